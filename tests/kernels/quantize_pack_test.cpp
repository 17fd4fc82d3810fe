// GPU rotate-clip-quantise-pack against the CPU quantiser: codes and metadata bit-identical on
// already-rotated rows (no rotation); with a rotation, x.R differs from the CPU by float summation
// order and, on the tensor-core paths (fp16 hi/lo split with power-of-two scaling, hi.hi + hi.lo + lo.hi),
// by ~2^-20 relative per product, so codes may move by one step where a value sits on a rounding
// boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "backend/cuda_paged.h"
#include "backend/paged_cache.h"
#include "common/float16.h"
#include "gpu_test_util.h"
#include "quantize_pack.h"

namespace oscar {
namespace {

kernels::MetadataRounding rounding_of(MetadataType t) {
  return t == MetadataType::fp16 ? kernels::MetadataRounding::fp16
         : t == MetadataType::bf16 ? kernels::MetadataRounding::bf16
                                   : kernels::MetadataRounding::fp32;
}

struct QuantCase {
  int dim;
  long rows;
  float clip;
  MetadataType metadata;
  bool integer_grid;         // values k/8 with many ties
  bool wide_range = false;   // channel i scaled by 2^(i % 41 - 20): magnitudes over 40 octaves in every row
};

class QuantizePackExact : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantizePackExact, BitIdenticalToCpuQuantizer) {
  const QuantCase c = GetParam();
  const int d = c.dim, Q = d / 4, stride = 4, offset = 2;
  std::vector<float> x = test::random_normal(static_cast<size_t>(c.rows) * d, 1234 + d + c.rows, 2.0f);
  if (c.integer_grid)
    for (auto& v : x) v = std::round(v * 4.0f) / 8.0f;
  if (c.wide_range)
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % d % 41) - 20);
  // A few rows with outliers and a constant row.
  if (c.rows > 3) {
    x[5] = 40.0f;
    x[d + 7] = -35.0f;
    for (int i = 0; i < d; ++i) x[2 * static_cast<size_t>(d) + i] = 0.5f;
  }
  // A row near the bottom of the normal range (its code thresholds are too fine for the kernel's
  // threshold form: the plain per-value path) and an all-positive row far from zero (large zero point).
  if (c.rows > 10) {
    for (int i = 0; i < d; ++i) {  // |x| >= 1e-37: no subnormal (the kernels flush those)
      float& v = x[3 * static_cast<size_t>(d) + i];
      v = std::copysign(1.0f + std::fabs(v), v) * 1e-37f;
    }
    for (int i = 0; i < d; ++i) x[4 * static_cast<size_t>(d) + i] = 1000.0f + x[4 * static_cast<size_t>(d) + i];
  }
  std::vector<int64_t> dst(c.rows);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), std::mt19937_64(99));
  QuantizerConfig config;
  config.clip_ratio = c.clip;
  config.metadata = c.metadata;
  std::vector<uint8_t> ref_codes(static_cast<size_t>(c.rows) * Q, 0);
  std::vector<float> ref_meta(static_cast<size_t>(c.rows) * stride, 0.f);
  quantize_pack_rows_reference(x.data(), c.rows, d, nullptr, config, ref_codes.data(), ref_meta.data(), stride,
                               offset, dst.data());

  DeviceBuffer<float> dx, dmeta;
  DeviceBuffer<uint16_t> dmeta16;
  DeviceBuffer<uint8_t> dcodes;
  DeviceBuffer<int64_t> ddst;
  dx.upload(x);
  ddst.upload(dst);
  // fp32 metadata storage, and with fp16 metadata also the fp16 layout (the same values as fp16 bits).
  for (bool fp16_storage : {false, true}) {
    if (fp16_storage && c.metadata != MetadataType::fp16) continue;
    SCOPED_TRACE(fp16_storage ? "fp16 metadata storage" : "fp32 metadata storage");
    dcodes.upload(std::vector<uint8_t>(ref_codes.size(), 0xAB));  // poison
    dmeta.upload(std::vector<float>(ref_meta.size(), 0.f));
    dmeta16.upload(std::vector<uint16_t>(ref_meta.size(), 0));
    kernels::QuantizePackParams p;
    p.rows = c.rows;
    p.head_dim = d;
    p.input = dx.get();
    p.clip_ratio = c.clip;
    p.metadata = rounding_of(c.metadata);
    p.codes = dcodes.get();
    p.metadata_out = fp16_storage ? static_cast<void*>(dmeta16.get()) : dmeta.get();
    p.metadata_out_fp16 = fp16_storage;
    p.metadata_stride = stride;
    p.metadata_offset = offset;
    p.destination_rows = ddst.get();
    kernels::launch_quantize_pack(p, nullptr);
    cuda_check(cudaGetLastError(), "launch");
    cuda_check(cudaDeviceSynchronize(), "sync");
    auto codes = dcodes.download();
    std::vector<float> meta = dmeta.download();
    if (fp16_storage) {
      const std::vector<uint16_t> half = dmeta16.download();
      for (size_t i = 0; i < meta.size(); ++i) meta[i] = fp16_to_float(half[i]);
    }
    long code_mismatch = 0, meta_mismatch = 0;
    for (size_t i = 0; i < codes.size(); ++i) code_mismatch += codes[i] != ref_codes[i];
    for (size_t i = 0; i < meta.size(); ++i) meta_mismatch += std::memcmp(&meta[i], &ref_meta[i], 4) != 0;
    EXPECT_EQ(code_mismatch, 0) << "packed bytes differ";
    EXPECT_EQ(meta_mismatch, 0) << "metadata bits differ";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantizePackExact,
    ::testing::Values(QuantCase{128, 1, 1.0f, MetadataType::fp32, false},
                      QuantCase{128, 1000, 0.96f, MetadataType::fp32, false},
                      QuantCase{128, 1000, 0.92f, MetadataType::fp16, false},
                      QuantCase{128, 777, 0.96f, MetadataType::bf16, true},
                      QuantCase{128, 513, 0.5f, MetadataType::fp16, true},
                      QuantCase{64, 999, 0.96f, MetadataType::fp32, false},
                      QuantCase{64, 65, 0.92f, MetadataType::fp16, true},
                      QuantCase{256, 333, 0.96f, MetadataType::fp32, false},
                      QuantCase{256, 129, 0.92f, MetadataType::bf16, true},
                      QuantCase{256, 63, 0.1f, MetadataType::fp16, false},
                      // Many rows: every code boundary of the threshold form is crossed often.
                      QuantCase{128, 30011, 0.96f, MetadataType::fp16, true},
                      QuantCase{128, 30011, 0.92f, MetadataType::fp32, false},
                      QuantCase{64, 20011, 0.96f, MetadataType::bf16, false},
                      QuantCase{128, 20011, 1.0f, MetadataType::fp16, false},
                      // d = 256 (two lanes per row, 32-row tiles) and d = 64 with K = 13 (top-16 by bitonic merges).
                      QuantCase{256, 20011, 0.96f, MetadataType::fp16, true},
                      QuantCase{256, 4099, 0.96f, MetadataType::bf16, false},
                      QuantCase{64, 5003, 0.8f, MetadataType::fp32, false},
                      // d = 256 with fewer clipped values than the top-K list holds (K = 7 of 8, 2 of 4): the lists'
                      // general merge, and lanes with fewer candidate groups than the quantiser takes unlooped.
                      QuantCase{256, 5003, 0.973f, MetadataType::fp16, false},
                      QuantCase{256, 4001, 0.995f, MetadataType::fp32, true},
                      // 17..32 clipped values: the top-32 list (K = 21, 32, 29, 31; and 21 in the 0.92 case above),
                      // then K = 33, the first count past it (the warp-per-row kernel).
                      QuantCase{128, 20011, 0.84f, MetadataType::fp32, false},
                      QuantCase{128, 5003, 0.75f, MetadataType::fp16, true},
                      QuantCase{64, 5003, 0.55f, MetadataType::bf16, false},
                      QuantCase{256, 4099, 0.88f, MetadataType::fp32, false},
                      QuantCase{128, 777, 0.7421875f, MetadataType::fp32, false},
                      // 9..12 clipped values: the top-12 list (K = 9, 12, and 12 at d = 256, whose two lanes then take
                      // the merge-free k_top = KMAX form; 11 in the 0.92 and d = 256 0.96 cases above).
                      QuantCase{64, 3001, 0.86f, MetadataType::fp32, false},
                      QuantCase{128, 4001, 0.91f, MetadataType::fp16, true},
                      QuantCase{256, 2003, 0.953125f, MetadataType::fp32, false},
                      // The warp-per-row kernel's threshold search (K = 33, 64, and 231 at d = 256 clip 0.1 above),
                      // on many rows (K = 41 and 52 at d = 256, 39 at d = 128; ties on the grid rows), so that it
                      // stops at the smallest magnitude above its lower bound, at the largest below its upper bound,
                      // and with an interval one bit pattern wide (ties); and near the smallest magnitudes (K = D -
                      // 5, and K = D, found at once by one minimum). The largest: see
                      // UnalignedRowsTakeTheWarpKernelSameBits. Rows over 40 octaves: its first candidates step
                      // down from the row's largest magnitude many times (and the thread-per-row lists at 0.96).
                      QuantCase{256, 6007, 0.84f, MetadataType::fp16, true},
                      QuantCase{256, 3001, 0.8f, MetadataType::fp32, false},
                      QuantCase{128, 4001, 0.7f, MetadataType::bf16, true},
                      QuantCase{128, 1001, 0.04f, MetadataType::fp32, false},
                      QuantCase{256, 501, 0.003f, MetadataType::bf16, false},
                      QuantCase{64, 999, 0.08f, MetadataType::fp16, true},
                      QuantCase{256, 2003, 0.84f, MetadataType::fp32, false, true},
                      QuantCase{128, 3001, 0.7f, MetadataType::fp16, false, true},
                      QuantCase{64, 2001, 0.45f, MetadataType::bf16, false, true},
                      QuantCase{128, 2001, 0.96f, MetadataType::fp32, false, true}));

