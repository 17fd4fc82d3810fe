// bf16, naive, hadamard, oscar and oscar-ablation:* as RotatedQuantizerSpecs (see
// rotated_quantizer_method.h; defaults in docs/tools/oscar-eval.md).
#include "methods/rotated_quantizer_method.h"

#include <algorithm>
#include <climits>

#include "common/error.h"

namespace oscar {
namespace {

constexpr double kReferenceKeyClip = 0.96;    // the reference code's fixed ratios (oscar-method.md 4)
constexpr double kReferenceValueClip = 0.92;

// Pack access with errors that name the pack file.
const LayerPack& pack_layer(const MethodContext& context, int layer) {
  const LayerPack* found = context.pack->find_layer(layer);
  OSCAR_CHECK(found, "{}: the pack has no layer {}", context.pack_path, layer);
  return *found;
}

int side_heads(const RotationSide& side, int dim, const std::string& pack_path, int layer) {
  const size_t per_head = static_cast<size_t>(dim) * dim;
  OSCAR_CHECK(!side.rotation.empty() && side.rotation.size() % per_head == 0,
              "{}: layer {} rotation has {} values, not a multiple of head_dim^2 = {}", pack_path, layer,
              side.rotation.size(), per_head);
  return static_cast<int>(side.rotation.size() / per_head);
}

MatrixD pack_rotation(const MethodContext& context, const RotationSide& side, int layer, int kv_head) {
  const int d = context.geometry.head_dim;
  const int heads = side_heads(side, d, context.pack_path, layer);
  OSCAR_CHECK(heads == 1 || kv_head < heads, "{}: layer {} has rotations for {} KV heads, the dump has {}",
              context.pack_path, layer, heads, context.geometry.num_kv_heads);
  const float* r = side.head_rotation(kv_head, d);
  MatrixD m(d, d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) m(i, j) = r[static_cast<size_t>(i) * d + j];
  return m;
}

MatrixD pack_composition(const MethodContext& context, const RotationSide& side, int layer, int kv_head,
                         const std::string& composition) {
  const int d = context.geometry.head_dim;
  const size_t per_head = static_cast<size_t>(d) * d;
  OSCAR_CHECK(!side.eigenvectors.empty() && side.eigenvectors.size() % per_head == 0 &&
                  side.eigenvalues.size() * d == side.eigenvectors.size(),
              "{}: layer {} has no eigenbasis (eigenvalues/eigenvectors), needed for oscar-ablation:{}",
              context.pack_path, layer, composition);
  const int heads = static_cast<int>(side.eigenvectors.size() / per_head);
  OSCAR_CHECK(heads == 1 || kv_head < heads, "{}: layer {} has eigenbases for {} KV heads, the dump has {}",
              context.pack_path, layer, heads, context.geometry.num_kv_heads);
  const int h = heads == 1 ? 0 : kv_head;
  Eigenbasis basis;
  basis.eigenvalues.resize(d);
  basis.vectors.resize(d, d);
  for (int i = 0; i < d; ++i) basis.eigenvalues[i] = side.eigenvalues[static_cast<size_t>(h) * d + i];
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) basis.vectors(i, j) = side.eigenvectors[h * per_head + static_cast<size_t>(i) * d + j];
  return compose_rotation(composition, basis);
}

void check_pack_geometry(const MethodContext& context) {
  const Pack& pack = *context.pack;
  OSCAR_CHECK(pack.head_dim == context.geometry.head_dim, "{}: pack has head_dim {} but the dump has head_dim {}",
              context.pack_path, pack.head_dim, context.geometry.head_dim);
  OSCAR_CHECK(pack.scope != "head" || pack.num_kv_heads == context.geometry.num_kv_heads,
              "{}: pack (scope head) has {} KV heads but the dump has {}", context.pack_path, pack.num_kv_heads,
              context.geometry.num_kv_heads);
}

// Baseline defaults: no windows, no clipping, G = d (baselines.md).
RotatedQuantizerSpec baseline_spec(const std::string& name, const MethodContext& context) {
  RotatedQuantizerSpec spec;
  spec.name = name;
  spec.layout.sink_tokens = 0;
  spec.layout.recent_tokens = 0;
  spec.key_quantizer.clip_ratio = 1.0f;
  spec.value_quantizer.clip_ratio = 1.0f;
  apply_method_options(context.options, spec.layout, spec.key_quantizer, spec.value_quantizer);
  return spec;
}

// OSCAR defaults from the pack: its windows, group size and per-layer clip ratios (pack_clips = true),
// or fixed ratios key_clip / value_clip. --k-clip / --v-clip override either.
RotatedQuantizerSpec pack_spec(const std::string& name, const MethodContext& context, bool pack_clips,
                               double key_clip, double value_clip, bool windows) {
  check_pack_geometry(context);
  const Pack& pack = *context.pack;
  RotatedQuantizerSpec spec;
  spec.name = name;
  spec.layout.sink_tokens = windows ? pack.sink_tokens : 0;
  spec.layout.recent_tokens = windows ? pack.recent_tokens : 0;
  spec.key_quantizer.group_size = spec.value_quantizer.group_size = pack.group_size;
  spec.key_quantizer.clip_ratio = static_cast<float>(key_clip);
  spec.value_quantizer.clip_ratio = static_cast<float>(value_clip);
  apply_method_options(context.options, spec.layout, spec.key_quantizer, spec.value_quantizer);
  if (pack_clips && !context.options.key_clip)
    spec.key_clip = [context](int layer) { return pack_layer(context, layer).key.clip_ratio; };
  if (pack_clips && !context.options.value_clip)
    spec.value_clip = [context](int layer) { return pack_layer(context, layer).value.clip_ratio; };
  return spec;
}

std::unique_ptr<KvMethod> make(RotatedQuantizerSpec spec, const MethodContext& context) {
  return std::make_unique<RotatedQuantizerMethod>(std::move(spec), context.geometry.head_dim);
}

}  // namespace

