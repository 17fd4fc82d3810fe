// Harness tests on in-memory activations: the bf16 method reproduces the reference, BPE per method,
// the method ranking on data with outlier channels, determinism across thread counts, tier errors,
// and one-line errors for bad contexts, layers and pack geometry.
#include "eval/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"

namespace oscar {
namespace {

// Q, K, V with a few large-magnitude channels (the structure that breaks naive INT2).
MemoryActivationSource make_source(std::vector<int64_t> lengths, int d = 32, int hq = 4, int hkv = 2,
                                   int num_layers = 2, unsigned seed = 11, int64_t queries_kept_last = 0) {
  DumpInfo info;
  info.geometry = ModelGeometry{num_layers, hq, hkv, d, true};
  info.sequence_offsets = {0};
  for (auto n : lengths) info.sequence_offsets.push_back(info.sequence_offsets.back() + n);
  info.tokens = info.sequence_offsets.back();
  info.queries_kept_last = queries_kept_last;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<LayerActivations> layers;
  for (int l = 0; l < num_layers; ++l) {
    info.layers.push_back(l);
    LayerActivations a;
    a.layer = l;
    a.tokens = info.tokens;
    std::vector<float> channel_scale(d);
    for (int i = 0; i < d; ++i) channel_scale[i] = (i % 11 == 3) ? 8.0f : 0.5f + 0.05f * i;
    std::vector<float> value_mean(d);
    for (auto& m : value_mean) m = normal(rng);
    auto fill = [&](std::vector<float>& x, int heads, float gain, const std::vector<float>* mean) {
      x.resize(static_cast<size_t>(info.tokens) * heads * d);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = (mean ? (*mean)[i % d] : 0.0f) + gain * channel_scale[i % d] * normal(rng);
    };
    fill(a.q, hq, 0.1f, nullptr);
    fill(a.k, hkv, 1.0f, nullptr);
    fill(a.v, hkv, 0.3f, &value_mean);
    if (queries_kept_last > 0)  // evaluation dump: queries only at the end of each sequence
      for (size_t s = 0; s + 1 < info.sequence_offsets.size(); ++s)
        for (int64_t t = info.sequence_offsets[s]; t < info.sequence_offsets[s + 1] - queries_kept_last; ++t)
          std::fill(a.q.begin() + t * hq * d, a.q.begin() + (t + 1) * hq * d, 0.0f);
    layers.push_back(std::move(a));
  }
  return MemoryActivationSource(info, std::move(layers), "mem.h5");
}

const EvalRow& row_of(const EvalResult& r, const std::string& method, int64_t context) {
  for (const auto& row : r.rows)
    if (row.method == method && row.context == context) return row;
  throw std::runtime_error("no row " + method);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Evaluator, Bf16ReproducesTheReferenceAndBaselinesRankAsExpected) {
  const auto source = make_source({300, 200});
  EvalConfig config;
  config.methods = {"bf16", "naive", "hadamard"};
  config.contexts = {1, 3, 127, 129, 200};
  config.threads = 2;
  const EvalResult r = run_evaluation(source, config);
  ASSERT_EQ(r.rows.size(), 15u);
  ASSERT_EQ(r.layer_rows.size(), 30u);
  for (int64_t L : config.contexts) {
    const EvalRow& bf16 = row_of(r, "bf16", L);
    EXPECT_DOUBLE_EQ(bf16.bpe, 16.0);
    EXPECT_LT(bf16.rel_err.max, 1e-6);  // only the float32 output of the backend
    EXPECT_EQ(bf16.kl, 0.0);             // identical logits
    EXPECT_EQ(bf16.top8_recall, 1.0);
    EXPECT_EQ(bf16.k_rel_mse, 0.0);
    const EvalRow& naive = row_of(r, "naive", L);
    EXPECT_DOUBLE_EQ(naive.bpe, 2.0 + 32.0 / 32.0);  // d = G = 32, fp16 scale + zero, no windows
    EXPECT_EQ(naive.err_sink, 0.0);  // no windows: all the error is in the history tier
    EXPECT_EQ(naive.err_recent, 0.0);
    EXPECT_GT(naive.err_history, 0.0);
    EXPECT_EQ(naive.layers, "0-1");
  }
  // Queries per context: positions L, L+16, L+32, L+48 below each sequence's length, x 2 layers x 4 query
  // heads. Context 200 only decodes in the 300-token sequence.
  EXPECT_EQ(row_of(r, "naive", 1).queries, 2 * 4 * 2 * 4);
  EXPECT_EQ(row_of(r, "naive", 129).queries, 2 * 4 * 2 * 4);
  EXPECT_EQ(row_of(r, "naive", 200).queries, 1 * 4 * 2 * 4);
  EXPECT_EQ(row_of(r, "naive", 200).sequences, 1);
  EXPECT_EQ(row_of(r, "naive", 129).sequences, 2);
  // Outlier channels: Hadamard beats naive on output error and KL at every context > 1.
  for (int64_t L : {127, 129, 200}) {
    EXPECT_GT(row_of(r, "naive", L).rel_err.mean, row_of(r, "hadamard", L).rel_err.mean) << L;
    EXPECT_GT(row_of(r, "naive", L).kl, row_of(r, "hadamard", L).kl) << L;
  }
  // Per-layer rows aggregate to the totals: the worst layer is the one with the larger mean.
  const EvalRow& total = row_of(r, "hadamard", 200);
  double worst = 0;
  for (const auto& lr : r.layer_rows)
    if (lr.method == "hadamard" && lr.context == 200) worst = std::max(worst, lr.rel_err.mean);
  EXPECT_EQ(total.worst_layer_rel_err, worst);
  // Every KV head serves the same number of queries, so a layer's mean is the mean of its heads' means
  // and the worst head is at least as bad as the worst layer (equal only if all heads tie).
  EXPECT_GT(total.worst_head_rel_err, total.worst_layer_rel_err);
  EXPECT_TRUE(total.worst_head == "0/0" || total.worst_head == "0/1" || total.worst_head == "1/0" ||
              total.worst_head == "1/1")
      << total.worst_head;
  double layer_worst_head = 0;
  for (const auto& lr : r.layer_rows)
    if (lr.method == "hadamard" && lr.context == 200) layer_worst_head = std::max(layer_worst_head, lr.worst_head_rel_err);
  EXPECT_EQ(total.worst_head_rel_err, layer_worst_head);
}

TEST(Evaluator, ResultsDoNotDependOnThreads) {
  const auto source = make_source({129, 131});
  EvalConfig config;
  config.methods = {"naive", "hadamard"};
  config.contexts = {64, 129};
  MethodOptions windows;
  windows.sink_tokens = 3;
  windows.recent_tokens = 17;
  config.variants = {MethodOptions{}, windows};
  config.threads = 1;
  const auto one = run_evaluation(source, config);
  config.threads = 3;
  const auto three = run_evaluation(source, config);
  const auto a = render_report(make_report_table(one.rows, false, true), ReportFormat::csv);
  const auto b = render_report(make_report_table(three.rows, false, true), ReportFormat::csv);
  EXPECT_EQ(a, b);
  ASSERT_EQ(one.rows.size(), 8u);
  // The windowed variant reports its layout and spends more bits: 20 BF16 tokens of 129.
  const EvalRow& w = one.rows[7];
  EXPECT_EQ(w.method, "hadamard");
  EXPECT_EQ(w.context, 129);
  EXPECT_EQ(w.sink, 3);
  EXPECT_EQ(w.recent, 17);
  const auto split = split_context(129, CacheLayout{3, 17, 8});
  EXPECT_EQ(split.sink + split.recent, 25);  // 126 past the sink: 13 pages of 8 demoted, 22 recent
  EXPECT_DOUBLE_EQ(w.bpe, (25 * 16.0 + 104 * 3.0) / 129.0);
}

TEST(Evaluator, BadInputsFailWithOneLine) {
  const auto source = make_source({100, 90});
  EvalConfig config;
  config.methods = {"naive"};
  config.contexts = {100};
  EXPECT_EQ(error_of([&] { run_evaluation(source, config); }),
            "mem.h5: context 100 is too long: decoding after 100 tokens needs a sequence of at least 101 tokens "
            "(longest: 100)");
  config.contexts = {50};
  config.layers = {7};
  EXPECT_EQ(error_of([&] { run_evaluation(source, config); }), "mem.h5: no layer 7 in the dump (layers 0-1)");
  config.layers = {};
  config.methods = {"naive", "nope"};
  EXPECT_NE(error_of([&] { run_evaluation(source, config); }).find("unknown method 'nope'"), std::string::npos);
  // A pack of another head_dim.
  Pack pack;
  pack.head_dim = 64;
  pack.num_layers = 2;
  config.methods = {"oscar"};
  config.pack = &pack;
  config.pack_path = "pack.h5";
  EXPECT_EQ(error_of([&] { run_evaluation(source, config); }), "pack.h5: pack has head_dim 64 but the dump has head_dim 32");
  // An evaluation dump with queries only in the last 8 tokens of each sequence (100 and 90 tokens).
  const auto eval_dump = make_source({100, 90}, 32, 4, 2, 1, 5, 8);
  config = EvalConfig{};
  config.methods = {"naive"};
  config.contexts = {10};  // positions 10, 26, 42, 58: none in [92, 100) or [82, 90)
  EXPECT_NE(error_of([&] { run_evaluation(eval_dump, config); }).find("context 10 has no decode position"),
            std::string::npos);
  config.contexts = {92, 82};
  config.query_stride = 2;
  const auto r = run_evaluation(eval_dump, config);
  EXPECT_EQ(r.rows[0].sequences, 1);
  EXPECT_EQ(r.rows[0].queries, 4 * 4);  // 92, 94, 96, 98 in the 100-token sequence
  EXPECT_EQ(r.rows[1].sequences, 1);
  EXPECT_EQ(r.rows[1].queries, 4 * 4);  // 82, 84, 86, 88 in the 90-token sequence only
  config.query_stride = 11;  // context 60: positions 60, 71, 82, 93: 93 in [92, 100), 82 in [82, 90)
  config.contexts = {60};
  const auto skipped = run_evaluation(eval_dump, config);
  EXPECT_EQ(skipped.rows[0].queries, 2 * 4);
  EXPECT_EQ(skipped.rows[0].sequences, 2);
}

TEST(Evaluator, ProvenanceWarning) {
  EXPECT_EQ(provenance_overlap_warning("p.h5", R"({"inputs":["/tmp/x/other.h5"]})", "/tmp/x/eval.h5"), "");
  EXPECT_NE(provenance_overlap_warning("p.h5", R"({"stats":{"inputs":["/tmp/x/../x/eval.h5"]}})", "/tmp/x/eval.h5")
                .find("the pack was calibrated on /tmp/x/eval.h5"),
            std::string::npos);
  EXPECT_NE(provenance_overlap_warning("p.h5", R"({"inputs":["/elsewhere/eval.h5"]})", "/tmp/x/eval.h5")
                .find("names a file called eval.h5"),
            std::string::npos);
}

TEST(Evaluator, FormatIndexList) {
  EXPECT_EQ(format_index_list({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(format_index_list({0, 2, 4, 5, 6}), "0,2,4-6");
  EXPECT_EQ(format_index_list({7}), "7");
}

}  // namespace
}  // namespace oscar
