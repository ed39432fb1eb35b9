// Launch interface between the host side (communicator.cc) and the kernels (comm.cu).
// Not a public header.
#pragma once

#include <cstdint>

#include "comm/protocol.h"
#include "molora/common.h"
#include "molora/status.h"

namespace molora::comm {

// One rank's view of the group: where every rank's buffer is mapped in this rank's address
// space (IPC-opened, or the same device's pointers for an in-process group).
struct RankArgs {
  char* peer_data[kMaxWorld];   // data region (2 * world slots of slot_bytes) of each rank
  Header* peer_hdr[kMaxWorld];  // header of each rank ([rank] = this rank's own)
  ErrorMirror* mirror;          // host-mapped error mirror of this rank
  const void* in;
  void* out;
  void* residual;      // fused variant: this rank's residual (updated in place)
  const void* weight;  // fused variant: rmsnorm weight [hidden]
  int rank;
};

struct LaunchArgs {
  RankArgs ranks[kMaxWorld];  // gridDim.y entries (1 except for a fused local-group launch)
  int world;
  uint64_t nvec;  // message length in 16-byte vectors
  uint64_t slot_bytes;
  uint32_t hash;  // shape hash of this call
  uint64_t timeout_ns;
  int64_t hidden;  // fused variant: row length in elements (a multiple of 8)
  float eps;
};

enum class Kernel : int { kOneShot = 0, kTwoShot = 1, kOneShotResidualRmsnorm = 2 };

// grid_x CTAs per rank, grid_y ranks in this launch. kOneShotResidualRmsnorm: one kernel that
// all-reduces, adds the residual and normalises; each CTA owns whole rows (a.hidden).
Status launch_all_reduce(const LaunchArgs& a, int grid_x, int grid_y, DType dtype, Kernel kernel,
                         cudaStream_t stream);
// Loads every comm kernel into the current context now. With lazy loading (CUDA 12.2+ default)
// the first launch of a kernel may wait for the whole context to go idle; a rank of an
// in-process group that spins on a peer whose kernel is not loaded yet would then wait until
// its deadline. Called at creation.
Status preload_kernels(int device);
// Whether the residual+rmsnorm step uses 16-byte accesses (and so the fused one-shot kernel may
// serve the call): hidden % 8 == 0 and every pointer 16-byte aligned.
inline bool rmsnorm_vectorised(const void* sum, const void* residual, const void* weight,
                               const void* out, int64_t hidden) {
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return hidden % 8 == 0 && al(sum) && al(residual) && al(weight) && al(out);
}
// residual = round(sum + residual); out = round(residual * rsqrt(mean sq + eps) * weight);
// `sum` may alias `out`.
Status launch_residual_rmsnorm(const void* sum, void* residual, const void* weight, void* out,
                               int64_t rows, int64_t hidden, float eps, DType dtype,
                               cudaStream_t stream);
// True when two kernels on two streams of `device` run at the same time (false under tools
// that serialise launches, such as compute-sanitizer): a test helper.
Status probe_concurrent_streams(int device, bool* concurrent);

}  // namespace molora::comm
