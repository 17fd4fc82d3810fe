// The canonical activation dump "oscar.dump" (docs/formats.md): model geometry, per layer post-RoPE
// Q [T, Hq, d], K [T, Hkv, d], V [T, Hkv, d] (float32, float16 or bfloat16-as-uint16), and sequence
// offsets into T. Reading converts to float32 and works layer by layer and chunk by chunk.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/hdf5.h"

namespace oscar {

inline constexpr const char* kDumpSchema = "oscar.dump";
inline constexpr int kDumpSchemaVersion = 1;

enum class StorageType { float32, float16, bfloat16 };
StorageType parse_storage_type(const std::string& name);  // "float32" | "float16" | "bfloat16"
const char* storage_type_name(StorageType type);

struct ModelGeometry {
  int num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool rope_applied = true;
  int group_size() const { return num_q_heads / num_kv_heads; }  // GQA ratio g
};

struct DumpInfo {
  ModelGeometry geometry;
  std::vector<int> layers;                // layer indices present in the file
  std::vector<int64_t> sequence_offsets;  // [S+1], offsets into T; sequence s = [off[s], off[s+1])
  int64_t tokens = 0;                     // T
  StorageType dtype = StorageType::float32;
  std::string model, provenance_json;     // free text / JSON object (tool, version, command, inputs, seed)
  // 0: queries stored for every token. N > 0: only the last N tokens of each sequence carry queries
  // (an evaluation dump, where queries elsewhere are never read; the other rows are zero).
  int64_t queries_kept_last = 0;
  bool compressed = true;  // writing: shuffle + deflate chunks (the default); false stores them raw
  int64_t num_sequences() const { return static_cast<int64_t>(sequence_offsets.size()) - 1; }
};

// One layer's activations (a token range of it) in float32, row-major.
struct LayerActivations {
  int layer = 0;
  int64_t first_token = 0, tokens = 0;
  std::vector<float> q;  // [tokens, Hq, d]
  std::vector<float> k;  // [tokens, Hkv, d]
  std::vector<float> v;  // [tokens, Hkv, d]
};

// The tensors a stored read takes: the accumulation's first pass needs only Q, its second K and V, so
// each stored tensor is decoded once per layer.
enum class StoredTensors { queries, keys_values };

// One layer's activations (a token range of it) as the dump stores them: the bytes of Q [tokens, Hq, d]
// or of K and V [tokens, Hkv, d] (whichever the read took, see StoredTensors; the other buffers keep what an
// earlier read left) in `dtype` (2 or 4 bytes per value), neither converted
// nor checked; the buffers may be longer than that (they only grow, so that streaming blocks through
// them never zero-fills). The accumulation streams these and widens one head's rows at a time with
// stored_rows_to_double: a block costs its stored size in memory and no float32 pass.
struct StoredActivations {
  int layer = 0;
  int64_t first_token = 0, tokens = 0;
  StorageType dtype = StorageType::float32;
  std::vector<unsigned char> q, k, v;
};

class DumpReader;

// A block's read split in two (see h5::File::ChunkedRead): DumpReader::plan_stored looks up the chunks
// (HDF5 metadata, on the calling thread); bind() sizes a block for it (reading through HDF5 the
// datasets whose chunks we do not decode, also on the calling thread); then the tasks (one per stored
// chunk) decode into that block on any threads, in any order, e.g. among the workers of another
// block's computation. The block must stay in place until they are done.
class StoredBlockRead {
 public:
  void bind(StoredActivations& block);
  int tasks() const { return total_; }
  void run(int task, h5::File::ChunkScratch& scratch) const;

 private:
  friend class DumpReader;
  struct Part {
    std::string dataset;
    std::optional<h5::File::ChunkedRead> chunks;  // nullopt: read through HDF5 by bind()
  };
  const DumpReader* reader_ = nullptr;
  const h5::File* file_ = nullptr;
  int layer_ = 0;
  int64_t first_ = 0, count_ = 0;
  std::vector<Part> parts_;  // Q, or K and V
  int total_ = 0;
};

// Rows [first, first + count) of head `head` of a stored [tokens, heads, d] tensor, as float64 into
// out [count, d]. Returns the first of these rows that holds a non-finite value, or -1.
int64_t stored_rows_to_double(const std::vector<unsigned char>& tensor, StorageType dtype, int heads, int head, int d,
                              int64_t first, int64_t count, double* out);

class DumpReader {
 public:
  explicit DumpReader(const std::string& path);  // validates schema, geometry, shapes; throws oscar::Error
  ~DumpReader();
  const DumpInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  // Reads tokens [first, first+count) of one layer; checks finiteness (error names file and dataset).
  LayerActivations read_layer(int layer, int64_t first = 0, int64_t count = -1) const;
  // The same into `out`, reusing its buffers' capacity (streaming readers call it block after block),
  // with the stored chunks decoded (inflated, converted) on `threads` threads.
  void read_layer_into(LayerActivations& out, int layer, int64_t first, int64_t count, int threads) const;
  // The same token range as stored, Q or K and V (see StoredActivations): plan_stored splits the read
  // (see StoredBlockRead); read_stored_into plans it, binds `out` and runs the decoding on `threads`
  // threads.
  StoredBlockRead plan_stored(int layer, int64_t first, int64_t count, StoredTensors tensors) const;
  void read_stored_into(StoredActivations& out, int layer, int64_t first, int64_t count, StoredTensors tensors,
                        int threads) const;
  // Rows per HDF5 chunk along T of this layer's K (the natural streaming granularity).
  int64_t chunk_tokens(int layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  DumpInfo info_;
};

// Writes a dump layer by layer; the file appears at `path` only after finish() (atomic rename).
class DumpWriter {
 public:
  DumpWriter(const std::string& path, const DumpInfo& info);  // info.layers, geometry, offsets, dtype
  ~DumpWriter();
  void write_layer(const LayerActivations& layer);  // full token range of one layer
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oscar
