// Rotate-clip-quantise-pack kernels (see quantize_pack.h). With the clip threshold among the 16
// largest magnitudes (clip ratio >= 1 - 16/d): one thread per row (below), x.R (if any) on tensor
// cores first. Otherwise: CTA = 8 warps, 32 rows. With a rotation the
// CTA first computes its [32, d] tile of x.R through shared memory (fp32 FMA); then each warp
// quantises 4 rows: a lane holds channels lane + 32k. The clip threshold is found exactly by removing
// extremes one at a time; every division and addition uses the _rn intrinsics (the library is built
// with --use_fast_math) so codes and metadata match the CPU quantiser bit for bit.
#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "quantize_pack.h"

namespace oscar::kernels {
namespace {

constexpr int kRowsPerCta = 32;
constexpr int kThreads = 256;
constexpr int kChunk = 32;  // k rows of the rotation staged per step

__device__ __forceinline__ float round_metadata(float x, MetadataRounding type) {
  if (type == MetadataRounding::fp16) return __half2float(__float2half_rn(x));
  if (type == MetadataRounding::bf16) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}
// oscar::group_scale for 2 bits: max(range, 1e-8) / 3, at least |x|max * 2^-14 (fp16) or 2^-100
// (bf16, fp32) so that degenerate (constant) rows keep a finite zero point; rounded to the metadata
// type; 0 becomes the smallest stored value. (The floor product is an exact power-of-two scaling;
// where it is subnormal and flushed, the 1e-8 / 3 term is larger anyway.)
__device__ __forceinline__ float group_scale(float mn, float mx, MetadataRounding type) {
  float range = __fsub_rn(mx, mn);
  range = range < 1e-8f ? 1e-8f : range;
  const float by_range = __fdiv_rn(range, 3.0f);
  const float magnitude = fmaxf(fabsf(mn), fabsf(mx));
  const float floor_value = __fmul_rn(magnitude, type == MetadataRounding::fp16 ? 0x1.0p-14f : 0x1.0p-100f);
  float s = round_metadata(by_range < floor_value ? floor_value : by_range, type);
  if (s == 0.0f) s = type == MetadataRounding::fp16 ? 0x1.0p-24f : 0x1.0p-126f;
  return s;
}
// std::min / std::max semantics: keep the first argument on ties.
__device__ __forceinline__ float first_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float first_max(float a, float b) { return a < b ? b : a; }

template <int D>
__device__ void quantize_row_warp(float (&v)[D / 32], const QuantizePackParams& p, long row) {
  constexpr int NV = D / 32;
  constexpr int Q = D / 4;
  const int lane = threadIdx.x % 32;
  if (p.clip_ratio < 1.0f) {
    int idx = (int)floor((double)p.clip_ratio * D);
    idx = idx < 0 ? 0 : (idx > D - 1 ? D - 1 : idx);
    float a[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) a[k] = fabsf(v[k]);
    const int above = D - 1 - idx;
    const bool from_top = above <= idx;
    const int rounds = from_top ? above : idx;  // extremes removed before the threshold is the extreme left
    unsigned removed = 0;
    float tau = 0.f;
    for (int r = 0; r <= rounds; ++r) {
      float best = from_top ? -INFINITY : INFINITY;
      int best_k = -1;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (removed >> k & 1u) continue;
        if (best_k < 0 || (from_top ? a[k] > best : a[k] < best)) best = a[k], best_k = k;
      }
      float wbest = best;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, wbest, off);
        wbest = from_top ? fmaxf(wbest, o) : fminf(wbest, o);
      }
      if (r == rounds) {
        tau = wbest;
        break;
      }
      const unsigned holders = __ballot_sync(0xffffffffu, best_k >= 0 && best == wbest);
      if (lane == __ffs(holders) - 1) removed |= 1u << best_k;
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) v[k] = v[k] < -tau ? -tau : (tau < v[k] ? tau : v[k]);
  }
  float mn = v[0], mx = v[0];
