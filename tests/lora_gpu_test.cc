// lora GPU suite: every kernel variant against the fp64 CPU reference (outputs poisoned, seeds
// printed), untouched pairs bit-identical, determinism, CUDA-graph capture, empty routing and
// argument errors.
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>

#include "gpu_test_util.h"
#include "lora_gpu_writer.h"
#include "lora_test_util.h"
#include "molora/settings.h"

using namespace lora_test;

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

template <typename V>
struct Dev {
  V* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(const std::vector<V>& h) : n(h.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(V)) != cudaSuccess)
      p = nullptr;
    set(h);
  }
  Dev(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<V> get() const {
    std::vector<V> h(n);
    if (n) cudaMemcpy(h.data(), p, n * sizeof(V), cudaMemcpyDeviceToHost);
    return h;
  }
  // cudaMemcpy from pageable memory may return before its last DMA has landed ("API
  // synchronization behavior" in the CUDA runtime docs), and the tests launch on non-blocking
  // streams, which do not wait for the legacy stream: without the device sync a launch right
  // after set() can read part of the old contents (a moe_delta graph replay after a reset of y,
  // under load: tools/probe/delta-race.sh failed 20 of 96 runs without the sync, 0 with it).
  void set(const std::vector<V>& h) {
    if (n) cudaMemcpy(p, h.data(), n * sizeof(V), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
};

struct DevData {
  Dev<uint16_t> w, in, out;
  Dev<int32_t> topk, slot, ranks, sorted, expert_ids, ntpp;
  Dev<float> scales;
  explicit DevData(const Data& d)
      : w(d.w),
        in(d.in),
        out(d.out),
        topk(d.topk),
        slot(d.slot),
        ranks(d.ranks),
        sorted(d.sorted),
        expert_ids(d.expert_ids),
        ntpp(d.ntpp),
        scales(d.scales) {}
  Routing routing() const {
    Routing r;
    r.topk_ids = topk.p;
    r.slot_ids = slot.p;
    r.sorted_token_ids = sorted.p;
    r.expert_ids = expert_ids.p;
    r.num_tokens_post_pad = ntpp.p;
    return r;
  }
};

Status run_gpu(const Data& d, DevData& g, const Plan* pl, cudaStream_t s) {
  return d.pb.op == Op::kShrink
             ? shrink(d.pb, pl, g.in.p, g.w.p, g.ranks.p, g.routing(), g.out.p, s)
             : expand(d.pb, pl, g.in.p, g.w.p, g.ranks.p, g.scales.p, g.routing(), g.out.p, s);
}

std::vector<uint16_t> run_cpu(const Data& d) {
  std::vector<uint16_t> out = d.out;
  Routing rt = d.host_routing();
  Status st = d.pb.op == Op::kShrink
                  ? shrink_cpu(d.pb, d.in.data(), d.w.data(), d.ranks.data(), rt, out.data())
                  : expand_cpu(d.pb, d.in.data(), d.w.data(), d.ranks.data(), d.scales.data(), rt,
                               out.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// Runs plan pl on the GPU from d's output (poisoned for shrink, the base for expand) and checks
// it against the reference: within tolerance, rows without a pair untouched, no NaN/Inf; then a
// second run from the same inputs must give the same bits. (Callers wrap it in
// ASSERT_NO_FATAL_FAILURE: a failed launch ends the caller.)
void check_plan_runs(const Data& d, DevData& g, const Plan& pl, const std::vector<uint16_t>& ref) {
  g.out.set(d.out);
  const Status st = run_gpu(d, g, &pl, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = g.out.get();
  const Err e = compare(d, got, ref, d.out);
  EXPECT_LE(e.rel, tolerance(d.pb.dtype)) << pl.to_string();
  EXPECT_EQ(e.untouched_changed, 0) << pl.to_string();
  EXPECT_EQ(e.nonfinite, 0) << pl.to_string();
  // Determinism: a second run from the same inputs gives the same bits.
  g.out.set(d.out);
  ASSERT_TRUE(run_gpu(d, g, &pl, nullptr).ok());
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(g.out.get(), got) << "second run differs";
}

// Whether the stream kernel takes c's routing: aligned with blocks of <= 32 pairs, or plain up to
// 2048 pairs and 65,536 virtual experts (each CTA groups the pairs itself).
bool stream_takes(const Case& c) {
  if (c.routing == RoutingKind::kAligned) return c.block <= 32;
  return int64_t(c.T) * c.k <= 2048 && int64_t(c.S) * c.E <= 65536;
}

// Runs one case on the GPU and checks it: the default plan, the grid kernel, the stream kernel
// where it applies (stream_takes; expand also at tiles of 32 and 96 rows), and the grid kernel
// at each forced tile given.
void check_case(const Case& c, std::mt19937_64& rng, std::vector<int> tiles = {0}) {
  SCOPED_TRACE(c.name());
  Data d = make_data(c, rng);
  std::vector<uint16_t> ref = run_cpu(d);
  DevData g(d);
  std::vector<std::pair<std::string, int>> runs = {{"", 0}, {"grid", 0}};
  const bool stream_ok = stream_takes(c);
  if (stream_ok) runs.push_back({"stream", 0});
  for (int tile : tiles)
    if (tile > 0) runs.push_back({"grid", tile});
  // Stream expand at tiles below its stage's rows (a task ends inside a group of 8-row tiles).
  const int stream_rows = molora::lora::detail::stream_expand_tile(c.r_max);
  if (stream_ok && c.op == Op::kExpand)
    for (int tile : {32, 96})
      if (tile < stream_rows) runs.push_back({"stream", tile});
  for (auto& [kernel, tile] : runs) {
    SCOPED_TRACE("kernel '" + kernel + "' tile " + std::to_string(tile));
    Plan pl;
    PlanOptions o;
    o.force_tile = tile;
    o.kernel = kernel;
    ASSERT_TRUE(plan(d.pb, &pl, o).ok());
    if (!kernel.empty()) {
      EXPECT_EQ(pl.kernel, kernel);
    }
    if (!stream_ok) {
      EXPECT_EQ(pl.kernel, "grid");
    }
    if (pl.kernel == "stream") {
      EXPECT_EQ(
          pl.variant.find(c.routing == RoutingKind::kPlain ? ".plain-stream." : ".aligned-stream."),
          pl.variant.find('.'))
          << pl.variant;
    }
    ASSERT_NO_FATAL_FAILURE(check_plan_runs(d, g, pl, ref));
  }
}

// Captures fn() (launches on st; returns the Status of its calls) into a graph once, then `reps`
// times: before() (host-side resets), one replay, a sync, check(rep). (Callers wrap it in
// ASSERT_NO_FATAL_FAILURE: a failed capture ends the caller.)
template <typename Fn, typename Before, typename Check>
void replay_graph(cudaStream_t st, int reps, Fn&& fn, Before&& before, Check&& check) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  const Status s = fn();
  CK(cudaStreamEndCapture(st, &graph));
  ASSERT_TRUE(s.ok()) << s.to_string();
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < reps; ++rep) {
    before();
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    check(rep);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace

TEST(LoraGpu, MatchesReferenceAcrossShapes) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned}) {
        Case c;
        c.op = op, c.dt = dt, c.routing = rk;
        c.T = 5, c.k = 4, c.S = 4, c.E = 16, c.r_max = 32, c.dim = 520, c.block = 8;
        std::vector<int> tiles =
            op == Op::kShrink ? std::vector<int>{0, 1, 2, 8, 32} : std::vector<int>{0, 8, 64, 1024};
        check_case(c, rng, tiles);
        c.T = 1, c.k = 1, c.r_max = 8, c.dim = 8, c.block = 1;  // T=1, smallest shape
        check_case(c, rng);
        c.T = 33, c.k = 8, c.S = 3, c.E = 24, c.r_max = 128, c.dim = 2056, c.block = 16;
        check_case(c, rng);
        c.T = 40, c.k = 2, c.S = 2, c.E = 3, c.r_max = 64, c.dim = 136, c.block = 64;  // big groups
        c.slots = SlotMode::kOne;
        check_case(c, rng, op == Op::kShrink ? std::vector<int>{0, 4} : std::vector<int>{0, 16});
        c.slots = SlotMode::kDistinct, c.mixed_ranks = false;
        check_case(c, rng);
        c.slots = SlotMode::kHalfNone, c.mixed_ranks = true;
        check_case(c, rng);
      }
}

TEST(LoraGpu, SeedLikeShapes) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned}) {
      Case c;
      c.op = op, c.routing = rk, c.T = 64, c.k = 8, c.S = 8, c.E = 160, c.r_max = 32;
      c.dim = op == Op::kShrink ? 2048 : 1536, c.block = 16;
      check_case(c, rng);
    }
}

