// Which path an all-reduce call takes: pure host logic, tested on CPU (tests/comm_test.cc).
// Not a public header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/protocol.h"
#include "molora/comm.h"

namespace molora::comm {

constexpr int kP2P = -1;

struct PathInputs {
  DType dtype;
  int64_t numel;
  uintptr_t in, out;
  int world;
  bool p2p_ok;               // the group's creation found P2P usable on every rank
  CommFallback p2p_reason;   // why not, when !p2p_ok
  bool failed;               // an earlier call timed out / mismatched
  CommFallback fail_reason;  // kTimeout or kMismatch
  size_t max_bytes;
  bool disabled;  // MOLORA_COMM_DISABLE_P2P
};

// kP2P or the CommFallback (as int) of the first reason that applies, in a fixed order, so that
// every rank given the same call decides the same.
inline int choose_path(const PathInputs& c) {
  if (c.disabled) return static_cast<int>(CommFallback::kDisabled);
  if (c.world < 2 || c.world > kMaxWorld) return static_cast<int>(CommFallback::kWorldSize);
  if (!c.p2p_ok) return static_cast<int>(c.p2p_reason);
  if (c.failed) return static_cast<int>(c.fail_reason);
  if (c.dtype != DType::kBF16 && c.dtype != DType::kF16)
    return static_cast<int>(CommFallback::kDtype);
  const uint64_t bytes = static_cast<uint64_t>(c.numel) * 2;
  if (bytes > c.max_bytes) return static_cast<int>(CommFallback::kSize);
  if (bytes % kVec != 0 || c.in % kVec != 0 || c.out % kVec != 0)
    return static_cast<int>(CommFallback::kAlignment);
  return kP2P;
}

// Default one-shot/two-shot switch point (bytes) for `world`: the largest size at which one-shot
// was no slower than two-shot in bench_comm on ONE H200 (ranks as streams, 2026-12-02,
// bench/NOTES.md "## comm"). On NVLink the balance differs (one-shot moves (w-1)*S per GPU over
// the links); re-measure there (issue 7). MOLORA_COMM_ONESHOT_MAX_BYTES overrides it.
inline size_t default_oneshot_max(int world) {
  constexpr size_t kKB = 1024;
  switch (world) {
    case 2:
      return 4096 * kKB;
    case 3:
    case 4:
      return 1024 * kKB;
    case 5:
    case 6:
      return 512 * kKB;
    default:
      return 256 * kKB;
  }
}

// CTAs per rank for a call of nvec vectors.
inline int grid_for(uint64_t nvec, int world, bool two_shot, int max_blocks) {
  uint64_t per = two_shot ? (nvec + world - 1) / world : nvec;
  uint64_t g = (per + 2 * kThreads - 1) / (2 * kThreads);
  if (g < 1) g = 1;
  if (g > static_cast<uint64_t>(max_blocks)) g = max_blocks;
  return static_cast<int>(g);
}

}  // namespace molora::comm
