// comm, GPU half: world 2/4/8 as streams of one process on one device (peer table into the same
// device's memory), eager and graph-captured, exact against the CPU reference; a stopped rank
// times out within deadline + 10 %; a mismatched call order is reported; IPC across two
// processes on one GPU; world 1 through NCCL.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/kernels.h"
#include "gpu_test_util.h"
#include "molora/comm.h"

extern char** environ;
using namespace molora;

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define OK(x)                               \
  do {                                      \
    ::molora::Status s_ = (x);              \
    ASSERT_TRUE(s_.ok()) << s_.to_string(); \
  } while (0)

// Input value bits: a function of (seed, rank, i), the same on host and device. Exponents are
// kept in a narrow range so sums round (exercising round-once) without overflow.
__host__ __device__ uint16_t gen_bits(uint32_t seed, int rank, uint64_t i, bool bf16) {
  uint32_t h =
      seed * 0x9e3779b1u ^ (rank + 1) * 0x85ebca6bu ^ static_cast<uint32_t>(i) * 0xc2b2ae35u;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 13;
  uint32_t sign = (h >> 31) << 15;
  if (bf16) return static_cast<uint16_t>(sign | ((120u + (h >> 8) % 14u) << 7) | (h & 0x7fu));
  return static_cast<uint16_t>(sign | ((10u + (h >> 10) % 10u) << 10) | (h & 0x3ffu));
}

__global__ void fill_kernel(uint16_t* const* in, int world, uint64_t n, uint32_t seed, bool bf16) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    for (int r = 0; r < world; ++r) in[r][i] = gen_bits(seed, r, i, bf16);
}
__device__ float to_f(uint16_t b, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<uint32_t>(b) << 16) : __half2float(__ushort_as_half(b));
}
__device__ uint16_t from_f(float f, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
}
// Every rank's output must equal the rank-order fp32 sum rounded once.
__global__ void verify_kernel(uint16_t* const* out, int world, uint64_t n, uint32_t seed, bool bf16,
                              unsigned long long* errors) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) acc += to_f(gen_bits(seed, r, i, bf16), bf16);
    uint16_t ref = from_f(acc, bf16);
    for (int r = 0; r < world; ++r)
      if (out[r][i] != ref) atomicAdd(errors, 1ull);
  }
}

float bf16_host(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// True when compute-sanitizer has injected itself into this process (it serialises kernels of
// different streams, so ranks as streams cannot meet there).
bool under_sanitizer() {
  static int cached = -1;
  if (cached < 0) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    cached = 0;
    while (std::getline(maps, line))
      if (line.find("sanitizer") != std::string::npos ||
          line.find("TreeLauncherTargetInjection") != std::string::npos)
        cached = 1;
  }
  return cached == 1;
}
// Whether two kernels on two streams run at the same time here. Outside compute-sanitizer a
// "no" is a failure, never a skip: the multi-stream tests are the point of this suite.
bool concurrent_streams() {
  static int cached = -1;
  if (cached < 0) {
    bool ok = false;
    Status s = comm::probe_concurrent_streams(0, &ok);
    cached = s.ok() && ok ? 1 : 0;
    std::printf("concurrent-streams probe: %s (%s)%s\n", cached ? "concurrent" : "serialised",
                s.to_string().c_str(), under_sanitizer() ? ", under compute-sanitizer" : "");
  }
  return cached == 1;
}
bool under_tool() { return under_sanitizer(); }
// Skips (under compute-sanitizer) or fails (anywhere else) when ranks as streams cannot meet.
#define REQUIRE_CONCURRENT_STREAMS()                                                    \
  do {                                                                                  \
    if (under_sanitizer())                                                              \
      GTEST_SKIP() << "compute-sanitizer serialises kernels of different streams; "     \
                      "LocalGroupLaunchExact covers the kernels there";                 \
    ASSERT_TRUE(concurrent_streams()) << "kernels on two streams did not run together " \
                                         "outside compute-sanitizer";                   \
  } while (0)
