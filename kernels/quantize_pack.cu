// Rotate-clip-quantise-pack kernels (see quantize_pack.h). With the clip threshold among the 32 largest magnitudes
// (clip ratio >= 1 - 32/d): one thread (d = 256: two lanes) per row (below), x.R (if any) on tensor cores first (fp16
// split with power-of-two scaling; R streamed from L2 at d = 256; with more clipped values and enough rows, the same
// x.R and then a warp per row as below). Otherwise: CTA = 8 warps, 32 rows. With a rotation the CTA first computes
// its [32, d] tile of x.R through shared memory (fp32 FMA); then each warp quantises 4 rows: a lane holds channels
// lane + 32k. The clip threshold is found exactly by counts at candidates (down from the row's largest magnitude, then
// halving), stopping once it is the extreme of what is left; every division and addition uses the _rn intrinsics (the
// library is built with --use_fast_math) so codes and metadata match the CPU quantiser bit for bit.
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
// (scale, zero) of destination row dst, as fp32 or (metadata_out_fp16) fp16: exact, the values are rounded to fp16
// already (check_quantize_pack).
__device__ __forceinline__ void store_metadata(const QuantizePackParams& p, long dst, float scale, float zero) {
  const long at = dst * p.metadata_stride + p.metadata_offset;
  if (p.metadata_out_fp16) {
    __half* meta = static_cast<__half*>(p.metadata_out) + at;
    meta[0] = __float2half_rn(scale);
    meta[1] = __float2half_rn(zero);
  } else {
    float* meta = static_cast<float*>(p.metadata_out) + at;
    meta[0] = scale;
    meta[1] = zero;
  }
}

// std::min / std::max semantics: keep the first argument on ties.
__device__ __forceinline__ float first_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float first_max(float a, float b) { return a < b ? b : a; }

// The code of a clipped value a, as the CPU quantiser computes it: a / scale correctly rounded without a division
// (Markstein: with r = RN(1/s) and q0 = RN(a r), q0 + (a - q0 s) r rounds to RN(a / s)), two rounded additions, floor,
// clamp to [0, 3].
__device__ __forceinline__ int code_of_clipped(float a, float scale, float r, float zero) {
  const float q0 = __fmul_rn(a, r);
  const float q = __fmaf_rn(__fmaf_rn(-q0, scale, a), r, q0);
  const int code = __float2int_rd(__fadd_rn(__fadd_rn(q, zero), 0.5f));
  return min(max(code, 0), 3);
}

// KMAX of the rotated thread-per-row kernels' instances that quantise a warp per row (quantize_row_warp) after their
// x.R on tensor cores: more clipped values than the thread-per-row lists hold.
constexpr int kWarpSearch = -1;

template <int D>
__device__ void quantize_row_warp(float (&v)[D / 32], const QuantizePackParams& p, long row, int k_top) {
  constexpr int NV = D / 32;
  constexpr int Q = D / 4;
  const int lane = threadIdx.x % 32;
  if (k_top > 0) {  // K = k_top = D - idx (clip_top_count, on the host), 1 <= K <= D
    // tau = the largest bit pattern T with at least K = D - idx magnitudes at or above it (non-negative floats order
    // as their bits): that is the K-th largest magnitude, the CPU's idx-th smallest, ties included. The answer lies in
    // [t, upper), with at least K magnitudes at or above t and fewer at or above upper; each step counts the row at a
    // candidate (one warp reduction) and keeps one side. The first candidates step down from the row's largest
    // magnitude by 2^3 (three exponents in the bits) until at least K lie above; then the interval is halved. The
    // search stops as soon as the answer is the smallest magnitude at or above t (count K there) or the largest below
    // upper (count K - 1): one min / max reduction then. On random rows (uniform, normal, t(3), a few 40x outliers)
    // that is 5-8 counts, against 11-14 halving the whole bit range from 2^30 (a numpy simulation). Counts: D less
    // the sign bits of bits - c (both below 2^31), one IADD and one LEA.HI per value. The kernels are issue-bound
    // here. H200, 1M rows, unrotated, clip 0.84 at d = 256 (log, fifty-fourth and fifty-fifth rounds): 1551 us with
    // all 31 bit steps, 1096 stopping early, 1036 without division in the codes, 882 with this count (41 -> 27
    // instructions per step) and a clamp without branches, 713 from the largest magnitude down. (Not kept: removing
    // extremes one at a time, a reduction each, slower from the third: d = 128, 721 us with three removed, 595
    // searching; two bits per step, the counts of three candidates in one reduction: 30-70 % slower, fifty-third
    // round; two rows per warp, their searches interleaved: 7-9 % slower, fifty-fifth round, and 22-38 % slower in the
    // tensor-core kernels' quantisers, fifty-sixth round.) The last count tells both stops (e = n - (K - 1) = 1 and
    // 0); K = D and K = 1 stop at once.
    const unsigned K = (unsigned)k_top;
    unsigned bits[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) bits[k] = __float_as_uint(fabsf(v[k]));
    auto count_below = [&](unsigned c) {
      unsigned below = 0u;
#pragma unroll
      for (int k = 0; k < NV; ++k) below += (bits[k] - c) >> 31;
      return __reduce_add_sync(0xffffffffu, below);
    };
    // b = D - n, the magnitudes below the last candidate: n >= K iff b <= kb, and the stops e = 1, 0 are b = kb,
    // kb + 1 (so the search goes on while b - kb > 1, unsigned). (Compared as b, not as n or e: with K a kernel
    // parameter, e = n - (K - 1) went through the uniform datapath and back each step; H200, 1M rows, d = 256 clip
    // 0.84: 713 -> 744 us.)
    const unsigned kb = D - K;
    constexpr unsigned kBracketStep = 3u << 23;
    unsigned t = 0u, upper = 0x80000000u, b = K == D ? kb : (K == 1u ? kb + 1u : kb + 2u);  // e = 1, 0, 2
    if (b - kb > 1u) {
      unsigned m = bits[0];
#pragma unroll
      for (int k = 1; k < NV; ++k) m = max(m, bits[k]);
      t = __reduce_max_sync(0xffffffffu, m);
      upper = t + 1u;
      for (;;) {
        const unsigned lo = t > kBracketStep ? t - kBracketStep : 0u;
        b = count_below(lo);  // (0 at 0, so this ends)
        t = lo;
        if (b <= kb) break;
        upper = lo;
        if (b == kb + 1u) break;
      }
    }
    while (b - kb > 1u && upper - t > 1u) {
      const unsigned candidate = t + ((upper - t) >> 1);
      b = count_below(candidate);
      t = b <= kb ? candidate : t;
      upper = b <= kb ? upper : candidate;
    }
    if (b == kb) {
      unsigned m = 0xffffffffu;
#pragma unroll
      for (int k = 0; k < NV; ++k) m = min(m, bits[k] >= t ? bits[k] : 0xffffffffu);
      t = __reduce_min_sync(0xffffffffu, m);
    } else if (b == kb + 1u) {
      unsigned m = 0u;
#pragma unroll
      for (int k = 0; k < NV; ++k) m = max(m, bits[k] < upper ? bits[k] : 0u);
      t = __reduce_max_sync(0xffffffffu, m);
    }
    const float tau = __uint_as_float(t);
    // std::clamp(v, -tau, tau) without branches: fmaxf / fminf order -0 below +0, so zeros keep their sign as there.
#pragma unroll
    for (int k = 0; k < NV; ++k) v[k] = fminf(fmaxf(v[k], -tau), tau);
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
  const float r = __frcp_rn(scale);
  unsigned code[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) code[k] = (unsigned)code_of_clipped(v[k], scale, r, zero);
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
  if (lane == 0) store_metadata(p, dst, scale, zero);
}

template <int D, bool ROTATE>
__global__ void __launch_bounds__(kThreads) quantize_pack_kernel(const __grid_constant__ QuantizePackParams p,
                                                                 int k_top) {
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
      quantize_row_warp<D>(v, p, row, k_top);
    }
  } else {
    extern __shared__ __align__(128) float smem[];
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
      // A fixed count of float4 loads per thread (a loop from threadIdx.x was unrolled 16 times with remainders: H200,
      // 1M rows, clip 0.7 at d = 128, 1765 -> 1637 us; log, fifty-fourth round).
      static_assert(kChunk * D % (kThreads * 4) == 0, "whole float4 loads per thread");
#pragma unroll
      for (int j = 0; j < kChunk * D / (kThreads * 4); ++j) {
        const int i = 4 * (threadIdx.x + j * kThreads);
        *reinterpret_cast<float4*>(rs + i) = __ldg(reinterpret_cast<const float4*>(p.rotation + (size_t)k0 * D + i));
      }
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
      quantize_row_warp<D>(v, p, row, k_top);
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
// d = 256: two lanes per row (quantize_row_thread's LANES = 2), 32 rows per CTA: a 33 KB tile, 6 CTAs and 12 warps
// per SM instead of 3 and 6, each lane with half the work of a row (H200, 1M rows: 588 -> 353 us, 43 -> 71.5 % of
// the read peak; the bitonic top-16 merge alone: 588 -> 520).
constexpr int kRowThreads = 64;

template <int D>
constexpr int row_lanes() {
  return D == 256 ? 2 : 1;
}
template <int D>
constexpr int row_tile_rows() {
  return kRowThreads / row_lanes<D>();
}
template <int D>
constexpr int row_tile_bytes() {
  return row_tile_rows<D>() * (D + 4) * (int)sizeof(float);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// Stores WORDS 4-byte words of one row's packed codes (Q bytes) from byte `offset` on, as 16-byte
// words, and, if asked, its metadata.
template <int Q, int WORDS>
__device__ __forceinline__ void store_row_codes(const QuantizePackParams& p, long row, int offset,
                                                const uint32_t (&packed)[WORDS], bool metadata, float scale,
                                                float zero) {
  const long dst = p.destination_rows ? p.destination_rows[row] : row;
  uint8_t* out = p.codes + dst * Q + offset;
#pragma unroll
  for (int w = 0; w < WORDS; w += 4)
    *reinterpret_cast<uint4*>(out + 4 * w) = make_uint4(packed[w], packed[w + 1], packed[w + 2], packed[w + 3]);
  if (metadata) store_metadata(p, dst, scale, zero);
}
// All Q bytes of one row's codes and its metadata (thread per row).
template <int Q>
__device__ __forceinline__ void store_row_thread(const QuantizePackParams& p, long row, const uint32_t (&packed)[Q / 4],
                                                 float scale, float zero) {
  store_row_codes<Q, Q / 4>(p, row, 0, packed, true, scale, zero);
}

// One row of fp32 values in shared memory, read in 16-byte chunks (chunk i = columns 4i .. 4i + 3). Padded tile
// rows (d + 4 floats apart; the d = 128 hand-over tiles: see handover_row_offset) make the 16-byte reads of the rows
// of a load phase at one column conflict-free.
struct PaddedRow {
  const float* x;
  __device__ __forceinline__ float4 chunk(int i) const { return *reinterpret_cast<const float4*>(x + 4 * i); }
  __device__ __forceinline__ float at(int c) const { return x[c]; }
};
// Unpadded tile rows (the d = 128 split kernel, where the padding does not fit): chunk i stored at chunk i ^ key,
// key = swizzle_key(row), a permutation of row % 8, so the same chunk of eight consecutive rows lies in eight
// distinct bank groups. (Bits 0 and 1 of row % 8 swapped: the split kernel's scale-back stores 8-byte pairs of
// chunks 2n, 2n + 1 of rows 0, 4, 1, 5 (or 2, 6, 3, 7) per half-warp, whose keys then differ above bit 0: no
// conflict; with key = row % 8, rows 0 and 1 hit the same bank group, 4 wavefronts instead of 2 per store.)
__device__ __forceinline__ int swizzle_key(int row) { return (row & 4) | (row & 1) << 1 | (row >> 1 & 1); }
// (Used by the mma.sync path only: sm_90a builds, whose d = 128 kernel takes the wgmma path, do not reference it.)
#pragma nv_diag_suppress 177
struct SwizzledRow {
  const float* x;
  int key;  // swizzle_key(row)
  __device__ __forceinline__ float4 chunk(int i) const {  // (i / 8 apart: one address per i % 8, offsets for i / 8)
    return *reinterpret_cast<const float4*>(x + 32 * (i / 8) + 4 * ((i % 8) ^ key));
  }
  __device__ __forceinline__ float at(int c) const { return x[4 * ((c / 4) ^ key) + c % 4]; }
};
#pragma nv_diag_default 177

// Quantises row `row` of the batch from its fp32 values x[0..D) in shared memory (thread per row): the
// plain form, one division per value. quantize_row_thread (below) takes it for the rare rows whose
// code thresholds it cannot express; the two agree bit for bit.
template <int D, int KMAX, class Row>
__device__ __forceinline__ void quantize_row_thread_plain(const QuantizePackParams& p, Row x, long row, int k_top) {
  constexpr int Q = D / 4;
  // (1) min / max of the row and, when clipping, the top-KMAX magnitudes (descending; -1 = empty) by
  // a branch-free insertion (the 32 rows of a warp would diverge anyway): 2 KMAX + 2 ops per value.
  float tau = INFINITY, lo = x.at(0), hi = x.at(0);
  float best[KMAX > 0 ? KMAX : 1];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) best[i] = -1.f;
#pragma unroll 4
  for (int c = 0; c < D; c += 4) {
    const float4 v4 = x.chunk(c / 4);
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
    mn = mx = clip(x.at(0));
    for (int c = 1; c < D; ++c) mn = first_min(mn, clip(x.at(c))), mx = first_max(mx, clip(x.at(c)));
  }
  const float scale = group_scale(mn, mx, p.metadata);
  const float zero = round_metadata(__fdiv_rn(-mn, scale), p.metadata);
  // (3) codes (code_of_clipped); channel c -> byte c % Q, bits 2 (c / Q).
  const float r = __frcp_rn(scale);
  uint32_t packed[Q / 4];
#pragma unroll
  for (int w = 0; w < Q / 4; ++w) packed[w] = 0u;
#pragma unroll
  for (int c = 0; c < D; c += 4) {
    const float4 v4 = x.chunk(c / 4);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int code = code_of_clipped(clip(v[e]), scale, r, zero);
      const int ch = c + e, byte = ch % Q;
      packed[byte / 4] += (uint32_t)code << (8 * (byte % 4) + 2 * (ch / Q));
    }
  }
  store_row_thread<Q>(p, row, packed, scale, zero);
}

