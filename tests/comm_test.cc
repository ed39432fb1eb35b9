// comm, CPU half: the reference, the path choice, and the CPU model of the protocol — one thread
// per rank running the kernel's steps over std::atomic with the kernel's memory orders
// (release flag stores, acquire flag loads, relaxed data), with random delays, a stopped rank
// and a mismatched call order.
#include "molora/comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/numeric.h"
#include "comm/policy.h"
#include "comm/protocol.h"

using namespace molora;

namespace {

uint32_t seed_now() {
  uint32_t s = std::random_device{}();
  std::printf("comm_test seed %u\n", s);
  return s;
}

TEST(CommReference, RankOrderFp32RoundOnce) {
  // 1 + 2^-8 + 2^-8 in bf16: summing in fp32 then rounding once gives 1 + 2^-7; rounding after
  // every addition would give 1 (ties to even). Rank-encoded values catch any order bug.
  std::vector<uint16_t> a = {comm::float_to_bf16(1.0f), comm::float_to_bf16(3.0f)};
  std::vector<uint16_t> b = {comm::float_to_bf16(1.0f / 256), comm::float_to_bf16(10.0f)};
  std::vector<uint16_t> c = {comm::float_to_bf16(1.0f / 256), comm::float_to_bf16(100.0f)};
  const void* in[3] = {a.data(), b.data(), c.data()};
  std::vector<uint16_t> out(2, 0xffff);
  ASSERT_TRUE(all_reduce_reference(in, 3, out.data(), 2, DType::kBF16).ok());
  EXPECT_EQ(comm::bf16_to_float(out[0]), 1.0f + 1.0f / 128);
  EXPECT_EQ(comm::bf16_to_float(out[1]), 113.0f);
}

TEST(CommReference, F16AndF32AndErrors) {
  std::vector<uint16_t> a = {comm::float_to_f16(1.5f)}, b = {comm::float_to_f16(-0.25f)};
  const void* in[2] = {a.data(), b.data()};
  uint16_t out = 0;
  ASSERT_TRUE(all_reduce_reference(in, 2, &out, 1, DType::kF16).ok());
  EXPECT_EQ(comm::f16_to_float(out), 1.25f);
  float fa = 1e8f, fb = 1.0f, fo = 0;
  const void* fin[2] = {&fa, &fb};
  ASSERT_TRUE(all_reduce_reference(fin, 2, &fo, 1, DType::kF32).ok());
  EXPECT_EQ(fo, 1e8f + 1.0f);
  EXPECT_EQ(all_reduce_reference(in, 2, &out, 1, DType::kI32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(all_reduce_reference(in, 2, &out, -1, DType::kBF16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(all_reduce_reference(nullptr, 2, nullptr, 0, DType::kBF16).ok());
}

TEST(CommReference, ResidualRmsnorm) {
  const int64_t hidden = 4;
  std::vector<uint16_t> x0(8), x1(8), res(8), w(4), out(8);
  for (int i = 0; i < 8; ++i) {
    x0[i] = comm::float_to_bf16(0.5f * i);
    x1[i] = comm::float_to_bf16(-0.25f * i);
    res[i] = comm::float_to_bf16(1.0f);
  }
  for (int j = 0; j < 4; ++j) w[j] = comm::float_to_bf16(2.0f);
  const void* in[2] = {x0.data(), x1.data()};
  ASSERT_TRUE(all_reduce_residual_rmsnorm_reference(in, 2, res.data(), w.data(), out.data(), 8,
                                                    hidden, 1e-6f, DType::kBF16)
                  .ok());
  EXPECT_EQ(comm::bf16_to_float(res[3]), 1.0f + 0.75f);
  float ss = 0;
  for (int j = 0; j < 4; ++j) ss += comm::bf16_to_float(res[j]) * comm::bf16_to_float(res[j]);
  float expect = comm::bf16_to_float(res[0]) / std::sqrt(ss / 4 + 1e-6f) * 2.0f;
  EXPECT_NEAR(comm::bf16_to_float(out[0]), expect, 1e-2);
  EXPECT_EQ(all_reduce_residual_rmsnorm_reference(in, 2, res.data(), w.data(), out.data(), 8, 3,
                                                  1e-6f, DType::kBF16)
                .code(),
            StatusCode::kInvalidArgument);
}

comm::PathInputs ok_call() {
  return comm::PathInputs{
      DType::kBF16,           4096,      0x1000, 0x2000, 4, true, CommFallback::kTopology, false,
      CommFallback::kTimeout, 16u << 20, false};
}

TEST(CommPath, EveryReason) {
  EXPECT_EQ(comm::choose_path(ok_call()), comm::kP2P);
  auto p = ok_call();
  p.dtype = DType::kF32;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kDtype);
  p = ok_call();
  p.numel = (16 << 20) / 2 + 8;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kSize);
  p.numel = (16 << 20) / 2;
  EXPECT_EQ(comm::choose_path(p), comm::kP2P);  // exactly max: P2P
  p = ok_call();
  p.numel = 4;  // 8 bytes: not a multiple of 16
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kAlignment);
  p = ok_call();
  p.in += 8;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kAlignment);
  for (int w : {1, 9, 16}) {
    p = ok_call();
    p.world = w;
    EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kWorldSize) << w;
  }
  p = ok_call();
  p.p2p_ok = false;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kTopology);
  p.p2p_reason = CommFallback::kIpcFailure;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kIpcFailure);
  p = ok_call();
  p.failed = true;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kTimeout);
  p.fail_reason = CommFallback::kMismatch;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kMismatch);
  p = ok_call();
  p.disabled = true;
  EXPECT_EQ(comm::choose_path(p), (int)CommFallback::kDisabled);
  for (int r = 0; r < (int)CommFallback::kCount; ++r)
    EXPECT_STRNE(comm_fallback_name((CommFallback)r), "unknown");
}