// The CPU reference and the kernel on the same rows and rotation (clip 0.96, fp32 metadata unless given).
struct RotatedRun {
  std::vector<uint8_t> ref_codes, codes;
  std::vector<float> ref_meta, meta;
};

// fp16_storage: the kernel writes the metadata as fp16 (needs fp16 metadata); run.meta holds them as floats.
// caller_workspace: the call gets its workspace (quantize_pack_workspace_bytes) from the caller, poisoned, instead of
// allocating one on the stream. unaligned_input: the rows start 4 bytes past a 16-byte boundary (the warp-per-row
// kernel).
RotatedRun run_rotated(const std::vector<float>& x, const std::vector<float>& rot, long rows, int d, float clip = 0.96f,
                       MetadataType metadata = MetadataType::fp32, bool fp16_storage = false,
                       bool caller_workspace = false, bool unaligned_input = false) {
  QuantizerConfig config;
  config.clip_ratio = clip;
  config.metadata = metadata;
  RotatedRun run;
  run.ref_codes.resize(static_cast<size_t>(rows) * d / 4);
  run.ref_meta.resize(static_cast<size_t>(rows) * 2);
  quantize_pack_rows_reference(x.data(), rows, d, rot.data(), config, run.ref_codes.data(), run.ref_meta.data(), 2,
                               0, nullptr);
  DeviceBuffer<float> dx, drot, dmeta(run.ref_meta.size());
  DeviceBuffer<uint16_t> dmeta16(run.ref_meta.size());
  DeviceBuffer<uint8_t> dcodes(run.ref_codes.size());
  if (unaligned_input) {
    std::vector<float> shifted(x.size() + 1, 0.0f);
    std::copy(x.begin(), x.end(), shifted.begin() + 1);
    dx.upload(shifted);
  } else {
    dx.upload(x);
  }
  drot.upload(rot);
  kernels::QuantizePackParams p;
  p.rows = rows;
  p.head_dim = d;
  p.input = dx.get() + (unaligned_input ? 1 : 0);
  p.rotation = drot.get();
  p.clip_ratio = clip;
  p.metadata = rounding_of(metadata);
  p.codes = dcodes.get();
  p.metadata_out = fp16_storage ? static_cast<void*>(dmeta16.get()) : dmeta.get();
  p.metadata_out_fp16 = fp16_storage;
  DeviceBuffer<uint8_t> workspace;
  if (caller_workspace) {
    workspace.upload(std::vector<uint8_t>(kernels::quantize_pack_workspace_bytes(p), 0xAB));
    p.workspace = workspace.get();
  }
  kernels::launch_quantize_pack(p, nullptr);
  cuda_check(cudaGetLastError(), "launch");
  cuda_check(cudaDeviceSynchronize(), "sync");
  run.codes = dcodes.download();
  if (fp16_storage) {
    const std::vector<uint16_t> half = dmeta16.download();
    run.meta.resize(half.size());
    for (size_t i = 0; i < half.size(); ++i) run.meta[i] = fp16_to_float(half[i]);
  } else {
    run.meta = dmeta.download();
  }
  return run;
}

