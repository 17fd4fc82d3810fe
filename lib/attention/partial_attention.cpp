// Reference partial attention and merge (see partial_attention.h).
#include "attention/partial_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace oscar {

static std::vector<double> logits_of(const float* query, const float* keys, int n, int dim, double scale) {
  std::vector<double> logits(n);
  for (int j = 0; j < n; ++j) {
    double dot = 0;
    const float* k = keys + static_cast<size_t>(j) * dim;
    for (int i = 0; i < dim; ++i) dot += static_cast<double>(query[i]) * k[i];
    logits[j] = scale * dot;
  }
  return logits;
}

PartialAttention partial_attention(const float* query, const float* keys, const float* values, int n, int dim,
                                   double scale) {
  PartialAttention part;
  if (n <= 0) {
    part.log_sum_exp = -std::numeric_limits<double>::infinity();
    return part;
  }
  auto logits = logits_of(query, keys, n, dim, scale);
  double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  part.output.assign(dim, 0.0);
  for (int j = 0; j < n; ++j) {
    double w = std::exp(logits[j] - max_logit);
    sum += w;
    const float* v = values + static_cast<size_t>(j) * dim;
    for (int i = 0; i < dim; ++i) part.output[i] += w * v[i];
  }
  for (auto& o : part.output) o /= sum;
  part.log_sum_exp = max_logit + std::log(sum);
  return part;
}

PartialAttention merge_partials(const std::vector<PartialAttention>& parts) {
  PartialAttention merged;
  merged.log_sum_exp = -std::numeric_limits<double>::infinity();
  double max_lse = -std::numeric_limits<double>::infinity();
  for (const auto& p : parts)
    if (!p.empty()) max_lse = std::max(max_lse, p.log_sum_exp);
  if (std::isinf(max_lse)) return merged;
  double total = 0;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    double w = std::exp(p.log_sum_exp - max_lse);
    if (merged.output.empty()) merged.output.assign(p.output.size(), 0.0);
    for (size_t i = 0; i < p.output.size(); ++i) merged.output[i] += w * p.output[i];
    total += w;
  }
  for (auto& o : merged.output) o /= total;
  merged.log_sum_exp = max_lse + std::log(total);
  return merged;
}

std::vector<double> attention_probabilities(const float* query, const float* keys, int n, int dim, double scale) {
  auto p = logits_of(query, keys, n, dim, scale);
  if (n == 0) return p;
  double max_logit = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (auto& x : p) sum += (x = std::exp(x - max_logit));
  for (auto& x : p) x /= sum;
  return p;
}

}  // namespace oscar
