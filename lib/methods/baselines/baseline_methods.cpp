// kivi, hadamard:kivi, oscars, turboquant[:qjl|:k3v3], int4-hadamard as KvMethods (see
// baseline_methods.h; defaults and the paper-vs-code choices are listed in docs/tools/oscar-eval.md).
#include "methods/baselines/baseline_methods.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/error.h"
#include "common/float16.h"
#include "methods/baselines/oscars.h"
#include "methods/baselines/turboquant.h"
#include "methods/baselines/uniform_group.h"

namespace oscar::baselines {
namespace {

constexpr double kBf16Bits = 16.0;

// Which tokens of K and of V are quantised at each context, and the bits stored (K + V of one head).
class TieredStorage final : public ExternalStorage {
 public:
  std::function<TierSplit(int64_t)> keys, values;
  std::function<double(const TierSplit& keys, const TierSplit& values)> bits;
  TierSplit key_split(int64_t context) const override { return keys(context); }
  TierSplit value_split(int64_t context) const override { return values(context); }
  double storage_bits(int64_t context) const override { return bits(keys(context), values(context)); }
};

TierSplit quantized_prefix(int64_t context, int64_t quantized) { return TierSplit{0, quantized, context - quantized}; }

double window_bits(const TierSplit& split, int dim) {
  return static_cast<double>(split.sink + split.recent) * dim * kBf16Bits;
}

// out [n, d] = bf16(x · R) (R = null: bf16(x)): the rows as a BF16 activation path produces them.
std::vector<float> rotated_bf16(const float* x, int64_t n, int d, const MatrixD* rotation) {
  std::vector<float> out(static_cast<size_t>(n) * d);
  if (rotation) rotate_rows(x, n, d, *rotation, out.data());
  else std::copy(x, x + out.size(), out.begin());
  for (float& v : out) v = round_to_bf16(v);
  return out;
}

// rows [n, d] <- rows · R^T, back to the original basis (float64 accumulation).
void unrotate(std::vector<float>& rows, int64_t n, int d, const MatrixD* rotation) {
  if (!rotation) return;
  std::vector<float> out(rows.size());
  rotate_rows(rows.data(), n, d, rotation->transpose(), out.data());
  rows.swap(out);
}

int resolve_group(int group, int d) { return group == 0 ? d : group; }

void check_group(const std::string& name, int group, int d) {
  OSCAR_CHECK(group > 0 && d % group == 0, "method '{}': group size {} does not divide head_dim {}", name, group, d);
}

// Common part: identity rotations (rows come back in the original basis), a reporting QuantizerConfig,
// CPU reference backend only.
class BaselineMethod : public KvMethod {
 public:
  BaselineMethod(std::string name, CacheLayout layout, QuantizerConfig key, QuantizerConfig value, int dim)
      : name_(std::move(name)), layout_(layout), key_(key), value_(value), dim_(dim) {
    split_context(0, layout_);  // validates the layout
  }
  std::string name() const override { return name_; }
  CacheLayout layout() const override { return layout_; }
  QuantizerConfig key_quantizer(int) const override { return key_; }
  QuantizerConfig value_quantizer(int) const override { return value_; }
  MatrixD key_rotation(int, int) const override { return MatrixD::Identity(dim_, dim_); }
  MatrixD value_rotation(int, int) const override { return MatrixD::Identity(dim_, dim_); }
  bool cpu_reference_only() const override { return true; }

