// libFuzzer target: the lora part's host side on adversarial input. Built by
// tests/extra/lora_fuzz.sh with clang -fsanitize=fuzzer,address,undefined and without CUDA.
//
// The bytes pick a Problem (every field from a list of edge values: 0, 1, the limits and one past
// them, negatives, the extremes of the type, or a small value) and the planner's options, then:
//   - validate_problem, plan and plan_delta must return (an error or a plan), never crash or
//     overflow (UBSan aborts on signed overflow); a plan that succeeds has a grid of at least one
//     CTA and no more than its items;
//   - where the Problem is small enough to hold in memory, the CPU references run on arrays of the
//     sizes the contract gives (x [T,K], A [S,E,r_max,K], B [S,E,N,r_max], t [P,r_max], y [P,N],
//     ranks and scales [S], the routing ids), whose contents come from the bytes: ids and ranks
//     out of range, duplicated pairs, num_tokens_post_pad off the block, slot -1. A call that
//     fails must leave its outputs as they were; moe_delta_cpu must give the bits of shrink_cpu
//     then expand_cpu, and fail exactly when one of the two does.
// Inputs whose first byte is 'C' are a tuned-config file instead (the rest of the bytes, written
// to a file the planner is pointed at): whatever the file holds, valid Problems must still plan
// (a bad file or entry is ignored, with a log line), and what they plan must be launchable.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_bytes.h"
#include "lora/lora_internal.h"
#include "molora/lora.h"

