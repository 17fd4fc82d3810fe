// End-to-end: oscar-capture synth -> oscar-covariance -> oscar-calibrate -> oscar-eval on a small
// synthetic model; checks the columns of the contract, the method ranking, the provenance warning and
// the one-line errors (no partial output file).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct ToolRun {
  int status = 0;
  std::string out, err;
};

class OscarEvalTool : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("oscar_eval_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string synth = bin("oscar-capture") + " synth --layers 2 --q-heads 4 --kv-heads 2 --tokens 700 --sequences 2";
    ASSERT_EQ(run(synth + " --head-dim 64 --seed 1 -o " + path("calib.h5")).status, 0);
    ASSERT_EQ(run(synth + " --head-dim 64 --seed 2 -o " + path("eval.h5")).status, 0);
    ASSERT_EQ(run(synth + " --head-dim 32 --seed 3 -o " + path("calib32.h5")).status, 0);
    ASSERT_EQ(run(bin("oscar-covariance") + " -q -o " + path("stats.h5") + " " + path("calib.h5")).status, 0);
    ASSERT_EQ(run(bin("oscar-calibrate") + " -q -o " + path("pack.h5") + " " + path("stats.h5")).status, 0);
    ASSERT_EQ(run(bin("oscar-covariance") + " -q -o " + path("stats32.h5") + " " + path("calib32.h5")).status, 0);
    ASSERT_EQ(run(bin("oscar-calibrate") + " -q -o " + path("pack32.h5") + " " + path("stats32.h5")).status, 0);
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  static std::string bin(const std::string& tool) { return std::string(OSCAR_BIN_DIR) + "/" + tool; }
  static std::string path(const std::string& name) { return (dir / name).string(); }
  static std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static ToolRun run(const std::string& command) {
    ToolRun r;
    const std::string out = path("stdout.txt"), err = path("stderr.txt");
    r.status = std::system((command + " > " + out + " 2> " + err).c_str());
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  static std::string eval(const std::string& args) {
    return bin("oscar-eval") + " -q --dump " + path("eval.h5") + " " + args;
  }
};
fs::path OscarEvalTool::dir;

// Splits a csv line (no quoted commas in these files).
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  for (std::string c; std::getline(s, c, ',');) out.push_back(c);
  return out;
}

TEST_F(OscarEvalTool, CsvHasTheContractColumnsAndTheExpectedRanking) {
  const ToolRun r = run(eval("--pack " + path("pack.h5") + " --methods bf16,naive,hadamard,oscar --context 600 --format csv"));
  ASSERT_EQ(r.status, 0) << r.err;
  std::stringstream lines(r.out);
  std::string header;
  std::getline(lines, header);
  const auto fields = cells(header);
  auto column = [&](const std::string& name) {
    auto it = std::find(fields.begin(), fields.end(), name);
    EXPECT_NE(it, fields.end()) << name;
    return static_cast<size_t>(it - fields.begin());
  };
  for (const char* name : {"method", "context", "bpe", "rel_err", "rel_err_p99", "cos", "kl", "layers", "backend"})
    column(name);
  std::map<std::string, std::vector<std::string>> rows;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) rows[cells(line)[column("method")]] = cells(line);
  ASSERT_EQ(rows.size(), 4u);
  auto value = [&](const std::string& method, const std::string& field) { return std::stod(rows[method][column(field)]); };
  EXPECT_LT(value("bf16", "rel_err"), 1e-6);
  EXPECT_EQ(value("naive", "bpe"), 2.5);  // d = 64 = G, fp16 scale + zero, no windows
  EXPECT_GT(value("naive", "rel_err"), value("hadamard", "rel_err"));
  EXPECT_GT(value("hadamard", "rel_err"), value("oscar", "rel_err"));
  EXPECT_EQ(rows["oscar"][column("backend")], "cpu");
  EXPECT_EQ(rows["oscar"][column("layers")], "0-1");
  EXPECT_EQ(r.err, "");  // disjoint dumps: no warning; -q: no progress
}

TEST_F(OscarEvalTool, WarnsWhenThePackWasCalibratedOnTheEvaluatedDump) {
  const ToolRun r = run(bin("oscar-eval") + " -q --dump " + path("calib.h5") + " --pack " + path("pack.h5") +
                    " --methods oscar --context 64 --layers 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: " + path("pack.h5") + ": the pack was calibrated on"), std::string::npos) << r.err;
}

TEST_F(OscarEvalTool, BadInputsFailWithOneLineAndNoOutputFile) {
  const std::string out = path("never.csv");
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--methods naive,bogus --context 64", "error: unknown method 'bogus'"},
      {"--methods naive --context 700", "error: " + path("eval.h5") + ": context 700 is too long"},
      {"--pack " + path("pack32.h5") + " --methods oscar --context 64",
       "error: " + path("pack32.h5") + ": pack has head_dim 32 but the dump has head_dim 64"},
      {"--methods oscar --context 64", "error: method 'oscar' needs a rotation pack"},
  };
  for (const auto& c : cases) {
    const ToolRun r = run(eval(c.args + " -o " + out));
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_EQ(r.err.rfind(c.message, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// The synthetic sink token (a massive activation on a few channels, zeros elsewhere) is constant after
// clipping; it stays in the BF16 sink, so "no rotation + clip + windows" must evaluate.
TEST_F(OscarEvalTool, AblationWithoutRotationKeepsTheSinkInBf16) {
  const ToolRun r = run(eval("--pack " + path("pack.h5") + " --methods oscar-ablation:none --context 300 --format csv"));
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(OscarEvalTool, SweepsAndPerLayerRows) {
  const ToolRun r = run(eval("--pack " + path("pack.h5") +
                         " --methods oscar,oscar-ablation:h --context 300,600 --windows 0/0,32/128 --per-layer "
                         "--format jsonl"));
  ASSERT_EQ(r.status, 0) << r.err;
  // 2 contexts x 2 window variants x 2 methods x 2 layers
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 16);
  EXPECT_NE(r.out.find("\"method\":\"oscar-ablation:h\""), std::string::npos) << r.out.substr(0, 300);
}

}  // namespace