int epochs_for(int n) {
  if (const char* e = std::getenv("MOLORA_TEST_COMM_EPOCHS")) return std::atoi(e);
  return under_tool() ? std::max(4, n / 500) : n;
}

// A local group and its per-rank buffers and streams.
struct Group {
  int world;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<cudaStream_t> streams;
  std::vector<uint16_t*> in, out;
  uint16_t** d_in = nullptr;
  uint16_t** d_out = nullptr;
  unsigned long long* d_err = nullptr;
  cudaEvent_t ev_main;
  std::vector<cudaEvent_t> ev_rank;
  cudaStream_t main;
  uint64_t cap;

  Group(int w, uint64_t cap_elems, long long timeout_ms = 2000) : world(w), cap(cap_elems) {
    // Load the test's own kernels before any rank spins (lazy loading may wait for the context
    // to go idle at a kernel's first launch; the library preloads its kernels likewise).
    cudaFuncAttributes fa;
    cudaFuncGetAttributes(&fa, fill_kernel);
    cudaFuncGetAttributes(&fa, verify_kernel);
    CommOptions o;
    o.max_bytes = cap_elems * 2;
    o.timeout_ms = timeout_ms;
    // A fixed switch point inside kSizes, so every world runs both paths whatever the measured
    // default (bench_comm) is.
    o.oneshot_max = 256 << 10;
    Status s = Communicator::create_local_group(w, 0, o, &comms);
    EXPECT_TRUE(s.ok()) << s.to_string();
    streams.resize(w);
    in.resize(w);
    out.resize(w);
    ev_rank.resize(w);
    for (int r = 0; r < w; ++r) {
      cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
      cudaMalloc(&in[r], cap_elems * 2);
      cudaMalloc(&out[r], cap_elems * 2);
      cudaMemset(out[r], 0xff, cap_elems * 2);
      cudaEventCreateWithFlags(&ev_rank[r], cudaEventDisableTiming);
    }
    cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ev_main, cudaEventDisableTiming);
    cudaMalloc(&d_in, w * sizeof(void*));
    cudaMalloc(&d_out, w * sizeof(void*));
    cudaMalloc(&d_err, sizeof(unsigned long long));
    cudaMemcpy(d_in, in.data(), w * sizeof(void*), cudaMemcpyHostToDevice);
    cudaMemcpy(d_out, out.data(), w * sizeof(void*), cudaMemcpyHostToDevice);
    cudaMemset(d_err, 0, sizeof(unsigned long long));
    cudaDeviceSynchronize();
  }
  ~Group() {
    cudaDeviceSynchronize();
    for (int r = 0; r < world; ++r) {
      cudaStreamDestroy(streams[r]);
      cudaFree(in[r]);
      cudaFree(out[r]);
      cudaEventDestroy(ev_rank[r]);
    }
    cudaStreamDestroy(main);
    cudaEventDestroy(ev_main);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_err);
    comms.clear();
  }
  // main -> every rank stream.
  void fork() {
    cudaEventRecord(ev_main, main);
    for (int r = 0; r < world; ++r) cudaStreamWaitEvent(streams[r], ev_main, 0);
  }
  void join() {
    for (int r = 0; r < world; ++r) {
      cudaEventRecord(ev_rank[r], streams[r]);
      cudaStreamWaitEvent(main, ev_rank[r], 0);
    }
  }
  Status all_reduce_all(uint64_t n, DType dt) {
    for (int r = 0; r < world; ++r)
      MOLORA_RETURN_IF_ERROR(comms[r]->all_reduce(in[r], out[r], n, dt, streams[r]));
    return Status::Ok();
  }
  void fill(uint64_t n, uint32_t seed, bool bf16) {
    fill_kernel<<<128, 256, 0, main>>>(d_in, world, n, seed, bf16);
  }
  void verify(uint64_t n, uint32_t seed, bool bf16) {
    verify_kernel<<<128, 256, 0, main>>>(d_out, world, n, seed, bf16, d_err);
  }
  unsigned long long errors() {
    unsigned long long e = 0;
    cudaStreamSynchronize(main);
    cudaMemcpy(&e, d_err, sizeof(e), cudaMemcpyDeviceToHost);
    return e;
  }
  // The CPU reference on rank inputs vs every rank's output, bit for bit.
  void cpu_check(uint64_t n, DType dt) {
    cudaDeviceSynchronize();
    std::vector<std::vector<uint16_t>> hin(world, std::vector<uint16_t>(n));
    std::vector<const void*> ptrs;
    for (int r = 0; r < world; ++r) {
      cudaMemcpy(hin[r].data(), in[r], n * 2, cudaMemcpyDeviceToHost);
      ptrs.push_back(hin[r].data());
    }
    std::vector<uint16_t> ref(n), got(n);
    ASSERT_TRUE(all_reduce_reference(ptrs.data(), world, ref.data(), n, dt).ok());
    for (int r = 0; r < world; ++r) {
      cudaMemcpy(got.data(), out[r], n * 2, cudaMemcpyDeviceToHost);
      ASSERT_EQ(got, ref) << "rank " << r << " n " << n;
    }
  }
  void check_all_ok() {
    for (auto& c : comms) {
      Status s = c->check();
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
  }
};

