// Segmented cache tests: the serving tier split, incremental (paged) construction equal to the
// per-token encoding at every prefix, BPE from storage, and the per-tier merge equal to one softmax.
#include "cache/segmented_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/partial_attention.h"
#include "common/error.h"
#include "common/float16.h"

namespace oscar {
namespace {

std::vector<float> random_rows(int64_t rows, int dim, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(rows) * dim);
  for (auto& v : x) v = normal(rng);
  return x;
}

void expect_split(const TierSplit& s, int64_t sink, int64_t history, int64_t recent) {
  EXPECT_EQ(s.sink, sink);
  EXPECT_EQ(s.history, history);
  EXPECT_EQ(s.recent, recent);
}

TEST(SplitContext, ServingRuleWithPages) {
  CacheLayout layout{64, 256, 8};
  expect_split(split_context(0, layout), 0, 0, 0);
  expect_split(split_context(1, layout), 1, 0, 0);
  expect_split(split_context(64, layout), 64, 0, 0);
  expect_split(split_context(65, layout), 64, 0, 1);
  expect_split(split_context(320, layout), 64, 0, 256);
  expect_split(split_context(327, layout), 64, 0, 263);  // window full up to W + page - 1
  expect_split(split_context(328, layout), 64, 8, 256);  // first page demoted
  expect_split(split_context(329, layout), 64, 8, 257);
  expect_split(split_context(32768, layout), 64, 32448, 256);
  expect_split(split_context(131072, layout), 64, 130752, 256);
  // Odd layout: sink 4, window 3, page 8: 16 tokens past the sink -> one page demoted.
  expect_split(split_context(20, CacheLayout{4, 3, 8}), 4, 8, 8);
  // No recent window: every token past the sink is quantised on arrival (page irrelevant).
  expect_split(split_context(3, CacheLayout{0, 0, 8}), 0, 3, 0);
  expect_split(split_context(129, CacheLayout{1, 0, 8}), 1, 128, 0);
  EXPECT_THROW(split_context(-1, layout), Error);
  EXPECT_THROW(split_context(5, CacheLayout{1, 1, 0}), Error);
}

void expect_same_rows(const QuantizedRows& a, const QuantizedRows& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.zero, b.zero);
}

TEST(SegmentedCache, IncrementalEqualsPerTokenEncodingAtEveryPrefix) {
  const int d = 8;
  const int64_t tokens = 129;
  QuantizerConfig kq, vq;
  kq.clip_ratio = 0.75f;
  vq.group_size = 4;
  vq.metadata = MetadataType::bf16;
  auto keys = random_rows(tokens, d, 1), values = random_rows(tokens, d, 2);
  for (CacheLayout layout : {CacheLayout{3, 5, 4}, CacheLayout{0, 0, 8}, CacheLayout{2, 7, 3}}) {
    SegmentedCache cache(d, layout, kq, vq);
    const EncodedSequence encoded = EncodedSequence::encode(keys.data(), values.data(), tokens, d, kq, vq);
    for (int64_t t = 0; t < tokens; ++t) {
      cache.append(&keys[t * d], &values[t * d]);
      const TierSplit split = split_context(t + 1, layout);
      ASSERT_EQ(cache.split().sink, split.sink);
      ASSERT_EQ(cache.split().history, split.history);
      ASSERT_EQ(cache.split().recent, split.recent);
      const CacheSnapshot snapshot(encoded, split);
      const SegmentedCacheView a = cache.view(), b = snapshot.view();
      ASSERT_EQ(a.total_tokens(), t + 1);
      if (split.history > 0) {
        expect_same_rows(*a.history_keys, *b.history_keys);
        expect_same_rows(*a.history_values, *b.history_values);
      } else {
        EXPECT_EQ(a.history_keys, nullptr);
        EXPECT_EQ(b.history_keys, nullptr);
      }
      for (int64_t i = 0; i < split.sink * d; ++i) {
        ASSERT_EQ(a.sink_keys[i], b.sink_keys[i]);
        ASSERT_EQ(a.sink_values[i], b.sink_values[i]);
        ASSERT_EQ(a.sink_keys[i], round_to_bf16(keys[i]));
      }
      for (int64_t i = 0; i < split.recent * d; ++i) {
        ASSERT_EQ(a.recent_keys[i], b.recent_keys[i]);
        ASSERT_EQ(a.recent_values[i], b.recent_values[i]);
      }
      EXPECT_EQ(cache_storage_bits(a), cache_storage_bits(b));
    }
  }
}