TEST(CommProtocol, EpochArithmeticAndSplit) {
  EXPECT_TRUE(comm::epoch_ge(0, 0xffffffffu));  // wraps
  EXPECT_TRUE(comm::epoch_ge(5, 5));
  EXPECT_FALSE(comm::epoch_ge(4, 5));
  uint64_t f = comm::pack_flag(7, 0xabcdef12u);
  EXPECT_EQ(comm::flag_epoch(f), 7u);
  EXPECT_EQ(comm::flag_hash(f), 0xabcdef12u);
  EXPECT_NE(comm::shape_hash(1, 2, 4096, 1, 0), comm::shape_hash(1, 2, 4104, 1, 0));
  for (uint64_t n : {0, 1, 7, 8, 1000}) {
    uint64_t prev = 0;
    for (uint64_t i = 0; i < 5; ++i) {
      uint64_t b, e;
      comm::split(n, 5, i, &b, &e);
      EXPECT_EQ(b, prev);
      prev = e;
    }
    EXPECT_EQ(prev, n);
  }
  EXPECT_EQ(comm::grid_for(1, 8, false, 16), 1);
  EXPECT_EQ(comm::grid_for(1u << 22, 8, false, 16), 16);
}

// ---------------------------------------------------------------------------------------------
// The CPU model. Each rank: header (arrive, done, abort as atomics written by peers) and data
// slots [2][world][n] written by peers. The steps and orders are the kernel's (comm.cu).

constexpr int kN = 24;  // words per message

struct ModelRank {
  std::atomic<uint64_t> arrive[comm::kMaxWorld];
  std::atomic<uint64_t> done[comm::kMaxWorld];
  std::atomic<uint64_t> abort_word{0};
  std::vector<std::atomic<uint32_t>> slots;
  explicit ModelRank(int world) : slots(2 * world * kN) {
    for (auto& a : arrive) a.store(0);
    for (auto& d : done) d.store(0);
    for (auto& s : slots) s.store(0);
  }
};