const uint64_t kSizes[] = {8, 520, 4096, 65536, 262152, 1u << 20};

class CommWorld : public ::testing::TestWithParam<int> {};

TEST_P(CommWorld, EagerExactManyEpochs) {
  MOLORA_SKIP_WITHOUT_GPU();
  REQUIRE_CONCURRENT_STREAMS();
  const int w = GetParam();
  Group g(w, 1u << 20);
  const int epochs = epochs_for(10000);
  uint32_t seed = std::random_device{}();
  std::printf("world %d, %d epochs, seed %u\n", w, epochs, seed);
  for (int e = 0; e < epochs; ++e) {
    uint64_t n = kSizes[e % 6];
    bool bf16 = (e / 6) % 2 == 0;
    DType dt = bf16 ? DType::kBF16 : DType::kF16;
    g.fill(n, seed + e, bf16);
    g.fork();
    ASSERT_TRUE(g.all_reduce_all(n, dt).ok());
    g.join();
    g.verify(n, seed + e, bf16);
    if (e % 997 == 0 || e == epochs - 1) g.cpu_check(n, dt);
  }
  EXPECT_EQ(g.errors(), 0u);
  g.check_all_ok();
  uint64_t ep = 0;
  OK(g.comms[0]->epoch(&ep));
  EXPECT_EQ(ep, static_cast<uint64_t>(epochs));
  CommStats st = g.comms[w - 1]->stats();
  EXPECT_EQ(st.p2p_calls, static_cast<uint64_t>(epochs));
  EXPECT_GT(st.oneshot_calls, 0u);
  EXPECT_GT(st.twoshot_calls, 0u);
}

