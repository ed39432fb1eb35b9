// Comparisons of summaries: diff A B (per category, per kernel) and ranks (per-rank table, skew).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "molora/prof.h"
#include "prof/text.h"

namespace molora::prof {
namespace {

using nlohmann::ordered_json;

std::string sgn(double v, int prec = 1) { return (v > 0 ? "+" : "") + fmt(v, prec); }
std::string rel(double a, double b) {
  return a > 0 ? sgn(100.0 * (b - a) / a) + "%" : (b > 0 ? "new" : "0");
}

std::string table(const std::vector<std::vector<std::string>>& rows) { return format_table(rows); }
std::string csv(const std::vector<std::vector<std::string>>& rows) {
  std::string o;
  for (auto& r : rows) o += csv_row(r);
  return o;
}

struct KDelta {
  std::string name;
  Category cat;
  double a = 0, b = 0;
  uint64_t ca = 0, cb = 0;
};

std::vector<KDelta> kernel_deltas(const Summary& a, const Summary& b, int top_n) {
  std::map<std::string, KDelta> m;
  for (auto& k : a.top) {
    auto& d = m[k.name];
    d.name = k.name, d.cat = k.category, d.a = k.total_us, d.ca = k.count;
  }
  for (auto& k : b.top) {
    auto& d = m[k.name];
    d.name = k.name, d.cat = k.category, d.b = k.total_us, d.cb = k.count;
  }
  std::vector<KDelta> v;
  for (auto& [n, d] : m) v.push_back(d);
  std::sort(v.begin(), v.end(), [](const KDelta& x, const KDelta& y) {
    double dx = std::fabs(x.b - x.a), dy = std::fabs(y.b - y.a);
    return dx != dy ? dx > dy : x.name < y.name;
  });
  if (top_n >= 0 && static_cast<int>(v.size()) > top_n) v.resize(top_n);
  return v;
}

// Non-communication kernel time: the work the other ranks wait for in the collectives.
double compute_us(const Summary& s) {
  double c = s.kernel_us;
  for (int i = 0; i < kNumCategories; ++i)
    if (is_comm(static_cast<Category>(i))) c -= s.categories[i].time_us;
  return c;
}
int slowest(const std::vector<Summary>& r) {
  int best = -1;
  for (size_t i = 0; i < r.size(); ++i)
    if (best < 0 || compute_us(r[i]) > compute_us(r[best])) best = static_cast<int>(i);
  return best;
}
int rank_of(const std::vector<Summary>& r, size_t i) {
  return r[i].rank >= 0 ? r[i].rank : static_cast<int>(i);
}

std::vector<std::vector<std::string>> diff_rows(const Summary& a, const Summary& b, bool full) {
  std::vector<std::vector<std::string>> rows = {{"category", "A_us", "B_us", "delta_us", "delta"}};
  for (int i = 0; i < kNumCategories; ++i) {
    double x = a.categories[i].time_us, y = b.categories[i].time_us;
    if (!full && x == 0 && y == 0) continue;
    rows.push_back({category_name(static_cast<Category>(i)), fmt(x, full ? 3 : 1),
                    fmt(y, full ? 3 : 1), sgn(y - x, full ? 3 : 1), rel(x, y)});
  }
  rows.push_back({"kernel total", fmt(a.kernel_us), fmt(b.kernel_us),
                  sgn(b.kernel_us - a.kernel_us), rel(a.kernel_us, b.kernel_us)});
  rows.push_back({"busy", fmt(a.busy_us), fmt(b.busy_us), sgn(b.busy_us - a.busy_us),
                  rel(a.busy_us, b.busy_us)});
  rows.push_back({"wall", fmt(a.wall_us), fmt(b.wall_us), sgn(b.wall_us - a.wall_us),
                  rel(a.wall_us, b.wall_us)});
  return rows;
}

}  // namespace

std::string diff_text(const Summary& a, const Summary& b, int top_n) {
  std::ostringstream o;
  o << "A " << a.path << "\nB " << b.path << "\n\n" << table(diff_rows(a, b, false)) << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"kernel", "category", "A_count", "B_count", "A_us", "B_us", "delta_us", "delta"}};
  for (auto& d : kernel_deltas(a, b, top_n)) {
    std::string n = d.name.size() > 70 ? d.name.substr(0, 67) + "..." : d.name;
    rows.push_back({n, category_name(d.cat), std::to_string(d.ca), std::to_string(d.cb), fmt(d.a),
                    fmt(d.b), sgn(d.b - d.a), rel(d.a, d.b)});
  }
  o << table(rows);
  return o.str();
}

std::string diff_json(const Summary& a, const Summary& b, int top_n) {
  ordered_json j;
  j["schema"] = "molora.prof.diff/1";
  j["a"] = {{"path", a.path},
            {"kernel_us", a.kernel_us},
            {"busy_us", a.busy_us},
            {"wall_us", a.wall_us},
            {"truncated", a.truncated}};
  j["b"] = {{"path", b.path},
            {"kernel_us", b.kernel_us},
            {"busy_us", b.busy_us},
            {"wall_us", b.wall_us},
            {"truncated", b.truncated}};
  ordered_json cats = ordered_json::array();
  for (int i = 0; i < kNumCategories; ++i)
    cats.push_back({{"category", category_name(static_cast<Category>(i))},
                    {"a_us", a.categories[i].time_us},
                    {"b_us", b.categories[i].time_us},
                    {"delta_us", b.categories[i].time_us - a.categories[i].time_us},
                    {"a_count", a.categories[i].count},
                    {"b_count", b.categories[i].count}});
  j["categories"] = cats;
  ordered_json ks = ordered_json::array();
  for (auto& d : kernel_deltas(a, b, top_n))
    ks.push_back({{"name", d.name},
                  {"category", category_name(d.cat)},
                  {"a_count", d.ca},
                  {"b_count", d.cb},
                  {"a_us", d.a},
                  {"b_us", d.b},
                  {"delta_us", d.b - d.a}});
  j["kernels"] = ks;
  return j.dump(2) + "\n";
}

