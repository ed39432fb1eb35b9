// Reports: aligned text tables, JSON (versioned schemas, see docs/prof.md), CSV, SVG.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "molora/prof.h"
#include "prof/text.h"

namespace molora::prof {
namespace {

using nlohmann::ordered_json;

std::string pct(double share) { return fmt(100.0 * share, 1) + "%"; }

// Text table: first column left-aligned, the rest right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> head) { rows_.push_back(std::move(head)); }
  void add(std::vector<std::string> r) { rows_.push_back(std::move(r)); }
  std::string str() const { return format_table(rows_, left_); }
  void left(size_t col) { left_.insert(col); }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::set<size_t> left_;
};

std::string trunc(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}
std::string num(uint64_t v) { return std::to_string(v); }

void add_warnings(ordered_json& j, const std::vector<std::string>& w, bool truncated) {
  j["truncated"] = truncated;
  j["warnings"] = w;
}

ordered_json summary_obj(const Summary& s, int top_n) {
  ordered_json j;
  j["path"] = s.path;
  j["rank"] = s.rank;
  add_warnings(j, s.warnings, s.truncated);
  j["events"] = s.events, j["bytes"] = s.bytes, j["devices"] = s.devices;
  j["kernels"] = s.kernels, j["kernel_us"] = s.kernel_us, j["busy_us"] = s.busy_us;
  j["wall_us"] = s.wall_us;
  j["memcpy"] = {{"count", s.memcpys}, {"time_us", s.memcpy_us}};
  j["memset"] = {{"count", s.memsets}, {"time_us", s.memset_us}};
  ordered_json cats = ordered_json::array();
  for (int i = 0; i < kNumCategories; ++i)
    cats.push_back({{"category", category_name(static_cast<Category>(i))},
                    {"time_us", s.categories[i].time_us},
                    {"share", s.categories[i].share},
                    {"count", s.categories[i].count}});
  j["categories"] = cats;
  ordered_json top = ordered_json::array();
  for (size_t i = 0; i < s.top.size() && (top_n < 0 || static_cast<int>(i) < top_n); ++i) {
    const auto& k = s.top[i];
    top.push_back({{"name", k.name},
                   {"category", category_name(k.category)},
                   {"count", k.count},
                   {"total_us", k.total_us},
                   {"mean_us", k.mean_us},
                   {"min_us", k.min_us},
                   {"max_us", k.max_us},
                   {"share", s.kernel_us > 0 ? k.total_us / s.kernel_us : 0},
                   {"configs", k.configs},
                   {"num_configs", k.num_configs}});
  }
  j["top_kernels"] = top;
  return j;
}

}  // namespace

std::string summary_text(const Summary& s, int top_n) {
  std::ostringstream o;
  o << "trace " << s.path << (s.rank >= 0 ? "  (rank " + std::to_string(s.rank) + ")" : "") << "\n";
  o << "events " << s.events << ", " << fmt(s.bytes / 1e6, 1) << " MB JSON, " << s.devices
    << " device(s)\n";
  o << "kernel time " << fmt(s.kernel_us) << " us in " << s.kernels << " kernels; busy "
    << fmt(s.busy_us) << " us; wall " << fmt(s.wall_us) << " us";
  if (s.wall_us > 0) o << " (busy " << pct(s.busy_us / s.wall_us) << " of wall)";
  o << "\nmemcpy " << fmt(s.memcpy_us) << " us (" << s.memcpys << "), memset " << fmt(s.memset_us)
    << " us (" << s.memsets << ")\n\n";
  Table c({"category", "time_us", "share", "count"});
  for (int i = 0; i < kNumCategories; ++i) {
    const auto& x = s.categories[i];
    if (x.count == 0) continue;
    c.add({category_name(static_cast<Category>(i)), fmt(x.time_us), pct(x.share), num(x.count)});
  }
  c.add({"kernel total", fmt(s.kernel_us), pct(s.kernel_us > 0 ? 1 : 0), num(s.kernels)});
  o << c.str() << "\n";
  Table k({"kernel", "category", "count", "total_us", "mean_us", "share", "grid/block"});
  k.left(1);
  k.left(6);
  for (size_t i = 0; i < s.top.size() && (top_n < 0 || static_cast<int>(i) < top_n); ++i) {
    const auto& x = s.top[i];
    std::string cfg = x.configs.empty() ? "" : x.configs[0];
    if (x.num_configs > 1) cfg += " (+" + std::to_string(x.num_configs - 1) + ")";
    k.add({trunc(x.name, 70), category_name(x.category), num(x.count), fmt(x.total_us),
           fmt(x.mean_us, 2), pct(s.kernel_us > 0 ? x.total_us / s.kernel_us : 0), cfg});
  }
  o << k.str();
  for (auto& w : s.warnings) o << "warning: " << w << "\n";
  return o.str();
}

