// Calibration benchmark (see benchmark.h).
#include "covariance/benchmark.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <cblas.h>

#include "calibrate/calibrate.h"
#include "common/parallel.h"
#include "covariance/accumulate.h"

namespace oscar {

double accumulation_flops(int64_t tokens, int num_layers, int num_q_heads, int num_kv_heads, int head_dim) {
  const double d = head_dim, syrk_per_row = d * (d + 1);
  const double rows = static_cast<double>(tokens) * (num_q_heads + 3.0 * num_kv_heads);  // q, k, v, weighted v
  return num_layers * (rows * syrk_per_row + static_cast<double>(tokens) * num_kv_heads * 2.0 * d * d);
}

static double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

static double peak_memory_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

ReportTable run_calibration_benchmark(const std::string& dump_path, const CalibrationBenchmarkOptions& options) {
  DumpReader probe(dump_path);
  const ModelGeometry g = probe.info().geometry;
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int d = g.head_dim;
  const int64_t block_tokens = block_tokens_for(options.block_tokens, threads);

  // Reference: dsyrk on d columns with one single-threaded BLAS call per thread at a time, on two
  // shapes: the accumulation's calls (kSubBlockTokens rows) and long calls (8192 rows, for which BLAS
  // is tuned). The faster shape sets the reference, so the ratio is never flattered by a slow shape.
  openblas_set_num_threads(1);
  constexpr int64_t kLongRows = 8192;
  std::vector<std::vector<double>> inputs(threads, std::vector<double>(static_cast<size_t>(kLongRows) * d)),
      outputs(threads, std::vector<double>(static_cast<size_t>(d) * d, 0.0));
  for (auto& in : inputs)
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>((i * 2654435761u) % 1000) / 1000.0 - 0.5;
  // Timed for at least a second; run before and after the accumulation, the faster run counts
  // (on a shared machine the slower one mostly measures the neighbours).
  auto measure_shape = [&](int64_t rows) {
    int repeats = 1;
    while (true) {
      auto start = std::chrono::steady_clock::now();
      parallel_for(threads, threads, [&](int t) {
        for (int r = 0; r < repeats; ++r)
          for (int64_t first = 0; first + rows <= kLongRows; first += rows)
            add_gram(inputs[t].data() + first * d, rows, d, outputs[t].data());
      });
      const double seconds = seconds_since(start);
      if (seconds > 1.0) return static_cast<double>(threads) * repeats * kLongRows * d * (d + 1.0) / seconds / 1e9;
      repeats *= 2;
    }
  };
  auto measure_syrk = [&] { return std::max(measure_shape(kSubBlockTokens), measure_shape(kLongRows)); };
  const double syrk_before = measure_syrk();

  // Accumulation (value_scores off: it is attention, not a rank-k update; timed on its own below).
  AccumulateOptions accumulate;
  accumulate.block_tokens = block_tokens;
  accumulate.threads = threads;
  accumulate.score_queries = 0;
  accumulate.quiet = options.quiet;
  auto start = std::chrono::steady_clock::now();
  Statistics stats = accumulate_statistics({dump_path}, accumulate);
  const double accumulate_seconds = seconds_since(start);
  const double memory_after_accumulate = peak_memory_mib();
  const double syrk_after = measure_syrk();
  const double syrk_gflops = std::max(syrk_before, syrk_after);
  const double flops = accumulation_flops(probe.info().tokens, static_cast<int>(probe.info().layers.size()),
                                          g.num_q_heads, g.num_kv_heads, d);

  // Reading alone: the blocks of both passes (Q, then K and V), decoded as the accumulation
  // decodes them, with no computation; shows what the dump's storage (compressed or not) costs.
  start = std::chrono::steady_clock::now();
  StoredActivations block;
  for (int layer : probe.info().layers)
    for (StoredTensors tensors : {StoredTensors::queries, StoredTensors::keys_values})
      for (int64_t first = 0; first < probe.info().tokens; first += block_tokens)
        probe.read_stored_into(block, layer, first, std::min(block_tokens, probe.info().tokens - first), tensors,
                               threads);
  const double read_seconds = seconds_since(start);

  CalibrateOptions calibrate;
  calibrate.quiet = true;
  calibrate.threads = threads;
  start = std::chrono::steady_clock::now();
  Pack pack = calibrate_pack(stats, calibrate);
  const double calibrate_seconds = seconds_since(start);

  AccumulateOptions scores = accumulate;
  scores.score_queries = 64;
  scores.layers = {probe.info().layers.front()};
  start = std::chrono::steady_clock::now();
  accumulate_statistics({dump_path}, scores);
  const double one_layer_with_scores = seconds_since(start);

  ReportTable table;
  table.fields = {"measure", "value", "unit"};
  table.markdown_precision = 2;
  table.add_row({std::string("dump"), static_cast<double>(probe.info().tokens), std::string("tokens per layer")});
  table.add_row({std::string("layers"), static_cast<double>(probe.info().layers.size()), std::string("layers")});
  table.add_row({std::string("threads"), static_cast<double>(threads), std::string("threads")});
  table.add_row({std::string("dsyrk_rate"), syrk_gflops,
                 std::string("GFLOP/s (all threads; best of 512- and 8192-row calls, before/after)")});
  table.add_row({std::string("dsyrk_rate_before"), syrk_before, std::string("GFLOP/s")});
  table.add_row({std::string("dsyrk_rate_after"), syrk_after, std::string("GFLOP/s")});
  table.add_row({std::string("accumulate_time"), accumulate_seconds, std::string("s")});
  table.add_row({std::string("accumulate_tokens_per_s"), probe.info().tokens * probe.info().layers.size() / accumulate_seconds,
                 std::string("token-layers/s")});
  table.add_row({std::string("accumulate_rate"), flops / accumulate_seconds / 1e9, std::string("GFLOP/s")});
  table.add_row({std::string("accumulate_vs_dsyrk"), 100.0 * flops / accumulate_seconds / 1e9 / syrk_gflops, std::string("%")});
  table.add_row({std::string("read_time"), read_seconds,
                 std::string("s (reading both passes' blocks alone, decoded on all threads, no computation)")});
  table.add_row({std::string("peak_memory"), memory_after_accumulate,
                 std::string("MiB (max RSS of the process after accumulation, dsyrk buffers included)")});
  table.add_row({std::string("calibrate_time"), calibrate_seconds, std::string("s (eigh + u_h_p, all layers)")});
  table.add_row({std::string("scores_one_layer_time"), one_layer_with_scores,
                 std::string("s (one layer incl. value_scores, 64 queries/seq)")});
  (void)pack;
  return table;
}

}  // namespace oscar
