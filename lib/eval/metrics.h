// Attention-level error metrics of one query against the BF16 reference (baselines.md, harness
// metrics): relative output error, cosine, KL(p_ref || p_quant), max logit error, top-8 recall, the
// output error split by cache tier, and K/V reconstruction error in the original basis; plus the
// summary statistics (mean, p50, p90, p99, max) the reports use.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/segmented_cache.h"
#include "rotation/rotation.h"

namespace oscar {

struct QueryMetrics {
  double rel_err = 0;        // ||o - o_hat|| / ||o||
  double cos = 0;            // cosine(o, o_hat)
  double kl = 0;             // KL(p_ref || p_quant), nats
  double logit_err_max = 0;  // max_j |l_j - l_hat_j|, logits including the softmax scale
  double top8_recall = 0;    // |top-k(p_ref) & top-k(p_quant)| / k, k = min(8, context)
  // Tier split of the output error: o - o_hat = sum over tiers of sum_{j in tier} (p_j v_j - p_hat_j v_hat_j),
  // each term's norm relative to ||o|| (they add up as vectors to o - o_hat, not as norms).
  double err_sink = 0, err_history = 0, err_recent = 0;
};

// One query head at one decode position: the reference is float64 attention of the BF16-rounded query over
// the BF16-rounded original keys/values; the method side is the rotated query over the cache rows the
// method stores (EncodedSequence at `split`), values un-rotated with R_V^T.
struct QueryEvalInput {
  int dim = 0;
  double softmax_scale = 0;
  const float* query = nullptr;          // [d] original basis
  const float* reference_keys = nullptr;    // [context, d] original basis
  const float* reference_values = nullptr;  // [context, d]
  const float* rotated_query = nullptr;  // [d] q · R_K as the decode reads it
  const EncodedSequence* encoded = nullptr;  // rows in the method's rotated space
  TierSplit split;                        // context = split.total()
  const MatrixD* value_rotation = nullptr;  // R_V [d, d]; null = identity
  const float* output = nullptr;  // [d] the decode backend's output (original basis); null = the float64
                                  // output of the method side computed here
};

QueryMetrics evaluate_query(const QueryEvalInput& input);

// Per-token squared reconstruction errors in the original basis for both storage forms of every token:
// window_error[j] = ||x_j - w_j R^T||^2, history_error[j] = ||x_j - h_j R^T||^2 and norm[j] = ||x_j||^2
// (x = reference rows [tokens, d], w / h the window / dequantised rows of the encoded sequence). The error
// of a cache at any split is then a sum by tier.
struct ReconstructionErrors {
  std::vector<double> window_error, history_error, norm;  // [tokens]
  // sum of errors / sum of norms over tokens [0, split.total()), by tier. 0 when the norms are 0.
  double relative_error(const TierSplit& split) const;
};
ReconstructionErrors reconstruction_errors(const float* reference, const std::vector<float>& window_rows,
                                           const std::vector<float>& dequantized_rows, int64_t tokens, int dim,
                                           const MatrixD& rotation);

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  int64_t count = 0;
};
// Percentiles interpolate linearly between order statistics (numpy's default). Empty input: all 0.
Summary summarize(std::vector<double> values);
double percentile_of_sorted(const std::vector<double>& sorted, double q);  // q in [0, 1]

}  // namespace oscar
