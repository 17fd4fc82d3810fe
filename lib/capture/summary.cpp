// Dump summaries (see summary.h), streamed block by block.
#include "capture/summary.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include <fmt/ranges.h>

namespace oscar {
namespace {

struct Accumulator {
  std::vector<double> channel_square_sum;  // [d]
  double norm_sum = 0, max_abs = 0;
  int64_t vectors = 0;
  void add(const std::vector<float>& data, int d) {
    if (channel_square_sum.empty()) channel_square_sum.assign(d, 0.0);
    for (size_t i = 0; i < data.size(); i += d) {
      double squared = 0;
      for (int c = 0; c < d; ++c) {
        const double x = data[i + c];
        squared += x * x;
        channel_square_sum[c] += x * x;
        max_abs = std::max(max_abs, std::fabs(x));
      }
      norm_sum += std::sqrt(squared);
      ++vectors;
    }
  }
  TensorSummary finish() const {
    TensorSummary s;
    s.mean_norm = vectors ? norm_sum / vectors : 0;
    s.max_abs = max_abs;
    std::vector<double> rms(channel_square_sum.size());
    for (size_t c = 0; c < rms.size(); ++c) rms[c] = std::sqrt(channel_square_sum[c] / std::max<int64_t>(vectors, 1));
    std::vector<int> order(rms.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return rms[a] > rms[b]; });
    for (size_t i = 0; i < std::min<size_t>(3, order.size()); ++i) s.top_channels.push_back(order[i]);
    std::vector<double> sorted = rms;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    s.outlier_ratio = median > 0 ? rms[order[0]] / median : 0;
    return s;
  }
};

}  // namespace

std::vector<LayerSummary> summarize_dump(const DumpReader& dump, int64_t block_tokens) {
  const int d = dump.info().geometry.head_dim;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<LayerSummary> result;
  LayerActivations a;  // reused block by block
  for (int layer : dump.info().layers) {
    Accumulator q, k, v;
    for (int64_t first = 0; first < dump.info().tokens; first += block_tokens) {
      dump.read_layer_into(a, layer, first, std::min(block_tokens, dump.info().tokens - first), threads);
      q.add(a.q, d);
      k.add(a.k, d);
      v.add(a.v, d);
    }
    result.push_back({layer, q.finish(), k.finish(), v.finish()});
  }
  return result;
}

ReportTable summary_table(const std::vector<LayerSummary>& layers) {
  ReportTable table;
  table.fields = {"layer", "q_norm", "k_norm", "v_norm", "k_max_abs", "k_outlier_ratio", "k_top_channels",
                  "q_outlier_ratio", "v_outlier_ratio"};
  table.markdown_precision = 2;
  for (const auto& l : layers)
    table.add_row({static_cast<long>(l.layer), l.q.mean_norm, l.k.mean_norm, l.v.mean_norm, l.k.max_abs,
                   l.k.outlier_ratio, fmt::format("{}", fmt::join(l.k.top_channels, " ")), l.q.outlier_ratio,
                   l.v.outlier_ratio});
  return table;
}

}  // namespace oscar