// The stream kernel's edges (aligned routing): full 32-pair blocks (past 8, 16 and 24 members
// of one tensor-core batch), more slots than its shared-memory rank cache, K and N that end in
// a partial K-chunk / box / tile (shrink: a box partly past K arrives zero-filled), K < 256
// (shrink copies row by row: no tensor map), the largest dim, r_max 8 and 128, mixed ranks
// (per-row copies, masked tails), K a multiple of 64 but not of the shrink's 512-column piece
// (swizzled stages with bounds tests) and the block sizes on both sides of the stream/grid
// switch. (ctest also runs this test and MatchesReferenceAcrossShapes with probe bit 16: every
// shrink piece copied without a tensor map, tests/lora.cmake.)
TEST(LoraGpu, StreamKernelEdges) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (DType dt : {DType::kBF16, DType::kF16}) {
      Case c;
      c.op = op, c.dt = dt, c.routing = RoutingKind::kAligned;
      c.T = 40, c.k = 2, c.S = 1, c.E = 2, c.r_max = 32, c.dim = 1032, c.block = 32;
      c.slots = SlotMode::kOne;
      check_case(c, rng);  // blocks of 32 pairs of one expert
      c.slots = SlotMode::kZipf;
      c.T = 24, c.k = 4, c.S = 70, c.E = 4, c.r_max = 128, c.dim = 3080, c.block = 16;
      check_case(c, rng);  // S > 64: ranks and scales read from global memory
      c.T = 3, c.k = 2, c.S = 2, c.E = 4, c.r_max = 16, c.dim = 16384, c.block = 4;
      check_case(c, rng);  // the largest dim
      c.T = 17, c.k = 8, c.S = 5, c.E = 12, c.r_max = 8, c.dim = 520, c.block = 2;
      check_case(c, rng);  // r_max 8
      c.T = 40, c.k = 8, c.S = 8, c.E = 16, c.r_max = 32, c.dim = 1536, c.block = 32;
      check_case(c, rng);  // K a multiple of the shrink's piece (its swizzled stages), 4 batches
      c.block = 33;        // just past the stream kernel's block limit: the grid kernel
      check_case(c, rng);
      // K a multiple of the shrink's 64-column chunk but not of its piece: swizzled stages with
      // bounds tests and a box of the last piece's chunks (the tail map): 4 of them (768), 1
      // (1088), and one piece of 5 (320); both routings (the plain kernel is another
      // instantiation).
      for (RoutingKind rk : {RoutingKind::kAligned, RoutingKind::kPlain}) {
        c.routing = rk;
        c.T = 40, c.k = 8, c.S = 8, c.E = 16, c.r_max = 32, c.dim = 768, c.block = 32;
        check_case(c, rng);
        c.T = 12, c.k = 4, c.S = 4, c.E = 8, c.r_max = 16, c.dim = 1088, c.block = 16;
        check_case(c, rng);
        c.T = 9, c.k = 4, c.S = 3, c.E = 6, c.r_max = 16, c.dim = 320, c.block = 8;
        check_case(c, rng);
      }
    }
}

// The stream kernels with the fewest warps (MOLORA_LORA_STREAM_CONSUMERS=1: shrink 32 threads,
// expand 64): more slots than threads in a shrink CTA, so the shared-memory rank cache is
// filled past the one slot per thread loaded up front (SlotCache), and exactly one slot per
// thread in an expand CTA; and plain routing's grouping with one or two warps.
TEST(LoraGpu, StreamKernelFewestWarps) {
  MOLORA_SKIP_WITHOUT_GPU();
  const SettingsReset reset{"MOLORA_LORA_STREAM_CONSUMERS"};
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", "1");
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (int S : {40, 64}) {
      Case c;
      c.op = op, c.routing = RoutingKind::kAligned, c.slots = SlotMode::kDistinct;
      c.T = 48, c.k = 2, c.S = S, c.E = 4, c.r_max = 32, c.dim = 1032, c.block = 8;
      check_case(c, rng);
      // Plain routing: 96 and 40 pairs, the grouping's tables (shrink: one warp, its scratch past
      // the stages, which are smaller than it: 1 x 2 stages of 8 KiB; expand: two warps) and,
      // expand, the 256-key warp sort at 40 pairs; 16 pairs, the 32-key warp sort.
      c.routing = RoutingKind::kPlain;
      check_case(c, rng);
      for (int T : {8, 20}) {
        c.T = T;
        check_case(c, rng);
      }
    }
}

// An eager engine alternates layers: each call of an op sees other weights. The stream kernels'
// tensor maps (a copy of the weight pointer and shape, made on the host) come from a cache of
// many keys, so each layer must still read its own weights: layers of the same shape and routing
// but different weights, called in turn twice over, each against its own CPU reference. After
// the first pass every call is a cache hit (no map is encoded again).
TEST(LoraGpu, AlternatingLayersReadTheirOwnWeights) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int kLayers = 3;
  for (Op op : {Op::kShrink, Op::kExpand}) {
    Case c;
    c.op = op, c.routing = RoutingKind::kAligned, c.block = 16;
    c.T = 12, c.k = 4, c.S = 4, c.E = 8, c.r_max = 32, c.dim = 1032;  // shrink map: K >= 256
    SCOPED_TRACE(c.name());
    std::vector<Data> d;
    d.push_back(make_data(c, rng));
    d[0].ranks = {8, 16, 32, 24};  // expand: tensor copies at r8 8 and 16, per-lane at 24
    for (int l = 1; l < kLayers; ++l) {
      d.push_back(make_data(c, rng));
      share_routing(d[l], d[0]);
      d[l].scales = d[0].scales;
    }
    std::vector<std::vector<uint16_t>> ref;
    std::vector<std::unique_ptr<DevData>> g;
    for (int l = 0; l < kLayers; ++l) {
      ref.push_back(run_cpu(d[l]));
      g.push_back(std::make_unique<DevData>(d[l]));
      for (int j = 0; j < l; ++j) ASSERT_NE(d[l].w, d[j].w);
    }
    Plan pl;
    PlanOptions o;
    o.kernel = "stream";
    ASSERT_TRUE(plan(d[0].pb, &pl, o).ok());
    uint64_t hits0 = 0, misses0 = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const auto st0 = molora::lora::detail::tensor_map_cache_stats();
      for (int l = 0; l < kLayers; ++l) {
        SCOPED_TRACE("pass " + std::to_string(pass) + " layer " + std::to_string(l));
        g[l]->out.set(d[l].out);
        ASSERT_TRUE(run_gpu(d[l], *g[l], &pl, nullptr).ok());
        CK(cudaDeviceSynchronize());
        const Err e = compare(d[l], g[l]->out.get(), ref[l], d[l].out);
        EXPECT_LE(e.rel, tolerance(c.dt));
        EXPECT_EQ(e.untouched_changed, 0);
        EXPECT_EQ(e.nonfinite, 0);
      }
      const auto st1 = molora::lora::detail::tensor_map_cache_stats();
      if (pass == 0) {  // up to one new key per layer (an address may repeat an earlier test's)
        EXPECT_LE(st1.misses - st0.misses, uint64_t(kLayers));
        hits0 = st1.hits, misses0 = st1.misses;
      } else {  // every lookup a hit
        EXPECT_EQ(st1.misses, misses0);
        EXPECT_EQ(st1.hits - hits0, uint64_t(kLayers));
      }
    }
  }
}

