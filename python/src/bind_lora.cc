// lora bindings: lora_plan, lora_shrink, lora_expand. Validation and conversion only; CPU arrays
// run the reference, CUDA arrays the kernels.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "binding.h"
#include "molora/lora.h"

namespace molora::py {
namespace {

using lora::Op;
using lora::RoutingKind;
using Opt = std::optional<nb::ndarray<>>;

Op parse_op(const std::string& s) {
  if (s == "shrink") return Op::kShrink;
  if (s == "expand") return Op::kExpand;
  throw nb::value_error(("op must be 'shrink', 'expand' or 'delta', got '" + s + "'").c_str());
}
DType parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "f16" || s == "float16") return DType::kF16;
  if (s == "f32" || s == "float32") return DType::kF32;
  throw nb::type_error(("dtype must be bf16, f16 or f32, got '" + s + "'").c_str());
}

struct Operand {
  const nb::ndarray<>& a;
  const char* name;
  std::optional<DType> dtype;  // nullopt: the dtype of the reference operand
  int ndim;
};

// The checks every operand of a call gets, in one place: dtype (`ref_dt`, the reference's, for
// data operands), rank, contiguity and the reference's device. Errors name the operand.
void check_operands(const nb::ndarray<>& ref, const char* refn, DType ref_dt,
                    std::initializer_list<Operand> ops) {
  for (const Operand& o : ops) {
    const DType want = o.dtype.value_or(ref_dt);
    const DType got = dtype_of(o.a, o.name);
    if (got != want)
      throw nb::type_error((std::string(o.name) + " must have dtype " + dtype_name(want) +
                            (o.dtype ? std::string() : std::string(" (that of ") + refn + ")") +
                            ", got " + dtype_name(got))
                               .c_str());
    check_array(o.a, o.name, {want}, o.ndim);
    check_same_device(ref, refn, o.a, o.name);
  }
}

// Routing arrays: checks and fills Problem routing fields and the Routing pointers.
void routing_of(lora::Problem& pb, lora::Routing& rt, const nb::ndarray<>& ref, const char* refn,
                const Opt& topk, const Opt& slot, const Opt& sorted, const Opt& eids,
                const Opt& ntpp, int block_size, int top_k) {
  const bool plain = topk.has_value() || slot.has_value();
  const bool aligned = sorted.has_value() || eids.has_value() || ntpp.has_value();
  if (plain == aligned)
    throw nb::value_error(
        "pass either topk_ids and slot_ids (plain) or sorted_token_ids, expert_ids and "
        "num_tokens_post_pad (aligned)");
  if (plain) {
    if (!topk || !slot) throw nb::value_error("plain routing needs both topk_ids and slot_ids");
    check_operands(ref, refn, DType::kI32,
                   {{*topk, "topk_ids", DType::kI32, 2}, {*slot, "slot_ids", DType::kI32, 1}});
    check_dim(*topk, "topk_ids", 0, pb.num_tokens, "num_tokens");
    check_dim(*slot, "slot_ids", 0, pb.num_tokens, "num_tokens");
    pb.top_k = static_cast<int>(topk->shape(1));
    if (top_k > 0 && top_k != pb.top_k)
      throw nb::value_error("top_k does not match topk_ids.shape[1]");
    pb.routing = RoutingKind::kPlain;
    rt.topk_ids = static_cast<const int32_t*>(topk->data());
    rt.slot_ids = static_cast<const int32_t*>(slot->data());
    return;
  }
  if (!sorted || !eids || !ntpp)
    throw nb::value_error(
        "aligned routing needs sorted_token_ids, expert_ids and num_tokens_post_pad");
  if (block_size <= 0) throw nb::value_error("block_size is required for aligned routing");
  if (top_k <= 0) throw nb::value_error("top_k is required for aligned routing");
  check_operands(ref, refn, DType::kI32,
                 {{*sorted, "sorted_token_ids", DType::kI32, 1},
                  {*eids, "expert_ids", DType::kI32, 1},
                  {*ntpp, "num_tokens_post_pad", DType::kI32, 1}});
  pb.routing = RoutingKind::kAligned;
  pb.top_k = top_k;
  pb.block_size = block_size;
  pb.sorted_len = static_cast<int64_t>(sorted->shape(0));
  check_dim(*eids, "expert_ids", 0, cdiv(pb.sorted_len, block_size),
            "cdiv(len(sorted_token_ids), block_size)");
  check_dim(*ntpp, "num_tokens_post_pad", 0, 1, "one value");
  rt.sorted_token_ids = static_cast<const int32_t*>(sorted->data());
  rt.expert_ids = static_cast<const int32_t*>(eids->data());
  rt.num_tokens_post_pad = static_cast<const int32_t*>(ntpp->data());
}

