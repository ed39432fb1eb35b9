// lora CPU suite: the reference against a naive fp64 loop, plain vs aligned routing, the
// planner, and input validation (errors name the argument, nothing is written).
#include <cstdio>
#include <fstream>
#include <limits>

#include "lora/lora_internal.h"
#include "lora_test_util.h"
#include "molora/settings.h"

using namespace lora_test;

namespace {

// A second, independent statement of the contract, written from the header's formulas.
std::vector<double> naive(const Data& d) {
  const Problem& pb = d.pb;
  const int64_t P = pb.num_tokens * pb.top_k;
  const int R = pb.r_max;
  std::vector<double> out;
  if (pb.op == Op::kShrink) {
    out.assign(P * R, 0);
    for (int64_t p = 0; p < P; ++p) {
      int s = d.slot[p / pb.top_k], e = d.topk[p];
      if (s < 0) continue;
      for (int r = 0; r < d.ranks[s]; ++r) {
        double acc = 0;
        for (int64_t kk = 0; kk < pb.K; ++kk)
          acc += double(from16(pb.dtype,
                               d.w[((int64_t(s) * pb.num_experts + e) * R + r) * pb.K + kk])) *
                 from16(pb.dtype, d.in[(p / pb.top_k) * pb.K + kk]);
        out[p * R + r] = acc;
      }
    }
  } else {
    out.assign(P * pb.N, 0);
    for (int64_t p = 0; p < P; ++p) {
      int s = d.slot[p / pb.top_k], e = d.topk[p];
      for (int64_t n = 0; n < pb.N; ++n) {
        double acc = 0;
        if (s >= 0)
          for (int r = 0; r < d.ranks[s]; ++r)
            acc += double(from16(pb.dtype,
                                 d.w[((int64_t(s) * pb.num_experts + e) * pb.N + n) * R + r])) *
                   from16(pb.dtype, d.in[p * R + r]);
        out[p * pb.N + n] =
            from16(pb.dtype, d.out[p * pb.N + n]) + (s >= 0 ? d.scales[s] * acc : 0);
      }
    }
  }
  return out;
}

std::vector<uint16_t> run_ref(const Data& d, Status* st) {
  std::vector<uint16_t> out = d.out;
  Routing rt = d.host_routing();
  *st = d.pb.op == Op::kShrink
            ? shrink_cpu(d.pb, d.in.data(), d.w.data(), d.ranks.data(), rt, out.data())
            : expand_cpu(d.pb, d.in.data(), d.w.data(), d.ranks.data(), d.scales.data(), rt,
                         out.data());
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (Op op : {Op::kShrink, Op::kExpand})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (RoutingKind rk : {RoutingKind::kPlain, RoutingKind::kAligned}) {
        Case c;
        c.op = op, c.dt = dt, c.routing = rk;
        v.push_back(c);
        c.T = 1, c.k = 1, c.dim = 8, c.r_max = 8, c.block = 1;
        v.push_back(c);
        c.T = 7, c.k = 3, c.S = 3, c.E = 5, c.dim = 24, c.r_max = 32, c.block = 4;
        c.slots = SlotMode::kDistinct;
        v.push_back(c);
        c.slots = SlotMode::kOne;
        c.mixed_ranks = false;
        v.push_back(c);
      }
  return v;
}

}  // namespace

TEST(LoraCpu, ReferenceMatchesNaiveLoop) {
  std::mt19937_64 rng(fresh_seed());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Data d = make_data(c, rng);
    Status st;
    std::vector<uint16_t> got = run_ref(d, &st);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<double> want = naive(d);
    const int64_t P = int64_t(c.T) * c.k;
    const int64_t cols = c.op == Op::kShrink ? c.r_max : c.dim;
    for (int64_t p = 0; p < P; ++p) {
      int s = d.slot[p / c.k];
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = p * cols + j;
        const bool written = s >= 0 && (c.op == Op::kExpand || j < d.ranks[s]);
        if (!written) {
          ASSERT_EQ(got[i], d.out[i]) << "untouched element changed at pair " << p;
          continue;
        }
        // Both are fp64 sums rounded once to the storage type.
        ASSERT_EQ(got[i], to16(c.dt, float(want[i]))) << "pair " << p << " col " << j;
      }
    }
  }
}

TEST(LoraCpu, PlainAndAlignedAgreeBitwise) {
  std::mt19937_64 rng(fresh_seed());
  for (Case c : cases()) {
    if (c.routing != RoutingKind::kPlain) continue;
    SCOPED_TRACE(c.name());
    Data d = make_data(c, rng);
    Status s1, s2;
    std::vector<uint16_t> a = run_ref(d, &s1);
    Data d2 = d;
    d2.pb.routing = RoutingKind::kAligned;
    d2.pb.block_size = 3;
    build_aligned(d2);
    std::vector<uint16_t> b = run_ref(d2, &s2);
    ASSERT_TRUE(s1.ok() && s2.ok()) << s1.to_string() << s2.to_string();
    EXPECT_EQ(a, b);
  }
}

TEST(LoraCpu, AllSlotsNoneWritesNothing) {
  std::mt19937_64 rng(fresh_seed());
  for (Op op : {Op::kShrink, Op::kExpand}) {
    Case c;
    c.op = op;
    c.slots = SlotMode::kAllNone;
    Data d = make_data(c, rng);
    Status st;
    EXPECT_EQ(run_ref(d, &st), d.out);
    EXPECT_TRUE(st.ok());
  }
}

TEST(LoraCpu, ValidationNamesTheArgumentAndWritesNothing) {
  std::mt19937_64 rng(fresh_seed());
  Case c;
  Data base = make_data(c, rng);
  auto expect_err = [&](Data d, const std::string& word) {
    Status st;
    std::vector<uint16_t> out = run_ref(d, &st);
    EXPECT_FALSE(st.ok()) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
    EXPECT_EQ(out, d.out) << "wrote output despite error: " << word;
  };
  // One mutation of the valid input per row, and the word the error must name.
  struct Bad {
    const char* word;
    void (*mutate)(Data&, const Case&);
  };
  const Bad bads[] = {
      {"slot_ids", [](Data& d, const Case& k) { d.slot[1] = k.S; }},
      {"slot_ids", [](Data& d, const Case&) { d.slot[0] = -2; }},
      {"topk_ids", [](Data& d, const Case& k) { d.topk[3] = k.E; }},
      {"ranks", [](Data& d, const Case& k) { d.ranks[0] = k.r_max + 1; }},
      {"r_max", [](Data& d, const Case&) { d.pb.r_max = 24; }},
      {"N", [](Data& d, const Case&) { d.pb.N = 12; }},
      {"K must be 0", [](Data& d, const Case&) { d.pb.K = 64; }},
      {"top_k", [](Data& d, const Case&) { d.pb.top_k = 0; }},
  };
  for (const Bad& b : bads) {
    Data d = base;
    b.mutate(d, c);
    expect_err(d, b.word);
  }
  {
    Data d = base;
    d.pb.routing = RoutingKind::kAligned;
    d.pb.block_size = 4;
    build_aligned(d);
    d.expert_ids[0] = c.S * c.E;
    expect_err(d, "expert_ids");
  }
  {
    Data d = base;
    d.pb.routing = RoutingKind::kAligned;
    d.pb.block_size = 4;
    build_aligned(d);
    d.ntpp[0] = 3;
    expect_err(d, "num_tokens_post_pad");
  }
  {
    Problem pb = base.pb;
    pb.num_tokens = 65536;
    pb.top_k = 2;
    EXPECT_EQ(validate_problem(pb).code(), molora::StatusCode::kOutOfRange);
    // A num_tokens whose product with top_k overflows int64 (found by tests/extra/lora_fuzz.sh:
    // 2^62 * 4 wrapped to 0 and passed).
    pb.num_tokens = int64_t{1} << 62;
    pb.top_k = 4;
    const Status st = validate_problem(pb);
    EXPECT_EQ(st.code(), molora::StatusCode::kOutOfRange) << st.to_string();
    pb.num_tokens = 65536, pb.top_k = 1;
    EXPECT_TRUE(validate_problem(pb).ok());
  }
  {
    // sorted_len up to the longest align output, 65536 + S * E * (block_size - 1); past it (and
    // at INT64_MAX, which overflowed the planner's block count, found by the fuzzer) an error.
    Problem pb = base.pb;
    pb.routing = RoutingKind::kAligned;
    pb.block_size = 16;
    const int64_t max_len = 65536 + int64_t{c.S} * c.E * 15;
    pb.sorted_len = max_len;
    EXPECT_TRUE(validate_problem(pb).ok());
    for (int64_t bad : {max_len + 1, std::numeric_limits<int64_t>::max()}) {
      pb.sorted_len = bad;
      const Status st = validate_problem(pb);
      EXPECT_EQ(st.code(), molora::StatusCode::kOutOfRange) << bad;
      EXPECT_NE(st.message().find("sorted_len"), std::string::npos) << st.message();
      Plan pl;
      EXPECT_FALSE(plan(pb, &pl).ok());
    }
  }
}

