// The quantiser (see quantizer.h). Kept scalar and obvious: it is the reference that the CUDA
// quantise-pack kernel must match bit for bit.
#include "quant/quantizer.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/float16.h"

namespace oscar {

MetadataType parse_metadata_type(const std::string& name) {
  if (name == "fp16") return MetadataType::fp16;
  if (name == "bf16") return MetadataType::bf16;
  if (name == "fp32") return MetadataType::fp32;
  fail("unknown metadata type '{}' (expected fp16, bf16 or fp32)", name);
}

const char* metadata_type_name(MetadataType type) {
  switch (type) {
    case MetadataType::fp16: return "fp16";
    case MetadataType::bf16: return "bf16";
    case MetadataType::fp32: return "fp32";
  }
  return "?";
}

int metadata_type_bits(MetadataType type) { return type == MetadataType::fp32 ? 32 : 16; }

float round_to_metadata(float value, MetadataType type) {
  switch (type) {
    case MetadataType::fp16: return round_to_fp16(value);
    case MetadataType::bf16: return round_to_bf16(value);
    case MetadataType::fp32: return value;
  }
  return value;
}

void validate_quantizer(const QuantizerConfig& config, int dim) {
  OSCAR_CHECK(config.bits >= 2 && config.bits <= 4, "unsupported bit width {} (2, 3 or 4)", config.bits);
  OSCAR_CHECK(dim > 0, "row length must be positive, got {}", dim);
  int group = config.resolved_group(dim);
  OSCAR_CHECK(group > 0 && dim % group == 0, "group size {} does not divide head_dim {}", group, dim);
  OSCAR_CHECK(config.bits != 2 || dim % 4 == 0, "2-bit packing needs head_dim divisible by 4, got {}", dim);
  OSCAR_CHECK(config.bits != 4 || dim % 2 == 0, "4-bit packing needs an even head_dim, got {}", dim);
  OSCAR_CHECK(config.clip_ratio > 0.0f && config.clip_ratio <= 1.0f, "clip ratio {} outside (0, 1]",
              config.clip_ratio);
}

float group_scale(float mn, float mx, int bits, MetadataType metadata) {
  const float max_code = static_cast<float>((1 << bits) - 1);
  const float magnitude = std::max(std::fabs(mn), std::fabs(mx));
  // 2^-14 keeps |zero| <= 3 * 2^14 < 65504 (fp16); bf16 and fp32 have range to spare.
  const float floor_factor = metadata == MetadataType::fp16 ? 0x1.0p-14f : 0x1.0p-100f;
  float s = round_to_metadata(std::max(std::max(mx - mn, 1e-8f) / max_code, magnitude * floor_factor), metadata);
  if (s == 0.0f) s = metadata == MetadataType::fp16 ? 0x1.0p-24f : 0x1.0p-126f;  // smallest stored value
  return s;
}

float clip_threshold(const float* row, int dim, float clip_ratio) {
  int idx = static_cast<int>(std::floor(static_cast<double>(clip_ratio) * dim));
  idx = std::clamp(idx, 0, dim - 1);
  std::vector<float> magnitudes(dim);
  for (int i = 0; i < dim; ++i) magnitudes[i] = std::fabs(row[i]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + idx, magnitudes.end());
  return magnitudes[idx];
}

void quantize_row(const float* row, int dim, const QuantizerConfig& config, uint8_t* codes, float* scale,
                  float* zero) {
  const int group = config.resolved_group(dim);
  const float max_code = static_cast<float>((1 << config.bits) - 1);
  std::vector<float> x(row, row + dim);
  if (config.clip_ratio < 1.0f) {
    float tau = clip_threshold(row, dim, config.clip_ratio);
    for (auto& v : x) v = std::clamp(v, -tau, tau);
  }
  for (int g = 0; g < dim / group; ++g) {
    const float* xg = x.data() + g * group;
    float mn = xg[0], mx = xg[0];
    for (int i = 1; i < group; ++i) {
      mn = std::min(mn, xg[i]);
      mx = std::max(mx, xg[i]);
    }
    // Scale and zero are rounded to their storage type first, so codes are chosen against the
    // values that dequantisation will actually use.
    float s = group_scale(mn, mx, config.bits, config.metadata);
    float z = round_to_metadata(-mn / s, config.metadata);
    scale[g] = s;
    zero[g] = z;
    for (int i = 0; i < group; ++i) {
      float c = std::floor(xg[i] / s + z + 0.5f);
      codes[g * group + i] = static_cast<uint8_t>(std::clamp(c, 0.0f, max_code));
    }
  }
}

void dequantize_row(const uint8_t* codes, const float* scale, const float* zero, int dim, int group_size,
                    float* out) {
  for (int i = 0; i < dim; ++i) {
    int g = i / group_size;
    out[i] = (static_cast<float>(codes[i]) - zero[g]) * scale[g];
  }
}

int packed_row_bytes(int dim, int bits) { return (dim * bits + 7) / 8; }

void pack_codes(const uint8_t* codes, int dim, int bits, uint8_t* packed) {
  if (bits == 2) {
    const int q = dim / 4;
    for (int i = 0; i < q; ++i)
      packed[i] = static_cast<uint8_t>(codes[i] | (codes[i + q] << 2) | (codes[i + 2 * q] << 4) | (codes[i + 3 * q] << 6));
  } else if (bits == 4) {
    const int h = dim / 2;
    for (int i = 0; i < h; ++i) packed[i] = static_cast<uint8_t>(codes[i] | (codes[i + h] << 4));
  } else {
    std::fill(packed, packed + packed_row_bytes(dim, bits), 0);
    for (int i = 0; i < dim; ++i)
      for (int b = 0; b < bits; ++b)
        if (codes[i] >> b & 1) packed[(i * bits + b) / 8] |= static_cast<uint8_t>(1u << ((i * bits + b) % 8));
  }
}

void unpack_codes(const uint8_t* packed, int dim, int bits, uint8_t* codes) {
  if (bits == 2) {
    const int q = dim / 4;
    for (int i = 0; i < q; ++i)
      for (int part = 0; part < 4; ++part) codes[i + part * q] = (packed[i] >> (2 * part)) & 3u;
  } else if (bits == 4) {
    const int h = dim / 2;
    for (int i = 0; i < h; ++i) {
      codes[i] = packed[i] & 15u;
      codes[i + h] = packed[i] >> 4;
    }
  } else {
    for (int i = 0; i < dim; ++i) {
      uint8_t c = 0;
      for (int b = 0; b < bits; ++b) c |= static_cast<uint8_t>(((packed[(i * bits + b) / 8] >> ((i * bits + b) % 8)) & 1u) << b);
      codes[i] = c;
    }
  }
}

double QuantizedRows::storage_bits() const {
  return static_cast<double>(rows) *
         (8.0 * packed_row_bytes(dim, bits) + 2.0 * groups() * metadata_type_bits(metadata));
}

QuantizedRows quantize_rows(const float* x, int rows, int dim, const QuantizerConfig& config) {
  validate_quantizer(config, dim);
  QuantizedRows q;
  q.rows = rows;
  q.dim = dim;
  q.bits = config.bits;
  q.group_size = config.resolved_group(dim);
  q.metadata = config.metadata;
  const int row_bytes = packed_row_bytes(dim, config.bits);
  q.packed.resize(static_cast<size_t>(rows) * row_bytes);
  q.scale.resize(static_cast<size_t>(rows) * q.groups());
  q.zero.resize(q.scale.size());
  std::vector<uint8_t> codes(dim);
  for (int r = 0; r < rows; ++r) {
    quantize_row(x + static_cast<size_t>(r) * dim, dim, config, codes.data(), &q.scale[static_cast<size_t>(r) * q.groups()],
                 &q.zero[static_cast<size_t>(r) * q.groups()]);
    pack_codes(codes.data(), dim, config.bits, &q.packed[static_cast<size_t>(r) * row_bytes]);
  }
  return q;
}

void dequantize_rows(const QuantizedRows& q, float* out) {
  const int row_bytes = packed_row_bytes(q.dim, q.bits);
  std::vector<uint8_t> codes(q.dim);
  for (int r = 0; r < q.rows; ++r) {
    unpack_codes(&q.packed[static_cast<size_t>(r) * row_bytes], q.dim, q.bits, codes.data());
    dequantize_row(codes.data(), &q.scale[static_cast<size_t>(r) * q.groups()], &q.zero[static_cast<size_t>(r) * q.groups()],
                   q.dim, q.group_size, out + static_cast<size_t>(r) * q.dim);
  }
}

double quantized_bits_per_element(const QuantizerConfig& config, int dim) {
  int group = config.resolved_group(dim);
  return config.bits + 2.0 * metadata_type_bits(config.metadata) / group;
}

}  // namespace oscar
