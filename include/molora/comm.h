// molora/comm.h — NVLink peer-to-peer all-reduce that never hangs (TP reduction of one node).
//
// Protocol (docs/comm.md): every rank owns one device buffer (flags + staging slots), allocated
// and IPC-exchanged once at creation. A call copies the caller's tensor in (out-of-place
// contract): each rank writes its partial into every peer's slot of the current epoch
// (slot = (epoch & 1) * world + rank), then a release flag (epoch << 32 | shape hash); each rank
// waits for every peer's flag, sums in rank order in fp32 and rounds once to bf16/fp16, so every
// rank gets the same bits, equal to all_reduce_reference(). After reading, a rank stores an end
// flag ("done epoch e") into every peer, and a writer waits for done >= e - 2 before reusing a
// slot. The epoch lives on the device and is advanced by the kernel, so CUDA graph replays
// advance it. Every wait is bounded by a deadline (globaltimer): on expiry the kernel records an
// error word, tells the peers, and exits; the host reports Timeout/Mismatch (naming rank and
// epoch) at the next call or check(), and every later eager call goes to NCCL.
//
// Every call that does not take the P2P path increments a per-reason counter (stats()) and the
// first of each reason is logged once (log_once).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "molora/common.h"
#include "molora/status.h"

namespace molora {

// Why a call did not take the P2P path.
enum class CommFallback : int {
  kDtype = 0,      // not bf16 / fp16
  kNotContiguous,  // the caller's tensor is strided (Python layer)
  kSize,           // bytes > max message size
  kAlignment,      // bytes not a multiple of 16 or a pointer not 16-byte aligned
  kWorldSize,      // world outside 2..8
  kTopology,       // some pair of ranks has no P2P path (other node, no peer access)
  kIpcFailure,     // cudaIpcOpenMemHandle failed on some rank
  kTimeout,        // a previous wait expired on some rank
  kMismatch,       // a previous call disagreed in sequence/shape between ranks
  kDisabled,       // MOLORA_COMM_DISABLE_P2P=1
  kCount
};
const char* comm_fallback_name(CommFallback r) noexcept;

enum class CommAlgo : int { kAuto = 0, kOneShot = 1, kTwoShot = 2 };

struct CommStats {
  uint64_t p2p_calls = 0;      // calls that ran the P2P kernels
  uint64_t oneshot_calls = 0;  // of which one-shot
  uint64_t twoshot_calls = 0;  // of which two-shot
  uint64_t fused_calls = 0;    // of which one kernel for all-reduce + residual + rmsnorm
  uint64_t nccl_calls = 0;     // fallbacks that ran ncclAllReduce
  uint64_t unavailable = 0;    // fallbacks that found no NCCL communicator (returned Unavailable)
  std::array<uint64_t, static_cast<int>(CommFallback::kCount)> fallback{};  // per reason
};

struct CommOptions {
  size_t max_bytes = 0;        // staging capacity per slot; 0 = MOLORA_COMM_MAX_BYTES (16 MiB)
  long long timeout_ms = -1;   // -1 = read MOLORA_COMM_TIMEOUT_MS at every call (default 1000)
  long long oneshot_max = -1;  // one-shot up to this many bytes; -1 = setting, else default
  CommAlgo algo = CommAlgo::kAuto;
  void* nccl_comm = nullptr;  // an ncclComm_t the caller owns, used for fallbacks
  bool create_nccl = true;    // no nccl_comm: create one through the exchange (one GPU/rank)
  int max_blocks = 0;         // CTAs per rank per call; 0 = default (in-process: SMs / world)
};

// All-gather of bytes over a CPU channel the caller provides: every rank passes `mine` (the
// same length on every rank) and receives world * mine.size() bytes, rank i's at offset
// i * mine.size(). Called 2-3 times during create(), in the same order on every rank.
using CommExchange =
    std::function<Status(const std::vector<uint8_t>& mine, std::vector<uint8_t>* all)>;

class Communicator {
 public:
  // One rank of a group of `world` processes (one GPU each, or several on one GPU). Collective:
  // every rank must call it. Allocates and IPC-exchanges the buffers and (options) an NCCL
  // communicator. A group P2P cannot serve (world size, topology, IPC) still gets a usable
  // communicator whose calls go to NCCL, counted.
  static Status create(int rank, int world, int device, const CommExchange& exchange,
                       const CommOptions& options, std::unique_ptr<Communicator>* out);
  // `world` ranks in this process on one device: the peer table points into the same device's
  // memory. Rank i runs on the stream its caller passes; grids are sized to be co-resident.
  // NCCL cannot serve such a group (one rank per GPU): its fallbacks return Unavailable, counted.
  static Status create_local_group(int world, int device, const CommOptions& options,
                                   std::vector<std::unique_ptr<Communicator>>* out);
  // One launch that runs every rank of a local group (blockIdx.y = rank) on one stream: the same
  // kernel, for tools that serialise kernels (compute-sanitizer). in[i]/out[i] are rank i's.
  static Status all_reduce_local_group(const std::vector<Communicator*>& ranks,
                                       const void* const* in, void* const* out, int64_t numel,
                                       DType dtype, cudaStream_t stream);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // out = sum over ranks of in (numel elements of dtype), fp32 in rank order, rounded once.
  // Out-of-place or in-place (out == in). Graph-capturable. Returns the failure of an earlier
  // call (Timeout/Mismatch) once; later calls fall back to NCCL.
  Status all_reduce(const void* in, void* out, int64_t numel, DType dtype, cudaStream_t stream);
  // residual += allreduce(in) (bf16 rounding of each step as the unfused sequence), then
  // out = rmsnorm(residual) * weight over rows of `hidden`. numel = rows * hidden. One kernel on
  // the one-shot path when hidden % 8 == 0 (each CTA owns whole rows; stats().fused_calls);
  // otherwise the all-reduce then a residual+rmsnorm kernel. out may alias in.
  Status all_reduce_residual_rmsnorm(const void* in, void* residual, const void* weight, void* out,
                                     int64_t numel, int64_t hidden, float eps, DType dtype,
                                     cudaStream_t stream);
  // An all-reduce the caller already knows cannot take the P2P path (e.g. a strided tensor made
  // contiguous by the Python layer): counted under `reason` and run on NCCL.
  Status fallback_all_reduce(const void* in, void* out, int64_t numel, DType dtype,
                             CommFallback reason, cudaStream_t stream);
  // Non-blocking: Timeout/Mismatch (naming rank, peer and epoch) when a kernel of this rank has
  // failed, else Ok. Sticky. Synchronise the stream first to see the latest call's outcome.
  Status check();
  CommStats stats() const;
  // Whether P2P can serve this group at all (false: every call goes to NCCL), and why not.
  bool p2p_enabled() const;
  std::string p2p_disabled_reason() const;