void apply_method_options(const MethodOptions& options, CacheLayout& layout, QuantizerConfig& key_quantizer,
                          QuantizerConfig& value_quantizer) {
  if (options.sink_tokens) layout.sink_tokens = *options.sink_tokens;
  if (options.recent_tokens) layout.recent_tokens = *options.recent_tokens;
  layout.page_tokens = options.page_tokens;
  for (QuantizerConfig* q : {&key_quantizer, &value_quantizer}) {
    q->bits = options.bits;
    q->metadata = options.metadata;
    if (options.group_size) q->group_size = *options.group_size;
  }
  if (options.key_clip) key_quantizer.clip_ratio = static_cast<float>(*options.key_clip);
  if (options.value_clip) value_quantizer.clip_ratio = static_cast<float>(*options.value_clip);
}

RotatedQuantizerMethod::RotatedQuantizerMethod(RotatedQuantizerSpec spec, int head_dim)
    : spec_(std::move(spec)), head_dim_(head_dim) {
  if (spec_.quantizes) {
    validate_quantizer(spec_.key_quantizer, head_dim);
    validate_quantizer(spec_.value_quantizer, head_dim);
  }
  split_context(0, spec_.layout);
}

QuantizerConfig RotatedQuantizerMethod::key_quantizer(int layer) const {
  QuantizerConfig config = spec_.key_quantizer;
  if (spec_.key_clip) config.clip_ratio = spec_.key_clip(layer);
  return config;
}

QuantizerConfig RotatedQuantizerMethod::value_quantizer(int layer) const {
  QuantizerConfig config = spec_.value_quantizer;
  if (spec_.value_clip) config.clip_ratio = spec_.value_clip(layer);
  return config;
}

MatrixD RotatedQuantizerMethod::key_rotation(int layer, int kv_head) const {
  return spec_.key_rotation ? spec_.key_rotation(layer, kv_head) : MatrixD::Identity(head_dim_, head_dim_);
}

