// OScaR omni-token norms, scaling and its inverse (see oscars.h).
#include "methods/baselines/oscars.h"

#include <cmath>

#include "common/error.h"

namespace oscar::baselines {

std::vector<float> omni_token_norms(const std::vector<const float*>& heads, int num_kv_heads, int64_t tokens,
                                    int dim) {
  OSCAR_CHECK(static_cast<int>(heads.size()) == num_kv_heads && num_kv_heads > 0,
              "oscars: the omni-token key norm needs the keys of all {} KV heads of the layer, got {}", num_kv_heads,
              heads.size());
  for (const float* h : heads) OSCAR_CHECK(h != nullptr, "oscars: missing keys of a KV head");
  std::vector<float> norms(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (const float* h : heads)
      for (int i = 0; i < dim; ++i) {
        const double v = h[static_cast<size_t>(t) * dim + i];
        sum += v * v;
      }
    const float n = static_cast<float>(std::sqrt(sum));
    norms[t] = n > 0 ? n : 1.0f;
  }
  return norms;
}

void divide_rows_by_norms(float* rows, int64_t tokens, int dim, const std::vector<float>& norms) {
  OSCAR_CHECK(static_cast<int64_t>(norms.size()) >= tokens, "{} norms for {} tokens", norms.size(), tokens);
  for (int64_t t = 0; t < tokens; ++t)
    for (int i = 0; i < dim; ++i) rows[static_cast<size_t>(t) * dim + i] /= norms[t];
}

void multiply_rows_by_norms(float* rows, int64_t tokens, int dim, const std::vector<float>& norms) {
  OSCAR_CHECK(static_cast<int64_t>(norms.size()) >= tokens, "{} norms for {} tokens", norms.size(), tokens);
  for (int64_t t = 0; t < tokens; ++t)
    for (int i = 0; i < dim; ++i) rows[static_cast<size_t>(t) * dim + i] *= norms[t];
}

double rescaled_logit(const float* query, const float* scaled_key, int dim, float norm) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += static_cast<double>(query[i]) * scaled_key[i];
  return static_cast<double>(norm) * s;
}

}  // namespace oscar::baselines
