// Progress line implementation (see progress.h).
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace oscar {

Progress::Progress(std::string label, double total, std::string unit, bool quiet)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), quiet_(quiet),
      is_terminal_(isatty(2)), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() = default;  // an abandoned progress (an error) prints nothing more

void Progress::advance(double amount) {
  done_ += amount;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since > (is_terminal_ ? 0.2 : 10.0)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final_line) {
  if (quiet_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? done_ / elapsed : 0;
  double eta = rate > 0 ? (total_ - done_) / rate : 0;
  double percent = total_ > 0 ? 100.0 * done_ / total_ : 100.0;
  std::fprintf(stderr, "%s%s: %5.1f%%  %.4g/%.4g %s  %.4g %s/s  %s %.1fs%s", is_terminal_ ? "\r" : "",
               label_.c_str(), percent, done_, total_, unit_.c_str(), rate, unit_.c_str(),
               final_line ? "took" : "eta", final_line ? elapsed : eta,
               (final_line || !is_terminal_) ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace oscar