MatrixD RotatedQuantizerMethod::value_rotation(int layer, int kv_head) const {
  return spec_.value_rotation ? spec_.value_rotation(layer, kv_head) : MatrixD::Identity(head_dim_, head_dim_);
}

void register_rotated_quantizer_methods() {
  register_method({"bf16", "every token in BF16 (the storage noise floor; 16 BPE; ignores windows and quantiser flags)",
                   false, [](const std::string& name, const MethodContext& context) {
                     RotatedQuantizerSpec spec;
                     spec.name = name;
                     spec.quantizes = false;
                     spec.layout.sink_tokens = 0;
                     spec.layout.recent_tokens = INT_MAX / 2;  // everything stays in the window tier
                     return make(std::move(spec), context);
                   }});
  register_method({"naive", "no rotation, no clipping, no windows (defaults; flags override)", false,
                   [](const std::string& name, const MethodContext& context) {
                     return make(baseline_spec(name, context), context);
                   }});
  register_method({"hadamard", "R_K = R_V = H (normalised Sylvester Hadamard), no clipping, no windows", false,
                   [](const std::string& name, const MethodContext& context) {
                     auto spec = baseline_spec(name, context);
                     const int d = context.geometry.head_dim;
                     MatrixD h = hadamard_matrix(d);  // checks d is a power of two
                     spec.key_rotation = spec.value_rotation = [h](int, int) { return h; };
                     return make(std::move(spec), context);
                   }});
  register_method({"oscar", "the pack's R_K, R_V, clip ratios, group size and windows", true,
                   [](const std::string& name, const MethodContext& context) {
                     auto spec = pack_spec(name, context, true, 1.0, 1.0, true);
                     spec.key_rotation = [context](int layer, int kv_head) {
                       return pack_rotation(context, pack_layer(context, layer).key, layer, kv_head);
                     };
                     spec.value_rotation = [context](int layer, int kv_head) {
                       return pack_rotation(context, pack_layer(context, layer).value, layer, kv_head);
                     };
                     return make(std::move(spec), context);
                   }});
  register_method(
      {"oscar-ablation:",
       "oscar with one part changed: <composition> (none, h, u, u_h, u_h_p, h_p, u_p, u_p_h, rebuilt from the "
       "pack's eigenbasis), clip-fixed (0.96/0.92), no-clip, no-windows",
       true, [](const std::string& name, const MethodContext& context) {
         const std::string variant = name.substr(name.find(':') + 1);
         const auto& compositions = composition_names();
         double key_clip = 1.0, value_clip = 1.0;
         bool windows = true, pack_clips = true;
         const bool composition = std::find(compositions.begin(), compositions.end(), variant) != compositions.end();
         if (variant == "clip-fixed") {
           key_clip = kReferenceKeyClip;
           value_clip = kReferenceValueClip;
           pack_clips = false;
         } else if (variant == "no-clip") {
           pack_clips = false;
         } else if (variant == "no-windows") {
           windows = false;
         } else if (!composition) {
           fail("unknown method '{}' (oscar-ablation variants: none, h, u, u_h, u_h_p, h_p, u_p, u_p_h, clip-fixed, "
                "no-clip, no-windows)",
                name);
         }
         auto spec = pack_spec(name, context, pack_clips, key_clip, value_clip, windows);
         if (composition) {
           spec.key_rotation = [context, variant](int layer, int kv_head) {
             return pack_composition(context, pack_layer(context, layer).key, layer, kv_head, variant);
           };
           spec.value_rotation = [context, variant](int layer, int kv_head) {
             return pack_composition(context, pack_layer(context, layer).value, layer, kv_head, variant);
           };
         } else {
           spec.key_rotation = [context](int layer, int kv_head) {
             return pack_rotation(context, pack_layer(context, layer).key, layer, kv_head);
           };
           spec.value_rotation = [context](int layer, int kv_head) {
             return pack_rotation(context, pack_layer(context, layer).value, layer, kv_head);
           };
         }
         return make(std::move(spec), context);
       }});
}

}  // namespace oscar
