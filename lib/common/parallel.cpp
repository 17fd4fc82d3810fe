// Static thread split on a persistent pool (see parallel.h).
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace oscar {

namespace {

// One parallel_for call: `workers` tasks, task t running items t, t + workers, ... in order (dynamic:
// task t claiming items one at a time from a shared counter, as worker t). Tasks are
// claimed from a counter by the pool's threads and by the calling thread, which therefore always
// makes progress on its own (no deadlock when pool threads are busy or a task calls parallel_for).
struct Job {
  int n = 0, workers = 0;
  const std::function<void(int)>* fn = nullptr;                // static split
  const std::function<void(int, int)>* dynamic_fn = nullptr;   // items claimed one at a time
  std::atomic<int> next_task{0}, next_item{0};
  int finished = 0;  // guarded by mutex
  std::mutex mutex;
  std::condition_variable done;
  std::exception_ptr error;

  // Claims and runs tasks until none is left; returns when this thread has no more to do.
  void work() {
    for (int t; (t = next_task.fetch_add(1)) < workers;) {
      try {
        if (dynamic_fn)
          for (int i; (i = next_item.fetch_add(1)) < n;) (*dynamic_fn)(i, t);
        else
          for (int i = t; i < n; i += workers) (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (++finished == workers) done.notify_all();
    }
  }
};

// Threads started on first use (one per core, less the caller) and kept for the process's life;
// they pick up jobs that still have unclaimed tasks.
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: threads may outlive static destructors
    return *pool;
  }
  void submit(const std::shared_ptr<Job>& job, int helpers) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int h = 0; h < helpers; ++h) queue_.push_back(job);
    }
    wake_.notify_all();
  }
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  Pool() {
    const int helpers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) - 1;
    for (int h = 0; h < helpers; ++h)
      threads_.emplace_back([this] {
        for (;;) {
          std::shared_ptr<Job> job;
          {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [this] { return !queue_.empty(); });
            job = std::move(queue_.front());
            queue_.pop_front();
          }
          job->work();
        }
      });
    for (auto& t : threads_) t.detach();
  }
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
};

}  // namespace

int parallel_workers(int n, int threads) { return std::max(1, std::min(threads, n)); }

static void run_job(int n, int threads, const std::function<void(int)>* fn,
                    const std::function<void(int, int)>* dynamic_fn) {
  const int workers = parallel_workers(n, threads);
  if (n <= 0) return;
  if (workers == 1) {
    for (int i = 0; i < n; ++i) fn ? (*fn)(i) : (*dynamic_fn)(i, 0);
    return;
  }
  auto job = std::make_shared<Job>();
  job->n = n;
  job->workers = workers;
  job->fn = fn;
  job->dynamic_fn = dynamic_fn;
  Pool::instance().submit(job, std::min(workers - 1, Pool::instance().size()));
  job->work();
  std::unique_lock<std::mutex> lock(job->mutex);
  job->done.wait(lock, [&] { return job->finished == job->workers; });
  if (job->error) std::rethrow_exception(job->error);
}

void parallel_for(int n, int threads, const std::function<void(int)>& fn) { run_job(n, threads, &fn, nullptr); }

void parallel_for_dynamic(int n, int threads, const std::function<void(int, int)>& fn) {
  run_job(n, threads, nullptr, &fn);
}

}  // namespace oscar
