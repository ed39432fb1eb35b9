// lora host helpers without a GPU: the benchmark's shape names and timeline summary, the stream
// kernels' tensor-map memo (memo_cache.h) and their divisions by launch constants (fastdiv.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "core/cuda_util.h"
#include "lora/fastdiv.h"
#include "lora/lora_bench.h"
#include "lora/memo_cache.h"
#include "lora_test_util.h"

using namespace lora_test;

// The benchmark's copy of the same bytes (Result::copy_us): nothing to copy is 0 us and needs
// no device; a size to copy is a positive time, the same one when asked again (one measurement
// per size), or, without a usable GPU, an error Status (never a crash).
TEST(LoraBench, SameBytesCopy) {
  double us = -1;
  ASSERT_TRUE(molora::lora::bench::measure_copy_us(0, &us).ok());
  EXPECT_EQ(us, 0.0);
  ASSERT_TRUE(molora::lora::bench::measure_copy_us(-5, &us).ok());
  EXPECT_EQ(us, 0.0);
  const bool gpu = molora::require_gpu().ok();
  const molora::Status st = molora::lora::bench::measure_copy_us(3 << 20, &us);
  EXPECT_EQ(st.ok(), gpu) << st.to_string();
  if (!gpu) return;
  EXPECT_GT(us, 0.0);
  double again = -1;
  ASSERT_TRUE(molora::lora::bench::measure_copy_us((3 << 20) - 100, &again).ok());
  EXPECT_EQ(again, us);  // (the same 4 KiB step: the measurement kept)
}

// Case::weight_copies: outside [0, kWeightCopiesMax] is an error naming it, and so is a shape with
// fewer experts than top-k (it divided by zero drawing the routing), both before any device
// work; on a GPU, 0 takes one copy per rotating routing (16 for a small shape), and a
// count above 16 is honoured (the timed graph holds that many calls).
TEST(LoraBench, WeightCopies) {
  namespace b = molora::lora::bench;
  b::Case c;
  ASSERT_TRUE(b::parse_shape("N64_r8_V8x2", &c.shape));
  c.T = 3;
  b::Result r;
  {  // (fewer experts than top-k: the routing cannot draw k distinct ones)
    b::Case few = c;
    ASSERT_TRUE(b::parse_shape("N64_r8_V4x2", &few.shape));
    const molora::Status st = b::run_case(few, 1000.0, &r);
    ASSERT_FALSE(st.ok());
    if (st.code() != molora::StatusCode::kUnavailable) {
      EXPECT_EQ(st.code(), molora::StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find("experts 4"), std::string::npos) << st.to_string();
    }
  }
  for (int bad : {-1, b::kWeightCopiesMax + 1}) {
    c.weight_copies = bad;
    const molora::Status st = b::run_case(c, 1000.0, &r);
    ASSERT_FALSE(st.ok()) << bad;
    if (st.code() == molora::StatusCode::kUnavailable) continue;  // (built without CUDA)
    EXPECT_EQ(st.code(), molora::StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("weight_copies"), std::string::npos) << st.to_string();
  }
  if (!molora::require_gpu().ok()) {  // a valid case without a GPU: Unavailable, saying why
    c.weight_copies = 0;
    const molora::Status st = b::run_case(c, 1000.0, &r);
    EXPECT_EQ(st.code(), molora::StatusCode::kUnavailable) << st.to_string();
    GTEST_SKIP() << "no GPU: the timed cases need one";
  }
  for (int want : {0, 1, 40}) {
    c.weight_copies = want;
    const molora::Status st = b::run_case(c, 1000.0, &r);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(r.weight_copies, want == 0 ? b::kWeightCopiesAuto : want);
    EXPECT_GT(r.us, 0.0);
    EXPECT_GT(r.bytes, 0);
  }
}

