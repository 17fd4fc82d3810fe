// Reading and writing "oscar.dump" files (see dump.h and docs/formats.md).
#include "io/dump.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cli/atomic_file.h"
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/float16.h"
#include "common/parallel.h"
#include "io/hdf5.h"

namespace oscar {

StorageType parse_storage_type(const std::string& name) {
  if (name == "float32") return StorageType::float32;
  if (name == "float16") return StorageType::float16;
  if (name == "bfloat16") return StorageType::bfloat16;
  fail("unknown dtype '{}' (float32, float16 or bfloat16)", name);
}

const char* storage_type_name(StorageType type) {
  switch (type) {
    case StorageType::float32: return "float32";
    case StorageType::float16: return "float16";
    case StorageType::bfloat16: return "bfloat16";
  }
  return "?";
}

static h5::Element element_of(StorageType type) {
  switch (type) {
    case StorageType::float32: return h5::Element::float32;
    case StorageType::float16: return h5::Element::float16;
    case StorageType::bfloat16: return h5::Element::bfloat16;
  }
  return h5::Element::float32;
}

static std::string layer_path(int layer, const char* name) { return "/layers/" + std::to_string(layer) + "/" + name; }

struct DumpReader::Impl {
  h5::File file;
  h5::File::ChunkBuffers buffers;  // reused by read_layer_into
};

DumpReader::DumpReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  h5::File& f = impl_->file;
  f = h5::File::open_read(path);
  OSCAR_CHECK(f.has_attribute("/", "schema"), "{}: not an oscar dump (no 'schema' attribute; raw hook files need "
              "'oscar-capture import')", path);
  std::string schema = f.attribute_string("/", "schema");
  OSCAR_CHECK(schema == kDumpSchema, "{}: schema is '{}', expected '{}'", path, schema, kDumpSchema);
  int64_t version = f.attribute_int("/", "schema_version");
  OSCAR_CHECK(version >= 1 && version <= kDumpSchemaVersion, "{}: unsupported schema_version {} (this tool reads <= {})",
              path, version, kDumpSchemaVersion);
  ModelGeometry& g = info_.geometry;
  g.num_layers = static_cast<int>(f.attribute_int("/", "num_layers"));
  g.num_q_heads = static_cast<int>(f.attribute_int("/", "num_q_heads"));
  g.num_kv_heads = static_cast<int>(f.attribute_int("/", "num_kv_heads"));
  g.head_dim = static_cast<int>(f.attribute_int("/", "head_dim"));
  g.rope_applied = !f.has_attribute("/", "rope_applied") || f.attribute_int("/", "rope_applied") != 0;
  OSCAR_CHECK(g.num_layers > 0 && g.num_q_heads > 0 && g.num_kv_heads > 0 && g.head_dim > 0,
              "{}: geometry attributes must be positive", path);
  OSCAR_CHECK(g.num_q_heads % g.num_kv_heads == 0, "{}: num_q_heads {} is not divisible by num_kv_heads {}", path,
              g.num_q_heads, g.num_kv_heads);
  if (f.has_attribute("/", "model")) info_.model = f.attribute_string("/", "model");
  if (f.has_attribute("/", "provenance")) info_.provenance_json = f.attribute_string("/", "provenance");
  if (f.has_attribute("/", "queries_kept_last")) info_.queries_kept_last = f.attribute_int("/", "queries_kept_last");

  info_.sequence_offsets = f.read_ints("/sequence_offsets");
  const auto& off = info_.sequence_offsets;
  OSCAR_CHECK(off.size() >= 2 && off[0] == 0, "{}: /sequence_offsets must start at 0 and hold at least 2 entries", path);
  for (size_t i = 1; i < off.size(); ++i)
    OSCAR_CHECK(off[i] > off[i - 1], "{}: /sequence_offsets must increase strictly (entry {})", path, i);
  info_.tokens = off.back();

  for (const auto& name : f.list("/layers")) {
    size_t used = 0;
    int layer = -1;
    try {
      layer = std::stoi(name, &used);
    } catch (const std::exception&) {
    }
    OSCAR_CHECK(layer >= 0 && used == name.size(), "{}: /layers/{} is not a decimal layer index", path, name);
    OSCAR_CHECK(layer < g.num_layers, "{}: /layers/{} exceeds num_layers {}", path, layer, g.num_layers);
    info_.layers.push_back(layer);
  }
  std::sort(info_.layers.begin(), info_.layers.end());
  OSCAR_CHECK(!info_.layers.empty(), "{}: no layers under /layers", path);

