// CUDA decode backend (make_cuda_decode_backend, declared in decode_backend.h): lays one sequence and
// KV head of the segmented cache out in the paged serving layout, runs the split-K decode kernels and
// the merge + un-rotation kernel, and copies the output back. Simple per call (uploads every time):
// it exists so oscar-eval can check the kernels end to end against the CPU reference.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda_paged.h"
#include "backend/decode_backend.h"
#include "common/error.h"
#include "common/float16.h"

namespace oscar {
namespace {

class CudaDecodeBackend final : public DecodeBackend {
 public:
  CudaDecodeBackend() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      fail("backend 'cuda': no CUDA device is visible on this machine");
    sms_ = cuda_multiprocessor_count();
  }
  std::string name() const override { return "cuda"; }

  void decode(const DecodeRequest& request, float* out) override {
    OSCAR_CHECK(request.cache && request.queries, "cuda decode: null cache or queries");
    const SegmentedCacheView& view = *request.cache;
    const int d = view.dim;
    OSCAR_CHECK(d == 64 || d == 128 || d == 256, "backend 'cuda' supports head_dim 64, 128 or 256, got {}", d);
    OSCAR_CHECK(view.total_tokens() > 0, "decode over an empty cache");
    const int history = view.history_tokens();
    if (history > 0) {
      const QuantizedRows& k = *view.history_keys;
      OSCAR_CHECK(view.history_values && view.history_values->rows == history,
                  "INT2 history has {} key rows but a different number of value rows", history);
      for (const QuantizedRows* q : {view.history_keys, view.history_values}) {
        OSCAR_CHECK(q->bits == 2 && q->dim == d && q->group_size == d,
                    "backend 'cuda' serves 2-bit history with one (scale, zero) per row (group size = head_dim "
                    "{}); got {} bits, group size {}",
                    d, q->bits, q->group_size);
      }
      (void)k;
    }
    const int bf16_tokens = view.sink_tokens + view.recent_tokens;
    PagedCacheGeometry geometry;
    geometry.batch = 1;
    geometry.num_kv_heads = 1;
    geometry.head_dim = d;
    geometry.int2_page_size = 64;
    geometry.bf16_page_size = 64;
    // fp16 metadata is stored as fp16 (8 bytes per token), as a server would; other types as fp32.
    geometry.int2_metadata_fp16 = history > 0 && view.history_keys->metadata == MetadataType::fp16 &&
                                  view.history_values->metadata == MetadataType::fp16;
    std::vector<float> rotation_t;
    if (request.value_rotation) {
      rotation_t.resize(static_cast<size_t>(d) * d);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) rotation_t[static_cast<size_t>(i) * d + j] = request.value_rotation[static_cast<size_t>(j) * d + i];
      rotation_.upload(rotation_t);
    }
    // Query heads in groups of at most 8 (one CTA reads each page for all of them).
    for (int first = 0; first < request.num_queries; first += 8) {
      const int n = std::min(8, request.num_queries - first);
      geometry.group = n;
      HostPagedCache host = make_paged_cache(geometry, {history}, {bf16_tokens}, 7);
      const int Q = d / 4;
      for (int t = 0; t < history; ++t) {
        const int64_t row = host.int2_row(0, 0, t);
        std::memcpy(&host.key_codes[row * Q], &view.history_keys->packed[static_cast<size_t>(t) * Q], Q);
        std::memcpy(&host.value_codes[row * Q], &view.history_values->packed[static_cast<size_t>(t) * Q], Q);
        host.int2_metadata[row * 4 + 0] = view.history_keys->scale[t];
        host.int2_metadata[row * 4 + 1] = view.history_keys->zero[t];
        host.int2_metadata[row * 4 + 2] = view.history_values->scale[t];
        host.int2_metadata[row * 4 + 3] = view.history_values->zero[t];
      }
      auto put_bf16 = [&](int t, const float* k, const float* v) {
        const int64_t row = host.bf16_row(0, 0, t);
        for (int c = 0; c < d; ++c) {
          host.bf16_keys[row * d + c] = float_to_bf16(k[c]);
          host.bf16_values[row * d + c] = float_to_bf16(v[c]);
        }
      };
      for (int t = 0; t < view.sink_tokens; ++t)
        put_bf16(t, view.sink_keys + static_cast<size_t>(t) * d, view.sink_values + static_cast<size_t>(t) * d);
      for (int t = 0; t < view.recent_tokens; ++t)
        put_bf16(view.sink_tokens + t, view.recent_keys + static_cast<size_t>(t) * d,
                 view.recent_values + static_cast<size_t>(t) * d);
      cache_.upload(host);
      queries_.upload(request.queries + static_cast<size_t>(first) * d, static_cast<size_t>(n) * d);
      out_.resize(static_cast<size_t>(n) * d);
      CudaDecodePlan plan = plan_cuda_decode(cache_, sms_);
      decoder_.run(cache_, plan, queries_.get(), static_cast<float>(request.softmax_scale),
                   request.value_rotation ? rotation_.get() : nullptr, out_.get());
      cuda_check(cudaDeviceSynchronize(), "cuda decode");
      auto result = out_.download(static_cast<size_t>(n) * d);
      std::copy(result.begin(), result.end(), out + static_cast<size_t>(first) * d);
    }
  }

 private:
  int sms_ = 0;
  DevicePagedCache cache_;
  DeviceBuffer<float> queries_, out_, rotation_;
  CudaPagedDecoder decoder_;
};

}  // namespace

std::unique_ptr<DecodeBackend> make_cuda_decode_backend() { return std::make_unique<CudaDecodeBackend>(); }

}  // namespace oscar