  int rank() const;
  int world() const;
  int device() const;
  size_t capacity_bytes() const;
  size_t max_bytes() const;
  Status set_max_bytes(size_t bytes);  // <= capacity_bytes()
  void set_timeout_ms(long long ms);   // -1 = back to MOLORA_COMM_TIMEOUT_MS
  void set_algo(CommAlgo algo);
  // Bytes up to which kAuto uses one-shot, for this world.
  size_t oneshot_max_bytes() const;
  // The epoch of the last completed P2P call of this rank (reads device memory; syncs).
  Status epoch(uint64_t* out) const;

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The specification: out[i] = round(sum_{r=0..world-1} float(inputs[r][i])) in rank order,
// fp32 accumulation, one rounding (round to nearest even). dtype bf16, f16 or f32.
Status all_reduce_reference(const void* const* inputs, int world, void* out, int64_t numel,
                            DType dtype);
// The fused variant's specification: s = round(sum) as above; residual = round(s + residual);
// out = round(residual * rsqrt(mean(residual^2) + eps) * weight), per row of `hidden`.
Status all_reduce_residual_rmsnorm_reference(const void* const* inputs, int world, void* residual,
                                             const void* weight, void* out, int64_t numel,
                                             int64_t hidden, float eps, DType dtype);

}  // namespace molora