TEST_P(CommWorld, GraphsOfTwoSizesReplayedInterleaved) {
  MOLORA_SKIP_WITHOUT_GPU();
  REQUIRE_CONCURRENT_STREAMS();
  const int w = GetParam();
  Group g(w, 1u << 20);
  const uint64_t na = 4096, nb = 1u << 19;  // one-shot and two-shot
  cudaGraphExec_t exec[2];
  for (int k = 0; k < 2; ++k) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(g.main, cudaStreamCaptureModeThreadLocal));
    g.fork();
    Status s = g.all_reduce_all(k == 0 ? na : nb, DType::kBF16);
    g.join();
    CK(cudaStreamEndCapture(g.main, &graph));
    ASSERT_TRUE(s.ok()) << s.to_string();
    CK(cudaGraphInstantiate(&exec[k], graph, 0));
    cudaGraphDestroy(graph);
  }
  const int replays = epochs_for(4000);
  uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  int count[2] = {0, 0};
  for (int i = 0; i < replays; ++i) {
    int k = rng() % 3 == 0 ? 1 : 0;  // A A B A B B ...: the same order on every rank
    uint64_t n = k == 0 ? na : nb;
    g.fill(n, seed + i, true);
    CK(cudaGraphLaunch(exec[k], g.main));
    g.verify(n, seed + i, true);
    count[k]++;
    // Eager calls between replays are part of the same sequence.
    if (i % 50 == 25) {
      g.fill(520, seed + i, false);
      g.fork();
      ASSERT_TRUE(g.all_reduce_all(520, DType::kF16).ok());
      g.join();
      g.verify(520, seed + i, false);
      count[0] += 0;
    }
    if (i == replays - 1) g.cpu_check(n, DType::kBF16);
  }
  EXPECT_EQ(g.errors(), 0u);
  g.check_all_ok();
  EXPECT_GT(count[0], 0);
  EXPECT_GT(count[1], 0);
  uint64_t ep = 0;
  OK(g.comms[0]->epoch(&ep));
  EXPECT_EQ(ep, static_cast<uint64_t>(replays + (replays + 24) / 50));
  for (int k = 0; k < 2; ++k) cudaGraphExecDestroy(exec[k]);
}

TEST_P(CommWorld, LocalGroupLaunchExact) {
  // One launch for all ranks (blockIdx.y = rank): the same kernel, runnable under
  // compute-sanitizer, which serialises kernels of different streams.
  MOLORA_SKIP_WITHOUT_GPU();
  const int w = GetParam();
  Group g(w, 1u << 20);
  std::vector<Communicator*> ranks;
  for (auto& c : g.comms) ranks.push_back(c.get());
  std::vector<const void*> in(g.in.begin(), g.in.end());
  std::vector<void*> out(g.out.begin(), g.out.end());
  const int epochs = under_tool() ? 12 : 600;
  uint32_t seed = std::random_device{}();
  for (int e = 0; e < epochs; ++e) {
    uint64_t n = kSizes[e % 6];
    bool bf16 = e % 2 == 0;
    g.fill(n, seed + e, bf16);
    OK(Communicator::all_reduce_local_group(ranks, in.data(), out.data(), n,
                                            bf16 ? DType::kBF16 : DType::kF16, g.main));
    g.verify(n, seed + e, bf16);
    if (e >= epochs - 2) g.cpu_check(n, bf16 ? DType::kBF16 : DType::kF16);
  }
  EXPECT_EQ(g.errors(), 0u);
  g.check_all_ok();
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommWorld, ::testing::Values(2, 4, 8));

