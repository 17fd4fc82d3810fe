// TurboQuant primitives: the Lloyd-Max codebooks re-derived here independently (numerical integration of
// the Gaussian density, Lloyd iteration) to 1e-4, the randomized Hadamard (matches hadamard_matrix, round
// trip, seeded), exact coding of codebook points, distortion at the Lloyd-Max level, the QJL estimator's
// unbiasedness (and the bias of the plain MSE codebook it removes), and bits per vector.
#include "methods/baselines/turboquant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "rotation/rotation.h"

namespace oscar::baselines {
namespace {

// Independent derivation: composite Simpson integration (2000 panels per cell) of the N(0, 1) density and
// its first moment over each cell [b_{i-1}, b_i] (tails cut at +-12), Lloyd iteration from a different
// start (levels spread evenly on [-3, 3]).
std::vector<double> reference_lloyd_max(int bits) {
  const int levels = 1 << bits;
  auto simpson = [](double a, double b, auto f) {
    const int panels = 2000;
    const double h = (b - a) / panels;
    double s = f(a) + f(b);
    for (int i = 1; i < panels; ++i) s += (i % 2 ? 4 : 2) * f(a + i * h);
    return s * h / 3;
  };
  auto density = [](double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); };
  std::vector<double> c(levels);
  for (int i = 0; i < levels; ++i) c[i] = -3 + 6.0 * (i + 0.5) / levels;
  for (int it = 0; it < 5000; ++it) {
    double moved = 0;
    std::vector<double> next(levels);
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? -12.0 : 0.5 * (c[i - 1] + c[i]);
      const double b = i == levels - 1 ? 12.0 : 0.5 * (c[i] + c[i + 1]);
      next[i] = simpson(a, b, [&](double z) { return z * density(z); }) / simpson(a, b, density);
      moved = std::max(moved, std::fabs(next[i] - c[i]));
    }
    c = next;
    if (moved < 1e-10) break;
  }
  return c;
}

TEST(BaselinesTurboQuant, LloydMaxCodebooksRederived) {
  for (int bits : {1, 2, 3}) {
    const LloydMaxCodebook cb = lloyd_max_gaussian(bits);
    const std::vector<double> ref = reference_lloyd_max(bits);
    ASSERT_EQ(cb.centroids.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(cb.centroids[i], ref[i], 1e-4) << bits << " bits, level " << i;
    for (size_t i = 0; i + 1 < ref.size(); ++i)
      EXPECT_DOUBLE_EQ(cb.boundaries[i], 0.5 * (cb.centroids[i] + cb.centroids[i + 1]));
    for (size_t i = 0; i < ref.size(); ++i)  // symmetric law, symmetric codebook
      EXPECT_NEAR(cb.centroids[i], -cb.centroids[ref.size() - 1 - i], 1e-12);
  }
  // Facts from the literature (spec: ±0.453, ±1.51 at 2 bits; 1 bit: sqrt(2/pi)).
  EXPECT_NEAR(lloyd_max_gaussian(1).centroids[1], std::sqrt(2 / M_PI), 1e-9);
  EXPECT_NEAR(lloyd_max_gaussian(2).centroids[2], 0.4528, 1e-3);
  EXPECT_NEAR(lloyd_max_gaussian(2).centroids[3], 1.5104, 1e-3);
  // N(0, 1/d): the same codebook scaled by 1/sqrt(d).
  const LloydMaxCodebook scaled = lloyd_max_gaussian(2, 1 / std::sqrt(128.0));
  EXPECT_NEAR(scaled.centroids[3], lloyd_max_gaussian(2).centroids[3] / std::sqrt(128.0), 1e-12);
  EXPECT_THROW(lloyd_max_gaussian(0), Error);
}

TEST(BaselinesTurboQuant, FastHadamardMatchesTheMatrix) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (int d : {1, 2, 8, 128}) {
    std::vector<double> x(d), y(d);
    for (auto& v : x) v = normal(rng);
    y = x;
    fast_hadamard_transform(y.data(), d);
    const MatrixD h = hadamard_matrix(d);
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += x[i] * h(i, j);
      EXPECT_NEAR(y[j], s, 1e-12);
    }
  }
  std::vector<double> x(12);
  EXPECT_THROW(fast_hadamard_transform(x.data(), 12), Error);
}