 protected:
  std::string name_;
  CacheLayout layout_;
  QuantizerConfig key_, value_;
  int dim_;
};

QuantizerConfig report_config(int bits, int group, MetadataType metadata) {
  QuantizerConfig c;
  c.bits = bits;
  c.group_size = group;
  c.metadata = metadata;
  return c;
}

// ---- kivi, hadamard:kivi ----------------------------------------------------------------------------

class KiviMethod final : public BaselineMethod {
 public:
  KiviMethod(const std::string& name, const MethodContext& context, int group, ZeroPoint zero, bool hadamard)
      : BaselineMethod(name, {}, {}, {}, context.geometry.head_dim) {
    const MethodOptions& o = context.options;
    OSCAR_CHECK(!o.sink_tokens || *o.sink_tokens == 0, "method '{}' has no sink window (--sink must be 0)", name);
    group_ = resolve_group(o.group_size.value_or(group), dim_);
    residual_ = o.recent_tokens.value_or(kKiviResidual);
    // Keys: groups of G tokens (any G). Values: groups of G channels, at most the whole head (d = 64 with
    // G = 128 stores one group per token).
    value_group_ = std::min(group_, dim_);
    check_group(name, value_group_, dim_);
    kivi_quantized_keys(0, residual_, group_);  // checks R % G == 0
    config_ = UniformConfig{o.bits, zero, o.metadata};
    layout_ = CacheLayout{0, residual_, 1};  // the value split: exactly the last R values in BF16
    key_ = report_config(o.bits, group_, o.metadata);
    value_ = report_config(o.bits, value_group_, o.metadata);
    if (hadamard) hadamard_ = hadamard_matrix(dim_);
  }

  EncodedSequence encode(const HeadRows& rows) const override {
    const int d = rows.dim;
    const int64_t n = rows.tokens;
    const MatrixD* r = hadamard_.size() ? &hadamard_ : nullptr;
    EncodedSequence e;
    e.tokens = n;
    e.dim = d;
    e.window_keys = rotated_bf16(rows.keys, n, d, r);      // [n, d]
    e.window_values = rotated_bf16(rows.values, n, d, r);  // [n, d]
    e.dequantized_keys = e.window_keys;  // tokens past the last whole key group are never quantised
    const int64_t key_rows = group_ * (n / group_);
    quantize_per_channel(e.window_keys.data(), key_rows, d, group_, config_, e.dequantized_keys.data());
    e.dequantized_values.resize(e.window_values.size());
    quantize_per_token(e.window_values.data(), n, d, value_group_, config_, e.dequantized_values.data());
    for (auto* v : {&e.window_keys, &e.window_values, &e.dequantized_keys, &e.dequantized_values}) unrotate(*v, n, d, r);
    auto storage = std::make_shared<TieredStorage>();
    const int group = group_, residual = residual_, value_group = value_group_;
    const UniformConfig config = config_;
    storage->keys = [=](int64_t c) { return quantized_prefix(c, kivi_quantized_keys(c, residual, group)); };
    storage->values = [=](int64_t c) { return quantized_prefix(c, kivi_quantized_values(c, residual)); };
    storage->bits = [=](const TierSplit& k, const TierSplit& v) {
      return per_channel_storage_bits(k.history, d, group, config) + window_bits(k, d) +
             per_token_storage_bits(v.history, d, value_group, config) + window_bits(v, d);
    };
    e.external = storage;
    return e;
  }

 private:
  int group_ = kKiviGroup, residual_ = kKiviResidual, value_group_ = kKiviGroup;
  UniformConfig config_;
  MatrixD hadamard_;
};

// ---- oscars -----------------------------------------------------------------------------------------

class OscarsMethod final : public BaselineMethod {
 public:
  OscarsMethod(const std::string& name, const MethodContext& context)
      : BaselineMethod(name, {}, {}, {}, context.geometry.head_dim), num_kv_heads_(context.geometry.num_kv_heads) {
    const MethodOptions& o = context.options;
    OSCAR_CHECK(!o.sink_tokens || *o.sink_tokens == 0, "method '{}' has no sink window (--sink must be 0)", name);
    group_ = resolve_group(o.group_size.value_or(kOscarsGroup), dim_);
    block_ = o.recent_tokens.value_or(kOscarsTailBlock);
    check_group(name, group_, dim_);
    OSCAR_CHECK(block_ > 0 && block_ % group_ == 0,
                "method '{}': the tail block (--recent, {}) must be a positive multiple of the group size {}", name,
                block_, group_);
    config_ = UniformConfig{o.bits, ZeroPoint::integer, o.metadata};
    layout_ = CacheLayout{0, block_ - 1, 1};  // reporting only; the tiers come from the tail block rule
    key_ = value_ = report_config(o.bits, group_, o.metadata);
    hadamard_ = hadamard_matrix(dim_);
  }

