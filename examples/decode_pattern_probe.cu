// Read probe with the INT2 decode's access pattern and none of its machinery (docs/performance-log.md, twenty-second
// round): Qwen3-8B geometry (8 KV heads, d = 128), 64-token pages, pools laid out as the paged cache's
// [pages, KV heads, 64 tokens, row] (K and V codes 32 B per row, metadata 16 B); one CTA of 4 warps per (sequence,
// KV head, split), split-major; each warp stage reads 32 tokens (1 KB of K codes, 1 KB of V codes, 512 B of
// metadata) with four stages in flight per warp; page p of sequence b is page b * pages_per_sequence + p (no page
// table), nothing is written. Printed against plain grid-stride reads of the same pools, after an L2 flush, best of 10.
// Build and run on the GPU machine (not part of the CMake build):
//   nvcc -O3 -arch=sm_90 -o decode_pattern_probe examples/decode_pattern_probe.cu
//   ./decode_pattern_probe 64 102400 10      # batch, INT2 tokens per sequence, splits (tokens / splits: a multiple of 128)
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
constexpr int HKV = 8, P = 64, Q = 32, MB = 16, NST = 4;
__device__ unsigned sink;
__global__ void __launch_bounds__(128, 4) pattern(const uint4* k, const uint4* v, const uint4* m, int tokens, int splits) {
  const int pair = blockIdx.x % (gridDim.x / splits), split = blockIdx.x / (gridDim.x / splits);
  const int b = pair / HKV, kv = pair % HKV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pages_per_seq = tokens / P, chunk = tokens / splits;
  const int t0 = split * chunk, t1 = t0 + chunk;
  unsigned acc = 0;
  for (int t = t0 + warp * 32; t < t1; t += 4 * 32 * NST) {
    uint4 a[NST][3];
#pragma unroll
    for (int s = 0; s < NST; ++s) {
      const int tok = t + s * 128;
      if (tok < t1) {
        const size_t page = (size_t)b * pages_per_seq + tok / P;
        const size_t row = (page * HKV + kv) * P + tok % P;  // first token row of the 32-token piece
        a[s][0] = __ldcs(k + row * 2 + lane);
        uint4 k2 = __ldcs(k + row * 2 + 32 + lane);
        a[s][1] = __ldcs(v + row * 2 + lane);
        uint4 v2 = __ldcs(v + row * 2 + 32 + lane);
        a[s][2] = __ldcs(m + row + lane);
        a[s][0].x ^= k2.y; a[s][1].x ^= v2.z;
      } else {
        a[s][0] = a[s][1] = a[s][2] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int s = 0; s < NST; ++s) acc ^= a[s][0].x ^ a[s][1].x ^ a[s][2].x ^ a[s][0].w ^ a[s][1].w ^ a[s][2].w;
  }
  if (acc == 0x12345678u) sink = acc;
}
__global__ void plain(const uint4* x, size_t n) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 a = __ldcs(x + i);
    acc ^= a.x ^ a.w;
  }
  if (acc == 0x12345678u) sink = acc;
}
int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s BATCH TOKENS SPLITS\n", argv[0]);
    return 1;
  }
  const int batch = atoi(argv[1]), tokens = atoi(argv[2]), splits = atoi(argv[3]);
  if (batch < 1 || tokens < 128 || splits < 1 || tokens % splits != 0 || (tokens / splits) % 128 != 0) {
    fprintf(stderr, "error: need batch >= 1 and tokens / splits a positive multiple of 128\n");
    return 1;
  }
  const size_t rows = (size_t)batch * tokens * HKV;
  uint4 *k, *v, *m, *flush;
  const size_t fl = 256ull << 20;
  if (cudaMalloc(&k, rows * Q) != cudaSuccess || cudaMalloc(&v, rows * Q) != cudaSuccess ||
      cudaMalloc(&m, rows * MB) != cudaSuccess || cudaMalloc(&flush, fl) != cudaSuccess) {
    fprintf(stderr, "error: cannot allocate %.0f MB of pools on the device\n", rows * (2.0 * Q + MB) / 1e6);
    return 1;
  }
  cudaMemset(k, 1, rows * Q); cudaMemset(v, 2, rows * Q); cudaMemset(m, 3, rows * MB); cudaMemset(flush, 0, fl);
  const double bytes = rows * (2.0 * Q + MB);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int mode = 0; mode < 2; ++mode) {
    float best = 1e9;
    for (int it = 0; it < 12; ++it) {
      plain<<<132 * 8, 256>>>(flush, fl / 16);
      cudaEventRecord(e0);
      if (mode == 0) pattern<<<batch * HKV * splits, 128>>>(k, v, m, tokens, splits);
      else { plain<<<132 * 8, 256>>>(k, rows * 2); plain<<<132 * 8, 256>>>(v, rows * 2); plain<<<132 * 8, 256>>>(m, rows); }
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (it > 1 && ms < best) best = ms;
    }
    printf("batch %d tokens %d splits %d %s: %.1f us, %.3f TB/s (%.0f MB)\n", batch, tokens, splits,
           mode == 0 ? "decode pattern" : "three pools contiguous", best * 1e3, bytes / best / 1e9, bytes / 1e6);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    fprintf(stderr, "error: %s\n", cudaGetErrorString(err));
    return 1;
  }
}