  std::optional<h5::Element> dtype;
  for (int layer : info_.layers) {
    const std::pair<const char*, int> parts[] = {{"q", g.num_q_heads}, {"k", g.num_kv_heads}, {"v", g.num_kv_heads}};
    for (auto [name, heads] : parts) {
      std::string ds = layer_path(layer, name);
      auto shape = f.shape(ds);
      OSCAR_CHECK(shape.size() == 3, "{}: {} has rank {}, expected 3 [T, heads, head_dim]", path, ds, shape.size());
      OSCAR_CHECK(shape[0] == info_.tokens && shape[1] == heads && shape[2] == g.head_dim,
                  "{}: {} has shape [{}, {}, {}], expected [{}, {}, {}]", path, ds, shape[0], shape[1], shape[2],
                  info_.tokens, heads, g.head_dim);
      h5::Element e = f.element(ds);
      OSCAR_CHECK(e == h5::Element::float32 || e == h5::Element::float16 || e == h5::Element::bfloat16,
                  "{}: {} has dtype {}, expected float32, float16 or bfloat16", path, ds, h5::element_name(e));
      if (!dtype) dtype = e;
      OSCAR_CHECK(*dtype == e, "{}: {} is {} but other datasets are {}", path, ds, h5::element_name(e),
                  h5::element_name(*dtype));
    }
  }
  info_.dtype = *dtype == h5::Element::float16 ? StorageType::float16
                : *dtype == h5::Element::bfloat16 ? StorageType::bfloat16 : StorageType::float32;
}

DumpReader::~DumpReader() = default;

int64_t DumpReader::chunk_tokens(int layer) const { return impl_->file.chunk_rows(layer_path(layer, "q")); }

LayerActivations DumpReader::read_layer(int layer, int64_t first, int64_t count) const {
  LayerActivations a;
  read_layer_into(a, layer, first, count, 1);
  return a;
}

void DumpReader::read_layer_into(LayerActivations& a, int layer, int64_t first, int64_t count, int threads) const {
  OSCAR_CHECK(std::find(info_.layers.begin(), info_.layers.end(), layer) != info_.layers.end(),
              "{}: layer {} is not in this dump (layers present: {})", path_, layer, fmt::join(info_.layers, ","));
  if (count < 0) count = info_.tokens - first;
  OSCAR_CHECK(first >= 0 && first + count <= info_.tokens, "{}: token range [{}, {}) outside the dump's {} tokens", path_,
              first, first + count, info_.tokens);
  const ModelGeometry& g = info_.geometry;
  a.layer = layer;
  a.first_token = first;
  a.tokens = count;
  // resize keeps the capacity: a buffer read into again needs no new allocation.
  a.q.resize(static_cast<size_t>(count) * g.num_q_heads * g.head_dim);
  a.k.resize(static_cast<size_t>(count) * g.num_kv_heads * g.head_dim);
  a.v.resize(a.k.size());
  const std::pair<const char*, std::vector<float>*> parts[] = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}};
  for (auto [name, data] : parts) {
    std::string ds = layer_path(layer, name);
    // The reader checks finiteness on the way; the slow search for the culprit only runs when needed.
    if (!impl_->file.read_rows_parallel(ds, first, count, data->data(), threads, impl_->buffers)) {
      const size_t per_token = data->size() / std::max<int64_t>(count, 1);
      for (size_t i = 0; i < data->size(); ++i)
        if (!std::isfinite((*data)[i]))
          fail("{}: {} holds a non-finite value ({}) at token {}", path_, ds, (*data)[i],
               first + static_cast<int64_t>(i / per_token));
    }
  }
}

StoredBlockRead DumpReader::plan_stored(int layer, int64_t first, int64_t count, StoredTensors tensors) const {
  OSCAR_CHECK(std::find(info_.layers.begin(), info_.layers.end(), layer) != info_.layers.end(),
              "{}: layer {} is not in this dump (layers present: {})", path_, layer, fmt::join(info_.layers, ","));
  OSCAR_CHECK(first >= 0 && count >= 0 && first + count <= info_.tokens,
              "{}: token range [{}, {}) outside the dump's {} tokens", path_, first, first + count, info_.tokens);
  StoredBlockRead plan;
  plan.reader_ = this;
  plan.file_ = &impl_->file;
  plan.layer_ = layer;
  plan.first_ = first;
  plan.count_ = count;
  for (const char* name : {"q", "k", "v"}) {
    if ((name[0] == 'q') != (tensors == StoredTensors::queries)) continue;
    StoredBlockRead::Part part{layer_path(layer, name), std::nullopt};
    if (count > 0) part.chunks = impl_->file.plan_stored_rows(part.dataset, first, count);
    plan.total_ += part.chunks ? part.chunks->chunks() : 0;
    plan.parts_.push_back(std::move(part));
  }
  return plan;
}

