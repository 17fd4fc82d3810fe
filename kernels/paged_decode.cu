// Split-K flash-decoding kernels (see paged_decode.h). One CTA = (split, KV head, sequence), 4 warps.
// INT2 path: each warp streams 64-token blocks; K and V codes go straight from 2-bit fields into
// fp16 tensor-core fragments (1 + code/4, exact) with the g query heads as the n = 8 columns, so one
// read of each packed byte serves every query head of the KV head. Scale and zero are applied per
// token afterwards: q.k_hat = s (q.c - z sum q), sum_j w_j v_hat_j = sum_j w_j s_j (c_j - z_j).
// BF16 path: plain fp32 FMA (a lane per token for q.k, a lane per channel slice for p.v).
#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_fp16.h>

#include "paged_decode.h"

namespace oscar::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kGroup = kDecodeMaxGroup;

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_half2(uint32_t v) {
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
}
// D = A B + D, A [16 x 16] row-major fp16, B [16 x 8] col-major fp16, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t transpose_8x8_b16(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
// half2 (1 + c/4) of quarter qq of bytes 1 and 3 of w (0x3C00 = 1.0; code in mantissa bits 8-9).
__device__ __forceinline__ uint32_t codes_odd_bytes(uint32_t w, int qq) {
  return ((w >> (2 * qq)) & 0x03000300u) | 0x3C003C00u;
}
// The same for bytes 0 and 2.
__device__ __forceinline__ uint32_t codes_even_bytes(uint32_t w, int qq) {
  return ((w << (8 - 2 * qq)) & 0x03000300u) | 0x3C003C00u;
}

