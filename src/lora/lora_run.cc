// Host entry points of the CUDA path: validation, plan cache, kernel arguments.
#include <map>
#include <mutex>
#include <sstream>

#include "core/cuda_util.h"
#include "lora/lora_internal.h"
#include "molora/settings.h"

namespace molora::lora {
namespace {

#if MOLORA_HAVE_CUDA
// Plans of the calls that pass none, keyed by shape, device and config setting.
// early: PlanOptions::early_inputs of the plan (-1: the setting; moe_delta's expand: 1).
Status cached_plan(const Problem& pb, Plan* out, int early = -1) {
  static std::mutex m;
  static std::map<std::string, Plan> cache;
  int dev = 0;
  cudaGetDevice(&dev);
  std::ostringstream key;
  key << static_cast<int>(pb.op) << ':' << static_cast<int>(pb.dtype) << ':' << pb.num_tokens << ':'
      << pb.top_k << ':' << pb.num_slots << ':' << pb.num_experts << ':' << pb.r_max << ':' << pb.K
      << ':' << pb.N << ':' << static_cast<int>(pb.routing) << ':' << pb.block_size << ':'
      << pb.sorted_len << ':' << dev << ':' << get_setting("MOLORA_LORA_CONFIG") << ':'
      << get_setting("MOLORA_LORA_KERNEL") << ':' << get_setting("MOLORA_LORA_PDL") << ':'
      << get_setting("MOLORA_LORA_EARLY_INPUTS") << ':' << get_setting("MOLORA_LORA_SLOT_CHECK")
      << ':' << early;
  {
    std::lock_guard<std::mutex> lock(m);
    auto it = cache.find(key.str());
    if (it != cache.end()) {
      *out = it->second;
      return Status::Ok();
    }
  }
  PlanOptions o;
  o.early_inputs = early;
  MOLORA_RETURN_IF_ERROR(plan(pb, out, o));
  std::lock_guard<std::mutex> lock(m);
  cache[key.str()] = *out;
  return Status::Ok();
}

Status check_ptrs(const Problem& pb, const Routing& rt, cudaStream_t stream,
                  std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  MOLORA_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
  const bool check = cs == cudaStreamCaptureStatusNone;  // attribute queries stay out of captures
  for (auto& [p, name] : ptrs) {
    if (p == nullptr) return Status::InvalidArgument(std::string(name) + " is null");
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return Status::InvalidArgument(std::string(name) + " must be 16-byte aligned");
    if (check) MOLORA_RETURN_IF_ERROR(check_device_pointer(p, 1, name));
  }
  if (pb.routing == RoutingKind::kPlain) {
    if (!rt.topk_ids || !rt.slot_ids)
      return Status::InvalidArgument("topk_ids and slot_ids are required for plain routing");
    if (check) {
      MOLORA_RETURN_IF_ERROR(check_device_pointer(rt.topk_ids, 1, "topk_ids"));
      MOLORA_RETURN_IF_ERROR(check_device_pointer(rt.slot_ids, 1, "slot_ids"));
    }
  } else {
    if (!rt.sorted_token_ids || !rt.expert_ids || !rt.num_tokens_post_pad)
      return Status::InvalidArgument(
          "sorted_token_ids, expert_ids and num_tokens_post_pad are required for aligned routing");
    if (check) {
      MOLORA_RETURN_IF_ERROR(check_device_pointer(rt.sorted_token_ids, 1, "sorted_token_ids"));
      MOLORA_RETURN_IF_ERROR(check_device_pointer(rt.expert_ids, 1, "expert_ids"));
      MOLORA_RETURN_IF_ERROR(
          check_device_pointer(rt.num_tokens_post_pad, 1, "num_tokens_post_pad"));
    }
  }
  return Status::Ok();
}

// Fills a's sizes from pb and the plan (plan_in, or the cached one in *local) and checks that
// the plan matches the problem; *use is the plan to launch.
Status prepare(const Problem& pb, const Plan* plan_in, Plan* local, detail::KernelArgs* ap,
               const Plan** use, int early = -1) {
  if (pb.dtype != DType::kBF16 && pb.dtype != DType::kF16)
    return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                   dtype_name(pb.dtype));
  if (plan_in == nullptr) {
    MOLORA_RETURN_IF_ERROR(cached_plan(pb, local, early));
    plan_in = local;
  }
  detail::KernelArgs& a = *ap;
  a.T = pb.num_tokens;
  a.P = pb.num_tokens * pb.top_k;
  a.k = pb.top_k;
  a.S = pb.num_slots;
  a.E = pb.num_experts;
  a.r_max = pb.r_max;
  a.dim = pb.op == Op::kShrink ? pb.K : pb.N;
  a.aligned = pb.routing == RoutingKind::kAligned;
  a.block = pb.block_size;
  a.sorted_len = pb.sorted_len;
  a.mode = pb.routing == RoutingKind::kAligned ? detail::kModeAligned
           : plan_in->group_cap > 0            ? detail::kModeGrouped
                                               : detail::kModePairs;
  a.tile = plan_in->tile;
  a.chunks = plan_in->chunks;
  // A plan made for another shape would leave work items without a CTA (or run them wrong):
  // refuse it.
  MOLORA_RETURN_IF_ERROR(detail::check_plan(pb, *plan_in));
  *use = plan_in;
  return Status::Ok();
}

Status launch_prepared(const Problem& pb, const Plan& pl, const detail::KernelArgs& a,
                       cudaStream_t stream) {
  if (a.P == 0 || pl.max_items == 0) return Status::Ok();
  if (pl.kernel == "stream") return detail::launch_stream(pb.op, pb.dtype, a, pl, stream);
  return detail::launch(pb.op, pb.dtype, a, pl, stream);
}

Status run(const Problem& pb, const Plan* plan_in, detail::KernelArgs a, cudaStream_t stream) {
  Plan local;
  const Plan* use = nullptr;
  MOLORA_RETURN_IF_ERROR(prepare(pb, plan_in, &local, &a, &use));
  return launch_prepared(pb, *use, a, stream);
}
#endif

}  // namespace