std::string summary_json(const Summary& s, int top_n) {
  ordered_json j;
  j["schema"] = "molora.prof.summary/1";
  j.update(summary_obj(s, top_n));
  return j.dump(2) + "\n";
}

std::string summary_csv(const Summary& s, int top_n) {
  std::string o = csv_row({"section", "name", "category", "count", "time_us", "share", "mean_us"});
  for (int i = 0; i < kNumCategories; ++i) {
    const auto& x = s.categories[i];
    o += csv_row({"category", category_name(static_cast<Category>(i)),
                  category_name(static_cast<Category>(i)), num(x.count), fmt(x.time_us, 3),
                  fmt(x.share, 6), ""});
  }
  o += csv_row({"total", "kernel", "", num(s.kernels), fmt(s.kernel_us, 3), "1", ""});
  o += csv_row({"total", "busy", "", "", fmt(s.busy_us, 3), "", ""});
  o += csv_row({"total", "wall", "", "", fmt(s.wall_us, 3), "", ""});
  for (size_t i = 0; i < s.top.size() && (top_n < 0 || static_cast<int>(i) < top_n); ++i) {
    const auto& x = s.top[i];
    o += csv_row({"kernel", x.name, category_name(x.category), num(x.count), fmt(x.total_us, 3),
                  fmt(s.kernel_us > 0 ? x.total_us / s.kernel_us : 0, 6), fmt(x.mean_us, 3)});
  }
  return o;
}

std::string steps_text(const Steps& s) {
  std::ostringstream o;
  o << "trace " << s.path << ": " << s.kernels << " kernels, " << s.attributed
    << " attributed to their launching call, " << s.unmatched << " without one\n\n";
  // Categories with time in any step, by total.
  double tot[kNumCategories] = {};
  for (auto& r : s.steps)
    for (int i = 0; i < kNumCategories; ++i) tot[i] += r.categories_us[i];
  std::vector<int> cats;
  for (int i = 0; i < kNumCategories; ++i)
    if (tot[i] > 0) cats.push_back(i);
  std::sort(cats.begin(), cats.end(), [&](int a, int b) { return tot[a] > tot[b]; });
  std::vector<std::string> head = {"#",         "step",    "start_us", "cpu_us",
                                   "kernel_us", "busy_us", "wall_us",  "launches"};
  for (int c : cats) head.push_back(category_name(static_cast<Category>(c)));
  head.push_back("top annotation");
  Table t(head);
  t.left(1);
  t.left(head.size() - 1);
  for (auto& r : s.steps) {
    std::vector<std::string> row = {r.index >= 0 ? std::to_string(r.index) : "-",
                                    trunc(r.name, 40),
                                    fmt(r.cpu_start_us),
                                    fmt(r.cpu_us),
                                    fmt(r.kernel_us),
                                    fmt(r.busy_us),
                                    fmt(r.wall_us),
                                    num(r.launches)};
    for (int c : cats) row.push_back(fmt(r.categories_us[c]));
    row.push_back(trunc(r.top_annotation, 40) + " " + pct(r.top_annotation_share));
    t.add(row);
  }
  o << t.str();
  for (auto& w : s.warnings) o << "warning: " << w << "\n";
  return o.str();
}

std::string steps_json(const Steps& s) {
  ordered_json j;
  j["schema"] = "molora.prof.steps/1";
  j["path"] = s.path;
  add_warnings(j, s.warnings, s.truncated);
  j["kernels"] = s.kernels, j["attributed"] = s.attributed, j["unmatched"] = s.unmatched;
  ordered_json arr = ordered_json::array();
  for (auto& r : s.steps) {
    ordered_json c = ordered_json::object();
    for (int i = 0; i < kNumCategories; ++i)
      if (r.categories_us[i] > 0) c[category_name(static_cast<Category>(i))] = r.categories_us[i];
    arr.push_back({{"index", r.index},
                   {"name", r.name},
                   {"cpu_start_us", r.cpu_start_us},
                   {"cpu_us", r.cpu_us},
                   {"kernel_us", r.kernel_us},
                   {"busy_us", r.busy_us},
                   {"wall_us", r.wall_us},
                   {"launches", r.launches},
                   {"categories_us", c},
                   {"top_annotation", r.top_annotation},
                   {"top_annotation_us", r.top_annotation_us},
                   {"top_annotation_share", r.top_annotation_share}});
  }
  j["steps"] = arr;
  return j.dump(2) + "\n";
}

