// Host side of the CUDA decode path (see cuda_paged.h): uploads, split planning, the two launches.
#ifdef OSCAR_WITH_CUDA
#include "backend/cuda_paged.h"

#include <algorithm>
#include <stdexcept>

#include "common/error.h"
#include "decode_merge.h"
#include "paged_decode.h"

namespace oscar {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("{}: {}", what, cudaGetErrorString(status));
}

void DevicePagedCache::upload(const HostPagedCache& host) {
  geometry = host.geometry;
  int2_max_pages = host.int2_max_pages;
  bf16_max_pages = host.bf16_max_pages;
  max_int2_length = *std::max_element(host.int2_lengths.begin(), host.int2_lengths.end());
  max_bf16_length = *std::max_element(host.bf16_lengths.begin(), host.bf16_lengths.end());
  int2_lengths.upload(host.int2_lengths);
  bf16_lengths.upload(host.bf16_lengths);
  int2_page_table.upload(host.int2_page_table);
  bf16_page_table.upload(host.bf16_page_table);
  key_codes.upload(host.key_codes);
  value_codes.upload(host.value_codes);
  int2_metadata.upload(host.int2_metadata);
  bf16_keys.upload(host.bf16_keys);
  bf16_values.upload(host.bf16_values);
}

int cuda_multiprocessor_count() {
  int device = 0, count = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

CudaDecodePlan plan_cuda_decode(const DevicePagedCache& cache, int num_sms, int ctas_per_sm) {
  const auto& g = cache.geometry;
  CudaDecodePlan plan;
  const int target = std::max(1, num_sms * ctas_per_sm);
  if (cache.max_int2_length > 0) {
    plan.int2_chunk = kernels::choose_split_chunk(cache.max_int2_length, g.batch, g.num_kv_heads, target,
                                                  kernels::kInt2SplitQuantum);
    plan.int2_splits = (cache.max_int2_length + plan.int2_chunk - 1) / plan.int2_chunk;
  }
  if (cache.max_bf16_length > 0) {
    plan.bf16_chunk = kernels::choose_split_chunk(cache.max_bf16_length, g.batch, g.num_kv_heads, target,
                                                  kernels::kBf16SplitQuantum);
    plan.bf16_splits = (cache.max_bf16_length + plan.bf16_chunk - 1) / plan.bf16_chunk;
  }
  if (plan.splits_total() == 0) plan.bf16_splits = 1;  // every split empty: the output is zeros
  return plan;
}

void CudaPagedDecoder::run(const DevicePagedCache& cache, const CudaDecodePlan& plan, const float* queries,
                           float softmax_scale, const float* value_rotation_t, float* out, cudaStream_t stream) {
  const auto& g = cache.geometry;
  const size_t parts = static_cast<size_t>(g.batch) * g.num_kv_heads * plan.splits_total() * g.group;
  if (partial_lse2_.size() < parts) {
    partial_out_.resize(parts * g.head_dim);
    partial_lse2_.resize(parts);
  }
  kernels::PagedDecodeParams p;
  p.batch = g.batch;
  p.num_kv_heads = g.num_kv_heads;
  p.group = g.group;
  p.head_dim = g.head_dim;
  p.softmax_scale = softmax_scale;
  p.queries = queries;
  p.int2_page_size = g.int2_page_size;
  p.key_codes = cache.key_codes.get();
  p.value_codes = cache.value_codes.get();
  p.int2_metadata = cache.int2_metadata.get();
  p.int2_page_table = cache.int2_page_table.get();
  p.int2_max_pages = cache.int2_max_pages;
  p.int2_lengths = cache.int2_lengths.get();
  p.int2_splits = plan.int2_splits;
  p.int2_chunk = plan.int2_chunk;
  p.bf16_page_size = g.bf16_page_size;
  p.bf16_keys = cache.bf16_keys.get();
  p.bf16_values = cache.bf16_values.get();
  p.bf16_page_table = cache.bf16_page_table.get();
  p.bf16_max_pages = cache.bf16_max_pages;
  p.bf16_lengths = cache.bf16_lengths.get();
  p.bf16_splits = plan.bf16_splits;
  p.bf16_chunk = plan.bf16_chunk;
  p.partial_out = partial_out_.get();
  p.partial_lse2 = partial_lse2_.get();
  kernels::DecodeMergeParams m;
  m.batch = g.batch;
  m.num_kv_heads = g.num_kv_heads;
  m.group = g.group;
  m.head_dim = g.head_dim;
  m.splits_total = plan.splits_total();
  m.partial_out = p.partial_out;
  m.partial_lse2 = p.partial_lse2;
  m.value_rotation_t = value_rotation_t;
  m.out = out;
  try {
    kernels::launch_paged_decode(p, stream);
    cuda_check(cudaGetLastError(), "paged decode launch");
    kernels::launch_decode_merge(m, stream);
    cuda_check(cudaGetLastError(), "decode merge launch");
  } catch (const std::invalid_argument& e) {
    fail("cuda decode: {}", e.what());
  }
}

}  // namespace oscar
#endif
