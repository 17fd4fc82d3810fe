// CPU reference decode backend: dequantise the INT2 tier, attend to each tier in float64, merge the
// partials exactly and un-rotate. Simple on purpose: the CUDA kernels are tested against it.
#include <vector>

#include "attention/partial_attention.h"
#include "backend/decode_backend.h"
#include "common/error.h"

namespace oscar {
namespace {

class CpuDecodeBackend final : public DecodeBackend {
 public:
  std::string name() const override { return "cpu"; }

  void decode(const DecodeRequest& request, float* out) override {
    const SegmentedCacheView& cache = *request.cache;
    const int d = cache.dim;
    std::vector<float> history_keys, history_values;
    const int history = cache.history_tokens();
    if (history > 0) {
      OSCAR_CHECK(cache.history_values && cache.history_values->rows == history,
                  "INT2 history has {} key rows but a different number of value rows", history);
      history_keys.resize(static_cast<size_t>(history) * d);
      history_values.resize(static_cast<size_t>(history) * d);
      dequantize_rows(*cache.history_keys, history_keys.data());
      dequantize_rows(*cache.history_values, history_values.data());
    }
    for (int h = 0; h < request.num_queries; ++h) {
      const float* q = request.queries + static_cast<size_t>(h) * d;
      std::vector<PartialAttention> parts = {
          partial_attention(q, cache.sink_keys, cache.sink_values, cache.sink_tokens, d, request.softmax_scale),
          partial_attention(q, history_keys.data(), history_values.data(), history, d, request.softmax_scale),
          partial_attention(q, cache.recent_keys, cache.recent_values, cache.recent_tokens, d, request.softmax_scale)};
      PartialAttention merged = merge_partials(parts);
      OSCAR_CHECK(!merged.empty(), "decode over an empty cache");
      float* o = out + static_cast<size_t>(h) * d;
      for (int j = 0; j < d; ++j) {
        if (!request.value_rotation) {
          o[j] = static_cast<float>(merged.output[j]);
          continue;
        }
        // o = o' · R_V^T: o[j] = sum_i o'[i] * R_V[j, i]
        double acc = 0;
        const float* row = request.value_rotation + static_cast<size_t>(j) * d;
        for (int i = 0; i < d; ++i) acc += merged.output[i] * row[i];
        o[j] = static_cast<float>(acc);
      }
    }
  }
};

}  // namespace

std::unique_ptr<DecodeBackend> make_cpu_decode_backend() { return std::make_unique<CpuDecodeBackend>(); }

std::unique_ptr<DecodeBackend> make_decode_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_decode_backend();
  if (name == "cuda") {
#ifdef OSCAR_WITH_CUDA
    return make_cuda_decode_backend();
#else
    fail("backend 'cuda' is not available: this build has no CUDA (configure with OSCAR_ENABLE_CUDA=ON)");
#endif
  }
  fail("unknown backend '{}' (cpu or cuda)", name);
}

}  // namespace oscar