int device_sms() {
  int device = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "device");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessors");
  return sms;
}

// Rotated calls with more than 32 clipped values take x.R on tensor cores, then a warp per row, above this many rows
// per multiprocessor (quantize_pack.cu's tensor_warp_rows_per_sm); below, the warp-per-row kernel.
long tensor_warp_rows(int d) { return (d == 256 ? 32L : (d == 128 ? 128L : 512L)) * device_sms(); }

// Clip 0.96 and 26 clipped values (the top-32 list) take the thread-per-row kernels; more than 32 clipped values (clip
// 0.7, at d = 64 0.45) a warp per row after the same x.R on tensor cores (enough rows, as here: tensor_warp_rows),
// and an unaligned input at any ratio the warp-per-row kernel (also what a GPU takes that cannot grant the
// thread-per-row kernels' shared memory: rotated d = 128 on an A100).
TEST(QuantizePack, RotationWithinFloatTolerance) {
  for (int d : {64, 128, 256}) {
    for (float clip : {0.96f, (d - 26.0f) / d, d == 64 ? 0.45f : 0.7f, -0.7f}) {
      const bool unaligned = clip < 0.0f;  // the warp-per-row kernel (aligned, 0.7 takes tc-warp-per-row)
      clip = std::fabs(clip);
      const long rows = d == 256 || clip > 0.75f || unaligned ? 7001 : tensor_warp_rows(d) + 1001;
      auto x = test::random_normal(static_cast<size_t>(rows) * d, 5 + d);
      auto rot = test::random_normal(static_cast<size_t>(d) * d, 6 + d, 1.0f / std::sqrt(static_cast<float>(d)));
      const RotatedRun run = run_rotated(x, rot, rows, d, clip, MetadataType::fp32, false, false, unaligned);
      const std::vector<float>& meta = run.meta;
      const std::vector<float>& ref_meta = run.ref_meta;
      // Metadata: within a few float ulps relative (x.R differs by summation order, ~1e-6 relative).
      for (size_t i = 0; i < meta.size(); i += 2) {
        ASSERT_NEAR(meta[i], ref_meta[i], 1e-4 * std::fabs(ref_meta[i]) + 1e-7) << "scale of row " << i / 2;
        ASSERT_NEAR(meta[i + 1], ref_meta[i + 1], 1e-4 * std::fabs(ref_meta[i + 1]) + 1e-6) << "zero of row " << i / 2;
      }
      const std::string label =
          "d " + std::to_string(d) + " clip " + std::to_string(clip).substr(0, 4) + (unaligned ? " unaligned" : "");
      std::printf("  %s: largest relative scale difference %.3g\n", label.c_str(),
                  test::max_scale_error(run.meta, run.ref_meta));
      test::expect_codes_close(run.codes, run.ref_codes, rows, d, label);
    }
  }
}

