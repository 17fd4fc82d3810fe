// The method registry and the default KvMethod::encode (see kv_method.h). To add a method: write a
// register_<family>_methods() that calls register_method(), and call it in register_builtin_methods().
#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "methods/baselines/baseline_methods.h"
#include "methods/kv_method.h"
#include "methods/rotated_quantizer_method.h"

namespace oscar {
namespace {

std::vector<MethodInfo>& registry_storage() {
  static std::vector<MethodInfo> methods;
  return methods;
}

void register_builtin_methods() {
  register_rotated_quantizer_methods();
  baselines::register_baseline_methods();  // kivi, hadamard:kivi, oscars, turboquant, int4-hadamard
  // New families (kivi, oscars, turboquant, int4-hadamard, ...) add their register call here.
}

bool matches(const MethodInfo& info, const std::string& name) {
  if (!info.name.empty() && info.name.back() == ':')
    return name.size() > info.name.size() && name.compare(0, info.name.size(), info.name) == 0;
  return name == info.name;
}

}  // namespace

const std::vector<MethodInfo>& method_registry() {
  static std::once_flag once;
  std::call_once(once, register_builtin_methods);
  return registry_storage();
}

void register_method(MethodInfo info) {
  auto& methods = registry_storage();
  OSCAR_CHECK(std::none_of(methods.begin(), methods.end(), [&](const MethodInfo& m) { return m.name == info.name; }),
              "method '{}' registered twice", info.name);
  methods.push_back(std::move(info));
}

std::string method_names_help() {
  std::string names;
  for (const auto& m : method_registry()) {
    if (!names.empty()) names += ", ";
    names += m.name.back() == ':' ? m.name + "<variant>" : m.name;
  }
  return names;
}

std::unique_ptr<KvMethod> make_method(const std::string& name, const MethodContext& context) {
  for (const auto& info : method_registry()) {
    if (!matches(info, name)) continue;
    OSCAR_CHECK(!info.needs_pack || context.pack, "method '{}' needs a rotation pack: pass --pack PACK.h5", name);
    return info.factory(name, context);
  }
  fail("unknown method '{}' (known: {})", name, method_names_help());
}

bool is_identity(const MatrixD& rotation) {
  return rotation.rows() == rotation.cols() && rotation == MatrixD::Identity(rotation.rows(), rotation.cols());
}

void rotate_rows(const float* x, int64_t n, int dim, const MatrixD& rotation, float* out) {
  OSCAR_CHECK(rotation.rows() == dim && rotation.cols() == dim, "rotation is {}x{}, head_dim {}", rotation.rows(),
              rotation.cols(), dim);
  const size_t count = static_cast<size_t>(n) * dim;
  if (is_identity(rotation)) {
    std::copy(x, x + count, out);
    return;
  }
  using RowsF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  // Blocks of rows keep the float64 temporaries small.
  const int64_t block = 1024;
  for (int64_t first = 0; first < n; first += block) {
    const int64_t rows = std::min(block, n - first);
    Eigen::Map<const RowsF> in(x + first * dim, rows, dim);
    MatrixD product = in.cast<double>() * rotation;
    Eigen::Map<RowsF>(out + first * dim, rows, dim) = product.cast<float>();
  }
}

EncodedSequence KvMethod::encode(const HeadRows& rows) const {
  const size_t count = static_cast<size_t>(rows.tokens) * rows.dim;
  std::vector<float> keys(count), values(count);
  rotate_rows(rows.keys, rows.tokens, rows.dim, key_rotation(rows.layer, rows.kv_head), keys.data());
  rotate_rows(rows.values, rows.tokens, rows.dim, value_rotation(rows.layer, rows.kv_head), values.data());
  return EncodedSequence::encode(keys.data(), values.data(), rows.tokens, rows.dim, key_quantizer(rows.layer),
                                 value_quantizer(rows.layer),
                                 quantizes());
}

}  // namespace oscar
