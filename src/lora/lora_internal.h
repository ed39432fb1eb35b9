// Internal helpers of the lora part (not a public header): host fp16/bf16 conversion, the
// validation shared by the CPU and CUDA paths, and the kernel launch table.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "lora/fastdiv.h"
#include "molora/lora.h"

namespace molora::lora::detail {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// Reads element i of a host array of dtype f32/f16/bf16 as double.
inline double load(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}
inline void store(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      break;
    default:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
      break;
  }
}

inline int round8(int r) { return (r + 7) / 8 * 8; }

// Kernel arguments (one struct for both ops; pointers are device memory).
struct KernelArgs {
  const void* w = nullptr;   // A [S,E,r_max,K] or B [S,E,N,r_max]
  const void* in = nullptr;  // x [T,K] or t [P,r_max]
  void* out = nullptr;       // t [P,r_max] or y [P,N]
  const int32_t* ranks = nullptr;
  const float* scales = nullptr;
  Routing rt;
  int64_t T = 0, P = 0;
  int k = 0, S = 0, E = 0, r_max = 0;
  int64_t dim = 0;  // K (shrink) or N (expand)
  int aligned = 0, block = 0;
  int64_t sorted_len = 0;
  int mode = 0;  // kModePairs, kModeGrouped or kModeAligned
  int tile = 0, chunks = 0;
  int dbg = 0;         // stream kernel probe bits (MOLORA_LORA_STREAM_PROBE; 0 in normal use)
  int early = 0;       // stream kernels: Plan::early_inputs
  int slot_check = 0;  // plain stream kernels: Plan::slot_check
  // Shrink (both kernels) in moe_delta, always: the next kernel may launch only after this one's
  // own wait for the kernel before it (griddepcontrol.wait, then launch_dependents; a CTA that
  // leaves early waits first), so that the early reads of the delta's expand, and of a delta's
  // shrink right after it (shrink_early), start after everything before this one has ended.
  // 0: launch_dependents first thing.
  int late_trigger = 0;
  // Stream kernels' timeline probe (set_stream_trace; nullptr in normal use): kTraceWords words
  // per CTA, at trace + blockIdx.x * kTraceWords.
  unsigned long long* trace = nullptr;
  // The stream kernels' divisors (fastdiv.h), set by launch_stream: experts, top-k, align block
  // size, chunks per group, K pieces per task (shrink), ring stages, CTAs, warps per CTA,
  // consumer warps per CTA (expand).
  FastDiv fd_E, fd_k, fd_block, fd_chunks, fd_pieces, fd_stages, fd_grid, fd_warps, fd_consumers;
};

// How a CTA finds its group (see lora.cu).
constexpr int kModePairs = 0;    // plain routing, one pair per group (P > kGroupCap)
constexpr int kModeGrouped = 1;  // plain routing, pairs of one virtual expert, led by the first
constexpr int kModeAligned = 2;  // the blocks of the align output
// Plain routing groups pairs when P <= this (the member list lives in shared memory).
constexpr int kGroupCap = 4096;
// Pairs per pass: shrink accumulators per thread, expand t rows staged in shared memory.
constexpr int kShrinkMembers = 4;
constexpr int kExpandMembers = 8;

// The checks of a delta's problems shared by moe_delta, moe_delta_cpu and plan_delta: pb is a
// shrink's (op kShrink, K set) and both it and its expand's (delta_expand_problem(pb, N)) are
// valid. `who` names the caller in the error.
Status validate_delta(const char* who, const Problem& pb, int64_t N);

// Whether the stream kernel takes pb's routing (aligned with block_size <= kStreamMaxBlock, or
// plain within stream_plain_ok), and the error that says what it takes.
bool stream_routing_ok(const Problem& pb);
std::string stream_routing_error();
// The planner's rule for a work item's tile (and the grid kernel's unroll): "" when the kernel
// takes them, else why not. plan() applies it to tuned and forced values alike.
std::string tile_rule_error(const Problem& pb, bool stream, int64_t tile, int64_t unroll);
// A plan passed to shrink / expand / moe_delta must be one the kernels can run for pb: its
// kernel and shape (stream: stream_routing_ok, threads and stages the kernel takes), tile and
// unroll by the planner's rule, chunks and items of this problem, a grid of at least one CTA,
// and (grid kernel) the shared memory its member list needs. InvalidArgument "<op> plan does not
// match the problem: <why> (plan: ...)" otherwise. (Before, a tile off the rule was launched on a
// path no test runs, and shared memory below the member list was written past its end.)
Status check_plan(const Problem& pb, const Plan& pl);

