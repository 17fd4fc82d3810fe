// oscar-eval: how far decode attention over a 2-bit KV cache is from BF16, per method, context and
// layer, on activations from a dump. Thin: parse flags, call lib/eval, print. See docs/tools/oscar-eval.md.
#include <cstdio>

#include <fmt/format.h>

#include "cli/atomic_file.h"
#include "cli/options.h"
#include "common/error.h"
#include "eval/evaluator.h"
#include "io/pack.h"
#include "methods/kv_method.h"

using namespace oscar;

namespace {

// --windows "0/0,32/128" -> {(0,0), (32,128)}
std::vector<std::pair<int, int>> parse_windows(const std::string& spec) {
  std::vector<std::pair<int, int>> windows;
  for (const auto& part : split_list(spec)) {
    auto fields = split_list(part, '/');
    OSCAR_CHECK(fields.size() == 2, "malformed --windows '{}': '{}' is not SINK/RECENT", spec, part);
    auto sink = parse_int_list(fields[0]), recent = parse_int_list(fields[1]);
    OSCAR_CHECK(sink.size() == 1 && recent.size() == 1 && sink[0] >= 0 && recent[0] >= 0,
                "malformed --windows '{}': '{}'", spec, part);
    windows.emplace_back(static_cast<int>(sink[0]), static_cast<int>(recent[0]));
  }
  OSCAR_CHECK(!windows.empty(), "empty --windows");
  return windows;
}

template <typename T>
std::vector<std::optional<T>> optional_list(const std::vector<T>& values) {
  if (values.empty()) return {std::nullopt};
  return {values.begin(), values.end()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "oscar-eval: decode attention over a quantised KV cache vs BF16, per method, context and layer.\n"
      "Context L = L tokens precede the query: for each sequence, KV head and context, the queries at positions\n"
      "L, L+stride, ... (--queries of them; each reads tokens [0, p], its own key included) are decoded through\n"
      "--backend over the method's cache, built as serving builds it (BF16 sink | INT2 history | BF16 recent\n"
      "window, pages demoted from the window), and compared with float64 attention over the BF16-rounded K/V.\n"
      "The dump must hold EVALUATION activations, disjoint from the ones the pack was calibrated on (a warning is\n"
      "printed when the pack's provenance names the dump).\n"
      "Methods (defaults; --sink/--recent/--windows/--group-size/--k-clip/--v-clip override every method):\n"
      "  bf16                    every token in BF16 (the noise floor of the harness/backend; 16 BPE)\n"
      "  naive                   no rotation, no clipping, no windows, G = head_dim\n"
      "  hadamard                R = H (normalised Hadamard) for K and V, no clipping, no windows, G = head_dim\n"
      "  oscar                   the pack's R_K, R_V, clip ratios, group size and windows (needs --pack)\n"
      "  oscar-ablation:<c>      composition c in none,h,u,u_h,u_h_p,h_p,u_p,u_p_h rebuilt from the pack's eigenbasis,\n"
      "                          with the pack's clip and windows (none = no rotation, clip and windows kept)\n"
      "  oscar-ablation:clip-fixed | :no-clip | :no-windows   the pack's rotation with clip 0.96/0.92, no clip, 0/0\n"
      "Baselines (cpu backend only; --group-size, --recent, --bits, --metadata apply as documented):\n"
      "  kivi, kivi:<G>          KIVI: per-channel K in groups of G tokens (32), per-token V, float zero, residual R=128\n"
      "  hadamard:kivi[:<G>]     QuaRot at KIVI granularity: H on K/V, KIVI axes and windows, integer zero\n"
      "  oscars                  OScaR: H, omni-token key norm (all KV heads), groups of 32, integer zero, tail 0..255\n"
      "  turboquant[:qjl|:k3v3]  randomized Hadamard + norm + Lloyd-Max N(0,1/d) codebook (--bits); QJL bit; K3V3\n"
      "  int4-hadamard           H, per-token INT4 (G = d), integer zero: the 4.25-bit reference\n"
      "Examples:\n"
      "  oscar-eval --dump eval.h5 --pack pack.h5 --methods bf16,naive,hadamard,oscar --context 2048,8192\n"
      "  oscar-eval --dump eval.h5 --pack pack.h5 --methods oscar --context 8192 --windows 0/0,32/128,64/256 --format csv\n"
      "  oscar-eval --dump eval.h5 --methods naive,hadamard --context 1024:8192:1024 --group-size 128,64,32 -o sweep.csv\n"
      "  oscar-eval --dump eval.h5 --pack pack.h5 --methods oscar --context 8192 --per-layer --format jsonl"};
  CommonOptions common;
  add_common_options(app, common);
  std::string dump_path, pack_path, methods_spec, context_spec, backend = "cpu", format = "md", layers_spec;
  std::string sink_spec, recent_spec, windows_spec, group_spec, k_clip_spec, v_clip_spec, metadata = "fp16";
  int bits = 2, page = 8;
  EvalConfig config;
  bool per_layer = false, wide = false;
  app.add_option("--dump", dump_path, "Evaluation dump (oscar.dump)")->required();
  app.add_option("--methods", methods_spec, "Comma list of methods (see above)")->required();
  app.add_option("--pack", pack_path, "Rotation pack (oscar.pack) for oscar and oscar-ablation:*");
  app.add_option("--context", context_spec, "Context lengths: list and/or start:end:step ranges")->required();
  app.add_option("--backend", backend, "Decode backend: cpu (float64 reference) or cuda")->capture_default_str();
  app.add_option("--format", format, "md, csv, json or jsonl")->capture_default_str();
  app.add_option("--layers", layers_spec, "Layers to evaluate, e.g. 0,3,8-11 (default: all)");
  app.add_flag("--per-layer", per_layer, "One row per (method, context, layer) instead of per (method, context)");
  app.add_flag("--wide", wide, "Markdown with every column (csv/json/jsonl always have every column)");
  app.add_option("--sink", sink_spec, "Override: BF16 sink tokens S0 (list)");
  app.add_option("--recent", recent_spec, "Override: BF16 recent window W (list)");
  app.add_option("--windows", windows_spec, "Override: SINK/RECENT pairs, e.g. 0/0,32/128,64/256 (not with --sink/--recent)");
  app.add_option("--group-size", group_spec, "Override: channels per (scale, zero) (list; 0 = head_dim)");
  app.add_option("--k-clip", k_clip_spec, "Override: key clip ratio (list; 1 = no clipping)");
  app.add_option("--v-clip", v_clip_spec, "Override: value clip ratio (list; 1 = no clipping)");
  app.add_option("--bits", bits, "Bits per code of the quantised tier: 2, 3 or 4")->capture_default_str();
  app.add_option("--metadata", metadata, "Scale/zero storage: fp16, bf16 or fp32")->capture_default_str();
  app.add_option("--page", page, "Tokens demoted from the recent window at a time")->capture_default_str();
  app.add_option("--queries", config.queries_per_sequence, "Decode positions per sequence and context")
      ->capture_default_str();
  app.add_option("--query-stride", config.query_stride, "Tokens between sampled decode positions")->capture_default_str();
  app.add_option("--threads", config.threads, "Worker threads for the cpu backend (0: all cores)")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  return run_tool(argc, argv, [&](int, char**) {
    const ReportFormat report_format = parse_report_format(format);
    config.methods = split_list(methods_spec);
    OSCAR_CHECK(!config.methods.empty(), "--methods is empty");
    for (long c : parse_int_list(context_spec)) config.contexts.push_back(c);
    if (!layers_spec.empty()) config.layers = parse_index_list(layers_spec);
    config.backend = backend;
    config.quiet = common.quiet;

    // Option variants: the cartesian product of the list flags.
    OSCAR_CHECK(windows_spec.empty() || (sink_spec.empty() && recent_spec.empty()),
                "--windows and --sink/--recent are exclusive");
    std::vector<std::pair<std::optional<int>, std::optional<int>>> windows;
    if (!windows_spec.empty()) {
      for (auto [s, w] : parse_windows(windows_spec)) windows.emplace_back(s, w);
    } else {
      std::vector<int> sinks, recents;
      if (!sink_spec.empty())
        for (long v : parse_int_list(sink_spec)) sinks.push_back(static_cast<int>(v));
      if (!recent_spec.empty())
        for (long v : parse_int_list(recent_spec)) recents.push_back(static_cast<int>(v));
      for (auto s : optional_list(sinks))
        for (auto w : optional_list(recents)) windows.emplace_back(s, w);
    }
    std::vector<int> groups;
    if (!group_spec.empty())
      for (long v : parse_int_list(group_spec)) groups.push_back(static_cast<int>(v));
    std::vector<double> k_clips = k_clip_spec.empty() ? std::vector<double>{} : parse_real_list(k_clip_spec);
    std::vector<double> v_clips = v_clip_spec.empty() ? std::vector<double>{} : parse_real_list(v_clip_spec);
    config.variants.clear();
    for (const auto& [sink, recent] : windows)
      for (auto group : optional_list(groups))
        for (auto kc : optional_list(k_clips))
          for (auto vc : optional_list(v_clips)) {
            MethodOptions o;
            o.sink_tokens = sink;
            o.recent_tokens = recent;
            o.group_size = group;
            o.key_clip = kc;
            o.value_clip = vc;
            o.bits = bits;
            o.metadata = parse_metadata_type(metadata);
            o.page_tokens = page;
            OSCAR_CHECK((!sink || *sink >= 0) && (!recent || *recent >= 0) && page > 0,
                        "windows and --page must be non-negative (page > 0)");
            config.variants.push_back(o);
          }

    auto source = open_dump_source(dump_path);
    Pack pack;
    if (!pack_path.empty()) {
      pack = read_pack(pack_path);
      config.pack = &pack;
      config.pack_path = pack_path;
      const std::string warning = provenance_overlap_warning(pack_path, pack.provenance_json, dump_path);
      if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
    }
    if (common.verbose) {
      const DumpInfo& info = source->info();
      std::fprintf(stderr, "dump %s: %d layers, %d query heads, %d KV heads, head_dim %d, %lld sequences\n",
                   dump_path.c_str(), info.geometry.num_layers, info.geometry.num_q_heads, info.geometry.num_kv_heads,
                   info.geometry.head_dim, static_cast<long long>(info.num_sequences()));
    }
    const EvalResult result = run_evaluation(*source, config);
    const auto& rows = per_layer ? result.layer_rows : result.rows;
    const bool full = report_format != ReportFormat::markdown || wide;
    write_text_output(common.output, render_report(make_report_table(rows, per_layer, full), report_format));
    return 0;
  });
}
