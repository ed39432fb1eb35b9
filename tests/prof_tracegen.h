// A generator of realistic Kineto traces with known answers (tests and bench_prof).
//
// Per step: CPU user annotations ProfilerStep#N > step[DECODE] > layerL > attention|moe on one
// CPU thread, cudaLaunchKernel runtime calls with correlation ids, kernels on two streams
// (overlapping), NCCL collectives, memcpy/memset, cpu_op and python_function noise, ac2g flow
// events, gpu_user_annotation spans (which must be ignored), metadata events, and a few kernels
// with no step or no launching call. Times are integer nanoseconds printed as µs with 3 decimals.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace molora::prof::testgen {

struct KernelKind {
  const char* name;
  const char* category;
  int grid[3], block[3];
};

inline const std::vector<KernelKind>& kinds() {
  static const std::vector<KernelKind> k = {
      {"ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
       "gemm",
       {64, 1, 1},
       {128, 1, 1}},
      {"flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>",
       "attention",
       {2, 8, 4},
       {128, 1, 1}},
      {"fused_moe_kernel", "moe", {1536, 1, 1}, {128, 1, 1}},
      {"molora_lora_expand_kernel", "moe-lora", {48, 1, 1}, {256, 1, 1}},
      {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
       "allreduce",
       {8, 1, 1},
       {512, 1, 1}},
      {"void at::native::vectorized_elementwise_kernel<4, "
       "at::native::CUDAFunctor_add<c10::BFloat16>>",
       "elementwise",
       {80, 1, 1},
       {128, 1, 1}},
      {"void vllm::rms_norm_kernel<c10::BFloat16>", "norm", {16, 1, 1}, {1024, 1, 1}},
      {"void topkGatingSoftmax<8, 128>", "routing", {4, 1, 1}, {256, 1, 1}},
      {"ncclDevKernel_AllGather_RING_LL", "allgather", {8, 1, 1}, {512, 1, 1}},
      {"cross_device_reduce_1stage<__nv_bfloat16, 8>", "allreduce", {36, 1, 1}, {512, 1, 1}},
      {"eagle_draft_tree_kernel \\\"quoted\\\\name\\\"", "speculative", {1, 1, 1}, {32, 1, 1}},
      {"my_unknown_kernel", "other", {1, 1, 1}, {64, 1, 1}},
  };
  return k;
}

struct Expected {
  uint64_t kernels = 0, memcpys = 0, memsets = 0, events = 0;
  int64_t kernel_ns = 0, memcpy_ns = 0, memset_ns = 0, busy_ns = 0;
  std::map<std::string, int64_t> category_ns;
  std::map<std::string, uint64_t> category_count;
  std::vector<int64_t> step_kernel_ns;  // per step[DECODE]
  std::vector<uint64_t> step_launches;
  int64_t nostep_kernel_ns = 0;
  uint64_t nostep_launches = 0, unmatched = 0;
};

struct Options {
  int steps = 4, layers = 3;
  bool pretty = true;  // one key per line (like Kineto) or compact
  bool shuffle_keys = false;
  int rank = -1;       // distributedInfo.rank when >= 0
  double scale = 1.0;  // multiplies kernel durations (ranks, diff)
  uint32_t seed = 1;
};

