// Split-K flash-decoding kernels (see paged_decode.h). One CTA = (split, KV head, sequence), 4 warps.
//
// INT2 path. Each warp runs its own cp.async pipeline (STAGES deep; the batch-1 kernels load through
// registers instead, see int2_cta's STAGED) that copies whole 16-token tiles (K codes [16, d/4], V codes
// [16, d/4], metadata [16, 4] fp32 or fp16: contiguous in a page) into its shared-memory ring, two tiles per
// stage (four at d = 64), and computes on them with mma.sync, the g <= 8 query heads of the KV head as the
// n = 8 columns, so each byte read serves every query head. No dequantisation:
// q.k_hat = s (q.c - z sum q) and sum_t w_t v_hat_t = sum_t w_t s_t (c_t - z_t).
// Q.K on int8 tensor cores (m16n8k32, codes unsigned, query signed, exact int32 sums): one AND per 4
// codes puts each byte's code of one quarter at bits 4-5 or 6-7, i.e. 16c or 64c as an unsigned int8
// (two quarters from the word, two from the word times 16, an IMAD on the FMA pipe); the query is two
// int8 terms per channel (see int2_cta), each term its own accumulator (at g <= 4 one product holds both,
// int2_cta's PACK).
// P.V on fp16 tensor cores (m16n8k16, fp32 accumulate): a code at mantissa bits 6-7 or 8-9 of a half
// with exponent 16 or 4 reads as (16 + c) or (4 + c) exactly (one LOP3 per two codes); one byte swap
// and a multiply by 16 (IMAD) per 32-bit pair-word bring its 16 codes to such positions (offsets <= 16,
// so the fp32 accumulation of the offset costs < 2^-20 relative). V's pair-words (one 16-bit column of
// two tokens) come from ldmatrix .trans. The offsets are constants per channel, removed afterwards as
// off_c sum_t w_t. The mma k index of QK and the m index of PV are channel permutations; both are
// undone exactly (the q fragments are built in the permuted order, the output channels written back
// unpermuted).
//
// BF16 path: mma.sync on bf16 operands, queries and softmax weights as two bf16 terms each (see bf16_warp).
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"
#include "paged_decode.h"

