// Import of raw activation files written by a model hook into the canonical dump: our own raw layout
// ("oscar.raw", examples/capture_hf.py) or a foreign layout described by options (one group per
// layer holding q/k/v, possibly split into several chunk datasets, any axis order).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dump.h"

namespace oscar {

struct ImportOptions {
  std::string layout = "oscar-raw";     // "oscar-raw" | "grouped"
  std::vector<int> layers;              // empty: every layer found
  int64_t token_begin = 0, token_end = -1;  // token range kept from each file (end -1: to the end)
  StorageType dtype = StorageType::float16;
  int64_t queries_kept_last = 0;        // > 0: keep queries only for the last N tokens per sequence
  // Grouped layout: group name pattern with {} for the layer index, dataset base names, axis order,
  // and geometry when the file carries no attributes.
  std::string layer_group = "layer_{}";
  std::string q_name = "q", k_name = "k", v_name = "v";
  std::string axes = "thd";             // "thd" [T,H,d] | "htd" [H,T,d] | "bhtd" [1,H,T,d]
  int num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::string model;
  bool quiet = false;
};

// Reads every raw file (one sequence each), validates shapes, GQA divisibility, dtype, finiteness,
// and writes the dump atomically. Returns the written dump's info.
DumpInfo import_raw_files(const std::vector<std::string>& inputs, const std::string& output,
                          const ImportOptions& options, const std::string& provenance_json);

}  // namespace oscar