TEST(BaselinesTurboQuant, RandomizedHadamardIsSeededAndOrthogonal) {
  const int d = 64;
  const RandomizedHadamard a(d, 7), b(d, 7), c(d, 8);
  EXPECT_EQ(a.first_signs(), b.first_signs());
  EXPECT_EQ(a.second_signs(), b.second_signs());
  EXPECT_NE(a.first_signs(), c.first_signs());
  int plus = 0;
  for (int s : a.first_signs()) plus += s == 1;
  EXPECT_GT(plus, 16);  // both signs occur (P(fail) ~ 1e-5 for a fair coin; fixed seed)
  EXPECT_LT(plus, 48);
  std::mt19937 rng(1);
  std::normal_distribution<double> normal;
  std::vector<double> x(d), y(d), back(d);
  for (auto& v : x) v = normal(rng);
  a.forward(x.data(), y.data());
  a.inverse(y.data(), back.data());
  double nx = 0, ny = 0;
  for (int i = 0; i < d; ++i) {
    EXPECT_NEAR(back[i], x[i], 1e-12);
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-10);
  // Pi x = ((x . s1) H) . s2, written out with the matrix.
  const MatrixD h = hadamard_matrix(d);
  for (int j = 0; j < d; ++j) {
    double s = 0;
    for (int i = 0; i < d; ++i) s += x[i] * a.first_signs()[i] * h(i, j);
    EXPECT_NEAR(y[j], s * a.second_signs()[j], 1e-12);
  }
}

// Encode picks, per rotated coordinate, the nearest level (brute force over the levels, not the boundaries),
// stores gamma = ||x||; decode is gamma Pi^T (c / sqrt d).
TEST(BaselinesTurboQuant, EncodePicksTheNearestLevelAndDecodeInverts) {
  const int d = 16;
  for (int bits : {2, 3}) {
    const TurboQuantizer tq(d, TurboQuantConfig{bits, false, MetadataType::fp32, 42});
    std::mt19937 rng(8);
    std::normal_distribution<float> normal;
    std::vector<float> x(d);
    for (auto& v : x) v = 3.0f * normal(rng);
    const auto e = tq.encode(x.data());
    double n2 = 0;
    for (float v : x) n2 += double(v) * v;
    EXPECT_NEAR(e.norm, std::sqrt(n2), 1e-5 * std::sqrt(n2));
    std::vector<double> u(d), y(d);
    for (int i = 0; i < d; ++i) u[i] = x[i] / e.norm;
    tq.rotation().forward(u.data(), y.data());
    const auto& levels = tq.codebook().centroids;
    ASSERT_EQ(levels.size(), size_t(1) << bits);
    for (int i = 0; i < d; ++i) {
      const double target = y[i] * std::sqrt(double(d));
      size_t best = 0;
      for (size_t k = 1; k < levels.size(); ++k)
        if (std::fabs(target - levels[k]) < std::fabs(target - levels[best])) best = k;
      EXPECT_EQ(e.codes[i], best) << i;
    }
    std::vector<float> x_hat(d);
    tq.decode(e, x_hat.data());
    std::vector<double> c(d), expected(d);
    for (int i = 0; i < d; ++i) c[i] = levels[e.codes[i]] / std::sqrt(double(d));
    tq.rotation().inverse(c.data(), expected.data());
    for (int i = 0; i < d; ++i) EXPECT_NEAR(x_hat[i], e.norm * expected[i], 1e-5);
  }
}

// Rotated coordinates of random vectors are ~N(0, 1/d): the relative MSE is the Lloyd-Max distortion of
// N(0, 1) (0.1175 at 2 bits, 0.03455 at 3 bits), within sampling error.
TEST(BaselinesTurboQuant, DistortionMatchesLloydMax) {
  const int d = 128, rows = 400;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * d), x_hat(x.size());
  for (int i = 0; i < rows * d; ++i) x[i] = normal(rng) * (1.0f + 4.0f * (i % d == 5));  // an outlier channel
  for (auto [bits, distortion] : {std::pair{2, 0.1175}, std::pair{3, 0.03455}}) {
    const TurboQuantizer tq(d, TurboQuantConfig{bits, false, MetadataType::fp16, 11});
    tq.quantize_dequantize(x.data(), rows, x_hat.data());
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (x[i] - x_hat[i]) * (x[i] - x_hat[i]);
      ref += x[i] * x[i];
    }
    EXPECT_NEAR(err / ref, distortion, 0.1 * distortion) << bits << " bits";
  }
}

