// OScaR's omni-token key scaling (arXiv 2605.19660; shared/spec/baselines.md): each token's rotated key
// is divided by ONE fp32 L2 norm taken over all KV heads of that token, and at decode every logit is
// multiplied back by that norm. Needs the whole layer's keys, not one head.
#pragma once
#include <cstdint>
#include <vector>

namespace oscar::baselines {

// n_t = || (k_t,0, ..., k_t,Hkv-1) ||_2 in fp32 (accumulated in float64). heads[h]: [tokens, d] keys of
// KV head h (any orthogonal per-head rotation leaves n_t unchanged). A zero token gets n_t = 1 (nothing to
// scale). Fails unless heads has exactly num_kv_heads entries.
std::vector<float> omni_token_norms(const std::vector<const float*>& heads, int num_kv_heads, int64_t tokens, int dim);

// rows [tokens, d] divided in place by norms[t] (the stored, scaled keys).
void divide_rows_by_norms(float* rows, int64_t tokens, int dim, const std::vector<float>& norms);
// rows [tokens, d] multiplied in place by norms[t]: the dequantised scaled keys back in key units, so that
// q · (k_hat_t * n_t) equals the rescaled logit n_t * (q · k_hat_t).
void multiply_rows_by_norms(float* rows, int64_t tokens, int dim, const std::vector<float>& norms);

// The decode-side logit of one token, float64: n_t * (q · k_scaled_hat).
double rescaled_logit(const float* query, const float* scaled_key, int dim, float norm);

}  // namespace oscar::baselines
