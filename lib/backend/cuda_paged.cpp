// Host side of the CUDA decode path (see cuda_paged.h): uploads, split planning, the two launches.
#ifdef OSCAR_WITH_CUDA
#include "backend/cuda_paged.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>
#include <stdexcept>

#include "common/error.h"
#include "bandwidth_probe.h"
#include "decode_merge.h"
#include "paged_decode.h"

#ifndef OSCAR_PARALLEL_SPLIT_COST
#define OSCAR_PARALLEL_SPLIT_COST 10.0
#endif

namespace oscar {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("{}: {}", what, cudaGetErrorString(status));
}

void DevicePagedCache::upload(const HostPagedCache& host) {
  geometry = host.geometry;
  int2_max_pages = host.int2_max_pages;
  bf16_max_pages = host.bf16_max_pages;
  max_int2_length = *std::max_element(host.int2_lengths.begin(), host.int2_lengths.end());
  max_bf16_length = *std::max_element(host.bf16_lengths.begin(), host.bf16_lengths.end());
  min_int2_length = *std::min_element(host.int2_lengths.begin(), host.int2_lengths.end());
  host_int2_lengths = host.int2_lengths;
  host_bf16_lengths = host.bf16_lengths;
  int2_lengths.upload(host.int2_lengths);
  bf16_lengths.upload(host.bf16_lengths);
  int2_page_table.upload(host.int2_page_table);
  bf16_page_table.upload(host.bf16_page_table);
  key_codes.upload(host.key_codes);
  value_codes.upload(host.value_codes);
  if (geometry.int2_metadata_fp16) {
    const std::vector<uint16_t> half = int2_metadata_fp16(host);
    int2_metadata.upload(reinterpret_cast<const uint8_t*>(half.data()), half.size() * sizeof(uint16_t));
  } else {
    int2_metadata.upload(reinterpret_cast<const uint8_t*>(host.int2_metadata.data()),
                         host.int2_metadata.size() * sizeof(float));
  }
  bf16_keys.upload(host.bf16_keys);
  bf16_values.upload(host.bf16_values);
}

namespace {
struct PoolShape {
  int max_pages = 1, pages = 1;
  std::vector<int32_t> table;
};
PoolShape sequential_pages(const std::vector<int32_t>& lengths, int page_size) {
  PoolShape s;
  s.pages = 0;
  for (int32_t n : lengths) s.max_pages = std::max(s.max_pages, (n + page_size - 1) / page_size);
  s.table.assign(lengths.size() * s.max_pages, -1);
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int i = 0; i < (lengths[b] + page_size - 1) / page_size; ++i) s.table[b * s.max_pages + i] = s.pages++;
  s.pages = std::max(s.pages, 1);
  return s;
}
}  // namespace

size_t paged_cache_device_bytes(const PagedCacheGeometry& g, const std::vector<int32_t>& int2_lengths,
                                const std::vector<int32_t>& bf16_lengths) {
  const size_t int2_rows = static_cast<size_t>(sequential_pages(int2_lengths, g.int2_page_size).pages) *
                           g.num_kv_heads * g.int2_page_size;
  const size_t bf16_rows = static_cast<size_t>(sequential_pages(bf16_lengths, g.bf16_page_size).pages) *
                           g.num_kv_heads * g.bf16_page_size;
  return int2_rows * (2 * g.head_dim / 4 + g.int2_metadata_row_bytes()) + bf16_rows * 4 * g.head_dim;
}

size_t DevicePagedCache::device_bytes() const {
  return key_codes.size() * 2 + int2_metadata.size() + bf16_keys.size() * 4;
}

void DevicePagedCache::allocate_random(const PagedCacheGeometry& g, const std::vector<int32_t>& int2,
                                       const std::vector<int32_t>& bf16, uint64_t seed) {
  geometry = g;
  PoolShape s2 = sequential_pages(int2, g.int2_page_size), s16 = sequential_pages(bf16, g.bf16_page_size);
  int2_max_pages = s2.max_pages;
  bf16_max_pages = s16.max_pages;
  max_int2_length = *std::max_element(int2.begin(), int2.end());
  max_bf16_length = *std::max_element(bf16.begin(), bf16.end());
  min_int2_length = *std::min_element(int2.begin(), int2.end());
  host_int2_lengths = int2;
  host_bf16_lengths = bf16;
  int2_lengths.upload(int2);
  bf16_lengths.upload(bf16);
  int2_page_table.upload(s2.table);
  bf16_page_table.upload(s16.table);
  const size_t int2_rows = static_cast<size_t>(s2.pages) * g.num_kv_heads * g.int2_page_size;
  const size_t bf16_rows = static_cast<size_t>(s16.pages) * g.num_kv_heads * g.bf16_page_size;
  key_codes.resize(int2_rows * g.head_dim / 4);
  value_codes.resize(int2_rows * g.head_dim / 4);
  int2_metadata.resize(int2_rows * g.int2_metadata_row_bytes());
  bf16_keys.resize(bf16_rows * g.head_dim);
  bf16_values.resize(bf16_rows * g.head_dim);
  kernels::launch_fill_random_bytes(key_codes.get(), key_codes.size(), seed + 1, nullptr);
  kernels::launch_fill_random_bytes(value_codes.get(), value_codes.size(), seed + 2, nullptr);
  kernels::launch_fill_random_metadata(int2_metadata.get(), int2_rows, g.int2_metadata_fp16, seed + 3, nullptr);
  kernels::launch_fill_random_bf16(bf16_keys.get(), bf16_keys.size(), seed + 4, nullptr);
  kernels::launch_fill_random_bf16(bf16_values.get(), bf16_values.size(), seed + 5, nullptr);
  cuda_check(cudaGetLastError(), "random fill");
  cuda_check(cudaDeviceSynchronize(), "random fill");
}

