// molora/align.h — moe_align_block_size for up to 65,536 (virtual) experts.
//
// Groups the (token, expert) pairs of a top-k routing by expert, each expert's bucket padded to a
// multiple of the GEMM block size B, in exactly the layout the fused_moe family of kernels reads:
//
//   sorted_token_ids  int32 [numel + V*(B-1)]  flat pair index i = token*k + slot of each pair,
//                                              bucket after bucket (expert 0 first); every
//                                              position that holds no pair is the sentinel numel
//   expert_ids        int32 [cdiv(numel + V*(B-1), B)]  the expert of each block of B positions;
//                                              -1 for every block past the used ones
//   num_tokens_post_pad int32 [1]              number of used positions (a multiple of B)
//   num_dropped       int32 [2] (optional)     [0] pairs whose id is outside [0, V) (or whose slot
//                                              or base expert is invalid), [1] pairs of tokens
//                                              with slot -1 (no adapter). Neither goes to a bucket.
//
// numel = num_tokens * topk. Within a bucket the pairs are in ascending flat index, so the result
// is deterministic: the CPU reference and the CUDA path agree bit for bit.
//
// Virtual experts: with slot_ids (int32 [num_tokens], -1 = no adapter) and num_base_experts E, the
// bucket of pair (t, j) is v = slot_ids[t] * E + topk_ids[t, j], formed inside the kernel. A slot
// of -1 sends the token's pairs to no bucket (counted in num_dropped[1]); a slot below -1, a base
// id outside [0, E) or a v outside [0, V) is dropped and counted in num_dropped[0].
//
// The call allocates nothing: the caller passes the outputs and a workspace sized by
// moe_align_sizes(). The CUDA path is one kernel launch on `stream` when numel <= 4096 and three
// otherwise, no host synchronisation, and is legal under stream capture (CUDA graphs). All sizes
// depend only on (num_tokens, topk, num_experts, block_size), so a captured call can be replayed
// with new ids.
#pragma once

#include <cstdint>

#include "molora/common.h"
#include "molora/status.h"

namespace molora {

// Limits of moe_align_block_size.
constexpr int64_t kAlignMaxExperts = 65536;  // V
constexpr int64_t kAlignMaxPairs = 1 << 20;  // numel = num_tokens * topk
constexpr int kAlignMinBlockSize = 16;       // B is a power of two in [16, 256]
constexpr int kAlignMaxBlockSize = 256;

// Element counts of the outputs and the workspace size of one call shape.
struct AlignSizes {
  int64_t sorted_token_ids = 0;     // numel + V*(B-1)
  int64_t expert_ids = 0;           // cdiv(sorted_token_ids, B)
  int64_t num_tokens_post_pad = 1;  // always 1
  int64_t num_dropped = 2;          // always 2
  size_t workspace_bytes = 0;       // CUDA path scratch (the CPU reference needs none)
};

// Sizes for a call shape; InvalidArgument (naming the argument) when the shape is out of the
// limits above: num_tokens < 0, topk < 1, numel > kAlignMaxPairs, num_experts outside
// [1, kAlignMaxExperts], block_size not a power of two in [16, 256].
Status moe_align_sizes(int64_t num_tokens, int64_t topk, int64_t num_experts, int64_t block_size,
                       AlignSizes* sizes);

// One call. Pointers are device memory for moe_align_block_size and host memory for
// moe_align_block_size_cpu. Capacities (`*_len`, `workspace_bytes`) must be at least what
// moe_align_sizes() reports; exactly that many elements are written.
struct AlignArgs {
  const void* topk_ids = nullptr;  // [num_tokens, topk], row-major
  DType topk_dtype = DType::kI32;  // kI32 or kI64 (int64 ids are range-checked, never truncated)
  int64_t num_tokens = 0;          // T
  int64_t topk = 0;                // k
  int64_t num_experts = 0;         // V (buckets)
  int64_t block_size = 0;          // B

  const int32_t* slot_ids = nullptr;  // optional [num_tokens]; -1 = no adapter
  int64_t num_base_experts = 0;       // E; required (>= 1, <= V) with slot_ids, ignored without

  int32_t* sorted_token_ids = nullptr;
  int64_t sorted_token_ids_len = 0;
  int32_t* expert_ids = nullptr;
  int64_t expert_ids_len = 0;
  int32_t* num_tokens_post_pad = nullptr;  // [1]
  int32_t* num_dropped = nullptr;          // optional [2]

  void* workspace = nullptr;  // CUDA path only
  size_t workspace_bytes = 0;
};

// Validates `args` for the given path (device pointers for the CUDA path, host for the CPU
// reference are not checked there). Returns InvalidArgument naming the first bad argument.
// Called by both entry points before anything is written.
Status moe_align_check(const AlignArgs& args, bool cuda_path);

// CUDA path: one launch on `stream` for numel <= 4096 (each CTA fills its slice of the outputs and,
// where the slice can hold used positions, sorts all pairs itself; up to 128 pairs it places
// them by counting instead of sorting), three otherwise (per-slice sort
// and counts + fill, per-range scan, scatter); no host synchronisation, no allocation,
// capturable. Unavailable without CUDA. docs/align.md has the design and the measured numbers.
Status moe_align_block_size(const AlignArgs& args, cudaStream_t stream);

// CPU reference: the specification the CUDA path is tested against bit for bit.
Status moe_align_block_size_cpu(const AlignArgs& args);

}  // namespace molora
