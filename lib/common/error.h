// One exception type for every user-facing failure: its message is the one line the tools print
// after "error: " (it names the file, the dataset and what is wrong).
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace oscar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws oscar::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

#define OSCAR_CHECK(condition, ...)       \
  do {                                    \
    if (!(condition)) ::oscar::fail(__VA_ARGS__); \
  } while (0)

}  // namespace oscar