int cuda_multiprocessor_count() {
  int device = 0, count = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

namespace {
// Planner cost of one more INT2 split per pair (in tokens) when the parallel merge applies.
constexpr double kParallelSplitCost = OSCAR_PARALLEL_SPLIT_COST;
// Parallel-merge grids of one sequence with at most this many KV heads cut their BF16 tier finer (plan_cuda_decode).
constexpr int kFineBf16MaxKvHeads = 8;

// Split starts (splits + 1 token offsets, whole quanta, none empty) over `length` tokens whose sizes fall linearly
// from `first` to 2 - `first` times the mean (first = 1: equal splits). Needs 1 <= splits <= the length's quanta.
std::vector<int> falling_starts(long length, int splits, double first) {
  const long q = kernels::kInt2SplitQuantum, quanta = (length + q - 1) / q;
  std::vector<double> cumulative(splits + 1, 0.0);
  for (int s = 0; s < splits; ++s)
    cumulative[s + 1] = cumulative[s] + (splits > 1 ? first - 2 * (first - 1) * s / (splits - 1) : 1.0);
  std::vector<int> start(splits + 1, 0);
  for (int s = 1; s <= splits; ++s) {
    const long at = std::lround(static_cast<double>(quanta) * cumulative[s] / cumulative[splits]);
    const long lo = start[s - 1] / q + 1, hi = quanta - (splits - s);
    start[s] = static_cast<int>(std::clamp(at, lo, hi) * q);
  }
  return start;
}

// Whether a plan's grid can end with merge CTAs (see CudaDecodePlan::merge_ctas): merged in the grid but not in
// parallel, an INT2 tier, the fused merge's scratch, the lengths on the host (for the work list), and fewer pairs than
// CTAs resident at once: merge CTAs spin until their pair's partials are written, and then, whatever order the grid is
// dispatched in, the spinning ones leave a slot to the work they wait for.
bool merge_ctas_possible(const DevicePagedCache& cache, const CudaDecodePlan& plan, bool parallel, long resident) {
  const auto& g = cache.geometry;
  const size_t batch = static_cast<size_t>(g.batch);
  return !parallel && plan.int2_splits > 0 && static_cast<long>(g.batch) * g.num_kv_heads < resident &&
         cache.host_int2_lengths.size() == batch && cache.host_bf16_lengths.size() == batch &&
         kernels::fused_merge_fits(plan.splits_total(), g.group, g.head_dim);
}

// Ragged batches of long sequences: every sequence gets its own number of INT2 pieces (see plan_cuda_decode).
using Int2Piece = CudaDecodePlan::Int2Piece;
// INT2 tokens per split at most: long CTAs leave the end of the launch waiting on the slowest of them, and the
// planner's waves count does not see it (H200, batch 64 / 128K: 1 split of 130816 tokens 1821 us, 4 of 32768 1649
// us, 11 of 11904 1625 us; batch 32 / 32K: 2 of 16256 242.6 us, 4 of 8192 237.5 us).
constexpr long kMaxChunk = 12288;
// Ragged grids the planner models: at most 16 waves (finer splits never won in the model on batches 2-128 at 4K-128K;
// the bound keeps a plan within ~7 ms on a 2-core machine for batches 8-1024 at 100K, against ~160 ms at batch 256
// without it).
constexpr long kMaxRaggedWaves = 16;

// The sequences by ascending length (ties in index order): ragged grids take them so (H200, Qwen3-8B, batches 8-64:
// the same lengths longest first were 1.3-10 % slower on every ragged shape, e.g. 8 / 32K 47.7 -> 52.6 us, 64 / 8K
// 94.0 -> 99.3).
std::vector<int32_t> ascending_order(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lengths[a] < lengths[b]; });
  return order;
}

// Piece counts for at most `budget` pieces per KV head: starting from the fewest of <= kMaxChunk tokens, each further
// piece goes to the sequence whose pieces are longest on average (which minimises the longest mean). A sequence
// without INT2 tokens gets none, or one (empty) where there is no BF16 tier to give it a partial. Empty if even the
// fewest exceed the budget.
std::vector<long> balanced_counts(const std::vector<int32_t>& lengths, long budget, bool bf16_tier) {
  const long q = kernels::kInt2SplitQuantum;
  auto mean = [&](size_t b, long n) { return (lengths[b] + n - 1) / n; };
  std::vector<long> n(lengths.size());
  std::priority_queue<std::pair<long, size_t>> next;  // (mean piece, sequence) of those that can take one more
  long used = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    n[b] = lengths[b] > 0 ? (lengths[b] + kMaxChunk - 1) / kMaxChunk : (bf16_tier ? 0 : 1);
    used += n[b];
    if (n[b] > 0 && n[b] < (lengths[b] + q - 1) / q) next.push({mean(b, n[b]), b});
  }
  if (used > budget) return {};
  for (; used < budget && !next.empty(); ++used) {
    const size_t b = next.top().second;
    next.pop();
    if (++n[b] < (lengths[b] + q - 1) / q) next.push({mean(b, n[b]), b});
  }
  return n;
}

// Ragged batches: the plan's cost is the end of a greedy fill of the slots with the CTAs in grid order, each taking
// its tokens plus a start-up cost (BF16 tokens weighted by their bytes), plus the last CTA's merge per split. Costs
// in INT2 tokens, fitted on H200 A/Bs of forced split counts with equal chunks (ragged batch 8 / 32K, 100K, 128K, 32 /
// 8K, 32K, 64 / 8K, 32K): the fit's picks were within 1.5 % of the fastest count on each, where the waves of the
// longest sequence (the uniform rule) lost 8-11 % (and 24 % at ragged 4 / 128K).
constexpr double kCtaStart = 1024, kMergePerSplit = 100;
double slot_fill_end(const std::vector<double>& costs, long slots) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (long i = 0; i < std::min<long>(slots, static_cast<long>(costs.size())); ++i) free_at.push(0.0);
  double end = 0;
  for (double cost : costs) {
    const double t = free_at.top() + cost;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}
// Equal chunks: splits x pairs CTAs, pair-major, the sequences shortest first; the splits past a short sequence's end
// are empty and leave their slot at once (equal_pieces leaves them out; the fit had them).
double equal_chunk_makespan(const std::vector<int32_t>& sorted_lengths, int kv_heads, long chunk, long splits,
                            long slots) {
  constexpr double kEmpty = 64;
  std::vector<double> costs;
  for (int32_t len : sorted_lengths)
    for (int h = 0; h < kv_heads; ++h)
      for (long k = 0; k < splits; ++k) {
        const long tokens = std::clamp(len - k * chunk, 0L, chunk);
        costs.push_back(tokens > 0 ? static_cast<double>(tokens) + kCtaStart : kEmpty);
      }
  return slot_fill_end(costs, slots) + kMergePerSplit * static_cast<double>(splits);
}
// Pieces, then the BF16 splits.
double pieces_makespan(const std::vector<Int2Piece>& pieces, const std::vector<int32_t>& bf16_lengths, int kv_heads,
                       long bf16_splits, long bf16_chunk, double bf16_weight, long slots) {
  std::vector<double> costs;
  std::vector<long> count(bf16_lengths.size(), bf16_splits);
  for (const Int2Piece& piece : pieces) {
    ++count[piece.sequence];
    costs.insert(costs.end(), kv_heads, piece.end - piece.begin + kCtaStart);
  }
  for (int32_t len : bf16_lengths)
    for (long k = 0; k < bf16_splits; ++k)
      costs.insert(costs.end(), kv_heads, bf16_weight * std::clamp(len - k * bf16_chunk, 0L, bf16_chunk) + kCtaStart);
  return slot_fill_end(costs, slots) + kMergePerSplit * static_cast<double>(*std::max_element(count.begin(), count.end()));
}

