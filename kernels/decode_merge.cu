// Merge of split partials (log2-sum-exp weighted) fused with the un-rotation o = o' . R_V^T.
// One CTA per (query head, KV head, sequence); rows of R_V^T are read coalesced from L2.
#include <cmath>
#include <stdexcept>
#include <string>

#include "decode_merge.h"

namespace oscar::kernels {
namespace {

constexpr int kMaxGroup = 8;
constexpr int kThreads = 128;
constexpr int kMaxSplits = 4096;

// One CTA per query head: split weights exp2(lse2_s - max) / sum in shared memory, then the weighted
// sum over splits (independent loads, unrolled) and the un-rotation o'[1, d] . M[d, d].
template <int D>
__global__ void __launch_bounds__(kThreads) decode_merge_kernel(const DecodeMergeParams p) {
  __shared__ float weight[kMaxSplits];
  __shared__ float merged[D];
  __shared__ float reduce[2];
  const int h = blockIdx.x, kv = blockIdx.y, b = blockIdx.z, g = p.group, S = p.splits_total;
  const size_t pair = (size_t)b * p.num_kv_heads + kv;
  const float* lse = p.partial_lse2 + pair * S * g;    // [S, g]
  const float* po = p.partial_out + pair * S * g * D;  // [S, g, D]
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[s * g + h]);
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    for (int s = lane; s < S; s += 32) {
      const float w = mx == -INFINITY ? 0.f : exp2f(lse[s * g + h] - mx);
      weight[s] = w;
      sum += w;
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      reduce[0] = sum > 0.f ? 1.f / sum : 0.f;
      if (p.out_lse) p.out_lse[pair * g + h] = sum > 0.f ? (mx + log2f(sum)) * 0.69314718055994531f : -INFINITY;
    }
  }
  __syncthreads();
  const float inv = reduce[0];
  for (int c = threadIdx.x; c < D; c += kThreads) {
    float acc = 0.f;
#pragma unroll 8
    for (int s = 0; s < S; ++s) acc += weight[s] * __ldg(po + ((size_t)s * g + h) * D + c);
    merged[c] = acc * inv;
  }
  __syncthreads();
  float* out = p.out + (pair * g + h) * D;
  if (!p.value_rotation_t) {
    for (int c = threadIdx.x; c < D; c += kThreads) out[c] = merged[c];
    return;
  }
  const float* rot = p.value_rotation_t + kv * p.rotation_kv_head_stride;  // [D, D]
  for (int j = threadIdx.x; j < D; j += kThreads) {
    float acc = 0.f;
#pragma unroll 16
    for (int i = 0; i < D; ++i) acc += merged[i] * __ldg(rot + (size_t)i * D + j);
    out[j] = acc;
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("decode merge: " + message);
}

}  // namespace

void check_decode_merge(const DecodeMergeParams& p) {
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          "head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  require(p.group >= 1 && p.group <= kMaxGroup, "GQA ratio must be 1 to 8");
  require(p.batch >= 1 && p.num_kv_heads >= 1 && p.splits_total >= 1, "empty geometry");
  require(p.splits_total <= kMaxSplits, "more than 4096 splits");
  require(p.partial_out && p.partial_lse2 && p.out, "null pointer");
}

void launch_decode_merge(const DecodeMergeParams& p, cudaStream_t stream) {
  check_decode_merge(p);
  dim3 grid(p.group, p.num_kv_heads, p.batch);
  switch (p.head_dim) {
    case 64: decode_merge_kernel<64><<<grid, kThreads, 0, stream>>>(p); break;
    case 128: decode_merge_kernel<128><<<grid, kThreads, 0, stream>>>(p); break;
    case 256: decode_merge_kernel<256><<<grid, kThreads, 0, stream>>>(p); break;
    default: break;
  }
}

}  // namespace oscar::kernels