void StoredBlockRead::bind(StoredActivations& a) {
  OSCAR_CHECK(reader_, "StoredBlockRead: no plan to bind");
  const DumpInfo& info = reader_->info();
  const ModelGeometry& g = info.geometry;
  const size_t bytes = info.dtype == StorageType::float32 ? 4 : 2;
  a.layer = layer_;
  a.first_token = first_;
  a.tokens = count_;
  a.dtype = info.dtype;
  const size_t kv_bytes = static_cast<size_t>(count_) * g.num_kv_heads * g.head_dim * bytes;
  for (Part& part : parts_) {
    const char name = part.dataset.back();
    std::vector<unsigned char>& data = name == 'q' ? a.q : name == 'k' ? a.k : a.v;
    const size_t size = name == 'q' ? kv_bytes * g.group_size() : kv_bytes;
    // Buffers only grow (growing zero-fills; a buffer read into again needs neither allocation nor that).
    if (data.size() < size) data.resize(size);
    if (part.chunks)
      part.chunks->set_output(data.data());
    else
      file_->read_stored_rows(part.dataset, first_, count_, data.data());
  }
}

void StoredBlockRead::run(int task, h5::File::ChunkScratch& scratch) const {
  for (const Part& part : parts_) {
    const int chunks = part.chunks ? part.chunks->chunks() : 0;
    if (task < chunks) {
      part.chunks->decode(task, scratch);
      return;
    }
    task -= chunks;
  }
  fail("StoredBlockRead: task {} out of range", task);
}

void DumpReader::read_stored_into(StoredActivations& a, int layer, int64_t first, int64_t count,
                                  StoredTensors tensors, int threads) const {
  StoredBlockRead plan = plan_stored(layer, first, count, tensors);
  plan.bind(a);
  impl_->buffers.resize(std::max<size_t>(impl_->buffers.size(), parallel_workers(plan.tasks(), threads)));
  parallel_for_dynamic(plan.tasks(), threads, [&](int t, int worker) { plan.run(t, impl_->buffers[worker]); });
}

namespace {

// One row of d stored values to float64; whether all are finite.
bool row_to_double_scalar(const unsigned char* src, StorageType dtype, int d, double* out) {
  bool finite = true;
  for (int c = 0; c < d; ++c) {
    float x;
    if (dtype == StorageType::float32) {
      std::memcpy(&x, src + 4 * c, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * c, 2);
      x = dtype == StorageType::float16 ? fp16_to_float(h) : bf16_to_float(h);
    }
    out[c] = x;
    finite &= (x - x) == 0.0f;  // 0 for finite, NaN for Inf/NaN
  }
  return finite;
}

#if defined(__x86_64__)
// float16 rows with the F16C instruction (exact, like the scalar conversion).
__attribute__((target("f16c,avx"))) bool fp16_row_to_double(const unsigned char* src, int d, double* out) {
  const int vectorised = d / 8 * 8;
  __m256d ok = _mm256_setzero_pd();  // accumulates x - x: stays 0 while every value is finite
  for (int c = 0; c < vectorised; c += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c)));
    const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    _mm256_storeu_pd(out + c, low);
    _mm256_storeu_pd(out + c + 4, high);
    ok = _mm256_add_pd(ok, _mm256_add_pd(_mm256_sub_pd(low, low), _mm256_sub_pd(high, high)));
  }
  const bool finite = _mm256_movemask_pd(_mm256_cmp_pd(ok, _mm256_setzero_pd(), _CMP_EQ_OQ)) == 0xF;
  return row_to_double_scalar(src + 2 * vectorised, StorageType::float16, d - vectorised, out + vectorised) && finite;
}
#endif

}  // namespace