TEST(LoraGpu, PrefillUngroupedPath) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand}) {
    Case c;  // P = 2560 > group cap: one group per pair
    c.op = op, c.T = 320, c.k = 8, c.S = 2, c.E = 16, c.r_max = 16, c.dim = 64;
    check_case(c, rng);
    c.S = 80, c.T = 8, c.E = 64;  // V = 80 * 64 = 5120 > 4096: ungrouped at decode size too
    check_case(c, rng);
  }
}

// The largest call the issue names, T * k = 65,536 pairs (prefill), on every kernel and both
// routings, bf16 and fp16, against the reference; one pair more is refused on the device path
// too (OutOfRange, naming num_tokens, nothing written).
TEST(LoraGpu, LargestPairCount) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned})
      for (DType dt : {DType::kBF16, DType::kF16}) {
        Case c;
        c.op = op, c.routing = rk, c.dt = dt, c.T = 8192, c.k = 8, c.S = 4, c.E = 16;
        c.r_max = 16, c.dim = 64, c.block = 16;
        ASSERT_NO_FATAL_FAILURE(check_case(c, rng));
        if (op != Op::kShrink || dt != DType::kBF16) continue;
        SCOPED_TRACE(c.name() + " + 1 pair");
        Data d = make_data(c, rng);
        DevData g(d);
        d.pb.num_tokens = 65537, d.pb.top_k = 1;  // the buffers stay those of 65,536 pairs
        const Status st = run_gpu(d, g, nullptr, nullptr);
        EXPECT_EQ(st.code(), molora::StatusCode::kOutOfRange) << st.to_string();
        EXPECT_NE(st.message().find("num_tokens"), std::string::npos) << st.message();
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(g.out.get(), d.out) << "a refused call wrote its output";
      }
}

// Plain routing on the grid kernel with many items per CTA: every slot -1, half the tokens
// without adapter, one in 64 with one (and the last: a CTA's look at the items ahead finds
// none, looks again, then jumps far), or most with one, from T=1 to P = 2400 pairs, on the
// default grid and on a 1-SM plan (a few CTAs, each walking thousands of items). The same on
// the stream kernel up to its 2048 plain pairs (1 SM: one CTA groups and runs every task).
TEST(LoraGpu, PlainRoutingBatches) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  struct TK {
    int T, k;
  };
  for (Op op : {Op::kShrink, Op::kExpand})
    for (TK tk : {TK{1, 8}, TK{128, 8}, TK{205, 5}, TK{300, 8}})
      for (SlotMode sm :
           {SlotMode::kHalfNone, SlotMode::kAllNone, SlotMode::kZipf, SlotMode::kSparse})
        for (int sms : {0, 1}) {
          Case c;
          c.op = op, c.routing = RoutingKind::kPlain, c.slots = sm, c.T = tk.T, c.k = tk.k;
          c.S = 6, c.E = 40, c.r_max = 32, c.dim = 264;
          SCOPED_TRACE(c.name() + " sm_count " + std::to_string(sms) +
                       (sm == SlotMode::kHalfNone  ? " half none"
                        : sm == SlotMode::kAllNone ? " all none"
                        : sm == SlotMode::kSparse  ? " sparse"
                                                   : " zipf"));
          Data d = make_data(c, rng);
          const std::vector<uint16_t> ref = run_cpu(d);
          DevData g(d);
          for (const char* kernel : {"grid", "stream"}) {
            if (std::string(kernel) == "stream" && !stream_takes(c)) continue;
            SCOPED_TRACE(kernel);
            Plan pl;
            PlanOptions o;
            o.kernel = kernel;
            o.sm_count = sms;
            ASSERT_TRUE(plan(d.pb, &pl, o).ok());
            // (1 SM: a few CTAs, so each walks P x chunks / grid items; stream: one CTA)
            if (sms == 1) {
              EXPECT_LE(pl.grid, 4) << pl.to_string();
            }
            ASSERT_NO_FATAL_FAILURE(check_plan_runs(d, g, pl, ref));
          }
        }
}

// The stream shrink with many tasks per CTA: on 1 and 3 SMs every warp seeks far into its CTA's
// tasks (TaskIter::skip, across rounds of 32 and past tasks without rows at their slot's rank),
// and on the default grid; K a multiple of the 512-column piece and not; mixed ranks.
TEST(LoraGpu, StreamShrinkManyTasksPerCta) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (int64_t dim : {1024, 1032})
    for (int T : {1, 40, 300})
      for (int sms : {0, 1, 3}) {
        Case c;
        c.op = Op::kShrink, c.routing = RoutingKind::kAligned, c.block = 16;
        c.T = T, c.k = 8, c.S = 6, c.E = 40, c.r_max = 32, c.dim = dim;
        SCOPED_TRACE(c.name() + " sm_count " + std::to_string(sms));
        Data d = make_data(c, rng);
        const std::vector<uint16_t> ref = run_cpu(d);
        DevData g(d);
        Plan pl;
        PlanOptions o;
        o.kernel = "stream";
        o.sm_count = sms;
        ASSERT_TRUE(plan(d.pb, &pl, o).ok());
        if (sms > 0) {
          EXPECT_LE(pl.grid, sms) << pl.to_string();
        }
        ASSERT_NO_FATAL_FAILURE(check_plan_runs(d, g, pl, ref));
      }
}

