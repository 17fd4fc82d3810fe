// A static work split on a persistent thread pool, shared by the accumulation, the calibration, the
// synthetic generator and the dump reader and writer.
#pragma once
#include <functional>

namespace oscar {

// Runs fn(i) for i in [0, n) as parallel_workers(n, threads) workers: item i on worker
// i % parallel_workers(n, threads), each worker's items in increasing order on one thread (so
// per-worker scratch buffers need no locking). Workers run on the calling thread and on a pool of
// one thread per core started on first use (no thread is created per call). Safe to call from
// several threads at once and from inside fn. The first exception thrown by any item is rethrown
// after all finish.
void parallel_for(int n, int threads, const std::function<void(int)>& fn);
int parallel_workers(int n, int threads);
// Runs fn(i, worker) for i in [0, n) on the same pool, items claimed one at a time in increasing
// order by parallel_workers(n, threads) workers (worker in [0, workers): one thread each, so
// per-worker scratch buffers need no locking). For items of unequal cost: put the longest first.
void parallel_for_dynamic(int n, int threads, const std::function<void(int, int)>& fn);

}  // namespace oscar
