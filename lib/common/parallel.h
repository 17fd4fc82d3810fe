// A minimal static thread split shared by the accumulation, the calibration and the dump reader.
#pragma once
#include <functional>

namespace oscar {

// Runs fn(i) for i in [0, n) on parallel_workers(n, threads) threads: item i on worker
// i % parallel_workers(n, threads), each worker's items in increasing order (so per-worker scratch
// buffers need no locking). The first exception thrown by any item is rethrown after all finish.
void parallel_for(int n, int threads, const std::function<void(int)>& fn);
int parallel_workers(int n, int threads);

}  // namespace oscar
