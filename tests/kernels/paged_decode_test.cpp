// GPU paged decode (split-K partials + merge/un-rotation) against the float64 CPU twin
// paged_decode_reference on random caches: odd context lengths, page and split boundaries, ragged
// batches, empty tiers, GQA 1/4/8, d 64/128/256.
// Tolerance: the GPU holds q (INT2 tier) as two int8 terms, |q_c - q~_c| <= max_c |q_c| / 4064, the BF16
// tier's q as two bf16 terms and the PV weights p*s_v in fp16 (11-bit significand) for the tensor cores,
// and accumulates in fp32 (int32 for the INT2 q.k); a BF16 serving pipeline rounds q to bf16 (8 bits),
// |q_c - bf16(q_c)| <= 2^-9 |q_c|. So we require
// ||gpu - ref|| / ||ref|| <= 2 x (the error of the reference itself when q is rounded to bf16) + 2^-11
// (atol: the PV weights are stored once in fp16, unit roundoff 2^-11, e.g. a 1-token cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cuda_paged.h"
#include "backend/decode_backend.h"
#include "backend/paged_cache.h"
#include "common/error.h"
#include "common/float16.h"
#include "gpu_test_util.h"
#include "paged_decode.h"

namespace oscar {
namespace {

struct DecodeCase {
  int dim, group, kv_heads;
  std::vector<int32_t> int2_lengths, bf16_lengths;
  int int2_page = 64, bf16_page = 64;
  int ctas_per_sm = 4;  // large values force many small splits
  bool rotate = true;
  std::string label;
  int force_int2_chunk = 0;  // > 0: bypass the planner (e.g. more splits than the fused merge holds)
  int force_bf16_chunk = 0;  // > 0: the BF16 tier in splits of this many tokens instead of the planner's
  bool parallel_merge = true;  // false: the last split CTA merges even where merge CTAs would fit
  std::vector<int> split_starts;  // non-empty: this INT2 split table instead of the planner's splits
  bool expect_planned_table = false;  // the planner itself must choose a split table
  int expect_min_int2_splits = 0;     // the planner must choose at least this many INT2 splits
  bool expect_parallel_merge = false;  // the plan must run with the parallel merge (its grid fits one wave)
  bool expect_pieces = false;  // the planner must cut the INT2 tier into pieces of each sequence (a ragged batch)
  // Non-empty: INT2 pieces made by hand instead of the planner's: each (sequence, chunk) in turn, the sequence in
  // equal pieces of chunk tokens (one empty piece for a sequence without tokens where there is no BF16 tier).
  std::vector<std::pair<int, int>> sequence_chunks;
  bool pieces_past_length = false;  // those pieces end at whole chunks, the last past the sequence's length
  MetadataType metadata = MetadataType::fp32;  // rounding of the INT2 (scale, zero)
  bool fp16_storage = false;                   // the fp16 metadata layout on the device (needs fp16 rounding)
  // Grids merged in the grid: 0 / 1 the last-CTA merge / merge CTAs forced; -1 the planner's choice.
  int merge_ctas = -1;
  int merge_cta_parts = 0;  // > 0: merge CTAs per pair forced (1 or merge_cta_parts(d)); 0 the planner's choice
  bool bf16_queries = false;  // queries rounded to bf16: the reference then has no rounding error of its own
  double max_rel_err = 0;     // > 0: a tighter bound on the relative error than run_case's own
};

HostPagedCache random_cache(const DecodeCase& c, uint64_t seed) {
  PagedCacheGeometry g;
  g.batch = static_cast<int>(c.int2_lengths.size());
  g.num_kv_heads = c.kv_heads;
  g.group = c.group;
  g.head_dim = c.dim;
  g.int2_page_size = c.int2_page;
  g.bf16_page_size = c.bf16_page;
  g.int2_metadata_fp16 = c.fp16_storage;
  HostPagedCache cache = make_paged_cache(g, c.int2_lengths, c.bf16_lengths, seed);
  QuantizerConfig kc, vc;
  kc.clip_ratio = 0.96f;
  vc.clip_ratio = 0.92f;
  kc.metadata = vc.metadata = c.metadata;
  for (int b = 0; b < g.batch; ++b)
    for (int kv = 0; kv < g.num_kv_heads; ++kv) {
      const uint64_t s = seed * 1000 + b * 16 + kv;
      const int n2 = c.int2_lengths[b], n16 = c.bf16_lengths[b];
      auto k2 = test::random_normal(static_cast<size_t>(n2) * c.dim, s + 1);
      auto v2 = test::random_normal(static_cast<size_t>(n2) * c.dim, s + 2);
      fill_int2_tier(cache, b, kv, k2.data(), v2.data(), n2, kc, vc);
      auto k16 = test::random_normal(static_cast<size_t>(n16) * c.dim, s + 3);
      auto v16 = test::random_normal(static_cast<size_t>(n16) * c.dim, s + 4);
      fill_bf16_tier(cache, b, kv, k16.data(), v16.data(), n16);
    }
  return cache;
}

// Returns the GPU output. shared: a decoder kept across cases (its work list must follow each call's plan and cache).
std::vector<float> run_case(const DecodeCase& c, CudaPagedDecoder* shared = nullptr) {
  SCOPED_TRACE(c.label);
  HostPagedCache host = random_cache(c, 17);
  const auto& g = host.geometry;
  const int d = c.dim;
  const size_t qn = static_cast<size_t>(g.batch) * g.num_q_heads() * d;
  auto q = test::random_normal(qn, 23, 2.0f);  // sharper than uniform attention
  if (c.bf16_queries)
    for (auto& v : q) v = round_to_bf16(v);
  std::vector<float> rotation, rotation_t;
  if (c.rotate) {
    rotation = test::random_normal(static_cast<size_t>(d) * d, 29, 1.0f / std::sqrt(static_cast<float>(d)));
    rotation_t.resize(rotation.size());
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) rotation_t[static_cast<size_t>(i) * d + j] = rotation[static_cast<size_t>(j) * d + i];
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> ref(qn), ref_bf16q(qn);
  paged_decode_reference(host, q.data(), scale, c.rotate ? rotation.data() : nullptr, ref.data());
  std::vector<float> q_bf16(q);
  for (auto& v : q_bf16) v = round_to_bf16(v);
  paged_decode_reference(host, q_bf16.data(), scale, c.rotate ? rotation.data() : nullptr, ref_bf16q.data());

  DevicePagedCache dev;
  dev.upload(host);
  DeviceBuffer<float> dq, dout, drot;
  dq.upload(q);
  dout.upload(std::vector<float>(qn, std::numeric_limits<float>::quiet_NaN()));  // poison
  if (c.rotate) drot.upload(rotation_t);
  CudaPagedDecoder local;
  CudaPagedDecoder& decoder = shared ? *shared : local;
  CudaDecodePlan plan = plan_cuda_decode(dev, cuda_multiprocessor_count(), c.ctas_per_sm);
  if ((c.force_int2_chunk > 0 && dev.max_int2_length > 0) || !c.split_starts.empty()) plan.int2_pieces.clear();
  if (c.force_int2_chunk > 0 && dev.max_int2_length > 0) {
    plan.int2_chunk = c.force_int2_chunk;
    plan.int2_splits = (dev.max_int2_length + plan.int2_chunk - 1) / plan.int2_chunk;
    plan.int2_split_start.clear();
  }
  if (!c.split_starts.empty()) {
    plan.int2_split_start = c.split_starts;
    plan.int2_splits = static_cast<int>(c.split_starts.size()) - 1;
    for (size_t s = 1; s < c.split_starts.size(); ++s)
      plan.int2_chunk = std::max(plan.int2_chunk, c.split_starts[s] - c.split_starts[s - 1]);
  }
  if (c.force_bf16_chunk > 0 && dev.max_bf16_length > 0) {
    plan.bf16_chunk = c.force_bf16_chunk;
    plan.bf16_splits = (dev.max_bf16_length + plan.bf16_chunk - 1) / plan.bf16_chunk;
  }
  EXPECT_GE(plan.int2_splits, c.expect_min_int2_splits) << c.label;
  if (c.expect_planned_table)
    EXPECT_EQ(plan.int2_split_start.size(), static_cast<size_t>(plan.int2_splits) + 1) << c.label << ": no split table";
  if (c.expect_pieces) EXPECT_FALSE(plan.int2_pieces.empty()) << c.label << ": no INT2 pieces";
  if (!c.sequence_chunks.empty()) {
    plan.int2_pieces.clear();
    plan.int2_splits = plan.int2_chunk = 0;
    for (const auto& [b, chunk] : c.sequence_chunks) {
      const int len = c.int2_lengths[b], splits = std::max((len + chunk - 1) / chunk, plan.bf16_splits == 0 ? 1 : 0);
      for (int k = 0; k < splits; ++k) {
        const int end = c.pieces_past_length ? (k + 1) * chunk : std::min(len, (k + 1) * chunk);
        plan.int2_pieces.push_back({b, k * chunk, end});
      }
      plan.int2_splits = std::max(plan.int2_splits, splits), plan.int2_chunk = std::max(plan.int2_chunk, chunk);
    }
    plan.int2_split_start.clear();
  }
  if (c.expect_parallel_merge)
    EXPECT_TRUE(runs_parallel_merge(g, plan))
        << c.label << ": " << plan.int2_splits << " + " << plan.bf16_splits << " splits, no parallel merge";
  plan.parallel_merge = c.parallel_merge;
  if (c.merge_ctas >= 0) plan.merge_ctas = c.merge_ctas == 1;
  if (c.merge_cta_parts > 0) plan.merge_cta_parts = c.merge_cta_parts;
  const bool fused = kernels::fused_merge_fits(plan.splits_total(), g.group, d);
  ::testing::Test::RecordProperty("fused_merge", fused ? "yes" : "no");
  decoder.run(dev, plan, dq.get(), static_cast<float>(scale), c.rotate ? drot.get() : nullptr, dout.get());
  cuda_check(cudaDeviceSynchronize(), "decode");
  auto out = dout.download();
  // A second call with the same decoder (fused-merge counters must be back at zero) gives the same bits.
  dout.upload(std::vector<float>(qn, std::numeric_limits<float>::quiet_NaN()));
  decoder.run(dev, plan, dq.get(), static_cast<float>(scale), c.rotate ? drot.get() : nullptr, dout.get());
  cuda_check(cudaDeviceSynchronize(), "decode (second call)");
  auto again = dout.download();
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0) << "the second call differs";
  EXPECT_EQ(std::count_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); }), 0)
      << "outputs not written (NaN poison left) or not finite";
  const double err = test::relative_error(out, ref);
  const double own = test::relative_error(ref_bf16q, ref);
  ::testing::Test::RecordProperty("rel_err", std::to_string(err));
  EXPECT_LE(err, 2.0 * own + 0.00048828125) << "rel err " << err << ", bf16-q reference error " << own << ", splits "
                                   << plan.int2_splits << "+" << plan.bf16_splits;
  EXPECT_LT(err, 5e-3);
  if (c.max_rel_err > 0) EXPECT_LE(err, c.max_rel_err) << "rel err " << err;
  return out;
}

