// The evaluation loop (see evaluator.h). Work is split per (layer, sequence) unit into tasks
// (method variant x KV head); each task owns its result slot, and slots are merged in a fixed order,
// so the output does not depend on the number of threads.
#include "eval/evaluator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/decode_backend.h"
#include "cli/progress.h"
#include "common/error.h"
#include "common/float16.h"

namespace oscar {
namespace {

struct CacheRecord {
  double k_rel_mse = 0, v_rel_mse = 0, bpe = 0;
};

// Results of one (method variant, context, layer): filled in a fixed order.
struct Bucket {
  std::vector<QueryMetrics> queries;
  std::vector<int> query_kv_heads;  // [queries.size()] the KV head each query read
  std::vector<CacheRecord> caches;
};

struct TaskOutput {
  // [context index] -> records of this task
  std::vector<std::vector<QueryMetrics>> queries;
  std::vector<std::vector<CacheRecord>> caches;
};

// Decode positions of one sequence after a context of L tokens: L, L+stride, ... (the query at p reads the
// p + 1 tokens [0, p], its own key included, so exactly L tokens precede the first one). Positions past the
// sequence, and for evaluation dumps that keep queries only for the last N tokens, before those, are skipped.
std::vector<int64_t> decode_positions(int64_t context, int64_t sequence_length, const EvalConfig& config,
                                      int64_t queries_kept_last) {
  std::vector<int64_t> positions;
  for (int j = 0; j < config.queries_per_sequence; ++j) {
    const int64_t p = context + static_cast<int64_t>(j) * config.query_stride;
    if (p >= sequence_length) break;
    if (queries_kept_last > 0 && p < sequence_length - queries_kept_last) continue;
    positions.push_back(p);
  }
  return positions;
}

void collect_strings(const nlohmann::json& j, std::vector<std::string>& out) {
  if (j.is_string()) out.push_back(j.get<std::string>());
  else if (j.is_array() || j.is_object())
    for (const auto& item : j) collect_strings(item, out);
}

}  // namespace

MemoryActivationSource::MemoryActivationSource(DumpInfo info, std::vector<LayerActivations> layers, std::string name)
    : info_(std::move(info)), layers_(std::move(layers)), name_(std::move(name)) {}

LayerActivations MemoryActivationSource::read(int layer, int64_t first, int64_t count) const {
  auto it = std::find(info_.layers.begin(), info_.layers.end(), layer);
  OSCAR_CHECK(it != info_.layers.end(), "{}: no layer {}", name_, layer);
  const LayerActivations& all = layers_[it - info_.layers.begin()];
  if (count < 0) count = all.tokens - first;
  OSCAR_CHECK(first >= 0 && first + count <= all.tokens, "{}: tokens [{}, {}) outside {}", name_, first, first + count,
              all.tokens);
  const ModelGeometry& g = info_.geometry;
  LayerActivations out;
  out.layer = layer;
  out.first_token = first;
  out.tokens = count;
  auto slice = [&](const std::vector<float>& src, int heads) {
    const size_t row = static_cast<size_t>(heads) * g.head_dim;
    return std::vector<float>(src.begin() + first * row, src.begin() + (first + count) * row);
  };
  out.q = slice(all.q, g.num_q_heads);
  out.k = slice(all.k, g.num_kv_heads);
  out.v = slice(all.v, g.num_kv_heads);
  return out;
}

std::string format_index_list(const std::vector<int>& indices) {
  std::string text;
  for (size_t i = 0; i < indices.size();) {
    size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += j > i ? fmt::format("{}-{}", indices[i], indices[j]) : fmt::format("{}", indices[i]);
    i = j + 1;
  }
  return text;
}

std::string provenance_overlap_warning(const std::string& pack_path, const std::string& provenance_json,
                                       const std::string& dump_path) {
  namespace fs = std::filesystem;
  std::vector<std::string> strings;
  try {
    collect_strings(nlohmann::json::parse(provenance_json), strings);
  } catch (const std::exception&) {
    strings = {provenance_json};
  }
  std::error_code ec;
  const fs::path dump_canonical = fs::weakly_canonical(dump_path, ec);
  const std::string dump_name = fs::path(dump_path).filename().string();
  bool same_name = false;
  for (const auto& s : strings) {
    std::error_code ec2;
    if (!dump_canonical.empty() && fs::weakly_canonical(s, ec2) == dump_canonical && !ec2)
      return fmt::format(
          "warning: {}: the pack was calibrated on {}, the dump being evaluated: evaluation activations must be "
          "disjoint from calibration activations",
          pack_path, dump_path);
    if (!dump_name.empty() && s.find(dump_name) != std::string::npos) same_name = true;
  }
  if (same_name)
    return fmt::format(
        "warning: {}: the pack's provenance names a file called {}: make sure calibration and evaluation "
        "activations are disjoint",
        pack_path, dump_name);
  return {};
}

EvalResult run_evaluation(const ActivationSource& source, const EvalConfig& config) {
  const DumpInfo& info = source.info();
  const ModelGeometry& geometry = info.geometry;
  const int d = geometry.head_dim;
  const int g = geometry.group_size();
  const std::string dump = source.path();
  OSCAR_CHECK(!config.methods.empty(), "no methods given");
  OSCAR_CHECK(!config.contexts.empty(), "no contexts given");
  OSCAR_CHECK(!config.variants.empty(), "no option variants");
  OSCAR_CHECK(config.queries_per_sequence > 0 && config.query_stride > 0, "queries per sequence and stride must be > 0");
  OSCAR_CHECK(geometry.num_kv_heads > 0 && geometry.num_q_heads % geometry.num_kv_heads == 0,
              "{}: {} query heads are not a multiple of {} KV heads", dump, geometry.num_q_heads, geometry.num_kv_heads);

  // Layers.
  std::vector<int> layers = config.layers.empty() ? info.layers : config.layers;
  for (int l : layers)
    OSCAR_CHECK(std::find(info.layers.begin(), info.layers.end(), l) != info.layers.end(),
                "{}: no layer {} in the dump (layers {})", dump, l, format_index_list(info.layers));

  // Methods: one instance per (variant, method), index = variant * M + method.
  const int num_methods = static_cast<int>(config.methods.size());
  std::vector<std::unique_ptr<KvMethod>> methods;
  for (const auto& variant : config.variants)
    for (const auto& name : config.methods) {
      MethodContext context{geometry, config.pack, config.pack_path, variant};
      methods.push_back(make_method(name, context));
      OSCAR_CHECK(config.backend == "cpu" || !methods.back()->cpu_reference_only(),
                  "method '{}' stores rows the {} backend cannot decode (per-channel groups, codebooks or norms): "
                  "run it with --backend cpu",
                  name, config.backend);
    }
  const int units_of_work = static_cast<int>(methods.size());
  // Check pack layers up front (one clear line instead of a failure deep in a worker).
  for (const auto& method : methods)
    for (int l : layers) {
      method->key_rotation(l, 0);
      method->value_rotation(l, 0);
    }

  // Sequences and decode positions.
  const int64_t num_sequences = info.num_sequences();
  OSCAR_CHECK(num_sequences > 0, "{}: the dump has no sequences", dump);
  std::vector<int64_t> lengths(num_sequences);
  int64_t longest = 0;
  for (int64_t s = 0; s < num_sequences; ++s) {
    lengths[s] = info.sequence_offsets[s + 1] - info.sequence_offsets[s];
    longest = std::max(longest, lengths[s]);
  }
  const int num_contexts = static_cast<int>(config.contexts.size());
  // positions[context][sequence]
  std::vector<std::vector<std::vector<int64_t>>> positions(num_contexts, std::vector<std::vector<int64_t>>(num_sequences));
  std::vector<int64_t> sequences_used(num_contexts, 0);
  for (int ci = 0; ci < num_contexts; ++ci) {
    const int64_t L = config.contexts[ci];
    OSCAR_CHECK(L >= 1, "context {} must be at least 1", L);
    OSCAR_CHECK(L < longest,
                "{}: context {} is too long: decoding after {} tokens needs a sequence of at least {} tokens (longest: {})",
                dump, L, L, L + 1, longest);
    int64_t total = 0;
    for (int64_t s = 0; s < num_sequences; ++s) {
      positions[ci][s] = decode_positions(L, lengths[s], config, info.queries_kept_last);
      total += static_cast<int64_t>(positions[ci][s].size());
      if (!positions[ci][s].empty()) ++sequences_used[ci];
    }
    OSCAR_CHECK(total > 0,
                "{}: context {} has no decode position with a stored query (the dump keeps queries only for the last {} "
                "tokens of each sequence; try --query-stride or a context nearer the end)",
                dump, L, info.queries_kept_last);
  }

  // Buckets [method][context][layer index].
  const int num_layers = static_cast<int>(layers.size());
  std::vector<Bucket> buckets(static_cast<size_t>(units_of_work) * num_contexts * num_layers);
  auto bucket = [&](int mi, int ci, int li) -> Bucket& {
    return buckets[(static_cast<size_t>(mi) * num_contexts + ci) * num_layers + li];
  };

  const int threads = config.backend == "cpu"
                          ? (config.threads > 0 ? config.threads : std::max(1u, std::thread::hardware_concurrency()))
                          : 1;
  std::vector<std::unique_ptr<DecodeBackend>> backends;
  for (int t = 0; t < threads; ++t) backends.push_back(make_decode_backend(config.backend));
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));

  int64_t units = 0;
  for (int64_t s = 0; s < num_sequences; ++s) {
    bool used = false;
    for (int ci = 0; ci < num_contexts; ++ci) used |= !positions[ci][s].empty();
    units += used ? num_layers : 0;
  }
  Progress progress("oscar-eval", static_cast<double>(units), "layer-sequences", config.quiet);

  for (int li = 0; li < num_layers; ++li) {
    const int layer = layers[li];
    for (int64_t s = 0; s < num_sequences; ++s) {
      int64_t needed = 0;  // tokens [0, needed) of this sequence are read: up to the last decode position
      for (int ci = 0; ci < num_contexts; ++ci)
        if (!positions[ci][s].empty()) needed = std::max(needed, positions[ci][s].back() + 1);
      if (needed == 0) continue;
      const LayerActivations acts = source.read(layer, info.sequence_offsets[s], needed);
      // Reference rows per KV head: [needed, d], BF16-rounded like a BF16 cache.
      std::vector<std::vector<float>> ref_k(geometry.num_kv_heads), ref_v(geometry.num_kv_heads);
      for (int h = 0; h < geometry.num_kv_heads; ++h) {
        ref_k[h].resize(static_cast<size_t>(needed) * d);
        ref_v[h].resize(static_cast<size_t>(needed) * d);
        for (int64_t t = 0; t < needed; ++t)
          for (int i = 0; i < d; ++i) {
            const size_t src = (static_cast<size_t>(t) * geometry.num_kv_heads + h) * d + i;
            ref_k[h][t * d + i] = round_to_bf16(acts.k[src]);
            ref_v[h][t * d + i] = round_to_bf16(acts.v[src]);
          }
      }

      const int num_tasks = units_of_work * geometry.num_kv_heads;
      std::vector<TaskOutput> outputs(num_tasks);
      std::vector<std::string> errors(num_tasks);
      std::atomic<int> next{0};
      auto run_task = [&](int task, DecodeBackend& backend) {
        const int mi = task / geometry.num_kv_heads, h = task % geometry.num_kv_heads;
        const KvMethod& method = *methods[mi];
        TaskOutput& out = outputs[task];
        out.queries.resize(num_contexts);
        out.caches.resize(num_contexts);
        const MatrixD key_rotation = method.key_rotation(layer, h), value_rotation = method.value_rotation(layer, h);
        const bool value_identity = is_identity(value_rotation);
        std::vector<float> value_rotation_f(static_cast<size_t>(d) * d);
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j) value_rotation_f[static_cast<size_t>(i) * d + j] = static_cast<float>(value_rotation(i, j));
        HeadRows head_rows{layer, h, d, needed, ref_k[h].data(), ref_v[h].data(), {}};
        for (const auto& keys : ref_k) head_rows.layer_keys.push_back(keys.data());  // whole-layer methods (oscars)
        const EncodedSequence encoded = method.encode(head_rows);
        // Tokens of the sink prefix are never demoted, so only rows after it must be finite.
        const TierSplit longest_split = split_context(needed, method.layout());
        const size_t first_key = static_cast<size_t>(encoded.key_split(longest_split).sink) * d;
        const size_t first_value = static_cast<size_t>(encoded.value_split(longest_split).sink) * d;
        for (const auto* rows : {&encoded.dequantized_keys, &encoded.dequantized_values})
          for (size_t i = rows == &encoded.dequantized_keys ? first_key : first_value; i < rows->size(); ++i)
            OSCAR_CHECK(std::isfinite((*rows)[i]),
                        "method {}: layer {} KV head {} token {}: the quantised {} row is not finite (its scale "
                        "underflows the {} metadata type, e.g. a constant row after clipping)",
                        method.name(), layer, h, i / d, rows == &encoded.dequantized_keys ? "key" : "value",
                        metadata_type_name(method.key_quantizer(layer).metadata));
        const ReconstructionErrors key_errors = reconstruction_errors(ref_k[h].data(), encoded.window_keys,
                                                                      encoded.dequantized_keys, needed, d, key_rotation);
        const ReconstructionErrors value_errors = reconstruction_errors(
            ref_v[h].data(), encoded.window_values, encoded.dequantized_values, needed, d, value_rotation);
        const CacheLayout layout = method.layout();
        std::vector<float> queries(static_cast<size_t>(g) * d), rotated(static_cast<size_t>(g) * d), output(queries.size());
        for (int ci = 0; ci < num_contexts; ++ci) {
          if (positions[ci][s].empty()) continue;
          const int64_t L = config.contexts[ci];
          const TierSplit full = encoded.value_split(split_context(L, layout));
          CacheRecord record;
          record.bpe = method.quantizes() ? CacheSnapshot(encoded, full).bits_per_element() : 16.0;
          record.k_rel_mse = key_errors.relative_error(encoded.key_split(full));
          record.v_rel_mse = value_errors.relative_error(full);
          out.caches[ci].push_back(record);
          for (int64_t p : positions[ci][s]) {
            const TierSplit split = encoded.value_split(split_context(p + 1, layout));
            const CacheSnapshot snapshot(encoded, split);
            for (int qi = 0; qi < g; ++qi) {
              const int qh = h * g + qi;
              for (int i = 0; i < d; ++i)
                queries[qi * d + i] = round_to_bf16(acts.q[(static_cast<size_t>(p) * geometry.num_q_heads + qh) * d + i]);
            }
            rotate_rows(queries.data(), g, d, key_rotation, rotated.data());
            DecodeRequest request;
            request.cache = &snapshot.view();
            request.queries = rotated.data();
            request.num_queries = g;
            request.softmax_scale = softmax_scale;
            request.value_rotation = value_identity ? nullptr : value_rotation_f.data();
            backend.decode(request, output.data());
            for (int qi = 0; qi < g; ++qi) {
              QueryEvalInput in;
              in.dim = d;
              in.softmax_scale = softmax_scale;
              in.query = queries.data() + qi * d;
              in.reference_keys = ref_k[h].data();
              in.reference_values = ref_v[h].data();
              in.rotated_query = rotated.data() + qi * d;
              in.encoded = &encoded;
              in.split = split;
              in.value_rotation = value_identity ? nullptr : &value_rotation;
              in.output = output.data() + qi * d;
              out.queries[ci].push_back(evaluate_query(in));
            }
          }
        }
      };
      auto worker = [&](int t) {
        for (int task; (task = next.fetch_add(1)) < num_tasks;) {
          try {
            run_task(task, *backends[t]);
          } catch (const std::exception& e) {
            errors[task] = e.what();
          }
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < std::min(threads, num_tasks); ++t) pool.emplace_back(worker, t);
      worker(0);
      for (auto& thread : pool) thread.join();
      for (const auto& e : errors)
        if (!e.empty()) throw Error(e);
      for (int task = 0; task < num_tasks; ++task) {
        const int mi = task / geometry.num_kv_heads;
        for (int ci = 0; ci < num_contexts; ++ci) {
          Bucket& b = bucket(mi, ci, li);
          auto& q = outputs[task].queries[ci];
          auto& c = outputs[task].caches[ci];
          b.queries.insert(b.queries.end(), q.begin(), q.end());
          b.query_kv_heads.insert(b.query_kv_heads.end(), q.size(), task % geometry.num_kv_heads);
          b.caches.insert(b.caches.end(), c.begin(), c.end());
        }
      }
      progress.advance(1);
    }
  }
  progress.finish();

  // Aggregation.
  auto fill = [&](EvalRow& row, const std::vector<const Bucket*>& parts) {
    std::vector<double> rel;
    double cos = 0, kl = 0, top8 = 0, es = 0, eh = 0, er = 0, logit = 0, kr = 0, vr = 0, bpe = 0;
    int64_t n = 0, caches = 0;
    for (const Bucket* b : parts) {
      for (const auto& m : b->queries) {
        rel.push_back(m.rel_err);
        cos += m.cos;
        kl += m.kl;
        top8 += m.top8_recall;
        es += m.err_sink;
        eh += m.err_history;
        er += m.err_recent;
        logit = std::max(logit, m.logit_err_max);
        ++n;
      }
      for (const auto& c : b->caches) {
        kr += c.k_rel_mse;
        vr += c.v_rel_mse;
        bpe += c.bpe;
        ++caches;
      }
    }
    row.rel_err = summarize(rel);
    row.queries = n;
    if (n > 0) {
      row.cos = cos / n;
      row.kl = kl / n;
      row.top8_recall = top8 / n;
      row.err_sink = es / n;
      row.err_history = eh / n;
      row.err_recent = er / n;
    }
    row.logit_err_max = logit;
    if (caches > 0) {
      row.k_rel_mse = kr / caches;
      row.v_rel_mse = vr / caches;
      row.bpe = bpe / caches;
    }
  };

  EvalResult result;
  for (int ci = 0; ci < num_contexts; ++ci)
    for (int mi = 0; mi < units_of_work; ++mi) {
      const KvMethod& method = *methods[mi];
      EvalRow base;
      base.method = method.name();
      base.variant = mi / num_methods;
      base.context = config.contexts[ci];
      base.backend = backends.front()->name();
      base.sequences = sequences_used[ci];
      const CacheLayout layout = method.layout();
      if (method.quantizes()) {
        base.sink = layout.sink_tokens;
        base.recent = layout.recent_tokens;
        const QuantizerConfig kq = method.key_quantizer(layers.front());
        base.group_size = kq.resolved_group(d);
        base.bits = kq.bits;
        base.metadata = metadata_type_name(kq.metadata);
        double kc = 0, vc = 0;
        for (int l : layers) {
          kc += method.key_quantizer(l).clip_ratio;
          vc += method.value_quantizer(l).clip_ratio;
        }
        base.k_clip = kc / num_layers;
        base.v_clip = vc / num_layers;
      } else {
        base.bits = 16;
        base.metadata = "none";
      }
      std::vector<const Bucket*> all;
      int worst = -1;
      double worst_err = -1;
      std::string worst_head;
      double worst_head_err = -1;
      // The (layer, KV head) with the largest mean rel_err (baselines.md: "worst (layer, head)").
      auto head_means = [&](const Bucket& b) {
        std::vector<double> sum(geometry.num_kv_heads, 0.0);
        std::vector<int64_t> count(geometry.num_kv_heads, 0);
        for (size_t i = 0; i < b.queries.size(); ++i) {
          sum[b.query_kv_heads[i]] += b.queries[i].rel_err;
          ++count[b.query_kv_heads[i]];
        }
        for (int h = 0; h < geometry.num_kv_heads; ++h) sum[h] = count[h] ? sum[h] / count[h] : -1.0;
        return sum;
      };
      for (int li = 0; li < num_layers; ++li) {
        const Bucket& b = bucket(mi, ci, li);
        all.push_back(&b);
        EvalRow row = base;
        row.layer = layers[li];
        row.layers = fmt::format("{}", layers[li]);
        fill(row, {&b});
        row.worst_layer = layers[li];
        row.worst_layer_rel_err = row.rel_err.mean;
        const auto means = head_means(b);
        for (int h = 0; h < geometry.num_kv_heads; ++h) {
          if (means[h] > row.worst_head_rel_err) {
            row.worst_head_rel_err = means[h];
            row.worst_head = fmt::format("{}/{}", layers[li], h);
          }
          if (means[h] > worst_head_err) {
            worst_head_err = means[h];
            worst_head = fmt::format("{}/{}", layers[li], h);
          }
        }
        if (row.rel_err.mean > worst_err) {
          worst_err = row.rel_err.mean;
          worst = layers[li];
        }
        result.layer_rows.push_back(row);
      }
      EvalRow row = base;
      row.layers = format_index_list(layers);
      fill(row, all);
      row.worst_layer = worst;
      row.worst_layer_rel_err = worst_err;
      row.worst_head = worst_head;
      row.worst_head_rel_err = worst_head_err;
      result.rows.push_back(row);
    }
  return result;
}