// Rows and rotations that stress the power-of-two scaling of the fp16-split tensor-core path: a zero
// row, a row spanning 2^-30..2^29, a single huge outlier, rows near 1e-6, 1e-30 and 1e30, a constant row;
// a non-orthogonal R with columns scaled by 2^-12..2^20 and one zero column; enough rows that every
// persistent CTA handles several 64-row tiles (and a partial last tile).
TEST(QuantizePack, RotationHardRowsWithinFloatTolerance) {
  for (int d : {64, 128, 256}) {
    const long rows = d == 64 ? 60013 : (d == 128 ? 40009 : 3001);
    auto x = test::random_normal(static_cast<size_t>(rows) * d, 11 + d);
    auto rot = test::random_normal(static_cast<size_t>(d) * d, 12 + d, 1.0f / std::sqrt(static_cast<float>(d)));
    for (int k = 0; k < d; ++k)
      for (int n = 0; n < d; ++n) {
        float& r = rot[static_cast<size_t>(k) * d + n];
        r = n == 5 ? 0.0f : std::ldexp(r, n == 9 ? 20 : (n % 5) * 3 - 12 + 6 * (n % 2));
      }
    auto row = [&](long r) { return x.data() + static_cast<size_t>(r) * d; };
    for (int i = 0; i < d; ++i) {
      row(0)[i] = 0.0f;
      row(1)[i] = std::ldexp(i % 2 ? -1.0f : 1.0f, (i * 7) % 60 - 30);
      row(3)[i] *= 1e-6f;
      row(4)[i] *= 1e30f;
      row(5)[i] = 0.5f;
      row(6)[i] *= 1e-30f;
      row(rows - 1)[i] *= 1e-3f;
    }
    row(2)[3] = 1e6f;
    row(63)[d - 1] = -3e5f;
    row(64)[0] = 7e4f;
    const RotatedRun run = run_rotated(x, rot, rows, d);
    const std::vector<float>& meta = run.meta;
    const std::vector<float>& ref_meta = run.ref_meta;
    // The zero row rotates to exact zeros on any path: its metadata is bit-identical.
    EXPECT_EQ(meta[0], ref_meta[0]) << "d " << d;
    EXPECT_EQ(meta[1], ref_meta[1]) << "d " << d;
    // Rows 1..6 are relative only (their scales span 1e-9..1e30).
    for (size_t i = 0; i < meta.size(); i += 2) {
      const double atol = i / 2 < 7 ? 0.0 : 1.0;
      ASSERT_NEAR(meta[i], ref_meta[i], 1e-4 * std::fabs(ref_meta[i]) + 1e-7 * atol)
          << "scale of row " << i / 2 << " d " << d;
      ASSERT_NEAR(meta[i + 1], ref_meta[i + 1], 1e-4 * std::fabs(ref_meta[i + 1]) + 1e-6 * atol)
          << "zero of row " << i / 2 << " d " << d;
    }
    std::printf("  d %d: largest relative scale difference %.3g\n", d,
                test::max_scale_error(run.meta, run.ref_meta));
    test::expect_codes_close(run.codes, run.ref_codes, rows, d, "d " + std::to_string(d));
  }
}

