// A small RAII layer over the HDF5 C API: files, groups, attributes, and row-chunked datasets whose
// first axis is tokens. Every failure is an oscar::Error naming the file and the object.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace oscar::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

// Element type of a stored array.
enum class Element { float32, float64, float16, bfloat16, int64, uint8 };

class File {
 public:
  static File open_read(const std::string& path);  // error if missing or not HDF5
  static File create(const std::string& path);     // truncates
  const std::string& path() const { return path_; }
  hid_t id() const { return handle_.id(); }
  void close() { handle_.reset(); }

  bool exists(const std::string& object) const;  // "/layers/3/k" style, every level checked
  void create_group(const std::string& group);    // creates missing parents too
  std::vector<std::string> list(const std::string& group) const;  // child names, sorted

  // Attributes on any object ("/" for the root).
  bool has_attribute(const std::string& object, const std::string& name) const;
  std::string attribute_string(const std::string& object, const std::string& name) const;
  int64_t attribute_int(const std::string& object, const std::string& name) const;
  double attribute_double(const std::string& object, const std::string& name) const;
  void set_attribute(const std::string& object, const std::string& name, const std::string& value);
  void set_attribute(const std::string& object, const std::string& name, int64_t value);
  void set_attribute(const std::string& object, const std::string& name, double value);

  // Root attributes schema / schema_version of our formats; check fails with one line naming the file.
  void write_schema(const std::string& schema, int64_t version);
  void check_schema(const std::string& schema, int64_t max_version) const;

  // Datasets.
  std::vector<int64_t> shape(const std::string& dataset) const;
  Element element(const std::string& dataset) const;  // bfloat16 = uint16 with attribute dtype="bfloat16"
  // Creates [rows, rest...] chunked along rows (chunk <= 1 MiB), gzip + shuffle when compress.
  void create_dataset(const std::string& dataset, Element element, const std::vector<int64_t>& shape,
                      bool compress = true);
  int64_t chunk_rows(const std::string& dataset) const;  // rows per chunk (whole size if contiguous)
  // Rows [first, first+count) as float32 (converted from any stored float type); returns whether
  // every value read is finite (checked during the conversion, so callers need no second pass).
  bool read_rows(const std::string& dataset, int64_t first, int64_t count, float* out) const;
  // Scratch of chunk decoding, one per worker thread, kept by the caller between reads so that
  // repeated reads allocate nothing.
  struct ChunkScratch {
    std::vector<unsigned char> packed, plain, unshuffled;
  };
  using ChunkBuffers = std::vector<ChunkScratch>;
  // The same rows, values and finiteness answer as read_rows, decoded on `threads` threads: for a
  // dataset chunked along rows with shuffle and/or deflate (what create_dataset writes) the chunks'
  // stored bytes are read here and inflated, unshuffled and converted in parallel. Other layouts, and
  // threads <= 1, go through read_rows.
  bool read_rows_parallel(const std::string& dataset, int64_t first, int64_t count, float* out, int threads,
                          ChunkBuffers& buffers) const;
  // A read of rows split in two so that its chunks can be decoded among other work:
  // plan_stored_rows looks up where the chunks lie (HDF5 metadata, on the calling thread); once
  // given its output (set_output), decode(c, scratch) reads chunk c with pread and inflates and
  // unshuffles it into place, on any thread and in any order. The rows land as stored
  // (element_bytes(element(dataset)) bytes per value, neither converted nor checked: the caller
  // converts and checks them). No plan (nullopt) for datasets whose chunks we do not decode
  // ourselves: read_stored_rows reads those through HDF5.
  class ChunkedRead {
   public:
    int chunks() const { return static_cast<int>(address_.size()); }
    void set_output(void* out) { out_ = out; }
    // Decodes chunk c; float32 output (read_rows_parallel) returns whether its values are finite.
    bool decode(int c, ChunkScratch& scratch) const;

   private:
    friend class File;
    std::string path_, dataset_;
    std::shared_ptr<const int> fd_;  // closed with the last copy of the plan
    hsize_t user_block_ = 0, chunk_rows_ = 0;
    std::vector<haddr_t> address_;
    std::vector<hsize_t> stored_;
    std::vector<unsigned> skipped_;  // per chunk: bit f set when filter f was not applied
    bool shuffled_ = false, deflated_ = false, convert_ = false, bf16_ = false;
    size_t bytes_ = 0, per_row_ = 0, chunk_elements_ = 0;
    int64_t first_ = 0, count_ = 0, first_chunk_ = 0;
    void* out_ = nullptr;
  };
  std::optional<ChunkedRead> plan_stored_rows(const std::string& dataset, int64_t first, int64_t count) const;
  void read_stored_rows(const std::string& dataset, int64_t first, int64_t count, void* out) const;
  bool decodes_chunks(const std::string& dataset) const;  // whether read_rows_parallel decodes them itself
  // Rows written from float32, converted to the dataset's element type (fp16/bf16 round to nearest even).
  void write_rows(const std::string& dataset, int64_t first, int64_t count, const float* data);
  // The same stored bytes as write_rows, encoded on `threads` threads: for the datasets whose chunks
  // read_rows_parallel decodes, rows covering whole chunks are converted, shuffled and deflated
  // (zlib at the dataset's level, run-length strategy, near-random byte planes stored: deflate_chunk)
  // in parallel and stored with H5Dwrite_chunk.
  // Other datasets and row ranges go through write_rows.
  void write_rows_parallel(const std::string& dataset, int64_t first, int64_t count, const float* data, int threads);
  // Whole datasets of other types.
  std::vector<double> read_doubles(const std::string& dataset) const;
  std::vector<int64_t> read_ints(const std::string& dataset) const;
  void write_doubles(const std::string& dataset, const std::vector<int64_t>& shape, const double* data);
  void write_floats(const std::string& dataset, const std::vector<int64_t>& shape, const float* data);
  void write_ints(const std::string& dataset, const std::vector<int64_t>& shape, const int64_t* data);

 private:
  Handle handle_;
  std::string path_;
  bool transfer_rows(const std::string& dataset, int64_t first, int64_t count, float* buffer, bool write) const;
  // The plan of plan_stored_rows, or with convert of read_rows_parallel (float32 out); nullopt when
  // HDF5 must read the dataset (its layout, filters or file driver are not ours to decode).
  std::optional<ChunkedRead> plan_rows(const std::string& dataset, int64_t first, int64_t count, void* out,
                                       bool convert) const;
  void write_whole(const std::string& dataset, const std::vector<int64_t>& shape, hid_t file_type, hid_t memory_type,
                   const void* data);
};

const char* element_name(Element element);
size_t element_bytes(Element element);

}  // namespace oscar::h5
