// The lora benchmark's pieces that need no GPU (see lora_bench.h): the shape names and the
// summary of `molora bench lora --timeline`. Tested without a GPU, and linked without the kernels.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "lora/lora_bench.h"
#include "lora/lora_internal.h"

namespace molora::lora::bench {

std::vector<Shape> seed_shapes() {
  return {{"N6144_r32_V160x8", 6144, 32, 160, 8},
          {"N2048_r16_V128x8", 2048, 16, 128, 8},
          {"N7168_r32_V256x4", 7168, 32, 256, 4},
          {"N4096_r32_V128x8", 4096, 32, 128, 8}};
}

bool parse_shape(const std::string& name, Shape* out) {
  for (const Shape& sh : seed_shapes())
    if (sh.name == name) return *out = sh, true;
  long long dim = 0, r = 0, E = 0, S = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "N%lld_r%lld_V%lldx%lld%c", &dim, &r, &E, &S, &tail) != 4)
    return false;
  const bool r_ok = r == 8 || r == 16 || r == 32 || r == 64 || r == 128;
  if (dim <= 0 || dim > 16384 || dim % 8 != 0 || !r_ok || E <= 0 || S <= 0 || E * S > 65536)
    return false;
  // (the name must be the canonical spelling: no leading zeros, no sign)
  const std::string canon = "N" + std::to_string(dim) + "_r" + std::to_string(r) + "_V" +
                            std::to_string(E) + "x" + std::to_string(S);
  if (canon != name) return false;
  *out = Shape{name, dim, static_cast<int>(r), static_cast<int>(E), static_cast<int>(S)};
  return true;
}

std::vector<int> tune_token_counts() { return {1, 2, 4, 8, 16, 32, 64, 128, 256}; }

int64_t tune_p_min(int T, int k) {
  int64_t prev = 0;
  for (int t : tune_token_counts()) {
    if (t == T) return prev * k + 1;
    prev = t;
  }
  return 1;
}

bool tune_keeps_best(const TuneBucket& b) { return b.best_us < b.heur_us * detail::kTuneMargin; }

std::vector<nlohmann::json> tune_entries(const TuneBucket& b) {
  const bool keep = tune_keeps_best(b);
  auto entry = [&](const char* kernel) {
    return nlohmann::json{{"op", op_name(b.op)},
                          {"kernel", kernel},
                          {"dtype", "bf16"},
                          {"routing", routing_name(b.routing)},
                          {"dim", b.shape.dim},
                          {"r_max", b.shape.r},
                          {"p_min", tune_p_min(b.T, b.k)},
                          {"p_max", int64_t{b.T} * b.k}};
  };
  std::vector<nlohmann::json> out;
  nlohmann::json g = entry("grid");
  g["tile"] = keep ? b.best_tile : b.heur_tile;
  g["unroll"] = keep ? b.best_unroll : b.heur_unroll;
  g["us"] = keep ? b.best_us : b.heur_us;
  g["heuristic"] = !keep;
  g["heuristic_us"] = b.heur_us;
  out.push_back(g);
  if (b.stream) {
    nlohmann::json s = entry("stream");
    s["tile"] = b.stream_tile;
    s["unroll"] = 0;
    s["us"] = b.stream_us;
    s["heuristic"] = true;  // (the stream kernel's tile is the planner's own)
    s["heuristic_us"] = b.stream_us;
    out.push_back(s);
  }
  return out;
}

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

