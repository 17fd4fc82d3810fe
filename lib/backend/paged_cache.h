// The GPU serving layout of the segmented cache, held on the host (paged INT2 history + paged BF16
// sink/recent tokens, per-sequence page tables), and the CPU twins of the CUDA kernels that use it:
// quantize_pack_rows_reference (kernels/quantize_pack.h) and paged_decode_reference
// (kernels/paged_decode.h + kernels/decode_merge.h). Plain C++: no CUDA here.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/quantizer.h"

namespace oscar {

struct PagedCacheGeometry {
  int batch = 1;
  int num_kv_heads = 8;
  int group = 4;       // query heads per KV head (GQA ratio); Hq = Hkv * group
  int head_dim = 128;  // 64, 128 or 256 on the GPU
  int int2_page_size = 64;  // multiple of 16
  int bf16_page_size = 64;  // multiple of 32
  // Storage of the INT2 metadata on the device: fp32 (the reference serving layout, 16 bytes per token and KV
  // head: 2 + 64/d bits per element) or fp16 (8 bytes: 2 + 32/d bits; the values must be fp16 values, i.e.
  // quantised with fp16 metadata; INT2 pages of >= 32 tokens).
  bool int2_metadata_fp16 = false;
  int num_q_heads() const { return num_kv_heads * group; }
  int int2_metadata_row_bytes() const { return int2_metadata_fp16 ? 8 : 16; }
};

// Rows are addressed as ((page * Hkv + kv) * page_size + slot). INT2 metadata per row is 4 values:
// (key scale, key zero, value scale, value zero), held here as floats whatever the device storage.
struct HostPagedCache {
  PagedCacheGeometry geometry;
  std::vector<int32_t> int2_lengths, bf16_lengths;  // [B] tokens per sequence in each tier
  int int2_max_pages = 0, bf16_max_pages = 0;       // page-table row length
  int int2_pages = 0, bf16_pages = 0;               // pages in each pool
  std::vector<int32_t> int2_page_table, bf16_page_table;  // [B, max_pages], -1 = unused
  std::vector<uint8_t> key_codes, value_codes;  // [int2_pages, Hkv, P, d/4]
  std::vector<float> int2_metadata;             // [int2_pages, Hkv, P, 4]
  std::vector<uint16_t> bf16_keys, bf16_values;  // [bf16_pages, Hkv, P16, d] bfloat16 bits

  int64_t int2_row(int b, int kv, int token) const;  // destination row of token t of (b, kv)
  int64_t bf16_row(int b, int kv, int token) const;
  int64_t int2_bytes_read() const;  // codes + metadata (as stored on the device) of every live INT2 token
  int64_t bf16_bytes_read() const;  // keys + values of every live BF16 token
};

// The INT2 metadata as fp16 bits, for the fp16 device layout; throws oscar::Error naming the first value that is
// not an fp16 value (metadata quantised as fp32 or bf16).
std::vector<uint16_t> int2_metadata_fp16(const HostPagedCache& cache);

// Allocates pools and page tables for the given lengths; pages are handed out in a shuffled order
// (seeded) so that page-table indirection is exercised. Contents are zero.
HostPagedCache make_paged_cache(const PagedCacheGeometry& geometry, const std::vector<int32_t>& int2_lengths,
                                const std::vector<int32_t>& bf16_lengths, uint64_t seed = 1);

// CPU twin of kernels/quantize_pack: rows [N, d] -> (x . R) -> quantize_row + pack_codes (2 bits,
// one group per row); codes to codes[dst * d/4], (scale, zero) to metadata[dst * stride + offset].
void quantize_pack_rows_reference(const float* input, long rows, int dim, const float* rotation,
                                  const QuantizerConfig& config, uint8_t* codes, float* metadata, int stride,
                                  int offset, const int64_t* destination_rows);

// Fills the BF16 tier of (b, kv) from float rows [n, d] (rounded to bfloat16).
void fill_bf16_tier(HostPagedCache& cache, int b, int kv, const float* keys, const float* values, int n);
// Fills the INT2 tier of (b, kv) by quantising (already rotated) rows [n, d] with the CPU quantiser.
void fill_int2_tier(HostPagedCache& cache, int b, int kv, const float* keys, const float* values, int n,
                    const QuantizerConfig& key_config, const QuantizerConfig& value_config);

// CPU twin of the paged decode + merge: for each sequence and KV head, dequantised INT2 history and
// BF16 tokens attended in float64 (lib/attention), merged exactly, un-rotated by R_V^T.
// queries [B, Hq, d] (rotated), value_rotation R_V [d, d] or null; out [B, Hq, d].
void paged_decode_reference(const HostPagedCache& cache, const float* queries, double softmax_scale,
                            const float* value_rotation, float* out);

}  // namespace oscar