// Pieces of equal chunks, pair-major, shortest sequence first (ties in index order): a sequence without INT2 tokens
// gets none, or the empty piece where there is no BF16 tier.
std::vector<Int2Piece> equal_pieces(const std::vector<int32_t>& lengths, int chunk, bool bf16_tier) {
  std::vector<Int2Piece> pieces;
  for (int32_t b : ascending_order(lengths)) {
    if (lengths[b] == 0 && !bf16_tier) pieces.push_back({b, 0, 0});
    for (int begin = 0; begin < lengths[b]; begin += chunk)
      pieces.push_back({b, begin, std::min(lengths[b], begin + chunk)});
  }
  return pieces;
}
// The grid order of the largest piece first (ties in their order).
void sort_largest_first(std::vector<Int2Piece>& pieces) {
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Int2Piece& x, const Int2Piece& y) { return x.end - x.begin > y.end - y.begin; });
}
// The INT2 chunk of s splits of len tokens: ceil(len / s) rounded up to the split quantum. (A chunk that leaves fewer
// than s splits is the same grid as a smaller s.)
long split_chunk(long len, long s, long q = kernels::kInt2SplitQuantum) {
  return ((len + s - 1) / s + q - 1) / q * q;
}
}  // namespace

CudaDecodePlan plan_cuda_decode(const DevicePagedCache& cache, int num_sms, int ctas_per_sm) {
  const auto& g = cache.geometry;
  CudaDecodePlan plan;
  const int per_sm = ctas_per_sm > 0 ? ctas_per_sm : kernels::paged_decode_ctas_per_sm(g.head_dim);
  const long slots = std::max(1L, static_cast<long>(num_sms) * per_sm);
  const long pairs = static_cast<long>(g.batch) * g.num_kv_heads;
  // The parallel merge (see run) needs the splits, the BF16 splits and its merge CTAs resident at once.
  const long resident = static_cast<long>(num_sms) * kernels::paged_decode_ctas_per_sm(g.head_dim);
  const long parallel_merge_ctas = pairs * kernels::parallel_merge_parts(g.group, g.head_dim);
  // BF16 CTAs run last, so none is longer than 1/8 of an INT2 CTA (see below).
  auto longest_bf16 = [](long int2_chunk) {
    const long q16 = kernels::kBf16SplitQuantum;
    return std::max(q16, int2_chunk / 8 / q16 * q16);
  };
  bool parallel = false;
  double best = 0;  // the INT2 plan's cost (tokens)
  const bool ragged = cache.min_int2_length < cache.max_int2_length &&
                      cache.host_int2_lengths.size() == static_cast<size_t>(g.batch);
  if (cache.max_int2_length > 0) {
    // INT2 splits: minimise (waves of CTAs) x (tokens per CTA + a fixed start-up cost) + a merge cost
    // per split, over chunks that are multiples of the split quantum (or of kInt2ChunkQuantum, below; costs in
    // tokens).
    const long q = kernels::kInt2SplitQuantum, len = cache.max_int2_length;
    // The search starts at chunks of kMaxChunk. Ragged batches (not merged in parallel): the cost is
    // equal_chunk_makespan, for grids of at most kMaxRaggedWaves waves.
    constexpr long kShortSplit = 2304;
    std::vector<int32_t> sorted_lengths = cache.host_int2_lengths;
    std::sort(sorted_lengths.begin(), sorted_lengths.end());
    // Each split count s is tried twice: with a chunk of whole quanta, and (fine) of whole kInt2ChunkQuantum
    // halves, which only the parallel merge's one-wave grids take: there the longest split sets the end (H200,
    // batch 1 / 100K: 49 splits of 2112 tokens, 392 CTAs, three on all but four multiprocessors, instead of 47 of
    // 2176, 29.3 -> 29.0 us; other batch-1 and batch-2 shapes within noise).
    for (long s2 = 2 * ((len + kMaxChunk - 1) / kMaxChunk); s2 <= 2 * ((len + q - 1) / q) + 1; ++s2) {
      const long s = s2 / 2;
      const bool fine = s2 % 2 == 1;
      const long chunk = split_chunk(len, s, fine ? kernels::kInt2ChunkQuantum : q);
      const long splits = (len + chunk - 1) / chunk;
      if (splits != s) continue;  // the same chunk as a smaller s
      if (ragged && pairs * splits > kMaxRaggedWaves * slots && plan.int2_splits > 0) continue;
      const long waves = (pairs * splits + slots - 1) / slots;
      // The merge (last CTA per sequence and KV head) reads every split serially: ~100 tokens' worth
      // of time per split (batch 1 / 100K measured 58.6 us with 32 splits vs 68.9 us with 62).
      double cost = static_cast<double>(waves) * (chunk + 384) + 100.0 * splits;
      // The parallel merge reads up to 64 splits in one round, so more splits are cheap; then a CTA's
      // speed depends on how many INT2 CTAs share its multiprocessor (H200, batch 1 / 100K, 0.85 us per
      // 128-token step with 2, 1.29 with 4: an SM streams 1.32x more with 4, its CTAs run 1.52x
      // slower; batch 1 / 100K 38.3 / 35.0 / 39.1 us for 40 / 47 / 54 splits of 2560 / 2176 / 1920).
      const long bf16_splits = cache.max_bf16_length > 0 ? (cache.max_bf16_length + longest_bf16(chunk) - 1) / longest_bf16(chunk) : 0;
      // The merge CTAs hold slots that splits could stream in. A split count is costed as a parallel-merge
      // grid where they take at most 1/8 of the slots (batch 1 at g <= 4), or at most half of them with
      // splits of <= kShortSplit tokens, whose time the last CTA's serial merge would lengthen most (H200,
      // same call: batch 1 / 32K at g = 8 24.6 -> 22.1 us, d = 256 39.0 -> 32.0; batch 2 / 32K at Hkv = 4,
      // g = 7 24.3 -> 20.1; but batch 2 / 100K at g = 4, 24 splits of 4224, 55.3 -> 61.4 us, and batch 1 /
      // 128K at g = 8, 47 splits of 2816, 44.2 -> 46.8).
      const bool merge_share =
          8 * parallel_merge_ctas <= resident || (2 * parallel_merge_ctas <= resident && chunk <= kShortSplit);
      const bool fits = merge_share && pairs * (splits + bf16_splits) + parallel_merge_ctas <= resident;
      if (fits) {
        const long per_sm = (pairs * splits + num_sms - 1) / num_sms;
        const double slowdown = per_sm <= 2 ? 1.0 : 1.0 + 0.26 * static_cast<double>(per_sm - 2);
        cost = (chunk + 384) * slowdown + kParallelSplitCost * splits;
      } else if (ragged && pairs * splits <= kMaxRaggedWaves * slots) {
        cost = equal_chunk_makespan(sorted_lengths, g.num_kv_heads, chunk, splits, slots);
      }
      // (Fine chunks only where the parallel merge will run: the other plans may become split tables or work
      // pieces, which keep whole quanta, and were tuned with them.)
      if (fine && (!fits || chunk % q == 0 || !kernels::parallel_merge_fits(splits + bf16_splits, g.head_dim) ||
                   !kernels::fused_merge_fits(splits + bf16_splits, g.group, g.head_dim)))
        continue;
      if (plan.int2_splits == 0 || cost < best) {
        best = cost;
        plan.int2_splits = static_cast<int>(splits);
        plan.int2_chunk = static_cast<int>(chunk);
        parallel = fits;
      }
    }
  }
  // Ragged batches merged by the last CTA: equal chunks (the sequences shortest first, as pieces where the batch is
  // not in that order, or as pieces largest first where the model prefers that: below), or where the longest sequence
  // has >= kBalancedMinLength INT2 tokens, INT2 pieces (a work list) balanced over the sequences. Each sequence gets
  // its own number of pieces (balanced_counts) for grids of w waves of slots, their BF16 CTAs included, from the
  // fewest waves the pieces of <= kMaxChunk need to 15 more: the grid of least pieces_makespan. Inside a sequence the
  // piece sizes fall from 1.3 to 0.7 times its mean, and the grid takes the pieces largest first, so that the
  // smallest fill the multiprocessors that finish first (as the uniform split tables below). H200, Qwen3-8B, against
  // equal chunks, same call, three rounds: ragged 8 / 100K 110.3 -> 106.5 us, 8 / 128K 135.6 -> 128.7, 32 / 100K
  // 361.8 -> 345.3, 32 / 128K 447.7 -> 433.5, 64 / 100K 674.4 -> 667.5, 64 / 128K 850.9 -> 839.4; but at 32K and
  // 8K, whose pieces are short, 1.3-8 % slower (8 / 32K 48.1 -> 51.9, 32 / 32K 138.0 -> 146.0, 32 / 8K 58.3 ->
  // 67.4), and at 64 / 32K 1.3 % faster.
  constexpr long kBalancedMinLength = 65536;
  bool balanced = false;
  // The slot-fill model of a grid of pieces (pieces_makespan) and the BF16 splits that go with INT2 pieces.
  const long q16 = kernels::kBf16SplitQuantum;
  const double bf16_weight = 4.0 * g.head_dim / (g.head_dim / 2 + g.int2_metadata_row_bytes());
  const std::vector<int32_t>& lengths = cache.host_int2_lengths;
  const std::vector<int32_t> bf16_lengths = cache.host_bf16_lengths.size() == static_cast<size_t>(g.batch)
                                                ? cache.host_bf16_lengths
                                                : std::vector<int32_t>(g.batch, cache.max_bf16_length);
  auto bf16_split_count = [&](long int2_chunk) {  // BF16 CTAs of at most 1/8 of an INT2 CTA, as below
    return (cache.max_bf16_length + longest_bf16(int2_chunk) - 1) / longest_bf16(int2_chunk);
  };
  auto bf16_chunk_of = [&](long bf16_splits) {
    return bf16_splits > 0 ? (cache.max_bf16_length + bf16_splits * q16 - 1) / (bf16_splits * q16) * q16 : q16;
  };
  if (ragged && !parallel && cache.max_int2_length >= kBalancedMinLength) {
    const std::vector<int32_t> order = ascending_order(lengths);
    long fewest = 0;
    for (int32_t n : lengths) fewest += (n + kMaxChunk - 1) / kMaxChunk;
    const long w0 = std::max(1L, (fewest * g.num_kv_heads + pairs * bf16_split_count(kMaxChunk) + slots - 1) / slots);
    double balanced_best = 0;
    for (long w = w0; w < w0 + 16; ++w) {
      long b16 = bf16_split_count(kMaxChunk);
      std::vector<long> counts;
      for (int pass = 0; pass < 2; ++pass) {  // again if the pieces came out short enough for more BF16 splits
        counts = balanced_counts(lengths, (w * slots - pairs * b16) / g.num_kv_heads, b16 > 0);
        long longest = 0;
        for (size_t b = 0; b < counts.size(); ++b)
          if (counts[b] > 0) longest = std::max<long>(longest, (lengths[b] + counts[b] - 1) / counts[b]);
        if (counts.empty() || bf16_split_count(longest) == b16) break;
        b16 = bf16_split_count(longest);
      }
      if (counts.empty()) continue;
      const long most = *std::max_element(counts.begin(), counts.end());
      if (!kernels::fused_merge_fits(static_cast<int>(most + b16), g.group, g.head_dim)) continue;
      std::vector<Int2Piece> pieces;
      for (int32_t b : order) {
        if (lengths[b] == 0 && counts[b] > 0) pieces.push_back({b, 0, 0});
        if (lengths[b] == 0) continue;
        const std::vector<int> start = falling_starts(lengths[b], static_cast<int>(counts[b]), 1.3);
        for (size_t k = 0; k + 1 < start.size(); ++k) pieces.push_back({b, start[k], start[k + 1]});
      }
      sort_largest_first(pieces);
      const long bf16_chunk = bf16_chunk_of(b16);
      const double cost = pieces_makespan(pieces, bf16_lengths, g.num_kv_heads, b16, bf16_chunk, bf16_weight, slots);
      if (!balanced || cost < balanced_best) {
        balanced = true, balanced_best = cost;
        plan.int2_splits = static_cast<int>(most);
        plan.int2_chunk = std::max(pieces.front().end - pieces.front().begin, 1);
        plan.int2_pieces = std::move(pieces);
        plan.bf16_splits = static_cast<int>(b16), plan.bf16_chunk = static_cast<int>(bf16_chunk);
      }
    }
  }
  if (cache.max_bf16_length > 0 && !balanced) {
    // BF16 CTAs follow the INT2 CTAs in the grid: as many as the slots the INT2 CTAs' last wave leaves
    // free (few long ones at large batches: batch 32 / 8K 82.3 -> 77.1 us with 1 split instead of 3), but
    // none longer than 1/8 of an INT2 CTA, since they run last (batch 8 / 8K, 1024-token INT2 CTAs: one
    // 320-token BF16 split 39.5 us, three 36.7 us).
    // At batch 1 with at most 8 KV heads (parallel merge) the BF16 splits are multiples of 64 tokens, not 128: more,
    // shorter BF16 CTAs in the free slots, so that the multiprocessors holding one beside their INT2 CTAs end sooner.
    // H200, interleaved A/B, best of 3 (log, forty-third round), batch 1, geometric mean over 8K-128K: Qwen3-8B -2.9 %
    // (1 / 8K 12.8 -> 12.1 us, 1 / 100K 28.1 -> 27.4), d = 64 -1.3 %, g = 8 -1.3 %, d = 256 -0.3 %, Qwen2.5-7B (4 KV
    // heads) -2.5 %. Not for MHA (32 KV heads: 1 / 8K +3 % in one of two calls) nor at batch 2: d = 64 2 / 32K +11 %,
    // 2 / 100K +18 %; Qwen2.5-7B 2 / 8K -6 % but 2 / 32K +7 %.
    const bool fine = parallel && g.batch == 1 && g.num_kv_heads <= kFineBf16MaxKvHeads;
    const long q16 = fine ? kernels::kBf16ParallelQuantum : kernels::kBf16SplitQuantum;
    const long int2_ctas = pairs * plan.int2_splits;
    long free_slots = int2_ctas > 0 ? (int2_ctas + slots - 1) / slots * slots - int2_ctas : slots;
    // A whole number of BF16 splits per pair, so that the grid the INT2 plan fitted stays one wave
    // (choose_split_chunk rounds the splits up).
    if (parallel) free_slots = std::min(free_slots, (resident - int2_ctas - parallel_merge_ctas) / pairs * pairs);
    const long longest = longest_bf16(plan.int2_chunk);
    const long min_splits = int2_ctas > 0 ? (cache.max_bf16_length + longest - 1) / longest : 1;
    plan.bf16_chunk = kernels::choose_split_chunk(cache.max_bf16_length, g.batch, g.num_kv_heads,
                                                  static_cast<int>(std::max(free_slots, pairs * min_splits)), q16);
    plan.bf16_splits = (cache.max_bf16_length + plan.bf16_chunk - 1) / plan.bf16_chunk;
  }
  if (plan.splits_total() == 0) plan.bf16_splits = 1;  // every split empty: the output is zeros
  // Ragged batches below kBalancedMinLength: the equal chunks of 2 or more splits as pieces, largest first (each
  // sequence's remainder among the smallest), where the slot-fill model puts such a grid of more than one wave
  // kLargestFirstGain below the chosen one (taken shortest first). H200, Qwen3-8B, against the shortest-first grids,
  // same call, two rounds: ragged 16 / 4K 32.5 -> 29.6 us, 16 / 8K 38.5 -> 37.3, 8 / 16K 35.7 -> 34.8, 16 / 16K 52.5 ->
  // 49.3, 32 / 32K 134.9 -> 130.8 (3 splits of 10880 against 6 of 5504), 64 / 32K 245.2 -> 233.9, 16 / 48K 104.6 ->
  // 100.6, 8 / 60K 71.4 -> 68.8, 16 / 60K 125.1 -> 121.5; but 32 / 16K 84.9 -> 86.7 and 8 / 48K 60.5 -> 61.4 (the
  // model's gains, 8-22 %, do not tell these apart). Not with one split, whose pieces are whole sequences longest
  // first (128 / 4K 114.9 -> 123.2, 128 / 8K 161.1 -> 175.3: see ascending_order), nor in one wave, which the model
  // takes for balanced but the board does not run so (8 / 32K 47.5 -> 48.6 us with 8 splits).
  constexpr double kLargestFirstGain = 0.05;
  bool largest_first = false;
  if (ragged && !parallel && !balanced && plan.int2_splits > 0) {
    double best_pieces = (1.0 - kLargestFirstGain) *
                         pieces_makespan(equal_pieces(lengths, plan.int2_chunk, plan.bf16_splits > 0), bf16_lengths,
                                         g.num_kv_heads, plan.bf16_splits, plan.bf16_chunk, bf16_weight, slots);
    const long q = kernels::kInt2SplitQuantum, len = cache.max_int2_length;
    for (long s = std::max(2L, (len + kMaxChunk - 1) / kMaxChunk); s <= (len + q - 1) / q; ++s) {
      const long chunk = split_chunk(len, s);
      if ((len + chunk - 1) / chunk != s) continue;  // the same chunk as a smaller s
      const long b16 = cache.max_bf16_length > 0 ? bf16_split_count(chunk) : 0;
      std::vector<Int2Piece> pieces = equal_pieces(lengths, static_cast<int>(chunk), b16 > 0);
      const long ctas = static_cast<long>(pieces.size()) * g.num_kv_heads + pairs * b16;
      if (ctas > kMaxRaggedWaves * slots) break;
      if (ctas <= slots || !kernels::fused_merge_fits(static_cast<int>(s + b16), g.group, g.head_dim)) continue;
      sort_largest_first(pieces);
      const double cost =
          pieces_makespan(pieces, bf16_lengths, g.num_kv_heads, b16, bf16_chunk_of(b16), bf16_weight, slots);
      if (cost < best_pieces) {
        best_pieces = cost, largest_first = true;
        plan.int2_splits = static_cast<int>(s), plan.int2_chunk = static_cast<int>(chunk);
        plan.int2_pieces = std::move(pieces);
        plan.bf16_splits = static_cast<int>(b16), plan.bf16_chunk = static_cast<int>(bf16_chunk_of(b16));
      }
    }
  }
  // Equal chunks of a ragged batch not shortest first: the same grid, reordered, as pieces. (Not for batches in that
  // order already: reading the work list cost their CTAs' start, e.g. ragged 64 / 8K 93.4 -> 96.0 us.)
  if (ragged && !parallel && !balanced && !largest_first &&
      !std::is_sorted(cache.host_int2_lengths.begin(), cache.host_int2_lengths.end()) &&
      kernels::fused_merge_fits(plan.splits_total(), g.group, g.head_dim))
    plan.int2_pieces = equal_pieces(cache.host_int2_lengths, plan.int2_chunk, plan.bf16_splits > 0);
  // A multiprocessor runs the CTAs it received first ahead of its later ones (H200, batch 64 / 8K: four
  // equal CTAs started together on one multiprocessor ended after 82, 94, 108 and 123 us), so a wave of
  // equal CTAs ends over a long stretch. Where the INT2 CTAs make two or more waves, they go split-major with
  // split sizes falling linearly from `first` to 2 - `first` times the mean: the first waves get the largest
  // pieces, and the smallest fill the multiprocessors that finish first. Two waves: 1.3 -> 0.7 (H200, same
  // call, two rounds: batch 8 / 100K 176.8 -> 171.2 us, 32 / 32K 217.9 -> ~215 us with sizes 35:30:20:15 or
  // 30:27:23:20; 1.5 -> 0.5 was up to 1.4 % slower). Three or more: 1.7 -> 0.3 (H200, against equal splits, same
  // call, two rounds, 35 shapes of 3-9 waves in five geometries: geometric mean -1.2 %, up to -4 %, e.g.
  // Qwen3-8B 16 / 128K 385.5 -> 372.5 us, 32 / 100K 589.2 -> 574.6; worst +0.5 %, Gemma-2-9B 8 / 100K).
  // Uniform batches only: with ragged lengths the largest pieces of short sequences are empty or short, and
  // the table cost up to 5 % (ragged batch 8 / 100K 132.9 -> 137.8 us, 8 / 128K 164.7 -> 173.5).
  const long int2_ctas = pairs * plan.int2_splits, int2_waves = (int2_ctas + slots - 1) / slots;
  if (!parallel && cache.min_int2_length == cache.max_int2_length && plan.int2_splits >= 2 &&
      plan.int2_splits <= kernels::kDecodeMaxTableSplits && int2_waves >= 2) {
    plan.int2_split_start = falling_starts(cache.max_int2_length, plan.int2_splits, int2_waves == 2 ? 1.3 : 1.7);
    int largest = 0;
    for (int s = 1; s <= plan.int2_splits; ++s)
      largest = std::max(largest, plan.int2_split_start[s] - plan.int2_split_start[s - 1]);
    plan.int2_chunk = largest;
  } else if (!parallel && cache.min_int2_length == cache.max_int2_length &&
             plan.int2_splits <= kernels::kDecodeMaxTableSplits && int2_ctas > 0 && int2_ctas <= slots &&
             plan.int2_chunk >= 2048) {
    // One wave of INT2 CTAs (uniform lengths): the same equal splits as a table, so that the launch takes
    // the split-table kernel, whose staged merge is shorter (the merges end these launches: H200, batch
    // 64 / 8K, 512 merges in the last ~20 us, 4-11 us each) and whose BF16-tier CTAs fetch tile 1's key
    // rows early. Same call, three rounds: batch 64 / 8K 127.2-127.9 -> 124.4-125.2 us, 8 / 32K 68.4-69.2
    // -> 65.3-66.4, 32 / 8K 73.2-73.3 -> 72.0-72.2. Not for short CTAs (batch 8 / 8K, 1024-token splits:
    // 36.0-36.4 -> 36.6-36.8 us) nor ragged lengths (split-major order: ragged batch 8 / 32K 56.3-56.7 ->
    // 61.4-62.0 us).
    plan.int2_split_start.assign(plan.int2_splits + 1, 0);
    for (int s = 1; s <= plan.int2_splits; ++s) plan.int2_split_start[s] = s * plan.int2_chunk;
  }
  // Grids of one to two waves merged in the grid: a merge CTA per pair at the end of the grid folds the pair's
  // partials as their CTAs finish and un-rotates (kernels::PagedDecodeParams::merge_flags), instead of each pair's last
  // CTA merging alone after it; the grid runs as a work list (plan.int2_pieces, or the splits as pieces: see run).
  // H200, Qwen3-8B, against the last-CTA merge, same call, two rounds: ragged 64 / 8K 88.1 -> 83.0 us, 32 / 8K 54.8 ->
  // 50.4, 32 / 32K 131.4 -> 126.7, 8 / 100K 100.7 -> 99.6; uniform 8 / 8K 34.1 -> 30.9, 32 / 8K 67.5 -> 65.0, 64 / 8K
  // 116.4 -> 114.4; but ragged 8 / 8K 24.8 -> 25.4. (One-wave grids keep the last-CTA merge: their merge CTAs would
  // hold slots from the start.)
  // At most two waves: in longer grids the merges are a small share, and the work list (which drops the split-table
  // kernel) cost more than the merge CTAs saved in other geometries (H200, against merge CTAs in every multi-wave grid,
  // same call: Llama-3.2-1B, d = 64, 64 / 100K 612.7 -> 591.2 us, 32 / 100K 314.3 -> 304.5; Llama-3-70B, g = 8, ragged
  // 64 / 100K 694.0 -> 672.5; Qwen3-8B's calls of more than two waves -0.1 to +1.9 %, e.g. ragged 32 / 100K 328.4 ->
  // 334.5, its two-wave calls within 0.8 %).
  if (merge_ctas_possible(cache, plan, parallel, resident)) {
    const long work_ctas = plan.int2_pieces.empty()
                               ? pairs * plan.splits_total()
                               : static_cast<long>(plan.int2_pieces.size()) * g.num_kv_heads + pairs * plan.bf16_splits;
    plan.merge_ctas = work_ctas > slots && work_ctas <= 2 * slots;
    // Ragged batches whose merge CTAs would take at most half the resident slots get merge_cta_parts(d) per pair,
    // each folding the pair's partials and un-rotating a share of the columns: the last merge's un-rotation ends the
    // launch (1.0-1.4 us of ~6 us after the last piece at ragged 8 / 100K, traced), and then runs on that many
    // multiprocessors. H200, one binary, 4 against 1 per pair: Qwen3-8B ragged 8 / 8K, 32K, 100K -6.9, -5.6, -2.9 %,
    // Llama-3-70B's -6.5, -1.4, +2.0 %, Qwen2.5-7B's 8 / 32K -3.1 %. Uniform grids, whose merges all come at the end
    // together, moved -0.6 to +2.4 %, and grids with merge CTAs on most slots (Qwen2.5-7B batch 32: 512) +0.6-2.6 %.
    const int parts = kernels::merge_cta_parts(g.head_dim);
    if (plan.merge_ctas && ragged && 2 * pairs * parts <= resident) plan.merge_cta_parts = parts;
  }
  return plan;
}