// Launches the planned kernel (lora.cu). dtype kF16 or kBF16.
Status launch(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream);
// An empty kernel of `grid` CTAs x `threads` (the benchmark's launch baseline: what one call
// costs before it moves a byte).
Status launch_empty(int grid, int threads, cudaStream_t stream);
// CTAs of the kernel (U = unroll; plain or aligned routing) that fit on one SM with `smem`
// dynamic shared memory (0 if unknown).
int max_ctas_per_sm(Op op, DType dt, bool plain, int unroll, size_t smem);
// Threads per CTA of each kernel.
constexpr int kThreads = 256;
// Dynamic shared memory of a launch (the member list of one group).
size_t smem_bytes(int mode, int64_t P, int block);

// The stream kernel (lora_stream.cu): aligned routing with block size <= kStreamMaxBlock, or
// plain routing within stream_plain_ok (below).
// Expand: consumer warps plus one producer warp that fills a shared ring of stages. Shrink: every
// warp feeds its own ring (no producer warp; see lora_stream.cuh). The arithmetic runs on tensor
// cores. A CTA takes up to stream_max_consumers(op) consumer warps; the planner's default is
// stream_consumers(op), and MOLORA_LORA_STREAM_CONSUMERS overrides it (a tuning knob). Expand:
// 11 consumers + the producer = 12 warps, 3 per SM sub-partition, so each thread may hold 168
// registers (13 warps would put 4 on one sub-partition's 16 Ki registers: 128 each, and the 64 y
// words of r_max <= 16 would spill). More consumers hide more of each task's dependent loads
// (H200, N=6144 T=64: 8 -> 12 consumers 79.6 -> 69.2 us). Shrink: 12 warps x 2 stages measured
// 2-9% faster than 8 x 3 at T >= 64 and equal at T = 32; 4 x 6 and 2 x 13 slower everywhere
// (bench/NOTES.md "lora v0.6").
constexpr int stream_max_consumers(Op op) { return op == Op::kExpand ? 11 : 12; }
constexpr int stream_consumers(Op op) { return op == Op::kExpand ? 11 : 12; }
// Threads of a stream CTA with `consumers` consumer warps (expand adds the producer warp).
constexpr int stream_threads(Op op, int consumers) {
  return 32 * (consumers + (op == Op::kExpand ? 1 : 0));
}
constexpr int kStreamStageBytes = 16384;      // expand: weight bytes of one pipeline stage
constexpr int kStreamMaxBlock = 32;           // pairs per align block the kernel takes
constexpr int kStreamShrinkRows = 8;          // shrink: rank rows per task (the plan's tile)
constexpr int kStreamShrinkKc = 512;          // shrink: K columns per stage
constexpr int kStreamShrinkBox = 256;         // shrink: K columns per bulk tensor copy (box)
constexpr int kStreamShrinkSwzBox = 64;       // shrink, swizzled stages: K columns per chunk
constexpr int kStreamSmemBytes = 227 * 1024;  // dynamic shared memory a stream CTA may take
constexpr int kStreamSlots = 64;              // slots whose rank and scale live in shared memory
// Shrink: one warp's partial sums of a task cut between warps (4 batches x 32 lanes x 2 floats)
// and its `ready` barrier.
constexpr int kStreamShrinkPartBytes = (kStreamMaxBlock / 8) * 32 * 2 * 4 + 8;
// Bytes of one stage: expand, the weights of one task; shrink, 8 rank rows x 512 columns, as
// two boxes of 8 rows x 256 columns.
constexpr int stream_stage_bytes(Op op) {
  return op == Op::kExpand ? kStreamStageBytes : kStreamShrinkRows * kStreamShrinkKc * 2;
}
// Plain routing (topk_ids, slot_ids) on the stream kernels: every CTA groups the call's pairs
// by virtual expert itself, in shared memory (plain_build, lora_stream.cuh), into the groups the
// align output would hold at block size kStreamMaxBlock (same order, same members), so the rest
// of the kernel runs as on aligned routing. Up to kStreamPlainPairs pairs and V = S * E <=
// kStreamPlainMaxV (pair ids and virtual experts are kept as 16-bit words); past either, plain
// routing takes the grid kernel.
constexpr int kStreamPlainPairs = 2048;
// The tuner's noise margin: a tuned tile replaces the heuristic's, and a tuned kernel the
// planner's bounds' choice, only where it measured faster than this share of the other's time.
constexpr double kTuneMargin = 0.97;
constexpr int kStreamPlainMaxV = 65536;
// The scratch's small area (PlainScratch::wtot), 32-bit words: the block scan's warp totals (one
// per warp, at most 32 warps).
constexpr int kStreamPlainWtotWords = 32;
inline bool stream_plain_ok(int64_t P, int64_t V) {
  return P <= kStreamPlainPairs && V <= kStreamPlainMaxV;
}
// The grouping's scratch tables (byte offsets from the scratch's start) for a CTA of `warps`
// warps: a bitmap of the virtual experts present and its words' prefix counts, each pair's
// virtual expert, dense index and rank inside its warp's segment, the per-expert counts and their
// scan, the block scan's warp totals, and the per-warp counts (warps x kStreamPlainPairs 16-bit
// words). It overlaps the stages where they are large enough (nothing is copied into them
// before the grouping is done), else it follows the rest of the layout.
struct PlainScratch {
  size_t bm, wpre, key, dix, rl, cnt, scan, wtot, cntw, end;
};
#ifdef __CUDACC__
__host__ __device__
#endif
    inline PlainScratch
    plain_scratch(int warps) {
  PlainScratch s{};
  size_t o = 0;
  s.bm = o, o += 4 * (kStreamPlainMaxV / 32);
  s.wpre = o, o += 4 * (kStreamPlainMaxV / 32);
  s.key = o, o += 4 * kStreamPlainPairs;
  s.dix = o, o += 2 * kStreamPlainPairs;
  s.rl = o, o += 2 * kStreamPlainPairs;
  s.cnt = o, o += 4 * kStreamPlainPairs;
  s.scan = o, o += 4 * kStreamPlainPairs;
  s.wtot = o, o += 4 * kStreamPlainWtotWords;
  s.cntw = o, o += 2 * static_cast<size_t>(kStreamPlainPairs) * (warps > 0 ? warps : 1);
  s.end = o;
  return s;
}
// Shared-memory layout of one stream CTA (byte offsets; stages first). Expand: `stages` stages
// and their full/empty barriers, the producer's issued counter. Shrink: `stages` stages and full
// barriers per consumer warp (warp w's at index w * stages). Plain routing (`plain`) adds the
// groups (pmem: the member pair ids, pgv: each group's virtual expert, pgs: each group's first
// member, kStreamPlainPairs + 1 entries, then the group count) and the grouping's scratch
// (PlainScratch).
struct StreamLayout {
  int stages;
  size_t full, empty, issued, ids, rank, scale, ready, part, pmem, pgv, pgs, scratch, total;
};
#ifdef __CUDACC__
__host__ __device__
#endif
    inline StreamLayout
    stream_layout(Op op, int stages, int consumers, bool plain = false) {
  StreamLayout l{};
  l.stages = stages;
  const size_t n = static_cast<size_t>(stages) * (op == Op::kExpand ? 1 : consumers);
  const size_t stage_area = n * stream_stage_bytes(op);
  size_t o = stage_area;
  l.full = o, o += 8 * n;
  l.empty = o, o += op == Op::kExpand ? 8 * n : 0;
  l.issued = o, o += 16;
  l.ids = o, o += 4 * static_cast<size_t>(stream_max_consumers(op)) * kStreamMaxBlock;
  l.rank = o, o += 4 * kStreamSlots;
  l.scale = o, o += 4 * kStreamSlots;
  const size_t w = op == Op::kExpand ? 0 : static_cast<size_t>(consumers);
  l.ready = o, o += 8 * w;
  l.part = o, o += (kStreamShrinkPartBytes - 8) * w;
  if (plain) {  // (else pmem, pgv, pgs and scratch stay 0)
    o = (o + 15) / 16 * 16;
    l.pmem = o, o += 2 * static_cast<size_t>(kStreamPlainPairs);
    l.pgv = o, o += 2 * static_cast<size_t>(kStreamPlainPairs);
    l.pgs = o, o += (2 * static_cast<size_t>(kStreamPlainPairs + 2) + 15) / 16 * 16;
    const int warps = op == Op::kExpand ? consumers + 1 : consumers;
    const size_t need = plain_scratch(warps).end;
    if (need > stage_area) l.scratch = o, o += need;  // (else inside the stages, at 0)
  }
  l.total = o;
  return l;
}
// Pipeline stages: expand, the shared ring's; shrink, each warp's ring's. The default, and the
// most that fit in 227 KiB of shared memory with `consumers` consumer warps (and, `plain`, the
// plain routing's groups; MOLORA_LORA_STREAM_STAGES overrides the default within [2, max]).
inline int stream_stages(Op op) { return op == Op::kExpand ? 12 : 2; }
inline int stream_max_stages(Op op, int consumers, bool plain = false) {
  const int rings = op == Op::kExpand ? 1 : (consumers > 0 ? consumers : 1);
  const int extra = op == Op::kExpand ? 0 : rings * kStreamShrinkPartBytes;
  int m = (kStreamSmemBytes - 4096 - extra) / (rings * stream_stage_bytes(op));
  while (plain && m > 0 && stream_layout(op, m, consumers, true).total > kStreamSmemBytes) --m;
  return m;
}
// Expand rows per task: one stage of weights at r_max, at most 512 (r_max is a power of two).
// (Also the kernels' compile-time tile, ExpandTiles in lora_stream_expand.cuh.)
#ifdef __CUDACC__
__host__ __device__
#endif
    constexpr int
    stream_expand_tile(int r_max) {
  const int rows = kStreamStageBytes / (2 * r_max);
  return rows < 512 ? rows : 512;
}
// The consumer warps of a stream launch of `threads` threads (whole warps).
inline int stream_consumers_of(Op op, int threads) {
  return threads / 32 - (op == Op::kExpand ? 1 : 0);
}
// A stream launch's threads (whole warps: 1..max consumers, plus expand's producer) and stages
// (`plain`: with the plain routing's groups).
inline bool stream_shape_ok(Op op, int threads, int stages, bool plain = false) {
  const int c = stream_consumers_of(op, threads);
  return threads % 32 == 0 && c >= 1 && c <= stream_max_consumers(op) && stages >= 2 &&
         stages <= stream_max_stages(op, c, plain);
}
// A stream task's tile: shrink, kStreamShrinkRows rank rows; expand, a multiple of 32 rows that
// fits one stage at r_max (the kernel's register tiles are sized for that).
inline bool stream_tile_ok(Op op, int r_max, int tile) {
  return op == Op::kShrink ? tile == kStreamShrinkRows
                           : tile >= 32 && tile % 32 == 0 && tile <= stream_expand_tile(r_max);
}
// Launches a stream plan that run() has validated (stream_shape_ok, stream_tile_ok).
Status launch_stream(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream);
// The stream kernels' tensor-map cache (lora_stream.cu, memo_cache.h): lookups that found a map,
// maps encoded (misses), keys held, and the most it holds. For the benchmark and the tests.
struct MapCacheStats {
  uint64_t hits, misses;
  size_t size, capacity;
};
MapCacheStats tensor_map_cache_stats();
// Empties it (the benchmark's cold measurement).
void tensor_map_cache_clear();

