// bench_comm: µs per all-reduce, one-shot vs two-shot, world 2..8, 1 KB..16 MB, and the fused
// residual+rmsnorm variant, on ONE GPU.
//
// What a one-GPU run measures: the world ranks are streams of one process (create_local_group),
// each rank's staging slots live in the same device's HBM, and every rank's kernel runs at once
// on a share of the SMs. A time is "all ranks finished one all-reduce", CUDA-graph replayed (each
// graph: 20 calls of every rank, fork/join through events), so it contains the protocol's cost
// (flags, end flags, waits, launches) and HBM traffic of all ranks together. What it does NOT
// show: NVLink bandwidth or latency (no byte crosses a link), and how NCCL compares (NCCL needs
// one GPU per rank; the only NCCL row here is world 1, a local copy through ncclAllReduce, as a
// floor of one NCCL launch). The one-shot/two-shot switch point measured here is the one-GPU
// switch point; on NVLink it must be re-measured (issue 7).
//
// Bytes (HBM, all ranks): one-shot w*(S + 2(w-1)S + S) (read in, write (w-1) peer slots, read
// (w-1) slots, write out); two-shot w*(2S + 4S(w-1)/w) (scatter, reduce + gather writes, reads).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "molora/comm.h"

#define OK(x)                                                                           \
  do {                                                                                  \
    ::molora::Status s_ = (x);                                                          \
    if (!s_.ok()) {                                                                     \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, s_.to_string().c_str(), __LINE__); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

using namespace molora;

namespace {

constexpr int kCalls = 20;  // calls per graph

enum class Op { kAllReduce, kFused };

// One local group, its streams and buffers; times graphs of kCalls calls of every rank.
struct Bench {
  int world;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<cudaStream_t> streams;
  std::vector<void*> in, out, res;
  void* weight = nullptr;
  cudaStream_t main;
  cudaEvent_t fork_ev, t0, t1;
  std::vector<cudaEvent_t> join_ev;

  Bench(int w, size_t max_bytes) : world(w), streams(w), in(w), out(w), res(w), join_ev(w) {
    CommOptions o;
    o.max_bytes = max_bytes;
    o.timeout_ms = 10000;
    OK(Communicator::create_local_group(w, 0, o, &comms));
    for (int r = 0; r < w; ++r) {
      CK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
      CK(cudaMalloc(&in[r], max_bytes));
      CK(cudaMalloc(&out[r], max_bytes));
      CK(cudaMalloc(&res[r], max_bytes));
      CK(cudaMemset(in[r], 0x3c, max_bytes));  // bf16 ~0.011: finite sums
      CK(cudaMemset(res[r], 0x3c, max_bytes));
      CK(cudaEventCreateWithFlags(&join_ev[r], cudaEventDisableTiming));
    }
    CK(cudaMalloc(&weight, 64 << 10));
    CK(cudaMemset(weight, 0x3f, 64 << 10));
    CK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaDeviceSynchronize());
  }
  ~Bench() {
    cudaDeviceSynchronize();
    for (int r = 0; r < world; ++r) {
      cudaStreamDestroy(streams[r]);
      cudaFree(in[r]);
      cudaFree(out[r]);
      cudaFree(res[r]);
      cudaEventDestroy(join_ev[r]);
    }
    cudaFree(weight);
    cudaStreamDestroy(main);
  }
  // µs per call (all ranks done), median of 5 replays of a graph of kCalls calls.
  double time_us(size_t bytes, CommAlgo algo, Op op, int64_t hidden) {
    for (auto& c : comms) c->set_algo(algo);
    const int64_t numel = static_cast<int64_t>(bytes / 2);
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kCalls; ++i) {
      CK(cudaEventRecord(fork_ev, main));
      for (int r = 0; r < world; ++r) {
        CK(cudaStreamWaitEvent(streams[r], fork_ev, 0));
        if (op == Op::kAllReduce)
          OK(comms[r]->all_reduce(in[r], out[r], numel, DType::kBF16, streams[r]));
        else
          OK(comms[r]->all_reduce_residual_rmsnorm(in[r], res[r], weight, out[r], numel, hidden,
                                                   1e-6f, DType::kBF16, streams[r]));
        CK(cudaEventRecord(join_ev[r], streams[r]));
        CK(cudaStreamWaitEvent(main, join_ev[r], 0));
      }
    }
    CK(cudaStreamEndCapture(main, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, main));  // warm-up
    std::vector<double> t;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaEventRecord(t0, main));
      CK(cudaGraphLaunch(exec, main));
      CK(cudaEventRecord(t1, main));
      CK(cudaEventSynchronize(t1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      t.push_back(ms * 1000.0 / kCalls);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    for (auto& c : comms) {
      Status s = c->check();
      if (!s.ok()) {
        std::fprintf(stderr, "comm failed during the bench: %s\n", s.to_string().c_str());
        std::exit(1);
      }
    }
    std::sort(t.begin(), t.end());
    return t[2];
  }
};

double hbm_bytes(int w, double s, bool two) {
  return two ? w * (2 * s + 4 * s * (w - 1) / w) : w * (2 * s + 2 * s * (w - 1));
}

std::string size_name(size_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof(buf), "%zuMB", b >> 20);
  else
    std::snprintf(buf, sizeof(buf), "%zuKB", b >> 10);
  return buf;
}

