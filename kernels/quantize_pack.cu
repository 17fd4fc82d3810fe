// Rotate-clip-quantise-pack kernels (see quantize_pack.h). With the clip threshold among the 16
// largest magnitudes (clip ratio >= 1 - 16/d): one thread per row (below), x.R (if any) on tensor
// cores first (fp16 split with power-of-two scaling for d <= 128, 3xTF32 for d = 256). Otherwise: CTA = 8 warps, 32 rows. With a rotation the
// CTA first computes its [32, d] tile of x.R through shared memory (fp32 FMA); then each warp
// quantises 4 rows: a lane holds channels lane + 32k. The clip threshold is found exactly by removing
// extremes one at a time; every division and addition uses the _rn intrinsics (the library is built
// with --use_fast_math) so codes and metadata match the CPU quantiser bit for bit.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"
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
        for (int m = 0; m < 4; ++m) mma_tf32_1688(acc[m][n], a_lo[m], b_hi[n][0], b_hi[n][1]);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tf32_1688(acc[m][n], a_hi[m], b_lo[n][0], b_lo[n][1]);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tf32_1688(acc[m][n], a_hi[m], b_hi[n][0], b_hi[n][1]);
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

// ---------------------------------------------------------------- rotated path: fp16 split, warp pipelines
// d <= 128. Persistent CTAs (one per SM at d = 128, two at d = 64) convert R once: each column is scaled by a power of two 2^c_n
// (max |R[:, n]| in [2^13, 2^14)) and split as R = R_hi + R_lo, both fp16 (R_lo the fp16 of the exact
// fp32 remainder), stored in the B-fragment order of mma.sync m16n8k16 (one 16-byte load per lane,
// k-step and n-tile). Then every warp runs its own pipeline over 32-row tiles, with no CTA barrier:
// cp.async of the [32, d] tile; each lane scales its row by a power of two 2^r_i (max |x_i| in
// [2^13, 2^14)) and splits it in place the same way (each float4 of k 4j..4j+3 becomes the fp16 pairs
// hi(k, k+1), hi(k+2, k+3), lo(k, k+1), lo(k+2, k+3): the A-fragment registers of those k); x.R =
// hi.hi + hi.lo + lo.hi with fp32 accumulation (the lo.lo term and the rounding of the lo parts are
// ~2^-22 relative; fp16 range problems are scaled away, no orthogonality assumed), scaled back exactly
// by 2^-r_i 2^-c_n into the tile; then each lane quantises its row (quantize_row_thread). Independent
// warps overlap one another's loads, tensor-core work and quantiser (the quantiser needs many rows in
// flight: with CTA-wide phases it ran on a quarter of the warps and took half the time).
// Bank conflicts: the k order inside a k-step is free (A and B permuted alike): lane (g, t) reads k
// 4t..4t+3 of its two rows with one 16-byte load each, and fragment row g is tile row
// rho(g) = g / 2 + 4 (g % 2) (also free), so 8 consecutive lanes hit 8 distinct 16-byte bank groups
// with the row stride of d + 4 floats (which the thread-per-row passes need).
constexpr int kWarpRows = 32;    // rows per warp tile
constexpr int kSplitWarps = 8;   // warps per CTA (d = 128: one CTA per SM)

template <int D>
constexpr int split_smem_bytes() {
  return (D / 16) * (D / 8) * 32 * 16  // R fragments
         + (2 * D + kSplitWarps * kWarpRows * (D + 4)) * (int)sizeof(float);
}

