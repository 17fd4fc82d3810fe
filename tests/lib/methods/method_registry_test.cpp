// Method registry tests: names, defaults, overrides, rotations from a pack (including ablation
// compositions rebuilt from its eigenbasis) and one-line errors for bad names and geometry.
#include "methods/kv_method.h"

#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "common/float16.h"

namespace oscar {
namespace {

ModelGeometry geometry(int d = 16, int kv_heads = 2) { return ModelGeometry{2, 2 * kv_heads, kv_heads, d, true}; }

// A pack (scope layer) whose eigenbasis comes from a random symmetric matrix per layer and side.
Pack random_pack(int d, int num_layers, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Pack pack;
  pack.num_layers = num_layers;
  pack.num_kv_heads = 2;
  pack.head_dim = d;
  pack.sink_tokens = 5;
  pack.recent_tokens = 7;
  for (int l = 0; l < num_layers; ++l) {
    LayerPack lp;
    lp.layer = l;
    for (RotationSide* side : {&lp.key, &lp.value}) {
      MatrixD a(d, d);
      for (int i = 0; i < d * d; ++i) a.data()[i] = normal(rng);
      const Eigenbasis basis = symmetric_eigenbasis(a * a.transpose());
      const MatrixD r = compose_rotation("u_h_p", basis);
      for (int i = 0; i < d; ++i) side->eigenvalues.push_back(basis.eigenvalues[i]);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          side->eigenvectors.push_back(basis.vectors(i, j));
          side->rotation.push_back(static_cast<float>(r(i, j)));
        }
    }
    lp.key.clip_ratio = 0.9f - 0.1f * l;
    lp.value.clip_ratio = 0.8f;
    pack.layers.push_back(lp);
  }
  return pack;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MethodRegistry, BuiltinsAndErrors) {
  const std::string help = method_names_help();
  for (const char* name : {"bf16", "naive", "hadamard", "oscar", "oscar-ablation:<variant>"})
    EXPECT_NE(help.find(name), std::string::npos) << name;
  MethodContext context{geometry(), nullptr, "", {}};
  EXPECT_NE(error_of([&] { make_method("kivi2", context); }).find("unknown method 'kivi2'"), std::string::npos);
  EXPECT_NE(error_of([&] { make_method("oscar", context); }).find("needs a rotation pack"), std::string::npos);
  EXPECT_NE(error_of([&] { make_method("oscar-ablation:u_h", context); }).find("needs a rotation pack"),
            std::string::npos);
  Pack pack = random_pack(16, 2, 1);
  context.pack = &pack;
  context.pack_path = "p.h5";
  EXPECT_NE(error_of([&] { make_method("oscar-ablation:bogus", context); }).find("unknown method 'oscar-ablation:bogus'"),
            std::string::npos);
  MethodContext wrong{geometry(32), &pack, "p.h5", {}};
  EXPECT_EQ(error_of([&] { make_method("oscar", wrong); }), "p.h5: pack has head_dim 16 but the dump has head_dim 32");
  auto oscar = make_method("oscar", context);
  EXPECT_EQ(error_of([&] { oscar->key_rotation(5, 0); }), "p.h5: the pack has no layer 5");
}

TEST(MethodRegistry, BaselineDefaultsAndOverrides) {
  MethodContext context{geometry(), nullptr, "", {}};
  auto naive = make_method("naive", context);
  EXPECT_EQ(naive->layout().sink_tokens, 0);
  EXPECT_EQ(naive->layout().recent_tokens, 0);
  EXPECT_EQ(naive->key_quantizer(0).clip_ratio, 1.0f);
  EXPECT_EQ(naive->key_quantizer(0).resolved_group(16), 16);
  EXPECT_EQ(naive->key_quantizer(0).metadata, MetadataType::fp16);
  EXPECT_TRUE(is_identity(naive->key_rotation(0, 1)));
  auto hadamard = make_method("hadamard", context);
  EXPECT_EQ(hadamard->key_rotation(1, 1), hadamard_matrix(16));
  EXPECT_EQ(hadamard->value_rotation(0, 0), hadamard_matrix(16));
  auto bf16 = make_method("bf16", context);
  EXPECT_FALSE(bf16->quantizes());
  EXPECT_EQ(split_context(100000, bf16->layout()).recent, 100000);

  context.options.sink_tokens = 3;
  context.options.recent_tokens = 9;
  context.options.group_size = 8;
  context.options.key_clip = 0.5;
  context.options.bits = 3;
  context.options.metadata = MetadataType::fp32;
  auto swept = make_method("hadamard", context);
  EXPECT_EQ(swept->layout().sink_tokens, 3);
  EXPECT_EQ(swept->layout().recent_tokens, 9);
  EXPECT_EQ(swept->key_quantizer(0).group_size, 8);
  EXPECT_EQ(swept->value_quantizer(0).group_size, 8);
  EXPECT_EQ(swept->key_quantizer(0).clip_ratio, 0.5f);
  EXPECT_EQ(swept->value_quantizer(0).clip_ratio, 1.0f);
  EXPECT_EQ(swept->key_quantizer(0).bits, 3);
  EXPECT_EQ(swept->key_quantizer(0).metadata, MetadataType::fp32);
  context.options.group_size = 5;  // does not divide d = 16
  EXPECT_THROW(make_method("naive", context), Error);
}

TEST(MethodRegistry, PackMethodsUseThePack) {
  const int d = 16;
  Pack pack = random_pack(d, 2, 2);
  MethodContext context{geometry(d), &pack, "p.h5", {}};
  auto oscar = make_method("oscar", context);
  EXPECT_EQ(oscar->layout().sink_tokens, 5);
  EXPECT_EQ(oscar->layout().recent_tokens, 7);
  EXPECT_FLOAT_EQ(oscar->key_quantizer(0).clip_ratio, 0.9f);
  EXPECT_FLOAT_EQ(oscar->key_quantizer(1).clip_ratio, 0.8f);  // per-layer ratio
  EXPECT_FLOAT_EQ(oscar->value_quantizer(1).clip_ratio, 0.8f);
  const MatrixD rk = oscar->key_rotation(1, 1);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) EXPECT_EQ(rk(i, j), static_cast<double>(pack.layers[1].key.rotation[i * d + j]));
  // The ablation u_h_p rebuilt from the eigenbasis equals the stored rotation up to float32 storage.
  auto rebuilt = make_method("oscar-ablation:u_h_p", context);
  EXPECT_LT((rebuilt->key_rotation(1, 0) - rk).cwiseAbs().maxCoeff(), 1e-6);
  auto none = make_method("oscar-ablation:none", context);
  EXPECT_TRUE(is_identity(none->key_rotation(0, 0)));
  EXPECT_EQ(none->layout().recent_tokens, 7);  // keeps windows and clipping
  EXPECT_FLOAT_EQ(none->key_quantizer(0).clip_ratio, 0.9f);
  auto u = make_method("oscar-ablation:u", context);
  Eigenbasis basis;
  basis.eigenvalues = Eigen::Map<const VectorD>(pack.layers[0].value.eigenvalues.data(), d);
  basis.vectors = Eigen::Map<const MatrixD>(pack.layers[0].value.eigenvectors.data(), d, d);
  EXPECT_EQ(u->value_rotation(0, 1), basis.vectors);
  auto fixed = make_method("oscar-ablation:clip-fixed", context);
  EXPECT_FLOAT_EQ(fixed->key_quantizer(1).clip_ratio, 0.96f);
  EXPECT_FLOAT_EQ(fixed->value_quantizer(1).clip_ratio, 0.92f);
  auto no_clip = make_method("oscar-ablation:no-clip", context);
  EXPECT_EQ(no_clip->key_quantizer(0).clip_ratio, 1.0f);
  auto no_windows = make_method("oscar-ablation:no-windows", context);
  EXPECT_EQ(no_windows->layout().sink_tokens + no_windows->layout().recent_tokens, 0);
  context.options.key_clip = 0.7;  // overrides the pack's per-layer ratios
  EXPECT_FLOAT_EQ(make_method("oscar", context)->key_quantizer(1).clip_ratio, 0.7f);
}

