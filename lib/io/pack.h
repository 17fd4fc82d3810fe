// The rotation pack "oscar.pack" (docs/formats.md): per layer (and per KV head with scope head)
// float32 R_K and R_V [d, d] used as x_row @ R, eigenvalues, composition, clipping rule and ratios,
// group size, default windows, and a hash of the statistics it came from.
#pragma once
#include <string>
#include <vector>

namespace oscar {

inline constexpr const char* kPackSchema = "oscar.pack";
inline constexpr int kPackSchemaVersion = 1;

struct RotationSide {            // key or value side of one layer
  std::vector<float> rotation;   // [heads, d, d] row-major; heads = 1 for scope layer
  std::vector<double> eigenvalues;   // [heads, d], ascending, of the target the rotation came from
  std::vector<double> eigenvectors;  // [heads, d, d] row-major, column i belongs to eigenvalues[i]
                                     // (lets a harness compose any ablation from one pack)
  float clip_ratio = 1.0f;
  const float* head_rotation(int kv_head, int dim) const {  // scope layer: every head shares one
    size_t heads = rotation.size() / (static_cast<size_t>(dim) * dim);
    return rotation.data() + (heads == 1 ? 0 : static_cast<size_t>(kv_head) * dim * dim);
  }
};

struct LayerPack {
  int layer = 0;
  RotationSide key, value;
};

struct Pack {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  std::string composition = "u_h_p";
  std::string scope = "layer";        // "layer" | "head"
  std::string clip_rule = "fixed";    // "fixed" | "fit"
  std::string value_target = "proxy";  // "proxy" | "scores" | "gram" (V^T V); key: "query" | "gram"
  std::string key_target = "query";
  int group_size = 0;                 // 0 = head_dim
  int sink_tokens = 64, recent_tokens = 256;
  std::string stats_hash, provenance_json;
  std::vector<LayerPack> layers;      // sorted by layer index
  const LayerPack* find_layer(int layer) const;
};

Pack read_pack(const std::string& path);                 // validates; throws oscar::Error naming the file
void write_pack(const std::string& path, const Pack& pack);  // atomic

}  // namespace oscar
