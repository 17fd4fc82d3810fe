// Reference attention pieces in float64: partial attention of one query over a block of tokens
// (output normalised within the block + log-sum-exp), and the exact merge of partials.
// This is the ground truth for the CPU decode path and for the CUDA flash-decoding kernels.
#pragma once
#include <vector>

namespace oscar {

struct PartialAttention {
  std::vector<double> output;  // [d] softmax-weighted values of this block (normalised within it)
  double log_sum_exp = 0;      // log sum_j exp(scale * q.k_j); -inf for an empty block
  bool empty() const { return output.empty(); }
};

// query [d]; keys, values [n, d] row-major; logits = scale * q . k_j (scale = 1/sqrt(d) usually).
// n = 0 gives an empty partial.
PartialAttention partial_attention(const float* query, const float* keys, const float* values, int n, int dim,
                                   double scale);

// Exact softmax over the union of the blocks: o = sum_b exp(lse_b - lse) o_b, lse = log sum_b exp(lse_b).
// Empty partials are skipped; all empty gives an empty result.
PartialAttention merge_partials(const std::vector<PartialAttention>& parts);

// Attention probabilities of one query over n keys (float64), for metrics such as KL and recall.
std::vector<double> attention_probabilities(const float* query, const float* keys, int n, int dim, double scale);

}  // namespace oscar
