// Streaming accumulation of the calibration statistics from dumps: layer by layer, block by block
// (memory bounded by the block, not the dump), BLAS rank-k updates (dsyrk) on 512-token sub-blocks,
// work items per head and sub-block residue on all cores, the next block's reading inside the same job.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "covariance/statistics.h"

namespace oscar {

struct AccumulateOptions {
  std::vector<int> layers;          // empty: every layer of the first dump
  int64_t block_tokens = 0;         // tokens read per block; 0: block_tokens_for(threads)
  int64_t score_queries = 64;       // value_scores: queries sampled per sequence (0: skip the target)
  int threads = 0;                  // 0: all cores
  const Statistics* query_stats = nullptr;  // C_Q for the proxy weights; null: this run's own C_Q
  std::string query_stats_source;   // recorded as proxy_query_source when query_stats is given
  bool quiet = false;
};

// Rows are widened to float64 and added to the sums (one dsyrk call) in sub-blocks of this many
// tokens, at multiples of it counted from the dump's first token: a sub-block's rows stay in the core's
// cache between the conversion and dsyrk, and the sequence of dsyrk calls (hence the sums, bit for
// bit) depends neither on the block size nor on the thread count.
inline constexpr int64_t kSubBlockTokens = 512;

// Tokens per block: `requested` rounded up to a multiple of kSubBlockTokens when positive, else 2048
// per 4 threads, 2048 to 8192 (larger blocks amortise the per-block costs over more cores; memory
// stays bounded by the block).
int64_t block_tokens_for(int64_t requested, int threads);

Statistics accumulate_statistics(const std::vector<std::string>& dumps, const AccumulateOptions& options);

// Adds x^T x of rows x [n, d] (row-major float64) into the upper triangle of sum [d, d] (dsyrk).
void add_gram(const double* rows, int64_t n, int d, double* sum);
// Copies the upper triangle of a [d, d] matrix to the lower one.
void symmetrise_upper(double* matrix, int d);

}  // namespace oscar