// World 1 through NCCL (a local copy): the cost of one ncclAllReduce launch on this GPU.
double nccl_world1_us(size_t bytes) {
  CommExchange self = [](const std::vector<uint8_t>& mine, std::vector<uint8_t>* all) {
    *all = mine;
    return Status::Ok();
  };
  std::unique_ptr<Communicator> c;
  if (!Communicator::create(0, 1, 0, self, CommOptions{}, &c).ok()) return -1;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 0, bytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (!c->all_reduce(a, b, bytes / 2, DType::kBF16, s).ok()) return -1;  // no NCCL in this build
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) OK(c->all_reduce(a, b, bytes / 2, DType::kBF16, s));
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphLaunch(e, s));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaEventRecord(t0, s));
  CK(cudaGraphLaunch(e, s));
  CK(cudaEventRecord(t1, s));
  CK(cudaEventSynchronize(t1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, t0, t1));
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(s);
  return ms * 1000.0 / kCalls;
}

}  // namespace

int main(int argc, char** argv) {
  const double copy_gbs = molora::bench::copy_bandwidth_gbs();
  const size_t max_bytes = size_t{16} << 20;
  std::vector<size_t> sizes;
  for (size_t b = 1024; b <= max_bytes; b *= 2) sizes.push_back(b);
  int wmin = 2, wmax = 8;
  if (argc > 1) wmin = wmax = std::atoi(argv[1]);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
  std::printf("%-6s %-7s %10s %10s %8s %10s %8s %7s\n", "world", "size", "one_us", "two_us",
              "faster", "hbm_GB/s", "%copy", "algo");
  std::vector<std::string> summary;
  for (int w = wmin; w <= wmax; ++w) {
    Bench b(w, max_bytes);
    size_t switch_at = 0;  // largest size at which one-shot is still no slower
    double one_1k = 0;
    for (size_t s : sizes) {
      double one = b.time_us(s, CommAlgo::kOneShot, Op::kAllReduce, 0);
      double two = b.time_us(s, CommAlgo::kTwoShot, Op::kAllReduce, 0);
      if (s == 1024) one_1k = one;
      if (one <= two) switch_at = s;
      bool t = two < one;
      double best = t ? two : one;
      double gbs = hbm_bytes(w, static_cast<double>(s), t) / (best * 1e-6) / 1e9;
      std::printf("%-6d %-7s %10.2f %10.2f %8s %10.0f %7.1f%% %7s\n", w, size_name(s).c_str(), one,
                  two, t ? "two" : "one", gbs, 100.0 * gbs / copy_gbs,
                  s <= b.comms[0]->oneshot_max_bytes() ? "one" : "two");
    }
    char line[256];
    std::snprintf(line, sizeof(line),
                  "SUMMARY comm w=%d one-GPU: 1KB one-shot %.2f us; one-shot no slower up to %s "
                  "(default switch %s)",
                  w, one_1k, size_name(switch_at).c_str(),
                  size_name(b.comms[0]->oneshot_max_bytes()).c_str());
    summary.push_back(line);
  }
  // Fused residual + rmsnorm at decode shapes (world 4, hidden 4096 / 7168).
  std::printf("\n%-6s %-7s %-6s %12s %12s %14s\n", "world", "hidden", "rows", "allreduce_us",
              "fused_1k_us", "two_kernels_us");
  {
    Bench b(4, max_bytes);
    for (int64_t hidden : {4096, 7168})
      for (int64_t rows : {1, 16, 64}) {
        size_t bytes = static_cast<size_t>(hidden * rows * 2);
        double ar = b.time_us(bytes, CommAlgo::kOneShot, Op::kAllReduce, hidden);
        double fused = b.time_us(bytes, CommAlgo::kOneShot, Op::kFused, hidden);
        double two = b.time_us(bytes, CommAlgo::kTwoShot, Op::kFused, hidden);
        std::printf("%-6d %-7lld %-6lld %12.2f %12.2f %14.2f\n", 4, (long long)hidden,
                    (long long)rows, ar, fused, two);
        if (hidden == 7168 && rows == 16) {
          char line[256];
          std::snprintf(line, sizeof(line),
                        "SUMMARY comm fused w=4 7168x16: all-reduce %.2f us, fused one kernel "
                        "%.2f us, two-shot + norm kernel %.2f us",
                        ar, fused, two);
          summary.push_back(line);
        }
      }
  }
  std::printf("\nNCCL baseline on one GPU: world 1 only (NCCL takes one GPU per rank)\n");
  for (size_t s : {size_t{1024}, size_t{32} << 10, size_t{1} << 20}) {
    double us = nccl_world1_us(s);
    if (us < 0) {
      std::printf("  %-7s unavailable (no NCCL)\n", size_name(s).c_str());
      continue;
    }
    std::printf("  %-7s %8.2f us (ncclAllReduce world 1: a local copy)\n", size_name(s).c_str(),
                us);
    if (s == 1024) {
      char line[160];
      std::snprintf(line, sizeof(line), "SUMMARY comm NCCL world 1 (local copy) 1KB %.2f us", us);
      summary.push_back(line);
    }
  }
  for (auto& l : summary) std::printf("%s\n", l.c_str());
  return 0;
}