namespace {
// The INT2 pieces of a plan without them, in its grid's order: a split table's splits split-major, else each sequence's
// equal chunks (see equal_pieces).
std::vector<CudaDecodePlan::Int2Piece> pieces_of_splits(const DevicePagedCache& cache, const CudaDecodePlan& plan) {
  if (plan.int2_split_start.size() != static_cast<size_t>(plan.int2_splits) + 1)
    return equal_pieces(cache.host_int2_lengths, plan.int2_chunk, plan.bf16_splits > 0);
  std::vector<CudaDecodePlan::Int2Piece> pieces;
  for (int s = 0; s < plan.int2_splits; ++s)
    for (int b = 0; b < cache.geometry.batch; ++b)
      if (plan.int2_split_start[s] < cache.host_int2_lengths[b] || (s == 0 && plan.bf16_splits == 0))
        pieces.push_back({b, plan.int2_split_start[s], plan.int2_split_start[s + 1]});
  return pieces;
}
}  // namespace

bool runs_parallel_merge(const PagedCacheGeometry& g, const CudaDecodePlan& plan) {
  // Its CTAs wait on the splits, so they and all splits must be resident at once.
  const long pairs = static_cast<long>(g.batch) * g.num_kv_heads;
  return plan.parallel_merge && plan.int2_pieces.empty() &&
         kernels::fused_merge_fits(plan.splits_total(), g.group, g.head_dim) &&
         kernels::parallel_merge_fits(plan.splits_total(), g.head_dim) &&
         pairs * (plan.splits_total() + kernels::parallel_merge_parts(g.group, g.head_dim)) <=
             static_cast<long>(cuda_multiprocessor_count()) * kernels::paged_decode_ctas_per_sm(g.head_dim);
}