// moe_delta_cpu against the naive loops composed by hand: t rounded to the storage type, then
// y += scale * B t, each sum in fp64 and rounded once; t holds the shrink's rows.
TEST(LoraCpu, DeltaIsShrinkThenExpand) {
  std::mt19937_64 rng(fresh_seed());
  for (Case c : cases()) {
    if (c.op != Op::kShrink) continue;
    for (int64_t n : {int64_t{8}, int64_t{40}}) {
      SCOPED_TRACE(c.name() + " N" + std::to_string(n));
      DeltaData d = make_delta(c, n, rng);
      std::vector<uint16_t> t = d.s.out, y = d.e.out;
      const Status st =
          moe_delta_cpu(d.s.pb, n, d.s.in.data(), d.s.w.data(), d.e.w.data(), d.s.ranks.data(),
                        d.e.scales.data(), d.s.host_routing(), t.data(), y.data());
      ASSERT_TRUE(st.ok()) << st.to_string();
      const std::vector<double> t_want = naive(d.s);
      Data e = d.e;
      const int64_t P = int64_t(c.T) * c.k;
      for (int64_t i = 0; i < P * c.r_max; ++i) e.in[i] = to16(c.dt, float(t_want[i]));
      const std::vector<double> y_want = naive(e);
      for (int64_t p = 0; p < P; ++p) {
        const int s = d.s.slot[p / c.k];
        for (int r = 0; r < c.r_max; ++r) {
          const int64_t i = p * c.r_max + r;
          if (s >= 0 && r < d.s.ranks[s]) {
            ASSERT_EQ(t[i], e.in[i]) << "t, pair " << p << " rank row " << r;
          } else {
            ASSERT_EQ(t[i], d.s.out[i]) << "t written past the rank or for no adapter, pair " << p;
          }
        }
        for (int64_t j = 0; j < n; ++j) {
          const int64_t i = p * n + j;
          if (s < 0) {
            ASSERT_EQ(y[i], d.e.out[i]) << "y of a pair without adapter changed, pair " << p;
          } else {
            ASSERT_EQ(y[i], to16(c.dt, float(y_want[i]))) << "y, pair " << p << " col " << j;
          }
        }
      }
    }
  }
}

// Every argument error of moe_delta_cpu names the argument and writes neither t nor y (the
// expand's checks run before the shrink writes t).
TEST(LoraCpu, DeltaValidationWritesNothing) {
  std::mt19937_64 rng(fresh_seed());
  Case c;
  c.routing = RoutingKind::kAligned;
  DeltaData base = make_delta(c, 48, rng);
  struct Bad {
    const char* word;
    int64_t n;
    void (*mutate)(DeltaData&);
    bool null_scales, t_is_y;
  };
  const Bad bads[] = {
      {"N must be", 12, [](DeltaData&) {}, false, false},
      {"N must be", 0, [](DeltaData&) {}, false, false},
      {"scales", 48, [](DeltaData&) {}, true, false},
      {"different buffers", 48, [](DeltaData&) {}, false, true},
      {"op shrink", 48, [](DeltaData& d) { d.s.pb.op = Op::kExpand; }, false, false},
      {"ranks", 48, [](DeltaData& d) { d.s.ranks[1] = d.s.pb.r_max + 1; }, false, false},
      {"expert_ids", 48,
       [](DeltaData& d) { d.s.expert_ids[0] = d.s.pb.num_slots * d.s.pb.num_experts; }, false,
       false},
  };
  for (const Bad& b : bads) {
    SCOPED_TRACE(b.word);
    DeltaData d = base;
    b.mutate(d);
    std::vector<uint16_t> t = d.s.out, y = d.e.out;
    const Status st = moe_delta_cpu(d.s.pb, b.n, d.s.in.data(), d.s.w.data(), d.e.w.data(),
                                    d.s.ranks.data(), b.null_scales ? nullptr : d.e.scales.data(),
                                    d.s.host_routing(), t.data(), b.t_is_y ? t.data() : y.data());
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(b.word), std::string::npos) << st.message();
    EXPECT_EQ(t, d.s.out) << "t written despite the error";
    EXPECT_EQ(y, d.e.out) << "y written despite the error";
  }
  // Without CUDA the device call says so after the same checks; with CUDA, host pointers are
  // refused before anything launches.
  std::vector<uint16_t> t = base.s.out, y = base.e.out;
  const Status st = moe_delta(base.s.pb, 48, nullptr, base.s.in.data(), base.s.w.data(),
                              base.e.w.data(), base.s.ranks.data(), base.e.scales.data(),
                              base.s.host_routing(), t.data(), y.data(), nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(t, base.s.out);
  EXPECT_EQ(y, base.e.out);
  EXPECT_EQ(moe_delta(base.s.pb, 12, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                      Routing{}, nullptr, nullptr, nullptr)
                .code(),
            molora::StatusCode::kInvalidArgument);
  const Status se = moe_delta(base.s.pb, 48, nullptr, base.s.in.data(), base.s.w.data(),
                              base.e.w.data(), base.s.ranks.data(), base.e.scales.data(),
                              base.s.host_routing(), t.data(), y.data(), nullptr, 2);
  EXPECT_NE(se.message().find("shrink_early"), std::string::npos) << se.message();
  EXPECT_EQ(t, base.s.out);
  EXPECT_EQ(y, base.e.out);
}

TEST(LoraCpu, HalfAndBf16Conversions) {
  using namespace molora::lora::detail;
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 0x1p-14f, 0x1p-24f, 0x1.8p-20f})
    EXPECT_EQ(half_to_float(float_to_half(f)), f);  // exactly representable
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(65520.f), 0x7c00);             // rounds to inf
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie to even
  for (uint32_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(float_to_half(half_to_float(h)), h);
}

namespace {
// A problem of plain routing, top-8, 8 slots: `dim` is N for expand, K for shrink.
Problem problem(Op op, int64_t num_tokens, int num_experts, int r_max, int64_t dim) {
  Problem pb;
  pb.op = op;
  pb.num_tokens = num_tokens;
  pb.top_k = 8;
  pb.num_slots = 8;
  pb.num_experts = num_experts;
  pb.r_max = r_max;
  (op == Op::kExpand ? pb.N : pb.K) = dim;
  return pb;
}
// The issue's seed expand shape, plain routing: N=6144, r=32, 8 slots x 160 experts, T=64, k=8.
Problem seed_expand_problem() { return problem(Op::kExpand, 64, 160, 32, 6144); }
// The same on the align layout: blocks of 16 pairs, sorted_len for P = 512 and V = 1280.
Problem seed_expand_aligned() {
  Problem pb = seed_expand_problem();
  pb.routing = RoutingKind::kAligned;
  pb.block_size = 16;
  pb.sorted_len = 512 + 1280 * 15;
  return pb;
}
// The planner's heuristic on an H100-sized GPU: 132 SMs, no tuned config file.
PlanOptions heuristic_options() {
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = "none";
  return o;
}
}  // namespace

