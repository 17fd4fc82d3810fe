// Rotate-clip-quantise-pack of K or V rows (one row per token and KV head) into the INT2 serving
// layout: d/4 bytes of codes in the quarter layout and one (scale, zero) per row, bit-identical to
// oscar::quantize_row + pack_codes on the same rotated row. Serves prefill and the demotion of the
// oldest recent-window tokens into INT2 pages. CPU twin: quantize_pack_rows_reference (lib/backend).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace oscar::kernels {

enum class MetadataRounding : int { fp16 = 0, bf16 = 1, fp32 = 2 };

struct QuantizePackParams {
  long rows = 0;                   // N rows
  int head_dim = 0;                // d in {64, 128, 256}
  const float* input = nullptr;    // [N, d]
  const float* rotation = nullptr; // [d, d], rows are rotated as x_row @ rotation; null = identity
  float clip_ratio = 1.0f;         // (0, 1]; 1 = no clipping
  MetadataRounding metadata = MetadataRounding::fp32;  // rounding of scale and zero (stored as fp32)
  uint8_t* codes = nullptr;        // [*, d/4] indexed by destination row
  void* metadata_out = nullptr;    // [*, metadata_stride]: scale at +offset, zero at +offset+1
  bool metadata_out_fp16 = false;  // metadata_out holds fp16 values (the fp16 paged layout; needs metadata = fp16),
                                   // else fp32
  int metadata_stride = 2;         // floats per destination row (4 in the paged layout: k s, k z, v s, v z)
  int metadata_offset = 0;         // 0 for keys, 2 for values in the paged layout
  const int64_t* destination_rows = nullptr;  // [N] destination row of each input row; null = identity
  void* workspace = nullptr;  // quantize_pack_workspace_bytes(params) bytes of device memory, 16-byte aligned, used by
                              // the call in stream order (not shared with a concurrent call); null = the call
                              // allocates it on its stream (cudaMallocAsync) where it needs one
};

void check_quantize_pack(const QuantizePackParams& params);
// Device memory a call with these parameters needs on the current device besides its operands (d = 256 with a
// rotation, on the tensor-core paths below: R split into fp16 hi / lo fragments by a first kernel, ~257 KB; else 0).
size_t quantize_pack_workspace_bytes(const QuantizePackParams& params);
// The kernel a call with these parameters takes on the current device. For reports (oscar-bench); the launch decides
// the same way.
enum class QuantizePackPath : int {
  thread_per_row,  // the fast path: the clip threshold among the 32 largest magnitudes, x.R (if any) on tensor cores;
                   // needs 16-byte aligned operands and a device that grants its shared memory (~227 KB at d = 128
                   // rotated, ~100 KB at d = 256 rotated)
  tensor_rotate_warp_per_row,  // with a rotation, more clipped values and enough rows (per multiprocessor: 32 at
                               // d = 256, 128 at d = 128, 512 at d = 64; same needs): the same x.R, then a warp per
                               // row
  warp_per_row,                // the rest: fp32 x.R through shared memory, then a warp per row (slower)
};
QuantizePackPath quantize_pack_path(const QuantizePackParams& params);
const char* quantize_pack_path_name(QuantizePackPath path);  // thread-per-row, tc-warp-per-row, warp-per-row
void launch_quantize_pack(const QuantizePackParams& params, cudaStream_t stream);

}  // namespace oscar::kernels