namespace oscar::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
// Headroom of the INT2 path's running softmax reference over the max (log2 domain): after a rescale of the
// accumulators, rises of the max by less than this need none (random data: the rescale ran in 15 % of the warp
// stages of batch 64 / 100K without headroom; H200, uniform shapes 1.4 % faster, ragged 2.1 %).
constexpr float kMaxHeadroom = 3.f;
constexpr int kGroup = kDecodeMaxGroup;
constexpr int kThreads = kDecodeWarps * 32;
#ifndef OSCAR_DECODE_MIN_CTAS
#define OSCAR_DECODE_MIN_CTAS 4  // d <= 128: CTAs per SM the register budget must allow (128 registers)
#endif
constexpr int kMinCtasPerSm = OSCAR_DECODE_MIN_CTAS;

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_half2(uint32_t v) {
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
}
// ldmatrix .trans: lane (gid, tq) of matrix i gets rows 2tq (low half) and 2tq + 1 of column gid; lanes
// 8i .. 8i + 7 give the row addresses of matrix i (16 bytes each).
template <int N>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[N], uint32_t smem) {
  static_assert(N == 2 || N == 4, "x2 or x4");
  if constexpr (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem));
}
__device__ __forceinline__ uint32_t transpose_8x8_b16(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
// 16-byte cp.async to a shared-window address, skipped (no branch) when !pred.
__device__ __forceinline__ void cp_async16_if(uint32_t smem, const void* gmem, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(smem),
      "l"(gmem), "r"((int)pred)
      : "memory");
}
// Streaming (evict-first) loads into registers, skipped when !pred (the registers keep their values), and
// shared-memory stores of them.
__device__ __forceinline__ void ldg16_if(uint4& r, const void* gmem, bool pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
               : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
               : "l"(gmem), "r"((int)pred));
}
__device__ __forceinline__ void ldg8_if(uint2& r, const void* gmem, bool pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p ld.global.cs.v2.u32 {%0, %1}, [%2];\n}\n"
               : "+r"(r.x), "+r"(r.y)
               : "l"(gmem), "r"((int)pred));
}
__device__ __forceinline__ void sts16(uint32_t smem, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void sts8(uint32_t smem, const uint2& v) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(smem), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- INT2 path
// Code fields of a 16-bit half (V): byte b (0 low, 1 high) and quarter qq (bits 2qq..2qq+1 of that
// byte); channel = qq * d/4 + byte index in the row. A field moved to mantissa bits 6-7 / 8-9 of a half
// with exponent 16 / 4 reads as off + c, off = 16 / 4.
// The exponent words come from constant memory (values the compiler cannot fold), so each
// (src & mask) | expo is one LOP3 with an immediate mask and the exponent in a register; with both as
// immediates ptxas emits two LOP3 per operand.
// The third word, 16, multiplies instead of shifting left by 4: an IMAD (FMA pipe) where a shift would
// queue on the ALU pipe behind the LOP3s (K's codes use it too).
__constant__ uint32_t kExponentWords[3] = {0x4C004C00u, 0x44004400u, 16u};  // 16, 4 (fp16 x2)
struct Exponents {
  uint32_t e16, e4, times16;
  __device__ Exponents() : e16(kExponentWords[0]), e4(kExponentWords[1]), times16(kExponentWords[2]) {}
};
__device__ __forceinline__ uint32_t field_at(uint32_t src, int pos, const Exponents& x) {
  const uint32_t mask = pos == 6 ? 0x00C000C0u : 0x03000300u;
  const uint32_t expo = pos == 6 ? x.e16 : x.e4;
  return (src & mask) | expo;
}
__host__ __device__ constexpr int field_offset(int pos) { return pos == 6 ? 16 : 4; }

// K: the int8 operands of word w (4 bytes of one row, 16 codes): quarter qq of every byte, as the
// unsigned int8 (16 or 64) * c: qq 0 and 1 from (16 w) & 0x30.. / 0xC0.., qq 2 and 3 from w & 0x30.. /
// 0xC0... Class j = 0 (qq 0 and 2, x16) and j = 1 (qq 1 and 3, x64) make one mma each, qq j in its
// k slots 0-15 and qq j + 2 in 16-31.
__host__ __device__ constexpr int k_class_weight(int j) { return j == 0 ? 16 : 64; }
// Int8 query terms: q_c = s m_c (hi_c + lo_c / 256) + e_c, hi in [-127, 127], lo in [-128, 127], m_c the
// class weight, s a power of two; the int32 sums start at kAccBias (the bits of the float 1.5 * 2^23), so
// their bits read as the float 1.5 * 2^23 + sum exactly while |sum| < 2^22, fma(hi bits, s, -12632064 s)
// = s (sum_hi - 1.5 * 2^15) is exact, and fma(lo bits, s / 256, that) = s (sum_hi + sum_lo / 256)
// rounds once (12632064 = 1.5 * 2^23 (1 + 1 / 256)).
constexpr int32_t kAccBias = 0x4B400000;
constexpr float kAccBiasBoth = 12632064.f;
// V: 8 half2 per pair-word X from X, X << 4, Y, Y << 4, Y = X with the two bytes of each half swapped
// (one PRMT; offsets <= 16).
struct VField {
  int src, pos, b, qq;  // src 0: X, 1: X << 4, 2: Y, 3: Y << 4
};
__host__ __device__ constexpr VField v_field(int f) {
  constexpr VField t[8] = {{0, 6, 0, 3}, {0, 8, 1, 0}, {2, 6, 1, 3}, {2, 8, 0, 0},
                           {1, 6, 0, 1}, {1, 8, 0, 2}, {3, 6, 1, 1}, {3, 8, 1, 2}};
  return t[f];
}

template <int D>
struct Int2Geom {
  static constexpr int Q = D / 4;          // packed bytes per token row
  static constexpr int KW = D / 64;        // K words per thread per token row (QK A fragments)
  static constexpr int VB = D / 32;        // V bytes per thread per token (PV A fragments)
  static constexpr int NX = VB / 2;        // pair-words per token pair
  static constexpr int QC = Q / 16;        // 16-byte chunks per token row
  static constexpr int MT = D / 16;        // m16 tiles of the PV product (output channels)
  // 16-token tiles per warp per stage, and ring stages. At d = 64 a stage carries four tiles: the loop's work
  // that does not scale with d (copy issue, page-table reads, waits, the stage max) then serves twice the
  // tokens, 11 % fewer instructions per token (H200, Llama-3.2-1B geometry: 64 / 128K 939.6 -> 895.6 us,
  // 32 / 32K 137.6 -> 132.9; three ring stages, so that short CTAs keep their prologue: 8 / 8K 24.2 -> 24.7
  // us with three, 26.0 with four).
  static constexpr int TILES = D == 64 ? 4 : 2;
  static constexpr int STAGES = D == 128 ? 4 : 3;
  static constexpr int TILE_BYTES = 16 * (2 * Q + 16);  // K codes, V codes, metadata
  static constexpr int WARP_BYTES = STAGES * TILES * TILE_BYTES;
  static constexpr int RING_BYTES = kDecodeWarps * WARP_BYTES;
  static constexpr int CPY = 2 * Q / 32;  // 16-byte code chunks per lane per tile (K codes [0, Q), V [Q, 2Q))
  // Per-warp lane tables after the rings: smem offsets [3][32] uint32, copy sources [CPY + 1][32] pointers.
  static constexpr int TABLE_BYTES = 3 * 32 * 4 + (CPY + 1) * 32 * 8;
  static constexpr int CTA_BYTES = RING_BYTES + kDecodeWarps * TABLE_BYTES;
  static constexpr int STEP = kDecodeWarps * TILES * 16;  // tokens per CTA step
  static_assert(STEP % kInt2SplitQuantum == 0, "a CTA step must be a whole number of split quanta");
};

// Row r of a 16-token tile (S row / mma k slot) reads physical token tile_token(r): slots 2i, 2i+1 of
// the PV k dimension are tokens i, i + 4.
__host__ __device__ constexpr int tile_token(int r) { return (r & 8) | (r >> 1 & 3) | (r & 1) << 2; }
// V codes in shared memory: 16-byte chunk s of token t's row sits at chunk slot s ^ v_swizzle(t), so the
// 8 rows of an ldmatrix (tokens tile_token(0..7) + 8 hi, one chunk column) hit distinct bank groups.
template <int QC>
__host__ __device__ constexpr int v_swizzle(int t) {
  return QC == 1 ? 0 : (t / (8 / QC)) % QC;
}

// Metadata bytes per token row: (k scale, k zero, v scale, v zero) as fp32 or (M16) fp16. The ring keeps
// the fp32 tile size either way; fp16 metadata fills the first half of the tile's metadata slot.
template <bool M16>
constexpr int meta_row_bytes() {
  return M16 ? 8 : 16;
}

// Per-lane shared-memory offsets within a tile (bytes), kept in a per-warp table in shared memory and
// read there each stage: computed from the lane id in the loop they cost ~20 ALU instructions per stage
// (at 128 registers ptxas rematerialises them rather than hold them); a __constant__ table indexed by
// lane serialises (batch 32 / 32K 235 -> 279 us). k: row tile_token(gid) of the K codes at word tq * KW
// (row gid + 8: + 8 Q); meta: that row's (scale, zero) pairs (+ 8 rows for gid + 8); v: this lane's row
// address of the V ldmatrix: matrix m = (lane / 8) % 4 of the first ldmatrix, (hi, s) = (m / NX, m % NX)
// (the second, at D = 256, is hi = 1: + 8 rows), row lane % 8 = token tile_token(lane % 8) + 8 hi.
template <int D, bool M16>
__device__ __forceinline__ void lane_offsets(int lane, uint32_t& k, uint32_t& meta, uint32_t& v) {
  using G = Int2Geom<D>;
  const int gid = lane / 4, tq = lane % 4;
  k = tile_token(gid) * G::Q + tq * G::KW * 4;
  meta = 32 * G::Q + tile_token(gid) * meta_row_bytes<M16>();
  const int m = (lane >> 3) % (2 * G::NX >= 4 ? 4 : 2), vhi = m / G::NX, vs = m % G::NX;
  const int vt = tile_token(lane & 7) + 8 * vhi;
  v = 16 * G::Q + 16 * (vt * G::QC + (vs ^ v_swizzle<G::QC>(vt)));
}

// Per-warp running state handed to the CTA combine: m (log2 domain), l, unnormalised O [g][d].
template <int D>
struct CtaShared {
  float o[kDecodeWarps][kGroup][D];
  float m[kDecodeWarps][kGroup];
  float l[kDecodeWarps][kGroup];
};
// BF16 path: each warp's q fragments (hi and lo bf16 terms) after CtaShared, [warp][D / 16][2][32] uint2.
template <int D>
constexpr int bf16_q_bytes() {
  return kDecodeWarps * (D / 16) * 2 * 32 * 8;
}
template <int D>
constexpr int smem_bytes() {
  constexpr int bf16 = (int)sizeof(CtaShared<D>) + bf16_q_bytes<D>();
  return bf16 > Int2Geom<D>::CTA_BYTES ? bf16 : Int2Geom<D>::CTA_BYTES;
}

// One CTA over INT2 tokens [t_begin, t_end) of (b, kv). Shared memory: the stage rings (ring) alias sh;
// all warps call this (uniform), and it ends with sh.o/m/l written for heads < g.
// PAIRED (pages of >= 32 tokens): tiles 2i and 2i + 1 of a warp's stage are 32 consecutive tokens of one
// page (splits start at multiples of 64), so such a pair reads one page-table entry and tile 2i + 1's
// copies are tile 2i's addresses plus a constant.
// SPEC: the prologue's page-table entries come in spec_pages (read by the caller before the length was known).
// STAGED (the parallel-merge kernels, i.e. batch 1): instead of the cp.async pipeline, each warp loads its
// next stage by ld.global into registers while it computes the current one, and stores them into the ring at
// the top of the next step (same ring layout; metadata as 8 bytes per lane). One stage in flight per warp:
// faster on these short CTAs (H200, d = 128: batch 1 / 8K 14.2 -> 13.6 us, 100K 32.1 -> 31.5 us), slower
// on the large grids (all kernels this way: 32 / 100K 590 -> 614 us), where more stages need to fly.
// M16: the metadata is fp16 (8 bytes per row, read as 8 bytes and widened in the loop), else fp32.
// BLOCKS (the split-table and work-list kernels): the page-table entries of 32 runs come in one read per lane, a
// block ahead, and each stage takes its own by a shuffle: ~8-12 instructions fewer per warp stage than a read per
// stage (H200: split tables 0.4-1.9 % faster; work lists, the ragged and merge-CTA grids, up to 2.8 %, geometric
// mean over the Qwen3-8B shapes -0.4 %). Not in the kernel without a work list or table (the ragged one-wave grids
// lost 1.5-2.6 % when they ran there, for a reason not found). Needs load_pages called for k = 0, 1, ..
// PACK (g <= 4): the free mma columns take the query's lo terms (see below): half the Q.K products and half the
// per-lane softmax work, for two shuffles per tile and one per P fragment. In the batch-1 kernels 869 -> 759
// instructions per warp loop at d = 128 (H200: batch 1 / 100K 29.3 -> 28.2 us, 128K 34.0 -> 32.6); in the others it
// replaced two softmax streams per warp (tile 2j + u of a stage in columns 4u .. 4u + 3, two online softmaxes merged
// at the end), which halved the softmax work but not the products, and made the staged loop spill: 766 -> 742 per
// warp loop (split tables, d = 128), Qwen3-8B uniform calls 1.5 % and ragged ones 1.9 % faster (geometric means).
template <int D, bool PAIRED, bool SPEC = false, bool STAGED = false, bool M16 = false, bool BLOCKS = false,
          bool PACK = false>
__device__ void int2_cta(const PagedDecodeParams& p, CtaShared<D>& sh, uint8_t* ring, int b, int kv, int t_begin,
                         int t_end, const int (*spec_pages)[Int2Geom<D>::TILES] = nullptr) {
  using G = Int2Geom<D>;
  constexpr int Q = G::Q, KW = G::KW, NX = G::NX, TILES = G::TILES, STAGES = G::STAGES;
  constexpr int PRE = STAGED ? 1 : STAGES - 1;  // stages in flight after the prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int g = p.group;
  const float logit_factor = p.softmax_scale * kLog2e;
  const Exponents ex;
  const int head = PACK ? gid % 4 : gid;  // query head of mma column gid
  // PACK (g <= 4): the query's hi term of head h in mma column h, its lo term in column h + 4, so one Q.K product per
  // k step serves both terms; lanes tq and tq ^ 2 then swap halves, and lane (gid, tq) keeps token row gid + 8 (tq / 2)
  // of heads 2 (tq % 2), 2 (tq % 2) + 1: two logits, exponentials and running sums per tile instead of four.
  constexpr int NT = PACK ? 1 : 2;  // Q.K accumulators per tile (query terms)
  const bool low = tq < 2;          // PACK: this lane keeps row gid (else gid + 8)

  float o[G::MT][4];
#pragma unroll
  for (int i = 0; i < G::MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Running reference m (log2 domain) of heads 2tq, 2tq + 1. Logits are formed relative to it (one FFMA gives
  // s - m), so m must be finite from the start: it is 0 until the first stage sets it (`first`). A stage whose
  // logits pass m moves it to kMaxHeadroom above their max, so that the many small rises of the max that follow
  // (new maxima within 2^kMaxHeadroom of the old) need no rescale; softmax weights stay <= 1 and >= 2^-kMaxHeadroom
  // of the largest.
  float m0 = 0.f, m1 = 0.f, l0 = 0.f, l1 = 0.f;
  bool first = true;
  float w0 = 0.f, w1 = 0.f, wz0 = 0.f, wz1 = 0.f;  // sum of PV weights (as fed, fp16) and of weight * zero

  const int P = p.int2_page_size;
  const int page_shift = 31 - __clz(P);
  const int32_t* table = p.int2_page_table + (size_t)b * p.int2_max_pages;
  uint8_t* wring = ring + warp * G::WARP_BYTES;
  const int nsteps = (t_end - t_begin + G::STEP - 1) / G::STEP;
  auto tile_start = [&](int k, int t) { return t_begin + k * G::STEP + (warp * TILES + t) * 16; };
  // Page-table entries, one per run of tiles in one page (a tile, or with PAIRED a pair). BLOCKS: lane i holds the
  // entry of run i % RUNS of stage kb + i / RUNS, read for SPB stages at once, a block ahead, and a stage takes its
  // entries by shuffles instead of a read of its own.
  static_assert(!(BLOCKS && STAGED), "the staged prologue reads its entries by stage");
  constexpr int RUN = PAIRED ? 2 : 1, RUNS = TILES / RUN, SPB = 32 / RUNS;
  int page_block = 0, page_next = 0;
  auto read_block = [&](int kb) {
    const int tok = tile_start(kb + lane / RUNS, (lane % RUNS) * RUN);
    return tok < t_end ? __ldg(table + ((uint32_t)tok >> page_shift)) : 0;
  };
  auto load_pages = [&](int k, int (&pg)[TILES]) {
    if constexpr (BLOCKS) {
      if (k % SPB == 0) {
        page_block = k == 0 ? read_block(0) : page_next;
        page_next = read_block(k + SPB);
      }
#pragma unroll
      for (int t = 0; t < TILES; t += RUN) {
        pg[t] = __shfl_sync(0xffffffffu, page_block, (k % SPB) * RUNS + t / RUN);
        if (RUN == 2) pg[t + 1] = pg[t];
      }
    } else {
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const int tok = tile_start(k, t);
        if (PAIRED && (t & 1))
          pg[t] = pg[t - 1];
        else
          pg[t] = tok < t_end ? __ldg(table + ((uint32_t)tok >> page_shift)) : 0;
      }
    }
  };
  // Copy addresses: per-lane source bases (in the lane table) and the shared-window ring address are
  // computed once, so a tile costs one 64-bit multiply-add per 16-byte copy; copies past t_end are
  // predicated off.
  constexpr int CPY = G::CPY;
  static_assert(CPY >= 1 && (Q >= 32 || Q == 16), "chunk split");
  // Copy sources of this lane (code chunks, metadata), kept in the lane table like the offsets.
  const uint8_t** src_tbl =
      reinterpret_cast<const uint8_t**>(ring + G::RING_BYTES + warp * G::TABLE_BYTES + 3 * 32 * 4) + lane;
#pragma unroll
  for (int j = 0; j < CPY; ++j) {
    const int c = 32 * j + lane;
    // V: this lane fills chunk slot v = c - Q of the tile, i.e. token v / QC's chunk (v % QC) ^ swizzle.
    const int v = c - Q, vt = v / G::QC, vs = (v % G::QC) ^ v_swizzle<G::QC>(vt);
    src_tbl[32 * j] = c < Q ? p.key_codes + c * 16 : p.value_codes + (vt * G::QC + vs) * 16;
  }
  // Metadata of a tile: 16 rows of MB bytes, 16-byte copies by its first MB lanes (STAGED: 8 bytes per lane,
  // lanes 0-31 at fp32, 0-15 at fp16).
  constexpr int MB = meta_row_bytes<M16>();
  src_tbl[32 * CPY] = static_cast<const uint8_t*>(p.int2_metadata) + (STAGED ? lane * 8 : (lane % MB) * 16);
  const bool meta_lane = lane < MB, meta_lane8 = lane < 2 * MB;
  const uint32_t page_rows = (uint32_t)p.num_kv_heads * (uint32_t)P, kv_rows = (uint32_t)kv * (uint32_t)P;
  const uint32_t ring_lane = static_cast<uint32_t>(__cvta_generic_to_shared(wring)) + lane * 16;
  // This lane's table [k, meta, v] (written and read by this lane only).
  uint32_t* lane_tbl = reinterpret_cast<uint32_t*>(ring + G::RING_BYTES + warp * G::TABLE_BYTES) + lane;
  lane_offsets<D, M16>(lane, lane_tbl[0], lane_tbl[32], lane_tbl[64]);
  if (PACK && !low) lane_tbl[32] += 8 * MB;  // PACK: the metadata row of this lane's token row
  constexpr int NMAT = 2 * NX, LDM = NMAT >= 4 ? 4 : 2, NLDM = NMAT / LDM;  // V: 8x8 matrices, per ldmatrix
  const uint32_t wring_smem = static_cast<uint32_t>(__cvta_generic_to_shared(wring));
  // Byte offsets of tile t of stage k in the code and metadata pools: 32-bit row index of the tile's first
  // token (pools hold < 2^32 rows, checked on the host), 64-bit offsets.
  // Copy sources of tile t of stage k (src[j] + code_off: code chunk j, src[CPY] + meta_off: metadata) and
  // whether the tile starts before t_end. The lane's source table is read before the first copy (a copy's
  // "memory" clobber would force re-reads).
  struct TileSources {
    const uint8_t* src[CPY + 1];
  };
  auto lane_sources = [&] {
    TileSources s;
#pragma unroll
    for (int j = 0; j <= CPY; ++j) s.src[j] = src_tbl[32 * j];
    return s;
  };
  auto tile_at = [&](int k, int t, const int (&pg)[TILES], size_t& code_off, size_t& meta_off) {
    const int t0 = PAIRED ? (t & ~1) : t;
    const uint32_t row = (uint32_t)pg[t0] * page_rows + kv_rows + (uint32_t)(tile_start(k, t0) & (P - 1));
    code_off = (size_t)row * Q + (t - t0) * 16 * Q;
    meta_off = (size_t)row * MB + (t - t0) * 16 * MB;
    return tile_start(k, t) < t_end;
  };
  auto issue = [&](int k, const int (&pg)[TILES]) {
    const uint32_t sbuf = ring_lane + (k % STAGES) * (TILES * G::TILE_BYTES);
    const TileSources ts = lane_sources();
    const auto& src = ts.src;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      size_t code_off, meta_off;
      const bool live = tile_at(k, t, pg, code_off, meta_off);
      const uint32_t tb = sbuf + t * G::TILE_BYTES;
#pragma unroll
      for (int j = 0; j < CPY; ++j) cp_async16_if(tb + j * 512, src[j] + code_off, live);
      cp_async16_if(tb + 32 * Q, src[CPY] + meta_off, live && meta_lane);
    }
  };
  // STAGED: the registers of one stage (code chunks as the copies above, 8 bytes of metadata per lane).
  uint4 rc[STAGED ? TILES : 1][CPY];
  uint2 rm[STAGED ? TILES : 1];
#pragma unroll
  for (int t = 0; t < (STAGED ? TILES : 1); ++t) {
    rm[t] = make_uint2(0u, 0u);
#pragma unroll
    for (int j = 0; j < CPY; ++j) rc[t][j] = make_uint4(0u, 0u, 0u, 0u);
  }
  auto load_regs = [&](int k, const int (&pg)[TILES]) {
    const TileSources ts = lane_sources();
    const auto& src = ts.src;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      size_t code_off, meta_off;
      const bool live = tile_at(k, t, pg, code_off, meta_off);
#pragma unroll
      for (int j = 0; j < CPY; ++j) ldg16_if(rc[t][j], src[j] + code_off, live);
      ldg8_if(rm[t], src[CPY] + meta_off, live && meta_lane8);
    }
  };
  auto store_regs = [&](int k) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const uint32_t tb = wring_smem + (k % STAGES) * (TILES * G::TILE_BYTES) + t * G::TILE_BYTES;
#pragma unroll
      for (int j = 0; j < CPY; ++j) sts16(tb + j * 512 + lane * 16, rc[t][j]);
      if (meta_lane8) sts8(tb + 32 * Q + lane * 8, rm[t]);
    }
  };

  // The q loads go out with the prologue's page-table reads; the q fragments are built while the
  // prologue copies are in flight. qraw[u][qq]: head gid's channels qq * Q + 4 (tq KW + u) + 0..3, the
  // codes of this lane's K word u, quarter qq.
  float4 qraw[KW][4];
  {
    const float* q = p.queries + ((size_t)b * p.num_kv_heads * g + (size_t)kv * g + head) * D;
    const bool live = head < g;
#pragma unroll
    for (int u = 0; u < KW; ++u)
#pragma unroll
      for (int qq = 0; qq < 4; ++qq)
        qraw[u][qq] = live ? *reinterpret_cast<const float4*>(q + qq * Q + 4 * (tq * KW + u))
                           : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  int pg[TILES];
  {
    int first[PRE][TILES];  // all page-table reads of the prologue in flight together
    if constexpr (SPEC) {
#pragma unroll
      for (int k = 0; k < PRE; ++k)
#pragma unroll
        for (int t = 0; t < TILES; ++t) first[k][t] = spec_pages[k][t];
#pragma unroll
      for (int t = 0; t < TILES; ++t) pg[t] = spec_pages[PRE][t];
    } else {
#pragma unroll
      for (int k = 0; k < PRE; ++k) load_pages(k, first[k]);
      load_pages(PRE, pg);
    }
    if constexpr (STAGED) {
      load_regs(0, first[0]);
    } else {
#pragma unroll
      for (int k = 0; k < PRE; ++k) {
        issue(k, first[k]);
        cp_async_commit();
      }
    }
  }
  // B fragments of x = q * softmax_scale * log2e (logits come out in the log2 domain, up to the key
  // scale) for head gid as two int8 terms: x_c ~ s m_c (hi_c + lo_c / 256), s the smallest power of two
  // >= max |x| / 2032 over the warp's heads (so |hi| <= 127 at m = 16 and <= 32 at m = 64), hi =
  // rint(x / (s m)), lo = rint(256 (x / (s m) - hi)) clamped to [-128, 127]: |x_c - x~_c| <= s m_c / 256,
  // i.e. at most max |x| / 16256 (class x16) and max |x| / 4064 (class x64), against 2^-9 |x_c| for a
  // bf16 query (the tests' bound). The kernel computes the logits of x~ exactly up to fp32 rounding: the int32 sums are
  // exact and below 2^22 in magnitude (|sum_lo| <= 128 * 3 * (16 + 64) * d / 2 = 15360 d, 3.9e6 at
  // d = 256). qb[term][u][j] = (b0, b1): the bytes of quarters j and j + 2 of word u.
  uint32_t qb[2][KW][2][2];
  float qsum_own = 0.f;  // sum_c m_c (hi_c + lo_c / 256) over this lane's channels
  float qscale;          // s
  {
    float mx = 0.f;
#pragma unroll
    for (int u = 0; u < KW; ++u)
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const float4 v = qraw[u][qq];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      }
#pragma unroll
    for (int off = 1; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    mx *= logit_factor;
    // (A query below 1e-30 becomes 0, so that s stays a normal float.)
    qscale = mx > 1e-30f ? __uint_as_float((__float_as_uint(mx * (1.f / 2032.f)) + 0x007FFFFFu) & 0x7F800000u) : 1.f;
    // Rounding to an integer by adding and subtracting 1.5 * 2^23 (|y| < 2^22) leaves the integer's low
    // byte (two's complement) in the low byte of the sum's bits: no conversion instructions (XU pipe).
    // |x / (s m)| <= 127 (s >= max |x| / 2032), so hi needs no clamp.
    // The fragments are the same in every warp of the CTA (same lanes, same query, same s). SHARE (the STAGED
    // kernels, batch 1): the 4 KW groups (u, j, half) are shared out: warp w converts those of index (2 u + j) 2 +
    // half = w mod 4 (warp-uniform branches) and hands them to the others through its ring's last stage slot, which
    // nothing fills before the loop: a barrier after the writes, and one after the reads, before any warp's loop
    // stores into it. H200, batch 1 / 8K and 1 / 32K 2 % faster, 1 / 100K 0.4 %; in the cp.async kernels the two
    // barriers cost more than the ~330 instructions per warp saved (uniform 8 / 8K +3.3 %, ragged 8 / 8K +2.7 %).
    constexpr bool SHARE = STAGED;
    constexpr float kRound = 12582912.f;
    constexpr int NG = 4 * KW, NGW = NG / kDecodeWarps;
    static_assert(NG % kDecodeWarps == 0, "whole groups per warp");
    constexpr int kSlot = (STAGES - 1) * TILES * G::TILE_BYTES;  // byte offset of the hand-over in a warp's ring
    static_assert((2 * NGW + 1) * 32 * 4 <= TILES * G::TILE_BYTES, "the hand-over fits in one stage slot");
    uint32_t* handover = reinterpret_cast<uint32_t*>(wring + kSlot) + lane;  // [NGW][term][32], then [32] sums
#pragma unroll
    for (int u = 0; u < KW; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float factor = logit_factor / (qscale * (float)k_class_weight(j));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int idx = (2 * u + j) * 2 + half;
          if (SHARE && idx % kDecodeWarps != warp) continue;
          const float4 v4 = qraw[u][j + 2 * half];
          const float v[4] = {v4.x, v4.y, v4.z, v4.w};
          uint32_t hb[4], lb[4];
          float sum = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float x = v[i] * factor;
            const float hr = __fadd_rn(x, kRound), h = __fadd_rn(hr, -kRound);
            const float lr = __fadd_rn(fminf((x - h) * 256.f, 127.f), kRound), l = __fadd_rn(lr, -kRound);
            hb[i] = __float_as_uint(hr), lb[i] = __float_as_uint(lr);
            sum += h + l * (1.f / 256.f);
          }
          const uint32_t hi = __byte_perm(__byte_perm(hb[0], hb[1], 0x0040), __byte_perm(hb[2], hb[3], 0x0040), 0x5410);
          const uint32_t lo = __byte_perm(__byte_perm(lb[0], lb[1], 0x0040), __byte_perm(lb[2], lb[3], 0x0040), 0x5410);
          if constexpr (SHARE) {
            const int at = (idx / kDecodeWarps) * 2 * 32;
            handover[at] = hi, handover[at + 32] = lo;
          } else if constexpr (PACK) {
            qb[0][u][j][half] = gid < 4 ? hi : lo;
          } else {
            qb[0][u][j][half] = hi, qb[1][u][j][half] = lo;
          }
          qsum_own += (float)k_class_weight(j) * sum;
        }
      }
    if constexpr (SHARE) {
      reinterpret_cast<float*>(handover)[NGW * 2 * 32] = qsum_own;
      qsum_own = 0.f;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const uint32_t* from = reinterpret_cast<const uint32_t*>(ring + w * G::WARP_BYTES + kSlot) + lane;
#pragma unroll
        for (int idx = w; idx < NG; idx += kDecodeWarps) {
          const int u = idx / 4, j = idx / 2 % 2, half = idx % 2, at = (idx / kDecodeWarps) * 2 * 32;
          if constexpr (PACK) {
            qb[0][u][j][half] = from[gid < 4 ? at : at + 32];
          } else {
            qb[0][u][j][half] = from[at];
            qb[1][u][j][half] = from[at + 32];
          }
        }
        qsum_own += reinterpret_cast<const float*>(from)[NGW * 2 * 32];
      }
      __syncthreads();
    }
