// Bandwidth and clock probes, random fills (see bandwidth_probe.h). Grid-stride loops, 16-byte accesses,
// 4 loads in flight per thread.
#include "bandwidth_probe.h"

#include <cuda_fp16.h>

namespace oscar::kernels {
namespace {

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
          d = __ldcs(src + i + 3 * stride);
    __stcs(dst + i, a), __stcs(dst + i + stride, b), __stcs(dst + i + 2 * stride, c), __stcs(dst + i + 3 * stride, d);
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void read_kernel(const uint4* __restrict__ src, size_t n, unsigned* sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
          d = __ldcs(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= src[i].x;
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never taken; keeps the loads
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void clock_kernel(unsigned long long* out, unsigned spin_ns) {
  const unsigned long long t0 = global_ns();
  const long long c0 = clock64();
  unsigned long long t = t0;
  while (t - t0 < spin_ns) t = global_ns();
  out[0] = (unsigned long long)(clock64() - c0);
  out[1] = t - t0;
}

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
__device__ __forceinline__ float unit(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

__global__ void fill_bytes_kernel(uint8_t* data, size_t n, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    data[i] = (uint8_t)mix(i * 0x9e3779b97f4a7c15ull + seed);
}
__global__ void fill_bf16_kernel(uint16_t* data, size_t n, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = 4.0f * unit(mix(i * 0x9e3779b97f4a7c15ull + seed)) - 2.0f;
    data[i] = (uint16_t)(__float_as_uint(v) >> 16);
  }
}
__global__ void fill_float_kernel(float* data, size_t n, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    data[i] = 4.0f * unit(mix(i * 0x9e3779b97f4a7c15ull + seed)) - 2.0f;
}
template <typename T>
__global__ void fill_metadata_kernel(T* data, size_t rows, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * 4; i += (size_t)gridDim.x * blockDim.x) {
    const float u = unit(mix(i * 0x9e3779b97f4a7c15ull + seed));
    data[i] = T((i % 2 == 0) ? 0.3f + 0.4f * u : 1.0f + u);
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 132 * 32 ? (b > 0 ? b : 1) : 132 * 32);
}

}  // namespace

void launch_copy_probe(const BandwidthProbeParams& p, cudaStream_t stream) {
  copy_kernel<<<blocks_for(p.n16 / 4), kThreads, 0, stream>>>(p.source, p.destination, p.n16);
}
void launch_read_probe(const BandwidthProbeParams& p, cudaStream_t stream) {
  read_kernel<<<blocks_for(p.n16 / 4), kThreads, 0, stream>>>(p.source, p.n16, p.sink);
}
void launch_clock_probe(unsigned long long* out, unsigned spin_ns, cudaStream_t stream) {
  clock_kernel<<<1, 1, 0, stream>>>(out, spin_ns);
}
void launch_fill_random_bytes(uint8_t* data, size_t n, uint64_t seed, cudaStream_t stream) {
  fill_bytes_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed);
}
void launch_fill_random_bf16(uint16_t* data, size_t n, uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed);
}
void launch_fill_random_metadata(void* data, size_t rows, bool fp16, uint64_t seed, cudaStream_t stream) {
  if (fp16)
    fill_metadata_kernel<<<blocks_for(rows * 4), kThreads, 0, stream>>>(static_cast<__half*>(data), rows, seed);
  else
    fill_metadata_kernel<<<blocks_for(rows * 4), kThreads, 0, stream>>>(static_cast<float*>(data), rows, seed);
}
void launch_fill_random_float(float* data, size_t n, uint64_t seed, cudaStream_t stream) {
  fill_float_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed);
}

}  // namespace oscar::kernels
