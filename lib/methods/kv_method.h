// The method layer of the evaluation harness: one KvMethod per way of storing the KV cache (bf16, naive,
// hadamard, oscar, ablations, and later baselines), created by name from a registry. A method decides
// the rotation of keys/queries and values, how each token is stored (BF16 window or quantised), the
// tier layout at each context, and what the stored bits are. The harness does everything else.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/segmented_cache.h"
#include "io/dump.h"
#include "io/pack.h"
#include "quant/quantizer.h"
#include "rotation/rotation.h"

namespace oscar {

// User overrides (unset = the method's default) shared by every method, so sweeps compare on equal
// footing; plus the settings that have one value for all methods.
struct MethodOptions {
  std::optional<int> sink_tokens, recent_tokens;  // --sink, --recent
  std::optional<int> group_size;                  // --group-size (0 = head_dim)
  std::optional<double> key_clip, value_clip;     // --k-clip, --v-clip (1 = no clipping)
  int bits = 2;                                   // --bits
  MetadataType metadata = MetadataType::fp16;     // --metadata
  int page_tokens = 8;                            // --page
};

// Everything a method factory may read: model geometry, the pack (null when none was given) and the
// options.
struct MethodContext {
  ModelGeometry geometry;
  const Pack* pack = nullptr;
  std::string pack_path;  // for error messages
  MethodOptions options;
};

// The K/V rows of one KV head of one sequence, as the model produced them (the harness rounds them to
// BF16 first, like a BF16 activation path).
struct HeadRows {
  int layer = 0, kv_head = 0, dim = 0;
  int64_t tokens = 0;
  const float* keys = nullptr;    // [tokens, d]
  const float* values = nullptr;  // [tokens, d]
  // Keys [tokens, d] of every KV head of this layer (index = KV head, same rounding as keys), for methods
  // that need the whole layer (OScaR's omni-token norm); empty when the caller has only this head.
  std::vector<const float*> layer_keys;
};

class KvMethod {
 public:
  virtual ~KvMethod() = default;
  virtual std::string name() const = 0;
  // The cache layout (windows, page) this method uses.
  virtual CacheLayout layout() const = 0;
  // Quantiser settings of the history tier of one layer (clip ratios may differ per layer).
  virtual QuantizerConfig key_quantizer(int layer) const = 0;
  virtual QuantizerConfig value_quantizer(int layer) const = 0;
  // R_K and R_V of one (layer, KV head): [d, d] float64, x_row @ R. Identity for unrotated methods.
  virtual MatrixD key_rotation(int layer, int kv_head) const = 0;
  virtual MatrixD value_rotation(int layer, int kv_head) const = 0;
  // Encodes every token of one KV head (rows in the original basis) in the method's rotated space.
  // The default rotates with key_rotation / value_rotation and quantises with the configs above.
  virtual EncodedSequence encode(const HeadRows& rows) const;
  // True when the layout may put tokens in the quantised tier (false for bf16).
  virtual bool quantizes() const { return true; }
  // True when encode() returns an EncodedSequence with external storage (dequantised rows that are not
  // per-token QuantizedRows): only the CPU reference backend can decode it.
  virtual bool cpu_reference_only() const { return false; }
};

using MethodFactory = std::function<std::unique_ptr<KvMethod>(const std::string& name, const MethodContext&)>;

struct MethodInfo {
  std::string name;         // exact name, or a prefix ending in ':' for a family ("oscar-ablation:")
  std::string description;  // one line for --help and docs
  bool needs_pack = false;
  MethodFactory factory;
};

// All registered methods, in registration order. Built-ins register on first use.
const std::vector<MethodInfo>& method_registry();
// Adds a method (a new baseline calls this from its own registration function, listed in
// register_builtin_methods in method_registry.cpp).
void register_method(MethodInfo info);
// Creates a method by name; fails with one line for an unknown name or a missing pack.
std::unique_ptr<KvMethod> make_method(const std::string& name, const MethodContext& context);
// "bf16, naive, ..." for help texts and error messages.
std::string method_names_help();

// Rotates rows [n, d] by R (float64 [d, d]): out = x · R, accumulated in float64. R = identity copies.
void rotate_rows(const float* x, int64_t n, int dim, const MatrixD& rotation, float* out);
bool is_identity(const MatrixD& rotation);

}  // namespace oscar
