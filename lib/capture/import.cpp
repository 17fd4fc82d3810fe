// Raw-file import (see import.h). Each input becomes one sequence; layers are read whole per file.
#include "capture/import.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "common/error.h"
#include "io/hdf5.h"

namespace oscar {
namespace {

struct RawFile {
  h5::File file;
  ModelGeometry geometry;
  std::vector<int> layers;
  std::string model;
};

std::string layer_group_name(const ImportOptions& o, int layer) {
  if (o.layout == "oscar-raw") return "/layers/" + std::to_string(layer);
  std::string name = o.layer_group;
  auto brace = name.find("{}");
  OSCAR_CHECK(brace != std::string::npos, "--layer-group '{}' must contain {{}} for the layer index", name);
  name.replace(brace, 2, std::to_string(layer));
  return "/" + name;
}

// Datasets holding one tensor of a layer: "<base>" alone, or chunks "<base>_<i>" / "<base><i>" in order.
std::vector<std::string> tensor_parts(const h5::File& f, const std::string& group, const std::string& base) {
  if (f.exists(group + "/" + base)) return {group + "/" + base};
  std::vector<std::pair<long, std::string>> chunks;
  for (const auto& name : f.list(group)) {
    if (name.rfind(base, 0) != 0) continue;
    std::string rest = name.substr(base.size());
    if (!rest.empty() && rest[0] == '_') rest = rest.substr(1);
    if (rest.empty() || !std::all_of(rest.begin(), rest.end(), ::isdigit)) continue;
    chunks.emplace_back(std::stol(rest), group + "/" + name);
  }
  OSCAR_CHECK(!chunks.empty(), "{}: missing dataset '{}/{}' (nor chunks '{}_0', '{}_1', ...)", f.path(), group, base,
              base, base);
  std::sort(chunks.begin(), chunks.end());
  std::vector<std::string> parts;
  for (auto& c : chunks) parts.push_back(c.second);
  return parts;
}

// Reads a tensor of a layer as [T, heads, d] float32, whatever the stored axis order.
std::vector<float> read_tensor(const RawFile& raw, const ImportOptions& o, int layer, const std::string& base, int heads,
                               int64_t& tokens) {
  const int d = raw.geometry.head_dim;
  const std::string group = layer_group_name(o, layer);
  OSCAR_CHECK(raw.file.exists(group), "{}: missing group '{}' for layer {}", raw.file.path(), group, layer);
  const std::string axes = o.layout == "oscar-raw" ? "thd" : o.axes;
  std::vector<float> result;
  tokens = 0;
  for (const auto& ds : tensor_parts(raw.file, group, base)) {
    auto shape = raw.file.shape(ds);
    const size_t rank = axes.size();
    OSCAR_CHECK(shape.size() == rank, "{}: {} has rank {}, expected {} ({})", raw.file.path(), ds, shape.size(), rank, axes);
    if (axes == "bhtd") {
      OSCAR_CHECK(shape[0] == 1, "{}: {} has batch {}, expected 1", raw.file.path(), ds, shape[0]);
      shape.erase(shape.begin());
    }
    const bool token_major = axes == "thd";
    const int64_t t = token_major ? shape[0] : shape[1], h = token_major ? shape[1] : shape[0];
    OSCAR_CHECK(h == heads && shape[2] == d, "{}: {} has shape [{}], expected {} heads and head_dim {} ({})",
                raw.file.path(), ds, fmt::join(raw.file.shape(ds), ", "), heads, d, axes);
    std::vector<float> part(static_cast<size_t>(t) * h * d);
    raw.file.read_rows(ds, 0, raw.file.shape(ds)[0], part.data());
    if (!token_major) {  // [H, T, d] -> [T, H, d]
      std::vector<float> transposed(part.size());
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t tt = 0; tt < t; ++tt)
          std::copy_n(part.data() + (hh * t + tt) * d, d, transposed.data() + (tt * h + hh) * d);
      part.swap(transposed);
    }
    for (size_t i = 0; i < part.size(); ++i)
      OSCAR_CHECK(std::isfinite(part[i]), "{}: {} holds a non-finite value ({}) at token {}", raw.file.path(), ds,
                  part[i], tokens + static_cast<int64_t>(i / (static_cast<size_t>(h) * d)));
    result.insert(result.end(), part.begin(), part.end());
    tokens += t;
  }
  return result;
}

RawFile open_raw(const std::string& path, const ImportOptions& o) {
  RawFile raw{h5::File::open_read(path), {}, {}, o.model};
  h5::File& f = raw.file;
  ModelGeometry& g = raw.geometry;
  auto attribute_or = [&](const char* name, int fallback) {
    if (f.has_attribute("/", name)) return static_cast<int>(f.attribute_int("/", name));
    OSCAR_CHECK(fallback > 0, "{}: no attribute '{}': give it with --{}", path, name,
                std::string(name) == "num_layers" ? "num-layers" : std::string(name) == "head_dim" ? "head-dim"
                : std::string(name) == "num_q_heads" ? "q-heads" : "kv-heads");
    return fallback;
  };
  if (o.layout == "oscar-raw") {
    OSCAR_CHECK(f.has_attribute("/", "schema") && f.attribute_string("/", "schema") == "oscar.raw",
                "{}: not an oscar.raw file (schema attribute missing or different; use --layout grouped for other layouts)",
                path);
  } else {
    OSCAR_CHECK(o.layout == "grouped", "unknown --layout '{}' (oscar-raw or grouped)", o.layout);
  }
  g.num_layers = attribute_or("num_layers", o.num_layers);
  g.num_q_heads = attribute_or("num_q_heads", o.num_q_heads);
  g.num_kv_heads = attribute_or("num_kv_heads", o.num_kv_heads);
  g.head_dim = attribute_or("head_dim", o.head_dim);
  g.rope_applied = !f.has_attribute("/", "rope_applied") || f.attribute_int("/", "rope_applied") != 0;
  OSCAR_CHECK(g.num_q_heads > 0 && g.num_kv_heads > 0 && g.head_dim > 0, "{}: geometry must be positive", path);
  OSCAR_CHECK(g.num_q_heads % g.num_kv_heads == 0, "{}: num_q_heads {} is not divisible by num_kv_heads {}", path,
              g.num_q_heads, g.num_kv_heads);
  if (raw.model.empty() && f.has_attribute("/", "model")) raw.model = f.attribute_string("/", "model");
  for (int layer = 0; layer < g.num_layers; ++layer)
    if (f.exists(layer_group_name(o, layer))) raw.layers.push_back(layer);
  OSCAR_CHECK(!raw.layers.empty(), "{}: no layer groups found ({} for layer 0)", path, layer_group_name(o, 0));
  return raw;
}

}  // namespace

