// From statistics to a rotation pack: eigenbasis of the attention-aware targets (float64), the
// chosen composition of U, H and P, and clipping ratios (fixed, or fitted per layer on activations).
#pragma once
#include <string>
#include <vector>

#include "covariance/statistics.h"
#include "io/dump.h"
#include "io/pack.h"
#include "quant/quantizer.h"

namespace oscar {

struct CalibrateOptions {
  std::string composition = "u_h_p";
  std::string scope = "layer";         // "layer": one rotation per layer (targets averaged over KV heads)
  std::string key_target = "query";    // "query" (C_Q) | "gram" (K^T K)
  std::string value_target = "proxy";  // "proxy" | "scores" | "gram" (V^T V)
  std::string clip = "fixed";          // "fixed" | "fit"
  float key_clip = 0.96f, value_clip = 0.92f;
  std::vector<float> clip_grid = {0.80f, 0.84f, 0.88f, 0.90f, 0.92f, 0.94f, 0.96f, 0.98f, 1.0f};
  int group_size = 0;  // 0: head_dim
  MetadataType metadata = MetadataType::fp16;
  int sink_tokens = 64, recent_tokens = 256;
  const DumpReader* fit_dump = nullptr;  // activations for --clip fit
  int64_t fit_tokens = 4096;             // tokens per layer used by the fit
  int64_t fit_queries = 32;              // queries sampled per sequence for the value fit
  int threads = 0;
  bool quiet = false;
};

// What calibration found for the key or value side of one layer (printed by oscar-calibrate).
struct SideCalibrationSummary {
  double orthogonality = 0;      // max |R^T R - I| of the stored float32 rotations
  double top_share = 0;          // largest eigenvalue / trace (anisotropy)
  double condition = 0;          // largest / smallest positive eigenvalue
  float clip = 0;                // chosen clip ratio
  std::vector<double> fit_error;  // per fit_grid entry (fit only)
};

struct LayerCalibrationReport {
  int layer = 0;
  SideCalibrationSummary key, value;
  std::vector<float> fit_grid;  // candidate ratios (fit only)
};

Pack calibrate_pack(const Statistics& stats, const CalibrateOptions& options,
                    std::vector<LayerCalibrationReport>* report = nullptr);

// Attention-aware quantisation errors used by the clip fit, exposed for tests.
// Keys: sum_t dk_t C dk_t^T in the original basis (logit error), dk = (k R)^ R^T - k.
double key_quantization_error(const std::vector<float>& keys /*[T, d]*/, int d, const float* rotation /*[d, d]*/,
                              const MatrixD& query_covariance, const QuantizerConfig& config);
// Values: sum over sampled queries of ||P dV||^2 with P their causal attention probabilities [Q, T].
double value_quantization_error(const std::vector<float>& values /*[T, d]*/, int d, const float* rotation,
                                const MatrixD& probabilities, const QuantizerConfig& config);

}  // namespace oscar
