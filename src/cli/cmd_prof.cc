// `molora prof`: torch-profiler / Kineto trace analysis (summary, steps, grids, diff, ranks).
// Exit codes: 0 ok, 2 usage error, 3 bad input (malformed, or truncated: partial result printed).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "molora/prof.h"

namespace {

namespace mp = molora::prof;

struct Opts {
  bool json = false, csv = false, no_progress = false;
  std::string rules, svg, kernel, step_regex, explain;
  int threads = 0, top = 20;
  std::vector<std::string> traces;
};

void progress_bar(uint64_t done, uint64_t total) {
  if (total == 0) return;
  int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
  int fill = pct / 4;
  std::fprintf(stderr, "\r[%.*s%*s] %3d%% %.0f/%.0f MB", fill, "#########################",
               25 - fill, "", pct, done / 1e6, total / 1e6);
  if (done >= total) std::fprintf(stderr, "\r%*s\r", 60, "");
  std::fflush(stderr);
}

// 0 ok, 3 on error (message printed). Truncation is reported by the caller after the output.
int load(const std::string& path, const Opts& o, mp::Trace* t) {
  mp::ReadOptions ro;
  ro.threads = o.threads;
  struct stat st {};
  if (!o.no_progress && isatty(2) && stat(path.c_str(), &st) == 0 && st.st_size > (256ll << 20))
    ro.progress = progress_bar;
  molora::Status s = mp::read_trace(path, ro, t);
  if (!s.ok()) {
    std::cerr << "molora prof: " << s.message() << "\n";
    return s.code() == molora::StatusCode::kIoError ? 1 : 3;
  }
  return 0;
}

int load_rules(const Opts& o, mp::Rules* r) {
  if (o.rules.empty()) return 0;
  molora::Status s = r->add_file(o.rules);
  if (!s.ok()) {
    std::cerr << "molora prof: " << s.message() << "\n";
    return 2;
  }
  return 0;
}

int warn_exit(const mp::Trace& t) {
  for (auto& w : t.warnings) std::cerr << "molora prof: warning: " << t.path << ": " << w << "\n";
  return t.truncated ? 3 : 0;
}

int emit(const Opts& o, const std::string& text, const std::string& json, const std::string& csv) {
  std::cout << (o.json ? json : o.csv ? csv : text);
  return 0;
}

void common(CLI::App* sub, Opts& o) {
  sub->add_flag("--json", o.json, "JSON output (versioned schema, see docs/prof.md)");
  sub->add_flag("--csv", o.csv, "CSV output");
  sub->add_option(
         "--rules", o.rules,
         "Classification rules file (<category> <regex> per line), before the built-in ones")
      ->check(CLI::ExistingFile);
  sub->add_option("--threads", o.threads,
                  "Parser threads (default MOLORA_PROF_THREADS, else all cores)")
      ->check(CLI::Range(0, 256));
  sub->add_flag("--no-progress", o.no_progress, "No progress bar on stderr");
}

int run_summary(const Opts& o) {
  mp::Rules rules;
  if (int rc = load_rules(o, &rules)) return rc;
  mp::Trace t;
  if (int rc = load(o.traces[0], o, &t)) return rc;
  mp::Summary s;
  mp::summarize(t, rules, &s);
  emit(o, mp::summary_text(s, o.top), mp::summary_json(s, o.top), mp::summary_csv(s, o.top));
  return warn_exit(t);
}

int run_steps(const Opts& o) {
  mp::Rules rules;
  if (int rc = load_rules(o, &rules)) return rc;
  mp::Trace t;
  if (int rc = load(o.traces[0], o, &t)) return rc;
  mp::StepsOptions so;
  if (!o.step_regex.empty()) so.step_regex = o.step_regex;
  mp::Steps s;
  molora::Status st = mp::compute_steps(t, rules, so, &s);
  if (!st.ok()) {
    std::cerr << "molora prof: " << st.message() << "\n";
    return 2;
  }
  emit(o, mp::steps_text(s), mp::steps_json(s), mp::steps_csv(s));
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    f << mp::steps_svg(s);
    if (!f) {
      std::cerr << "molora prof: cannot write " << o.svg << "\n";
      return 1;
    }
  }
  return warn_exit(t);
}

int run_grids(const Opts& o) {
  mp::Rules rules;
  if (int rc = load_rules(o, &rules)) return rc;
  mp::Trace t;
  if (int rc = load(o.traces[0], o, &t)) return rc;
  std::vector<mp::GridStat> g;
  molora::Status st = mp::compute_grids(t, rules, o.kernel, &g);
  if (!st.ok()) {
    std::cerr << "molora prof: " << st.message() << "\n";
    return 2;
  }
  emit(o, mp::grids_text(g), mp::grids_json(g), mp::grids_csv(g));
  return warn_exit(t);
}

