// HDF5 wrapper (see hdf5.h). float16 uses the same IEEE half type h5py writes, read and written as raw
// bits and converted by lib/common/float16.h, so no HDF5 soft conversion is involved.
#include "io/hdf5.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include "common/error.h"
#include "common/float16.h"
#include "common/parallel.h"
#include "io/inflate.h"

namespace oscar::h5 {
namespace {

// HDF5 prints its own error stack by default; our errors are one line each.
struct SilenceHdf5 {
  SilenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
} silence_hdf5;

Handle half_type() {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return Handle(t, H5Tclose);
}

Handle open_object(const File& file, const std::string& object) {
  hid_t id = H5Oopen(file.id(), object.c_str(), H5P_DEFAULT);
  OSCAR_CHECK(id >= 0, "{}: missing object '{}'", file.path(), object);
  return Handle(id, H5Oclose);
}

Handle open_dataset(const File& file, const std::string& dataset) {
  OSCAR_CHECK(file.exists(dataset), "{}: missing dataset '{}'", file.path(), dataset);
  hid_t id = H5Dopen2(file.id(), dataset.c_str(), H5P_DEFAULT);
  OSCAR_CHECK(id >= 0, "{}: '{}' is not a dataset", file.path(), dataset);
  return Handle(id, H5Dclose);
}

// Elements in one row (along the first axis) of an array of shape dims.
size_t elements_per_row(const std::vector<int64_t>& dims) {
  size_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= static_cast<size_t>(dims[i]);
  return n;
}

}  // namespace

size_t element_bytes(Element e) {
  switch (e) {
    case Element::float64:
    case Element::int64: return 8;
    case Element::float32: return 4;
    case Element::float16:
    case Element::bfloat16: return 2;
    case Element::uint8: return 1;
  }
  return 1;
}

// Widens n 16-bit floats (float16 or bfloat16) at `src` to n float32 at `dst`, which may be the same
// memory (the values in its first 2n bytes: a read then needs no staging buffer); returns whether all
// n are finite (checked on the way). It runs backwards: float i overwrites halves 2i and 2i+1, which
// are either already converted (they lie later) or in the block being converted. Bytes move by
// memcpy and may_alias vector loads, so no strict-aliasing rule is broken.
static bool widen_half_at(const unsigned char* src, unsigned char* dst, size_t i, bool bf16) {
  uint16_t h;
  std::memcpy(&h, src + 2 * i, sizeof h);
  const float f = bf16 ? bf16_to_float(h) : fp16_to_float(h);
  std::memcpy(dst + 4 * i, &f, sizeof f);
  return (f - f) == 0.0f;  // 0 for finite, NaN for Inf/NaN
}

#if defined(__x86_64__)
// float16 with the F16C instruction (exact, like the scalar conversion).
__attribute__((target("f16c,avx"))) static bool widen_fp16_f16c(const unsigned char* src, unsigned char* dst,
                                                                 size_t n) {
  size_t blocks = n / 8;
  bool finite = true;
  for (size_t i = n; i-- > blocks * 8;) finite &= widen_half_at(src, dst, i, false);
  __m256 ok = _mm256_setzero_ps();  // accumulates x - x: stays 0 while every value is finite
  while (blocks-- > 0) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * blocks)));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + 32 * blocks), x);
    ok = _mm256_add_ps(ok, _mm256_sub_ps(x, x));
  }
  return finite && _mm256_movemask_ps(_mm256_cmp_ps(ok, _mm256_setzero_ps(), _CMP_EQ_OQ)) == 0xFF;
}
#endif

static bool widen_halves(const void* halves, size_t n, bool bf16, float* out) {
  const auto* src = static_cast<const unsigned char*>(halves);
  auto* dst = reinterpret_cast<unsigned char*>(out);
#if defined(__x86_64__)
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (!bf16 && has_f16c) return widen_fp16_f16c(src, dst, n);
#endif
  bool finite = true;
  for (size_t i = n; i-- > 0;) finite &= widen_half_at(src, dst, i, bf16);
  return finite;
}

// Whether all n values are finite: x - x is 0 for finite x and NaN otherwise, a branch-free pass the
// compiler vectorises.
static bool all_finite(const float* values, size_t n) {
  bool finite = true;
  for (size_t i = 0; i < n; ++i) finite &= (values[i] - values[i]) == 0.0f;
  return finite;
}

const char* element_name(Element element) {
  switch (element) {
    case Element::float32: return "float32";
    case Element::float64: return "float64";
    case Element::float16: return "float16";
    case Element::bfloat16: return "bfloat16";
    case Element::int64: return "int64";
    case Element::uint8: return "uint8";
  }
  return "?";
}

File File::open_read(const std::string& path) {
  File file;
  file.path_ = path;
  FILE* probe = std::fopen(path.c_str(), "rb");
  OSCAR_CHECK(probe != nullptr, "{}: cannot open (no such file or not readable)", path);
  std::fclose(probe);
  OSCAR_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{}: not an HDF5 file (or truncated)", path);
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  OSCAR_CHECK(id >= 0, "{}: cannot open HDF5 file (truncated or corrupt)", path);
  file.handle_ = Handle(id, H5Fclose);
  return file;
}

