// Rotations R = U · H · P and their parts (spec: oscar-method.md section 3). Matrices are
// row-major [d, d] float64 and act on row vectors from the right: y = x · R.
#pragma once
#include <string>
#include <vector>

#include <Eigen/Dense>

namespace oscar {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorD = Eigen::VectorXd;

bool is_power_of_two(int n);

// Normalised Sylvester Hadamard: H_1 = [1], H_2n = [[H, H], [H, -H]] / sqrt(2). d a power of two.
MatrixD hadamard_matrix(int dim);

// Reverses the log2(dim) low bits of i. dim a power of two.
int bit_reverse(int i, int dim);

// perm[bitrev(i)] = order[i] where order = argsort(eigenvalues, descending); P = I[:, perm],
// so (y · P)[j] = y[perm[j]].
std::vector<int> bit_reversal_permutation(const VectorD& eigenvalues);
MatrixD permutation_matrix(const std::vector<int>& perm);

// Symmetric eigendecomposition of a (symmetrised) target, eigenvalues ascending (the reference
// code's order) with eigenvectors as the columns of U.
struct Eigenbasis {
  VectorD eigenvalues;  // [d], ascending
  MatrixD vectors;      // [d, d], column i belongs to eigenvalues[i]
};
Eigenbasis symmetric_eigenbasis(const MatrixD& target);

// The compositions of the reference implementation, as products applied left to right.
// Names: none, h, u, u_h, u_h_p, h_p, u_p, u_p_h.
const std::vector<std::string>& composition_names();
bool composition_needs_hadamard(const std::string& name);
MatrixD compose_rotation(const std::string& name, const Eigenbasis& basis);

// max |R^T R - I|
double orthogonality_error(const MatrixD& rotation);

}  // namespace oscar
