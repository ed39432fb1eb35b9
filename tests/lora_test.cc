// lora CPU suite: the reference against a naive fp64 loop, plain vs aligned routing, the
// planner, and input validation (errors name the argument, nothing is written).
#include <cstdio>
#include <fstream>

#include "lora/lora_bench.h"
#include "lora/memo_cache.h"
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
  }
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
// The issue's seed expand shape, plain routing: N=6144, r=32, 8 slots x 160 experts, T=64, k=8.
Problem seed_expand_problem() {
  Problem pb;
  pb.op = Op::kExpand;
  pb.num_tokens = 64;
  pb.top_k = 8;
  pb.num_slots = 8;
  pb.num_experts = 160;
  pb.r_max = 32;
  pb.N = 6144;
  return pb;
}
// The same on the align layout: blocks of 16 pairs, sorted_len for P = 512 and V = 1280.
Problem seed_expand_aligned() {
  Problem pb = seed_expand_problem();
  pb.routing = RoutingKind::kAligned;
  pb.block_size = 16;
  pb.sorted_len = 512 + 1280 * 15;
  return pb;
}
}  // namespace

TEST(LoraPlan, HeuristicFieldsAreConsistent) {
  Problem pb = seed_expand_problem();
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = "none";
  Plan pl;
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
// Programmatic dependent launch: by default on the stream kernels and grid expand (where it
// measured faster), never on grid shrink; MOLORA_LORA_PDL=1 / 0 force it; other values are an
// error naming the setting. The plan says so.
TEST(LoraPlan, DependentLaunchChoice) {
  struct Reset {
    ~Reset() { molora::set_setting("MOLORA_LORA_PDL", std::nullopt); }
  } reset;
  Problem pb = seed_expand_aligned();
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = "none";
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
  EXPECT_FALSE(pl.pdl);  // grid shrink
  EXPECT_EQ(pl.to_string().find(" pdl"), std::string::npos) << pl.to_string();
  EXPECT_NE(pl.to_json().find("\"pdl\":false"), std::string::npos);
  o.kernel.clear();
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_TRUE(pl.pdl);  // stream shrink
  molora::set_setting("MOLORA_LORA_PDL", "0");
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_FALSE(pl.pdl);
  molora::set_setting("MOLORA_LORA_PDL", "1");
  o.kernel = "grid";
  ASSERT_TRUE(plan(sh, &pl, o).ok());
  EXPECT_TRUE(pl.pdl);
  molora::set_setting("MOLORA_LORA_PDL", "yes");
  Status st = plan(sh, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("MOLORA_LORA_PDL"), std::string::npos) << st.message();
}

TEST(LoraPlan, StreamKernelChoice) {
  Problem pb = seed_expand_aligned();
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = "none";
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
  pb.routing = RoutingKind::kPlain;
  pb.block_size = 0;
  pb.sorted_len = 0;
  EXPECT_FALSE(plan(pb, &pl, o).ok());
  o.kernel = "fast";
  st = plan(pb, &pl, o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("grid or stream"), std::string::npos) << st.message();
}

// Every stream shape the settings accept fits the 227 KiB the kernels ask for, with barriers
// and partial sums aligned; one stage more than the maximum is refused.
TEST(LoraPlan, StreamLayoutFitsEveryAcceptedShape) {
  namespace d = molora::lora::detail;
  for (Op op : {Op::kExpand, Op::kShrink})
    for (int c = 1; c <= d::stream_max_consumers(op); ++c) {
      const int threads = d::stream_threads(op, c), smax = d::stream_max_stages(op, c);
      EXPECT_EQ(d::stream_consumers_of(op, threads), c);
      if (smax < 2) {
        EXPECT_FALSE(d::stream_shape_ok(op, threads, 2)) << c;
        continue;
      }
      for (int st = 2; st <= smax; ++st) {
        ASSERT_TRUE(d::stream_shape_ok(op, threads, st)) << c << " " << st;
        const d::StreamLayout l = d::stream_layout(op, st, c);
        EXPECT_LE(l.total, 227u * 1024) << c << " " << st;
        EXPECT_EQ(l.full % 8, 0u);
        EXPECT_EQ(l.ready % 8, 0u);
        EXPECT_EQ(l.part % 8, 0u);
        EXPECT_GE(l.full, static_cast<size_t>(st) * (op == Op::kExpand ? 1 : c) *
                              d::stream_stage_bytes(op));
      }
      EXPECT_FALSE(d::stream_shape_ok(op, threads, smax + 1)) << c;
    }
  EXPECT_FALSE(d::stream_shape_ok(Op::kShrink, d::stream_threads(Op::kShrink, 13), 2));
  EXPECT_FALSE(d::stream_shape_ok(Op::kExpand, d::stream_threads(Op::kExpand, 12), 2));
}

TEST(LoraPlan, ShrinkTileSplitsRowsAtSmallBatches) {
  Problem pb;
  pb.op = Op::kShrink;
  pb.num_tokens = 1;
  pb.top_k = 8;
  pb.num_slots = 8;
  pb.num_experts = 256;
  pb.r_max = 32;
  pb.K = 7168;
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = "none";
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
  Problem pb;
  pb.op = Op::kExpand;
  pb.num_tokens = 8;
  pb.top_k = 8;
  pb.num_slots = 8;
  pb.num_experts = 128;
  pb.r_max = 16;
  pb.N = 2048;
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = path;
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

TEST(LoraPlan, DefaultConfigPathNamesTheGpu) {
  std::string p = default_config_path("NVIDIA H200");
  EXPECT_NE(p.find("configs/lora/nvidia_h200.json"), std::string::npos) << p;
}

// `molora bench lora --shape`: the seed names and the N<dim>_r<r>_V<E>x<S> form, every field
// checked against the kernels' limits.
TEST(LoraBench, ParseShapeTakesSeedAndCustomNames) {
  namespace b = molora::lora::bench;
  b::Shape sh;
  ASSERT_TRUE(b::parse_shape("N6144_r32_V160x8", &sh));
  EXPECT_EQ(sh.dim, 6144);
  EXPECT_EQ(sh.r, 32);
  EXPECT_EQ(sh.E, 160);
  EXPECT_EQ(sh.S, 8);
  ASSERT_TRUE(b::parse_shape("N16384_r128_V8192x8", &sh));
  EXPECT_EQ(sh.name, "N16384_r128_V8192x8");
  EXPECT_EQ(sh.dim, 16384);
  EXPECT_EQ(sh.r, 128);
  EXPECT_EQ(sh.E, 8192);
  EXPECT_EQ(sh.S, 8);
  ASSERT_TRUE(b::parse_shape("N8_r8_V1x1", &sh));
  EXPECT_EQ(sh.dim, 8);
  const b::Shape before = sh;
  for (const char* bad :
       {"", "N0_r8_V1x1", "N12_r8_V1x1", "N16392_r8_V1x1", "N64_r24_V1x1", "N64_r256_V1x1",
        "N64_r8_V0x1", "N64_r8_V1x0", "N64_r8_V65537x1", "N64_r8_V256x257", "N064_r8_V1x1",
        "N64_r8_V1x1x", "N-64_r8_V1x1", "N64_r8", "n64_r8_V1x1"}) {
    EXPECT_FALSE(b::parse_shape(bad, &sh)) << bad;
    EXPECT_EQ(sh.name, before.name) << bad;  // untouched
  }
}

// `molora bench lora --timeline`: the summary of the stream kernels' timeline records. Three
// calls of 4 CTAs laid out alike relative to the previous call's last CTA end (CTA 3 has no
// task: no copy words), so every median is the one call's statistic.
TEST(LoraBench, TimelineSummaryFromRecords) {
  namespace b = molora::lora::bench;
  constexpr int W = detail::kTraceWords, calls = 3, grid = 4;
  std::vector<unsigned long long> w(size_t(calls) * grid * W);
  const int tasks[grid] = {5, 6, 6, 0};
  for (int i = 0; i < calls; ++i) {
    const unsigned long long base = 1000000 + 10000ull * i, prev = base - 4700;
    for (int c = 0; c < grid; ++c) {
      unsigned long long* r = &w[(size_t(i) * grid + c) * W];
      r[0] = prev + 200 + 32 * c;
      r[1] = prev + 1000 + 10 * c;
      r[2] = prev + 1500;
      r[3] = c < 3 ? prev + 2000 + 100 * c : 0;
      r[4] = c < 3 ? prev + 3000 + 100 * c : 0;
      r[5] = prev + 4000;
      r[6] = base + 5000 + 100 * c;  // the last CTA: base + 5300 = the next call's prev
      r[7] = tasks[c];
      for (int e = 0; e < 7; ++e)  // a 2 GHz clock, started at 1e6 at the CTA's start
        r[8 + e] = r[e] != 0 ? 1000000 + 2 * (r[e] - r[0]) : 0;
    }
  }
  b::Timeline t;
  ASSERT_TRUE(b::summarize_timeline(w, calls, grid, &t).ok());
  EXPECT_EQ(t.calls, 2);
  EXPECT_EQ(t.grid, 4);
  EXPECT_NEAR(t.start_min, 0.2, 1e-9);
  EXPECT_NEAR(t.start_med, 0.248, 1e-9);
  EXPECT_NEAR(t.wait_med, 1.015, 1e-9);
  EXPECT_NEAR(t.wait_max, 1.03, 1e-9);
  EXPECT_NEAR(t.known_med, 1.5, 1e-9);
  EXPECT_NEAR(t.issue_med, 2.1, 1e-9);
  EXPECT_NEAR(t.issue_max, 2.2, 1e-9);
  EXPECT_NEAR(t.land_med, 3.1, 1e-9);
  EXPECT_NEAR(t.land_max, 3.2, 1e-9);
  EXPECT_NEAR(t.first_done_med, 4.0, 1e-9);
  EXPECT_NEAR(t.end_min, 9.7, 1e-9);
  EXPECT_NEAR(t.end_med, 9.85, 1e-9);
  EXPECT_NEAR(t.end_max, 10.0, 1e-9);
  EXPECT_NEAR(t.tasks_mean, 4.25, 1e-9);
  EXPECT_EQ(t.tasks_max, 6);
  EXPECT_NEAR(t.busiest_end, 9.8, 1e-9);  // CTA 1: the first with 6 tasks
  EXPECT_EQ(t.timer_step_ns, 32);
  // By the CTAs' clocks: (event - start) in ns, averaged over the CTAs that have the event.
  EXPECT_NEAR(t.clock_ghz, 2.0, 1e-9);
  EXPECT_NEAR(t.c_wait, 0.767, 1e-9);        // 800 - 22c
  EXPECT_NEAR(t.c_issue, 1.868, 1e-9);       // 1800 + 68c, c < 3
  EXPECT_NEAR(t.c_end, 9.602, 1e-9);         // 9500 + 68c
  EXPECT_NEAR(t.c_first_done, 3.752, 1e-9);  // 3800 - 32c
  const std::string f = b::format_timeline(t);
  EXPECT_NE(f.find("median of 2 calls, 4 CTAs"), std::string::npos) << f;
  EXPECT_NE(f.find("max  10.00 (the call)"), std::string::npos) << f;
  EXPECT_EQ(f.find("no clock estimate"), std::string::npos) << f;
  EXPECT_NE(b::format_timeline(b::Timeline{}).find("none"), std::string::npos);
  {  // CTAs that all ran under 2 us: no clock estimate, and the line says so
    std::vector<unsigned long long> shortw = w;
    for (size_t k = 0; k < shortw.size(); k += W)
      for (int e = 1; e < 7; ++e)
        if (shortw[k + e] != 0) shortw[k + e] = shortw[k] + (shortw[k + e] - shortw[k]) / 8;
    b::Timeline ts;
    ASSERT_TRUE(b::summarize_timeline(shortw, calls, grid, &ts).ok());
    EXPECT_EQ(ts.clock_ghz, 0.0);
    EXPECT_NE(b::format_timeline(ts).find("no clock estimate"), std::string::npos);
  }

  // Bad records: refused, the output untouched.
  const b::Timeline before = t;
  EXPECT_FALSE(b::summarize_timeline(w, 1, grid, &t).ok());
  EXPECT_FALSE(b::summarize_timeline(w, calls, grid + 1, &t).ok());
  EXPECT_FALSE(b::summarize_timeline(w, calls, 0, &t).ok());
  std::vector<unsigned long long> hole = w;
  hole[(size_t(2) * grid + 1) * W + 6] = 0;  // call 2, CTA 1: no warp done
  const Status st = b::summarize_timeline(hole, calls, grid, &t);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("call 2 CTA 1"), std::string::npos) << st.message();
  EXPECT_EQ(t.end_max, before.end_max);
  EXPECT_EQ(t.calls, before.calls);
}

// The stream kernels' tensor-map memo (memo_cache.h): a hit returns what make() stored for that
// exact key, make() runs once per key, every byte of the key counts, and the least recently used
// key is the one evicted at capacity.
TEST(LoraMemoCache, HitsMissesAndLeastRecentlyUsedEviction) {
  struct Key {
    uint64_t w;
    int64_t d;
    int32_t kind, tile;
  };
  detail::MemoCache<Key, int64_t> cache(3);
  int makes = 0;
  auto get = [&](Key k) {
    return cache.get(k, [&](int64_t* v) {
      ++makes;
      *v = int64_t(k.w) * 1000 + k.d * 10 + k.kind + 100 * k.tile;
    });
  };
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t base = rng() >> 20;
  const Key a{base, 7, 0, 0}, b{base + 16, 7, 0, 0}, c{base, 8, 0, 0}, d{base, 7, 1, 0};
  EXPECT_EQ(get(a), int64_t(base) * 1000 + 70);
  EXPECT_EQ(get(b), int64_t(base + 16) * 1000 + 70);
  EXPECT_EQ(get(a), int64_t(base) * 1000 + 70);  // hit: no new make
  EXPECT_EQ(makes, 2);
  EXPECT_EQ(get(c), int64_t(base) * 1000 + 80);  // differs from a in one field only
  EXPECT_EQ(makes, 3);
  auto st = cache.stats();
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 3u);
  EXPECT_EQ(st.size, 3u);
  EXPECT_EQ(st.capacity, 3u);
  // Full (a, b, c; b least recently used): d evicts b, so b is made again and a stays.
  EXPECT_EQ(get(d), int64_t(base) * 1000 + 71);
  EXPECT_EQ(makes, 4);
  EXPECT_EQ(get(a), int64_t(base) * 1000 + 70);
  EXPECT_EQ(makes, 4);
  EXPECT_EQ(get(b), int64_t(base + 16) * 1000 + 70);
  EXPECT_EQ(makes, 5);
  EXPECT_EQ(cache.stats().size, 3u);  // never more than the capacity
  // (b's return evicted c, the least recently used then)
  EXPECT_EQ(get(c), int64_t(base) * 1000 + 80);
  EXPECT_EQ(makes, 6);
  cache.clear();
  st = cache.stats();
  EXPECT_EQ(st.size, 0u);
  EXPECT_EQ(st.hits + st.misses, 0u);
}

