// bench_prof_stages: where the time of `molora prof summary` goes, stage by stage, on one
// generated trace (tests/prof_tracegen.h) held in memory: gzip inflate alone (zlib stream and
// libdeflate whole-buffer), the piece parser alone over the whole traceEvents array (one core),
// read_trace_buffer on the raw JSON and on the gzip bytes (1 and N threads), and summarize().
//
//   bench_prof_stages [--mb 80] [--reps 3] [--piece-mb N]
#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "molora/prof.h"
#include "prof/parse_piece.h"
#include "prof_tracegen.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

std::string gzip(const std::string& s, int level) {
  z_stream z{};
  deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, s.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = static_cast<uInt>(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int mb = 80, reps = 3;
  size_t piece = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mb") mb = std::stoi(argv[i + 1]);
    if (a == "--reps") reps = std::stoi(argv[i + 1]);
    if (a == "--piece-mb") piece = std::stoul(argv[i + 1]) << 20;
  }
  molora::prof::testgen::Options o;
  o.layers = 8;
  std::string probe;
  o.steps = 4;
  molora::prof::testgen::generate(o, &probe);
  o.steps = std::max(1, static_cast<int>(mb * 1e6 / (probe.size() / 4.0)));
  std::string js;
  molora::prof::testgen::generate(o, &js);
  std::string gz = gzip(js, 6);
  const double MB = js.size() / 1e6;
  std::printf("trace %.1f MB JSON, %.1f MB gzip -6 (%.1fx), %u hardware threads\n", MB,
              gz.size() / 1e6, static_cast<double>(js.size()) / gz.size(),
              std::thread::hardware_concurrency());
  auto row = [&](const char* what, double s) {
    std::printf("%-46s %8.3f s %8.0f MB/s\n", what, s, MB / s);
  };

  std::vector<char> out(8u << 20);
  row("zlib inflate (stream, 8 MB out chunks)", best_of(reps, [&] {
        z_stream z{};
        inflateInit2(&z, 15 + 32);
        z.next_in = reinterpret_cast<Bytef*>(gz.data());
        z.avail_in = static_cast<uInt>(gz.size());
        int rc = Z_OK;
        while (rc == Z_OK) {
          z.next_out = reinterpret_cast<Bytef*>(out.data());
          z.avail_out = static_cast<uInt>(out.size());
          rc = inflate(&z, Z_NO_FLUSH);
        }
        inflateEnd(&z);
      }));
  std::vector<char> whole(js.size() + 64);
  row("libdeflate gzip (whole buffer)", best_of(reps, [&] {
        auto* d = libdeflate_alloc_decompressor();
        size_t n = 0;
        libdeflate_gzip_decompress(d, gz.data(), gz.size(), whole.data(), whole.size(), &n);
        libdeflate_free_decompressor(d);
      }));

  // The parser alone over the whole traceEvents array, one core.
  size_t a = js.find("\"traceEvents\": [") + 15;
  size_t b = js.rfind(']', js.find("\"traceName\""));
  std::vector<char> arr(js.begin() + a, js.begin() + b + 1);
  arr.resize(arr.size() + 64);
  row("parse_piece alone (1 core)", best_of(reps, [&] {
        molora::prof::detail::PieceResult r;
        molora::prof::detail::parse_piece(arr.data(), b + 1 - a, 0, &r);
      }));

  unsigned hw = std::max(2u, std::thread::hardware_concurrency());
  molora::prof::Trace t;
  for (int th : {1, static_cast<int>(hw)}) {
    molora::prof::ReadOptions ro;
    ro.threads = th;
    if (piece) ro.piece_bytes = piece;
    std::string l = "read_trace_buffer json, threads " + std::to_string(th);
    row(l.c_str(),
        best_of(reps, [&] { molora::prof::read_trace_buffer(js.data(), js.size(), ro, &t); }));
    l = "read_trace_buffer json.gz, threads " + std::to_string(th);
    row(l.c_str(),
        best_of(reps, [&] { molora::prof::read_trace_buffer(gz.data(), gz.size(), ro, &t); }));
  }
  molora::prof::Rules rules;
  molora::prof::Summary s;
  row("summarize (after reading)", best_of(reps, [&] { molora::prof::summarize(t, rules, &s); }));
  std::printf("events %llu, kept: %zu kernels, %zu runtime, %zu annotations\n",
              static_cast<unsigned long long>(t.events), t.kernels.size(), t.runtime.size(),
              t.annotations.size());
  return 0;
}