TEST(SegmentedCache, StorageBitsCountCodesMetadataAndWindows) {
  // d = 8, G = 4, fp16: a history row is 8*2 code bits + 2 groups * 2 * 16 metadata bits = 80 bits.
  const int d = 8;
  QuantizerConfig q;
  q.group_size = 4;
  auto keys = random_rows(20, d, 3), values = random_rows(20, d, 4);
  const EncodedSequence e = EncodedSequence::encode(keys.data(), values.data(), 20, d, q, q);
  const CacheSnapshot s(e, split_context(20, CacheLayout{4, 3, 8}));  // 4 | 8 | 8
  EXPECT_DOUBLE_EQ(cache_storage_bits(s.view()), 2.0 * (8 * 80) + 2.0 * (4 + 8) * d * 16);
  EXPECT_DOUBLE_EQ(cache_bits_per_element(s.view()), (2.0 * 640 + 2.0 * 12 * 128) / (2.0 * 20 * d));
}

// BPE(L) from what is stored; the spec's formula gives 2.28 at 128K and 2.38 at 32K (G = 128, 16-bit
// metadata, windows 64/256).
TEST(SegmentedCache, BitsPerElementAtLongContextsMatchTheSpec) {
  const int d = 128;
  QuantizerConfig q;  // 2 bits, G = d = 128, fp16
  const CacheLayout layout{64, 256, 8};
  for (int64_t L : {int64_t{32768}, int64_t{131072}}) {
    auto keys = random_rows(L, d, 5), values = random_rows(L, d, 6);
    const EncodedSequence e = EncodedSequence::encode(keys.data(), values.data(), L, d, q, q);
    const CacheSnapshot s(e, split_context(L, layout));
    const double bpe = cache_bits_per_element(s.view());
    const double formula = ((64.0 + 256.0) * 16.0 + static_cast<double>(L - 64 - 256) * 2.25) / static_cast<double>(L);
    EXPECT_NEAR(bpe, formula, 1e-12);
    EXPECT_EQ(std::lround(bpe * 100), L == 131072 ? 228 : 238);
  }
  // fp32 metadata (the reference serving config): 2.5 bits in the history.
  QuantizerConfig q32;
  q32.metadata = MetadataType::fp32;
  auto keys = random_rows(1000, d, 7), values = random_rows(1000, d, 8);
  const EncodedSequence e = EncodedSequence::encode(keys.data(), values.data(), 1000, d, q32, q32);
  const CacheSnapshot s(e, split_context(1000, CacheLayout{0, 0, 8}));
  EXPECT_DOUBLE_EQ(cache_bits_per_element(s.view()), 2.5);
}

TEST(SegmentedCache, SliceAndAppendRoundTrip) {
  const int d = 12;
  QuantizerConfig q;
  q.bits = 3;
  q.group_size = 4;
  auto x = random_rows(7, d, 9);
  const QuantizedRows all = quantize_rows(x.data(), 7, d, q);
  QuantizedRows joined;
  append_rows(joined, slice_rows(all, 0, 3));
  append_rows(joined, slice_rows(all, 3, 0));
  append_rows(joined, slice_rows(all, 3, 4));
  expect_same_rows(joined, all);
  EXPECT_THROW(slice_rows(all, 5, 3), Error);
}

// The harness and the decode backends rely on this: attention split into the tiers of any context
// and merged by log-sum-exp equals one softmax over all tokens.
TEST(SegmentedCache, TierMergeEqualsOneSoftmax) {
  const int d = 16;
  const double scale = 1.0 / 4.0;
  for (int64_t L : {int64_t{1}, int64_t{3}, int64_t{127}, int64_t{129}, int64_t{333}}) {
    auto keys = random_rows(L, d, 10, 2.0f), values = random_rows(L, d, 11), q = random_rows(1, d, 12, 2.0f);
    const TierSplit split = split_context(L, CacheLayout{5, 17, 8});
    const int64_t bounds[4] = {0, split.history_begin(), split.recent_begin(), L};
    std::vector<PartialAttention> parts;
    for (int t = 0; t < 3; ++t)
      parts.push_back(partial_attention(q.data(), keys.data() + bounds[t] * d, values.data() + bounds[t] * d,
                                        static_cast<int>(bounds[t + 1] - bounds[t]), d, scale));
    const PartialAttention merged = merge_partials(parts);
    const auto p = attention_probabilities(q.data(), keys.data(), static_cast<int>(L), d, scale);
    for (int i = 0; i < d; ++i) {
      double o = 0;
      for (int64_t j = 0; j < L; ++j) o += p[j] * values[j * d + i];
      EXPECT_NEAR(merged.output[i], o, 1e-12) << "L=" << L << " i=" << i;
    }
    double lse = -INFINITY;
    {
      double m = -INFINITY;
      std::vector<double> logits(L);
      for (int64_t j = 0; j < L; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * keys[j * d + i];
        logits[j] = scale * dot;
        m = std::max(m, logits[j]);
      }
      double sum = 0;
      for (double l : logits) sum += std::exp(l - m);
      lse = m + std::log(sum);
    }
    EXPECT_NEAR(merged.log_sum_exp, lse, 1e-12);
  }
}

}  // namespace
}  // namespace oscar