Status shrink(const Problem& pb, const Plan* plan_in, const void* x, const void* A,
              const int32_t* ranks, const Routing& rt, void* t, cudaStream_t stream) {
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  if (pb.op != Op::kShrink) return Status::InvalidArgument("problem.op must be shrink");
#if MOLORA_HAVE_CUDA
  if (pb.num_tokens == 0) return Status::Ok();
  MOLORA_RETURN_IF_ERROR(
      check_ptrs(pb, rt, stream, {{x, "x"}, {A, "A"}, {ranks, "ranks"}, {t, "t"}}));
  detail::KernelArgs a;
  a.w = A;
  a.in = x;
  a.out = t;
  a.ranks = ranks;
  a.rt = rt;
  return run(pb, plan_in, a, stream);
#else
  (void)plan_in, (void)x, (void)A, (void)ranks, (void)rt, (void)t, (void)stream;
  return Status::Unavailable("molora was built without CUDA");
#endif
}

Status expand(const Problem& pb, const Plan* plan_in, const void* t, const void* B,
              const int32_t* ranks, const float* scales, const Routing& rt, void* y,
              cudaStream_t stream) {
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  if (pb.op != Op::kExpand) return Status::InvalidArgument("problem.op must be expand");
#if MOLORA_HAVE_CUDA
  if (pb.num_tokens == 0) return Status::Ok();
  MOLORA_RETURN_IF_ERROR(check_ptrs(
      pb, rt, stream, {{t, "t"}, {B, "B"}, {ranks, "ranks"}, {scales, "scales"}, {y, "y"}}));
  detail::KernelArgs a;
  a.w = B;
  a.in = t;
  a.out = y;
  a.ranks = ranks;
  a.scales = scales;
  a.rt = rt;
  return run(pb, plan_in, a, stream);
#else
  (void)plan_in, (void)t, (void)B, (void)ranks, (void)scales, (void)rt, (void)y, (void)stream;
  return Status::Unavailable("molora was built without CUDA");
#endif
}

Status moe_delta(const Problem& pb, int64_t N, const DeltaPlan* plan_in, const void* x,
                 const void* A, const void* B, const int32_t* ranks, const float* scales,
                 const Routing& rt, void* t, void* y, cudaStream_t stream, int shrink_early) {
  MOLORA_RETURN_IF_ERROR(detail::validate_delta("moe_delta", pb, N));
  if (shrink_early < -1 || shrink_early > 1)
    return Status::InvalidArgument("moe_delta: shrink_early must be -1, 0 or 1, got " +
                                   std::to_string(shrink_early));
#if MOLORA_HAVE_CUDA
  if (pb.num_tokens == 0) return Status::Ok();
  const Problem pbe = delta_expand_problem(pb, N);
  MOLORA_RETURN_IF_ERROR(check_ptrs(
      pb, rt, stream,
      {{x, "x"}, {A, "A"}, {B, "B"}, {ranks, "ranks"}, {scales, "scales"}, {t, "t"}, {y, "y"}}));
  if (t == y) return Status::InvalidArgument("t and y must be different buffers");
  detail::KernelArgs as, ae;
  as.w = A, as.in = x, as.out = t, as.ranks = ranks, as.rt = rt;
  ae.w = B, ae.in = t, ae.out = y, ae.ranks = ranks, ae.scales = scales, ae.rt = rt;
  // Both plans checked before either kernel runs. The expand's plan: early inputs on (valid
  // after this call's own shrink; see lora.h), unless a plan passed in says otherwise.
  Plan ls, le;
  const Plan *ps = nullptr, *pe = nullptr;
  MOLORA_RETURN_IF_ERROR(
      prepare(pb, plan_in ? &plan_in->shrink : nullptr, &ls, &as, &ps, shrink_early));
  MOLORA_RETURN_IF_ERROR(prepare(pbe, plan_in ? &plan_in->expand : nullptr, &le, &ae, &pe, 1));
  // The expand reads its early inputs once it starts; the shrink lets it launch only after its
  // own wait for the kernel before it, so everything before the shrink has ended by then. Always,
  // so that a delta right after this one may read its shrink's inputs early too (lora.h).
  as.late_trigger = 1;
  MOLORA_RETURN_IF_ERROR(launch_prepared(pb, *ps, as, stream));
  return launch_prepared(pbe, *pe, ae, stream);
#else
  (void)plan_in, (void)x, (void)A, (void)B, (void)ranks, (void)scales, (void)rt, (void)t, (void)y;
  (void)stream;
  return Status::Unavailable("molora was built without CUDA");
#endif
}

}  // namespace molora::lora