TEST(CommFault, StoppedRankTimesOutWithinDeadline) {
  MOLORA_SKIP_WITHOUT_GPU();
  const long long deadline_ms = 200;
  Group g(2, 4096, deadline_ms);
  g.fill(4096, 1, true);
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  OK(g.comms[0]->all_reduce(g.in[0], g.out[0], 4096, DType::kBF16, g.streams[0]));
  CK(cudaStreamSynchronize(g.streams[0]));  // rank 1 never calls
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("stopped rank: kernel returned after %.1f ms (deadline %lld ms)\n", ms, deadline_ms);
  EXPECT_GE(ms, deadline_ms * 0.99);
  // Under compute-sanitizer the host sees the kernel's end late (instrumentation); the device
  // deadline still holds, and the timing bounds are checked in the plain run only.
  if (!under_tool()) EXPECT_LE(ms, deadline_ms * 1.10);
  Status s = g.comms[0]->check();
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_NE(s.message().find("epoch 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  // Later calls fall back (no NCCL in a one-device group: Unavailable), counted.
  Status s2 = g.comms[0]->all_reduce(g.in[0], g.out[0], 4096, DType::kBF16, g.streams[0]);
  EXPECT_EQ(s2.code(), StatusCode::kUnavailable) << s2.to_string();
  EXPECT_EQ(g.comms[0]->stats().fallback[(int)CommFallback::kTimeout], 1u);
  // The late rank learns of it at once (abort word) instead of waiting.
  t0 = std::chrono::steady_clock::now();
  Status s3 = g.comms[1]->all_reduce(g.in[1], g.out[1], 4096, DType::kBF16, g.streams[1]);
  EXPECT_TRUE(s3.ok()) << s3.to_string();
  CK(cudaStreamSynchronize(g.streams[1]));
  ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("late rank: returned after %.1f ms\n", ms);
  if (!under_tool()) EXPECT_LT(ms, 50.0);
  EXPECT_EQ(g.comms[1]->check().code(), StatusCode::kTimeout);
}

TEST(CommFault, MismatchedOrderReported) {
  MOLORA_SKIP_WITHOUT_GPU();
  REQUIRE_CONCURRENT_STREAMS();
  Group g(2, 1u << 16, 2000);
  g.fill(1u << 16, 3, true);
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  // rank 0: A then B; rank 1: B then A.
  OK(g.comms[0]->all_reduce(g.in[0], g.out[0], 1024, DType::kBF16, g.streams[0]));
  OK(g.comms[0]->all_reduce(g.in[0], g.out[0], 4096, DType::kBF16, g.streams[0]));
  OK(g.comms[1]->all_reduce(g.in[1], g.out[1], 4096, DType::kBF16, g.streams[1]));
  OK(g.comms[1]->all_reduce(g.in[1], g.out[1], 1024, DType::kBF16, g.streams[1]));
  CK(cudaDeviceSynchronize());
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000.0);
  for (int r = 0; r < 2; ++r) {
    Status s = g.comms[r]->check();
    EXPECT_EQ(s.code(), StatusCode::kMismatch) << s.to_string();
    EXPECT_NE(s.message().find("epoch 1"), std::string::npos) << s.message();
  }
}

TEST(CommFallbacks, CountedPerReason) {
  MOLORA_SKIP_WITHOUT_GPU();
  Group g(2, 4096);
  Communicator& c = *g.comms[0];
  EXPECT_EQ(c.all_reduce(g.in[0], g.out[0], 4, DType::kBF16, g.streams[0]).code(),
            StatusCode::kUnavailable);  // 8 bytes: alignment
  EXPECT_EQ(c.all_reduce(g.in[0], g.out[0], 8192, DType::kBF16, g.streams[0]).code(),
            StatusCode::kUnavailable);  // past max: size
  EXPECT_EQ(c.all_reduce(g.in[0], g.out[0], 64, DType::kF32, g.streams[0]).code(),
            StatusCode::kUnavailable);  // dtype
  EXPECT_EQ(c.fallback_all_reduce(g.in[0], g.out[0], 64, DType::kBF16, CommFallback::kNotContiguous,
                                  g.streams[0])
                .code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(c.all_reduce(g.in[0], g.out[0], -1, DType::kBF16, g.streams[0]).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.all_reduce(g.in[0], g.out[0], 0, DType::kBF16, g.streams[0]).ok());
  EXPECT_EQ(c.set_max_bytes(1u << 30).code(), StatusCode::kOutOfRange);
  CommStats st = c.stats();
  EXPECT_EQ(st.fallback[(int)CommFallback::kAlignment], 1u);
  EXPECT_EQ(st.fallback[(int)CommFallback::kSize], 1u);
  EXPECT_EQ(st.fallback[(int)CommFallback::kDtype], 1u);
  EXPECT_EQ(st.fallback[(int)CommFallback::kNotContiguous], 1u);
  EXPECT_EQ(st.unavailable, 4u);
  EXPECT_EQ(st.p2p_calls, 0u);
}

// The fused variant on every rank: residual bit-exact against the CPU reference, out the same
// bits on every rank and within one ulp of the reference (the row's sum of squares is a tree on
// the GPU), and the one-kernel path (one-shot) bit-identical to the two-kernel path (two-shot).
class CommFusedWorld : public ::testing::TestWithParam<int> {};

TEST_P(CommFusedWorld, ResidualRmsnormMatchesReference) {
  MOLORA_SKIP_WITHOUT_GPU();
  REQUIRE_CONCURRENT_STREAMS();
  const int w = GetParam();
  const int64_t hidden = 2048, max_rows = 9;
  Group g(w, hidden * max_rows);
  std::vector<uint16_t*> res(w);
  uint16_t* weight = nullptr;
  cudaMalloc(&weight, hidden * 2);
  for (int r = 0; r < w; ++r) cudaMalloc(&res[r], hidden * max_rows * 2);
  const uint32_t seed = std::random_device{}();
  std::printf("world %d seed %u\n", w, seed);
  const int epochs = under_tool() ? 4 : 60;
  for (int e = 0; e < epochs; ++e) {
    const int64_t rows = 1 + e % max_rows, n = hidden * rows;
    const bool two = e % 2 == 1;  // two-shot: the all-reduce, then the norm kernel
    for (auto& c : g.comms) c->set_algo(two ? CommAlgo::kTwoShot : CommAlgo::kOneShot);
    g.fill(n, seed + e, true);
    std::vector<uint16_t> hres(n), hw(hidden);
    for (int64_t i = 0; i < n; ++i) hres[i] = gen_bits(seed ^ 99, e, i, true);
    for (int64_t j = 0; j < hidden; ++j) hw[j] = gen_bits(seed ^ 77, e, j, true) & 0x7fff;
    cudaMemcpy(weight, hw.data(), hidden * 2, cudaMemcpyHostToDevice);
    for (int r = 0; r < w; ++r) cudaMemcpy(res[r], hres.data(), n * 2, cudaMemcpyHostToDevice);
    CK(cudaDeviceSynchronize());
    g.fork();
    for (int r = 0; r < w; ++r)
      OK(g.comms[r]->all_reduce_residual_rmsnorm(g.in[r], res[r], weight, g.out[r], n, hidden,
                                                 1e-6f, DType::kBF16, g.streams[r]));
    g.join();
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<uint16_t>> hin(w, std::vector<uint16_t>(n));
    std::vector<const void*> ptrs;
    for (int r = 0; r < w; ++r) {
      cudaMemcpy(hin[r].data(), g.in[r], n * 2, cudaMemcpyDeviceToHost);
      ptrs.push_back(hin[r].data());
    }
    std::vector<uint16_t> ref_out(n), got(n), got_res(n), out0;
    std::vector<uint16_t> ref_res = hres;
    OK(all_reduce_residual_rmsnorm_reference(ptrs.data(), w, ref_res.data(), hw.data(),
                                             ref_out.data(), n, hidden, 1e-6f, DType::kBF16));
    for (int r = 0; r < w; ++r) {
      cudaMemcpy(got.data(), g.out[r], n * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(got_res.data(), res[r], n * 2, cudaMemcpyDeviceToHost);
      ASSERT_EQ(got_res, ref_res) << "residual, rank " << r << " epoch " << e;
      if (r == 0) out0 = got;
      ASSERT_EQ(got, out0) << "ranks must agree bit for bit, epoch " << e;
      int64_t far = 0;
      for (int64_t i = 0; i < n; ++i) {
        float a = bf16_host(got[i]), b = bf16_host(ref_out[i]);
        if (std::fabs(a - b) > std::fabs(b) * (1.0f / 128) + 1e-30f) ++far;
      }
      ASSERT_EQ(far, 0) << "rank " << r << " epoch " << e;
    }
    // The other path on the same inputs must give the same bits (shared row function).
    if (e % 2 == 0) {
      for (auto& c : g.comms) c->set_algo(CommAlgo::kTwoShot);
      for (int r = 0; r < w; ++r) cudaMemcpy(res[r], hres.data(), n * 2, cudaMemcpyHostToDevice);
      CK(cudaDeviceSynchronize());
      g.fork();
      for (int r = 0; r < w; ++r)
        OK(g.comms[r]->all_reduce_residual_rmsnorm(g.in[r], res[r], weight, g.out[r], n, hidden,
                                                   1e-6f, DType::kBF16, g.streams[r]));
      g.join();
      CK(cudaDeviceSynchronize());
      cudaMemcpy(got.data(), g.out[0], n * 2, cudaMemcpyDeviceToHost);
      ASSERT_EQ(got, out0) << "one kernel (one-shot) vs two kernels (two-shot), epoch " << e;
    }
  }
  g.check_all_ok();
  CommStats st = g.comms[0]->stats();
  EXPECT_EQ(st.fused_calls, static_cast<uint64_t>((epochs + 1) / 2));
  EXPECT_EQ(st.p2p_calls, static_cast<uint64_t>(epochs + (epochs + 1) / 2));
  for (int r = 0; r < w; ++r) cudaFree(res[r]);
  cudaFree(weight);
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommFusedWorld, ::testing::Values(2, 4, 8));

// ---- IPC across two processes on the same GPU (file rendezvous) ------------------------------

CommExchange file_exchange(const std::string& dir, int rank, int world) {
  auto round = std::make_shared<int>(0);
  return [=](const std::vector<uint8_t>& mine, std::vector<uint8_t>* all) -> Status {
    int n = (*round)++;
    std::string me = dir + "/r" + std::to_string(n) + "_" + std::to_string(rank);
    {
      std::ofstream f(me + ".tmp", std::ios::binary);
      f.write(reinterpret_cast<const char*>(mine.data()), mine.size());
    }
    std::rename((me + ".tmp").c_str(), (me + ".bin").c_str());
    all->assign(mine.size() * world, 0);
    for (int k = 0; k < world; ++k) {
      std::string p = dir + "/r" + std::to_string(n) + "_" + std::to_string(k) + ".bin";
      auto t0 = std::chrono::steady_clock::now();
      while (access(p.c_str(), F_OK) != 0) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
          return Status::Timeout("file exchange: no " + p);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::ifstream f(p, std::ios::binary);
      f.read(reinterpret_cast<char*>(all->data() + k * mine.size()), mine.size());
      if (static_cast<size_t>(f.gcount()) != mine.size()) return Status::IoError("short " + p);
    }
    return Status::Ok();
  };
}

// Both ranks: 40 epochs of exact all-reduce through IPC-mapped buffers. Returns failures.
int ipc_rank_main(const std::string& dir, int rank) {
  const int world = 2;
  const uint64_t n = 8192;
  CommOptions o;
  o.max_bytes = n * 2;
  o.timeout_ms = 10000;  // two processes on one GPU time-slice
  o.create_nccl = false;
  std::unique_ptr<Communicator> c;
  Status s = Communicator::create(rank, world, 0, file_exchange(dir, rank, world), o, &c);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, s.to_string().c_str());
    return 1;
  }
  if (!c->p2p_enabled()) {
    std::fprintf(stderr, "rank %d: P2P disabled: %s\n", rank, c->p2p_disabled_reason().c_str());
    return 1;
  }
  uint16_t *in = nullptr, *out = nullptr;
  cudaMalloc(&in, n * 2);
  cudaMalloc(&out, n * 2);
  std::vector<uint16_t> hin(n), hpeer(n), ref(n), got(n);
  int bad = 0;
  for (int e = 0; e < 40 && !bad; ++e) {
    uint64_t m = e % 2 ? n : 1024;
    for (uint64_t i = 0; i < m; ++i) {
      hin[i] = gen_bits(e, rank, i, true);
      hpeer[i] = gen_bits(e, 1 - rank, i, true);
    }
    cudaMemcpy(in, hin.data(), m * 2, cudaMemcpyHostToDevice);
    s = c->all_reduce(in, out, m, DType::kBF16, nullptr);
    cudaDeviceSynchronize();
    if (s.ok()) s = c->check();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d epoch %d: %s\n", rank, e, s.to_string().c_str());
      bad = 1;
      break;
    }
    const void* ptrs[2] = {rank == 0 ? hin.data() : hpeer.data(),
                           rank == 0 ? hpeer.data() : hin.data()};
    all_reduce_reference(ptrs, 2, ref.data(), m, DType::kBF16);
    cudaMemcpy(got.data(), out, m * 2, cudaMemcpyDeviceToHost);
    for (uint64_t i = 0; i < m; ++i) bad |= got[i] != ref[i];
  }
  cudaFree(in);
  cudaFree(out);
  std::printf("rank %d: %s\n", rank, bad ? "FAILED" : "40 epochs exact");
  return bad;
}

