// Statistics tests: accumulation equals a naive double loop, halves merge to the whole, layer
// shards merge, geometry mismatches are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "capture/synthetic.h"
#include "common/error.h"
#include "covariance/accumulate.h"

namespace oscar {
namespace {

std::string write_synthetic(const std::string& name, const SyntheticSpec& spec, int64_t first_sequence = 0,
                            int sequences = -1) {
  const std::string path = testing::TempDir() + "/" + name;
  if (sequences < 0) sequences = spec.sequences;
  DumpInfo info;
  info.geometry = spec.geometry;
  info.dtype = StorageType::float32;
  for (int s = 0; s <= sequences; ++s) info.sequence_offsets.push_back(s * spec.tokens_per_sequence);
  for (int l = 0; l < spec.geometry.num_layers; ++l) info.layers.push_back(l);
  DumpWriter writer(path, info);
  for (int l = 0; l < spec.geometry.num_layers; ++l) {
    LayerActivations all = synthesize_layer(spec, l), part;
    const auto& g = spec.geometry;
    const size_t q_row = g.num_q_heads * g.head_dim, kv_row = g.num_kv_heads * g.head_dim;
    const size_t t0 = first_sequence * spec.tokens_per_sequence, t1 = t0 + sequences * spec.tokens_per_sequence;
    part.layer = l;
    part.tokens = t1 - t0;
    part.q.assign(all.q.begin() + t0 * q_row, all.q.begin() + t1 * q_row);
    part.k.assign(all.k.begin() + t0 * kv_row, all.k.begin() + t1 * kv_row);
    part.v.assign(all.v.begin() + t0 * kv_row, all.v.begin() + t1 * kv_row);
    writer.write_layer(part);
  }
  writer.finish();
  return path;
}

SyntheticSpec small_spec() {
  SyntheticSpec spec;
  spec.geometry = {2, 6, 2, 16, true};
  spec.tokens_per_sequence = 77;
  spec.sequences = 2;
  spec.seed = 4;
  return spec;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (double x : b) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst / std::max(scale, 1e-300);
}

// Enough tokens for several blocks and several of the accumulation's sub-blocks.
SyntheticSpec long_spec() {
  SyntheticSpec spec = small_spec();
  spec.tokens_per_sequence = 700;
  return spec;
}

TEST(Covariance, MatchesNaiveDoubleLoop) {
  SyntheticSpec spec = long_spec();
  const std::string path = write_synthetic("naive.h5", spec);
  AccumulateOptions options;
  options.block_tokens = 1000;  // rounded up to 1024: blocks do not align with the 700-token sequences
  options.quiet = true;
  options.score_queries = 5;
  Statistics stats = accumulate_statistics({path}, options);
  const auto& g = spec.geometry;
  const int d = g.head_dim, group = g.group_size();
  DumpReader reader(path);
  for (int layer = 0; layer < g.num_layers; ++layer) {
    LayerActivations a = reader.read_layer(layer);
    const LayerStatistics& ls = *stats.find_layer(layer);
    for (int h = 0; h < g.num_kv_heads; ++h) {
      std::vector<double> query(d * d, 0.0), key(d * d, 0.0), value(d * d, 0.0), proxy(d * d, 0.0);
      for (int64_t t = 0; t < a.tokens; ++t)
        for (int j = 0; j < group; ++j)
          for (int r = 0; r < d; ++r)
            for (int c = 0; c < d; ++c)
              query[r * d + c] += static_cast<double>(a.q[(t * g.num_q_heads + h * group + j) * d + r]) *
                                  a.q[(t * g.num_q_heads + h * group + j) * d + c];
      double weight_sum = 0;
      for (int64_t t = 0; t < a.tokens; ++t) {
        const float* k = &a.k[(t * g.num_kv_heads + h) * d];
        const float* v = &a.v[(t * g.num_kv_heads + h) * d];
        double w = 0;
        for (int r = 0; r < d; ++r)
          for (int c = 0; c < d; ++c) w += k[r] * (query[r * d + c] / (a.tokens * group)) * k[c];
        weight_sum += w;
        for (int r = 0; r < d; ++r)
          for (int c = 0; c < d; ++c) {
            key[r * d + c] += static_cast<double>(k[r]) * k[c];
            value[r * d + c] += static_cast<double>(v[r]) * v[c];
            proxy[r * d + c] += w * v[r] * v[c];
          }
      }
      auto head = [&](Target t) {
        const auto& s = ls.of(t).sum;
        return std::vector<double>(s.begin() + h * d * d, s.begin() + (h + 1) * d * d);
      };
      EXPECT_LT(max_relative_difference(head(Target::key_query), query), 1e-12);
      EXPECT_LT(max_relative_difference(head(Target::key_gram), key), 1e-12);
      EXPECT_LT(max_relative_difference(head(Target::value_gram), value), 1e-12);
      EXPECT_LT(max_relative_difference(head(Target::value_proxy), proxy), 1e-10);
      EXPECT_NEAR(ls.of(Target::value_proxy).weight[h], weight_sum, 1e-9 * weight_sum);
      EXPECT_EQ(ls.of(Target::key_query).weight[h], a.tokens * group);
      EXPECT_EQ(ls.of(Target::value_scores).weight[h], 2 * 5 * group);
    }
  }
}

TEST(Covariance, HalvesMergeToTheWhole) {
  SyntheticSpec spec = small_spec();
  const std::string whole = write_synthetic("whole.h5", spec);
  const std::string first = write_synthetic("first.h5", spec, 0, 1);
  const std::string second = write_synthetic("second.h5", spec, 1, 1);
  AccumulateOptions options;
  options.quiet = true;
  options.score_queries = 7;
  Statistics reference = accumulate_statistics({whole}, options);
  options.query_stats = &reference;  // shared C_Q for the proxy weights
  options.query_stats_source = "stats:whole";
  Statistics whole_stats = accumulate_statistics({whole}, options);
  Statistics merged = merge_statistics(accumulate_statistics({first}, options), accumulate_statistics({second}, options));
  for (const auto& layer : whole_stats.layers)
    for (Target t : kAllTargets) {
      EXPECT_LT(max_relative_difference(merged.find_layer(layer.layer)->of(t).sum, layer.of(t).sum), 1e-13)
          << target_name(t);
      EXPECT_LT(max_relative_difference(merged.find_layer(layer.layer)->of(t).weight, layer.of(t).weight), 1e-13);
    }
  EXPECT_EQ(merged.tokens, whole_stats.tokens);
  // Without a shared C_Q, token shards are refused rather than merged inexactly.
  AccumulateOptions own;
  own.quiet = true;
  EXPECT_THROW(merge_statistics(accumulate_statistics({first}, own), accumulate_statistics({second}, own)), Error);
}

TEST(Covariance, LayerShardsMergeExactly) {
  SyntheticSpec spec = small_spec();
  const std::string path = write_synthetic("layers.h5", spec);
  AccumulateOptions options;
  options.quiet = true;
  Statistics all = accumulate_statistics({path}, options);
  options.layers = {0};
  Statistics a = accumulate_statistics({path}, options);
  options.layers = {1};
  Statistics b = accumulate_statistics({path}, options);
  Statistics merged = merge_statistics(a, b);
  ASSERT_EQ(merged.layers.size(), 2u);
  for (const auto& layer : all.layers)
    for (Target t : kAllTargets) EXPECT_EQ(merged.find_layer(layer.layer)->of(t).sum, layer.of(t).sum);
}

TEST(Covariance, ThreadCountAndBlockSizeDoNotChangeOneBit) {
  // Work items, partial sums and the sub-blocks of the dsyrk calls are fixed by the geometry and the
  // token positions, not by the threads or the block size: any mix of them (the reader decoding chunks
  // on as many threads) gives bit-identical statistics. 11 sub-blocks of 512 tokens: with blocks of
  // 4096 and more, an item adds two or three sub-blocks in one block.
  SyntheticSpec spec = long_spec();
  spec.tokens_per_sequence = 2600;
  const std::string path = write_synthetic("threads.h5", spec);
  AccumulateOptions options;
  options.quiet = true;
  options.block_tokens = 512;
  options.threads = 1;
  const Statistics one = accumulate_statistics({path}, options);
  for (auto [threads, block] : {std::pair{3, 1024}, {8, 0}, {2, 700}, {5, 8192}}) {
    options.threads = threads;
    options.block_tokens = block;
    const Statistics many = accumulate_statistics({path}, options);
    for (const auto& layer : one.layers)
      for (Target t : kAllTargets) {
        EXPECT_EQ(many.find_layer(layer.layer)->of(t).sum, layer.of(t).sum) << threads << " threads, block " << block;
        EXPECT_EQ(many.find_layer(layer.layer)->of(t).weight, layer.of(t).weight) << threads << " threads";
      }
  }
}

TEST(Covariance, MergeRefusesDifferentGeometry) {
  SyntheticSpec spec = small_spec();
  AccumulateOptions options;
  options.quiet = true;
  Statistics a = accumulate_statistics({write_synthetic("g1.h5", spec)}, options);
  spec.geometry.head_dim = 8;
  Statistics b = accumulate_statistics({write_synthetic("g2.h5", spec)}, options);
  EXPECT_THROW(merge_statistics(a, b), Error);
}

TEST(Covariance, StatisticsFileRoundTrip) {
  SyntheticSpec spec = small_spec();
  AccumulateOptions options;
  options.quiet = true;
  Statistics a = accumulate_statistics({write_synthetic("rt.h5", spec)}, options);
  const std::string path = testing::TempDir() + "/stats_rt.h5";
  write_statistics(path, a);
  Statistics b = read_statistics(path);
  ASSERT_EQ(b.layers.size(), a.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (Target t : kAllTargets) EXPECT_EQ(b.layers[l].of(t).sum, a.layers[l].of(t).sum);
  EXPECT_EQ(b.inputs, a.inputs);
  EXPECT_EQ(b.proxy_query_source, a.proxy_query_source);
}

}  // namespace
}  // namespace oscar
