// Synthetic activation generator (see synthetic.h). Pre-RoPE vectors are built in a random
// orthonormal basis per (layer, KV head) with planted spectra, then rotated by position.
#include "capture/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include <Eigen/Dense>

#include "common/error.h"
#include "common/parallel.h"

namespace oscar {
namespace {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Portable standard normal (Box-Muller over mt19937_64), identical on every platform.
class Normal {
 public:
  explicit Normal(uint64_t seed) : engine_(seed) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53;
    double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0;
  bool has_spare_ = false;
};

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

MatrixF random_orthonormal(int d, Normal& normal) {
  Eigen::MatrixXd g(d, d);
  for (int i = 0; i < d * d; ++i) g.data()[i] = normal();
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  Eigen::MatrixXd q = qr.householderQ();
  return q.cast<float>();
}

}  // namespace

void apply_rope(float* row, int d, int64_t position, double base) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * std::pow(base, -2.0 * i / d);
    const double c = std::cos(angle), s = std::sin(angle);
    const double x = row[i], y = row[i + half];
    row[i] = static_cast<float>(x * c - y * s);
    row[i + half] = static_cast<float>(x * s + y * c);
  }
}

LayerActivations synthesize_layer(const SyntheticSpec& spec, int layer) {
  const ModelGeometry& g = spec.geometry;
  const int d = g.head_dim, hq = g.num_q_heads, hkv = g.num_kv_heads, group = g.group_size();
  OSCAR_CHECK(d >= 4 && d % 2 == 0, "synthetic head_dim must be even and >= 4, got {}", d);
  OSCAR_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "--q-heads {} must be a positive multiple of --kv-heads {}", hq, hkv);
  const int64_t per_seq = spec.tokens_per_sequence, total = per_seq * spec.sequences;
  LayerActivations a;
  a.layer = layer;
  a.tokens = total;
  a.q.assign(static_cast<size_t>(total) * hq * d, 0.0f);
  a.k.assign(static_cast<size_t>(total) * hkv * d, 0.0f);
  a.v.assign(static_cast<size_t>(total) * hkv * d, 0.0f);
  // Deeper layers: sharper query spectra (a real-model trend; gives per-layer variety).
  const double decay = 3.0 + 3.0 * std::exp(-0.1 * layer);
  const int half = d / 2;
  // KV heads are independent (own seeds, disjoint outputs): one per thread.
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  parallel_for(hkv, threads, [&](int h) {
    Normal normal(mix(mix(spec.seed, static_cast<uint64_t>(layer)), static_cast<uint64_t>(h)));
    const MatrixF basis = random_orthonormal(d, normal);  // rows: directions
    // Low-frequency channels (largest i < d/2 and their partners) hold the massive key channels,
    // the query mean and the sink direction: they barely rotate with position.
    Eigen::VectorXf query_mean = Eigen::VectorXf::Zero(d);
    query_mean[half - 1] = 2.0f;
    query_mean[d - 1] = 1.0f;
    Eigen::VectorXf key_mean = Eigen::VectorXf::Zero(d);
    for (int m = 0; m < spec.massive_key_channels && m < half; ++m) {
      const int channel = (m % 2 == 0) ? half - 2 - m / 2 : d - 2 - m / 2;
      key_mean[channel] = static_cast<float>((m % 2 ? -1.0 : 1.0) * (6.0 + 2.0 * normal.uniform()));
    }
    Eigen::VectorXf key_spectrum(d), value_scale(d);
    for (int i = 0; i < d; ++i) {
      key_spectrum[i] = static_cast<float>(1.5 * std::exp(-i / 16.0) + 0.3);
      value_scale[i] = static_cast<float>(1.0 + 0.2 * normal.uniform());
    }
    std::vector<Eigen::VectorXf> query_spectra(group, Eigen::VectorXf(d));
    for (int j = 0; j < group; ++j)
      for (int i = 0; i < d; ++i)
        query_spectra[j][i] = static_cast<float>((4.0 * std::exp(-i / decay) + 0.15) * (1.0 + 0.3 * normal.uniform()));

    for (int s = 0; s < spec.sequences; ++s) {
      Normal tokens_normal(mix(mix(mix(spec.seed, static_cast<uint64_t>(layer)), static_cast<uint64_t>(h)),
                               1000003ull + static_cast<uint64_t>(s)));
      MatrixF z(per_seq, d);
      // Keys: planted spectrum in the basis + massive channels.
      for (int64_t i = 0; i < per_seq * d; ++i) z.data()[i] = static_cast<float>(tokens_normal());
      MatrixF keys = (z * key_spectrum.asDiagonal()) * basis;
      keys.rowwise() += key_mean.transpose();
      // Sink: the first token's key points along the query mean, so every query attends to it.
      // Its logit against the mean query is about 8 (q . k / sqrt(d)).
      keys.row(0) = query_mean.normalized().transpose() * (8.0f * std::sqrt(static_cast<float>(d)) / query_mean.norm());
      for (int64_t i = 0; i < per_seq * d; ++i) z.data()[i] = static_cast<float>(tokens_normal());
      MatrixF values = z * value_scale.asDiagonal();
      values.row(0) *= 0.1f;  // sink values are small in real models
      for (int64_t t = 0; t < per_seq; ++t) {
        const int64_t row = s * per_seq + t;
        float* k = a.k.data() + (static_cast<size_t>(row) * hkv + h) * d;
        float* v = a.v.data() + (static_cast<size_t>(row) * hkv + h) * d;
        for (int c = 0; c < d; ++c) {
          k[c] = keys(t, c);
          v[c] = values(t, c);
        }
        apply_rope(k, d, t, spec.rope_base);
      }
      for (int j = 0; j < group; ++j) {
        for (int64_t i = 0; i < per_seq * d; ++i) z.data()[i] = static_cast<float>(tokens_normal());
        MatrixF queries = (z * query_spectra[j].asDiagonal()) * basis;
        queries.rowwise() += query_mean.transpose();
        for (int64_t t = 0; t < per_seq; ++t) {
          float* q = a.q.data() + ((static_cast<size_t>(s * per_seq + t)) * hq + h * group + j) * d;
          for (int c = 0; c < d; ++c) q[c] = queries(t, c);
          apply_rope(q, d, t, spec.rope_base);
        }
      }
    }
  });
  return a;
}

}  // namespace oscar
