// lora benchmark harness (see lora_bench.h).
#include "lora/lora_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "core/cuda_util.h"
#include "lora/lora_internal.h"
#include "molora/align.h"

namespace molora::lora::bench {

std::string gpu_name() {
#if MOLORA_HAVE_CUDA
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    return prop.name;
  cudaGetLastError();
#endif
  return "";
}

#if !MOLORA_HAVE_CUDA
Status measure_copy_gbps(double*) { return Status::Unavailable("built without CUDA"); }
Status measure_empty_launch_us(double*) { return Status::Unavailable("built without CUDA"); }
Status measure_copy_us(int64_t bytes, double* us) {
  *us = 0;
  return bytes <= 0 ? Status::Ok() : Status::Unavailable("built without CUDA");
}
Status run_case(const Case&, double, Result*) { return Status::Unavailable("built without CUDA"); }
Status run_table(std::ostream&, bool, int*) { return Status::Unavailable("built without CUDA"); }
Status tune(const std::string&, std::ostream&) { return Status::Unavailable("built without CUDA"); }
#else

namespace {

constexpr int kRot = 16;  // rotating routings per timed graph
static_assert(kRot == kWeightCopiesAuto, "one weight copy per rotating routing by default");

struct Buf {
  void* p = nullptr;
  size_t n = 0;
  Status ensure(size_t bytes) {
    if (bytes <= n) return Status::Ok();
    if (p) cudaFree(p);
    p = nullptr;
    n = 0;
    MOLORA_CUDA_CHECK(cudaMalloc(&p, bytes));
    n = bytes;
    return Status::Ok();
  }
};

Buf& buf(const std::string& name) {
  static std::map<std::string, Buf> m;
  return m[name];
}

struct HostRouting {
  std::vector<int32_t> topk, slot, sorted, eids, ntpp;
  RoutingStats st;
};

// Slot s's rank in the benchmark: r_max, or r_max / 2 for odd slots with mixed_ranks.
int slot_rank(const Case& c, int s) {
  return c.mixed_ranks && s % 2 == 1 ? std::max(1, c.shape.r / 2) : c.shape.r;
}

HostRouting make_routing(const Case& c, std::mt19937_64& rng) {
  HostRouting h;
  const int T = c.T, k = c.k, S = c.shape.S, E = c.shape.E;
  const int64_t P = int64_t(T) * k;
  // Zipf over slots: p(s) ~ 1/(s+1).
  std::vector<double> cdf(S);
  double z = 0;
  for (int s = 0; s < S; ++s) cdf[s] = (z += 1.0 / (s + 1));
  h.slot.resize(T);
  for (int t = 0; t < T; ++t) {
    double u = std::uniform_real_distribution<double>(0, z)(rng);
    h.slot[t] = int(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  }
  int none = int(std::floor(c.none_frac * T + 0.5));
  std::vector<int> order(T);
  for (int t = 0; t < T; ++t) order[t] = t;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < none; ++i) h.slot[order[i]] = -1;
  h.topk.resize(P);
  std::vector<int32_t> perm(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int j = 0; j < k; ++j) {
      int pick = j + int(rng() % (E - j));
      std::swap(perm[j], perm[pick]);
      h.topk[int64_t(t) * k + j] = perm[j];
    }
  }
  std::set<int64_t> distinct;
  int64_t active = 0, atok = 0, active_r8 = 0;
  for (int t = 0; t < T; ++t) {
    if (h.slot[t] < 0) continue;
    ++atok;
    for (int j = 0; j < k; ++j, ++active) {
      distinct.insert(int64_t(h.slot[t]) * E + h.topk[int64_t(t) * k + j]);
      active_r8 += detail::round8(slot_rank(c, h.slot[t]));
    }
  }
  int64_t distinct_r8 = 0;
  for (int64_t v : distinct) distinct_r8 += detail::round8(slot_rank(c, int(v / E)));
  h.st = {active, atok, int64_t(distinct.size()), distinct_r8, active_r8};
  if (c.routing == RoutingKind::kAligned) {
    const int64_t V = int64_t(S) * E, B = c.block, len = P + V * (B - 1);
    h.sorted.assign(len, int32_t(P));
    h.eids.assign(cdiv(len, B), -1);
    std::vector<std::vector<int32_t> > bk(V);
    for (int64_t p = 0; p < P; ++p)
      if (h.slot[p / k] >= 0) bk[int64_t(h.slot[p / k]) * E + h.topk[p]].push_back(int32_t(p));
    int64_t pos = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (bk[v].empty()) continue;
      std::copy(bk[v].begin(), bk[v].end(), h.sorted.begin() + pos);
      int64_t nb = cdiv(bk[v].size(), B);
      for (int64_t b = 0; b < nb; ++b) h.eids[pos / B + b] = int32_t(v);
      pos += nb * B;
    }
    h.ntpp = {int32_t(pos)};
  }
  return h;
}

