// oscar-bench: times the CUDA decode kernels (INT2 paged split-K decode, our BF16 flash-decode baseline)
// and the quantise-pack kernel on one GPU, next to the HBM bandwidth measured in the same run.
// Results on stdout (md/csv/json/jsonl), progress on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda_paged.h"
#include "bandwidth_probe.h"
#include "cli/options.h"
#include "paged_decode.h"
#include "common/error.h"
#include "quantize_pack.h"
#include "report/report.h"

namespace oscar {
namespace {

struct Timing {
  double median_us = 0, noise_pct = 0;
  double sm_mhz = 0;  // median SM clock right after each timed call
};

// How the L2 is emptied before each sample. read: stream a buffer twice the L2 through it, leaving
// clean lines (a cold cache); write: memset such a buffer, leaving dirty lines whose write-back to HBM
// is then charged to the timed call (the method of the first round of numbers); none: warm L2.
enum class Flush { read, write, none };

// Each case starts after settle_ms of an idle GPU: under sustained load the GPU's power cap lowers the SM
// clock (H200: from 1980 to 1350-1530 MHz within seconds), so without a pause a case would be timed at a
// clock set by the cases before it. The SM clock after every timed call is measured and reported.
class Timer {
 public:
  Timer(int warmup, int iterations, int settle_ms, size_t flush_bytes, Flush flush)
      : warmup_(warmup), iterations_(iterations), settle_ms_(settle_ms), mode_(flush) {
    flush_.resize(flush_bytes);
    sink_.resize(1);
    clocks_.resize(2 * static_cast<size_t>(iterations));
    kernels::launch_fill_random_bytes(flush_.get(), flush_bytes, 77, nullptr);
    cuda_check(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Median over samples; before each sample the L2 is flushed as mode_ says.
  Timing time(const std::function<void()>& body) {
    if (settle_ms_ > 0) {
      cuda_check(cudaDeviceSynchronize(), "settle");
      std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms_));
    }
    for (int i = 0; i < warmup_; ++i) body();
    cuda_check(cudaGetLastError(), "warm-up launch");
    cuda_check(cudaDeviceSynchronize(), "warm-up");
    std::vector<double> us;
    for (int i = 0; i < iterations_; ++i) {
      if (mode_ == Flush::write) {
        cuda_check(cudaMemsetAsync(flush_.get(), i & 0xff, flush_.size()), "L2 flush");
      } else if (mode_ == Flush::read) {
        kernels::BandwidthProbeParams p;
        p.source = reinterpret_cast<const uint4*>(flush_.get());
        p.n16 = flush_.size() / 16;
        p.sink = sink_.get();
        kernels::launch_read_probe(p, nullptr);
      }
      cuda_check(cudaEventRecord(start_), "cudaEventRecord");
      body();
      cuda_check(cudaEventRecord(stop_), "cudaEventRecord");
      kernels::launch_clock_probe(clocks_.get() + 2 * i, 20000, nullptr);  // after the stop event: not timed
      cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      us.push_back(ms * 1000.0);
    }
    cuda_check(cudaGetLastError(), "timed launch");
    std::sort(us.begin(), us.end());
    Timing t;
    t.median_us = us[us.size() / 2];
    const double mean = std::accumulate(us.begin(), us.end(), 0.0) / us.size();
    double var = 0;
    for (double u : us) var += (u - mean) * (u - mean);
    t.noise_pct = 100.0 * std::sqrt(var / us.size()) / mean;
    const std::vector<unsigned long long> clocks = clocks_.download();
    std::vector<double> mhz;
    for (int i = 0; i < iterations_; ++i) mhz.push_back(1000.0 * clocks[2 * i] / std::max(1ull, clocks[2 * i + 1]));
    std::sort(mhz.begin(), mhz.end());
    t.sm_mhz = mhz[mhz.size() / 2];
    return t;
  }