struct ModelResult {
  uint32_t code = 0, peer = 0, epoch = 0;
  uint64_t epochs_done = 0, bad_words = 0;
};

uint32_t word(int rank, uint32_t epoch, int i) {
  return (rank + 1) * 2654435761u ^ (epoch * 40503u + i * 977u);
}

struct Model {
  int world;
  std::vector<std::unique_ptr<ModelRank>> r;
  std::chrono::milliseconds timeout;
  explicit Model(int w, int timeout_ms) : world(w), timeout(timeout_ms) {
    for (int i = 0; i < w; ++i) r.push_back(std::make_unique<ModelRank>(w));
  }

  // Spin (yielding) until the flag's epoch >= epoch; the kernel's wait_flag.
  uint32_t wait(int me, const std::atomic<uint64_t>& flag, uint32_t epoch, uint32_t hash,
                bool check_hash, std::chrono::steady_clock::time_point deadline) {
    for (uint32_t spin = 1;; ++spin) {
      uint64_t f = flag.load(std::memory_order_acquire);
      if (comm::epoch_ge(comm::flag_epoch(f), epoch)) {
        if (check_hash && comm::flag_epoch(f) == epoch && comm::flag_hash(f) != hash)
          return comm::kErrMismatch;
        return comm::kErrNone;
      }
      if ((spin & 15u) == 0) {
        if (r[me]->abort_word.load(std::memory_order_relaxed)) return comm::kErrPeerAbort;
        if (std::chrono::steady_clock::now() > deadline) return comm::kErrTimeout;
        std::this_thread::yield();
      }
    }
  }

  void fail(int me, ModelResult* res, uint32_t code, uint32_t peer, uint32_t epoch) {
    res->code = code, res->peer = peer, res->epoch = epoch;
    if (code == comm::kErrPeerAbort) {
      uint64_t ab = r[me]->abort_word.load();
      res->peer = (ab >> 48) & 0xff;
      return;
    }
    for (int k = 0; k < world; ++k)
      if (k != me)
        r[k]->abort_word.store(comm::pack_abort(code, me, epoch), std::memory_order_release);
  }

