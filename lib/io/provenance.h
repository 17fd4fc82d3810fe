// Provenance recorded in every file a tool writes: tool, toolkit version, command line, inputs, seed
// (no time stamp, so equal inputs give bit-identical files). Stored as a JSON string attribute "provenance" on the root group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace oscar {

std::string make_provenance(const std::string& tool, const std::string& command, const std::vector<std::string>& inputs,
                            int64_t seed = -1);

// 64-bit FNV-1a of a file's bytes as 16 hex digits (identifies the statistics a pack came from).
std::string file_fnv1a64(const std::string& path);

}  // namespace oscar