std::string diff_csv(const Summary& a, const Summary& b, int top_n) {
  std::vector<std::vector<std::string>> out;
  out.push_back({"section", "name", "category", "a_count", "b_count", "a_us", "b_us", "delta_us"});
  for (int i = 0; i < kNumCategories; ++i)
    out.push_back({"category", category_name(static_cast<Category>(i)),
                   category_name(static_cast<Category>(i)), std::to_string(a.categories[i].count),
                   std::to_string(b.categories[i].count), fmt(a.categories[i].time_us, 3),
                   fmt(b.categories[i].time_us, 3),
                   fmt(b.categories[i].time_us - a.categories[i].time_us, 3)});
  const std::pair<const char*, std::pair<double, double>> totals[] = {
      {"kernel total", {a.kernel_us, b.kernel_us}},
      {"busy", {a.busy_us, b.busy_us}},
      {"wall", {a.wall_us, b.wall_us}}};
  for (auto& [name, v] : totals)
    out.push_back(
        {"total", name, "", "", "", fmt(v.first, 3), fmt(v.second, 3), fmt(v.second - v.first, 3)});
  for (auto& d : kernel_deltas(a, b, top_n))
    out.push_back({"kernel", d.name, category_name(d.cat), std::to_string(d.ca),
                   std::to_string(d.cb), fmt(d.a, 3), fmt(d.b, 3), fmt(d.b - d.a, 3)});
  return csv(out);
}

std::string ranks_text(const std::vector<Summary>& r) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"category"};
  for (size_t i = 0; i < r.size(); ++i) head.push_back("rank" + std::to_string(rank_of(r, i)));
  head.push_back("skew_us");
  head.push_back("max/min");
  rows.push_back(head);
  auto line = [&](const std::string& name, auto get) {
    std::vector<std::string> row = {name};
    double lo = 1e300, hi = -1e300;
    for (auto& s : r) {
      double v = get(s);
      row.push_back(fmt(v));
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
    row.push_back(fmt(hi - lo));
    row.push_back(lo > 0 ? fmt(hi / lo, 2) : "-");
    rows.push_back(row);
  };
  for (int i = 0; i < kNumCategories; ++i) {
    bool any = false;
    for (auto& s : r) any |= s.categories[i].count > 0;
    if (any)
      line(category_name(static_cast<Category>(i)),
           [i](const Summary& s) { return s.categories[i].time_us; });
  }
  line("kernel total", [](const Summary& s) { return s.kernel_us; });
  line("compute (non-comm)", [](const Summary& s) { return compute_us(s); });
  line("busy", [](const Summary& s) { return s.busy_us; });
  line("wall", [](const Summary& s) { return s.wall_us; });
  std::ostringstream o;
  for (size_t i = 0; i < r.size(); ++i) o << "rank" << rank_of(r, i) << " " << r[i].path << "\n";
  o << "\n" << table(rows);
  int s = slowest(r);
  if (s >= 0)
    o << "\nslowest rank: " << rank_of(r, s) << " (" << fmt(compute_us(r[s]))
      << " us of non-communication kernel time)\n";
  return o.str();
}

std::string ranks_json(const std::vector<Summary>& r) {
  ordered_json j;
  j["schema"] = "molora.prof.ranks/1";
  ordered_json ranks = ordered_json::array();
  for (size_t i = 0; i < r.size(); ++i) {
    ordered_json c = ordered_json::object();
    for (int k = 0; k < kNumCategories; ++k)
      c[category_name(static_cast<Category>(k))] = r[i].categories[k].time_us;
    ranks.push_back({{"rank", rank_of(r, i)},
                     {"path", r[i].path},
                     {"truncated", r[i].truncated},
                     {"kernel_us", r[i].kernel_us},
                     {"compute_us", compute_us(r[i])},
                     {"busy_us", r[i].busy_us},
                     {"wall_us", r[i].wall_us},
                     {"categories_us", c}});
  }
  j["ranks"] = ranks;
  ordered_json skew = ordered_json::object();
  for (int k = 0; k < kNumCategories; ++k) {
    double lo = 1e300, hi = -1e300;
    for (auto& s : r)
      lo = std::min(lo, s.categories[k].time_us), hi = std::max(hi, s.categories[k].time_us);
    skew[category_name(static_cast<Category>(k))] = r.empty() ? 0 : hi - lo;
  }
  j["skew_us"] = skew;
  int s = slowest(r);
  j["slowest_rank"] = s >= 0 ? rank_of(r, s) : -1;
  return j.dump(2) + "\n";
}

std::string ranks_csv(const std::vector<Summary>& r) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"rank", "path", "kernel_us", "compute_us", "busy_us", "wall_us"};
  for (int k = 0; k < kNumCategories; ++k) head.push_back(category_name(static_cast<Category>(k)));
  rows.push_back(head);
  for (size_t i = 0; i < r.size(); ++i) {
    std::vector<std::string> row = {std::to_string(rank_of(r, i)), r[i].path,
                                    fmt(r[i].kernel_us, 3),        fmt(compute_us(r[i]), 3),
                                    fmt(r[i].busy_us, 3),          fmt(r[i].wall_us, 3)};
    for (int k = 0; k < kNumCategories; ++k) row.push_back(fmt(r[i].categories[k].time_us, 3));
    rows.push_back(row);
  }
  return csv(rows);
}

}  // namespace molora::prof