  EncodedSequence encode(const HeadRows& rows) const override {
    const int d = rows.dim;
    const int64_t n = rows.tokens;
    OSCAR_CHECK(static_cast<int>(rows.layer_keys.size()) == num_kv_heads_,
                "method '{}': layer {}: the omni-token key norm needs the keys of all {} KV heads of the layer, but "
                "only {} were given (a per-head dump is not enough)",
                name_, rows.layer, num_kv_heads_, rows.layer_keys.size());
    // Rotated keys of every KV head (Hadamard keeps each head's norm, so n_t is the same either way;
    // computed in the rotated space as OScaR does).
    std::vector<std::vector<float>> rotated_heads;
    std::vector<const float*> heads;
    for (const float* k : rows.layer_keys) {
      rotated_heads.push_back(rotated_bf16(k, n, d, &hadamard_));
      heads.push_back(rotated_heads.back().data());
    }
    const std::vector<float> norms = omni_token_norms(heads, num_kv_heads_, n, d);  // [n]
    EncodedSequence e;
    e.tokens = n;
    e.dim = d;
    e.window_keys = rotated_bf16(rows.keys, n, d, &hadamard_);
    e.window_values = rotated_bf16(rows.values, n, d, &hadamard_);
    std::vector<float> scaled = e.window_keys;  // [n, d] = k_t / n_t
    divide_rows_by_norms(scaled.data(), n, d, norms);
    e.dequantized_keys = e.window_keys;
    const int64_t key_rows = group_ * (n / group_);
    quantize_per_channel(scaled.data(), key_rows, d, group_, config_, e.dequantized_keys.data());
    // Decode multiplies each logit by n_t: fold it into the dequantised key (q · (k_hat n_t) = n_t q · k_hat).
    multiply_rows_by_norms(e.dequantized_keys.data(), key_rows, d, norms);
    e.dequantized_values.resize(e.window_values.size());
    quantize_per_token(e.window_values.data(), n, d, group_, config_, e.dequantized_values.data());
    for (auto* v : {&e.window_keys, &e.window_values, &e.dequantized_keys, &e.dequantized_values})
      unrotate(*v, n, d, &hadamard_);
    auto storage = std::make_shared<TieredStorage>();
    const int group = group_, block = block_, heads_count = num_kv_heads_;
    const UniformConfig config = config_;
    storage->keys = [=](int64_t c) { return quantized_prefix(c, block_quantized_tokens(c, block)); };
    storage->values = storage->keys;
    storage->bits = [=](const TierSplit& k, const TierSplit& v) {
      // + one fp32 norm per quantised token, shared by the layer's KV heads.
      return per_channel_storage_bits(k.history, d, group, config) + 32.0 * k.history / heads_count +
             window_bits(k, d) + per_token_storage_bits(v.history, d, group, config) + window_bits(v, d);
    };
    e.external = storage;
    return e;
  }

