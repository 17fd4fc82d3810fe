// Dump format tests: round trip in each dtype, chunking, and the errors bad files produce.
#include "io/dump.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "capture/synthetic.h"
#include "common/error.h"
#include "common/float16.h"
#include "io/hdf5.h"

namespace oscar {
namespace {

DumpInfo small_info(StorageType dtype, int64_t tokens = 37) {
  DumpInfo info;
  info.geometry = {1, 4, 2, 8, true};
  info.layers = {0};
  info.sequence_offsets = {0, 20, tokens};
  info.dtype = dtype;
  info.model = "test";
  return info;
}

LayerActivations ramp_layer(const DumpInfo& info) {
  LayerActivations a;
  a.tokens = info.sequence_offsets.back();
  const auto& g = info.geometry;
  for (int64_t i = 0; i < a.tokens * g.num_q_heads * g.head_dim; ++i) a.q.push_back(0.25f * static_cast<float>(i % 97) - 3.0f);
  for (int64_t i = 0; i < a.tokens * g.num_kv_heads * g.head_dim; ++i) {
    a.k.push_back(static_cast<float>(i % 13) * 0.5f);
    a.v.push_back(-static_cast<float>(i % 7) * 0.125f);
  }
  return a;
}

TEST(Dump, RoundTripEachDtype) {
  for (auto dtype : {StorageType::float32, StorageType::float16, StorageType::bfloat16}) {
    const std::string path = testing::TempDir() + "/roundtrip.h5";
    DumpInfo info = small_info(dtype);
    LayerActivations a = ramp_layer(info);
    DumpWriter writer(path, info);
    writer.write_layer(a);
    writer.finish();
    DumpReader reader(path);
    EXPECT_EQ(reader.info().tokens, 37);
    EXPECT_EQ(reader.info().num_sequences(), 2);
    EXPECT_EQ(reader.info().dtype, dtype);
    LayerActivations b = reader.read_layer(0, 5, 20);
    ASSERT_EQ(b.q.size(), 20u * 4 * 8);
    // The ramps are exact in every dtype (multiples of 1/8 with few significant bits).
    for (size_t i = 0; i < b.q.size(); ++i) EXPECT_EQ(b.q[i], a.q[5 * 32 + i]);
    for (size_t i = 0; i < b.k.size(); ++i) EXPECT_EQ(b.k[i], a.k[5 * 16 + i]);
    std::remove(path.c_str());
  }
}

TEST(Dump, Float16RoundsToNearestEven) {
  EXPECT_EQ(round_to_fp16(1.0f + 1.0f / 2048), 1.0f);  // halfway between 1 and 1+2^-10 -> even (1)
  EXPECT_EQ(round_to_fp16(1.0f + 3.0f / 2048), 1.0f + 1.0f / 512);  // 1.5 ulp -> even (2 ulp)
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(round_to_fp16(1e6f)));
  EXPECT_EQ(round_to_fp16(5.9604645e-8f), 5.9604645e-8f);  // smallest subnormal
}

TEST(Dump, NonFiniteValueIsReportedWithFileAndDataset) {
  const std::string path = testing::TempDir() + "/nan.h5";
  DumpInfo info = small_info(StorageType::float32);
  LayerActivations a = ramp_layer(info);
  a.k[16 * 30 + 3] = std::nanf("");
  DumpWriter writer(path, info);
  writer.write_layer(a);
  writer.finish();
  DumpReader reader(path);
  try {
    reader.read_layer(0);
    FAIL() << "NaN not detected";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("/layers/0/k"), std::string::npos) << m;
    EXPECT_NE(m.find("token 30"), std::string::npos) << m;
  }
}

TEST(Dump, WriterLeavesNoFileWhenAbandoned) {
  const std::string path = testing::TempDir() + "/abandoned.h5";
  std::remove(path.c_str());
  {
    DumpWriter writer(path, small_info(StorageType::float32));
  }
  EXPECT_EQ(std::fopen(path.c_str(), "rb"), nullptr);
}

