// TurboQuant primitives (see turboquant.h): fast Hadamard, seeded signs and sketches, Lloyd-Max
// codebook derivation for the Gaussian, encode/decode with the optional QJL residual bit.
#include "methods/baselines/turboquant.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "rotation/rotation.h"

namespace oscar::baselines {

void fast_hadamard_transform(double* x, int dim) {
  OSCAR_CHECK(is_power_of_two(dim), "Hadamard transform needs a power-of-two length, got {}", dim);
  for (int h = 1; h < dim; h *= 2)
    for (int i = 0; i < dim; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int i = 0; i < dim; ++i) x[i] *= norm;
}

double DeterministicRandom::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double DeterministicRandom::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

int DeterministicRandom::sign() { return (engine_() >> 63) ? -1 : 1; }

RandomizedHadamard::RandomizedHadamard(int dim, uint64_t seed) : dim_(dim), s1_(dim), s2_(dim) {
  OSCAR_CHECK(is_power_of_two(dim), "randomized Hadamard needs a power-of-two head_dim, got {}", dim);
  DeterministicRandom random(seed);
  for (int& s : s1_) s = random.sign();
  for (int& s : s2_) s = random.sign();
}

void RandomizedHadamard::forward(const double* x, double* y) const {
  for (int i = 0; i < dim_; ++i) y[i] = x[i] * s1_[i];
  fast_hadamard_transform(y, dim_);
  for (int i = 0; i < dim_; ++i) y[i] *= s2_[i];
}

void RandomizedHadamard::inverse(const double* y, double* x) const {
  for (int i = 0; i < dim_; ++i) x[i] = y[i] * s2_[i];
  fast_hadamard_transform(x, dim_);  // H^T = H
  for (int i = 0; i < dim_; ++i) x[i] *= s1_[i];
}

int LloydMaxCodebook::index_of(double y) const {
  return static_cast<int>(std::upper_bound(boundaries.begin(), boundaries.end(), y) - boundaries.begin());
}

LloydMaxCodebook lloyd_max_gaussian(int bits, double sigma, double tolerance, int max_iterations) {
  OSCAR_CHECK(bits >= 1 && bits <= 4 && sigma > 0, "Lloyd-Max codebook for {} bits, sigma {}", bits, sigma);
  const int levels = 1 << bits;
  auto pdf = [](double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); };
  auto cdf = [](double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); };
  LloydMaxCodebook cb;
  cb.centroids.resize(levels);
  cb.boundaries.resize(levels - 1);
  // Start from evenly spaced levels over [-2, 2] (standard units); the iteration is a contraction here.
  for (int i = 0; i < levels; ++i) cb.centroids[i] = levels == 1 ? 0.0 : -2.0 + 4.0 * (i + 0.5) / levels;
  for (int it = 1; it <= max_iterations; ++it) {
    for (int i = 0; i + 1 < levels; ++i) cb.boundaries[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
    double moved = 0;
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? -INFINITY : cb.boundaries[i - 1];
      const double b = i == levels - 1 ? INFINITY : cb.boundaries[i];
      // E[Z | a < Z < b] = (phi(a) - phi(b)) / (Phi(b) - Phi(a)) for Z ~ N(0, 1).
      const double pa = std::isinf(a) ? 0.0 : pdf(a), pb = std::isinf(b) ? 0.0 : pdf(b);
      const double mass = cdf(b) - cdf(a);
      const double c = (pa - pb) / mass;
      moved = std::max(moved, std::fabs(c - cb.centroids[i]));
      cb.centroids[i] = c;
    }
    cb.iterations = it;
    if (moved < tolerance) break;
  }
  for (int i = 0; i + 1 < levels; ++i) cb.boundaries[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
  for (double& c : cb.centroids) c *= sigma;
  for (double& b : cb.boundaries) b *= sigma;
  return cb;
}