TEST(PagedDecode, ContextLengthsAroundPageBoundaries) {
  // Planned as one short split (batch 1 takes the parallel merge, register-staged loop) and forced through the
  // last-CTA merge kernels (cp.async loop); both with the lo query terms in the free columns at g = 4.
  for (int n : {1, 63, 64, 65, 127, 129, 1000})
    for (bool parallel : {true, false}) {
      const std::string s = parallel ? "" : ", last-CTA merge";
      DecodeCase a{128, 4, 2, {n}, {0}, 64, 64, 4, true, "int2 only, n=" + std::to_string(n) + s};
      DecodeCase b{128, 4, 2, {n}, {n}, 64, 64, 4, true, "int2+bf16, n=" + std::to_string(n) + s};
      a.parallel_merge = b.parallel_merge = parallel;
      run_case(a);
      run_case(b);
    }
}

TEST(PagedDecode, EmptyTiers) {
  run_case({128, 4, 2, {0}, {320}, 64, 64, 4, true, "no INT2 tokens yet"});
  run_case({128, 4, 2, {0, 5}, {64, 0}, 64, 64, 4, true, "one sequence per tier"});
  run_case({128, 4, 2, {3000}, {0}, 64, 64, 4, false, "no recent tokens, no rotation"});
}

TEST(PagedDecode, SplitBoundariesAndRaggedBatch) {
  // 256-token splits: lengths straddle split edges.
  DecodeCase c{128, 4, 8, {255, 256, 257, 511, 512, 513, 4097}, {1, 64, 320, 0, 33, 129, 7}, 16, 32, 40, true,
               "ragged, page 16/32, many splits"};
  c.force_int2_chunk = 256;
  run_case(c);
  run_case({128, 4, 8, {20000, 1, 700}, {320, 320, 320}, 256, 64, 4, true, "ragged, page 256"});
}

TEST(PagedDecode, RaggedBatchIsPlannedByTheCtasWithTokens) {
  // One long sequence and seven short ones, 8 KV heads: planned as if all were 60000 tokens long, 8 splits
  // would fill one wave (64 pairs x 8); most of those CTAs are empty, so the ragged rule splits the long
  // sequence much finer (24-30 splits in its model), and the result must still match the reference.
  DecodeCase c{128, 4, 8, {60000, 2000, 2000, 2000, 2000, 2000, 2000, 2000}, std::vector<int32_t>(8, 320), 64, 64, 4,
               true, "ragged, one long sequence"};
  c.expect_min_int2_splits = 16;
  c.expect_pieces = true;
  run_case(c);
}