// The shrink side of a call (lora_shrink, lora_moe_delta), checked: x [T, K] (its dtype is the
// call's), A [S, E, r_max, K], ranks int32 [S], t [T*k, r_max] and the routing. Fills pb (op
// shrink) and rt; returns the dtype.
DType shrink_side(lora::Problem& pb, lora::Routing& rt, const nb::ndarray<>& x,
                  const nb::ndarray<>& A, const nb::ndarray<>& ranks, const nb::ndarray<>& t,
                  const Opt& topk, const Opt& slot, const Opt& sorted, const Opt& eids,
                  const Opt& ntpp, int block_size, int top_k) {
  const DType dt = check_array(x, "x", {DType::kBF16, DType::kF16, DType::kF32}, 2);
  check_operands(
      x, "x", dt,
      {{A, "A", std::nullopt, 4}, {t, "t", std::nullopt, 2}, {ranks, "ranks", DType::kI32, 1}});
  pb.op = Op::kShrink;
  pb.dtype = dt;
  pb.num_tokens = static_cast<int64_t>(x.shape(0));
  pb.K = static_cast<int64_t>(x.shape(1));
  pb.num_slots = static_cast<int>(A.shape(0));
  pb.num_experts = static_cast<int>(A.shape(1));
  pb.r_max = static_cast<int>(A.shape(2));
  check_dim(A, "A", 3, pb.K, "K = x.shape[1]");
  check_dim(ranks, "ranks", 0, pb.num_slots, "num_slots = A.shape[0]");
  routing_of(pb, rt, x, "x", topk, slot, sorted, eids, ntpp, block_size, top_k);
  check_dim(t, "t", 0, pb.num_tokens * pb.top_k, "num_tokens * top_k");
  check_dim(t, "t", 1, pb.r_max, "r_max = A.shape[2]");
  return dt;
}

