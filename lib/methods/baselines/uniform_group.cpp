// Uniform group quantisers and window rules of the baselines (see uniform_group.h). Scalar on purpose:
// this is the reference arithmetic the tests check bit for bit.
#include "methods/baselines/uniform_group.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace oscar::baselines {

float round_half_even(float x) { return std::nearbyint(x); }

GroupParams quantize_group(const float* x, int n, std::ptrdiff_t stride, const UniformConfig& config,
                           uint8_t* codes) {
  OSCAR_CHECK(n > 0 && config.bits >= 1 && config.bits <= 8, "group of {} values at {} bits", n, config.bits);
  const float max_code = static_cast<float>((1 << config.bits) - 1);
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  GroupParams p;
  p.scale = round_to_metadata((mx - mn) / max_code, config.metadata);
  // A constant group (or a range below the metadata type's resolution) has no usable scale: any scale
  // works since every code is then 0 (float zero) or z (integer zero); 1 keeps the arithmetic finite.
  if (!(p.scale > 0) || !std::isfinite(p.scale)) p.scale = 1.0f;
  if (config.zero_point == ZeroPoint::float_min) {
    p.offset = round_to_metadata(mn, config.metadata);
    for (int i = 0; i < n; ++i)
      codes[i] = static_cast<uint8_t>(std::clamp(round_half_even((x[i * stride] - p.offset) / p.scale), 0.0f, max_code));
  } else {
    p.offset = round_half_even(-mn / p.scale);
    for (int i = 0; i < n; ++i)
      codes[i] =
          static_cast<uint8_t>(std::clamp(round_half_even(x[i * stride] / p.scale) + p.offset, 0.0f, max_code));
  }
  return p;
}

float dequantize_code(uint8_t code, const GroupParams& params, ZeroPoint zero_point) {
  return zero_point == ZeroPoint::float_min ? static_cast<float>(code) * params.scale + params.offset
                                            : (static_cast<float>(code) - params.offset) * params.scale;
}

void quantize_per_token(const float* x, int64_t rows, int dim, int group, const UniformConfig& config, float* x_hat,
                        uint8_t* codes, GroupParams* params) {
  OSCAR_CHECK(group > 0 && dim % group == 0, "group size {} does not divide head_dim {}", group, dim);
  std::vector<uint8_t> c(group);
  const int groups = dim / group;
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < groups; ++g) {
      const size_t base = static_cast<size_t>(r) * dim + static_cast<size_t>(g) * group;
      const GroupParams p = quantize_group(x + base, group, 1, config, c.data());
      for (int i = 0; i < group; ++i) {
        x_hat[base + i] = dequantize_code(c[i], p, config.zero_point);
        if (codes) codes[base + i] = c[i];
      }
      if (params) params[static_cast<size_t>(r) * groups + g] = p;
    }
}

void quantize_per_channel(const float* x, int64_t rows, int dim, int group, const UniformConfig& config, float* x_hat,
                          uint8_t* codes, GroupParams* params) {
  OSCAR_CHECK(group > 0 && rows % group == 0, "{} tokens are not whole groups of {} tokens", rows, group);
  std::vector<uint8_t> c(group);
  for (int64_t block = 0; block < rows / group; ++block)
    for (int ch = 0; ch < dim; ++ch) {
      const size_t base = static_cast<size_t>(block) * group * dim + ch;
      const GroupParams p = quantize_group(x + base, group, dim, config, c.data());
      for (int i = 0; i < group; ++i) {
        x_hat[base + static_cast<size_t>(i) * dim] = dequantize_code(c[i], p, config.zero_point);
        if (codes) codes[base + static_cast<size_t>(i) * dim] = c[i];
      }
      if (params) params[static_cast<size_t>(block) * dim + ch] = p;
    }
}

int64_t kivi_quantized_keys(int64_t context, int residual, int key_group) {
  OSCAR_CHECK(residual >= 0 && key_group > 0 && residual % key_group == 0,
              "KIVI needs the residual length R ({}) to be a multiple of the group size G ({})", residual, key_group);
  const int64_t block = residual > 0 ? residual : key_group;
  return block * (context / block);
}

int64_t kivi_quantized_values(int64_t context, int residual) { return std::max<int64_t>(0, context - residual); }

int64_t block_quantized_tokens(int64_t context, int block) {
  OSCAR_CHECK(block > 0, "block of {} tokens", block);
  return block * (context / block);
}

double per_token_storage_bits(int64_t quantized, int dim, int group, const UniformConfig& config) {
  return static_cast<double>(quantized) * (static_cast<double>(dim) * config.bits +
                                           static_cast<double>(dim / group) * config.metadata_bits_per_group());
}

double per_channel_storage_bits(int64_t quantized, int dim, int group, const UniformConfig& config) {
  return static_cast<double>(quantized) * dim * config.bits +
         static_cast<double>(quantized / group) * dim * config.metadata_bits_per_group();
}

}  // namespace oscar::baselines