template <typename V>
Status upload(const std::string& name, const std::vector<V>& h, int slot, size_t stride, V** out) {
  Buf& b = buf(name);
  MOLORA_RETURN_IF_ERROR(b.ensure(stride * sizeof(V) * kRot));
  V* p = static_cast<V*>(b.p) + stride * slot;
  // A pageable cudaMemcpy may return before its DMA lands, and the timed calls run on a
  // non-blocking stream: wait for it (tests/lora_gpu_test.cc's Dev::set, which raced).
  if (!h.empty()) {
    MOLORA_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
    MOLORA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  *out = p;
  return Status::Ok();
}

// Runs launch() `reps` times on stream s between two events and gives the elapsed time, ms.
template <typename F>
Status time_reps_ms(cudaStream_t s, int reps, F&& launch, float* ms) {
  cudaEvent_t e0, e1;
  MOLORA_CUDA_CHECK(cudaEventCreate(&e0));
  MOLORA_CUDA_CHECK(cudaEventCreate(&e1));
  MOLORA_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int r = 0; r < reps; ++r) MOLORA_CUDA_CHECK(launch());
  MOLORA_CUDA_CHECK(cudaEventRecord(e1, s));
  MOLORA_CUDA_CHECK(cudaEventSynchronize(e1));
  MOLORA_CUDA_CHECK(cudaEventElapsedTime(ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return Status::Ok();
}

}  // namespace

Status measure_copy_gbps(double* gbps) {
  MOLORA_RETURN_IF_ERROR(require_gpu());  // (Unavailable, naming why, where there is no GPU)
  const size_t bytes = size_t(1) << 30;
  Buf& a = buf("copy_a");
  Buf& b = buf("copy_b");
  MOLORA_RETURN_IF_ERROR(a.ensure(bytes));
  MOLORA_RETURN_IF_ERROR(b.ensure(bytes));
  auto copy = [&] { return cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr); };
  MOLORA_CUDA_CHECK(copy());  // warm
  const int reps = 10;
  float ms = 0;
  MOLORA_RETURN_IF_ERROR(time_reps_ms(nullptr, reps, copy, &ms));
  *gbps = 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
  cudaFree(a.p), cudaFree(b.p);
  a = Buf{}, b = Buf{};
  return Status::Ok();
}

// Captures call(0..calls-1) on stream s into one graph, replays it (once to warm, then 8 times
// timed) and gives the time per call, us.
template <typename F>
Status time_graph_us(cudaStream_t s, F&& call, double* us, int calls = kRot) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  MOLORA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  Status cap;
  for (int i = 0; i < calls && cap.ok(); ++i) cap = call(i);
  MOLORA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOLORA_RETURN_IF_ERROR(cap);
  MOLORA_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  MOLORA_CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm
  const int reps = 8;
  float ms = 0;
  MOLORA_RETURN_IF_ERROR(time_reps_ms(
      s, reps, [&] { return cudaGraphLaunch(ge, s); }, &ms));
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  *us = ms * 1e3 / (reps * calls);
  return Status::Ok();
}

// Host time per eager call over `layers` weight pointers (call(routing, layer)): one pass with
// the tensor-map cache emptied, then eight passes warm (see Result::host_us_cold); then the host
// cost of one pointer check (on dev_ptr) and of one empty launch.
template <typename F>
Status time_layers_host(int layers, cudaStream_t s, F&& call, const void* dev_ptr, Result* r) {
  using clock = std::chrono::steady_clock;
  auto pass = [&](int passes, double* us, double* encodes) -> Status {
    MOLORA_CUDA_CHECK(cudaStreamSynchronize(s));
    const uint64_t m0 = detail::tensor_map_cache_stats().misses;
    const auto t0 = clock::now();
    int n = 0;
    for (int p = 0; p < passes; ++p)
      for (int l = 0; l < layers; ++l, ++n) MOLORA_RETURN_IF_ERROR(call(n % kRot, l));
    const auto t1 = clock::now();
    MOLORA_CUDA_CHECK(cudaStreamSynchronize(s));
    *us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
    *encodes = double(detail::tensor_map_cache_stats().misses - m0) / n;
    return Status::Ok();
  };
  detail::tensor_map_cache_clear();
  MOLORA_RETURN_IF_ERROR(pass(1, &r->host_us_cold, &r->encodes_cold));
  MOLORA_RETURN_IF_ERROR(pass(8, &r->host_us_warm, &r->encodes_warm));
  constexpr int kN = 512;  // (kernels enqueued below stay under the launch queue's depth)
  const auto t0 = clock::now();
  for (int i = 0; i < kN; ++i) {
    cudaPointerAttributes at{};
    MOLORA_CUDA_CHECK(cudaPointerGetAttributes(&at, dev_ptr));
  }
  const auto t1 = clock::now();
  for (int i = 0; i < kN; ++i) MOLORA_RETURN_IF_ERROR(detail::launch_empty(1, 32, s));
  const auto t2 = clock::now();
  MOLORA_CUDA_CHECK(cudaStreamSynchronize(s));
  r->host_us_pointer_check = std::chrono::duration<double, std::micro>(t1 - t0).count() / kN;
  r->host_us_empty_launch = std::chrono::duration<double, std::micro>(t2 - t1).count() / kN;
  return Status::Ok();
}

// The calls once more, captured with the timeline probe on (one stream launch per call of
// `grid` CTAs), then the records of the last replay summarised.
template <typename F>
Status run_timeline(cudaStream_t s, F&& call, int grid, Timeline* out) {
  if (!detail::stream_trace_built())
    return Status::Unavailable(
        "--timeline: this build's stream kernels have no timeline probe (configure with "
        "-DMOLORA_LORA_TRACE=ON)");
  const size_t words = size_t(kRot) * grid * detail::kTraceWords;
  unsigned long long* d = nullptr;
  MOLORA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), words * sizeof(*d)));
  Status st;
  double us = 0;
  if (cudaMemsetAsync(d, 0, words * sizeof(*d), s) != cudaSuccess)
    st = Status::Internal("timeline: cudaMemsetAsync failed");
  if (st.ok()) {
    detail::set_stream_trace(d, int64_t(words));
    st = time_graph_us(s, call, &us);
    detail::set_stream_trace(nullptr, 0);
  }
  std::vector<unsigned long long> h(words);
  if (st.ok() &&
      cudaMemcpyAsync(h.data(), d, words * sizeof(*d), cudaMemcpyDeviceToHost, s) == cudaSuccess &&
      cudaStreamSynchronize(s) == cudaSuccess) {
    st = summarize_timeline(h, kRot, grid, out);
    out->probe_us = us;
  } else if (st.ok()) {
    st = Status::Internal(std::string("timeline: copy back failed: ") +
                          cudaGetErrorString(cudaGetLastError()));
  }
  cudaFree(d);
  return st;
}