// Nothing to do: every slot -1 (no task at all: each CTA leaves after reading the routing's
// length, or with plain routing after the grouping's first barrier), or every slot at rank 0
// (tasks, none valid). On every kernel, at T = 1 (fewer tasks than CTAs), 6, 16 and 64 (the
// plain grouping's ways at top-8: the 32-key warp sort, the 256-key one twice, the tables) and
// 256 (the tables' two rounds of routing loads; the expand's slot check over 256 tokens).
TEST(LoraGpu, AllSlotsNoneTouchesNothing) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand})
    for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned})
      for (bool rank0 : {false, true})
        for (int T : {1, 6, 16, 64, 256, 400}) {
          Case c;
          // (T = 400 at top-1: more tokens than the plain stream kernels' threads, which their
          // slot check counts as a slot found; the grouping finds none)
          c.op = op, c.routing = rk, c.T = T, c.k = T == 400 ? 1 : 8;
          c.slots = rank0 ? SlotMode::kZipf : SlotMode::kAllNone;
          SCOPED_TRACE(c.name() + (rank0 ? " every rank 0" : " every slot -1"));
          Data d = make_data(c, rng);
          if (rank0) std::fill(d.ranks.begin(), d.ranks.end(), 0);
          ASSERT_EQ(run_cpu(d), d.out);  // (the reference moves nothing either)
          DevData g(d);
          std::vector<std::string> kernels = {"", "grid", "stream"};
          for (const std::string& kernel : kernels)
            for (int check : {-1, 0}) {  // the plain stream kernels' slot check on, off
              SCOPED_TRACE("kernel '" + kernel + "' slot_check " + std::to_string(check));
              Plan pl;
              PlanOptions o;
              o.kernel = kernel;
              o.slot_check = check;
              ASSERT_TRUE(plan(d.pb, &pl, o).ok());
              g.out.set(d.out);
              ASSERT_TRUE(run_gpu(d, g, &pl, nullptr).ok());
              CK(cudaDeviceSynchronize());
              EXPECT_EQ(g.out.get(), d.out) << pl.to_string();
            }
        }
}

TEST(LoraGpu, GraphCaptureReplaysLikeEager) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned}) {
    Case cs;
    cs.op = Op::kShrink, cs.routing = rk, cs.T = 8, cs.k = 8, cs.S = 4, cs.E = 32, cs.dim = 256;
    cs.r_max = 16;
    Data ds = make_data(cs, rng);
    Case ce = cs;
    ce.op = Op::kExpand;
    Data de = make_data(ce, rng);
    share_routing(de, ds);
    DevData gs(ds), ge(de);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // Eager: shrink into gs.out, expand from it.
    ASSERT_TRUE(run_gpu(ds, gs, nullptr, s).ok());  // warm the plan cache
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> t_eager = gs.out.get();
    ge.in.set(t_eager);
    ASSERT_TRUE(run_gpu(de, ge, nullptr, s).ok());
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> y_eager = ge.out.get();
    // Graph: the same two calls captured, expand reading the shrink output directly.
    gs.out.set(ds.out);
    ge.out.set(de.out);
    ASSERT_NO_FATAL_FAILURE(replay_graph(
        s, 3,
        [&] {
          Status st1 = run_gpu(ds, gs, nullptr, s);
          Status st2 = expand(de.pb, nullptr, gs.out.p, ge.w.p, ge.ranks.p, ge.scales.p,
                              ge.routing(), ge.out.p, s);
          return st1.ok() ? st2 : st1;
        },
        [&] { ge.out.set(de.out); },
        [&](int rep) { EXPECT_EQ(ge.out.get(), y_eager) << "replay " << rep; }));
    EXPECT_EQ(gs.out.get(), t_eager);
    cudaStreamDestroy(s);
  }
}

// MOLORA_LORA_PDL=1 (programmatic dependent launch): every kernel against the reference, and a
// shrink -> expand chain, eager and replayed from a graph, where expand reads the t that shrink
// has just written (each kernel may start while the one before it runs, so its wait must come
// before its first read): the same bits as with the setting off.
TEST(LoraGpu, DependentLaunchKeepsStreamOrder) {
  MOLORA_SKIP_WITHOUT_GPU();
  const SettingsReset reset{"MOLORA_LORA_PDL"};
  std::mt19937_64 rng(fresh_seed());
  molora::set_setting("MOLORA_LORA_PDL", "1");
  for (Op op : {Op::kShrink, Op::kExpand}) {
    Case c;
    c.op = op, c.routing = RoutingKind::kAligned, c.T = 64, c.k = 8, c.S = 8, c.E = 160;
    c.r_max = 32, c.dim = op == Op::kShrink ? 2048 : 1536, c.block = 16;
    check_case(c, rng);
    c.T = 1;  // P = 8: the grid kernel by default
    check_case(c, rng);
  }
  Case cs;
  cs.op = Op::kShrink, cs.routing = RoutingKind::kAligned, cs.T = 64, cs.k = 8, cs.S = 8;
  cs.E = 160, cs.r_max = 32, cs.dim = 4096, cs.block = 16;
  Data ds = make_data(cs, rng);
  Case ce = cs;
  ce.op = Op::kExpand, ce.dim = 2048;
  Data de = make_data(ce, rng);
  share_routing(de, ds);
  DevData gs(ds), ge(de);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto chain = [&]() {  // shrink into gs.out (poisoned first), expand from it into ge.out
    Status a = run_gpu(ds, gs, nullptr, s);
    Status b = expand(de.pb, nullptr, gs.out.p, ge.w.p, ge.ranks.p, ge.scales.p, ge.routing(),
                      ge.out.p, s);
    return a.ok() ? b : a;
  };
  molora::set_setting("MOLORA_LORA_PDL", "0");
  ASSERT_TRUE(chain().ok());
  CK(cudaStreamSynchronize(s));
  const std::vector<uint16_t> t_ref = gs.out.get(), y_ref = ge.out.get();
  molora::set_setting("MOLORA_LORA_PDL", "1");
  gs.out.set(ds.out), ge.out.set(de.out);
  ASSERT_TRUE(chain().ok());
  CK(cudaStreamSynchronize(s));
  EXPECT_EQ(gs.out.get(), t_ref);
  EXPECT_EQ(ge.out.get(), y_ref) << "eager chain";
  // Captures fn into a graph and replays it three times from the poisoned outputs: t and y are
  // t_ref and y_want each time.
  auto replays_match = [&](auto&& fn, const std::vector<uint16_t>& y_want, const char* what) {
    replay_graph(
        s, 3, fn, [&] { gs.out.set(ds.out), ge.out.set(de.out); },
        [&](int rep) {
          EXPECT_EQ(gs.out.get(), t_ref) << what << "replay " << rep;
          EXPECT_EQ(ge.out.get(), y_want) << what << "replay " << rep;
        });
  };
  replays_match(chain, y_ref, "");
  // Early inputs (Plan::early_inputs: the routing, ranks, scales and weights read before the wait
  // for the kernel before): the chain reads t right after the shrink wrote it, and a second
  // expand reads y right after the first wrote it, so an activation read before the wait would
  // show as a wrong t or a lost first delta. Eager and from a graph, the same bits as without.
  {
    const SettingsReset reset_early{"MOLORA_LORA_EARLY_INPUTS"};
    auto twice = [&]() {  // the chain, then the expand once more on its own output
      Status a = chain();
      Status b = expand(de.pb, nullptr, gs.out.p, ge.w.p, ge.ranks.p, ge.scales.p, ge.routing(),
                        ge.out.p, s);
      return a.ok() ? b : a;
    };
    molora::set_setting("MOLORA_LORA_PDL", "0");
    gs.out.set(ds.out), ge.out.set(de.out);
    ASSERT_TRUE(twice().ok());
    CK(cudaStreamSynchronize(s));
    const std::vector<uint16_t> y2_ref = ge.out.get();
    EXPECT_NE(y2_ref, y_ref);  // (the second delta changed y)
    molora::set_setting("MOLORA_LORA_PDL", "1");
    molora::set_setting("MOLORA_LORA_EARLY_INPUTS", "1");
    Plan pl;
    ASSERT_TRUE(plan(de.pb, &pl).ok());
    ASSERT_TRUE(pl.early_inputs) << pl.to_string();
    for (int rep = 0; rep < 3; ++rep) {
      gs.out.set(ds.out), ge.out.set(de.out);
      ASSERT_TRUE(twice().ok());
      CK(cudaStreamSynchronize(s));
      EXPECT_EQ(gs.out.get(), t_ref) << "early, eager " << rep;
      EXPECT_EQ(ge.out.get(), y2_ref) << "early, eager " << rep;
    }
    replays_match(twice, y2_ref, "early, ");
    // and against the fp64 reference, for both ops at a decode and a larger batch
    for (Op op : {Op::kShrink, Op::kExpand}) {
      Case c;
      c.op = op, c.routing = RoutingKind::kAligned, c.T = 8, c.k = 8, c.S = 8, c.E = 160;
      c.r_max = 32, c.dim = op == Op::kShrink ? 2048 : 1536, c.block = 16;
      check_case(c, rng);
      c.T = 64;
      check_case(c, rng);
    }
  }
  cudaStreamDestroy(s);
}