TEST(Dump, SyntheticIsDeterministicAndPlantsStructure) {
  SyntheticSpec spec;
  spec.geometry = {2, 8, 2, 64, true};
  spec.tokens_per_sequence = 300;
  spec.sequences = 2;
  spec.seed = 9;
  LayerActivations a = synthesize_layer(spec, 1), b = synthesize_layer(spec, 1);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.q, b.q);
  // Massive key channels: the largest channel RMS is many times the median.
  std::vector<double> rms(64, 0.0);
  for (size_t i = 0; i < a.k.size(); ++i) rms[i % 64] += a.k[i] * a.k[i];
  std::vector<double> sorted = rms;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::sqrt(sorted[63] / sorted[32]), 3.0);
  // The sink: the first token of a sequence draws more attention than the average token.
  const int d = 64;
  double sink = 0, other = 0;
  for (int64_t t = 200; t < 300; ++t) {
    const float* q = a.q.data() + (t * 8) * d;
    double dots[2] = {0, 0};
    for (int c = 0; c < d; ++c) {
      dots[0] += q[c] * a.k[(0 * 2) * d + c];
      dots[1] += q[c] * a.k[((t - 1) * 2) * d + c];
    }
    sink += dots[0];
    other += dots[1];
  }
  EXPECT_GT(sink, other + 100 * 8.0);
}

}  // namespace
}  // namespace oscar

