// Internal constants of the align part shared by the CPU reference (sizes, checks) and the CUDA
// path. Not a public header.
#pragma once

#include <cstdint>

#include "molora/align.h"

namespace molora::align_detail {

// Calls with numel <= kSmallPairs take the one-launch path: every CTA that writes part of the
// used region sorts all the pairs itself (no workspace, no second launch).
constexpr int64_t kSmallPairs = 4096;
// Larger calls (three launches) cut the pairs into slices of kSlicePairs, one CTA each, and the
// experts into ranges of kExpertsPerRange, one CTA each.
constexpr int64_t kSlicePairs = 4096;
constexpr int64_t kExpertsPerRange = 512;

inline int64_t num_ranges(int64_t num_experts) {
  return (num_experts + kExpertsPerRange - 1) / kExpertsPerRange;
}
inline int64_t num_slices(int64_t numel) { return (numel + kSlicePairs - 1) / kSlicePairs; }

// Workspace (int32 words). One-launch path: none (4 words are still asked for, so a workspace is
// always passed). Three-launch path: vbuf [numel] (packed bucket and rank of each pair, -1 when it
// goes to no bucket), counts [C][V] (pairs of each expert in each slice, then their exclusive
// prefix over the slices), loc [V] (block offset of each expert inside its range), part [R]
// (blocks of each range), dropped [C][2] (per-slice num_dropped).
inline int64_t workspace_words(int64_t numel, int64_t num_experts) {
  if (numel <= kSmallPairs) return 4;
  const int64_t C = num_slices(numel);
  int64_t w = numel + C * num_experts + num_experts + num_ranges(num_experts) + 2 * C;
  return (w + 3) / 4 * 4;  // whole 16-byte units
}

// Shapes, dtypes, capacities (and the workspace on the CUDA path): no CUDA call.
Status check_values(const AlignArgs& a, bool cuda_path);
// Every pointer is device memory (cudaPointerGetAttributes).
Status check_pointers(const AlignArgs& a);

}  // namespace molora::align_detail