Binder bind_lora([](nb::module_& m) {
  m.def(
      "lora_plan",
      [](const std::string& op, const std::string& dtype, int64_t num_tokens, int top_k,
         int num_slots, int num_experts, int r_max, int64_t K, int64_t N,
         const std::string& routing, int block_size, int64_t sorted_len, int64_t active_pairs,
         int64_t active_tokens, int64_t distinct_pairs, int64_t distinct_rank8,
         int64_t active_rank8, double bandwidth_gbps, int sm_count, const std::string& config,
         int force_tile, int force_unroll, const std::string& kernel) {
        // "delta": moe_delta's two plans (the shrink's problem with K, the expand's N).
        const bool delta = op == "delta";
        lora::Problem pb;
        pb.op = delta ? Op::kShrink : parse_op(op);
        pb.dtype = parse_dtype(dtype);
        pb.num_tokens = num_tokens;
        pb.top_k = top_k;
        pb.num_slots = num_slots;
        pb.num_experts = num_experts;
        pb.r_max = r_max;
        pb.K = K;
        pb.N = delta ? 0 : N;
        if (routing != "plain" && routing != "aligned")
          throw nb::value_error("routing must be 'plain' or 'aligned'");
        pb.routing = routing == "plain" ? RoutingKind::kPlain : RoutingKind::kAligned;
        pb.block_size = block_size;
        pb.sorted_len = sorted_len;
        lora::RoutingStats st{active_pairs, active_tokens, distinct_pairs, distinct_rank8,
                              active_rank8};
        lora::PlanOptions o;
        if (distinct_rank8 >= 0) o.stats = &st;
        o.bandwidth_gbps = bandwidth_gbps;
        o.sm_count = sm_count;
        o.config_path = config;
        o.force_tile = force_tile;
        o.force_unroll = force_unroll;
        o.kernel = kernel;
        if (delta) {
          lora::DeltaPlan dp;
          throw_if_error(lora::plan_delta(pb, N, &dp, o));
          return dp.to_json();
        }
        lora::Plan pl;
        throw_if_error(lora::plan(pb, &pl, o));
        return pl.to_json();
      },
      nb::arg("op"), nb::arg("dtype"), nb::arg("num_tokens"), nb::arg("top_k"),
      nb::arg("num_slots"), nb::arg("num_experts"), nb::arg("r_max"), nb::arg("K"), nb::arg("N"),
      nb::arg("routing"), nb::arg("block_size"), nb::arg("sorted_len"), nb::arg("active_pairs"),
      nb::arg("active_tokens"), nb::arg("distinct_pairs"), nb::arg("distinct_rank8"),
      nb::arg("active_rank8"), nb::arg("bandwidth_gbps"), nb::arg("sm_count"),
      nb::arg("config_path"), nb::arg("force_tile"), nb::arg("force_unroll"), nb::arg("kernel"),
      "Plan of one lora call as JSON (see molora.lora_plan).");

  m.def(
      "lora_shrink",
      [](nb::ndarray<> x, nb::ndarray<> A, nb::ndarray<> ranks, Opt topk, Opt slot, Opt sorted,
         Opt eids, Opt ntpp, int block_size, int top_k, nb::ndarray<> t, uintptr_t stream) {
        lora::Problem pb;
        lora::Routing rt;
        shrink_side(pb, rt, x, A, ranks, t, topk, slot, sorted, eids, ntpp, block_size, top_k);
        const int32_t* rk = static_cast<const int32_t*>(ranks.data());
        if (is_cuda(x, "x")) {
          throw_if_error(
              lora::shrink(pb, nullptr, x.data(), A.data(), rk, rt, t.data(), as_stream(stream)));
        } else {
          nb::gil_scoped_release nogil;
          throw_if_error(lora::shrink_cpu(pb, x.data(), A.data(), rk, rt, t.data()));
        }
      },
      nb::arg("x"), nb::arg("A"), nb::arg("ranks"), nb::arg("topk_ids").none(),
      nb::arg("slot_ids").none(), nb::arg("sorted_token_ids").none(), nb::arg("expert_ids").none(),
      nb::arg("num_tokens_post_pad").none(), nb::arg("block_size"), nb::arg("top_k"), nb::arg("t"),
      nb::arg("stream"), "t[p, :r_s] = A[s, e, :r_s] @ x[token(p)] (see molora.lora_shrink).");

  m.def(
      "lora_expand",
      [](nb::ndarray<> t, nb::ndarray<> B, nb::ndarray<> ranks, nb::ndarray<> scales, Opt topk,
         Opt slot, Opt sorted, Opt eids, Opt ntpp, int block_size, int top_k, nb::ndarray<> y,
         uintptr_t stream) {
        const DType dt = check_array(t, "t", {DType::kBF16, DType::kF16, DType::kF32}, 2);
        check_operands(t, "t", dt,
                       {{B, "B", std::nullopt, 4},
                        {y, "y", std::nullopt, 2},
                        {ranks, "ranks", DType::kI32, 1},
                        {scales, "scales", DType::kF32, 1}});
        lora::Problem pb;
        pb.op = Op::kExpand;
        pb.dtype = dt;
        pb.num_slots = static_cast<int>(B.shape(0));
        pb.num_experts = static_cast<int>(B.shape(1));
        pb.N = static_cast<int64_t>(B.shape(2));
        pb.r_max = static_cast<int>(B.shape(3));
        check_dim(ranks, "ranks", 0, pb.num_slots, "num_slots = B.shape[0]");
        check_dim(scales, "scales", 0, pb.num_slots, "num_slots = B.shape[0]");
        check_dim(t, "t", 1, pb.r_max, "r_max = B.shape[3]");
        // T from the routing: topk_ids rows (plain) or t rows / top_k (aligned).
        if (topk) {
          pb.num_tokens = static_cast<int64_t>(topk->shape(0));
        } else {
          if (top_k <= 0) throw nb::value_error("top_k is required for aligned routing");
          if (t.shape(0) % top_k != 0)
            throw nb::value_error("t.shape[0] must be a multiple of top_k");
          pb.num_tokens = static_cast<int64_t>(t.shape(0)) / top_k;
        }
        lora::Routing rt;
        routing_of(pb, rt, t, "t", topk, slot, sorted, eids, ntpp, block_size, top_k);
        check_dim(t, "t", 0, pb.num_tokens * pb.top_k, "num_tokens * top_k");
        check_dim(y, "y", 0, pb.num_tokens * pb.top_k, "num_tokens * top_k");
        check_dim(y, "y", 1, pb.N, "N = B.shape[2]");
        const int32_t* rk = static_cast<const int32_t*>(ranks.data());
        const float* sc = static_cast<const float*>(scales.data());
        if (is_cuda(t, "t")) {
          throw_if_error(lora::expand(pb, nullptr, t.data(), B.data(), rk, sc, rt, y.data(),
                                      as_stream(stream)));
        } else {
          nb::gil_scoped_release nogil;
          throw_if_error(lora::expand_cpu(pb, t.data(), B.data(), rk, sc, rt, y.data()));
        }
      },
      nb::arg("t"), nb::arg("B"), nb::arg("ranks"), nb::arg("scales"), nb::arg("topk_ids").none(),
      nb::arg("slot_ids").none(), nb::arg("sorted_token_ids").none(), nb::arg("expert_ids").none(),
      nb::arg("num_tokens_post_pad").none(), nb::arg("block_size"), nb::arg("top_k"), nb::arg("y"),
      nb::arg("stream"),
      "y[p] += scale_s * B[s, e, :, :r_s] @ t[p, :r_s] in place (see molora.lora_expand).");

  m.def(
      "lora_moe_delta",
      [](nb::ndarray<> x, nb::ndarray<> A, nb::ndarray<> B, nb::ndarray<> ranks,
         nb::ndarray<> scales, Opt topk, Opt slot, Opt sorted, Opt eids, Opt ntpp, int block_size,
         int top_k, nb::ndarray<> t, nb::ndarray<> y, uintptr_t stream, bool after_delta) {
        lora::Problem pb;
        lora::Routing rt;
        const DType dt =
            shrink_side(pb, rt, x, A, ranks, t, topk, slot, sorted, eids, ntpp, block_size, top_k);
        check_operands(x, "x", dt,
                       {{B, "B", std::nullopt, 4},
                        {y, "y", std::nullopt, 2},
                        {scales, "scales", DType::kF32, 1}});
        check_dim(B, "B", 0, pb.num_slots, "num_slots = A.shape[0]");
        check_dim(B, "B", 1, pb.num_experts, "num_experts = A.shape[1]");
        check_dim(B, "B", 3, pb.r_max, "r_max = A.shape[2]");
        const int64_t N = static_cast<int64_t>(B.shape(2));
        check_dim(scales, "scales", 0, pb.num_slots, "num_slots = A.shape[0]");
        check_dim(y, "y", 0, pb.num_tokens * pb.top_k, "num_tokens * top_k");
        check_dim(y, "y", 1, N, "N = B.shape[2]");
        const int32_t* rk = static_cast<const int32_t*>(ranks.data());
        const float* sc = static_cast<const float*>(scales.data());
        if (is_cuda(x, "x")) {
          throw_if_error(lora::moe_delta(pb, N, nullptr, x.data(), A.data(), B.data(), rk, sc, rt,
                                         t.data(), y.data(), as_stream(stream),
                                         after_delta ? 1 : -1));
        } else {
          nb::gil_scoped_release nogil;
          throw_if_error(lora::moe_delta_cpu(pb, N, x.data(), A.data(), B.data(), rk, sc, rt,
                                             t.data(), y.data()));
        }
      },
      nb::arg("x"), nb::arg("A"), nb::arg("B"), nb::arg("ranks"), nb::arg("scales"),
      nb::arg("topk_ids").none(), nb::arg("slot_ids").none(), nb::arg("sorted_token_ids").none(),
      nb::arg("expert_ids").none(), nb::arg("num_tokens_post_pad").none(), nb::arg("block_size"),
      nb::arg("top_k"), nb::arg("t"), nb::arg("y"), nb::arg("stream"), nb::arg("after_delta"),
      "y[p] += scale_s * B[s, e, :, :r_s] @ (A[s, e, :r_s] @ x[token(p)]), t the workspace (see "
      "molora.lora_moe_delta).");
});

}  // namespace
}  // namespace molora::py
