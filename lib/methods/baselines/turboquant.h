// TurboQuant (ICLR 2026; shared/spec/baselines.md) for one head's rows: per vector x store gamma = ||x||
// (fp16), rotate y = Pi x / gamma with a seeded randomized Hadamard Pi (random signs, H, random signs),
// and quantise each coordinate with the Lloyd-Max codebook of N(0, 1/d); x_hat = gamma Pi^T c. The "prod"
// variant spends one of the b bits on a QJL sign sketch of the residual (unbiased inner products).
// The Lloyd-Max codebooks are derived here (centroid / boundary conditions iterated to convergence).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "quant/quantizer.h"

namespace oscar::baselines {

// Normalised Walsh-Hadamard transform in place, x <- x · H_d (H_d symmetric, orthogonal), d a power of 2.
// Same matrix as rotation/rotation.h hadamard_matrix (Sylvester order).
void fast_hadamard_transform(double* x, int dim);

// Deterministic random stream for signs and Gaussian sketches: std::mt19937_64 bits only (the standard
// fixes its output sequence; library distributions are implementation-defined and not used).
class DeterministicRandom {
 public:
  explicit DeterministicRandom(uint64_t seed) : engine_(seed) {}
  double uniform();  // in [0, 1), 53 random bits
  double normal();   // Box-Muller (one of the pair; the other is dropped so the stream stays simple)
  int sign();        // +1 / -1, one random bit

 private:
  std::mt19937_64 engine_;
};

// Pi x = ((x ⊙ s1) · H) ⊙ s2 with seeded signs s1, s2 in {-1, +1}^d; orthogonal.
class RandomizedHadamard {
 public:
  RandomizedHadamard(int dim, uint64_t seed);
  int dim() const { return dim_; }
  void forward(const double* x, double* y) const;  // y = Pi x, [d]
  void inverse(const double* y, double* x) const;  // x = Pi^T y, [d]
  const std::vector<int>& first_signs() const { return s1_; }
  const std::vector<int>& second_signs() const { return s2_; }

 private:
  int dim_;
  std::vector<int> s1_, s2_;  // [d]
};

// Lloyd-Max (MSE-optimal scalar) quantiser of N(0, sigma^2) with 2^bits levels.
struct LloydMaxCodebook {
  std::vector<double> centroids;   // [2^bits], ascending
  std::vector<double> boundaries;  // [2^bits - 1], midpoints of neighbouring centroids
  int iterations = 0;
  int index_of(double y) const;  // the level whose cell holds y
};
// Iterates centroid = E[X | cell] (closed form for the Gaussian) and boundary = midpoint until no centroid
// moves by more than tolerance * sigma. bits in 1..4.
LloydMaxCodebook lloyd_max_gaussian(int bits, double sigma = 1.0, double tolerance = 1e-13,
                                    int max_iterations = 100000);

struct TurboQuantConfig {
  int bits = 2;        // total bits per coordinate (codebook bits, or codebook + 1 QJL bit)
  bool qjl = false;    // prod variant: (bits-1)-bit codebook + 1-bit QJL sketch of the residual
  MetadataType norm_type = MetadataType::fp16;  // storage of gamma (and the residual norm)
  uint64_t seed = 0;   // signs of Pi and the QJL sketch
};

// One head's TurboQuant encoder/decoder (one Pi and, for qjl, one sketch S [d, d]).
class TurboQuantizer {
 public:
  TurboQuantizer(int dim, const TurboQuantConfig& config);
  struct Encoded {
    std::vector<uint8_t> codes;  // [d] codebook indices
    float norm = 0;              // gamma as stored
    std::vector<int8_t> signs;   // [d] QJL signs sign(S r) (qjl only)
    float residual_norm = 0;     // ||r|| as stored (qjl only)
  };
  Encoded encode(const float* x) const;  // x [d]
  // x_hat [d] = gamma Pi^T (c + r_hat), r_hat = sqrt(pi/2)/m ||r|| S^T signs (0 without qjl): the vector whose
  // inner product with a query is the method's (unbiased, for qjl) inner-product estimate.
  void decode(const Encoded& encoded, float* x_hat) const;
  // rows [n, d] -> x_hat [n, d]
  void quantize_dequantize(const float* x, int64_t rows, float* x_hat) const;
  double bits_per_vector() const;  // d*bits + norm (+ residual norm for qjl)
  const LloydMaxCodebook& codebook() const { return codebook_; }  // for N(0, 1) (scaled by 1/sqrt(d) at use)
  const RandomizedHadamard& rotation() const { return rotation_; }
  // The QJL estimate of <q, r> from the stored signs: sqrt(pi/2)/m ||r|| <S q, signs> (q in rotated space).
  double qjl_inner_product(const double* rotated_query, const Encoded& encoded) const;

 private:
  int dim_;
  TurboQuantConfig config_;
  RandomizedHadamard rotation_;
  LloydMaxCodebook codebook_;
  std::vector<double> sketch_;  // [m = d, d] Gaussian (qjl only)
};

}  // namespace oscar::baselines
