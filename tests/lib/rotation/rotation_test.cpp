// Rotation tests: Hadamard orthogonality and the equal-importance lemma, bit reversal, compositions.
#include "rotation/rotation.h"

#include <gtest/gtest.h>

#include <random>

#include "common/error.h"

namespace oscar {
namespace {

TEST(Hadamard, OrthogonalForAllPowersOfTwo) {
  for (int dim : {1, 2, 4, 64, 128, 256}) EXPECT_LT(orthogonality_error(hadamard_matrix(dim)), 1e-12) << dim;
}

TEST(Hadamard, EqualisesDiagonalOfAnyDiagonalMatrix) {
  const int dim = 128;
  std::mt19937 rng(11);
  std::exponential_distribution<double> spread(0.1);
  VectorD lambda(dim);
  for (int i = 0; i < dim; ++i) lambda[i] = spread(rng);
  lambda[5] = 1e4;  // a spike in one direction is spread over all channels
  MatrixD h = hadamard_matrix(dim);
  MatrixD rotated = h.transpose() * lambda.asDiagonal() * h;
  for (int i = 0; i < dim; ++i) EXPECT_NEAR(rotated(i, i), lambda.sum() / dim, 1e-9 * lambda.sum());
}

TEST(Hadamard, RejectsNonPowerOfTwo) { EXPECT_THROW(hadamard_matrix(96), Error); }

TEST(BitReversal, KnownValues) {
  EXPECT_EQ(bit_reverse(1, 8), 4);
  EXPECT_EQ(bit_reverse(3, 8), 6);
  EXPECT_EQ(bit_reverse(1, 128), 64);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(bit_reverse(bit_reverse(i, 128), 128), i);
}

TEST(BitReversal, PlacesSortedDirectionsAtBitReversedSlots) {
  VectorD eig(8);
  eig << 0.1, 5.0, 0.3, 7.0, 0.2, 1.0, 0.0, 2.0;  // descending order: 3,1,7,5,2,4,0,6
  auto perm = bit_reversal_permutation(eig);
  std::vector<int> order = {3, 1, 7, 5, 2, 4, 0, 6};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(perm[bit_reverse(i, 8)], order[i]);
  // (y P)[j] = y[perm[j]]
  MatrixD p = permutation_matrix(perm);
  Eigen::RowVectorXd y(8);
  y << 0, 1, 2, 3, 4, 5, 6, 7;
  Eigen::RowVectorXd yp = y * p;
  for (int j = 0; j < 8; ++j) EXPECT_EQ(yp[j], perm[j]);
  // The two largest directions land in different halves (groups of d/2).
  EXPECT_EQ(perm[0], 3);
  EXPECT_EQ(perm[4], 1);
}

TEST(Compositions, AllOrthogonalAndOrdered) {
  const int dim = 64;
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  MatrixD a(dim, dim);
  for (int i = 0; i < dim * dim; ++i) a.data()[i] = normal(rng);
  Eigenbasis basis = symmetric_eigenbasis(a.transpose() * a);
  for (int i = 1; i < dim; ++i) EXPECT_LE(basis.eigenvalues[i - 1], basis.eigenvalues[i]);
  for (const auto& name : composition_names())
    EXPECT_LT(orthogonality_error(compose_rotation(name, basis)), 1e-10) << name;
  MatrixD full = compose_rotation("u_h_p", basis);
  MatrixD expected = basis.vectors * hadamard_matrix(dim) * permutation_matrix(bit_reversal_permutation(basis.eigenvalues));
  EXPECT_LT((full - expected).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_THROW(compose_rotation("x_y", basis), Error);
}

}  // namespace
}  // namespace oscar
