// CPU reference of the lora part: the specification every kernel is compared against.
// Simple loops in fp64; t is rounded to the storage dtype exactly as the kernels round it.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lora/lora_internal.h"

namespace molora::lora {

const char* op_name(Op op) noexcept { return op == Op::kShrink ? "shrink" : "expand"; }
const char* routing_name(RoutingKind r) noexcept {
  return r == RoutingKind::kPlain ? "plain" : "aligned";
}

namespace detail {

float half_to_float(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    f = man ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -f : f;
}

uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (a < 0x38800000u) {                                               // subnormal or zero
    float af;
    std::memcpy(&af, &a, 4);
    float m = std::nearbyint(af * 16777216.0f);  // units of 2^-24, ties to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

}  // namespace detail

Status validate_problem(const Problem& pb) {
  if (pb.dtype != DType::kBF16 && pb.dtype != DType::kF16 && pb.dtype != DType::kF32)
    return Status::InvalidArgument(std::string("dtype must be bf16, f16 or f32, got ") +
                                   dtype_name(pb.dtype));
  if (pb.num_tokens < 0) return Status::InvalidArgument("num_tokens must be >= 0");
  if (pb.top_k < 1 || pb.top_k > 64) return Status::InvalidArgument("top_k must be in [1, 64]");
  // (num_tokens first: the product of a huge num_tokens and top_k would overflow)
  if (pb.num_tokens > 65536 || pb.num_tokens * pb.top_k > 65536)
    return Status::OutOfRange("num_tokens * top_k must be <= 65536, got " +
                              std::to_string(pb.num_tokens) + " * " + std::to_string(pb.top_k));
  if (pb.num_slots < 1) return Status::InvalidArgument("num_slots must be >= 1");
  if (pb.num_experts < 1) return Status::InvalidArgument("num_experts must be >= 1");
  if (static_cast<int64_t>(pb.num_slots) * pb.num_experts > (1 << 24))
    return Status::OutOfRange("num_slots * num_experts must be <= 16777216");
  if (pb.r_max != 8 && pb.r_max != 16 && pb.r_max != 32 && pb.r_max != 64 && pb.r_max != 128)
    return Status::InvalidArgument("r_max must be 8, 16, 32, 64 or 128, got " +
                                   std::to_string(pb.r_max));
  const char* dn = pb.op == Op::kShrink ? "K" : "N";
  int64_t dim = pb.op == Op::kShrink ? pb.K : pb.N;
  int64_t other = pb.op == Op::kShrink ? pb.N : pb.K;
  if (other != 0)
    return Status::InvalidArgument(pb.op == Op::kShrink
                                       ? "shrink takes K (input features); N must be 0"
                                       : "expand takes N (output features); K must be 0");
  if (dim <= 0 || dim % 8 != 0 || dim > 16384)
    return Status::InvalidArgument(std::string(dn) +
                                   " must be a positive multiple of 8 up to 16384, got " +
                                   std::to_string(dim));
  if (pb.routing == RoutingKind::kAligned) {
    if (pb.block_size < 1 || pb.block_size > 1024)
      return Status::InvalidArgument("block_size must be in [1, 1024], got " +
                                     std::to_string(pb.block_size));
    if (pb.sorted_len < 0) return Status::InvalidArgument("sorted_len must be >= 0");
    // The longest align output (65536 pairs, every virtual expert padded by block_size - 1);
    // it also keeps the planner's block counts far from overflow.
    const int64_t max_len = 65536 + static_cast<int64_t>(pb.num_slots) * pb.num_experts *
                                        (static_cast<int64_t>(pb.block_size) - 1);
    if (pb.sorted_len > max_len)
      return Status::OutOfRange(
          "sorted_len must be <= 65536 + num_slots * num_experts * (block_size - 1) = " +
          std::to_string(max_len) + ", got " + std::to_string(pb.sorted_len));
  }
  return Status::Ok();
}

namespace {

struct Pair {
  int64_t p;
  int s, e;
};

// Validates the routing ids and lists the active pairs (slot >= 0) in a fixed order.
Status active_pairs(const Problem& pb, const Routing& rt, std::vector<Pair>* out) {
  const int64_t P = pb.num_tokens * pb.top_k;
  const int S = pb.num_slots, E = pb.num_experts;
  out->clear();
  if (pb.routing == RoutingKind::kPlain) {
    if (P > 0 && (rt.topk_ids == nullptr || rt.slot_ids == nullptr))
      return Status::InvalidArgument("topk_ids and slot_ids are required for plain routing");
    for (int64_t t = 0; t < pb.num_tokens; ++t) {
      int s = rt.slot_ids[t];
      if (s < -1 || s >= S)
        return Status::InvalidArgument("slot_ids[" + std::to_string(t) +
                                       "] = " + std::to_string(s) + " is outside [-1, " +
                                       std::to_string(S) + ")");
      for (int j = 0; j < pb.top_k; ++j) {
        int e = rt.topk_ids[t * pb.top_k + j];
        if (e < 0 || e >= E)
          return Status::InvalidArgument("topk_ids[" + std::to_string(t) + "][" +
                                         std::to_string(j) + "] = " + std::to_string(e) +
                                         " is outside [0, " + std::to_string(E) + ")");
        if (s >= 0) out->push_back({t * pb.top_k + j, s, e});
      }
    }
    return Status::Ok();
  }
  if (rt.sorted_token_ids == nullptr || rt.expert_ids == nullptr ||
      rt.num_tokens_post_pad == nullptr)
    return Status::InvalidArgument(
        "sorted_token_ids, expert_ids and num_tokens_post_pad are required for aligned routing");
  const int64_t B = pb.block_size, L = pb.sorted_len;
  int64_t used = rt.num_tokens_post_pad[0];
  if (used < 0 || used > L || used % B != 0)
    return Status::InvalidArgument("num_tokens_post_pad = " + std::to_string(used) +
                                   " must be a multiple of block_size in [0, sorted_len]");
  std::vector<char> seen(static_cast<size_t>(P), 0);
  const int64_t V = static_cast<int64_t>(S) * E;
  for (int64_t g = 0; g < used / B; ++g) {
    int v = rt.expert_ids[g];
    if (v == -1) continue;
    if (v < 0 || v >= V)
      return Status::InvalidArgument("expert_ids[" + std::to_string(g) +
                                     "] = " + std::to_string(v) + " is outside [-1, S*E)");
    for (int64_t i = g * B; i < (g + 1) * B; ++i) {
      int64_t p = rt.sorted_token_ids[i];
      if (p == P) continue;  // sentinel
      if (p < 0 || p > P)
        return Status::InvalidArgument("sorted_token_ids[" + std::to_string(i) + "] = " +
                                       std::to_string(p) + " is outside [0, num_tokens*top_k]");
      if (seen[p])
        return Status::InvalidArgument("sorted_token_ids lists pair " + std::to_string(p) +
                                       " twice");
      seen[p] = 1;
      out->push_back({p, v / E, v % E});
    }
  }
  return Status::Ok();
}

Status check_ranks(const Problem& pb, const int32_t* ranks) {
  if (ranks == nullptr) return Status::InvalidArgument("ranks is required (int32 [num_slots])");
  for (int s = 0; s < pb.num_slots; ++s)
    if (ranks[s] < 0 || ranks[s] > pb.r_max)
      return Status::InvalidArgument("ranks[" + std::to_string(s) +
                                     "] = " + std::to_string(ranks[s]) +
                                     " is outside [0, r_max=" + std::to_string(pb.r_max) + "]");
  return Status::Ok();
}

}  // namespace

Status shrink_cpu(const Problem& pb, const void* x, const void* A, const int32_t* ranks,
                  const Routing& rt, void* t) {
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  if (pb.op != Op::kShrink) return Status::InvalidArgument("problem.op must be shrink");
  MOLORA_RETURN_IF_ERROR(check_ranks(pb, ranks));
  std::vector<Pair> pairs;
  MOLORA_RETURN_IF_ERROR(active_pairs(pb, rt, &pairs));
  if (!pairs.empty() && (x == nullptr || A == nullptr || t == nullptr))
    return Status::InvalidArgument("x, A and t must not be null");
  const int64_t K = pb.K, R = pb.r_max;
  for (const Pair& q : pairs) {
    const int64_t tok = q.p / pb.top_k;
    const int64_t wbase = (static_cast<int64_t>(q.s) * pb.num_experts + q.e) * R * K;
    for (int r = 0; r < ranks[q.s]; ++r) {
      double acc = 0;
      for (int64_t kk = 0; kk < K; ++kk)
        acc +=
            detail::load(A, pb.dtype, wbase + r * K + kk) * detail::load(x, pb.dtype, tok * K + kk);
      detail::store(t, pb.dtype, q.p * R + r, acc);
    }
  }
  return Status::Ok();
}

Status expand_cpu(const Problem& pb, const void* t, const void* B, const int32_t* ranks,
                  const float* scales, const Routing& rt, void* y) {
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  if (pb.op != Op::kExpand) return Status::InvalidArgument("problem.op must be expand");
  MOLORA_RETURN_IF_ERROR(check_ranks(pb, ranks));
  if (scales == nullptr) return Status::InvalidArgument("scales is required (f32 [num_slots])");
  std::vector<Pair> pairs;
  MOLORA_RETURN_IF_ERROR(active_pairs(pb, rt, &pairs));
  if (!pairs.empty() && (t == nullptr || B == nullptr || y == nullptr))
    return Status::InvalidArgument("t, B and y must not be null");
  const int64_t N = pb.N, R = pb.r_max;
  for (const Pair& q : pairs) {
    const int64_t wbase = (static_cast<int64_t>(q.s) * pb.num_experts + q.e) * N * R;
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int r = 0; r < ranks[q.s]; ++r)
        acc +=
            detail::load(B, pb.dtype, wbase + n * R + r) * detail::load(t, pb.dtype, q.p * R + r);
      double old = detail::load(y, pb.dtype, q.p * N + n);
      detail::store(y, pb.dtype, q.p * N + n, old + static_cast<double>(scales[q.s]) * acc);
    }
  }
  return Status::Ok();
}

Status detail::validate_delta(const char* who, const Problem& pb, int64_t N) {
  if (pb.op != Op::kShrink)
    return Status::InvalidArgument(std::string(who) +
                                   " takes the shrink's problem (op shrink, K set)");
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  return validate_problem(delta_expand_problem(pb, N));
}

Status moe_delta_cpu(const Problem& pb, int64_t N, const void* x, const void* A, const void* B,
                     const int32_t* ranks, const float* scales, const Routing& rt, void* t,
                     void* y) {
  // Everything the two calls check, before the first writes t.
  MOLORA_RETURN_IF_ERROR(detail::validate_delta("moe_delta", pb, N));
  const Problem pbe = delta_expand_problem(pb, N);
  if (scales == nullptr) return Status::InvalidArgument("scales is required (f32 [num_slots])");
  if (pb.num_tokens > 0 && (B == nullptr || y == nullptr))
    return Status::InvalidArgument("B and y must not be null");
  if (t != nullptr && t == y) return Status::InvalidArgument("t and y must be different buffers");
  MOLORA_RETURN_IF_ERROR(shrink_cpu(pb, x, A, ranks, rt, t));
  return expand_cpu(pbe, t, B, ranks, scales, rt, y);
}

}  // namespace molora::lora