#pragma unroll
    for (int off = 1; off < 4; off *= 2) qsum_own += __shfl_xor_sync(0xffffffffu, qsum_own, off);
  }
  // Heads of this thread's logits: 2tq, 2tq+1 (PACK: 2 (tq % 2), 2 (tq % 2) + 1), their sum_c x~_c.
  const int qh = PACK ? 2 * (tq % 2) : 2 * tq;
  const float qsum0 = __shfl_sync(0xffffffffu, qsum_own, qh * 4) * qscale;
  const float qsum1 = __shfl_sync(0xffffffffu, qsum_own, (qh + 1) * 4) * qscale;
  const float qscale_lo = qscale * (1.f / 256.f), qbias = -kAccBiasBoth * qscale;
  const int32_t bias[4] = {kAccBias, kAccBias, kAccBias, kAccBias};
  for (int k = 0; k < nsteps; ++k) {
    if constexpr (STAGED) {
      // Stage k's registers into its slot (a full wait: ptxas keeps every ld.global on one scoreboard, and
      // nothing else is outstanding here; the other lanes may still read slot k - 1), then stage k + 1's loads,
      // which fly during compute(k).
      store_regs(k);
      __syncwarp();
      load_regs(k + 1, pg);
      load_pages(k + 2, pg);
    } else {
      issue(k + STAGES - 1, pg);
      cp_async_commit();
      load_pages(k + STAGES, pg);
      cp_async_wait<STAGES - 1>();
      __syncwarp();
    }
    // A full stage (every token of the warp's tiles < t_end) skips the masks.
    auto compute = [&](auto full_tag) {
      constexpr bool FULL = decltype(full_tag)::value;
      const uint8_t* buf = wring + (k % STAGES) * (TILES * G::TILE_BYTES);
      // S^T [16 tokens x 8 columns] per tile: acc[t][term] (int32 from kAccBias); rows gid and gid + 8 are tokens
      // tile_token(gid), tile_token(gid + 8).
      int32_t acc[TILES][NT][4];
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const uint8_t* tb = buf + t * G::TILE_BYTES;
        uint32_t kw[2][KW];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* kp = tb + lane_tbl[0] + r * 8 * Q;
          if constexpr (KW == 1) {
            kw[r][0] = *reinterpret_cast<const uint32_t*>(kp);
          } else if constexpr (KW == 2) {
            const uint2 v = *reinterpret_cast<const uint2*>(kp);
            kw[r][0] = v.x, kw[r][1] = v.y;
          } else {
            const uint4 v = *reinterpret_cast<const uint4*>(kp);
            kw[r][0] = v.x, kw[r][1] = v.y, kw[r][2] = v.z, kw[r][3] = v.w;
          }
        }
#pragma unroll
        for (int u = 0; u < KW; ++u) {
          uint32_t a[2][4];  // [row][quarter]
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t w = kw[r][u], w16 = w * ex.times16;
            a[r][0] = w16 & 0x30303030u, a[r][1] = w16 & 0xC0C0C0C0u;
            a[r][2] = w & 0x30303030u, a[r][3] = w & 0xC0C0C0C0u;
          }
#pragma unroll
          for (int term = 0; term < NT; ++term)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint32_t b0 = qb[term][u][j][0], b1 = qb[term][u][j][1];
              if (u + j == 0)
                mma_u8s8_16832(acc[t][term], a[0][j], a[1][j], a[0][j + 2], a[1][j + 2], b0, b1, bias);
              else
                mma_u8s8_16832(acc[t][term], a[0][j], a[1][j], a[0][j + 2], a[1][j + 2], b0, b1, acc[t][term]);
            }
        }
      }
      // This lane's logits: s[j] of tile j (rows gid, gid + 8; heads 2tq, 2tq + 1), minus the running reference (log2
      // domain), with the stage max per head. PACK: s[j][0..1], row gid + 8 (tq / 2) of heads 2 (tq % 2), +1, from
      // this lane's hi or lo half and the partner's (lane tq ^ 2).
      constexpr int NE = PACK ? 2 : 4, NR = PACK ? 1 : 2;  // logits and token rows per tile and lane
      float s[TILES][NE];
      float4 meta[TILES][NR];
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        if constexpr (PACK) {
          // Lane tq < 2 holds the hi sums (rows gid, gid + 8), lane tq ^ 2 the lo sums of the same heads: each sends
          // the row it does not keep. (hi first: that FMA is exact, see kAccBias.)
          const int32_t(&c)[4] = acc[j][0];
          const int32_t r0 = __shfl_xor_sync(0xffffffffu, low ? c[2] : c[0], 2);
          const int32_t r1 = __shfl_xor_sync(0xffffffffu, low ? c[3] : c[1], 2);
          const int32_t hi0 = low ? c[0] : r0, hi1 = low ? c[1] : r1, lo0 = low ? r0 : c[2], lo1 = low ? r1 : c[3];
          s[j][0] = __fmaf_rn(__int_as_float(lo0), qscale_lo, __fmaf_rn(__int_as_float(hi0), qscale, qbias));
          s[j][1] = __fmaf_rn(__int_as_float(lo1), qscale_lo, __fmaf_rn(__int_as_float(hi1), qscale, qbias));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            s[j][i] = __fmaf_rn(__int_as_float(acc[j][1][i]), qscale_lo,
                                __fmaf_rn(__int_as_float(acc[j][0][i]), qscale, qbias));
        }
        const uint8_t* tb = buf + j * G::TILE_BYTES + lane_tbl[32];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const int tok = tile_start(k, j) + tile_token(gid + 8 * (PACK ? !low : r));
          float4 mt;
          if constexpr (M16) {
            const uint2 h = *reinterpret_cast<const uint2*>(tb + r * 8 * MB);
            const float2 key = unpack_half2(h.x), value = unpack_half2(h.y);
            mt = make_float4(key.x, key.y, value.x, value.y);
          } else {
            mt = *reinterpret_cast<const float4*>(tb + r * 8 * MB);
          }
          meta[j][r] = FULL || tok < t_end ? mt : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
      float bmax0, bmax1;
      const float neg_m0 = -m0, neg_m1 = -m1;
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const int tok = tile_start(k, j) + tile_token(gid + 8 * (PACK ? !low : r));
          const float4 mt = meta[j][r];
          const bool valid = FULL || tok < t_end;
          s[j][2 * r + 0] = valid ? fmaf(mt.x, fmaf(-mt.y, qsum0, s[j][2 * r + 0]), neg_m0) : -INFINITY;
          s[j][2 * r + 1] = valid ? fmaf(mt.x, fmaf(-mt.y, qsum1, s[j][2 * r + 1]), neg_m1) : -INFINITY;
          bmax0 = j + r == 0 ? s[j][0] : fmaxf(bmax0, s[j][2 * r + 0]);
          bmax1 = j + r == 0 ? s[j][1] : fmaxf(bmax1, s[j][2 * r + 1]);
        }
      }
      // The max over the 16 token rows (lanes gid) is only needed when some lane's logits exceed the
      // running reference: after the first stages that is rare, and the shuffles stay off the common path.
      // A computed stage has a valid token (its tile 0 starts before t_end), so the stage max is finite.
      if (__any_sync(0xffffffffu, first || bmax0 > 0.f || bmax1 > 0.f)) {
#pragma unroll
        for (int off = PACK ? 2 : 4; off < 32; off *= 2) {  // (PACK: the rows of lane tq ^ 2 too)
          bmax0 = fmaxf(bmax0, __shfl_xor_sync(0xffffffffu, bmax0, off));
          bmax1 = fmaxf(bmax1, __shfl_xor_sync(0xffffffffu, bmax1, off));
        }
        // m moves up by delta >= 0 to kMaxHeadroom above the stage max where that passed it (the first stage:
        // from the placeholder 0).
        const float delta0 = first || bmax0 > 0.f ? bmax0 + kMaxHeadroom : 0.f;
        const float delta1 = first || bmax1 > 0.f ? bmax1 + kMaxHeadroom : 0.f;
        const float corr0 = first ? 1.f : exp2f(-delta0), corr1 = first ? 1.f : exp2f(-delta1);
        first = false;
        m0 += delta0, m1 += delta1;
        l0 *= corr0, l1 *= corr1, w0 *= corr0, w1 *= corr1, wz0 *= corr0, wz1 *= corr1;
#pragma unroll
        for (int i = 0; i < G::MT; ++i) o[i][0] *= corr0, o[i][1] *= corr1, o[i][2] *= corr0, o[i][3] *= corr1;
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
          for (int i = 0; i < NE; i += 2) s[j][i] -= delta0, s[j][i + 1] -= delta1;
      }
      // P.V of tile t with B fragments pb (k slots 2tq, 2tq + 1 [+ 8], column gid).
      auto pv = [&](int t, uint32_t pb0, uint32_t pb1) {
        const uint32_t vaddr =
            wring_smem + (k % STAGES) * (TILES * G::TILE_BYTES) + t * G::TILE_BYTES + lane_tbl[64];
        // V pair-words by ldmatrix .trans: x[hi][s] = 16-bit column 8s + gid of tokens (tq, tq + 4) + 8 hi,
        // i.e. k slots (2tq, 2tq + 1) [+ 8].
        uint32_t x[2][NX];
#pragma unroll
        for (int i = 0; i < NLDM; ++i) {
          uint32_t r[LDM];
          ldmatrix_trans(r, vaddr + i * 8 * Q);
#pragma unroll
          for (int j = 0; j < LDM; ++j) x[(i * LDM + j) / NX][(i * LDM + j) % NX] = r[j];
        }
#pragma unroll
        for (int xi = 0; xi < NX; ++xi) {
          uint32_t src[2][4];
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const uint32_t X = x[hi][xi];
            const uint32_t Y = __byte_perm(X, 0u, 0x2301);
            src[hi][0] = X, src[hi][1] = X * ex.times16, src[hi][2] = Y, src[hi][3] = Y * ex.times16;
          }
#pragma unroll
          for (int fp = 0; fp < 8; fp += 2) {
            // m-tile 4 xi + fp / 2: row gid = field fp, row gid + 8 = field fp + 1.
            const VField f0 = v_field(fp), f1 = v_field(fp + 1);
            mma_f16_16816(o[4 * xi + fp / 2], field_at(src[0][f0.src], f0.pos, ex), field_at(src[0][f1.src], f1.pos, ex),
                          field_at(src[1][f0.src], f0.pos, ex), field_at(src[1][f1.src], f1.pos, ex), pb0, pb1);
          }
        }
      };
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        uint32_t pb[2];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const float4 mt = meta[j][r];
          const float p0 = exp2f(s[j][2 * r + 0]), p1 = exp2f(s[j][2 * r + 1]);  // exp2(-inf) = 0 (masked)
          l0 += p0, l1 += p1;
          const uint32_t wh = pack_half2(p0 * mt.z, p1 * mt.z);
          const float2 wf = unpack_half2(wh);
          w0 += wf.x, w1 += wf.y;
          wz0 = fmaf(wf.x, mt.w, wz0), wz1 = fmaf(wf.y, mt.w, wz1);
          if constexpr (PACK) {
            // Row gid + 8's weights from lane tq ^ 2; columns 4-7 (lanes tq >= 2) are empty heads.
            const uint32_t other = __shfl_xor_sync(0xffffffffu, wh, 2);
            pb[0] = transpose_8x8_b16(low ? wh : 0u);
            pb[1] = transpose_8x8_b16(low ? other : 0u);
          } else {
            pb[r] = transpose_8x8_b16(wh);  // -> (k slots 2tq, 2tq+1 [+8]; column gid)
          }
        }
        pv(j, pb[0], pb[1]);
      }
    };
    if (tile_start(k, TILES - 1) + 16 <= t_end)
      compute(std::true_type{});
    else if (tile_start(k, 0) < t_end)
      compute(std::false_type{});
    if constexpr (!STAGED) __syncwarp();
  }
  if constexpr (!STAGED) cp_async_wait<0>();
  // Reduce l, w, wz over the 16 token rows (gid; PACK: and the rows of lane tq ^ 2).