Status summarize_timeline(const std::vector<unsigned long long>& words, int calls, int grid,
                          Timeline* out) {
  constexpr int W = detail::kTraceWords;
  if (calls < 2 || grid < 1)
    return Status::InvalidArgument("timeline: needs 2 or more calls of 1 or more CTAs, got " +
                                   std::to_string(calls) + " x " + std::to_string(grid));
  if (words.size() != size_t(calls) * grid * W)
    return Status::InvalidArgument("timeline: " + std::to_string(words.size()) + " words for " +
                                   std::to_string(calls) + " calls x " + std::to_string(grid) +
                                   " CTAs x " + std::to_string(W));
  auto rec = [&](int i, int b) { return &words[(size_t(i) * grid + b) * W]; };
  for (int i = 0; i < calls; ++i)
    for (int b = 0; b < grid; ++b) {
      const unsigned long long* r = rec(i, b);
      if (r[0] == 0 || r[6] == 0 || r[6] < r[0])
        return Status::InvalidArgument("timeline: the record of call " + std::to_string(i) +
                                       " CTA " + std::to_string(b) + " is not written");
    }
  // The SM clock: cycles over ns, summed over the CTAs that ran 2 us or more.
  double cyc = 0, ns = 0;
  for (int i = 0; i < calls; ++i)
    for (int b = 0; b < grid; ++b) {
      const unsigned long long* r = rec(i, b);
      if (r[6] - r[0] >= 2000 && r[14] > r[8])
        cyc += double(r[14] - r[8]), ns += double(r[6] - r[0]);
    }
  const double ghz = ns > 0 ? cyc / ns : 0;
  std::vector<double> c_wait, c_known, c_issue, c_land, c_first_done, c_end, c_build[8];
  // Each statistic per call, then its median over the calls.
  std::vector<double> start_min, start_med, wait_med, wait_max, known_med, issue_med, issue_max,
      land_med, land_max, first_done_med, end_min, end_med, end_max, tasks_mean, busiest;
  std::vector<double> known_n, issue_n, land_n;  // CTAs with the event, per call
  int tasks_max = 0;
  int64_t step = 0;
  for (int i = 1; i < calls; ++i) {
    unsigned long long prev = 0;
    for (int b = 0; b < grid; ++b) prev = std::max(prev, rec(i - 1, b)[6]);
    auto us = [&](unsigned long long t) { return (double(t) - double(prev)) * 1e-3; };
    std::vector<double> st, wt, kn, is, ld, fd, en;
    std::vector<unsigned long long> starts;
    double tsum = 0;
    int tmax = -1;
    double tmax_end = 0;
    for (int b = 0; b < grid; ++b) {
      const unsigned long long* r = rec(i, b);
      st.push_back(us(r[0]));
      starts.push_back(r[0]);
      wt.push_back(us(r[1]));
      if (r[2] != 0) kn.push_back(us(r[2]));  // (unset: the CTA left before its task count)
      if (r[3] != 0) is.push_back(us(r[3]));
      if (r[4] != 0) ld.push_back(us(r[4]));
      fd.push_back(us(r[5]));
      en.push_back(us(r[6]));
      tsum += double(r[7]);
      if (int(r[7]) > tmax) tmax = int(r[7]), tmax_end = us(r[6]);
    }
    if (ghz > 0) {  // mean over the CTAs (with the event) of its clock after the CTA's start
      auto mean_after = [&](int e) {
        double sum = 0;
        int n = 0;
        for (int b = 0; b < grid; ++b) {
          const unsigned long long* r = rec(i, b);
          if (r[8 + e] != 0 && r[8 + e] >= r[8]) sum += double(r[8 + e] - r[8]), ++n;
        }
        return n > 0 ? sum / n / ghz * 1e-3 : 0.0;
      };
      c_wait.push_back(mean_after(1));
      c_known.push_back(mean_after(2));
      c_issue.push_back(mean_after(3));
      c_land.push_back(mean_after(4));
      c_first_done.push_back(mean_after(5));
      c_end.push_back(mean_after(6));
      for (int j = 0; j < 8; ++j) c_build[j].push_back(mean_after(8 + j));
    }
    std::sort(starts.begin(), starts.end());
    for (size_t j = 1; j < starts.size(); ++j) {
      const int64_t d = int64_t(starts[j] - starts[j - 1]);
      if (d > 0 && (step == 0 || d < step)) step = d;
    }
    start_min.push_back(*std::min_element(st.begin(), st.end()));
    start_med.push_back(median(st));
    wait_med.push_back(median(wt));
    wait_max.push_back(*std::max_element(wt.begin(), wt.end()));
    known_med.push_back(median(kn));
    known_n.push_back(double(kn.size()));
    issue_n.push_back(double(is.size()));
    land_n.push_back(double(ld.size()));
    issue_med.push_back(median(is));
    issue_max.push_back(is.empty() ? 0 : *std::max_element(is.begin(), is.end()));
    land_med.push_back(median(ld));
    land_max.push_back(ld.empty() ? 0 : *std::max_element(ld.begin(), ld.end()));
    first_done_med.push_back(median(fd));
    end_min.push_back(*std::min_element(en.begin(), en.end()));
    end_med.push_back(median(en));
    end_max.push_back(*std::max_element(en.begin(), en.end()));
    tasks_mean.push_back(tsum / grid);
    tasks_max = std::max(tasks_max, tmax);
    busiest.push_back(tmax_end);
  }
  Timeline t;
  t.calls = calls - 1;
  t.grid = grid;
  t.start_min = median(start_min), t.start_med = median(start_med);
  t.wait_med = median(wait_med), t.wait_max = median(wait_max);
  t.known_med = median(known_med);
  t.known_ctas = median(known_n), t.issue_ctas = median(issue_n), t.land_ctas = median(land_n);
  t.issue_med = median(issue_med), t.issue_max = median(issue_max);
  t.land_med = median(land_med), t.land_max = median(land_max);
  t.first_done_med = median(first_done_med);
  t.end_min = median(end_min), t.end_med = median(end_med), t.end_max = median(end_max);
  t.tasks_mean = median(tasks_mean);
  t.tasks_max = tasks_max;
  t.busiest_end = median(busiest);
  t.timer_step_ns = step;
  t.clock_ghz = ghz;
  t.c_wait = median(c_wait), t.c_known = median(c_known), t.c_issue = median(c_issue);
  t.c_land = median(c_land), t.c_first_done = median(c_first_done), t.c_end = median(c_end);
  for (int j = 0; j < 8; ++j) t.c_build[j] = median(c_build[j]);
  *out = t;
  return Status::Ok();
}

