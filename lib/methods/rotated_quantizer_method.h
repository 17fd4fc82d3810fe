// The family behind bf16, naive, hadamard, oscar and the oscar-ablation variants: a fixed rotation
// per (layer, KV head) for keys and for values, then the OSCAR quantiser (lib/quant) in a segmented
// cache. Each registered name only fills a RotatedQuantizerSpec.
#pragma once
#include <functional>
#include <string>

#include "methods/kv_method.h"

namespace oscar {

struct RotatedQuantizerSpec {
  std::string name;
  CacheLayout layout;
  QuantizerConfig key_quantizer, value_quantizer;
  bool quantizes = true;  // false: every token stays BF16 (the bf16 method)
  // R_K, R_V for (layer, kv_head, head_dim); empty function = identity.
  std::function<MatrixD(int layer, int kv_head)> key_rotation, value_rotation;
  // Per-layer clip ratios (a pack calibrated with clip fit); empty = the quantiser configs' ratio.
  std::function<float(int layer)> key_clip, value_clip;
};

class RotatedQuantizerMethod final : public KvMethod {
 public:
  RotatedQuantizerMethod(RotatedQuantizerSpec spec, int head_dim);
  std::string name() const override { return spec_.name; }
  CacheLayout layout() const override { return spec_.layout; }
  QuantizerConfig key_quantizer(int layer) const override;
  QuantizerConfig value_quantizer(int layer) const override;
  MatrixD key_rotation(int layer, int kv_head) const override;
  MatrixD value_rotation(int layer, int kv_head) const override;
  bool quantizes() const override { return spec_.quantizes; }

 private:
  RotatedQuantizerSpec spec_;
  int head_dim_;
};

// Applies MethodOptions overrides to a layout and quantiser pair (used by every built-in factory).
void apply_method_options(const MethodOptions& options, CacheLayout& layout, QuantizerConfig& key_quantizer,
                          QuantizerConfig& value_quantizer);

// Registers bf16, naive, hadamard, oscar, oscar-ablation:* (called once by method_registry()).
void register_rotated_quantizer_methods();

}  // namespace oscar
