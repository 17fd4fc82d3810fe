// Static thread split (see parallel.h).
#include "common/parallel.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace oscar {

int parallel_workers(int n, int threads) { return std::max(1, std::min(threads, n)); }

void parallel_for(int n, int threads, const std::function<void(int)>& fn) {
  threads = parallel_workers(n, threads);
  if (threads == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex error_mutex;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = t; i < n; i += threads) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace oscar
