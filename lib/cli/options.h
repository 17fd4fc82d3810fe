// Options and list syntax shared by every tool: --version, -v, -q, -o, comma lists and ranges,
// and the main() wrapper that turns oscar::Error into one "error: ..." line and exit code 1.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace oscar {

struct CommonOptions {
  bool verbose = false;
  bool quiet = false;
  std::string output;  // empty: stdout (results) or a tool-specific requirement
};

// Adds --version, -v/--verbose, -q/--quiet and (if with_output) -o/--output to an app.
void add_common_options(CLI::App& app, CommonOptions& options, bool with_output = true);

// "0,3,8-11" -> {0,3,8,9,10,11}; sorted, unique. Throws oscar::Error on malformed text.
std::vector<int> parse_index_list(const std::string& spec);

// "2048,4096" or "2048:8192:2048" (start:end:step, end inclusive) or mixes "1024,2048:8192:2048".
std::vector<long> parse_int_list(const std::string& spec);
std::vector<double> parse_real_list(const std::string& spec);
std::vector<std::string> split_list(const std::string& spec, char separator = ',');

// Runs body(argc, argv); prints "error: <message>" for oscar::Error and std::exception, returns 1.
int run_tool(int argc, char** argv, const std::function<int(int, char**)>& body);

// The command line as one string, recorded as provenance in every file a tool writes.
std::string command_line(int argc, char** argv);

}  // namespace oscar