bool runs_split_table(const CudaDecodePlan& plan, bool parallel_merge) {
  return !parallel_merge && plan.int2_split_start.size() == static_cast<size_t>(plan.int2_splits) + 1;
}

namespace {
// The grid of INT2 pieces (the plan's or its splits as pieces): a CTA per piece and KV head in the pieces' order, then
// the BF16 CTAs by sequence (in the order of their first pieces), KV head and split, then merge_parts merge CTAs per
// pair in that order (none: merged by the last CTA). A pair's partial slots: its pieces in grid order, then its BF16
// splits. Throws unless each sequence's pieces tile its INT2 tokens from 0 in whole quanta within the plan's
// int2_splits x int2_chunk, and every pair gets a partial.
std::vector<kernels::DecodeWork> work_list(const DevicePagedCache& cache, const CudaDecodePlan& plan,
                                           const std::vector<CudaDecodePlan::Int2Piece>& pieces, int merge_parts) {
  const auto& g = cache.geometry;
  OSCAR_CHECK(cache.host_int2_lengths.size() == static_cast<size_t>(g.batch) &&
                  cache.host_bf16_lengths.size() == static_cast<size_t>(g.batch),
              "cuda decode: INT2 pieces need the cache's lengths on the host");
  std::vector<std::vector<std::pair<int, int>>> ranges(g.batch);
  for (const auto& piece : pieces) {
    OSCAR_CHECK(piece.sequence >= 0 && piece.sequence < g.batch, "cuda decode: an INT2 piece of sequence {} (batch {})",
                piece.sequence, g.batch);
    ranges[piece.sequence].push_back({piece.begin, piece.end});
  }
  std::vector<int> count(g.batch);
  for (int b = 0; b < g.batch; ++b) {
    auto r = ranges[b];
    std::sort(r.begin(), r.end());
    const long len = cache.host_int2_lengths[b];
    bool ok = static_cast<int>(r.size()) <= plan.int2_splits && (len == 0 || !r.empty());
    for (size_t i = 0; ok && i < r.size(); ++i) {
      const int begin = r[i].first, end = r[i].second, size = end - begin;
      ok = begin == (i == 0 ? 0 : r[i - 1].second) && begin % kernels::kInt2SplitQuantum == 0 &&
           size <= plan.int2_chunk && (size > 0 || (len == 0 && r.size() == 1));
    }
    ok = ok && (r.empty() || r.back().second >= len);
    OSCAR_CHECK(ok, "cuda decode: sequence {}'s {} INT2 pieces do not tile its {} tokens from 0 in whole quanta within "
                "the plan's {} x {}", b, r.size(), len, plan.int2_splits, plan.int2_chunk);
    count[b] = static_cast<int>(r.size()) + plan.bf16_splits;
    OSCAR_CHECK(count[b] >= 1, "cuda decode: sequence {} has neither an INT2 piece nor a BF16 split", b);
  }
  std::vector<kernels::DecodeWork> work;
  std::vector<int> next(static_cast<size_t>(g.batch) * g.num_kv_heads, 0);  // next free slot per pair
  auto add = [&](int32_t b, int kv, long begin, long end) {
    kernels::DecodeWork w;
    w.pair = b * g.num_kv_heads + kv;
    w.slot = static_cast<uint16_t>(next[w.pair]++), w.count = static_cast<uint16_t>(count[b]);
    w.begin = static_cast<int32_t>(begin), w.end = static_cast<int32_t>(std::max(begin, end));
    work.push_back(w);
  };
  for (const auto& piece : pieces)
    for (int kv = 0; kv < g.num_kv_heads; ++kv)
      add(piece.sequence, kv, piece.begin, std::min<long>(cache.host_int2_lengths[piece.sequence], piece.end));
  std::vector<int32_t> order;  // the sequences by their first piece, then those without one
  std::vector<char> listed(g.batch, 0);
  for (const auto& piece : pieces)
    if (!listed[piece.sequence]) listed[piece.sequence] = 1, order.push_back(piece.sequence);
  for (int b = 0; b < g.batch; ++b)
    if (!listed[b]) order.push_back(b);
  for (int32_t b : order)
    for (int kv = 0; kv < g.num_kv_heads; ++kv)
      for (int k = 0; k < plan.bf16_splits; ++k)
        add(b, kv, static_cast<long>(k) * plan.bf16_chunk,
            std::min<long>(cache.host_bf16_lengths[b], static_cast<long>(k + 1) * plan.bf16_chunk));
  for (int32_t b : order)  // the merge CTAs, in the order of the sequences' first pieces
    for (int kv = 0; kv < g.num_kv_heads; ++kv)
      for (int part = 0; part < merge_parts; ++part) {
        kernels::DecodeWork w;
        w.pair = b * g.num_kv_heads + kv, w.slot = static_cast<uint16_t>(part), w.count = static_cast<uint16_t>(count[b]);
        work.push_back(w);
      }
  return work;
}
}  // namespace