namespace oscar {
namespace {

TEST(Dump, RowReadsOfAnyLengthConvertAndReportFiniteness) {
  // 16-bit values are read into the float buffer and widened in place, backwards, in blocks of 8 with
  // a scalar tail, checking finiteness on the way: every length (1..40 values) in every stored type
  // must read back exactly, and read_rows must say false exactly when the range holds the Inf.
  const int64_t tokens = 40, inf_at = 29;
  for (auto element : {h5::Element::float32, h5::Element::float16, h5::Element::bfloat16}) {
    std::vector<float> values(tokens);
    for (int64_t i = 0; i < tokens; ++i) values[i] = 0.5f * static_cast<float>(i) - 7.25f;  // exact in all
    values[inf_at] = -INFINITY;
    const std::string path = testing::TempDir() + "/odd_rows.h5";
    h5::File f = h5::File::create(path);
    f.create_dataset("/x", element, {tokens, 1});
    f.write_rows("/x", 0, tokens, values.data());
    for (int64_t count = 1; count <= tokens; ++count)
      for (int64_t first : {int64_t{0}, (tokens - count) / 2, tokens - count}) {
        std::vector<float> back(count + 1, 123.0f);  // one sentinel past the end
        const bool finite = f.read_rows("/x", first, count, back.data());
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(back[i], values[first + i]) << count << " " << i;
        EXPECT_EQ(back[count], 123.0f);
        EXPECT_EQ(finite, !(first <= inf_at && inf_at < first + count)) << h5::element_name(element) << " " << first
                                                                          << "+" << count;
      }
    std::remove(path.c_str());
  }
}

// A dataset of 24 rows of 65536 values: rows of 128-256 KiB, so 4-8 rows per chunk and several
// chunks per read. Values are small multiples of 1/4, exact in every stored type; one is +Inf.
constexpr int64_t kWideRows = 24, kWideRow = 65536, kInfAt = 9 * kWideRow + 4321;

std::vector<float> wide_values() {
  std::vector<float> values(kWideRows * kWideRow);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(static_cast<int>((i * 37) % 509) - 254);
  values[kInfAt] = INFINITY;
  return values;
}

TEST(Dump, ParallelChunkReadsMatchHdf5Reads) {
  // read_rows_parallel decodes the stored chunks itself (inflate, unshuffle, convert) on several
  // threads: same values and finiteness answer as read_rows for every stored type, with and without
  // compression, for ranges inside one chunk, across chunks, and ending in a partial chunk.
  const std::vector<float> values = wide_values();
  const std::pair<int64_t, int64_t> ranges[] = {{0, 24}, {0, 1}, {7, 1}, {7, 9}, {8, 8}, {23, 1}, {5, 19}, {10, 14}};
  for (auto element : {h5::Element::float32, h5::Element::float16, h5::Element::bfloat16})
    for (bool compress : {true, false}) {
      const std::string path = testing::TempDir() + "/wide.h5";
      h5::File f = h5::File::create(path);
      f.create_dataset("/x", element, {kWideRows, 1, kWideRow}, compress);
      f.write_rows("/x", 0, kWideRows, values.data());
      ASSERT_LT(f.chunk_rows("/x"), 10);
      ASSERT_TRUE(f.decodes_chunks("/x"));  // else both calls would be the same HDF5 read
      h5::File::ChunkBuffers buffers;
      for (auto [first, count] : ranges)
        for (int threads : {2, 3}) {
          std::vector<float> expected(count * kWideRow), got(count * kWideRow + 1, 123.0f);
          const bool expected_finite = f.read_rows("/x", first, count, expected.data());
          const bool finite = f.read_rows_parallel("/x", first, count, got.data(), threads, buffers);
          EXPECT_EQ(finite, expected_finite);
          EXPECT_EQ(finite, !(first * kWideRow <= kInfAt && kInfAt < (first + count) * kWideRow));
          for (size_t i = 0; i < expected.size(); ++i)
            ASSERT_EQ(float_bits(got[i]), float_bits(expected[i]))
                << h5::element_name(element) << (compress ? " compressed " : " plain ") << first << "+" << count;
          EXPECT_EQ(got.back(), 123.0f);
        }
      std::remove(path.c_str());
    }
}

TEST(Dump, StoredChunkReadsMatchHdf5AndWidenExactly) {
  // The accumulation's path: plan_stored_rows + decode (chunks in any order) gives the bytes HDF5
  // reads for the same rows (no conversion), and stored_rows_to_double widens them to the float32
  // read's values exactly and reports the first non-finite row, with heads of 16384 values (the
  // vector conversion) and of 4 (its scalar tail).
  const std::vector<float> values = wide_values();
  const std::pair<int64_t, int64_t> ranges[] = {{0, 24}, {7, 1}, {7, 9}, {5, 19}, {10, 14}};
  const std::pair<h5::Element, StorageType> types[] = {{h5::Element::float32, StorageType::float32},
                                                        {h5::Element::float16, StorageType::float16},
                                                        {h5::Element::bfloat16, StorageType::bfloat16}};
  for (auto [element, storage] : types)
    for (bool compress : {true, false}) {
      const std::string path = testing::TempDir() + "/stored.h5";
      h5::File f = h5::File::create(path);
      f.create_dataset("/x", element, {kWideRows, 1, kWideRow}, compress);
      f.write_rows("/x", 0, kWideRows, values.data());
      const size_t bytes = h5::element_bytes(element);
      h5::File::ChunkScratch scratch;
      for (auto [first, count] : ranges) {
        const std::string what = std::string(h5::element_name(element)) + (compress ? " compressed " : " plain ") +
                                 std::to_string(first) + "+" + std::to_string(count);
        std::vector<unsigned char> expected(count * kWideRow * bytes), got(expected.size() + 16, 0xAB);
        f.read_stored_rows("/x", first, count, expected.data());
        auto plan = f.plan_stored_rows("/x", first, count);
        ASSERT_TRUE(plan.has_value()) << what;  // else the chunks would not be ours to decode
        ASSERT_GT(plan->chunks(), 0);
        plan->set_output(got.data());
        for (int c = plan->chunks(); c-- > 0;) plan->decode(c, scratch);
        ASSERT_TRUE(std::equal(expected.begin(), expected.end(), got.begin())) << what;
        EXPECT_EQ(got[expected.size()], 0xAB) << what << ": wrote past the rows";
        std::vector<float> floats(count * kWideRow);
        f.read_rows("/x", first, count, floats.data());
        for (int d : {16384, 4}) {
          const int heads = static_cast<int>(kWideRow / d);
          for (int head = 0; head < heads; ++head) {
            std::vector<double> wide(count * d);
            const int64_t bad = stored_rows_to_double(got, storage, heads, head, d, 0, count, wide.data());
            const int64_t inf_row = kInfAt / kWideRow - first;
            const bool has_inf = head == (kInfAt % kWideRow) / d && inf_row >= 0 && inf_row < count;
            EXPECT_EQ(bad, has_inf ? inf_row : -1) << what << " head " << head;
            for (int64_t t = 0; t < count; ++t)
              for (int c = 0; c < d; ++c)
                ASSERT_EQ(wide[t * d + c], static_cast<double>(floats[t * kWideRow + head * d + c])) << what;
          }
        }
      }
      std::remove(path.c_str());
    }
}

TEST(Dump, StoredRowsOfAContiguousDatasetComeThroughHdf5) {
  // A layout we do not decode ourselves (here contiguous, as other writers may store it): no chunk
  // plan, and read_stored_rows returns the stored bytes of the rows asked for.
  const std::string path = testing::TempDir() + "/contiguous.h5";
  h5::File f = h5::File::create(path);
  const hsize_t dims[3] = {10, 1, 8};
  std::vector<float> values(80);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 7.0f;
  hid_t space = H5Screate_simple(3, dims, nullptr);
  hid_t d = H5Dcreate2(f.id(), "/x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(d);
  H5Sclose(space);
  EXPECT_FALSE(f.plan_stored_rows("/x", 2, 5).has_value());
  std::vector<float> got(5 * 8, -1.0f);
  f.read_stored_rows("/x", 2, 5, got.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], values[2 * 8 + i]);
  std::remove(path.c_str());
}

// The stored bytes and filter mask of every chunk of a dataset.
std::vector<std::pair<uint32_t, std::vector<unsigned char>>> stored_chunks(const h5::File& f, const std::string& name) {
  std::vector<std::pair<uint32_t, std::vector<unsigned char>>> chunks;
  const auto dims = f.shape(name);
  const int64_t rows = f.chunk_rows(name);
  hid_t d = H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT);
  for (int64_t first = 0; first < dims[0]; first += rows) {
    std::vector<hsize_t> offset(dims.size(), 0);
    offset[0] = static_cast<hsize_t>(first);
    hsize_t size = 0;
    EXPECT_GE(H5Dget_chunk_storage_size(d, offset.data(), &size), 0);
    std::pair<uint32_t, std::vector<unsigned char>> chunk{0, std::vector<unsigned char>(size)};
    EXPECT_GE(H5Dread_chunk(d, H5P_DEFAULT, offset.data(), &chunk.first, chunk.second.data()), 0);
    chunks.push_back(std::move(chunk));
  }
  H5Dclose(d);
  return chunks;
}

TEST(Dump, ParallelChunkWritesReadBackThroughHdf5) {
  // write_rows_parallel encodes chunks itself (convert, shuffle, deflate at the dataset's level with
  // zlib's run-length strategy) on several threads: HDF5's own filters must read back what its own
  // writes store, with the same filter masks, including a partial last chunk and chunks too random
  // to compress (deflate output larger).
  std::vector<float> values = wide_values();
  std::vector<float> noise(values.size());
  uint64_t state = 88172645463325252ull;
  for (float& x : noise) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const uint32_t bits = static_cast<uint32_t>(state);
    std::memcpy(&x, &bits, 4);
  }
  const int64_t rows = 22;  // not a multiple of the chunk rows (8 for float16, 4 for float32)
  for (auto element : {h5::Element::float32, h5::Element::float16, h5::Element::bfloat16})
    for (bool compress : {true, false})
      for (const std::vector<float>* source : {&values, &noise}) {
        if (source == &noise && element != h5::Element::float32) continue;  // only float32 keeps random bits
        const std::string what = std::string(h5::element_name(element)) + (compress ? " compressed" : " plain") +
                                 (source == &noise ? " noise" : " values");
        const std::string path = testing::TempDir() + "/wide_write.h5";
        h5::File f = h5::File::create(path);
        f.create_dataset("/serial", element, {rows, 1, kWideRow}, compress);
        f.create_dataset("/parallel", element, {rows, 1, kWideRow}, compress);
        ASSERT_TRUE(f.decodes_chunks("/parallel"));
        f.write_rows("/serial", 0, rows, source->data());
        f.write_rows_parallel("/parallel", 0, rows, source->data(), 3);
        const auto serial = stored_chunks(f, "/serial"), parallel = stored_chunks(f, "/parallel");
        ASSERT_EQ(serial.size(), parallel.size());
        for (size_t c = 0; c < serial.size(); ++c) {
          EXPECT_EQ(parallel[c].first, serial[c].first) << "filter mask of chunk " << c;
          if (!compress) EXPECT_TRUE(parallel[c].second == serial[c].second) << what << " chunk " << c;
        }
        std::vector<float> a(values.size()), b(values.size());
        f.read_rows("/serial", 0, rows, a.data());
        f.read_rows("/parallel", 0, rows, b.data());  // through HDF5's filters
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
        std::remove(path.c_str());
      }
}