// (A reference into a kernel's parameters, taken by this call that is not inlined, makes the kernel copy them to
// local memory and read them back from there on its hot path unless they are __grid_constant__: 167 -> 152 us for
// the unrotated d = 128 kernel. For the rotated split kernel it did not pay at 16 warps and 128 registers (363 ->
// 369-372 us, later within noise); at 20 warps and 96 registers the copy cost 96 bytes of stack and spills: 347
// -> 344 us at d = 128, 148 -> 145 at d = 64.)
template <int D, int KMAX, class Row>
__device__ __noinline__ void quantize_row_thread_fallback(const QuantizePackParams& p, Row x, long row, int k_top) {
  quantize_row_thread_plain<D, KMAX>(p, x, row, k_top);
}

// ---------------------------------------------------------------- thread-per-row quantiser, fewer instructions
// The same codes and metadata as quantize_row_thread_plain, with far fewer instructions per value
// (the rotated kernel is bound by instruction issue, the top-K network on the half-rate ALU pipe first):
// - min / max and the clip threshold: each group of 8 values gives its min and max (the row's min /
//   max follow, and the group's largest |x| = max(max, -min)); the K-th largest of the D/8 group
//   maxima is a lower bound on tau (K groups hold values at or above it), so every value >= tau lies
//   in a group whose maximum reaches the bound: tau is the K-th largest |x| of those groups alone
//   (K of them unless ties, on every lane), 8 values at a time through sorting networks. Exact by
//   construction.
// - codes: the code is a non-decreasing function of v (clip, a correctly rounded division, two
//   rounded additions, floor, clamp), so code(v) >= j iff v >= T_j for the smallest such float T_j.
//   T_j is found per row by inverting the three roundings one at a time (in double, where each
//   boundary is exact or within one float step) and checked against the code itself at T_j and at the
//   float below it. Then, with p the float below T_j (no value lies strictly between, values being
//   normal or zero), saturate(v / (T_j - p) - p / (T_j - p)) is exactly [v >= T_j]: one FFMA with
//   saturation per threshold, three per value, and the sum is packed with FFMA too (fp32 pipe, not
//   the ALU). Rows whose thresholds sit in the subnormal range (or fail the check) take the plain path.
__device__ __forceinline__ float float_pred(float x) {  // the next float below x (-0 and +0 are one point)
  const int b = __float_as_int(x);
  return x == 0.f ? __int_as_float(0x80000001) : __int_as_float(b > 0 ? b - 1 : b + 1);
}
__device__ __forceinline__ float float_succ(float x) {  // the next float above x
  const int b = __float_as_int(x);
  return x == 0.f ? __int_as_float(1) : __int_as_float(b > 0 ? b + 1 : b - 1);
}

// RU(x) as a float, subnormal results kept: the plain conversion. (__double2float_ru under the library's flush to
// zero costs a double compare, two selects and a multiplication more per conversion, on the chains of the code
// thresholds.) Where the thresholds go unchecked (see code_threshold_finish) q and t are normal, so the results
// are the same; elsewhere the check below runs on whatever comes out.
__device__ __forceinline__ float double_to_float_ru(double x) {
  float f;
  asm("cvt.rp.f32.f64 %0, %1;" : "=f"(f) : "d"(x));
  return f;
}

// x as a double, subnormal inputs kept: the plain conversion (the library's flush to zero adds a multiplication by 1
// before each one). The chains below convert only normal floats or zero, except a subnormal zero point, for which
// code_threshold_finish's argument holds flushed or not.
__device__ __forceinline__ double float_to_double(float x) {
  double d;
  asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(x));
  return d;
}