Status measure_copy_us(int64_t bytes, double* us) {
  *us = 0;
  if (bytes <= 0) return Status::Ok();
  // Half the bytes read, half written, rounded up to 4 KiB (so that near sizes share one
  // measurement); each copy of the graph on its own source and destination, and enough of them
  // that the graph's sources span >= 256 MiB: every copy reads HBM, not L2 (50 MiB on the H200).
  constexpr size_t kGran = 4096, kSpan = size_t(256) << 20;
  const size_t half = (static_cast<size_t>(bytes) / 2 + kGran - 1) / kGran * kGran;
  static std::map<size_t, double> memo;
  if (auto it = memo.find(half); it != memo.end()) return *us = it->second, Status::Ok();
  MOLORA_RETURN_IF_ERROR(require_gpu());
  const int calls = static_cast<int>(std::max<size_t>(kRot, (kSpan + half - 1) / half));
  Buf& a = buf("same_bytes_a");
  Buf& b = buf("same_bytes_b");
  MOLORA_RETURN_IF_ERROR(a.ensure(half * calls));
  MOLORA_RETURN_IF_ERROR(b.ensure(half * calls));
  cudaStream_t s;
  MOLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto copy = [&](int i) -> Status {
    MOLORA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(b.p) + half * i,
                                      static_cast<const char*>(a.p) + half * i, half,
                                      cudaMemcpyDeviceToDevice, s));
    return Status::Ok();
  };
  const Status st = time_graph_us(s, copy, us, calls);
  cudaStreamDestroy(s);
  MOLORA_RETURN_IF_ERROR(st);
  memo[half] = *us;
  return Status::Ok();
}

Status measure_empty_launch_us(double* us) {
  MOLORA_RETURN_IF_ERROR(require_gpu());
  int dev = 0, sms = 0;
  MOLORA_CUDA_CHECK(cudaGetDevice(&dev));
  MOLORA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s;
  MOLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Status st = time_graph_us(
      s, [&](int) { return detail::launch_empty(sms, 384, s); }, us);
  cudaStreamDestroy(s);
  MOLORA_RETURN_IF_ERROR(st);
  return Status::Ok();
}

