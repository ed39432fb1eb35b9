// bench_pool: adapter sets of >= 1 GB per source dtype (PEFT safetensors written to --dir at run
// time, not in the repo, kept between runs) loaded, converted and uploaded:
//   cpu load    mmap + parse + validate + convert into the slot image (one thread), from page
//               cache, for each source dtype (bf16, f16, f32 → the bf16 pool) and each build of
//               the conversion loops (avx2 where the CPU has it, baseline)
//   convert     the conversion loop alone on data already in memory (where load time goes)
//   cpu upload  image → host slots (the CPU backend)
//   h2d         device pool uploads: pinned images (DMA) and pageable images through staging
// Baselines measured in the same run: memcpy of the same file bytes out of the page cache (CPU),
// and a plain cudaMemcpyAsync from pinned memory (H2D). Table last, then SUMMARY lines.
//
// Flags: --dir D (default /tmp/molora_pool_bench)  --layers L (8)  --rank r (16)
//        --r-max R (= r; R > r exercises the padded-row path)  --src bf16,f16,f32
//        --isa both|auto|baseline (both)  --reps N (3, best of)
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "molora/pool.h"
#include "molora/safetensors.h"
#include "pool/convert.h"
#include "pool/safetensors_writer.h"

using namespace molora;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string what;
  double bytes, seconds, baseline_gbps;
};
std::vector<Row> rows;

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Shape {
  int L = 8, E = 128;
  int64_t H = 2048, I = 768;
  int r = 16;
};

std::string name(int l, int e, const char* proj, const char* ab) {
  return "base_model.model.model.layers." + std::to_string(l) + ".mlp.experts." +
         std::to_string(e) + "." + proj + ".lora_" + ab + ".weight";
}

uint64_t file_size(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Writes adapter `dir` (tensors of safetensors dtype `dt`: BF16, F16 or F32; finite
// pseudo-random values) unless a file of the right size is already there.
void write_adapter(const std::string& dir, const Shape& s, const std::string& dt, uint32_t seed) {
  ::mkdir(dir.c_str(), 0755);
  const std::string st = dir + "/adapter_model.safetensors";
  std::vector<pool::StWriteTensor> ts;
  const size_t es = dt == "F32" ? 4 : 2;
  uint32_t x = seed * 2654435761u + 1;
  auto fill = [&](int64_t rows, int64_t cols) {
    std::vector<uint8_t> b(static_cast<size_t>(rows * cols) * es);
    for (size_t i = 0; i < b.size(); i += es) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      uint32_t v = 0x3c000000u | (x & 0x807fffffu);  // |v| in [2^-7, 2^-6): finite
      float f;
      std::memcpy(&f, &v, 4);
      if (es == 4) {
        std::memcpy(&b[i], &v, 4);
      } else {
        uint16_t h = dt == "BF16" ? pool::float_to_bf16(f) : pool::float_to_half(f);
        std::memcpy(&b[i], &h, 2);
      }
    }
    return b;
  };
  std::vector<uint64_t> sizes;
  uint64_t expect = 0;
  for (int l = 0; l < s.L; ++l)
    for (int e = 0; e < s.E; ++e) {
      const char* projs[] = {"gate_proj", "up_proj", "down_proj"};
      for (int m = 0; m < 3; ++m) {
        int64_t K = m < 2 ? s.H : s.I, N = m < 2 ? s.I : s.H;
        ts.push_back({name(l, e, projs[m], "A"), dt, {s.r, K}, {}});
        sizes.push_back(static_cast<uint64_t>(s.r * K) * es);
        ts.push_back({name(l, e, projs[m], "B"), dt, {N, s.r}, {}});
        sizes.push_back(static_cast<uint64_t>(N * s.r) * es);
        expect += sizes[sizes.size() - 2] + sizes.back();
      }
    }
  std::string cfg = dir + "/adapter_config.json";
  FILE* f = std::fopen(cfg.c_str(), "w");
  std::fprintf(f,
               "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": 32, \"target_modules\": "
               "[\"gate_proj\", \"up_proj\", \"down_proj\"]}",
               s.r);
  std::fclose(f);
  const uint64_t header = pool::st_header_json(ts, &sizes).size() + 8;  // no data generated yet
  if (file_size(st) == header + expect) return;                         // kept from an earlier run
  for (auto& t : ts) t.bytes = fill(t.shape[0], t.shape[1]);
  if (!pool::write_safetensors(st, ts)) std::fprintf(stderr, "cannot write %s\n", st.c_str());
}

// Page-cache baseline: mmap (populated) and memcpy every tensor of each file (the bytes load()
// reads) into one destination buffer faulted in beforehand; best of 3; returns file bytes/s.
double memcpy_baseline(const std::vector<std::string>& dirs, double* bytes) {
  std::vector<uint8_t> dst;
  for (const auto& d : dirs) {
    const uint64_t n = file_size(d + "/adapter_model.safetensors");
    if (n > dst.size()) dst.assign(n, 1);
  }
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    double total = 0;
    auto t0 = Clock::now();
    for (const auto& d : dirs) {
      std::unique_ptr<SafetensorsFile> f;
      if (!SafetensorsFile::open(d + "/adapter_model.safetensors", &f).ok()) return 0;
      const auto& h = f->header();
      for (const auto& t : h.tensors)
        std::memcpy(dst.data() + t.begin, f->data(t), t.end - t.begin);
      total += static_cast<double>(f->file_size() - h.data_offset);
    }
    best = std::min(best, secs(t0, Clock::now()));
    *bytes = total;
  }
  return *bytes / best / 1e9;
}