TEST(LoraPlan, HeuristicFieldsAreConsistent) {
  Problem pb = seed_expand_problem();
  PlanOptions o = heuristic_options();
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.variant, "expand.plain-stream.bf16");  // the planner's choice for 512 plain pairs
  o.kernel = "grid";                                  // (the grid kernel's fields below)
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "heuristic");
  EXPECT_EQ(pl.variant, "expand.plain-grouped.bf16");
  EXPECT_EQ(pl.chunks, molora::cdiv(6144, pl.tile));
  EXPECT_EQ(pl.groups, 512);
  EXPECT_EQ(pl.max_items, 512LL * pl.chunks);
  EXPECT_EQ(pl.grid, std::min<int64_t>(pl.max_items, 132LL * 2));  // resident CTAs (no GPU: 2/SM)
  EXPECT_EQ(pl.unroll, 4);
  EXPECT_GT(pl.floor_us, 0);
  EXPECT_FALSE(pl.bytes_exact);
  // worst case: 512 distinct pairs at r_max, t read, y read+written, routing ids
  EXPECT_EQ(pl.bytes,
            512LL * 32 * 6144 * 2 + 512LL * 32 * 2 + 2LL * 512 * 6144 * 2 + 512 * 4 + 64 * 4);
  RoutingStats st;
  st.active_pairs = 256, st.active_tokens = 32, st.distinct_pairs = 100, st.distinct_rank8 = 1600,
  st.active_rank8 = 256 * 16;
  o.stats = &st;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_TRUE(pl.bytes_exact);
  EXPECT_EQ(pl.bytes, 1600LL * 6144 * 2 + 256LL * 16 * 2 + 2LL * 256 * 6144 * 2 + 512 * 4 + 64 * 4);
  EXPECT_NE(pl.to_json().find("\"floor_us\""), std::string::npos);
  EXPECT_NE(pl.to_string().find("grid="), std::string::npos);

  pb.routing = RoutingKind::kAligned;
  pb.block_size = 16;
  pb.sorted_len = 512 + 1280 * 15;
  o.kernel.clear();
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.variant, "expand.aligned-stream.bf16");  // the planner's choice here
  EXPECT_EQ(pl.groups, molora::cdiv(pb.sorted_len, 16));
  o.kernel = "grid";
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.variant, "expand.aligned.bf16");
  EXPECT_EQ(pl.groups, molora::cdiv(pb.sorted_len, 16));
  o.kernel.clear();

  pb.routing = RoutingKind::kPlain;
  pb.num_tokens = 1024;  // P = 8192 > group cap (4096): one group per pair
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.variant, "expand.plain-pairs.bf16");
  EXPECT_EQ(pl.group_cap, 0);
}

// The stream kernel (aligned routing, blocks of <= 32 pairs): one CTA per SM, shared-memory
// pipeline stages; the planner takes it for every expand and for shrink with P >= 16, grid
// elsewhere; asking for it where it does not apply, or for knobs it does not have, is an error.
// Programmatic dependent launch: on by default on every kernel (measured faster);
// MOLORA_LORA_PDL=0 / 1 turn it off / on; other values are an error naming the setting. The plan
// says so.
TEST(LoraPlan, DependentLaunchChoice) {
  const SettingsReset reset{"MOLORA_LORA_PDL"};
  Problem pb = seed_expand_aligned();
  PlanOptions o = heuristic_options();
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_TRUE(pl.pdl);
  EXPECT_NE(pl.to_string().find(" pdl"), std::string::npos) << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"pdl\":true"), std::string::npos);
  o.kernel = "grid";
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_TRUE(pl.pdl);  // grid expand
  Problem sh = pb;
  sh.op = Op::kShrink, sh.K = 6144, sh.N = 0;
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_TRUE(pl.pdl);  // grid shrink (since v0.14)
  o.kernel.clear();
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_TRUE(pl.pdl);  // stream shrink
  molora::set_setting("MOLORA_LORA_PDL", "0");
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_FALSE(pl.pdl);
  o.kernel = "grid";
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_FALSE(pl.pdl);
  EXPECT_EQ(pl.to_string().find(" pdl"), std::string::npos) << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"pdl\":false"), std::string::npos);
  molora::set_setting("MOLORA_LORA_PDL", "1");
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_TRUE(pl.pdl);
  molora::set_setting("MOLORA_LORA_PDL", "yes");
  Status st = plan(sh, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("MOLORA_LORA_PDL"), std::string::npos) << st.message();
}

namespace {
// The rule the plan's switches share (early_inputs, slot_check: option_or_setting in
// lora_plan.cc), on a problem where the switch can be on: the option 0 wins over the setting "1";
// the option -1 takes the setting ("1" on, "0" off); any other setting value is an error naming
// the setting, an option above 1 one naming the option. Leaves the setting unset.
void expect_option_or_setting(const Problem& pb, PlanOptions o, int PlanOptions::*option,
                              bool Plan::*field, const char* setting, const char* option_name,
                              const char* bad_setting) {
  SCOPED_TRACE(setting);
  Plan pl;
  o.*option = 0;  // the option wins over the setting
  molora::set_setting(setting, "1");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_FALSE(pl.*field);
  o.*option = -1;  // the setting
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_TRUE(pl.*field);
  molora::set_setting(setting, "0");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_FALSE(pl.*field);
  molora::set_setting(setting, bad_setting);
  Status st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(setting), std::string::npos) << st.message();
  molora::set_setting(setting, std::nullopt);
  o.*option = 2;
  st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(option_name), std::string::npos) << st.message();
}
}  // namespace

// Early inputs (the stream kernels read the routing, ranks, scales and weights before waiting for
// the kernel before them): off unless asked for (PlanOptions::early_inputs, or the setting when
// the option is -1), and only on a stream plan with dependent launch (else there is no wait to
// read before). Bad values are errors naming the option or the setting. The plan says so.
TEST(LoraPlan, EarlyInputsOnlyWhenAskedOnStreamWithDependentLaunch) {
  const SettingsReset reset{"MOLORA_LORA_EARLY_INPUTS", "MOLORA_LORA_PDL"};
  Problem pb = seed_expand_aligned();
  PlanOptions o = heuristic_options();
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  ASSERT_EQ(pl.kernel, "stream");
  EXPECT_FALSE(pl.early_inputs);  // default off
  EXPECT_NE(pl.to_json().find("\"early_inputs\":false"), std::string::npos);
  o.early_inputs = 1;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_TRUE(pl.early_inputs);
  EXPECT_NE(pl.to_string().find(" early-inputs"), std::string::npos) << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"early_inputs\":true"), std::string::npos);
  Problem sh = pb;
  sh.op = Op::kShrink, sh.K = 6144, sh.N = 0;
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_TRUE(pl.early_inputs);
  o.kernel = "grid";  // no early read in the grid kernels
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_FALSE(pl.early_inputs);
  EXPECT_EQ(pl.to_string().find("early-inputs"), std::string::npos) << pl.to_string();
  o.kernel.clear();
  molora::set_setting("MOLORA_LORA_PDL", "0");  // no dependent launch: nothing to read before
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_FALSE(pl.early_inputs);
  molora::set_setting("MOLORA_LORA_PDL", std::nullopt);
  expect_option_or_setting(pb, o, &PlanOptions::early_inputs, &Plan::early_inputs,
                           "MOLORA_LORA_EARLY_INPUTS", "early_inputs", "yes");
}

