// The align contract against the CUDA path (label gpu), plus what only the device has: bit-exact
// agreement with the CPU reference, a poisoned workspace, and capture + replay with new inputs.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "align_contract.h"
#include "gpu_test_util.h"

namespace molora::align_test {
namespace {

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define CKR(call)                                                          \
  do {                                                                     \
    cudaError_t e_ = (call);                                               \
    if (e_ != cudaSuccess) {                                               \
      r.status = Status::Internal(std::string(#call) + " failed in test"); \
      return r;                                                            \
    }                                                                      \
  } while (0)

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (count) cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void put(const std::vector<T>& h) {
    if (!h.empty()) cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  // Stream-ordered copy (the graph test: the replay runs on a non-blocking stream, which does not
  // wait for work on the legacy default stream).
  void put_async(const std::vector<T>& h, cudaStream_t s) {
    if (!h.empty()) cudaMemcpyAsync(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s);
  }
  void get(std::vector<T>* h) const {
    if (!h->empty()) cudaMemcpy(h->data(), p, h->size() * sizeof(T), cudaMemcpyDeviceToHost);
  }
};

}  // namespace

struct GpuBackend {
  static Status available() { return require_gpu(); }
  // Run with optional host-pointer substitutions (`host_arg`: which argument gets host memory).
  static AlignRun run(const AlignCase& c, const std::function<void(AlignArgs&)>& tweak) {
    AlignRun r = poisoned_outputs(c);
    AlignSizes sz = sizes_of(c);
    std::vector<int32_t> ids32 = ids_i32(c);
    DevBuf<int32_t> d_ids32(ids32.size());
    DevBuf<int64_t> d_ids64(c.ids.size());
    d_ids32.put(ids32);
    d_ids64.put(c.ids);
    DevBuf<int32_t> d_slots(c.slots.size()), d_sorted(r.sorted.size()), d_eids(r.expert_ids.size()),
        d_post(r.post_pad.size()), d_drop(r.dropped.size());
    d_slots.put(c.slots);
    d_sorted.put(r.sorted);
    d_eids.put(r.expert_ids);
    d_post.put(r.post_pad);
    d_drop.put(r.dropped);
    const size_t ws_words = sz.workspace_bytes / 4 + 4;
    DevBuf<int32_t> d_ws(ws_words);
    CKR(cudaMemset(d_ws.p, 0xA5, ws_words * 4));  // a poisoned workspace: no zeroing is needed
    AlignBuffers b;
    b.ids = c.dtype == DType::kI64 ? static_cast<const void*>(d_ids64.p)
                                   : static_cast<const void*>(d_ids32.p);
    b.slots = d_slots.p;
    b.sorted = d_sorted.p, b.expert_ids = d_eids.p, b.post_pad = d_post.p, b.dropped = d_drop.p;
    AlignArgs a = args_of(c, b);
    a.workspace = d_ws.p, a.workspace_bytes = sz.workspace_bytes;
    if (tweak) tweak(a);
    r.status = moe_align_block_size(a, nullptr);
    CKR(cudaDeviceSynchronize());
    d_sorted.get(&r.sorted);
    d_eids.get(&r.expert_ids);
    d_post.get(&r.post_pad);
    d_drop.get(&r.dropped);
    return r;
  }
  static void extra_rejections(const AlignCase& ok) {
    static int32_t host_word[64];
    using Tweak = std::function<void(AlignArgs&)>;
    expect_rejected(run(ok, Tweak([](AlignArgs& a) { a.topk_ids = host_word; })), "topk_ids");
    expect_rejected(run(ok, Tweak([](AlignArgs& a) { a.num_tokens_post_pad = host_word; })),
                    "num_tokens_post_pad");
    expect_rejected(run(ok, Tweak([](AlignArgs& a) { a.num_dropped = host_word; })), "num_dropped");
    expect_rejected(run(ok, Tweak([](AlignArgs& a) { a.workspace_bytes -= 4; })), "workspace");
    expect_rejected(run(ok, Tweak([](AlignArgs& a) { a.workspace = nullptr; })), "workspace");
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Gpu, AlignContract, GpuBackend);

TEST(AlignGpu, BitExactWithCpuReference) {
  MOLORA_SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  for (int64_t V : {256, 1024, 8192, 65536})
    for (int64_t T : {1, 16, 64, 256, 4096})
      for (int64_t B : {16, 64}) {
        AlignCase c = random_case(g, T, 8, V, B, (T + V) % 3 == 0);
        AlignRun gpu = GpuBackend::run(c, {}), cpu = CpuBackend::run(c, {});
        ASSERT_TRUE(gpu.status.ok() && cpu.status.ok());
        ASSERT_EQ(gpu.sorted, cpu.sorted) << "seed " << seed << " V=" << V << " T=" << T;
        ASSERT_EQ(gpu.expert_ids, cpu.expert_ids) << "seed " << seed;
        ASSERT_EQ(gpu.post_pad[0], cpu.post_pad[0]);
        ASSERT_EQ(gpu.dropped[0], cpu.dropped[0]);
        ASSERT_EQ(gpu.dropped[1], cpu.dropped[1]);
      }
}

// Capture one call into a CUDA graph, then replay it after overwriting the inputs: the replay
// must produce the new inputs' result, which proves nothing was read or decided on the host.
// New inputs and the output poison are written on the replay stream itself: that stream is
// non-blocking, so a cudaMemset / cudaMemcpy on the legacy default stream would not be ordered
// before the replay (the poison landed after the kernel's stores in an earlier version of this
// test). Both paths: 200 x 8 pairs (one launch) and 1000 x 8 (three launches).
static void capture_and_replay(int64_t T, int64_t k, int64_t V, int64_t B) {
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu T=%lld\n", static_cast<unsigned long long>(seed), (long long)T);
  std::mt19937_64 g(seed);
  AlignSizes sz;
  ASSERT_TRUE(moe_align_sizes(T, k, V, B, &sz).ok());
  DevBuf<int32_t> ids(T * k), slots(T), sorted(sz.sorted_token_ids), eids(sz.expert_ids), post(1),
      drop(2), ws(sz.workspace_bytes / 4);
  AlignArgs a;
  a.topk_ids = ids.p, a.num_tokens = T, a.topk = k, a.num_experts = V, a.block_size = B;
  a.slot_ids = slots.p, a.num_base_experts = 256;
  a.sorted_token_ids = sorted.p, a.sorted_token_ids_len = sz.sorted_token_ids;
  a.expert_ids = eids.p, a.expert_ids_len = sz.expert_ids;
  a.num_tokens_post_pad = post.p, a.num_dropped = drop.p;
  a.workspace = ws.p, a.workspace_bytes = sz.workspace_bytes;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  AlignCase c0 = random_case(g, T, k, V, B, true);
  std::vector<int32_t> hids0 = ids_i32(c0);
  ids.put_async(hids0, s);
  slots.put_async(c0.slots, s);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  Status st = moe_align_block_size(a, s);
  CK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    AlignCase c = random_case(g, T, k, V, B, true);
    c.E = 256;
    std::vector<int32_t> hids = ids_i32(c);
    ids.put_async(hids, s);
    slots.put_async(c.slots, s);
    CK(cudaMemsetAsync(sorted.p, 0x7f, sz.sorted_token_ids * 4, s));
    CK(cudaMemsetAsync(eids.p, 0x7f, sz.expert_ids * 4, s));
    CK(cudaMemsetAsync(post.p, 0x7f, 4, s));
    CK(cudaMemsetAsync(drop.p, 0x7f, 8, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    Expected e = oracle(c);
    std::vector<int32_t> hs(sz.sorted_token_ids), he(sz.expert_ids), hp(1), hd(2);
    sorted.get(&hs);
    eids.get(&he);
    post.get(&hp);
    drop.get(&hd);
    ASSERT_EQ(hp[0], e.post_pad) << "replay " << rep;
    ASSERT_EQ(hs, e.sorted) << "replay " << rep;
    ASSERT_EQ(he, e.expert_ids) << "replay " << rep;
    ASSERT_EQ(hd[0], e.dropped);
    ASSERT_EQ(hd[1], e.no_adapter);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
}

TEST(AlignGpu, GraphCaptureReplaysWithNewInputs) {
  MOLORA_SKIP_WITHOUT_GPU();
  capture_and_replay(200, 8, 8192, 16);
  if (::testing::Test::HasFatalFailure()) return;
  capture_and_replay(1000, 8, 8192, 64);
}

}  // namespace molora::align_test
