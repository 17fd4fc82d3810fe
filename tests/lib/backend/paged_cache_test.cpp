// CPU twins of the CUDA kernels: the paged layout must give the same decode as the segmented-cache
// CPU backend, and quantize_pack_rows_reference the same bytes as quantize_rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/decode_backend.h"
#include "backend/paged_cache.h"
#include "common/error.h"
#include "common/float16.h"

namespace oscar {
namespace {

std::vector<float> normal(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

TEST(PagedCache, QuantizePackReferenceMatchesQuantizeRows) {
  const int d = 128, rows = 37;
  auto x = normal(static_cast<size_t>(rows) * d, 1);
  QuantizerConfig config;
  config.clip_ratio = 0.96f;
  QuantizedRows q = quantize_rows(x.data(), rows, d, config);
  std::vector<uint8_t> codes(static_cast<size_t>(rows) * d / 4);
  std::vector<float> meta(static_cast<size_t>(rows) * 2);
  quantize_pack_rows_reference(x.data(), rows, d, nullptr, config, codes.data(), meta.data(), 2, 0, nullptr);
  EXPECT_EQ(codes, q.packed);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(meta[2 * r], q.scale[r]);
    EXPECT_EQ(meta[2 * r + 1], q.zero[r]);
  }
}

TEST(PagedCache, DecodeReferenceMatchesCpuBackend) {
  PagedCacheGeometry g;
  g.batch = 1, g.num_kv_heads = 1, g.group = 2, g.head_dim = 64, g.int2_page_size = 16, g.bf16_page_size = 32;
  const int n2 = 100, n16 = 40, d = 64;
  HostPagedCache cache = make_paged_cache(g, {n2}, {n16}, 3);
  auto k2 = normal(static_cast<size_t>(n2) * d, 2), v2 = normal(static_cast<size_t>(n2) * d, 3);
  auto k16 = normal(static_cast<size_t>(n16) * d, 4), v16 = normal(static_cast<size_t>(n16) * d, 5);
  for (auto* v : {&k16, &v16})
    for (auto& x : *v) x = round_to_bf16(x);
  QuantizerConfig config;
  config.metadata = MetadataType::fp32;
  fill_int2_tier(cache, 0, 0, k2.data(), v2.data(), n2, config, config);
  fill_bf16_tier(cache, 0, 0, k16.data(), v16.data(), n16);
  auto q = normal(2 * d, 6);
  std::vector<float> paged(2 * d), segmented(2 * d);
  paged_decode_reference(cache, q.data(), 0.125, nullptr, paged.data());
  QuantizedRows hk = quantize_rows(k2.data(), n2, d, config), hv = quantize_rows(v2.data(), n2, d, config);
  SegmentedCacheView view;
  view.dim = d;
  view.history_keys = &hk, view.history_values = &hv;
  view.recent_tokens = n16, view.recent_keys = k16.data(), view.recent_values = v16.data();
  DecodeRequest request;
  request.cache = &view;
  request.queries = q.data();
  request.num_queries = 2;
  request.softmax_scale = 0.125;
  make_cpu_decode_backend()->decode(request, segmented.data());
  for (int i = 0; i < 2 * d; ++i) EXPECT_NEAR(paged[i], segmented[i], 1e-6) << i;
}

TEST(PagedCache, RejectsBadPageSizes) {
  PagedCacheGeometry g;
  g.int2_page_size = 24;
  EXPECT_THROW(make_paged_cache(g, {1}, {1}), Error);
  g.int2_page_size = 16, g.int2_metadata_fp16 = true;  // the fp16 metadata layout: pages of >= 32 tokens
  EXPECT_THROW(make_paged_cache(g, {1}, {1}), Error);
  g.int2_page_size = 32;
  EXPECT_NO_THROW(make_paged_cache(g, {1}, {1}));
}

TEST(PagedCache, Fp16MetadataLayout) {
  PagedCacheGeometry g;
  g.batch = 2, g.num_kv_heads = 2, g.group = 2, g.head_dim = 64, g.int2_page_size = 32, g.bf16_page_size = 32;
  g.int2_metadata_fp16 = true;
  HostPagedCache cache = make_paged_cache(g, {70, 33}, {5, 0}, 3);
  // Bytes read per live token and KV head: d/4 codes for K and V + 4 fp16 values (fp32: 16 bytes).
  EXPECT_EQ(cache.int2_bytes_read(), (70 + 33) * 2 * (2 * 64 / 4 + 8));
  QuantizerConfig config;
  config.metadata = MetadataType::fp16;
  for (int b = 0; b < 2; ++b)
    for (int kv = 0; kv < 2; ++kv) {
      const int n = cache.int2_lengths[b];
      auto k = normal(static_cast<size_t>(n) * 64, 10 + 2 * b + kv);
      auto v = normal(static_cast<size_t>(n) * 64, 20 + 2 * b + kv);
      fill_int2_tier(cache, b, kv, k.data(), v.data(), n, config, config);
    }
  const std::vector<uint16_t> half = int2_metadata_fp16(cache);
  ASSERT_EQ(half.size(), cache.int2_metadata.size());
  for (size_t i = 0; i < half.size(); ++i) ASSERT_EQ(fp16_to_float(half[i]), cache.int2_metadata[i]) << i;
  // fp32 metadata is not fp16 values: refused, naming the row.
  config.metadata = MetadataType::fp32;
  auto k = normal(70 * 64, 1), v = normal(70 * 64, 2);
  fill_int2_tier(cache, 0, 1, k.data(), v.data(), 70, config, config);
  try {
    int2_metadata_fp16(cache);
    FAIL() << "fp32 metadata accepted by the fp16 layout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an fp16 value"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oscar