template <int N>
struct Bytes {
  static constexpr int kWords = N >= 4 ? N / 4 : 1;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const uint8_t* ptr) {
    if constexpr (N == 16) {
      uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (N == 8) {
      uint2 v = __ldg(reinterpret_cast<const uint2*>(ptr));
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (N == 4) {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(ptr));
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned short*>(ptr));
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ uint32_t byte_word(int e) const { return w[e / 4]; }
};

// Per-warp running state handed to the CTA combine: m (log2 domain), l, unnormalised O [g][d].
template <int D>
struct CtaShared {
  float o[kDecodeWarps][kGroup][D];
  float m[kDecodeWarps][kGroup];
  float l[kDecodeWarps][kGroup];
  float q[kGroup][D];                 // BF16 path: queries * scale * log2e
  float p[kDecodeWarps][kGroup][32];  // BF16 path: probabilities of the current 32-token block
};

// ---------------------------------------------------------------- INT2 path
template <int D>
__device__ void int2_warp(const PagedDecodeParams& p, CtaShared<D>& sh, int b, int kv, int t_begin, int t_end) {
  constexpr int Q = D / 4;           // packed bytes per token row
  constexpr int KB = D / 16;         // K bytes per thread per token (QK fragments)
  constexpr int VB = D / 32;         // V bytes per thread per token (PV fragments)
  constexpr int CHUNKS = D / 16;     // k16 chunks of the QK product
  constexpr int MT = D / 16;         // m16 tiles of the PV product (output channels)
  constexpr int TILES = D == 256 ? 2 : 4;  // 16-token tiles per step
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int g = p.group;
  const float logit_factor = 4.0f * p.softmax_scale * kLog2e;

  // B fragments of q (n = head gid): chunk c = 4*wd + qq covers channels qq*Q + tq*KB + 4*wd + {0,2 | 1,3}.
  uint32_t qf[CHUNKS][2];
  float qsum_own = 0;
  {
    const float* q = p.queries + ((size_t)b * p.num_kv_heads * g + (size_t)kv * g + gid) * D;
    const bool live = gid < g;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int wd = c / 4, qq = c % 4;
      const int base = qq * Q + tq * KB + 4 * wd;
      float v0 = live ? q[base + 0] : 0.f, v1 = live ? q[base + 1] : 0.f;
      float v2 = live ? q[base + 2] : 0.f, v3 = live ? q[base + 3] : 0.f;
      qf[c][0] = pack_half2(v0, v2);
      qf[c][1] = pack_half2(v1, v3);
      float2 a = unpack_half2(qf[c][0]), bb = unpack_half2(qf[c][1]);
      qsum_own += (a.x + a.y) + (bb.x + bb.y);
    }
    qsum_own += __shfl_xor_sync(0xffffffffu, qsum_own, 1);
    qsum_own += __shfl_xor_sync(0xffffffffu, qsum_own, 2);
  }
  // Sums of the (rounded) queries of the heads this thread holds in C fragments: 2tq, 2tq+1.
  const float qsum0 = __shfl_sync(0xffffffffu, qsum_own, (2 * tq) * 4);
  const float qsum1 = __shfl_sync(0xffffffffu, qsum_own, (2 * tq + 1) * 4);

  float o[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY;  // heads 2tq, 2tq+1
  float l0 = 0.f, l1 = 0.f, wz0 = 0.f, wz1 = 0.f;

  const int P = p.int2_page_size;
  const int32_t* table = p.int2_page_table + (size_t)b * p.int2_max_pages;
  constexpr int STEP = 16 * TILES;

  // Register double buffering: the next block's codes and metadata are in flight while this one computes.
  Bytes<KB> kc[TILES][2];
  Bytes<VB> vc[TILES][4];
  float4 meta[TILES][2];
  auto load_block = [&](int blk, Bytes<KB> (&kc)[TILES][2], Bytes<VB> (&vc)[TILES][4], float4 (&meta)[TILES][2]) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const int tile = blk + 16 * t;
      if (tile < t_end) {
        const int page = table[tile / P];
        const size_t row = ((size_t)page * p.num_kv_heads + kv) * P + (tile % P);
        const uint8_t* kp = p.key_codes + row * Q;
        const uint8_t* vp = p.value_codes + row * Q;
        kc[t][0].load(kp + gid * Q + tq * KB);
        kc[t][1].load(kp + (gid + 8) * Q + tq * KB);
        vc[t][0].load(vp + (2 * tq) * Q + gid * VB);
        vc[t][1].load(vp + (2 * tq + 1) * Q + gid * VB);
        vc[t][2].load(vp + (2 * tq + 8) * Q + gid * VB);
        vc[t][3].load(vp + (2 * tq + 9) * Q + gid * VB);
        const float4* mp = reinterpret_cast<const float4*>(p.int2_metadata) + row;
        meta[t][0] = tile + gid < t_end ? __ldg(mp + gid) : make_float4(0.f, 0.f, 0.f, 0.f);
        meta[t][1] = tile + gid + 8 < t_end ? __ldg(mp + gid + 8) : make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        kc[t][0].zero(), kc[t][1].zero();
        vc[t][0].zero(), vc[t][1].zero(), vc[t][2].zero(), vc[t][3].zero();
        meta[t][0] = meta[t][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  };
  Bytes<KB> nkc[TILES][2];
  Bytes<VB> nvc[TILES][4];
  float4 nmeta[TILES][2];
  int blk = t_begin + warp * STEP;
  if (blk < t_end) load_block(blk, nkc, nvc, nmeta);
  for (; blk < t_end; blk += kDecodeWarps * STEP) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      kc[t][0] = nkc[t][0], kc[t][1] = nkc[t][1];
      vc[t][0] = nvc[t][0], vc[t][1] = nvc[t][1], vc[t][2] = nvc[t][2], vc[t][3] = nvc[t][3];
      meta[t][0] = nmeta[t][0], meta[t][1] = nmeta[t][1];
    }
    if (blk + kDecodeWarps * STEP < t_end) load_block(blk + kDecodeWarps * STEP, nkc, nvc, nmeta);
    // S^T [16 tokens x 8 heads] per tile.
    float s[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const int wd = c / 4, qq = c % 4;
        mma_16816(s[t], codes_even_bytes(kc[t][0].w[wd], qq), codes_even_bytes(kc[t][1].w[wd], qq),
                  codes_odd_bytes(kc[t][0].w[wd], qq), codes_odd_bytes(kc[t][1].w[wd], qq), qf[c][0], qf[c][1]);
      }
    }
    // Logits (log2 domain), block max per head.
    float bmax0 = -INFINITY, bmax1 = -INFINITY;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = blk + 16 * t + gid + 8 * r;
        const float4 mt = meta[t][r];
        const float alpha = logit_factor * mt.x, beta = 1.f + 0.25f * mt.y;
        const bool valid = tok < t_end;
        s[t][2 * r + 0] = valid ? alpha * (s[t][2 * r + 0] - beta * qsum0) : -INFINITY;
        s[t][2 * r + 1] = valid ? alpha * (s[t][2 * r + 1] - beta * qsum1) : -INFINITY;
        bmax0 = fmaxf(bmax0, s[t][2 * r + 0]);
        bmax1 = fmaxf(bmax1, s[t][2 * r + 1]);
      }
    }