  // Runs `epochs` calls on rank `me`. stop_at: stop calling before this epoch (0 = never).
  // bad_hash_at: use another shape hash at this epoch (0 = never).
  ModelResult run(int me, uint32_t epochs, uint32_t seed, uint32_t stop_at, uint32_t bad_hash_at,
                  int delay_pct) {
    ModelResult res;
    std::mt19937 rng(seed * 7919u + me);
    auto maybe_delay = [&] {
      if ((int)(rng() % 100) < delay_pct) {
        if (rng() % 8 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
        else
          std::this_thread::yield();
      }
    };
    for (uint32_t e = 1; e <= epochs; ++e) {
      if (e == stop_at) return res;
      if (r[me]->abort_word.load()) {
        fail(me, &res, comm::kErrPeerAbort, 0, e);
        return res;
      }
      const uint32_t hash = e == bad_hash_at ? 0xbadu : comm::shape_hash(1, 2, kN, 1, 0);
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      // 1. end flags: every peer finished reading epoch e-2 of these slots.
      for (int k = 0; k < world; ++k) {
        if (k == me) continue;
        uint32_t err = wait(me, r[me]->done[k], e - 2u, 0, false, deadline);
        if (err) return fail(me, &res, err, k, e), res;
      }
      maybe_delay();
      // 2. push the partial into every peer's slot (e, me): relaxed data stores.
      for (int k = 0; k < world; ++k) {
        if (k == me) continue;
        size_t base = comm::slot_index(e, world, me) * kN;
        for (int i = 0; i < kN; ++i)
          r[k]->slots[base + i].store(word(me, e, i), std::memory_order_relaxed);
        maybe_delay();
      }
      // 3. release flags; acquire-wait for every peer's flag.
      for (int k = 0; k < world; ++k)
        if (k != me) r[k]->arrive[me].store(comm::pack_flag(e, hash), std::memory_order_release);
      for (int k = 0; k < world; ++k) {
        if (k == me) continue;
        uint32_t err = wait(me, r[me]->arrive[k], e, hash, true, deadline);
        if (err) return fail(me, &res, err, k, e), res;
      }
      maybe_delay();
      // 4. read every peer's slot; a wrong word = read before write or overwrite before read.
      for (int k = 0; k < world; ++k) {
        if (k == me) continue;
        size_t base = comm::slot_index(e, world, k) * kN;
        for (int i = 0; i < kN; ++i) {
          if (r[me]->slots[base + i].load(std::memory_order_relaxed) != word(k, e, i))
            res.bad_words++;
          if (i == kN / 2) maybe_delay();
        }
      }
      // 5. end flag into every peer (release: orders the reads above).
      for (int k = 0; k < world; ++k)
        if (k != me) r[k]->done[me].store(comm::pack_flag(e, 0), std::memory_order_release);
      res.epochs_done = e;
    }
    return res;
  }
};

std::vector<ModelResult> run_model(int world, uint32_t epochs, int timeout_ms, int stop_rank,
                                   uint32_t stop_at, int bad_rank, uint32_t bad_at, int delay_pct) {
  Model m(world, timeout_ms);
  uint32_t seed = seed_now();
  std::vector<ModelResult> res(world);
  std::vector<std::thread> th;
  for (int k = 0; k < world; ++k)
    th.emplace_back([&, k] {
      res[k] = m.run(k, epochs, seed, k == stop_rank ? stop_at : 0, k == bad_rank ? bad_at : 0,
                     delay_pct);
    });
  for (auto& t : th) t.join();
  return res;
}

TEST(CommModel, StressExact) {
  // >= 100,000 epochs in total per world, random delays, every word checked.
  for (int world : {2, 3}) {
    auto t0 = std::chrono::steady_clock::now();
    auto res = run_model(world, 100000, 10000, -1, 0, -1, 0, 3);
    for (int k = 0; k < world; ++k) {
      EXPECT_EQ(res[k].code, 0u) << "world " << world << " rank " << k;
      EXPECT_EQ(res[k].epochs_done, 100000u);
      EXPECT_EQ(res[k].bad_words, 0u);
    }
    std::printf("world %d: 100000 epochs in %.2f s\n", world,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  auto res = run_model(4, 20000, 10000, -1, 0, -1, 0, 10);
  for (auto& r : res) EXPECT_EQ(r.bad_words + r.code, 0u);
}

TEST(CommModel, StoppedRankTimesOutNoHang) {
  const int timeout_ms = 150;
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_model(3, 1000, timeout_ms, 2, 500, -1, 0, 2);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(res[2].code, 0u);
  EXPECT_EQ(res[2].epochs_done, 499u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(res[k].code == comm::kErrTimeout || res[k].code == comm::kErrPeerAbort) << k;
    if (res[k].code == comm::kErrTimeout) {
      EXPECT_EQ(res[k].peer, 2u);
      EXPECT_EQ(res[k].epoch, 500u);
    }
    EXPECT_EQ(res[k].bad_words, 0u);
  }
  EXPECT_TRUE(res[0].code == comm::kErrTimeout || res[1].code == comm::kErrTimeout);
  EXPECT_LT(s, 5.0);
}

TEST(CommModel, MismatchReported) {
  auto res = run_model(2, 1000, 5000, -1, 0, 1, 300, 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(res[k].code == comm::kErrMismatch || res[k].code == comm::kErrPeerAbort) << k;
    EXPECT_EQ(res[k].epoch, 300u);
    EXPECT_EQ(res[k].epochs_done, 299u);
    EXPECT_EQ(res[k].bad_words, 0u);
  }
}

}  // namespace
