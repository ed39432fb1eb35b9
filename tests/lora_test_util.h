// Shared helpers of the lora suites: random problems, routing (plain and a CPU-built aligned
// layout of moe_align_block_size's contract), host bf16/fp16 conversion, error metrics.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lora/lora_internal.h"
#include "molora/lora.h"
#include "molora/settings.h"

namespace lora_test {

using molora::DType;
using molora::Status;
using namespace molora::lora;

// Clears the named MOLORA_* settings when it leaves scope: a test that sets them leaves the
// environment's values to the next.
struct SettingsReset {
  std::vector<std::string> names;
  SettingsReset(std::initializer_list<const char*> n) : names(n.begin(), n.end()) {}
  SettingsReset(const SettingsReset&) = delete;
  ~SettingsReset() {
    for (const std::string& n : names) molora::set_setting(n, std::nullopt);
  }
};

inline uint64_t fresh_seed() {
  uint64_t s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("[lora] seed %llu\n", static_cast<unsigned long long>(s));
  return s;
}

// kLast: only the last token has an adapter (the plain grouping's tables see their first round
// of routing loads without a valid key and must still read the second).
enum class SlotMode { kZipf, kAllNone, kOne, kDistinct, kHalfNone, kSparse, kLast };

struct Case {
  Op op = Op::kExpand;
  DType dt = DType::kBF16;
  int T = 4, k = 2, S = 4, E = 8, r_max = 16;
  int64_t dim = 64;
  RoutingKind routing = RoutingKind::kPlain;
  int block = 16;
  SlotMode slots = SlotMode::kZipf;
  bool mixed_ranks = true;
  std::string name() const {
    return std::string(op_name(op)) + "_" + molora::dtype_name(dt) + "_T" + std::to_string(T) +
           "k" + std::to_string(k) + "S" + std::to_string(S) + "E" + std::to_string(E) + "r" +
           std::to_string(r_max) + "d" + std::to_string(dim) + "_" + routing_name(routing);
  }
};

struct Data {
  Problem pb;
  std::vector<uint16_t> w, in, out;  // 16-bit storage (f16/bf16)
  std::vector<int32_t> topk, slot, ranks;
  std::vector<float> scales;
  std::vector<int32_t> sorted, expert_ids, ntpp;
  Routing host_routing() const {
    Routing r;
    r.topk_ids = topk.data();
    r.slot_ids = slot.data();
    if (pb.routing == RoutingKind::kAligned) {
      r.sorted_token_ids = sorted.data();
      r.expert_ids = expert_ids.data();
      r.num_tokens_post_pad = ntpp.data();
    }
    return r;
  }
};

inline uint16_t to16(DType dt, float f) {
  return dt == DType::kF16 ? molora::lora::detail::float_to_half(f)
                           : molora::lora::detail::float_to_bf16(f);
}
inline float from16(DType dt, uint16_t h) {
  return dt == DType::kF16 ? molora::lora::detail::half_to_float(h)
                           : molora::lora::detail::bf16_to_float(h);
}

// The aligned layout (moe_align_block_size's contract) over virtual experts v = s*E + e, built
// on the CPU: buckets in ascending v, pairs ascending within a bucket, each padded to B with the
// sentinel P; expert_ids -1 past the used blocks; worst-case sizes.
inline void build_aligned(Data& d) {
  const Problem& pb = d.pb;
  const int64_t P = pb.num_tokens * pb.top_k, V = int64_t(pb.num_slots) * pb.num_experts;
  const int B = pb.block_size;
  const int64_t len = P + V * (B - 1);
  d.sorted.assign(len, static_cast<int32_t>(P));
  d.expert_ids.assign(molora::cdiv(len, B), -1);
  std::vector<std::vector<int32_t>> buckets(V);
  for (int64_t p = 0; p < P; ++p) {
    int s = d.slot[p / pb.top_k];
    if (s < 0) continue;
    buckets[int64_t(s) * pb.num_experts + d.topk[p]].push_back(static_cast<int32_t>(p));
  }
  int64_t pos = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (buckets[v].empty()) continue;
    for (int64_t i = 0; i < int64_t(buckets[v].size()); ++i) d.sorted[pos + i] = buckets[v][i];
    int64_t nb = molora::cdiv(buckets[v].size(), B);
    for (int64_t b = 0; b < nb; ++b) d.expert_ids[pos / B + b] = static_cast<int32_t>(v);
    pos += nb * B;
  }
  d.ntpp = {static_cast<int32_t>(pos)};
  d.pb.sorted_len = len;
}