#pragma unroll
    for (int off = 4; off < 32; off *= 2) {
      bmax0 = fmaxf(bmax0, __shfl_xor_sync(0xffffffffu, bmax0, off));
      bmax1 = fmaxf(bmax1, __shfl_xor_sync(0xffffffffu, bmax1, off));
    }
    const float mn0 = fmaxf(m0, bmax0), mn1 = fmaxf(m1, bmax1);
    const float corr0 = exp2f(m0 - mn0), corr1 = exp2f(m1 - mn1);
    m0 = mn0, m1 = mn1;
    l0 *= corr0, l1 *= corr1, wz0 *= corr0, wz1 *= corr1;
#pragma unroll
    for (int i = 0; i < MT; ++i) o[i][0] *= corr0, o[i][1] *= corr1, o[i][2] *= corr0, o[i][3] *= corr1;

#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      uint32_t pb[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float4 mt = meta[t][r];
        const float p0 = exp2f(s[t][2 * r + 0] - m0), p1 = exp2f(s[t][2 * r + 1] - m1);
        l0 += p0, l1 += p1;
        const uint32_t w = pack_half2(p0 * mt.z, p1 * mt.z);
        const float2 wf = unpack_half2(w);
        wz0 += wf.x * (4.f + mt.w);
        wz1 += wf.y * (4.f + mt.w);
        pb[r] = transpose_8x8_b16(w);  // -> (tokens 2tq, 2tq+1 [+8]; head gid)
      }
#pragma unroll
      for (int e = 0; e < VB; ++e) {
        const int sel = (e % 4) | ((e % 4) << 4) | ((4 + e % 4) << 8) | ((4 + e % 4) << 12);
        const uint32_t x = __byte_perm(vc[t][0].byte_word(e), vc[t][1].byte_word(e), sel);
        const uint32_t y = __byte_perm(vc[t][2].byte_word(e), vc[t][3].byte_word(e), sel);
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
          mma_16816(o[2 * e + pp], codes_odd_bytes(x, 2 * pp), codes_odd_bytes(x, 2 * pp + 1),
                    codes_odd_bytes(y, 2 * pp), codes_odd_bytes(y, 2 * pp + 1), pb[0], pb[1]);
        }
      }
    }
  }
  // Reduce l and wz over the 8 token rows (gid).
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    wz0 += __shfl_xor_sync(0xffffffffu, wz0, off);
    wz1 += __shfl_xor_sync(0xffffffffu, wz1, off);
  }
  const int h0 = 2 * tq, h1 = 2 * tq + 1;
#pragma unroll
  for (int e = 0; e < VB; ++e) {
#pragma unroll
    for (int pp = 0; pp < 2; ++pp) {
      const float* c = o[2 * e + pp];
      const int ch0 = (2 * pp) * Q + gid * VB + e, ch1 = (2 * pp + 1) * Q + gid * VB + e;
      if (h0 < g) sh.o[warp][h0][ch0] = 4.f * c[0] - wz0, sh.o[warp][h0][ch1] = 4.f * c[2] - wz0;
      if (h1 < g) sh.o[warp][h1][ch0] = 4.f * c[1] - wz1, sh.o[warp][h1][ch1] = 4.f * c[3] - wz1;
    }
  }
  if (gid == 0) {
    if (h0 < g) sh.m[warp][h0] = m0, sh.l[warp][h0] = l0;
    if (h1 < g) sh.m[warp][h1] = m1, sh.l[warp][h1] = l1;
  }
}

// ---------------------------------------------------------------- BF16 path
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