// Case::align_first (`molora bench lora --routing align`, the table's al+align rows): with
// anything but aligned routing at block 16 or 32, or with layers or the timeline, an error
// naming it before any device work. On a GPU each timed call runs the align kernel and then the
// aligned call, and run_case checks the device's align output against the layout built on the
// host (a mismatch is an error): T = 1, 3 and 64, every token with an adapter, half, none
// (nothing to align), both blocks, and a moe_delta pair.
TEST(LoraBench, AlignFirst) {
  namespace b = molora::lora::bench;
  b::Case c;
  ASSERT_TRUE(b::parse_shape("N64_r8_V8x2", &c.shape));
  c.align_first = true;
  c.routing = molora::lora::RoutingKind::kAligned;
  b::Result r;
  auto bad = [&](b::Case bc, const char* want) {
    const molora::Status st = b::run_case(bc, 1000.0, &r);
    ASSERT_FALSE(st.ok()) << want;
    if (st.code() == molora::StatusCode::kUnavailable) return;  // (built without CUDA)
    EXPECT_EQ(st.code(), molora::StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(want), std::string::npos) << st.to_string();
  };
  {
    b::Case bc = c;
    bc.routing = molora::lora::RoutingKind::kPlain;
    bad(bc, "routing must be aligned");
  }
  for (int blk : {8, 64}) {
    b::Case bc = c;
    bc.block = blk;
    bad(bc, "block must be 16 or 32");
  }
  {
    b::Case bc = c;
    bc.layers = 4;
    bad(bc, "layers and timeline");
    bc.layers = 0;
    bc.timeline = true;
    bad(bc, "layers and timeline");
  }
  if (!molora::require_gpu().ok()) GTEST_SKIP() << "no GPU: the timed cases need one";
  for (int blk : {16, 32})
    for (int T : {1, 3, 64})
      for (double none : {0.0, 0.5, 1.0}) {
        for (auto op : {molora::lora::Op::kShrink, molora::lora::Op::kExpand}) {
          b::Case gc = c;
          gc.block = blk, gc.T = T, gc.none_frac = none, gc.op = op;
          const molora::Status st = b::run_case(gc, 1000.0, &r);
          ASSERT_TRUE(st.ok()) << "block " << blk << " T " << T << " none " << none << ": "
                               << st.to_string();
          EXPECT_GT(r.us, 0.0);
        }
      }
  b::Case dc = c;
  dc.op = molora::lora::Op::kShrink, dc.chain = true, dc.delta = true, dc.T = 64;
  const molora::Status st = b::run_case(dc, 1000.0, &r);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_GT(r.us, 0.0);
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

// The tuner's buckets: token counts each twice the one before, every P from 1 to the last
// count's in exactly one bucket ([p_min, p_max]).
TEST(LoraBench, TuneBucketsCoverEveryPairCountOnce) {
  const std::vector<int> ts = molora::lora::bench::tune_token_counts();
  ASSERT_FALSE(ts.empty());
  EXPECT_EQ(ts.front(), 1);
  for (int k : {1, 4, 8}) {
    int64_t next = 1;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (i > 0) {
        EXPECT_EQ(ts[i], 2 * ts[i - 1]);
      }
      EXPECT_EQ(molora::lora::bench::tune_p_min(ts[i], k), next) << "T=" << ts[i] << " k=" << k;
      next = int64_t{ts[i]} * k + 1;
    }
  }
}