TEST(MethodRegistry, DefaultEncodeRotatesThenQuantises) {
  const int d = 16, tokens = 9;
  MethodContext context{geometry(d), nullptr, "", {}};
  auto hadamard = make_method("hadamard", context);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> k(tokens * d), v(tokens * d);
  for (auto& x : k) x = round_to_bf16(normal(rng));
  for (auto& x : v) x = round_to_bf16(normal(rng));
  const EncodedSequence e = hadamard->encode(HeadRows{0, 1, d, tokens, k.data(), v.data()});
  const MatrixD h = hadamard_matrix(d);
  std::vector<float> rotated(tokens * d);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < d; ++j) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += static_cast<double>(k[t * d + i]) * h(i, j);
      rotated[t * d + j] = static_cast<float>(acc);
      EXPECT_EQ(e.window_keys[t * d + j], round_to_bf16(rotated[t * d + j]));
    }
  const std::vector<float> windows(e.window_keys);
  const QuantizedRows expected = quantize_rows(windows.data(), tokens, d, hadamard->key_quantizer(0));
  EXPECT_EQ(e.quantized_keys.packed, expected.packed);
  EXPECT_EQ(e.quantized_keys.scale, expected.scale);
  EXPECT_EQ(e.quantized_keys.zero, expected.zero);
}

}  // namespace
}  // namespace oscar
