// Uniform asymmetric group quantisers of the competing methods (spec: shared/spec/baselines.md) with
// both zero-point conventions (float zero: KIVI; integer zero: QuaRot, OScaR) and both axes (per-token
// groups of G channels; per-channel groups of G consecutive tokens, KIVI's key axis), plus the
// residual-window tier rules of KIVI and OScaR. Rounding is round half to even (torch.round).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/quantizer.h"

namespace oscar::baselines {

enum class ZeroPoint {
  float_min,  // KIVI: store (scale, min); code = clamp(rne((x - min)/scale)); x_hat = code*scale + min
  integer,    // QuaRot/OScaR: z = rne(-min/scale); code = clamp(rne(x/scale) + z); x_hat = (code - z)*scale
};

struct UniformConfig {
  int bits = 2;  // 2..8
  ZeroPoint zero_point = ZeroPoint::float_min;
  MetadataType metadata = MetadataType::fp16;  // storage of scale and min (the integer zero takes 16 bits)
  // Bits of metadata per group: scale + (min or integer zero).
  int metadata_bits_per_group() const { return 2 * metadata_type_bits(metadata); }
};

// One group's stored parameters: offset = min (float_min) or the integer zero z (integer).
struct GroupParams {
  float scale = 1, offset = 0;
};

// Round half to even (the default rounding mode; what torch.round does).
float round_half_even(float x);

// Quantises n values x[i*stride] (one group). codes: [n] in [0, 2^bits - 1]. Scale and min are rounded to
// the metadata type before the codes are chosen (the codes are chosen against the stored values).
GroupParams quantize_group(const float* x, int n, std::ptrdiff_t stride, const UniformConfig& config,
                           uint8_t* codes);
float dequantize_code(uint8_t code, const GroupParams& params, ZeroPoint zero_point);

// Per-token quantisation, groups of `group` channels: x [rows, dim] -> x_hat [rows, dim] (dequantised).
// codes (optional): [rows, dim]; params (optional): [rows, dim/group].
void quantize_per_token(const float* x, int64_t rows, int dim, int group, const UniformConfig& config, float* x_hat,
                        uint8_t* codes = nullptr, GroupParams* params = nullptr);
// Per-channel quantisation, groups of `group` consecutive tokens (KIVI keys): x [rows, dim] with rows a
// multiple of group -> x_hat [rows, dim]. codes (optional): [rows, dim]; params (optional): [rows/group, dim].
void quantize_per_channel(const float* x, int64_t rows, int dim, int group, const UniformConfig& config, float* x_hat,
                          uint8_t* codes = nullptr, GroupParams* params = nullptr);

// KIVI's residual windows (R = residual): keys are buffered in full precision and quantised a whole block
// of R at a time, so quantised keys = R*floor(L/R) (0..R-1 keys stay full precision); values keep exactly
// the last R tokens in full precision, quantised values = max(0, L - R). R = 0 quantises keys in whole
// groups of G and every value. Requires R % G == 0 (KIVI's own requirement for its key groups).
int64_t kivi_quantized_keys(int64_t context, int residual, int key_group);
int64_t kivi_quantized_values(int64_t context, int residual);
// OScaR's BF16 tail: quantised = block*floor(L/block) for both K and V (tail of 0..block-1 tokens).
int64_t block_quantized_tokens(int64_t context, int block);

// Bits stored for `quantized` tokens of one head (codes + metadata), per layout.
double per_token_storage_bits(int64_t quantized, int dim, int group, const UniformConfig& config);
double per_channel_storage_bits(int64_t quantized, int dim, int group, const UniformConfig& config);  // quantized % group == 0

}  // namespace oscar::baselines
