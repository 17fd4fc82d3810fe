// A progress line with rate and ETA on stderr, redrawn at most a few times a second.
// Silent when quiet; a plain final line when stderr is not a terminal.
#pragma once
#include <chrono>
#include <string>

namespace oscar {

class Progress {
 public:
  Progress(std::string label, double total, std::string unit, bool quiet);
  ~Progress();
  void advance(double amount);
  void finish();  // prints the final line; not called on errors

 private:
  void draw(bool final_line);
  std::string label_, unit_;
  double total_, done_ = 0;
  bool quiet_, finished_ = false, is_terminal_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace oscar
