// Host API of the CUDA decode path (CUDA builds only): device buffers, the paged cache uploaded in
// its serving layout, and the decode (split-K kernel + merge/un-rotation kernel) as one call.
// The CPU twin of every piece is in backend/paged_cache.h.
#pragma once
#ifdef OSCAR_WITH_CUDA
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/paged_cache.h"
#include "paged_decode.h"

namespace oscar {

// Throws oscar::Error("<what>: <CUDA error string>") unless status is cudaSuccess.
void cuda_check(cudaError_t status, const char* what);

// Owning device allocation of n elements of T (cudaMalloc; no managed memory).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), size_(other.size_) { other.ptr_ = nullptr, other.size_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) release(), ptr_ = other.ptr_, size_ = other.size_, other.ptr_ = nullptr, other.size_ = 0;
    return *this;
  }
  void resize(size_t n) {  // contents are lost
    if (n == size_ && ptr_) return;
    release();
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&ptr_), (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc");
    size_ = n;
  }
  void upload(const T* host, size_t n) {
    if (n > size_ || !ptr_) resize(n);
    if (n) cuda_check(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  std::vector<T> download(size_t n) const {
    std::vector<T> host(n);
    if (n) cuda_check(cudaMemcpy(host.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }
  std::vector<T> download() const { return download(size_); }
  T* get() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// The paged cache on the device, same layout as HostPagedCache; the INT2 metadata as geometry says (fp32 or fp16).
struct DevicePagedCache {
  PagedCacheGeometry geometry;
  int int2_max_pages = 0, bf16_max_pages = 0;
  int max_int2_length = 0, max_bf16_length = 0;
  int min_int2_length = 0;  // the shortest INT2 tier of the batch
  std::vector<int32_t> host_int2_lengths;  // [batch] INT2 tokens per sequence (split planning)
  std::vector<int32_t> host_bf16_lengths;  // [batch] BF16 tokens per sequence (work lists)
  DeviceBuffer<int32_t> int2_lengths, bf16_lengths, int2_page_table, bf16_page_table;
  DeviceBuffer<uint8_t> key_codes, value_codes;
  DeviceBuffer<uint8_t> int2_metadata;  // [int2 rows, 4] fp32 or fp16 values
  DeviceBuffer<uint16_t> bf16_keys, bf16_values;
  void upload(const HostPagedCache& host);
  // Benchmark cache built on the device: pages handed out in order, random codes, metadata and bf16.
  void allocate_random(const PagedCacheGeometry& geometry, const std::vector<int32_t>& int2_lengths,
                       const std::vector<int32_t>& bf16_lengths, uint64_t seed);
  size_t device_bytes() const;
};
// Device bytes allocate_random would take (to skip shapes that do not fit).
size_t paged_cache_device_bytes(const PagedCacheGeometry& geometry, const std::vector<int32_t>& int2_lengths,
                                const std::vector<int32_t>& bf16_lengths);

// Splits of each tier (0 splits if a tier is empty). INT2: the split count that minimises waves x
// tokens per CTA for ctas_per_sm resident CTAs per multiprocessor (<= 0: the kernel's occupancy), with
// at most 12K tokens per CTA, plus a merge cost per split (lower where the parallel merge applies; ragged
// batches: the end of a greedy fill of the slots with the non-empty and empty CTAs in grid order);
// BF16: as many CTAs as the INT2 CTAs' last wave leaves slots free (about ctas_per_sm * SMs without
// INT2 tokens), at least one per (sequence, KV head), each at most 1/8 of an INT2 CTA's tokens, in multiples of
// kernels::kBf16SplitQuantum (kBf16ParallelQuantum in parallel-merge grids of batch 1 with at most 8 KV heads; run
// without the parallel merge, such a plan's BF16 splits are rounded up to multiples of kBf16SplitQuantum).
struct CudaDecodePlan {
  int int2_splits = 0, int2_chunk = 128, bf16_splits = 0, bf16_chunk = 128;
  // Merge by parallel merge CTAs when the whole grid is resident at once (small batches), else by the
  // last split CTA of each (sequence, KV head); false forces the latter.
  bool parallel_merge = true;
  // INT2 split boundaries (int2_splits + 1 tokens, see plan_cuda_decode) for grids merged by the last CTA;
  // empty: int2_chunk tokens per split. int2_chunk is then the largest split (used by the parallel merge).
  std::vector<int> int2_split_start;
  // Ragged batches merged by the last CTA: the INT2 tier as pieces of each sequence (one CTA per piece and KV head),
  // in the order the grid takes them; empty: int2_splits splits of int2_chunk tokens for every sequence. A sequence's
  // pieces tile its INT2 tokens from 0, each starting at a multiple of kInt2SplitQuantum (a sequence without INT2
  // tokens has none, or the empty piece [0, 0) when there is no BF16 tier). With pieces, int2_splits is the most
  // pieces of any sequence, int2_chunk the longest piece, and the decoder runs a work list (kernels::DecodeWork).
  struct Int2Piece {
    int32_t sequence = 0, begin = 0, end = 0;  // INT2 tokens [begin, end)
    bool operator==(const Int2Piece&) const = default;
  };
  std::vector<Int2Piece> int2_pieces;
  // Merge in the grid by a merge CTA per (sequence, KV head) at its end (kernels::PagedDecodeParams::merge_flags)
  // rather than by each pair's last CTA: the planner's choice for grids of more than one and at most two waves that
  // are not merged in parallel, with fewer pairs than CTAs resident at once (it needs the cache's lengths on the
  // host). The decoder then runs the grid as a work list: the pieces, or without them the splits as pieces (a split
  // table's split-major, else each sequence's equal chunks). A plan that cannot have them is merged by its last CTAs.
  bool merge_ctas = false;
  // With merge_ctas: merge CTAs per pair, 1 or kernels::merge_cta_parts(d), each un-rotating that share of the output
  // columns: the planner's choice for ragged batches where pairs x merge_cta_parts(d) is at most half the CTAs resident
  // at once (a plan with more than the resident CTAs runs with 1).
  int merge_cta_parts = 1;
  int splits_total() const { return int2_splits + bf16_splits; }
};
CudaDecodePlan plan_cuda_decode(const DevicePagedCache& cache, int num_sms, int ctas_per_sm = 0);
// Whether CudaPagedDecoder::run merges this plan's splits by parallel merge CTAs in the same grid (the plan
// allows it, the merge fits, and the whole grid is resident at once on this GPU).
bool runs_parallel_merge(const PagedCacheGeometry& geometry, const CudaDecodePlan& plan);
// Whether CudaPagedDecoder::run takes the plan's INT2 split table (int2_split_start) rather than equal chunks:
// the plan has one and is not merged in parallel (parallel_merge: runs_parallel_merge's answer).
bool runs_split_table(const CudaDecodePlan& plan, bool parallel_merge);
int cuda_multiprocessor_count();

// Runs decode on stream: one launch (split-K partials, merged and un-rotated by the pair's parallel
// merge CTAs in the same grid or by the last CTA of each (sequence, KV head)) or, when the splits do not
// fit the fused merge's scratch, two (partials, then decode_merge). queries and out are device pointers
// [B, Hq, d]; value_rotation_t is R_V^T [d, d] on the device or null. INT2 pages must be a power of two
// >= 16 tokens. Throws oscar::Error when the plan's splits do not cover the longest tier of the cache.
class CudaPagedDecoder {
 public:
  void run(const DevicePagedCache& cache, const CudaDecodePlan& plan, const float* queries, float softmax_scale,
           const float* value_rotation_t, float* out, cudaStream_t stream = nullptr);

 private:
  DeviceBuffer<float> partial_out_, partial_lse2_;
  DeviceBuffer<unsigned> counters_;  // [B, Hkv] fused-merge arrival counters, left at zero by each call
  // The last work list on the device, and what it was built from: a call with the same pieces, split sizes and
  // sequence lengths reuses it instead of building it again (the layers of one decode step share them).
  struct WorkInputs {
    std::vector<CudaDecodePlan::Int2Piece> pieces;
    std::vector<int32_t> int2_lengths, bf16_lengths;
    int num_kv_heads = 0, int2_splits = 0, int2_chunk = 0, bf16_splits = 0, bf16_chunk = 0;
    int merge_parts = 0;  // the list ends with this many merge CTAs per pair
  };
  DeviceBuffer<kernels::DecodeWork> work_;
  WorkInputs work_inputs_;
  int work_ctas_ = 0;
  // Work-list grids with merge CTAs: [B, Hkv, splits_total] flags, zeroed when allocated; each call writes epoch_.
  DeviceBuffer<unsigned> flags_;
  unsigned epoch_ = 0;
};

}  // namespace oscar
#endif