TEST(PagedDecode, RaggedBatchesArePlannedInPiecesPerSequence) {
  // Planner only, 132 multiprocessors: ragged batches (here not in ascending order) get INT2 pieces of each sequence
  // that tile its tokens from 0 in whole quanta, and piece counts balanced by their mean size: no sequence keeps a
  // piece whose removal would leave its mean above the plan's largest mean. Below 64K tokens the pieces are equal
  // chunks, the sequences shortest first (and a batch in that order already gets none); from 64K, balanced pieces,
  // largest first. Uniform batches get none.
  const int q = kernels::kInt2SplitQuantum;
  const std::vector<std::vector<int32_t>> batches{{30000, 9000, 30000, 500, 12000},
                                                  {102080, 91113, 80146, 69180, 58213, 47246, 36280, 25313},
                                                  {131000, 0, 7000}};
  for (const auto& lengths : batches) {
    SCOPED_TRACE("batch " + std::to_string(lengths.size()) + ", longest " + std::to_string(lengths[0]));
    DevicePagedCache cache;
    cache.geometry.batch = static_cast<int>(lengths.size());
    cache.geometry.num_kv_heads = 8;
    cache.geometry.group = 4;
    cache.geometry.head_dim = 128;
    cache.host_int2_lengths = lengths;
    cache.min_int2_length = *std::min_element(lengths.begin(), lengths.end());
    cache.max_int2_length = *std::max_element(lengths.begin(), lengths.end());
    cache.max_bf16_length = 320;
    const CudaDecodePlan plan = plan_cuda_decode(cache, 132, 4);
    ASSERT_FALSE(plan.int2_pieces.empty());
    std::vector<std::vector<std::pair<int, int>>> ranges(lengths.size());
    int longest = 0;
    for (const auto& piece : plan.int2_pieces) {
      ranges.at(piece.sequence).push_back({piece.begin, piece.end});
      longest = std::max(longest, piece.end - piece.begin);
    }
    EXPECT_EQ(plan.int2_chunk, longest);
    size_t most = 0;
    long largest_mean = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      auto& r = ranges[b];
      std::sort(r.begin(), r.end());
      most = std::max(most, r.size());
      EXPECT_EQ(r.empty(), lengths[b] == 0) << "sequence " << b;
      for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(r[i].first, i == 0 ? 0 : r[i - 1].second) << "sequence " << b << ", piece " << i;
        EXPECT_EQ(r[i].first % q, 0);
        EXPECT_GT(r[i].second, r[i].first) << "sequence " << b << ": an empty piece";
      }
      if (!r.empty()) {
        EXPECT_GE(r.back().second, lengths[b]) << "sequence " << b << " not covered";
        EXPECT_LT(r.back().first, lengths[b]);
        largest_mean = std::max<long>(largest_mean, (lengths[b] + r.size() - 1) / r.size());
      }
    }
    EXPECT_EQ(plan.int2_splits, static_cast<int>(most));
    if (lengths[0] < 65536) {  // equal chunks, the sequences shortest first
      std::vector<int32_t> order;
      for (const auto& piece : plan.int2_pieces)
        if (order.empty() || order.back() != piece.sequence) order.push_back(piece.sequence);
      EXPECT_EQ(order, (std::vector<int32_t>{3, 1, 4, 0, 2}));
    } else {  // balanced pieces, largest first
      for (size_t i = 1; i < plan.int2_pieces.size(); ++i)
        EXPECT_LE(plan.int2_pieces[i].end - plan.int2_pieces[i].begin,
                  plan.int2_pieces[i - 1].end - plan.int2_pieces[i - 1].begin);
    }
    for (size_t b = 0; b < lengths.size(); ++b)
      if (ranges[b].size() >= 2)
        EXPECT_GE((lengths[b] + ranges[b].size() - 2) / (ranges[b].size() - 1), largest_mean) << "sequence " << b;
  }
  DevicePagedCache sorted;  // below 64K and already shortest first: the plain grid (no work list)
  sorted.geometry.batch = 5, sorted.geometry.num_kv_heads = 8, sorted.geometry.group = 4;
  sorted.geometry.head_dim = 128;
  sorted.host_int2_lengths = {500, 9000, 12000, 30000, 30000};
  sorted.min_int2_length = 500, sorted.max_int2_length = 30000;
  sorted.max_bf16_length = 320;
  EXPECT_TRUE(plan_cuda_decode(sorted, 132, 4).int2_pieces.empty());
  DevicePagedCache uniform;
  uniform.geometry.batch = 5, uniform.geometry.num_kv_heads = 8, uniform.geometry.group = 4;
  uniform.geometry.head_dim = 128;
  uniform.host_int2_lengths.assign(5, 30000);
  uniform.min_int2_length = uniform.max_int2_length = 30000;
  uniform.max_bf16_length = 320;
  EXPECT_TRUE(plan_cuda_decode(uniform, 132, 4).int2_pieces.empty());
}

TEST(PagedDecode, RaggedBatchesBelow64KMayRunTheirChunksLargestFirst) {
  // Planner only, 132 multiprocessors, Qwen3-8B, lengths spread over [L / 4, L] shortest first (oscar-bench's ragged
  // batches, 320 BF16 tokens each): at 32 / 32K the equal chunks of >= 2 splits as pieces, largest first, each
  // sequence's pieces tiling its tokens; at 128 / 8K (one split: whole sequences) the plain shortest-first grid.
  auto ragged = [](int batch, int context) {
    DevicePagedCache cache;
    cache.geometry.batch = batch, cache.geometry.num_kv_heads = 8, cache.geometry.group = 4;
    cache.geometry.head_dim = 128;
    cache.host_int2_lengths.resize(batch);
    cache.host_bf16_lengths.assign(batch, 320);
    for (int b = 0; b < batch; ++b)
      cache.host_int2_lengths[b] = context / 4 + (context - context / 4) * b / (batch - 1) - 320;
    cache.min_int2_length = cache.host_int2_lengths.front(), cache.max_int2_length = cache.host_int2_lengths.back();
    cache.max_bf16_length = 320;
    return cache;
  };
  const DevicePagedCache cache = ragged(32, 32768);
  const CudaDecodePlan plan = plan_cuda_decode(cache, 132, 4);
  ASSERT_FALSE(plan.int2_pieces.empty());
  EXPECT_GE(plan.int2_splits, 2);
  std::vector<int> covered(cache.geometry.batch, 0);
  for (size_t i = 0; i < plan.int2_pieces.size(); ++i) {
    const auto& piece = plan.int2_pieces[i];
    const int size = piece.end - piece.begin;
    if (i > 0) EXPECT_LE(size, plan.int2_pieces[i - 1].end - plan.int2_pieces[i - 1].begin) << "piece " << i;
    EXPECT_EQ(piece.begin % plan.int2_chunk, 0) << "piece " << i;
    EXPECT_TRUE(size == plan.int2_chunk || piece.end == cache.host_int2_lengths[piece.sequence]) << "piece " << i;
    covered[piece.sequence] += size;
  }
  for (int b = 0; b < cache.geometry.batch; ++b) EXPECT_EQ(covered[b], cache.host_int2_lengths[b]) << "sequence " << b;
  const CudaDecodePlan whole = plan_cuda_decode(ragged(128, 8192), 132, 4);
  EXPECT_EQ(whole.int2_splits, 1);
  EXPECT_TRUE(whole.int2_pieces.empty());
}

TEST(PagedDecode, GridsOfOneToTwoWavesAreMergedByMergeCtas) {
  // Planner only, 132 multiprocessors x 4 slots, Qwen3-8B, lengths on the host (as the decoder's caches have them):
  // merge CTAs for grids of more than one and at most two waves (ragged 64 / 8K, uniform 64 / 8K, ragged 8 / 100K with
  // pieces); none for a small grid (batch 4 / 8K), a long one (uniform 64 / 100K), at batch 1 (the parallel merge),
  // without the lengths, or for more pairs than resident CTAs.
  auto cache = [](int batch, int context, bool ragged, bool host = true) {
    DevicePagedCache c;
    c.geometry.batch = batch, c.geometry.num_kv_heads = 8, c.geometry.group = 4, c.geometry.head_dim = 128;
    std::vector<int32_t> lengths(batch);
    for (int b = 0; b < batch; ++b)
      lengths[b] = (ragged && batch > 1 ? context / 4 + (context - context / 4) * b / (batch - 1) : context) - 320;
    if (host) c.host_int2_lengths = lengths, c.host_bf16_lengths.assign(batch, 320);
    c.min_int2_length = *std::min_element(lengths.begin(), lengths.end());
    c.max_int2_length = *std::max_element(lengths.begin(), lengths.end());
    c.max_bf16_length = 320;
    return c;
  };
  const CudaDecodePlan ragged64 = plan_cuda_decode(cache(64, 8192, true), 132, 4);
  EXPECT_TRUE(ragged64.merge_ctas) << "ragged 64 / 8K";
  // 512 pairs: four merge CTAs each would be more than the 528 resident CTAs.
  EXPECT_EQ(ragged64.merge_cta_parts, 1) << "ragged 64 / 8K";
  EXPECT_TRUE(plan_cuda_decode(cache(64, 8192, false), 132, 4).merge_ctas) << "uniform 64 / 8K";
  const CudaDecodePlan pieces = plan_cuda_decode(cache(8, 102400, true), 132, 4);
  EXPECT_TRUE(pieces.merge_ctas && !pieces.int2_pieces.empty()) << "ragged 8 / 100K";
  EXPECT_EQ(pieces.merge_cta_parts, kernels::merge_cta_parts(128)) << "ragged 8 / 100K: 64 pairs";
  const CudaDecodePlan uniform8 = plan_cuda_decode(cache(8, 32768, false), 132, 4);
  EXPECT_TRUE(uniform8.merge_ctas && uniform8.merge_cta_parts == 1) << "uniform 8 / 32K: its merges end together";
  EXPECT_FALSE(plan_cuda_decode(cache(4, 8192, false), 132, 4).merge_ctas) << "uniform 4 / 8K: a small grid";
  EXPECT_FALSE(plan_cuda_decode(cache(64, 102400, false), 132, 4).merge_ctas) << "uniform 64 / 100K: many waves";
  EXPECT_FALSE(plan_cuda_decode(cache(1, 102400, false), 132, 4).merge_ctas) << "batch 1 / 100K: the parallel merge";
  EXPECT_FALSE(plan_cuda_decode(cache(64, 8192, false, false), 132, 4).merge_ctas) << "no lengths on the host";
  // 1024 pairs: as many merge CTAs as resident CTAs could leave their pairs' work no slot, whatever the dispatch order.
  EXPECT_FALSE(plan_cuda_decode(cache(128, 8192, true), 132, 4).merge_ctas) << "ragged 128 / 8K: more pairs than slots";
}