// Loads every adapter into a fresh pool, best of `reps`; returns file bytes/s.
double time_loads(const PoolConfig& c, const std::vector<std::string>& dirs, int reps,
                  double* file_bytes, std::unique_ptr<AdapterPool>* keep) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    std::unique_ptr<AdapterPool> p;
    Status s = AdapterPool::create(c, &p);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 0;
    }
    double fb = 0;
    auto t0 = Clock::now();
    for (size_t i = 0; i < dirs.size(); ++i) {
      int32_t id;
      s = p->load("a" + std::to_string(i), dirs[i], &id);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        return 0;
      }
      AdapterInfo info;
      p->info(id, &info);
      fb += static_cast<double>(info.file_bytes);
    }
    best = std::min(best, secs(t0, Clock::now()));
    *file_bytes = fb;
    *keep = std::move(p);
  }
  return *file_bytes / best / 1e9;
}

// Alternating batches of adapters {0..S−1}, {S..2S−1}: every prepare uploads S adapters.
double time_uploads(AdapterPool& p, int n_adapters, int reps, double* bytes) {
  const int S = p.config().num_slots;
  std::vector<int32_t> slots(S);
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<int32_t> ids(S);
    for (int i = 0; i < S; ++i) ids[i] = (rep * S + i) % n_adapters;
    p.synchronize();
    auto t0 = Clock::now();
    Status s = p.prepare(ids.data(), S, slots.data());
    if (s.ok()) s = p.synchronize();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 0;
    }
    if (rep > 0 || reps == 1) best = std::min(best, secs(t0, Clock::now()));
  }
  *bytes = static_cast<double>(S) * static_cast<double>(p.stats().slot_bytes);
  return *bytes / best / 1e9;
}

// The conversion loop alone: `n` elements of `src` (in memory, already faulted in) into a
// prefaulted destination, rows of r into rows of r_max (one long row when r == r_max). Best of
// 5; returns source bytes/s.
double time_convert(DType src, DType dst, int64_t n, int r, int r_max) {
  const size_t ses = dtype_size(src), des = dtype_size(dst);
  const int64_t rows = n / r;
  std::vector<uint8_t> in(static_cast<size_t>(rows * r) * ses);
  uint32_t x = 12345;
  for (size_t i = 0; i + 4 <= in.size(); i += 4) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    uint32_t v = 0x3c000000u | (x & 0x807fffffu);
    std::memcpy(&in[i], &v, 4);
  }
  std::vector<uint8_t> out(static_cast<size_t>(rows * r_max) * des, 1);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    pool::convert_rows(src, in.data(), r * static_cast<int64_t>(ses), dst, out.data(), r_max, rows,
                       r);
    best = std::min(best, secs(t0, Clock::now()));
  }
  return static_cast<double>(in.size()) / best / 1e9;
}

