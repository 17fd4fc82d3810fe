// Metric tests: a two-token fixture whose metrics are worked out by hand, identity cases, the tier
// split of the output error, reconstruction errors and the summary statistics.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace oscar {
namespace {

// Two tokens, d = 4, softmax scale 1, no rotation. Reference: k0 = 0, k1 = ln3 e0, so p = (1/4, 3/4).
// Quantised: k1_hat = 0, so p_hat = (1/2, 1/2). Values v0 = e0, v1 = e1 (exact in both).
// o = (1/4, 3/4, 0, 0), o_hat = (1/2, 1/2, 0, 0):
//   rel_err = |(-1/4, 1/4)| / |(1/4, 3/4)| = (sqrt2/4) / (sqrt10/4) = 1/sqrt5
//   cos = (1/8 + 3/8) / ((sqrt10/4)(sqrt2/2)) = 2/sqrt5
//   KL = 1/4 ln(1/2) + 3/4 ln(3/2);  max logit error = ln3;  top-2 recall = 1
//   token 0 sits in the sink, token 1 in the history: sink delta = (1/4 - 1/2) e0, history delta =
//   (3/4 - 1/2) e1, each of norm 1/4, relative 1/sqrt10; recent 0.
struct Fixture {
  const float ln3 = static_cast<float>(std::log(3.0));
  std::vector<float> query = {1, 0, 0, 0};
  std::vector<float> ref_keys = {0, 0, 0, 0, ln3, 0, 0, 0};
  std::vector<float> values = {1, 0, 0, 0, 0, 1, 0, 0};
  EncodedSequence encoded;
  Fixture() {
    encoded.tokens = 2;
    encoded.dim = 4;
    encoded.window_keys = ref_keys;
    encoded.window_values = values;
    encoded.dequantized_keys = {0, 0, 0, 0, 0, 0, 0, 0};
    encoded.dequantized_values = values;
  }
  QueryEvalInput input() const {
    QueryEvalInput in;
    in.dim = 4;
    in.softmax_scale = 1.0;
    in.query = in.rotated_query = query.data();
    in.reference_keys = ref_keys.data();
    in.reference_values = values.data();
    in.encoded = &encoded;
    in.split = TierSplit{1, 1, 0};
    return in;
  }
};

TEST(Metrics, HandComputedTwoTokenFixture) {
  Fixture f;
  const QueryMetrics m = evaluate_query(f.input());
  const double ln3 = static_cast<double>(f.ln3);  // the float key; exp(ln3f) differs from 3 by ~1e-7
  const double p1 = std::exp(ln3) / (1 + std::exp(ln3));
  EXPECT_NEAR(p1, 0.75, 1e-7);
  const double o_norm = std::sqrt((1 - p1) * (1 - p1) + p1 * p1);
  EXPECT_NEAR(m.rel_err, std::sqrt(2 * (p1 - 0.5) * (p1 - 0.5)) / o_norm, 1e-15);
  EXPECT_NEAR(m.rel_err, 1 / std::sqrt(5.0), 1e-7);
  EXPECT_NEAR(m.cos, 2 / std::sqrt(5.0), 1e-7);
  EXPECT_NEAR(m.kl, (1 - p1) * std::log((1 - p1) / 0.5) + p1 * std::log(p1 / 0.5), 1e-15);
  EXPECT_NEAR(m.kl, 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_DOUBLE_EQ(m.logit_err_max, ln3);
  EXPECT_DOUBLE_EQ(m.top8_recall, 1.0);
  EXPECT_NEAR(m.err_sink, (p1 - 0.5) / o_norm, 1e-15);
  EXPECT_NEAR(m.err_history, (p1 - 0.5) / o_norm, 1e-15);
  EXPECT_NEAR(m.err_sink, 1 / std::sqrt(10.0), 1e-7);
  EXPECT_DOUBLE_EQ(m.err_recent, 0.0);
}

TEST(Metrics, BackendOutputIsWhatIsScored) {
  Fixture f;
  QueryEvalInput in = f.input();
  const std::vector<float> exact_reference = {0.25f, 0.75f, 0, 0};
  in.output = exact_reference.data();  // pretend the backend returned o exactly
  const QueryMetrics m = evaluate_query(in);
  EXPECT_NEAR(m.rel_err, 0.0, 1e-7);
  EXPECT_NEAR(m.cos, 1.0, 1e-12);
  EXPECT_NEAR(m.kl, 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);  // probabilities still differ
}

TEST(Metrics, TopEightRecallCountsTheOverlap) {
  // 10 tokens on e0 with logits 0..9; the quantised keys swap the ranks of tokens 1 and 9.
  const int n = 10, d = 4;
  std::vector<float> q = {1, 0, 0, 0}, keys(n * d, 0.0f), keys_hat(n * d, 0.0f), values(n * d, 1.0f);
  for (int j = 0; j < n; ++j) keys[j * d] = keys_hat[j * d] = static_cast<float>(j);
  keys_hat[1 * d] = 9;
  keys_hat[9 * d] = 1;
  EncodedSequence e;
  e.tokens = n;
  e.dim = d;
  e.window_keys = keys;
  e.dequantized_keys = keys_hat;
  e.window_values = e.dequantized_values = values;
  QueryEvalInput in;
  in.dim = d;
  in.softmax_scale = 1;
  in.query = in.rotated_query = q.data();
  in.reference_keys = keys.data();
  in.reference_values = values.data();
  in.encoded = &e;
  in.split = TierSplit{0, n, 0};
  // top-8 reference = {2..9}; quantised = {1, 2..8} (token 9 now has logit 1) -> overlap 7.
  EXPECT_DOUBLE_EQ(evaluate_query(in).top8_recall, 7.0 / 8.0);
  in.split = TierSplit{0, 0, n};  // everything from the windows: identical
  const QueryMetrics same = evaluate_query(in);
  EXPECT_DOUBLE_EQ(same.top8_recall, 1.0);
  EXPECT_DOUBLE_EQ(same.kl, 0.0);
  EXPECT_DOUBLE_EQ(same.rel_err, 0.0);
  EXPECT_DOUBLE_EQ(same.logit_err_max, 0.0);
}

TEST(Metrics, ValueRotationIsUndoneBeforeComparing) {
  // One token; the method stores v · R with R a 90-degree rotation in the (0, 1) plane.
  const int d = 4;
  std::vector<float> q = {0, 0, 0, 0}, k = {0, 0, 0, 0}, v = {3, 4, 0, 0}, v_rot = {-4, 3, 0, 0};
  MatrixD r = MatrixD::Identity(d, d);
  r(0, 0) = 0;
  r(0, 1) = 1;
  r(1, 0) = -1;
  r(1, 1) = 0;  // (3, 4) · R = (-4, 3)
  EncodedSequence e;
  e.tokens = 1;
  e.dim = d;
  e.window_keys = k;
  e.window_values = v_rot;
  QueryEvalInput in;
  in.dim = d;
  in.softmax_scale = 1;
  in.query = in.rotated_query = q.data();
  in.reference_keys = k.data();
  in.reference_values = v.data();
  in.encoded = &e;
  in.split = TierSplit{1, 0, 0};
  in.value_rotation = &r;
  EXPECT_DOUBLE_EQ(evaluate_query(in).rel_err, 0.0);
  in.value_rotation = nullptr;  // forgetting R_V^T: |(3,4) - (-4,3)| / 5 = sqrt(50)/5
  EXPECT_DOUBLE_EQ(evaluate_query(in).rel_err, std::sqrt(50.0) / 5.0);
}

TEST(Metrics, ReconstructionErrorsByTier) {
  // d = 2, identity rotation. Reference rows (1,0), (0,2), (2,0); windows exact, history rows off by
  // (0,1), (1,0), (0,0): history errors 1, 1, 0; norms 1, 4, 4.
  const MatrixD identity = MatrixD::Identity(2, 2);
  std::vector<float> ref = {1, 0, 0, 2, 2, 0}, hist = {1, 1, 1, 2, 2, 0};
  const ReconstructionErrors r = reconstruction_errors(ref.data(), ref, hist, 3, 2, identity);
  EXPECT_DOUBLE_EQ(r.relative_error(TierSplit{0, 3, 0}), 2.0 / 9.0);
  EXPECT_DOUBLE_EQ(r.relative_error(TierSplit{1, 1, 1}), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(r.relative_error(TierSplit{0, 1, 0}), 1.0);
  EXPECT_DOUBLE_EQ(r.relative_error(TierSplit{3, 0, 0}), 0.0);
}

TEST(Metrics, SummaryStatisticsInterpolateLikeNumpy) {
  std::vector<double> v;
  for (int i = 101; i >= 1; --i) v.push_back(i);  // unsorted input
  const Summary s = summarize(v);
  EXPECT_DOUBLE_EQ(s.mean, 51.0);
  EXPECT_DOUBLE_EQ(s.p50, 51.0);
  EXPECT_DOUBLE_EQ(s.p90, 91.0);
  EXPECT_DOUBLE_EQ(s.p99, 100.0);
  EXPECT_DOUBLE_EQ(s.max, 101.0);
  EXPECT_EQ(s.count, 101);
  const Summary two = summarize({0.0, 1.0});
  EXPECT_DOUBLE_EQ(two.p99, 0.99);
  EXPECT_DOUBLE_EQ(two.p50, 0.5);
  const Summary one = summarize({3.0});
  EXPECT_DOUBLE_EQ(one.p99, 3.0);
  EXPECT_EQ(summarize({}).count, 0);
}

}  // namespace
}  // namespace oscar
