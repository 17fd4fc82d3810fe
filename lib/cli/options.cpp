// Shared option parsing for the tools (see options.h).
#include "cli/options.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace oscar {

void add_common_options(CLI::App& app, CommonOptions& options, bool with_output) {
  app.set_version_flag("--version", std::string("oscar toolkit ") + OSCAR_VERSION);
  app.fallthrough();  // -v, -q, -o also work after a subcommand name
  app.add_flag("-v,--verbose", options.verbose, "More detail on stderr");
  app.add_flag("-q,--quiet", options.quiet, "No progress output on stderr");
  if (with_output) app.add_option("-o,--output", options.output, "Output file (default: stdout where it makes sense)");
}

std::vector<std::string> split_list(const std::string& spec, char separator) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : spec) {
    if (c == separator) {
      parts.push_back(current);
      current.clear();
    } else if (c != ' ') {
      current.push_back(c);
    }
  }
  parts.push_back(current);
  parts.erase(std::remove(parts.begin(), parts.end(), std::string()), parts.end());
  return parts;
}

static long parse_long(const std::string& text, const std::string& spec) {
  try {
    size_t used = 0;
    long value = std::stol(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    fail("malformed list '{}': '{}' is not an integer", spec, text);
  }
}

std::vector<int> parse_index_list(const std::string& spec) {
  std::set<int> indices;
  for (const auto& part : split_list(spec)) {
    auto dash = part.find('-', 1);
    if (dash == std::string::npos) {
      long v = parse_long(part, spec);
      OSCAR_CHECK(v >= 0, "malformed list '{}': negative index {}", spec, v);
      indices.insert(static_cast<int>(v));
    } else {
      long a = parse_long(part.substr(0, dash), spec), b = parse_long(part.substr(dash + 1), spec);
      OSCAR_CHECK(a >= 0 && b >= a, "malformed range '{}' in '{}'", part, spec);
      for (long i = a; i <= b; ++i) indices.insert(static_cast<int>(i));
    }
  }
  OSCAR_CHECK(!indices.empty(), "empty list '{}'", spec);
  return {indices.begin(), indices.end()};
}

std::vector<long> parse_int_list(const std::string& spec) {
  std::vector<long> values;
  for (const auto& part : split_list(spec)) {
    auto fields = split_list(part, ':');
    if (fields.size() == 1) {
      values.push_back(parse_long(fields[0], spec));
    } else if (fields.size() == 3) {
      long a = parse_long(fields[0], spec), b = parse_long(fields[1], spec), s = parse_long(fields[2], spec);
      OSCAR_CHECK(s > 0 && b >= a, "malformed range '{}' in '{}' (start:end:step, step > 0)", part, spec);
      for (long v = a; v <= b; v += s) values.push_back(v);
    } else {
      fail("malformed list '{}': '{}' is neither a number nor start:end:step", spec, part);
    }
  }
  OSCAR_CHECK(!values.empty(), "empty list '{}'", spec);
  return values;
}

std::vector<double> parse_real_list(const std::string& spec) {
  std::vector<double> values;
  for (const auto& part : split_list(spec)) {
    try {
      size_t used = 0;
      values.push_back(std::stod(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      fail("malformed list '{}': '{}' is not a number", spec, part);
    }
  }
  OSCAR_CHECK(!values.empty(), "empty list '{}'", spec);
  return values;
}

int run_tool(int argc, char** argv, const std::function<int(int, char**)>& body) {
  try {
    return body(argc, argv);
  } catch (const CLI::ParseError&) {
    throw;  // handled by the caller's CLI11_PARSE
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

std::string command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    if (i) line += ' ';
    line += argv[i];
  }
  return line;
}

}  // namespace oscar