// saturate(RN(a b + c)) in one FFMA.SAT (the intrinsics would not fuse the saturation).
__device__ __forceinline__ float fma_saturate(float a, float b, float c) {
  float d;
  asm("fma.rn.ftz.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

// The code of one value, exactly as quantize_row_thread_plain computes it (clip at tau; INFINITY: none).
__device__ __forceinline__ int code_of(float v, float tau, float scale, float r, float zero) {
  return code_of_clipped(fminf(fmaxf(v, -tau), tau), scale, r, zero);
}

// (b, c) with saturate(v b + c) = 1 iff code_of(v) >= j = i + 1 (i = 0, 1, 2: the threshold, a run-time value
// when two lanes share the thresholds), for every row value v (code_low / code_high: the codes of the row's min
// / max); ok becomes false if the threshold cannot be expressed so (the caller takes the plain path).
// In two parts, so that a caller can interleave the double-precision chains of two or three thresholds (the first
// part, straight-line code) before the branches of the second: t and the float below it, then (b, c).
__device__ __forceinline__ void code_threshold_candidate(int i, float scale, float zero, float& t_out, float& below_out) {
  // code >= j iff w = RN(q + zero) >= W_j = 0.5 - 2^-25, 1.5, 2.5 (floor(RN(w + 0.5)) >= j), so iff
  // q + zero >= the midpoint below W_j (a tie rounds to even: W_1 is odd, W_2 and W_3 even).
  const double mid_below_w = i == 0 ? 0.5 - 3 * 0x1p-26 : (i == 1 ? 1.5 - 0x1p-24 : 2.5 - 0x1p-23);
  const bool w_odd = i == 0;
  const double zero_d = float_to_double(zero), scale_d = float_to_double(scale);
  // The smallest float q reaching it, then the smallest v with RN(v / scale) >= q: v / scale >= the
  // midpoint below q (exact in double).
  const double q_real = mid_below_w - zero_d;
  float q = double_to_float_ru(q_real);
  const double q_d = float_to_double(q);
  if (w_odd && q_d == q_real) q = float_succ(q);
  const double v_real = 0.5 * (float_to_double(float_pred(q)) + float_to_double(q)) * scale_d;
  float t = double_to_float_ru(v_real);
  if ((__float_as_int(q) & 1) && float_to_double(t) == v_real) t = float_succ(t);
  t_out = t, below_out = float_pred(t);
}
__device__ __forceinline__ void code_threshold_finish(int i, float t, float below, float tau, float scale, float r,
                                                      float zero, int code_low, int code_high, float& b, float& c,
                                                      bool& ok) {
  const int j = i + 1;
  bool exact = true;
  // Where 2^-40 <= scale <= 2^60 and |zero| < 2^26, t is the threshold without a check. (1) q: M = the midpoint
  // below W_j is a midpoint between floats at least 2^-26 from both; q_real = M - zero is exact in double for
  // 2^-27 <= |zero| < 2^26 (M is a multiple of 2^-26: multiples of 2^-26 below 2^27, or of 2^-50 below 2^3) and
  // for zero = 0, and for |zero| < 2^-27 (flushed or not) lies strictly between the two floats around M, as M -
  // zero does: q is the smallest float with RN(q + zero) >= W_j, and |q| >= 2^-26. (2) v_real: pred(q) + q has
  // <= 26 bits, times scale <= 50 bits: exact, so t is the smallest float with v / scale reaching the midpoint
  // below q (strictly when q is odd), i.e. with RN(v / scale) >= q, 2^-67 <= |t| < 2^87. (3) code_of at t and
  // below: the clip leaves them (tau >= t > clip(lo) >= -tau when code_low < j <= code_high), r = RN(1 / scale)
  // and q0 are normal, the residual v - q0 scale a non-zero multiple of 2^-114 or 0: nothing flushed, so
  // code_of's division is RN(v / scale) (Markstein, as in the plain path) and code_of(t) >= j > code_of(below).
  // Elsewhere: the exact check at t and at the float below it, with one float step of slack either way (a
  // boundary rounded in double, or a flushed subnormal).
  if (!(scale >= 0x1p-40f && scale <= 0x1p60f && fabsf(zero) < 0x1p26f)) {
    int code_t = code_of(t, tau, scale, r, zero), code_below = code_of(below, tau, scale, r, zero);
    if (code_t < j) {
      below = t, code_below = code_t, t = float_succ(t);
      code_t = code_of(t, tau, scale, r, zero);
    } else if (code_below >= j) {
      t = below, code_t = code_below, below = float_pred(t);
      code_below = code_of(below, tau, scale, r, zero);
    }
    if (t == 0.f) below = -0x1p-126f, code_below = code_of(below, tau, scale, r, zero);  // no row value between
    exact = (fabsf(t) >= 0x1p-125f || t == 0.f) && code_t >= j && code_below < j;
  }
  const float step = __fsub_rn(t, below);  // a power of two (exact unless flushed)
  exact = exact && step >= 0x1p-126f;
  b = __int_as_float(0x7f000000 - __float_as_int(step));  // 1 / step
  c = __fmul_rn(-below, b);  // an integer below 2^25: (v - below) b is exact in the FFMA
  if (code_low >= j) b = 0.f, c = 1.f;        // every value
  else if (code_high < j) b = 0.f, c = -1.f;  // none
  else ok = ok && exact;
}

// Sorts v descending with a sorting network (N = 4, 6, 8: 5, 12, 19 comparators; checked on all 0/1 inputs).
template <int N>
__device__ __forceinline__ void sort_descending(float (&v)[N]) {
  auto ce = [&](int i, int j) {
    const float hi = fmaxf(v[i], v[j]), lo = fminf(v[i], v[j]);
    v[i] = hi, v[j] = lo;
  };
  if constexpr (N == 4) {
    ce(0, 1), ce(2, 3), ce(0, 2), ce(1, 3), ce(1, 2);
  } else if constexpr (N == 6) {
    ce(0, 5), ce(1, 3), ce(2, 4), ce(1, 2), ce(3, 4), ce(0, 3), ce(2, 5), ce(0, 1), ce(2, 3), ce(4, 5), ce(1, 2), ce(3, 4);
  } else {
    static_assert(N == 8, "networks for 4, 6 and 8 values");
    ce(0, 2), ce(1, 3), ce(4, 6), ce(5, 7), ce(0, 4), ce(1, 5), ce(2, 6), ce(3, 7), ce(0, 1), ce(2, 3), ce(4, 5), ce(6, 7);
    ce(2, 4), ce(3, 5), ce(1, 4), ce(3, 6), ce(1, 2), ce(3, 4), ce(5, 6);
  }
}
// Sorts v descending when it is non-increasing, then non-decreasing: max(a[i], b[N - 1 - i]) of two descending lists
// a, b, whose sorted result is their top N. A bitonic merge (half-cleaners at distances N/2, .., 1; N = 6: of
// {+inf, +inf, v}, the comparators with an infinity dropped): 4, 7, 12 comparators for N = 4, 6, 8 instead of a
// full network's 5, 12, 19 (checked against a full sort on all such inputs of values 0..4).
template <int N>
__device__ __forceinline__ void sort_v_shaped_descending(float (&v)[N]) {
  auto ce = [&](int i, int j) {
    const float hi = fmaxf(v[i], v[j]), lo = fminf(v[i], v[j]);
    v[i] = hi, v[j] = lo;
  };
  if constexpr (N == 4) {
    ce(0, 2), ce(1, 3), ce(0, 1), ce(2, 3);
  } else if constexpr (N == 6) {
    ce(0, 4), ce(1, 5), ce(2, 4), ce(3, 5), ce(0, 1), ce(2, 3), ce(4, 5);
  } else {
    static_assert(N == 8, "networks for 4, 6 and 8 values");
    ce(0, 4), ce(1, 5), ce(2, 6), ce(3, 7), ce(0, 2), ce(1, 3), ce(4, 6), ce(5, 7), ce(0, 1), ce(2, 3), ce(4, 5), ce(6, 7);
  }
}
// Sorts a bitonic v (descending then ascending, or for N a power of two also the reverse) descending: half-cleaners at
// distances P/2, .., 1 over P = the next power of two, v taken as the last N of P entries after P - N entries of +inf,
// which keep the first places, so that every comparator on them is dropped (N = 16: 32 comparators; 12: 20).
template <int N>
__device__ __forceinline__ void bitonic_merge_descending(float (&v)[N]) {
  constexpr int P = N <= 8 ? 8 : (N <= 16 ? 16 : 32), PAD = P - N;
  static_assert(N <= P && P <= 32, "up to 32 values");
#pragma unroll
  for (int s = P / 2; s > 0; s /= 2)
#pragma unroll
    for (int u = PAD; u < P; ++u)
      if (!(u & s)) {
        const int i = u - PAD;
        const float hi = fmaxf(v[i], v[i + s]), lo = fminf(v[i], v[i + s]);
        v[i] = hi, v[i + s] = lo;
      }
}

// LANES = 1: the thread quantises its row alone. LANES = 2: lanes l and l ^ 16 share the row, each
// taking the half [h D/2, (h + 1) D/2) of its columns (h = 1 for the upper lane) in the passes over
// the values and half of the candidate groups of the threshold search (lists and masks exchanged by
// shuffles, merged alike on both lanes); both compute the metadata, the code thresholds are shared out (one
// each, one on both) and each stores half of the codes. Every lane of the warp must call it (store = false: a
// row past the end, quantised but not stored), and with LANES = 2 the caller must reconverge the warp
// (__syncwarp or a CTA barrier) before its next full-warp operation: a row whose thresholds go to the fallback
// keeps its lower lane there after the other lanes have returned.
template <int D, int KMAX, int LANES = 1, class Row>
__device__ __forceinline__ void quantize_row_thread(const QuantizePackParams& p, Row x, long row, int k_top,
                                                    bool store = true) {
  static_assert(LANES == 1 || LANES == 2, "one or two lanes per row");
  constexpr int Q = D / 4, G = D / 8, GL = G / LANES;  // groups of 8 values per lane
  const int half = LANES == 2 ? (int)(threadIdx.x % 32) / 16 : 0;
  const int first_chunk = half * (D / LANES / 4);  // this lane's columns
  unsigned pairs = 0xffffffffu;  // the lanes taking part in the exchanges
  auto partner = [&pairs](auto v) { return __shfl_xor_sync(pairs, v, 16); };
  // (1) min / max and the group maxima of |x|.
  float lo, hi, group_abs[GL];
#pragma unroll
  for (int g = 0; g < GL; ++g) {
    const float4 a = x.chunk(first_chunk + 2 * g), b = x.chunk(first_chunk + 2 * g + 1);
    const float gmax = fmaxf(fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)), fmaxf(fmaxf(b.x, b.y), fmaxf(b.z, b.w)));
    const float gmin = fminf(fminf(fminf(a.x, a.y), fminf(a.z, a.w)), fminf(fminf(b.x, b.y), fminf(b.z, b.w)));
    lo = g == 0 ? gmin : fminf(lo, gmin);
    hi = g == 0 ? gmax : fmaxf(hi, gmax);
    group_abs[g] = fmaxf(gmax, -gmin);
  }
  if constexpr (LANES == 2) lo = fminf(lo, partner(lo)), hi = fmaxf(hi, partner(hi));  // (a zero's sign: below)
  float tau = INFINITY;
  if constexpr (KMAX > 0) {
    // Top-KMAX magnitudes (descending; -1 = empty) by branch-free sorting networks.
    static_assert(KMAX == 4 || KMAX == 6 || KMAX == 8 || KMAX == 12 || KMAX == 16 || KMAX == 32, "list lengths");
    float best[KMAX];
    // Eight values at once: sorted by a network, then the top KMAX of best and of them are
    // max(best[i], s[KMAX - 1 - i]) (the first step of a bitonic merge), sorted by the rest of that merge
    // (sort_v_shaped_descending, c = 4, 7, 12 comparators for KMAX = 4, 6, 8): 2 (19 + KMAX / 2 + c) min / max
    // instead of 16 KMAX (KMAX = 6: 58 against 96).
    // first: best is empty, so the top KMAX are v's own (the values are >= 0: the -1 of an empty entry never wins);
    // the two lanes' lists are merged alike, without sorting the partner's sorted list again. (H100, 1M rows, d = 128
    // rotated: 326-328 -> 317 us, about 170 min / max fewer per lane and row; checked against the former
    // code on 2M emulated rows, ties and zeros included: the same tau bit for bit.)
    auto insert8 = [&](float4 a, float4 b, bool absolute, bool first = false) {
      float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      if constexpr (KMAX == 4 || KMAX == 6 || KMAX == 8) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = absolute ? fabsf(v[i]) : v[i];
        sort_descending<8>(v);
        if (first) {
#pragma unroll
          for (int i = 0; i < KMAX; ++i) best[i] = v[i];
        } else {
#pragma unroll
          for (int i = 0; i < KMAX; ++i) best[i] = fmaxf(best[i], v[KMAX - 1 - i]);
          sort_v_shaped_descending<KMAX>(best);
        }
      } else if constexpr (KMAX == 12 || KMAX == 16 || KMAX == 32) {
        // max(best[i], v[KMAX - 1 - i]) (v[j] = -1 for j >= 8: best[0..KMAX - 9] unchanged) is the top KMAX,
        // non-increasing and then non-decreasing (best minus the reversed v is non-increasing): a bitonic merge sorts
        // it. 2 (19 + 8 + c) min / max, c = 20, 32, 80 for KMAX = 12, 16, 32 (an insertion: 16 KMAX).
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = absolute ? fabsf(v[i]) : v[i];
        sort_descending<8>(v);
#pragma unroll
        for (int i = KMAX - 8; i < KMAX; ++i) best[i] = fmaxf(best[i], v[KMAX - 1 - i]);
        bitonic_merge_descending<KMAX>(best);
      }
    };
    // Two lanes: the partner's sorted list joins this one (as in insert8); both lanes end with the same sorted values.
    // (Padding the lower lane's list with KMAX - k_top entries of +inf, so that union_kth could take any k_top without
    // this merge, made the d = 128 rotated kernel 5-14 % slower at k_top = 16 and 32 and 2-3 % faster at 11, both with
    // the lists copied and with each candidate folded in as it arrives: log, fifty-second round.)
    auto merge_partner = [&] {
      if constexpr (LANES == 2) {
        float other[KMAX];
#pragma unroll
        for (int i = 0; i < KMAX; ++i) other[i] = partner(best[i]);
#pragma unroll
        for (int i = 0; i < KMAX; ++i) best[i] = fmaxf(best[i], other[KMAX - 1 - i]);
        if constexpr (KMAX >= 12) bitonic_merge_descending<KMAX>(best);  // the top KMAX of both is bitonic
        else sort_v_shaped_descending<KMAX>(best);
      }
    };
    auto kth = [&] {  // best[k_top - 1] without a run-time index
      float v = INFINITY;
#pragma unroll
      for (int i = 0; i < KMAX; ++i) v = fminf(v, i < k_top ? best[i] : INFINITY);
      return v;
    };
    // The k_top-th largest of this lane's list and (two lanes) the partner's. When k_top = KMAX, without merging the
    // lists: the best KMAX values of two descending lists a, b are the top i of a and the top KMAX - i of b for some
    // i, so the KMAX-th largest is max over i = 0..KMAX of min(a[i - 1], b[KMAX - 1 - i]) (a[-1] = b[-1] = +inf):
    // KMAX = 6: 11 min / max instead of the merge's 20 and kth's 6 and 6 selects. (The candidates' max by a tree: a
    // chain would be KMAX deep.)
    auto union_kth = [&] {
      if constexpr (LANES == 2) {
        if (k_top == KMAX) {
          float other[KMAX], c[KMAX + 1];
#pragma unroll
          for (int i = 0; i < KMAX; ++i) other[i] = partner(best[i]);
          c[0] = other[KMAX - 1], c[KMAX] = best[KMAX - 1];
#pragma unroll
          for (int i = 1; i < KMAX; ++i) c[i] = fminf(best[i - 1], other[KMAX - 1 - i]);
#pragma unroll
          for (int s = 1; s <= KMAX; s *= 2)
#pragma unroll
            for (int i = 0; i + s <= KMAX; i += 2 * s) c[i] = fmaxf(c[i], c[i + s]);
          return c[0];
        }
        merge_partner();
      }
      return kth();
    };
#pragma unroll
    for (int i = 0; i < KMAX; ++i) best[i] = -1.f;
#pragma unroll
    for (int g = 0; g < GL; g += 8)
      insert8(make_float4(group_abs[g], group_abs[g + 1], group_abs[g + 2], group_abs[g + 3]),
              make_float4(group_abs[g + 4], group_abs[g + 5], group_abs[g + 6], group_abs[g + 7]), false, g == 0);
    const float bound = union_kth();  // <= tau
    unsigned groups = 0;  // bit g: group g of the row (lane h's groups at bits h GL ..)
#pragma unroll
    for (int g = 0; g < GL; ++g) groups |= (group_abs[g] >= bound ? 1u : 0u) << g;
    int spare = -1;  // a group below the bound (two lanes; -1: none)
    if constexpr (LANES == 2) {
      groups <<= half * GL;
      groups |= partner(groups);
      spare = __ffs(~groups) - 1;
      // Lane h takes the candidates of rank h, h + 2, ..: rank parity from the prefix parity of the mask.
      unsigned below = groups << 1;
      below ^= below << 1, below ^= below << 2, below ^= below << 4, below ^= below << 8, below ^= below << 16;
      groups &= half ? below : ~below;
    }
#pragma unroll
    for (int i = 0; i < KMAX; ++i) best[i] = -1.f;
    if constexpr (LANES == 2 && KMAX <= 8) {
      // Without ties there are k_top candidate groups, so each lane takes at most U = ceil(KMAX / 2) when k_top >=
      // KMAX - 1: U of them without a loop, so that their loads and sorting networks overlap (a lane with fewer takes
      // the spare group, which exists then (fewer than 2 U <= 8 of the row's >= 8 groups are candidates) and whose
      // values, all below the bound, cannot change the k_top-th largest: the candidates hold k_top values at or above
      // it). The rest, if any (ties), in the loop below.
      constexpr int U = (KMAX + 1) / 2;
      float4 lo4[U], hi4[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = groups ? __ffs(groups) - 1 : spare;
        groups &= groups - 1;
        lo4[u] = x.chunk(2 * g), hi4[u] = x.chunk(2 * g + 1);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) insert8(lo4[u], hi4[u], true, u == 0);
    } else if (groups) {  // the first candidate group fills the empty list
      const int g = __ffs(groups) - 1;
      groups &= groups - 1;
      insert8(x.chunk(2 * g), x.chunk(2 * g + 1), true, true);
    }
    while (groups) {
      const int g = __ffs(groups) - 1;
      groups &= groups - 1;
      insert8(x.chunk(2 * g), x.chunk(2 * g + 1), true);
    }
    tau = union_kth();
  }
  auto clip = [&](float v) { return KMAX > 0 ? fminf(fmaxf(v, -tau), tau) : v; };
  float mn = clip(lo), mx = clip(hi);
  if (mn == 0.f || mx == 0.f) {  // std::min / std::max keep the first of equal values: the sign of a zero
    mn = mx = clip(x.at(0));
    for (int c = 1; c < D; ++c) mn = first_min(mn, clip(x.at(c))), mx = first_max(mx, clip(x.at(c)));
  }
  const float scale = group_scale(mn, mx, p.metadata);
  const float zero = round_metadata(__fdiv_rn(-mn, scale), p.metadata);
  const float r = __frcp_rn(scale);
  // (2) the three code thresholds, then codes = the number of thresholds reached.
  const int code_low = code_of(lo, tau, scale, r, zero), code_high = code_of(hi, tau, scale, r, zero);
  float tb[3], tc[3];
  bool thresholds = true;
  if constexpr (LANES == 1) {  // three independent chains, side by side
    float t[3], below[3];
#pragma unroll
    for (int i = 0; i < 3; ++i) code_threshold_candidate(i, scale, zero, t[i], below[i]);
#pragma unroll
    for (int i = 0; i < 3; ++i)
      code_threshold_finish(i, t[i], below[i], tau, scale, r, zero, code_low, code_high, tb[i], tc[i], thresholds);
  } else {  // the warp runs two chains, not three: j = 1 (lower lane) or 3 (upper), exchanged, and j = 2 on both
    float b_own, c_own, t_own, below_own, t_2, below_2;
    code_threshold_candidate(2 * half, scale, zero, t_own, below_own);
    code_threshold_candidate(1, scale, zero, t_2, below_2);
    code_threshold_finish(2 * half, t_own, below_own, tau, scale, r, zero, code_low, code_high, b_own, c_own,
                          thresholds);
    code_threshold_finish(1, t_2, below_2, tau, scale, r, zero, code_low, code_high, tb[1], tc[1], thresholds);
    const float b_other = partner(b_own), c_other = partner(c_own);
    tb[0] = half ? b_other : b_own, tc[0] = half ? c_other : c_own;
    tb[2] = half ? b_own : b_other, tc[2] = half ? c_own : c_other;
    const unsigned own = __ballot_sync(0xffffffffu, thresholds);
    pairs = own & (own >> 16 | own << 16);  // rows whose thresholds both lanes could express
    thresholds = pairs >> (threadIdx.x % 32) & 1u;
  }
  if (!thresholds) {
    if (store && half == 0) quantize_row_thread_fallback<D, KMAX>(p, x, row, k_top);
    return;
  }
  const float b1 = tb[0], c1 = tc[0], b2 = tb[1], c2 = tc[1], b3 = tb[2], c3 = tc[2];
  // Channel c -> byte c % Q, bits 2 (c / Q); two bytes per float accumulator, which starts at 2^23: 2^23 + n
  // (n < 2^16, exact) holds n in its low 16 bits, with no addition after the sums.
  // (Two lanes: the upper half's bits are the lower half's shifted by 4, added after the packing.)
  float byte_pairs[Q / 2];
#pragma unroll
  for (int h = 0; h < Q / 2; ++h) byte_pairs[h] = 0x1p23f;
#pragma unroll
  for (int c = 0; c < D / LANES; c += 4) {
    const float4 v4 = x.chunk(first_chunk + c / 4);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ch = c + e, byte = ch % Q;
      const float weight = (float)(1u << (8 * (byte % 2) + 2 * (ch / Q)));
      float& acc = byte_pairs[byte / 2];  // exact integers below 2^24: plain arithmetic may fold the weights
      acc = fmaf(fma_saturate(v[e], b1, c1), weight, acc);
      acc = fmaf(fma_saturate(v[e], b2, c2), weight, acc);
      acc = fmaf(fma_saturate(v[e], b3, c3), weight, acc);
    }
  }
  uint32_t packed[Q / 4];
#pragma unroll
  for (int w = 0; w < Q / 4; ++w)
    packed[w] = __byte_perm(__float_as_uint(byte_pairs[2 * w]), __float_as_uint(byte_pairs[2 * w + 1]), 0x5410);
  if constexpr (LANES == 1) {
    if (store) store_row_thread<Q>(p, row, packed, scale, zero);
  } else {  // lane h stores words [h Q/8, (h + 1) Q/8), the partner's bits added
    uint32_t mine[Q / 8];
#pragma unroll
    for (int w = 0; w < Q / 8; ++w) {
      const uint32_t lower = packed[w], upper = packed[Q / 8 + w];
      const uint32_t sent = partner(half ? lower << 4 : upper);  // to the lane that stores it
      mine[w] = half ? (upper << 4) + sent : lower + sent;
    }
    if (store) store_row_codes<Q, Q / 8>(p, row, half * (Q / 2), mine, half == 0, scale, zero);
  }
}