template <int D>
__device__ void bf16_warp(const PagedDecodeParams& p, CtaShared<D>& sh, int b, int kv, int t_begin, int t_end) {
  constexpr int CPL = D / 32;  // channels per lane in P.V
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = p.group;
  const int P = p.bf16_page_size;
  const int32_t* table = p.bf16_page_table + (size_t)b * p.bf16_max_pages;
  float o[kGroup][CPL];
  float m[kGroup], l[kGroup];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int c = 0; c < CPL; ++c) o[h][c] = 0.f;
  }
  for (int blk = t_begin + warp * 32; blk < t_end; blk += kDecodeWarps * 32) {
    const int page = table[blk / P];
    const size_t row0 = ((size_t)page * p.num_kv_heads + kv) * P + (blk % P);
    const int tok = blk + lane;
    const bool valid = tok < t_end;
    float s[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) s[h] = 0.f;
    if (valid) {
      const uint4* kp = reinterpret_cast<const uint4*>(p.bf16_keys + (row0 + lane) * D);
      constexpr int HALF = D / 8 > 16 ? 16 : D / 8;
#pragma unroll
      for (int part = 0; part < D / 8; part += HALF) {
        uint4 kv4[HALF];
#pragma unroll
        for (int i = 0; i < HALF; ++i) kv4[i] = __ldg(kp + part + i);
#pragma unroll
        for (int i = 0; i < HALF; ++i) {
          const float k[8] = {bf16_lo(kv4[i].x), bf16_hi(kv4[i].x), bf16_lo(kv4[i].y), bf16_hi(kv4[i].y),
                              bf16_lo(kv4[i].z), bf16_hi(kv4[i].z), bf16_lo(kv4[i].w), bf16_hi(kv4[i].w)};
#pragma unroll
          for (int h = 0; h < kGroup; ++h) {
            if (h < g) {
              const float4 qa = *reinterpret_cast<const float4*>(&sh.q[h][(part + i) * 8]);
              const float4 qb = *reinterpret_cast<const float4*>(&sh.q[h][(part + i) * 8 + 4]);
              s[h] += qa.x * k[0] + qa.y * k[1] + qa.z * k[2] + qa.w * k[3] + qb.x * k[4] + qb.y * k[5] +
                      qb.z * k[6] + qb.w * k[7];
            }
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h < g) {
        float x = valid ? s[h] : -INFINITY;
        float bm = x;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, off));
        const float mn = fmaxf(m[h], bm);
        const float corr = exp2f(m[h] - mn);
        m[h] = mn;
        const float pr = exp2f(x - mn);
        l[h] = l[h] * corr + pr;
        sh.p[warp][h][lane] = pr;
#pragma unroll
        for (int c = 0; c < CPL; ++c) o[h][c] *= corr;
      }
    }
    __syncwarp();
    const int n = min(32, t_end - blk);
    const uint16_t* vbase = p.bf16_values + row0 * D + lane * CPL;
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
      float v[CPL];
      const uint16_t* vp = vbase + (size_t)j * D;
      if constexpr (CPL == 8) {
        uint4 r = __ldg(reinterpret_cast<const uint4*>(vp));
        v[0] = bf16_lo(r.x), v[1] = bf16_hi(r.x), v[2] = bf16_lo(r.y), v[3] = bf16_hi(r.y);
        v[4] = bf16_lo(r.z), v[5] = bf16_hi(r.z), v[6] = bf16_lo(r.w), v[7] = bf16_hi(r.w);
      } else if constexpr (CPL == 4) {
        uint2 r = __ldg(reinterpret_cast<const uint2*>(vp));
        v[0] = bf16_lo(r.x), v[1] = bf16_hi(r.x), v[2] = bf16_lo(r.y), v[3] = bf16_hi(r.y);
      } else {
        uint32_t r = __ldg(reinterpret_cast<const unsigned int*>(vp));
        v[0] = bf16_lo(r), v[1] = bf16_hi(r);
      }
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        if (h < g) {
          const float pr = sh.p[warp][h][j];
#pragma unroll
          for (int c = 0; c < CPL; ++c) o[h][c] += pr * v[c];
        }
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (h < g) {
      float lsum = l[h];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);
#pragma unroll
      for (int c = 0; c < CPL; ++c) sh.o[warp][h][lane * CPL + c] = o[h][c];
      if (lane == 0) sh.m[warp][h] = m[h], sh.l[warp][h] = lsum;
    }
  }
}