// The every-slot -1 check (Plan::slot_check): on by default in the plain stream kernels, shrink
// and expand; never in the aligned or grid kernels (they have no grouping to skip); off by the
// option (which wins over the setting) or MOLORA_LORA_SLOT_CHECK=0. Bad values are errors naming
// the option or the setting. The plan says so, and plan_delta's two plans follow the option.
TEST(LoraPlan, SlotCheckOnPlainStreamUnlessTurnedOff) {
  const SettingsReset reset{"MOLORA_LORA_SLOT_CHECK", "MOLORA_LORA_KERNEL"};
  PlanOptions o = heuristic_options();
  Plan pl;
  for (Op op : {Op::kShrink, Op::kExpand}) {
    Problem pb = problem(op, 64, 160, 32, 6144);
    SCOPED_TRACE(op == Op::kShrink ? "shrink" : "expand");
    o.slot_check = -1;
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    ASSERT_EQ(pl.kernel, "stream") << pl.to_string();
    EXPECT_TRUE(pl.slot_check);  // default on
    EXPECT_NE(pl.to_string().find(" slot-check"), std::string::npos) << pl.to_string();
    EXPECT_NE(pl.to_json().find("\"slot_check\":true"), std::string::npos) << pl.to_json();
    o.slot_check = 0;
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_FALSE(pl.slot_check);
    EXPECT_EQ(pl.to_string().find("slot-check"), std::string::npos) << pl.to_string();
    EXPECT_NE(pl.to_json().find("\"slot_check\":false"), std::string::npos) << pl.to_json();
    expect_option_or_setting(pb, o, &PlanOptions::slot_check, &Plan::slot_check,
                             "MOLORA_LORA_SLOT_CHECK", "slot_check", "off");
    o.slot_check = 1;
    o.kernel = "grid";  // the grid kernels: no grouping in shared memory to skip
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_FALSE(pl.slot_check) << pl.to_string();
    o.kernel.clear();
    Problem al = pb;  // aligned: a CTA without used blocks leaves at once anyway
    al.routing = RoutingKind::kAligned, al.block_size = 16, al.sorted_len = 512 + 1280 * 15;
    ASSERT_TRUE(plan(al, &pl, o).ok());
    ASSERT_EQ(pl.kernel, "stream") << pl.to_string();
    EXPECT_FALSE(pl.slot_check) << pl.to_string();
  }
  DeltaPlan d;
  o.slot_check = -1;
  ASSERT_TRUE(plan_delta(problem(Op::kShrink, 64, 160, 32, 2048), 2048, &d, o).ok());
  EXPECT_TRUE(d.shrink.slot_check) << d.to_string();
  EXPECT_TRUE(d.expand.slot_check) << d.to_string();
  o.slot_check = 0;
  ASSERT_TRUE(plan_delta(problem(Op::kShrink, 64, 160, 32, 2048), 2048, &d, o).ok());
  EXPECT_FALSE(d.shrink.slot_check) << d.to_string();
  EXPECT_FALSE(d.expand.slot_check) << d.to_string();
}

// plan_delta: the shrink's plan as plan() gives it (early inputs as asked), the expand's with
// early inputs wherever its kernel has them (stream, dependent launch); both in the JSON.
TEST(LoraPlan, DeltaPlanReadsTheExpandsInputsEarly) {
  const SettingsReset reset{"MOLORA_LORA_EARLY_INPUTS", "MOLORA_LORA_PDL"};
  Problem pb = seed_expand_aligned();
  pb.op = Op::kShrink, pb.K = 6144, pb.N = 0;
  PlanOptions o = heuristic_options();
  DeltaPlan d;
  ASSERT_TRUE(plan_delta(pb, 4096, &d, o).ok());
  EXPECT_EQ(d.shrink.variant.rfind("shrink.", 0), 0u) << d.shrink.variant;
  EXPECT_EQ(d.expand.variant.rfind("expand.", 0), 0u) << d.expand.variant;
  EXPECT_FALSE(d.shrink.early_inputs);
  EXPECT_TRUE(d.expand.early_inputs) << d.expand.to_string();
  Plan pe;
  ASSERT_TRUE(plan(delta_expand_problem(pb, 4096), &pe, o).ok());
  EXPECT_EQ(pe.tile, d.expand.tile);
  EXPECT_EQ(pe.grid, d.expand.grid);
  EXPECT_FALSE(pe.early_inputs);  // (plan() alone: off by default)
  EXPECT_NE(d.to_string().find("expand: "), std::string::npos) << d.to_string();
  const std::string js = d.to_json();
  EXPECT_NE(js.find("{\"shrink\": {"), std::string::npos) << js;
  EXPECT_NE(js.find(", \"expand\": {"), std::string::npos) << js;
  EXPECT_NE(js.find("\"early_inputs\":true"), std::string::npos) << js;
  o.early_inputs = 1;  // the option reaches the shrink
  ASSERT_TRUE(plan_delta(pb, 4096, &d, o).ok());
  EXPECT_TRUE(d.shrink.early_inputs);
  o.early_inputs = -1;
  o.kernel = "grid";  // the grid expand reads nothing early
  ASSERT_TRUE(plan_delta(pb, 4096, &d, o).ok());
  EXPECT_FALSE(d.expand.early_inputs);
  o.kernel.clear();
  molora::set_setting("MOLORA_LORA_PDL", "0");  // no dependent launch: nothing to read before
  ASSERT_TRUE(plan_delta(pb, 4096, &d, o).ok());
  EXPECT_FALSE(d.expand.early_inputs);
  molora::set_setting("MOLORA_LORA_PDL", std::nullopt);
  Problem plain = pb;  // plain routing, 512 pairs: the stream kernels, the expand reads early
  plain.routing = RoutingKind::kPlain, plain.block_size = 0, plain.sorted_len = 0;
  ASSERT_TRUE(plan_delta(plain, 4096, &d, o).ok());
  EXPECT_EQ(d.expand.variant, "expand.plain-stream.bf16");
  EXPECT_TRUE(d.expand.early_inputs);
  plain.num_tokens = 4;  // 32 pairs: the grid shrink, the stream expand (N * r_max >= 131072)
  ASSERT_TRUE(plan_delta(plain, 4096, &d, o).ok());
  EXPECT_EQ(d.shrink.kernel, "grid");
  EXPECT_EQ(d.expand.kernel, "stream");
  EXPECT_TRUE(d.expand.early_inputs);
  o.kernel = "grid";  // the grid kernels: nothing read early
  ASSERT_TRUE(plan_delta(plain, 4096, &d, o).ok());
  EXPECT_EQ(d.expand.kernel, "grid");
  EXPECT_FALSE(d.expand.early_inputs);
  o.kernel.clear();
  // Errors: the expand's N, an expand problem, no output.
  Status st = plan_delta(pb, 12, &d, o);
  EXPECT_NE(st.message().find("N must be"), std::string::npos) << st.message();
  Problem ex = delta_expand_problem(pb, 4096);
  st = plan_delta(ex, 4096, &d, o);
  EXPECT_NE(st.message().find("op shrink"), std::string::npos) << st.message();
  EXPECT_FALSE(plan_delta(pb, 4096, nullptr, o).ok());
}

