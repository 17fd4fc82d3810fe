// The evaluation harness behind oscar-eval: for every method, context, layer, sequence, KV head and
// sampled decode position, decode attention through a DecodeBackend over the method's segmented cache
// and compare with the float64 BF16 reference; aggregate into report rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "io/dump.h"
#include "io/pack.h"
#include "methods/kv_method.h"
#include "report/report.h"

namespace oscar {

// Where activations come from: a dump file (DumpReader) or memory (tests).
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  virtual const DumpInfo& info() const = 0;
  virtual std::string path() const = 0;  // for error messages
  // Tokens [first, first + count) of one layer, float32.
  virtual LayerActivations read(int layer, int64_t first, int64_t count) const = 0;
};

std::unique_ptr<ActivationSource> open_dump_source(const std::string& path);

// An in-memory source: layers[i] holds the full token range of info.layers[i].
class MemoryActivationSource final : public ActivationSource {
 public:
  MemoryActivationSource(DumpInfo info, std::vector<LayerActivations> layers, std::string name = "<memory>");
  const DumpInfo& info() const override { return info_; }
  std::string path() const override { return name_; }
  LayerActivations read(int layer, int64_t first, int64_t count) const override;

 private:
  DumpInfo info_;
  std::vector<LayerActivations> layers_;
  std::string name_;
};

struct EvalConfig {
  std::vector<std::string> methods;
  std::vector<int64_t> contexts;
  std::vector<int> layers;  // empty: every layer of the dump
  // Option sets to sweep (the cartesian product of the list flags); every method runs with each.
  std::vector<MethodOptions> variants = {MethodOptions{}};
  int queries_per_sequence = 4;  // decode steps per sequence and context: positions L, L+stride, ...
  int query_stride = 16;
  std::string backend = "cpu";
  int threads = 0;  // 0: hardware concurrency (the cuda backend always uses 1)
  const Pack* pack = nullptr;
  std::string pack_path;
  bool quiet = true;
};

// One aggregate: a (method, variant, context) over all evaluated layers (layer = -1) or one layer.
struct EvalRow {
  std::string method;
  int variant = 0;
  int64_t context = 0;
  int layer = -1;
  std::string layers;  // "0-5" or "3"
  double bpe = 0;      // from the storage of the cache holding exactly `context` tokens
  int sink = 0, recent = 0, group_size = 0, bits = 2;
  double k_clip = 1, v_clip = 1;  // mean over evaluated layers
  std::string metadata;
  Summary rel_err;
  double cos = 0, kl = 0, logit_err_max = 0, top8_recall = 0;
  double k_rel_mse = 0, v_rel_mse = 0;
  double err_sink = 0, err_history = 0, err_recent = 0;
  int worst_layer = -1;
  double worst_layer_rel_err = 0;
  std::string worst_head;  // "layer/kv_head" with the largest mean rel_err
  double worst_head_rel_err = -1;
  int64_t queries = 0, sequences = 0;
  std::string backend;
};

struct EvalResult {
  std::vector<EvalRow> rows;          // one per (method, variant, context), in the order asked
  std::vector<EvalRow> layer_rows;    // one per (method, variant, context, layer)
};

// Runs the whole evaluation. Fails (oscar::Error, one line naming the file) on a context longer than
// every sequence, on a context without queries (evaluation dumps keep queries only at the end), on
// unknown methods, and on a pack whose geometry differs from the dump.
EvalResult run_evaluation(const ActivationSource& source, const EvalConfig& config);

// Report tables. Markdown shows the essential columns; csv/json/jsonl carry every field.
ReportTable make_report_table(const std::vector<EvalRow>& rows, bool per_layer, bool full);

// Warning text when the pack's provenance names this dump (calibration and evaluation data must be
// disjoint), or an empty string.
std::string provenance_overlap_warning(const std::string& pack_path, const std::string& provenance_json,
                                       const std::string& dump_path);

// "0-5", "0,2,4-6" for sorted unique layer indices.
std::string format_index_list(const std::vector<int>& indices);

}  // namespace oscar