// A signed permutation with power-of-two entries: column shifts within 7 of one another (one scale), or spread over
// 2^-12..2^12 (per-column scales).
std::vector<float> signed_permutation(int d, bool spread_columns) {
  std::vector<int> column(d);
  std::iota(column.begin(), column.end(), 0);
  std::shuffle(column.begin(), column.end(), std::mt19937_64(7 + d));
  std::vector<float> rot(static_cast<size_t>(d) * d, 0.0f);
  for (int k = 0; k < d; ++k) {
    const int n = column[k], shift = spread_columns ? 2 * (n % 13) - 12 : n % 5 - 2;
    rot[static_cast<size_t>(k) * d + n] = std::ldexp((k * 7 + n) % 3 ? 1.0f : -1.0f, shift);
  }
  return rot;
}

void expect_bit_identical(const RotatedRun& run, const std::string& what) {
  long code_mismatch = 0, meta_mismatch = 0;
  for (size_t i = 0; i < run.codes.size(); ++i) code_mismatch += run.codes[i] != run.ref_codes[i];
  for (size_t i = 0; i < run.meta.size(); ++i) meta_mismatch += std::memcmp(&run.meta[i], &run.ref_meta[i], 4) != 0;
  EXPECT_EQ(code_mismatch, 0) << what;
  EXPECT_EQ(meta_mismatch, 0) << what;
}