Status run_case(const Case& c, double copy_gbps, Result* out) {
  if (c.weight_copies < 0 || c.weight_copies > kWeightCopiesMax)
    return Status::InvalidArgument("weight_copies must be in [0, " +
                                   std::to_string(kWeightCopiesMax) + "] (0: automatic)");
  if (c.T < 1 || c.k < 1 || c.k > c.shape.E)  // (the routing draws k distinct experts per token)
    return Status::InvalidArgument("a case needs T >= 1 and 1 <= top-k <= experts (T " +
                                   std::to_string(c.T) + ", top-k " + std::to_string(c.k) +
                                   ", experts " + std::to_string(c.shape.E) + ")");
  if (c.align_first) {  // (checked before any device work)
    if (c.routing != RoutingKind::kAligned)
      return Status::InvalidArgument("align_first times the aligned call: routing must be aligned");
    if (c.block != 16 && c.block != 32)
      return Status::InvalidArgument(
          "align_first: block must be 16 or 32 (the align kernel's "
          "smallest blocks, the stream kernels' largest), got " +
          std::to_string(c.block));
    if (c.layers > 0 || c.timeline)
      return Status::InvalidArgument("align_first: layers and timeline time the lora call alone");
  }
  MOLORA_RETURN_IF_ERROR(require_gpu());
  const Shape& sh = c.shape;
  const int64_t P = int64_t(c.T) * c.k, V = int64_t(sh.S) * sh.E;
  Problem pb;
  pb.op = c.op;
  pb.dtype = DType::kBF16;
  pb.num_tokens = c.T;
  pb.top_k = c.k;
  pb.num_slots = sh.S;
  pb.num_experts = sh.E;
  pb.r_max = sh.r;
  (c.op == Op::kShrink ? pb.K : pb.N) = sh.dim;
  pb.routing = c.routing;
  if (c.routing == RoutingKind::kAligned) {
    pb.block_size = c.block;
    pb.sorted_len = P + V * (c.block - 1);
  }
  // Weights: one buffer per (op, shape), filled with a small constant.
  // (plus 256 bytes per layer of Case::layers: layer l reads from 256 * l bytes in)
  constexpr size_t kLayerStep = 256;
  // (Case::weight_copies of them, one after the other, each 256-byte aligned)
  const size_t wbytes =
      (size_t(V) * sh.r * sh.dim * 2 + kLayerStep * size_t(std::max(c.layers, 0)) + 255) / 256 *
      256;
  // Each copy (and the chain's second weights, as many) within an eighth of the device's memory
  // when chosen automatically, a quarter when asked for.
  size_t free_b = 0, total_b = 0;
  MOLORA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t per_copy = wbytes * (c.chain ? 2 : 1);
  int copies = c.weight_copies;
  if (copies == 0) {
    copies = static_cast<int>(std::clamp<size_t>(total_b / 8 / per_copy, 1, kWeightCopiesAuto));
  } else if (copies > 1 && per_copy * size_t(copies) > total_b / 4) {
    return Status::InvalidArgument("weight_copies " + std::to_string(copies) + " x " +
                                   std::to_string(per_copy >> 20) +
                                   " MiB of weights is more than a quarter of the device's memory");
  }
  // The timed graph: kRot calls, or one per copy where more copies were asked for.
  const int calls = std::max(kRot, copies);
  Buf& w = buf("w");
  static std::string w_for;
  const std::string wkey =
      sh.name + op_name(c.op) + "/" + std::to_string(wbytes) + "x" + std::to_string(copies);
  if (w_for != wkey) {
    MOLORA_RETURN_IF_ERROR(w.ensure(wbytes * copies));
    MOLORA_CUDA_CHECK(cudaMemset(w.p, 0x3c, wbytes * copies));
    w_for = wkey;
  }
  auto w_at = [&](const Buf& b, int i) {  // the weights call i reads
    return static_cast<const void*>(static_cast<const char*>(b.p) + wbytes * size_t(i % copies));
  };
  const size_t in_elems = c.op == Op::kShrink ? size_t(c.T) * sh.dim : size_t(P) * sh.r;
  const size_t out_elems = c.op == Op::kShrink ? size_t(P) * sh.r : size_t(P) * sh.dim;
  Buf& in = buf("in");
  Buf& o = buf("out");
  MOLORA_RETURN_IF_ERROR(in.ensure(in_elems * 2));
  MOLORA_RETURN_IF_ERROR(o.ensure(out_elems * 2));
  MOLORA_CUDA_CHECK(cudaMemset(in.p, 0x3c, in_elems * 2));
  MOLORA_CUDA_CHECK(cudaMemset(o.p, 0, out_elems * 2));
  std::vector<int32_t> ranks(sh.S);
  for (int s = 0; s < sh.S; ++s) ranks[s] = slot_rank(c, s);
  std::vector<float> scales(sh.S, 0.5f);
  int32_t* d_ranks = nullptr;
  float* d_scales = nullptr;
  MOLORA_RETURN_IF_ERROR(upload("ranks", ranks, 0, ranks.size(), &d_ranks));
  MOLORA_RETURN_IF_ERROR(upload("scales", scales, 0, scales.size(), &d_scales));

  if (c.chain && c.op != Op::kShrink) return Status::InvalidArgument("a chain starts with shrink");
  Problem pbe = pb;  // the chain's expand (N = K)
  pbe.op = Op::kExpand;
  pbe.K = 0;
  pbe.N = sh.dim;
  std::mt19937_64 rng(0x10ba + c.T * 131 + int(c.none_frac * 10) + sh.dim);
  Routing rts[kRot];
  HostRouting last;  // (rotation kRot - 1: align_first checks the device's align against it)
  double bytes_sum = 0;
  PlanOptions po;
  po.bandwidth_gbps = copy_gbps;
  po.force_tile = c.force_tile;
  po.force_unroll = c.force_unroll;
  po.config_path = c.config_path;
  po.kernel = c.kernel;
  Plan pl;
  for (int i = 0; i < kRot; ++i) {
    HostRouting h = make_routing(c, rng);
    int32_t *a = nullptr, *b = nullptr;
    MOLORA_RETURN_IF_ERROR(upload("topk", h.topk, i, size_t(P), &a));
    MOLORA_RETURN_IF_ERROR(upload("slot", h.slot, i, size_t(c.T), &b));
    rts[i].topk_ids = a;
    rts[i].slot_ids = b;
    // (align_first: the calls read the device's align output instead; the host layout stays in
    // h, for the check against it)
    if (c.routing == RoutingKind::kAligned && !c.align_first) {
      int32_t *s = nullptr, *e = nullptr, *n = nullptr;
      MOLORA_RETURN_IF_ERROR(upload("sorted", h.sorted, i, size_t(pb.sorted_len), &s));
      MOLORA_RETURN_IF_ERROR(upload("eids", h.eids, i, size_t(cdiv(pb.sorted_len, c.block)), &e));
      MOLORA_RETURN_IF_ERROR(upload("ntpp", h.ntpp, i, 1, &n));
      rts[i].sorted_token_ids = s;
      rts[i].expert_ids = e;
      rts[i].num_tokens_post_pad = n;
    }
    po.stats = &h.st;
    if (i == kRot - 1) last = h;
    MOLORA_RETURN_IF_ERROR(plan(pb, &pl, po));
    bytes_sum += double(pl.bytes);
    if (c.chain) {
      MOLORA_RETURN_IF_ERROR(plan(pbe, &pl, po));
      bytes_sum += double(pl.bytes);
    }
  }
  po.stats = nullptr;
  Plan run_plan;
  MOLORA_RETURN_IF_ERROR(plan(pb, &run_plan, po));
  // The chain's expand: B [V, N = dim, r] (its own buffer), t = the shrink's output, y [P, N].
  Plan plan_e;
  DeltaPlan plan_d;
  Buf& w2 = buf("w2");
  Buf& y = buf("y");
  if (c.chain) {
    MOLORA_RETURN_IF_ERROR(w2.ensure(wbytes * copies));
    MOLORA_CUDA_CHECK(cudaMemset(w2.p, 0x3c, wbytes * copies));
    MOLORA_RETURN_IF_ERROR(y.ensure(size_t(P) * sh.dim * 2));
    MOLORA_CUDA_CHECK(cudaMemset(y.p, 0, size_t(P) * sh.dim * 2));
    MOLORA_RETURN_IF_ERROR(plan(pbe, &plan_e, po));
    if (c.delta) {
      PlanOptions pd = po;
      if (c.after_delta) pd.early_inputs = 1;
      MOLORA_RETURN_IF_ERROR(plan_delta(pb, sh.dim, &plan_d, pd));
    }
  }
  if (c.delta && !c.chain) return Status::InvalidArgument("delta times a chain");
  if (c.after_delta && !c.delta) return Status::InvalidArgument("after_delta times deltas");
  // align_first: the device's align output, which every call reads (call i aligns routing
  // i % kRot first, in the same stream).
  Routing art;
  AlignArgs al;
  if (c.align_first) {
    AlignSizes as;
    MOLORA_RETURN_IF_ERROR(moe_align_sizes(c.T, c.k, V, c.block, &as));
    if (as.sorted_token_ids != pb.sorted_len)
      return Status::Internal("align_first: align's length differs from the problem's");
    Buf& bs = buf("al_sorted");
    Buf& be = buf("al_eids");
    Buf& bn = buf("al_ntpp");
    Buf& bw = buf("al_ws");
    MOLORA_RETURN_IF_ERROR(bs.ensure(size_t(as.sorted_token_ids) * 4));
    MOLORA_RETURN_IF_ERROR(be.ensure(size_t(as.expert_ids) * 4));
    MOLORA_RETURN_IF_ERROR(bn.ensure(4));
    MOLORA_RETURN_IF_ERROR(bw.ensure(std::max<size_t>(as.workspace_bytes, 1)));
    al.topk_dtype = DType::kI32;
    al.num_tokens = c.T;
    al.topk = c.k;
    al.num_experts = V;
    al.block_size = c.block;
    al.num_base_experts = sh.E;
    al.sorted_token_ids = static_cast<int32_t*>(bs.p);
    al.sorted_token_ids_len = as.sorted_token_ids;
    al.expert_ids = static_cast<int32_t*>(be.p);
    al.expert_ids_len = as.expert_ids;
    al.num_tokens_post_pad = static_cast<int32_t*>(bn.p);
    al.workspace = bw.p;
    al.workspace_bytes = as.workspace_bytes;
    art.sorted_token_ids = al.sorted_token_ids;
    art.expert_ids = al.expert_ids;
    art.num_tokens_post_pad = al.num_tokens_post_pad;
  }
  auto rt_of = [&](int i) -> const Routing& { return c.align_first ? art : rts[i % kRot]; };
  cudaStream_t s;
  MOLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto call_op = [&](int i, const void* wp) {  // the case's op at routing i % kRot, weights wp
    const Routing& rt = rt_of(i);
    return c.op == Op::kShrink ? shrink(pb, &run_plan, in.p, wp, d_ranks, rt, o.p, s)
                               : expand(pb, &run_plan, in.p, wp, d_ranks, d_scales, rt, o.p, s);
  };
  auto call = [&](int i) -> Status {
    if (c.align_first) {
      AlignArgs ai = al;
      ai.topk_ids = rts[i % kRot].topk_ids;
      ai.slot_ids = rts[i % kRot].slot_ids;
      MOLORA_RETURN_IF_ERROR(moe_align_block_size(ai, s));
    }
    if (c.delta)
      return moe_delta(pb, sh.dim, &plan_d, in.p, w_at(w, i), w_at(w2, i), d_ranks, d_scales,
                       rt_of(i), o.p, y.p, s);
    MOLORA_RETURN_IF_ERROR(call_op(i, w_at(w, i)));
    if (!c.chain) return Status::Ok();
    return expand(pbe, &plan_e, o.p, w_at(w2, i), d_ranks, d_scales, rt_of(i), y.p, s);
  };
  for (int i = 0; i < kRot; ++i) MOLORA_RETURN_IF_ERROR(call(i));  // eager warm-up
  MOLORA_CUDA_CHECK(cudaStreamSynchronize(s));
  if (c.align_first) {  // the last warm-up call aligned rotation kRot - 1: the host's layout
    std::vector<int32_t> ds(size_t(al.sorted_token_ids_len)), de(size_t(al.expert_ids_len)), dn(1);
    MOLORA_CUDA_CHECK(
        cudaMemcpy(ds.data(), al.sorted_token_ids, ds.size() * 4, cudaMemcpyDeviceToHost));
    MOLORA_CUDA_CHECK(cudaMemcpy(de.data(), al.expert_ids, de.size() * 4, cudaMemcpyDeviceToHost));
    MOLORA_CUDA_CHECK(cudaMemcpy(dn.data(), al.num_tokens_post_pad, 4, cudaMemcpyDeviceToHost));
    if (ds != last.sorted || de != last.eids || dn != last.ntpp) {
      cudaStreamDestroy(s);
      return Status::Internal(
          "align_first: the device's align output differs from the layout "
          "built on the host (num_tokens_post_pad " +
          std::to_string(dn[0]) + " against " + std::to_string(last.ntpp.at(0)) + ")");
    }
  }
  Result r;
  r.weight_copies = copies;
  Status st = time_graph_us(s, call, &r.us, calls);
  if (st.ok() && c.layers > 0) {
    auto call_layer = [&](int i, int l) {  // routing i of kRot, layer l
      return call_op(i, static_cast<const char*>(w.p) + kLayerStep * size_t(l));
    };
    st = time_layers_host(c.layers, s, call_layer, w.p, &r);
  }
  if (st.ok() && c.timeline) {
    if (c.chain)
      st = Status::InvalidArgument("the timeline probe times one op, not a chain");
    else if (run_plan.variant.find("stream") != std::string::npos)
      st = run_timeline(s, call, run_plan.grid, &r.timeline);
  }
  cudaStreamDestroy(s);
  MOLORA_RETURN_IF_ERROR(st);
  r.bytes = int64_t(bytes_sum / kRot);
  r.floor_us = double(r.bytes) / (copy_gbps * 1e3);
  r.gbps = r.bytes / (r.us * 1e3);
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  MOLORA_RETURN_IF_ERROR(measure_copy_us(r.bytes, &r.copy_us));
  r.plan = c.delta ? plan_d.shrink : run_plan;
  r.plan_expand = c.delta ? plan_d.expand : plan_e;
  *out = r;
  return Status::Ok();
}

