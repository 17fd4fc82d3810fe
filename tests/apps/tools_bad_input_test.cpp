// Runs the tools on malformed inputs: each must fail with exactly one "error: ..." line naming the
// file, a non-zero exit code, and no output file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "capture/synthetic.h"
#include "io/dump.h"
#include "io/hdf5.h"

namespace oscar {
namespace {

const std::string kBin = OSCAR_BIN_DIR;

// Per-test names: ctest runs tests of this binary in parallel processes.
std::string temp(const std::string& name) {
  return testing::TempDir() + "/bad_" + testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + name;
}
bool exists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

struct Result {
  int status;
  std::string stderr_text;
};

Result run(const std::string& command) {
  const std::string err = temp("stderr.txt");
  int status = std::system((command + " 2>" + err + " >/dev/null").c_str());
  std::ifstream in(err);
  std::stringstream text;
  text << in.rdbuf();
  return {status, text.str()};
}

// The tool failed cleanly: non-zero exit, one line "error: ...", mentioning `mention`, no `output`.
void expect_clean_failure(const std::string& command, const std::string& mention, const std::string& output) {
  std::remove(output.c_str());
  Result r = run(command);
  EXPECT_NE(r.status, 0) << command;
  EXPECT_EQ(r.stderr_text.rfind("error: ", 0), 0u) << r.stderr_text;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find(mention), std::string::npos) << "'" << mention << "' not in: " << r.stderr_text;
  EXPECT_FALSE(exists(output)) << output << " was written";
}

std::string synth(const std::string& name, int d, int hq = 4, int hkv = 2) {
  const std::string path = temp(name);
  std::string command = kBin + "/oscar-capture synth -q --layers 1 --q-heads " + std::to_string(hq) + " --kv-heads " +
                        std::to_string(hkv) + " --head-dim " + std::to_string(d) + " --tokens 64 -o " + path;
  EXPECT_EQ(std::system(command.c_str()), 0);
  return path;
}

// A hand-made dump with the given shapes for /layers/0/{q,k,v}; `skip` leaves one dataset out.
std::string handmade(const std::string& name, int hq, int hkv, int d, std::vector<int64_t> k_shape,
                     const std::string& skip = "", bool nan = false) {
  const std::string path = temp(name);
  h5::File f = h5::File::create(path);
  f.set_attribute("/", "schema", std::string("oscar.dump"));
  f.set_attribute("/", "schema_version", int64_t{1});
  f.set_attribute("/", "num_layers", int64_t{1});
  f.set_attribute("/", "num_q_heads", int64_t{hq});
  f.set_attribute("/", "num_kv_heads", int64_t{hkv});
  f.set_attribute("/", "head_dim", int64_t{d});
  const int64_t tokens = 16;
  std::vector<int64_t> offsets = {0, tokens};
  f.write_ints("/sequence_offsets", {2}, offsets.data());
  auto make = [&](const std::string& ds, std::vector<int64_t> shape) {
    if (ds == skip) return;
    f.create_dataset("/layers/0/" + ds, h5::Element::float32, shape);
    int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> data(n, 0.5f);
    if (nan) data[n / 2] = NAN;
    f.write_rows("/layers/0/" + ds, 0, shape[0], data.data());
  };
  make("q", {tokens, hq, d});
  make("k", k_shape);
  make("v", {tokens, hkv, d});
  return path;
}

TEST(ToolsBadInput, MissingFile) {
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + temp("nope.h5"), "nope.h5", temp("o.h5"));
}

TEST(ToolsBadInput, TruncatedFile) {
  const std::string good = synth("good.h5", 16);
  const std::string cut = temp("truncated.h5");
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + cut, "truncated.h5", temp("o.h5"));
}

TEST(ToolsBadInput, MissingDataset) {
  const std::string path = handmade("missing.h5", 4, 2, 16, {16, 2, 16}, "v");
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + path, "/layers/0/v", temp("o.h5"));
}

TEST(ToolsBadInput, WrongRankAndShape) {
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + handmade("rank.h5", 4, 2, 16, {16, 32}),
                       "rank 2", temp("o.h5"));
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + handmade("shape.h5", 4, 2, 16, {16, 3, 16}),
                       "/layers/0/k", temp("o.h5"));
}

TEST(ToolsBadInput, QueryHeadsNotDivisible) {
  const std::string path = handmade("gqa.h5", 6, 4, 16, {16, 4, 16});
  expect_clean_failure(kBin + "/oscar-capture info " + path, "not divisible", temp("unused"));
}

TEST(ToolsBadInput, NonFiniteValues) {
  const std::string path = handmade("nan.h5", 4, 2, 16, {16, 2, 16}, "", true);
  expect_clean_failure(kBin + "/oscar-covariance -o " + temp("o.h5") + " " + path, "non-finite", temp("o.h5"));
}

TEST(ToolsBadInput, HadamardNeedsPowerOfTwo) {
  const std::string dump = synth("d48.h5", 48);
  const std::string stats = temp("d48_stats.h5");
  ASSERT_EQ(std::system((kBin + "/oscar-covariance -q -o " + stats + " " + dump).c_str()), 0);
  expect_clean_failure(kBin + "/oscar-calibrate -q -o " + temp("p.h5") + " " + stats, "power of two", temp("p.h5"));
}

TEST(ToolsBadInput, DumpAndStatisticsHeadDimMismatch) {
  const std::string dump64 = synth("d64.h5", 64), dump32 = synth("d32.h5", 32);
  const std::string stats = temp("d64_stats.h5");
  ASSERT_EQ(std::system((kBin + "/oscar-covariance -q -o " + stats + " " + dump64).c_str()), 0);
  expect_clean_failure(kBin + "/oscar-calibrate -q -o " + temp("p.h5") + " " + stats + " --clip fit --dump " + dump32,
                       "d32.h5", temp("p.h5"));
}

TEST(ToolsBadInput, MergeOfDifferentGeometry) {
  const std::string a = temp("ga.h5"), b = temp("gb.h5");
  ASSERT_EQ(std::system((kBin + "/oscar-covariance -q -o " + a + " " + synth("g16.h5", 16)).c_str()), 0);
  ASSERT_EQ(std::system((kBin + "/oscar-covariance -q -o " + b + " " + synth("g32.h5", 32)).c_str()), 0);
  expect_clean_failure(kBin + "/oscar-covariance --merge -o " + temp("m.h5") + " " + a + " " + b, "different geometry",
                       temp("m.h5"));
}

TEST(ToolsBadInput, ImportRefusesForeignFileWithoutLayout) {
  const std::string dump = synth("notraw.h5", 16);
  expect_clean_failure(kBin + "/oscar-capture import -q -o " + temp("i.h5") + " " + dump, "oscar.raw", temp("i.h5"));
}

TEST(ToolsGoodInput, DeterministicOutputs) {
  const std::string dump = synth("det.h5", 16);
  const std::string out = temp("det_stats.h5");
  auto run_once = [&] {
    EXPECT_EQ(std::system((kBin + "/oscar-covariance -q -o " + out + " " + dump).c_str()), 0);
    std::ifstream f(out, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  const std::string first = run_once(), second = run_once();
  EXPECT_FALSE(first.empty());
  EXPECT_TRUE(first == second) << "statistics files differ between identical runs";
}

}  // namespace
}  // namespace oscar
