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
  void get(std::vector<T>* h) const {
    if (!h->empty()) cudaMemcpy(h->data(), p, h->size() * sizeof(T), cudaMemcpyDeviceToHost);
  }
};

}  // namespace

struct GpuBackend {
  static Status available() { return require_gpu(); }
  // Run with optional host-pointer substitutions (`host_arg`: which argument gets host memory).
  static AlignRun run(const AlignCase& c, const std::function<void(AlignArgs&)>& tweak) {
    AlignSizes sz = sizes_of(c);
    AlignRun r;
    r.sorted_len = sz.sorted_token_ids;
    r.expert_len = sz.expert_ids;
    r.sorted.assign(sz.sorted_token_ids + kGuard, kPoison);
    r.expert_ids.assign(sz.expert_ids + kGuard, kPoison);
    r.post_pad.assign(1 + kGuard, kPoison);
    r.dropped.assign(2 + kGuard, kPoison);
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
    AlignArgs a;
    a.topk_ids = c.dtype == DType::kI64 ? static_cast<const void*>(d_ids64.p)
                                        : static_cast<const void*>(d_ids32.p);
    a.topk_dtype = c.dtype;
    a.num_tokens = c.T, a.topk = c.k, a.num_experts = c.V, a.block_size = c.B;
    if (c.has_slots) a.slot_ids = d_slots.p, a.num_base_experts = c.E;
    a.sorted_token_ids = d_sorted.p, a.sorted_token_ids_len = sz.sorted_token_ids;
    a.expert_ids = d_eids.p, a.expert_ids_len = sz.expert_ids;
    a.num_tokens_post_pad = d_post.p;
    a.num_dropped = d_drop.p;
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

// Runs the CPU reference on the same case (host buffers).
static void run_cpu(const AlignCase& c, AlignRun* out) {
  AlignSizes sz = sizes_of(c);
  out->sorted.assign(sz.sorted_token_ids, kPoison);
  out->expert_ids.assign(sz.expert_ids, kPoison);
  out->post_pad.assign(1, kPoison);
  out->dropped.assign(2, kPoison);
  std::vector<int32_t> ids32 = ids_i32(c);
  AlignArgs a;
  a.topk_ids = c.dtype == DType::kI64 ? static_cast<const void*>(c.ids.data())
                                      : static_cast<const void*>(ids32.data());
  a.topk_dtype = c.dtype;
  a.num_tokens = c.T, a.topk = c.k, a.num_experts = c.V, a.block_size = c.B;
  if (c.has_slots) a.slot_ids = c.slots.data(), a.num_base_experts = c.E;
  a.sorted_token_ids = out->sorted.data(), a.sorted_token_ids_len = sz.sorted_token_ids;
  a.expert_ids = out->expert_ids.data(), a.expert_ids_len = sz.expert_ids;
  a.num_tokens_post_pad = out->post_pad.data();
  a.num_dropped = out->dropped.data();
  out->status = moe_align_block_size_cpu(a);
}

TEST(AlignGpu, BitExactWithCpuReference) {
  MOLORA_SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  for (int64_t V : {256, 1024, 8192, 65536})
    for (int64_t T : {1, 16, 64, 256, 4096})
      for (int64_t B : {16, 64}) {
        AlignCase c = random_case(g, T, 8, V, B, (T + V) % 3 == 0);
        AlignRun cpu, gpu = GpuBackend::run(c, {});
        run_cpu(c, &cpu);
        ASSERT_TRUE(gpu.status.ok() && cpu.status.ok());
        gpu.sorted.resize(cpu.sorted.size());
        gpu.expert_ids.resize(cpu.expert_ids.size());
        ASSERT_EQ(gpu.sorted, cpu.sorted) << "seed " << seed << " V=" << V << " T=" << T;
        ASSERT_EQ(gpu.expert_ids, cpu.expert_ids) << "seed " << seed;
        ASSERT_EQ(gpu.post_pad[0], cpu.post_pad[0]);
        ASSERT_EQ(gpu.dropped[0], cpu.dropped[0]);
        ASSERT_EQ(gpu.dropped[1], cpu.dropped[1]);
      }
}

// Capture one call into a CUDA graph, then replay it after overwriting the inputs: the replay
// must produce the new inputs' result, which proves nothing was read or decided on the host.
TEST(AlignGpu, GraphCaptureReplaysWithNewInputs) {
  MOLORA_SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  const int64_t T = 200, k = 8, V = 8192, B = 16;
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
  ids.put(ids_i32(c0));
  slots.put(c0.slots);
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
    ids.put(ids_i32(c));
    slots.put(c.slots);
    CK(cudaMemset(sorted.p, 0x7f, sz.sorted_token_ids * 4));
    CK(cudaMemset(eids.p, 0x7f, sz.expert_ids * 4));
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

}  // namespace molora::align_test
