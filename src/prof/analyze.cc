// Analyses over a read Trace: summary, steps (attribution by correlation), grids.
#include <algorithm>
#include <map>
#include <regex>
#include <unordered_map>

#include "molora/prof.h"

namespace molora::prof {
namespace {

constexpr double kUs = 1e-3;  // ns → µs

// Union length of [ts, ts + dur) intervals (sorted in place).
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>>& iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto& [s, e] : iv) {
    if (!open || s > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = s, cur_e = e, open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

// Busy time: per device union, summed over devices.
template <class Idx>
int64_t busy_ns(const std::vector<GpuEvent>& ev, const Idx& idx, int* devices = nullptr) {
  std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> per;
  for (auto i : idx) per[ev[i].device].push_back({ev[i].ts_ns, ev[i].ts_ns + ev[i].dur_ns});
  int64_t total = 0;
  for (auto& [d, iv] : per) total += union_ns(iv);
  if (devices) *devices = static_cast<int>(per.size());
  return total;
}

std::vector<Category> classify_names(const Trace& t, const Rules& rules) {
  std::vector<Category> cat(t.names.size(), Category::kOther);
  std::vector<char> used(t.names.size(), 0);
  for (auto& k : t.kernels) used[k.name] = 1;
  for (size_t i = 0; i < t.names.size(); ++i)
    if (used[i]) cat[i] = rules.classify(t.names[i]);
  return cat;
}

std::string config_string(const GpuEvent& k) {
  return "grid [" + std::to_string(k.grid[0]) + "," + std::to_string(k.grid[1]) + "," +
         std::to_string(k.grid[2]) + "] block [" + std::to_string(k.block[0]) + "," +
         std::to_string(k.block[1]) + "," + std::to_string(k.block[2]) + "]";
}

}  // namespace

Status summarize(const Trace& t, const Rules& rules, Summary* out) {
  if (!out) return Status::InvalidArgument("out is null");
  Summary s;
  s.path = t.path, s.rank = t.rank, s.truncated = t.truncated, s.warnings = t.warnings;
  s.events = t.events, s.bytes = t.bytes;
  s.kernels = t.kernels.size(), s.memcpys = t.memcpys.size(), s.memsets = t.memsets.size();
  auto cat = classify_names(t, rules);
  struct Acc {
    uint64_t count = 0;
    int64_t total = 0, mn = INT64_MAX, mx = 0;
    std::vector<std::string> configs;
    std::vector<std::array<int32_t, 6>> seen;
  };
  std::unordered_map<int32_t, Acc> by_name;
  int64_t kernel_ns = 0, lo = INT64_MAX, hi = INT64_MIN;
  int64_t cat_ns[kNumCategories] = {};
  for (auto& k : t.kernels) {
    kernel_ns += k.dur_ns;
    Category c = cat[k.name];
    cat_ns[static_cast<int>(c)] += k.dur_ns;
    s.categories[static_cast<int>(c)].count++;
    Acc& a = by_name[k.name];
    a.count++, a.total += k.dur_ns, a.mn = std::min(a.mn, k.dur_ns),
                                    a.mx = std::max(a.mx, k.dur_ns);
    std::array<int32_t, 6> cfg = {k.grid[0],  k.grid[1],  k.grid[2],
                                  k.block[0], k.block[1], k.block[2]};
    if (a.seen.size() < 64 && std::find(a.seen.begin(), a.seen.end(), cfg) == a.seen.end()) {
      a.seen.push_back(cfg);
      if (a.configs.size() < 8) a.configs.push_back(config_string(k));
    }
    lo = std::min(lo, k.ts_ns), hi = std::max(hi, k.ts_ns + k.dur_ns);
  }
  int64_t memcpy_ns = 0, memset_ns = 0;
  for (auto& m : t.memcpys)
    memcpy_ns += m.dur_ns, lo = std::min(lo, m.ts_ns), hi = std::max(hi, m.ts_ns + m.dur_ns);
  for (auto& m : t.memsets)
    memset_ns += m.dur_ns, lo = std::min(lo, m.ts_ns), hi = std::max(hi, m.ts_ns + m.dur_ns);
  cat_ns[static_cast<int>(Category::kMemcpy)] = memcpy_ns;
  cat_ns[static_cast<int>(Category::kMemset)] = memset_ns;
  s.categories[static_cast<int>(Category::kMemcpy)].count = t.memcpys.size();
  s.categories[static_cast<int>(Category::kMemset)].count = t.memsets.size();
  s.kernel_us = kernel_ns * kUs, s.memcpy_us = memcpy_ns * kUs, s.memset_us = memset_ns * kUs;
  s.wall_us = hi > lo ? (hi - lo) * kUs : 0;
  std::vector<size_t> all(t.kernels.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  s.busy_us = busy_ns(t.kernels, all, &s.devices) * kUs;
  for (int i = 0; i < kNumCategories; ++i) {
    s.categories[i].time_us = cat_ns[i] * kUs;
    s.categories[i].share = kernel_ns > 0 ? static_cast<double>(cat_ns[i]) / kernel_ns : 0;
  }
  for (auto& [n, a] : by_name) {
    KernelStat k;
    k.name = t.names[n], k.category = cat[n], k.count = a.count;
    k.total_us = a.total * kUs, k.mean_us = k.total_us / a.count;
    k.min_us = a.mn * kUs, k.max_us = a.mx * kUs;
    k.configs = a.configs, k.num_configs = a.seen.size();
    s.top.push_back(std::move(k));
  }
  std::sort(s.top.begin(), s.top.end(), [](const KernelStat& a, const KernelStat& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  *out = std::move(s);
  return Status::Ok();
}

Status compute_steps(const Trace& t, const Rules& rules, const StepsOptions& opts, Steps* out) {
  if (!out) return Status::InvalidArgument("out is null");
  std::regex step_re;
  try {
    step_re = std::regex(opts.step_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument("step regex '" + opts.step_regex + "': " + e.what());
  }
  Steps st;
  st.path = t.path, st.truncated = t.truncated, st.warnings = t.warnings;
  st.kernels = t.kernels.size();
  auto cat = classify_names(t, rules);
  std::vector<char> is_step(t.names.size(), 0);
  for (auto& a : t.annotations)
    if (!is_step[a.name]) is_step[a.name] = std::regex_search(t.names[a.name], step_re) ? 1 : 2;

  // Innermost enclosing annotation and step of every runtime call, per CPU thread.
  const size_t nr = t.runtime.size();
  std::vector<int32_t> inner(nr, -1), step_of(nr, -1);
  std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<int32_t>, std::vector<int32_t>>> thr;
  for (size_t i = 0; i < t.annotations.size(); ++i)
    thr[{t.annotations[i].pid, t.annotations[i].tid}].first.push_back(static_cast<int32_t>(i));
  for (size_t i = 0; i < nr; ++i) {
    auto it = thr.find({t.runtime[i].pid, t.runtime[i].tid});
    if (it != thr.end()) it->second.second.push_back(static_cast<int32_t>(i));
  }
  for (auto& [key, v] : thr) {
    auto& an = v.first;
    auto& rc = v.second;
    std::sort(an.begin(), an.end(), [&](int32_t a, int32_t b) {
      const auto &x = t.annotations[a], &y = t.annotations[b];
      return x.ts_ns != y.ts_ns ? x.ts_ns < y.ts_ns : x.dur_ns > y.dur_ns;
    });
    std::sort(rc.begin(), rc.end(),
              [&](int32_t a, int32_t b) { return t.runtime[a].ts_ns < t.runtime[b].ts_ns; });
    std::vector<std::pair<int32_t, int32_t>> stack;  // (annotation, nearest step annotation)
    size_t ai = 0;
    auto end_of = [&](int32_t a) { return t.annotations[a].ts_ns + t.annotations[a].dur_ns; };
    for (int32_t r : rc) {
      int64_t ts = t.runtime[r].ts_ns;
      while (ai < an.size() && t.annotations[an[ai]].ts_ns <= ts) {
        int32_t a = an[ai++];
        while (!stack.empty() && end_of(stack.back().first) <= t.annotations[a].ts_ns)
          stack.pop_back();
        int32_t parent_step = stack.empty() ? -1 : stack.back().second;
        stack.push_back({a, is_step[t.annotations[a].name] == 1 ? a : parent_step});
      }
      while (!stack.empty() && end_of(stack.back().first) < ts) stack.pop_back();
      if (!stack.empty()) inner[r] = stack.back().first, step_of[r] = stack.back().second;
    }
  }

  std::vector<std::pair<int64_t, int32_t>> corr(nr);
  for (size_t i = 0; i < nr; ++i) corr[i] = {t.runtime[i].correlation, static_cast<int32_t>(i)};
  std::sort(corr.begin(), corr.end());

  struct Acc {
    std::vector<size_t> kern;
    std::unordered_map<int32_t, int64_t> by_annotation;  // name → ns
  };
  std::map<int32_t, Acc> steps;  // step annotation index (-1: none) → kernels
  for (size_t k = 0; k < t.kernels.size(); ++k) {
    const auto& g = t.kernels[k];
    int32_t r = -1;
    auto it = std::lower_bound(corr.begin(), corr.end(), std::make_pair(g.correlation, INT32_MIN));
    if (g.correlation >= 0 && it != corr.end() && it->first == g.correlation) r = it->second;
    if (r < 0) {
      st.unmatched++;
    } else {
      st.attributed++;
    }
    int32_t s = r >= 0 ? step_of[r] : -1;
    Acc& a = steps[s];
    a.kern.push_back(k);
    int32_t in = r >= 0 && inner[r] >= 0 ? t.annotations[inner[r]].name : -1;
    a.by_annotation[in] += g.dur_ns;
  }
  std::vector<int32_t> order;
  for (auto& [s, a] : steps)
    if (s >= 0) order.push_back(s);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return t.annotations[a].ts_ns < t.annotations[b].ts_ns; });
  if (steps.count(-1)) order.push_back(-1);
  int64_t t0 = order.empty() || order[0] < 0 ? 0 : t.annotations[order[0]].ts_ns;
  int idx = 0;
  for (int32_t s : order) {
    Acc& a = steps[s];
    StepStat r;
    r.index = s >= 0 ? idx++ : -1;
    r.name = s >= 0 ? t.names[t.annotations[s].name] : "(no step)";
    if (s >= 0) {
      r.cpu_start_us = (t.annotations[s].ts_ns - t0) * kUs;
      r.cpu_us = t.annotations[s].dur_ns * kUs;
    }
    int64_t kns = 0, lo = INT64_MAX, hi = INT64_MIN;
    int64_t cns[kNumCategories] = {};
    for (size_t k : a.kern) {
      const auto& g = t.kernels[k];
      kns += g.dur_ns;
      cns[static_cast<int>(cat[g.name])] += g.dur_ns;
      lo = std::min(lo, g.ts_ns), hi = std::max(hi, g.ts_ns + g.dur_ns);
    }
    r.kernel_us = kns * kUs;
    r.launches = a.kern.size();
    r.wall_us = hi > lo ? (hi - lo) * kUs : 0;
    r.busy_us = busy_ns(t.kernels, a.kern) * kUs;
    for (int i = 0; i < kNumCategories; ++i) r.categories_us[i] = cns[i] * kUs;
    int32_t best = -2;
    int64_t best_ns = -1;
    for (auto& [n, ns] : a.by_annotation)
      if (ns > best_ns || (ns == best_ns && n < best)) best = n, best_ns = ns;
    if (best_ns >= 0) {
      r.top_annotation = best >= 0 ? t.names[best] : "(none)";
      r.top_annotation_us = best_ns * kUs;
      r.top_annotation_share = kns > 0 ? static_cast<double>(best_ns) / kns : 0;
    }
    st.steps.push_back(std::move(r));
  }
  *out = std::move(st);
  return Status::Ok();
}

Status compute_grids(const Trace& t, const Rules& rules, const std::string& kernel_regex,
                     std::vector<GridStat>* out) {
  if (!out) return Status::InvalidArgument("out is null");
  std::regex re;
  try {
    if (!kernel_regex.empty()) re = std::regex(kernel_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument("--kernel regex '" + kernel_regex + "': " + e.what());
  }
  std::vector<char> keep(t.names.size(), 0);
  for (size_t i = 0; i < t.names.size(); ++i)
    keep[i] = kernel_regex.empty() || std::regex_search(t.names[i], re);
  auto cat = classify_names(t, rules);
  std::map<std::array<int32_t, 7>, GridStat> m;
  for (auto& k : t.kernels) {
    if (!keep[k.name]) continue;
    std::array<int32_t, 7> key = {k.name,     k.grid[0],  k.grid[1], k.grid[2],
                                  k.block[0], k.block[1], k.block[2]};
    GridStat& g = m[key];
    double d = k.dur_ns * kUs;
    if (g.count == 0) {
      g.name = t.names[k.name], g.category = cat[k.name];
      for (int i = 0; i < 3; ++i) g.grid[i] = k.grid[i], g.block[i] = k.block[i];
      g.ctas = static_cast<uint64_t>(std::max(k.grid[0], 0)) * std::max(k.grid[1], 0) *
               std::max(k.grid[2], 0);
      g.threads_per_cta = static_cast<uint64_t>(std::max(k.block[0], 0)) * std::max(k.block[1], 0) *
                          std::max(k.block[2], 0);
      g.min_us = d;
    }
    g.count++, g.total_us += d, g.min_us = std::min(g.min_us, d), g.max_us = std::max(g.max_us, d);
  }
  out->clear();
  for (auto& [k, g] : m) {
    g.mean_us = g.total_us / g.count;
    out->push_back(g);
  }
  std::sort(out->begin(), out->end(), [](const GridStat& a, const GridStat& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  return Status::Ok();
}

}  // namespace molora::prof
