// GPU tests on the real activations shipped in data/ (SmolLM2-135M, 3 layers, d = 64, GQA 3; data/README.md):
// the CUDA decode backend against the CPU backend through the evaluation harness (what oscar-eval --backend
// cuda runs), and the quantise-pack kernel against the CPU quantiser on the dump's K and V rows, without a
// rotation (bit-identical) and with the rotations calibrated on data/'s calibration dump (float tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda_paged.h"
#include "backend/paged_cache.h"
#include "calibrate/calibrate.h"
#include "covariance/accumulate.h"
#include "eval/evaluator.h"
#include "gpu_test_util.h"
#include "io/dump.h"
#include "quantize_pack.h"

namespace oscar {
namespace {

// data/NAME of the source tree this binary was built from, or of the working directory (a binary built on another
// machine and run from the repository root, as tests/gpu_check.sh's PREBUILT runs do).
std::string shipped(const std::string& name) {
  const std::string built = std::string(OSCAR_SOURCE_DIR) + "/data/" + name;
  return std::filesystem::exists(built) ? built : "data/" + name;
}
const std::string kCalibrationDump = shipped("smollm2-calib.h5");
const std::string kEvaluationDump = shipped("smollm2-eval.h5");

// The pack examples/demo.sh calibrates (oscar-covariance and oscar-calibrate with their defaults), once.
const Pack& shipped_pack() {
  static const Pack pack = [] {
    AccumulateOptions accumulate;
    accumulate.quiet = true;
    CalibrateOptions calibrate;
    calibrate.quiet = true;
    return calibrate_pack(accumulate_statistics({kCalibrationDump}, accumulate), calibrate);
  }();
  return pack;
}

// oscar-eval --backend cuda against --backend cpu on the shipped dump, the demo's methods and context: the same
// metrics up to the kernels' rounding (fp32 accumulation in another order, queries as two int8 terms, see
// kernels/paged_decode.cu). The bound: rel_err within 1e-3 relative.
TEST(ShippedData, CudaEvaluationMatchesCpu) {
  const auto source = open_dump_source(kEvaluationDump);
  EvalConfig config;
  config.methods = {"naive", "hadamard", "oscar"};
  config.contexts = {8192};
  config.queries_per_sequence = 16;
  config.pack = &shipped_pack();
  config.pack_path = "(calibrated by the test)";
  const EvalResult cpu = run_evaluation(*source, config);
  config.backend = "cuda";
  const EvalResult gpu = run_evaluation(*source, config);
  ASSERT_EQ(cpu.rows.size(), config.methods.size());
  ASSERT_EQ(gpu.rows.size(), cpu.rows.size());
  for (size_t i = 0; i < cpu.rows.size(); ++i) {
    const EvalRow &c = cpu.rows[i], &g = gpu.rows[i];
    std::printf("  %-8s rel_err cpu %.6f cuda %.6f  cos %.6f / %.6f  kl %.6f / %.6f\n", c.method.c_str(),
                c.rel_err.mean, g.rel_err.mean, c.cos, g.cos, c.kl, g.kl);
    ASSERT_EQ(g.method, c.method);
    EXPECT_EQ(g.queries, c.queries) << c.method;
    EXPECT_GT(c.queries, 0) << c.method;
    EXPECT_NEAR(g.rel_err.mean, c.rel_err.mean, 1e-3 * c.rel_err.mean) << c.method;
    EXPECT_NEAR(g.rel_err.p99, c.rel_err.p99, 1e-3 * c.rel_err.p99) << c.method;
    EXPECT_NEAR(g.cos, c.cos, 1e-4) << c.method;
    EXPECT_NEAR(g.kl, c.kl, 1e-3 * c.kl + 1e-6) << c.method;
  }
  // Both backends see what the method exists for: naive > Hadamard > OSCAR in attention-output error.
  for (const EvalResult* r : {&cpu, &gpu}) {
    EXPECT_GT(r->rows[0].rel_err.mean, r->rows[1].rel_err.mean);
    EXPECT_GT(r->rows[1].rel_err.mean, r->rows[2].rel_err.mean);
  }
}

struct PackedRows {
  std::vector<uint8_t> codes;
  std::vector<float> metadata;  // (scale, zero) per row
};

PackedRows quantize_on_gpu(const std::vector<float>& rows, long n, int d, const float* rotation, float clip,
                           MetadataType metadata) {
  DeviceBuffer<float> input, rot, meta(static_cast<size_t>(n) * 2);
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(n) * d / 4);
  input.upload(rows);
  kernels::QuantizePackParams p;
  p.rows = n;
  p.head_dim = d;
  p.input = input.get();
  if (rotation) {
    rot.upload(std::vector<float>(rotation, rotation + static_cast<size_t>(d) * d));
    p.rotation = rot.get();
  }
  p.clip_ratio = clip;
  p.metadata = metadata == MetadataType::fp16   ? kernels::MetadataRounding::fp16
               : metadata == MetadataType::bf16 ? kernels::MetadataRounding::bf16
                                                : kernels::MetadataRounding::fp32;
  p.codes = codes.get();
  p.metadata_out = meta.get();
  kernels::launch_quantize_pack(p, nullptr);
  cuda_check(cudaGetLastError(), "launch");
  cuda_check(cudaDeviceSynchronize(), "quantize-pack");
  return {codes.download(), meta.download()};
}

PackedRows quantize_on_cpu(const std::vector<float>& rows, long n, int d, const float* rotation, float clip,
                           MetadataType metadata) {
  QuantizerConfig config;
  config.clip_ratio = clip;
  config.metadata = metadata;
  PackedRows out{std::vector<uint8_t>(static_cast<size_t>(n) * d / 4), std::vector<float>(static_cast<size_t>(n) * 2)};
  quantize_pack_rows_reference(rows.data(), n, d, rotation, config, out.codes.data(), out.metadata.data(), 2, 0,
                               nullptr);
  return out;
}

// Every K and V row of the evaluation dump (token x KV head), keys at the key clip and values at the value clip of
// the calibrated pack (0.96 / 0.92, the reference ratios). Without a rotation: codes and metadata bit-identical,
// fp32 and fp16 metadata. With the pack's R_K / R_V: x.R on the GPU differs by summation order and the fp16
// split products (~2^-20 relative), so a code may move by one step where a rotated value sits on a rounding
// boundary (at most 0.1 % of them) and scales agree within 1e-4 relative (the synthetic tests' bounds).
TEST(ShippedData, QuantizePackMatchesCpuOnRealRows) {
  const DumpReader dump(kEvaluationDump);
  const Pack& pack = shipped_pack();
  const int d = dump.info().geometry.head_dim;
  for (int layer : dump.info().layers) {
    const LayerActivations act = dump.read_layer(layer);
    const LayerPack* rotations = pack.find_layer(layer);
    ASSERT_NE(rotations, nullptr) << "layer " << layer;
    const long n = static_cast<long>(act.k.size()) / d;
    for (int side = 0; side < 2; ++side) {
      const std::vector<float>& rows = side == 0 ? act.k : act.v;
      const RotationSide& r = side == 0 ? rotations->key : rotations->value;
      const std::string what = "layer " + std::to_string(layer) + (side == 0 ? " keys" : " values");
      for (MetadataType metadata : {MetadataType::fp32, MetadataType::fp16}) {
        const PackedRows gpu = quantize_on_gpu(rows, n, d, nullptr, r.clip_ratio, metadata);
        const PackedRows cpu = quantize_on_cpu(rows, n, d, nullptr, r.clip_ratio, metadata);
        EXPECT_EQ(gpu.codes, cpu.codes) << what;
        EXPECT_EQ(std::memcmp(gpu.metadata.data(), cpu.metadata.data(), cpu.metadata.size() * sizeof(float)), 0)
            << what;
      }
      const float* rotation = r.head_rotation(0, d);  // scope layer: one matrix for every KV head
      const PackedRows gpu = quantize_on_gpu(rows, n, d, rotation, r.clip_ratio, MetadataType::fp32);
      const PackedRows cpu = quantize_on_cpu(rows, n, d, rotation, r.clip_ratio, MetadataType::fp32);
      test::expect_codes_close(gpu.codes, cpu.codes, n, d, what + ", rotated");
      for (size_t i = 0; i < cpu.metadata.size(); i += 2) {
        ASSERT_NEAR(gpu.metadata[i], cpu.metadata[i], 1e-4 * std::fabs(cpu.metadata[i])) << what << ", row " << i / 2;
        ASSERT_NEAR(gpu.metadata[i + 1], cpu.metadata[i + 1], 1e-4 * std::fabs(cpu.metadata[i + 1]) + 1e-6)
            << what << ", row " << i / 2;
      }
      std::printf("  %s: %ld rows, rotated: largest relative scale difference %.3g\n", what.c_str(), n,
                  test::max_scale_error(gpu.metadata, cpu.metadata));
    }
  }
}

}  // namespace
}  // namespace oscar