TEST(Dump, CorruptCompressedChunkIsAnErrorNamingTheFile) {
  const std::vector<float> values = wide_values();
  const std::string path = testing::TempDir() + "/corrupt_chunk.h5";
  haddr_t address = 0;
  hsize_t size = 0;
  {
    h5::File f = h5::File::create(path);
    f.create_dataset("/x", h5::Element::float16, {kWideRows, 1, kWideRow});
    f.write_rows("/x", 0, kWideRows, values.data());
    hid_t d = H5Dopen2(f.id(), "/x", H5P_DEFAULT);
    const hsize_t offset[3] = {static_cast<hsize_t>(f.chunk_rows("/x")), 0, 0};  // the second chunk
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(d, offset, &mask, &address, &size), 0);
    H5Dclose(d);
  }
  FILE* file = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(file, nullptr);
  std::fseek(file, static_cast<long>(address + size / 2), SEEK_SET);
  const char garbage[64] = "not a deflate stream, not a deflate stream, not a deflate strea";
  std::fwrite(garbage, 1, sizeof garbage, file);
  std::fclose(file);
  h5::File f = h5::File::open_read(path);
  h5::File::ChunkBuffers buffers;
  std::vector<float> out(kWideRows * kWideRow);
  try {
    f.read_rows_parallel("/x", 0, kWideRows, out.data(), 2, buffers);
    FAIL() << "corrupt chunk not detected";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("'/x'"), std::string::npos) << m;
    EXPECT_NE(m.find("does not inflate"), std::string::npos) << m;  // found by our decoder
  }
  std::remove(path.c_str());
}

TEST(Dump, EveryFiniteFloat16ValueReadsBackExactly) {
  // The reader converts float16 with F16C where available: it must agree with the scalar conversion
  // on every finite half value (subnormals included).
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float x = fp16_to_float(static_cast<uint16_t>(bits));
    if (std::isfinite(x)) values.push_back(x);
  }
  const int64_t tokens = static_cast<int64_t>(values.size()) / 16;  // [T, 2 heads, 8]
  values.resize(tokens * 16);
  const std::string path = testing::TempDir() + "/all_halves.h5";
  h5::File f = h5::File::create(path);
  f.create_dataset("/x", h5::Element::float16, {tokens, 2, 8});
  f.write_rows("/x", 0, tokens, values.data());
  std::vector<float> back(values.size());
  f.read_rows("/x", 0, tokens, back.data());
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(float_bits(back[i]), float_bits(values[i])) << i;
}

}  // namespace
}  // namespace oscar