 private:
  int warmup_, iterations_, settle_ms_;
  Flush mode_;
  DeviceBuffer<uint8_t> flush_;
  DeviceBuffer<unsigned> sink_;
  DeviceBuffer<unsigned long long> clocks_;  // [iterations] {SM cycles, ns} of the clock probe
  cudaEvent_t start_{}, stop_{};
};

std::string human_tokens(long n) {
  if (n % 1024 == 0) return fmt::format("{}K", n / 1024);
  return std::to_string(n);
}

int bench_main(int argc, char** argv) {
  CLI::App app{
      "oscar-bench: time the CUDA decode kernels (INT2 paged split-K decode vs our BF16 flash-decode) and the\n"
      "rotate-clip-quantise-pack kernel, with the HBM bandwidth measured in the same run.\n\n"
      "Examples:\n"
      "  oscar-bench                                   # Qwen3-8B geometry, batch 1,8,32,64 x context 8K..128K\n"
      "  oscar-bench --batch 1 --context 102400        # the anchor shape\n"
      "  oscar-bench --head-dim 64 --q-heads 16 --kv-heads 16 --batch 8 --context 32K --format csv\n"
      "  oscar-bench --batch 8,32 --context 32768 --ragged --format json -o bench.json\n"
      "  oscar-bench --kernels int2 --int2-metadata fp32,fp16   # both INT2 metadata layouts"};
  CommonOptions common;
  int q_heads = 32, kv_heads = 8, head_dim = 128, sink = 64, recent = 256, int2_page = 64, bf16_page = 64;
  int warmup = 5, iterations = 30, settle_ms = 500, ctas_per_sm = 0;
  std::string quant_rows_spec = "1048576", clip_spec = "0.96";
  std::string batch_spec = "1,8,32,64", context_spec = "8192,32768,102400,131072", format = "md";
  std::string kernels_spec = "int2,bf16,quant", flush = "read", metadata_spec = "fp32";
  bool ragged = false;
  app.add_option("--q-heads", q_heads, "query heads (Hq)")->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "KV heads (Hkv); Hq/Hkv must be 1..8")->capture_default_str();
  app.add_option("--head-dim", head_dim, "head dimension d: 64, 128 or 256")->capture_default_str();
  app.add_option("--batch", batch_spec, "batch sizes, comma list or start:end:step")->capture_default_str();
  app.add_option("--context", context_spec, "context lengths in tokens (K suffix allowed: 32K)")->capture_default_str();
  app.add_flag("--ragged", ragged, "also time ragged batches (lengths spread over [context/4, context])");
  std::string ragged_order = "ascending";
  app.add_option("--ragged-order", ragged_order,
                 "order of the ragged batch's lengths: ascending (shortest first) or descending (the decode planner "
                 "runs both alike: shortest first, or largest first where it prefers that)")
      ->check(CLI::IsMember({"ascending", "descending"}))
      ->capture_default_str();
  app.add_option("--sink", sink, "BF16 sink tokens of the INT2 cache")->capture_default_str();
  app.add_option("--recent", recent, "BF16 recent-window tokens of the INT2 cache")->capture_default_str();
  app.add_option("--int2-page", int2_page, "INT2 page size (multiple of 16)")->capture_default_str();
  app.add_option("--bf16-page", bf16_page, "BF16 page size (multiple of 32)")->capture_default_str();
  app.add_option("--int2-metadata", metadata_spec,
                 "storage of the INT2 (scale, zero) per token, comma list: fp32 (the reference serving layout, 16 B "
                 "per token and KV head) and/or fp16 (8 B; pages of >= 32 tokens)")
      ->capture_default_str();
  app.add_option("--ctas-per-sm", ctas_per_sm, "split planning: resident CTAs per multiprocessor (0: the kernel's occupancy)")->capture_default_str();
  app.add_option("--quant-rows", quant_rows_spec,
                 "rows per quantise-pack call (list; e.g. 4096 = a decode step demoting 8 tokens of batch 64 x 8 KV "
                 "heads; 0 skips the quantise-pack)")
      ->capture_default_str();
  app.add_option("--clip-ratio", clip_spec,
                 "quantise-pack clip ratios (list in (0, 1]; the reference uses 0.96 for keys, 0.92 for values; 1 = "
                 "no clipping)")
      ->capture_default_str();
  app.add_option("--kernels", kernels_spec, "which benchmarks: int2,bf16,quant")->capture_default_str();
  app.add_option("--warmup", warmup, "warm-up calls per case")->capture_default_str();
  app.add_option("--iterations", iterations, "timed calls per case (median reported)")->capture_default_str();
  app.add_option("--settle-ms", settle_ms,
                 "idle milliseconds before each case, so that every case starts at the same SM clock (the power "
                 "cap lowers it under sustained load; 0: no pause, cases run back to back)")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  app.add_option("--format", format, "md, csv, json or jsonl")->capture_default_str();
  app.add_option("--flush", flush,
                 "L2 state before each sample: read (stream 2x L2 through it: clean, cold), write (memset: "
                 "dirty lines, their write-back is timed too) or none (warm)")
      ->check(CLI::IsMember({"read", "write", "none"}))
      ->capture_default_str();
  add_common_options(app, common);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const ReportFormat report_format = parse_report_format(format);
  OSCAR_CHECK(kv_heads >= 1 && q_heads % kv_heads == 0 && q_heads / kv_heads <= 8,
              "--q-heads {} / --kv-heads {}: the GQA ratio must be an integer from 1 to 8", q_heads, kv_heads);
  OSCAR_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, "--head-dim {} is not supported (64, 128, 256)",
              head_dim);
  for (char& ch : context_spec) ch = ch == 'k' ? 'K' : ch;
  std::string expanded;
  for (const auto& item : split_list(context_spec)) {
    std::string x = item;
    if (!x.empty() && x.back() == 'K') x = std::to_string(std::stol(x.substr(0, x.size() - 1)) * 1024);
    expanded += (expanded.empty() ? "" : ",") + x;
  }
  const std::vector<long> batches = parse_int_list(batch_spec), contexts = parse_int_list(expanded);
  const auto kernel_list = split_list(kernels_spec);
  const auto metadata_list = split_list(metadata_spec);
  OSCAR_CHECK(!metadata_list.empty(), "--int2-metadata: give fp32, fp16 or both");
  for (const auto& m : metadata_list)
    OSCAR_CHECK(m == "fp32" || m == "fp16", "--int2-metadata: '{}' is not fp32 or fp16", m);
  OSCAR_CHECK(int2_page >= 32 || std::find(metadata_list.begin(), metadata_list.end(), "fp16") == metadata_list.end(),
              "--int2-page {}: the fp16 metadata layout needs pages of >= 32 tokens", int2_page);
  const std::vector<long> quant_rows_list = parse_int_list(quant_rows_spec);
  for (long r : quant_rows_list) OSCAR_CHECK(r >= 0, "--quant-rows {}: a row count cannot be negative", r);
  const std::vector<double> clip_list = parse_real_list(clip_spec);
  for (double c : clip_list) OSCAR_CHECK(c > 0 && c <= 1, "--clip-ratio {}: need a ratio in (0, 1]", c);
  auto wants = [&](const char* k) { return std::find(kernel_list.begin(), kernel_list.end(), k) != kernel_list.end(); };
  auto log = [&](const std::string& line) {
    if (!common.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  };

  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const int sms = prop.multiProcessorCount;
  log(fmt::format("device: {} ({} SMs, {:.1f} GiB, L2 {} MB)", prop.name, sms, prop.totalGlobalMem / 1073741824.0,
                  prop.l2CacheSize >> 20));
  const Flush flush_mode = flush == "write" ? Flush::write : flush == "none" ? Flush::none : Flush::read;
  OSCAR_CHECK(iterations >= 1 && warmup >= 0, "--iterations {} / --warmup {}: need iterations >= 1 and warmup >= 0",
              iterations, warmup);
  Timer timer(warmup, iterations, settle_ms, std::max<size_t>(2 * static_cast<size_t>(prop.l2CacheSize), 64u << 20),
              flush_mode);
  log(fmt::format("L2 flush before each sample: {}", flush));

  ReportTable table;
  // int2_splits / bf16_splits / split_plan: the decode's split plan (split_plan: parallel-merge, table = a split
  // table of falling or equal sizes, equal = equal chunks, pieces = each sequence of a ragged batch in pieces of its
  // own (int2_splits is then the most pieces of any sequence); merged by each pair's last CTA, or with the suffix
  // +merge-ctas (grids of one to two waves) by a merge CTA per pair at the end of the grid, +merge-ctas-xN by N per
  // pair, each un-rotating 1/N of the output columns). Quantise-pack rows: batch = rows, split_plan = the kernel the
  // call took (kernels::QuantizePackPath: thread-per-row, the fast path; tc-warp-per-row, rotated with clip
  // thresholds below the 32 largest magnitudes and enough rows; warp-per-row, such thresholds otherwise, or a GPU
  // without the fast path's shared memory), clip_ratio as given.
  table.fields = {"kernel", "batch", "context", "ragged", "int2_metadata", "clip_ratio", "launches",
                  "int2_splits", "bf16_splits", "split_plan", "mbytes", "time_us", "noise_pct", "sm_mhz", "tbps",
                  "pct_peak", "floor_us", "pct_floor", "speedup_vs_bf16", "gpu"};
  const auto split_plan = [](const PagedCacheGeometry& g, const CudaDecodePlan& plan) {
    const bool parallel = runs_parallel_merge(g, plan);
    if (parallel) return std::string("parallel-merge");
    const std::string merge = !plan.merge_ctas            ? ""
                              : plan.merge_cta_parts == 1 ? "+merge-ctas"
                                                          : fmt::format("+merge-ctas-x{}", plan.merge_cta_parts);
    if (!plan.int2_pieces.empty()) return "pieces" + merge;
    return (runs_split_table(plan, parallel) ? "table" : "equal") + merge;
  };
  table.markdown_precision = 2;
  const std::string gpu = prop.name;

  // HBM bandwidth: 2 GiB copy (bytes read + written) and 2 GiB read-only.
  const size_t probe_bytes = size_t{2} << 30;
  double peak_tbps = 0;
  // Kept for the per-call floors below.
  DeviceBuffer<uint8_t> a(probe_bytes);
  DeviceBuffer<unsigned> sink_word(1);
  {
    DeviceBuffer<uint8_t> b(probe_bytes);
    kernels::launch_fill_random_bytes(a.get(), probe_bytes, 1, nullptr);
    kernels::BandwidthProbeParams p;
    p.source = reinterpret_cast<const uint4*>(a.get());
    p.destination = reinterpret_cast<uint4*>(b.get());
    p.n16 = probe_bytes / 16;
    p.sink = sink_word.get();
    Timing copy = timer.time([&] { kernels::launch_copy_probe(p, nullptr); });
    Timing read = timer.time([&] { kernels::launch_read_probe(p, nullptr); });
    const double copy_tbps = 2.0 * probe_bytes / (copy.median_us * 1e-6) / 1e12;
    const double read_tbps = 1.0 * probe_bytes / (read.median_us * 1e-6) / 1e12;
    peak_tbps = std::max(copy_tbps, read_tbps);
    const std::string dash("-");
    table.add_row({std::string("hbm_copy"), 0L, 0L, dash, dash, dash, 1L, dash, dash, dash, 2.0 * probe_bytes / 1e6,
                   copy.median_us, copy.noise_pct, copy.sm_mhz, copy_tbps, 100.0 * copy_tbps / peak_tbps, dash, dash,
                   dash, gpu});
    table.add_row({std::string("hbm_read"), 0L, 0L, dash, dash, dash, 1L, dash, dash, dash, 1.0 * probe_bytes / 1e6,
                   read.median_us, read.noise_pct, read.sm_mhz, read_tbps, 100.0 * read_tbps / peak_tbps, dash, dash,
                   dash, gpu});
    log(fmt::format("HBM: copy {:.2f} TB/s, read {:.2f} TB/s (SM {:.0f} MHz)", copy_tbps, read_tbps, read.sm_mhz));
    // The floor of any one-launch call timed this way: the read probe over 64 KB (4 CTAs), i.e. a launch, one
    // cold HBM round trip and the events around it. The small decode calls are measured against it.
    kernels::BandwidthProbeParams tiny = p;
    tiny.n16 = 4096;
    Timing floor = timer.time([&] { kernels::launch_read_probe(tiny, nullptr); });
    table.add_row({std::string("launch_floor"), 0L, 0L, dash, dash, dash, 1L, dash, dash, dash, 16.0 * tiny.n16 / 1e6,
                   floor.median_us, floor.noise_pct, floor.sm_mhz, dash, dash, dash, dash, dash, gpu});
    log(fmt::format("launch floor (one launch, one cold read): {:.1f} us", floor.median_us));
  }
  auto pct = [&](double tbps) { return 100.0 * tbps / peak_tbps; };
  // The floor of a decode call: the read probe over the same number of bytes (one launch, cold L2, timed the same
  // way), i.e. what a plain streaming read of the call's bytes takes on this board; pct_floor = floor / time.
  // Calls of more than the probe buffer get "-" (their pct_peak says the same).
  auto floor_columns = [&](double bytes, double time_us) -> std::pair<ReportValue, ReportValue> {
    if (bytes > static_cast<double>(probe_bytes)) return {std::string("-"), std::string("-")};
    kernels::BandwidthProbeParams p;
    p.source = reinterpret_cast<const uint4*>(a.get());
    p.n16 = std::max<size_t>(1, static_cast<size_t>(bytes / 16));
    p.sink = sink_word.get();
    const Timing floor = timer.time([&] { kernels::launch_read_probe(p, nullptr); });
    return {floor.median_us, 100.0 * floor.median_us / time_us};
  };

  PagedCacheGeometry geometry;
  geometry.num_kv_heads = kv_heads;
  geometry.group = q_heads / kv_heads;
  geometry.head_dim = head_dim;
  geometry.int2_page_size = int2_page;
  geometry.bf16_page_size = bf16_page;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  for (long context : contexts) {
    for (long batch : batches) {
      for (int rag = 0; rag <= (ragged && batch > 1 ? 1 : 0); ++rag) {
        std::vector<int32_t> lengths(batch);
        for (long b = 0; b < batch; ++b) {
          const long rank = ragged_order == "ascending" ? b : batch - 1 - b;
          lengths[b] = rag ? static_cast<int32_t>(context / 4 + (context - context / 4) * rank / std::max(1L, batch - 1))
                           : static_cast<int32_t>(context);
        }
        geometry.batch = static_cast<int>(batch);
        const int tiers = sink + recent;
        std::vector<int32_t> int2_len(batch), tier_len(batch), zeros(batch, 0);
        for (long b = 0; b < batch; ++b) {
          tier_len[b] = std::min(lengths[b], tiers);
          int2_len[b] = lengths[b] - tier_len[b];
        }
        size_t free_bytes = 0, total_bytes = 0;
        cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
        const size_t bf16_need = paged_cache_device_bytes(geometry, zeros, lengths);
        const size_t qn = static_cast<size_t>(batch) * q_heads * head_dim;
        DeviceBuffer<float> queries(qn), out(qn), rotation_t(static_cast<size_t>(head_dim) * head_dim);
        kernels::launch_fill_random_float(queries.get(), qn, 11, nullptr);
        kernels::launch_fill_random_float(rotation_t.get(), rotation_t.size(), 12, nullptr);
        CudaPagedDecoder decoder;
        const std::string rag_label = rag ? "ragged" : "uniform";
        double bf16_us = 0;
        if (wants("bf16")) {
          if (bf16_need > free_bytes * 0.9) {
            log(fmt::format("skip bf16 batch {} context {}: needs {:.1f} GB", batch, context, bf16_need / 1e9));
          } else {
            DevicePagedCache cache;
            cache.allocate_random(geometry, zeros, lengths, 100 + context + batch);
            CudaDecodePlan plan = plan_cuda_decode(cache, sms, ctas_per_sm);
            Timing t = timer.time([&] {
              decoder.run(cache, plan, queries.get(), softmax_scale, nullptr, out.get());
            });
            long tokens = std::accumulate(lengths.begin(), lengths.end(), 0L);
            const double bytes = 1.0 * tokens * kv_heads * 4 * head_dim;
            const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
            bf16_us = t.median_us;
            const long launches = kernels::fused_merge_fits(plan.splits_total(), geometry.group, head_dim) ? 1L : 2L;
            const auto [floor_us, pct_floor] = floor_columns(bytes, t.median_us);
            table.add_row({std::string("bf16_decode"), batch, context, rag_label, std::string("-"), std::string("-"),
                           launches, static_cast<long>(plan.int2_splits), static_cast<long>(plan.bf16_splits),
                           split_plan(geometry, plan), bytes / 1e6, t.median_us,
                           t.noise_pct, t.sm_mhz, tbps, pct(tbps), floor_us, pct_floor, 1.0, gpu});
            log(fmt::format("bf16_decode  B={} L={} {}: {:.1f} us, {:.2f} TB/s, SM {:.0f} MHz ({} splits)", batch,
                            context, rag_label, t.median_us, tbps, t.sm_mhz, plan.splits_total()));
          }
        }
        for (const std::string& metadata : wants("int2") ? metadata_list : std::vector<std::string>{}) {
          geometry.int2_metadata_fp16 = metadata == "fp16";
          const size_t int2_need = paged_cache_device_bytes(geometry, int2_len, tier_len);
          if (int2_need > free_bytes * 0.9) {
            log(fmt::format("skip int2 batch {} context {} ({} metadata): needs {:.1f} GB", batch, context, metadata,
                            int2_need / 1e9));
          } else {
            DevicePagedCache cache;
            cache.allocate_random(geometry, int2_len, tier_len, 200 + context + batch);
            CudaDecodePlan plan = plan_cuda_decode(cache, sms, ctas_per_sm);
            Timing t = timer.time([&] {
              decoder.run(cache, plan, queries.get(), softmax_scale, rotation_t.get(), out.get());
            });
            long t2 = std::accumulate(int2_len.begin(), int2_len.end(), 0L);
            long t16 = std::accumulate(tier_len.begin(), tier_len.end(), 0L);
            const double bytes = 1.0 * t2 * kv_heads * (2 * head_dim / 4 + geometry.int2_metadata_row_bytes()) +
                                 1.0 * t16 * kv_heads * 4 * head_dim;
            const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
            const long launches = kernels::fused_merge_fits(plan.splits_total(), geometry.group, head_dim) ? 1L : 2L;
            const auto [floor_us, pct_floor] = floor_columns(bytes, t.median_us);
            table.add_row({std::string("int2_decode"), batch, context, rag_label, metadata, std::string("-"), launches,
                           static_cast<long>(plan.int2_splits), static_cast<long>(plan.bf16_splits),
                           split_plan(geometry, plan), bytes / 1e6,
                           t.median_us, t.noise_pct, t.sm_mhz, tbps, pct(tbps), floor_us, pct_floor,
                           bf16_us > 0 ? ReportValue(bf16_us / t.median_us) : ReportValue(std::string("-")), gpu});
            log(fmt::format("int2_decode  B={} L={} {} {}: {:.1f} us, {:.2f} TB/s, SM {:.0f} MHz ({}+{} splits, "
                            "chunk {})",
                            batch, context, rag_label, metadata, t.median_us, tbps, t.sm_mhz, plan.int2_splits,
                            plan.bf16_splits, plan.int2_chunk));
          }
        }
      }
    }
  }

  for (const long quant_rows : wants("quant") ? quant_rows_list : std::vector<long>{}) {
    if (quant_rows == 0) continue;
    const size_t n = static_cast<size_t>(quant_rows) * head_dim;
    DeviceBuffer<float> input(n), meta(static_cast<size_t>(quant_rows) * 2),
        rotation(static_cast<size_t>(head_dim) * head_dim);
    DeviceBuffer<uint8_t> codes(static_cast<size_t>(quant_rows) * head_dim / 4);
    kernels::launch_fill_random_float(input.get(), n, 21, nullptr);
    kernels::launch_fill_random_float(rotation.get(), rotation.size(), 22, nullptr);
    for (const double clip : clip_list) {
      for (int rotate = 0; rotate <= 1; ++rotate) {
        kernels::QuantizePackParams p;
        p.rows = quant_rows;
        p.head_dim = head_dim;
        p.input = input.get();
        p.rotation = rotate ? rotation.get() : nullptr;
        p.clip_ratio = static_cast<float>(clip);
        p.metadata = kernels::MetadataRounding::fp32;
        p.codes = codes.get();
        p.metadata_out = meta.get();
        // Allocated once, as a server would.
        DeviceBuffer<uint8_t> workspace(kernels::quantize_pack_workspace_bytes(p));
        p.workspace = workspace.get();
        Timing t = timer.time([&] { kernels::launch_quantize_pack(p, nullptr); });
        const double bytes = 1.0 * quant_rows * (head_dim * 4 + head_dim / 4 + 8);
        const long launches = workspace.size() > 0 ? 2 : 1;  // a workspace holds R split by a kernel of its own
        const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
        const std::string path = kernels::quantize_pack_path_name(kernels::quantize_pack_path(p));
        const std::string kernel = rotate ? "quantize_pack_rotate" : "quantize_pack";
        const auto [floor_us, pct_floor] = floor_columns(bytes, t.median_us);
        table.add_row({kernel, quant_rows, 0L, std::string("-"), std::string("fp32"), clip, launches,
                       std::string("-"), std::string("-"), path, bytes / 1e6, t.median_us, t.noise_pct, t.sm_mhz,
                       tbps, pct(tbps), floor_us, pct_floor, std::string("-"), gpu});
        log(fmt::format("{} rows={} clip={} ({}): {:.1f} us, {:.2f} TB/s, SM {:.0f} MHz", kernel, quant_rows, clip,
                        path, t.median_us, tbps, t.sm_mhz));
      }
    }
  }

  const std::string text = render_report(table, report_format);
  if (common.output.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::FILE* f = std::fopen(common.output.c_str(), "w");
    OSCAR_CHECK(f, "cannot open {} for writing", common.output);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace oscar

int main(int argc, char** argv) { return oscar::run_tool(argc, argv, oscar::bench_main); }