TEST(LoraPlan, StreamKernelChoice) {
  Problem pb = seed_expand_aligned();
  PlanOptions o = heuristic_options();
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");  // the default for aligned expand with blocks <= 32
  {
    Problem q = pb;
    q.num_tokens = 1;  // P = 8
    ASSERT_TRUE(plan(q, &pl, o).ok());
    EXPECT_EQ(pl.kernel, "stream");
    q = pb, q.r_max = 16;
    ASSERT_TRUE(plan(q, &pl, o).ok());
    EXPECT_EQ(pl.kernel, "stream");
    EXPECT_EQ(pl.tile, 512);  // 512 rows x 16 x 2 bytes: a stage holds at most 512 rows
    q = pb, q.block_size = 64, q.sorted_len = 512 + 1280 * 63;
    ASSERT_TRUE(plan(q, &pl, o).ok());
    EXPECT_EQ(pl.kernel, "grid");
    o.kernel = "grid";
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.kernel, "grid");
  }
  o.kernel = "stream";
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.variant, "expand.aligned-stream.bf16");
  EXPECT_EQ(pl.tile, 256);  // 256 rows x 32 x 2 bytes = one 16 KiB stage
  EXPECT_EQ(pl.stages, 12);
  EXPECT_EQ(pl.unroll, 0);
  EXPECT_EQ(pl.threads, 32 * 12);  // 11 consumer warps and the producer
  EXPECT_EQ(pl.ctas_per_sm, 1);
  EXPECT_EQ(pl.grid, 132);
  EXPECT_EQ(pl.chunks, 6144 / 256);
  EXPECT_LE(pl.smem_bytes, 227u * 1024);
  EXPECT_GT(pl.smem_bytes, 12u * 16384);
  EXPECT_NE(pl.to_string().find("stages=12"), std::string::npos) << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"kernel\":\"stream\""), std::string::npos);
  // The tuning settings: consumer warps in [1, 11], stages in [2, 13] (227 KiB of stages).
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", "6");
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "13");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.threads, 32 * 7);
  EXPECT_EQ(pl.stages, 13);
  EXPECT_LE(pl.smem_bytes, 227u * 1024);
  for (const char* bad : {"12", "-1"}) {
    molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", bad);
    Status st = plan(pb, &pl, o);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("MOLORA_LORA_STREAM_CONSUMERS"), std::string::npos);
  }
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", std::nullopt);
  for (const char* bad : {"14", "1"}) {
    molora::set_setting("MOLORA_LORA_STREAM_STAGES", bad);
    EXPECT_FALSE(plan(pb, &pl, o).ok()) << bad;
  }
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", std::nullopt);
  for (int r : {8, 16, 64, 128}) {  // tile: one stage at r_max, at most 512 rows
    pb.r_max = r;
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.tile, std::min(512, 16384 / (2 * r))) << r;
  }
  pb.r_max = 32;
  o.force_tile = 64;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.tile, 64);
  EXPECT_EQ(pl.source, "forced");
  o.force_tile = 40;  // not a multiple of 32
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.force_tile = 512;  // 512 rows x 64 bytes > one stage
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.force_tile = 0;
  o.force_unroll = 8;
  Status st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("unroll"), std::string::npos) << st.message();
  o.force_unroll = 0;

  pb.op = Op::kShrink;
  pb.K = 6144;
  pb.N = 0;
  {  // the planner's choice for shrink: stream from P = 16 pairs
    PlanOptions d = o;
    d.kernel.clear();
    ASSERT_TRUE(plan(pb, &pl, d).ok());  // P = 512
    EXPECT_EQ(pl.kernel, "stream");
    Problem q = pb;
    q.num_tokens = 2;  // P = 16, K = 6144
    ASSERT_TRUE(plan(q, &pl, d).ok());
    EXPECT_EQ(pl.kernel, "stream");
    q.top_k = 5, q.num_tokens = 3;  // P = 15
    ASSERT_TRUE(plan(q, &pl, d).ok());
    EXPECT_EQ(pl.kernel, "grid");
    q.top_k = pb.top_k;
    q.K = 2048, q.num_tokens = 2;  // P = 16 at any K
    ASSERT_TRUE(plan(q, &pl, d).ok());
    EXPECT_EQ(pl.kernel, "stream");
    q.num_tokens = 1;  // P = 8
    ASSERT_TRUE(plan(q, &pl, d).ok());
    EXPECT_EQ(pl.kernel, "grid");
  }
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.variant, "shrink.aligned-stream.bf16");
  EXPECT_EQ(pl.tile, 8);
  EXPECT_EQ(pl.chunks, 4);
  EXPECT_EQ(pl.stages, 2);         // per warp
  EXPECT_EQ(pl.threads, 32 * 12);  // 12 warps, each feeding its own ring (no producer warp)
  EXPECT_LE(pl.smem_bytes, 227u * 1024);
  EXPECT_GE(pl.smem_bytes, 12u * 2 * 8192);  // 12 rings of 2 stages of 8 rows x 512 columns
  // Shrink's settings: warps in [1, 12], stages per warp within 227 KiB (12 warps: 2; 4: 6).
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", "4");
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "6");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.threads, 32 * 4);
  EXPECT_EQ(pl.stages, 6);
  EXPECT_LE(pl.smem_bytes, 227u * 1024);
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "7");  // 4 x 7 x 8 KiB > 227 KiB
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", "12");
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "2");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.threads, 32 * 12);
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "3");
  Status sst = plan(pb, &pl, o);
  EXPECT_FALSE(sst.ok());
  EXPECT_NE(sst.message().find("stages per consumer warp"), std::string::npos) << sst.message();
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", "13");
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", "2");
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  molora::set_setting("MOLORA_LORA_STREAM_CONSUMERS", std::nullopt);
  molora::set_setting("MOLORA_LORA_STREAM_STAGES", std::nullopt);
  o.force_tile = 16;
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.force_tile = 0;

  pb.block_size = 33;  // past the stream kernel's block limit
  pb.sorted_len = 512 + 1280 * 32;
  st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block_size"), std::string::npos) << st.message();
  // Plain routing: the stream kernel groups the pairs itself up to 2048 pairs and V = 65536.
  pb.routing = RoutingKind::kPlain;
  pb.block_size = 0;
  pb.sorted_len = 0;
  st = plan(pb, &pl, o);  // P = 512
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.variant, "shrink.plain-stream.bf16");
  EXPECT_EQ(pl.groups, 512);  // at most one group per pair
  EXPECT_EQ(pl.group_cap, 2048);
  EXPECT_EQ(pl.stages, 2);
  EXPECT_LE(pl.smem_bytes, 227u * 1024);
  {
    // The planner's default for plain routing (v0.29): shrink from 33 pairs where K * r_max >
    // 131072, else from 128; expand always where N * r_max >= 131072, else from 96.
    PlanOptions d = o;
    d.kernel.clear();
    struct Rule {
      Op op;
      int64_t dim;
      int r_max, T;  // (k = 8)
      const char* kernel;
    };
    const Rule rules[] = {
        {Op::kShrink, 6144, 32, 64, "stream"}, {Op::kShrink, 6144, 32, 5, "stream"},
        {Op::kShrink, 6144, 32, 4, "grid"},    {Op::kShrink, 4096, 32, 16, "stream"},
        {Op::kShrink, 4096, 32, 15, "grid"},   {Op::kShrink, 4096, 32, 8, "grid"},
        {Op::kExpand, 4096, 32, 8, "stream"},  {Op::kExpand, 4096, 32, 7, "stream"},
        {Op::kExpand, 4096, 32, 1, "stream"},  {Op::kExpand, 6144, 32, 1, "stream"},
        {Op::kExpand, 8192, 16, 1, "stream"},  {Op::kExpand, 2048, 32, 1, "grid"},
        {Op::kExpand, 2048, 16, 11, "grid"},   {Op::kExpand, 2048, 16, 12, "stream"},
    };
    for (const Rule& r : rules) {
      Problem q = problem(r.op, r.T, 160, r.r_max, r.dim);
      ASSERT_TRUE(plan(q, &pl, d).ok());
      EXPECT_EQ(pl.kernel, r.kernel) << op_name(r.op) << " dim " << r.dim << " T " << r.T;
      if (pl.kernel == "stream") {
        EXPECT_EQ(pl.variant, std::string(op_name(r.op)) + ".plain-stream.bf16");
      }
    }
  }
  Problem big = pb;
  big.num_tokens = 257;  // P = 2056 > 2048
  st = plan(big, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("plain routing with num_tokens * top_k <= 2048"), std::string::npos)
      << st.message();
  big.num_tokens = 256;  // P = 2048: the largest
  ASSERT_TRUE(plan(big, &pl, o).ok());
  EXPECT_EQ(pl.variant, "shrink.plain-stream.bf16");
  big.num_slots = 410;  // V = 410 * 160 = 65600 > 65536
  st = plan(big, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("num_slots * num_experts <= 65536"), std::string::npos)
      << st.message();
  big.num_slots = 409;  // V = 65440
  EXPECT_TRUE(plan(big, &pl, o).ok());
  o.kernel = "fast";
  st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("grid or stream"), std::string::npos) << st.message();
}

