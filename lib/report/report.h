// One report layer for every tool (llama-bench style): a table is a list of named fields and rows of
// values; it renders as a markdown table (for people) or csv / json / jsonl (for scripts).
#pragma once
#include <string>
#include <variant>
#include <vector>

namespace oscar {

enum class ReportFormat { markdown, csv, json, jsonl };
ReportFormat parse_report_format(const std::string& name);  // "md" | "csv" | "json" | "jsonl"

using ReportValue = std::variant<std::string, long, double>;

struct ReportTable {
  std::vector<std::string> fields;
  std::vector<std::vector<ReportValue>> rows;
  // Digits after the point for doubles in markdown (csv/json keep full precision).
  int markdown_precision = 4;
  void add_row(std::vector<ReportValue> row);  // throws unless row.size() == fields.size()
};

std::string render_report(const ReportTable& table, ReportFormat format);

}  // namespace oscar