namespace {

// One moe_delta on the device: x, A, B and the shrink's routing from d, t poisoned and y the
// base before the call (plan dp, or the cached plans when null).
struct DeltaDev {
  DevData s, e;
  explicit DeltaDev(const DeltaData& d) : s(d.s), e(d.e) {}
  Status run(const DeltaData& d, const DeltaPlan* dp, cudaStream_t st, int shrink_early = -1) {
    return moe_delta(d.s.pb, d.e.pb.N, dp, s.in.p, s.w.p, e.w.p, s.ranks.p, e.scales.p, s.routing(),
                     s.out.p, e.out.p, st, shrink_early);
  }
  // The same as two calls: shrink() into t, then expand() from it (the first error stops it).
  Status run_two_calls(const DeltaData& d, cudaStream_t st) {
    Status r = shrink(d.s.pb, nullptr, s.in.p, s.w.p, s.ranks.p, s.routing(), s.out.p, st);
    if (!r.ok()) return r;
    return expand(d.e.pb, nullptr, s.out.p, e.w.p, s.ranks.p, e.scales.p, s.routing(), e.out.p, st);
  }
  void reset(const DeltaData& d) { s.out.set(d.s.out), e.out.set(d.e.out); }
};

// The delta's CPU reference: t and y.
std::pair<std::vector<uint16_t>, std::vector<uint16_t>> delta_cpu(const DeltaData& d) {
  std::vector<uint16_t> t = d.s.out, y = d.e.out;
  const Status st =
      moe_delta_cpu(d.s.pb, d.e.pb.N, d.s.in.data(), d.s.w.data(), d.e.w.data(), d.s.ranks.data(),
                    d.e.scales.data(), d.s.host_routing(), t.data(), y.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return {t, y};
}

}  // namespace

// moe_delta against its fp64 reference (t and y, fresh random inputs, t poisoned), bit-equal to
// shrink() then expand() and to graph replays, on the stream kernels (aligned, early expand),
// the grid shrink (T=1), the grid kernels (plain routing, blocks of 64), fp16, and every slot -1.
TEST(LoraGpu, DeltaMatchesReferenceAndTheTwoCalls) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  struct DCase {
    Case c;
    int64_t n;
  };
  std::vector<DCase> cases;
  Case base;
  base.routing = RoutingKind::kAligned, base.k = 8, base.S = 8, base.E = 32, base.r_max = 32;
  base.dim = 2048, base.block = 16;
  for (int T : {1, 2, 8, 64}) {
    Case c = base;
    c.T = T;
    cases.push_back({c, 1536});
  }
  {
    Case c = base;  // odd sizes: K and N off the pieces and tiles, r_max 16
    c.T = 5, c.dim = 1032, c.r_max = 16;
    cases.push_back({c, 520});
    c.dt = DType::kF16;
    cases.push_back({c, 520});
    c = base;
    c.T = 8, c.routing = RoutingKind::kPlain;  // grid kernels
    cases.push_back({c, 1024});
    c = base;
    c.T = 8, c.block = 64;  // aligned, blocks past the stream kernels': grid
    cases.push_back({c, 1024});
    c = base;
    c.T = 8, c.slots = SlotMode::kAllNone;
    cases.push_back({c, 1024});
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const DCase& dc : cases) {
    SCOPED_TRACE(dc.c.name() + " N" + std::to_string(dc.n));
    const DeltaData d = make_delta(dc.c, dc.n, rng);
    const auto [t_ref, y_ref] = delta_cpu(d);
    DeltaDev g(d);
    DeltaPlan dp;
    ASSERT_TRUE(plan_delta(d.s.pb, dc.n, &dp).ok());
    const bool stream_e = dc.c.routing == RoutingKind::kAligned && dc.c.block <= 32;
    EXPECT_EQ(dp.expand.early_inputs, stream_e) << dp.to_string();
    ASSERT_TRUE(g.run(d, nullptr, st).ok());
    CK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> t = g.s.out.get(), y = g.e.out.get();
    const Err et = compare(d.s, t, t_ref, d.s.out), ey = compare(d.e, y, y_ref, d.e.out);
    EXPECT_LE(et.rel, tolerance(dc.c.dt)) << dp.to_string();
    EXPECT_LE(ey.rel, tolerance(dc.c.dt)) << dp.to_string();
    EXPECT_EQ(et.untouched_changed + ey.untouched_changed, 0) << dp.to_string();
    EXPECT_EQ(et.nonfinite + ey.nonfinite, 0);
    if (dc.c.slots == SlotMode::kAllNone) {
      EXPECT_EQ(y, d.e.out);
      EXPECT_EQ(t, d.s.out);
    }
    // The same bits as the two calls, and as the plan passed in.
    g.reset(d);
    ASSERT_TRUE(g.run_two_calls(d, st).ok());
    CK(cudaStreamSynchronize(st));
    EXPECT_EQ(g.s.out.get(), t);
    EXPECT_EQ(g.e.out.get(), y) << "moe_delta differs from shrink() then expand()";
    g.reset(d);
    ASSERT_TRUE(g.run(d, &dp, st).ok());
    CK(cudaStreamSynchronize(st));
    EXPECT_EQ(g.e.out.get(), y) << "with the plan passed in";
    // Captured once, replayed three times.
    ASSERT_NO_FATAL_FAILURE(replay_graph(
        st, 3, [&] { return g.run(d, &dp, st); }, [&] { g.reset(d); },
        [&](int rep) {
          EXPECT_EQ(g.s.out.get(), t) << "replay " << rep;
          EXPECT_EQ(g.e.out.get(), y) << "replay " << rep;
        }));
  }
  // Bad arguments: named, nothing written (both plans are checked before the shrink runs).
  {
    Case c = base;
    c.T = 8;
    const DeltaData d = make_delta(c, 1024, rng);
    DeltaDev g(d);
    DeltaPlan dp;
    ASSERT_TRUE(plan_delta(d.s.pb, 1024, &dp).ok());
    DeltaPlan wrong = dp;
    wrong.expand.chunks += 1;  // an expand plan of another shape
    Status s1 = g.run(d, &wrong, st);
    EXPECT_NE(s1.message().find("expand plan does not match"), std::string::npos) << s1.message();
    std::vector<uint16_t> host_y = d.e.out;
    Status s2 = moe_delta(d.s.pb, 1024, &dp, g.s.in.p, g.s.w.p, g.e.w.p, g.s.ranks.p, g.e.scales.p,
                          g.s.routing(), g.s.out.p, host_y.data(), st);
    EXPECT_NE(s2.message().find("y"), std::string::npos) << s2.message();
    Status s3 = moe_delta(d.s.pb, 1024, &dp, g.s.in.p, g.s.w.p, g.e.w.p, g.s.ranks.p, nullptr,
                          g.s.routing(), g.s.out.p, g.e.out.p, st);
    EXPECT_NE(s3.message().find("scales"), std::string::npos) << s3.message();
    Status s4 = moe_delta(d.s.pb, 1004, &dp, g.s.in.p, g.s.w.p, g.e.w.p, g.s.ranks.p, g.e.scales.p,
                          g.s.routing(), g.s.out.p, g.e.out.p, st);
    EXPECT_NE(s4.message().find("N must be"), std::string::npos) << s4.message();
    CK(cudaStreamSynchronize(st));
    EXPECT_EQ(g.s.out.get(), d.s.out);
    EXPECT_EQ(g.e.out.get(), d.e.out);
  }
  cudaStreamDestroy(st);
}