File File::create(const std::string& path) {
  File file;
  file.path_ = path;
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  OSCAR_CHECK(id >= 0, "{}: cannot create file", path);
  file.handle_ = Handle(id, H5Fclose);
  return file;
}

bool File::exists(const std::string& object) const {
  if (object == "/") return true;
  std::string prefix;
  size_t start = object[0] == '/' ? 1 : 0;
  while (start <= object.size()) {
    size_t end = object.find('/', start);
    if (end == std::string::npos) end = object.size();
    prefix = object.substr(0, end);
    if (H5Lexists(id(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (H5Oexists_by_name(id(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = end + 1;
  }
  return true;
}

void File::create_group(const std::string& group) {
  if (exists(group)) return;
  Handle plist(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(plist.id(), 1);
  Handle group_plist(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(group_plist.id(), 0);  // no time stamps: identical inputs, identical files
  hid_t id = H5Gcreate2(this->id(), group.c_str(), plist.id(), group_plist.id(), H5P_DEFAULT);
  OSCAR_CHECK(id >= 0, "{}: cannot create group '{}'", path_, group);
  H5Gclose(id);
}

std::vector<std::string> File::list(const std::string& group) const {
  OSCAR_CHECK(exists(group), "{}: missing group '{}'", path_, group);
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  H5Literate_by_name(id(), group.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names, H5P_DEFAULT);
  std::sort(names.begin(), names.end());
  return names;
}

bool File::has_attribute(const std::string& object, const std::string& name) const {
  if (!exists(object)) return false;
  return H5Aexists_by_name(id(), object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

static Handle open_attribute(const File& file, const std::string& object, const std::string& name) {
  OSCAR_CHECK(file.has_attribute(object, name), "{}: missing attribute '{}' on '{}'", file.path(), name, object);
  return Handle(H5Aopen_by_name(file.id(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
}

std::string File::attribute_string(const std::string& object, const std::string& name) const {
  Handle attribute = open_attribute(*this, object, name);
  Handle type(H5Aget_type(attribute.id()), H5Tclose);
  OSCAR_CHECK(H5Tget_class(type.id()) == H5T_STRING, "{}: attribute '{}' on '{}' is not a string", path_, name, object);
  if (H5Tis_variable_str(type.id()) > 0) {
    Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.id(), H5T_VARIABLE);
    H5Tset_cset(memory.id(), H5Tget_cset(type.id()));
    char* text = nullptr;
    OSCAR_CHECK(H5Aread(attribute.id(), memory.id(), &text) >= 0, "{}: cannot read attribute '{}'", path_, name);
    std::string value = text ? text : "";
    Handle space(H5Aget_space(attribute.id()), H5Sclose);
    H5Dvlen_reclaim(memory.id(), space.id(), H5P_DEFAULT, &text);
    return value;
  }
  size_t size = H5Tget_size(type.id());
  std::string value(size, '\0');
  OSCAR_CHECK(H5Aread(attribute.id(), type.id(), value.data()) >= 0, "{}: cannot read attribute '{}'", path_, name);
  value.resize(std::find(value.begin(), value.end(), '\0') - value.begin());
  return value;
}

int64_t File::attribute_int(const std::string& object, const std::string& name) const {
  Handle attribute = open_attribute(*this, object, name);
  Handle type(H5Aget_type(attribute.id()), H5Tclose);
  OSCAR_CHECK(H5Tget_class(type.id()) == H5T_INTEGER, "{}: attribute '{}' on '{}' is not an integer", path_, name,
              object);
  int64_t value = 0;
  OSCAR_CHECK(H5Aread(attribute.id(), H5T_NATIVE_INT64, &value) >= 0, "{}: cannot read attribute '{}'", path_, name);
  return value;
}

double File::attribute_double(const std::string& object, const std::string& name) const {
  Handle attribute = open_attribute(*this, object, name);
  double value = 0;
  OSCAR_CHECK(H5Aread(attribute.id(), H5T_NATIVE_DOUBLE, &value) >= 0, "{}: cannot read attribute '{}' as a number",
              path_, name);
  return value;
}

static void write_attribute(File& file, const std::string& object, const std::string& name, hid_t type,
                            const void* data) {
  Handle target = open_object(file, object);
  if (H5Aexists(target.id(), name.c_str()) > 0) H5Adelete(target.id(), name.c_str());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(target.id(), name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  OSCAR_CHECK(attribute.valid() && H5Awrite(attribute.id(), type, data) >= 0, "{}: cannot write attribute '{}'",
              file.path(), name);
}

void File::set_attribute(const std::string& object, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id(), H5T_VARIABLE);
  H5Tset_cset(type.id(), H5T_CSET_UTF8);
  const char* text = value.c_str();
  write_attribute(*this, object, name, type.id(), &text);
}

void File::set_attribute(const std::string& object, const std::string& name, int64_t value) {
  write_attribute(*this, object, name, H5T_NATIVE_INT64, &value);
}

void File::set_attribute(const std::string& object, const std::string& name, double value) {
  write_attribute(*this, object, name, H5T_NATIVE_DOUBLE, &value);
}

std::vector<int64_t> File::shape(const std::string& dataset) const {
  Handle d = open_dataset(*this, dataset);
  Handle space(H5Dget_space(d.id()), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.id());
  OSCAR_CHECK(rank >= 0, "{}: cannot read the shape of '{}'", path_, dataset);
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

Element File::element(const std::string& dataset) const {
  Handle d = open_dataset(*this, dataset);
  Handle type(H5Dget_type(d.id()), H5Tclose);
  H5T_class_t cls = H5Tget_class(type.id());
  size_t size = H5Tget_size(type.id());
  if (cls == H5T_FLOAT && size == 8) return Element::float64;
  if (cls == H5T_FLOAT && size == 4) return Element::float32;
  if (cls == H5T_FLOAT && size == 2) return Element::float16;
  if (cls == H5T_INTEGER && size == 2 && H5Tget_sign(type.id()) == H5T_SGN_NONE) {
    if (has_attribute(dataset, "dtype") && attribute_string(dataset, "dtype") == "bfloat16") return Element::bfloat16;
    fail("{}: dataset '{}' is uint16 without the attribute dtype=\"bfloat16\"", path_, dataset);
  }
  if (cls == H5T_INTEGER && size == 8) return Element::int64;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type.id()) == H5T_SGN_NONE) return Element::uint8;
  fail("{}: dataset '{}' has an unsupported element type (class {}, {} bytes)", path_, dataset, static_cast<int>(cls),
       size);
}

void File::create_dataset(const std::string& dataset, Element element, const std::vector<int64_t>& shape,
                          bool compress) {
  auto slash = dataset.rfind('/');
  if (slash != std::string::npos && slash > 0) create_group(dataset.substr(0, slash));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(plist.id(), 0);
  size_t row_bytes = element_bytes(element);
  for (size_t i = 1; i < dims.size(); ++i) row_bytes *= dims[i];
  if (!dims.empty() && dims[0] > 0 && row_bytes > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::clamp<hsize_t>((1u << 20) / row_bytes, 1, dims[0]);
    H5Pset_chunk(plist.id(), static_cast<int>(chunk.size()), chunk.data());
    if (compress) {
      H5Pset_shuffle(plist.id());
      H5Pset_deflate(plist.id(), 4);
    }
  }
  Handle half;
  hid_t type = H5T_NATIVE_FLOAT;
  switch (element) {
    case Element::float32: type = H5T_IEEE_F32LE; break;
    case Element::float64: type = H5T_IEEE_F64LE; break;
    case Element::float16: half = half_type(); type = half.id(); break;
    case Element::bfloat16: type = H5T_STD_U16LE; break;
    case Element::int64: type = H5T_STD_I64LE; break;
    case Element::uint8: type = H5T_STD_U8LE; break;
  }
  Handle d(H5Dcreate2(id(), dataset.c_str(), type, space.id(), H5P_DEFAULT, plist.id(), H5P_DEFAULT), H5Dclose);
  OSCAR_CHECK(d.valid(), "{}: cannot create dataset '{}'", path_, dataset);
  d.reset();
  if (element == Element::bfloat16) set_attribute(dataset, "dtype", std::string("bfloat16"));
}

int64_t File::chunk_rows(const std::string& dataset) const {
  Handle d = open_dataset(*this, dataset);
  Handle plist(H5Dget_create_plist(d.id()), H5Pclose);
  auto dims = shape(dataset);
  if (dims.empty()) return 1;
  if (H5Pget_layout(plist.id()) != H5D_CHUNKED) return std::max<int64_t>(dims[0], 1);
  std::vector<hsize_t> chunk(dims.size());
  H5Pget_chunk(plist.id(), static_cast<int>(chunk.size()), chunk.data());
  return static_cast<int64_t>(chunk[0]);
}

// A memory space shaped like a row selection ([count, rest...]): with the same shape as the file
// selection HDF5 copies whole chunks instead of iterating element by element.
static Handle selection_shaped_space(const File& file, const std::string& dataset, int64_t count) {
  auto dims = file.shape(dataset);
  std::vector<hsize_t> memory_dims(dims.begin(), dims.end());
  memory_dims[0] = static_cast<hsize_t>(count);
  return Handle(H5Screate_simple(static_cast<int>(memory_dims.size()), memory_dims.data(), nullptr), H5Sclose);
}

// Selects rows [first, first+count) of a dataset; returns the elements per row.
static int64_t select_rows(const File& file, const std::string& dataset, hid_t space, int64_t first, int64_t count) {
  auto dims = file.shape(dataset);
  OSCAR_CHECK(!dims.empty(), "{}: dataset '{}' is a scalar", file.path(), dataset);
  OSCAR_CHECK(first >= 0 && count >= 0 && first + count <= dims[0], "{}: rows [{}, {}) outside '{}' with {} rows",
              file.path(), first, first + count, dataset, dims[0]);
  std::vector<hsize_t> start(dims.size(), 0), extent(dims.begin(), dims.end());
  start[0] = static_cast<hsize_t>(first);
  extent[0] = static_cast<hsize_t>(count);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr);
  return static_cast<int64_t>(elements_per_row(dims));
}

// Moves rows [first, first+count) between a float32 buffer and the dataset, converting to or from
// its element type (fp16/bf16 as raw bits, converted here with round to nearest even).
bool File::transfer_rows(const std::string& dataset, int64_t first, int64_t count, float* buffer, bool write) const {
  Element e = element(dataset);
  Handle d = open_dataset(*this, dataset);
  Handle space(H5Dget_space(d.id()), H5Sclose);
  int64_t per_row = select_rows(*this, dataset, space.id(), first, count);
  const size_t n = static_cast<size_t>(per_row * count);
  if (n == 0) return true;
  bool finite = true;
  Handle memory_space = selection_shaped_space(*this, dataset, count);
  herr_t status = -1;
  if (e == Element::float32 || e == Element::float64) {
    status = write ? H5Dwrite(d.id(), H5T_NATIVE_FLOAT, memory_space.id(), space.id(), H5P_DEFAULT, buffer)
                   : H5Dread(d.id(), H5T_NATIVE_FLOAT, memory_space.id(), space.id(), H5P_DEFAULT, buffer);
    if (!write && status >= 0) finite = all_finite(buffer, n);
  } else if (e == Element::float16 || e == Element::bfloat16) {
    const bool half = e == Element::float16;
    Handle half_file_type = half_type();
    const hid_t memory_type = half ? half_file_type.id() : H5T_NATIVE_UINT16;
    if (write) {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i) bits[i] = half ? float_to_fp16(buffer[i]) : float_to_bf16(buffer[i]);
      status = H5Dwrite(d.id(), memory_type, memory_space.id(), space.id(), H5P_DEFAULT, bits.data());
    } else {
      // The 16-bit values land in the front half of the float buffer and are widened in place.
      status = H5Dread(d.id(), memory_type, memory_space.id(), space.id(), H5P_DEFAULT, buffer);
      if (status >= 0) finite = widen_halves(buffer, n, !half, buffer);
    }
  } else {
    fail("{}: dataset '{}' holds {} where floating-point activations are expected", path_, dataset, element_name(e));
  }
  OSCAR_CHECK(status >= 0, "{}: cannot {} rows [{}, {}) of '{}'{}", path_, write ? "write" : "read", first,
              first + count, dataset, write ? "" : " (truncated or corrupt file)");
  return finite;
}

bool File::read_rows(const std::string& dataset, int64_t first, int64_t count, float* out) const {
  return transfer_rows(dataset, first, count, out, false);
}

// How a dataset's chunks are stored, when we can encode and decode them ourselves: chunked along
// rows only (whole rows per chunk), every chunk filtered (no unfiltered partial chunks), filters
// shuffle and/or deflate in the order create_dataset sets them, the default fill value (0), and a
// little-endian element layout we convert ourselves (IEEE float32, IEEE float16, or bfloat16 bits).
struct ChunkCodec {
  hsize_t rows = 0;       // rows per chunk
  bool shuffled = false;  // filter 0
  bool deflated = false;  // the last filter
  int level = 0;          // deflate level
};

static std::optional<ChunkCodec> chunk_codec(hid_t dataset, Element e, const std::vector<int64_t>& dims) {
  if (e != Element::float32 && e != Element::float16 && e != Element::bfloat16) return std::nullopt;
  Handle plist(H5Dget_create_plist(dataset), H5Pclose);
  if (H5Pget_layout(plist.id()) != H5D_CHUNKED) return std::nullopt;
  std::vector<hsize_t> chunk(dims.size());
  if (H5Pget_chunk(plist.id(), static_cast<int>(chunk.size()), chunk.data()) != static_cast<int>(dims.size()))
    return std::nullopt;
  for (size_t i = 1; i < dims.size(); ++i)
    if (chunk[i] != static_cast<hsize_t>(dims[i])) return std::nullopt;
  ChunkCodec codec;
  codec.rows = chunk[0];
  unsigned options = 0;
  if (H5Pget_chunk_opts(plist.id(), &options) < 0 || (options & H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS))
    return std::nullopt;
  H5D_fill_value_t fill = H5D_FILL_VALUE_ERROR;
  if (H5Pfill_value_defined(plist.id(), &fill) < 0 || fill == H5D_FILL_VALUE_USER_DEFINED) return std::nullopt;
  const int filters = H5Pget_nfilters(plist.id());
  for (int f = 0; f < filters; ++f) {
    unsigned flags = 0, config = 0, values[8] = {};
    size_t count = 8;
    const H5Z_filter_t id = H5Pget_filter2(plist.id(), static_cast<unsigned>(f), &flags, &count, values, 0, nullptr,
                                           &config);
    if (id == H5Z_FILTER_SHUFFLE && f == 0) {
      codec.shuffled = true;
    } else if (id == H5Z_FILTER_DEFLATE && f == filters - 1 && count >= 1) {
      codec.deflated = true;
      codec.level = static_cast<int>(values[0]);
    } else {
      return std::nullopt;
    }
  }
  Handle type(H5Dget_type(dataset), H5Tclose);
  if (H5Tget_order(type.id()) != H5T_ORDER_LE) return std::nullopt;
  if (e == Element::float32) return H5Tequal(type.id(), H5T_IEEE_F32LE) > 0 ? std::optional(codec) : std::nullopt;
  if (e == Element::float16) {
    size_t sign = 0, exponent_pos = 0, exponent_bits = 0, mantissa_pos = 0, mantissa_bits = 0;
    H5Tget_fields(type.id(), &sign, &exponent_pos, &exponent_bits, &mantissa_pos, &mantissa_bits);
    const bool ieee_half = sign == 15 && exponent_pos == 10 && exponent_bits == 5 && mantissa_pos == 0 &&
                           mantissa_bits == 10 && H5Tget_ebias(type.id()) == 15;
    return ieee_half ? std::optional(codec) : std::nullopt;
  }
  return codec;  // bfloat16: uint16 bits
}

bool File::decodes_chunks(const std::string& dataset) const {
  Handle d = open_dataset(*this, dataset);
  return chunk_codec(d.id(), element(dataset), shape(dataset)).has_value();
}

bool File::read_rows_parallel(const std::string& dataset, int64_t first, int64_t count, float* out, int threads,
                              ChunkBuffers& buffers) const {
  if (threads <= 1 || count <= 0) return read_rows(dataset, first, count, out);
  const std::optional<ChunkedRead> plan = plan_rows(dataset, first, count, out, true);
  if (!plan) return read_rows(dataset, first, count, out);
  buffers.resize(std::max<size_t>(buffers.size(), parallel_workers(plan->chunks(), threads)));
  std::vector<char> finite(plan->chunks(), 1);
  parallel_for_dynamic(plan->chunks(), threads, [&](int c, int worker) { finite[c] = plan->decode(c, buffers[worker]); });
  return std::all_of(finite.begin(), finite.end(), [](char f) { return f != 0; });
}

std::optional<File::ChunkedRead> File::plan_stored_rows(const std::string& dataset, int64_t first,
                                                        int64_t count) const {
  return plan_rows(dataset, first, count, nullptr, false);
}

// Rows as stored, through HDF5 (memory type = the stored element type).
void File::read_stored_rows(const std::string& dataset, int64_t first, int64_t count, void* out) const {
  const Element e = element(dataset);
  OSCAR_CHECK(e == Element::float32 || e == Element::float16 || e == Element::bfloat16,
              "{}: dataset '{}' holds {} where floating-point activations are expected", path_, dataset,
              element_name(e));
  Handle d = open_dataset(*this, dataset);
  Handle space(H5Dget_space(d.id()), H5Sclose);
  if (select_rows(*this, dataset, space.id(), first, count) * count == 0) return;
  Handle memory_space = selection_shaped_space(*this, dataset, count);
  Handle half = half_type();
  const hid_t memory_type = e == Element::float32 ? H5T_NATIVE_FLOAT
                            : e == Element::float16 ? half.id() : H5T_NATIVE_UINT16;
  OSCAR_CHECK(H5Dread(d.id(), memory_type, memory_space.id(), space.id(), H5P_DEFAULT, out) >= 0,
              "{}: cannot read rows [{}, {}) of '{}' (truncated or corrupt file)", path_, first, first + count, dataset);
}

std::optional<File::ChunkedRead> File::plan_rows(const std::string& dataset, int64_t first, int64_t count, void* out,
                                                 bool convert) const {
  const Element e = element(dataset);
  Handle d = open_dataset(*this, dataset);
  const std::vector<int64_t> dims = shape(dataset);
  OSCAR_CHECK(!dims.empty() && first >= 0 && count >= 0 && first + count <= dims[0],
              "{}: rows [{}, {}) outside '{}' with {} rows", path_, first, first + count, dataset,
              dims.empty() ? 0 : dims[0]);
  const std::optional<ChunkCodec> codec = chunk_codec(d.id(), e, dims);
  if (!codec) return std::nullopt;
  ChunkedRead plan;
  plan.path_ = path_;
  plan.dataset_ = dataset;
  plan.chunk_rows_ = codec->rows;
  plan.shuffled_ = codec->shuffled;
  plan.deflated_ = codec->deflated;
  plan.convert_ = convert;
  plan.bf16_ = e == Element::bfloat16;
  plan.bytes_ = element_bytes(e);
  plan.per_row_ = elements_per_row(dims);
  plan.chunk_elements_ = plan.chunk_rows_ * plan.per_row_;
  plan.first_ = first;
  plan.count_ = count;
  plan.out_ = out;
  plan.first_chunk_ = first / static_cast<int64_t>(plan.chunk_rows_);
  const int chunks =
      count == 0 ? 0 : static_cast<int>((first + count - 1) / static_cast<int64_t>(plan.chunk_rows_) - plan.first_chunk_ + 1);

  // Where each chunk's stored bytes lie: HDF5 metadata, looked up on this thread (HDF5 is not
  // thread-safe). The bytes themselves are read with pread by decode(): a file opened with HDF5's
  // default (sec2) driver is a plain file, chunk addresses counted from the end of its user block. A
  // file this process is writing is flushed first, so that the bytes are on disk.
  unsigned intent = 0;
  if (H5Fget_intent(id(), &intent) >= 0 && (intent & H5F_ACC_RDWR)) H5Fflush(id(), H5F_SCOPE_LOCAL);
  Handle access(H5Fget_access_plist(id()), H5Pclose);
  if (H5Pget_driver(access.id()) != H5FD_SEC2) return std::nullopt;
  Handle creation(H5Fget_create_plist(id()), H5Pclose);
  H5Pget_userblock(creation.id(), &plan.user_block_);
  plan.address_.resize(chunks);
  plan.stored_.resize(chunks);
  plan.skipped_.assign(chunks, 0);
  for (int c = 0; c < chunks; ++c) {
    std::vector<hsize_t> offset(dims.size(), 0);
    offset[0] = static_cast<hsize_t>(plan.first_chunk_ + c) * plan.chunk_rows_;
    OSCAR_CHECK(H5Dget_chunk_info_by_coord(d.id(), offset.data(), &plan.skipped_[c], &plan.address_[c],
                                           &plan.stored_[c]) >= 0,
                "{}: cannot locate the chunk at row {} of '{}' (corrupt file)", path_, offset[0], dataset);
    if (plan.address_[c] == HADDR_UNDEF || plan.stored_[c] == 0)
      return std::nullopt;  // unwritten chunk: HDF5 supplies the fill value
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  OSCAR_CHECK(fd >= 0, "{}: cannot open for reading", path_);
  plan.fd_ = std::shared_ptr<const int>(new int(fd), [](const int* f) {
    ::close(*f);
    delete f;
  });
  return plan;
}

// Reads chunk c's stored bytes, inflates and unshuffles the rows wanted, and stores them as they are
// or converted to float32.
bool File::ChunkedRead::decode(int c, ChunkScratch& scratch) const {
  const int64_t chunk_first = (first_chunk_ + c) * static_cast<int64_t>(chunk_rows_);
  // Rows of this chunk inside [first, first + count), as an element range of the chunk.
  const int64_t row_begin = std::max(first_, chunk_first);
  const int64_t row_end = std::min(first_ + count_, chunk_first + static_cast<int64_t>(chunk_rows_));
  const size_t begin = static_cast<size_t>(row_begin - chunk_first) * per_row_;
  const size_t n = static_cast<size_t>(row_end - row_begin) * per_row_;
  const size_t out_offset = static_cast<size_t>(row_begin - first_) * per_row_;
  // Reads `length` stored bytes of the chunk from byte `offset` on.
  auto read_chunk = [&](unsigned char* into, size_t offset, size_t length) {
    size_t done = 0;
    while (done < length) {
      const ssize_t got = ::pread(*fd_, into + done, length - done,
                                  static_cast<off_t>(user_block_ + address_[c] + offset + done));
      if (got < 0 && errno == EINTR) continue;
      OSCAR_CHECK(got > 0, "{}: the chunk at row {} of '{}' lies past the end of the file (truncated file)", path_,
                  chunk_first, dataset_);
      done += static_cast<size_t>(got);
    }
  };
  const bool inflate = deflated_ && !(skipped_[c] & (1u << (shuffled_ ? 1 : 0)));
  const bool unshuffle = shuffled_ && !(skipped_[c] & 1u);
  OSCAR_CHECK(inflate || stored_[c] == chunk_elements_ * bytes_,
              "{}: the chunk at row {} of '{}' holds {} bytes, not {}", path_, chunk_first, dataset_, stored_[c],
              chunk_elements_ * bytes_);
  unsigned char* const stored_out = static_cast<unsigned char*>(out_) + out_offset * bytes_;
  if (!convert_ && !inflate && !unshuffle) {  // stored bytes wanted and stored plainly: no staging
    read_chunk(stored_out, begin * bytes_, n * bytes_);
    return true;
  }
  std::vector<unsigned char>& packed = scratch.packed;
  packed.resize(stored_[c]);
  read_chunk(packed.data(), 0, packed.size());
  const unsigned char* plain = packed.data();
  if (inflate) {
    std::vector<unsigned char>& inflated = scratch.plain;
    inflated.resize(chunk_elements_ * bytes_);
    OSCAR_CHECK(inflate_zlib(packed.data(), packed.size(), inflated.data(), inflated.size()),
                "{}: the chunk at row {} of '{}' does not inflate to {} bytes (corrupt file)", path_, chunk_first,
                dataset_, inflated.size());
    plain = inflated.data();
  }
  const unsigned char* src = plain + begin * bytes_;
  if (unshuffle) {
    // Shuffled: byte b of element i is at b * chunk_elements + i; unshuffled straight into place
    // when the stored bytes are wanted.
    std::vector<unsigned char>& ordered = scratch.unshuffled;
    unsigned char* into = stored_out;
    if (convert_) {
      ordered.resize(n * bytes_);
      into = ordered.data();
    }
    const unsigned char* plane = plain + begin;
    if (bytes_ == 2) {  // the common case: 16 elements a step (SSE2 is part of x86-64)
      size_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(plane + i));
        const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(plane + chunk_elements_ + i));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(into + 2 * i), _mm_unpacklo_epi8(low, high));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(into + 2 * i + 16), _mm_unpackhi_epi8(low, high));
      }
      for (; i < n; ++i) {
        const uint16_t value = static_cast<uint16_t>(plane[i] | plane[chunk_elements_ + i] << 8);
        std::memcpy(into + 2 * i, &value, 2);
      }
    } else {
      for (size_t b = 0; b < bytes_; ++b)
        for (size_t i = 0; i < n; ++i) into[i * bytes_ + b] = plane[b * chunk_elements_ + i];
    }
    if (!convert_) return true;
    src = into;
  }
  if (!convert_) {
    std::memcpy(stored_out, src, n * bytes_);
    return true;
  }
  float* dst = static_cast<float*>(out_) + out_offset;
  if (bytes_ == 2) return widen_halves(src, n, bf16_, dst);
  std::memcpy(dst, src, n * sizeof(float));
  return all_finite(dst, n);
}

// Whether Huffman coding could save at most ~3 % of these bytes: their order-0 entropy is at least
// 7.76 bits per byte (the low bytes of activations are near random).
static bool incompressible(const unsigned char* p, size_t n) {
  uint32_t count[256] = {};
  for (size_t i = 0; i < n; ++i) ++count[p[i]];
  double bits = 0;
  for (uint32_t c : count)
    if (c) bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / static_cast<double>(n));
  return bits >= 0.97 * 8.0 * static_cast<double>(n);
}

// A chunk as HDF5's deflate filter stores it (one zlib stream, into a buffer of ceil(1.001 n) + 12
// bytes), written for fast decoding. The run-length strategy: activations have few repeated strings,
// so the string search of the default strategy buys nothing (shuffled 16-bit activations come out
// at 85 % instead of 86 % of the raw size, 2-4x faster). A shuffled chunk goes plane by plane (byte b
// of every element): the near-random planes as stored blocks (copied when read), the others in
// Huffman blocks of up to 32K symbols (memLevel 9: half as many code tables to build when read).
static std::vector<unsigned char> deflate_chunk(const std::vector<unsigned char>& plain, int level, size_t planes,
                                                const std::string& path, const std::string& dataset) {
  std::vector<unsigned char> packed(
      static_cast<size_t>(std::ceil(static_cast<double>(plain.size()) * static_cast<double>(1.001f))) + 12);
  z_stream z{};
  int status = deflateInit2(&z, level, Z_DEFLATED, 15, 9, Z_RLE);
  if (status == Z_OK) {
    z.next_out = packed.data();
    z.avail_out = static_cast<uInt>(packed.size());
    const size_t plane_bytes = plain.size() / planes;
    for (size_t b = 0; b < planes && status == Z_OK; ++b) {
      const unsigned char* plane = plain.data() + b * plane_bytes;
      const size_t n = b + 1 == planes ? plain.size() - b * plane_bytes : plane_bytes;
      if (planes > 1) status = deflateParams(&z, incompressible(plane, n) ? 0 : level, Z_RLE);
      if (status != Z_OK) break;
      z.next_in = const_cast<unsigned char*>(plane);
      z.avail_in = static_cast<uInt>(n);
      status = deflate(&z, b + 1 == planes ? Z_FINISH : Z_NO_FLUSH);
    }
    packed.resize(z.total_out);
    deflateEnd(&z);
  }
  OSCAR_CHECK(status == Z_STREAM_END, "{}: cannot compress a chunk of '{}' (zlib error {})", path, dataset, status);
  return packed;
}

void File::write_rows_parallel(const std::string& dataset, int64_t first, int64_t count, const float* data,
                               int threads) {
  const Element e = element(dataset);
  Handle d = open_dataset(*this, dataset);
  const std::vector<int64_t> dims = shape(dataset);
  const std::optional<ChunkCodec> codec = chunk_codec(d.id(), e, dims);
  // Whole chunks only (the last may end at the end of the dataset): HDF5 would otherwise merge the
  // rows into chunks already stored.
  const int64_t rows = codec ? static_cast<int64_t>(codec->rows) : 0;
  if (threads <= 1 || count <= 0 || !codec || first % rows != 0 || (count % rows != 0 && first + count != dims[0]))
    return write_rows(dataset, first, count, data);

  const size_t bytes = element_bytes(e);
  const size_t per_row = elements_per_row(dims);
  const size_t chunk_elements = static_cast<size_t>(rows) * per_row, chunk_bytes = chunk_elements * bytes;
  const int chunks = static_cast<int>((count + rows - 1) / rows);
  // Batches of chunks bound the memory: encoded on the threads, then stored in order on this one.
  const int batch = std::max(1, threads) * 8;
  std::vector<std::vector<unsigned char>> encoded(std::min(batch, chunks));
  const int workers = parallel_workers(static_cast<int>(encoded.size()), threads);
  std::vector<std::vector<unsigned char>> plain(workers), shuffled(workers);
  for (int begin = 0; begin < chunks; begin += batch) {
    const int n = std::min(batch, chunks - begin);
    parallel_for(n, threads, [&](int i) {
      const int64_t row_begin = first + static_cast<int64_t>(begin + i) * rows;
      const size_t valid = static_cast<size_t>(std::min(rows, first + count - row_begin)) * per_row;
      const float* src = data + static_cast<size_t>(row_begin - first) * per_row;
      // Elements past the dataset's end keep the fill value 0, as HDF5 writes a partial chunk.
      std::vector<unsigned char>& raw = plain[i % workers];
      raw.assign(chunk_bytes, 0);
      if (bytes == 4) {
        std::memcpy(raw.data(), src, valid * 4);
      } else {
        for (size_t k = 0; k < valid; ++k) {
          const uint16_t h = e == Element::float16 ? float_to_fp16(src[k]) : float_to_bf16(src[k]);
          std::memcpy(raw.data() + 2 * k, &h, 2);
        }
      }
      const std::vector<unsigned char>* stage = &raw;
      if (codec->shuffled) {  // byte b of element k goes to b * chunk_elements + k
        std::vector<unsigned char>& out = shuffled[i % workers];
        out.resize(chunk_bytes);
        for (size_t b = 0; b < bytes; ++b)
          for (size_t k = 0; k < chunk_elements; ++k) out[b * chunk_elements + k] = raw[k * bytes + b];
        stage = &out;
      }
      if (!codec->deflated) {
        encoded[i] = *stage;
        return;
      }
      encoded[i] = deflate_chunk(*stage, codec->level, codec->shuffled ? bytes : 1, path_, dataset);
    });
    for (int i = 0; i < n; ++i) {
      std::vector<hsize_t> offset(dims.size(), 0);
      offset[0] = static_cast<hsize_t>(first + static_cast<int64_t>(begin + i) * rows);
      OSCAR_CHECK(H5Dwrite_chunk(d.id(), H5P_DEFAULT, 0, offset.data(), encoded[i].size(),
                                 encoded[i].data()) >= 0,
                  "{}: cannot write the chunk at row {} of '{}'", path_, offset[0], dataset);
    }
  }
}

void File::write_rows(const std::string& dataset, int64_t first, int64_t count, const float* data) {
  transfer_rows(dataset, first, count, const_cast<float*>(data), true);  // not written to when writing
}

void File::write_schema(const std::string& schema, int64_t version) {
  set_attribute("/", "schema", schema);
  set_attribute("/", "schema_version", version);
}

void File::check_schema(const std::string& schema, int64_t max_version) const {
  OSCAR_CHECK(has_attribute("/", "schema") && attribute_string("/", "schema") == schema,
              "{}: not an {} file (the root attribute 'schema' must be '{}')", path_, schema, schema);
  const int64_t version = attribute_int("/", "schema_version");
  OSCAR_CHECK(version >= 1 && version <= max_version, "{}: unsupported schema_version {} (this tool reads <= {})",
              path_, version, max_version);
}

// A whole dataset read into memory type `memory_type`; `accepts` says which stored elements convert.
template <typename T>
static std::vector<T> read_whole(const File& file, const std::string& dataset, hid_t memory_type,
                                 bool (*accepts)(Element), const char* expected) {
  auto dims = file.shape(dataset);
  size_t n = 1;
  for (auto x : dims) n *= static_cast<size_t>(x);
  std::vector<T> values(n);
  if (n == 0) return values;
  const Element e = file.element(dataset);
  OSCAR_CHECK(accepts(e), "{}: dataset '{}' is {}, expected {}", file.path(), dataset, element_name(e), expected);
  Handle d = open_dataset(file, dataset);
  OSCAR_CHECK(H5Dread(d.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0,
              "{}: cannot read '{}' (truncated or corrupt file)", file.path(), dataset);
  return values;
}

std::vector<double> File::read_doubles(const std::string& dataset) const {
  return read_whole<double>(*this, dataset, H5T_NATIVE_DOUBLE,
                            [](Element e) { return e == Element::float32 || e == Element::float64; }, "floating point");
}

std::vector<int64_t> File::read_ints(const std::string& dataset) const {
  return read_whole<int64_t>(*this, dataset, H5T_NATIVE_INT64, [](Element e) { return e == Element::int64; }, "int64");
}

void File::write_whole(const std::string& dataset, const std::vector<int64_t>& shape, hid_t file_type,
                       hid_t memory_type, const void* data) {
  auto slash = dataset.rfind('/');
  if (slash != std::string::npos && slash > 0) create_group(dataset.substr(0, slash));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(plist.id(), 0);
  Handle d(H5Dcreate2(id(), dataset.c_str(), file_type, space.id(), H5P_DEFAULT, plist.id(), H5P_DEFAULT), H5Dclose);
  OSCAR_CHECK(d.valid(), "{}: cannot create dataset '{}'", path_, dataset);
  OSCAR_CHECK(H5Dwrite(d.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "{}: cannot write '{}'", path_,
              dataset);
}

void File::write_doubles(const std::string& dataset, const std::vector<int64_t>& shape, const double* data) {
  write_whole(dataset, shape, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, data);
}
void File::write_floats(const std::string& dataset, const std::vector<int64_t>& shape, const float* data) {
  write_whole(dataset, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data);
}
void File::write_ints(const std::string& dataset, const std::vector<int64_t>& shape, const int64_t* data) {
  write_whole(dataset, shape, H5T_STD_I64LE, H5T_NATIVE_INT64, data);
}

}  // namespace oscar::h5