ReportTable make_report_table(const std::vector<EvalRow>& rows, bool per_layer, bool full) {
  ReportTable table;
  if (!full) {
    table.fields = {"method", "context"};
    if (per_layer) table.fields.push_back("layer");
    for (const char* f : {"bpe", "rel_err", "rel_err_p99", "cos", "kl", "top8_recall", "worst_layer"})
      table.fields.push_back(f);
    for (const auto& r : rows) {
      std::vector<ReportValue> v = {r.method,  static_cast<long>(r.context), r.bpe, r.rel_err.mean, r.rel_err.p99,
                                    r.cos,     r.kl, r.top8_recall,
                                    fmt::format("{} ({:.4f})", r.worst_layer, r.worst_layer_rel_err)};
      if (per_layer) v.insert(v.begin() + 2, static_cast<long>(r.layer));
      table.add_row(std::move(v));
    }
    return table;
  }
  table.fields = {"method",      "context",     "layers",        "bpe",         "rel_err",     "rel_err_p50",
                  "rel_err_p90", "rel_err_p99", "rel_err_max",   "cos",         "kl",          "logit_err_max",
                  "top8_recall", "k_rel_mse",   "v_rel_mse",     "err_sink",    "err_history", "err_recent",
                  "worst_layer", "worst_layer_rel_err", "worst_head", "worst_head_rel_err", "queries", "sequences",
                  "sink",        "recent",      "group_size",    "bits",        "metadata",    "k_clip",
                  "v_clip",      "backend"};
  if (per_layer) table.fields.insert(table.fields.begin() + 2, "layer");
  for (const auto& r : rows) {
    std::vector<ReportValue> v = {r.method, static_cast<long>(r.context), r.layers, r.bpe, r.rel_err.mean, r.rel_err.p50,
                   r.rel_err.p90, r.rel_err.p99, r.rel_err.max, r.cos, r.kl, r.logit_err_max, r.top8_recall,
                   r.k_rel_mse, r.v_rel_mse, r.err_sink, r.err_history, r.err_recent, static_cast<long>(r.worst_layer),
                   r.worst_layer_rel_err, r.worst_head, r.worst_head_rel_err, static_cast<long>(r.queries),
                   static_cast<long>(r.sequences),
                   static_cast<long>(r.sink), static_cast<long>(r.recent), static_cast<long>(r.group_size),
                   static_cast<long>(r.bits), r.metadata, r.k_clip, r.v_clip, r.backend};
    if (per_layer) v.insert(v.begin() + 2, static_cast<long>(r.layer));
    table.add_row(std::move(v));
  }
  return table;
}

}  // namespace oscar