// A layer cycle longer than one entry per op (an eager engine alternating layers): after the
// first pass every lookup hits, for any cycle that fits the capacity; a cycle past it misses on
// every lookup (LRU), which the capacity (512 in lora_stream.cu) is sized to avoid.
TEST(LoraMemoCache, LayerCyclesWithinCapacityHitAfterOnePass) {
  struct Key {
    uint64_t w;
    int64_t d;
  };
  std::mt19937_64 rng(std::random_device{}());
  const int cap = 8 + int(rng() % 56);
  for (const int layers : {1, 2, cap - 1, cap, cap + 1}) {
    detail::MemoCache<Key, int> cache(static_cast<size_t>(cap));
    int makes = 0;
    for (int pass = 0; pass < 4; ++pass)
      for (int l = 0; l < layers; ++l)
        EXPECT_EQ(cache.get(Key{uint64_t(l) * 256, 4096},
                            [&](int* v) {
                              ++makes;
                              *v = l;
                            }),
                  l);
    EXPECT_EQ(makes, layers <= cap ? layers : 4 * layers) << "layers " << layers << " cap " << cap;
  }
}

// The stream kernels' divisions by launch constants (fastdiv.h): n / d and n % d exactly, for
// edge values (0, d - 1, d, d + 1, powers of two and their neighbours, 2^31 - 1) and random
// ones, for every divisor class the kernels use (1, small, powers of two, up to 2^31 - 1).
TEST(LoraFastDiv, MatchesIntegerDivision) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<uint32_t> ds = {1,
                              2,
                              3,
                              5,
                              7,
                              8,
                              11,
                              12,
                              16,
                              24,
                              31,
                              32,
                              33,
                              64,
                              100,
                              128,
                              132,
                              160,
                              255,
                              256,
                              257,
                              1000,
                              4095,
                              4096,
                              4097,
                              65535,
                              65536,
                              65537,
                              (1u << 30) - 1,
                              1u << 30,
                              (1u << 30) + 1,
                              (1u << 31) - 1};
  for (int i = 0; i < 200; ++i) ds.push_back(1 + uint32_t(rng() % ((1u << 31) - 1)));
  for (int i = 0; i < 200; ++i) ds.push_back(1 + uint32_t(rng() % 4096));
  const uint32_t top = (1u << 31) - 1;
  for (uint32_t d : ds) {
    const detail::FastDiv f(d);
    ASSERT_EQ(f.d, d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, top, top - 1, top - d};
    if (d < top) ns.push_back(d + 1);
    if (d < top / 2) ns.push_back(2 * d - 1), ns.push_back(2 * d), ns.push_back(2 * d + 1);
    for (int b = 0; b < 31; ++b) ns.push_back(1u << b), ns.push_back((1u << b) - 1);
    for (int i = 0; i < 2000; ++i) ns.push_back(uint32_t(rng() % (uint64_t(top) + 1)));
    for (uint32_t n : ns) {
      if (n > top) continue;  // (the wrapped d - 1 of d = 0 cannot occur: d >= 1)
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
      ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
    }
  }
  // Divisors out of range are taken as 1 (the kernels' divisors are validated before).
  EXPECT_EQ(detail::FastDiv(0).d, 1u);
  EXPECT_EQ(detail::FastDiv(int64_t(1) << 31).d, 1u);
}