TEST(PagedDecode, OneDecoderAcrossPlansAndLengths) {
  // One decoder for several calls whose work lists differ in one input each: the length of one sequence (the same
  // pieces, which end past it, as the planner's balanced pieces do), the pieces, the KV heads, the merge CTAs per
  // pair. A stale work list would read the wrong tokens (or too few) and miss the reference, or leave outputs unwritten.
  CudaPagedDecoder decoder;
  DecodeCase a{128, 4, 4, {9000, 4100, 129}, {320, 7, 33}, 64, 64, 4, true, "pieces A"};
  a.parallel_merge = false;
  a.sequence_chunks = {{0, 2304}, {1, 1024}, {2, 128}};
  a.pieces_past_length = true;
  DecodeCase longer = a;
  longer.int2_lengths = {9000, 4100, 200}, longer.label = "pieces A, sequence 2 longer, the same pieces";
  DecodeCase cut = a;
  cut.sequence_chunks = {{0, 4608}, {1, 1024}, {2, 128}}, cut.label = "pieces A, sequence 0 in larger pieces";
  DecodeCase heads = a;
  heads.kv_heads = 2, heads.label = "pieces A, 2 KV heads";
  DecodeCase merged = a;
  merged.merge_ctas = 1, merged.label = "pieces A, merge CTAs";
  DecodeCase merged_longer = longer;
  merged_longer.merge_ctas = 1, merged_longer.label = "pieces A, sequence 2 longer, merge CTAs";
  DecodeCase merged4 = merged;  // the same pieces, merge_cta_parts(d) merge CTAs per pair: a list of its own
  merged4.merge_cta_parts = kernels::merge_cta_parts(merged4.dim), merged4.label = "pieces A, 4 merge CTAs per pair";
  for (const DecodeCase* c : {&a, &longer, &cut, &heads, &merged, &merged_longer, &a, &merged, &merged4, &merged})
    run_case(*c, &decoder);
}

// The grid's merge forced: parts 0 the last-CTA merge, 1 a merge CTA per pair, -1 merge_cta_parts(d) per pair (each
// un-rotating its share of the columns); the label says which.
void merge_by(DecodeCase& c, int parts) {
  c.parallel_merge = false, c.merge_ctas = parts != 0;
  c.merge_cta_parts = parts < 0 ? kernels::merge_cta_parts(c.dim) : parts;
  c.label += parts == 0 ? ", last-CTA merge" : ", " + std::to_string(c.merge_cta_parts) + " merge CTAs per pair";
}

TEST(PagedDecode, Int2PiecesInAnyOrder) {
  // INT2 pieces made by hand, merged by the last CTA and by merge CTAs: longest first (with ties), a sequence without
  // INT2 tokens (no INT2 piece, its BF16 partial only) and one whose pieces are 1 quantum, pages of 16 and 64; and a
  // batch without a BF16 tier, whose INT2-less sequence keeps one empty INT2 piece (an empty partial for the merge CTA
  // to skip). Every output must land in its own sequence's rows.
  // Each with the last-CTA merge, one merge CTA per pair and merge_cta_parts(d) per pair.
  for (int parts : {0, 1, -1}) {
    for (int page : {16, 64}) {
      DecodeCase c{128, 4, 4, {9000, 4100, 4100, 1000, 129, 0}, {320, 7, 64, 0, 33, 5}, page, 64, 4, true,
                   "INT2 pieces, longest first, page " + std::to_string(page)};
      merge_by(c, parts);
      c.sequence_chunks = {{0, 2304}, {1, 1024}, {2, 4224}, {3, 128}, {4, 256}, {5, 128}};
      run_case(c);
    }
    DecodeCase g8{64, 8, 2, {7000, 3000, 64}, {320, 320, 320}, 64, 64, 4, true, "INT2 pieces, d=64 g=8"};
    merge_by(g8, parts);
    g8.sequence_chunks = {{2, 128}, {0, 1792}, {1, 3072}};
    run_case(g8);
    DecodeCase none{128, 4, 2, {5000, 0, 700}, {0, 0, 0}, 64, 64, 4, true, "INT2 pieces, no BF16 tier"};
    merge_by(none, parts);
    none.sequence_chunks = {{1, 128}, {2, 384}, {0, 1280}};
    run_case(none);
  }
}

TEST(PagedDecode, LongBf16SplitsInWorkLists) {
  // Long BF16 splits in work-list grids: splits of 4608 tokens give each warp 35-36 blocks of 32 tokens over many
  // pages, beside a short BF16 tier, a sequence of BF16 tokens only and a last block of 4 tokens; both merges, d = 64 /
  // 128 / 256. (The other work-list cases have BF16 tiers of at most 320 tokens, 3 blocks per warp.)
  for (int parts : {0, 1, -1})  // the last-CTA merge, one merge CTA per pair, merge_cta_parts(d) per pair
    for (int d : {64, 128, 256}) {
      DecodeCase c{d, 4, 2, {3000, 500, 0}, {4500, 700, 4420}, 64, 64, 4, true,
                   "long BF16 splits, d=" + std::to_string(d)};
      merge_by(c, parts);
      c.sequence_chunks = {{0, 1024}, {1, 512}, {2, 128}};
      c.force_bf16_chunk = 4608;
      run_case(c);
    }
}

TEST(PagedDecode, Bf16OnlyCachesInBalancedTiles) {
  // Caches without INT2 tokens (the BF16 decode, and sequences before their first demotion) split each range into
  // four equal runs of 16-token tiles: splits of 4608 tokens give a warp 72 tiles (its page entries read 32 at a
  // time), 20 tokens leave two warps without a tile, 77 end in a tile of 13; d = 64 / 128 / 256, g = 1 / 4 / 8,
  // pages of 32 and 64 tokens; the planned cases without R_V^T at g = 4.
  for (int d : {64, 128, 256})
    for (int g : {1, 4, 8}) {
      DecodeCase c{d, g, 2, {0, 0, 0, 0}, {9000, 20, 77, 4700}, 64, 64, 4, true,
                   "BF16 only, d=" + std::to_string(d) + " g=" + std::to_string(g)};
      c.force_bf16_chunk = 4608;
      run_case(c);
      DecodeCase one{d, g, 2, {0, 0}, {320, 1000}, 32, 32, 4, g != 4,
                     "BF16 only, planned, pages of 32, d=" + std::to_string(d) + " g=" + std::to_string(g)};
      run_case(one);
    }
}

