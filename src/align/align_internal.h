// Internal constants of the align part shared by the CPU reference (sizes, checks) and the CUDA
// path. Not a public header.
#pragma once

#include <cstdint>

#include "molora/align.h"

namespace molora::align_detail {

// The CUDA path splits the V experts into ranges of kExpertsPerRange; one CTA owns a range.
constexpr int64_t kExpertsPerRange = 512;

inline int64_t num_ranges(int64_t num_experts) {
  return (num_experts + kExpertsPerRange - 1) / kExpertsPerRange;
}

// Workspace (int32 words): vbuf [numel] (virtual id of each pair, -1 when dropped),
// loc [V] (block offset of each expert inside its range), part [R] (blocks of each range).
inline int64_t workspace_words(int64_t numel, int64_t num_experts) {
  int64_t w = numel + num_experts + num_ranges(num_experts);
  return (w + 3) / 4 * 4;  // whole 16-byte units
}

// Shapes, dtypes, capacities (and the workspace on the CUDA path): no CUDA call.
Status check_values(const AlignArgs& a, bool cuda_path);
// Every pointer is device memory (cudaPointerGetAttributes).
Status check_pointers(const AlignArgs& a);

}  // namespace molora::align_detail