TurboQuantizer::TurboQuantizer(int dim, const TurboQuantConfig& config)
    : dim_(dim), config_(config), rotation_(dim, config.seed) {
  const int codebook_bits = config.bits - (config.qjl ? 1 : 0);
  OSCAR_CHECK(codebook_bits >= 1 && codebook_bits <= 4,
              "turboquant: {} bits{} leaves {} codebook bits (1..4 supported)", config.bits,
              config.qjl ? " with the QJL bit" : "", codebook_bits);
  codebook_ = lloyd_max_gaussian(codebook_bits, 1.0);
  if (config.qjl) {
    // Sketch rows from a stream independent of the signs' stream.
    DeterministicRandom random(config.seed ^ 0x9e3779b97f4a7c15ull);
    sketch_.resize(static_cast<size_t>(dim) * dim);
    for (double& s : sketch_) s = random.normal();
  }
}

TurboQuantizer::Encoded TurboQuantizer::encode(const float* x) const {
  const int d = dim_;
  Encoded e;
  e.codes.resize(d);
  double norm2 = 0;
  for (int i = 0; i < d; ++i) norm2 += static_cast<double>(x[i]) * x[i];
  e.norm = round_to_metadata(static_cast<float>(std::sqrt(norm2)), config_.norm_type);
  std::vector<double> u(d), y(d);
  const double inv = e.norm > 0 ? 1.0 / e.norm : 0.0;
  for (int i = 0; i < d; ++i) u[i] = x[i] * inv;
  rotation_.forward(u.data(), y.data());
  // Coordinates of a rotated unit vector are ~N(0, 1/d): compare y*sqrt(d) with the N(0, 1) codebook.
  const double root_d = std::sqrt(static_cast<double>(d));
  std::vector<double> residual(d);
  for (int i = 0; i < d; ++i) {
    const int c = codebook_.index_of(y[i] * root_d);
    e.codes[i] = static_cast<uint8_t>(c);
    residual[i] = y[i] - codebook_.centroids[c] / root_d;
  }
  if (config_.qjl) {
    double r2 = 0;
    for (double r : residual) r2 += r * r;
    e.residual_norm = round_to_metadata(static_cast<float>(std::sqrt(r2)), config_.norm_type);
    e.signs.resize(d);
    for (int m = 0; m < d; ++m) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += sketch_[static_cast<size_t>(m) * d + i] * residual[i];
      e.signs[m] = s >= 0 ? 1 : -1;
    }
  }
  return e;
}

void TurboQuantizer::decode(const Encoded& e, float* x_hat) const {
  const int d = dim_;
  const double root_d = std::sqrt(static_cast<double>(d));
  std::vector<double> y(d), x(d);
  for (int i = 0; i < d; ++i) y[i] = codebook_.centroids[e.codes[i]] / root_d;
  if (config_.qjl) {
    const double factor = std::sqrt(M_PI / 2.0) / d * e.residual_norm;
    for (int m = 0; m < d; ++m)
      for (int i = 0; i < d; ++i) y[i] += factor * sketch_[static_cast<size_t>(m) * d + i] * e.signs[m];
  }
  rotation_.inverse(y.data(), x.data());
  for (int i = 0; i < d; ++i) x_hat[i] = static_cast<float>(e.norm * x[i]);
}

double TurboQuantizer::qjl_inner_product(const double* rotated_query, const Encoded& e) const {
  OSCAR_CHECK(config_.qjl, "turboquant: no QJL sketch in this configuration");
  const int d = dim_;
  double acc = 0;
  for (int m = 0; m < d; ++m) {
    double sq = 0;
    for (int i = 0; i < d; ++i) sq += sketch_[static_cast<size_t>(m) * d + i] * rotated_query[i];
    acc += sq * e.signs[m];
  }
  return std::sqrt(M_PI / 2.0) / d * e.residual_norm * acc;
}

void TurboQuantizer::quantize_dequantize(const float* x, int64_t rows, float* x_hat) const {
  for (int64_t r = 0; r < rows; ++r)
    decode(encode(x + static_cast<size_t>(r) * dim_), x_hat + static_cast<size_t>(r) * dim_);
}

double TurboQuantizer::bits_per_vector() const {
  const int norm_bits = metadata_type_bits(config_.norm_type);
  return static_cast<double>(dim_) * config_.bits + norm_bits * (config_.qjl ? 2 : 1);
}

}  // namespace oscar::baselines
