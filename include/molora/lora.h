// molora/lora.h — MoE multi-LoRA shrink and expand over virtual experts, and their planner.
//
// Notation (used at every call site; N and K are never swapped):
//   T  tokens, k top-k, P = T*k routed pairs, pair p = token*k + j routed to expert e = topk[t][j]
//   S  adapter slots, E experts, virtual expert v = s*E + e, slot s = -1: no adapter
//   K  shrink input features (contraction dim):  x [T, K],  A [S, E, r_max, K]
//   N  expand output features:                   B [S, E, N, r_max],  y [P, N]
//   r_s = ranks[s] <= r_max (per slot; bytes read follow r_s), scale_s = scales[s]
//
//   shrink: t[p, :r_s]  = A[s, e, :r_s, :] @ x[token(p), :]           (t [P, r_max])
//   expand: y[p, :]    += scale_s * B[s, e, :, :r_s] @ t[p, :r_s]
// for every pair whose slot s >= 0 (pairs with s = -1 are left untouched and move no bytes).
// Arithmetic in fp32, storage bf16 or fp16 (the CPU reference also takes f32).
//
// Routing comes in one of two layouts:
//   plain:   topk_ids int32 [T, k] (expert per pair) and slot_ids int32 [T] (adapter per token).
//   aligned: the output of moe_align_block_size over the V = S*E virtual experts with block size
//            B: sorted_token_ids int32 [sorted_len] (flat pair ids, padded with the sentinel P),
//            expert_ids int32 [cdiv(sorted_len, B)] (virtual expert per block, -1 past the used
//            blocks), num_tokens_post_pad int32 [1].
// Ids out of range on the device (expert outside [0,E), slot outside [-1,S), virtual expert
// outside [0,V)) are treated like slot -1: skipped, never a write outside a buffer. The CPU
// path rejects them with InvalidArgument.
//
// The CUDA calls are graph-capturable: no host synchronisation, no allocation, grid fixed by the
// plan (the resident CTAs walk the work items grid-stride; items past the ones the device
// finds are never visited).
#pragma once

#include <cstdint>
#include <string>

#include "molora/common.h"
#include "molora/status.h"