int run_multi(const Opts& o, bool diff) {
  mp::Rules rules;
  if (int rc = load_rules(o, &rules)) return rc;
  std::vector<mp::Summary> sums;
  int rc = 0;
  for (auto& p : o.traces) {
    mp::Trace t;
    if (int r = load(p, o, &t)) return r;
    mp::Summary s;
    mp::summarize(t, rules, &s);
    sums.push_back(std::move(s));
    rc = std::max(rc, warn_exit(t));
  }
  if (diff)
    emit(o, mp::diff_text(sums[0], sums[1], o.top), mp::diff_json(sums[0], sums[1], o.top),
         mp::diff_csv(sums[0], sums[1], o.top));
  else
    emit(o, mp::ranks_text(sums), mp::ranks_json(sums), mp::ranks_csv(sums));
  return rc;
}

molora::cli::Registrar reg(10, [](CLI::App& app, int& exit_code) {
  auto* prof =
      app.add_subcommand("prof", "Analyze torch-profiler / Kineto traces (.json, .json.gz)");
  auto o = std::make_shared<Opts>();
  prof->add_option("--explain", o->explain,
                   "Print which classification rule a kernel name matches");
  prof->add_option("--rules", o->rules, "Rules file (for --explain and the subcommand)")
      ->check(CLI::ExistingFile);
  prof->require_subcommand(0, 1);

  auto* sum = prof->add_subcommand("summary", "Kernel time, busy, wall; categories; top kernels");
  common(sum, *o);
  sum->add_option("--top", o->top, "Top kernels to list (default 20)");
  sum->add_option("--explain", o->explain, "Also print which rule matches NAME");
  sum->add_option("trace", o->traces, "Trace file")
      ->required()
      ->expected(1)
      ->check(CLI::ExistingFile);

  auto* steps = prof->add_subcommand(
      "steps", "Per-step kernel time, attributed by correlation to CPU annotations");
  common(steps, *o);
  steps->add_option("--svg", o->svg, "Write a stacked bar per step by category (SVG)");
  steps->add_option("--step-regex", o->step_regex, "Annotations that are steps (ECMAScript regex)");
  steps->add_option("trace", o->traces, "Trace file")
      ->required()
      ->expected(1)
      ->check(CLI::ExistingFile);

  auto* grids =
      prof->add_subcommand("grids", "Grid, block, CTAs and duration per launch configuration");
  common(grids, *o);
  grids->add_option("--kernel", o->kernel, "Only kernels whose name matches REGEX");
  grids->add_option("trace", o->traces, "Trace file")
      ->required()
      ->expected(1)
      ->check(CLI::ExistingFile);

  auto* diff = prof->add_subcommand("diff", "Per-category and per-kernel deltas, B - A");
  common(diff, *o);
  diff->add_option("--top", o->top, "Kernels to list (largest |delta| first, default 20)");
  diff->add_option("traces", o->traces, "A B")->required()->expected(2)->check(CLI::ExistingFile);

  auto* ranks =
      prof->add_subcommand("ranks", "Per-rank table, skew per category, the slowest rank");
  common(ranks, *o);
  ranks->add_option("traces", o->traces, "One trace per rank")
      ->required()
      ->expected(1, 1024)
      ->check(CLI::ExistingFile);

  prof->callback([o, prof, sum, steps, grids, diff, ranks, &exit_code] {
    if (o->json && o->csv) {
      std::cerr << "molora prof: --json and --csv exclude each other\n";
      exit_code = 2;
      return;
    }
    if (!o->explain.empty()) {
      mp::Rules rules;
      if ((exit_code = load_rules(*o, &rules))) return;
      // With a machine-readable output the explanation goes to stderr (stdout stays one document).
      (o->json || o->csv ? std::cerr : std::cout) << mp::explain(rules, o->explain);
      if (prof->get_subcommands().empty()) return;
    } else if (prof->get_subcommands().empty()) {
      std::cerr << "molora prof: a subcommand is required (summary, steps, grids, diff, ranks)\n"
                << prof->help();
      exit_code = 2;
      return;
    }
    if (sum->parsed()) exit_code = run_summary(*o);
    if (steps->parsed()) exit_code = run_steps(*o);
    if (grids->parsed()) exit_code = run_grids(*o);
    if (diff->parsed()) exit_code = run_multi(*o, true);
    if (ranks->parsed()) exit_code = run_multi(*o, false);
  });
});

}  // namespace