TEST(PagedDecode, MergeCtasOverSplitsAsPieces) {
  // Merge CTAs where the plan has no pieces: its splits become the work list's pieces (a split table's split-major,
  // equal chunks per sequence), d = 64 / 128 / 256 with g = 1 / 4 / 8 (several output items per thread at d = 256,
  // g = 8), more partials than a merge CTA folds in one round (32 splits of 128 tokens), ragged lengths with a
  // sequence of BF16 tokens only, and no R_V^T.
  DecodeCase table{128, 4, 2, {5000, 5000}, {320, 320}, 64, 64, 4, true, "split table as pieces, merge CTAs"};
  table.split_starts = {0, 2048, 3584, 4608, 5120};
  table.parallel_merge = false, table.merge_ctas = 1;
  run_case(table);
  DecodeCase many{128, 4, 2, {4096, 1000, 0}, {320, 7, 64}, 64, 64, 4, true, "32 equal splits, ragged, merge CTAs"};
  many.force_int2_chunk = 128;
  many.parallel_merge = false, many.merge_ctas = 1;
  run_case(many);
  DecodeCase wide{256, 8, 2, {3000, 900}, {100, 320}, 64, 64, 4, true, "d=256 g=8, merge CTAs"};
  wide.force_int2_chunk = 1024;
  wide.parallel_merge = false, wide.merge_ctas = 1;
  run_case(wide);
  DecodeCase mha{64, 1, 4, {3000, 2000}, {320, 320}, 64, 64, 4, false, "d=64 g=1, no R_V^T, merge CTAs"};
  mha.force_int2_chunk = 512;
  mha.parallel_merge = false, mha.merge_ctas = 1;
  run_case(mha);
  // The same with merge_cta_parts(d) merge CTAs per pair, each un-rotating (or, without R_V^T, copying) its columns.
  for (DecodeCase* c : {&table, &many, &wide, &mha}) {
    c->merge_cta_parts = kernels::merge_cta_parts(c->dim);
    c->label += ", " + std::to_string(c->merge_cta_parts) + " per pair";
    run_case(*c);
  }
}

TEST(PagedDecode, SmallestSplitsAndRepeatedCalls) {
  // 128-token splits (the quantum), page 16: every tile boundary is a page boundary.
  DecodeCase c{128, 8, 2, {129, 1000, 3}, {0, 40, 64}, 16, 32, 4, true, "128-token splits, g=8"};
  c.force_int2_chunk = 128;
  run_case(c);
}

TEST(PagedDecode, ChunksOfHalfSteps) {
  // Equal splits in multiples of kInt2ChunkQuantum (64) rather than of a CTA step (128 tokens, 256 at d = 64): splits
  // start mid-step and end in a half (at d = 64 a quarter) step. Each case runs twice: merged in parallel (the
  // register-staged kernels, whose warps share the q fragments' conversion; the grid must fit one wave), then by the
  // last CTA (the cp.async kernels); both with the lo query terms in the free mma columns at g = 4; pages of 16 tokens
  // at d = 128.
  for (int dim : {64, 128, 256})
    for (int chunk : {64, 192, 2112}) {
      // (One KV head at d = 256: its 32 merge CTAs per pair at g = 4 and the splits must all be resident at once, at two
      // CTAs per SM.)
      const int kv_heads = dim == 256 ? 1 : 2, int2_page = dim == 128 ? 16 : 64;
      DecodeCase c{dim,  4, kv_heads, {1, 191, 193, 2 * chunk + 100}, {0, 7, 64, 320}, int2_page, 64, 4,
                   true, "d=" + std::to_string(dim) + ", splits of " + std::to_string(chunk)};
      c.force_int2_chunk = chunk;
      c.expect_parallel_merge = true;
      run_case(c);
      c.expect_parallel_merge = false, c.parallel_merge = false, c.merge_ctas = 0;
      c.label += ", last-CTA merge";
      run_case(c);
    }
}

TEST(PagedDecode, ParallelMergeRoundsAndLastCtaMerge) {
  // Small grids merge in parallel merge CTAs: splits beyond one round of their loads (64 at d = 128, 128
  // at d = 64, 32 at d = 256), and the same small cases merged by the last split CTA instead.
  for (int d : {64, 128, 256}) {
    DecodeCase c{d, 8, 1, {20000}, {300}, 64, 64, 4, true, "parallel merge, 157 + 3 splits, d=" + std::to_string(d)};
    c.force_int2_chunk = 128;
    run_case(c);
  }
  for (int d : {64, 128, 256})
    for (bool parallel : {true, false}) {
      DecodeCase c{d, 8, 2, {5000}, {320}, 64, 64, 4, true,
                   std::string(parallel ? "parallel" : "last-CTA") + " merge, d=" + std::to_string(d)};
      c.parallel_merge = parallel;
      run_case(c);
      // BF16 splits of 64 tokens (kBf16ParallelQuantum), which the parallel-merge kernels take and the decoder turns
      // into 128-token splits for the last-CTA merge.
      c.force_bf16_chunk = kernels::kBf16ParallelQuantum;
      c.label += ", 64-token BF16 splits";
      run_case(c);
    }
}

TEST(PagedDecode, BatchOneWithFewKvHeadsTakesFinerBf16Splits) {
  // Planner only, 132 multiprocessors x 4 slots: parallel-merge grids (here all of them) of batch 1 with at most 8 KV
  // heads cut the BF16 tier (320 tokens) in 64-token splits; batch 2 (here 8 pairs too) and MHA keep multiples of 128.
  auto cache = [](int batch, int kv_heads, int group, int context) {
    DevicePagedCache c;
    c.geometry.batch = batch, c.geometry.num_kv_heads = kv_heads, c.geometry.group = group, c.geometry.head_dim = 128;
    c.host_int2_lengths.assign(batch, context - 320), c.host_bf16_lengths.assign(batch, 320);
    c.min_int2_length = c.max_int2_length = context - 320;
    c.max_bf16_length = 320;
    return c;
  };
  for (int context : {8192, 102400}) {
    const CudaDecodePlan one = plan_cuda_decode(cache(1, 8, 4, context), 132, 4);
    EXPECT_EQ(one.bf16_chunk, kernels::kBf16ParallelQuantum) << "batch 1 / " << context;
    const CudaDecodePlan four = plan_cuda_decode(cache(1, 4, 7, context), 132, 4);
    EXPECT_EQ(four.bf16_chunk, kernels::kBf16ParallelQuantum) << "4 KV heads, batch 1 / " << context;
    const CudaDecodePlan two = plan_cuda_decode(cache(2, 4, 7, context), 132, 4);
    EXPECT_EQ(two.bf16_chunk % kernels::kBf16SplitQuantum, 0) << "4 KV heads, batch 2 / " << context;
    const CudaDecodePlan mha = plan_cuda_decode(cache(1, 32, 1, context), 132, 4);
    EXPECT_EQ(mha.bf16_chunk % kernels::kBf16SplitQuantum, 0) << "MHA batch 1 / " << context;
  }
}