// R = a signed permutation with power-of-two entries, rows of multiples of 1/8 (which fit fp16 after
// the power-of-two row scale): x.R is exact on every path (one non-zero product per output, no split
// remainders), so codes and metadata must be bit-identical to the CPU quantiser. Any wrong fragment,
// descriptor or shared-memory layout of R or x moves columns. Column shifts within 7 of one another
// (one scale) and spread over 2^-12..2^12 (per-column scales); enough rows that persistent warps take
// several tiles, and a partial last one.
TEST(QuantizePack, RotationBySignedPermutationBitIdentical) {
  struct Case {
    int dim;
    long rows;
    float clip;
    MetadataType metadata;
    bool spread_columns;
  };
  const Case cases[] = {{64, 70001, 0.96f, MetadataType::fp32, false},  {64, 333, 0.92f, MetadataType::bf16, true},
                        {128, 1, 0.96f, MetadataType::fp16, false},      {128, 40009, 0.96f, MetadataType::fp32, false},
                        {128, 5003, 0.92f, MetadataType::fp16, true},    {256, 1001, 0.96f, MetadataType::fp32, false},
                        {256, 20011, 0.96f, MetadataType::fp16, true},
                        // K = 5 and 2 of lists of 6 and 4 (see QuantizePackExact's d = 256 cases).
                        {128, 20011, 0.965f, MetadataType::fp32, false}, {128, 7001, 0.99f, MetadataType::bf16, false},
                        {256, 3001, 0.973f, MetadataType::fp32, false},
                        // K = 12 and 10: the top-12 list; K = 26, 32, 21, 26: the top-32 list.
                        {128, 7001, 0.91f, MetadataType::fp32, false},
                        {256, 2001, 0.9609375f, MetadataType::fp16, true},
                        {128, 20011, 0.796875f, MetadataType::fp32, false},
                        {128, 7001, 0.75f, MetadataType::fp16, true},
                        {256, 3001, 0.92f, MetadataType::bf16, false},
                        {64, 5003, 0.59375f, MetadataType::fp32, false},
                        // K = 52 and 77 at d = 256, 39 at d = 128, 36 at d = 64: a warp per row after x.R on
                        // tensor cores (enough rows: tensor_warp_rows), or the warp-per-row kernel.
                        {256, 7001, 0.8f, MetadataType::fp16, true},
                        {256, 1001, 0.7f, MetadataType::fp32, false},
                        {128, -1, 0.7f, MetadataType::fp16, false},
                        {128, 1001, 0.7f, MetadataType::fp32, true},
                        {64, -1, 0.45f, MetadataType::bf16, false},
                        {64, 1001, 0.45f, MetadataType::fp32, true}};
  for (Case c : cases) {
    if (c.rows < 0) c.rows = tensor_warp_rows(c.dim) + 2001;  // enough rows for the tensor cores (tensor_warp_rows)
    const int d = c.dim;
    std::vector<float> x = test::random_normal(static_cast<size_t>(c.rows) * d, 31 + d + c.rows, 2.0f);
    for (auto& v : x) v = std::round(v * 4.0f) / 8.0f;
    if (c.rows > 3) {
      x[5] = 40.0f;
      for (int i = 0; i < d; ++i) x[2 * static_cast<size_t>(d) + i] = 0.5f;
      // A tiny row (one scale only: its shifted values stay normal, >= 2^-125): the steps of its code
      // thresholds fall below the normal range, so the quantiser takes its per-value fallback. A small one
      // (2^-60): its scale is below 2^-40, so its thresholds are checked, not taken as exact.
      if (!c.spread_columns)
        for (size_t i = 3 * static_cast<size_t>(d); i < 5 * static_cast<size_t>(d); ++i)
          x[i] = std::ldexp(x[i], i < 4 * static_cast<size_t>(d) ? -120 : -60);
    }
    const std::vector<float> rot = signed_permutation(d, c.spread_columns);
    // With fp16 metadata also into the fp16 layout.
    for (bool fp16_storage : {false, true}) {
      if (fp16_storage && c.metadata != MetadataType::fp16) continue;
      const RotatedRun run = run_rotated(x, rot, c.rows, d, c.clip, c.metadata, fp16_storage);
      expect_bit_identical(run, "d " + std::to_string(d) + " rows " + std::to_string(c.rows) +
                                    (fp16_storage ? ", fp16 storage" : ""));
    }
  }
}