#if MOLORA_HAVE_CUDA
double h2d_baseline(size_t bytes) {
  void *h = nullptr, *d = nullptr;
  if (cudaHostAlloc(&h, bytes, 0) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess) return 0;
  std::memset(h, 1, bytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int i = 0; i < 4; ++i) {
    cudaEventRecord(a);
    cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(h);
  cudaFree(d);
  return static_cast<double>(bytes) / (best * 1e-3) / 1e9;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/molora_pool_bench", srcs = "bf16,f16,f32", isa = "both";
  Shape s;
  int r_max = 0, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--layers")
      s.L = std::atoi(argv[i + 1]);
    else if (a == "--rank")
      s.r = std::atoi(argv[i + 1]);
    else if (a == "--r-max")
      r_max = std::atoi(argv[i + 1]);
    else if (a == "--src")
      srcs = argv[i + 1];
    else if (a == "--isa")
      isa = argv[i + 1];
    else if (a == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (r_max < s.r) r_max = s.r;
  ::mkdir(dir.c_str(), 0755);
  struct Src {
    const char* tag;  // flag spelling
    const char* st;   // safetensors dtype
    DType dt;
    int count;  // adapters (>= 1 GB per source dtype)
  };
  const Src all[] = {{"bf16", "BF16", DType::kBF16, 4},
                     {"f16", "F16", DType::kF16, 4},
                     {"f32", "F32", DType::kF32, 2}};
  std::vector<Src> used;
  std::vector<std::vector<std::string>> dirs;
  auto t0 = Clock::now();
  for (const Src& x : all) {
    if (("," + srcs + ",").find(std::string(",") + x.tag + ",") == std::string::npos) continue;
    used.push_back(x);
    dirs.emplace_back();
    for (int i = 0; i < x.count; ++i) {
      dirs.back().push_back(dir + "/" + x.tag + "_L" + std::to_string(s.L) + "_r" +
                            std::to_string(s.r) + "_" + std::to_string(i));
      write_adapter(dirs.back().back(), s, x.st, static_cast<uint32_t>(i + 1));
    }
  }
  if (used.empty()) {
    std::fprintf(stderr, "--src names none of bf16, f16, f32\n");
    return 2;
  }
  std::printf(
      "adapter sets in %s: L=%d E=%d H=%lld I=%lld r=%d r_max=%d; sources %s "
      "(written/checked in %.1f s); conversion loops: %s available\n",
      dir.c_str(), s.L, s.E, (long long)s.H, (long long)s.I, s.r, r_max, srcs.c_str(),
      secs(t0, Clock::now()), pool::convert_force_baseline(false) ? "avx2" : "baseline only");

  PoolConfig c;
  c.num_slots = 2;
  c.num_layers = s.L;
  c.num_experts = s.E;
  c.hidden = s.H;
  c.intermediate = s.I;
  c.r_max = r_max;
  c.dtype = DType::kBF16;

  std::vector<std::pair<bool, const char*>> isas;  // (force baseline, label)
  const bool has_avx2 =
      pool::convert_force_baseline(false) && std::string(pool::convert_isa()) == "avx2";
  if ((isa == "both" || isa == "auto") && has_avx2) isas.push_back({false, "avx2"});
  if (isa == "both" || isa == "baseline" || !has_avx2) isas.push_back({true, "baseline"});

  std::string summary;
  double bytes = 0;
  std::unique_ptr<AdapterPool> cpu_pool;
  size_t bf16_set = used.size();
  for (size_t k = 0; k < used.size(); ++k) {
    const Src& x = used[k];
    double bb = 0;
    const double base = memcpy_baseline(dirs[k], &bb);
    for (const auto& is : isas) {
      pool::convert_force_baseline(is.first);
      std::unique_ptr<AdapterPool> p;
      const double g = time_loads(c, dirs[k], reps, &bytes, &p);
      rows.push_back({std::string("cpu load ") + x.tag + "->bf16 " + is.second + " (1 thread)",
                      bytes, g > 0 ? bytes / g / 1e9 : 0, base});
      summary += std::string(summary.empty() ? "" : ", ") + x.tag + "/" + is.second + " " +
                 std::to_string(g).substr(0, 4);
      if (x.dt == DType::kBF16 && !cpu_pool) {
        cpu_pool = std::move(p);
        bf16_set = k;
      }
    }
    const int64_t n = (int64_t{64} << 20) / static_cast<int64_t>(dtype_size(x.dt));  // 64 MB
    for (const auto& is : isas) {
      pool::convert_force_baseline(is.first);
      const double g = time_convert(x.dt, DType::kBF16, n, s.r, r_max);
      rows.push_back({std::string("convert ") + x.tag + "->bf16 " + is.second + " (in memory)",
                      64e6 * 1.048576, 64e6 * 1.048576 / g / 1e9, base});
    }
  }
  pool::convert_force_baseline(false);
  if (cpu_pool) {
    double bb = 0;
    const double base = memcpy_baseline(dirs[bf16_set], &bb);
    const double g = time_uploads(*cpu_pool, used[bf16_set].count, 3, &bytes);
    rows.push_back({"cpu upload image->host slots", bytes, bytes / g / 1e9, base});
    cpu_pool.reset();
  }

  double h2d_pinned = 0, h2d_staged = 0, h2d_base = 0;
#if MOLORA_HAVE_CUDA
  if (require_gpu().ok() && bf16_set < used.size()) {
    const auto& bdirs = dirs[bf16_set];
    const int nb = used[bf16_set].count;
    c.device = 0;
    std::unique_ptr<AdapterPool> gp;
    const double gpu_load = time_loads(c, bdirs, 1, &bytes, &gp);
    const double slot_bytes = gp ? static_cast<double>(gp->stats().slot_bytes) : 0;
    h2d_base = h2d_baseline(static_cast<size_t>(2 * slot_bytes));
    rows.push_back({"gpu load bf16 (pinned images)", bytes, bytes / gpu_load / 1e9, 0});
    if (gp) {
      h2d_pinned = time_uploads(*gp, nb, 4, &bytes);
      rows.push_back({"h2d upload, pinned images", bytes, bytes / h2d_pinned / 1e9, h2d_base});
    }
    gp.reset();
    c.pinned_images = false;
    time_loads(c, bdirs, 1, &bytes, &gp);
    if (gp) {
      h2d_staged = time_uploads(*gp, nb, 4, &bytes);
      rows.push_back({"h2d upload, staged (pageable)", bytes, bytes / h2d_staged / 1e9, h2d_base});
    }
  } else {
    std::printf("no GPU (or no bf16 set): %s; host->device rows skipped\n",
                require_gpu().message().c_str());
  }
#endif

  std::printf("\n%-40s %10s %10s %9s %12s %8s\n", "case", "MB", "ms", "GB/s", "baseline GB/s",
              "% base");
  for (const auto& r : rows) {
    double gbps = r.bytes / r.seconds / 1e9;
    std::printf("%-40s %10.1f %10.2f %9.2f %12.2f %7.0f%%\n", r.what.c_str(), r.bytes / 1e6,
                r.seconds * 1e3, gbps, r.baseline_gbps,
                r.baseline_gbps > 0 ? 100.0 * gbps / r.baseline_gbps : 0.0);
  }
  std::printf(
      "(GB/s of file bytes read; baselines: mmap + memcpy of the same file bytes out of the page "
      "cache into memory already faulted in; "
      "plain pinned cudaMemcpyAsync H2D)\n");
  std::printf("SUMMARY pool cpu_load GB/s/core (source/loops): %s (target >= 1)\n",
              summary.c_str());
  if (h2d_pinned > 0)
    std::printf(
        "SUMMARY pool h2d pinned %.1f GB/s, staged %.1f GB/s, raw pinned copy %.1f GB/s "
        "(target >= 20)\n",
        h2d_pinned, h2d_staged, h2d_base);
  return 0;
}
