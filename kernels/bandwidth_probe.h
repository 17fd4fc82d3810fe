// Memory-bandwidth probes for oscar-bench (device-to-device copy and read-only streaming kernels), an SM
// clock probe, and device-side random fills so benchmark caches of tens of GB need no host data.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace oscar::kernels {

struct BandwidthProbeParams {
  const uint4* source = nullptr;  // [n16] 16-byte words
  uint4* destination = nullptr;   // [n16] for the copy; unused by the read probe
  size_t n16 = 0;
  unsigned* sink = nullptr;       // one word the read probe writes so the loads are not removed
};
void launch_copy_probe(const BandwidthProbeParams& params, cudaStream_t stream);
void launch_read_probe(const BandwidthProbeParams& params, cudaStream_t stream);

// SM clock: one thread spins for spin_ns of %globaltimer and writes {SM cycles, ns} elapsed to out[0..1]
// (MHz = 1000 cycles / ns): the clock the GPU's power management runs the SMs at just then.
void launch_clock_probe(unsigned long long* out, unsigned spin_ns, cudaStream_t stream);

// Random bytes (hash of index and seed).
void launch_fill_random_bytes(uint8_t* data, size_t n, uint64_t seed, cudaStream_t stream);
// Random bfloat16 bits, roughly uniform in [-2, 2).
void launch_fill_random_bf16(uint16_t* data, size_t n, uint64_t seed, cudaStream_t stream);
// INT2 metadata rows [n, 4] = (k scale, k zero, v scale, v zero) with scale in [0.3, 0.7), zero in [1, 2), as
// fp32 or (fp16) fp16 values.
void launch_fill_random_metadata(void* data, size_t rows, bool fp16, uint64_t seed, cudaStream_t stream);
// Random floats, roughly uniform in [-2, 2).
void launch_fill_random_float(float* data, size_t n, uint64_t seed, cudaStream_t stream);

}  // namespace oscar::kernels