#pragma unroll
  for (int k = 1; k < NV; ++k) mn = first_min(mn, v[k]), mx = first_max(mx, v[k]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    mn = first_min(mn, __shfl_xor_sync(0xffffffffu, mn, off));
    mx = first_max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  }
  const float scale = group_scale(mn, mx, p.metadata);
  const float zero = round_metadata(__fdiv_rn(-mn, scale), p.metadata);
  unsigned code[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    float c = floorf(__fadd_rn(__fadd_rn(__fdiv_rn(v[k], scale), zero), 0.5f));
    c = c < 0.f ? 0.f : (3.f < c ? 3.f : c);
    code[k] = (unsigned)c;
  }
  const long dst = p.destination_rows ? p.destination_rows[row] : row;
  uint8_t* out = p.codes + dst * Q;
  if constexpr (D >= 128) {
    constexpr int M = Q / 32;  // bytes per lane
#pragma unroll
    for (int m = 0; m < M; ++m) {
      unsigned byte = 0;
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) byte |= code[m + qq * M] << (2 * qq);
      out[lane + 32 * m] = (uint8_t)byte;
    }
  } else {  // D = 64: Q = 16, quarters 1 and 3 live in lane + 16
    const unsigned c0 = __shfl_down_sync(0xffffffffu, code[0], 16);
    const unsigned c1 = __shfl_down_sync(0xffffffffu, code[1], 16);
    if (lane < 16) out[lane] = (uint8_t)(code[0] | c0 << 2 | code[1] << 4 | c1 << 6);
  }
  if (lane == 0) {
    float* meta = p.metadata_out + dst * p.metadata_stride + p.metadata_offset;
    meta[0] = scale;
    meta[1] = zero;
  }
}

