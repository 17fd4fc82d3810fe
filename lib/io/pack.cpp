// Reading and writing "oscar.pack" files (see pack.h and docs/formats.md).
#include "io/pack.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "cli/atomic_file.h"
#include "common/error.h"
#include "io/hdf5.h"

namespace oscar {

const LayerPack* Pack::find_layer(int layer) const {
  for (const auto& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

static std::string side_group(int layer, const char* side) {
  return "/layers/" + std::to_string(layer) + "/" + side;
}

Pack read_pack(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  f.check_schema(kPackSchema, kPackSchemaVersion);
  Pack p;
  p.num_layers = static_cast<int>(f.attribute_int("/", "num_layers"));
  p.num_kv_heads = static_cast<int>(f.attribute_int("/", "num_kv_heads"));
  p.head_dim = static_cast<int>(f.attribute_int("/", "head_dim"));
  OSCAR_CHECK(p.num_layers > 0 && p.num_kv_heads > 0 && p.head_dim > 0, "{}: geometry attributes must be positive", path);
  p.composition = f.attribute_string("/", "composition");
  p.scope = f.attribute_string("/", "scope");
  OSCAR_CHECK(p.scope == "layer" || p.scope == "head", "{}: scope '{}' is neither 'layer' nor 'head'", path, p.scope);
  p.clip_rule = f.attribute_string("/", "clip_rule");
  p.key_target = f.attribute_string("/", "key_target");
  p.value_target = f.attribute_string("/", "value_target");
  p.group_size = static_cast<int>(f.attribute_int("/", "group_size"));
  p.sink_tokens = static_cast<int>(f.attribute_int("/", "sink_tokens"));
  p.recent_tokens = static_cast<int>(f.attribute_int("/", "recent_tokens"));
  p.stats_hash = f.attribute_string("/", "stats_hash");
  p.provenance_json = f.attribute_string("/", "provenance");
  const int64_t d = p.head_dim, heads = p.scope == "head" ? p.num_kv_heads : 1;
  for (const auto& name : f.list("/layers")) {
    LayerPack lp;
    lp.layer = std::stoi(name);
    OSCAR_CHECK(lp.layer >= 0 && lp.layer < p.num_layers, "{}: /layers/{} outside num_layers {}", path, name, p.num_layers);
    for (auto [side_name, side] : {std::pair{"key", &lp.key}, std::pair{"value", &lp.value}}) {
      const std::string group = side_group(lp.layer, side_name);
      const std::vector<int64_t> want = p.scope == "head" ? std::vector<int64_t>{heads, d, d} : std::vector<int64_t>{d, d};
      auto shape = f.shape(group + "/rotation");
      OSCAR_CHECK(shape == want, "{}: {}/rotation has shape [{}], expected [{}] (head_dim {}, scope {})", path, group,
                  fmt::join(shape, ", "), fmt::join(want, ", "), d, p.scope);
      auto rotation = f.read_doubles(group + "/rotation");
      side->rotation.assign(rotation.begin(), rotation.end());
      side->eigenvalues = f.read_doubles(group + "/eigenvalues");
      OSCAR_CHECK(static_cast<int64_t>(side->eigenvalues.size()) == heads * d, "{}: {}/eigenvalues must hold {} values",
                  path, group, heads * d);
      if (f.exists(group + "/eigenvectors")) side->eigenvectors = f.read_doubles(group + "/eigenvectors");
      side->clip_ratio = static_cast<float>(f.attribute_double(group, "clip_ratio"));
      OSCAR_CHECK(side->clip_ratio > 0 && side->clip_ratio <= 1, "{}: {} clip_ratio {} outside (0, 1]", path, group,
                  side->clip_ratio);
      for (float x : side->rotation) OSCAR_CHECK(std::isfinite(x), "{}: {}/rotation holds NaN or Inf", path, group);
    }
    p.layers.push_back(std::move(lp));
  }
  std::sort(p.layers.begin(), p.layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  OSCAR_CHECK(!p.layers.empty(), "{}: no layers under /layers", path);
  return p;
}

void write_pack(const std::string& path, const Pack& p) {
  AtomicOutputFile output(path);
  {
    h5::File f = h5::File::create(output.temporary_path());
    f.write_schema(kPackSchema, kPackSchemaVersion);
    f.set_attribute("/", "num_layers", int64_t{p.num_layers});
    f.set_attribute("/", "num_kv_heads", int64_t{p.num_kv_heads});
    f.set_attribute("/", "head_dim", int64_t{p.head_dim});
    f.set_attribute("/", "composition", p.composition);
    f.set_attribute("/", "scope", p.scope);
    f.set_attribute("/", "clip_rule", p.clip_rule);
    f.set_attribute("/", "key_target", p.key_target);
    f.set_attribute("/", "value_target", p.value_target);
    f.set_attribute("/", "group_size", int64_t{p.group_size});
    f.set_attribute("/", "sink_tokens", int64_t{p.sink_tokens});
    f.set_attribute("/", "recent_tokens", int64_t{p.recent_tokens});
    f.set_attribute("/", "stats_hash", p.stats_hash);
    f.set_attribute("/", "provenance", p.provenance_json);
    const int64_t d = p.head_dim, heads = p.scope == "head" ? p.num_kv_heads : 1;
    for (const auto& lp : p.layers) {
      for (auto [side_name, side] : {std::pair{"key", &lp.key}, std::pair{"value", &lp.value}}) {
        const std::string group = side_group(lp.layer, side_name);
        f.create_group(group);
        std::vector<int64_t> matrix_shape = p.scope == "head" ? std::vector<int64_t>{heads, d, d} : std::vector<int64_t>{d, d};
        std::vector<int64_t> vector_shape = p.scope == "head" ? std::vector<int64_t>{heads, d} : std::vector<int64_t>{d};
        f.write_floats(group + "/rotation", matrix_shape, side->rotation.data());
        f.write_doubles(group + "/eigenvalues", vector_shape, side->eigenvalues.data());
        if (!side->eigenvectors.empty()) f.write_doubles(group + "/eigenvectors", matrix_shape, side->eigenvectors.data());
        f.set_attribute(group, "clip_ratio", static_cast<double>(side->clip_ratio));
      }
    }
  }
  output.commit();
}

}  // namespace oscar