// QJL: <q, x_hat> is unbiased over the random sketch and rotation; the 1-bit MSE codebook alone shrinks
// inner products by ~2/pi (biased): the QJL bit removes that bias.
TEST(BaselinesTurboQuant, QjlInnerProductsAreUnbiased) {
  const int d = 64, trials = 600;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> x(d), q(d), x_hat(d);
  for (auto& v : x) v = normal(rng);
  for (auto& v : q) v = normal(rng);
  double truth = 0;
  for (int i = 0; i < d; ++i) truth += static_cast<double>(q[i]) * x[i];
  auto mean_error = [&](bool qjl, double& standard_error) {
    std::vector<double> errors;
    for (int t = 0; t < trials; ++t) {
      const TurboQuantizer tq(d, TurboQuantConfig{qjl ? 2 : 1, qjl, MetadataType::fp32, 1000u + t});
      tq.decode(tq.encode(x.data()), x_hat.data());
      double s = 0;
      for (int i = 0; i < d; ++i) s += static_cast<double>(q[i]) * x_hat[i];
      errors.push_back(s - truth);
    }
    double m = 0, v = 0;
    for (double e : errors) m += e;
    m /= trials;
    for (double e : errors) v += (e - m) * (e - m);
    standard_error = std::sqrt(v / (trials - 1) / trials);
    return m;
  };
  double se_qjl = 0, se_mse = 0;
  const double bias_qjl = mean_error(true, se_qjl);
  const double bias_mse = mean_error(false, se_mse);
  EXPECT_LT(std::fabs(bias_qjl), 4 * se_qjl) << "qjl mean error " << bias_qjl;
  EXPECT_GT(std::fabs(bias_mse), 4 * se_mse) << "1-bit mse mean error " << bias_mse;
  // The decoded vector is linear in the stored sketch: <q, x_hat> = gamma (<Pi q, c/sqrt d> + qjl estimate).
  const TurboQuantizer tq(d, TurboQuantConfig{2, true, MetadataType::fp32, 5});
  const auto e = tq.encode(x.data());
  tq.decode(e, x_hat.data());
  std::vector<double> qd(q.begin(), q.end()), rq(d);
  tq.rotation().forward(qd.data(), rq.data());
  double expected = 0, got = 0;
  for (int i = 0; i < d; ++i) {
    expected += rq[i] * tq.codebook().centroids[e.codes[i]] / std::sqrt(double(d));
    got += qd[i] * x_hat[i];
  }
  expected = e.norm * (expected + tq.qjl_inner_product(rq.data(), e));
  EXPECT_NEAR(got, expected, 1e-4 * std::fabs(expected) + 1e-5);
}

TEST(BaselinesTurboQuant, BitsPerVector) {
  EXPECT_DOUBLE_EQ(TurboQuantizer(128, TurboQuantConfig{2, false, MetadataType::fp16, 0}).bits_per_vector(), 256 + 16);
  EXPECT_DOUBLE_EQ(TurboQuantizer(128, TurboQuantConfig{2, true, MetadataType::fp16, 0}).bits_per_vector(), 256 + 32);
  EXPECT_DOUBLE_EQ(TurboQuantizer(128, TurboQuantConfig{3, false, MetadataType::fp16, 0}).bits_per_vector(), 384 + 16);
  EXPECT_THROW(TurboQuantizer(128, TurboQuantConfig{1, true, MetadataType::fp16, 0}), Error);  // no codebook bit left
  EXPECT_THROW(TurboQuantizer(96, TurboQuantConfig{2, false, MetadataType::fp16, 0}), Error);  // not a power of 2
}

}  // namespace
}  // namespace oscar::baselines