// Every stream shape the settings accept fits the 227 KiB the kernels ask for, with barriers
// and partial sums aligned; one stage more than the maximum is refused.
// Plain routing (its groups and the grouping's scratch): the same, and the scratch either lies
// inside the stages (nothing else there) or after everything else.
TEST(LoraPlan, StreamLayoutFitsEveryAcceptedShape) {
  namespace d = molora::lora::detail;
  for (bool plain : {false, true})
    for (Op op : {Op::kExpand, Op::kShrink})
      for (int c = 1; c <= d::stream_max_consumers(op); ++c) {
        const int threads = d::stream_threads(op, c), smax = d::stream_max_stages(op, c, plain);
        EXPECT_EQ(d::stream_consumers_of(op, threads), c);
        if (smax < 2) {
          EXPECT_FALSE(d::stream_shape_ok(op, threads, 2, plain)) << c;
          continue;
        }
        for (int st = 2; st <= smax; ++st) {
          ASSERT_TRUE(d::stream_shape_ok(op, threads, st, plain)) << c << " " << st;
          const d::StreamLayout l = d::stream_layout(op, st, c, plain);
          EXPECT_LE(l.total, 227u * 1024) << c << " " << st;
          EXPECT_EQ(l.full % 8, 0u);
          EXPECT_EQ(l.ready % 8, 0u);
          EXPECT_EQ(l.part % 8, 0u);
          const size_t stage_area =
              static_cast<size_t>(st) * (op == Op::kExpand ? 1 : c) * d::stream_stage_bytes(op);
          EXPECT_GE(l.full, stage_area);
          if (!plain) {
            EXPECT_EQ(l.pmem, 0u);
            continue;
          }
          const size_t after_part = l.part + (op == Op::kExpand ? 0 : c * 1024u);
          EXPECT_GE(l.pmem, after_part);
          EXPECT_EQ(l.pgv, l.pmem + 2 * 2048);
          EXPECT_EQ(l.pgs, l.pgv + 2 * 2048);
          EXPECT_EQ(l.pgs % 16, 0u);
          const int warps = op == Op::kExpand ? c + 1 : c;
          const size_t need = d::plain_scratch(warps).end;
          EXPECT_GE(need, 2u * 2048 * warps);    // per-warp counts of every pair at least
          EXPECT_LE(l.pgs + 2 * 2050, l.total);  // every group's first member, the count
          if (l.scratch == 0) {
            EXPECT_LE(need, stage_area) << c << " " << st;
          } else {
            EXPECT_GE(l.scratch, l.pgs + 2 * 2050) << c << " " << st;  // (+ the group count)
            EXPECT_EQ(l.scratch % 16, 0u);
            EXPECT_EQ(l.scratch + need, l.total) << c << " " << st;
          }
        }
        EXPECT_FALSE(d::stream_shape_ok(op, threads, smax + 1, plain)) << c;
      }
  // The defaults hold with plain routing: expand 12 stages, shrink 2 per warp.
  EXPECT_GE(d::stream_max_stages(Op::kExpand, 11, true), 12);
  EXPECT_GE(d::stream_max_stages(Op::kShrink, 12, true), 2);
  EXPECT_FALSE(d::stream_shape_ok(Op::kShrink, d::stream_threads(Op::kShrink, 13), 2));
  EXPECT_FALSE(d::stream_shape_ok(Op::kExpand, d::stream_threads(Op::kExpand, 12), 2));
}

TEST(LoraPlan, ShrinkTileSplitsRowsAtSmallBatches) {
  Problem pb = problem(Op::kShrink, 1, 256, 32, 7168);
  PlanOptions o = heuristic_options();
  o.kernel = "grid";  // (plain routing from 64 pairs takes the stream kernel by default)
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_LT(pl.tile, 8);  // 8 groups only: split rows across warps to reach every SM
  pb.num_tokens = 256;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.tile, 16);  // two rows of K per warp
  pb.num_tokens = 32;      // P = 256 pairs, the demo's small K: the full tile (measured faster)
  pb.r_max = 16;
  pb.K = 512;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.tile, 16);
  pb.num_tokens = 256;
  pb.r_max = 32;
  pb.K = 7168;
  o.force_unroll = 6;
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.force_unroll = 4;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.unroll, 4);
  o.force_tile = 3;
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.force_tile = 4;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "forced");
  EXPECT_EQ(pl.chunks, 8);
}

// The grid kernels' heuristic (plain routing, no config) picks, for the seed shapes at T = 1
// and 8, the tiles that `molora bench lora --tune` measured fastest on both the H100 and the
// H200 (bench/NOTES.md "lora v0.14"), within 5% where the two GPUs' picks differ.
TEST(LoraPlan, GridHeuristicTakesTheTunersTiles) {
  PlanOptions o = heuristic_options();
  o.kernel = "grid";  // (plain routing from 64 pairs takes the stream kernel by default)
  struct Case {
    Op op;
    int T, experts, r, dim, tile;
  };
  const Case cases[] = {
      {Op::kExpand, 1, 160, 32, 6144, 256}, {Op::kExpand, 8, 160, 32, 6144, 2048},
      {Op::kExpand, 1, 256, 32, 7168, 256}, {Op::kExpand, 8, 256, 32, 7168, 2048},
      {Op::kExpand, 1, 128, 32, 4096, 256}, {Op::kExpand, 8, 128, 32, 4096, 1024},
      {Op::kExpand, 1, 128, 16, 2048, 512}, {Op::kExpand, 8, 128, 16, 2048, 512},
      {Op::kShrink, 1, 160, 32, 6144, 1},   {Op::kShrink, 8, 160, 32, 6144, 8},
      {Op::kShrink, 8, 256, 32, 7168, 8},   {Op::kShrink, 8, 128, 32, 4096, 8},
      {Op::kShrink, 8, 128, 16, 2048, 4},   {Op::kShrink, 32, 128, 32, 4096, 16},
  };
  for (const Case& c : cases) {
    Problem pb = problem(c.op, c.T, c.experts, c.r, c.dim);
    Plan pl;
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.source, "heuristic");
    EXPECT_EQ(pl.tile, c.tile) << pl.variant << " T=" << c.T << " dim=" << c.dim << " r=" << c.r;
  }
  // No item below 16 KiB of weights (8192 / r_max rows, at least 64), whatever the SM count.
  o.sm_count = 100000;
  for (int r : {8, 16, 32, 64, 128}) {
    Problem pb = problem(Op::kExpand, 1, 160, r, 6144);
    Plan pl;
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.tile, std::max(64, 8192 / r)) << r;
  }
  // A dimension below that keeps one tile of the whole dimension.
  Problem pb = problem(Op::kExpand, 1, 160, 16, 136);
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.tile, 136);
}

TEST(LoraPlan, TunedConfigIsUsedAndNamed) {
  const std::string path = testing::TempDir() + "lora_tuned_test.json";
  {
    std::ofstream f(path);
    f << R"({"gpu": "test", "entries": [
      {"op": "expand", "dtype": "bf16", "routing": "plain", "dim": 2048, "r_max": 16,
       "p_min": 9, "p_max": 64, "tile": 256, "unroll": 4},
      {"op": "expand", "dtype": "bf16", "routing": "plain", "dim": 2048, "r_max": 16,
       "p_min": 65, "p_max": 512, "tile": 128},
      {"op": "expand", "dtype": "bf16", "routing": "plain", "dim": 4096, "r_max": 16,
       "p_max": 512, "tile": 64}]})";
  }
  Problem pb = problem(Op::kExpand, 8, 128, 16, 2048);
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = path;
  o.kernel = "grid";  // (the entries are the grid kernel's)
  Plan pl;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "tuned:" + path);
  EXPECT_EQ(pl.tile, 256);
  EXPECT_EQ(pl.unroll, 4);
  EXPECT_EQ(pl.chunks, molora::cdiv(2048, 256));
  pb.num_tokens = 32;  // P = 256: the p_max 512 entry (no unroll given: the default)
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.tile, 128);
  EXPECT_EQ(pl.unroll, 4);
  pb.num_tokens = 128;  // P = 1024: no entry
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "heuristic");
  // P = 8, below both entries' p_min (a token count the tuner left to the heuristic): no entry.
  pb.num_tokens = 1;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "heuristic");
  pb.N = 4096;  // an entry without p_min covers every P up to its p_max
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "tuned:" + path);
  EXPECT_EQ(pl.tile, 64);
  pb.N = 2048;
  // The setting is read when used.
  molora::set_setting("MOLORA_LORA_CONFIG", path);
  o.config_path = "";
  pb.num_tokens = 8;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.source, "tuned:" + path);
  molora::set_setting("MOLORA_LORA_CONFIG", std::nullopt);
  std::remove(path.c_str());
}