// The expand of moe_delta reads its weights before it waits for the shrink. That is valid only
// if nothing launched before the shrink is still running then: a kernel before the delta that
// lets the next one launch at once and writes B 200 us later must still be seen. The delta runs
// after such a writer (eager and replayed from a graph; shrink early inputs off and on) and must
// give the bits of a run with B already in place. Control (printed, not asserted: a race): the
// same with shrink() then expand() under MOLORA_LORA_EARLY_INPUTS=1, whose shrink lets the
// expand launch first thing and so may read the stale B.
TEST(LoraGpu, DeltaWaitsForEverythingBeforeIt) {
  MOLORA_SKIP_WITHOUT_GPU();
  const SettingsReset reset{"MOLORA_LORA_EARLY_INPUTS"};
  std::mt19937_64 rng(fresh_seed());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int T : {1, 2, 8}) {  // grid shrink at T=1, stream from T=2; few tasks: idle SMs
    SCOPED_TRACE("T=" + std::to_string(T));
    Case c;
    c.routing = RoutingKind::kAligned, c.T = T, c.k = 8, c.S = 4, c.E = 16, c.r_max = 32;
    c.dim = 1024, c.block = 16;
    c.slots = SlotMode::kDistinct;  // (every token has an adapter: B is read)
    const DeltaData d = make_delta(c, 1024, rng);
    const auto [t_ref, y_ref] = delta_cpu(d);
    DeltaDev g(d);
    Dev<uint16_t> b_true(d.e.w);
    std::vector<uint16_t> stale(d.e.w.size());
    for (auto& v : stale) v = to16(c.dt, std::uniform_real_distribution<float>(-1, 1)(rng));
    const size_t b_bytes = d.e.w.size() * sizeof(uint16_t);
    // With B in place.
    ASSERT_TRUE(g.run(d, nullptr, st).ok());
    CK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> y_good = g.e.out.get();
    EXPECT_LE(compare(d.e, y_good, y_ref, d.e.out).rel, tolerance(c.dt));
    // With the stale B: a different y, so a stale read would show.
    g.reset(d);
    g.e.w.set(stale);
    ASSERT_TRUE(g.run(d, nullptr, st).ok());
    CK(cudaStreamSynchronize(st));
    ASSERT_NE(g.e.out.get(), y_good);
    for (const char* early : {"0", "1"}) {
      SCOPED_TRACE(std::string("MOLORA_LORA_EARLY_INPUTS=") + early);
      molora::set_setting("MOLORA_LORA_EARLY_INPUTS", early);
      DeltaPlan dp;
      ASSERT_TRUE(plan_delta(d.s.pb, 1024, &dp).ok());
      ASSERT_TRUE(dp.expand.early_inputs) << dp.to_string();
      for (int rep = 0; rep < 2; ++rep) {
        g.reset(d);
        g.e.w.set(stale);
        CK(launch_late_writer(g.e.w.p, b_true.p, b_bytes, 200, st));
        ASSERT_TRUE(g.run(d, nullptr, st).ok());
        CK(cudaStreamSynchronize(st));
        EXPECT_EQ(g.e.out.get(), y_good) << "eager " << rep;
      }
      ASSERT_NO_FATAL_FAILURE(replay_graph(
          st, 2,
          [&] {
            if (launch_late_writer(g.e.w.p, b_true.p, b_bytes, 200, st) != cudaSuccess)
              return Status::Internal("late writer launch failed");
            return g.run(d, &dp, st);
          },
          [&] { g.reset(d), g.e.w.set(stale); },
          [&](int rep) { EXPECT_EQ(g.e.out.get(), y_good) << "graph " << rep; }));
    }
    // Control: the two calls with early inputs on both.
    molora::set_setting("MOLORA_LORA_EARLY_INPUTS", "1");
    g.reset(d);
    g.e.w.set(stale);
    CK(launch_late_writer(g.e.w.p, b_true.p, b_bytes, 200, st));
    ASSERT_TRUE(g.run_two_calls(d, st).ok());
    CK(cudaStreamSynchronize(st));
    const bool stale_read = g.e.out.get() != y_good;
    std::printf(
        "[lora] control T=%d: shrink() then expand() with early inputs after the late "
        "writer %s\n",
        T, stale_read ? "read the stale B (the race moe_delta closes)" : "read the new B");
    molora::set_setting("MOLORA_LORA_EARLY_INPUTS", std::nullopt);
  }
  cudaStreamDestroy(st);
}

