// Split-K flash-decoding over a paged segmented cache: INT2 history pages (2-bit codes in the quarter
// layout + (scale, zero) per token in fp32 or fp16) and BF16 pages (sink + recent tiers, or a whole plain BF16
// cache for the baseline). One launch writes a partial output and log2-sum-exp per split; with
// merge_counters set, the last CTA of each (sequence, KV head) also merges the splits and un-rotates
// (one launch per decode call), or, with merge_parts set (grids of one wave, i.e. batch 1), merge CTAs
// at the end of the same grid do it in parallel, or, with a work list and merge_flags set, a merge CTA per
// pair at the end of the grid folds its partials as they are written; otherwise decode_merge.h does it in a
// second launch.
// CPU twin: lib/backend/paged_cache.h.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace oscar::kernels {

constexpr int kDecodeMaxGroup = 8;      // query heads per KV head handled by one CTA
constexpr int kDecodeWarps = 4;         // warps per CTA
constexpr int kInt2SplitQuantum = 128;  // INT2 tokens per split table entry or work piece: a multiple of this (4
                                        // warps x 2 tiles x 16; a CTA step at d = 64 is two quanta: 4 tiles per warp)
constexpr int kInt2ChunkQuantum = 64;   // equal INT2 splits (int2_chunk): a multiple of this, so a split may end in
                                        // half a CTA step (its tiles past the end masked)
constexpr int kBf16SplitQuantum = 128;  // BF16 tokens per split: a multiple of this (4 warps x 32)
constexpr int kBf16ParallelQuantum = 64;  // the same in the parallel merge's grids (balanced tiles)
constexpr int kDecodeMaxTableSplits = 64;  // INT2 splits of a split table

// One CTA's share of a work list (PagedDecodeParams::work): tokens [begin, end) of one tier of pair b * Hkv + kv,
// written to partial slot `slot` of the pair's `count`; end is already clamped to the tier's length. A merge CTA's
// entry: the pair, its `count` partials, and its column part `slot` (of PagedDecodeParams::merge_cta_parts).
struct alignas(16) DecodeWork {
  int32_t pair = 0;
  uint16_t slot = 0, count = 0;
  int32_t begin = 0, end = 0;
};

struct PagedDecodeParams {
  int batch = 0;         // B sequences
  int num_kv_heads = 0;  // Hkv
  int group = 0;         // g query heads per KV head (1..8); Hq = Hkv * g
  int head_dim = 0;      // d in {64, 128, 256}
  float softmax_scale = 0;
  const float* queries = nullptr;  // [B, Hkv*g, d] already rotated (q . R_K); head hq = kv*g + j

  // INT2 tier (may be absent: int2_splits = 0).
  int int2_page_size = 0;                 // P tokens per page, a power of two >= 16; pool < 2^32 rows
  const uint8_t* key_codes = nullptr;     // [pages, Hkv, P, d/4] quarter layout
  const uint8_t* value_codes = nullptr;   // [pages, Hkv, P, d/4]
  const void* int2_metadata = nullptr;    // [pages, Hkv, P, 4] = (k_scale, k_zero, v_scale, v_zero)
  bool int2_metadata_fp16 = false;        // int2_metadata holds fp16 (8 B per row; pages >= 32 tokens), else fp32
  const int32_t* int2_page_table = nullptr;  // [B, int2_max_pages]
  int int2_max_pages = 0;
  const int32_t* int2_lengths = nullptr;  // [B] INT2 tokens per sequence
  int int2_splits = 0;                    // grid splits for the INT2 tier (with work: the most of any sequence)
  int int2_chunk = 0;                     // tokens per split, multiple of kInt2ChunkQuantum

  // BF16 tier (may be absent: bf16_splits = 0). Token order inside it is irrelevant to softmax.
  int bf16_page_size = 0;                 // tokens per page, multiple of 32
  const uint16_t* bf16_keys = nullptr;    // [pages, Hkv, P16, d] bfloat16 bits
  const uint16_t* bf16_values = nullptr;  // [pages, Hkv, P16, d]
  const int32_t* bf16_page_table = nullptr;  // [B, bf16_max_pages]
  int bf16_max_pages = 0;
  const int32_t* bf16_lengths = nullptr;  // [B]
  int bf16_splits = 0;
  int bf16_chunk = 0;                     // multiple of kBf16SplitQuantum (kBf16ParallelQuantum with merge_parts)

  // Outputs, splits_total = int2_splits + bf16_splits (INT2 splits first).
  float* partial_out = nullptr;   // [B, Hkv, splits_total, g, d] normalised within the split
  float* partial_lse2 = nullptr;  // [B, Hkv, splits_total, g] log2 sum exp2(logit*log2e); -inf if empty
  int splits_total() const { return int2_splits + bf16_splits; }