template <int D, int KMAX>
__global__ void __launch_bounds__(kRowThreads) quantize_rows_kernel(const __grid_constant__ QuantizePackParams p, int k_top) {
  constexpr int XS = D + 4, LANES = row_lanes<D>(), ROWS = row_tile_rows<D>();
  extern __shared__ __align__(128) float tile[];  // [ROWS][D + 4]
  const long row0 = (long)blockIdx.x * ROWS;
  const int rows = (int)min((long)ROWS, p.rows - row0);
  for (int i = threadIdx.x; i < rows * (D / 4); i += kRowThreads) {
    const int r = i / (D / 4), c = i % (D / 4);
    cp_async16(tile + r * XS + 4 * c, p.input + (row0 + r) * D + 4 * c);
  }
  if constexpr (LANES == 2)  // rows past the end of a warp that has some: zeros, quantised but not stored
    for (int i = rows * (D / 4) + threadIdx.x; i < ROWS * (D / 4); i += kRowThreads) {
      const int r = i / (D / 4), c = i % (D / 4);
      *reinterpret_cast<float4*>(tile + r * XS + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  if constexpr (LANES == 1) {
    if ((int)threadIdx.x >= rows) return;
    quantize_row_thread<D, KMAX>(p, PaddedRow{tile + threadIdx.x * XS}, row0 + threadIdx.x, k_top);
  } else {  // lanes r and r + 16 of a warp share row r of its 16 (every lane of the warp takes part)
    const int first = (int)(threadIdx.x / 32) * 16, r = first + (int)threadIdx.x % 16;
    if (first >= rows) return;
    quantize_row_thread<D, KMAX, 2>(p, PaddedRow{tile + r * XS}, row0 + r, k_top, r < rows);
  }
}

// ---------------------------------------------------------------- rotated path: fp16 split, warp pipelines
// d <= 128. Persistent CTAs (one per SM at d = 128, two at d = 64) convert R once: each column is scaled
// by a power of two 2^c_n (max |R[:, n]| in [2^13, 2^14); when all c_n lie within 7 of one another, every
// column takes the smallest) and split as R = R_hi + R_lo, both fp16 (R_lo the fp16 of the exact fp32
// remainder), stored in the B-fragment order of mma.sync m16n8k16 (one 16-byte load per lane, k-step and
// n-tile) or, for wgmma, as K-major core matrices. Then every warp runs its own pipeline over ROWS-row
// tiles, with no CTA barrier: cp.async of the [ROWS, d] tile; each row is scaled by a power of two 2^r_i
// (sum |x_i| in [2^13, 2^14), so max |x_i| in [2^6, 2^14)) and split in place the same way, written as the
// A fragments themselves (see the split below); x.R = hi.hi + hi.lo + lo.hi with fp32 accumulation (the
// lo.lo term and the rounding of the lo parts are ~2^-22 relative; fp16 range problems are scaled away,
// no orthogonality assumed), scaled back exactly by 2^-r_i 2^-c_n (one multiplication when the column
// shifts are one) into the tile; then the rows are quantised (quantize_row_thread; with more than 32 clipped values,
// KMAX = kWarpSearch, a warp per row: quantize_row_warp). Independent warps
// overlap one another's loads, tensor-core work and quantiser.
// d = 128 (the quantiser, not the tensor cores, sets the pace: with 32-row tiles and 8 warps, 2 per scheduler, 0.54
// were eligible): 16-row tiles, 20 warps (5 per scheduler) at <= 96 registers, two lanes per row in the quantiser,
// unpadded tiles (split_tile_swizzled), and x.R on wgmma (sm_90a builds, kernels/CMakeLists.txt): one wgmma m64n128k16
// per k-step and term for a 64-row group tile, R_hi / R_lo from shared memory (no per-warp B loads: 16-row tiles on
// mma.sync would read all of R per 16 rows; measured 470 against 430 us). The warpgroups specialise (kProducerGroups,
// below): two split x, run the wgmma and scale x.R back into the tiles of three that quantise, so that no warp waits
// for the tensor cores or for the three others of its warpgroup before quantising (349-352 -> 333-335 us; all 20 warps
// running every stage: 343-345). The producers split x straight into the A fragments (registers) and take registers
// from the consumers (setmaxnreg: 120 and 80 of the launch's 96): the split x written to shared memory as the A operand
// cost the multiprocessor's shared-memory pipe ~10 of its ~48 wavefronts per row (ncu), and A from registers at 96
// registers made ptxas serialise the wgmma (C7511 / C7512). H200, 1M rows, interleaved, five rounds: 294.9 -> 273.7 us.
// d = 64: 32-row tiles, 8 warps, two CTAs per SM, mma.sync, one lane per row (wgmma measured 0.8 % slower there).
// Bank conflicts (mma.sync): the k order inside a k-step is free (A and B permuted alike): lane (g, t) reads k
// 4t..4t+3 of its row pair with one 16-byte load for hi and one for lo, and fragment row g is tile row
// rho(g) = g / 2 + 4 (g % 2) (also free), so 8 consecutive lanes hit 8 distinct 16-byte bank groups
// with the row stride of d + 4 floats (which the thread-per-row passes need).
// (Warps come in fours: 9 warps of 32 rows at d = 128 left one scheduler with 3: 543 against 451 us.)
template <int D>
constexpr int split_warp_rows() {
  return D == 128 ? 16 : 32;
}
template <int D>
constexpr int split_warps() {
  return D == 128 ? 20 : 8;
}
// The warps' tiles: d = 64, rows of d + 4 floats; d = 128, rows of d floats with swizzled 16-byte chunks
// (SwizzledRow; 20 padded tiles and R would not fit in shared memory).
template <int D>
constexpr bool split_tile_swizzled() {
  return D == 128;
}
template <int D>
constexpr int split_row_floats() {
  return split_tile_swizzled<D>() ? D : D + 4;
}
// Offset (floats) of chunk `chunk` (columns 4 chunk .. 4 chunk + 3) of row `row` in a warp's tile.
template <int D>
__device__ __forceinline__ int split_tile_offset(int row, int chunk) {
  return row * split_row_floats<D>() + 4 * (split_tile_swizzled<D>() ? chunk ^ swizzle_key(row) : chunk);
}

// d = 128 on sm_90a: the warpgroups that quantise (consumers; kProducerGroups, below, split and multiply). Here, not
// with the producers, because the host's shared-memory size counts the consumers' tiles.
constexpr int kConsumerGroups = 3;
// The consumers' tiles there (x.R handed over): row c at c d + 4 (c / 2) floats, linear, so rows 2i and 2i + 1 begin in
// bank group i (mod 8). The consumers' eight lanes of a 16-byte load phase take rows of distinct c / 2 and the eight
// rows of a producer's stmatrix matrix are too: conflict-free with the same chunk offset for every row, i.e. immediate
// offsets from one row address. (The XOR swizzle of the x tiles needed an address per chunk column: ~40 instructions
// per consumer lane and tile, or 16 registers held across the quantiser. H200, 1M rows: 275.7 -> 273.0 us with the
// consumers' counters below, 263.9 with these rows too.)
template <int D>
__host__ __device__ constexpr int handover_row_offset(int c) {
  return c * D + 4 * (c / 2);
}
template <int D>
constexpr int handover_tile_floats() {
  return handover_row_offset<D>(split_warp_rows<D>() - 1) + D;
}
template <int D>
constexpr int split_smem_bytes() {
  constexpr int handover_extra =  // the hand-over tiles' padding beyond the warp tiles' ROWS x d
      D == 128 ? kConsumerGroups * 4 * (handover_tile_floats<D>() - split_warp_rows<D>() * D) : 0;
  return (D / 16) * (D / 8) * 32 * 16  // R fragments
         + (2 * D + split_warps<D>() * split_warp_rows<D>() * split_row_floats<D>() + handover_extra) *
               (int)sizeof(float);
}
// Room left beside a kernel's dynamic shared memory for its static variables (the d = 128 split kernel's mbarriers and
// shifts take 128 bytes). A CTA's shared memory on sm_90 is at most 227 KB.
constexpr int kStaticSmemRoom = 512;
static_assert(split_smem_bytes<128>() <= 227 * 1024 - kStaticSmemRoom,
              "the d = 128 split kernel's shared memory does not fit");

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
// The 4 values at u_at and the 4 at v_at (two rows, same columns k .. k + 3) replaced in place by their mma.sync
// fragments: {hi(u_k, u_k+1), hi(v_k, v_k+1), hi(u_k+2, u_k+3), hi(v_k+2, v_k+3)} over u, the lo fragment over v.
__device__ __forceinline__ void split_row_pair_in_place(float* u_at, float* v_at, float scale_u, float scale_v) {
  const float4 u = *reinterpret_cast<const float4*>(u_at);
  const float4 v = *reinterpret_cast<const float4*>(v_at);
  uint4 fhi, flo;
  split_fp16x2(u.x, u.y, scale_u, fhi.x, flo.x);
  split_fp16x2(v.x, v.y, scale_v, fhi.y, flo.y);
  split_fp16x2(u.z, u.w, scale_u, fhi.z, flo.z);
  split_fp16x2(v.z, v.w, scale_v, fhi.w, flo.w);
  *reinterpret_cast<uint4*>(u_at) = fhi;
  *reinterpret_cast<uint4*>(v_at) = flo;
}

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// d = 128 on sm_90a: warpgroups that split x, run the wgmma and scale back (producers), and warpgroups that quantise
// (consumers). Local group tile i of a CTA goes through producer i % 2 and consumer i % 3. (One producer and four
// consumers: 403 us, the producer's split, wgmma and tile load in series set the pace.)
constexpr int kProducerGroups = 2;
// Registers per thread after the hand-over of registers (setmaxnreg): the producers' accumulators, two A fragments
// and their loop need more than the launch's 96 (at 96 ptxas serialises their wgmma, C7512), the consumers fewer.
constexpr int kProducerRegisters = 120, kConsumerRegisters = 80;
static_assert(kProducerGroups * kProducerRegisters + kConsumerGroups * kConsumerRegisters ==
                  (kProducerGroups + kConsumerGroups) * 96,
              "the warpgroups share out the registers of the launch (20 warps at <= 96)");

// d += a b for one warpgroup: wgmma m64n128k16 (d = 128), fp16 operands, fp32 accumulators; b from shared memory
// (descriptor, K-major, not transposed), a from registers: this thread's A fragment (fragment rows g and g + 8 of its
// warp's 16; logical k 2t, 2t + 1 in a[0] and a[1], 2t + 8, 2t + 9 in a[2] and a[3]).
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc)
      : "memory");
}

// Four 8x8 matrices of 32-bit elements (stmatrix's pairs of b16) to shared memory: lane 4 i + j holds element (i, j)
// of matrix q in r_q; lane 8 q + i gives the address of row i of matrix q (16 bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t address, float r0, float r1, float r2, float r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
               "r"(__float_as_uint(r0)), "r"(__float_as_uint(r1)), "r"(__float_as_uint(r2)), "r"(__float_as_uint(r3))
               : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this thread's wgmma are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The compiler sees only the issue of a wgmma: this keeps its accumulators' later uses after the wait.
