// Import tests: our raw layout and a foreign grouped layout (chunked tensors, [H, T, d] axes) give
// the same dump; token ranges, layer selection and evaluation dumps (queries kept last).
#include "capture/import.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "io/hdf5.h"

namespace oscar {
namespace {

constexpr int kHq = 4, kHkv = 2, kD = 8, kT = 10;

float value_of(char tensor, int layer, int t, int h, int c) {
  return static_cast<float>(tensor - 'a') + 0.5f * layer + 0.25f * t + 0.125f * h + 0.0625f * c;
}

std::vector<float> tensor(char name, int layer, int heads, bool head_major, int t0 = 0, int t1 = kT) {
  std::vector<float> data;
  if (head_major) {
    for (int h = 0; h < heads; ++h)
      for (int t = t0; t < t1; ++t)
        for (int c = 0; c < kD; ++c) data.push_back(value_of(name, layer, t, h, c));
  } else {
    for (int t = t0; t < t1; ++t)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < kD; ++c) data.push_back(value_of(name, layer, t, h, c));
  }
  return data;
}

std::string write_raw(const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name;
  h5::File f = h5::File::create(path);
  f.set_attribute("/", "schema", std::string("oscar.raw"));
  f.set_attribute("/", "schema_version", int64_t{1});
  f.set_attribute("/", "num_layers", int64_t{3});
  f.set_attribute("/", "num_q_heads", int64_t{kHq});
  f.set_attribute("/", "num_kv_heads", int64_t{kHkv});
  f.set_attribute("/", "head_dim", int64_t{kD});
  for (int layer : {0, 2})
    for (char t : {'q', 'k', 'v'}) {
      const int heads = t == 'q' ? kHq : kHkv;
      const std::string ds = "/layers/" + std::to_string(layer) + "/" + t;
      f.create_dataset(ds, h5::Element::float16, {kT, heads, kD});
      f.write_rows(ds, 0, kT, tensor(t, layer, heads, false).data());
    }
  return path;
}

// Foreign layout: group "blk<l>", tensors split in two chunks along T, stored [H, T, d], no attributes.
std::string write_grouped(const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name;
  h5::File f = h5::File::create(path);
  for (int layer : {0, 2})
    for (char t : {'q', 'k', 'v'}) {
      const int heads = t == 'q' ? kHq : kHkv;
      const std::string base = "/blk" + std::to_string(layer) + "/" + std::string(1, t) + "_states_";
      f.create_dataset(base + "0", h5::Element::float32, {heads, 4, kD});
      f.write_rows(base + "0", 0, heads, tensor(t, layer, heads, true, 0, 4).data());
      f.create_dataset(base + "1", h5::Element::float32, {heads, kT - 4, kD});
      f.write_rows(base + "1", 0, heads, tensor(t, layer, heads, true, 4, kT).data());
    }
  return path;
}

TEST(Import, RawAndGroupedLayoutsAgree) {
  ImportOptions raw_options;
  raw_options.quiet = true;
  raw_options.dtype = StorageType::float32;
  const std::string a = testing::TempDir() + "/import_raw.h5";
  import_raw_files({write_raw("r0.h5"), write_raw("r1.h5")}, a, raw_options, "{}");

  ImportOptions grouped = raw_options;
  grouped.layout = "grouped";
  grouped.layer_group = "blk{}";
  grouped.q_name = "q_states";
  grouped.k_name = "k_states";
  grouped.v_name = "v_states";
  grouped.axes = "htd";
  grouped.num_layers = 3;
  grouped.num_q_heads = kHq;
  grouped.num_kv_heads = kHkv;
  grouped.head_dim = kD;
  const std::string b = testing::TempDir() + "/import_grouped.h5";
  import_raw_files({write_grouped("g0.h5"), write_grouped("g1.h5")}, b, grouped, "{}");

  DumpReader ra(a), rb(b);
  EXPECT_EQ(ra.info().layers, std::vector<int>({0, 2}));
  EXPECT_EQ(ra.info().sequence_offsets, std::vector<int64_t>({0, kT, 2 * kT}));
  for (int layer : {0, 2}) {
    LayerActivations x = ra.read_layer(layer), y = rb.read_layer(layer);
    EXPECT_EQ(x.q, y.q);
    EXPECT_EQ(x.k, y.k);
    EXPECT_EQ(x.v, y.v);
    // Token 13 = token 3 of the second sequence; exact in float16 (few significant bits).
    EXPECT_EQ(x.k[(13 * kHkv + 1) * kD + 2], value_of('k', layer, 3, 1, 2));
  }
}

TEST(Import, TokenRangeLayersAndQueriesKeptLast) {
  ImportOptions options;
  options.quiet = true;
  options.layers = {2};
  options.token_begin = 2;
  options.token_end = 9;
  options.queries_kept_last = 3;
  const std::string out = testing::TempDir() + "/import_range.h5";
  import_raw_files({write_raw("r2.h5")}, out, options, "{}");
  DumpReader r(out);
  EXPECT_EQ(r.info().layers, std::vector<int>({2}));
  EXPECT_EQ(r.info().tokens, 7);
  EXPECT_EQ(r.info().queries_kept_last, 3);
  LayerActivations a = r.read_layer(2);
  EXPECT_EQ(a.k[0], value_of('k', 2, 2, 0, 0));
  EXPECT_EQ(a.q[(3 * kHq) * kD], 0.0f);                          // token 5 of the file: dropped query
  EXPECT_EQ(a.q[(4 * kHq) * kD + 1], value_of('q', 2, 6, 0, 1));  // token 6: kept (last 3 of [2, 9))
}

TEST(Import, RefusesMissingLayerAndBadGroupPattern) {
  ImportOptions options;
  options.quiet = true;
  options.layers = {1};
  EXPECT_THROW(import_raw_files({write_raw("r3.h5")}, testing::TempDir() + "/x.h5", options, "{}"), Error);
  ImportOptions grouped;
  grouped.layout = "grouped";
  grouped.layer_group = "blk";
  grouped.num_layers = 3;
  grouped.num_q_heads = kHq;
  grouped.num_kv_heads = kHkv;
  grouped.head_dim = kD;
  EXPECT_THROW(import_raw_files({write_grouped("g2.h5")}, testing::TempDir() + "/y.h5", grouped, "{}"), Error);
}

}  // namespace
}  // namespace oscar
