// Quantiser tests: clip index, bit-exact integer-grid round trips, packing layout.
#include "quant/quantizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"

namespace oscar {
namespace {

TEST(ClipThreshold, IndexIsFloorOfRatioTimesDim) {
  for (int dim : {64, 128}) {
    std::vector<float> row(dim);
    for (int i = 0; i < dim; ++i) row[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(dim - i);  // |x| = dim..1
    // 0.96*128 = 122.88 -> idx 122 -> 123rd smallest |x| = 123 (|x| takes 1..128).
    int idx_k = static_cast<int>(0.96 * dim), idx_v = static_cast<int>(0.92 * dim);
    EXPECT_EQ(clip_threshold(row.data(), dim, 0.96f), static_cast<float>(idx_k + 1));
    EXPECT_EQ(clip_threshold(row.data(), dim, 0.92f), static_cast<float>(idx_v + 1));
    EXPECT_EQ(clip_threshold(row.data(), dim, 1.0f), static_cast<float>(dim));
  }
  // d = 128: K clips the 5 largest, V the 10 largest.
  EXPECT_EQ(128 - static_cast<int>(0.96 * 128) - 1, 5);
  EXPECT_EQ(128 - static_cast<int>(0.92 * 128) - 1, 10);
}

TEST(Quantizer, IntegerGridRoundTripIsExact) {
  // Values on the grid min + k*scale with scale a power of two are reproduced exactly.
  const int dim = 128;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0, 3);
  for (auto meta : {MetadataType::fp16, MetadataType::bf16, MetadataType::fp32}) {
    std::vector<float> row(dim);
    for (int i = 0; i < dim; ++i) row[i] = -1.0f + 0.5f * code(rng);
    row[0] = -1.0f;
    row[1] = 0.5f;  // min -1, max 0.5 -> scale 0.5, zero 2
    QuantizerConfig config;
    config.metadata = meta;
    auto q = quantize_rows(row.data(), 1, dim, config);
    EXPECT_EQ(q.scale[0], 0.5f);
    EXPECT_EQ(q.zero[0], 2.0f);
    std::vector<float> back(dim);
    dequantize_rows(q, back.data());
    for (int i = 0; i < dim; ++i) EXPECT_EQ(back[i], row[i]) << i;
  }
}

TEST(Quantizer, FourBitGroupsOf32AreExactOnGrid) {
  const int dim = 64;
  std::vector<float> row(dim);
  for (int i = 0; i < dim; ++i) row[i] = static_cast<float>(i % 16) - (i < 32 ? 3.0f : 8.0f);
  QuantizerConfig config;
  config.bits = 4;
  config.group_size = 32;
  auto q = quantize_rows(row.data(), 1, dim, config);
  std::vector<float> back(dim);
  dequantize_rows(q, back.data());
  for (int i = 0; i < dim; ++i) EXPECT_EQ(back[i], row[i]) << i;
}

TEST(Quantizer, RoundsHalfUpAndClamps) {
  // min 0, max 3 -> scale 1, zero 0; 1.5 -> floor(2.0) = 2; 0.49 -> 0.
  std::vector<float> row = {0.0f, 3.0f, 1.5f, 0.49f, 2.5f, 0.5f, 2.99f, 1.0f};
  QuantizerConfig config;
  config.metadata = MetadataType::fp32;
  std::vector<uint8_t> codes(8);
  float scale, zero;
  quantize_row(row.data(), 8, config, codes.data(), &scale, &zero);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(zero, 0.0f);
  std::vector<uint8_t> expected = {0, 3, 2, 0, 3, 1, 3, 1};
  EXPECT_EQ(codes, expected);
}

TEST(Quantizer, ClippingBoundsTheRange) {
  const int dim = 128;
  std::vector<float> row(dim, 0.0f);
  for (int i = 0; i < dim; ++i) row[i] = static_cast<float>(i) / dim - 0.5f;
  row[3] = 100.0f;  // one outlier: clipped to the 122nd smallest |x|
  QuantizerConfig config;
  config.clip_ratio = 0.96f;
  config.metadata = MetadataType::fp32;
  auto q = quantize_rows(row.data(), 1, dim, config);
  std::vector<float> back(dim);
  dequantize_rows(q, back.data());
  float tau = clip_threshold(row.data(), dim, 0.96f);
  EXPECT_LT(tau, 1.0f);
  for (float v : back) EXPECT_LE(std::fabs(v), tau * 1.0001f);
}

TEST(Packing, QuarterLayoutBytes) {
  const int dim = 8;  // Q = 2
  std::vector<uint8_t> codes = {1, 2, 3, 0, 2, 1, 0, 3};
  std::vector<uint8_t> packed(packed_row_bytes(dim, 2));
  pack_codes(codes.data(), dim, 2, packed.data());
  // byte0 = c0 | c2<<2 | c4<<4 | c6<<6 = 1 | 3<<2 | 2<<4 | 0<<6
  EXPECT_EQ(packed[0], 1 | (3 << 2) | (2 << 4));
  EXPECT_EQ(packed[1], 2 | (0 << 2) | (1 << 4) | (3 << 6));
}

TEST(Packing, RoundTripAllWidths) {
  std::mt19937 rng(3);
  for (int bits : {2, 3, 4})
    for (int dim : {4, 64, 128, 256}) {
      std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
      std::vector<uint8_t> codes(dim), back(dim), packed(packed_row_bytes(dim, bits));
      for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
      pack_codes(codes.data(), dim, bits, packed.data());
      unpack_codes(packed.data(), dim, bits, back.data());
      EXPECT_EQ(codes, back) << bits << " bits, d " << dim;
    }
}

TEST(Quantizer, BitsPerElement) {
  QuantizerConfig config;
  EXPECT_DOUBLE_EQ(quantized_bits_per_element(config, 128), 2.25);
  config.metadata = MetadataType::fp32;
  EXPECT_DOUBLE_EQ(quantized_bits_per_element(config, 128), 2.5);
  config.group_size = 32;
  config.metadata = MetadataType::fp16;
  EXPECT_DOUBLE_EQ(quantized_bits_per_element(config, 128), 3.0);
}

TEST(Quantizer, RejectsBadConfig) {
  QuantizerConfig config;
  config.group_size = 48;
  EXPECT_THROW(validate_quantizer(config, 128), Error);
  config.group_size = 0;
  config.bits = 5;
  EXPECT_THROW(validate_quantizer(config, 128), Error);
}

}  // namespace
}  // namespace oscar

