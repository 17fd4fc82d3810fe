// Calibration statistics "oscar.stats" (docs/formats.md): per layer and KV head, float64 SUMS of
// d x d second moments and their weights for every calibration target, so shards merge by addition.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dump.h"
#include "rotation/rotation.h"

namespace oscar {

inline constexpr const char* kStatsSchema = "oscar.stats";
inline constexpr int kStatsSchemaVersion = 1;

// The targets (spec section 2). key_query: C_Q = sum q^T q over the GQA group's queries; value_proxy:
// sum w_t v_t^T v_t with w_t = k_t C_Q k_t^T, weight sum w_t; value_scores: sum o^T o of causal
// attention outputs o = softmax(q K^T / sqrt(d)) V; key_gram / value_gram: K^T K and V^T V.
enum class Target { key_query, key_gram, value_proxy, value_scores, value_gram };
inline constexpr Target kAllTargets[] = {Target::key_query, Target::key_gram, Target::value_proxy,
                                         Target::value_scores, Target::value_gram};
const char* target_name(Target target);
Target parse_target(const std::string& name);

struct TargetSum {
  std::vector<double> sum;     // [Hkv, d, d], symmetric
  std::vector<double> weight;  // [Hkv]: number of rows, or sum of weights for value_proxy
};

struct LayerStatistics {
  int layer = 0;
  TargetSum targets[5];  // indexed by Target
  TargetSum& of(Target t) { return targets[static_cast<int>(t)]; }
  const TargetSum& of(Target t) const { return targets[static_cast<int>(t)]; }
};

struct Statistics {
  ModelGeometry geometry;
  std::vector<LayerStatistics> layers;  // sorted by layer
  std::vector<std::string> inputs;      // dumps the sums came from
  int64_t tokens = 0;                   // tokens seen per layer (summed over inputs)
  int64_t score_queries = 0;            // queries sampled per sequence for value_scores (0: all)
  std::string proxy_query_source;       // "self" or the hash of the --query-stats file used for w_t
  std::string provenance_json;

  // Zero sums for these layers (those not there yet), on up to `threads` threads: hundreds of MB of
  // fresh pages cost page faults, which scale with cores.
  void allocate(const std::vector<int>& layer_indices, int threads = 1);
  const LayerStatistics* find_layer(int layer) const;
  // Normalised target (sum / weight) of one KV head, or averaged over KV heads when kv_head < 0
  // (the reference implementation's per-layer scope).
  MatrixD target_matrix(int layer, Target target, int kv_head) const;
};

Statistics read_statistics(const std::string& path);
void write_statistics(const std::string& path, const Statistics& stats);  // atomic
// a + b: sums and weights add, layers unite. Throws on different geometry or proxy source.
Statistics merge_statistics(const Statistics& a, const Statistics& b);

}  // namespace oscar
