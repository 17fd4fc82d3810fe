// Uniform group quantisers of the baselines: both zero-point conventions on hand-checked groups (bit-exact),
// round half to even, per-channel vs per-token axes, KIVI / OScaR window rules and storage bits.
#include "methods/baselines/uniform_group.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"

namespace oscar::baselines {
namespace {

TEST(BaselinesUniform, RoundHalfEven) {
  EXPECT_EQ(round_half_even(0.5f), 0.0f);
  EXPECT_EQ(round_half_even(1.5f), 2.0f);
  EXPECT_EQ(round_half_even(2.5f), 2.0f);
  EXPECT_EQ(round_half_even(-1.5f), -2.0f);
  EXPECT_EQ(round_half_even(-2.5f), -2.0f);
  EXPECT_EQ(round_half_even(2.4f), 2.0f);
  EXPECT_EQ(round_half_even(2.6f), 3.0f);
}

// x = {-1, 0.5, 2, 5}: min -1, max 5, scale (5 - -1)/3 = 2 (exact in every metadata type).
TEST(BaselinesUniform, FloatZeroGroupByHand) {
  const float x[4] = {-1.0f, 0.5f, 2.0f, 5.0f};
  uint8_t codes[4];
  const UniformConfig config{2, ZeroPoint::float_min, MetadataType::fp16};
  const GroupParams p = quantize_group(x, 4, 1, config, codes);
  EXPECT_EQ(p.scale, 2.0f);
  EXPECT_EQ(p.offset, -1.0f);
  // (x - min)/scale = 0, 0.75, 1.5, 3 -> 0, 1, 2 (half to even), 3
  const uint8_t expected[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], expected[i]) << i;
  const float expected_hat[4] = {-1.0f, 1.0f, 3.0f, 5.0f};  // code*2 - 1: min and max exact
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dequantize_code(codes[i], p, config.zero_point), expected_hat[i]);
}

TEST(BaselinesUniform, IntegerZeroGroupByHand) {
  const float x[4] = {-1.0f, 0.5f, 2.0f, 5.0f};
  uint8_t codes[4];
  const UniformConfig config{2, ZeroPoint::integer, MetadataType::fp16};
  const GroupParams p = quantize_group(x, 4, 1, config, codes);
  EXPECT_EQ(p.scale, 2.0f);
  EXPECT_EQ(p.offset, 0.0f);  // z = rne(1/2) = 0 (half to even)
  // rne(x/2) + 0 = rne(-0.5)=0, rne(0.25)=0, rne(1)=1, rne(2.5)=2
  const uint8_t expected[4] = {0, 0, 1, 2};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], expected[i]) << i;
  const float expected_hat[4] = {0.0f, 0.0f, 2.0f, 4.0f};  // the group's min and max are no longer exact
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dequantize_code(codes[i], p, config.zero_point), expected_hat[i]);

  // x = {-3, -1, 1, 3}: scale 2, z = rne(1.5) = 2; codes rne(x/2)+2 = rne(-1.5)+2=0, rne(-0.5)+2=2, rne(0.5)+2=2, rne(1.5)+2=4->3
  const float y[4] = {-3.0f, -1.0f, 1.0f, 3.0f};
  const GroupParams q = quantize_group(y, 4, 1, config, codes);
  EXPECT_EQ(q.offset, 2.0f);
  const uint8_t expected_y[4] = {0, 2, 2, 3};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], expected_y[i]) << i;
  EXPECT_EQ(dequantize_code(codes[3], q, config.zero_point), 2.0f);  // clamped at the top
}

// INT4 (int4-hadamard): x = {-3, 0, 4.5, 12}: scale 15/15 = 1, z = rne(3) = 3, codes rne(x) + 3 =
// 0, 3, 7 (4.5 -> 4, half to even), 15.
TEST(BaselinesUniform, Int4IntegerZeroByHand) {
  const float x[4] = {-3.0f, 0.0f, 4.5f, 12.0f};
  uint8_t codes[4];
  const UniformConfig config{4, ZeroPoint::integer, MetadataType::fp16};
  const GroupParams p = quantize_group(x, 4, 1, config, codes);
  EXPECT_EQ(p.scale, 1.0f);
  EXPECT_EQ(p.offset, 3.0f);
  const uint8_t expected[4] = {0, 3, 7, 15};
  const float expected_hat[4] = {-3.0f, 0.0f, 4.0f, 12.0f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(codes[i], expected[i]) << i;
    EXPECT_EQ(dequantize_code(codes[i], p, config.zero_point), expected_hat[i]) << i;
  }
}

TEST(BaselinesUniform, ConstantGroupIsExactAndStrideIsHonoured) {
  const float x[6] = {7.0f, 99.0f, 7.0f, 99.0f, 7.0f, 99.0f};  // stride 2 reads 7, 7, 7
  uint8_t codes[3];
  for (ZeroPoint z : {ZeroPoint::float_min, ZeroPoint::integer}) {
    const UniformConfig config{2, z, MetadataType::fp16};
    const GroupParams p = quantize_group(x, 3, 2, config, codes);
    for (int i = 0; i < 3; ++i) {
      const float v = dequantize_code(codes[i], p, z);
      if (z == ZeroPoint::float_min) EXPECT_EQ(v, 7.0f);
      else EXPECT_TRUE(std::isfinite(v));
    }
  }
}

