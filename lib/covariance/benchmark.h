// Calibration benchmark (oscar-covariance bench): the machine's dsyrk rate measured with the same
// shapes and threads as accumulation, then accumulation and calibration of a dump, with peak memory.
#pragma once
#include <string>

#include "report/report.h"

namespace oscar {

struct CalibrationBenchmarkOptions {
  int64_t block_tokens = 0;  // 0: block_tokens_for(threads)
  int threads = 0;
  bool quiet = false;
};

ReportTable run_calibration_benchmark(const std::string& dump_path, const CalibrationBenchmarkOptions& options);

// FLOPs of the accumulation passes (without value_scores): syrk n*d*(d+1) per update, plus the
// proxy weights k C_Q (2 d^2 per key).
double accumulation_flops(int64_t tokens, int num_layers, int num_q_heads, int num_kv_heads, int head_dim);

}  // namespace oscar
