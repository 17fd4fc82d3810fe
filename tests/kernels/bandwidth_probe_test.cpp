// GPU tests of oscar-bench's helpers: the copy probe copies, the random fills stay in their documented
// ranges, and the SM clock probe reads a clock no faster than the device's maximum.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/cuda_paged.h"
#include "bandwidth_probe.h"
#include "common/float16.h"

namespace oscar {
namespace {

TEST(BandwidthProbe, CopyProbeCopiesEveryWord) {
  const size_t n16 = 4099 * 4 + 3;  // not a multiple of the 4-word unroll
  DeviceBuffer<uint8_t> a(n16 * 16), b(n16 * 16);
  kernels::launch_fill_random_bytes(a.get(), a.size(), 5, nullptr);
  cuda_check(cudaMemset(b.get(), 0, b.size()), "cudaMemset");
  kernels::BandwidthProbeParams p;
  p.source = reinterpret_cast<const uint4*>(a.get());
  p.destination = reinterpret_cast<uint4*>(b.get());
  p.n16 = n16;
  kernels::launch_copy_probe(p, nullptr);
  cuda_check(cudaDeviceSynchronize(), "copy probe");
  const std::vector<uint8_t> src = a.download(), dst = b.download();
  EXPECT_EQ(src, dst);
  EXPECT_GT(std::count_if(src.begin(), src.end(), [](uint8_t v) { return v != 0; }), static_cast<long>(src.size() / 2));
}

TEST(BandwidthProbe, RandomFillsStayInTheirRanges) {
  const size_t rows = 10007;
  DeviceBuffer<float> meta(rows * 4), x(rows);
  DeviceBuffer<uint16_t> meta16(rows * 4);
  kernels::launch_fill_random_metadata(meta.get(), rows, false, 3, nullptr);
  kernels::launch_fill_random_metadata(meta16.get(), rows, true, 3, nullptr);
  kernels::launch_fill_random_float(x.get(), rows, 4, nullptr);
  cuda_check(cudaDeviceSynchronize(), "fills");
  const std::vector<float> m = meta.download(), v = x.download();
  const std::vector<uint16_t> m16 = meta16.download();
  for (size_t i = 0; i < m.size(); ++i) {
    if (i % 2 == 0) {
      ASSERT_GE(m[i], 0.3f) << i;
      ASSERT_LT(m[i], 0.7f) << i;
    } else {
      ASSERT_GE(m[i], 1.0f) << i;
      ASSERT_LT(m[i], 2.0f) << i;
    }
    ASSERT_EQ(fp16_to_float(m16[i]), round_to_fp16(m[i])) << i;  // the same values, rounded to fp16
  }
  for (float f : v) ASSERT_TRUE(f >= -2.0f && f < 2.0f) << f;
}

TEST(BandwidthProbe, ClockProbeReadsAPlausibleSmClock) {
  int device = 0, max_khz = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&max_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute");
  DeviceBuffer<unsigned long long> out(2);
  kernels::launch_clock_probe(out.get(), 20000, nullptr);
  cuda_check(cudaDeviceSynchronize(), "clock probe");
  const std::vector<unsigned long long> r = out.download();
  ASSERT_GE(r[1], 20000ull);      // spun for at least the requested time
  ASSERT_LT(r[1], 20000000ull);   // and not for ever
  const double mhz = 1000.0 * r[0] / r[1];
  EXPECT_GT(mhz, 50.0);
  EXPECT_LT(mhz, 1.05 * max_khz / 1000.0) << "max " << max_khz / 1000 << " MHz";
}

}  // namespace
}  // namespace oscar