TEST(PagedDecode, LoQueryTermsInTheFreeMmaColumns) {
  // At g <= 4 every kernel puts each head's lo query term in mma column h + 4 and splits a tile's token rows between
  // lanes tq and tq ^ 2 (PACK, in int2_cta and bf16_warp): g = 1 to 4 at every head dim, through the parallel merge
  // (register-staged loop) and the last-CTA merge (cp.async loop), a BF16-only cache (the BF16 decode's balanced
  // tiles), and 16-token pages.
  for (int d : {64, 128, 256})
    for (int g : {1, 2, 3, 4}) {
      DecodeCase c{d, g, d == 256 ? 1 : 2, {2500}, {100}, 64, 64, 4, true,
                   "d=" + std::to_string(d) + " g=" + std::to_string(g)};
      c.expect_parallel_merge = true;
      run_case(c);
      c.expect_parallel_merge = false, c.parallel_merge = false, c.merge_ctas = 0;
      c.label += ", last-CTA merge";
      run_case(c);
      run_case({d, g, 2, {0, 0}, {1000, 77}, 32, 32, 4, true,
                "BF16 only, d=" + std::to_string(d) + " g=" + std::to_string(g)});
    }
  DecodeCase c{128, 4, 2, {777}, {0}, 16, 64, 4, true, "pages of 16, no BF16 tier"};
  c.expect_parallel_merge = true;
  run_case(c);
}

TEST(PagedDecode, SplitTableOfUnequalSplits) {
  // Splits of 1 to 9 quanta, split-major; lengths ending inside, at and before split edges; pages of 16, 32
  // and 64 tokens (at d = 64 a warp's stage of 64 tokens spans two 32-token pages). Where the parallel merge
  // runs instead, the table is ignored (chunks of its largest split).
  const std::vector<int> starts{0, 1152, 1536, 1664, 2560, 2816, 3200, 3328};
  for (int d : {64, 128, 256})
    for (int page : {16, 32, 64})
      for (bool parallel : {false, true}) {
        DecodeCase c{d, 4, 3, {3328, 1600, 1, 2816}, {320, 0, 5, 64}, page, 64, 4, true,
                     "split table, d=" + std::to_string(d) + ", page " + std::to_string(page) +
                         (parallel ? ", parallel merge" : "")};
        c.split_starts = starts;
        c.parallel_merge = parallel;
        run_case(c);
      }
  // g = 8 and 40 splits of 1-3 quanta: more partials than the last CTA's shared memory holds at once, so
  // the split-table merge loads them in several rounds (6, 9 and 12 splits per round at d = 256, 128, 64).
  std::vector<int> many{0};
  for (int s = 0; s < 40; ++s) many.push_back(many.back() + kernels::kInt2SplitQuantum * (1 + s % 3));
  for (int d : {64, 128, 256}) {
    DecodeCase c{d, 8, 2, {many.back(), many.back() - 200}, {320, 7}, 64, 64, 4, true,
                 "split table, 40 splits, g=8, d=" + std::to_string(d)};
    c.split_starts = many;
    c.parallel_merge = false;
    run_case(c);
  }
}

TEST(PagedDecode, SplitTableOfLongSplits) {
  // The split-table kernels read the page-table entries of 32 runs of tiles at a time, a block ahead (16 or 8
  // stages at d = 64 or with 16-token pages): splits of 41-70 quanta cross several such blocks, and the lengths
  // end inside a block, at a split edge and inside the first split.
  const int q = kernels::kInt2SplitQuantum;
  const std::vector<int> starts{0, 41 * q, 111 * q, 112 * q, 160 * q};
  for (int d : {64, 128, 256})
    for (int page : {16, 64}) {
      DecodeCase c{d, 4, 2, {160 * q, 111 * q, 6000, 160 * q - 300}, {320, 64, 0, 7}, page, 64, 4, true,
                   "long split table, d=" + std::to_string(d) + ", page " + std::to_string(page)};
      c.split_starts = starts;
      c.parallel_merge = false;
      run_case(c);
    }
}

TEST(PagedDecode, OneWaveUniformBatchTakesEqualSplitTable) {
  // Uniform lengths whose INT2 CTAs fit in one wave, too many pairs for the parallel merge, splits of >= 2048
  // tokens: the planner hands the equal splits over as a table (the split-table kernel and its staged merge).
  DecodeCase c{128, 4, 4, {60000, 60000, 60000, 60000}, {320, 320, 320, 320}, 64, 64, 4, true,
               "one-wave uniform batch, equal split table"};
  c.expect_planned_table = true;
  run_case(c);
}

TEST(PagedDecode, MultiWaveUniformBatchesTakeFallingSplitTables) {
  // Planner only (no cache allocated): uniform batches whose INT2 CTAs make two or more waves on 132
  // multiprocessors get a split table whose sizes fall from ~1.3 (two waves) or ~1.7 (more) times the mean;
  // every split is a whole number of quanta, none empty, and the table ends at the sequence's last quantum.
  struct Shape {
    int batch, length;
    double first;
  };
  const Shape shapes[] = {{8, 102080, 1.3}, {32, 32448, 1.3}, {16, 102080, 1.7}, {64, 130752, 1.7}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE("batch " + std::to_string(s.batch) + " / " + std::to_string(s.length));
    DevicePagedCache cache;
    cache.geometry.batch = s.batch;
    cache.geometry.num_kv_heads = 8;
    cache.geometry.group = 4;
    cache.geometry.head_dim = 128;
    cache.max_int2_length = cache.min_int2_length = s.length;
    cache.host_int2_lengths.assign(s.batch, s.length);
    cache.max_bf16_length = 320;
    const CudaDecodePlan plan = plan_cuda_decode(cache, 132, 4);
    const long ctas = 8L * s.batch * plan.int2_splits;
    ASSERT_GT(ctas, 132 * 4) << "one wave: not a multi-wave shape";
    ASSERT_EQ(plan.int2_split_start.size(), static_cast<size_t>(plan.int2_splits) + 1) << "no split table";
    const auto& st = plan.int2_split_start;
    EXPECT_EQ(st.front(), 0);
    const int q = kernels::kInt2SplitQuantum;
    EXPECT_EQ(st.back(), (s.length + q - 1) / q * q) << "the table must end at the last quantum";
    for (size_t i = 1; i < st.size(); ++i) {
      EXPECT_GT(st[i], st[i - 1]) << "split " << i - 1 << " empty";
      EXPECT_EQ(st[i] % q, 0);
    }
    const double mean = static_cast<double>(st.back()) / plan.int2_splits;
    EXPECT_NEAR((st[1] - st[0]) / mean, s.first, 0.1) << "first split";
    EXPECT_NEAR((st.back() - st[st.size() - 2]) / mean, 2 - s.first, 0.1) << "last split";
    EXPECT_EQ(plan.int2_chunk, st[1] - st[0]) << "int2_chunk: the largest split";
  }
}

TEST(PagedDecode, ShortSplitsArePlannedForTheParallelMerge) {
  // Merge CTAs that take more than 1/8 of the slots (g = 8: 16 per pair at d = 128): the planner costs short
  // splits as a parallel-merge grid, and the BF16 splits it adds keep that grid one wave. The second case
  // (Hkv = 32, ragged) once got 4 + 3 splits there, one BF16 split too many for the wave. Plans for the
  // 132 multiprocessors of an H100 SXM / H200.
  if (cuda_multiprocessor_count() < 132) GTEST_SKIP() << "plans checked for 132 multiprocessors";
  DecodeCase g8{128, 8, 8, {32000}, {320}, 64, 64, 4, true, "g = 8, batch 1, 32000 INT2 tokens"};
  g8.expect_parallel_merge = true;
  run_case(g8);
  DecodeCase mha{128, 1, 32, {2000, 7872}, {320, 320}, 64, 64, 4, true, "Hkv = 32, ragged batch 2"};
  mha.expect_parallel_merge = true;
  run_case(mha);
}