std::string format_timeline(const Timeline& t) {
  if (t.calls == 0) return "  timeline: none (the plan is not a stream kernel)\n";
  char b[2048];
  // An event no CTA reached (every CTA left before it: no task, or every slot -1 at the plain
  // kernels' slot check) prints "none", not a time.
  auto ev = [](double ctas, double med, double mx, bool with_max) {
    char e[64];
    if (ctas <= 0)
      std::snprintf(e, sizeof(e), "   none");
    else if (with_max)
      std::snprintf(e, sizeof(e), "%6.2f  max %6.2f", med, mx);
    else
      std::snprintf(e, sizeof(e), "%6.2f", med);
    return std::string(e);
  };
  const std::string known = ev(t.known_ctas, t.known_med, 0, false);
  const std::string issue = ev(t.issue_ctas, t.issue_med, t.issue_max, true);
  const std::string land = ev(t.land_ctas, t.land_med, t.land_max, true);
  std::snprintf(b, sizeof(b),
                "  timeline (median of %d calls, %d CTAs; us from the previous call's last CTA "
                "end):\n"
                "    CTA start       min %6.2f  med %6.2f\n"
                "    pdl_wait done           med %6.2f  max %6.2f\n"
                "    tasks known             med %s\n"
                "    1st copy issued         med %s\n"
                "    1st copy landed         med %s\n"
                "    1st warp done           med %6.2f\n"
                "    CTA end         min %6.2f  med %6.2f  max %6.2f (the call)\n"
                "    tasks per CTA mean %.2f, max %d; the busiest CTA ends at %.2f\n"
                "    timer step <= %lld ns; %.2f us per call with the probe on\n"
                "    by each CTA's clock (%.2f GHz), mean us after its start: pdl_wait %.3f, "
                "tasks known %.3f, 1st copy issued %.3f, landed %.3f, 1st warp done %.3f, "
                "end %.3f\n",
                t.calls, t.grid, t.start_min, t.start_med, t.wait_med, t.wait_max, known.c_str(),
                issue.c_str(), land.c_str(), t.first_done_med, t.end_min, t.end_med, t.end_max,
                t.tasks_mean, t.tasks_max, t.busiest_end, static_cast<long long>(t.timer_step_ns),
                t.probe_us, t.clock_ghz, t.c_wait, t.c_known, t.c_issue, t.c_land, t.c_first_done,
                t.c_end);
  std::string o = b;
  if (t.c_build[7] > 0) {  // plain routing: the grouping's steps (those its way marks)
    // (The tables mark every step; the 256-key warp sort entry, keys (loaded), sorted (its step
    // 2, named so where no ranks step follows) and done; the 32-key warp sort entry and done.)
    static const char* const kStep[8] = {"entry", "keys",   "index",  "ranks",
                                         "scan",  "counts", "placed", "done"};
    o += "    plain grouping, mean us after the CTA's start:";
    const char* sep = " ";
    for (int j = 0; j < 8; ++j) {
      if (t.c_build[j] <= 0) continue;
      const char* name = j == 2 && t.c_build[3] <= 0 ? "sorted" : kStep[j];
      std::snprintf(b, sizeof(b), "%s%s %.3f", sep, name, t.c_build[j]);
      o += b;
      sep = ", ";
    }
    o += "\n";
  }
  if (t.clock_ghz <= 0)  // (the line above then holds zeros)
    o += "    (no CTA ran 2 us or more: no clock estimate)\n";
  return o;
}

}  // namespace molora::lora::bench