  // Fused merge (optional): when merge_counters is set, the last CTA to finish a (sequence, KV head)
  // merges its splits, applies o . R_V^T and writes out; counters must be zero before the first call
  // and are left at zero. Needs fused_merge_fits(). value_rotation_t: R_V^T [d, d] or null.
  unsigned* merge_counters = nullptr;  // [B, Hkv]
  const float* value_rotation_t = nullptr;
  long rotation_kv_head_stride = 0;  // 0: one matrix for every KV head; d*d: one per KV head
  float* out = nullptr;              // [B, Hkv*g, d]
  // Parallel merge (optional, with merge_counters): merge_parts = parallel_merge_parts(g, d) extra CTAs
  // per (sequence, KV head) at the end of the grid, each waiting for that pair's splits and merging one
  // (query head, column block) of the output, instead of the last split CTA merging alone. They spin on
  // the counters, so every CTA of the launch must be resident at once (parallel_merge_fits and a grid of
  // at most one wave: the caller checks). merge_done [B, Hkv] zero before the first call, left at zero.
  int merge_parts = 0;
  unsigned* merge_done = nullptr;
  // Split table (optional, grids without merge_parts): INT2 split s covers tokens [int2_split_start[s],
  // int2_split_start[s + 1]) (0 first, then increasing multiples of kInt2SplitQuantum) instead of
  // [s * int2_chunk, (s + 1) * int2_chunk), and the INT2 CTAs are ordered split-major, so that the grid
  // hands out its largest pieces first (see the planner).
  bool int2_split_table = false;
  int int2_split_start[kDecodeMaxTableSplits + 1] = {};
  // Work list (optional, grids merged by the last CTA without a split table; ragged batches): CTA i takes work[i]
  // instead of the (sequence, KV head, split) its index gives, the first work_int2_ctas entries on the INT2 tier,
  // the rest on the BF16 tier, work_ctas CTAs in all. Pair (b, kv)'s partials are then the `count` slots
  // [0, count) of its row of int2_splits + bf16_splits, so every sequence can have its own number of INT2 splits.
  const DecodeWork* work = nullptr;
  int work_int2_ctas = 0, work_ctas = 0;
  // Merge CTAs (optional, with a work list and merge_counters): the grid ends with work_merge_ctas more CTAs, work
  // entries [work_ctas, work_ctas + work_merge_ctas) naming a pair and its count. A CTA that wrote its partial sets
  // merge_flags[pair * splits_total + slot] to merge_epoch (release) instead of arriving; the pair's merge CTA loads
  // R_V^T, then folds the partials in slot order as their flags show the epoch, and un-rotates. merge_flags must not
  // hold merge_epoch before the call (the caller counts the epoch up from 1 over flags zeroed once). The merge CTAs
  // spin, so the caller keeps them fewer than the CTAs resident at once (the work they wait for then has a slot).
  // merge_cta_parts merge CTAs per pair (1 or merge_cta_parts(d), work_merge_ctas = pairs x that): each folds all of
  // the pair's partials and un-rotates its share of the output columns (the un-rotation ends the launch, and then runs
  // on that many multiprocessors).
  unsigned* merge_flags = nullptr;
  unsigned merge_epoch = 0;
  int work_merge_ctas = 0;
  int merge_cta_parts = 1;
};

// Grid: one CTA per (split, KV head, sequence) or per work-list entry, INT2 CTAs first. CTAs of the INT2 path
// that fit on one multiprocessor at once (occupancy), for split planning.
int paged_decode_ctas_per_sm(int head_dim);
// Whether the fused merge's shared-memory scratch (splits_total * g weights, g * d merged outputs,
// 512 / d row slices of g * d for the un-rotation) fits.
bool fused_merge_fits(int splits_total, int group, int head_dim);

// Merge CTAs per (sequence, KV head) of a work list's merge CTAs where the grid has room for more than one: each
// un-rotates d / merge_cta_parts(d) of the output columns.
int merge_cta_parts(int head_dim);
// Merge CTAs per (sequence, KV head) of the parallel merge: g query heads x (d / columns per CTA).
int parallel_merge_parts(int group, int head_dim);
// Whether a parallel merge CTA's shared memory (a column block of R_V^T, splits_total weights) fits.
bool parallel_merge_fits(int splits_total, int head_dim);

// Throws std::invalid_argument with a clear message on unsupported shapes or bad pointers.
void check_paged_decode(const PagedDecodeParams& params);
void launch_paged_decode(const PagedDecodeParams& params, cudaStream_t stream);

// Tokens per split so that the grid has about target_ctas CTAs for the longest sequence.
int choose_split_chunk(long max_tokens, int batch, int num_kv_heads, int target_ctas, int quantum);

}  // namespace oscar::kernels
