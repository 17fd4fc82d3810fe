// Provenance strings and file hashes (see provenance.h).
#include "io/provenance.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace oscar {

std::string make_provenance(const std::string& tool, const std::string& command, const std::vector<std::string>& inputs,
                            int64_t seed) {
  nlohmann::ordered_json j;
  j["tool"] = tool;
  j["version"] = OSCAR_VERSION;
  j["command"] = command;
  j["inputs"] = inputs;
  if (seed >= 0) j["seed"] = seed;
  return j.dump();
}

std::string file_fnv1a64(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OSCAR_CHECK(in.good(), "{}: cannot open for hashing", path);
  uint64_t hash = 14695981039346656037ull;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      hash ^= static_cast<unsigned char>(buffer[i]);
      hash *= 1099511628211ull;
    }
  }
  return fmt::format("{:016x}", hash);
}

}  // namespace oscar