 private:
  int num_kv_heads_;
  int group_ = kOscarsGroup, block_ = kOscarsTailBlock;
  UniformConfig config_;
  MatrixD hadamard_;
};

// ---- turboquant, turboquant:qjl, turboquant:k3v3, int4-hadamard -------------------------------------

uint64_t mix_seed(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t head_seed(int layer, int kv_head, int side) {
  return mix_seed(kTurboQuantSeed ^ mix_seed((static_cast<uint64_t>(layer) << 32) | (static_cast<uint64_t>(kv_head) << 2) |
                                             static_cast<uint64_t>(side)));
}

// Per-token storage (every quantised token stored alike) with the OSCAR-style sink / recent layout
// (default: no windows). Each side is encoded by a function rows [n, d] -> x_hat [n, d].
class PerTokenMethod final : public BaselineMethod {
 public:
  using Encoder = std::function<void(const HeadRows& rows, const float* x, int64_t n, float* x_hat)>;
  struct Side {
    Encoder encode;
    double bits_per_token = 0;
    const MatrixD* rotation = nullptr;  // applied before encoding (rows stored rotated, BF16)
  };
  PerTokenMethod(const std::string& name, const MethodContext& context, QuantizerConfig key, QuantizerConfig value)
      : BaselineMethod(name, CacheLayout{0, 0, context.options.page_tokens}, key, value, context.geometry.head_dim) {
    const MethodOptions& o = context.options;
    if (o.sink_tokens) layout_.sink_tokens = *o.sink_tokens;
    if (o.recent_tokens) layout_.recent_tokens = *o.recent_tokens;
    split_context(0, layout_);
  }
  Side keys, values;
  MatrixD rotation_storage;  // owned rotation the sides point to

  EncodedSequence encode(const HeadRows& rows) const override {
    const int d = rows.dim;
    const int64_t n = rows.tokens;
    EncodedSequence e;
    e.tokens = n;
    e.dim = d;
    e.window_keys = rotated_bf16(rows.keys, n, d, keys.rotation);
    e.window_values = rotated_bf16(rows.values, n, d, values.rotation);
    e.dequantized_keys.resize(e.window_keys.size());
    e.dequantized_values.resize(e.window_values.size());
    keys.encode(rows, e.window_keys.data(), n, e.dequantized_keys.data());
    values.encode(rows, e.window_values.data(), n, e.dequantized_values.data());
    for (auto* v : {&e.window_keys, &e.dequantized_keys}) unrotate(*v, n, d, keys.rotation);
    for (auto* v : {&e.window_values, &e.dequantized_values}) unrotate(*v, n, d, values.rotation);
    auto storage = std::make_shared<TieredStorage>();
    const CacheLayout layout = layout_;
    const double key_bits = keys.bits_per_token, value_bits = values.bits_per_token;
    storage->keys = [layout](int64_t c) { return split_context(c, layout); };
    storage->values = storage->keys;
    storage->bits = [=](const TierSplit& k, const TierSplit& v) {
      return k.history * key_bits + window_bits(k, d) + v.history * value_bits + window_bits(v, d);
    };
    e.external = storage;
    return e;
  }
};

PerTokenMethod::Side turboquant_side(int d, int bits, bool qjl, MetadataType metadata, int side) {
  PerTokenMethod::Side s;
  TurboQuantConfig config{bits, qjl, metadata, 0};
  s.bits_per_token = TurboQuantizer(d, config).bits_per_vector();  // also validates bits
  s.encode = [config, side](const HeadRows& rows, const float* x, int64_t n, float* x_hat) {
    TurboQuantConfig c = config;
    c.seed = head_seed(rows.layer, rows.kv_head, side);
    TurboQuantizer(rows.dim, c).quantize_dequantize(x, n, x_hat);
  };
  return s;
}

PerTokenMethod::Side uniform_side(int d, int bits, int group, ZeroPoint zero, MetadataType metadata) {
  PerTokenMethod::Side s;
  const UniformConfig config{bits, zero, metadata};
  s.bits_per_token = per_token_storage_bits(1, d, group, config);
  s.encode = [config, group](const HeadRows& rows, const float* x, int64_t n, float* x_hat) {
    quantize_per_token(x, n, rows.dim, group, config, x_hat);
  };
  return s;
}

std::unique_ptr<KvMethod> make_turboquant(const std::string& name, const MethodContext& context,
                                          const std::string& variant) {
  const int d = context.geometry.head_dim;
  const MethodOptions& o = context.options;
  OSCAR_CHECK(is_power_of_two(d), "method '{}': the randomized Hadamard needs a power-of-two head_dim, got {}", name, d);
  if (variant.empty() || variant == "qjl") {
    const bool qjl = variant == "qjl";
    auto m = std::make_unique<PerTokenMethod>(name, context, report_config(o.bits, d, o.metadata),
                                              report_config(o.bits, d, o.metadata));
    m->keys = turboquant_side(d, o.bits, qjl, o.metadata, 0);
    m->values = turboquant_side(d, o.bits, false, o.metadata, 1);  // QJL only serves inner products (keys)
    return m;
  }
  if (variant == "k3v3") {
    const int group = resolve_group(o.group_size.value_or(0), d);
    check_group(name, group, d);
    auto m = std::make_unique<PerTokenMethod>(name, context, report_config(3, d, o.metadata),
                                              report_config(3, group, o.metadata));
    m->keys = turboquant_side(d, 3, false, o.metadata, 0);
    m->values = uniform_side(d, 3, group, ZeroPoint::float_min, o.metadata);
    return m;
  }
  fail("unknown method '{}' (turboquant variants: turboquant, turboquant:qjl, turboquant:k3v3)", name);
}

std::unique_ptr<KvMethod> make_int4_hadamard(const std::string& name, const MethodContext& context) {
  const int d = context.geometry.head_dim;
  const MethodOptions& o = context.options;
  const int group = resolve_group(o.group_size.value_or(0), d);
  check_group(name, group, d);
  auto m = std::make_unique<PerTokenMethod>(name, context, report_config(4, group, o.metadata),
                                            report_config(4, group, o.metadata));
  m->rotation_storage = hadamard_matrix(d);
  m->keys = uniform_side(d, 4, group, ZeroPoint::integer, o.metadata);
  m->values = m->keys;
  m->keys.rotation = m->values.rotation = &m->rotation_storage;
  return m;
}

int parse_group_suffix(const std::string& name, const std::string& text) {
  int g = 0;
  for (char c : text) {
    OSCAR_CHECK(c >= '0' && c <= '9' && g < 1000000, "method '{}': '{}' is not a group size", name, text);
    g = g * 10 + (c - '0');
  }
  OSCAR_CHECK(!text.empty() && g > 0, "method '{}': '{}' is not a group size", name, text);
  return g;
}

}  // namespace

void register_baseline_methods() {
  register_method({"kivi",
                   "KIVI: per-channel K in groups of G=32 tokens, per-token V in groups of G channels, float zero, "
                   "residual R=128 (--group-size G, --recent R)",
                   false, [](const std::string& name, const MethodContext& context) -> std::unique_ptr<KvMethod> {
                     return std::make_unique<KiviMethod>(name, context, kKiviGroup, ZeroPoint::float_min, false);
                   }});
  register_method({"kivi:", "kivi:<G>: KIVI with group size G (kivi:128 is KIVI's other published setting)", false,
                   [](const std::string& name, const MethodContext& context) -> std::unique_ptr<KvMethod> {
                     const int g = parse_group_suffix(name, name.substr(5));
                     return std::make_unique<KiviMethod>(name, context, g, ZeroPoint::float_min, false);
                   }});
  register_method({"hadamard:",
                   "hadamard:kivi[:<G>]: QuaRot at KIVI granularity: H on K and V, KIVI axes and windows, integer "
                   "zero (G=32 default)",
                   false, [](const std::string& name, const MethodContext& context) -> std::unique_ptr<KvMethod> {
                     const std::string variant = name.substr(9);
                     int g = kKiviGroup;
                     if (variant.rfind("kivi:", 0) == 0) g = parse_group_suffix(name, variant.substr(5));
                     else OSCAR_CHECK(variant == "kivi", "unknown method '{}' (hadamard variants: hadamard:kivi, "
                                                         "hadamard:kivi:<G>)", name);
                     return std::make_unique<KiviMethod>(name, context, g, ZeroPoint::integer, true);
                   }});
  register_method({"oscars",
                   "OScaR: H on Q/K/V, omni-token key norm, per-channel K / per-token V in groups of 32, integer "
                   "zero, BF16 tail 0..255",
                   false, [](const std::string& name, const MethodContext& context) -> std::unique_ptr<KvMethod> {
                     return std::make_unique<OscarsMethod>(name, context);
                   }});
  register_method({"turboquant",
                   "TurboQuant (MSE): randomized Hadamard, fp16 norm, Lloyd-Max N(0,1/d) codebook at --bits (2)",
                   false, [](const std::string& name, const MethodContext& context) {
                     return make_turboquant(name, context, "");
                   }});
  register_method({"turboquant:",
                   "turboquant:qjl (keys: (b-1)-bit codebook + 1 QJL residual bit), turboquant:k3v3 (3-bit "
                   "Lloyd-Max keys, 3-bit uniform values)",
                   false, [](const std::string& name, const MethodContext& context) {
                     return make_turboquant(name, context, name.substr(11));
                   }});
  register_method({"int4-hadamard", "H on K and V, per-token INT4 (G = head_dim), integer zero: the 4.25-bit reference",
                   false, [](const std::string& name, const MethodContext& context) {
                     return make_int4_hadamard(name, context);
                   }});
}

}  // namespace oscar::baselines