__device__ __forceinline__ void fence_register(float& v) { asm volatile("" : "+f"(v)::"memory"); }
// mbarrier (shared memory) arrive (release) and wait for the completion of the phase of the given parity (acquire).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(address) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
}
// Descriptor of a K-major, no-swizzle operand at shared address `address`: 128-byte core matrices
// (8 rows of 16 bytes), the next one along K at +128 bytes (leading byte offset), along N at +256 (R's layout: two
// core columns per 8 n).
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t address) {
  return (uint64_t)((address & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 | (uint64_t)(256 >> 4) << 32;
}
#endif

// The [ROWS, D] tile of rows row0.. into this warp's shared memory (cp.async; rows past the end zeroed).
template <int D, int ROWS>
__device__ __forceinline__ void load_warp_tile(const QuantizePackParams& p, float* tile, long row0, int lane) {
  static_assert(D / 4 <= 32 && 32 % (D / 4) == 0, "a row is a whole number of 16-byte pieces per warp");
  constexpr int kRowStep = 32 / (D / 4);  // rows per pass of the warp
  const int rows = (int)min((long)ROWS, p.rows - row0);
  const int chunk = lane % (D / 4), r0 = lane / (D / 4);
  const float* src = p.input + (row0 + r0) * D + 4 * chunk;
  if (rows == ROWS) {
#pragma unroll
    for (int r = 0; r < ROWS; r += kRowStep) cp_async16(tile + split_tile_offset<D>(r0 + r, chunk), src + r * D);
  } else {
    for (int r = 0; r < ROWS; r += kRowStep) {
      float* dst = tile + split_tile_offset<D>(r0 + r, chunk);
      if (r0 + r < rows) cp_async16(dst, src + r * D);
      else *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Column shifts 2^c_n of R (col_scale, and 2^-c_n in col_inverse; THREADS threads, a multiple of D). When they all
// lie within 2^7 of one another (any R of similar columns, e.g. orthogonal), every column takes the smallest one
// (column maxima scaled into [2^6, 2^14): the lo parts keep their precision as for the rows), so that the result
// needs one multiplication by 2^-(r_i + c) instead of two. The column maxima of |R| first, each column's k range
// shared out among THREADS / D threads (as bits in col_scale until the shifts replace them: non-negative floats
// order as their bits). Ends with a CTA barrier: the shifts are visible to every thread.
struct ColumnShifts {
  bool uniform;  // every column takes `shift`
  int shift;     // the smallest column shift
};
template <int D, int THREADS>
__device__ ColumnShifts column_shifts(const float* rotation, float* col_scale, float* col_inverse) {
  static_assert(THREADS % D == 0, "whole columns per thread");
  __shared__ int shift_min, shift_max;
  int* col_max_bits = reinterpret_cast<int*>(col_scale);
  if (threadIdx.x == 0) shift_min = 1000, shift_max = -1000;
  for (int n = threadIdx.x; n < D; n += THREADS) col_max_bits[n] = 0;
  __syncthreads();
  {
    const int n = threadIdx.x % D;
    float m = 0.f;
#pragma unroll 8
    for (int k = threadIdx.x / D; k < D; k += THREADS / D) m = fmaxf(m, fabsf(__ldg(rotation + (size_t)k * D + n)));
    atomicMax(col_max_bits + n, __float_as_int(m));
  }
  __syncthreads();
  int shift = 0;
  if (threadIdx.x < D) {
    shift = fp16_range_shift(__int_as_float(col_max_bits[threadIdx.x]));
    atomicMin(&shift_min, shift);
    atomicMax(&shift_max, shift);
  }
  __syncthreads();
  const ColumnShifts shifts{shift_max - shift_min <= 7, shift_min};
  if (threadIdx.x < D) {
    if (shifts.uniform) shift = shifts.shift;
    col_scale[threadIdx.x] = exp2_int(shift);
    col_inverse[threadIdx.x] = exp2_int(-shift);
  }
  __syncthreads();
  return shifts;
}

// The mma.sync m16n8k16 B fragment of lane l for k-step ks and n-tile nt of R, its columns scaled by col_scale and
// split into fp16 hi and lo: {hi(R[k][n], R[k + 1][n]), hi(R[k + 2][n], R[k + 3][n]), lo(the same), lo(..)} with
// n = 8 nt + l / 4, k = 16 ks + 4 (l % 4), i.e. logical k 2t, 2t + 1 and 2t + 8, 2t + 9 (the A fragments' k order).
template <int D>
__device__ __forceinline__ uint4 rotation_b_fragment(const float* rotation, int ks, int nt, int l,
                                                     const float* col_scale) {
  const int n = 8 * nt + l / 4, k = 16 * ks + 4 * (l % 4);
  const float* r = rotation + (size_t)k * D + n;
  const float cs = col_scale[n];
  uint4 f;
  split_fp16x2(__ldg(r), __ldg(r + D), cs, f.x, f.z);
  split_fp16x2(__ldg(r + 2 * D), __ldg(r + 3 * D), cs, f.y, f.w);
  return f;
}

// A wgmma core-matrix row of R (K-major, fp16, columns scaled by col_scale and split into hi and lo): the 8 logical k
// 8 kc + e (e < 8) of k-step ks and column n, logical k 8 kc + e being row 16 ks + 4 (e / 2) + 2 kc + e % 2 of R: the
// order of the A fragments (k-step ks of lane (g, t) holds x's columns 16 ks + 4 t .. 16 ks + 4 t + 3 as logical k
// 2t, 2t + 1, 2t + 8, 2t + 9).
template <int D>
__device__ __forceinline__ void rotation_core_row(const float* rotation, int ks, int kc, int n, const float* col_scale,
                                                  uint4& hi, uint4& lo) {
  const float* r = rotation + (size_t)(16 * ks + 2 * kc) * D + n;
  const float cs = col_scale[n];
  split_fp16x2(__ldg(r), __ldg(r + D), cs, hi.x, lo.x);
  split_fp16x2(__ldg(r + 4 * D), __ldg(r + 5 * D), cs, hi.y, lo.y);
  split_fp16x2(__ldg(r + 8 * D), __ldg(r + 9 * D), cs, hi.z, lo.z);
  split_fp16x2(__ldg(r + 12 * D), __ldg(r + 13 * D), cs, hi.w, lo.w);
}

// d = 128: one CTA of 20 warps per SM (<= 96 registers); d = 64: two CTAs of 8 (<= 128 registers).
template <int D, int KMAX>
__global__ void __launch_bounds__(split_warps<D>() * 32, D == 64 ? 2 : 1)
    quantize_rows_rotated_split_kernel(const __grid_constant__ QuantizePackParams p, int k_top) {
  static_assert(D == 64 || D == 128, "R fragments of d = 256 do not fit in shared memory");
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  constexpr bool WGMMA = D == 128;
#endif
  constexpr int ROWS = split_warp_rows<D>(), WARPS = split_warps<D>(), THREADS = WARPS * 32;
  constexpr int XS = split_row_floats<D>(), KSTEPS = D / 16, NTILES = D / 8, MTILES = ROWS / 16, LANES = 32 / ROWS;
  constexpr int PAIRS = ROWS / 2, PARTS = 32 / PAIRS;  // in the split: row pairs, column parts per pair
  // 128-byte aligned (all kernels here): behind static __shared__ variables a 16-byte alignment leaves cp.async
  // destinations off 32-byte boundaries, which doubles the L2 requests (see paged_decode.cu; d = 128 rotated: 302
  // -> 295 us on the H200).
  extern __shared__ __align__(128) float smem[];
  // mma.sync: [D/16 k-steps][D/8 n-tiles][32 lanes] {hi, lo} fragments; wgmma: R_hi then R_lo, each
  // [D/16 k-steps][D/8 core rows of 8 n][2 core columns of 8 k] core matrices.
  uint4* rfrag = reinterpret_cast<uint4*>(smem);
  float* col_scale = smem + KSTEPS * NTILES * 32 * 4;     // [D] 2^c_n
  float* col_inverse = col_scale + D;                     // [D] 2^-c_n
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* tile = col_inverse + D + warp * ROWS * XS;  // [ROWS][XS]: x, split x, then x.R
  auto chunk_at = [tile](int row, int chunk) { return tile + split_tile_offset<D>(row, chunk); };
  auto row_of = [tile](int row) {  // one row for the quantiser
    if constexpr (split_tile_swizzled<D>()) return SwizzledRow{tile + row * XS, swizzle_key(row)};
    else return PaddedRow{tile + row * XS};
  };
  // Group tiles of 4 ROWS rows; warp w % 4 of a warpgroup takes the w-th ROWS rows of each of its group tiles
  // (past the end: zero rows). (Broadcast from lane 0: ptxas knows the loops are warp-uniform and does not
  // serialise the wgmma.)
  const long group_tiles = (p.rows + 4 * ROWS - 1) / (4 * ROWS);
  const long stride = (long)gridDim.x * (WARPS / 4);
  long group_index = (long)blockIdx.x * (WARPS / 4) + __shfl_sync(0xffffffffu, warp / 4, 0);
  const int warp_offset = __shfl_sync(0xffffffffu, warp % 4, 0) * ROWS;
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (WGMMA) {  // the producers' first group tiles (local group i = warpgroup)
    const long first = blockIdx.x + (long)(warp / 4) * gridDim.x;
    if (warp / 4 < kProducerGroups && first < group_tiles)
      load_warp_tile<D, ROWS>(p, tile, first * 4 * ROWS + warp_offset, lane);
  } else
#endif
  if (group_index < group_tiles) load_warp_tile<D, ROWS>(p, tile, group_index * 4 * ROWS + warp_offset, lane);
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  __shared__ uint64_t tile_full[kConsumerGroups], tile_empty[kConsumerGroups];  // mbarriers of the consumers' tiles
  if constexpr (WGMMA) {
    if (threadIdx.x < kConsumerGroups) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(tile_full + threadIdx.x)))
                   : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(tile_empty + threadIdx.x)))
                   : "memory");
    }
  }
#endif
  const ColumnShifts shifts = column_shifts<D, THREADS>(p.rotation, col_scale, col_inverse);
  const bool uniform_columns = shifts.uniform;
  const int column_shift = shifts.shift;  // the shift of every column when uniform_columns
  // Power-of-two scales of a lane's two split rows from the sum of |x| (fp32 pipe) over the lane's columns
  // [4 chunk0, 4 chunk0 + D / PARTS), summed over the pair's PARTS lanes (a butterfly: the same on each):
  // max |x| 2^r lands in [2^6, 2^14). inverse = 2^-r (2^-(r + c) with uniform columns, then r + c <= 126
  // so that it stays a normal float: tiny rows scale less), scale = 2^r.
  struct RowScales {
    float inverse_upper, inverse_lower, scale_upper, scale_lower;
  };
  // The scales from a lane's partial sums, once summed over the lanes that share its rows (xor offsets first, 2 first,
  // .., last: the same sums on each).
  auto row_scales_of = [&](float su, float sl, int first, int last) {
#pragma unroll
    for (int offset = first; offset <= last; offset *= 2)
      su += __shfl_xor_sync(0xffffffffu, su, offset), sl += __shfl_xor_sync(0xffffffffu, sl, offset);
    int ru = fp16_range_shift(su), rl = fp16_range_shift(sl);
    RowScales r;
    if (uniform_columns) {
      ru = min(ru, 126 - column_shift), rl = min(rl, 126 - column_shift);
      r.inverse_upper = exp2_int(min(-(ru + column_shift), 127));  // (127: the result overflows anyway)
      r.inverse_lower = exp2_int(min(-(rl + column_shift), 127));
    } else {
      r.inverse_upper = exp2_int(-ru), r.inverse_lower = exp2_int(-rl);
    }
    r.scale_upper = exp2_int(ru), r.scale_lower = exp2_int(rl);
    return r;
  };
  auto row_scales = [&](int upper, int lower, int chunk0) {
    float su = 0.f, sl = 0.f;
#pragma unroll 8
    for (int c = 0; c < D / PARTS; c += 4) {
      const float4 u = *reinterpret_cast<const float4*>(chunk_at(upper, chunk0 + c / 4));
      const float4 v = *reinterpret_cast<const float4*>(chunk_at(lower, chunk0 + c / 4));
      su += fabsf(u.x) + fabsf(u.y) + fabsf(u.z) + fabsf(u.w);
      sl += fabsf(v.x) + fabsf(v.y) + fabsf(v.z) + fabsf(v.w);
    }
    return row_scales_of(su, sl, PAIRS, 16);
  };
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (WGMMA) {
    // R_hi, then R_lo: core-matrix rows (rotation_core_row), [k-step][8 n][2 core columns][8 n].
    for (int i = threadIdx.x; i < KSTEPS * D * 2; i += THREADS) {
      const int kc = i % 2, n = (i / 2) % D, ks = i / (2 * D);
      uint4 hi, lo;
      rotation_core_row<D>(p.rotation, ks, kc, n, col_scale, hi, lo);
      // Column n at wgmma column 8 (n / 8) + 2 (n % 4) + (n % 8) / 4, so that the accumulators of a lane hold, per
      // n-tile, columns 4 e + t of its eight (e = 0, 1): the fragments of stmatrix (the scale-back, below).
      const int at = ks * 2 * D + (n / 8) * 16 + kc * 8 + 2 * (n % 4) + (n % 8) / 4;  // 16-byte units
      rfrag[at] = hi;
      rfrag[KSTEPS * 2 * D + at] = lo;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to the tensor cores
  } else
#endif
  {
    for (int i = threadIdx.x; i < KSTEPS * NTILES * 32; i += THREADS)
      rfrag[i] = rotation_b_fragment<D>(p.rotation, i / (32 * NTILES), (i / 32) % NTILES, i % 32, col_scale);
  }
  __syncthreads();  // R ready; from here on the warps are independent (no CTA barrier)
  const int g = lane / 4, t = lane % 4;
  const int rho = g / 2 + 4 * (g % 2);  // tile row of fragment row g (and rho + 8 of g + 8)
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if constexpr (WGMMA) {
    // Warpgroup wg < P produces the local group tiles wg, wg + P, ..: its warps' tiles hold x (split into the wgmma A
    // fragments in registers); x.R goes to the tiles of consumer k = i % C, whose warp w quantises the rows of producer
    // warp w. Hand-over by two mbarriers per consumer, 128 arrivals each: full[k] (x.R written: the producer's threads
    // arrive, the consumer waits) and empty[k] (the consumer's threads done reading: they arrive, the producer of the
    // tile's next group tile i + C waits before writing). The u-th use of consumer k's tiles (i = u C + k) is phase u
    // of both, and a wait names its phase by parity, which is only sound while the barrier is at most one phase behind
    // it. The consumer's waits are sound: full[k] cannot complete phase u + 1 before the consumer's own arrivals
    // complete empty[k] phase u. The producers' are not by themselves: with P = 2 and C odd, consumer k's tiles
    // alternate between the two producers, so the producer of phase u could wait on empty[k] while that barrier is
    // still in phase u - 2 (the other producer's tile u - 1 not written yet, consumer k slow, e.g. on zero rows), take
    // the parity of phase u - 1 for that of the completed u - 3, and overwrite tiles in use (nondeterministic codes,
    // hangs). So it first waits for full[k] phase u - 1 (tile u - 1 written, hence empty phase u - 2 complete); full[k]
    // is then at phase >= u - 1, since this warpgroup's own arrivals completed phase u - 2. (Named barriers per
    // (producer, consumer) pair measured 339-340 us against 333-335; compute-sanitizer's racecheck does not follow
    // them.)
    constexpr int P = kProducerGroups, C = kConsumerGroups;
    static_assert(ROWS == 16 && PARTS == 4 && 4 * (P + C) == WARPS, "16-row warp tiles, P + C warpgroups");
    static_assert(2 * C % P == 0, "tiles i and i - 2C of a consumer have one producer (the waits below)");
    static_assert(P <= C, "the producers' counters of i % C wrap at most once per step");
    const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), w = warp % 4;  // (warp-uniform: no serialised wgmma)
    constexpr int CT = handover_tile_floats<D>();
    static_assert(CT % 4 == 0, "16-byte aligned hand-over tiles");
    float* const consumer_tiles = col_inverse + D + 4 * P * ROWS * XS;  // [C][4 warps][CT]
    if (wg < P) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
      // R_hi's and R_lo's descriptors at k-step 0. K-step ks lies ks 32 D bytes further on: its descriptors add
      // ks 32 D / 16 (the address field counts 16-byte units; R lies in the first 64 KB, so nothing carries over).
      const uint32_t r_hi = static_cast<uint32_t>(__cvta_generic_to_shared(rfrag)), r_lo = r_hi + KSTEPS * 32 * D;
      const uint64_t r_hi_desc = wgmma_descriptor(r_hi), r_lo_desc = wgmma_descriptor(r_lo);
      // Tile i's consumer k = i % C and u = i / C kept as counters (a 64-bit division by C per tile cost ~20 uniform
      // instructions, in both roles).
      int k = wg % C;
      uint32_t u = 0;
      for (int i = wg;; i += P) {
        const long gi = blockIdx.x + (long)i * gridDim.x;
        if (gi >= group_tiles) break;
        const long next = gi + (long)P * gridDim.x;
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncwarp();
        // The split, straight into the A fragments (registers): fragment rows g and g + 8 of the warp's 16 are tile
        // rows rho(g) and rho(g) + 8 (as in the mma.sync path); k-step ks of lane (g, t) takes chunk 4 ks + t of
        // both, its four values logical k 2t, 2t + 1, 2t + 8, 2t + 9 (R's rows permuted alike, above). Eight lanes
        // of a 16-byte load phase then read eight distinct bank groups. The rows' scales first (a pass of its own:
        // the values of all k-steps would not fit in registers beside the accumulators).
        float scale_upper, scale_lower, rinv_upper, rinv_lower;
        {
          float su = 0.f, sl = 0.f;
#pragma unroll
          for (int ks = 0; ks < KSTEPS; ++ks) {
            const float4 u = *reinterpret_cast<const float4*>(chunk_at(rho, 4 * ks + t));
            const float4 v = *reinterpret_cast<const float4*>(chunk_at(rho + 8, 4 * ks + t));
            su += fabsf(u.x) + fabsf(u.y) + fabsf(u.z) + fabsf(u.w);
            sl += fabsf(v.x) + fabsf(v.y) + fabsf(v.z) + fabsf(v.w);
          }
          const RowScales rs = row_scales_of(su, sl, 1, 2);  // over the quad
          scale_upper = rs.scale_upper, scale_lower = rs.scale_lower;
          rinv_upper = rs.inverse_upper, rinv_lower = rs.inverse_lower;
        }
        float d[64];  // fragment row g: tile row rho(g)
#pragma unroll
        for (int e = 0; e < 64; ++e) d[e] = 0.f;
        // Two A buffers: k-step ks writes buffer ks % 2 once the group of k-step ks - 2, which read it, is done.
        uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
          const int b = ks % 2;
          const float4 u = *reinterpret_cast<const float4*>(chunk_at(rho, 4 * ks + t));
          const float4 v = *reinterpret_cast<const float4*>(chunk_at(rho + 8, 4 * ks + t));
          if (ks >= 2) wgmma_wait<1>();
          split_fp16x2(u.x, u.y, scale_upper, a_hi[b][0], a_lo[b][0]);
          split_fp16x2(v.x, v.y, scale_lower, a_hi[b][1], a_lo[b][1]);
          split_fp16x2(u.z, u.w, scale_upper, a_hi[b][2], a_lo[b][2]);
          split_fp16x2(v.z, v.w, scale_lower, a_hi[b][3], a_lo[b][3]);
          wgmma_fence();
          const uint64_t b_hi = r_hi_desc + ks * 32 * D / 16, b_lo = r_lo_desc + ks * 32 * D / 16;
          wgmma_f16_rs(d, a_lo[b], b_hi);
          wgmma_f16_rs(d, a_hi[b], b_lo);
          wgmma_f16_rs(d, a_hi[b], b_hi);
          wgmma_commit();
        }
        __syncwarp();  // every lane done reading the tile: the next one may land in it
        if (next < group_tiles) load_warp_tile<D, ROWS>(p, tile, next * 4 * ROWS + warp_offset, lane);
        // Wait for the consumer's tiles while the tensor cores run.
        if (i >= 2 * C) mbarrier_wait(tile_full + k, (u - 1) & 1u);  // tile i - C written
        if (i >= C) mbarrier_wait(tile_empty + k, (u - 1) & 1u);
        wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; ++e) fence_register(d[e]);
        // Per n-tile one stmatrix.x4 (8x8 matrices of 32-bit elements here): matrix q = 2 (row half) + (column
        // half) holds chunk 2 n + q % 2 of fragment rows 0..7 + 8 (q / 2); lane 8 q + i names row i of matrix q.
        // Fragment row f goes to hand-over row 2 (f % 8) + f / 8 (see handover_row_offset), where its chunk 2 n + q % 2
        // lies 32 n bytes after chunk q % 2: one lane address, then immediate offsets. (stmatrix: half the
        // instructions of 8-byte stores and fewer address computations: H100, 1M rows, 317 -> 309 us.)
        const uint32_t out = static_cast<uint32_t>(__cvta_generic_to_shared(consumer_tiles + (4 * k + w) * CT));
        const int st_q = lane / 8, st_i = lane % 8;
        const uint32_t st_at = out + 4 * (handover_row_offset<D>(2 * st_i + st_q / 2) + 4 * (st_q % 2));
        if (uniform_columns) {
#pragma unroll
          for (int n = 0; n < NTILES; ++n)
            stmatrix_x4(st_at + 32 * n, d[4 * n] * rinv_upper, d[4 * n + 1] * rinv_upper, d[4 * n + 2] * rinv_lower,
                        d[4 * n + 3] * rinv_lower);
        } else {
#pragma unroll
          for (int n = 0; n < NTILES; ++n) {
            const float ci0 = col_inverse[8 * n + t], ci1 = col_inverse[8 * n + 4 + t];
            stmatrix_x4(st_at + 32 * n, d[4 * n] * rinv_upper * ci0, d[4 * n + 1] * rinv_upper * ci1,
                        d[4 * n + 2] * rinv_lower * ci0, d[4 * n + 3] * rinv_lower * ci1);
          }
        }
        mbarrier_arrive(tile_full + k);
        k += P;
        if (k >= C) k -= C, ++u;
      }
    } else {  // consumer k: the local group tiles k, k + C, ..
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
      const int k = wg - P;
      // Lanes l and l + 16 (l < 16) share fragment row f = l: hand-over row 2 (l % 8) + l / 8, tile row r = rho(l % 8)
      // + 8 (l / 8).
      const int l = lane % ROWS;
      const PaddedRow x{consumer_tiles + (4 * k + w) * CT + handover_row_offset<D>(2 * (l % 8) + l / 8)};
      const int r = (l % 8) / 2 + 4 * (l % 2) + 8 * (l / 8);
      uint32_t parity = 0;  // of u = i / C
      for (long gi = blockIdx.x + (long)k * gridDim.x; gi < group_tiles; gi += (long)C * gridDim.x, parity ^= 1u) {
        const long row0 = gi * 4 * ROWS + warp_offset;
        const int rows = (int)min((long)ROWS, p.rows - row0);
        mbarrier_wait(tile_full + k, parity);
        // KMAX = kWarpSearch: a warp per row, hand-over row c holding tile row c / 4 + 4 (c / 2 % 2) + 8 (c % 2) (the
        // lanes' mapping above, inverted). H200, 1M rows, d = 128 clip 0.7: 1417 us on the warp-per-row kernel, 852
        // here (log, fifty-sixth round; two rows per warp, their searches stepping together: 1171).
        if constexpr (KMAX == kWarpSearch) {
          const float* const handed = consumer_tiles + (4 * k + w) * CT;
          for (int c = 0; c < ROWS; ++c) {
            const int rc = c / 4 + 4 * (c / 2 % 2) + 8 * (c % 2);
            if (rc >= rows) continue;
            float v[D / 32];
#pragma unroll
            for (int j = 0; j < D / 32; ++j) v[j] = handed[handover_row_offset<D>(c) + lane + 32 * j];
            quantize_row_warp<D>(v, p, row0 + rc, k_top);
          }
        } else {
          quantize_row_thread<D, KMAX, LANES>(p, x, row0 + r, k_top, r < rows);
        }
        // The warp together again before the next tile's full-warp shuffles: a row on the quantiser's fallback
        // path keeps its lower lane there while its upper lane and the other rows' lanes have returned.
        __syncwarp();
        mbarrier_arrive(tile_empty + k);
      }
    }
  } else
