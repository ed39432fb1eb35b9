// The all-reduce protocol's shared definitions: buffer layout, flag encoding, epoch arithmetic.
// Used by the CUDA kernels (comm.cu), the host (communicator.cc) and the CPU model test
// (tests/comm_test.cc), so the three cannot drift apart. Not a public header.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MOLORA_HD __host__ __device__ __forceinline__
#else
#define MOLORA_HD inline
#endif

namespace molora::comm {

constexpr int kMaxWorld = 8;
constexpr int kMaxBlocks = 64;  // flag lanes: CTAs per rank per call
constexpr int kThreads = 512;   // threads per CTA
constexpr size_t kVec = 16;     // bytes per vector access; messages are multiples of it
constexpr size_t kHeaderBytes = 64 * 1024;

// Error codes of the device error word (0 = none).
enum : uint32_t { kErrNone = 0, kErrTimeout = 1, kErrMismatch = 2, kErrPeerAbort = 3 };

// The flags region at the start of every rank's buffer. Fields marked "remote" are written by
// peers (release stores at system scope), the others only by this rank's kernels.
struct Header {
  uint64_t arrive[2][kMaxBlocks][kMaxWorld];  // remote: [phase][cta][src] = epoch<<32 | hash
  uint64_t done[kMaxWorld];                   // remote: [src] = last epoch src finished reading
  uint64_t abort_word;                        // remote: a peer failed (see pack_abort)
  uint64_t epoch;                             // local: last completed epoch of this rank
  uint32_t exit_count;                        // local: CTAs of the current call that finished
  uint32_t error_code;                        // local: first error of this rank (kErr*)
  uint32_t error_peer;
  uint32_t error_epoch;
  uint32_t error_detail;  // the peer's hash (mismatch) / CTA (timeout)
};
static_assert(sizeof(Header) <= kHeaderBytes, "header region too small");

// Host-mapped mirror of the error word, so the host sees a failure without a synchronisation.
struct ErrorMirror {
  uint32_t code, peer, epoch, detail;
};

MOLORA_HD uint64_t pack_flag(uint32_t epoch, uint32_t hash) {
  return (static_cast<uint64_t>(epoch) << 32) | hash;
}
MOLORA_HD uint32_t flag_epoch(uint64_t f) { return static_cast<uint32_t>(f >> 32); }
MOLORA_HD uint32_t flag_hash(uint64_t f) { return static_cast<uint32_t>(f); }
// a >= b in serial-number arithmetic (32-bit epochs wrap; differences stay tiny).
MOLORA_HD bool epoch_ge(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

MOLORA_HD uint64_t pack_abort(uint32_t code, uint32_t rank, uint32_t epoch) {
  return (static_cast<uint64_t>(code) << 56) | (static_cast<uint64_t>(rank) << 48) |
         static_cast<uint64_t>(epoch & 0xffffffffu);
}

// Staging slot of (epoch, src) in a rank's data region, in units of the slot capacity.
MOLORA_HD size_t slot_index(uint32_t epoch, int world, int src) {
  return static_cast<size_t>(epoch & 1u) * world + src;
}

// Shape hash of a call (FNV-1a over kind, dtype, numel, algo and extra).
MOLORA_HD uint32_t shape_hash(uint32_t kind, uint32_t dtype, uint64_t numel, uint32_t algo,
                              uint64_t extra) {
  uint32_t h = 2166136261u;
  uint64_t words[5] = {kind, dtype, numel, algo, extra};
  for (int w = 0; w < 5; ++w)
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint32_t>((words[w] >> (8 * b)) & 0xffu);
      h *= 16777619u;
    }
  return h;
}

// Element range [begin, end) in vectors of chunk `c` of `nchunks`, sub-range of CTA `b` of `g`.
MOLORA_HD void split(uint64_t n, uint64_t parts, uint64_t i, uint64_t* begin, uint64_t* end) {
  uint64_t base = n / parts, rem = n % parts;
  *begin = i * base + (i < rem ? i : rem);
  *end = *begin + base + (i < rem ? 1 : 0);
}

}  // namespace molora::comm