int64_t stored_rows_to_double(const std::vector<unsigned char>& tensor, StorageType dtype, int heads, int head, int d,
                              int64_t first, int64_t count, double* out) {
  const size_t bytes = dtype == StorageType::float32 ? 4 : 2;
  OSCAR_CHECK(static_cast<size_t>(first + count) * heads * d * bytes <= tensor.size() && head >= 0 && head < heads,
              "stored_rows_to_double: rows [{}, {}) of head {} outside the block", first, first + count, head);
#if defined(__x86_64__)
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  const bool f16c = dtype == StorageType::float16 && has_f16c;
#else
  const bool f16c = false;
#endif
  int64_t bad = -1;
  for (int64_t t = 0; t < count; ++t) {
    const unsigned char* src = tensor.data() + (static_cast<size_t>(first + t) * heads + head) * d * bytes;
    double* row = out + static_cast<size_t>(t) * d;
#if defined(__x86_64__)
    const bool finite = f16c ? fp16_row_to_double(src, d, row) : row_to_double_scalar(src, dtype, d, row);
#else
    const bool finite = row_to_double_scalar(src, dtype, d, row);
#endif
    if (!finite && bad < 0) bad = first + t;
  }
  return bad;
}

struct DumpWriter::Impl {
  AtomicOutputFile output;
  h5::File file;
  DumpInfo info;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // chunk encoding
  explicit Impl(const std::string& path) : output(path) {}
};

DumpWriter::DumpWriter(const std::string& path, const DumpInfo& info) : impl_(std::make_unique<Impl>(path)) {
  impl_->info = info;
  const ModelGeometry& g = info.geometry;
  OSCAR_CHECK(g.num_q_heads > 0 && g.num_kv_heads > 0 && g.num_q_heads % g.num_kv_heads == 0,
              "{}: num_q_heads {} must be a positive multiple of num_kv_heads {}", path, g.num_q_heads, g.num_kv_heads);
  OSCAR_CHECK(info.sequence_offsets.size() >= 2 && info.sequence_offsets.front() == 0,
              "{}: sequence offsets must start at 0", path);
  h5::File& f = impl_->file;
  f = h5::File::create(impl_->output.temporary_path());
  f.write_schema(kDumpSchema, kDumpSchemaVersion);
  f.set_attribute("/", "num_layers", int64_t{g.num_layers});
  f.set_attribute("/", "num_q_heads", int64_t{g.num_q_heads});
  f.set_attribute("/", "num_kv_heads", int64_t{g.num_kv_heads});
  f.set_attribute("/", "head_dim", int64_t{g.head_dim});
  f.set_attribute("/", "rope_applied", int64_t{g.rope_applied ? 1 : 0});
  f.set_attribute("/", "dtype", std::string(storage_type_name(info.dtype)));
  f.set_attribute("/", "num_sequences", int64_t{info.num_sequences()});
  f.set_attribute("/", "num_tokens", int64_t{info.sequence_offsets.back()});
  f.set_attribute("/", "queries_kept_last", int64_t{info.queries_kept_last});
  f.set_attribute("/", "model", info.model);
  f.set_attribute("/", "provenance", info.provenance_json);
  f.write_ints("/sequence_offsets", {static_cast<int64_t>(info.sequence_offsets.size())}, info.sequence_offsets.data());
  f.create_group("/layers");
}

DumpWriter::~DumpWriter() = default;

void DumpWriter::write_layer(const LayerActivations& layer) {
  const DumpInfo& info = impl_->info;
  const ModelGeometry& g = info.geometry;
  const int64_t tokens = info.sequence_offsets.back();
  OSCAR_CHECK(layer.tokens == tokens && layer.first_token == 0, "layer {}: {} tokens given, dump has {}", layer.layer,
              layer.tokens, tokens);
  const std::pair<const char*, const std::vector<float>*> parts[] = {{"q", &layer.q}, {"k", &layer.k}, {"v", &layer.v}};
  for (auto [name, data] : parts) {
    int heads = name[0] == 'q' ? g.num_q_heads : g.num_kv_heads;
    OSCAR_CHECK(data->size() == static_cast<size_t>(tokens) * heads * g.head_dim, "layer {}: {} has {} values, expected {}",
                layer.layer, name, data->size(), static_cast<size_t>(tokens) * heads * g.head_dim);
    std::string ds = layer_path(layer.layer, name);
    impl_->file.create_dataset(ds, element_of(info.dtype), {tokens, heads, g.head_dim}, info.compressed);
    impl_->file.write_rows_parallel(ds, 0, tokens, data->data(), impl_->threads);
  }
}

void DumpWriter::finish() {
  impl_->file.close();
  impl_->output.commit();
}

}  // namespace oscar