#endif
  {  // mma.sync: every warpgroup splits, multiplies and quantises its own group tiles
    for (; group_index < group_tiles; group_index += stride) {
      const long row0 = group_index * 4 * ROWS + warp_offset;
      const int rows = (int)min((long)ROWS, p.rows - row0);
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      __syncwarp();
      // Lane (j + 8 m + PAIRS h) splits columns [h D/PARTS, (h + 1) D/PARTS) of the row pair (16 m + j,
      // 16 m + j + 8) (the two rows of one A fragment): each 4 columns of both rows become the 16-byte hi fragment
      // {a0, a1, a2, a3} = hi(upper: k, k+1), hi(lower: k, k+1), hi(upper: k+2, k+3), hi(lower: k+2, k+3),
      // stored in place of the upper row's 4 values, and the lo fragment in place of the lower row's, so
      // the mma loads each operand with one 16-byte load straight into its registers (no moves).
      // Row scale: from the sum of |x| (fp32 pipe) instead of the maximum: max |x| 2^r lands in [2^6, 2^14).
      float inverse_upper, inverse_lower;  // 2^-r of this lane's two rows (2^-(r + c): uniform columns)
      {
        const int j = lane % 8, m = (lane % PAIRS) / 8, h = lane / PAIRS;
        const int upper = 16 * m + j, lower = upper + 8, chunk0 = h * (D / PARTS / 4);  // rows, first chunk
        const RowScales rs = row_scales(upper, lower, chunk0);
        inverse_upper = rs.inverse_upper, inverse_lower = rs.inverse_lower;
        const float scale_upper = rs.scale_upper, scale_lower = rs.scale_lower;
#pragma unroll 8
        for (int c = 0; c < D / PARTS; c += 4)
          split_row_pair_in_place(chunk_at(upper, chunk0 + c / 4), chunk_at(lower, chunk0 + c / 4), scale_upper,
                                  scale_lower);
      }
      __syncwarp();
      float acc[MTILES][NTILES][4];  // [m-tile][n-tile][fragment]
#pragma unroll
      for (int m = 0; m < MTILES; ++m)
#pragma unroll
        for (int n = 0; n < NTILES; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
      // The A fragments of k-step ks (hi and lo of each m-tile): one 16-byte load each.
      auto load_a = [&](int ks, uint4 (&a_hi)[MTILES], uint4 (&a_lo)[MTILES]) {
#pragma unroll
        for (int m = 0; m < MTILES; ++m) {
          a_hi[m] = *reinterpret_cast<const uint4*>(chunk_at(16 * m + rho, 4 * ks + t));
          a_lo[m] = *reinterpret_cast<const uint4*>(chunk_at(16 * m + rho + 8, 4 * ks + t));
        }
      };
      {
#pragma unroll 1  // (unrolled twice: spills at 128 registers)
        for (int ks = 0; ks < KSTEPS; ++ks) {
          uint4 a_hi[MTILES], a_lo[MTILES];
          load_a(ks, a_hi, a_lo);
          const uint4* bk = rfrag + ks * NTILES * 32 + lane;
          // One n-tile's B fragment at a time (4 registers, not 4 NTILES): the MTILES x 3 mma of consecutive
          // n-tiles are independent.
#pragma unroll
          for (int n = 0; n < NTILES; ++n) {
            const uint4 b = bk[n * 32];
            auto mma = [&](int m, const uint4& a, uint32_t b0, uint32_t b1) {
              mma_f16_16816(acc[m][n], a.x, a.y, a.z, a.w, b0, b1);
            };
#pragma unroll
            for (int m = 0; m < MTILES; ++m) mma(m, a_lo[m], b.x, b.y);
#pragma unroll
            for (int m = 0; m < MTILES; ++m) mma(m, a_hi[m], b.z, b.w);
#pragma unroll
            for (int m = 0; m < MTILES; ++m) mma(m, a_hi[m], b.x, b.y);
          }
        }
      }
      float rinv[MTILES][2];  // lane 8 m + rho (h = 0) holds the pair (16 m + rho, 16 m + rho + 8)
#pragma unroll
      for (int m = 0; m < MTILES; ++m)
        rinv[m][0] = __shfl_sync(0xffffffffu, inverse_upper, 8 * m + rho),
        rinv[m][1] = __shfl_sync(0xffffffffu, inverse_lower, 8 * m + rho);
      __syncwarp();  // every lane done reading the split x
      if (uniform_columns) {
#pragma unroll
        for (int n = 0; n < NTILES; ++n)
#pragma unroll
          for (int m = 0; m < MTILES; ++m) {
            float* c = chunk_at(16 * m + rho, 2 * n + t / 2) + 2 * (t % 2);
            float* c8 = chunk_at(16 * m + rho + 8, 2 * n + t / 2) + 2 * (t % 2);
            *reinterpret_cast<float2*>(c) = make_float2(acc[m][n][0] * rinv[m][0], acc[m][n][1] * rinv[m][0]);
            *reinterpret_cast<float2*>(c8) = make_float2(acc[m][n][2] * rinv[m][1], acc[m][n][3] * rinv[m][1]);
          }
      } else {
#pragma unroll
        for (int n = 0; n < NTILES; ++n) {
          const float2 ci = *reinterpret_cast<const float2*>(col_inverse + 8 * n + 2 * t);
#pragma unroll
          for (int m = 0; m < MTILES; ++m) {
            float* c = chunk_at(16 * m + rho, 2 * n + t / 2) + 2 * (t % 2);
            float* c8 = chunk_at(16 * m + rho + 8, 2 * n + t / 2) + 2 * (t % 2);
            *reinterpret_cast<float2*>(c) =
                make_float2(acc[m][n][0] * rinv[m][0] * ci.x, acc[m][n][1] * rinv[m][0] * ci.y);
            *reinterpret_cast<float2*>(c8) =
                make_float2(acc[m][n][2] * rinv[m][1] * ci.x, acc[m][n][3] * rinv[m][1] * ci.y);
          }
        }
      }
      __syncwarp();
      if constexpr (KMAX == kWarpSearch) {  // a warp per row (lane: channels lane + 32 j)
        for (int r = 0; r < rows; ++r) {
          float v[D / 32];
#pragma unroll
          for (int j = 0; j < D / 32; ++j) v[j] = row_of(r).at(lane + 32 * j);
          quantize_row_warp<D>(v, p, row0 + r, k_top);
        }
      } else if constexpr (LANES == 1) {
        if (lane < rows) quantize_row_thread<D, KMAX>(p, row_of(lane), row0 + lane, k_top);
      } else {  // lanes r and r + 16 share row r (all lanes take part: the pairs exchange by shuffles)
        const int r = lane % ROWS;
        quantize_row_thread<D, KMAX, LANES>(p, row_of(r), row0 + r, k_top, r < rows);
      }
      __syncwarp();  // tile consumed
      if (group_index + stride < group_tiles)
        load_warp_tile<D, ROWS>(p, tile, (group_index + stride) * 4 * ROWS + warp_offset, lane);
    }
  }
}