#pragma unroll
  for (int off = PACK ? 2 : 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    w0 += __shfl_xor_sync(0xffffffffu, w0, off);
    w1 += __shfl_xor_sync(0xffffffffu, w1, off);
    wz0 += __shfl_xor_sync(0xffffffffu, wz0, off);
    wz1 += __shfl_xor_sync(0xffffffffu, wz1, off);
  }
  __syncthreads();  // the rings alias sh
  // Slots 2tq, 2tq + 1 of the warp's state: heads 2tq, 2tq + 1 (PACK: lanes tq < 2 hold them, as after the sums).
  const int h0 = 2 * tq, h1 = 2 * tq + 1;
  const bool live0 = h0 < g, live1 = h1 < g;
#pragma unroll
  for (int mt = 0; mt < G::MT; ++mt) {
    const int xi = mt / 4, fp = 2 * (mt % 4);
    const VField f0 = v_field(fp), f1 = v_field(fp + 1);
    const int ch0 = f0.qq * Q + 2 * (8 * xi + gid) + f0.b, ch1 = f1.qq * Q + 2 * (8 * xi + gid) + f1.b;
    const float off0 = (float)field_offset(f0.pos), off1 = (float)field_offset(f1.pos);
    if (live0) {
      sh.o[warp][h0][ch0] = o[mt][0] - fmaf(off0, w0, wz0);
      sh.o[warp][h0][ch1] = o[mt][2] - fmaf(off1, w0, wz0);
    }
    if (live1) {
      sh.o[warp][h1][ch0] = o[mt][1] - fmaf(off0, w1, wz1);
      sh.o[warp][h1][ch1] = o[mt][3] - fmaf(off1, w1, wz1);
    }
  }
  if (first) m0 = m1 = -INFINITY;  // no stage: an empty warp (l = 0, o = 0)
  if (gid == 0) {
    if (live0) sh.m[warp][h0] = m0, sh.l[warp][h0] = l0;
    if (live1) sh.m[warp][h1] = m1, sh.l[warp][h1] = l1;
  }
}

// ---------------------------------------------------------------- BF16 path
// A warp takes 32-token blocks (two 16-token tiles) and runs both products on mma.sync m16n8k16 with bf16
// operands and fp32 accumulation, the g query heads as n = 8 like the INT2 path. Operands split in two
// bf16 terms (x = hi + lo, hi = RN_bf16(x), lo = RN_bf16(x - hi): ~16 significant bits) for the queries and
// the softmax weights; the cache values are bf16 already, so both products are exact up to fp32
// accumulation and the dropped lo * (bf16 value) term of ~2^-17 relative.
__device__ __forceinline__ uint32_t word(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}
// (hi, lo) bf16x2 words of the pair (x0, x1), x0 in the low half.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Channel order of the QK product: chunk 2c + e (16 channels) takes channels 32c + 8tq + 4e + {0, 1, 2, 3}
// at k slots {2tq, 2tq + 1, 2tq + 8, 2tq + 9}, so a 16-byte load of a key row feeds two chunks.
// P.V: lane (gid, tq) owns output channels [gid * D / 8, +D / 8); m-tile i rows gid / gid + 8 are its
// channels 2i / 2i + 1, and the k slots are the tile's tokens in order.
// BALANCED (the kernels without an INT2 path: the BF16 decode, caches before their first demotion; the split-table
// kernels; the work-list kernels but those with four merge CTAs per pair; the parallel-merge kernels, whose BF16 splits
// may be 64-token multiples, kBf16ParallelQuantum, which the blocks do not cover): warp w takes the w-th quarter of the
// range's 16-token tiles, instead of blocks of two tiles dealt round the warps, which left a 320-token range (10
// blocks) three blocks on two warps and two on the others (H200: the BF16 decode 7-12 % faster; in the work lists,
// whose BF16 CTAs fill the slots the INT2 CTAs free, ragged 64 / 8K 2.4-3.2 % and the uniform merge-CTA grids 1-3 %
// faster; the split tables 0.1-0.7 %, and their d = 128 kernels lost their spill). The other kernels with an INT2 path
// keep the blocks: there the balanced loop changes ptxas's code for the INT2 loop, and the calls they serve, whose BF16
// share is small, ran 1-3 % slower (ragged 8 / 32K - 8 / 128K with four merge CTAs per pair; in the work lists ragged
// 32 / 32K pays 1.1-1.2 % of this).
// PACK (g <= 4): column h of the Q.K product holds head h's hi query term, column h + 4 its lo term, and the P.V
// product the weights' hi and lo terms the same way, as int2_cta's PACK: one product of each instead of two (the
// BF16-only loop 412 -> 346 SASS instructions per tile at d = 128; H200, the BF16 decode 0.7 % faster, geometric
// mean of nine shapes, 8 / 128K 1.9 %).
template <int D, bool PREFETCH_KEYS, bool BALANCED, bool PACK = false>
__device__ void bf16_warp(const PagedDecodeParams& p, CtaShared<D>& sh, int b, int kv, int t_begin, int t_end) {
  constexpr int CHUNKS = D / 16, KV4 = D / 32, MT = D / 16, VW = D / 64;  // VW: uint4 per row per lane in P.V
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4;
  const int g = p.group;
  const int P = p.bf16_page_size;
  const int32_t* table = p.bf16_page_table + (size_t)b * p.bf16_max_pages;

  // B fragments of q * softmax_scale * log2e for head gid (zero for heads >= g), hi and lo terms, kept in
  // shared memory (registers are the INT2 path's budget): qf[chunk][term][lane].
  uint2* qf = reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(&sh) + sizeof(CtaShared<D>)) +
              warp * CHUNKS * 2 * 32;
  {
    const float scale = p.softmax_scale * kLog2e;
    const int head = PACK ? gid % 4 : gid;
    const float* q = p.queries + ((size_t)b * p.num_kv_heads * g + (size_t)kv * g + head) * D;
#pragma unroll
    for (int c = 0; c < KV4; ++c) {
      float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
      if (head < g) {
        x0 = *reinterpret_cast<const float4*>(q + 32 * c + 8 * tq);
        x1 = *reinterpret_cast<const float4*>(q + 32 * c + 8 * tq + 4);
      }
      uint2 h0, l0, h1, l1;
      split_bf16x2(x0.x * scale, x0.y * scale, h0.x, l0.x);
      split_bf16x2(x0.z * scale, x0.w * scale, h0.y, l0.y);
      split_bf16x2(x1.x * scale, x1.y * scale, h1.x, l1.x);
      split_bf16x2(x1.z * scale, x1.w * scale, h1.y, l1.y);
      if constexpr (PACK) {  // column gid: head gid's hi term, or (gid >= 4) head gid - 4's lo term
        qf[(4 * c + 0) * 32 + lane] = gid < 4 ? h0 : l0, qf[(4 * c + 2) * 32 + lane] = gid < 4 ? h1 : l1;
      } else {
        qf[(4 * c + 0) * 32 + lane] = h0, qf[(4 * c + 1) * 32 + lane] = l0;
        qf[(4 * c + 2) * 32 + lane] = h1, qf[(4 * c + 3) * 32 + lane] = l1;
      }
    }
    __syncwarp();
  }
  float o[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2tq, 2tq + 1 (PACK: 2 (tq % 2), + 1)

  // One 16-token tile (tokens [tile, tile + 16), rows from row0 in the pool) into the running state.
  auto attend_tile = [&](size_t row0, int tile) {
    // S [16 tokens x 8 heads]: rows gid, gid + 8. Rows past t_end read in-page memory, masked below.
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s_lo[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const uint4* k0 = reinterpret_cast<const uint4*>(p.bf16_keys + (row0 + gid) * D) + tq;
      const uint4* k1 = k0 + D / 8 * 8;  // row gid + 8
#pragma unroll
      for (int c = 0; c < KV4; ++c) {
        const uint4 ka = __ldg(k0 + 4 * c), kb = __ldg(k1 + 4 * c);
        // Fragment j of this k chunk: hi terms at j = 0, 2, lo terms at 1, 3 (PACK has no lo fragments: it carries
        // the lo terms in the hi fragments' free columns).
        auto frag = [&](int j) { return qf[(4 * c + j) * 32 + lane]; };
        const uint2 h0 = frag(0), h1 = frag(2);
        mma_bf16_16816(s, ka.x, kb.x, ka.y, kb.y, h0.x, h0.y);
        if constexpr (!PACK) {
          const uint2 l0 = frag(1);
          mma_bf16_16816(s_lo, ka.x, kb.x, ka.y, kb.y, l0.x, l0.y);
        }
        mma_bf16_16816(s, ka.z, kb.z, ka.w, kb.w, h1.x, h1.y);
        if constexpr (!PACK) {
          const uint2 l1 = frag(3);
          mma_bf16_16816(s_lo, ka.z, kb.z, ka.w, kb.w, l1.x, l1.y);
        }
      }
    }
    // This lane's logits x[r][0..1] of heads 2tq, 2tq + 1 (PACK: 2 (tq % 2), + 1) in its token rows: gid and gid + 8,
    // or with PACK the one it keeps (gid + 8 (tq / 2)): lane tq < 2 holds the hi products, lane tq ^ 2 the lo ones,
    // and each sends the row it does not keep.
    constexpr int NR = PACK ? 1 : 2;
    const bool low = tq < 2;
    float x[NR][2];
    bool valid[NR];
    if constexpr (PACK) {
      const float r0 = __shfl_xor_sync(0xffffffffu, low ? s[2] : s[0], 2);
      const float r1 = __shfl_xor_sync(0xffffffffu, low ? s[3] : s[1], 2);
      valid[0] = tile + gid + (low ? 0 : 8) < t_end;
      x[0][0] = valid[0] ? (low ? s[0] + r0 : r0 + s[2]) : -INFINITY;
      x[0][1] = valid[0] ? (low ? s[1] + r1 : r1 + s[3]) : -INFINITY;
    } else {
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        valid[r] = tile + gid + 8 * r < t_end;
        x[r][0] = valid[r] ? s[2 * r] + s_lo[2 * r] : -INFINITY;
        x[r][1] = valid[r] ? s[2 * r + 1] + s_lo[2 * r + 1] : -INFINITY;
      }
    }
    float bmax0 = x[0][0], bmax1 = x[0][1];
    if constexpr (!PACK) bmax0 = fmaxf(bmax0, x[1][0]), bmax1 = fmaxf(bmax1, x[1][1]);
#pragma unroll
    for (int off = PACK ? 2 : 4; off < 32; off *= 2) {  // (PACK: the rows of lane tq ^ 2 too)
      bmax0 = fmaxf(bmax0, __shfl_xor_sync(0xffffffffu, bmax0, off));
      bmax1 = fmaxf(bmax1, __shfl_xor_sync(0xffffffffu, bmax1, off));
    }
    const float mn0 = fmaxf(m0, bmax0), mn1 = fmaxf(m1, bmax1);  // finite: the tile's row 0 is valid
    const float corr0 = exp2f(m0 - mn0), corr1 = exp2f(m1 - mn1);
    m0 = mn0, m1 = mn1;
    l0 *= corr0, l1 *= corr1;
#pragma unroll
    for (int i = 0; i < MT; ++i) o[i][0] *= corr0, o[i][1] *= corr1, o[i][2] *= corr0, o[i][3] *= corr1;
    float pw[NR][2];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      pw[r][0] = valid[r] ? exp2f(x[r][0] - m0) : 0.f;
      pw[r][1] = valid[r] ? exp2f(x[r][1] - m1) : 0.f;
    }
    if constexpr (PACK) {
      l0 += pw[0][0], l1 += pw[0][1];
    } else {
      l0 += pw[0][0] + pw[1][0], l1 += pw[0][1] + pw[1][1];
    }
    // B fragments of P^T (k = tokens, n = head gid) by transposing the (token, head pair) words, the weights' hi terms
    // in pb and their lo terms in pl. PACK: one product's columns 0-3 take the hi terms and 4-7 the lo terms, block 0
    // (rows gid) from lane tq < 2's hi and its partner's lo, block 1 (rows gid + 8) from the partner's hi and lane
    // tq >= 2's lo.
    uint32_t pb0, pb1, pl0 = 0u, pl1 = 0u;
    if constexpr (PACK) {
      uint32_t hi, lo;
      split_bf16x2(pw[0][0], pw[0][1], hi, lo);
      const uint32_t got = __shfl_xor_sync(0xffffffffu, low ? lo : hi, 2);
      pb0 = transpose_8x8_b16(low ? hi : got), pb1 = transpose_8x8_b16(low ? got : lo);
    } else {
      uint32_t h0, lo0, h1, lo1;
      split_bf16x2(pw[0][0], pw[0][1], h0, lo0);
      split_bf16x2(pw[1][0], pw[1][1], h1, lo1);
      pb0 = transpose_8x8_b16(h0), pb1 = transpose_8x8_b16(h1);
      pl0 = transpose_8x8_b16(lo0), pl1 = transpose_8x8_b16(lo1);
    }
    // A fragments of V^T: tokens 2tq, 2tq + 1, 2tq + 8, 2tq + 9 of the tile, zero past t_end (the
    // weight is 0 there, but in-page memory past the length may hold anything).