// The kernel from the tuned file: where the tuner timed both kernels at a token count (a grid
// and a stream entry of one bucket, each with its "us"), the planner takes the other kernel
// than its bounds' where that one is more than 3% faster, and says so (kernel_source); elsewhere
// its bounds (the heuristic), and a kernel asked for (PlanOptions::kernel, MOLORA_LORA_KERNEL) is
// never overridden. Plain expand N2048 r16, whose bound takes the stream kernel from 96 pairs.
TEST(LoraPlan, TunedKernelChoiceTakesTheFasterKernelOfABucket) {
  const std::string path = testing::TempDir() + "lora_tuned_kernel_test.json";
  int writes = 0;
  auto write = [&](const std::string& entries) {
    // (padded to a size of its own each time: the planner rereads a file whose modification
    // time or size changed, and two writes within the file system's clock tick share a time)
    const std::string text = "{\"entries\": [" + entries + "]}";
    ASSERT_LT(text.size(), 4000u);
    std::ofstream f(path, std::ios::trunc);
    f << text << std::string(4000 + writes++ - text.size(), ' ');
  };
  auto entry = [](const char* kernel, int p_min, int p_max, int tile, const std::string& us) {
    return std::string("{\"op\": \"expand\", \"kernel\": \"") + kernel +
           "\", \"dtype\": \"bf16\", \"routing\": \"plain\", \"dim\": 2048, \"r_max\": 16, "
           "\"p_min\": " +
           std::to_string(p_min) + ", \"p_max\": " + std::to_string(p_max) +
           ", \"tile\": " + std::to_string(tile) +
           ", \"unroll\": " + (std::string(kernel) == "grid" ? "4" : "0") +
           (us.empty() ? "" : ", \"us\": " + us) + "}";
  };
  Problem pb = problem(Op::kExpand, 8, 128, 16, 2048);  // P = 64: the bounds say grid
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = path;
  Plan pl;
  const std::string tuned = "tuned:" + path;
  // Both timed, the stream kernel faster: stream, and its entry's tile.
  write(entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 33, 64, 512, "5.25"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.kernel_source, tuned);
  EXPECT_EQ(pl.variant, "expand.plain-stream.bf16");
  EXPECT_EQ(pl.source, tuned);
  EXPECT_EQ(pl.tile, 512);
  EXPECT_NE(pl.to_string().find("kernel=stream [" + tuned + "]"), std::string::npos)
      << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"kernel_source\":\"" + tuned + "\""), std::string::npos)
      << pl.to_json();
  // A kernel asked for is never overridden: by the options, or by the setting.
  o.kernel = "grid";
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "forced");
  EXPECT_EQ(pl.source, tuned);  // (the grid entry's tile)
  EXPECT_EQ(pl.tile, 256);
  o.kernel = "";
  molora::set_setting("MOLORA_LORA_KERNEL", "grid");
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "forced");
  molora::set_setting("MOLORA_LORA_KERNEL", std::nullopt);
  // A P outside the bucket: the bounds (P = 128 >= 96: stream; P = 16: grid).
  pb.num_tokens = 16;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.kernel_source, "heuristic");
  pb.num_tokens = 2;
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "heuristic");
  pb.num_tokens = 8;
  // The grid kernel faster: grid, its entry's tile.
  write(entry("grid", 33, 64, 256, "4.5") + ", " + entry("stream", 33, 64, 512, "5.25"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, tuned);
  EXPECT_EQ(pl.tile, 256);
  // Within 3% (the tuner's noise): the bounds' kernel, either way.
  write(entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 33, 64, 512, "6.35"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, tuned);
  pb.num_tokens = 16;  // P = 128: the bounds say stream; the grid entry 2% faster
  write(entry("grid", 65, 128, 256, "6.37") + ", " + entry("stream", 65, 128, 512, "6.5"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.kernel_source, tuned);
  write(entry("grid", 65, 128, 256, "6.0") + ", " + entry("stream", 65, 128, 512, "6.5"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());  // 7.7% faster: grid
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, tuned);
  EXPECT_EQ(pl.tile, 256);
  pb.num_tokens = 8;
  // Nothing to compare: the bounds. A stream entry without a time, or of another bucket, or a
  // bucket with only the grid kernel's entry (a file from before the tuner timed both).
  const std::string others[] = {
      entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 33, 64, 512, ""),
      entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 9, 64, 512, "5.25"),
      entry("grid", 33, 64, 256, "6.5"),
      entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 33, 64, 512, "\"5.25\""),
      entry("grid", 33, 64, 256, "0") + ", " + entry("stream", 33, 64, 512, "5.25"),
  };
  for (const std::string& e : others) {
    SCOPED_TRACE(e);
    write(e);
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.kernel, "grid");
    EXPECT_EQ(pl.kernel_source, "heuristic");
  }
  // Where the stream kernel does not apply (plain routing past 2048 pairs), its entry is not
  // taken however fast.
  pb.num_tokens = 512;  // P = 4096
  write(entry("grid", 2049, 4096, 256, "60") + ", " + entry("stream", 2049, 4096, 512, "1"));
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "heuristic");
  // "none": no file at all.
  pb.num_tokens = 8;
  write(entry("grid", 33, 64, 256, "6.5") + ", " + entry("stream", 33, 64, 512, "5.25"));
  o.config_path = "none";
  ASSERT_TRUE(plan(pb, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "heuristic");
  EXPECT_EQ(pl.source, "heuristic");
  std::remove(path.c_str());
}

// A config file (or entry) the kernels cannot use is ignored: the call plans with the
// heuristic (and the log says why, once) instead of failing or crashing. Found by
// tests/extra/lora_fuzz.sh: "entries" that is not a list threw from nlohmann::json and ended the
// process; a float tile was converted to int (undefined behaviour); an entry with a tile the
// kernel does not take made every call of its shape fail. Each file is written to the same
// path, one after the other (a file rewritten within a second is read again).
TEST(LoraPlan, BadConfigFilesAndEntriesFallBackToTheHeuristic) {
  const std::string path = testing::TempDir() + "lora_bad_config_test.json";
  Problem pb = problem(Op::kExpand, 8, 128, 16, 2048);
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = path;
  Plan heur;
  {
    PlanOptions h = o;
    h.config_path = "none";
    ASSERT_TRUE(plan(pb, &heur, h).ok());
  }
  const std::string good =
      R"({"op": "expand", "dtype": "bf16", "routing": "plain", "dim": 2048, "r_max": 16, )"
      R"("p_min": 9, "p_max": 64, "tile": 256, "unroll": 8})";
  auto with = [&](const std::string& field, const std::string& value) {
    std::string e = good;
    const size_t at = e.find("\"" + field + "\": ");
    const size_t end = e.find_first_of(",}", at);
    return e.substr(0, at) + "\"" + field + "\": " + value + e.substr(end);
  };
  struct Doc {
    const char* name;
    std::string text;
    bool tuned;
  };
  const Doc docs[] = {
      {"the good entry", "{\"entries\": [" + good + "]}", true},
      {"entries a number", R"({"entries": 5})", false},
      {"entries an object", R"({"entries": {"op": "expand"}})", false},
      {"a list, not an object", "[" + good + "]", false},
      {"truncated", "{\"entries\": [" + good, false},
      {"empty file", "", false},
      {"an entry that is a number, then the good one", "{\"entries\": [7, " + good + "]}", true},
      {"dim a string", "{\"entries\": [" + with("dim", "\"2048\"") + "]}", false},
      {"tile a float past int", "{\"entries\": [" + with("tile", "1e30") + "]}", false},
      {"tile past int", "{\"entries\": [" + with("tile", "4294967552") + "]}", false},
      {"p_max past int64", "{\"entries\": [" + with("p_max", "18446744073709551615") + "]}", false},
      {"tile 12 (not a multiple of 8)", "{\"entries\": [" + with("tile", "12") + "]}", false},
      {"unroll 5", "{\"entries\": [" + with("unroll", "5") + "]}", false},
      {"tile -256", "{\"entries\": [" + with("tile", "-256") + "]}", false},
      {"op null", "{\"entries\": [" + with("op", "null") + "]}", false},
      {"heuristic a string",
       "{\"entries\": [" + good.substr(0, good.size() - 1) + ", \"heuristic\": \"no\"}]}", false},
      {"heuristic false (the tuner's own tile)",
       "{\"entries\": [" + good.substr(0, good.size() - 1) + ", \"heuristic\": false}]}", true},
  };
  size_t i = 0;
  for (const Doc& d : docs) {
    SCOPED_TRACE(d.name);
    {
      // Padded to a size of its own: the planner rereads a file whose modification time or size
      // changed, and two writes within the file system's clock tick share a time.
      std::ofstream f(path, std::ios::trunc);
      ASSERT_LT(d.text.size(), 1000u);
      f << d.text << std::string(1000 + i++ - d.text.size(), ' ');
    }
    Plan pl;
    const Status st = plan(pb, &pl, o);
    ASSERT_TRUE(st.ok()) << st.to_string();
    if (d.tuned) {
      EXPECT_EQ(pl.source, "tuned:" + path);
      EXPECT_EQ(pl.tile, 256);
      EXPECT_EQ(pl.unroll, 8);
    } else {
      EXPECT_EQ(pl.source, "heuristic");
      EXPECT_EQ(pl.tile, heur.tile);
      EXPECT_EQ(pl.unroll, heur.unroll);
    }
  }
  std::remove(path.c_str());
}