// Rows that keep the quantiser's lanes busy for long and unevenly: zero rows (every 97th; each lane walks the
// whole row for the sign of a zero) and rows on the fallback path (every 7th scaled by 2^-120, every 11th by 2^-60,
// as the tiny rows above: one lane of the pair busy after the rest of its warp has returned). At d = 128 the
// consumer warpgroups of the rotated kernel then run unevenly, which exposed a hand-over that let a producer
// overwrite tiles still in use (nondeterministic codes). x.R is exact (signed permutation), so each of three
// launches must give the CPU quantiser's bits, and so must one with more than 32 clipped values (a warp per row after
// the same x.R).
TEST(QuantizePack, RotationWithZeroAndFallbackRowsBitIdentical) {
  for (int d : {64, 128, 256}) {
    const long rows = d == 256 ? 8009 : 100037;
    std::vector<float> x = test::random_normal(static_cast<size_t>(rows) * d, 41 + d, 2.0f);
    for (auto& v : x) v = std::round(v * 4.0f) / 8.0f;
    for (long r = 0; r < rows; ++r)
      for (int i = 0; i < d; ++i) {
        float& v = x[static_cast<size_t>(r) * d + i];
        if (r % 97 == 1) v = 0.0f;
        else if (r % 7 == 3 || r % 11 == 5) v = std::ldexp(v, r % 7 == 3 ? -120 : -60);
      }
    const std::vector<float> rot = signed_permutation(d, false);
    for (int launch = 0; launch < 4; ++launch) {
      const float clip = launch < 3 ? 0.96f : (d == 64 ? 0.45f : 0.7f);
      expect_bit_identical(run_rotated(x, rot, rows, d, clip),
                           "d " + std::to_string(d) + " clip " + std::to_string(clip).substr(0, 4) + " launch " +
                               std::to_string(launch));
    }
  }
}

// d = 256 splits R into a workspace first: the caller's (poisoned beforehand) and the call's own give the same bits.
TEST(QuantizePack, RotationWorkspaceOfCallerOrStreamSameBits) {
  const int d = 256;
  const long rows = 7001;
  auto x = test::random_normal(static_cast<size_t>(rows) * d, 61, 3.0f);
  auto rot = test::random_normal(static_cast<size_t>(d) * d, 62, 1.0f / std::sqrt(static_cast<float>(d)));
  kernels::QuantizePackParams p;
  p.rows = rows;
  p.head_dim = d;
  EXPECT_EQ(kernels::quantize_pack_workspace_bytes(p), 0u);
  p.rotation = rot.data();
  const size_t bytes = kernels::quantize_pack_workspace_bytes(p);
  EXPECT_GT(bytes, size_t{256} * d * 4);  // R's fp16 hi and lo at least
  p.clip_ratio = 0.8f;  // 52 clipped values: a warp per row after the same x.R, from the same workspace
  EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::tensor_rotate_warp_per_row);
  EXPECT_EQ(kernels::quantize_pack_workspace_bytes(p), bytes);
  ASSERT_GT(rows, tensor_warp_rows(d));
  p.rows = tensor_warp_rows(d);  // one CTA of 32 rows per multiprocessor: the warp-per-row kernel, which needs none
  EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::warp_per_row);
  EXPECT_EQ(kernels::quantize_pack_workspace_bytes(p), 0u);
  p.rows += 1;
  EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::tensor_rotate_warp_per_row);
  for (int dim : {64, 128}) {  // d = 64 and 128: x.R on the tensor cores of the top-32 lists' kernels, R split there
    p.head_dim = dim;
    p.clip_ratio = dim == 64 ? 0.45f : 0.7f;  // K = 36, 39
    p.rows = tensor_warp_rows(dim);
    EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::warp_per_row) << dim;
    p.rows += 1;
    EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::tensor_rotate_warp_per_row) << dim;
    EXPECT_EQ(kernels::quantize_pack_workspace_bytes(p), 0u) << dim;
    p.clip_ratio = 0.96f;
    EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::thread_per_row) << dim;
  }
  p.head_dim = d;
  p.clip_ratio = 0.8f;
  p.rows = rows;
  p.rotation = rot.data() + 1;  // unaligned: the warp-per-row kernel
  EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::warp_per_row);
  EXPECT_EQ(kernels::quantize_pack_workspace_bytes(p), 0u);
  for (float clip : {0.96f, 0.8f}) {
    const std::string what = "clip " + std::to_string(clip).substr(0, 4);
    const RotatedRun own = run_rotated(x, rot, rows, d, clip);
    const RotatedRun given = run_rotated(x, rot, rows, d, clip, MetadataType::fp32, false, true);
    EXPECT_EQ(own.codes, given.codes) << what;
    EXPECT_EQ(own.meta, given.meta) << what;
    test::expect_codes_close(given.codes, given.ref_codes, rows, d, "caller's workspace, " + what);
  }
}

