// Statistics container, file format and merge (see statistics.h).
#include "covariance/statistics.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "cli/atomic_file.h"
#include "common/error.h"
#include "common/parallel.h"
#include "io/hdf5.h"

namespace oscar {

const char* target_name(Target target) {
  switch (target) {
    case Target::key_query: return "key_query";
    case Target::key_gram: return "key_gram";
    case Target::value_proxy: return "value_proxy";
    case Target::value_scores: return "value_scores";
    case Target::value_gram: return "value_gram";
  }
  return "?";
}

Target parse_target(const std::string& name) {
  for (Target t : kAllTargets)
    if (name == target_name(t)) return t;
  fail("unknown target '{}'", name);
}

void Statistics::allocate(const std::vector<int>& layer_indices, int threads) {
  const size_t heads = geometry.num_kv_heads, d = geometry.head_dim, existing = layers.size();
  for (int layer : layer_indices)
    if (!find_layer(layer)) layers.push_back(LayerStatistics{layer, {}});
  parallel_for(static_cast<int>(layers.size() - existing), threads, [&](int i) {
    for (auto& t : layers[existing + i].targets) {
      t.sum.assign(heads * d * d, 0.0);
      t.weight.assign(heads, 0.0);
    }
  });
  std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
}

const LayerStatistics* Statistics::find_layer(int layer) const {
  for (const auto& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

MatrixD Statistics::target_matrix(int layer, Target target, int kv_head) const {
  const LayerStatistics* ls = find_layer(layer);
  OSCAR_CHECK(ls, "statistics have no layer {}", layer);
  const int d = geometry.head_dim, heads = geometry.num_kv_heads;
  const TargetSum& t = ls->of(target);
  MatrixD result = MatrixD::Zero(d, d);
  int used = 0;
  for (int h = 0; h < heads; ++h) {
    if (kv_head >= 0 && h != kv_head) continue;
    OSCAR_CHECK(t.weight[h] > 0, "statistics of layer {} have no data for target {} (KV head {}){}", layer,
                target_name(target), h,
                target == Target::value_scores ? ": accumulate with --score-queries > 0" : "");
    result += Eigen::Map<const MatrixD>(t.sum.data() + static_cast<size_t>(h) * d * d, d, d) / t.weight[h];
    ++used;
  }
  return result / used;
}

static std::string layer_group(int layer) { return "/layers/" + std::to_string(layer); }

Statistics read_statistics(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  f.check_schema(kStatsSchema, kStatsSchemaVersion);
  Statistics s;
  s.geometry.num_layers = static_cast<int>(f.attribute_int("/", "num_layers"));
  s.geometry.num_q_heads = static_cast<int>(f.attribute_int("/", "num_q_heads"));
  s.geometry.num_kv_heads = static_cast<int>(f.attribute_int("/", "num_kv_heads"));
  s.geometry.head_dim = static_cast<int>(f.attribute_int("/", "head_dim"));
  OSCAR_CHECK(s.geometry.num_kv_heads > 0 && s.geometry.head_dim > 0, "{}: geometry attributes must be positive", path);
  s.tokens = f.attribute_int("/", "tokens");
  s.score_queries = f.attribute_int("/", "score_queries");
  s.proxy_query_source = f.attribute_string("/", "proxy_query_source");
  s.provenance_json = f.attribute_string("/", "provenance");
  auto inputs = nlohmann::json::parse(f.attribute_string("/", "inputs"), nullptr, false);
  OSCAR_CHECK(inputs.is_array(), "{}: attribute 'inputs' is not a JSON list", path);
  for (const auto& i : inputs) s.inputs.push_back(i.get<std::string>());
  const size_t heads = s.geometry.num_kv_heads, d = s.geometry.head_dim;
  for (const auto& name : f.list("/layers")) {
    LayerStatistics ls;
    ls.layer = std::stoi(name);
    for (Target t : kAllTargets) {
      std::string base = layer_group(ls.layer) + "/" + target_name(t);
      auto shape = f.shape(base + "_sum");
      OSCAR_CHECK(shape == std::vector<int64_t>({static_cast<int64_t>(heads), static_cast<int64_t>(d), static_cast<int64_t>(d)}),
                  "{}: {}_sum has the wrong shape (expected [{}, {}, {}])", path, base, heads, d, d);
      ls.of(t).sum = f.read_doubles(base + "_sum");
      ls.of(t).weight = f.read_doubles(base + "_weight");
      OSCAR_CHECK(ls.of(t).weight.size() == heads, "{}: {}_weight must hold {} values", path, base, heads);
    }
    s.layers.push_back(std::move(ls));
  }
  std::sort(s.layers.begin(), s.layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  return s;
}

void write_statistics(const std::string& path, const Statistics& s) {
  AtomicOutputFile output(path);
  {
    h5::File f = h5::File::create(output.temporary_path());
    f.write_schema(kStatsSchema, kStatsSchemaVersion);
    f.set_attribute("/", "num_layers", int64_t{s.geometry.num_layers});
    f.set_attribute("/", "num_q_heads", int64_t{s.geometry.num_q_heads});
    f.set_attribute("/", "num_kv_heads", int64_t{s.geometry.num_kv_heads});
    f.set_attribute("/", "head_dim", int64_t{s.geometry.head_dim});
    f.set_attribute("/", "tokens", s.tokens);
    f.set_attribute("/", "score_queries", s.score_queries);
    f.set_attribute("/", "proxy_query_source", s.proxy_query_source);
    f.set_attribute("/", "inputs", nlohmann::json(s.inputs).dump());
    f.set_attribute("/", "provenance", s.provenance_json);
    f.create_group("/layers");
    const int64_t heads = s.geometry.num_kv_heads, d = s.geometry.head_dim;
    for (const auto& ls : s.layers)
      for (Target t : kAllTargets) {
        std::string base = layer_group(ls.layer) + "/" + target_name(t);
        f.write_doubles(base + "_sum", {heads, d, d}, ls.of(t).sum.data());
        f.write_doubles(base + "_weight", {heads}, ls.of(t).weight.data());
      }
  }
  output.commit();
}

Statistics merge_statistics(const Statistics& a, const Statistics& b) {
  const ModelGeometry &ga = a.geometry, &gb = b.geometry;
  OSCAR_CHECK(ga.num_q_heads == gb.num_q_heads && ga.num_kv_heads == gb.num_kv_heads && ga.head_dim == gb.head_dim &&
                  ga.num_layers == gb.num_layers,
              "cannot merge statistics of different geometry ({} layers, {}q/{}kv heads, d {} vs {} layers, {}q/{}kv "
              "heads, d {})",
              ga.num_layers, ga.num_q_heads, ga.num_kv_heads, ga.head_dim, gb.num_layers, gb.num_q_heads,
              gb.num_kv_heads, gb.head_dim);
  OSCAR_CHECK(a.score_queries == b.score_queries, "cannot merge statistics with different --score-queries ({} vs {})",
              a.score_queries, b.score_queries);
  Statistics m = a;
  bool shares_layers = false;
  for (const auto& lb : b.layers) {
    if (m.find_layer(lb.layer)) {
      shares_layers = true;
      LayerStatistics* lm = nullptr;
      for (auto& l : m.layers)
        if (l.layer == lb.layer) lm = &l;
      for (Target t : kAllTargets) {
        for (size_t i = 0; i < lm->of(t).sum.size(); ++i) lm->of(t).sum[i] += lb.of(t).sum[i];
        for (size_t i = 0; i < lm->of(t).weight.size(); ++i) lm->of(t).weight[i] += lb.of(t).weight[i];
      }
    } else {
      m.layers.push_back(lb);
    }
  }
  // Token shards (same layers) only add up to the whole when both used the same query covariance
  // for the proxy weights (accumulate both with --query-stats).
  OSCAR_CHECK(!shares_layers || a.proxy_query_source == b.proxy_query_source,
              "cannot merge token shards whose value-proxy weights used different query statistics ('{}' vs '{}'); "
              "accumulate both with the same --query-stats", a.proxy_query_source, b.proxy_query_source);
  if (shares_layers) m.tokens += b.tokens;
  std::sort(m.layers.begin(), m.layers.end(), [](const auto& x, const auto& y) { return x.layer < y.layer; });
  m.inputs.insert(m.inputs.end(), b.inputs.begin(), b.inputs.end());
  return m;
}

}  // namespace oscar