DumpInfo import_raw_files(const std::vector<std::string>& inputs, const std::string& output, const ImportOptions& o,
                          const std::string& provenance_json) {
  OSCAR_CHECK(!inputs.empty(), "no raw input files given");
  std::vector<RawFile> raws;
  for (const auto& path : inputs) raws.push_back(open_raw(path, o));
  const ModelGeometry g = raws[0].geometry;
  for (const auto& r : raws) {
    const ModelGeometry& x = r.geometry;
    OSCAR_CHECK(x.num_q_heads == g.num_q_heads && x.num_kv_heads == g.num_kv_heads && x.head_dim == g.head_dim &&
                    x.num_layers == g.num_layers,
                "{}: geometry differs from {}", r.file.path(), raws[0].file.path());
  }
  std::vector<int> layers = o.layers.empty() ? raws[0].layers : o.layers;
  for (const auto& r : raws)
    for (int layer : layers)
      OSCAR_CHECK(std::find(r.layers.begin(), r.layers.end(), layer) != r.layers.end(), "{}: layer {} is missing",
                  r.file.path(), layer);

  // Token counts per file (from the first layer's keys), then the kept range.
  DumpInfo info;
  info.geometry = g;
  info.layers = layers;
  info.dtype = o.dtype;
  info.model = raws[0].model;
  // Keep each raw file's own provenance (text, checksums, hook settings) next to ours.
  nlohmann::ordered_json provenance = nlohmann::ordered_json::parse(provenance_json, nullptr, false);
  if (provenance.is_object()) {
    nlohmann::ordered_json raw_files = nlohmann::ordered_json::array();
    for (const auto& r : raws) {
      nlohmann::ordered_json entry;
      entry["file"] = r.file.path();
      for (const char* key : {"model", "source", "source_sha256", "token_offset", "provenance"}) {
        if (!r.file.has_attribute("/", key)) continue;
        try {
          entry[key] = r.file.attribute_string("/", key);
        } catch (const Error&) {
          entry[key] = r.file.attribute_int("/", key);
        }
      }
      raw_files.push_back(entry);
    }
    provenance["raw_files"] = raw_files;
    info.provenance_json = provenance.dump();
  } else {
    info.provenance_json = provenance_json;
  }
  info.queries_kept_last = o.queries_kept_last;
  info.sequence_offsets = {0};
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& r : raws) {
    int64_t tokens = 0;
    read_tensor(r, o, layers[0], o.k_name, g.num_kv_heads, tokens);
    const int64_t end = o.token_end < 0 ? tokens : std::min(o.token_end, tokens);
    OSCAR_CHECK(o.token_begin >= 0 && o.token_begin < end, "{}: token range [{}, {}) is empty (file has {} tokens)",
                r.file.path(), o.token_begin, end, tokens);
    ranges.emplace_back(o.token_begin, end);
    info.sequence_offsets.push_back(info.sequence_offsets.back() + end - o.token_begin);
  }
  info.tokens = info.sequence_offsets.back();

  DumpWriter writer(output, info);
  Progress progress("import", static_cast<double>(layers.size() * raws.size()), "layer-files", o.quiet);
  for (int layer : layers) {
    LayerActivations a;
    a.layer = layer;
    a.tokens = info.tokens;
    for (size_t i = 0; i < raws.size(); ++i) {
      const auto [begin, end] = ranges[i];
      const std::pair<const std::string*, std::vector<float>*> parts[] = {
          {&o.q_name, &a.q}, {&o.k_name, &a.k}, {&o.v_name, &a.v}};
      int64_t reference_tokens = -1;
      for (auto [name, out] : parts) {
        const int heads = out == &a.q ? g.num_q_heads : g.num_kv_heads;
        int64_t tokens = 0;
        std::vector<float> full = read_tensor(raws[i], o, layer, *name, heads, tokens);
        if (reference_tokens < 0) reference_tokens = tokens;
        OSCAR_CHECK(tokens == reference_tokens, "{}: layer {}: '{}' has {} tokens but q has {}", raws[i].file.path(),
                    layer, *name, tokens, reference_tokens);
        OSCAR_CHECK(end <= tokens, "{}: layer {} has {} tokens, fewer than layer {}", raws[i].file.path(), layer, tokens,
                    layers[0]);
        const size_t row = static_cast<size_t>(heads) * g.head_dim;
        const size_t first_kept = out == &a.q && o.queries_kept_last > 0
                                      ? static_cast<size_t>(std::max<int64_t>(begin, end - o.queries_kept_last))
                                      : static_cast<size_t>(begin);
        for (int64_t t = begin; t < end; ++t) {
          if (static_cast<size_t>(t) < first_kept)
            out->insert(out->end(), row, 0.0f);
          else
            out->insert(out->end(), full.begin() + t * row, full.begin() + (t + 1) * row);
        }
      }
      progress.advance(1);
    }
    writer.write_layer(a);
  }
  writer.finish();
  progress.finish();
  return info;
}

}  // namespace oscar