// 2^s for s in [-126, 127].
__device__ __forceinline__ float exp2_int(int s) { return __int_as_float((s + 127) << 23); }
// s such that m 2^s lies in [2^13, 2^14) for a normal m > 0, clamped to [-126, 126] (zero and
// subnormal m: 126; fp16 products of scaled values and their sums stay far inside the fp32 range).
__device__ __forceinline__ int fp16_range_shift(float m) {
  const int e = (__float_as_int(m) >> 23) & 0xff;  // m in [2^(e - 127), 2^(e - 126))
  const int s = 140 - e;
  return s > 126 ? 126 : (s < -126 ? -126 : s);
}
// (a, b) * scale (exact: a power of two) = hi + lo, hi = fp16(a scale), lo = fp16(a scale - hi) (the
// difference is exact in fp32); each pair packed low element first.
__device__ __forceinline__ void split_fp16x2(float a, float b, float scale, uint32_t& hi, uint32_t& lo) {
  const float sa = a * scale, sb = b * scale;
  const __half2 h = __floats2half2_rn(sa, sb);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(sa - hf.x, sb - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// The [32, D] tile of rows row0.. into this warp's shared memory (cp.async; rows past the end zeroed).
template <int D>
__device__ __forceinline__ void load_warp_tile(const QuantizePackParams& p, float* tile, long row0, int lane) {
  constexpr int XS = D + 4;
  const int rows = (int)min((long)kWarpRows, p.rows - row0);
  for (int r = 0; r < kWarpRows; ++r)
    for (int c = lane; c < D / 4; c += 32) {
      if (r < rows) cp_async16(tile + r * XS + 4 * c, p.input + (row0 + r) * D + 4 * c);
      else *reinterpret_cast<float4*>(tile + r * XS + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// d = 64 runs two CTAs per SM (<= 128 registers; 230 at d = 128, where shared memory allows one).
template <int D, int KMAX>
__global__ void __launch_bounds__(kSplitWarps * 32, D == 64 ? 2 : 1) quantize_rows_rotated_split_kernel(const QuantizePackParams p, int k_top) {
  static_assert(D == 64 || D == 128, "R fragments of d = 256 do not fit in shared memory");
  constexpr int XS = D + 4, KSTEPS = D / 16, NTILES = D / 8, THREADS = kSplitWarps * 32;
  extern __shared__ __align__(16) float smem[];
  uint4* rfrag = reinterpret_cast<uint4*>(smem);          // [D/16 k-steps][D/8 n-tiles][32 lanes]
  float* col_scale = smem + KSTEPS * NTILES * 32 * 4;     // [D] 2^c_n
  float* col_inverse = col_scale + D;                     // [D] 2^-c_n
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* tile = col_inverse + D + warp * kWarpRows * XS;  // [32][D + 4]: x, split x, then x.R
  const long tiles = (p.rows + kWarpRows - 1) / kWarpRows;
  const long stride = (long)gridDim.x * kSplitWarps;
  long tile_index = (long)blockIdx.x * kSplitWarps + warp;
  if (tile_index < tiles) load_warp_tile<D>(p, tile, tile_index * kWarpRows, lane);  // overlaps the split of R
  for (int n = threadIdx.x; n < D; n += THREADS) {
    float m = 0.f;
#pragma unroll 8
    for (int k = 0; k < D; ++k) m = fmaxf(m, fabsf(__ldg(p.rotation + (size_t)k * D + n)));
    const int s = fp16_range_shift(m);
    col_scale[n] = exp2_int(s);
    col_inverse[n] = exp2_int(-s);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < KSTEPS * NTILES * 32; i += THREADS) {
    const int l = i % 32, nt = (i / 32) % NTILES, ks = i / (32 * NTILES);
    const int n = 8 * nt + l / 4, k = 16 * ks + 4 * (l % 4);
    const float* r = p.rotation + (size_t)k * D + n;
    const float cs = col_scale[n];
    uint4 f;
    split_fp16x2(__ldg(r), __ldg(r + D), cs, f.x, f.z);              // logical k 2t, 2t+1 = k, k + 1
    split_fp16x2(__ldg(r + 2 * D), __ldg(r + 3 * D), cs, f.y, f.w);  // logical k 2t+8, 2t+9 = k + 2, k + 3
    rfrag[i] = f;
  }
  __syncthreads();  // R ready; from here on the warps are independent (no CTA barrier)
  const int g = lane / 4, t = lane % 4;
  const int rho = g / 2 + 4 * (g % 2);  // tile row of fragment row g (and rho + 8 of g + 8)
  for (; tile_index < tiles; tile_index += stride) {
    const long row0 = tile_index * kWarpRows;
    const int rows = (int)min((long)kWarpRows, p.rows - row0);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncwarp();
    float inverse;  // 2^-r of this lane's row
    {
      float* x = tile + lane * XS;
      float m = 0.f;
#pragma unroll 8
      for (int c = 0; c < D; c += 4) {
        const float4 v = *reinterpret_cast<const float4*>(x + c);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      }
      const int s = fp16_range_shift(m);
      const float scale = exp2_int(s);
      inverse = exp2_int(-s);
#pragma unroll 8
      for (int c = 0; c < D; c += 4) {
        const float4 v = *reinterpret_cast<const float4*>(x + c);
        uint4 f;
        split_fp16x2(v.x, v.y, scale, f.x, f.z);
        split_fp16x2(v.z, v.w, scale, f.y, f.w);
        *reinterpret_cast<uint4*>(x + c) = f;
      }
    }
    __syncwarp();
    float acc[2][NTILES][4];  // [m-tile][n-tile][fragment]
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < NTILES; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
#pragma unroll 1
    for (int ks = 0; ks < KSTEPS; ++ks) {
      uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float* a = tile + (16 * m + rho) * XS + 16 * ks + 4 * t;
        const uint4 u = *reinterpret_cast<const uint4*>(a);           // row rho (split)
        const uint4 v = *reinterpret_cast<const uint4*>(a + 8 * XS);  // row rho + 8
        a_hi[m][0] = u.x, a_hi[m][2] = u.y, a_lo[m][0] = u.z, a_lo[m][2] = u.w;
        a_hi[m][1] = v.x, a_hi[m][3] = v.y, a_lo[m][1] = v.z, a_lo[m][3] = v.w;
      }
      const uint4* bk = rfrag + ks * NTILES * 32 + lane;
      uint4 b[NTILES];
#pragma unroll
      for (int n = 0; n < NTILES; ++n) b[n] = bk[n * 32];
      // Three passes over the 2 x NTILES tiles: consecutive mma are independent.
#pragma unroll
      for (int n = 0; n < NTILES; ++n)
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_f16_16816(acc[m][n], a_lo[m], b[n].x, b[n].y);
#pragma unroll
      for (int n = 0; n < NTILES; ++n)
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_f16_16816(acc[m][n], a_hi[m], b[n].z, b[n].w);
#pragma unroll
      for (int n = 0; n < NTILES; ++n)
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_f16_16816(acc[m][n], a_hi[m], b[n].x, b[n].y);
    }
    float rinv[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
      rinv[m][0] = __shfl_sync(0xffffffffu, inverse, 16 * m + rho),
      rinv[m][1] = __shfl_sync(0xffffffffu, inverse, 16 * m + rho + 8);
    __syncwarp();  // every lane done reading the split x
#pragma unroll
    for (int n = 0; n < NTILES; ++n) {
      const float2 ci = *reinterpret_cast<const float2*>(col_inverse + 8 * n + 2 * t);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        float* c = tile + (16 * m + rho) * XS + 8 * n + 2 * t;
        *reinterpret_cast<float2*>(c) = make_float2(acc[m][n][0] * rinv[m][0] * ci.x, acc[m][n][1] * rinv[m][0] * ci.y);
        *reinterpret_cast<float2*>(c + 8 * XS) =
            make_float2(acc[m][n][2] * rinv[m][1] * ci.x, acc[m][n][3] * rinv[m][1] * ci.y);
      }
    }
    __syncwarp();
    if (lane < rows) quantize_row_thread<D, KMAX>(p, tile + lane * XS, row0 + lane, k_top);
    __syncwarp();  // tile consumed
    if (tile_index + stride < tiles) load_warp_tile<D>(p, tile, (tile_index + stride) * kWarpRows, lane);
  }
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
  if (p.rotation && D <= 128) {
    if constexpr (D <= 128) {
      // Persistent: as many CTAs as fit on the device at once (each converts R once).
      static const int per_sm = [] {
        cudaFuncSetAttribute(quantize_rows_rotated_split_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             split_smem_bytes<D>());
        int n = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, quantize_rows_rotated_split_kernel<D, KMAX>, kSplitWarps * 32,
                                                      split_smem_bytes<D>());
        return n > 0 ? n : 1;
      }();
      int device = 0, sms = 0;
      cudaGetDevice(&device);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      const long warp_tiles = (p.rows + kWarpRows - 1) / kWarpRows;
      const long ctas = std::min<long>((warp_tiles + kSplitWarps - 1) / kSplitWarps, (long)per_sm * (sms > 0 ? sms : 1));
      quantize_rows_rotated_split_kernel<D, KMAX><<<(unsigned)ctas, kSplitWarps * 32, split_smem_bytes<D>(), stream>>>(p, k_top);
    }
    return;
  }
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