// ---------------------------------------------------------------- kernel
template <int D, bool HAS_INT2>
__global__ void __launch_bounds__(kDecodeWarps * 32) paged_decode_kernel(const PagedDecodeParams p) {
  __shared__ __align__(16) CtaShared<D> sh;
  const int split = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  const int g = p.group;
  // Empty warps leave m = -inf, l = 0, o = 0.
  for (int i = threadIdx.x; i < kDecodeWarps * kGroup; i += blockDim.x) {
    (&sh.m[0][0])[i] = -INFINITY;
    (&sh.l[0][0])[i] = 0.f;
  }
  for (int i = threadIdx.x; i < kDecodeWarps * kGroup * D; i += blockDim.x) (&sh.o[0][0][0])[i] = 0.f;
  const bool int2 = HAS_INT2 && split < p.int2_splits;
  int t_begin, t_end;
  if (int2) {
    const int len = p.int2_lengths[b];
    t_begin = split * p.int2_chunk;
    t_end = min(len, t_begin + p.int2_chunk);
  } else {
    const int s = split - (HAS_INT2 ? p.int2_splits : 0);
    const int len = p.bf16_lengths[b];
    t_begin = s * p.bf16_chunk;
    t_end = min(len, t_begin + p.bf16_chunk);
    const float qscale = p.softmax_scale * kLog2e;
    const float* q = p.queries + ((size_t)b * p.num_kv_heads * g + (size_t)kv * g) * D;
    for (int i = threadIdx.x; i < kGroup * D; i += blockDim.x)
      (&sh.q[0][0])[i] = i < g * D ? q[i] * qscale : 0.f;
  }
  __syncthreads();
  if (t_begin < t_end) {
    if constexpr (HAS_INT2) {
      if (int2)
        int2_warp<D>(p, sh, b, kv, t_begin, t_end);
      else
        bf16_warp<D>(p, sh, b, kv, t_begin, t_end);
    } else {
      bf16_warp<D>(p, sh, b, kv, t_begin, t_end);
    }
  }
  __syncthreads();
  // Combine the warps' states; write this split's partial.
  const size_t part = ((size_t)b * p.num_kv_heads + kv) * (p.int2_splits + p.bf16_splits) + split;
  float* out = p.partial_out + part * g * D;
  for (int i = threadIdx.x; i < g * D; i += blockDim.x) {
    const int h = i / D, c = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, sh.m[w][h]);
    float num = 0.f, den = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float f = exp2f(sh.m[w][h] - mx);
        num += f * sh.o[w][h][c];
        den += f * sh.l[w][h];
      }
    }
    out[i] = den > 0.f ? num / den : 0.f;
    if (c == 0) p.partial_lse2[part * g + h] = den > 0.f ? mx + log2f(den) : -INFINITY;
  }
}

template <bool HAS_INT2>
void launch_for_dim(const PagedDecodeParams& p, cudaStream_t stream) {
  dim3 grid(p.splits_total(), p.num_kv_heads, p.batch);
  dim3 block(kDecodeWarps * 32);
  switch (p.head_dim) {
    case 64: paged_decode_kernel<64, HAS_INT2><<<grid, block, 0, stream>>>(p); break;
    case 128: paged_decode_kernel<128, HAS_INT2><<<grid, block, 0, stream>>>(p); break;
    case 256: paged_decode_kernel<256, HAS_INT2><<<grid, block, 0, stream>>>(p); break;
    default: break;
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("paged decode: " + message);
}

}  // namespace

void check_paged_decode(const PagedDecodeParams& p) {
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          "head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  require(p.group >= 1 && p.group <= kDecodeMaxGroup,
          "GQA ratio " + std::to_string(p.group) + " is not supported (1 to 8 query heads per KV head)");
  require(p.batch >= 1 && p.num_kv_heads >= 1, "batch and KV heads must be positive");
  require(p.batch <= 65535 && p.num_kv_heads <= 65535, "batch or KV heads above the grid limit");
  require(p.queries && p.partial_out && p.partial_lse2, "null queries or partial outputs");
  require(p.splits_total() >= 1, "no splits (both tiers absent)");
  require(std::isfinite(p.softmax_scale) && p.softmax_scale > 0, "softmax scale must be positive");
  if (p.int2_splits > 0) {
    require(p.int2_page_size >= 16 && p.int2_page_size % 16 == 0, "INT2 page size must be a multiple of 16");
    require(p.int2_chunk > 0 && p.int2_chunk % kInt2SplitQuantum == 0, "INT2 split chunk must be a multiple of 256");
    require(p.key_codes && p.value_codes && p.int2_metadata && p.int2_page_table && p.int2_lengths,
            "null INT2 cache pointer");
  }
  if (p.bf16_splits > 0) {
    require(p.bf16_page_size >= 32 && p.bf16_page_size % 32 == 0, "BF16 page size must be a multiple of 32");
    require(p.bf16_chunk > 0 && p.bf16_chunk % kBf16SplitQuantum == 0, "BF16 split chunk must be a multiple of 128");
    require(p.bf16_keys && p.bf16_values && p.bf16_page_table && p.bf16_lengths, "null BF16 cache pointer");
  }
}

void launch_paged_decode(const PagedDecodeParams& p, cudaStream_t stream) {
  check_paged_decode(p);
  if (p.int2_splits > 0)
    launch_for_dim<true>(p, stream);
  else
    launch_for_dim<false>(p, stream);
}

int choose_split_chunk(long max_tokens, int batch, int num_kv_heads, int target_ctas, int quantum) {
  if (max_tokens <= 0) return quantum;
  const long pairs = (long)batch * num_kv_heads;
  long splits = (target_ctas + pairs - 1) / pairs;
  if (splits < 1) splits = 1;
  long chunk = (max_tokens + splits - 1) / splits;
  chunk = (chunk + quantum - 1) / quantum * quantum;
  return (int)chunk;
}

}  // namespace oscar::kernels