// An entry whose tile the tuner left to the heuristic ("heuristic": true) gives the heuristic's
// tile at the call's own P, whatever tile the entry holds (the heuristic's at the bucket's P);
// an entry with the tuner's own tile ("heuristic": false, or no field) gives that tile at every
// P of its bucket. Grid expand N6144 r32, one bucket [9, 64] as the H200's file before v0.30
// has: at T=2 (P=16) the heuristic takes 512 rows, the entry 2048 (the tile that ran 13.2 us
// there on the H200, more than T=8's 12.5, bench/NOTES.md "lora v0.29").
TEST(LoraPlan, HeuristicEntryFollowsTheCallsPairCount) {
  const std::string path = testing::TempDir() + "lora_heuristic_entry_test.json";
  int writes = 0;
  auto write = [&](const std::string& heuristic_field) {
    const std::string text =
        R"({"entries": [{"op": "expand", "kernel": "grid", "dtype": "bf16", "routing": "aligned", )"
        R"("dim": 6144, "r_max": 32, "p_min": 9, "p_max": 64, "tile": 2048, "unroll": 8)" +
        heuristic_field + "}]}";
    std::ofstream f(path, std::ios::trunc);  // (a size of its own each time: see above)
    ASSERT_LT(text.size(), 1000u);
    f << text << std::string(1000 + writes++ - text.size(), ' ');
  };
  PlanOptions o, none;
  o.sm_count = none.sm_count = 132;
  o.kernel = none.kernel = "grid";
  o.config_path = path;
  none.config_path = "none";
  Problem pb = seed_expand_aligned();
  const std::string tuned = "tuned:" + path;
  for (int T : {2, 4, 8}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    pb.num_tokens = T;
    pb.sorted_len = T * 8 + 1280 * 15;
    Plan heur, pl;
    ASSERT_TRUE(plan(pb, &heur, none).ok());
    EXPECT_EQ(heur.source, "heuristic");
    write(", \"heuristic\": true");
    ASSERT_TRUE(plan(pb, &pl, o).ok());
    EXPECT_EQ(pl.source, "heuristic");
    EXPECT_EQ(pl.tile, heur.tile);
    EXPECT_EQ(pl.unroll, heur.unroll);
    if (T == 2) {
      EXPECT_EQ(heur.tile, 512);  // (the heuristic follows P: 2,048 only at P = 64)
    }
    for (const char* field : {", \"heuristic\": false", ""}) {
      write(field);
      ASSERT_TRUE(plan(pb, &pl, o).ok());
      EXPECT_EQ(pl.source, tuned) << field;
      EXPECT_EQ(pl.tile, 2048) << field;
      EXPECT_EQ(pl.unroll, 8) << field;
    }
  }
  std::remove(path.c_str());
}

// detail::check_plan, the kernels' guard against a plan passed in (shrink / expand / moe_delta
// with plan_in): the planner's own plans pass; a plan of another shape, or one edited off the
// planner's rules, is refused with the reason. Before, only kernel, shape, chunks, items and
// grid were checked: a grid shrink tile of 3 (a path the planner never makes and no test runs)
// was launched, and an aligned grid plan for blocks of 16 passed for blocks of 64 with the same
// block count, its shared memory a quarter of what the member list writes.
TEST(LoraPlan, CheckPlanRefusesPlansTheKernelsCannotRun) {
  PlanOptions o = heuristic_options();
  auto refused = [&](const Problem& pb, const Plan& pl, const char* why) {
    const Status st = molora::lora::detail::check_plan(pb, pl);
    EXPECT_FALSE(st.ok()) << why;
    EXPECT_NE(st.message().find("plan does not match the problem"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  // The planner's plans pass, on both kernels, both ops, both routings.
  for (Op op : {Op::kShrink, Op::kExpand})
    for (int64_t T : {1, 8, 64, 600})
      for (int routing = 0; routing < 2; ++routing)
        for (const char* kernel : {"", "grid", "stream"}) {
          Problem pb = problem(op, T, 160, 32, 2048);
          if (routing == 1) {
            pb.routing = RoutingKind::kAligned;
            pb.block_size = 16;
            pb.sorted_len = T * 8 + 1280 * 15;
          }
          if (std::string(kernel) == "stream" && routing == 0 && T * 8 > 2048) continue;
          PlanOptions k = o;
          k.kernel = kernel;
          Plan pl;
          ASSERT_TRUE(plan(pb, &pl, k).ok());
          const Status st = molora::lora::detail::check_plan(pb, pl);
          EXPECT_TRUE(st.ok()) << st.to_string();
        }
  // Grid shrink, plain routing (grouped pairs).
  Problem pb = problem(Op::kShrink, 8, 160, 32, 2048);
  o.kernel = "grid";
  Plan base;
  ASSERT_TRUE(plan(pb, &base, o).ok());
  ASSERT_EQ(base.kernel, "grid");
  Plan q = base;
  q.tile = 3, q.chunks = 11, q.max_items = 64 * 11;  // consistent counts, a tile off the rule
  refused(pb, q, "power of two");
  q = base, q.unroll = 5;
  refused(pb, q, "unroll must be 4 or 8");
  q = base, q.smem_bytes = 16;
  refused(pb, q, "shared memory");
  q = base, q.grid = 0;
  refused(pb, q, "grid must be");
  q = base, q.chunks += 1;
  refused(pb, q, "chunks");
  q = base, q.kernel = "fast";
  refused(pb, q, "grid or stream");
  q = base, q.kernel = "stream";  // a grid plan's threads and stages on the stream kernel
  refused(pb, q, "not a shape the kernel takes");
  {
    Problem big = problem(Op::kShrink, 300, 160, 32, 2048);  // P = 2400: past plain streaming
    Plan sp;
    ASSERT_TRUE(plan(problem(Op::kShrink, 256, 160, 32, 2048), &sp, PlanOptions{o}).ok());
    PlanOptions so = o;
    so.kernel = "stream";
    ASSERT_TRUE(plan(problem(Op::kShrink, 256, 160, 32, 2048), &sp, so).ok());
    sp.groups = 2400, sp.max_items = 2400 * sp.chunks;
    refused(big, sp, "plain routing with num_tokens * top_k <= 2048");
  }
  {
    Problem big = problem(Op::kShrink, 600, 160, 32, 2048);  // P = 4800: pairs, not grouped
    Plan pb_plan;
    ASSERT_TRUE(plan(big, &pb_plan, o).ok());
    EXPECT_EQ(pb_plan.group_cap, 0);
    pb_plan.group_cap = 4096;
    pb_plan.smem_bytes = 1 << 20;
    refused(big, pb_plan, "grouped only up to");
  }
  // Aligned, grid: a plan for blocks of 16 against blocks of 64 with the same block count.
  Problem a16 = problem(Op::kExpand, 8, 160, 32, 2048);
  a16.routing = RoutingKind::kAligned, a16.block_size = 16, a16.sorted_len = 1024;
  Problem a64 = a16;
  a64.block_size = 64, a64.sorted_len = 4096;
  Plan p16;
  ASSERT_TRUE(plan(a16, &p16, o).ok());
  ASSERT_TRUE(molora::lora::detail::check_plan(a16, p16).ok());
  refused(a64, p16, "shared memory");
  // Stream: threads and stages the kernel does not take, a tile off its rule.
  o.kernel = "stream";
  Problem s16 = a16;
  Plan ps;
  ASSERT_TRUE(plan(s16, &ps, o).ok());
  ASSERT_EQ(ps.kernel, "stream");
  q = ps, q.stages = 1;
  refused(s16, q, "stages");
  q = ps, q.threads = 33;
  refused(s16, q, "threads");
  q = ps, q.tile = 48, q.chunks = static_cast<int>(molora::cdiv(2048, 48));
  q.max_items = 64 * q.chunks;
  refused(s16, q, "multiple of 32");
  Problem s64 = a64;  // blocks past the stream kernel's
  refused(s64, ps, "block_size <= 32");
}

TEST(LoraPlan, DefaultConfigPathNamesTheGpu) {
  std::string p = default_config_path("NVIDIA H200");
  EXPECT_NE(p.find("configs/lora/nvidia_h200.json"), std::string::npos) << p;
}
