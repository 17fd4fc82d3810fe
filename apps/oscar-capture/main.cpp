// oscar-capture: make canonical activation dumps (synthetic, or imported from a model hook's raw
// HDF5 files) and describe them. See docs/tools/oscar-capture.md.
#include <cstdio>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "capture/import.h"
#include "capture/summary.h"
#include "capture/synthetic.h"
#include "cli/atomic_file.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "common/error.h"
#include "io/provenance.h"

using namespace oscar;

int main(int argc, char** argv) {
  CLI::App app{"oscar-capture: build canonical Q/K/V activation dumps (oscar.dump) and inspect them.\n"
               "Examples:\n"
               "  oscar-capture synth --layers 4 --q-heads 32 --kv-heads 8 --head-dim 128 --tokens 8192 -o synth.h5\n"
               "  oscar-capture import -o eval.h5 raw/seq0.h5 raw/seq1.h5 --layers 0,9,19,29\n"
               "  oscar-capture import --layout grouped --layer-group 'layer_{}' --axes htd --q-heads 32 \\\n"
               "      --kv-heads 8 --head-dim 128 --num-layers 36 -o dump.h5 foreign.h5\n"
               "  oscar-capture info eval.h5 --json"};
  CommonOptions common;
  add_common_options(app, common, false);
  app.require_subcommand(1);

  // synth
  auto* synth = app.add_subcommand("synth", "Synthetic post-RoPE activations with planted real-model structure");
  SyntheticSpec spec;
  std::string synth_output, synth_dtype = "float32";
  synth->add_option("--layers", spec.geometry.num_layers, "Number of layers")->required()->check(CLI::PositiveNumber);
  synth->add_option("--q-heads", spec.geometry.num_q_heads, "Query heads")->required()->check(CLI::PositiveNumber);
  synth->add_option("--kv-heads", spec.geometry.num_kv_heads, "KV heads")->required()->check(CLI::PositiveNumber);
  synth->add_option("--head-dim", spec.geometry.head_dim, "Head dimension d")->required()->check(CLI::PositiveNumber);
  synth->add_option("--tokens", spec.tokens_per_sequence, "Tokens per sequence")->required()->check(CLI::PositiveNumber);
  synth->add_option("--sequences", spec.sequences, "Number of sequences")->capture_default_str()->check(CLI::PositiveNumber);
  synth->add_option("--seed", spec.seed, "Random seed")->capture_default_str();
  synth->add_option("--rope-base", spec.rope_base, "RoPE base")->capture_default_str();
  synth->add_option("--dtype", synth_dtype, "Stored dtype: float32, float16, bfloat16")->capture_default_str();
  bool synth_raw = false;
  synth->add_flag("--no-compress", synth_raw, "Store chunks uncompressed (faster to read, larger)");
  synth->add_option("-o,--output", synth_output, "Output dump")->required();

  // import
  auto* import = app.add_subcommand("import", "Import raw hook files (one sequence each) into a dump");
  ImportOptions io;
  std::vector<std::string> raw_inputs;
  std::string import_output, import_layers, import_dtype = "float16", token_range;
  import->add_option("inputs", raw_inputs, "Raw HDF5 files, one sequence each")->required();
  import->add_option("-o,--output", import_output, "Output dump")->required();
  import->add_option("--layers", import_layers, "Layers to keep, e.g. 0,9,19-21 (default: all found)");
  import->add_option("--tokens", token_range, "Token range kept from each file, START:END (END exclusive)");
  import->add_option("--dtype", import_dtype, "Stored dtype: float32, float16, bfloat16")->capture_default_str();
  import->add_option("--queries-last", io.queries_kept_last,
                     "Keep queries only for the last N tokens of each sequence (evaluation dumps; 0 = all)")
      ->capture_default_str();
  import->add_option("--layout", io.layout, "oscar-raw (examples/capture_hf.py) or grouped")->capture_default_str();
  import->add_option("--layer-group", io.layer_group, "grouped: group name, {} = layer index")->capture_default_str();
  import->add_option("--q-name", io.q_name, "grouped: query dataset base name (chunks NAME_0, NAME_1.. concatenate)")
      ->capture_default_str();
  import->add_option("--k-name", io.k_name, "grouped: key dataset base name")->capture_default_str();
  import->add_option("--v-name", io.v_name, "grouped: value dataset base name")->capture_default_str();
  import->add_option("--axes", io.axes, "grouped: axis order thd [T,H,d], htd [H,T,d] or bhtd [1,H,T,d]")
      ->capture_default_str();
  import->add_option("--num-layers", io.num_layers, "Geometry when the file has no attributes");
  import->add_option("--q-heads", io.num_q_heads, "Geometry when the file has no attributes");
  import->add_option("--kv-heads", io.num_kv_heads, "Geometry when the file has no attributes");
  import->add_option("--head-dim", io.head_dim, "Geometry when the file has no attributes");
  import->add_option("--model", io.model, "Model name to record");

  // info
  auto* info = app.add_subcommand("info", "Geometry, tokens, sequences, dtype, provenance, per-layer outliers");
  std::string info_input;
  bool info_json = false, info_no_summary = false;
  info->add_option("dump", info_input, "Dump file")->required();
  info->add_flag("--json", info_json, "Machine-readable output");
  info->add_flag("--no-summary", info_no_summary, "Skip the per-layer pass over the data");

  CLI11_PARSE(app, argc, argv);
  return run_tool(argc, argv, [&](int, char**) {
    const std::string command = command_line(argc, argv);
    if (*synth) {
      DumpInfo d;
      d.geometry = spec.geometry;
      d.dtype = parse_storage_type(synth_dtype);
      d.model = "synthetic";
      d.compressed = !synth_raw;
      d.provenance_json = make_provenance("oscar-capture synth", command, {}, static_cast<int64_t>(spec.seed));
      for (int s = 0; s <= spec.sequences; ++s) d.sequence_offsets.push_back(s * spec.tokens_per_sequence);
      for (int l = 0; l < spec.geometry.num_layers; ++l) d.layers.push_back(l);
      OSCAR_CHECK(spec.geometry.num_q_heads % spec.geometry.num_kv_heads == 0,
                  "--q-heads {} is not divisible by --kv-heads {}", spec.geometry.num_q_heads, spec.geometry.num_kv_heads);
      DumpWriter writer(synth_output, d);
      Progress progress("synth", spec.geometry.num_layers, "layers", common.quiet);
      for (int l = 0; l < spec.geometry.num_layers; ++l) {
        writer.write_layer(synthesize_layer(spec, l));
        progress.advance(1);
      }
      writer.finish();
      progress.finish();
      if (!common.quiet) std::fprintf(stderr, "wrote %s\n", synth_output.c_str());
      return 0;
    }
    if (*import) {
      if (!import_layers.empty()) io.layers = parse_index_list(import_layers);
      if (!token_range.empty()) {
        auto fields = split_list(token_range, ':');
        OSCAR_CHECK(fields.size() == 2, "--tokens '{}' must be START:END", token_range);
        io.token_begin = std::stol(fields[0]);
        io.token_end = std::stol(fields[1]);
      }
      io.dtype = parse_storage_type(import_dtype);
      io.quiet = common.quiet;
      auto d = import_raw_files(raw_inputs, import_output, io, make_provenance("oscar-capture import", command, raw_inputs));
      if (!common.quiet)
        std::fprintf(stderr, "wrote %s: %lld tokens in %lld sequences, %zu layers\n", import_output.c_str(),
                     static_cast<long long>(d.tokens), static_cast<long long>(d.num_sequences()), d.layers.size());
      return 0;
    }
    DumpReader dump(info_input);
    const DumpInfo& d = dump.info();
    std::vector<LayerSummary> summary;
    if (!info_no_summary) summary = summarize_dump(dump);
    if (info_json) {
      nlohmann::ordered_json j;
      j["file"] = info_input;
      j["schema"] = kDumpSchema;
      j["model"] = d.model;
      j["num_layers"] = d.geometry.num_layers;
      j["num_q_heads"] = d.geometry.num_q_heads;
      j["num_kv_heads"] = d.geometry.num_kv_heads;
      j["head_dim"] = d.geometry.head_dim;
      j["rope_applied"] = d.geometry.rope_applied;
      j["dtype"] = storage_type_name(d.dtype);
      j["layers"] = d.layers;
      j["tokens"] = d.tokens;
      j["sequences"] = d.num_sequences();
      j["sequence_offsets"] = d.sequence_offsets;
      j["queries_kept_last"] = d.queries_kept_last;
      j["provenance"] = nlohmann::json::parse(d.provenance_json.empty() ? "null" : d.provenance_json, nullptr, false);
      if (!summary.empty())
        j["layer_summary"] = nlohmann::ordered_json::parse(render_report(summary_table(summary), ReportFormat::json));
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("dump        %s (%s v%d)\nmodel       %s\ngeometry    %d layers, %d query heads, %d KV heads (GQA %d), "
                "head_dim %d, RoPE %s\ndtype       %s\nlayers      %s\ntokens      %lld in %lld sequences\n",
                info_input.c_str(), kDumpSchema, kDumpSchemaVersion, d.model.c_str(), d.geometry.num_layers,
                d.geometry.num_q_heads, d.geometry.num_kv_heads, d.geometry.group_size(), d.geometry.head_dim,
                d.geometry.rope_applied ? "applied" : "not applied", storage_type_name(d.dtype),
                fmt::format("{}", fmt::join(d.layers, ",")).c_str(), static_cast<long long>(d.tokens),
                static_cast<long long>(d.num_sequences()));
    if (d.queries_kept_last > 0)
      std::printf("queries     kept for the last %lld tokens of each sequence (evaluation dump)\n",
                  static_cast<long long>(d.queries_kept_last));
    std::printf("provenance  %s\n", d.provenance_json.c_str());
    if (!summary.empty()) std::printf("\n%s", render_report(summary_table(summary), ReportFormat::markdown).c_str());
    return 0;
  });
}