#pragma unroll
    for (int w = 0; w < VW; ++w) {  // 16 bytes of each of the four rows: m-tiles 4w .. 4w + 3
      uint4 v[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tr = 2 * tq + (r & 1) + 8 * (r >> 1);  // tokens 2tq, 2tq + 1, 2tq + 8, 2tq + 9
        const uint4* vp = reinterpret_cast<const uint4*>(p.bf16_values + (row0 + tr) * D) + gid * VW + w;
        v[r] = tile + tr < t_end ? __ldg(vp) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t w0 = word(v[0], e), w1 = word(v[1], e), w2 = word(v[2], e), w3 = word(v[3], e);
        const uint32_t a0 = __byte_perm(w0, w1, 0x5410), a1 = __byte_perm(w0, w1, 0x7632);
        const uint32_t a2 = __byte_perm(w2, w3, 0x5410), a3 = __byte_perm(w2, w3, 0x7632);
        mma_bf16_16816(o[4 * w + e], a0, a1, a2, a3, pb0, pb1);
        if constexpr (!PACK) mma_bf16_16816(o[4 * w + e], a0, a1, a2, a3, pl0, pl1);
      }
    }
  };
  if constexpr (BALANCED) {
    // Warp w takes tiles [w n / 4, (w + 1) n / 4) of the range's n 16-token tiles (a tile lies in one page: pages and
    // split starts are multiples of 32). Lane i holds the page of the warp's tile tile_lo + i, read 32 tiles at a time.
    const int ntiles = (t_end - t_begin + 15) / 16;
    const int tile_lo = warp * ntiles / kDecodeWarps, tile_hi = (warp + 1) * ntiles / kDecodeWarps;
    constexpr int VLINES = D / 64;  // 128-byte lines per bf16 row
    int page_lane = 0;
    for (int i = tile_lo; i < tile_hi; ++i) {
      if ((i - tile_lo) % 32 == 0) {
        const int ti = i + lane;
        page_lane = ti < tile_hi ? table[(t_begin + 16 * ti) / P] : 0;
      }
      const int tile = t_begin + 16 * i;
      const int page = __shfl_sync(0xffffffffu, page_lane, (i - tile_lo) % 32);
      const size_t row0 = ((size_t)page * p.num_kv_heads + kv) * P + (tile % P);
      {
        // The P.V part reads this tile's value rows after the QK part: have them in L2 by then.
        const char* vrows = reinterpret_cast<const char*>(p.bf16_values + row0 * D);
#pragma unroll
        for (int x = lane; x < 16 * VLINES; x += 32)
          if (tile + x / VLINES < t_end) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vrows + x * 128));
        if constexpr (PREFETCH_KEYS) {
          // Grids whose BF16 CTAs end the launch (parallel merge, split tables): the next tile's key rows too, as
          // the blocks below (measured there).
          const int next = (i - tile_lo) % 32 + 1;
          const int next_page = __shfl_sync(0xffffffffu, page_lane, next % 32);
          if (i + 1 < tile_hi && next < 32) {
            const char* krows = reinterpret_cast<const char*>(
                p.bf16_keys + (((size_t)next_page * p.num_kv_heads + kv) * P + ((tile + 16) % P)) * D);
#pragma unroll
            for (int x = lane; x < 16 * VLINES; x += 32)
              if (tile + 16 + x / VLINES < t_end) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(krows + x * 128));
          }
        }
      }
      attend_tile(row0, tile);
    }
  } else {  // blocks of two tiles dealt round the warps
    for (int blk = t_begin + warp * 32; blk < t_end; blk += kDecodeWarps * 32) {
      const int page = table[blk / P];
      const size_t row0 = ((size_t)page * p.num_kv_heads + kv) * P + (blk % P);  // a block lies in one page
      if (blk + lane < t_end) {
        // The P.V part reads these value rows after the QK part: have them in L2 by then.
        const char* vrow = reinterpret_cast<const char*>(p.bf16_values + (row0 + lane) * D);
#pragma unroll
        for (int off = 0; off < D * 2; off += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vrow + off));
        if constexpr (PREFETCH_KEYS) {
          // Grids whose BF16 CTAs end the launch (parallel merge, split tables): tile 1 reads its key rows
          // after tile 0's P.V; have them in L2 too (batch 1 / 1K: the BF16 CTAs end the launch, ~2.7 us after
          // the INT2 CTAs; batch 8 / 32K 66.3 -> 65.3 us). At large batches this extra L2 traffic made the
          // BF16-only decode 10 % slower (batch 32 / 32K 1128.5 -> 1237.7 us).
          const char* krow = reinterpret_cast<const char*>(p.bf16_keys + (row0 + lane) * D);
#pragma unroll
          for (int off = 0; off < D * 2; off += 128)
            if (lane >= 16) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(krow + off));
        }
      }
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int tile = blk + 16 * t;
        if (tile >= t_end) break;
        attend_tile(row0 + 16 * t, tile);
      }
    }
  }
  // Reduce l over the 16 token rows (gid; PACK: and lane tq ^ 2's rows); write this warp's state (o unnormalised, as
  // the INT2 path). PACK: columns 4-7 hold the lo terms' products of heads 0-3, added to columns 0-3.
#pragma unroll
  for (int off = PACK ? 2 : 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  if constexpr (PACK) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k) o[i][k] += __shfl_xor_sync(0xffffffffu, o[i][k], 2);
  }
  const int h0 = 2 * tq, h1 = 2 * tq + 1;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int ch = gid * (D / 8) + 2 * i;
    if (h0 < g) sh.o[warp][h0][ch] = o[i][0], sh.o[warp][h0][ch + 1] = o[i][2];
    if (h1 < g) sh.o[warp][h1][ch] = o[i][1], sh.o[warp][h1][ch + 1] = o[i][3];
  }
  if (gid == 0) {
    if (h0 < g) sh.m[warp][h0] = m0, sh.l[warp][h0] = l0;
    if (h1 < g) sh.m[warp][h1] = m1, sh.l[warp][h1] = l1;
  }
}