// Scale and min are stored in fp16: the codes are chosen against the stored values.
TEST(BaselinesUniform, MetadataIsRoundedBeforeCoding) {
  const float x[2] = {0.1f, 1.0f};
  uint8_t codes[2];
  const GroupParams p = quantize_group(x, 2, 1, UniformConfig{2, ZeroPoint::float_min, MetadataType::fp16}, codes);
  EXPECT_EQ(p.offset, round_to_metadata(0.1f, MetadataType::fp16));
  EXPECT_EQ(p.scale, round_to_metadata(0.9f / 3.0f, MetadataType::fp16));
  EXPECT_NE(p.offset, 0.1f);
}

// Per-channel groups over tokens are per-token groups of the transposed matrix (bit-exact), on odd sizes.
TEST(BaselinesUniform, PerChannelIsPerTokenOfTheTranspose) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int group : {1, 3, 32}) {
    const int rows = group * 3, dim = 5;
    std::vector<float> x(rows * dim), xt(rows * dim);
    for (auto& v : x) v = normal(rng);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < dim; ++c) xt[c * rows + r] = x[r * dim + c];
    for (ZeroPoint z : {ZeroPoint::float_min, ZeroPoint::integer}) {
      const UniformConfig config{2, z, MetadataType::fp16};
      std::vector<float> a(x.size()), b(x.size());
      std::vector<uint8_t> codes(x.size());
      std::vector<GroupParams> params(rows / group * dim);
      quantize_per_channel(x.data(), rows, dim, group, config, a.data(), codes.data(), params.data());
      quantize_per_token(xt.data(), dim, rows, group, config, b.data());
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < dim; ++c) {
          ASSERT_EQ(a[r * dim + c], b[c * rows + r]);
          ASSERT_LE(codes[r * dim + c], 3);
        }
      // params are [rows/G, d]: block 1, channel 2 holds the min of x[G..2G-1][2] (float zero).
      if (z == ZeroPoint::float_min && group > 1) {
        float mn = x[group * dim + 2];
        for (int r = group; r < 2 * group; ++r) mn = std::min(mn, x[r * dim + 2]);
        EXPECT_EQ(params[1 * dim + 2].offset, round_to_metadata(mn, MetadataType::fp16));
      }
    }
  }
  std::vector<float> x(10), y(10);
  EXPECT_THROW(quantize_per_channel(x.data(), 5, 2, 2, UniformConfig{}, y.data()), Error);  // 5 tokens, G = 2
  EXPECT_THROW(quantize_per_token(x.data(), 2, 5, 2, UniformConfig{}, y.data()), Error);    // G does not divide d
}

// Reconstruction error bound: |x - x_hat| <= scale/2 inside the range (float zero, no clipping).
TEST(BaselinesUniform, FloatZeroErrorBound) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int rows = 129, dim = 32;
  std::vector<float> x(rows * dim), x_hat(x.size());
  for (auto& v : x) v = normal(rng);
  std::vector<GroupParams> params(rows);
  const UniformConfig config{3, ZeroPoint::float_min, MetadataType::fp32};
  quantize_per_token(x.data(), rows, dim, dim, config, x_hat.data(), nullptr, params.data());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < dim; ++c)
      ASSERT_LE(std::fabs(x[r * dim + c] - x_hat[r * dim + c]), params[r].scale * 0.5f * (1 + 1e-5f) + 1e-7f);
}

TEST(BaselinesUniform, KiviWindowRules) {
  // R = 128, G = 32: keys quantised 128 at a time, values all but the last 128.
  const int64_t contexts[] = {0, 1, 127, 128, 129, 255, 256, 300};
  const int64_t keys[] = {0, 0, 0, 128, 128, 128, 256, 256};
  const int64_t values[] = {0, 0, 0, 0, 1, 127, 128, 172};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(kivi_quantized_keys(contexts[i], 128, 32), keys[i]) << contexts[i];
    EXPECT_EQ(kivi_quantized_values(contexts[i], 128), values[i]) << contexts[i];
    EXPECT_GE(kivi_quantized_keys(contexts[i], 128, 32), kivi_quantized_values(contexts[i], 128));
  }
  EXPECT_EQ(kivi_quantized_keys(70, 0, 32), 64);  // R = 0: whole groups of G
  EXPECT_EQ(kivi_quantized_values(70, 0), 70);
  EXPECT_THROW(kivi_quantized_keys(10, 100, 32), Error);  // R % G != 0
  EXPECT_EQ(block_quantized_tokens(255, 256), 0);
  EXPECT_EQ(block_quantized_tokens(256, 256), 256);
  EXPECT_EQ(block_quantized_tokens(8191, 256), 7936);
}

TEST(BaselinesUniform, StorageBitsByHand) {
  const UniformConfig config{2, ZeroPoint::float_min, MetadataType::fp16};
  // 64 tokens, d = 128, G = 32: codes 64*128*2 = 16384; per-token metadata 64*4 groups*32 = 8192;
  // per-channel metadata (64/32)*128*32 = 8192.
  EXPECT_DOUBLE_EQ(per_token_storage_bits(64, 128, 32, config), 16384.0 + 8192.0);
  EXPECT_DOUBLE_EQ(per_channel_storage_bits(64, 128, 32, config), 16384.0 + 8192.0);
  EXPECT_DOUBLE_EQ(per_token_storage_bits(1, 128, 128, UniformConfig{4, ZeroPoint::integer, MetadataType::fp16}),
                   128 * 4 + 32.0);
  EXPECT_DOUBLE_EQ(per_token_storage_bits(1, 128, 128, UniformConfig{2, ZeroPoint::integer, MetadataType::fp32}),
                   256 + 64.0);
}

}  // namespace
}  // namespace oscar::baselines
