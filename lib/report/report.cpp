// Report rendering (see report.h).
#include "report/report.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace oscar {

ReportFormat parse_report_format(const std::string& name) {
  if (name == "md" || name == "markdown") return ReportFormat::markdown;
  if (name == "csv") return ReportFormat::csv;
  if (name == "json") return ReportFormat::json;
  if (name == "jsonl") return ReportFormat::jsonl;
  fail("unknown format '{}' (md, csv, json or jsonl)", name);
}

void ReportTable::add_row(std::vector<ReportValue> row) {
  OSCAR_CHECK(row.size() == fields.size(), "report row has {} values for {} fields", row.size(), fields.size());
  rows.push_back(std::move(row));
}

static std::string text_of(const ReportValue& value, int precision) {
  if (auto s = std::get_if<std::string>(&value)) return *s;
  if (auto i = std::get_if<long>(&value)) return std::to_string(*i);
  double d = std::get<double>(value);
  if (precision < 0) return fmt::format("{}", d);
  if (d != 0 && (std::fabs(d) < 1e-3 || std::fabs(d) >= 1e6)) return fmt::format("{:.{}e}", d, std::max(precision - 1, 1));
  return fmt::format("{:.{}f}", d, precision);
}

static nlohmann::ordered_json json_of(const ReportValue& value) {
  if (auto s = std::get_if<std::string>(&value)) return *s;
  if (auto i = std::get_if<long>(&value)) return *i;
  double d = std::get<double>(value);
  if (!std::isfinite(d)) return nullptr;
  return d;
}

std::string render_report(const ReportTable& table, ReportFormat format) {
  std::string out;
  switch (format) {
    case ReportFormat::markdown: {
      std::vector<std::vector<std::string>> cells;
      std::vector<size_t> width(table.fields.size());
      for (size_t c = 0; c < table.fields.size(); ++c) width[c] = table.fields[c].size();
      for (const auto& row : table.rows) {
        cells.emplace_back();
        for (size_t c = 0; c < row.size(); ++c) {
          cells.back().push_back(text_of(row[c], table.markdown_precision));
          width[c] = std::max(width[c], cells.back().back().size());
        }
      }
      auto line = [&](const std::vector<std::string>& values) {
        out += "|";
        for (size_t c = 0; c < values.size(); ++c) out += fmt::format(" {:<{}} |", values[c], width[c]);
        out += "\n";
      };
      line(table.fields);
      out += "|";
      for (size_t c = 0; c < width.size(); ++c) out += std::string(width[c] + 2, '-') + "|";
      out += "\n";
      for (const auto& row : cells) line(row);
      break;
    }
    case ReportFormat::csv: {
      for (size_t c = 0; c < table.fields.size(); ++c) out += (c ? "," : "") + table.fields[c];
      out += "\n";
      for (const auto& row : table.rows) {
        for (size_t c = 0; c < row.size(); ++c) {
          std::string text = text_of(row[c], -1);
          if (text.find_first_of(",\"\n") != std::string::npos) {
            std::string quoted = "\"";
            for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
            text = quoted + "\"";
          }
          out += (c ? "," : "") + text;
        }
        out += "\n";
      }
      break;
    }
    case ReportFormat::json:
    case ReportFormat::jsonl: {
      nlohmann::ordered_json array = nlohmann::ordered_json::array();
      for (const auto& row : table.rows) {
        nlohmann::ordered_json object = nlohmann::ordered_json::object();
        for (size_t c = 0; c < row.size(); ++c) object[table.fields[c]] = json_of(row[c]);
        if (format == ReportFormat::jsonl)
          out += object.dump() + "\n";
        else
          array.push_back(object);
      }
      if (format == ReportFormat::json) out = array.dump(2) + "\n";
      break;
    }
  }
  return out;
}

}  // namespace oscar