// ---------------------------------------------------------------- fused merge
// The last CTA of (b, kv) to finish merges its partials (merge_pair): it is alone on the critical path at the end of
// the launch, so each phase keeps many loads in flight: the split weights exp2(lse2_s - max) / sum from one pass over
// lse2, the weighted sum of the partials (read through L2: other CTAs of this launch wrote them), then o'[g, d] .
// R_V^T by (row slice, column quad) threads, the row slices summed in a fixed order. Scratch aliases the CTA's shared
// memory.
// Merge CTAs per pair that split the un-rotation's columns where a grid has room for them (merge_cta_parts).
template <int D>
constexpr int merge_cta_parts_max() {
  return D == 64 ? 2 : 4;  // 4 at d = 64 would leave a thread 2 rows of R_V^T, fewer than a float4 of merged values
}
template <int D>
constexpr int merge_slices() {
  return 4 * kThreads / D;  // row slices of the un-rotation: 128 threads = slices x (D / 4) column quads
}
// a += w v, per component.
__device__ __forceinline__ void fma4(float w, const float4& v, float4& a) {
  a.x = fmaf(w, v.x, a.x), a.y = fmaf(w, v.y, a.y), a.z = fmaf(w, v.z, a.z), a.w = fmaf(w, v.w, a.w);
}
// Split weights in place: weight [S, g] holds the splits' lse2 on entry and exp2(lse2 - max over the
// splits) on exit; inv[h] = 1 / (sum of head h's weights), 0 if every split is empty. One warp per head.
__device__ __forceinline__ void split_weights(float* weight, float* inv, int S, int g) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < g; h += kDecodeWarps) {
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, weight[s * g + h]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    for (int s = lane; s < S; s += 32) {
      const float w = mx == -INFINITY ? 0.f : exp2f(weight[s * g + h] - mx);
      weight[s * g + h] = w;
      sum += w;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) inv[h] = sum > 0.f ? 1.f / sum : 0.f;
  }
}
// out [g, D] = merged [g, D] . M, M = R_V^T [D, D] (rot; null: out = merged), or with PARTS > 1 its columns [part W,
// +W), W = D / PARTS (a merge CTA per column part): thread (slice, quad) takes rows [slice * ROWS, +ROWS) of M and
// columns [part W + 4 quad, +4), in rounds of RU rows; the slices' sums go through scratch [SLICES, g, W] and are added
// in a fixed order. The first round's rows come loaded (first, see merge_pair); the others from tail (shared memory,
// [ROWS - RU][kThreads] float4, this thread's at threadIdx.x) or, without it, from M.
template <int D, int PARTS = 1>
struct Unrotation {
  static constexpr int W = D / PARTS, QUADS = W / 4;  // columns of the part, and their quads
  static constexpr int SLICES = kThreads / QUADS, ROWS = D / SLICES, RU = ROWS < 16 ? ROWS : 16;
  static constexpr int TAIL_BYTES = (ROWS - RU) * kThreads * 16;  // the rows after the first round
  static_assert(PARTS * merge_slices<D>() == SLICES, "scratch [SLICES, g, W] is the same size for every PARTS");
  static_assert(RU % 4 == 0, "a head's merged values are read as float4");
  // This thread's rows [slice * ROWS + r0, +RU) of M, columns [part W + 4 quad, +4).
  __device__ static void load(const float* rot, int r0, float4 (&r)[RU], int part) {
    const int quad = threadIdx.x % QUADS, slice = threadIdx.x / QUADS;
    const float4* rot4 =
        reinterpret_cast<const float4*>(rot) + (size_t)(slice * ROWS + r0) * (D / 4) + (PARTS == 1 ? 0 : part * QUADS) + quad;
#pragma unroll
    for (int u = 0; u < RU; ++u) r[u] = __ldg(rot4 + (size_t)u * (D / 4));
  }
  // A merge's reads of M at its start: the first round into registers, the rest into tail by cp.async (a group of its
  // own if `commit`, else the caller's next) or, without a tail, sent to L2.
  __device__ static void load_start(const float* rot, float4 (&first)[RU], float4* tail, bool commit, int part) {
    load(rot, 0, first, part);
    if (tail) {
      const int quad = threadIdx.x % QUADS, slice = threadIdx.x / QUADS;
      const float* src = rot + (size_t)(slice * ROWS + RU) * D + 4 * ((PARTS == 1 ? 0 : part * QUADS) + quad);
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(tail + threadIdx.x));
      for (int u = 0; u < ROWS - RU; ++u) cp_async16_if(dst + u * kThreads * 16, src + (size_t)u * D, true);
      if (commit) cp_async_commit();
    } else if (ROWS > RU) {
      for (int off = threadIdx.x * 32; off < D * D; off += kThreads * 32)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rot + off));
    }
  }
};
template <int D, int PARTS = 1>
__device__ __forceinline__ void unrotate(const float* merged, const float* rot, float* scratch, int g, float* out,
                                         const float4 (&first)[Unrotation<D, PARTS>::RU], const float4* tail,
                                         int part = 0) {
  using U = Unrotation<D, PARTS>;
  constexpr int SLICES = U::SLICES, ROWS = U::ROWS, RU = U::RU, W = U::W;
  if (!rot) {
    for (int i = threadIdx.x; i < g * W; i += kThreads) {  // (PARTS = 1: i itself, the merges' code as before)
      const int at = PARTS == 1 ? i : i / W * D + part * W + i % W;
      out[at] = merged[at];
    }
    return;
  }
  const int quad = threadIdx.x % U::QUADS, slice = threadIdx.x / U::QUADS;
  float4 acc[kGroup];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
  // Head-major: a head's RU merged values are read together, then its 4 RU FMAs. (Rows-major, each head's read sat
  // behind its own branch (h < g), so every 16 FMAs waited for a shared-memory round trip: the phase took ~2 us of a
  // merge at the end of the launch.)
  auto fma_rows = [&](int r0, const float4(&r)[RU]) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h < g) {
        float4 m[RU / 4];
#pragma unroll
        for (int u = 0; u < RU; u += 4) m[u / 4] = *reinterpret_cast<const float4*>(merged + h * D + slice * ROWS + r0 + u);
#pragma unroll
        for (int u = 0; u < RU; u += 4) {
          fma4(m[u / 4].x, r[u], acc[h]), fma4(m[u / 4].y, r[u + 1], acc[h]);
          fma4(m[u / 4].z, r[u + 2], acc[h]), fma4(m[u / 4].w, r[u + 3], acc[h]);
        }
      }
    }
  };
  fma_rows(0, first);
  for (int r0 = RU; r0 < ROWS; r0 += RU) {
    float4 r[RU];
    if (tail) {
#pragma unroll
      for (int u = 0; u < RU; ++u) r[u] = tail[(r0 - RU + u) * kThreads + threadIdx.x];
    } else {
      U::load(rot, r0, r, part);
    }
    fma_rows(r0, r);
  }
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
    if (h < g) reinterpret_cast<float4*>(scratch + (slice * g + h) * W)[quad] = acc[h];
  __syncthreads();
  for (int i = threadIdx.x; i < g * W; i += kThreads) {
    float v = 0.f;
#pragma unroll
    for (int sl = 0; sl < SLICES; ++sl) v += scratch[sl * g * W + i];
    out[PARTS == 1 ? i : i / W * D + part * W + i % W] = v;
  }
}
// Its reads in one round trip where shared memory allows: at its start the merge loads this thread's first round of
// R_V^T rows into registers, the rest of its rows into shared memory (cp.async; else it sends R_V^T to L2 and reads
// those rows after the weighted sum), the partials of up to C splits into shared memory (cp.async) and the splits'
// lse2. (H200, per-CTA traces: the un-rotation phase 2.7 -> 2.4 us at ragged 8 / 100K, 3.7 -> 3.1 us at ragged 64 /
// 8K; the rest of the merge's ~5 us under load is its arithmetic and code, not R_V^T's reads.)
template <int D>
__device__ void merge_pair(const PagedDecodeParams& p, uint8_t* smem, int pair, int S) {  // S: the pair's partials
  using U = Unrotation<D>;
  constexpr int MAX_ITEMS = kGroup * D / 4 / kThreads;  // float4 items of [g, D] per thread
  const int g = p.group, stride = p.int2_splits + p.bf16_splits, gd = g * D;
  const int kv = pair % p.num_kv_heads;
  float* weight = reinterpret_cast<float*>(smem);       // [S, g]
  float* merged = weight + ((S * g + 3) & ~3);          // [g, D]
  float* inv = merged + gd;                             // [g] (8 floats)
  float* buf = inv + 8;                                 // [C, g, D] partials of C splits, then [SLICES, g, D]
  const int buf_floats = max(S * gd, U::SLICES * gd);   // all partials in one round, and the un-rotation's scratch
  const bool tail_fits =
      U::TAIL_BYTES > 0 && (int)(buf - weight) * 4 + buf_floats * 4 + U::TAIL_BYTES <= smem_bytes<D>();
  float4* tail = tail_fits ? reinterpret_cast<float4*>(smem + smem_bytes<D>() - U::TAIL_BYTES) : nullptr;
  const int C = min(S, (smem_bytes<D>() / 4 - (int)(buf - weight)) / gd);
  const float* lse = p.partial_lse2 + (size_t)pair * stride * g;  // [S, g]
  const float* po = p.partial_out + (size_t)pair * stride * gd;   // [S, g, D]
  const float* rot = p.value_rotation_t ? p.value_rotation_t + kv * p.rotation_kv_head_stride : nullptr;
  float4 first[U::RU];
  if (rot) U::load_start(rot, first, tail, false, 0);  // committed with the first partials
  const uint32_t buf_smem = static_cast<uint32_t>(__cvta_generic_to_shared(buf));
  auto load_splits = [&](int s0) {  // partials of splits [s0, s0 + C) into buf (read through L2)
    const int n = min(C, S - s0) * gd / 4;
    for (int i = threadIdx.x; i < n; i += kThreads) cp_async16_if(buf_smem + 16 * i, po + (size_t)s0 * gd + 4 * i, true);
    cp_async_commit();
  };
  load_splits(0);
  for (int i = threadIdx.x; i < S * g; i += kThreads) weight[i] = __ldcg(lse + i);
  __syncthreads();
  split_weights(weight, inv, S, g);
  // Weighted sum: a thread owns float4 items threadIdx.x + kThreads i of [g, D / 4], summed over the
  // splits in order.
  const int n4 = gd / 4;
  float4 sum4[MAX_ITEMS];
#pragma unroll
  for (int j = 0; j < MAX_ITEMS; ++j) sum4[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < S; s0 += C) {
    cp_async_wait<0>();
    __syncthreads();  // (the first time also: the split weights)
    const float4* part = reinterpret_cast<const float4*>(buf);
    for (int s = s0; s < min(S, s0 + C); ++s)
#pragma unroll
      for (int j = 0; j < MAX_ITEMS; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < n4) fma4(weight[s * g + 4 * i / D], part[(s - s0) * n4 + i], sum4[j]);
      }
    if (s0 + C < S) {
      __syncthreads();
      load_splits(s0 + C);
    }
  }
#pragma unroll
  for (int j = 0; j < MAX_ITEMS; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < n4) {
      const float f = inv[4 * i / D];
      reinterpret_cast<float4*>(merged)[i] = make_float4(sum4[j].x * f, sum4[j].y * f, sum4[j].z * f, sum4[j].w * f);
    }
  }
  __syncthreads();
  unrotate<D>(merged, rot, buf, g, p.out + (size_t)pair * g * D, first, tail);  // heads (b * Hkv + kv) * g + h
}

// A merge CTA of a work-list grid (merge_flags): R_V^T's rows loaded as merge_pair loads them, then the pair's partials
// folded in slot order as they are written: warp 0 reads the flags of the next slots (acquire), the ready run of them
// (up to C) comes in by cp.async with its lse2, and each thread updates the running max, sum and weighted output of
// its items slot by slot, so the result does not depend on how the slots arrived. Then the un-rotation, of the output
// columns of part `part` of PARTS (each of a pair's PARTS merge CTAs folds every partial).
template <int D, int PARTS>
__device__ void merge_flagged(const PagedDecodeParams& p, uint8_t* smem, int pair, int S, int part) {
  using U = Unrotation<D, PARTS>;
  constexpr int MAX_ITEMS = kGroup * D / 4 / kThreads;
  const int g = p.group, stride = p.int2_splits + p.bf16_splits, gd = g * D;
  const int kv = pair % p.num_kv_heads;
  __shared__ int ready;
  float* merged = reinterpret_cast<float*>(smem);  // [g, D]
  float* lse_s = merged + gd;                       // [C, g] (32 * 8 floats at most)
  float* buf = lse_s + 32 * kGroup;                 // [C, g, D] partials, then [SLICES, g, D]
  const int head_floats = (int)(buf - merged);
  const int buf_floats = U::SLICES * gd;
  const bool tail_fits = U::TAIL_BYTES > 0 && head_floats * 4 + buf_floats * 4 + U::TAIL_BYTES <= smem_bytes<D>();
  float4* tail = tail_fits ? reinterpret_cast<float4*>(smem + smem_bytes<D>() - U::TAIL_BYTES) : nullptr;
  const int room = (smem_bytes<D>() - (tail ? U::TAIL_BYTES : 0)) / 4 - head_floats;
  const int C = max(1, min(32, room / gd));
  const float* lse = p.partial_lse2 + (size_t)pair * stride * g;  // [S, g]
  const float* po = p.partial_out + (size_t)pair * stride * gd;   // [S, g, D]
  const unsigned* flags = p.merge_flags + (size_t)pair * stride;
  const float* rot = p.value_rotation_t ? p.value_rotation_t + kv * p.rotation_kv_head_stride : nullptr;
  float4 first[U::RU];
  if (rot) U::load_start(rot, first, tail, true, part);
  const int n4 = gd / 4;
  float4 acc[MAX_ITEMS];
  float m[MAX_ITEMS], l[MAX_ITEMS];
#pragma unroll
  for (int j = 0; j < MAX_ITEMS; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f), m[j] = -INFINITY, l[j] = 0.f;
  const uint32_t buf_smem = static_cast<uint32_t>(__cvta_generic_to_shared(buf));
  for (int done = 0; done < S;) {
    if (threadIdx.x < 32) {  // the run of ready slots from `done` (at most C)
      const int s = done + (int)threadIdx.x;
      unsigned seen = 0;
      if (s < S && (int)threadIdx.x < C)
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(flags + s) : "memory");
      const unsigned not_ready = __ballot_sync(0xffffffffu, seen != p.merge_epoch);
      if (threadIdx.x == 0) ready = not_ready ? __ffs(not_ready) - 1 : 32;
    }
    __syncthreads();
    const int n = min(ready, min(C, S - done));
    if (n == 0) {
      __nanosleep(64);
      __syncthreads();  // `ready` is read above before warp 0 writes it again
      continue;
    }
    for (int i = threadIdx.x; i < n * gd / 4; i += kThreads)
      cp_async16_if(buf_smem + 16 * i, po + (size_t)done * gd + 4 * i, true);
    cp_async_commit();
    for (int i = threadIdx.x; i < n * g; i += kThreads) lse_s[i] = __ldcg(lse + (size_t)done * g + i);
    cp_async_wait<0>();
    __syncthreads();
    const float4* part = reinterpret_cast<const float4*>(buf);
#pragma unroll
    for (int j = 0; j < MAX_ITEMS; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i >= n4) continue;
      const int h = 4 * i / D;
      for (int s = 0; s < n; ++s) {
        const float x = lse_s[s * g + h];
        if (x == -INFINITY) continue;  // an empty split
        const float mn = fmaxf(m[j], x);
        const float scale = exp2f(m[j] - mn), w = exp2f(x - mn);  // exp2(-inf) = 0 for the first
        l[j] = fmaf(l[j], scale, w);
        const float4 v = part[s * n4 + i];
        acc[j].x = fmaf(w, v.x, acc[j].x * scale), acc[j].y = fmaf(w, v.y, acc[j].y * scale);
        acc[j].z = fmaf(w, v.z, acc[j].z * scale), acc[j].w = fmaf(w, v.w, acc[j].w * scale);
        m[j] = mn;
      }
    }
    done += n;
    __syncthreads();  // buf and lse_s are refilled next round
  }
#pragma unroll
  for (int j = 0; j < MAX_ITEMS; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < n4) {
      const float f = l[j] > 0.f ? 1.f / l[j] : 0.f;
      reinterpret_cast<float4*>(merged)[i] = make_float4(acc[j].x * f, acc[j].y * f, acc[j].z * f, acc[j].w * f);
    }
  }
  if (tail) cp_async_wait<0>();
  __syncthreads();
  unrotate<D, PARTS>(merged, rot, buf, g, p.out + (size_t)pair * g * D, first, tail, part);
}

