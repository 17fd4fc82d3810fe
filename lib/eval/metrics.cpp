// Metric arithmetic in float64 (see metrics.h).
#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace oscar {
namespace {

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Softmax of logits: probabilities and log-probabilities (computed from the logits, so no log(0)).
void softmax(const std::vector<double>& logits, std::vector<double>& p, std::vector<double>& log_p) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double l : logits) sum += std::exp(l - m);
  const double lse = m + std::log(sum);
  p.resize(logits.size());
  log_p.resize(logits.size());
  for (size_t j = 0; j < logits.size(); ++j) {
    log_p[j] = logits[j] - lse;
    p[j] = std::exp(log_p[j]);
  }
}

// Indices of the k largest probabilities; ties broken by lower index (deterministic).
std::vector<int64_t> top_k(const std::vector<double>& p, int64_t k) {
  std::vector<int64_t> index(p.size());
  std::iota(index.begin(), index.end(), 0);
  std::partial_sort(index.begin(), index.begin() + k, index.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  index.resize(k);
  std::sort(index.begin(), index.end());
  return index;
}

double norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace

QueryMetrics evaluate_query(const QueryEvalInput& in) {
  const int d = in.dim;
  const int64_t n = in.split.total();
  OSCAR_CHECK(n > 0 && in.encoded && n <= in.encoded->tokens, "query evaluation over {} tokens", n);
  std::vector<double> logits(n), logits_hat(n);
  for (int64_t j = 0; j < n; ++j) {
    logits[j] = in.softmax_scale * dot(in.query, in.reference_keys + j * d, d);
    logits_hat[j] = in.softmax_scale * dot(in.rotated_query, in.encoded->key_row(j, in.split), d);
  }
  std::vector<double> p, log_p, p_hat, log_p_hat;
  softmax(logits, p, log_p);
  softmax(logits_hat, p_hat, log_p_hat);

  QueryMetrics m;
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] > 0) m.kl += p[j] * (log_p[j] - log_p_hat[j]);
    m.logit_err_max = std::max(m.logit_err_max, std::fabs(logits[j] - logits_hat[j]));
  }
  const int64_t k = std::min<int64_t>(8, n);
  auto top_ref = top_k(p, k), top_hat = top_k(p_hat, k);
  std::vector<int64_t> common;
  std::set_intersection(top_ref.begin(), top_ref.end(), top_hat.begin(), top_hat.end(), std::back_inserter(common));
  m.top8_recall = static_cast<double>(common.size()) / static_cast<double>(k);

  // Per tier: reference sum p_j v_j (original basis) and method sum p_hat_j v_hat_j (rotated, then R_V^T).
  const int64_t bounds[4] = {0, in.split.history_begin(), in.split.recent_begin(), n};
  std::vector<double> o(d, 0.0), o_hat_own(d, 0.0);
  double tier_err_norm[3];
  std::vector<std::vector<double>> tier_delta(3, std::vector<double>(d, 0.0));
  for (int t = 0; t < 3; ++t) {
    std::vector<double> ref(d, 0.0), rotated(d, 0.0);
    for (int64_t j = bounds[t]; j < bounds[t + 1]; ++j) {
      const float* v = in.reference_values + j * d;
      const float* v_hat = in.encoded->value_row(j, in.split);
      for (int i = 0; i < d; ++i) {
        ref[i] += p[j] * v[i];
        rotated[i] += p_hat[j] * v_hat[i];
      }
    }
    for (int i = 0; i < d; ++i) {
      double back = rotated[i];
      if (in.value_rotation) {  // (x · R^T)[i] = sum_c x[c] R[i, c]
        back = 0;
        for (int c = 0; c < d; ++c) back += rotated[c] * (*in.value_rotation)(i, c);
      }
      tier_delta[t][i] = ref[i] - back;
      o[i] += ref[i];
      o_hat_own[i] += back;
    }
  }
  const double o_norm = norm(o);
  for (int t = 0; t < 3; ++t) tier_err_norm[t] = o_norm > 0 ? norm(tier_delta[t]) / o_norm : 0.0;
  m.err_sink = tier_err_norm[0];
  m.err_history = tier_err_norm[1];
  m.err_recent = tier_err_norm[2];

  std::vector<double> o_hat(d);
  for (int i = 0; i < d; ++i) o_hat[i] = in.output ? static_cast<double>(in.output[i]) : o_hat_own[i];
  double diff2 = 0, dot_o = 0;
  for (int i = 0; i < d; ++i) {
    diff2 += (o[i] - o_hat[i]) * (o[i] - o_hat[i]);
    dot_o += o[i] * o_hat[i];
  }
  const double o_hat_norm = norm(o_hat);
  m.rel_err = o_norm > 0 ? std::sqrt(diff2) / o_norm : 0.0;
  m.cos = (o_norm > 0 && o_hat_norm > 0) ? dot_o / (o_norm * o_hat_norm) : 0.0;
  return m;
}

ReconstructionErrors reconstruction_errors(const float* reference, const std::vector<float>& window_rows,
                                           const std::vector<float>& dequantized_rows, int64_t tokens, int dim,
                                           const MatrixD& rotation) {
  ReconstructionErrors r;
  r.window_error.assign(tokens, 0.0);
  r.history_error.assign(tokens, 0.0);
  r.norm.assign(tokens, 0.0);
  // The back-rotation runs in float32 (a metric, not the stored data: its ~1e-7 relative error is far below
  // BF16 and INT2 errors); an identity rotation is skipped, so unrotated rows compare exactly.
  using RowsF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const bool identity = rotation == MatrixD::Identity(dim, dim);
  const RowsF back = rotation.transpose().cast<float>();
  const int64_t block = 1024;
  auto errors = [&](const float* rows_in, int64_t first, int64_t rows, double* out) {
    Eigen::Map<const RowsF> x(reference + first * dim, rows, dim), y(rows_in + first * dim, rows, dim);
    RowsF back_rotated = identity ? RowsF(y) : RowsF(y * back);
    for (int64_t j = 0; j < rows; ++j) {
      double e = 0;
      for (int i = 0; i < dim; ++i) {
        const double diff = static_cast<double>(x(j, i)) - back_rotated(j, i);
        e += diff * diff;
      }
      out[first + j] = e;
    }
  };
  for (int64_t first = 0; first < tokens; first += block) {
    const int64_t rows = std::min(block, tokens - first);
    for (int64_t j = 0; j < rows; ++j) {
      double n = 0;
      for (int i = 0; i < dim; ++i) n += static_cast<double>(reference[(first + j) * dim + i]) * reference[(first + j) * dim + i];
      r.norm[first + j] = n;
    }
    errors(window_rows.data(), first, rows, r.window_error.data());
    if (!dequantized_rows.empty()) errors(dequantized_rows.data(), first, rows, r.history_error.data());
  }
  return r;
}

double ReconstructionErrors::relative_error(const TierSplit& split) const {
  double err = 0, ref = 0;
  for (int64_t j = 0; j < split.total(); ++j) {
    const bool history = j >= split.history_begin() && j < split.recent_begin();
    err += history ? history_error[j] : window_error[j];
    ref += norm[j];
  }
  return ref > 0 ? err / ref : 0.0;
}

double percentile_of_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

Summary summarize(std::vector<double> values) {
  Summary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = percentile_of_sorted(values, 0.50);
  s.p90 = percentile_of_sorted(values, 0.90);
  s.p99 = percentile_of_sorted(values, 0.99);
  s.max = values.back();
  return s;
}

}  // namespace oscar
