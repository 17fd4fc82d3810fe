// Merge of split partials (log2-sum-exp weighted) fused with the un-rotation o = o' . R_V^T.
// One CTA of 8 warps per (KV head, sequence): warp h finds the max and sum for query head h, then all
// threads form o' [g, d] in shared memory and multiply by R_V^T (rows read coalesced from L2).
#include <cmath>
#include <stdexcept>
#include <string>

#include "decode_merge.h"

namespace oscar::kernels {
namespace {

constexpr int kMaxGroup = 8;
constexpr int kThreads = 256;

template <int D>
__global__ void __launch_bounds__(kThreads) decode_merge_kernel(const DecodeMergeParams p) {
  __shared__ float merged[kMaxGroup][D];
  __shared__ float head_max[kMaxGroup], head_inv_sum[kMaxGroup];
  const int kv = blockIdx.x, b = blockIdx.y, g = p.group, S = p.splits_total;
  const size_t pair = (size_t)b * p.num_kv_heads + kv;
  const float* lse = p.partial_lse2 + pair * S * g;  // [S, g]
  const float* po = p.partial_out + pair * S * g * D;  // [S, g, D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < g) {
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[s * g + warp]);
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != -INFINITY)
      for (int s = lane; s < S; s += 32) sum += exp2f(lse[s * g + warp] - mx);
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      head_max[warp] = mx;
      head_inv_sum[warp] = sum > 0.f ? 1.f / sum : 0.f;
      if (p.out_lse) {
        p.out_lse[pair * g + warp] = sum > 0.f ? (mx + log2f(sum)) * 0.69314718055994531f : -INFINITY;
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < g * D; i += kThreads) {
    const int h = i / D, c = i % D;
    const float mx = head_max[h];
    float acc = 0.f;
    if (mx != -INFINITY) {
      for (int s = 0; s < S; ++s) {
        const float l = lse[s * g + h];
        if (l != -INFINITY) acc += exp2f(l - mx) * po[((size_t)s * g + h) * D + c];
      }
    }
    merged[h][c] = acc * head_inv_sum[h];
  }
  __syncthreads();
  float* out = p.out + pair * g * D;
  if (!p.value_rotation_t) {
    for (int i = threadIdx.x; i < g * D; i += kThreads) out[i] = merged[i / D][i % D];
    return;
  }
  const float* rot = p.value_rotation_t + kv * p.rotation_kv_head_stride;  // [D, D]
  for (int j = threadIdx.x; j < D; j += kThreads) {
    float acc[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) acc[h] = 0.f;
    for (int i = 0; i < D; ++i) {
      const float r = __ldg(rot + (size_t)i * D + j);
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h)
        if (h < g) acc[h] += merged[h][i] * r;
    }
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h)
      if (h < g) out[h * D + j] = acc[h];
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
  require(p.partial_out && p.partial_lse2 && p.out, "null pointer");
}

void launch_decode_merge(const DecodeMergeParams& p, cudaStream_t stream) {
  check_decode_merge(p);
  dim3 grid(p.num_kv_heads, p.batch);
  switch (p.head_dim) {
    case 64: decode_merge_kernel<64><<<grid, kThreads, 0, stream>>>(p); break;
    case 128: decode_merge_kernel<128><<<grid, kThreads, 0, stream>>>(p); break;
    case 256: decode_merge_kernel<256><<<grid, kThreads, 0, stream>>>(p); break;
    default: break;
  }
}

}  // namespace oscar::kernels
