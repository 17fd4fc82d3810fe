// oscar-calibrate: statistics -> rotation/threshold pack (eigenbasis, Hadamard, bit-reversal
// permutation, fixed or fitted clipping), and pack inspection. See docs/tools/oscar-calibrate.md.
#include <cstdio>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "calibrate/calibrate.h"
#include "cli/options.h"
#include "common/error.h"
#include "io/provenance.h"
#include "report/report.h"

using namespace oscar;

static int print_info(const std::string& path, bool json) {
  Pack p = read_pack(path);
  ReportTable table;
  table.fields = {"layer", "key_clip", "value_clip", "key_orthogonality", "value_orthogonality", "key_top_eigen_share",
                  "value_top_eigen_share"};
  for (const auto& l : p.layers) {
    const int d = p.head_dim;
    auto orth = [&](const RotationSide& s) {
      double worst = 0;
      for (size_t h = 0; h < s.rotation.size() / (static_cast<size_t>(d) * d); ++h) {
        Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> r(
            s.rotation.data() + h * d * d, d, d);
        worst = std::max(worst, orthogonality_error(r.cast<double>()));
      }
      return worst;
    };
    auto share = [&](const RotationSide& s) {
      double total = 0, top = 0;
      for (int i = 0; i < d; ++i) total += s.eigenvalues[i];
      top = s.eigenvalues[d - 1];
      return total > 0 ? top / total : 0.0;
    };
    table.add_row({static_cast<long>(l.layer), static_cast<double>(l.key.clip_ratio), static_cast<double>(l.value.clip_ratio),
                   orth(l.key), orth(l.value), share(l.key), share(l.value)});
  }
  if (json) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["schema"] = kPackSchema;
    j["num_layers"] = p.num_layers;
    j["num_kv_heads"] = p.num_kv_heads;
    j["head_dim"] = p.head_dim;
    j["composition"] = p.composition;
    j["scope"] = p.scope;
    j["clip_rule"] = p.clip_rule;
    j["key_target"] = p.key_target;
    j["value_target"] = p.value_target;
    j["group_size"] = p.group_size;
    j["sink_tokens"] = p.sink_tokens;
    j["recent_tokens"] = p.recent_tokens;
    j["stats_hash"] = p.stats_hash;
    j["provenance"] = nlohmann::json::parse(p.provenance_json, nullptr, false);
    j["layers"] = nlohmann::ordered_json::parse(render_report(table, ReportFormat::json));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("pack         %s (%s v%d)\ngeometry     %d layers, %d KV heads, head_dim %d\ncomposition  %s, scope %s\n"
              "targets      key %s, value %s\nclipping     %s\nquantiser    group %d, windows sink %d / recent %d\n"
              "statistics   %s\n\n%s",
              path.c_str(), kPackSchema, kPackSchemaVersion, p.num_layers, p.num_kv_heads, p.head_dim,
              p.composition.c_str(), p.scope.c_str(), p.key_target.c_str(), p.value_target.c_str(), p.clip_rule.c_str(),
              p.group_size ? p.group_size : p.head_dim, p.sink_tokens, p.recent_tokens, p.stats_hash.c_str(),
              render_report(table, ReportFormat::markdown).c_str());
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"oscar-calibrate: turn statistics into a rotation pack R = U.H.P per layer (or per KV head) for K and V,\n"
               "with clipping ratios fixed (K 0.96, V 0.92) or fitted per layer on activations (--clip fit --dump).\n"
               "Compositions: none h u u_h u_h_p h_p u_p u_p_h (factors multiplied left to right).\n"
               "Examples:\n"
               "  oscar-calibrate -o pack.h5 stats.h5\n"
               "  oscar-calibrate -o pack_fit.h5 stats.h5 --clip fit --dump calib.h5\n"
               "  oscar-calibrate -o pack_uh.h5 stats.h5 --composition u_h --scope head --value-target scores\n"
               "  oscar-calibrate info pack.h5 --json"};
  CommonOptions common;
  add_common_options(app, common);
  std::string stats_path, dump_path, clip_grid, metadata = "fp16";
  CalibrateOptions options;
  app.add_option("stats", stats_path, "Statistics file from oscar-covariance");
  app.add_option("--composition", options.composition, "Rotation composition")->capture_default_str();
  app.add_option("--scope", options.scope, "layer (one rotation per layer, targets averaged over KV heads) or head")
      ->capture_default_str();
  app.add_option("--key-target", options.key_target, "query (C_Q) or gram (K^T K, ablation)")->capture_default_str();
  app.add_option("--value-target", options.value_target, "proxy (reference code), scores (paper) or gram (V^T V)")
      ->capture_default_str();
  app.add_option("--clip", options.clip, "fixed or fit")->capture_default_str();
  app.add_option("--k-clip", options.key_clip, "Key clip ratio (fixed; always a candidate of the fit)")->capture_default_str();
  app.add_option("--v-clip", options.value_clip, "Value clip ratio (fixed; always a candidate of the fit)")->capture_default_str();
  app.add_option("--clip-grid", clip_grid, "Candidate ratios for --clip fit (comma list)");
  app.add_option("--dump", dump_path, "Calibration activations for --clip fit");
  app.add_option("--fit-tokens", options.fit_tokens, "Tokens per layer used by the fit")->capture_default_str();
  app.add_option("--fit-queries", options.fit_queries, "Queries per sequence for the value fit")->capture_default_str();
  app.add_option("--group-size", options.group_size, "Quantiser group size (0: head_dim)")->capture_default_str();
  app.add_option("--metadata", metadata, "Quantiser metadata type used by the fit: fp16, bf16, fp32")->capture_default_str();
  app.add_option("--sink", options.sink_tokens, "Default BF16 sink window recorded in the pack")->capture_default_str();
  app.add_option("--recent", options.recent_tokens, "Default BF16 recent window recorded in the pack")->capture_default_str();
  app.add_option("--threads", options.threads, "Worker threads (0: all cores)")->capture_default_str();
  auto* info = app.add_subcommand("info", "Describe a pack");
  std::string info_path;
  bool info_json = false;
  info->add_option("pack", info_path, "Pack file")->required();
  info->add_flag("--json", info_json, "Machine-readable output");

  CLI11_PARSE(app, argc, argv);
  return run_tool(argc, argv, [&](int, char**) {
    if (*info) return print_info(info_path, info_json);
    OSCAR_CHECK(!stats_path.empty(), "no statistics file given (see --help)");
    OSCAR_CHECK(!common.output.empty(), "no output file: -o PACK.h5");
    Statistics stats = read_statistics(stats_path);
    std::unique_ptr<DumpReader> dump;
    if (!dump_path.empty()) {
      dump = std::make_unique<DumpReader>(dump_path);
      options.fit_dump = dump.get();
    }
    if (!clip_grid.empty()) {
      options.clip_grid.clear();
      for (double r : parse_real_list(clip_grid)) options.clip_grid.push_back(static_cast<float>(r));
    }
    options.metadata = parse_metadata_type(metadata);
    options.quiet = common.quiet;
    std::vector<LayerCalibrationReport> report;
    Pack pack;
    try {
      pack = calibrate_pack(stats, options, &report);
    } catch (const Error& e) {
      fail("{}: {}", stats_path, e.what());
    }
    pack.stats_hash = file_fnv1a64(stats_path);
    std::vector<std::string> inputs = {stats_path};
    inputs.insert(inputs.end(), stats.inputs.begin(), stats.inputs.end());
    if (!dump_path.empty()) inputs.push_back(dump_path);
    pack.provenance_json = make_provenance("oscar-calibrate", command_line(argc, argv), inputs);
    write_pack(common.output, pack);
    if (!common.quiet) {
      ReportTable table;
      table.fields = {"layer", "key_clip", "value_clip", "key_orthogonality", "value_orthogonality", "key_top_share",
                      "value_top_share", "key_condition", "value_condition"};
      for (const auto& r : report)
        table.add_row({static_cast<long>(r.layer), static_cast<double>(r.key.clip), static_cast<double>(r.value.clip),
                       r.key.orthogonality, r.value.orthogonality, r.key.top_share, r.value.top_share, r.key.condition,
                       r.value.condition});
      std::fprintf(stderr, "%s", render_report(table, ReportFormat::markdown).c_str());
      std::fprintf(stderr, "wrote %s\n", common.output.c_str());
    }
    return 0;
  });
}
