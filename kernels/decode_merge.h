// Merge of split partials into the final decode output, fused with the un-rotation o = o' . R_V^T.
// CPU twin: merge_partials in lib/attention plus the loop in lib/backend/paged_cache.cpp.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace oscar::kernels {

struct DecodeMergeParams {
  int batch = 0, num_kv_heads = 0, group = 0, head_dim = 0, splits_total = 0;
  const float* partial_out = nullptr;   // [B, Hkv, splits_total, g, d]
  const float* partial_lse2 = nullptr;  // [B, Hkv, splits_total, g]
  // M = R_V^T row-major [d, d] so that out[j] = sum_i o'[i] * M[i, j]; null = identity.
  const float* value_rotation_t = nullptr;
  long rotation_kv_head_stride = 0;  // 0: one matrix for every KV head; d*d: one per KV head
  float* out = nullptr;              // [B, Hkv*g, d]; all splits empty gives zeros
  float* out_lse = nullptr;          // optional [B, Hkv*g] natural-log sum exp
};

void check_decode_merge(const DecodeMergeParams& params);
void launch_decode_merge(const DecodeMergeParams& params, cudaStream_t stream);

}  // namespace oscar::kernels