inline std::string us(int64_t ns) {
  char b[48];
  std::snprintf(b, sizeof(b), "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  return b;
}

class Writer {
 public:
  Writer(const Options& o, std::string* out) : o_(o), out_(out), rng_(o.seed) {}
  // One event from (key, raw JSON value) pairs.
  void event(std::vector<std::pair<std::string, std::string>> kv) {
    if (o_.shuffle_keys) std::shuffle(kv.begin(), kv.end(), rng_);
    *out_ += first_ ? (o_.pretty ? "\n  {" : "{") : (o_.pretty ? ",\n  {" : ",{");
    first_ = false;
    ++count;
    for (size_t i = 0; i < kv.size(); ++i) {
      if (i) *out_ += ",";
      if (o_.pretty) *out_ += "\n    ";
      *out_ += "\"" + kv[i].first + "\": " + kv[i].second;
    }
    *out_ += o_.pretty ? "\n  }" : "}";
  }
  std::mt19937& rng() { return rng_; }
  uint64_t count = 0;

 private:
  const Options& o_;
  std::string* out_;
  std::mt19937 rng_;
  bool first_ = true;
};

inline std::string q(const std::string& s) { return "\"" + s + "\""; }
inline std::string dim3(const int* d) {
  return "[" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
         "]";
}

// Writes a trace into *out and returns the answers.
inline Expected generate(const Options& o, std::string* out) {
  Expected e;
  out->clear();
  *out +=
      "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [{\"id\": 0, \"name\": \"NVIDIA "
      "H200\"}],\n";
  if (o.rank >= 0)
    *out += "  \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": " + std::to_string(o.rank) +
            ", \"world_size\": 8},\n";
  *out += "  \"traceEvents\": [";
  Writer w(o, out);
  const std::string pid = "1234", tid = "1234";
  int64_t corr = 1000;
  std::vector<std::pair<int64_t, int64_t>> busy;
  auto add_kernel = [&](int kind, int64_t launch_ts, int64_t kts, int64_t dur, int stream, int step,
                        bool match) {
    const KernelKind& k = kinds()[kind];
    int64_t c = corr++;
    if (match) {
      w.event({{"ph", q("X")},
               {"cat", q("cuda_runtime")},
               {"name", q("cudaLaunchKernel")},
               {"pid", pid},
               {"tid", tid},
               {"ts", us(launch_ts)},
               {"dur", "3.250"},
               {"args", "{\"External id\": " + std::to_string(c) +
                            ", \"cbid\": 211, \"correlation\": " + std::to_string(c) + "}"}});
      w.event({{"ph", q("s")},
               {"id", std::to_string(c)},
               {"pid", pid},
               {"tid", tid},
               {"ts", us(launch_ts)},
               {"cat", q("ac2g")},
               {"name", q("ac2g")}});
    } else {
      e.unmatched++;
    }
    std::string name = k.name;
    w.event({{"ph", q("X")},
             {"cat", q("kernel")},
             {"name", q(name)},
             {"pid", "0"},
             {"tid", std::to_string(stream)},
             {"ts", us(kts)},
             {"dur", us(dur)},
             {"args",
              "{\"External id\": " + std::to_string(c) +
                  ", \"queued\": 0, \"device\": 0, \"context\": 1, "
                  "\"stream\": " +
                  std::to_string(stream) + ", \"correlation\": " + std::to_string(c) +
                  ", \"registers per thread\": 128, \"shared memory\": 0, \"blocks per SM\": 0.5, "
                  "\"warps per SM\": 2.0, \"grid\": " +
                  dim3(k.grid) + ", \"block\": " + dim3(k.block) +
                  ", \"est. achieved occupancy %\": 0}"}});
    e.kernels++;
    e.kernel_ns += dur;
    e.category_ns[k.category] += dur;
    e.category_count[k.category]++;
    busy.push_back({kts, kts + dur});
    if (step >= 0 && match) {
      e.step_kernel_ns[step] += dur;
      e.step_launches[step]++;
    } else {
      e.nostep_kernel_ns += dur;
      e.nostep_launches++;
    }
  };
  auto annotation = [&](const std::string& name, int64_t ts, int64_t dur) {
    w.event({{"ph", q("X")},
             {"cat", q("user_annotation")},
             {"name", q(name)},
             {"pid", pid},
             {"tid", tid},
             {"ts", us(ts)},
             {"dur", us(dur)},
             {"args", "{\"External id\": 7}"}});
  };
  w.event({{"ph", q("M")},
           {"name", q("process_name")},
           {"pid", "0"},
           {"tid", "0"},
           {"args", "{\"name\": \"GPU 0\"}"}});
  // A kernel before any step (warm-up) and one whose launching call is missing.
  add_kernel(5, 100000, 100500, 2000 + 7, 7, -1, true);
  add_kernel(11, 100600, 103000, 1500, 7, -1, false);
  e.step_kernel_ns.assign(o.steps, 0);
  e.step_launches.assign(o.steps, 0);
  int64_t t = 200000;  // ns
  const int per_layer = 8;
  for (int s = 0; s < o.steps; ++s) {
    int64_t step_len = 40000 + o.layers * per_layer * 12000;
    annotation("ProfilerStep#" + std::to_string(s + 10), t, step_len + 20000);
    annotation("step[DECODE]", t + 5000, step_len);
    int64_t gpu = t + 30000;
    int64_t cpu = t + 10000;
    for (int l = 0; l < o.layers; ++l) {
      int64_t layer_len = per_layer * 12000;
      annotation("layer" + std::to_string(l), cpu, layer_len - 100);
      annotation("attention", cpu + 50, 4 * 12000 - 200);
      annotation("moe", cpu + 4 * 12000, 4 * 12000 - 300);
      for (int i = 0; i < per_layer; ++i) {
        int kind = (s * 7 + l * 3 + i) % static_cast<int>(kinds().size());
        int64_t dur =
            static_cast<int64_t>((1000 + 137 * ((s + i * 5 + l) % 23)) * o.scale) + (i % 3);
        int stream = (i % 4 == 3) ? 13 : 7;  // side stream overlaps the main one
        add_kernel(kind, cpu + 1000 + i * 12000, gpu, dur, stream, s, true);
        if (stream == 7) gpu += dur + 300;
        // cpu_op noise with a big args object
        w.event({{"ph", q("X")},
                 {"cat", q("cpu_op")},
                 {"name", q("aten::mm")},
                 {"pid", pid},
                 {"tid", tid},
                 {"ts", us(cpu + 900 + i * 12000)},
                 {"dur", "5.000"},
                 {"args",
                  "{\"External id\": 3, \"Input Dims\": [[16, 1024], [1024, 512]], \"Input type\": "
                  "[\"c10::BFloat16\", \"c10::BFloat16\"], \"Sequence number\": 11, \"Fwd thread "
                  "id\": 0}"}});
      }
      // gpu_user_annotation spanning the layer (nested and overlapping: must not count)
      w.event({{"ph", q("X")},
               {"cat", q("gpu_user_annotation")},
               {"name", q("layer" + std::to_string(l))},
               {"pid", "0"},
               {"tid", "7"},
               {"ts", us(gpu - 50000)},
               {"dur", us(60000)},
               {"args", "{\"External id\": 9}"}});
      cpu += layer_len;
    }
    // memcpy and memset (kept apart from kernel time)
    w.event({{"ph", q("X")},
             {"cat", q("gpu_memcpy")},
             {"name", q("Memcpy DtoH (Device -> Pinned)")},
             {"pid", "0"},
             {"tid", "7"},
             {"ts", us(gpu + 100)},
             {"dur", "1.500"},
             {"args", "{\"device\": 0, \"stream\": 7, \"correlation\": 1, \"bytes\": 64}"}});
    w.event({{"ph", q("X")},
             {"cat", q("gpu_memset")},
             {"name", q("Memset (Device)")},
             {"pid", "0"},
             {"tid", "7"},
             {"ts", us(gpu + 2000)},
             {"dur", "0.750"},
             {"args", "{\"device\": 0, \"stream\": 7, \"correlation\": 2, \"bytes\": 4096}"}});
    e.memcpys++, e.memsets++;
    e.memcpy_ns += 1500, e.memset_ns += 750;
    w.event({{"ph", q("X")},
             {"cat", q("python_function")},
             {"name", q("torch/nn/modules/module.py(1747): _call_impl")},
             {"pid", pid},
             {"tid", tid},
             {"ts", us(t)},
             {"dur", us(step_len)},
             {"args", "{\"Python parent id\": 1, \"Python id\": 2}"}});
    t += step_len + 60000;
  }
  *out += o.pretty ? "\n  ],\n" : "],\n";
  *out +=
      "  \"traceName\": \"generated\",\n  \"displayTimeUnit\": \"ms\",\n  \"baseTimeNanoseconds\": "
      "1700000000000000000\n}\n";
  e.events = w.count;
  // busy: union of kernel intervals (single device)
  std::sort(busy.begin(), busy.end());
  int64_t cs = 0, ce = -1;
  for (auto& [a, b] : busy) {
    if (a > ce) {
      if (ce > cs) e.busy_ns += ce - cs;
      cs = a, ce = b;
    } else {
      ce = std::max(ce, b);
    }
  }
  if (ce > cs) e.busy_ns += ce - cs;
  return e;
}

}  // namespace molora::prof::testgen