TEST(CommIpc, TwoProcessesOneGpu) {
  MOLORA_SKIP_WITHOUT_GPU();
  char tmpl[] = "/tmp/molora_comm_ipc_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::string filter = "--gtest_filter=CommIpc.ChildRank";
  std::string env_dir = "MOLORA_COMM_IPC_DIR=" + dir;
  std::vector<char*> argv = {const_cast<char*>("/proc/self/exe"), filter.data(), nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(env_dir.data());
  envp.push_back(nullptr);
  char exe[4096] = {0};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof(exe) - 1), 0);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), envp.data()), 0);
  int bad = ipc_rank_main(dir, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  std::string cmd = "rm -rf " + dir;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(CommIpc, ChildRank) {
  const char* dir = std::getenv("MOLORA_COMM_IPC_DIR");
  if (!dir) GTEST_SKIP() << "the child half of CommIpc.TwoProcessesOneGpu (spawned by it)";
  MOLORA_SKIP_WITHOUT_GPU();
  EXPECT_EQ(ipc_rank_main(dir, 1), 0);
}

TEST(CommNccl, WorldOneFallsBackToNccl) {
  MOLORA_SKIP_WITHOUT_GPU();
  // Under memcheck, ncclCommInitRank's own cudaFuncGetAttributes probes of NCCL kernels that
  // have no image for this GPU are reported as API errors (209) inside libnccl: NCCL's code,
  // handled there, not molora's. The plain run covers this test.
  if (under_sanitizer()) GTEST_SKIP() << "NCCL's internal API errors under compute-sanitizer";
  CommExchange self = [](const std::vector<uint8_t>& mine, std::vector<uint8_t>* all) {
    *all = mine;
    return Status::Ok();
  };
  std::unique_ptr<Communicator> c;
  OK(Communicator::create(0, 1, 0, self, CommOptions{}, &c));
  EXPECT_FALSE(c->p2p_enabled());
  const uint64_t n = 4096;
  uint16_t *in = nullptr, *out = nullptr;
  cudaMalloc(&in, n * 2);
  cudaMalloc(&out, n * 2);
  std::vector<uint16_t> h(n), got(n);
  for (uint64_t i = 0; i < n; ++i) h[i] = gen_bits(5, 0, i, true);
  cudaMemcpy(in, h.data(), n * 2, cudaMemcpyHostToDevice);
  Status s = c->all_reduce(in, out, n, DType::kBF16, nullptr);
  cudaDeviceSynchronize();
  CommStats st = c->stats();
  EXPECT_EQ(st.fallback[(int)CommFallback::kWorldSize], 1u);
#if MOLORA_HAVE_NCCL
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(st.nccl_calls, 1u);
  cudaMemcpy(got.data(), out, n * 2, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, h);
#else
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
#endif
  cudaFree(in);
  cudaFree(out);
}

}  // namespace
