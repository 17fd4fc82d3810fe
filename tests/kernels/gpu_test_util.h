// Shared helpers of the GPU tests: seeded random data, relative errors, and the float-tolerance checks of
// rotated quantise-pack runs against the CPU quantiser.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace oscar::test {

inline std::vector<float> random_normal(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// ||a - b|| / ||b|| over the whole arrays.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// Packed 2-bit codes [rows, d/4] of a rotated run against the CPU quantiser's: x.R differs by summation order and
// the tensor-core split, so a code may move, by one step at most, where a value sits on a rounding boundary: at
// most 0.1 % of them.
inline void expect_codes_close(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& ref_codes, long rows,
                               int d, const std::string& what) {
  long moved = 0;
  for (size_t i = 0; i < ref_codes.size(); ++i)
    for (int s = 0; s < 8; s += 2) {
      const int a = codes[i] >> s & 3, b = ref_codes[i] >> s & 3;
      ASSERT_LE(std::abs(a - b), 1) << what << ", byte " << i;
      moved += a != b;
    }
  EXPECT_LE(moved, rows * d / 1000) << what;
  std::printf("  %s: %ld of %ld codes moved one step (%.4f %%)\n", what.c_str(), moved, rows * d,
              100.0 * moved / (rows * d));
}

// Largest relative difference of the scales of (scale, zero) pairs (rows with a zero reference scale skipped).
inline double max_scale_error(const std::vector<float>& meta, const std::vector<float>& ref_meta) {
  double worst = 0.0;
  for (size_t i = 0; i < ref_meta.size(); i += 2)
    if (ref_meta[i] != 0.0f)
      worst = std::max(worst, std::fabs(static_cast<double>(meta[i]) - ref_meta[i]) / std::fabs(ref_meta[i]));
  return worst;
}

}  // namespace oscar::test