Status run_table(std::ostream& os, bool quick, int* missed) {
  double copy = 0, empty_us = 0;
  MOLORA_RETURN_IF_ERROR(measure_copy_gbps(&copy));
  MOLORA_RETURN_IF_ERROR(measure_empty_launch_us(&empty_us));
  char line[512];
  std::vector<std::string> rows;
  std::snprintf(line, sizeof line, "%-7s %-18s %4s %5s %-8s %9s %9s %11s %8s %6s %7s %8s %6s  %s",
                "op", "shape", "T", "none", "routing", "us", "floor_us", "bytes", "GB/s", "%copy",
                "x_floor", "copy_us", "x_copy", "plan");
  rows.push_back(line);
  const std::vector<int> Ts =
      quick ? std::vector<int>{1, 64} : std::vector<int>{1, 8, 32, 64, 128, 256};
  std::map<std::string, double> t_at;     // key → us
  std::map<std::string, double> copy_at;  // key → the same-bytes copy's us
  std::map<std::string, double> pct_at;   // key → % of copy bandwidth
  auto key = [](Op o, const Shape& s, int T, double none, const char* label) {
    std::ostringstream k;
    k << op_name(o) << s.name << T << none << label;
    return k.str();
  };
  std::vector<std::string> summary;
  int miss = 0;
  for (Op op : {Op::kExpand, Op::kShrink})
    for (const Shape& sh : seed_shapes()) {
      // max_xl: T <= 8 against max(floor, one empty launch): a call cannot cost less than its
      // launch, which is above the byte floor for most of these.
      double min_pct[2] = {1e9, 1e9}, max_x[2] = {0, 0}, max_xl[2] = {0, 0};
      // Against a copy of the same bytes (Result::copy_us): T <= 8 and T >= 32.
      double max_xc_small[2] = {0, 0}, max_xc_large[2] = {0, 0};
      // Plain, aligned (the planner's kernel) and, for comparison in the same run, aligned
      // on each kernel forced (all-adapter rows only): al-grid, al-strm; and (full table) the
      // align kernel + the aligned call, what a caller holding plain routing pays: al+align;
      // and plain routing on each kernel forced (full table): pl-grid, pl-strm (the stream
      // kernel grouping the pairs itself).
      struct Variant {
        const char* label;
        RoutingKind routing;
        const char* kernel;  // "" = the planner's
        bool align_first;
        bool none_rows;  // also the 50% and 100% no-adapter rows
        bool target;     // the rows the target lines judge (per routing)
        bool quick;      // also in the quick table
      };
      const Variant variants[] = {
          {"plain", RoutingKind::kPlain, "", false, true, true, true},
          {"aligned", RoutingKind::kAligned, "", false, true, true, true},
          {"al-grid", RoutingKind::kAligned, "grid", false, false, false, true},
          {"al-strm", RoutingKind::kAligned, "stream", false, false, false, true},
          {"al+align", RoutingKind::kAligned, "", true, true, false, false},
          {"pl-grid", RoutingKind::kPlain, "grid", false, false, false, false},
          {"pl-strm", RoutingKind::kPlain, "stream", false, true, false, false},
      };
      for (const Variant& vr : variants)
        for (int T : Ts)
          for (double none : {0.0, 0.5, 1.0}) {
            if ((quick && !vr.quick) || (!vr.none_rows && none != 0.0)) continue;
            const RoutingKind rk = vr.routing;
            const char* label = vr.label;
            Case c;
            c.op = op, c.shape = sh, c.T = T, c.none_frac = none, c.routing = rk;
            c.kernel = vr.kernel;
            c.align_first = vr.align_first;
            Result r;
            MOLORA_RETURN_IF_ERROR(run_case(c, copy, &r));
            std::snprintf(line, sizeof line,
                          "%-7s %-18s %4d %4.0f%% %-8s %9.2f %9.2f %11lld %8.0f %5.1f%% %7.2f "
                          "%8.2f %6.2f  %s tile=%d %s=%d grid=%d w=%d %s",
                          op_name(op), sh.name.c_str(), T, none * 100, label, r.us, r.floor_us,
                          (long long)r.bytes, r.gbps, r.pct_copy, r.us / r.floor_us, r.copy_us,
                          r.copy_us > 0 ? r.us / r.copy_us : 0.0, r.plan.variant.c_str(),
                          r.plan.tile, r.plan.stages > 0 ? "stages" : "u",
                          r.plan.stages > 0 ? r.plan.stages : r.plan.unroll, r.plan.grid,
                          r.weight_copies, r.plan.source.c_str());
            rows.push_back(line);
            const std::string k = key(op, sh, T, none, label);
            t_at[k] = r.us;
            copy_at[k] = r.copy_us;
            pct_at[k] = r.pct_copy;
            if (!vr.target) continue;
            int ri = rk == RoutingKind::kPlain ? 0 : 1;
            if (none == 0.0 && T >= 32) {
              min_pct[ri] = std::min(min_pct[ri], r.pct_copy);
              max_xc_large[ri] = std::max(max_xc_large[ri], r.us / r.copy_us);
            }
            if (none == 0.0 && T <= 8) {
              max_x[ri] = std::max(max_x[ri], r.us / r.floor_us);
              max_xl[ri] = std::max(max_xl[ri], r.us / std::max(r.floor_us, empty_us));
              max_xc_small[ri] = std::max(max_xc_small[ri], r.us / r.copy_us);
            }
          }
      for (int ri = 0; ri < 2; ++ri) {
        const char* rn = ri ? "aligned" : "plain";
        if (!quick) {
          bool ok = min_pct[ri] >= 75;
          miss += ok ? 0 : 1;
          std::snprintf(
              line, sizeof line,
              "SUMMARY lora %s %s %s T>=32: min %.1f%% of copy bandwidth (target >=75%%) %s; "
              "max %.2fx a copy of the same bytes",
              op_name(op), sh.name.c_str(), rn, min_pct[ri], ok ? "MET" : "MISSED",
              max_xc_large[ri]);
          summary.push_back(line);
        }
        bool ok = max_x[ri] <= 2;
        miss += ok ? 0 : 1;
        std::snprintf(line, sizeof line,
                      "SUMMARY lora %s %s %s T<=8: max %.2fx the floor (target <=2x) %s; "
                      "%.2fx max(floor, empty launch %.2f us); %.2fx a copy of the same bytes",
                      op_name(op), sh.name.c_str(), rn, max_x[ri], ok ? "MET" : "MISSED",
                      max_xl[ri], empty_us, max_xc_small[ri]);
        summary.push_back(line);
        const std::string k0 = key(op, sh, 64, 0.0, rn), k50 = key(op, sh, 64, 0.5, rn);
        double ratio = t_at[k50] / t_at[k0];
        // The same ratio for copies of the two rows' bytes: what the bytes alone allow (a
        // copy's rate falls with its size, so the ratio of copy times sits above the bytes').
        const double c0 = copy_at[k0];
        const double copy_ratio = c0 > 0 ? copy_at[k50] / c0 : 0.0;
        ok = ratio <= 0.6;
        miss += ok ? 0 : 1;
        std::snprintf(line, sizeof line,
                      "SUMMARY lora %s %s %s T=64 50%% no-adapter: %.2f of all-adapter time "
                      "(target <=0.60) %s; a copy of the same bytes %.2f",
                      op_name(op), sh.name.c_str(), rn, ratio, ok ? "MET" : "MISSED", copy_ratio);
        summary.push_back(line);
      }
      {
        std::snprintf(line, sizeof line,
                      "SUMMARY lora %s %s T=64 routing: plain %.2f us, aligned %.2f us (the "
                      "planner's kernel; grid %.2f us, stream %.2f us; aligned excludes the align "
                      "kernel)",
                      op_name(op), sh.name.c_str(), t_at[key(op, sh, 64, 0.0, "plain")],
                      t_at[key(op, sh, 64, 0.0, "aligned")], t_at[key(op, sh, 64, 0.0, "al-grid")],
                      t_at[key(op, sh, 64, 0.0, "al-strm")]);
        summary.push_back(line);
      }
      if (!quick) {  // a caller holding plain routing: the plain kernel, or align + aligned
        std::string per_t;
        int from_t = 0;  // the smallest T from which align + aligned is faster at every T
        double min_pct_al = 1e9;
        for (int T : Ts) {
          const std::string kl = key(op, sh, T, 0.0, "al+align");
          const double up = t_at[key(op, sh, T, 0.0, "plain")], ul = t_at[kl],
                       us = t_at[key(op, sh, T, 0.0, "pl-strm")];
          char cell[96];
          std::snprintf(cell, sizeof cell, "%sT=%d %.2f / %.2f / %.2f", per_t.empty() ? "" : ", ",
                        T, up, ul, us);
          per_t += cell;
          if (ul < up && from_t == 0) from_t = T;
          if (ul >= up) from_t = 0;
          if (T >= 32) min_pct_al = std::min(min_pct_al, pct_at[kl]);
        }
        std::snprintf(line, sizeof line,
                      "SUMMARY lora %s %s plain routing's caller, us, the plain kernel (planner) / "
                      "align kernel + aligned call / plain on the stream kernel: %s; align + "
                      "aligned faster than the plain kernel from T=%s; T>=32 min "
                      "%.1f%% of copy bandwidth (the lora call's bytes; not a target line)",
                      op_name(op), sh.name.c_str(), per_t.c_str(),
                      from_t ? std::to_string(from_t).c_str() : "(none)", min_pct_al);
        summary.push_back(line);
      }
    }
  // The pair of one layer (shrink -> expand, N = K, aligned): the two calls against one
  // moe_delta, in the same run.
  if (!quick)
    for (const Shape& sh : seed_shapes())
      for (int T : {1, 8, 32, 64}) {
        Result rc, rd;
        Case c;
        c.op = Op::kShrink, c.shape = sh, c.T = T, c.routing = RoutingKind::kAligned;
        c.chain = true;
        MOLORA_RETURN_IF_ERROR(run_case(c, copy, &rc));
        c.delta = true;
        MOLORA_RETURN_IF_ERROR(run_case(c, copy, &rd));
        const std::string ks = key(Op::kShrink, sh, T, 0.0, "aligned"),
                          ke = key(Op::kExpand, sh, T, 0.0, "aligned");
        const double alone = t_at.count(ks) && t_at.count(ke) ? t_at[ks] + t_at[ke] : 0.0;
        std::snprintf(line, sizeof line,
                      "SUMMARY lora pair %s T=%d: shrink then expand %.2f us, moe_delta %.2f us "
                      "(%.3fx; expand %s), the two ops timed alone %.2f us; floor %.2f us",
                      sh.name.c_str(), T, rc.us, rd.us, rd.us / rc.us,
                      rd.plan_expand.early_inputs ? "early" : "not early", alone, rd.floor_us);
        summary.push_back(line);
      }
  os << "copy bandwidth (device-to-device, read+write): " << copy << " GB/s\n";
  os << "empty launch (graph replay, one CTA per SM x 384 threads): " << empty_us << " us\n";
  os << "weights: the timed calls cycle through w copies (plan column), one per rotating "
        "routing, so a call's weights come from HBM, not from an earlier call in L2\n";
  if (detail::stream_trace_built())  // (its null tests cost the stream kernels ~100 instructions)
    os << "NOTE: this build's stream kernels carry the timeline probe (-DMOLORA_LORA_TRACE=ON): "
          "time a build without it\n";
  os << "\n";
  for (auto& r : rows) os << r << "\n";
  os << "\n";
  for (auto& s : summary) os << s << "\n";
  if (missed) *missed = miss;
  return Status::Ok();
}

