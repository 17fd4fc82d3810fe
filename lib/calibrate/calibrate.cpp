// Calibration (see calibrate.h).
#include "calibrate/calibrate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "cli/progress.h"
#include "common/error.h"
#include "common/parallel.h"
#include "covariance/accumulate.h"

namespace oscar {
namespace {

Target key_target_of(const std::string& name) {
  if (name == "query") return Target::key_query;
  if (name == "gram") return Target::key_gram;
  fail("unknown key target '{}' (query or gram)", name);
}

Target value_target_of(const std::string& name) {
  if (name == "proxy") return Target::value_proxy;
  if (name == "scores") return Target::value_scores;
  if (name == "gram") return Target::value_gram;
  fail("unknown value target '{}' (proxy, scores or gram)", name);
}

// Rotates rows [T, d] by R [d, d] (float64 accumulation), quantises, dequantises and rotates back:
// returns the reconstruction error in the original basis, [T, d].
MatrixD reconstruction_error(const std::vector<float>& rows, int d, const float* rotation, const QuantizerConfig& config) {
  const int64_t n = static_cast<int64_t>(rows.size()) / d;
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> x(rows.data(), n, d);
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> r(rotation, d, d);
  MatrixD r64 = r.cast<double>();
  MatrixD rotated64 = x.cast<double>() * r64;
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rotated = rotated64.cast<float>();
  QuantizedRows q = quantize_rows(rotated.data(), static_cast<int>(n), d, config);
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> back(n, d);
  dequantize_rows(q, back.data());
  return (back.cast<double>() - rotated64) * r64.transpose();
}

struct SideResult {
  std::vector<float> rotation;
  std::vector<double> eigenvalues, eigenvectors;
  SideCalibrationSummary summary;
};

SideResult build_side(const Statistics& stats, int layer, Target target, const std::string& composition,
                      const std::string& scope) {
  const int d = stats.geometry.head_dim;
  const int heads = scope == "head" ? stats.geometry.num_kv_heads : 1;
  SideResult side;
  for (int h = 0; h < heads; ++h) {
    MatrixD c = stats.target_matrix(layer, target, scope == "head" ? h : -1);
    Eigenbasis basis = symmetric_eigenbasis(c);
    MatrixD rotation = compose_rotation(composition, basis);
    for (int i = 0; i < d * d; ++i) side.rotation.push_back(static_cast<float>(rotation.data()[i]));
    for (int i = 0; i < d; ++i) side.eigenvalues.push_back(basis.eigenvalues[i]);
    for (int i = 0; i < d * d; ++i) side.eigenvectors.push_back(basis.vectors.data()[i]);
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> stored(
        side.rotation.data() + static_cast<size_t>(h) * d * d, d, d);
    side.summary.orthogonality = std::max(side.summary.orthogonality, orthogonality_error(stored.cast<double>()));
    const double trace = basis.eigenvalues.sum(), top = basis.eigenvalues[d - 1];
    double smallest = std::numeric_limits<double>::infinity();
    for (int i = 0; i < d; ++i)
      if (basis.eigenvalues[i] > 1e-12 * top) smallest = std::min(smallest, basis.eigenvalues[i]);
    side.summary.top_share = std::max(side.summary.top_share, trace > 0 ? top / trace : 0.0);
    side.summary.condition = std::max(side.summary.condition, top / smallest);
  }
  return side;
}

}  // namespace

double key_quantization_error(const std::vector<float>& keys, int d, const float* rotation,
                              const MatrixD& query_covariance, const QuantizerConfig& config) {
  MatrixD delta = reconstruction_error(keys, d, rotation, config);
  return ((delta * query_covariance).array() * delta.array()).sum();
}

double value_quantization_error(const std::vector<float>& values, int d, const float* rotation,
                                const MatrixD& probabilities, const QuantizerConfig& config) {
  MatrixD delta = reconstruction_error(values, d, rotation, config);
  return (probabilities * delta).squaredNorm();
}

Pack calibrate_pack(const Statistics& stats, const CalibrateOptions& options,
                    std::vector<LayerCalibrationReport>* report) {
  const ModelGeometry& g = stats.geometry;
  const int d = g.head_dim;
  OSCAR_CHECK(options.scope == "layer" || options.scope == "head", "unknown scope '{}' (layer or head)", options.scope);
  OSCAR_CHECK(!(composition_needs_hadamard(options.composition) || options.composition.find('p') != std::string::npos) ||
                  is_power_of_two(d),
              "head_dim {} is not a power of two: composition '{}' needs a Hadamard or bit-reversal permutation "
              "(use --composition u or none)", d, options.composition);
  OSCAR_CHECK(options.clip == "fixed" || options.clip == "fit", "unknown clip rule '{}' (fixed or fit)", options.clip);
  const Target key_target = key_target_of(options.key_target), value_target = value_target_of(options.value_target);
  QuantizerConfig quant;
  quant.group_size = options.group_size;
  quant.metadata = options.metadata;
  validate_quantizer(quant, d);
  if (options.clip == "fit") {
    OSCAR_CHECK(options.fit_dump, "--clip fit needs activations: --dump DUMP.h5");
    const ModelGeometry& dg = options.fit_dump->info().geometry;
    OSCAR_CHECK(dg.head_dim == d && dg.num_kv_heads == g.num_kv_heads && dg.num_q_heads == g.num_q_heads,
                "{}: dump geometry ({}q/{}kv heads, d {}) differs from the statistics' ({}q/{}kv heads, d {})",
                options.fit_dump->path(), dg.num_q_heads, dg.num_kv_heads, dg.head_dim, g.num_q_heads, g.num_kv_heads, d);
    OSCAR_CHECK(options.fit_dump->info().queries_kept_last == 0,
                "{}: an evaluation dump (queries only at the last tokens) cannot be used to fit clipping",
                options.fit_dump->path());
  }

  Pack pack;
  pack.num_layers = g.num_layers;
  pack.num_kv_heads = g.num_kv_heads;
  pack.head_dim = d;
  pack.composition = options.composition;
  pack.scope = options.scope;
  pack.clip_rule = options.clip;
  pack.key_target = options.key_target;
  pack.value_target = options.value_target;
  pack.group_size = options.group_size;
  pack.sink_tokens = options.sink_tokens;
  pack.recent_tokens = options.recent_tokens;
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  Progress progress("calibrate", static_cast<double>(stats.layers.size()), "layers", options.quiet);
  for (const auto& ls : stats.layers) {
    LayerPack lp;
    lp.layer = ls.layer;
    SideResult key = build_side(stats, ls.layer, key_target, options.composition, options.scope);
    SideResult value = build_side(stats, ls.layer, value_target, options.composition, options.scope);
    LayerCalibrationReport r;
    r.layer = ls.layer;
    r.key = key.summary;
    r.value = value.summary;
    lp.key.clip_ratio = options.key_clip;
    lp.value.clip_ratio = options.value_clip;
    lp.key.rotation = std::move(key.rotation);
    lp.key.eigenvalues = std::move(key.eigenvalues);
    lp.key.eigenvectors = std::move(key.eigenvectors);
    lp.value.rotation = std::move(value.rotation);
    lp.value.eigenvalues = std::move(value.eigenvalues);
    lp.value.eigenvectors = std::move(value.eigenvectors);

    if (options.clip == "fit") {
      // Fit data: whole sequences from the start of the dump, the last one cut at fit_tokens.
      const DumpReader& dump = *options.fit_dump;
      const int64_t tokens = std::min(options.fit_tokens, dump.info().tokens);
      LayerActivations a = dump.read_layer(ls.layer, 0, tokens);
      const int hq = g.num_q_heads, hkv = g.num_kv_heads, group = g.group_size();
      // The fixed ratios are always candidates, so the fit is never worse than fixed on its own data.
      std::vector<float> grid = options.clip_grid;
      for (float fixed : {options.key_clip, options.value_clip})
        if (std::find(grid.begin(), grid.end(), fixed) == grid.end()) grid.push_back(fixed);
      std::sort(grid.begin(), grid.end());
      std::vector<double> grid_key(grid.size(), 0.0), grid_value(grid.size(), 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      std::vector<std::vector<double>> key_err(hkv), value_err(hkv);
      parallel_for(hkv, threads, [&](int h) {
        std::vector<float> keys(static_cast<size_t>(tokens) * d), values(keys.size());
        for (int64_t t = 0; t < tokens; ++t)
          for (int c = 0; c < d; ++c) {
            keys[t * d + c] = a.k[(static_cast<size_t>(t) * hkv + h) * d + c];
            values[t * d + c] = a.v[(static_cast<size_t>(t) * hkv + h) * d + c];
          }
        // Causal attention probabilities of sampled queries of this head's group, per sequence.
        std::vector<Eigen::RowVectorXd> rows;
        const auto& offsets = dump.info().sequence_offsets;
        for (size_t s = 0; s + 1 < offsets.size() && offsets[s] < tokens; ++s) {
          const int64_t begin = offsets[s], end = std::min(offsets[s + 1], tokens), length = end - begin;
          const int64_t samples = std::min(options.fit_queries, length);
          for (int64_t i = 0; i < samples; ++i) {
            const int64_t t = begin + length - 1 - (i * length) / samples;
            for (int j = 0; j < group; ++j) {
              const float* q = a.q.data() + (static_cast<size_t>(t) * hq + h * group + j) * d;
              Eigen::RowVectorXd p = Eigen::RowVectorXd::Zero(tokens);
              double max_logit = -1e300;
              for (int64_t u = begin; u <= t; ++u) {
                double dot = 0;
                for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * keys[u * d + c];
                p[u] = dot * scale;
                max_logit = std::max(max_logit, p[u]);
              }
              double total = 0;
              for (int64_t u = begin; u <= t; ++u) total += (p[u] = std::exp(p[u] - max_logit));
              p /= total;
              rows.push_back(std::move(p));
            }
          }
        }
        MatrixD probabilities(static_cast<Eigen::Index>(rows.size()), tokens);
        for (size_t i = 0; i < rows.size(); ++i) probabilities.row(static_cast<Eigen::Index>(i)) = rows[i];
        const MatrixD query_cov = stats.target_matrix(ls.layer, Target::key_query, h);
        for (size_t c = 0; c < grid.size(); ++c) {
          QuantizerConfig config = quant;
          config.clip_ratio = grid[c];
          key_err[h].push_back(key_quantization_error(keys, d, lp.key.head_rotation(h, d), query_cov, config));
          value_err[h].push_back(value_quantization_error(values, d, lp.value.head_rotation(h, d), probabilities, config));
        }
      });
      for (int h = 0; h < hkv; ++h)
        for (size_t c = 0; c < grid.size(); ++c) {
          grid_key[c] += key_err[h][c];
          grid_value[c] += value_err[h][c];
        }
      const size_t best_key = std::min_element(grid_key.begin(), grid_key.end()) - grid_key.begin();
      const size_t best_value = std::min_element(grid_value.begin(), grid_value.end()) - grid_value.begin();
      lp.key.clip_ratio = grid[best_key];
      lp.value.clip_ratio = grid[best_value];
      r.fit_grid = grid;
      r.key.fit_error = grid_key;
      r.value.fit_error = grid_value;
    }
    r.key.clip = lp.key.clip_ratio;
    r.value.clip = lp.value.clip_ratio;
    if (report) report->push_back(r);
    pack.layers.push_back(std::move(lp));
    progress.advance(1);
  }
  progress.finish();
  return pack;
}

}  // namespace oscar