// ---------------------------------------------------------------- parallel merge
// At batch 1 the last-CTA merge above is one CTA's serial latency chain after the last split: S / 8
// rounds of loads, then 64 KB of R_V^T through 4 warps (H200, batch 1 / 100K, 35 splits: 8.3 us of a
// 38 us kernel; 1K tokens, 6 splits: 4.9 of 11.8 us). Instead merge_parts CTAs per pair, resident from
// the start of the launch, each load a column block of R_V^T into shared memory while the splits run,
// wait on the pair's arrival counter, merge one query head's splits (one round of loads for up to
// 64 splits at d = 128, the split weights computed while those loads are in flight) and write that
// head's output columns. No second reduction: a column block needs only its own head's merged row.
template <int D>
__host__ __device__ constexpr int merge_cols() {  // output columns per merge CTA: <= 32 KB of R_V^T
  return D * D * 4 <= 32768 ? D : 8192 / D;
}
template <int D>
__host__ __device__ constexpr int merge_cta_smem_floats(int splits) {
  // R_V^T block [D, NC], split-group sums [threads / (D / 4), D / 4] float4 (then the un-rotation's slice sums),
  // merged row [D], split lse [S].
  return D * merge_cols<D>() + 4 * kThreads + D + splits;
}
__device__ __forceinline__ void fma4_acc(float w, const float4& v, float4& a) {
  a.x = fmaf(w, v.x, a.x), a.y = fmaf(w, v.y, a.y), a.z = fmaf(w, v.z, a.z), a.w = fmaf(w, v.w, a.w);
}
template <int D>
__device__ void merge_cta(const PagedDecodeParams& p, uint8_t* smem, int m) {
  constexpr int NC = merge_cols<D>(), C = D / NC;
  constexpr int Q4 = D / 4;           // float4 per output row
  constexpr int SG = kThreads / Q4;   // split groups: thread (sg, j) sums float4 j over splits sg + SG i
  constexpr int U = 16;               // loads in flight per thread
  const int g = p.group, S = p.int2_splits + p.bf16_splits, K = g * C;
  const int pair = m / K, part = m % K, h = part / C, c0 = (part % C) * NC;
  float* rot_s = reinterpret_cast<float*>(smem);              // [D, NC]: R_V^T[:, c0 .. c0 + NC)
  float4* red = reinterpret_cast<float4*>(rot_s + D * NC);    // [SG, Q4]
  float* merged = reinterpret_cast<float*>(red + SG * Q4);    // [D]
  float* lse_s = merged + D;                                  // [S]
  const int tid = threadIdx.x, lane = tid % 32;
  const bool rotate = p.value_rotation_t != nullptr;
  if (rotate) {
    const float* rot = p.value_rotation_t + (pair % p.num_kv_heads) * p.rotation_kv_head_stride + c0;
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(rot_s));
    for (int i = tid; i < D * NC / 4; i += kThreads)
      cp_async16_if(base + 16 * i, rot + (size_t)(i / (NC / 4)) * D + 4 * (i % (NC / 4)), true);
    cp_async_commit();
  }
  // Wait for the pair's S arrivals (each a release after its partial and lse were written).
  if (tid == 0) {
    const unsigned* count = p.merge_counters + pair;
    for (;;) {
      unsigned seen;  // acquire: the partials read after the barrier below follow the arrivals
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
      if (seen >= (unsigned)S) break;
      __nanosleep(32);
    }
  }
  __syncthreads();
  const size_t first = (size_t)pair * S;
  const float* lse = p.partial_lse2 + first * g;                                                 // [S, g]
  const float4* po4 = reinterpret_cast<const float4*>(p.partial_out + first * g * D) + h * Q4;  // [S, g, Q4]
  const int j = tid % Q4, sg = tid / Q4;
  for (int s = tid; s < S; s += kThreads) lse_s[s] = __ldcg(lse + (size_t)s * g + h);
  float4 v[U];
  auto load_round = [&](int r) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = sg + SG * (r * U + u);
      v[u] = s < S ? __ldcg(po4 + (size_t)s * g * Q4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_round(0);
  // The pair's last merge CTA past the wait re-arms both counters for the next call (while the loads fly).
  if (tid == 0 && atomicAdd(p.merge_done + pair, 1u) == (unsigned)(K - 1)) {
    p.merge_counters[pair] = 0u;
    p.merge_done[pair] = 0u;
  }
  __syncthreads();
  // Split weights exp2(lse_s - max) / sum (every warp computes max and sum itself: no barrier).
  float mx = -INFINITY;
  for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse_s[s]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  if (mx != -INFINITY)
    for (int s = lane; s < S; s += 32) sum += exp2f(lse_s[s] - mx);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int rounds = (S + SG * U - 1) / (SG * U);
  for (int r = 0;;) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = sg + SG * (r * U + u);
      if (s < S && mx != -INFINITY) fma4_acc(exp2f(lse_s[s] - mx), v[u], acc);
    }
    if (++r >= rounds) break;
    load_round(r);
  }
  red[sg * Q4 + j] = acc;
  __syncthreads();
  if (tid < Q4) {
    float4 a = red[tid];
#pragma unroll
    for (int k = 1; k < SG; ++k) {
      const float4 b = red[k * Q4 + tid];
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    reinterpret_cast<float4*>(merged)[tid] = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
  }
  if (rotate) cp_async_wait<0>();
  __syncthreads();
  float* out = p.out + ((size_t)pair * g + h) * D + c0;  // head (b * Hkv + kv) * g + h, columns c0 ..
  if (!rotate) {
    for (int c = tid; c < NC; c += kThreads) out[c] = merged[c0 + c];
    return;
  }
  // out[c] = sum_i merged[i] R_V^T[i, c0 + c]: thread (slice, quad) takes rows [slice R, +R) and columns [4 quad, +4)
  // by float4 reads of the block and of the merged row, the slices' sums (in red) added in order. (A thread per column
  // and half the rows, a chain of D / 2 FMAs behind two scalar shared loads each, took 0.48 us of the batch-1 merge's
  // ~2.3, H200 trace.)
  constexpr int QC = NC / 4, SL = kThreads / QC, R = D / SL;
  static_assert(R % 4 == 0 && SL * QC == kThreads && SL * QC <= SG * Q4, "slice sums fit red");
  const int quad = tid % QC, sl = tid / QC;
  const float4* rot4 = reinterpret_cast<const float4*>(rot_s) + sl * R * QC + quad;
  const float4* m4 = reinterpret_cast<const float4*>(merged) + sl * R / 4;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u = 0; u < R; u += 4) {
    const float4 m = m4[u / 4];
    fma4_acc(m.x, rot4[u * QC], a), fma4_acc(m.y, rot4[(u + 1) * QC], a);
    fma4_acc(m.z, rot4[(u + 2) * QC], a), fma4_acc(m.w, rot4[(u + 3) * QC], a);
  }
  red[sl * QC + quad] = a;
  __syncthreads();
  if (tid < NC) {
    const float* sums = reinterpret_cast<const float*>(red);
    float o = 0.f;
#pragma unroll
    for (int k = 0; k < SL; ++k) o += sums[k * NC + tid];
    out[tid] = o;
  }
}

// ---------------------------------------------------------------- kernel
// Grid (1-D): INT2 CTAs (sequence, KV head, split) first, then BF16 CTAs, then (PARALLEL) merge_parts
// merge CTAs per (sequence, KV head); block 128 threads; dynamic shared memory smem_bytes<D>().
// INT2 tier of a launch: absent, pages of 16 tokens (a page-table read per tile), or pages of >= 32
// tokens (a read per stage, see int2_cta).
enum class Int2Pages { none, small, paired };

// PARALLEL: the grid ends with the parallel merge CTAs (p.merge_parts > 0); the kernel without them is
// kept separate so that the large-batch code is not recompiled around the merge CTAs' (batch 8 / 8K
// was 2.5-4 % slower in one kernel). TABLE (not with PARALLEL): INT2 splits from p.int2_split_table, a
// kernel of its own for the same reason (batch 64 / 8K 133 -> 138 us with the table read in every kernel).
// M16: fp16 INT2 metadata (p.int2_metadata_fp16; paired pages only).
// PACK (g <= 4): both query terms in one Q.K product (see int2_cta and bf16_warp).
// WORK (not with PARALLEL or TABLE): the CTAs take their shares from p.work, a kernel of its own so that the grids
// without a work list keep their code (in one kernel, ragged 64 / 8K and 32 / 8K ran 1.9-2.4 % slower).
// MERGE_PARTS > 0 (with WORK, p.merge_flags): a CTA flags its partial and exits; the grid's last p.work_merge_ctas CTAs
// merge (merge_flagged), MERGE_PARTS per pair (p.merge_cta_parts). Kernels of their own, so that the others keep their
// code (when added, the other 72 kernels' SASS was unchanged), one per MERGE_PARTS (with both merges in one kernel,
// ptxas spilled in its INT2 loop: two loads from the stack per step at d = 128).
template <int D, Int2Pages PAGES, bool PARALLEL, bool TABLE, bool M16, bool PACK, bool WORK, int MERGE_PARTS = 0>
__global__ void __launch_bounds__(kThreads, D == 256 ? 2 : kMinCtasPerSm) paged_decode_kernel(const PagedDecodeParams p) {
  constexpr bool HAS_INT2 = PAGES != Int2Pages::none, MERGE_CTAS = MERGE_PARTS > 0;
  // 128-byte aligned: with the static is_last below, a 16-byte alignment put the dynamic base 16 bytes past a
  // 32-byte boundary, and then every lane's 16-byte cp.async into the rings reached L2 as a sector request of its
  // own, twice the requests of the data (ncu; H200: the INT2 decode 5-7 % slower on calls of >= 1 GB).
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int is_last;
  __shared__ int identity[4];  // pair, split, count, int2, read back after the loop (see there)
  CtaShared<D>& sh = *reinterpret_cast<CtaShared<D>*>(smem);
  const int g = p.group, S = p.int2_splits + p.bf16_splits;
  const int pairs = p.batch * p.num_kv_heads;
  if constexpr (PARALLEL) {
    if ((int)blockIdx.x >= pairs * S) {  // parallel merge CTAs after the splits
      merge_cta<D>(p, smem, blockIdx.x - pairs * S);
      return;
    }
  }
  if constexpr (MERGE_CTAS) {
    if ((int)blockIdx.x >= p.work_ctas) {  // merge CTAs after the work: entry (pair, part | count << 16)
      const int4 w = __ldg(reinterpret_cast<const int4*>(p.work) + blockIdx.x);
      merge_flagged<D, MERGE_PARTS>(p, smem, w.x, (unsigned)w.y >> 16, w.y & 0xffff);
      return;
    }
  }
  // This CTA's pair, partial slot, the pair's partial count and (from a work list) its token range.
  int pair, split, count = S, t_begin = 0, t_end = 0;
  bool int2;
  if constexpr (WORK) {
    const int4 w = __ldg(reinterpret_cast<const int4*>(p.work) + blockIdx.x);  // DecodeWork
    int2 = HAS_INT2 && (int)blockIdx.x < p.work_int2_ctas;
    pair = w.x, split = w.y & 0xffff, count = (unsigned)w.y >> 16, t_begin = w.z, t_end = w.w;
  } else {
    const int int2_ctas = HAS_INT2 ? pairs * p.int2_splits : 0;
    int2 = HAS_INT2 && (int)blockIdx.x < int2_ctas;
    if (TABLE && int2) {  // split-major
      split = blockIdx.x / pairs;
      pair = blockIdx.x % pairs;
    } else if (int2) {
      pair = blockIdx.x / p.int2_splits;
      split = blockIdx.x % p.int2_splits;
    } else {
      const int i = blockIdx.x - int2_ctas;
      pair = i / p.bf16_splits;
      split = (HAS_INT2 ? p.int2_splits : 0) + i % p.bf16_splits;
    }
  }
  const int b = pair / p.num_kv_heads, kv = pair % p.num_kv_heads;
  // Parallel-merge grids (batch 1, one wave): the INT2 prologue's page-table reads go out with the length
  // read instead of after it (entries past the length, inside the sequence's table row, are read but not
  // used: every copy is predicated on the length).
  using G = Int2Geom<D>;
  constexpr int SPEC_STAGES = 2;  // the STAGED prologue's stages (the parallel-merge kernels stage through registers)
  int spec[SPEC_STAGES][G::TILES];
  if constexpr (PARALLEL && HAS_INT2) {
    if (int2) {
      const int P = p.int2_page_size, shift = 31 - __clz(P), warp = threadIdx.x / 32;
      const int32_t* table = p.int2_page_table + (size_t)b * p.int2_max_pages;
      const int start = TABLE ? p.int2_split_start[split] : split * p.int2_chunk;
      const int stop = min(TABLE ? p.int2_split_start[split + 1] : start + p.int2_chunk, p.int2_max_pages * P);
#pragma unroll
      for (int k = 0; k < SPEC_STAGES; ++k)
#pragma unroll
        for (int t = 0; t < G::TILES; ++t) {
          const int tok = start + k * G::STEP + (warp * G::TILES + t) * 16;
          spec[k][t] = PAGES == Int2Pages::paired && (t & 1) ? spec[k][t - 1]
                       : tok < stop                       ? __ldg(table + ((uint32_t)tok >> shift))
                                                          : 0;
        }
    }
  }
  if (!WORK && int2) {
    const int len = p.int2_lengths[b];
    t_begin = TABLE ? p.int2_split_start[split] : split * p.int2_chunk;
    t_end = min(len, TABLE ? p.int2_split_start[split + 1] : t_begin + p.int2_chunk);
  } else if (!WORK) {
    const int s = split - (HAS_INT2 ? p.int2_splits : 0);
    const int len = p.bf16_lengths[b];
    t_begin = s * p.bf16_chunk;
    t_end = min(len, t_begin + p.bf16_chunk);
  }
  if (threadIdx.x == 0) identity[0] = pair, identity[1] = split, identity[2] = count, identity[3] = int2;
  if (!int2 || t_begin >= t_end) {
    // Empty warps leave m = -inf, l = 0, o = 0.
    for (int i = threadIdx.x; i < kDecodeWarps * kGroup; i += blockDim.x) {
      (&sh.m[0][0])[i] = -INFINITY;
      (&sh.l[0][0])[i] = 0.f;
    }
    for (int i = threadIdx.x; i < kDecodeWarps * kGroup * D; i += blockDim.x) (&sh.o[0][0][0])[i] = 0.f;
  }
  __syncthreads();
  if (t_begin < t_end) {
    if (int2)
      int2_cta<D, PAGES == Int2Pages::paired, PARALLEL, PARALLEL, M16, TABLE || WORK, PACK>(p, sh, smem, b, kv, t_begin,
                                                                                           t_end, spec);
    else
      bf16_warp<D, PARALLEL || TABLE, !HAS_INT2 || PARALLEL || TABLE || (WORK && MERGE_PARTS <= 1), PACK>(
          p, sh, b, kv, t_begin, t_end);
  }
  __syncthreads();
  // The CTA's identity, read back from shared memory rather than held through the loop, which then spills less (d =
  // 128: 0-16 bytes of stack, against 0-24; H200, in a variant of the merge above: uniform shapes 1.2 % slower
  // without it).
  {
    const volatile int* id = identity;
    pair = id[0], split = id[1], count = id[2], int2 = id[3] != 0;
  }
  // Combine the warps' states (one per warp and head); write this split's partial. Eight lanes per head (warps 0-1)
  // turn its states' m into the weights exp2(m - max) / den by shuffles and write the split's LSE; then every output
  // float4 is one weighted sum.
  const size_t part = (size_t)pair * S + split;
  float* out = p.partial_out + part * g * D;
  static_assert(kDecodeWarps <= 8 && kGroup * 8 <= kThreads, "eight lanes per head");
  if ((int)threadIdx.x < kGroup * 8) {  // whole warps: the shuffles below take every lane
    const int h = threadIdx.x / 8, w = threadIdx.x % 8;
    const bool live = h < g && w < kDecodeWarps;
    const int ws = w % kDecodeWarps;  // w itself where live; inside sh for every lane, so the loads need no branch
    const float m = live ? sh.m[ws][h] : -INFINITY;
    float mx = m;
#pragma unroll
    for (int off = 1; off < 8; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float e = live && mx != -INFINITY ? exp2f(m - mx) : 0.f;
    float den = live ? e * sh.l[ws][h] : 0.f;
#pragma unroll
    for (int off = 1; off < 8; off *= 2) den += __shfl_xor_sync(0xffffffffu, den, off);
    const float inv = den > 0.f ? 1.f / den : 0.f;
    if (live) sh.m[ws][h] = e * inv;
    if (w == 0 && h < g) p.partial_lse2[part * g + h] = den > 0.f ? mx + log2f(den) : -INFINITY;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < g * D / 4; i += blockDim.x) {
    const int h = 4 * i / D, c = 4 * i % D;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) fma4(sh.m[w][h], *reinterpret_cast<const float4*>(&sh.o[w][h][c]), v);
    *reinterpret_cast<float4*>(out + 4 * i) = v;
  }
  if (!p.merge_counters) return;
  // The flag and the arrival below are release operations: the barrier orders this CTA's writes before them. (As
  // fence.acq_rel + a relaxed write, the fence's acquire half also invalidated the multiprocessor's L1, CCTL.IVALL.)
  if constexpr (MERGE_CTAS) {
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p.merge_flags + part), "r"(p.merge_epoch) : "memory");
    return;
  }
  if constexpr (PARALLEL) {  // arrive
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.merge_counters + pair) : "memory");
    return;
  }
  // Last CTA of this (sequence, KV head) merges. Thread 0 arrives for the CTA, as in the parallel merge: the barrier
  // orders the CTA's partial writes before its release fence, and the last arrival's acquire fence orders the other
  // CTAs' partials before the merge's reads. (A sequentially consistent __threadfence in every thread: ragged batches
  // up to 1.2 % slower, H200.)
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
    is_last = atomicAdd(p.merge_counters + pair, 1u) == (unsigned)(count - 1);
    if (is_last) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  }
  __syncthreads();
  if (!is_last) return;
  merge_pair<D>(p, smem, pair, count);
  if (threadIdx.x == 0) p.merge_counters[pair] = 0u;
}

