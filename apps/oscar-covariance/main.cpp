// oscar-covariance: accumulate the attention-aware calibration statistics from dumps, merge shards,
// and describe statistics files. See docs/tools/oscar-covariance.md.
#include <cstdio>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/atomic_file.h"
#include "cli/options.h"
#include "common/error.h"
#include "covariance/accumulate.h"
#include "covariance/benchmark.h"
#include "io/provenance.h"
#include "report/report.h"

using namespace oscar;

static int print_info(const std::string& path, bool json) {
  Statistics s = read_statistics(path);
  ReportTable table;
  table.fields = {"layer", "target", "kv_heads", "weight", "trace", "top_eigen_share"};
  for (const auto& l : s.layers)
    for (Target t : kAllTargets) {
      const double weight = l.of(t).weight[0];
      if (weight <= 0) {
        table.add_row({static_cast<long>(l.layer), std::string(target_name(t)), static_cast<long>(s.geometry.num_kv_heads),
                       0.0, 0.0, 0.0});
        continue;
      }
      MatrixD c = s.target_matrix(l.layer, t, -1);
      Eigenbasis b = symmetric_eigenbasis(c);
      table.add_row({static_cast<long>(l.layer), std::string(target_name(t)), static_cast<long>(s.geometry.num_kv_heads),
                     weight, c.trace(), b.eigenvalues[c.rows() - 1] / std::max(c.trace(), 1e-300)});
    }
  if (json) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["schema"] = kStatsSchema;
    j["num_layers"] = s.geometry.num_layers;
    j["num_q_heads"] = s.geometry.num_q_heads;
    j["num_kv_heads"] = s.geometry.num_kv_heads;
    j["head_dim"] = s.geometry.head_dim;
    j["tokens"] = s.tokens;
    j["score_queries"] = s.score_queries;
    j["proxy_query_source"] = s.proxy_query_source;
    j["inputs"] = s.inputs;
    j["provenance"] = nlohmann::json::parse(s.provenance_json, nullptr, false);
    j["targets"] = nlohmann::ordered_json::parse(render_report(table, ReportFormat::json));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("statistics  %s (%s v%d)\ngeometry    %d layers, %d query heads, %d KV heads, head_dim %d\n"
              "tokens      %lld per layer\nscores      %lld queries per sequence\nproxy C_Q   %s\ninputs      %s\n\n%s",
              path.c_str(), kStatsSchema, kStatsSchemaVersion, s.geometry.num_layers, s.geometry.num_q_heads,
              s.geometry.num_kv_heads, s.geometry.head_dim, static_cast<long long>(s.tokens),
              static_cast<long long>(s.score_queries), s.proxy_query_source.c_str(),
              fmt::format("{}", fmt::join(s.inputs, ", ")).c_str(), render_report(table, ReportFormat::markdown).c_str());
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"oscar-covariance: accumulate OSCAR calibration statistics (float64 sums + weights per layer and KV head)\n"
               "for every target: key_query (C_Q of the GQA group's queries), value_proxy (values weighted by\n"
               "k C_Q k^T), value_scores (causal attention outputs of sampled queries), key_gram, value_gram.\n"
               "Shards merge exactly by addition: split by --layers, or by dumps with a shared --query-stats.\n"
               "Examples:\n"
               "  oscar-covariance -o stats.h5 calib.h5\n"
               "  oscar-covariance -o s0.h5 --layers 0-17 calib.h5 && oscar-covariance -o s1.h5 --layers 18-35 calib.h5\n"
               "  oscar-covariance --merge -o stats.h5 s0.h5 s1.h5\n"
               "  oscar-covariance info stats.h5 --json"};
  CommonOptions common;
  add_common_options(app, common);
  std::vector<std::string> inputs;
  std::string layers, query_stats_path;
  bool merge = false;
  AccumulateOptions options;
  app.add_option("inputs", inputs, "Dumps to accumulate (or statistics files with --merge)");
  app.add_flag("--merge", merge, "Add statistics files (same geometry) instead of reading dumps");
  app.add_option("--layers", layers, "Layers to accumulate, e.g. 0,3,8-11 (default: all in the first dump)");
  app.add_option("--block-tokens", options.block_tokens,
                 "Tokens read per block, rounded up to a multiple of 512 (bounds memory; 0: 2048 per 4 threads, 2048 to 8192; the statistics do not depend on it)")->capture_default_str();
  app.add_option("--score-queries", options.score_queries,
                 "Queries sampled per sequence for value_scores; costs O(N * T * d) per query head and sequence of T "
                 "tokens (0: skip that target)")
      ->capture_default_str();
  app.add_option("--query-stats", query_stats_path,
                 "Statistics whose key_query C_Q weights the value proxy (make token shards merge exactly)");
  app.add_option("--threads", options.threads, "Worker threads (0: all cores)")->capture_default_str();
  auto* info = app.add_subcommand("info", "Describe a statistics file");
  std::string info_path;
  bool info_json = false;
  info->add_option("stats", info_path, "Statistics file")->required();
  info->add_flag("--json", info_json, "Machine-readable output");

  auto* bench = app.add_subcommand("bench", "Benchmark: dsyrk rate vs accumulation rate, peak memory, calibration time");
  std::string bench_path, bench_format = "md";
  bench->add_option("dump", bench_path, "Dump to accumulate (e.g. oscar-capture synth, Qwen3-8B geometry)")->required();
  bench->add_option("--format", bench_format, "md, csv, json or jsonl")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  return run_tool(argc, argv, [&](int, char**) {
    if (*info) return print_info(info_path, info_json);
    if (*bench) {
      CalibrationBenchmarkOptions bench_options;
      bench_options.block_tokens = options.block_tokens;
      bench_options.threads = options.threads;
      bench_options.quiet = common.quiet;
      ReportTable table = run_calibration_benchmark(bench_path, bench_options);
      write_text_output(common.output, render_report(table, parse_report_format(bench_format)));
      return 0;
    }
    OSCAR_CHECK(!inputs.empty(), "no input files (see --help)");
    OSCAR_CHECK(!common.output.empty(), "no output file: -o STATS.h5");
    const std::string command = command_line(argc, argv);
    if (merge) {
      OSCAR_CHECK(inputs.size() >= 2, "--merge needs at least two statistics files");
      Statistics merged = read_statistics(inputs[0]);
      for (size_t i = 1; i < inputs.size(); ++i) {
        try {
          merged = merge_statistics(merged, read_statistics(inputs[i]));
        } catch (const Error& e) {
          fail("{}: {}", inputs[i], e.what());
        }
      }
      merged.provenance_json = make_provenance("oscar-covariance --merge", command, inputs);
      write_statistics(common.output, merged);
      if (!common.quiet) std::fprintf(stderr, "merged %zu files into %s\n", inputs.size(), common.output.c_str());
      return 0;
    }
    if (!layers.empty()) options.layers = parse_index_list(layers);
    Statistics query_stats;
    if (!query_stats_path.empty()) {
      query_stats = read_statistics(query_stats_path);
      options.query_stats = &query_stats;
      options.query_stats_source = "stats:" + file_fnv1a64(query_stats_path);
    }
    options.quiet = common.quiet;
    OSCAR_CHECK(options.block_tokens >= 0, "--block-tokens must not be negative");
    Statistics stats = accumulate_statistics(inputs, options);
    stats.provenance_json = make_provenance("oscar-covariance", command, inputs);
    write_statistics(common.output, stats);
    if (!common.quiet) std::fprintf(stderr, "wrote %s\n", common.output.c_str());
    return 0;
  });
}