// What the tuner writes for a bucket is what the planner reads back: the grid entry (the
// sweep's best tile only when > 3% faster than the heuristic's) and the stream entry, and the
// plan takes the faster kernel of the two with its entry's tile.
TEST(LoraBench, TuneEntriesPlanTheFasterKernel) {
  using molora::lora::bench::TuneBucket;
  const std::string path = testing::TempDir() + "lora_tune_entries_test.json";
  int writes = 0;
  TuneBucket b;
  b.op = Op::kShrink;
  b.shape = molora::lora::bench::seed_shapes()[0];  // K=6144 r32, 160 experts x 8 slots
  b.routing = RoutingKind::kPlain;
  b.T = 4, b.k = 8;
  b.heur_tile = 2, b.heur_unroll = 4, b.heur_us = 9.0;
  b.best_tile = 4, b.best_unroll = 8, b.best_us = 8.9;  // within 3%: the heuristic's tile
  b.stream = true, b.stream_tile = 8, b.stream_us = 9.5;
  Problem pb;
  pb.op = Op::kShrink;
  pb.num_tokens = 3;  // P = 24, in the T=4 bucket [17, 32]
  pb.top_k = 8;
  pb.num_slots = b.shape.S;
  pb.num_experts = b.shape.E;
  pb.r_max = b.shape.r;
  pb.K = b.shape.dim;
  PlanOptions o;
  o.sm_count = 132;
  o.config_path = path;
  const std::string tuned = "tuned:" + path;
  auto plan_with = [&](const TuneBucket& t, Plan* pl) {
    nlohmann::json doc = {{"entries", molora::lora::bench::tune_entries(t)}};
    {
      // (padded to a size of its own: the planner rereads a file whose modification time or
      // size changed, and two writes within the file system's clock tick share a time)
      const std::string text = doc.dump(1);
      EXPECT_LT(text.size(), 8000u);
      std::ofstream f(path, std::ios::trunc);
      f << text << std::string(8000 + writes++ - std::min<size_t>(text.size(), 8000), ' ');
    }
    const std::vector<nlohmann::json> es = molora::lora::bench::tune_entries(t);
    EXPECT_EQ(es.size(), t.stream ? 2u : 1u);
    for (const auto& e : es) {
      EXPECT_EQ(e["p_min"], 17);
      EXPECT_EQ(e["p_max"], 32);
      EXPECT_EQ(e["op"], "shrink");
      EXPECT_EQ(e["routing"], "plain");
    }
    return plan(pb, pl, o);
  };
  Plan pl, heur;
  {
    PlanOptions h = o;
    h.config_path = "none", h.kernel = "grid";
    ASSERT_TRUE(plan(pb, &heur, h).ok());
  }
  ASSERT_TRUE(plan_with(b, &pl).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, tuned);
  // The heuristic kept (8.9 is not 3% below 9.0): the entry says so ("heuristic": true), and the
  // planner takes its heuristic's tile at this P, not the entry's (2, the heuristic's at P = 32
  // in this made-up bucket).
  EXPECT_EQ(pl.source, "heuristic");
  EXPECT_EQ(pl.tile, heur.tile);
  EXPECT_NE(pl.tile, 2);
  EXPECT_EQ(pl.unroll, heur.unroll);
  b.best_us = 8.0;  // > 3% faster: the sweep's tile
  ASSERT_TRUE(plan_with(b, &pl).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.tile, 4);
  EXPECT_EQ(pl.unroll, 8);
  b.stream_us = 7.5;  // the stream kernel faster than the grid's best
  ASSERT_TRUE(plan_with(b, &pl).ok());
  EXPECT_EQ(pl.kernel, "stream");
  EXPECT_EQ(pl.kernel_source, tuned);
  EXPECT_EQ(pl.tile, 8);
  b.stream = false;  // not timed: the planner's bounds (33 pairs at this K * r_max: grid)
  ASSERT_TRUE(plan_with(b, &pl).ok());
  EXPECT_EQ(pl.kernel, "grid");
  EXPECT_EQ(pl.kernel_source, "heuristic");
  std::remove(path.c_str());
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
  EXPECT_EQ(f.find("plain grouping"), std::string::npos) << f;  // (no grouping marks)
  {  // plain routing: the grouping's line names only the steps its way marked
    b::Timeline tp = t;
    tp.c_build[0] = 1.25, tp.c_build[1] = 2.5, tp.c_build[7] = 3.75;
    const std::string fp = b::format_timeline(tp);
    EXPECT_NE(fp.find("plain grouping, mean us after the CTA's start: entry 1.250, keys 2.500, "
                      "done 3.750\n"),
              std::string::npos)
        << fp;
    EXPECT_EQ(fp.find("index"), std::string::npos) << fp;
    tp.c_build[3] = 3.0;
    EXPECT_NE(b::format_timeline(tp).find("keys 2.500, ranks 3.000, done 3.750"),
              std::string::npos);
    // step 2: the tables' index where a ranks step follows, else the warp sort's end
    tp.c_build[2] = 2.75;
    const std::string ft = b::format_timeline(tp);
    EXPECT_NE(ft.find("keys 2.500, index 2.750, ranks 3.000, done 3.750"), std::string::npos) << ft;
    EXPECT_EQ(ft.find("sorted"), std::string::npos) << ft;
    tp.c_build[3] = 0;
    const std::string fw = b::format_timeline(tp);
    EXPECT_NE(fw.find("entry 1.250, keys 2.500, sorted 2.750, done 3.750\n"), std::string::npos)
        << fw;
    EXPECT_EQ(fw.find("index"), std::string::npos) << fw;
  }
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

// Calls whose CTAs leave before their task count (every slot -1 at the plain kernels' slot
// check: no tasks-known word, no copy words): those events are counted as reached by no CTA and
// print "none", not a time from a zero word; with some CTAs past the count, its median is
// theirs.
TEST(LoraBench, TimelineEventsNoCtaReached) {
  namespace b = molora::lora::bench;
  constexpr int W = detail::kTraceWords, calls = 3, grid = 4;
  std::vector<unsigned long long> w(size_t(calls) * grid * W, 0);
  for (int i = 0; i < calls; ++i) {
    const unsigned long long prev = 5000000 + 10000ull * i;
    for (int c = 0; c < grid; ++c) {
      unsigned long long* r = &w[(size_t(i) * grid + c) * W];
      r[0] = prev + 200 + 32 * c;
      r[1] = prev + 700;
      r[5] = prev + 1200;
      r[6] = c == grid - 1 ? prev + 10000 : prev + 1250;  // the next call's prev
    }
  }
  b::Timeline t;
  ASSERT_TRUE(b::summarize_timeline(w, calls, grid, &t).ok());
  EXPECT_EQ(t.known_ctas, 0.0);
  EXPECT_EQ(t.issue_ctas, 0.0);
  EXPECT_EQ(t.land_ctas, 0.0);
  EXPECT_NEAR(t.first_done_med, 1.2, 1e-9);
  std::string f = b::format_timeline(t);
  EXPECT_NE(f.find("tasks known             med    none\n"), std::string::npos) << f;
  EXPECT_NE(f.find("1st copy issued         med    none\n"), std::string::npos) << f;
  EXPECT_NE(f.find("1st copy landed         med    none\n"), std::string::npos) << f;
  EXPECT_EQ(f.find("-"), std::string::npos) << f;  // (no negative time)
  // Two of the four CTAs past the count (at 900 and 1100 ns): its median is theirs.
  for (int i = 0; i < calls; ++i)
    for (int c = 0; c < 2; ++c) {
      unsigned long long* r = &w[(size_t(i) * grid + c) * W];
      r[2] = 5000000 + 10000ull * i + 900 + 200 * c;
    }
  ASSERT_TRUE(b::summarize_timeline(w, calls, grid, &t).ok());
  EXPECT_EQ(t.known_ctas, 2.0);
  EXPECT_NEAR(t.known_med, 1.0, 1e-9);
  f = b::format_timeline(t);
  EXPECT_NE(f.find("tasks known             med   1.00\n"), std::string::npos) << f;
  EXPECT_NE(f.find("1st copy issued         med    none\n"), std::string::npos) << f;
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