// ---------------------------------------------------------------- rotated path, d = 256: fp16 split, R streamed
// R_hi and R_lo in fp16 (256 KB) do not fit in shared memory, so R is streamed. First, once per call,
// rotation_split_kernel splits R into a workspace (RotationSplit256): the column shifts 2^c_n (as the split kernel:
// max |R[:, n]| 2^c_n in [2^13, 2^14), one shift for all columns when they lie within 7) and R's fp16 hi / lo parts
// in the order the products read them. Then persistent CTAs of 8 warps, two per SM, over 64-row tiles. Per tile:
// cp.async of x; each row pair split in place into the fp16 A fragments (row scale 2^r_i from the sum of |x_i|, as
// the split kernel; lane (g, t) holds k 4t .. 4t + 3 of a k-step, fragment row g = tile row rho(g)); R streamed a
// k-step (16 KB) at a time (cp.async, two buffers, one CTA barrier per k-step); x.R = hi.hi + hi.lo + lo.hi with
// fp32 accumulation (the d <= 128 kernels' accuracy argument): on wgmma (sm_90a), warpgroup h takes the columns
// [128 h, 128 h + 128) with A from registers (warp w: m-tile w) and the k-step's core matrices as B; on mma.sync,
// warp w takes the columns [32 w, 32 w + 32) with one 16-byte B fragment per n-tile. Scaled back by 2^-r_i 2^-c_n
// into the tile; then two lanes per row quantise (warps 0-3), or, with more than 32 clipped values (KMAX =
// kWarpSearch), a warp per row (all warps: quantize_row_warp, as the warp-per-row kernel). H200, 1M rows: 3364 us with
// the former kernel (3xTF32 mma.sync, R in fp32 chunks, the plain quantiser on 64 threads), 2287 with two lanes per row
// there, 1937 on mma.sync with each warp splitting R's fp32 chunks itself for every tile, 1472 with R split once per
// call, 1177 on wgmma (log, fiftieth round: the k-step loop is now bound by latency, one k-step in flight per CTA). 3
// fp16 products of [1M, 256] x [256, 256] are ~400 GFLOP: at the H200's dense fp16 rate (~990 TFLOP/s with wgmma) that
// alone takes >= ~410 us. (Not kept, on mma.sync: a ring of three R chunks, x and R in unpadded swizzled rows so that
// two CTAs still fit: 2183 us, 20 bytes of spills; the next tile's first R chunk issued before the quantiser:
// 1974.)
constexpr int kRotF16Threads = 256;

// d = 256: R split for the quantiser (rotation_split_kernel), in global memory (the caller's workspace). A k-step
// (16 KB) holds, for wgmma (sm_90a builds), R_hi's core-matrix rows (rotation_core_row) [32 n-groups of 8][2 core
// columns][8 n], then R_lo's; for mma.sync, the B fragments [32 n-tiles][32 lanes] (rotation_b_fragment).
struct RotationSplit256 {
  static constexpr int D = 256, KSTEP_FRAGMENTS = (D / 8) * 32;  // 16-byte units per k-step
  uint4 fragments[(D / 16) * KSTEP_FRAGMENTS];                   // [k-step][KSTEP_FRAGMENTS]
  float col_inverse[D];                                          // 2^-c_n
  int uniform, column_shift;                                     // ColumnShifts
};

// One CTA per k-step of R: the column shifts (every CTA alike; CTA 0 stores them), then the k-step's 16 KB.
__global__ void __launch_bounds__(kRotF16Threads) rotation_split_kernel(const float* __restrict__ rotation,
                                                                        RotationSplit256* __restrict__ out) {
  constexpr int D = RotationSplit256::D, F = RotationSplit256::KSTEP_FRAGMENTS;
  __shared__ float col_scale[D], col_inverse[D];
  const ColumnShifts shifts = column_shifts<D, kRotF16Threads>(rotation, col_scale, col_inverse);
  if (blockIdx.x == 0) {
    for (int n = threadIdx.x; n < D; n += kRotF16Threads) out->col_inverse[n] = col_inverse[n];
    if (threadIdx.x == 0) out->uniform = shifts.uniform, out->column_shift = shifts.shift;
  }
  uint4* const ks_out = out->fragments + blockIdx.x * F;
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  static_assert(F == 4 * D, "R_hi and R_lo: two core columns of D rows each");
  for (int i = threadIdx.x; i < 2 * D; i += kRotF16Threads) {
    const int kc = i % 2, n = i / 2;
    uint4 hi, lo;
    rotation_core_row<D>(rotation, blockIdx.x, kc, n, col_scale, hi, lo);
    const int at = (n / 8) * 16 + kc * 8 + n % 8;
    ks_out[at] = hi;
    ks_out[2 * D + at] = lo;
  }
#else
  for (int i = threadIdx.x; i < F; i += kRotF16Threads)
    ks_out[i] = rotation_b_fragment<D>(rotation, blockIdx.x, i / 32, i % 32, col_scale);
#endif
}

template <int D>
constexpr int rot_f16_smem_bytes() {
  return (kRowThreads * (D + 4) + D + kRowThreads) * (int)sizeof(float) +
         2 * RotationSplit256::KSTEP_FRAGMENTS * (int)sizeof(uint4);
}

template <int D, int KMAX>
__global__ void __launch_bounds__(kRotF16Threads, 2)
    quantize_rows_rotated_f16_kernel(const __grid_constant__ QuantizePackParams p, int k_top,
                                     const RotationSplit256* __restrict__ split) {
  static_assert(D == RotationSplit256::D, "the d = 256 kernel");
  constexpr int THREADS = kRotF16Threads, ROWS = kRowThreads, XS = D + 4, F = RotationSplit256::KSTEP_FRAGMENTS;
  constexpr int KSTEPS = D / 16;
  extern __shared__ __align__(128) float smem[];
  float* tile = smem;                                              // [64][D + 4]: x, split x, then x.R
  uint4* rchunk = reinterpret_cast<uint4*>(tile + ROWS * XS);      // [2][F]: a k-step of R's fragments
  float* col_inverse = reinterpret_cast<float*>(rchunk + 2 * F);   // [D] 2^-c_n
  float* row_inverse = col_inverse + D;                            // [64] 2^-r_i (2^-(r_i + c) with uniform columns)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rho = g / 2 + 4 * (g % 2);  // tile row of fragment row g (conflict-free 16-byte A loads)
  const long tiles = (p.rows + ROWS - 1) / ROWS;
  // Copies: thread i takes 16 bytes q = i % 64 of rows i / 64 + 4 j (j < 16) of the x tile, and fragments i + 256 j
  // (j < 4) of a k-step.
  static_assert(THREADS == 4 * (D / 4) && ROWS == 64 && F % THREADS == 0, "four rows per pass of the CTA");
  const int copy_row = threadIdx.x / (D / 4), copy_q = threadIdx.x % (D / 4);
  auto load_r_chunk = [&](int c) {
    const uint4* src = split->fragments + c * F + threadIdx.x;
    uint4* dst = rchunk + (c % 2) * F + threadIdx.x;
#pragma unroll
    for (int j = 0; j < F / THREADS; ++j) cp_async16(dst + j * THREADS, src + j * THREADS);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  const bool uniform_columns = split->uniform != 0;
  const int column_shift = split->column_shift;
  for (int n = threadIdx.x; n < D; n += THREADS) col_inverse[n] = split->col_inverse[n];  // (read after a barrier)
  // The split: lane l of warp w takes the row pair (16 m + j, 16 m + j + 8), pair = 4 w + l % 4 = 8 m + j, and
  // chunks [8 h, 8 h + 8) (h = l / 4) in the order 8 h + (c + 4 (h % 2)) % 8: the 16-byte accesses of a
  // quarter-warp hit 8 distinct bank groups (rows 65 chunks apart).
  const int pair = 4 * warp + lane % 4, part = lane / 4;
  const int upper = 16 * (pair / 8) + pair % 8, lower = upper + 8;
  auto part_chunk = [part](int c) { return 8 * part + (c + 4 * (part % 2)) % 8; };
  for (long ti = blockIdx.x; ti < tiles; ti += gridDim.x) {
    const long row0 = ti * ROWS;
    const int rows = (int)min((long)ROWS, p.rows - row0);
    {
      const float* src = p.input + (row0 + copy_row) * D + 4 * copy_q;
      float* dst = tile + copy_row * XS + 4 * copy_q;
      if (rows == ROWS) {
#pragma unroll
        for (int j = 0; j < ROWS / 4; ++j) cp_async16(dst + 4 * j * XS, src + 4 * j * D);
      } else {
        for (int j = 0; j < ROWS / 4; ++j) {
          if (copy_row + 4 * j < rows) cp_async16(dst + 4 * j * XS, src + 4 * j * D);
          else *reinterpret_cast<float4*>(dst + 4 * j * XS) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    load_r_chunk(0);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    {  // row scales from the sum of |x| over the pair's 8 lanes, then the split in place
      float su = 0.f, sl = 0.f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float4 u = *reinterpret_cast<const float4*>(tile + upper * XS + 4 * part_chunk(c));
        const float4 v = *reinterpret_cast<const float4*>(tile + lower * XS + 4 * part_chunk(c));
        su += fabsf(u.x) + fabsf(u.y) + fabsf(u.z) + fabsf(u.w);
        sl += fabsf(v.x) + fabsf(v.y) + fabsf(v.z) + fabsf(v.w);
      }
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2)
        su += __shfl_xor_sync(0xffffffffu, su, offset), sl += __shfl_xor_sync(0xffffffffu, sl, offset);
      int ru = fp16_range_shift(su), rl = fp16_range_shift(sl);
      float inverse_upper, inverse_lower;
      if (uniform_columns) {
        ru = min(ru, 126 - column_shift), rl = min(rl, 126 - column_shift);
        inverse_upper = exp2_int(min(-(ru + column_shift), 127));  // (127: the result overflows anyway)
        inverse_lower = exp2_int(min(-(rl + column_shift), 127));
      } else {
        inverse_upper = exp2_int(-ru), inverse_lower = exp2_int(-rl);
      }
      const float scale_upper = exp2_int(ru), scale_lower = exp2_int(rl);
      if (part == 0) row_inverse[upper] = inverse_upper, row_inverse[lower] = inverse_lower;
#pragma unroll
      for (int c = 0; c < 8; ++c)
        split_row_pair_in_place(tile + upper * XS + 4 * part_chunk(c), tile + lower * XS + 4 * part_chunk(c),
                                scale_upper, scale_lower);
    }
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    {  // wgmma: warpgroup h computes columns [128 h, 128 h + 128) of the 64 rows, its warp w the rows of m-tile w
      const int h = __shfl_sync(0xffffffffu, warp / 4, 0), w = warp % 4;  // (warp-uniform: no serialised wgmma)
      const uint32_t r_hi = static_cast<uint32_t>(__cvta_generic_to_shared(rchunk)) + h * (F / 4) * 16;
      float d[64];
#pragma unroll
      for (int e = 0; e < 64; ++e) d[e] = 0.f;
      uint32_t a_hi[2][4], a_lo[2][4];  // k-steps c % 2
      auto load_a = [&](int c, uint32_t(&hi)[4], uint32_t(&lo)[4]) {
        const uint4 u = *reinterpret_cast<const uint4*>(tile + (16 * w + rho) * XS + 4 * (4 * c + t));
        const uint4 v = *reinterpret_cast<const uint4*>(tile + (16 * w + rho + 8) * XS + 4 * (4 * c + t));
        hi[0] = u.x, hi[1] = u.y, hi[2] = u.z, hi[3] = u.w, lo[0] = v.x, lo[1] = v.y, lo[2] = v.z, lo[3] = v.w;
      };
      // R's k-step 0 has landed (the wait before the split); the cp.async writes go to the tensor cores' proxy.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();  // the split x and k-step 0 visible
      load_a(0, a_hi[0], a_lo[0]);
#pragma unroll 2
      for (int c = 0; c < KSTEPS; ++c) {
        const int b = c % 2;
        if (c + 1 < KSTEPS) load_r_chunk(c + 1);  // into the buffer of k-step c - 1, whose wgmma all completed
        wgmma_fence();
        const uint32_t r_b = r_hi + b * F * 16;  // k-step c's buffer: R_hi, then R_lo F * 8 bytes on
        const uint64_t hi_desc = wgmma_descriptor(r_b), lo_desc = wgmma_descriptor(r_b + F * 8);
        wgmma_f16_rs(d, a_lo[b], hi_desc);
        wgmma_f16_rs(d, a_hi[b], lo_desc);
        wgmma_f16_rs(d, a_hi[b], hi_desc);
        wgmma_commit();
        if (c + 1 < KSTEPS) load_a(c + 1, a_hi[1 - b], a_lo[1 - b]);  // while the tensor cores run
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        wgmma_wait<0>();
        __syncthreads();  // k-step c + 1 visible; every warpgroup done with k-step c's buffer
      }
#pragma unroll
      for (int e = 0; e < 64; ++e) fence_register(d[e]);
      // Accumulators: d[4 j + e] (e < 2) = fragment row g, column 128 h + 8 j + 2 t + e; e = 2, 3 fragment row g + 8.
      const float ru = row_inverse[16 * w + rho], rl = row_inverse[16 * w + rho + 8];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * h + 8 * j + 2 * t;
        float2 cu = make_float2(d[4 * j] * ru, d[4 * j + 1] * ru);
        float2 cl = make_float2(d[4 * j + 2] * rl, d[4 * j + 3] * rl);
        if (!uniform_columns) {
          const float2 ci = *reinterpret_cast<const float2*>(col_inverse + col);
          cu.x *= ci.x, cu.y *= ci.y, cl.x *= ci.x, cl.y *= ci.y;
        }
        *reinterpret_cast<float2*>(tile + (16 * w + rho) * XS + col) = cu;
        *reinterpret_cast<float2*>(tile + (16 * w + rho + 8) * XS + col) = cl;
      }
    }
#else  // mma.sync: warp w computes columns [32 w, 32 w + 32) of the 64 rows
    constexpr int MTILES = ROWS / 16, NT = 4;  // n-tiles per warp
    const int n_base = 32 * warp;
    float acc[MTILES][NT][4];
#pragma unroll
    for (int m = 0; m < MTILES; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
#pragma unroll 1
    for (int c = 0; c < KSTEPS; ++c) {
      if (c > 0) asm volatile("cp.async.wait_all;\n" ::: "memory");
      __syncthreads();  // k-step c (and the split x) visible; every warp done with k-step c - 1
      if (c + 1 < KSTEPS) load_r_chunk(c + 1);
      uint4 a_hi[MTILES], a_lo[MTILES];
#pragma unroll
      for (int m = 0; m < MTILES; ++m) {
        a_hi[m] = *reinterpret_cast<const uint4*>(tile + (16 * m + rho) * XS + 4 * (4 * c + t));
        a_lo[m] = *reinterpret_cast<const uint4*>(tile + (16 * m + rho + 8) * XS + 4 * (4 * c + t));
      }
      const uint4* rk = rchunk + (c % 2) * F + (n_base / 8) * 32 + lane;  // this warp's n-tiles
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4 b = rk[32 * n];  // {hi, hi, lo, lo}: logical k 2t, 2t + 1 and 2t + 8, 2t + 9 of each
#pragma unroll
        for (int m = 0; m < MTILES; ++m) mma_f16_16816(acc[m][n], a_lo[m].x, a_lo[m].y, a_lo[m].z, a_lo[m].w, b.x, b.y);
#pragma unroll
        for (int m = 0; m < MTILES; ++m) mma_f16_16816(acc[m][n], a_hi[m].x, a_hi[m].y, a_hi[m].z, a_hi[m].w, b.z, b.w);
#pragma unroll
        for (int m = 0; m < MTILES; ++m) mma_f16_16816(acc[m][n], a_hi[m].x, a_hi[m].y, a_hi[m].z, a_hi[m].w, b.x, b.y);
      }
    }
    __syncthreads();  // every warp done reading the split x
#pragma unroll
    for (int m = 0; m < MTILES; ++m) {
      const float ru = row_inverse[16 * m + rho], rl = row_inverse[16 * m + rho + 8];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int col = n_base + 8 * n + 2 * t;
        float2 cu = make_float2(acc[m][n][0] * ru, acc[m][n][1] * ru);
        float2 cl = make_float2(acc[m][n][2] * rl, acc[m][n][3] * rl);
        if (!uniform_columns) {
          const float2 ci = *reinterpret_cast<const float2*>(col_inverse + col);
          cu.x *= ci.x, cu.y *= ci.y, cl.x *= ci.x, cl.y *= ci.y;
        }
        *reinterpret_cast<float2*>(tile + (16 * m + rho) * XS + col) = cu;
        *reinterpret_cast<float2*>(tile + (16 * m + rho + 8) * XS + col) = cl;
      }
    }
#endif
    __syncthreads();
    if constexpr (KMAX == kWarpSearch) {  // a warp per row, every warp (its lane holds channels lane + 32 k)
      for (int r = warp; r < rows; r += THREADS / 32) {
        float v[D / 32];
#pragma unroll
        for (int k = 0; k < D / 32; ++k) v[k] = tile[r * XS + lane + 32 * k];
        quantize_row_warp<D>(v, p, row0 + r, k_top);
      }
    } else if (warp * 16 < rows) {
      // Two lanes per row: lanes r and r + 16 of warp w < 4 share row 16 w + r (rows past the end: zeros, not stored).
      const int r = warp * 16 + lane % 16;
      quantize_row_thread<D, KMAX, 2>(p, PaddedRow{tile + r * XS}, row0 + r, k_top, r < rows);
    }
    __syncthreads();  // tile consumed
  }
}