namespace molora::lora {

enum class Op : int { kShrink = 0, kExpand = 1 };
enum class RoutingKind : int { kPlain = 0, kAligned = 1 };

const char* op_name(Op op) noexcept;
const char* routing_name(RoutingKind r) noexcept;

// Shape of one call. For shrink set K (N = 0); for expand set N (K = 0).
struct Problem {
  Op op = Op::kShrink;
  DType dtype = DType::kBF16;  // x, A, t (shrink) / t, B, y (expand)
  int64_t num_tokens = 0;      // T
  int top_k = 0;               // k
  int num_slots = 0;           // S
  int num_experts = 0;         // E
  int r_max = 0;               // 8, 16, 32, 64 or 128
  int64_t K = 0;               // shrink input features
  int64_t N = 0;               // expand output features
  RoutingKind routing = RoutingKind::kPlain;
  int block_size = 0;      // aligned: B
  int64_t sorted_len = 0;  // aligned: length of sorted_token_ids (P + V*(B-1) worst case)
};

// Optional facts about the routing, known to the caller (the benchmark computes them), that make
// the plan's byte count exact instead of the worst case.
struct RoutingStats {
  int64_t active_pairs = -1;    // pairs with slot >= 0
  int64_t active_tokens = -1;   // tokens with slot >= 0
  int64_t distinct_pairs = -1;  // distinct (slot, expert) among active pairs
  int64_t distinct_rank8 = -1;  // sum over distinct (slot, expert) of roundup(r_s, 8)
  int64_t active_rank8 = -1;    // sum over active pairs of roundup(r_s, 8)
};

// What the planner chose for a Problem; the kernels launch exactly this.
struct Plan {
  std::string variant;  // e.g. "expand.plain-grouped.bf16", "shrink.aligned-stream.f16"
  std::string kernel;   // "grid" (every routing) or "stream" (aligned with block <= 32, or
                        // plain up to 2048 pairs and S * E <= 65536)
  std::string source;   // the tile's: "heuristic", "tuned:<config file>" or "forced"
  // The kernel's: "heuristic" (the planner's bounds), "tuned:<config file>" (the tuner timed
  // both kernels at this token count on this GPU: the bounds' kernel unless the other one was
  // more than 3% faster) or "forced" (PlanOptions::kernel or MOLORA_LORA_KERNEL).
  std::string kernel_source;
  int threads = 0;        // threads per CTA
  int tile = 0;           // shrink: rank rows per work item; expand: N rows per work item
  int unroll = 0;         // grid: 16-byte weight loads in flight per thread (4 or 8)
  int stages = 0;         // stream: pipeline stages (expand: the shared ring's, 16 KiB each;
                          // shrink: each warp's ring's, 8 KiB each; 0 for grid)
  int chunks = 0;         // work items per group (cdiv(r_max, tile) or cdiv(N, tile))
  int64_t groups = 0;     // groups the kernel may find (P for plain, blocks for aligned)
  int64_t max_items = 0;  // groups * chunks
  int ctas_per_sm = 0;    // CTAs of this kernel resident per SM (occupancy; 0 without a GPU)
  int grid = 0;           // CTAs launched: min(max_items, SMs x ctas_per_sm), grid-stride
  int group_cap = 0;      // plain: pairs grouped by virtual expert when P <= this (0: not)
  int64_t est_items = 0;  // work items expected to hold work (distinct pairs x chunks)
  size_t smem_bytes = 0;  // dynamic shared memory per CTA
  int64_t bytes = 0;      // bytes that must move (exact with RoutingStats, else worst case)
  bool bytes_exact = false;
  double bandwidth_gbps = 0;  // bandwidth assumed for the floor
  double floor_us = 0;        // bytes / bandwidth
  // Launched with programmatic dependent launch (sm_90): the call's launch and set-up overlap
  // the kernel before it in the stream, whose completion it waits for before touching memory.
  // MOLORA_LORA_PDL: "" or "1" = on (every kernel: it measured faster on each), "0" = never.
  bool pdl = false;
  // Stream kernels with pdl only: the routing, ranks, scales and weights are read (and the first
  // weight copies issued) before the wait for the kernel before, the activations (x, t, y) read
  // and the outputs written only after it, so that the call's start overlaps that kernel's end.
  // Valid only where nothing that may still be running writes the routing, ranks, scales or
  // weights (e.g. align ran before the base expert GEMM that precedes this call; the pool's
  // weights were loaded before the step). Off unless asked for: PlanOptions::early_inputs or
  // MOLORA_LORA_EARLY_INPUTS=1.
  bool early_inputs = false;
  // Plain stream kernels only: before grouping the pairs, the CTA checks the first slots (token
  // t for thread t; a call of more tokens than threads counts as having an adapter) and, when
  // none is in [0, S), leaves: a call whose slots are all -1 then costs about one empty launch.
  // The check costs a call with adapters up to ~0.35 us, at most 1.5% (H100; docs/lora.md
  // "Every slot -1"), and saves a call without any 0.35-1.46 us.
  // On unless turned off: PlanOptions::slot_check or MOLORA_LORA_SLOT_CHECK=0.
  bool slot_check = false;
  std::string to_string() const;
  std::string to_json() const;
};

// Per-call options of plan(); zero values mean "default".
struct PlanOptions {
  const RoutingStats* stats = nullptr;
  double bandwidth_gbps = 0;  // default 4300 (H200 device-to-device copy)
  int sm_count = 0;           // default: the current device's, 132 without a device
  // Forces a configuration (the tuner): tile > 0 and/or unroll (4 or 8) replace the choice.
  int force_tile = 0;
  int force_unroll = 0;
  // Kernel: "" = MOLORA_LORA_KERNEL, else the planner's choice (stream for aligned routing with
  // block size <= 32: every expand, shrink from P = 16 pairs; grid otherwise); "grid" forces the
  // grid kernel; "stream" asks for the stream kernel and is an error where it does not apply.
  std::string kernel;
  // Config file to consult; "" = MOLORA_LORA_CONFIG, else configs/lora/<gpu>.json. "none" = skip.
  std::string config_path;
  // Plan::early_inputs: -1 = MOLORA_LORA_EARLY_INPUTS ("" or "0": off, "1": on), 0 off, 1 on.
  int early_inputs = -1;
  // Plan::slot_check: -1 = MOLORA_LORA_SLOT_CHECK ("" or "1": on, "0": off), 0 off, 1 on.
  int slot_check = -1;
};

// Checks the Problem (sizes, r_max, alignment) and fills `out`. MOLORA_LOG=plan logs each new
// shape's plan once.
Status plan(const Problem& pb, Plan* out, const PlanOptions& opt = {});

// Path of the tuned config for GPU `gpu_name` under the source tree (configs/lora/<name>.json,
// name lower-case with non-alphanumerics as '_').
std::string default_config_path(const std::string& gpu_name);

// Routing pointers (host memory for the CPU reference, device memory for the CUDA path).
struct Routing {
  const int32_t* topk_ids = nullptr;             // plain: [T, k]
  const int32_t* slot_ids = nullptr;             // plain: [T]
  const int32_t* sorted_token_ids = nullptr;     // aligned: [sorted_len]
  const int32_t* expert_ids = nullptr;           // aligned: [cdiv(sorted_len, B)]
  const int32_t* num_tokens_post_pad = nullptr;  // aligned: [1]
};

// CUDA shrink. x [T,K], A [S,E,r_max,K], ranks int32 [S] (0 <= r_s <= r_max), t [P, r_max].
// `plan_in` null: the call plans (cached per shape). Writes t[p, :r_s] of active pairs only.
Status shrink(const Problem& pb, const Plan* plan_in, const void* x, const void* A,
              const int32_t* ranks, const Routing& rt, void* t, cudaStream_t stream);
// CUDA expand. t [P, r_max], B [S,E,N,r_max], ranks int32 [S], scales f32 [S], y [P, N] updated
// in place (y += scale_s * B t) for active pairs only.
Status expand(const Problem& pb, const Plan* plan_in, const void* t, const void* B,
              const int32_t* ranks, const float* scales, const Routing& rt, void* y,
              cudaStream_t stream);

// --- The whole delta of one MoE layer's LoRA in one call: shrink, then expand -----------------
//   t[p, :r_s] = A[s, e, :r_s, :] @ x[token(p), :],  y[p, :] += scale_s * B[s, e, :, :r_s] @ t[p,
//   :r_s]
// Two kernels, one call. What it adds over calling shrink and expand: the expand reads its
// routing, ranks, scales and weights and issues its first weight copies while the shrink is still
// finishing (Plan::early_inputs on the expand's plan, where its kernel has them), which is always
// valid here, because the kernel before the expand is this call's own shrink (it writes t only),
// and the shrink lets the expand launch only after its own wait for the kernel before it (so
// nothing launched earlier in the stream is still running when the expand starts).
// `pb` is the shrink's Problem (op kShrink, K set, N = 0); N is the expand's output features.
struct DeltaPlan {
  // Early inputs as PlanOptions / MOLORA_LORA_EARLY_INPUTS say (the caller's contract).
  Plan shrink;
  // Early inputs on wherever the expand's kernel has them (stream kernel with pdl).
  Plan expand;
  std::string to_string() const;
  std::string to_json() const;  // {"shrink": {...}, "expand": {...}}
};
// The two plans of a moe_delta call (the expand's Problem is pb with op kExpand, K = 0, N).
// opt applies to both plans, a forced tile or kernel included (to force one op's only, fill a
// DeltaPlan from two plan() calls, the expand's with early_inputs = 1), except early_inputs,
// which applies to the shrink only.
Status plan_delta(const Problem& pb, int64_t N, DeltaPlan* out, const PlanOptions& opt = {});
// The Problem of the delta's expand: pb with op kExpand, K = 0 and N.
Problem delta_expand_problem(const Problem& pb, int64_t N);
// CUDA: x [T,K], A [S,E,r_max,K], B [S,E,N,r_max], ranks int32 [S], scales f32 [S], t [P, r_max]
// (workspace: written for active pairs, then read by the expand), y [P, N] updated in place.
// `plan_in` null: the call plans (cached per shape). Both plans and every pointer are checked
// before either kernel launches: on an error nothing is written. A plan passed in whose expand
// has early_inputs off computes exactly what shrink() followed by expand() computes.
// The shrink always lets the expand launch only after its own wait, so a delta that directly
// follows another delta in the stream (e.g. up's after gate's, same x and routing) may read its
// shrink's inputs early as well: everything still running then is a molora delta, which writes
// only its t and y. That is valid when those t and y are not this call's routing, ranks or A.
// Ask for it with shrink_early = 1 (plan_in null; with a plan, plan_delta's
// PlanOptions::early_inputs = 1 does the same); -1: PlanOptions' default (the setting), 0: off.
Status moe_delta(const Problem& pb, int64_t N, const DeltaPlan* plan_in, const void* x,
                 const void* A, const void* B, const int32_t* ranks, const float* scales,
                 const Routing& rt, void* t, void* y, cudaStream_t stream, int shrink_early = -1);
// CPU reference of the same: shrink_cpu into t, then expand_cpu from it.
Status moe_delta_cpu(const Problem& pb, int64_t N, const void* x, const void* A, const void* B,
                     const int32_t* ranks, const float* scales, const Routing& rt, void* t,
                     void* y);

// CPU reference (host pointers; dtype f32, f16 or bf16). Validates every id first and writes
// nothing on error. Accumulates in fp64, rounds t to the storage dtype like the kernels.
Status shrink_cpu(const Problem& pb, const void* x, const void* A, const int32_t* ranks,
                  const Routing& rt, void* t);
Status expand_cpu(const Problem& pb, const void* t, const void* B, const int32_t* ranks,
                  const float* scales, const Routing& rt, void* y);

// Host-side checks of a Problem (shared by plan, CPU and CUDA paths).
Status validate_problem(const Problem& pb);

}  // namespace molora::lora
