// Text helpers shared by the prof reports (report.cc, compare.cc): number formatting, aligned
// text tables and CSV fields. Internal header.
#pragma once

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace molora::prof {

// `v` with `prec` decimals.
inline std::string fmt(double v, int prec = 1) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", prec, v);
  return b;
}

// Aligned text table: column 0 and the columns in `left` left-aligned, the rest right-aligned,
// two spaces between columns, trailing blanks trimmed.
inline std::string format_table(const std::vector<std::vector<std::string>>& rows,
                                const std::set<size_t>& left = {}) {
  std::vector<size_t> w;
  for (auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::string o;
  for (auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      std::string pad(w[i] - r[i].size(), ' ');
      line += (i == 0 || left.count(i)) ? r[i] + pad : pad + r[i];
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    o += line + "\n";
  }
  return o;
}

// One CSV field, quoted when it holds a comma, a quote or a newline.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

// One CSV line.
inline std::string csv_row(const std::vector<std::string>& r) {
  std::string o;
  for (size_t i = 0; i < r.size(); ++i) o += (i ? "," : "") + csv_field(r[i]);
  return o + "\n";
}

}  // namespace molora::prof
