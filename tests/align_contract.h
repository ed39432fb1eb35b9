// The contract of moe_align_block_size, written once and run against every backend: the CPU
// reference (align_test, label cpu) and the CUDA path (align_gpu_test, label gpu).
//
// A backend is a type with
//   static Status available();                       // skip the suite when not ok
//   static AlignRun run(const AlignCase&, const std::function<void(AlignArgs&)>& tweak);
// that copies the case's inputs where the backend reads them, poisons the outputs (and guard
// words past their ends), calls the backend with the AlignArgs (after `tweak`, which the error
// tests use to break one argument) and copies everything back.
//
// Expected results come from an oracle written independently of the reference (a stable sort of
// the flat indices by virtual id); position-encoded ids make a wrong index a wrong value.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "molora/align.h"

namespace molora::align_test {

constexpr int32_t kPoison = static_cast<int32_t>(0xDEADBEEF);
constexpr int kGuard = 16;  // poisoned words past the end of every output

struct AlignCase {
  int64_t T = 0, k = 1, V = 1, B = 16;
  DType dtype = DType::kI32;
  std::vector<int64_t> ids;  // [T*k], stored as int64 whatever the dtype
  bool has_slots = false;
  std::vector<int32_t> slots;  // [T]
  int64_t E = 0;
};

struct AlignRun {
  Status status;
  std::vector<int32_t> sorted, expert_ids, post_pad, dropped;  // each with kGuard guard words
  int64_t sorted_len = 0, expert_len = 0;
};

inline std::vector<int32_t> ids_i32(const AlignCase& c) {
  return std::vector<int32_t>(c.ids.begin(), c.ids.end());
}

// Output lengths of a case (0 when the shape is invalid).
inline AlignSizes sizes_of(const AlignCase& c) {
  AlignSizes s;
  if (!moe_align_sizes(c.T, c.k, c.V, c.B, &s).ok()) s = AlignSizes{};
  return s;
}

// Host outputs of a case, every word (and kGuard guard words past each end) poisoned.
inline AlignRun poisoned_outputs(const AlignCase& c) {
  AlignSizes sz = sizes_of(c);
  AlignRun r;
  r.sorted_len = sz.sorted_token_ids;
  r.expert_len = sz.expert_ids;
  r.sorted.assign(sz.sorted_token_ids + kGuard, kPoison);
  r.expert_ids.assign(sz.expert_ids + kGuard, kPoison);
  r.post_pad.assign(1 + kGuard, kPoison);
  r.dropped.assign(2 + kGuard, kPoison);
  return r;
}

// The call of a case: its shape, dtype and slots, with the buffers a backend placed them in
// (ids is int32 or int64 per c.dtype; slots is used only when the case has slots).
struct AlignBuffers {
  const void* ids = nullptr;
  const int32_t* slots = nullptr;
  int32_t *sorted = nullptr, *expert_ids = nullptr, *post_pad = nullptr, *dropped = nullptr;
};

inline AlignArgs args_of(const AlignCase& c, const AlignBuffers& b) {
  AlignSizes sz = sizes_of(c);
  AlignArgs a;
  a.topk_ids = b.ids;
  a.topk_dtype = c.dtype;
  a.num_tokens = c.T, a.topk = c.k, a.num_experts = c.V, a.block_size = c.B;
  if (c.has_slots) a.slot_ids = b.slots, a.num_base_experts = c.E;
  a.sorted_token_ids = b.sorted, a.sorted_token_ids_len = sz.sorted_token_ids;
  a.expert_ids = b.expert_ids, a.expert_ids_len = sz.expert_ids;
  a.num_tokens_post_pad = b.post_pad;
  a.num_dropped = b.dropped;
  return a;
}

// The CPU reference as a backend (align_test runs the contract on it; align_gpu_test compares
// the CUDA path with it bit for bit).
struct CpuBackend {
  static Status available() { return Status::Ok(); }
  static AlignRun run(const AlignCase& c, const std::function<void(AlignArgs&)>& tweak) {
    AlignRun r = poisoned_outputs(c);
    std::vector<int32_t> ids32 = ids_i32(c);
    AlignBuffers b;
    b.ids = c.dtype == DType::kI64 ? static_cast<const void*>(c.ids.data())
                                   : static_cast<const void*>(ids32.data());
    b.slots = c.slots.data();
    b.sorted = r.sorted.data(), b.expert_ids = r.expert_ids.data();
    b.post_pad = r.post_pad.data(), b.dropped = r.dropped.data();
    AlignArgs a = args_of(c, b);
    if (tweak) tweak(a);
    r.status = moe_align_block_size_cpu(a);
    return r;
  }
  static void extra_rejections(const AlignCase&) {}
};

// Independent oracle: expected outputs (without guards).
struct Expected {
  std::vector<int32_t> sorted, expert_ids;
  int32_t post_pad = 0, dropped = 0, no_adapter = 0;
};

inline Expected oracle(const AlignCase& c) {
  const int64_t numel = c.T * c.k;
  AlignSizes sz = sizes_of(c);
  std::vector<int64_t> v(numel);
  Expected e;
  for (int64_t i = 0; i < numel; ++i) {
    int64_t id = c.ids[i];
    if (c.dtype == DType::kI32) id = static_cast<int32_t>(id);
    if (c.has_slots) {
      const int64_t s = c.slots[i / c.k];
      if (s == -1) {
        v[i] = -2;
        ++e.no_adapter;
        continue;
      }
      id = (s < 0 || id < 0 || id >= c.E) ? -1 : s * c.E + id;
    }
    v[i] = (id >= 0 && id < c.V) ? id : -1;
    if (v[i] == -1) ++e.dropped;
  }
  std::vector<int64_t> order;
  for (int64_t i = 0; i < numel; ++i)
    if (v[i] >= 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
  e.sorted.assign(sz.sorted_token_ids, static_cast<int32_t>(numel));
  e.expert_ids.assign(sz.expert_ids, -1);
  int64_t pos = 0;
  for (size_t j = 0; j < order.size();) {
    size_t end = j;
    while (end < order.size() && v[order[end]] == v[order[j]]) ++end;
    for (size_t q = j; q < end; ++q) e.sorted[pos + (q - j)] = static_cast<int32_t>(order[q]);
    const int64_t padded = cdiv(static_cast<int64_t>(end - j), c.B) * c.B;
    for (int64_t b = pos / c.B; b < (pos + padded) / c.B; ++b)
      e.expert_ids[b] = static_cast<int32_t>(v[order[j]]);
    pos += padded;
    j = end;
  }
  e.post_pad = static_cast<int32_t>(pos);
  return e;
}

inline void expect_guards(const std::vector<int32_t>& a, int64_t len, const char* what) {
  for (int64_t g = len; g < static_cast<int64_t>(a.size()); ++g)
    ASSERT_EQ(a[g], kPoison) << what << " written past its end at " << g;
}

// Runs the case and compares every output word and the guards.
template <class Backend>
void check_case(const AlignCase& c, const std::string& label) {
  SCOPED_TRACE(label + " T=" + std::to_string(c.T) + " k=" + std::to_string(c.k) +
               " V=" + std::to_string(c.V) + " B=" + std::to_string(c.B) +
               (c.dtype == DType::kI64 ? " int64" : " int32") + (c.has_slots ? " slots" : ""));
  AlignRun r = Backend::run(c, {});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  Expected e = oracle(c);
  ASSERT_EQ(r.sorted_len, static_cast<int64_t>(e.sorted.size()));
  ASSERT_EQ(r.expert_len, static_cast<int64_t>(e.expert_ids.size()));
  EXPECT_EQ(r.post_pad[0], e.post_pad);
  EXPECT_EQ(r.dropped[0], e.dropped);
  EXPECT_EQ(r.dropped[1], e.no_adapter);
  for (int64_t p = 0; p < r.sorted_len; ++p)
    ASSERT_EQ(r.sorted[p], e.sorted[p]) << "sorted_token_ids[" << p << "]";
  for (int64_t b = 0; b < r.expert_len; ++b)
    ASSERT_EQ(r.expert_ids[b], e.expert_ids[b]) << "expert_ids[" << b << "]";
  expect_guards(r.sorted, r.sorted_len, "sorted_token_ids");
  expect_guards(r.expert_ids, r.expert_len, "expert_ids");
  expect_guards(r.post_pad, 1, "num_tokens_post_pad");
  expect_guards(r.dropped, 2, "num_dropped");
}

// Expects `status` to be InvalidArgument naming `arg`, and every output still poisoned.
inline void expect_rejected(const AlignRun& r, const std::string& arg) {
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.to_string();
  EXPECT_NE(r.status.message().find(arg), std::string::npos) << r.status.to_string();
  for (const auto* a : {&r.sorted, &r.expert_ids, &r.post_pad, &r.dropped})
    for (int32_t w : *a) ASSERT_EQ(w, kPoison) << "an output was written on error";
}

inline uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Random case: ids drawn in [-2, V+2) with a few out-of-range ones, optional slots.
inline AlignCase random_case(std::mt19937_64& g, int64_t T, int64_t k, int64_t V, int64_t B,
                             bool slots, DType dt = DType::kI32) {
  AlignCase c;
  c.T = T, c.k = k, c.V = V, c.B = B, c.dtype = dt;
  c.ids.resize(T * k);
  if (slots) {
    c.has_slots = true;
    c.E = std::max<int64_t>(1, std::min<int64_t>(V, 256));
    const int64_t S = std::max<int64_t>(1, V / c.E);
    c.slots.resize(T);
    for (auto& s : c.slots) s = static_cast<int32_t>(static_cast<int64_t>(g() % (S + 2)) - 1);
    for (auto& id : c.ids) id = static_cast<int64_t>(g() % (c.E + 2)) - 1;
  } else {
    for (auto& id : c.ids) id = static_cast<int64_t>(g() % (V + 4)) - 2;
  }
  return c;
}

inline AlignCase same_expert_case(int64_t T, int64_t k, int64_t V, int64_t B, int64_t e) {
  AlignCase c;
  c.T = T, c.k = k, c.V = V, c.B = B;
  c.ids.assign(T * k, e);
  return c;
}

template <class Backend>
class AlignContract : public ::testing::Test {};
TYPED_TEST_SUITE_P(AlignContract);

#define MOLORA_ALIGN_BACKEND_SKIP()                                             \
  do {                                                                          \
    ::molora::Status avail_ = TypeParam::available();                           \
    if (!avail_.ok()) GTEST_SKIP() << "GPU test skipped: " << avail_.message(); \
  } while (0)

TYPED_TEST_P(AlignContract, EdgesOfTokensAndBlockSize) {
  MOLORA_ALIGN_BACKEND_SKIP();
  std::mt19937_64 g(fresh_seed());
  for (int64_t B : {16, 32, 64, 128, 256})
    for (int64_t T : {int64_t{0}, int64_t{1}, B - 1, B, B + 1, 3 * B + 5})
      for (int64_t k : {1, 2, 8}) {
        const uint64_t seed = g();
        std::mt19937_64 gg(seed);
        check_case<TypeParam>(random_case(gg, T, k, 64, B, false), "seed=" + std::to_string(seed));
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TYPED_TEST_P(AlignContract, EdgesOfExperts) {
  MOLORA_ALIGN_BACKEND_SKIP();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  for (int64_t V : {1, 2, 511, 512, 513, 1024, 8192, 65535, 65536})
    for (int64_t B : {16, 64}) {
      check_case<TypeParam>(random_case(g, 37, 8, V, B, false), "seed=" + std::to_string(seed));
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TYPED_TEST_P(AlignContract, AllSameExpertAndExtremeIds) {
  MOLORA_ALIGN_BACKEND_SKIP();
  for (int64_t e : {int64_t{0}, int64_t{511}, int64_t{512}, int64_t{8191}})
    check_case<TypeParam>(same_expert_case(300, 8, 8192, 16, e), "same " + std::to_string(e));
  // All ids invalid: nothing in any bucket, everything dropped.
  for (int64_t e : {int64_t{-1}, int64_t{8192}, int64_t{-2147483647}, int64_t{2147483647}})
    check_case<TypeParam>(same_expert_case(33, 8, 8192, 64, e), "invalid " + std::to_string(e));
  // int64 ids beyond the int32 range must be dropped, not truncated into range.
  AlignCase c = same_expert_case(20, 4, 256, 16, 5);
  c.dtype = DType::kI64;
  c.ids[3] = (int64_t{1} << 32) + 7;
  c.ids[9] = -(int64_t{1} << 40);
  c.ids[10] = 255;
  check_case<TypeParam>(c, "int64 wide");
}

TYPED_TEST_P(AlignContract, RandomWithInt64AndSlots) {
  MOLORA_ALIGN_BACKEND_SKIP();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  struct Shape {
    int64_t T, k, V, B;
  };
  for (Shape s : {Shape{1, 8, 2048, 16}, Shape{64, 8, 8192, 64}, Shape{256, 8, 8192, 16},
                  Shape{256, 8, 65536, 64}, Shape{4096, 8, 8192, 64}, Shape{5000, 6, 1280, 128}})
    for (bool slots : {false, true})
      for (DType dt : {DType::kI32, DType::kI64}) {
        check_case<TypeParam>(random_case(g, s.T, s.k, s.V, s.B, slots, dt),
                              "seed=" + std::to_string(seed));
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TYPED_TEST_P(AlignContract, SlotsFormVirtualIds) {
  MOLORA_ALIGN_BACKEND_SKIP();
  // 4 slots x 8 experts; token t has slot t%6 - 1 (so -1, 0..3, 4 = past V); ids position-encoded.
  AlignCase c;
  c.T = 30, c.k = 3, c.V = 32, c.B = 16, c.E = 8, c.has_slots = true;
  c.slots.resize(c.T);
  for (int64_t t = 0; t < c.T; ++t) c.slots[t] = static_cast<int32_t>(t % 6 - 1);
  c.slots[7] = -5;  // invalid slot: dropped, not "no adapter"
  c.ids.resize(c.T * c.k);
  for (int64_t i = 0; i < c.T * c.k; ++i) c.ids[i] = (i * 5) % 10 - 1;  // -1..8: some invalid
  check_case<TypeParam>(c, "slots");
}

// The CUDA path places up to 128 pairs by counting (1 thread per pair up to 8 pairs, 2 up to 16,
// 4 up to 32, then 8 and 4 as the count doubles) and sorts more (one pair per thread up to 512,
// then 4 and 8), switches from one launch to three past 4,096 pairs and slices the pairs by 4,096:
// sizes on each side of each, with buckets that span slices.
TYPED_TEST_P(AlignContract, PathAndSliceBoundaries) {
  MOLORA_ALIGN_BACKEND_SKIP();
  const uint64_t seed = fresh_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  // (V = 3: few buckets, many pairs each; V = 65,536: almost every pair its own bucket)
  for (int64_t numel :
       {1, 2, 8, 9, 16, 17, 32, 33, 63, 64, 65, 127, 128, 129, 511, 512, 513, 2048, 2049})
    for (int64_t V : {3, 600, 4095, 4096, 65536})
      for (bool slots : {false, true}) {
        check_case<TypeParam>(random_case(g, numel, 1, V, 16, slots),
                              "seed=" + std::to_string(seed));
        if (::testing::Test::HasFatalFailure()) return;
      }
  check_case<TypeParam>(random_case(g, 16, 8, 1280, 16, true), "seed=" + std::to_string(seed));
  check_case<TypeParam>(random_case(g, 17, 8, 1280, 16, true), "seed=" + std::to_string(seed));
  {
    AlignCase c = random_case(g, 16, 8, 1280, 16, true);
    for (auto& sl : c.slots) sl = -1;
    check_case<TypeParam>(c, "128 pairs, every slot -1");
  }
  check_case<TypeParam>(same_expert_case(16, 8, 70, 16, 69), "128 pairs in one bucket");
  check_case<TypeParam>(same_expert_case(16, 8, 70, 256, -1), "128 pairs, all invalid");
  for (int64_t numel : {4095, 4096, 4097, 8191, 8192, 8193, 12289})
    for (int64_t V : {3, 600}) {
      check_case<TypeParam>(random_case(g, numel, 1, V, 16, false), "seed=" + std::to_string(seed));
      if (::testing::Test::HasFatalFailure()) return;
    }
  check_case<TypeParam>(random_case(g, 1024, 4, 1024, 32, true), "seed=" + std::to_string(seed));
  check_case<TypeParam>(random_case(g, 1025, 4, 1024, 32, true), "seed=" + std::to_string(seed));
  check_case<TypeParam>(same_expert_case(4097, 2, 70, 256, 69), "same past the one-launch path");
}

TYPED_TEST_P(AlignContract, LargestShapes) {
  MOLORA_ALIGN_BACKEND_SKIP();
  std::mt19937_64 g(fresh_seed());
  check_case<TypeParam>(random_case(g, kAlignMaxPairs / 8, 8, 8, 16, false), "max numel, V=8");
  check_case<TypeParam>(random_case(g, 64, 8, kAlignMaxExperts, 256, false), "max V, B=256");
  check_case<TypeParam>(same_expert_case(kAlignMaxPairs / 4, 4, 600, 16, 513), "max numel same");
}

TYPED_TEST_P(AlignContract, BadArgumentsAreRejectedAndNothingIsWritten) {
  MOLORA_ALIGN_BACKEND_SKIP();
  std::mt19937_64 g(fresh_seed());
  AlignCase ok = random_case(g, 8, 2, 64, 16, false);
  auto with = [&](int64_t T, int64_t k, int64_t V, int64_t B) {
    AlignCase c = ok;
    c.T = T, c.k = k, c.V = V, c.B = B;
    c.ids.assign(std::max<int64_t>(0, T * k), 1);
    return c;
  };
  using Tweak = std::function<void(AlignArgs&)>;
  expect_rejected(TypeParam::run(with(8, 2, 0, 16), {}), "num_experts");
  expect_rejected(TypeParam::run(with(8, 2, kAlignMaxExperts + 1, 16), {}), "num_experts");
  for (int64_t B : {0, 8, 24, 100, 512})
    expect_rejected(TypeParam::run(with(8, 2, 64, B), {}), "block_size");
  expect_rejected(TypeParam::run(with(8, 0, 64, 16), {}), "topk");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { a.num_tokens = -1; })), "num_tokens");
  expect_rejected(
      TypeParam::run(ok, Tweak([](AlignArgs& a) { a.num_tokens = kAlignMaxPairs / 2 + 1; })),
      "topk_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { a.topk_dtype = DType::kF32; })),
                  "topk_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { a.topk_ids = nullptr; })),
                  "topk_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { --a.sorted_token_ids_len; })),
                  "sorted_token_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { a.expert_ids = nullptr; })),
                  "expert_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { --a.expert_ids_len; })),
                  "expert_ids");
  expect_rejected(TypeParam::run(ok, Tweak([](AlignArgs& a) { a.num_tokens_post_pad = nullptr; })),
                  "num_tokens_post_pad");
  AlignCase sl = ok;
  sl.has_slots = true;
  sl.slots.assign(sl.T, 0);
  sl.E = 0;
  expect_rejected(TypeParam::run(sl, {}), "num_base_experts");
  sl.E = sl.V + 1;
  expect_rejected(TypeParam::run(sl, {}), "num_base_experts");
  TypeParam::extra_rejections(ok);
}

REGISTER_TYPED_TEST_SUITE_P(AlignContract, EdgesOfTokensAndBlockSize, EdgesOfExperts,
                            AllSameExpertAndExtremeIds, RandomWithInt64AndSlots,
                            SlotsFormVirtualIds, PathAndSliceBoundaries, LargestShapes,
                            BadArgumentsAreRejectedAndNothingIsWritten);

}  // namespace molora::align_test