inline Data make_data(const Case& c, std::mt19937_64& rng) {
  Data d;
  Problem& pb = d.pb;
  pb.op = c.op;
  pb.dtype = c.dt;
  pb.num_tokens = c.T;
  pb.top_k = c.k;
  pb.num_slots = c.S;
  pb.num_experts = c.E;
  pb.r_max = c.r_max;
  (c.op == Op::kShrink ? pb.K : pb.N) = c.dim;
  pb.routing = c.routing;
  pb.block_size = c.routing == RoutingKind::kAligned ? c.block : 0;
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  const int64_t P = int64_t(c.T) * c.k;
  d.ranks.resize(c.S);
  d.scales.resize(c.S);
  // Powers of two (expand: one tensor copy per task below r_max >= 32), others rounding to 8
  // (24, 40: per-lane copies) and ranks that are not multiples of 8 (masked tails).
  const int choices[] = {8, 16, 32, 64, 128, 4, 12, 1, 24, 40};
  for (int s = 0; s < c.S; ++s) {
    d.ranks[s] = c.mixed_ranks ? std::min(c.r_max, choices[rng() % 10]) : c.r_max;
    d.scales[s] = 0.25f + 0.25f * (s % 4);
  }
  d.slot.resize(c.T);
  for (int t = 0; t < c.T; ++t) {
    switch (c.slots) {
      case SlotMode::kAllNone:
        d.slot[t] = -1;
        break;
      case SlotMode::kOne:
        d.slot[t] = c.S - 1;
        break;
      case SlotMode::kDistinct:
        d.slot[t] = t % c.S;
        break;
      case SlotMode::kHalfNone:
        d.slot[t] = (rng() % 2) ? -1 : int(rng() % c.S);
        break;
      case SlotMode::kSparse:  // about one token in 64 has an adapter, and the last one
        d.slot[t] = (t == c.T - 1 || rng() % 64 == 0) ? int(rng() % c.S) : -1;
        break;
      case SlotMode::kLast:
        d.slot[t] = t == c.T - 1 ? int(rng() % c.S) : -1;
        break;
      case SlotMode::kZipf: {
        double u = std::uniform_real_distribution<double>(0, 1)(rng);
        int s = std::min<int>(c.S - 1, int(std::floor(std::pow(double(c.S + 1), u))) - 1);
        d.slot[t] = (rng() % 5 == 0) ? -1 : s;
        break;
      }
    }
  }
  d.topk.resize(P);
  for (int t = 0; t < c.T; ++t) {  // k distinct experts per token
    std::vector<int32_t> perm(c.E);
    for (int e = 0; e < c.E; ++e) perm[e] = e;
    for (int j = 0; j < c.k; ++j) {
      int pick = j + int(rng() % (c.E - j));
      std::swap(perm[j], perm[pick]);
      d.topk[int64_t(t) * c.k + j] = perm[j];
    }
  }
  const int64_t V = int64_t(c.S) * c.E;
  const float ws = 1.f / std::sqrt(float(c.op == Op::kShrink ? c.dim : c.r_max));
  if (c.op == Op::kShrink) {
    d.w.resize(V * c.r_max * c.dim);
    d.in.resize(int64_t(c.T) * c.dim);
    d.out.assign(P * c.r_max, 0x7fff);  // poison (NaN in both f16 and bf16)
  } else {
    d.w.resize(V * c.dim * c.r_max);
    d.in.resize(P * c.r_max);
    d.out.resize(P * c.dim);
    for (auto& v : d.out) v = to16(c.dt, U(rng));
  }
  for (auto& v : d.w) v = to16(c.dt, U(rng) * ws);
  for (auto& v : d.in) v = to16(c.dt, U(rng));
  if (c.routing == RoutingKind::kAligned) build_aligned(d);
  return d;
}

// Gives `to` (an expand) the routing, ranks and layout of `from` (a shrink), so that the expand
// reads the pairs the shrink wrote.
inline void share_routing(Data& to, const Data& from) {
  to.ranks = from.ranks, to.slot = from.slot, to.topk = from.topk, to.sorted = from.sorted;
  to.expert_ids = from.expert_ids, to.ntpp = from.ntpp, to.pb.sorted_len = from.pb.sorted_len;
}

// One layer's delta (moe_delta): the shrink's data (x, A, the poisoned t) and the expand's (B,
// scales, the base y), with the shrink's routing and ranks. `n` is the expand's N.
struct DeltaData {
  Data s, e;
};
inline DeltaData make_delta(Case c, int64_t n, std::mt19937_64& rng) {
  DeltaData d;
  c.op = Op::kShrink;
  d.s = make_data(c, rng);
  c.op = Op::kExpand;
  c.dim = n;
  d.e = make_data(c, rng);
  share_routing(d.e, d.s);
  return d;
}

// Max |a-b| over active rows divided by max |ref| (a relative error that ignores cancellation).
struct Err {
  double rel = 0;
  int64_t untouched_changed = 0;  // inactive elements that differ bitwise from the original
  int64_t nonfinite = 0;
};

inline bool pair_active(const Data& d, int64_t p) {
  int s = d.slot[p / d.pb.top_k];
  return s >= 0;
}

// Compares outputs: active row p (first `cols(p)` columns) numerically, the rest bitwise.
inline Err compare(const Data& d, const std::vector<uint16_t>& got,
                   const std::vector<uint16_t>& ref, const std::vector<uint16_t>& orig) {
  Err e;
  const bool shrink = d.pb.op == Op::kShrink;
  const int64_t P = d.pb.num_tokens * d.pb.top_k;
  const int64_t cols = shrink ? d.pb.r_max : d.pb.N;
  double maxref = 0, maxdiff = 0;
  for (int64_t p = 0; p < P; ++p) {
    const bool act = pair_active(d, p);
    const int64_t lim = act ? (shrink ? d.ranks[d.slot[p / d.pb.top_k]] : cols) : 0;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = p * cols + c;
      if (c < lim) {
        double a = from16(d.pb.dtype, got[i]), b = from16(d.pb.dtype, ref[i]);
        if (!std::isfinite(a)) ++e.nonfinite;
        maxref = std::max(maxref, std::fabs(b));
        maxdiff = std::max(maxdiff, std::fabs(a - b));
      } else if (got[i] != orig[i]) {
        ++e.untouched_changed;
      }
    }
  }
  e.rel = maxref > 0 ? maxdiff / maxref : maxdiff;
  return e;
}

inline double tolerance(DType dt) { return dt == DType::kBF16 ? 1e-2 : 2e-3; }

}  // namespace lora_test