// A delta right after another (gate's, then up's: the same x and routing) may read its shrink's
// inputs early as well (shrink_early = 1), because the first delta's shrink lets its expand
// launch only after its own wait. A kernel before the gate delta lets its successor launch at
// once and writes up's A 200 us later; up's delta must still give the bits of a run with A in
// place (eager and from a graph). Control (printed, not asserted: a race): gate as shrink() then
// expand(), whose shrink lets the expand launch first thing, may let up's early shrink read the
// stale A.
TEST(LoraGpu, DeltaAfterDeltaReadsEarlyOnlyWhenSafe) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int T : {2, 8}) {  // (stream shrink: P >= 16)
    SCOPED_TRACE("T=" + std::to_string(T));
    Case c;
    c.routing = RoutingKind::kAligned, c.T = T, c.k = 8, c.S = 4, c.E = 16, c.r_max = 32;
    c.dim = 1024, c.block = 16;
    c.slots = SlotMode::kDistinct;  // (every token has an adapter: A is read)
    const DeltaData gate = make_delta(c, 1024, rng);
    DeltaData up = make_delta(c, 768, rng);
    up.s.in = gate.s.in;  // the same x
    share_routing(up.s, gate.s);
    share_routing(up.e, gate.s);
    DeltaDev gg(gate), gu(up);
    const auto [tu_ref, yu_ref] = delta_cpu(up);
    DeltaPlan dp;
    PlanOptions o;
    o.early_inputs = 1;
    ASSERT_TRUE(plan_delta(up.s.pb, 768, &dp, o).ok());
    ASSERT_TRUE(dp.shrink.early_inputs) << dp.to_string();
    // With A in place, without and with shrink_early: the same bits.
    ASSERT_TRUE(gg.run(gate, nullptr, st).ok());
    ASSERT_TRUE(gu.run(up, nullptr, st).ok());
    CK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> yu_good = gu.e.out.get();
    EXPECT_LE(compare(up.e, yu_good, yu_ref, up.e.out).rel, tolerance(c.dt));
    gg.reset(gate), gu.reset(up);
    ASSERT_TRUE(gg.run(gate, nullptr, st).ok());
    ASSERT_TRUE(gu.run(up, nullptr, st, 1).ok());
    CK(cudaStreamSynchronize(st));
    EXPECT_EQ(gu.e.out.get(), yu_good);
    Dev<uint16_t> a_true(up.s.w);
    std::vector<uint16_t> stale(up.s.w.size());
    for (auto& v : stale) v = to16(c.dt, std::uniform_real_distribution<float>(-1, 1)(rng));
    const size_t a_bytes = up.s.w.size() * sizeof(uint16_t);
    gu.reset(up);
    gu.s.w.set(stale);
    ASSERT_TRUE(gu.run(up, nullptr, st).ok());
    CK(cudaStreamSynchronize(st));
    ASSERT_NE(gu.e.out.get(), yu_good);  // (a stale A shows)
    auto both = [&](bool with_plan) {
      if (launch_late_writer(gu.s.w.p, a_true.p, a_bytes, 200, st) != cudaSuccess)
        return Status::Internal("late writer launch failed");
      Status s1 = gg.run(gate, nullptr, st);
      Status s2 = with_plan ? gu.run(up, &dp, st) : gu.run(up, nullptr, st, 1);
      return s1.ok() ? s2 : s1;
    };
    for (int rep = 0; rep < 2; ++rep) {
      gg.reset(gate), gu.reset(up);
      gu.s.w.set(stale);
      ASSERT_TRUE(both(rep == 1).ok());
      CK(cudaStreamSynchronize(st));
      EXPECT_EQ(gu.e.out.get(), yu_good) << "eager " << rep;
    }
    ASSERT_NO_FATAL_FAILURE(replay_graph(
        st, 2, [&] { return both(true); }, [&] { gg.reset(gate), gu.reset(up), gu.s.w.set(stale); },
        [&](int rep) { EXPECT_EQ(gu.e.out.get(), yu_good) << "graph " << rep; }));
    // Control: gate as two plain calls.
    gg.reset(gate), gu.reset(up);
    gu.s.w.set(stale);
    CK(launch_late_writer(gu.s.w.p, a_true.p, a_bytes, 200, st));
    ASSERT_TRUE(gg.run_two_calls(gate, st).ok());
    ASSERT_TRUE(gu.run(up, nullptr, st, 1).ok());
    CK(cudaStreamSynchronize(st));
    std::printf(
        "[lora] control T=%d: shrink() and expand() then an early delta after the late "
        "writer %s\n",
        T,
        gu.e.out.get() != yu_good ? "read the stale A (the race the late trigger closes)"
                                  : "read the new A");
  }
  cudaStreamDestroy(st);
}

TEST(LoraGpu, BadArgumentsAreRejected) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  Case c;
  Data d = make_data(c, rng);
  DevData g(d);
  std::vector<uint16_t> host_out = d.out;
  Status st = expand(d.pb, nullptr, g.in.p, g.w.p, g.ranks.p, g.scales.p, g.routing(),
                     host_out.data(), nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("y"), std::string::npos) << st.message();
  st = expand(d.pb, nullptr, g.in.p, g.w.p, g.ranks.p, nullptr, g.routing(), g.out.p, nullptr);
  EXPECT_NE(st.message().find("scales"), std::string::npos) << st.message();
  Problem pb = d.pb;
  pb.dtype = DType::kF32;
  st = expand(pb, nullptr, g.in.p, g.w.p, g.ranks.p, g.scales.p, g.routing(), g.out.p, nullptr);
  EXPECT_NE(st.message().find("dtype"), std::string::npos) << st.message();
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(g.out.get(), d.out);
  // A plan passed in that the kernels cannot run for the problem (detail::check_plan): refused
  // with the reason, nothing written. An aligned grid plan made for blocks of 16 against blocks
  // of 64 with the same block count (its shared memory a quarter of the member list), and a grid
  // expand tile off the planner's rule with consistent counts.
  {
    Case a = c;
    a.routing = RoutingKind::kAligned, a.block = 64;
    const Data da = make_data(a, rng);
    DevData ga(da);
    PlanOptions o;
    o.kernel = "grid";
    o.config_path = "none";
    Problem p16 = da.pb;
    p16.block_size = 16;
    p16.sorted_len = molora::cdiv(da.pb.sorted_len, 64) * 16;
    Plan pl16, own;
    ASSERT_TRUE(plan(p16, &pl16, o).ok());
    ASSERT_TRUE(plan(da.pb, &own, o).ok());
    Status s1 = expand(da.pb, &pl16, ga.in.p, ga.w.p, ga.ranks.p, ga.scales.p, ga.routing(),
                       ga.out.p, nullptr);
    EXPECT_NE(s1.message().find("shared memory"), std::string::npos) << s1.message();
    Plan off = own;
    off.tile = 12;
    off.chunks = static_cast<int>(molora::cdiv(a.dim, 12));
    off.max_items = molora::cdiv(da.pb.sorted_len, 64) * off.chunks;
    Status s2 = expand(da.pb, &off, ga.in.p, ga.w.p, ga.ranks.p, ga.scales.p, ga.routing(),
                       ga.out.p, nullptr);
    EXPECT_NE(s2.message().find("multiple of 8"), std::string::npos) << s2.message();
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(ga.out.get(), da.out);  // neither refused call wrote y
    // The problem's own plan runs, against the reference.
    ASSERT_NO_FATAL_FAILURE(check_plan_runs(da, ga, own, run_cpu(da)));
  }
}

TEST(LoraGpu, OutOfRangeIdsOnTheDeviceAreSkipped) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  Case c;
  c.slots = SlotMode::kDistinct;
  Data d = make_data(c, rng);
  Data bad = d;
  bad.slot[0] = c.S;       // slot >= S
  bad.topk[c.k + 1] = -3;  // expert < 0
  DevData g(bad);
  // The plain routing's stream kernel (which groups the ids itself) skips them alike.
  Plan sp;
  PlanOptions so;
  so.kernel = "stream";
  ASSERT_TRUE(plan(bad.pb, &sp, so).ok());
  ASSERT_TRUE(run_gpu(bad, g, &sp, nullptr).ok());
  CK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got_stream = g.out.get();
  g.out.set(bad.out);
  ASSERT_TRUE(run_gpu(bad, g, nullptr, nullptr).ok());
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> got = g.out.get();
  // The same as the reference with those pairs dropped.
  Data ok = d;
  ok.slot[0] = -1;
  std::vector<uint16_t> ref = run_cpu(ok);
  for (int64_t n = 0; n < c.dim; ++n) {
    EXPECT_EQ(got[n], d.out[n]);  // pair 0 untouched
    EXPECT_EQ(got[(c.k + 1) * c.dim + n], d.out[(c.k + 1) * c.dim + n]);
  }
  // Every other pair as the reference (pair k + 1's row: left as it was), on both kernels.
  std::vector<uint16_t> ref2 = ref;
  for (int64_t n = 0; n < c.dim; ++n) ref2[(c.k + 1) * c.dim + n] = d.out[(c.k + 1) * c.dim + n];
  for (const std::vector<uint16_t>* out :
       {&static_cast<const std::vector<uint16_t>&>(got), &got_stream}) {
    const Err e = compare(ok, *out, ref2, d.out);
    EXPECT_LE(e.rel, tolerance(c.dt));
    EXPECT_EQ(e.untouched_changed, 0);
    EXPECT_EQ(e.nonfinite, 0);
  }
}

