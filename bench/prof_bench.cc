// bench_prof: generates Kineto-like traces (tests/prof_tracegen.h) of ~80 MB and ~1 GB into /tmp
// (.json and .json.gz), then times `molora prof summary --json` and the Python baseline
// (bench/prof_baseline.py: json.load + the same classification loop) on the same files, in the
// same run, as child processes (wall time, peak RSS from wait4).
//
// Traces up to 256 MB run each side 3 times (--reps) and keep the fastest of each, alternating
// the two so that machine noise hits both; larger ones run once.
//
//   bench_prof [--sizes 80,1024] [--reps N] [--no-baseline-above MB] [--cli PATH] [--keep]
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "prof_tracegen.h"

namespace {

struct Run {
  double seconds = -1;
  long rss_kb = 0;
  int rc = -1;
};

Run run(const std::vector<std::string>& argv) {
  std::fflush(stdout);  // or the child repeats buffered output
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    if (!std::freopen("/dev/null", "w", stdout)) _exit(127);
    execvp(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rss_kb = ru.ru_maxrss;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// molora's run failed, or the baseline ran (seconds > 0) and failed.
bool failed(const Run& p, const Run& py) { return p.rc != 0 || (py.seconds > 0 && py.rc != 0); }

uint64_t file_size(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Writes ~mb MB of trace JSON (and its gzip) unless they exist already.
void make_trace(int mb, const std::string& json_path, const std::string& gz_path) {
  if (file_size(json_path) > 0 && file_size(gz_path) > 0) return;
  molora::prof::testgen::Options o;
  o.layers = 8;
  std::string probe;
  o.steps = 4;
  molora::prof::testgen::generate(o, &probe);
  double per_step = probe.size() / 4.0;
  o.steps = std::max(1, static_cast<int>(mb * 1e6 / per_step));
  std::string s;
  molora::prof::testgen::generate(o, &s);
  FILE* f = std::fopen(json_path.c_str(), "wb");
  std::fwrite(s.data(), 1, s.size(), f);
  std::fclose(f);
  gzFile g = gzopen(gz_path.c_str(), "wb6");
  for (size_t off = 0; off < s.size(); off += 1u << 26) {
    unsigned n = static_cast<unsigned>(std::min<size_t>(1u << 26, s.size() - off));
    gzwrite(g, s.data() + off, n);
  }
  gzclose(g);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {80, 1024};
  std::string cli =
#ifdef MOLORA_BENCH_CLI
      MOLORA_BENCH_CLI;
#else
      "molora";
#endif
  int baseline_max = 1 << 30;
  bool keep = false;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string x;
      while (std::getline(ss, x, ',')) sizes.push_back(std::stoi(x));
    } else if (a == "--cli" && i + 1 < argc) {
      cli = argv[++i];
    } else if (a == "--no-baseline-above" && i + 1 < argc) {
      baseline_max = std::stoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--keep") {
      keep = true;
    } else {
      std::fprintf(
          stderr,
          "usage: bench_prof [--sizes 80,1024] [--reps N] [--cli PATH] [--no-baseline-above MB] "
          "[--keep]\n");
      return 2;
    }
  }
  std::printf("%-8s %-8s %10s %9s %9s %10s %9s %10s %9s %8s\n", "trace", "format", "json_MB",
              "prof_s", "prof_MB/s", "prof_RSS", "RSS/json", "python_s", "py_RSS", "speedup");
  std::vector<std::string> summary;
  int failures = 0;
  for (int mb : sizes) {
    std::string base = "/tmp/molora_bench_prof_" + std::to_string(mb) + "mb.pt.trace.json";
    make_trace(mb, base, base + ".gz");
    double json_mb = file_size(base) / 1e6;
    for (std::string path : {base + ".gz", base}) {
      const char* fmt =
          path.size() > 3 && path.substr(path.size() - 3) == ".gz" ? "json.gz" : "json";
      Run p, py;
      const int n = mb <= 256 ? reps : 1;
      for (int r = 0; r < n; ++r) {  // fastest of n, the two sides alternating
        Run x = run({cli, "prof", "summary", "--json", "--no-progress", path});
        if (r == 0 || x.rc != 0 || x.seconds < p.seconds) p = x;
        if (mb <= baseline_max) {
          Run y = run({"python3", MOLORA_BENCH_BASELINE, path});
          if (r == 0 || y.rc != 0 || y.seconds < py.seconds) py = y;
        }
        if (failed(p, py)) break;
      }
      double mbs = json_mb / p.seconds;
      char line[512];
      std::snprintf(
          line, sizeof(line), "%-8s %-8s %10.1f %9.3f %9.0f %8.0fMB %9.2f %10.2f %7.0fMB %7.1fx%s",
          (std::to_string(mb) + "MB").c_str(), fmt, json_mb, p.seconds, mbs, p.rss_kb / 1e3,
          p.rss_kb * 1e3 / (json_mb * 1e6), py.seconds, py.rss_kb / 1e3,
          py.seconds > 0 ? py.seconds / p.seconds : 0.0, failed(p, py) ? "  (nonzero exit!)" : "");
      std::printf("%s\n", line);
      std::fflush(stdout);
      if (failed(p, py)) {  // a failed run has no throughput
        std::fprintf(stderr, "bench_prof: %s exited %d, python baseline %d on %s\n", cli.c_str(),
                     p.rc, py.rc, path.c_str());
        ++failures;
        continue;
      }
      char s[256];
      std::snprintf(s, sizeof(s),
                    "SUMMARY prof_summary_%dMB_%s %.0f MB/s, %.1fx python, RSS %.2fx json", mb, fmt,
                    mbs, py.seconds > 0 ? py.seconds / p.seconds : 0.0,
                    p.rss_kb * 1e3 / (json_mb * 1e6));
      summary.push_back(s);
    }
    if (!keep) {
      std::remove(base.c_str());
      std::remove((base + ".gz").c_str());
    }
  }
  for (auto& s : summary) std::printf("%s\n", s.c_str());
  return failures ? 1 : 0;
}