std::string steps_csv(const Steps& s) {
  std::vector<std::string> head = {"index",     "step",    "cpu_start_us", "cpu_us",
                                   "kernel_us", "busy_us", "wall_us",      "launches"};
  for (int i = 0; i < kNumCategories; ++i) head.push_back(category_name(static_cast<Category>(i)));
  head.push_back("top_annotation");
  head.push_back("top_annotation_share");
  std::string o = csv_row(head);
  for (auto& r : s.steps) {
    std::vector<std::string> row = {std::to_string(r.index), r.name,
                                    fmt(r.cpu_start_us, 3),  fmt(r.cpu_us, 3),
                                    fmt(r.kernel_us, 3),     fmt(r.busy_us, 3),
                                    fmt(r.wall_us, 3),       num(r.launches)};
    for (int i = 0; i < kNumCategories; ++i) row.push_back(fmt(r.categories_us[i], 3));
    row.push_back(r.top_annotation);
    row.push_back(fmt(r.top_annotation_share, 6));
    o += csv_row(row);
  }
  return o;
}

std::string steps_svg(const Steps& s) {
  static const char* colors[kNumCategories] = {
      "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a",
      "#d62728", "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94",
      "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#17becf"};
  double mx = 0;
  for (auto& r : s.steps) mx = std::max(mx, r.kernel_us);
  const int bar = 18, gap = 4, left = 60, width = 720, legend = 150;
  const int n = static_cast<int>(s.steps.size());
  const int h = 40 + n * (bar + gap) + 20;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + legend + 20
    << "\" height=\"" << std::max(h, 40 + kNumCategories * 16)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<text x=\"" << left << "\" y=\"16\">kernel time per step by category (max " << fmt(mx)
    << " us)</text>\n";
  for (int i = 0; i < n; ++i) {
    const auto& r = s.steps[i];
    int y = 30 + i * (bar + gap);
    o << "<text x=\"4\" y=\"" << y + bar - 5 << "\">"
      << (r.index >= 0 ? std::to_string(r.index) : "-") << "</text>\n";
    double x = left;
    for (int c = 0; c < kNumCategories; ++c) {
      if (r.categories_us[c] <= 0 || mx <= 0) continue;
      double w = r.categories_us[c] / mx * width;
      o << "<rect x=\"" << fmt(x, 2) << "\" y=\"" << y << "\" width=\"" << fmt(w, 2)
        << "\" height=\"" << bar << "\" fill=\"" << colors[c] << "\"><title>"
        << category_name(static_cast<Category>(c)) << " " << fmt(r.categories_us[c])
        << " us</title></rect>\n";
      x += w;
    }
  }
  for (int c = 0; c < kNumCategories; ++c) {
    int y = 30 + c * 16;
    o << "<rect x=\"" << left + width + 20 << "\" y=\"" << y
      << "\" width=\"10\" height=\"10\" fill=\"" << colors[c] << "\"/><text x=\""
      << left + width + 34 << "\" y=\"" << y + 9 << "\">" << category_name(static_cast<Category>(c))
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string grids_text(const std::vector<GridStat>& g) {
  Table t({"kernel", "category", "grid", "block", "ctas", "threads", "count", "total_us", "mean_us",
           "min_us", "max_us"});
  t.left(1);
  for (auto& x : g) {
    auto d3 = [](const int32_t* d) {
      return std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]);
    };
    t.add({trunc(x.name, 60), category_name(x.category), d3(x.grid), d3(x.block), num(x.ctas),
           num(x.threads_per_cta), num(x.count), fmt(x.total_us), fmt(x.mean_us, 2),
           fmt(x.min_us, 2), fmt(x.max_us, 2)});
  }
  return t.str();
}

std::string grids_json(const std::vector<GridStat>& g) {
  ordered_json j;
  j["schema"] = "molora.prof.grids/1";
  ordered_json arr = ordered_json::array();
  for (auto& x : g)
    arr.push_back({{"name", x.name},
                   {"category", category_name(x.category)},
                   {"grid", {x.grid[0], x.grid[1], x.grid[2]}},
                   {"block", {x.block[0], x.block[1], x.block[2]}},
                   {"ctas", x.ctas},
                   {"threads_per_cta", x.threads_per_cta},
                   {"count", x.count},
                   {"total_us", x.total_us},
                   {"mean_us", x.mean_us},
                   {"min_us", x.min_us},
                   {"max_us", x.max_us}});
  j["configs"] = arr;
  return j.dump(2) + "\n";
}

std::string grids_csv(const std::vector<GridStat>& g) {
  std::string o =
      csv_row({"name", "category", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
               "ctas", "threads_per_cta", "count", "total_us", "mean_us", "min_us", "max_us"});
  for (auto& x : g)
    o += csv_row({x.name, category_name(x.category), std::to_string(x.grid[0]),
                  std::to_string(x.grid[1]), std::to_string(x.grid[2]), std::to_string(x.block[0]),
                  std::to_string(x.block[1]), std::to_string(x.block[2]), num(x.ctas),
                  num(x.threads_per_cta), num(x.count), fmt(x.total_us, 3), fmt(x.mean_us, 3),
                  fmt(x.min_us, 3), fmt(x.max_us, 3)});
  return o;
}

}  // namespace molora::prof
