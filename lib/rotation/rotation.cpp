// Rotation building blocks (see rotation.h).
#include "rotation/rotation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace oscar {

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

MatrixD hadamard_matrix(int dim) {
  OSCAR_CHECK(is_power_of_two(dim), "Hadamard rotation needs head_dim a power of two, got {}", dim);
  MatrixD h = MatrixD::Ones(1, 1);
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0);
  while (h.rows() < dim) {
    const Eigen::Index n = h.rows();
    MatrixD next(2 * n, 2 * n);
    next.topLeftCorner(n, n) = h;
    next.topRightCorner(n, n) = h;
    next.bottomLeftCorner(n, n) = h;
    next.bottomRightCorner(n, n) = -h;
    h = next * inv_sqrt2;
  }
  return h;
}

int bit_reverse(int i, int dim) {
  int bits = 0;
  while ((1 << bits) < dim) ++bits;
  int r = 0;
  for (int b = 0; b < bits; ++b)
    if (i >> b & 1) r |= 1 << (bits - 1 - b);
  return r;
}

std::vector<int> bit_reversal_permutation(const VectorD& eigenvalues) {
  const int dim = static_cast<int>(eigenvalues.size());
  OSCAR_CHECK(is_power_of_two(dim), "bit-reversal permutation needs head_dim a power of two, got {}", dim);
  std::vector<int> order(dim);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return eigenvalues[a] > eigenvalues[b]; });
  std::vector<int> perm(dim);
  for (int i = 0; i < dim; ++i) perm[bit_reverse(i, dim)] = order[i];
  return perm;
}

MatrixD permutation_matrix(const std::vector<int>& perm) {
  const int dim = static_cast<int>(perm.size());
  MatrixD p = MatrixD::Zero(dim, dim);
  for (int j = 0; j < dim; ++j) p(perm[j], j) = 1.0;  // column j of P is e_perm[j]
  return p;
}

Eigenbasis symmetric_eigenbasis(const MatrixD& target) {
  OSCAR_CHECK(target.rows() == target.cols() && target.rows() > 0, "eigenbasis needs a square matrix");
  OSCAR_CHECK(target.allFinite(), "target matrix has NaN or Inf entries");
  MatrixD symmetric = 0.5 * (target + target.transpose());
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(symmetric);
  OSCAR_CHECK(solver.info() == Eigen::Success, "symmetric eigensolver did not converge");
  Eigenbasis basis;
  basis.eigenvalues = solver.eigenvalues();
  basis.vectors = solver.eigenvectors();
  return basis;
}

const std::vector<std::string>& composition_names() {
  static const std::vector<std::string> names = {"none", "h", "u", "u_h", "u_h_p", "h_p", "u_p", "u_p_h"};
  return names;
}

bool composition_needs_hadamard(const std::string& name) { return name.find('h') != std::string::npos; }

MatrixD compose_rotation(const std::string& name, const Eigenbasis& basis) {
  const auto& names = composition_names();
  OSCAR_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
              "unknown composition '{}' (none, h, u, u_h, u_h_p, h_p, u_p, u_p_h)", name);
  const int dim = static_cast<int>(basis.eigenvalues.size());
  MatrixD rotation = MatrixD::Identity(dim, dim);
  if (name == "none") return rotation;
  // Factors in name order, multiplied left to right: "u_h_p" -> U · H · P.
  size_t start = 0;
  while (start < name.size()) {
    size_t end = name.find('_', start);
    if (end == std::string::npos) end = name.size();
    const std::string factor = name.substr(start, end - start);
    if (factor == "u") rotation = rotation * basis.vectors;
    if (factor == "h") rotation = rotation * hadamard_matrix(dim);
    if (factor == "p") rotation = rotation * permutation_matrix(bit_reversal_permutation(basis.eigenvalues));
    start = end + 1;
  }
  return rotation;
}

double orthogonality_error(const MatrixD& rotation) {
  MatrixD gram = rotation.transpose() * rotation;
  gram.diagonal().array() -= 1.0;
  return gram.cwiseAbs().maxCoeff();
}

}  // namespace oscar