namespace {

using molora::DType;
using molora::Status;
using namespace molora::lora;
using namespace molora::fuzz;

void fill(std::vector<uint16_t>& v, Bytes& b) {
  for (auto& e : v) e = static_cast<uint16_t>(b.u8() | (b.u8() << 8));
}

// Plans a few valid Problems of the seed shapes (grid and stream kernels, both ops, both
// routings) against the config file at `path`.
void plan_against_config(const std::string& path) {
  struct Shape {
    Op op;
    RoutingKind rt;
    int64_t T, dim;
    int r_max;
  };
  const Shape shapes[] = {{Op::kShrink, RoutingKind::kPlain, 8, 6144, 32},
                          {Op::kExpand, RoutingKind::kPlain, 1, 6144, 32},
                          {Op::kShrink, RoutingKind::kAligned, 8, 4096, 32},
                          {Op::kExpand, RoutingKind::kAligned, 64, 2048, 16}};
  for (const Shape& sh : shapes) {
    Problem pb;
    pb.op = sh.op;
    pb.dtype = DType::kBF16;
    pb.routing = sh.rt;
    pb.num_tokens = sh.T;
    pb.top_k = 8;
    pb.num_slots = 8;
    pb.num_experts = 160;
    pb.r_max = sh.r_max;
    (sh.op == Op::kShrink ? pb.K : pb.N) = sh.dim;
    if (sh.rt == RoutingKind::kAligned) {
      pb.block_size = 16;
      pb.sorted_len = sh.T * 8 + 1280 * 15;
    }
    PlanOptions o;
    o.config_path = path;
    o.sm_count = 132;
    Plan pl;
    if (!plan(pb, &pl, o).ok()) fail();  // a config file broke a valid call
    if (pl.grid < 1 || pl.grid > pl.max_items || pl.tile < 1) fail();
    // What the kernels' own guard accepts (a tuned kernel choice included: never the stream
    // kernel where the routing does not allow it, never one kernel's tile on the other).
    if (!detail::check_plan(pb, pl).ok()) fail();
    if (pl.kernel_source != "heuristic" && pl.kernel_source != "tuned:" + path) fail();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 'C') {
    static const std::string path = "/tmp/molora_lora_fuzz_" + std::to_string(getpid()) + ".json";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    std::fwrite(data + 1, 1, size - 1, f);
    std::fclose(f);
    plan_against_config(path);
    return 0;
  }
  Bytes b{data, size};
  Problem pb;
  pb.op = (b.u8() & 1) ? Op::kExpand : Op::kShrink;
  pb.dtype = static_cast<DType>(b.u8() % 7);  // f32, f16, bf16; past them not a lora dtype
  pb.routing = (b.u8() & 1) ? RoutingKind::kAligned : RoutingKind::kPlain;
  pb.num_tokens =
      b.pick({0, 1, 65536, 65537, 8192, 8193, kI32Max, int64_t{1} << 62, kI64Max, -1, kI64Min}, 6);
  pb.top_k = static_cast<int>(b.pick({1, 8, 64, 65, 0, -1, kI32Max, kI32Min}, 4));
  pb.num_slots = static_cast<int>(b.pick({1, 65536, 1 << 24, (1 << 24) + 1, 0, -1, kI32Max}, 4));
  pb.num_experts = static_cast<int>(b.pick({1, 256, 1 << 24, 0, -1, kI32Max}, 4));
  pb.r_max = static_cast<int>(b.pick({8, 16, 32, 64, 128, 0, 24, 256, -8, kI32Max}, 0));
  const int64_t dim = b.pick({8, 16384, 16392, 12, 0, -8, kI64Max, kI64Min}, 48, 8);
  const int64_t dim2 = b.pick({0, 8, 16384, 16392, 12, -8, kI64Max}, 0);  // the other one: K or N
  if (pb.op == Op::kShrink)
    pb.K = dim, pb.N = dim2;
  else
    pb.N = dim, pb.K = dim2;
  pb.block_size = static_cast<int>(b.pick({1, 2, 16, 32, 64, 1024, 1025, 0, -1, kI32Max}, 8));
  pb.sorted_len = b.pick({0, 1, kI64Max, -1, int64_t{1} << 40}, 96);
  const int64_t n_delta = b.pick({8, 16384, 16392, 12, 0, -8, kI64Max}, 48, 8);

  // The planner: must return, and a plan it returns must be launchable.
  const Status valid = validate_problem(pb);
  PlanOptions o;
  o.config_path = "none";
  o.sm_count = static_cast<int>(b.pick({0, 1, 132, -1, kI32Max}, 0));
  o.bandwidth_gbps = static_cast<double>(b.pick({0, 1, 4300, -1}, 0));
  o.force_tile = static_cast<int>(b.pick({0, 1, 8, 512, 4096, -1, kI32Max}, 64));
  o.force_unroll = static_cast<int>(b.pick({0, 4, 8, 3, -1}, 0));
  const char* kernels[] = {"", "grid", "stream", "bogus"};
  o.kernel = kernels[b.u8() % 4];
  o.early_inputs = static_cast<int>(b.pick({-1, 0, 1, 2, -2}, 0));
  o.slot_check = static_cast<int>(b.pick({-1, 0, 1, 2, -2}, 0));
  Plan pl;
  const Status ps = plan(pb, &pl, o);
  if (ps.ok()) {
    if (!valid.ok()) fail();  // a plan for a Problem that validation refuses
    if (pl.grid < 1 || (pl.max_items > 0 && pl.grid > pl.max_items)) fail();
    if (!detail::check_plan(pb, pl).ok()) fail();  // the kernels would refuse the planner's plan
    // A plan with one field changed must still be checked: accepted only if it stays launchable
    // by the same rules (the check is the kernels' only guard against a caller's plan).
    Plan q = pl;
    switch (b.u8() % 6) {
      case 0:
        q.tile = static_cast<int>(b.pick({0, 1, 3, 8, 12, 32, 512, -1, kI32Max}, 64));
        break;
      case 1:
        q.unroll = static_cast<int>(b.pick({0, 4, 8, 5}, 0));
        break;
      case 2:
        q.smem_bytes = static_cast<size_t>(b.pick({0, 16, 64, 1 << 20}, 0));
        break;
      case 3:
        q.group_cap = static_cast<int>(b.pick({0, 4096, -1}, 0));
        break;
      case 4:
        q.kernel = (b.u8() & 1) ? "grid" : "stream";
        break;
      default:
        q.grid = static_cast<int>(b.pick({0, -1, 1, kI32Max}, 0));
        break;
    }
    if (detail::check_plan(pb, q).ok()) {
      const bool st = q.kernel == "stream";
      if (!detail::tile_rule_error(pb, st, q.tile, q.unroll).empty() || q.grid < 1 || q.chunks < 1)
        fail();
    }
  }
  if (pb.op == Op::kShrink) {
    DeltaPlan dp;
    (void)plan_delta(pb, n_delta, &dp, o);
  }

  // The CPU references, where the Problem is small enough to hold.
  if (!valid.ok()) return 0;
  const int64_t T = pb.num_tokens, k = pb.top_k, P = T * k, R = pb.r_max;
  const int64_t V = static_cast<int64_t>(pb.num_slots) * pb.num_experts;
  const int64_t K = pb.op == Op::kShrink ? pb.K : 0, N = pb.op == Op::kExpand ? pb.N : n_delta;
  const bool aligned = pb.routing == RoutingKind::kAligned;
  if (T > 6 || V > 64 || R > 32 || (pb.op == Op::kShrink && K > 64) || N > 64 || N < 0 ||
      (aligned && pb.sorted_len > 96))
    return 0;
  const int64_t es = pb.dtype == DType::kF32 ? 2 : 1;  // 16-bit words per element
  std::vector<uint16_t> x(T * K * es + 1), A(V * R * K * es + 1), t(P * R * es + 1),
      Bw(V * N * R * es + 1), y(P * N * es + 1);
  fill(x, b), fill(A, b), fill(Bw, b), fill(t, b), fill(y, b);
  std::vector<int32_t> ranks(pb.num_slots);
  for (auto& r : ranks) r = static_cast<int32_t>(b.pick({0, 8, 16, 32, 33, -1}, R));
  std::vector<float> scales(pb.num_slots);
  for (auto& s : scales) s = static_cast<float>(static_cast<int8_t>(b.u8())) / 16.f;
  std::vector<int32_t> topk(P), slot(T);
  std::vector<int32_t> srt(aligned ? pb.sorted_len : 0);
  const int64_t blocks = aligned ? (pb.sorted_len + pb.block_size - 1) / pb.block_size : 0;
  std::vector<int32_t> eids(blocks);
  int32_t ntpp = 0;
  Routing rt;
  if (aligned) {
    for (auto& s : srt) s = static_cast<int32_t>(b.pick({-1, 0, 1, kI32Max}, P));
    for (auto& e : eids) e = static_cast<int32_t>(b.pick({-1, -2, 0, kI32Max}, V));
    ntpp = static_cast<int32_t>(b.pick({0, -1, 1, kI32Max}, pb.sorted_len));
    rt.sorted_token_ids = srt.data(), rt.expert_ids = eids.data(), rt.num_tokens_post_pad = &ntpp;
  } else {
    for (auto& e : topk) e = static_cast<int32_t>(b.pick({-1, kI32Max}, pb.num_experts));
    for (auto& s : slot) s = static_cast<int32_t>(b.pick({-1, -2, kI32Max}, pb.num_slots));
    rt.topk_ids = topk.data(), rt.slot_ids = slot.data();
  }
  if (pb.op == Op::kExpand) {
    std::vector<uint16_t> y1 = y;
    const Status st =
        expand_cpu(pb, t.data(), Bw.data(), ranks.data(), scales.data(), rt, y1.data());
    if (!st.ok() && y1 != y) fail();  // an error wrote y
    return 0;
  }
  std::vector<uint16_t> t1 = t;
  const Status ss = shrink_cpu(pb, x.data(), A.data(), ranks.data(), rt, t1.data());
  if (!ss.ok() && t1 != t) fail();  // an error wrote t
  // The delta: the bits of the two calls, and an error exactly when one of them fails.
  std::vector<uint16_t> t2 = t, y2 = y;
  const Status sd = moe_delta_cpu(pb, N, x.data(), A.data(), Bw.data(), ranks.data(), scales.data(),
                                  rt, t2.data(), y2.data());
  if (!sd.ok()) {
    if (t2 != t || y2 != y) fail();  // a delta that fails writes nothing
    if (ss.ok() && validate_problem(delta_expand_problem(pb, N)).ok()) fail();
    return 0;
  }
  if (!ss.ok() || t2 != t1) fail();
  std::vector<uint16_t> y1 = y;
  const Status se = expand_cpu(delta_expand_problem(pb, N), t1.data(), Bw.data(), ranks.data(),
                               scales.data(), rt, y1.data());
  if (!se.ok() || y1 != y2) fail();
  return 0;
}