template <int D, bool ROTATE>
__global__ void __launch_bounds__(kThreads) quantize_pack_kernel(const QuantizePackParams p) {
  constexpr int NV = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long row0 = (long)blockIdx.x * kRowsPerCta;
  if constexpr (!ROTATE) {
    for (int r = warp; r < kRowsPerCta; r += kThreads / 32) {
      const long row = row0 + r;
      if (row >= p.rows) break;
      float v[NV];
#pragma unroll
      for (int k = 0; k < NV; ++k) v[k] = __ldg(p.input + row * D + lane + 32 * k);
      quantize_row_warp<D>(v, p, row);
    }
  } else {
    extern __shared__ __align__(16) float smem[];
    float* xs = smem;                          // [32][D + 4]
    float* rs = smem + kRowsPerCta * (D + 4);  // [kChunk][D]
    constexpr int XS = D + 4;
    for (int i = threadIdx.x; i < kRowsPerCta * D; i += kThreads) {
      const int r = i / D, c = i % D;
      xs[r * XS + c] = row0 + r < p.rows ? __ldg(p.input + (row0 + r) * D + c) : 0.f;
    }
    constexpr int CC = D == 256 ? 8 : 4;
    constexpr int COL_GROUPS = D / CC;
    constexpr int RR = kRowsPerCta * COL_GROUPS / kThreads;
    const int cg = threadIdx.x % COL_GROUPS, rg = threadIdx.x / COL_GROUPS;
    float acc[RR][CC];
#pragma unroll
    for (int r = 0; r < RR; ++r)
#pragma unroll
      for (int c = 0; c < CC; ++c) acc[r][c] = 0.f;
    for (int k0 = 0; k0 < D; k0 += kChunk) {
      __syncthreads();
      for (int i = threadIdx.x * 4; i < kChunk * D; i += kThreads * 4)
        *reinterpret_cast<float4*>(rs + i) = __ldg(reinterpret_cast<const float4*>(p.rotation + (size_t)k0 * D + i));
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kChunk; ++k) {
        float rv[CC];
#pragma unroll
        for (int c = 0; c < CC; c += 4) {
          const float4 t = *reinterpret_cast<const float4*>(rs + k * D + cg * CC + c);
          rv[c] = t.x, rv[c + 1] = t.y, rv[c + 2] = t.z, rv[c + 3] = t.w;
        }
#pragma unroll
        for (int r = 0; r < RR; ++r) {
          const float xv = xs[(rg * RR + r) * XS + k0 + k];
#pragma unroll
          for (int c = 0; c < CC; ++c) acc[r][c] = fmaf(xv, rv[c], acc[r][c]);
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RR; ++r)
#pragma unroll
      for (int c = 0; c < CC; ++c) xs[(rg * RR + r) * XS + cg * CC + c] = acc[r][c];
    __syncthreads();
    for (int r = warp; r < kRowsPerCta; r += kThreads / 32) {
      const long row = row0 + r;
      if (row >= p.rows) break;
      float v[NV];
#pragma unroll
      for (int k = 0; k < NV; ++k) v[k] = xs[r * XS + lane + 32 * k];
      quantize_row_warp<D>(v, p, row);
    }
  }
}

// ---------------------------------------------------------------- thread-per-row path
// CTA = 64 threads = 64 rows. The [64, d] tile is copied into shared memory with cp.async (rows padded
// by 16 bytes: conflict-free 16-byte reads when each thread walks its own row); then each thread
// quantises its row in two passes over it: (1) min, max and tau = the K-th largest |x| (K = d - idx
// <= KMAX) by a sorted insertion network of KMAX registers, (2) codes, packed into registers and
// stored as 16-byte words. Bit-identical to the CPU quantiser; far fewer instructions per row than a
// warp-wide threshold search.
constexpr int kRowThreads = 64;

template <int D>
constexpr int row_tile_bytes() {
  return kRowThreads * (D + 4) * (int)sizeof(float);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// Quantises row `row` of the batch from its fp32 values x[0..D) in shared memory (thread per row).
template <int D, int KMAX>
__device__ __forceinline__ void quantize_row_thread(const QuantizePackParams& p, const float* x, long row, int k_top) {
  constexpr int Q = D / 4;
  // (1) min / max of the row and, when clipping, the top-KMAX magnitudes (descending; -1 = empty) by
  // a branch-free insertion (the 32 rows of a warp would diverge anyway): 2 KMAX + 2 ops per value.
  float tau = INFINITY, lo = x[0], hi = x[0];
  float best[KMAX > 0 ? KMAX : 1];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) best[i] = -1.f;
#pragma unroll 4
  for (int c = 0; c < D; c += 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(x + c);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo = fminf(lo, v[e]), hi = fmaxf(hi, v[e]);
      float t = fabsf(v[e]);
#pragma unroll
      for (int i = 0; i < KMAX; ++i) {
        const float b_hi = fmaxf(best[i], t), b_lo = fminf(best[i], t);
        best[i] = b_hi, t = b_lo;
      }
    }
  }
  // tau = best[k_top - 1], without a run-time index (which would put best in local memory).
#pragma unroll
  for (int i = 0; i < KMAX; ++i) tau = fminf(tau, i < k_top ? best[i] : INFINITY);
  // std::clamp(v, -tau, tau) (v itself when inside; min/max order -0 below +0).
  auto clip = [&](float v) { return KMAX > 0 ? fminf(fmaxf(v, -tau), tau) : v; };
  // (2) min / max of the clipped row = the clipped min / max; std::min / std::max keep the first of
  // equal values, which only matters for the sign of a zero: then redo it in order.
  float mn = clip(lo), mx = clip(hi);
  if (mn == 0.f || mx == 0.f) {
    mn = mx = clip(x[0]);
    for (int c = 1; c < D; ++c) mn = first_min(mn, clip(x[c])), mx = first_max(mx, clip(x[c]));
  }
  const float scale = group_scale(mn, mx, p.metadata);
  const float zero = round_metadata(__fdiv_rn(-mn, scale), p.metadata);
  // (3) codes: v / scale correctly rounded without a division per value (Markstein: with r = RN(1/s)
  // and q0 = RN(v r), q0 + (v - q0 s) r rounds to RN(v / s)); channel c -> byte c % Q, bits 2 (c / Q).
  const float r = __frcp_rn(scale);
  uint32_t packed[Q / 4];
#pragma unroll
  for (int w = 0; w < Q / 4; ++w) packed[w] = 0u;
#pragma unroll
  for (int c = 0; c < D; c += 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(x + c);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float a = clip(v[e]);
      const float q0 = __fmul_rn(a, r);
      const float q = __fmaf_rn(__fmaf_rn(-q0, scale, a), r, q0);
      int code = __float2int_rd(__fadd_rn(__fadd_rn(q, zero), 0.5f));
      code = min(max(code, 0), 3);
      const int ch = c + e, byte = ch % Q;
      packed[byte / 4] += (uint32_t)code << (8 * (byte % 4) + 2 * (ch / Q));
    }
  }
  const long dst = p.destination_rows ? p.destination_rows[row] : row;
  uint8_t* out = p.codes + dst * Q;
#pragma unroll
  for (int w = 0; w < Q / 4; w += 4)
    *reinterpret_cast<uint4*>(out + 4 * w) = make_uint4(packed[w], packed[w + 1], packed[w + 2], packed[w + 3]);
  float* meta = p.metadata_out + dst * p.metadata_stride + p.metadata_offset;
  meta[0] = scale;
  meta[1] = zero;
}