// The stream kernels' timeline probe (the benchmark's `--timeline`). While a buffer is set, the
// n-th stream launch enqueued since (captured launches included) gets the kTraceWords x grid
// words at buf + n * grid * kTraceWords, until `words` are used up (later launches record
// nothing); set_stream_trace(nullptr, 0) turns it off. Per CTA, %globaltimer in ns (a 256 ns
// step on the H200): word 0 the CTA's start, 1 pdl_wait returned, 2 its task count known (after
// the first __syncthreads), 3 its first weight copy issued (shrink warp 0, expand's producer), 4
// that copy landed (shrink warp 0's lane 0 waits for it before its x loads while tracing,
// expand consumer 0's first task), 5 the first warp done, 6 the last warp done; word 7 the CTA's
// grid-stride tasks; words 8 + i the SM's clock64 at event i (i < 7; 0 where the event has
// none); words 16 + j (j < 8) the SM's clock at the plain routing grouping's steps
// (plain_build; 0 where it has none). One process-wide setting, for one thread's use.
// The probe is compiled in only with -DMOLORA_LORA_TRACE=ON (stream_trace_built(); else the
// kernels record nothing and set_stream_trace has no effect).
constexpr int kTraceWords = 24;
void set_stream_trace(unsigned long long* buf, int64_t words);
bool stream_trace_built();

}  // namespace molora::lora::detail