template <int D, Int2Pages PAGES, bool PARALLEL, bool TABLE, bool M16, bool PACK, bool WORK, int MERGE_PARTS = 0>
void launch_kernel(const PagedDecodeParams& p, cudaStream_t stream) {
  static const bool configured = [] {
    cudaFuncSetAttribute(paged_decode_kernel<D, PAGES, PARALLEL, TABLE, M16, PACK, WORK, MERGE_PARTS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<D>());
    return true;
  }();
  (void)configured;
  const int pairs = p.batch * p.num_kv_heads;
  const unsigned ctas = WORK ? (unsigned)(p.work_ctas + (MERGE_PARTS > 0 ? p.work_merge_ctas : 0))
                             : (unsigned)(pairs * (p.splits_total() + p.merge_parts));
  paged_decode_kernel<D, PAGES, PARALLEL, TABLE, M16, PACK, WORK, MERGE_PARTS><<<ctas, kThreads, smem_bytes<D>(), stream>>>(p);
}
template <int D, Int2Pages PAGES, bool PARALLEL, bool TABLE, bool M16, bool PACK>
void launch_kernel(const PagedDecodeParams& p, cudaStream_t stream) {
  if constexpr (!PARALLEL && !TABLE && PAGES != Int2Pages::none) {
    if (p.work && p.merge_flags) {
      constexpr int PARTS = merge_cta_parts_max<D>();
      if (p.merge_cta_parts == PARTS) return launch_kernel<D, PAGES, false, false, M16, PACK, true, PARTS>(p, stream);
      return launch_kernel<D, PAGES, false, false, M16, PACK, true, 1>(p, stream);
    }
  }
  if constexpr (!PARALLEL && !TABLE) {
    if (p.work) return launch_kernel<D, PAGES, false, false, M16, PACK, true>(p, stream);
  }
  launch_kernel<D, PAGES, PARALLEL, TABLE, M16, PACK, false>(p, stream);
}

// The query's lo terms in the free mma columns where the heads fit twice in them (g <= 4), in the INT2 and BF16 paths.
template <int D, Int2Pages PAGES, bool PARALLEL, bool TABLE, bool M16>
void launch_kernel(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.group <= 4) return launch_kernel<D, PAGES, PARALLEL, TABLE, M16, true>(p, stream);
  launch_kernel<D, PAGES, PARALLEL, TABLE, M16, false>(p, stream);
}

template <int D, Int2Pages PAGES, bool M16>
void launch_kernel(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.merge_parts > 0) {
    launch_kernel<D, PAGES, true, false, M16>(p, stream);
  } else if constexpr (PAGES != Int2Pages::none) {  // a split table has INT2 splits
    if (p.int2_split_table)
      launch_kernel<D, PAGES, false, true, M16>(p, stream);
    else
      launch_kernel<D, PAGES, false, false, M16>(p, stream);
  } else {
    launch_kernel<D, PAGES, false, false, M16>(p, stream);
  }
}

template <Int2Pages PAGES, bool M16 = false>
void launch_for_dim(const PagedDecodeParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: launch_kernel<64, PAGES, M16>(p, stream); break;
    case 128: launch_kernel<128, PAGES, M16>(p, stream); break;
    case 256: launch_kernel<256, PAGES, M16>(p, stream); break;
    default: break;
  }
}

template <int D>
int occupancy() {
  const auto kernel = paged_decode_kernel<D, Int2Pages::paired, false, false, false, false, false>;  // the default 64-token pages
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<D>());
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem_bytes<D>()) != cudaSuccess)
    return 1;
  return n > 0 ? n : 1;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("paged decode: " + message);
}

}  // namespace

bool fused_merge_fits(int splits_total, int group, int head_dim) {
  const int slices = 4 * kThreads / head_dim;
  const long need = ((((long)splits_total * group + 3) & ~3L) + (1L + slices) * group * head_dim + 8) * 4;
  const long have = head_dim == 64 ? smem_bytes<64>() : head_dim == 128 ? smem_bytes<128>() : smem_bytes<256>();
  return need <= have;
}

int parallel_merge_parts(int group, int head_dim) {
  const int cols = head_dim == 64 ? merge_cols<64>() : head_dim == 128 ? merge_cols<128>() : merge_cols<256>();
  return group * (head_dim / cols);
}

bool parallel_merge_fits(int splits_total, int head_dim) {
  const long need = 4L * (head_dim == 64    ? merge_cta_smem_floats<64>(splits_total)
                          : head_dim == 128 ? merge_cta_smem_floats<128>(splits_total)
                                            : merge_cta_smem_floats<256>(splits_total));
  const long have = head_dim == 64 ? smem_bytes<64>() : head_dim == 128 ? smem_bytes<128>() : smem_bytes<256>();
  return need <= have;
}

int merge_cta_parts(int head_dim) {
  return head_dim == 64    ? merge_cta_parts_max<64>()
         : head_dim == 128 ? merge_cta_parts_max<128>()
                           : merge_cta_parts_max<256>();
}

int paged_decode_ctas_per_sm(int head_dim) {
  static const int n64 = occupancy<64>(), n128 = occupancy<128>(), n256 = occupancy<256>();
  return head_dim == 64 ? n64 : head_dim == 128 ? n128 : n256;
}

void check_paged_decode(const PagedDecodeParams& p) {
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          "head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  require(p.group >= 1 && p.group <= kDecodeMaxGroup,
          "GQA ratio " + std::to_string(p.group) + " is not supported (1 to 8 query heads per KV head)");
  require(p.batch >= 1 && p.num_kv_heads >= 1, "batch and KV heads must be positive");
  require((long)p.batch * p.num_kv_heads * p.splits_total() <= 0x7fffffffL, "grid too large");
  require(p.queries && p.partial_out && p.partial_lse2, "null queries or partial outputs");
  require(reinterpret_cast<uintptr_t>(p.value_rotation_t) % 16 == 0 && p.rotation_kv_head_stride % 4 == 0,
          "the value rotation must be 16-byte aligned");
  require(p.splits_total() >= 1, "no splits (both tiers absent)");
  require(std::isfinite(p.softmax_scale) && p.softmax_scale > 0, "softmax scale must be positive");
  if (p.int2_splits > 0) {
    require(p.int2_page_size >= 16 && (p.int2_page_size & (p.int2_page_size - 1)) == 0,
            "INT2 page size must be a power of two >= 16");
    require(p.int2_chunk > 0 && p.int2_chunk % kInt2ChunkQuantum == 0, "INT2 split chunk must be a multiple of 64");
    require(p.key_codes && p.value_codes && p.int2_metadata && p.int2_page_table && p.int2_lengths,
            "null INT2 cache pointer");
    require(!p.int2_metadata_fp16 || p.int2_page_size >= 32, "fp16 INT2 metadata needs pages of >= 32 tokens");
  }
  if (p.bf16_splits > 0) {
    require(p.bf16_page_size >= 32 && p.bf16_page_size % 32 == 0, "BF16 page size must be a multiple of 32");
    const int q = p.merge_parts > 0 ? kBf16ParallelQuantum : kBf16SplitQuantum;
    require(p.bf16_chunk > 0 && p.bf16_chunk % q == 0, "BF16 split chunk must be a multiple of " + std::to_string(q));
    require(p.bf16_keys && p.bf16_values && p.bf16_page_table && p.bf16_lengths, "null BF16 cache pointer");
  }
  if (p.merge_counters) {
    require(p.out != nullptr, "fused merge needs an output pointer");
    require(fused_merge_fits(p.splits_total(), p.group, p.head_dim), "too many splits for the fused merge");
  }
  if (p.merge_parts != 0) {
    require(p.merge_counters && p.merge_done, "the parallel merge needs its counters");
    require(p.merge_parts == parallel_merge_parts(p.group, p.head_dim), "merge_parts must be parallel_merge_parts()");
    require(parallel_merge_fits(p.splits_total(), p.head_dim), "too many splits for the parallel merge");
  }
  if (p.int2_split_table) {
    require(p.merge_parts == 0, "a split table does not go with the parallel merge");
    require(p.int2_splits >= 1 && p.int2_splits <= kDecodeMaxTableSplits, "a split table holds 1 to 64 INT2 splits");
    const int* start = p.int2_split_start;
    bool ok = start[0] == 0;
    for (int s = 0; s < p.int2_splits; ++s) ok = ok && start[s + 1] > start[s] && start[s + 1] % kInt2SplitQuantum == 0;
    require(ok, "INT2 split starts must be 0, then increasing multiples of 128");
  }
  if (p.work) {
    require(p.merge_counters && p.merge_parts == 0 && !p.int2_split_table,
            "a work list goes with the last-CTA merge only (no parallel merge, no split table)");
    require(p.work_ctas >= 1 && p.work_int2_ctas >= 0 && p.work_int2_ctas <= p.work_ctas,
            "a work list needs 1 or more CTAs, the INT2 ones first");
    require(p.work_int2_ctas == 0 || p.int2_splits > 0, "a work list's INT2 CTAs need an INT2 tier");
    require(p.work_int2_ctas == p.work_ctas || p.bf16_splits > 0, "a work list's BF16 CTAs need a BF16 tier");
  }
  if (p.merge_flags)  // (without merge_counters the work CTAs would not set the flags, and the merge CTAs would spin)
    require(p.work && p.merge_counters && p.int2_splits > 0 && p.work_merge_ctas >= 1 && p.merge_epoch != 0,
            "merge CTAs need a work list with the merge in the grid, an INT2 tier, 1 or more of them and an epoch "
            "other than 0");
  if (p.merge_flags) {
    const int parts = merge_cta_parts(p.head_dim);
    require(p.merge_cta_parts == 1 || p.merge_cta_parts == parts,
            "merge_cta_parts must be 1 or merge_cta_parts(d) = " + std::to_string(parts));
    require(p.work_merge_ctas % p.merge_cta_parts == 0, "work_merge_ctas must be a multiple of merge_cta_parts");
  }
}

void launch_paged_decode(const PagedDecodeParams& p, cudaStream_t stream) {
  check_paged_decode(p);
  if (p.merge_parts > 0) {  // merge CTAs spin on the splits: the whole grid must be resident at once
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const long ctas = (long)p.batch * p.num_kv_heads * (p.splits_total() + p.merge_parts);
    require(ctas <= (long)sms * paged_decode_ctas_per_sm(p.head_dim), "parallel merge grid exceeds one wave");
  }
  if (p.int2_splits == 0)
    launch_for_dim<Int2Pages::none>(p, stream);
  else if (p.int2_metadata_fp16)
    launch_for_dim<Int2Pages::paired, true>(p, stream);
  else if (p.int2_page_size >= 32)
    launch_for_dim<Int2Pages::paired>(p, stream);
  else
    launch_for_dim<Int2Pages::small>(p, stream);
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