// The thread-per-row kernels keep the top K magnitudes of a row in a sorted register list of up to 32 (a clip ratio of
// 0.75 at d = 128, 0.875 at d = 256; every ratio at d = 64 above 0.5); larger K are quantised a warp per row (in the
// warp-per-row kernel, or at d = 256 with a rotation after the tensor-core x.R: quantize_pack_path).
constexpr int kRowsPathTopMax = 32;
// The current device's multiprocessor count (at least 1).
int device_sms() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms > 0 ? sms : 1;
}

// K = number of magnitudes at or above the clip threshold (0: no clipping).
int clip_top_count(float clip_ratio, int d) {
  if (clip_ratio >= 1.0f) return 0;
  int idx = (int)std::floor((double)clip_ratio * d);
  idx = idx < 0 ? 0 : (idx > d - 1 ? d - 1 : idx);
  return d - idx;
}

// d = 256 with a rotation: R split into the workspace by a first kernel, then x.R on tensor cores and the quantiser
// (KMAX = kWarpSearch: a warp per row), persistent CTAs.
template <int KMAX>
void launch_rotated_f16(const QuantizePackParams& p, int k_top, cudaStream_t stream) {
  constexpr int D = 256;
  static const int per_sm = [] {
    cudaFuncSetAttribute(quantize_rows_rotated_f16_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         rot_f16_smem_bytes<D>());
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, quantize_rows_rotated_f16_kernel<D, KMAX>, kRotF16Threads,
                                                  rot_f16_smem_bytes<D>());
    return n > 0 ? n : 1;
  }();
  const long tiles = (p.rows + kRowThreads - 1) / kRowThreads;
  const long ctas = std::min<long>(tiles, (long)per_sm * device_sms());
  // R's split in the caller's workspace, or in one of the stream's own (freed behind the kernels).
  RotationSplit256* split = static_cast<RotationSplit256*>(p.workspace);
  if (!split) {
    const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&split), sizeof(RotationSplit256), stream);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("quantize-pack: workspace allocation failed: ") + cudaGetErrorString(e));
  }
  rotation_split_kernel<<<D / 16, kRotF16Threads, 0, stream>>>(p.rotation, split);
  quantize_rows_rotated_f16_kernel<D, KMAX>
      <<<(unsigned)ctas, kRotF16Threads, rot_f16_smem_bytes<D>(), stream>>>(p, k_top, split);
  if (!p.workspace) cudaFreeAsync(split, stream);
}

template <int D, int KMAX>
void launch_rows(const QuantizePackParams& p, int k_top, cudaStream_t stream) {
  if (p.rotation && D <= 128) {
    if constexpr (D <= 128) {
      // Persistent: as many CTAs as fit on the device at once (each converts R once).
      static const int per_sm = [] {
        cudaFuncSetAttribute(quantize_rows_rotated_split_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             split_smem_bytes<D>());
        int n = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, quantize_rows_rotated_split_kernel<D, KMAX>,
                                                      split_warps<D>() * 32, split_smem_bytes<D>());
        return n > 0 ? n : 1;
      }();
      // A warp per row (KMAX = kWarpSearch) takes a warp's tile one row at a time: at d = 128 a CTA then takes a group
      // tile per consumer warpgroup, not one per warpgroup, so that small calls spread over more multiprocessors.
      constexpr int rows_per_cta = split_warp_rows<D>() * (KMAX == kWarpSearch && D == 128 ? 4 * kConsumerGroups
                                                                                          : split_warps<D>());
      const long ctas = std::min<long>((p.rows + rows_per_cta - 1) / rows_per_cta, (long)per_sm * device_sms());
      quantize_rows_rotated_split_kernel<D, KMAX>
          <<<(unsigned)ctas, split_warps<D>() * 32, split_smem_bytes<D>(), stream>>>(p, k_top);
    }
    return;
  }
  if (p.rotation) {
    if constexpr (D == 256) launch_rotated_f16<KMAX>(p, k_top, stream);
    return;
  }
  if constexpr (KMAX != kWarpSearch) {  // (unrotated rows with more clipped values: the warp-per-row kernel)
    static const bool configured = [] {
      cudaFuncSetAttribute(quantize_rows_kernel<D, KMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           row_tile_bytes<D>());
      return true;
    }();
    (void)configured;
    const unsigned blocks = (unsigned)((p.rows + row_tile_rows<D>() - 1) / row_tile_rows<D>());
    quantize_rows_kernel<D, KMAX><<<blocks, kRowThreads, row_tile_bytes<D>(), stream>>>(p, k_top);
  }
}

// Rotated calls with more than 32 clipped values take x.R on tensor cores and then a warp per row above this many rows
// per multiprocessor. d = 256: above one 32-row CTA of the warp-per-row kernel per multiprocessor, whose second CTA
// costs more than the tensor-core path's fixed cost (H200, clip 0.84: 46.9-47.7 against 54.2-54.6 us at 4224 rows,
// 69.1-69.2 against 53.6-54.5 at 4256: log, fifty-third round; since the fifty-fifth round's search 38.5-39.0 us at
// 4224 rows on the warp-per-row kernel, 39.1-39.6 at 4256 on the tensor cores: fifty-sixth round, call 1). d = 128, 64:
// where the times crossed (H200, clip 0.7 / 0.45, log, fifty-sixth round, call 2): d = 128 at 16384 rows (31.2 us
// either way; 29.4 against 15.9 at 4096, 47.5 against 56.1 at 32768, 860 against 1417 on 1M rows), d = 64 between
// 32768 rows (38.1 against 29.2) and 65536 (47.9 against 50.1; 611 against 646 on 1M rows).
int tensor_warp_rows_per_sm(int d) { return d == 256 ? kRowsPerCta : (d == 128 ? 128 : 512); }

// The current device's largest dynamic shared memory per block (opt-in), in bytes (0 without a device).
int device_smem_optin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;
  return bytes;
}

// Dynamic shared memory of the thread-per-row kernel that launch_rows takes (rotated d = 128: ~227 KB, which H100,
// H200 and B200 grant but A100 (163 KB) and L40S or RTX boards (99 KB) do not; rotated d = 256 ~100 KB).
template <int D>
int rows_path_smem_bytes(bool rotated) {
  if (!rotated) return row_tile_bytes<D>();
  if constexpr (D <= 128) return split_smem_bytes<D>();
  else return rot_f16_smem_bytes<D>();
}

template <int D>
bool launch_rows_fast(const QuantizePackParams& p, cudaStream_t stream) {
  const QuantizePackPath path = quantize_pack_path(p);
  if (path == QuantizePackPath::warp_per_row) return false;
  const int k = clip_top_count(p.clip_ratio, D);
  if (path == QuantizePackPath::tensor_rotate_warp_per_row) launch_rows<D, kWarpSearch>(p, k, stream);
  else if (k == 0) launch_rows<D, 0>(p, 0, stream);
  else if (k <= 4) launch_rows<D, 4>(p, k, stream);
  else if (k <= 6) launch_rows<D, 6>(p, k, stream);
  else if (k <= 8) launch_rows<D, 8>(p, k, stream);
  else if (k <= 12) launch_rows<D, 12>(p, k, stream);
  else if (k <= 16) launch_rows<D, 16>(p, k, stream);
  else launch_rows<D, 32>(p, k, stream);
  return true;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("quantize-pack: " + message);
}

template <int D>
void launch_dim(const QuantizePackParams& p, cudaStream_t stream) {
  const unsigned blocks = (unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta);
  if (launch_rows_fast<D>(p, stream)) return;  // thread per row (with x.R on tensor cores when rotating)
  const int k_top = clip_top_count(p.clip_ratio, D);
  if (p.rotation) {
    const int smem = (kRowsPerCta * (D + 4) + kChunk * D) * (int)sizeof(float);  // d = 256: 66 KB
    if (smem > device_smem_optin())
      throw std::runtime_error("quantize-pack: a rotation at d = " + std::to_string(D) + " needs " +
                               std::to_string(smem) + " bytes of shared memory per block; this GPU grants " +
                               std::to_string(device_smem_optin()));
    cudaFuncSetAttribute(quantize_pack_kernel<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    quantize_pack_kernel<D, true><<<blocks, kThreads, smem, stream>>>(p, k_top);
  } else {
    quantize_pack_kernel<D, false><<<blocks, kThreads, 0, stream>>>(p, k_top);
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
  require(!p.metadata_out_fp16 || p.metadata == MetadataRounding::fp16,
          "fp16 metadata storage needs metadata rounded to fp16");
  require(reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0, "workspace not 16-byte aligned");
}

size_t quantize_pack_workspace_bytes(const QuantizePackParams& p) {
  return p.rotation && p.head_dim == 256 && quantize_pack_path(p) != QuantizePackPath::warp_per_row
             ? sizeof(RotationSplit256)
             : 0;
}

// The thread-per-row kernels (launch_rows, launch_rows_fast) need 16-byte aligned operands and a device that grants
// their shared memory; they take clip thresholds among the top 32 magnitudes (or no clipping), and at d = 256 with a
// rotation any other too, quantised a warp per row after x.R on tensor cores. The rest: the warp-per-row kernel
// (slower; its codes and metadata meet the same bounds against the CPU quantiser).
QuantizePackPath quantize_pack_path(const QuantizePackParams& p) {
  auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (!aligned16(p.input) || !aligned16(p.codes) || !aligned16(p.rotation)) return QuantizePackPath::warp_per_row;
  const bool rotated = p.rotation != nullptr;
  const int smem = p.head_dim == 64    ? rows_path_smem_bytes<64>(rotated)
                   : p.head_dim == 128 ? rows_path_smem_bytes<128>(rotated)
                                       : rows_path_smem_bytes<256>(rotated);
  if (smem + kStaticSmemRoom > device_smem_optin()) return QuantizePackPath::warp_per_row;
  if (clip_top_count(p.clip_ratio, p.head_dim) <= kRowsPathTopMax) return QuantizePackPath::thread_per_row;
  // Rotated, more clipped values: x.R on tensor cores, then a warp per row, above a row count per multiprocessor
  // (tensor_warp_rows_per_sm); below, the warp-per-row kernel (fp32 x.R) ends before the tensor-core kernels' fixed
  // costs.
  const bool tensor = rotated && p.rows > (long)tensor_warp_rows_per_sm(p.head_dim) * device_sms();
  return tensor ? QuantizePackPath::tensor_rotate_warp_per_row : QuantizePackPath::warp_per_row;
}

const char* quantize_pack_path_name(QuantizePackPath path) {
  switch (path) {
    case QuantizePackPath::thread_per_row: return "thread-per-row";
    case QuantizePackPath::tensor_rotate_warp_per_row: return "tc-warp-per-row";
    case QuantizePackPath::warp_per_row: return "warp-per-row";
  }
  return "?";
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
