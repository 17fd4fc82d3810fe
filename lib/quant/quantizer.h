// The OSCAR per-token asymmetric quantiser (spec: oscar-method.md section 4), generalised to b bits
// and groups of G channels: quantile clip over the row, per-group min/max, float zero point,
// round half up, clamp; codes packed in the "quarter" layout (2 bits) or "half" layout (4 bits).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace oscar {

enum class MetadataType { fp16, bf16, fp32 };
MetadataType parse_metadata_type(const std::string& name);  // "fp16" | "bf16" | "fp32"
const char* metadata_type_name(MetadataType type);
int metadata_type_bits(MetadataType type);
float round_to_metadata(float value, MetadataType type);  // value as it is stored

struct QuantizerConfig {
  int bits = 2;                  // 2, 3 or 4
  int group_size = 0;            // channels per (scale, zero); 0 = the whole row (G = d)
  float clip_ratio = 1.0f;       // quantile of |x| kept; 1.0 = no clipping
  MetadataType metadata = MetadataType::fp16;
  int resolved_group(int dim) const { return group_size > 0 ? group_size : dim; }
};

// Throws oscar::Error unless bits in {2,3,4}, dim > 0, G divides dim, 0 < clip_ratio <= 1.
void validate_quantizer(const QuantizerConfig& config, int dim);

// The stored scale of one group: max(mx - mn, 1e-8) / (2^bits - 1) as the spec says, except for
// degenerate (near-constant) groups, where it is raised to max(|mn|, |mx|) * 2^-14 (fp16 metadata) so
// that the zero point -mn/scale stays finite in 16 bits, and never rounds to 0. Identical for every
// group whose range exceeds ~2e-4 of its magnitude. The CUDA quantise-pack kernel uses the same rule.
float group_scale(float mn, float mx, int bits, MetadataType metadata);

// Clip threshold tau of one row: idx = clamp(floor(ratio*d), 0, d-1); tau = idx-th smallest |x|.
float clip_threshold(const float* row, int dim, float clip_ratio);

// Quantises one row [dim] (already rotated). codes: [dim] unpacked values in [0, 2^bits-1];
// scale, zero: [dim/G], rounded to the metadata type (the stored values; dequantisation uses them).
void quantize_row(const float* row, int dim, const QuantizerConfig& config, uint8_t* codes, float* scale,
                  float* zero);
// x_hat[i] = (code[i] - zero[g]) * scale[g]
void dequantize_row(const uint8_t* codes, const float* scale, const float* zero, int dim, int group_size,
                    float* out);

// Packed size of one row's codes in bytes: dim*bits/8 rounded up.
int packed_row_bytes(int dim, int bits);
// 2 bits, quarter layout: byte[i] = c[i] | c[i+Q]<<2 | c[i+2Q]<<4 | c[i+3Q]<<6 with Q = dim/4.
// 4 bits, half layout: byte[i] = c[i] | c[i+dim/2]<<4. 3 bits: little-endian bit stream.
void pack_codes(const uint8_t* codes, int dim, int bits, uint8_t* packed);
void unpack_codes(const uint8_t* packed, int dim, int bits, uint8_t* codes);

// A block of quantised rows as a cache stores them.
struct QuantizedRows {
  int rows = 0, dim = 0, bits = 2, group_size = 0;
  MetadataType metadata = MetadataType::fp16;
  std::vector<uint8_t> packed;     // [rows, packed_row_bytes(dim, bits)]
  std::vector<float> scale, zero;  // [rows, dim/group_size], values as stored
  int groups() const { return dim / group_size; }
  // Storage in bits of the whole block: codes + metadata.
  double storage_bits() const;
};

QuantizedRows quantize_rows(const float* x, int rows, int dim, const QuantizerConfig& config);  // x: [rows, dim]
void dequantize_rows(const QuantizedRows& q, float* out);                                     // out: [rows, dim]

// Bits per element of the quantised part alone: bits + 2*metadata_bits/G.
double quantized_bits_per_element(const QuantizerConfig& config, int dim);

}  // namespace oscar