Status tune(const std::string& path, std::ostream& log) {
  double copy = 0;
  MOLORA_RETURN_IF_ERROR(measure_copy_gbps(&copy));
  log << "copy bandwidth " << copy << " GB/s\n";
  nlohmann::json entries = nlohmann::json::array();
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  MOLORA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  for (Op op : {Op::kExpand, Op::kShrink})
    for (const Shape& sh : seed_shapes())
      for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned})
        for (int T : tune_token_counts()) {
          // The grid kernel: the heuristic's tile, then tile x unroll.
          std::vector<int> tiles = op == Op::kShrink
                                       ? std::vector<int>{1, 2, 4, 8, 16, 32}
                                       : std::vector<int>{64, 128, 256, 512, 1024, 2048, 4096};
          TuneBucket tb;
          tb.op = op, tb.shape = sh, tb.routing = rk, tb.T = T;
          Case c;
          c.op = op, c.shape = sh, c.T = T, c.routing = rk, c.config_path = "none";
          tb.k = c.k;
          c.kernel = "grid";
          Result r;
          MOLORA_RETURN_IF_ERROR(run_case(c, copy, &r));
          tb.heur_us = r.us, tb.heur_tile = r.plan.tile, tb.heur_unroll = r.plan.unroll;
          tb.best_us = 1e30;
          for (int tile : tiles)
            for (int unroll : {4, 8}) {
              if (op == Op::kShrink && tile > sh.r) continue;
              if (op == Op::kExpand && tile > sh.dim) continue;
              c.force_tile = tile, c.force_unroll = unroll;
              MOLORA_RETURN_IF_ERROR(run_case(c, copy, &r));
              log << "  " << op_name(op) << " " << sh.name << " " << routing_name(rk) << " T=" << T
                  << " tile=" << tile << " unroll=" << unroll << ": " << r.us << " us ("
                  << r.pct_copy << "% copy)\n";
              if (r.us < tb.best_us)
                tb.best_us = r.us, tb.best_tile = tile, tb.best_unroll = unroll;
            }
          // The stream kernel, where the routing allows it (aligned blocks <= 32 pairs; plain
          // up to kStreamPlainPairs pairs): its own tile.
          Problem pb;
          pb.op = op, pb.num_tokens = T, pb.top_k = c.k, pb.num_slots = sh.S;
          pb.num_experts = sh.E, pb.r_max = sh.r, pb.routing = rk, pb.block_size = c.block;
          if (detail::stream_routing_ok(pb)) {
            c.kernel = "stream", c.force_tile = 0, c.force_unroll = 0;
            MOLORA_RETURN_IF_ERROR(run_case(c, copy, &r));
            tb.stream = true, tb.stream_us = r.us, tb.stream_tile = r.plan.tile;
          }
          for (nlohmann::json& e : tune_entries(tb)) entries.push_back(std::move(e));
          const bool keep = tune_keeps_best(tb);
          log << "TUNE " << op_name(op) << " " << sh.name << " " << routing_name(rk) << " T=" << T
              << ": heuristic tile=" << tb.heur_tile << " unroll=" << tb.heur_unroll << " "
              << tb.heur_us << " us, best tile=" << tb.best_tile << " unroll=" << tb.best_unroll
              << " " << tb.best_us << " us" << (keep ? " (kept)" : " (heuristic kept)");
          if (tb.stream)
            log << "; stream " << tb.stream_us << " us (faster: "
                << (tb.stream_us < (keep ? tb.best_us : tb.heur_us) ? "stream" : "grid") << ")";
          log << "\n";
        }
  nlohmann::json doc = {{"gpu", prop.name},
                        {"copy_gbps", copy},
                        {"generator", "molora bench lora --tune"},
                        {"entries", entries}};
  std::ofstream f(path);
  if (!f) return Status::IoError("cannot write " + path);
  f << doc.dump(1) << "\n";
  log << "wrote " << entries.size() << " entries to " << path << "\n";
  return Status::Ok();
}

#endif

}  // namespace molora::lora::bench