// Plain routing on the stream kernel groups the pairs as the align output does at blocks of 32
// (the same groups, members and tasks), so it must give the aligned stream call's bits exactly:
// Zipf slots, one slot (groups past 32 members, split), half and all without adapter, distinct
// slots, T = 1 to 256 (2048 pairs, the most it takes), the three ways of grouping (P <= 32: the
// 32-key warp sort; 33 to 256: the 256-key one, P = 33, 49, 63, 64, 65, 99, 200 and 256, its
// network cut at n = 64, 128 and 256; above: the tables, P = 257, 320, 511, 512, 513, 2040 and
// 2048) and the bitmap index (V = 65,536 too), S = 256 (> the 64 slots cached in shared memory),
// the only slot used past the first warp's lanes (S = 48 at P = 32, S = 60 at P = 64: that
// slot's rank and scale cached by a thread of warp 1), a key of 16 pairs at P = 16, both ops,
// bf16 (fp16 at T = 1, 8 and 64), against the reference too.
TEST(LoraGpu, PlainStreamGivesTheAlignedStreamBits) {
  MOLORA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  struct Sh {
    int T, k, S, E, r;
    int64_t dim;
    SlotMode sm;
  };
  const Sh shapes[] = {
      {1, 8, 8, 160, 32, 1536, SlotMode::kZipf},
      {8, 8, 8, 160, 32, 1536, SlotMode::kZipf},
      {64, 8, 8, 160, 32, 1032, SlotMode::kZipf},
      {256, 8, 8, 160, 16, 520, SlotMode::kZipf},
      {100, 2, 1, 3, 32, 264, SlotMode::kOne},
      {64, 8, 8, 160, 32, 1032, SlotMode::kHalfNone},
      {64, 8, 8, 160, 32, 1032, SlotMode::kAllNone},
      {33, 3, 40, 16, 64, 136, SlotMode::kDistinct},
      {4, 8, 256, 256, 8, 64, SlotMode::kZipf},
      {255, 8, 4, 64, 128, 136, SlotMode::kSparse},
      {11, 3, 4, 16, 32, 264, SlotMode::kZipf},
      {40, 8, 40, 64, 16, 136, SlotMode::kZipf},
      {16, 1, 1, 1, 32, 264, SlotMode::kOne},
      {7, 7, 8, 32, 16, 264, SlotMode::kZipf},
      {21, 3, 3, 12, 32, 136, SlotMode::kSparse},
      {4, 8, 48, 16, 32, 264, SlotMode::kOne},
      {8, 8, 60, 16, 32, 264, SlotMode::kOne},
      {13, 5, 8, 16, 32, 264, SlotMode::kZipf},
      {73, 7, 8, 16, 32, 264, SlotMode::kOne},
      {57, 9, 6, 12, 16, 136, SlotMode::kZipf},
      {32, 8, 8, 160, 32, 1032, SlotMode::kZipf},
      {257, 1, 4, 16, 32, 264, SlotMode::kZipf},
      // one token with an adapter among none in the warp sort of up to 256 pairs (56 and 240
      // pairs; the tables' way: the 255-token shape above); its pairs last, so the network's
      // skip and the groups' scans must see the valid keys of one lane
      {7, 8, 8, 160, 32, 1032, SlotMode::kSparse},
      {30, 8, 8, 160, 32, 1032, SlotMode::kSparse},
      // the warp sort's network cut to the power of two n >= P: P = 1, 2, 3, 5, 9, 17 (n = 1,
      // 2, 4, 8, 16, 32) and 16 with one token's adapter among none
      {1, 1, 4, 16, 32, 264, SlotMode::kZipf},
      {1, 2, 4, 16, 32, 264, SlotMode::kZipf},
      {3, 1, 4, 16, 32, 264, SlotMode::kDistinct},
      {5, 1, 4, 16, 32, 264, SlotMode::kZipf},
      {3, 3, 4, 16, 32, 264, SlotMode::kZipf},
      {17, 1, 4, 16, 32, 264, SlotMode::kZipf},
      {2, 8, 8, 160, 32, 1032, SlotMode::kSparse},
      // only the last token has an adapter: the expand's slot check must see it (past the first
      // threads' tokens: T = 255 and 200), and the shrink's grouping (tables, two rounds of
      // routing loads at P > 4 x threads: P = 2040, and 1600 for its 384 threads) finds no
      // valid key in the first round and must still read the second
      {255, 8, 8, 160, 32, 1032, SlotMode::kLast},
      {200, 8, 8, 160, 32, 1032, SlotMode::kLast},
      // more tokens than the plain shrink's 384 threads: its slot check (one token per thread)
      // counts that as a slot found, and the grouping must still find the last token's pair
      {400, 1, 8, 160, 32, 1032, SlotMode::kLast},
  };
  for (Op op : {Op::kShrink, Op::kExpand})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (const Sh& sh : shapes) {
        // fp16: one shape of each way of grouping (the kernels' arithmetic is tested above)
        if (dt == DType::kF16 && sh.T != 1 && sh.T != 8 && sh.T != 64) continue;
        Case c;
        c.op = op, c.dt = dt, c.routing = RoutingKind::kAligned, c.block = 32;
        c.T = sh.T, c.k = sh.k, c.S = sh.S, c.E = sh.E, c.r_max = sh.r, c.dim = sh.dim;
        c.slots = sh.sm;
        SCOPED_TRACE(c.name());
        Data d = make_data(c, rng);
        const std::vector<uint16_t> ref = run_cpu(d);
        DevData g(d);
        PlanOptions o;
        o.kernel = "stream";
        Plan pa, pp;
        ASSERT_TRUE(plan(d.pb, &pa, o).ok());
        ASSERT_NO_FATAL_FAILURE(check_plan_runs(d, g, pa, ref));
        const std::vector<uint16_t> aligned_bits = g.out.get();
        Data dp = d;
        dp.pb.routing = RoutingKind::kPlain, dp.pb.block_size = 0, dp.pb.sorted_len = 0;
        ASSERT_TRUE(plan(dp.pb, &pp, o).ok());
        EXPECT_NE(pp.variant.find(".plain-stream."), std::string::npos) << pp.variant;
        EXPECT_TRUE(pp.slot_check) << pp.to_string();
        ASSERT_NO_FATAL_FAILURE(check_plan_runs(dp, g, pp, ref));
        EXPECT_EQ(g.out.get(), aligned_bits) << "plain stream differs from aligned stream";
        o.slot_check = 0;  // the same without the slot check
        ASSERT_TRUE(plan(dp.pb, &pp, o).ok());
        ASSERT_FALSE(pp.slot_check) << pp.to_string();
        ASSERT_NO_FATAL_FAILURE(check_plan_runs(dp, g, pp, ref));
        EXPECT_EQ(g.out.get(), aligned_bits) << "plain stream, no slot check, differs";
      }
}
