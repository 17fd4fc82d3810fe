// Per-layer summary of a dump for `oscar-capture info`: token norms and channel outliers of Q, K, V
// (real keys show a few channels far above the rest; that is what makes naive INT2 fail).
#pragma once
#include <string>
#include <vector>

#include "io/dump.h"
#include "report/report.h"

namespace oscar {

struct TensorSummary {
  double mean_norm = 0;        // mean L2 norm of one head's vector
  double max_abs = 0;          // largest |x|
  double outlier_ratio = 0;    // largest channel RMS / median channel RMS (channels pooled over heads)
  std::vector<int> top_channels;  // the 3 channels with the largest RMS
};

struct LayerSummary {
  int layer = 0;
  TensorSummary q, k, v;
};

std::vector<LayerSummary> summarize_dump(const DumpReader& dump, int64_t block_tokens = 4096);
ReportTable summary_table(const std::vector<LayerSummary>& layers);

}  // namespace oscar