namespace oscar {
namespace {

TEST(Quantizer, ConstantGroupsStayFinite) {
  // A group that is constant (after clipping, or a zero sink row) must give finite metadata and
  // reconstruct its value closely in every metadata type.
  for (auto meta : {MetadataType::fp16, MetadataType::bf16, MetadataType::fp32})
    for (float c : {0.0f, -1.0f, 3.5f, -250.0f}) {
      std::vector<float> row(64, c);
      QuantizerConfig config;
      config.metadata = meta;
      config.group_size = 32;
      auto q = quantize_rows(row.data(), 1, 64, config);
      std::vector<float> back(64);
      dequantize_rows(q, back.data());
      for (float s : q.scale) EXPECT_GT(s, 0.0f);
      for (float z : q.zero) EXPECT_TRUE(std::isfinite(z));
      // x_hat = (code - zero) * scale: the stored zero's relative precision bounds the error
      // (bf16: 8 significant bits -> 2^-9 relative; fp16 / fp32 far below 1e-3).
      const float tolerance = (meta == MetadataType::bf16 ? 0x1.0p-8f : 1e-3f) * std::max(1.0f, std::fabs(c));
      for (float v : back) EXPECT_NEAR(v, c, tolerance) << metadata_type_name(meta) << " " << c;
    }
}

TEST(Quantizer, ScaleRuleUnchangedForOrdinaryGroups) {
  EXPECT_EQ(group_scale(-1.5f, 1.5f, 2, MetadataType::fp32), 1.0f);
  EXPECT_EQ(group_scale(-0.75f, 0.75f, 2, MetadataType::fp16), 0.5f);
  EXPECT_EQ(group_scale(0.0f, 15.0f, 4, MetadataType::bf16), 1.0f);
}

}  // namespace
}  // namespace oscar