void CudaPagedDecoder::run(const DevicePagedCache& cache, const CudaDecodePlan& planned, const float* queries,
                           float softmax_scale, const float* value_rotation_t, float* out, cudaStream_t stream) {
  const auto& g = cache.geometry;
  // A plan for the parallel merge may cut the BF16 tier in multiples of kBf16ParallelQuantum, which only its kernels
  // take; run another way (parallel_merge turned off, a grid that does not fit), its BF16 splits become whole
  // multiples of kBf16SplitQuantum.
  CudaDecodePlan rechunked;
  const CudaDecodePlan* chosen = &planned;
  if (planned.bf16_chunk % kernels::kBf16SplitQuantum != 0 && !runs_parallel_merge(g, planned)) {
    rechunked = planned;
    const long q = kernels::kBf16SplitQuantum;
    rechunked.bf16_chunk = static_cast<int>((planned.bf16_chunk + q - 1) / q * q);
    rechunked.bf16_splits = static_cast<int>((cache.max_bf16_length + rechunked.bf16_chunk - 1) / rechunked.bf16_chunk);
    if (rechunked.splits_total() == 0) rechunked.bf16_splits = 1;
    chosen = &rechunked;
  }
  const CudaDecodePlan& plan = *chosen;
  const size_t parts = static_cast<size_t>(g.batch) * g.num_kv_heads * plan.splits_total() * g.group;
  if (partial_lse2_.size() < parts) {
    partial_out_.resize(parts * g.head_dim);
    partial_lse2_.resize(parts);
  }
  const size_t int2_rows = cache.int2_metadata.size() / g.int2_metadata_row_bytes();
  OSCAR_CHECK(int2_rows < (size_t{1} << 32), "cuda decode: INT2 pool of {} rows exceeds 2^32", int2_rows);
  const size_t pairs = static_cast<size_t>(g.batch) * g.num_kv_heads;
  const bool fused = kernels::fused_merge_fits(plan.splits_total(), g.group, g.head_dim);
  const int merge_parts = kernels::parallel_merge_parts(g.group, g.head_dim);
  const bool parallel = runs_parallel_merge(g, plan);
  // Merge CTAs (the plan's choice) run the grid as a work list: the plan's pieces or its splits as pieces.
  const long resident = static_cast<long>(cuda_multiprocessor_count()) * kernels::paged_decode_ctas_per_sm(g.head_dim);
  const bool merge_ctas = plan.merge_ctas && merge_ctas_possible(cache, plan, parallel, resident);
  OSCAR_CHECK(plan.merge_cta_parts == 1 || plan.merge_cta_parts == kernels::merge_cta_parts(g.head_dim),
              "cuda decode: {} merge CTAs per pair (1 or {} at d = {})", plan.merge_cta_parts,
              kernels::merge_cta_parts(g.head_dim), g.head_dim);
  // As many merge CTAs as resident CTAs could leave their pairs' work no slot: then one per pair.
  const int merge_cta_parts =
      !merge_ctas ? 0 : (static_cast<long>(pairs) * plan.merge_cta_parts < resident ? plan.merge_cta_parts : 1);
  const bool table = !merge_ctas && runs_split_table(plan, parallel);
  // A plan made by hand must cover every token: the kernel reads only its splits' ranges.
  const long int2_cover = table ? plan.int2_split_start.back() : static_cast<long>(plan.int2_splits) * plan.int2_chunk;
  OSCAR_CHECK(int2_cover >= cache.max_int2_length, "cuda decode: the plan's INT2 splits cover {} of {} tokens", int2_cover,
              cache.max_int2_length);
  OSCAR_CHECK(static_cast<long>(plan.bf16_splits) * plan.bf16_chunk >= cache.max_bf16_length,
              "cuda decode: the plan's BF16 splits cover {} of {} tokens",
              static_cast<long>(plan.bf16_splits) * plan.bf16_chunk, cache.max_bf16_length);
  if (fused && counters_.size() < 2 * pairs) {  // [pairs] arrivals, [pairs] parallel-merge done counts
    counters_.resize(2 * pairs);
    cuda_check(cudaMemsetAsync(counters_.get(), 0, 2 * pairs * sizeof(unsigned), stream), "cudaMemsetAsync");
  }
  kernels::PagedDecodeParams p;
  p.batch = g.batch;
  p.num_kv_heads = g.num_kv_heads;
  p.group = g.group;
  p.head_dim = g.head_dim;
  p.softmax_scale = softmax_scale;
  p.queries = queries;
  p.int2_page_size = g.int2_page_size;
  p.key_codes = cache.key_codes.get();
  p.value_codes = cache.value_codes.get();
  p.int2_metadata = cache.int2_metadata.get();
  p.int2_metadata_fp16 = g.int2_metadata_fp16;
  p.int2_page_table = cache.int2_page_table.get();
  p.int2_max_pages = cache.int2_max_pages;
  p.int2_lengths = cache.int2_lengths.get();
  if (!plan.int2_pieces.empty() || merge_ctas) {
    OSCAR_CHECK(fused && !parallel && !table,
                "cuda decode: INT2 pieces need the merge in the grid (last CTA or merge CTAs)");
    const std::vector<CudaDecodePlan::Int2Piece> split_pieces =
        plan.int2_pieces.empty() ? pieces_of_splits(cache, plan) : std::vector<CudaDecodePlan::Int2Piece>{};
    const auto& pieces = plan.int2_pieces.empty() ? split_pieces : plan.int2_pieces;
    const WorkInputs& in = work_inputs_;
    const bool same = work_ctas_ > 0 && in.merge_parts == merge_cta_parts && in.pieces == pieces &&
                      in.int2_lengths == cache.host_int2_lengths &&
                      in.bf16_lengths == cache.host_bf16_lengths && in.num_kv_heads == g.num_kv_heads &&
                      in.int2_splits == plan.int2_splits && in.int2_chunk == plan.int2_chunk &&
                      in.bf16_splits == plan.bf16_splits && in.bf16_chunk == plan.bf16_chunk;
    if (!same) {
      const std::vector<kernels::DecodeWork> work = work_list(cache, plan, pieces, merge_cta_parts);
      work_.upload(work);
      work_ctas_ = static_cast<int>(work.size());
      work_inputs_ = {pieces,           cache.host_int2_lengths, cache.host_bf16_lengths, g.num_kv_heads,
                      plan.int2_splits, plan.int2_chunk,         plan.bf16_splits,        plan.bf16_chunk,
                      merge_cta_parts};
    }
    p.work = work_.get();
    p.work_ctas = static_cast<int>(work_ctas_ - pairs * merge_cta_parts);
    p.work_int2_ctas = static_cast<int>(p.work_ctas - pairs * plan.bf16_splits);
    if (merge_ctas) {
      const size_t n = pairs * plan.splits_total();
      if (flags_.size() < n) {
        flags_.resize(n);
        cuda_check(cudaMemsetAsync(flags_.get(), 0, n * sizeof(unsigned), stream), "cudaMemsetAsync");
        epoch_ = 0;
      }
      if (++epoch_ == 0) {  // after 2^32 - 1 calls: flags back to zero
        cuda_check(cudaMemsetAsync(flags_.get(), 0, flags_.size() * sizeof(unsigned), stream), "cudaMemsetAsync");
        epoch_ = 1;
      }
      p.merge_flags = flags_.get();
      p.merge_epoch = epoch_;
      p.work_merge_ctas = static_cast<int>(pairs * merge_cta_parts);
      p.merge_cta_parts = merge_cta_parts;
    }
  }
  p.int2_splits = plan.int2_splits;
  p.int2_chunk = plan.int2_chunk;
  p.bf16_page_size = g.bf16_page_size;
  p.bf16_keys = cache.bf16_keys.get();
  p.bf16_values = cache.bf16_values.get();
  p.bf16_page_table = cache.bf16_page_table.get();
  p.bf16_max_pages = cache.bf16_max_pages;
  p.bf16_lengths = cache.bf16_lengths.get();
  p.bf16_splits = plan.bf16_splits;
  p.bf16_chunk = plan.bf16_chunk;
  p.partial_out = partial_out_.get();
  p.partial_lse2 = partial_lse2_.get();
  if (table) {
    p.int2_split_table = true;
    std::copy(plan.int2_split_start.begin(), plan.int2_split_start.end(), p.int2_split_start);
  }
  if (fused) {  // one launch: the last CTA of each (sequence, KV head) merges and un-rotates
    p.merge_counters = counters_.get();
    if (parallel) p.merge_parts = merge_parts, p.merge_done = counters_.get() + pairs;
    p.value_rotation_t = value_rotation_t;
    p.out = out;
    try {
      kernels::launch_paged_decode(p, stream);
    } catch (const std::invalid_argument& e) {
      fail("cuda decode: {}", e.what());
    }
    cuda_check(cudaGetLastError(), "paged decode launch");
    return;
  }
  kernels::DecodeMergeParams m;
  m.batch = g.batch;
  m.num_kv_heads = g.num_kv_heads;
  m.group = g.group;
  m.head_dim = g.head_dim;
  m.splits_total = plan.splits_total();
  m.partial_out = p.partial_out;
  m.partial_lse2 = p.partial_lse2;
  m.value_rotation_t = value_rotation_t;
  m.out = out;
  try {
    kernels::launch_paged_decode(p, stream);
    cuda_check(cudaGetLastError(), "paged decode launch");
    kernels::launch_decode_merge(m, stream);
    cuda_check(cudaGetLastError(), "decode merge launch");
  } catch (const std::invalid_argument& e) {
    fail("cuda decode: {}", e.what());
  }
}

}  // namespace oscar
#endif