template <int D, int KMAX>
__global__ void __launch_bounds__(kRowThreads) quantize_rows_kernel(const QuantizePackParams p, int k_top) {
  constexpr int XS = D + 4;
  extern __shared__ __align__(16) float tile[];  // [64][D + 4]
  const long row0 = (long)blockIdx.x * kRowThreads;
  const int rows = (int)min((long)kRowThreads, p.rows - row0);
  for (int i = threadIdx.x; i < rows * (D / 4); i += kRowThreads) {
    const int r = i / (D / 4), c = i % (D / 4);
    cp_async16(tile + r * XS + 4 * c, p.input + (row0 + r) * D + 4 * c);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  if ((int)threadIdx.x >= rows) return;
  quantize_row_thread<D, KMAX>(p, tile + threadIdx.x * XS, row0 + threadIdx.x, k_top);
}

// ---------------------------------------------------------------- rotated path on tensor cores
// CTA = D/32 warps, 64 rows. The [64, d] input tile goes to shared memory (cp.async); x.R is computed
// with mma.sync m16n8k8 TF32 in the 3xTF32 form (a = a_hi + a_lo, both TF32, see split_tf32:
// a_hi b_hi + a_hi b_lo + a_lo b_hi, fp32 accumulation; products within ~2^-20 relative, the
// a_lo b_lo term is below that), R streamed through shared memory in chunks of 32 k-rows. Warp w owns output
// columns [32 w, 32 w + 32) of all 64 rows: 4 m-tiles x 4 n-tiles, 64 fp32 accumulators per lane.
// The result overwrites the tile and threads 0..63 quantise one row each (quantize_row_thread).
constexpr int kRotKChunk = 32;

template <int D>
constexpr int rot_smem_bytes() {
  return (kRowThreads * (D + 4) + kRotKChunk * (D + 8)) * (int)sizeof(float);
}

// x = hi + lo: hi = x truncated to TF32 (exact), lo = x - hi (exact in fp32, |lo| < 2^-10 |x|); the
// mma reads lo's top 19 bits (the low 13 are ignored), so hi + lo(TF32) is within 2^-20 |x| of x.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(__fsub_rn(x, __uint_as_float(hi)));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(  // not volatile: a pure function of its operands, free to be scheduled
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int KMAX>
__global__ void __launch_bounds__(D) quantize_rows_rotated_kernel(const QuantizePackParams p, int k_top) {
  constexpr int XS = D + 4, RS = D + 8, THREADS = D;
  extern __shared__ __align__(16) float smem[];
  float* tile = smem;                        // [64][D + 4]: x, then x.R
  float* rs = smem + kRowThreads * XS;       // [32][D + 8]: rows k0..k0+31 of R
  const long row0 = (long)blockIdx.x * kRowThreads;
  const int rows = (int)min((long)kRowThreads, p.rows - row0);
  for (int i = threadIdx.x; i < kRowThreads * (D / 4); i += THREADS) {
    const int r = i / (D / 4), c = i % (D / 4);
    if (r < rows) cp_async16(tile + r * XS + 4 * c, p.input + (row0 + r) * D + 4 * c);
    else *reinterpret_cast<float4*>(tile + r * XS + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int n_base = warp * 32;
  float acc[4][4][4];  // [m-tile][n-tile][fragment]
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
  for (int k0 = 0; k0 < D; k0 += kRotKChunk) {
    __syncthreads();  // previous chunk consumed
    for (int i = threadIdx.x; i < kRotKChunk * (D / 4); i += THREADS) {
      const int r = i / (D / 4), c = i % (D / 4);
      cp_async16(rs + r * RS + 4 * c, p.rotation + (size_t)(k0 + r) * D + 4 * c);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kRotKChunk; kk += 8) {
      uint32_t a_hi[4][4], a_lo[4][4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float* a = tile + (16 * m + g) * XS + k0 + kk + t;
        split_tf32(a[0], a_hi[m][0], a_lo[m][0]);           // (g, t)
        split_tf32(a[8 * XS], a_hi[m][1], a_lo[m][1]);      // (g + 8, t)
        split_tf32(a[4], a_hi[m][2], a_lo[m][2]);           // (g, t + 4)
        split_tf32(a[8 * XS + 4], a_hi[m][3], a_lo[m][3]);  // (g + 8, t + 4)
      }
      uint32_t b_hi[4][2], b_lo[4][2];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float* b = rs + (kk + t) * RS + n_base + 8 * n + g;
        split_tf32(b[0], b_hi[n][0], b_lo[n][0]);       // (k = t, n = g)
        split_tf32(b[4 * RS], b_hi[n][1], b_lo[n][1]);  // (k = t + 4, n = g)
      }
      // Three passes over the 16 tiles: consecutive mma are independent (no accumulator chains).
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tf32(acc[m][n], a_lo[m], b_hi[n][0], b_hi[n][1]);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tf32(acc[m][n], a_hi[m], b_lo[n][0], b_lo[n][1]);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tf32(acc[m][n], a_hi[m], b_hi[n][0], b_hi[n][1]);
    }
  }
  __syncthreads();  // all warps done reading x
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      float* c = tile + (16 * m + g) * XS + n_base + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(c) = make_float2(acc[m][n][0], acc[m][n][1]);
      *reinterpret_cast<float2*>(c + 8 * XS) = make_float2(acc[m][n][2], acc[m][n][3]);
    }
  __syncthreads();
  if ((int)threadIdx.x >= rows) return;
  quantize_row_thread<D, KMAX>(p, tile + threadIdx.x * XS, row0 + threadIdx.x, k_top);
}

// K = number of magnitudes at or above the clip threshold (0: no clipping).
int clip_top_count(float clip_ratio, int d) {
  if (clip_ratio >= 1.0f) return 0;
  int idx = (int)std::floor((double)clip_ratio * d);
  idx = idx < 0 ? 0 : (idx > d - 1 ? d - 1 : idx);
  return d - idx;
}

template <int D, int KMAX>
void launch_rows(const QuantizePackParams& p, int k_top, cudaStream_t stream) {
  const unsigned blocks = (unsigned)((p.rows + kRowThreads - 1) / kRowThreads);
  if (p.rotation) {
    static const bool configured = [] {
      cudaFuncSetAttribute(quantize_rows_rotated_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           rot_smem_bytes<D>());
      return true;
    }();
    (void)configured;
    quantize_rows_rotated_kernel<D, KMAX><<<blocks, D, rot_smem_bytes<D>(), stream>>>(p, k_top);
    return;
  }
  static const bool configured = [] {
    cudaFuncSetAttribute(quantize_rows_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         row_tile_bytes<D>());
    return true;
  }();
  (void)configured;
  quantize_rows_kernel<D, KMAX><<<blocks, kRowThreads, row_tile_bytes<D>(), stream>>>(p, k_top);
}

// The thread-per-row path when the clip threshold is among the top 16 magnitudes (or no clipping);
// false: use the warp-per-row path.
template <int D>
bool launch_rows_fast(const QuantizePackParams& p, cudaStream_t stream) {
  const int k = clip_top_count(p.clip_ratio, D);
  if (reinterpret_cast<uintptr_t>(p.input) % 16 != 0 || reinterpret_cast<uintptr_t>(p.codes) % 16 != 0) return false;
  if (p.rotation && reinterpret_cast<uintptr_t>(p.rotation) % 16 != 0) return false;
  if (k == 0) launch_rows<D, 0>(p, 0, stream);
  else if (k <= 4) launch_rows<D, 4>(p, k, stream);
  else if (k <= 6) launch_rows<D, 6>(p, k, stream);
  else if (k <= 8) launch_rows<D, 8>(p, k, stream);
  else if (k <= 16) launch_rows<D, 16>(p, k, stream);
  else return false;
  return true;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("quantize-pack: " + message);
}

template <int D>
void launch_dim(const QuantizePackParams& p, cudaStream_t stream) {
  const unsigned blocks = (unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta);
  if (launch_rows_fast<D>(p, stream)) return;  // thread per row (with x.R on tensor cores when rotating)
  if (p.rotation) {
    const int smem = (kRowsPerCta * (D + 4) + kChunk * D) * (int)sizeof(float);
    cudaFuncSetAttribute(quantize_pack_kernel<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    quantize_pack_kernel<D, true><<<blocks, kThreads, smem, stream>>>(p);
  } else {
    quantize_pack_kernel<D, false><<<blocks, kThreads, 0, stream>>>(p);
  }
}

}  // namespace

void check_quantize_pack(const QuantizePackParams& p) {
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          "head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  require(p.rows >= 0, "negative row count");
  require(p.clip_ratio > 0.f && p.clip_ratio <= 1.f, "clip ratio outside (0, 1]");
  require(p.metadata_stride >= 2 && p.metadata_offset >= 0 && p.metadata_offset + 2 <= p.metadata_stride,
          "metadata stride/offset do not fit (scale, zero)");
  require(p.rows == 0 || (p.input && p.codes && p.metadata_out), "null pointer");
}

void launch_quantize_pack(const QuantizePackParams& p, cudaStream_t stream) {
  check_quantize_pack(p);
  if (p.rows == 0) return;
  switch (p.head_dim) {
    case 64: launch_dim<64>(p, stream); break;
    case 128: launch_dim<128>(p, stream); break;
    case 256: launch_dim<256>(p, stream); break;
    default: break;
  }
}

}  // namespace oscar::kernels