TEST(PagedDecode, UnfusedMergeForManySplits) {
  // d = 64, g = 8: more 128-token splits than the fused merge's scratch holds -> two launches.
  DecodeCase c{64, 8, 1, {150000}, {50}, 64, 64, 4, false, "unfused merge, 1172 splits"};
  c.force_int2_chunk = 128;
  ASSERT_FALSE(kernels::fused_merge_fits(1172 + 1, 8, 64));
  run_case(c);
}

TEST(PagedDecode, Bf16TierToFp32PrecisionOnBf16Queries) {
  // The BF16 decode carries each softmax weight into P.V as a bf16 hi and a lo term (with PACK, at g <= 4, in one
  // product's columns 0-3 and 4-7). With queries exact in bf16 the output is then within ~4e-6 of the fp64 reference
  // (H200, d = 256, g = 8); builds that dropped the lo terms (PACK, or not) measured 4.9e-4 to 7.8e-4 here.
  for (int d : {64, 128, 256})
    for (int g : {1, 2, 4, 8}) {
      DecodeCase c{d, g, 2, {0, 0}, {1000, 77}, 32, 32, 4, true,
                   "BF16 only, bf16 queries, d=" + std::to_string(d) + " g=" + std::to_string(g)};
      c.bf16_queries = true;
      c.max_rel_err = 1e-4;
      run_case(c);
    }
}

TEST(PagedDecode, GqaRatiosAndHeadDims) {
  for (int d : {64, 128, 256})
    for (int g : {1, 4, 8})
      run_case({d, g, 2, {1500, 77}, {320, 65}, 64, 64, 8, true,
                "d=" + std::to_string(d) + " g=" + std::to_string(g)});
  run_case({128, 3, 3, {900}, {100}, 32, 32, 8, true, "odd group 3"});
}

TEST(PagedDecode, UnrotationIsNearFp32) {
  // The merge's un-rotation o . R_V^T against the same call without R_V^T, un-rotated on the CPU in float64: near
  // fp32, per head (a tensor-core un-rotation with one tf32 product per term was at 8e-4 here, with three at 2e-6).
  // Last-CTA merges with R_V^T's rows partly in shared memory (d = 128, g <= 4, at most 5 partials: a forced chunk of
  // 1024 INT2 tokens and one BF16 split; no other decode test takes that path) and from L2 (few partials at g = 8, the
  // planner's splits, 72 forced ones), d = 256 in rounds, and the parallel merge.
  struct Merge {
    int dim, group, int2_length, chunk;  // chunk > 0: forced INT2 chunk; >= 1024: and one BF16 split
    bool parallel;
  };
  for (const Merge& m : {Merge{64, 8, 3000, 0, false}, Merge{128, 4, 3000, 0, false}, Merge{128, 4, 3000, 1024, false},
                         Merge{128, 8, 1000, 1024, false}, Merge{128, 4, 9000, 128, false},
                         Merge{128, 1, 9000, 128, false}, Merge{256, 8, 3000, 0, false}, Merge{128, 8, 5000, 0, true}}) {
    DecodeCase c{m.dim, m.group, 2, {m.int2_length, 700}, {320, 100}, 64, 64, 4, true, ""};
    if (m.parallel) c.int2_lengths = {m.int2_length}, c.bf16_lengths = {320};  // batch 1: one wave
    SCOPED_TRACE("d=" + std::to_string(m.dim) + " g=" + std::to_string(m.group) + " chunk=" +
                 std::to_string(m.chunk) + (m.parallel ? " parallel" : " last-CTA"));
    HostPagedCache host = random_cache(c, 5);
    const int d = m.dim;
    const size_t qn = static_cast<size_t>(host.geometry.batch) * host.geometry.num_q_heads() * d;
    const auto q = test::random_normal(qn, 7, 2.0f);
    const auto rot_t = test::random_normal(static_cast<size_t>(d) * d, 11, 1.0f / std::sqrt(static_cast<float>(d)));
    DevicePagedCache dev;
    dev.upload(host);
    DeviceBuffer<float> dq, dout, drot;
    dq.upload(q);
    drot.upload(rot_t);
    const std::vector<float> poison(qn, std::numeric_limits<float>::quiet_NaN());  // unwritten outputs fail below
    CudaPagedDecoder decoder;
    CudaDecodePlan plan = plan_cuda_decode(dev, cuda_multiprocessor_count(), 4);
    if (m.chunk > 0) {
      plan.int2_pieces.clear(), plan.int2_split_start.clear();
      plan.int2_chunk = m.chunk;
      plan.int2_splits = (dev.max_int2_length + m.chunk - 1) / m.chunk;
      if (m.chunk >= 1024) plan.bf16_splits = 1, plan.bf16_chunk = 384;
    }
    plan.parallel_merge = m.parallel;
    EXPECT_EQ(runs_parallel_merge(host.geometry, plan), m.parallel);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    dout.upload(poison);
    decoder.run(dev, plan, dq.get(), scale, nullptr, dout.get());
    cuda_check(cudaDeviceSynchronize(), "decode without R_V^T");
    const auto plain = dout.download();
    dout.upload(poison);
    decoder.run(dev, plan, dq.get(), scale, drot.get(), dout.get());
    cuda_check(cudaDeviceSynchronize(), "decode with R_V^T");
    const auto rotated = dout.download();
    double worst = 0;
    int nan_heads = 0;  // unwritten or non-finite outputs
    for (size_t h = 0; h < qn / d; ++h) {
      double num = 0, den = 0;
      for (int j = 0; j < d; ++j) {
        double v = 0;
        for (int i = 0; i < d; ++i) v += static_cast<double>(plain[h * d + i]) * rot_t[static_cast<size_t>(i) * d + j];
        num += (rotated[h * d + j] - v) * (rotated[h * d + j] - v), den += v * v;
      }
      const double err = std::sqrt(num / den);
      if (std::isnan(err))
        ++nan_heads;
      else
        worst = std::max(worst, err);
    }
    std::printf("  d=%d g=%d, %d + %d splits: worst head's relative error %.2e, %d NaN heads\n", d, m.group,
                plan.int2_splits, plan.bf16_splits, worst, nan_heads);
    EXPECT_EQ(nan_heads, 0);
    EXPECT_LT(worst, 2e-5);
  }
}

TEST(PagedDecode, Fp16MetadataLayoutGivesTheFp32LayoutsBits) {
  // The same fp16-rounded metadata stored as fp16 (8 bytes per token) and as fp32: the kernels widen the fp16
  // values exactly, so both layouts must give the same bits, on every kernel: batch 1 (parallel merge,
  // register-staged loads), the last-CTA merge (cp.async ring), split tables, pages of 32 to 256 tokens, d 64 to
  // 256, and ragged lengths ending inside tiles.
  struct Layout {
    int dim, group, kv_heads;
    std::vector<int32_t> int2, bf16;
    int page;
    bool parallel;
    std::vector<int> split_starts;
    std::string label;
  };
  const std::vector<int> table{0, 1152, 1536, 1664, 2560, 2816, 3200, 3328};
  const std::vector<Layout> layouts{
      {64, 8, 1, {20000}, {300}, 64, true, {}, "d=64 parallel merge"},
      {64, 4, 1, {5000}, {320}, 32, true, {}, "d=64 parallel merge, page 32"},
      {64, 4, 2, {5000, 4099}, {320, 17}, 32, false, {}, "d=64 last-CTA merge, page 32"},
      {128, 4, 2, {5000}, {320}, 64, true, {}, "d=128 parallel merge"},
      {256, 4, 2, {5000}, {320}, 32, true, {}, "d=256 parallel merge, page 32"},
      {128, 4, 2, {5000}, {320}, 64, false, {}, "d=128 last-CTA merge"},
      {64, 4, 3, {3328, 1600, 1, 2816}, {320, 0, 5, 64}, 64, false, table, "d=64 split table"},
      {128, 4, 3, {3328, 1600, 1, 2816}, {320, 0, 5, 64}, 32, false, table, "d=128 split table, page 32"},
      {256, 8, 2, {4097, 1000, 63}, {7, 320, 0}, 256, false, {}, "d=256 ragged, page 256"},
      {128, 1, 8, {20000, 1, 700}, {320, 320, 320}, 128, false, {}, "d=128 g=1 ragged, page 128"}};
  for (const Layout& l : layouts) {
    DecodeCase c{l.dim, l.group, l.kv_heads, l.int2, l.bf16, l.page, 64, 4, true, l.label};
    c.parallel_merge = l.parallel;
    c.split_starts = l.split_starts;
    c.metadata = MetadataType::fp16;
    const std::vector<float> fp32_layout = run_case(c);
    c.fp16_storage = true;
    c.label += ", fp16 layout";
    const std::vector<float> fp16_layout = run_case(c);
    ASSERT_EQ(fp16_layout.size(), fp32_layout.size());
    EXPECT_EQ(std::memcmp(fp16_layout.data(), fp32_layout.data(), fp32_layout.size() * sizeof(float)), 0) << l.label;
  }
}