// Input rows that are not 16-byte aligned take the warp-per-row kernel at any clip ratio: at d = 128 clip 0.96 and 0.92
// its search looks for the 6th and 11th largest magnitudes, at 0.995 for the largest (found at once, by one maximum).
// Bit-identical to the CPU.
TEST(QuantizePack, UnalignedRowsTakeTheWarpKernelSameBits) {
  const int d = 128, Q = d / 4;
  const long rows = 3001;
  const std::vector<float> x = test::random_normal(static_cast<size_t>(rows) * d + 1, 71, 2.0f);
  DeviceBuffer<float> dx, dmeta;
  DeviceBuffer<uint8_t> dcodes;
  dx.upload(x);
  dmeta.resize(static_cast<size_t>(rows) * 2);
  dcodes.resize(static_cast<size_t>(rows) * Q);
  for (float clip : {0.96f, 0.92f, 0.995f}) {
    QuantizerConfig config;
    config.clip_ratio = clip;
    config.metadata = MetadataType::fp32;
    std::vector<uint8_t> ref_codes(static_cast<size_t>(rows) * Q);
    std::vector<float> ref_meta(static_cast<size_t>(rows) * 2);
    quantize_pack_rows_reference(x.data() + 1, rows, d, nullptr, config, ref_codes.data(), ref_meta.data(), 2, 0,
                                 nullptr);
    kernels::QuantizePackParams p;
    p.rows = rows;
    p.head_dim = d;
    p.input = dx.get();
    p.clip_ratio = clip;
    p.codes = dcodes.get();
    p.metadata_out = dmeta.get();
    EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::thread_per_row);
    p.input = dx.get() + 1;  // 4 bytes past a 16-byte boundary
    EXPECT_EQ(kernels::quantize_pack_path(p), kernels::QuantizePackPath::warp_per_row);
    kernels::launch_quantize_pack(p, nullptr);
    cuda_check(cudaDeviceSynchronize(), "sync");
    EXPECT_EQ(dcodes.download(), ref_codes) << "clip " << clip;
    const std::vector<float> meta = dmeta.download();
    EXPECT_EQ(std::memcmp(meta.data(), ref_meta.data(), meta.size() * 4), 0) << "clip " << clip;
  }
}

TEST(QuantizePack, RefusesUnsupportedShapes) {
  kernels::QuantizePackParams p;
  p.rows = 1;
  p.head_dim = 96;
  EXPECT_THROW(kernels::check_quantize_pack(p), std::invalid_argument);
  // fp16 metadata storage holds only fp16-rounded metadata.
  std::vector<float> dummy(128);
  p.head_dim = 128, p.input = dummy.data(), p.codes = reinterpret_cast<uint8_t*>(dummy.data());
  p.metadata_out = dummy.data(), p.metadata_out_fp16 = true, p.metadata = kernels::MetadataRounding::fp32;
  EXPECT_THROW(kernels::check_quantize_pack(p), std::invalid_argument);
  p.metadata = kernels::MetadataRounding::fp16;
  EXPECT_NO_THROW(kernels::check_quantize_pack(p));
  p.workspace = reinterpret_cast<uint8_t*>(dummy.data()) + 4;  // not 16-byte aligned
  EXPECT_THROW(kernels::check_quantize_pack(p), std::invalid_argument);
}

}  // namespace
}  // namespace oscar
