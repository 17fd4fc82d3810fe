// Decode attention over one segmented cache (BF16 sink | INT2 history | BF16 recent, all in rotated
// space), behind one interface with two implementations: "cpu" (float64 reference) and "cuda"
// (the kernels/ flash-decoding path). oscar-eval --backend picks one.
#pragma once
#include <memory>
#include <string>

#include "quant/quantizer.h"

namespace oscar {

// One sequence, one KV head. Rows are [tokens, d] row-major, rotated. BF16 tiers hold floats that are
// already rounded to bfloat16. Any tier may be empty (0 tokens, null pointers allowed).
struct SegmentedCacheView {
  int dim = 0;
  int sink_tokens = 0;
  const float* sink_keys = nullptr;    // [sink_tokens, d]
  const float* sink_values = nullptr;  // [sink_tokens, d]
  const QuantizedRows* history_keys = nullptr;    // [H, d] quantised (H = rows), or null
  const QuantizedRows* history_values = nullptr;  // [H, d] quantised, same H
  int recent_tokens = 0;
  const float* recent_keys = nullptr;    // [recent_tokens, d]
  const float* recent_values = nullptr;  // [recent_tokens, d]
  int history_tokens() const { return history_keys ? history_keys->rows : 0; }
  int total_tokens() const { return sink_tokens + history_tokens() + recent_tokens; }
};

struct DecodeRequest {
  const SegmentedCacheView* cache = nullptr;
  const float* queries = nullptr;          // [num_queries, d], already rotated by R_K (q · R_K)
  int num_queries = 0;                     // the GQA group of query heads reading this KV head
  double softmax_scale = 0;                // usually 1/sqrt(d)
  const float* value_rotation = nullptr;   // R_V [d, d] (x_row @ R_V); null = identity
};

class DecodeBackend {
 public:
  virtual ~DecodeBackend() = default;
  virtual std::string name() const = 0;
  // out: [num_queries, d] = softmax over all tiers, un-rotated: o = o' · R_V^T.
  virtual void decode(const DecodeRequest& request, float* out) = 0;
};

// "cpu" or "cuda"; "cuda" fails with a clear error when the build or the machine has no CUDA.
std::unique_ptr<DecodeBackend> make_decode_backend(const std::string& name);

// The CPU reference (float64): partial attention per tier, exact merge, un-rotation.
std::unique_ptr<DecodeBackend> make_cpu_decode_backend();
#ifdef OSCAR_WITH_CUDA
std::unique_ptr<DecodeBackend> make_cuda_decode_backend();  // lib/backend/cuda_backend.cpp
#endif

}  // namespace oscar