TEST(PagedDecode, RefusesUnsupportedShapes) {
  kernels::PagedDecodeParams p;
  p.batch = 1, p.num_kv_heads = 1, p.group = 4, p.head_dim = 96;
  EXPECT_THROW(kernels::check_paged_decode(p), std::invalid_argument);
  p.head_dim = 128, p.group = 9;
  EXPECT_THROW(kernels::check_paged_decode(p), std::invalid_argument);
  // INT2 pages must be a power of two.
  std::vector<float> dummy(16);
  std::vector<int32_t> idummy(4);
  p.group = 4, p.queries = dummy.data(), p.partial_out = dummy.data(), p.partial_lse2 = dummy.data();
  p.softmax_scale = 1.f, p.int2_splits = 1, p.int2_chunk = 128, p.int2_page_size = 48;
  p.key_codes = p.value_codes = reinterpret_cast<const uint8_t*>(dummy.data());
  p.int2_metadata = dummy.data(), p.int2_page_table = p.int2_lengths = idummy.data();
  EXPECT_THROW(kernels::check_paged_decode(p), std::invalid_argument);
  p.int2_page_size = 64;
  EXPECT_NO_THROW(kernels::check_paged_decode(p));
  // The fp16 metadata layout needs pages of >= 32 tokens.
  p.int2_metadata_fp16 = true, p.int2_page_size = 16;
  EXPECT_THROW(kernels::check_paged_decode(p), std::invalid_argument);
  p.int2_page_size = 32;
  EXPECT_NO_THROW(kernels::check_paged_decode(p));
}

TEST(PagedDecode, RefusesAPlanThatDoesNotCoverTheCache) {
  // A plan made by hand with too few splits (or a split table that ends early) would leave tokens unread.
  DecodeCase c{128, 4, 2, {3000, 2000}, {320, 100}, 64, 64, 4, true, "coverage"};
  HostPagedCache host = random_cache(c, 5);
  DevicePagedCache dev;
  dev.upload(host);
  const size_t qn = static_cast<size_t>(c.int2_lengths.size()) * c.kv_heads * c.group * c.dim;
  DeviceBuffer<float> dq(qn), dout(qn);
  CudaPagedDecoder decoder;
  CudaDecodePlan plan;
  plan.int2_chunk = 1024, plan.int2_splits = 3, plan.bf16_chunk = 128, plan.bf16_splits = 3;
  plan.parallel_merge = false;
  const auto run = [&] { decoder.run(dev, plan, dq.get(), 0.1f, nullptr, dout.get()); };
  EXPECT_NO_THROW(run());
  plan.int2_splits = 2;  // 2048 of 3000 INT2 tokens
  EXPECT_THROW(run(), Error);
  plan.int2_splits = 3, plan.bf16_splits = 2;  // 256 of 320 BF16 tokens
  EXPECT_THROW(run(), Error);
  plan.bf16_splits = 3, plan.int2_split_start = {0, 1024, 2048, 2944};  // a table that ends before 3000
  EXPECT_THROW(run(), Error);
  plan.int2_split_start.back() = 3072;
  EXPECT_NO_THROW(run());
  plan.int2_split_start.clear();
  using Piece = CudaDecodePlan::Int2Piece;
  plan.int2_pieces = {{1, 0, 1024}, {1, 1024, 2000}, {1, 0, 1024}};  // sequence 1 twice over, sequence 0 none
  EXPECT_THROW(run(), Error);
  plan.int2_pieces = {{1, 0, 2000}, {0, 0, 1024}, {0, 1024, 2048}};  // sequence 0: 2048 of 3000 INT2 tokens
  EXPECT_THROW(run(), Error);
  plan.int2_pieces = {{1, 0, 2000}, {0, 0, 1024}, {0, 1024, 3000}};  // a piece of 1976 > int2_chunk
  EXPECT_THROW(run(), Error);
  plan.int2_pieces = {{1, 0, 2000}, {0, 0, 1000}, {0, 1000, 2000}, {0, 2000, 3000}};  // not whole quanta
  EXPECT_THROW(run(), Error);
  plan.int2_pieces = {{1, 1024, 2000}, {0, 2048, 3000}, {0, 0, 1024}, {1, 0, 1024}, {0, 1024, 2048}};
  EXPECT_NO_THROW(run());
  plan.int2_pieces.push_back(Piece{0, 3072, 3200});  // a fourth piece of sequence 0, past its tokens
  EXPECT_THROW(run(), Error);
  cuda_check(cudaDeviceSynchronize(), "decode");
}

TEST(CudaDecodeBackend, MatchesCpuBackend) {
  const int d = 128, history = 777, sink = 64, recent = 100, nq = 4;
  auto k = test::random_normal(static_cast<size_t>(history) * d, 1), v = test::random_normal(static_cast<size_t>(history) * d, 2);
  QuantizerConfig config;
  config.group_size = 0;
  config.clip_ratio = 0.96f;
  QuantizedRows hk = quantize_rows(k.data(), history, d, config), hv = quantize_rows(v.data(), history, d, config);
  auto sk = test::random_normal(static_cast<size_t>(sink) * d, 3), sv = test::random_normal(static_cast<size_t>(sink) * d, 4);
  auto rk = test::random_normal(static_cast<size_t>(recent) * d, 5), rv = test::random_normal(static_cast<size_t>(recent) * d, 6);
  for (auto* vec : {&sk, &sv, &rk, &rv})
    for (auto& x : *vec) x = round_to_bf16(x);
  SegmentedCacheView view;
  view.dim = d;
  view.sink_tokens = sink, view.sink_keys = sk.data(), view.sink_values = sv.data();
  view.history_keys = &hk, view.history_values = &hv;
  view.recent_tokens = recent, view.recent_keys = rk.data(), view.recent_values = rv.data();
  auto q = test::random_normal(static_cast<size_t>(nq) * d, 7, 2.0f);
  auto rot = test::random_normal(static_cast<size_t>(d) * d, 8, 1.0f / std::sqrt(128.0f));
  DecodeRequest request;
  request.cache = &view;
  request.queries = q.data();
  request.num_queries = nq;
  request.softmax_scale = 1.0 / std::sqrt(128.0);
  request.value_rotation = rot.data();
  std::vector<float> cpu(static_cast<size_t>(nq) * d), gpu(cpu.size());
  make_decode_backend("cpu")->decode(request, cpu.data());
  make_decode_backend("cuda")->decode(request, gpu.data());
  EXPECT_LT(test::relative_error(gpu, cpu), 2e-3);
}

}  // namespace
}  // namespace oscar
