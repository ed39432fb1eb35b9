// Device code shared by the stream kernels (lora_stream_shrink.cuh, lora_stream_expand.cuh) and
// the host side's declarations (lora_stream.cu, which includes all three). How the kernels work:
//
// The "stream" kernels of aligned routing (block size <= 32): warp-specialised pipelines that
// stream every weight byte of the call through shared-memory stages filled by bulk asynchronous
// copies (cp.async.bulk, Hopper's TMA engine), so that the bytes in flight do not depend on how
// many registers or threads the arithmetic needs. One CTA per SM; the tasks of a CTA are
// (group, chunk) items taken grid-stride, exactly as the grid kernel (lora.cu) numbers them.
// Every warp walks the same list, reads the expert id of each task (one load per 32 tasks) and
// keeps only the tasks that hold work (a valid virtual expert whose slot has rank > 0 and,
// shrink, a rank row in the chunk), so every warp counts valid tasks identically without talking
// to the others: valid task i belongs to consumer warp i % consumers.
//
// Expand: warp 0 is a producer, warps 1..consumers consume. Valid task i (`tile` rows of B[v]:
// whole rows as one bulk copy where the columns past r_s cost no extra DRAM sector, else the
// roundup(r_s, 8) columns of each row as 16-byte cp.async copies over the producer's lanes, so
// the bytes read follow r_s) takes ring position i (stage i % stages, phase i / stages). The
// producer waits for the stage to be released, announces the copy on the stage's `full` barrier
// and issues it; the consumer loads its task's pair ids and activations (t and y) while the
// copy is in flight, waits on `full`, computes from shared memory and releases the stage on
// `empty`.
//
// Shrink: no producer; every warp feeds a ring of its own (`stages` stages of 8 rank rows x 512
// columns of A[v]: a task's K-chunks, then the next task's), issuing the copy of piece u + stages
// right after it has computed piece u, and loads its x vectors from global memory (L2) while the
// copy of the piece it waits for lands. Nothing is handed between warps, so a stage's turn-around
// is one copy's latency: a producer warp serving several consumers through full/empty barriers
// measured ~0.36 us per stage for the hand-offs alone (bench/NOTES.md "lora v0.6"). Full rows of
// 8 go as two 2-D bulk tensor copies (boxes of 8 rows x 256 columns, one tensor map over A
// viewed as [S*E*r_max, K]; columns past K arrive as zeros); rows past a slot's rank are not
// read (the remainder rows of a chunk go as one copy per row and box).
//
// Every sum is taken in a fixed order and every output element written by one thread: the
// result is the same bits run to run. Every wait is bounded: a lost arrival traps (a launch
// error) instead of hanging the stream.
#pragma once

#include <cuda.h>  // CUtensorMap and the cuTensorMapEncodeTiled types (no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_util.h"
#include "lora/lora_device.cuh"
#include "lora/lora_internal.h"

namespace molora::lora::detail {

// Expand's tensor maps for slots whose rank rounds (to 8) below r_max: map j views B as
// [V, N, r_max] with boxes of (8 << j) columns x `tile` rows of one expert, so such a task is one
// copy of exactly its r8 columns per row, landing at the pitch r8 (rows past N arrive as zeros).
// Made on the host for r_max >= 32 (r_max <= 16: whole rows cost no extra DRAM sector); `ok` 0:
// none (the per-lane copies below are used).
struct ExpandMaps {
  CUtensorMap m[4];  // r8 = 8, 16, 32, 64
  int ok;
};

// --- host side (lora_stream.cu) --------------------------------------------------------------
// MOLORA_LORA_STREAM_PROBE (read once): the timing probe's bits (KernelArgs::dbg; 0 in normal use).
int probe_bits();
// Expand's tensor maps for r_max >= 32 (ok = 0 where none can be made), from the shared cache.
void expand_maps(const KernelArgs& a, ExpandMaps* out);
// The shrink kernel's maps of A where its stages are swizzled and K is not a multiple of the
// piece: `full` for the 512-column pieces, `tail` (a box of the last piece's chunks) for the
// piece that ends at K (the only one where K < 512: then `full` is the same map).
struct ShrinkMaps {
  CUtensorMap full, tail;
};
// Shrink's tensor map of A (false where none can be made: the kernel copies row by row, or the
// launcher takes the unswizzled kernel). Forms: kShrinkMapPlain, boxes of 8 rows x 256 columns;
// kShrinkMapSwizzled, [K / 64 chunks][rows][64 columns] in boxes of min(8, K / 64) chunks x 8
// rows with the 128-byte swizzle (K a multiple of 64); kShrinkMapTail, the same view in boxes
// of the last piece's (K % 512) / 64 chunks (K a multiple of 64, not of 512).
enum ShrinkMapForm : int { kShrinkMapPlain = 0, kShrinkMapSwizzled = 1, kShrinkMapTail = 2 };
bool shrink_map(const KernelArgs& a, CUtensorMap* out, ShrinkMapForm form);
// The launchers of each kernel (lora_stream_shrink.cuh, lora_stream_expand.cuh; T = __nv_bfloat16
// or __half): a plan run() has validated (stream_shape_ok, stream_tile_ok), `a` with the
// launch's divisors set (launch_stream).
template <typename T>
Status launch_stream_shrink(const KernelArgs& a, const Plan& plan, cudaStream_t stream);
template <typename T>
Status launch_stream_expand(const KernelArgs& a, const Plan& plan, cudaStream_t stream);

// (Unnamed: this header is private to lora_stream.cu, the one translation unit of the stream
// kernels.)
namespace {

constexpr int kSlots = kStreamSlots;
constexpr int kBox = kStreamShrinkBox;  // shrink: columns per box (256: 512 bytes per row)
constexpr int kBoxBytes = kStreamShrinkRows * kBox * 2;

// --- mbarrier and bulk-copy primitives (PTX ISA 8.0, sm_90) -------------------------------
__device__ __forceinline__ uint32_t sa(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
// A waiting warp is suspended in hardware (up to this long per try) instead of spinning: spinning
// warps take issue slots from the consumers that share their scheduler.
constexpr uint32_t kSuspendNs = 20000;
__device__ __forceinline__ bool bar_try(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(sa(b)), "r"(parity), "r"(kSuspendNs)
      : "memory");
  return ok != 0;
}
// Waits for the phase of parity `parity` to complete; traps after ~2^33 cycles (seconds).
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  if (bar_try(b, parity)) return;
  const long long t0 = clock64();
  while (!bar_try(b, parity))
    if (clock64() - t0 > (1LL << 33)) __trap();
}
// Waits until the producer has issued ring position `pos` (its counter is past it), then for
// the stage's fill. The counter comes first because consumers share stages: without it a warp
// that runs ahead could see the previous fill of its stage still pending, whose parity differs,
// and take that as its own phase being complete.
__device__ __forceinline__ void wait_filled(const volatile int* issued, uint64_t* full, int64_t pos,
                                            const FastDiv& stages) {
  if (*issued <= pos) {
    // Short fixed sleeps: the wake-up delay adds to the stage's turn-around whenever the
    // consumer is ahead of the producer.
    const long long t0 = clock64();
    while (*issued <= pos) {
      __nanosleep(32);
      if (clock64() - t0 > (1LL << 33)) __trap();
    }
  }
  bar_wait(full, stages.div(static_cast<uint32_t>(pos)) & 1u);
}
// A ring position kept as (stage, fill number) and stepped without dividing by `stages` (a
// runtime value: each division is ~20 dependent instructions on the per-piece path).
struct RingPos {
  int s = 0;       // stage
  uint32_t n = 0;  // fills of that stage before this one
  __device__ __forceinline__ void step(int d, int stages) {
    s += d;
    while (s >= stages) s -= stages, ++n;
  }
};
// One bulk copy global -> this CTA's shared memory, completing `bytes` on barrier b.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* b,
                                         uint64_t policy) {
  if (policy == 0) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(sa(dst)),
        "l"(src), "r"(bytes), "r"(sa(b))
        : "memory");
    return;
  }
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(sa(dst)),
      "l"(src), "r"(bytes), "r"(sa(b)), "l"(policy)
      : "memory");
}
// A 16-byte asynchronous copy global -> shared memory (L2 only), completion tracked by
// cp_async_arrive. (No L2 cache hint: the .L2::cache_hint form with an evict-first policy raised
// an illegal-instruction error on the H200.)
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(dst)), "l"(src) : "memory");
}
// An arrival on barrier b when this thread's earlier cp_async16 copies have landed (the
// barrier's expected count is raised by one first, so the phase waits for it).
__device__ __forceinline__ void cp_async_arrive(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// --- timeline probe (KernelArgs::trace, set_stream_trace) -----------------------------------
// Compiled in only with -DMOLORA_LORA_TRACE=ON (cmake): with the probe off at run time its null
// tests still cost 90-135 instructions per kernel (SASS of the bf16 kernels: shrink 3,138 ->
// 3,018, expand r32 5,023 -> 4,914; bench/NOTES.md "lora v0.12"). Without it every trace_*
// below is empty, and the kernels' code is that of a build without the probe.
#ifndef MOLORA_LORA_TRACE
#define MOLORA_LORA_TRACE 0
#endif
constexpr bool kTrace = MOLORA_LORA_TRACE != 0;
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Word `i` of this CTA's record = now, and word 8 + i = the SM's clock (the caller picks one
// thread).
__device__ __forceinline__ void trace_set(unsigned long long* tr, int i) {
  if (kTrace && tr != nullptr) {
    tr[blockIdx.x * kTraceWords + i] = gtime();
    tr[blockIdx.x * kTraceWords + 8 + i] = static_cast<unsigned long long>(clock64());
  }
}
// A warp is done: lane 0 folds now into words 5 (min) and 6 (max), its clock into 13 and 14.
__device__ __forceinline__ void trace_done(unsigned long long* tr) {
  if (kTrace && tr != nullptr && (threadIdx.x & 31) == 0) {
    const unsigned long long t = gtime(), c = static_cast<unsigned long long>(clock64());
    unsigned long long* r = tr + blockIdx.x * kTraceWords;
    atomicMin(r + 5, t);
    atomicMax(r + 6, t);
    atomicMin(r + 13, c);
    atomicMax(r + 14, c);
  }
}
// Thread 0 at the CTA's start: words 0 and 8, and words 5/6 and 13/14 reset for trace_done (ordered
// before the other warps' atomics by the __syncthreads that follows in both kernels).
__device__ __forceinline__ void trace_start(unsigned long long* tr) {
  if (kTrace && tr != nullptr && threadIdx.x == 0) {
    unsigned long long* r = tr + blockIdx.x * kTraceWords;
    r[0] = gtime();
    r[8] = static_cast<unsigned long long>(clock64());
    r[5] = r[13] = ~0ull;
    r[6] = r[14] = 0;
  }
}

// One 2-D bulk tensor copy: the box at (column c0, row c1) of `map` into shared memory.
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                       uint64_t* b, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(sa(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(sa(b)), "l"(policy)
      : "memory");
}

// One 3-D bulk tensor copy: the box at (c0, c1, c2) of `map` into shared memory.
__device__ __forceinline__ void tma_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                       uint64_t* b, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(sa(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(sa(b)), "l"(policy)
      : "memory");
}

// The stage pitch (in elements) of an expand task at rounded rank r8 in a kernel of r_max R:
// r8 where the task goes as one tensor copy (a power of two below R >= 32, maps made, neither
// probe bit 64 nor 128), else R. The producer and the consumers decide alike.
__device__ __forceinline__ int expand_pitch(int r8, int R, int maps_ok, int dbg) {
  return (maps_ok != 0 && !(dbg & (64 | 128)) && R >= 32 && r8 < R && (r8 & (r8 - 1)) == 0) ? r8
                                                                                            : R;
}

struct Ctx {
  const KernelArgs* a;
  uint8_t* smem;
  StreamLayout L;
  uint64_t *full, *empty;
  volatile int* issued;  // ring positions the producer has announced (written by its lane 0)
  const int* rank;
  const float* scale;
  int V, pieces, kc;
  int my_tasks;  // < 2^31: the planner bounds a call's tasks
  // Plain routing (plain_build): the groups, at smem + poff (StreamLayout::pmem: the member
  // pair ids group by group, then kStreamPlainPairs words on each group's virtual expert, then
  // each group's first member, groups + 1 entries); pgroups < 0 on aligned routing. (One 32-bit
  // offset instead of three pointers: the shrink kernel's registers are full.)
  uint32_t poff = 0;
  int pgroups = -1;
  __device__ __forceinline__ const uint16_t* pmem() const {
    return reinterpret_cast<const uint16_t*>(smem + poff);
  }
  __device__ __forceinline__ const uint16_t* pgv() const { return pmem() + kStreamPlainPairs; }
  __device__ __forceinline__ const uint16_t* pgs() const { return pmem() + 2 * kStreamPlainPairs; }
};

__device__ __forceinline__ int rank_of(const Ctx& x, int slot) {
  return x.a->S <= kSlots ? x.rank[slot] : min(max(__ldg(x.a->ranks + slot), 0), x.a->r_max);
}
__device__ __forceinline__ float scale_of(const Ctx& x, int slot) {
  return x.a->S <= kSlots ? x.scale[slot] : __ldg(x.a->scales + slot);
}

// This CTA's valid tasks in order: `next` gives the next one (its valid index vi, group g,
// chunk c, virtual expert v, rank r) or false at the end. A whole warp calls it (uniformly).
struct Task {
  int vi;
  int64_t g;
  int c, v, r;
};
template <Op OP>
struct TaskIter {
  // Division-free: the tasks of a round are blockIdx.x + (l0 + lane) * gridDim.x, and each lane
  // keeps its task's (group, chunk), stepped by 32 tasks per round (the step's quotient and
  // remainder by `chunks` taken once). The planner keeps every task index below 2^31, so the
  // arithmetic is 32-bit. (A 64-bit division per task was ~100 dependent instructions: on the
  // shrink kernel's three walks it was most of the fixed cost at small T, bench/NOTES.md v0.7.)
  const Ctx& x;
  int l0 = 0, vi = 0;
  unsigned m = 0;
  int ve = -1, rk = 0;
  int lg = 0, lc = 0;  // this lane's (group, chunk) for the current round
  int dg = 0, dc = 0;  // 32 tasks further: groups and chunks to add
  bool fresh = true;
  int pre = -1;  // the first round's expert id, loaded by the constructor
  // Made before the CTA knows its task count (num_tokens_post_pad): the first round's expert ids
  // are loaded at once for every group the align output can hold, so that their load and that of
  // num_tokens_post_pad are in flight together instead of one after the other (one L2 round trip
  // less before the first copy is issued). round() keeps only the lanes below the count.
  __device__ explicit TaskIter(const Ctx& c) : x(c) {
    const KernelArgs& a = *x.a;
    const uint32_t ch = static_cast<uint32_t>(a.chunks);
    const uint32_t t0 = blockIdx.x + (threadIdx.x & 31) * gridDim.x;
    lg = static_cast<int>(a.fd_chunks.div(t0)), lc = static_cast<int>(t0 - lg * ch);
    const uint32_t step = 32u * gridDim.x;
    dg = static_cast<int>(a.fd_chunks.div(step)), dc = static_cast<int>(step - dg * ch);
    if (x.pgroups >= 0) {
      pre = lg < x.pgroups ? static_cast<int>(x.pgv()[lg]) : -1;
    } else if (static_cast<int64_t>(lg + 1) * a.block <= a.sorted_len) {  // block lg exists
      pre = __ldg(a.rt.expert_ids + lg);
    }
  }
  // Loads the next round's expert ids; false at the end of the CTA's tasks.
  __device__ __forceinline__ bool round() {
    const KernelArgs& a = *x.a;
    const bool first = fresh;
    if (!fresh) {
      lg += dg, lc += dc;
      if (lc >= a.chunks) lc -= a.chunks, ++lg;
      l0 += 32;
    }
    fresh = false;
    if (l0 >= x.my_tasks) return false;
    ve = -1, rk = 0;
    bool ok = false;
    if (l0 + (threadIdx.x & 31) < x.my_tasks) {
      ve = first            ? pre
           : x.pgroups >= 0 ? static_cast<int>(x.pgv()[lg])
                            : __ldg(a.rt.expert_ids + lg);
      if (ve >= 0 && ve < x.V) {
        rk = rank_of(x, static_cast<int>(a.fd_E.div(static_cast<uint32_t>(ve))));
        ok = rk > 0 && (OP == Op::kExpand || lc * a.tile < rk);
      }
    }
    m = __ballot_sync(~0u, ok);
    return true;
  }
  __device__ __forceinline__ bool next(Task& t) {
    while (m == 0)
      if (!round()) return false;
    const int j = __ffs(m) - 1;
    m &= m - 1;
    t.g = __shfl_sync(~0u, lg, j);
    t.c = __shfl_sync(~0u, lc, j);
    t.v = __shfl_sync(~0u, ve, j);
    t.r = __shfl_sync(~0u, rk, j);
    t.vi = vi++;
    return true;
  }
  // The next valid task whose valid index is w modulo C (expand: consumer w's), skipping the
  // others without stepping through them: each lane holds its task's valid index in the round
  // (a prefix count of the mask), one ballot picks the first of this consumer's. Exactly the
  // tasks next() would give with turn counting, in the same order.
  __device__ __forceinline__ bool next_of(Task& t, int w, const FastDiv& C) {
    const int lane = threadIdx.x & 31;
    while (true) {
      if (m != 0) {
        const int idx = vi + __popc(m & ((1u << lane) - 1u));
        const bool mine = ((m >> lane) & 1u) && static_cast<int>(C.mod(idx)) == w;
        const unsigned sel = __ballot_sync(~0u, mine);
        if (sel != 0) {
          const int j = __ffs(sel) - 1;
          const unsigned upto = j == 31 ? ~0u : ((1u << (j + 1)) - 1u);
          vi += __popc(m & upto);
          m &= ~upto;
          t.g = __shfl_sync(~0u, lg, j);
          t.c = __shfl_sync(~0u, lc, j);
          t.v = __shfl_sync(~0u, ve, j);
          t.r = __shfl_sync(~0u, rk, j);
          t.vi = vi - 1;
          return true;
        }
        vi += __popc(m);
        m = 0;
      }
      if (!round()) return false;
    }
  }
  // The number of valid tasks left (consumes the iterator).
  __device__ __forceinline__ int count() {
    int n = __popc(m);
    m = 0;
    while (round()) n += __popc(m);
    m = 0;
    return n;
  }
};
// Calls f(valid_index, group, chunk, v, r) for each valid task, in order (whole warp).
template <Op OP, typename F>
__device__ __forceinline__ void for_valid_tasks(TaskIter<OP> it, F&& f) {
  Task t;
  while (it.next(t)) f(t.vi, t.g, t.c, t.v, t.r);
}

// The ranks (and scales) of slots < kSlots, cached in shared memory by the stream kernels. The
// first blockDim.x of them are loaded by the constructor into registers (one per thread), so
// that their global loads are issued before the task walk's (instructions issue in order: a
// load placed after the first use of num_tokens_post_pad would wait for that round trip first,
// one L2 latency more before the first copy); store() writes them, and loads any slot past
// blockDim.x, once the CTA's task count is known.
struct SlotCache {
  int rank = 0;
  float scale = 0.f;
  __device__ SlotCache(const KernelArgs& a, bool with_scale) {
    if (a.S <= kSlots && static_cast<int>(threadIdx.x) < a.S) {
      rank = __ldg(a.ranks + threadIdx.x);
      if (with_scale && a.scales != nullptr) scale = __ldg(a.scales + threadIdx.x);
    }
  }
  __device__ void store(const KernelArgs& a, int* s_rank, float* s_scale) const {
    if (a.S > kSlots) return;
    const int s0 = static_cast<int>(threadIdx.x);
    if (s0 < a.S) {
      s_rank[s0] = min(max(rank, 0), a.r_max);
      if (s_scale != nullptr) s_scale[s0] = scale;
    }
    for (int s = s0 + static_cast<int>(blockDim.x); s < a.S; s += blockDim.x) {
      s_rank[s] = min(max(__ldg(a.ranks + s), 0), a.r_max);
      if (s_scale != nullptr) s_scale[s] = a.scales != nullptr ? __ldg(a.scales + s) : 0.f;
    }
  }
};

// The tasks this CTA takes grid-stride: (group, chunk) items of the used blocks of the align
// output (num_tokens_post_pad, clamped to sorted_len), or of the plain routing's groups.
__device__ __forceinline__ int cta_tasks(const Ctx& x) {
  const KernelArgs& a = *x.a;
  uint32_t groups;
  if (x.pgroups >= 0) {
    groups = static_cast<uint32_t>(x.pgroups);
  } else {
    int64_t used = __ldg(a.rt.num_tokens_post_pad);
    used = max(int64_t{0}, min(used, a.sorted_len));
    // The planner keeps groups x chunks below 2^31: 32-bit divisions (a 64-bit one is a long
    // subroutine that every warp runs before its first task).
    // (Divisions by the launch's constants as multiplies, fastdiv.h: n < 2^31.)
    groups = used < (int64_t{1} << 31) ? a.fd_block.div(static_cast<uint32_t>(used))
                                       : static_cast<uint32_t>(used / a.block);
  }
  const uint32_t n_tasks = groups * static_cast<uint32_t>(a.chunks);
  if (n_tasks <= blockIdx.x) return 0;
  const uint32_t n = n_tasks - blockIdx.x + gridDim.x - 1;
  return static_cast<int>(n < (1u << 31) ? a.fd_grid.div(n) : n / gridDim.x);
}
// This lane's entry of block g of the align output (-1 past the block or the used length), or
// of plain group g (-1 past its members).
__device__ __forceinline__ int block_entry(const Ctx& x, int64_t g) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  if (x.pgroups >= 0) {
    const uint16_t* gs = x.pgs();
    const int s0 = gs[g], n = gs[g + 1] - s0;
    return lane < n ? static_cast<int>(x.pmem()[s0 + lane]) : -1;
  }
  const int64_t at = g * a.block + lane;
  return (lane < a.block && at < a.sorted_len) ? __ldg(a.rt.sorted_token_ids + at) : -1;
}
// --- plain routing: the groups, built by every CTA -------------------------------------------
// Inclusive scan of v over the warp's lanes in lane order (kMax: the maximum, else the sum):
// five shuffles. Whole warp.
template <bool kMax>
__device__ __forceinline__ int warp_incl_scan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(~0u, v, o);
    if (lane >= o) v = kMax ? max(v, t) : v + t;
  }
  return v;
}
// Exclusive prefix of v over the CTA's threads in thread order; *total gets the sum (every
// thread). Two barriers; wtot holds 32 words.
__device__ __forceinline__ int block_excl_scan(int v, int* wtot, int* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int inc = warp_incl_scan<false>(v);
  if (lane == 31) wtot[w] = inc;
  __syncthreads();
  // The warps' totals scanned by every warp at once, lane i holding warp i's (nw <= 32): a loop
  // over them unrolled by the compiler was 2.9 KB of code per use, and this code runs once per
  // CTA from a cold instruction cache (bench/NOTES.md "lora v0.22").
  const int wi = warp_incl_scan<false>(lane < nw ? wtot[lane] : 0);
  // (the warps below w: lane w - 1's sum; warp 0 reads lane 31, wrapped, and discards it)
  const int tot = __shfl_sync(~0u, wi, 31), below = __shfl_sync(~0u, wi, (w + 31) & 31);
  __syncthreads();  // (wtot is reused)
  *total = tot;
  return (w > 0 ? below : 0) + inc - v;
}
// out[i] = the sum of f(j) for j < i, i < n (thread t takes a run of ceil(n / threads) in
// order); returns the sum of all. Every thread calls it.
template <typename F>
__device__ __forceinline__ int scan_runs(int n, F&& f, int* out, int* wtot) {
  const int per = (n + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int i0 = static_cast<int>(threadIdx.x) * per, i1 = min(n, i0 + per);
  int sum = 0;
#pragma unroll 1
  for (int i = i0; i < i1; ++i) sum += f(i);
  int total;
  int run = block_excl_scan(sum, wtot, &total);
#pragma unroll 1
  for (int i = i0; i < i1; ++i) {
    const int v = f(i);
    out[i] = run;
    run += v;
  }
  return total;
}
// Sorts the warp's 32 keys ascending (lane l's key is position l) with a bitonic network of
// shuffles. A step at size k, stride j pairs positions i and i ^ j; the lower takes the smaller
// key when i & k is 0 (the larger otherwise). n (warp-uniform, a power of two <= 32): only the
// sizes up to n, so that lanes [0, n) end sorted ascending (the steps pair lanes within blocks of
// n; lanes past n are left in any order): where only the first n lanes hold keys. Used by
// plain_build's warp sort.
__device__ __forceinline__ void warp_bitonic_sort32(uint32_t& e, int lane, int n) {
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
    if (k > n) break;
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const uint32_t o = __shfl_xor_sync(~0u, e, j);
      e = ((lane & j) == 0) == ((lane & k) == 0) ? min(e, o) : max(e, o);
    }
  }
}
// Sorts the warp's 256 keys ascending, lane l holding positions 8l + h (e[h]), by the bitonic
// network at the sizes up to n (warp-uniform, a power of two in [8, 256]; positions [0, n) end
// sorted ascending, the blocks past n in any order). Strides 1-4 pair a lane's own keys (21 of
// the 36 steps at n = 256, no shuffle); a stride j >= 8 pairs lane l with lane l ^ (j / 8), key
// for key. Used by plain_build's warp sort of up to 256 pairs.
__device__ __forceinline__ void warp_bitonic_sort256(uint32_t (&e)[8], int lane, int n) {
#pragma unroll
  for (int k = 2; k <= 256; k <<= 1) {
    if (k > n) break;
    const bool lasc = ((lane << 3) & k) == 0;  // (the direction for k >= 8: a lane's 8 keys)
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j < 8) {
#pragma unroll
        for (int h = 0; h < 8; ++h) {
          if (h & j) continue;
          const bool asc = k < 8 ? (h & k) == 0 : lasc;
          const uint32_t lo = min(e[h], e[h | j]), hi = max(e[h], e[h | j]);
          e[h] = asc ? lo : hi, e[h | j] = asc ? hi : lo;
        }
      } else {
        const int m = j >> 3;
        const bool keep_min = ((lane & m) == 0) == lasc;
#pragma unroll
        for (int h = 0; h < 8; ++h) {
          const uint32_t o = __shfl_xor_sync(~0u, e[h], m);
          e[h] = keep_min ? min(e[h], o) : max(e[h], o);
        }
      }
    }
  }
}
// Groups the call's pairs (plain routing, P <= kStreamPlainPairs, V <= kStreamPlainMaxV) as the
// align output would at block size kStreamMaxBlock: virtual experts ascending, each one's pairs
// in ascending pair order, cut into groups of at most kStreamMaxBlock. Pairs without a valid
// virtual expert (slot -1 or out of range, expert out of range) join none. Every CTA computes
// the same groups, and the order does not depend on timing (no atomic decides a position), so
// the tasks are those of the aligned call at that block size, member for member. Whole CTA;
// returns the number of groups (plain_groups sets x.poff and x.pgroups). Three ways, by size:
//   P <= 32: warp 0 alone sorts the 32 keys (v << 5 | pair) in registers (a bitonic network of
//     shuffles); a pair's sorted position is its place, a key's first pair opens its group (a
//     key holds at most 32 pairs here). One barrier.
//   P <= kPlainWarpPairs: warp 0 alone sorts the keys (v << 11 | pair; kNone | pair without a
//     v), 8 per lane in registers, by one bitonic network up to n = the power of two >= P (21 of
//     its 36 steps at n = 256 inside a lane); each key's v-first place (the last key at or
//     before it whose v differs from the one before it) comes from a max-scan over the lanes,
//     the groups' firsts (every 32nd place from it) and their numbers from a sum-scan. One
//     barrier. (The forty-first session, bench/NOTES.md: before, counting to 64 pairs, three
//     barriers, and a block sort of 64-key chunks merged by binary searches to 256, five; this
//     way is 0.3-0.5 us faster per call at 64-256 pairs on the H100, but for the shrink N4096
//     at 64 pairs, unchanged, though its unrolled network is ~2,200 SASS instructions.)
//   else, tables: 1. each pair's virtual expert v (or -1) into key[]; a bitmap of the v present
//     and its words' prefix counts give each v its dense index d; 2. warp w takes pairs
//     [w * seg, (w + 1) * seg) 32 at a time: __match_any_sync finds the lanes of equal d, so
//     each pair gets its rank among the warp's pairs of its d (rl[]), counted in the warp's own
//     row of cntw; 3. per d: the warps' counts turned into each warp's first rank (warp order),
//     and a scan of (count, groups) over d gives each d's first member and first group; 4. each
//     pair lands at its d's first member + its rank, and every 32nd opens a group. Nine barriers.
// (Measured with the timeline probe's marks on the H100, bench/NOTES.md "lora v0.21", from the
// kernel's entry to the groups known, the routing loads included: the first form, the tables
// for every size, ~3 us at T = 1 and 8; the warp sort 0.7 us at T = 1; counting 1.8 us at
// P = 64 and 3.8 at 128; the tables 5.0 us at P = 512 and 9.0 at 2048, ~1 us of it the loads.)
// Code size is time here: each CTA runs this code once, from a cold instruction cache, and
// Nsight Compute's warp sampling put "no instruction" first among its stalls (226 of 758 samples
// in it, plain expand N2048 T=64, v0.22). So its loops with run-time bounds are not unrolled
// (`#pragma unroll 1`; they run a few times each) and the block scan reads the warps' totals
// with shuffles: 39.5 KB of code -> 21.6 KB, ~0.5-0.9 us less per call at T = 64-256.
constexpr int kPlainWarpPairs = 256;  // warp 0's sort, 8 keys per lane
static_assert(kPlainWarpPairs == 8 * 32 && kPlainWarpPairs <= kStreamPlainPairs,
              "the warp sort holds 8 keys per lane; its positions are 16-bit pair ids");
// The groups that c pairs of one virtual expert make (kStreamMaxBlock pairs each).
__device__ __forceinline__ int plain_groups_of(int c) {
  return (c + kStreamMaxBlock - 1) / kStreamMaxBlock;
}
constexpr int kPlainMaxWarps = 16;  // (a stream CTA has at most 12 warps)
static_assert(kPlainMaxWarps <= kStreamPlainWtotWords,
              "block_excl_scan keeps one total per warp in the scratch's wtot words");
// The routing and sizes plain_build reads (by value: it is not inlined, see plain_groups).
struct PlainIn {
  const int32_t* topk;
  const int32_t* slot;
  FastDiv fd_k;
  int P, S, E, V;
  unsigned long long* trace;  // the timeline probe's record of this launch (or null)
  int dbg;                    // probe bits (KernelArgs::dbg)
};
__device__ __noinline__ int plain_build(const PlainIn a, uint8_t* smem, uint32_t pmem_off,
                                        uint32_t scratch_off) {
  const int nt = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, w = tid >> 5, nw = nt >> 5;
  uint16_t* mem = reinterpret_cast<uint16_t*>(smem + pmem_off);
  uint16_t* gv = mem + kStreamPlainPairs;  // (StreamLayout: pgv and pgs follow pmem)
  uint16_t* gs = mem + 2 * kStreamPlainPairs;
  uint16_t* n_groups = gs + kStreamPlainPairs + 1;  // (StreamLayout: pgs's last entry)
  const int P = a.P, V = a.V;
  // The timeline probe's marks (words 16 + j: the SM's clock at step j, thread 0).
  auto mark = [&](int j) {
    if (kTrace && a.trace != nullptr && tid == 0)
      a.trace[blockIdx.x * kTraceWords + 16 + j] = static_cast<unsigned long long>(clock64());
  };
  mark(0);
  auto key_of = [&](int p) {  // (p < P)
    const int e = __ldg(a.topk + p);
    const int s = __ldg(a.slot + a.fd_k.div(static_cast<uint32_t>(p)));
    return (s >= 0 && s < a.S && e >= 0 && e < a.E) ? s * a.E + e : -1;
  };
  // No valid key: no pair with a valid v (every slot -1, say) means no group, and the rest of the
  // grouping is skipped. The warp sorts (P <= kPlainWarpPairs, one warp) skip their network.
  // The tables end their first barrier, the one after the routing loads, with __syncthreads_or
  // of "a valid key seen", and without one go straight to their last barrier, so such a call
  // costs the loads and two barriers (before, the whole grouping: 3.2 us at P = 256 and 5.0 at
  // 2048 on the H200 against 1.1 for the aligned call).
  // (Not a return there: a second way out of this function took 2 registers more in every plain
  // kernel, and spills in the plain shrink kernels.)
  if (P <= 32) {
    if (w == 0) {
      const int k = lane < P ? key_of(lane) : -1;
      uint32_t v = k >= 0 ? (static_cast<uint32_t>(k) << 5) | static_cast<uint32_t>(lane) : ~0u;
      // Keys only in lanes [0, P): the network up to the power of two n >= P (6 steps of 15 at
      // P = 8, one token at top-8), and none at all without a valid key ("No valid key" above).
      if (__any_sync(~0u, k >= 0))
        warp_bitonic_sort32(v, lane, P <= 1 ? 1 : 1 << (32 - __clz(P - 1)));
      const bool valid = v != ~0u;
      const uint32_t prev = __shfl_up_sync(~0u, v, 1);
      const bool head = valid && (lane == 0 || (prev >> 5) != (v >> 5));
      const unsigned heads = __ballot_sync(~0u, head), valids = __ballot_sync(~0u, valid);
      if (valid) mem[lane] = static_cast<uint16_t>(v & 31u);
      if (head) {
        const int g = __popc(heads & ((1u << lane) - 1u));
        gv[g] = static_cast<uint16_t>(v >> 5);
        gs[g] = static_cast<uint16_t>(lane);
      }
      if (lane == 0) {
        gs[__popc(heads)] = static_cast<uint16_t>(__popc(valids));
        *n_groups = static_cast<uint16_t>(__popc(heads));
      }
    }
    __syncthreads();  // (nothing was written into the stages: no proxy fence)
    mark(7);
    return *n_groups;
  }
  if (P <= kPlainWarpPairs) {
    // Warp 0 alone: the keys (v << 11 | pair; kNone | pair without a v) of positions 8 lane ..
    // 8 lane + 7 in its registers, sorted by one network (the sizes up to n, the power of two
    // >= P); then each key's v-first place (a head is a key whose v differs from the one before;
    // the last head at or before it: in the lane, then a max-scan over the lanes), the groups'
    // firsts (every kStreamMaxBlock-th place from it) and their numbers (a sum-scan over the
    // lanes), all in registers. No barrier but the last.
    if (w == 0) {
      constexpr uint32_t kNone = ~0u << 11;
      int n = 64;
      while (n < P) n <<= 1;
      uint32_t e[8];
      bool any = false;
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        const int p = 8 * lane + h;
        const int k = p < P ? key_of(p) : -1;
        any |= k >= 0;
        e[h] = (k >= 0 ? static_cast<uint32_t>(k) << 11 : kNone) | static_cast<uint32_t>(p);
      }
      // (without a valid key the keys are already in order: kNone | position; the timeline
      // probe's marks are inside the branch, so that they follow the loads the vote waits for)
      if (__any_sync(~0u, any)) {
        mark(1);  // keys loaded
        warp_bitonic_sort256(e, lane, n);
        mark(2);  // sorted
      }
      const uint32_t before = __shfl_up_sync(~0u, e[7], 1);  // (lane 0: its own, unused)
      int f = -1, fh[8], nv = 0;
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        const int pos = 8 * lane + h;
        const bool valid = e[h] < kNone;
        const uint32_t prev = h == 0 ? before : e[h - 1];
        if (valid && (pos == 0 || (prev >> 11) != (e[h] >> 11))) f = pos;
        fh[h] = f;
        nv += valid ? 1 : 0;
      }
      const int last = warp_incl_scan<true>(f);  // the last head at or before this lane's end
      int carry = __shfl_up_sync(~0u, last, 1);
      if (lane == 0) carry = -1;
      unsigned opens = 0;  // bit h: position 8 lane + h opens a group
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        const int first = max(fh[h], carry);
        if (e[h] < kNone && (8 * lane + h - first) % kStreamMaxBlock == 0) opens |= 1u << h;
      }
      const int no = __popc(opens);
      const int incl = warp_incl_scan<false>(no);  // groups opening at or before this lane's end
      const int nvalid = __reduce_add_sync(~0u, nv);
      // The positions' pairs, 8 per lane in one 16-byte store; those past the valid keys too,
      // unread (block_entry reads group g's members up to gs[g + 1], the last up to nvalid).
      uint32_t m[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) m[q] = (e[2 * q] & 0x7ffu) | ((e[2 * q + 1] & 0x7ffu) << 16);
      reinterpret_cast<uint4*>(mem)[lane] = make_uint4(m[0], m[1], m[2], m[3]);
      int g = incl - no;
#pragma unroll
      for (int h = 0; h < 8; ++h)
        if (opens & (1u << h)) {
          gv[g] = static_cast<uint16_t>(e[h] >> 11);
          gs[g] = static_cast<uint16_t>(8 * lane + h);
          ++g;
        }
      if (lane == 31)
        gs[incl] = static_cast<uint16_t>(nvalid), *n_groups = static_cast<uint16_t>(incl);
    }
    __syncthreads();  // (nothing was written into the stages: no proxy fence)
    mark(7);
    return *n_groups;
  }
  const PlainScratch sc = plain_scratch(nw);
  uint8_t* base = smem + scratch_off;
  uint32_t* bm = reinterpret_cast<uint32_t*>(base + sc.bm);
  int* wpre = reinterpret_cast<int*>(base + sc.wpre);
  int* key = reinterpret_cast<int*>(base + sc.key);
  uint16_t* dix = reinterpret_cast<uint16_t*>(base + sc.dix);
  uint16_t* rl = reinterpret_cast<uint16_t*>(base + sc.rl);
  int* cnt = reinterpret_cast<int*>(base + sc.cnt);
  int* scan = reinterpret_cast<int*>(base + sc.scan);
  int* wtot = reinterpret_cast<int*>(base + sc.wtot);
  uint16_t* cntw = reinterpret_cast<uint16_t*>(base + sc.cntw);
  {  // the tables
    const int nwords = (V + 31) >> 5;
    const int seg = ((P + nw - 1) / nw + 31) & ~31;  // pairs per warp in step 2
    const int nwa = (P + seg - 1) / seg;             // warps holding pairs
    const int ds = (min(P, V) + 1) & ~1;             // a warp's row of cntw (whole words)
#pragma unroll 1
    for (int i = tid; i < nwords; i += nt) bm[i] = 0u;
    // 1. (the routing ids of 4 pairs per thread in flight at once: 8 was 2.2 KB more code, and no
    // faster at 2048 pairs, bench/NOTES.md "lora v0.22")
    constexpr int kIn = 4;
    bool seen = false;  // a valid key among this thread's
#pragma unroll 1
    for (int p0 = tid; p0 < P; p0 += kIn * nt) {
      int k[kIn];
#pragma unroll
      for (int j = 0; j < kIn; ++j) k[j] = p0 + j * nt < P ? key_of(p0 + j * nt) : -1;
#pragma unroll
      for (int j = 0; j < kIn; ++j)
        if (p0 + j * nt < P) key[p0 + j * nt] = k[j], seen |= k[j] >= 0;
    }
    if (__syncthreads_or(seen)) {  // (else no group: "No valid key" above)
      mark(1);
      // The warps' counts of step 2, zeroed only where a group may follow (up to 20 words per
      // thread at 2048 pairs); the barrier after the bits orders it before step 2.
#pragma unroll 1
      for (int i = tid; i < nwa * ds / 2; i += nt) reinterpret_cast<uint32_t*>(cntw)[i] = 0u;
#pragma unroll 1
      for (int p = tid; p < P; p += nt) {
        const int k = key[p];
        if (k >= 0) atomicOr(bm + (k >> 5), 1u << (k & 31));
      }
      __syncthreads();
      const int D = scan_runs(
          nwords, [&](int i) { return __popc(bm[i]); }, wpre, wtot);
      __syncthreads();
      mark(2);
      // 2.
      const int p_end = min(P, (w + 1) * seg);
#pragma unroll 1
      for (int p0 = w * seg; p0 < p_end; p0 += 32) {  // (warp-uniform)
        const int p = p0 + lane;
        int d = -1;
        if (p < p_end) {
          const int k = key[p];
          if (k >= 0) d = wpre[k >> 5] + __popc(bm[k >> 5] & ((1u << (k & 31)) - 1u));
        }
        const unsigned peers = __match_any_sync(~0u, d);
        const int leader = __ffs(peers) - 1;
        int b = 0;
        if (d >= 0 && lane == leader) {
          b = cntw[w * ds + d];
          cntw[w * ds + d] = static_cast<uint16_t>(b + __popc(peers));
        }
        b = __shfl_sync(~0u, b, leader);
        if (d >= 0) {
          dix[p] = static_cast<uint16_t>(d);
          rl[p] = static_cast<uint16_t>(b + __popc(peers & ((1u << lane) - 1u)));
        }
      }
      __syncthreads();
      mark(3);
      // 3. Thread t takes the run [i0, i1) of d: the warps' counts (loaded first, then their
      // prefixes written), the total into cnt[]; then the block scan of (members << 16 | groups)
      // (both sums stay below 2^16: P <= 2048) gives scan[].
      auto packed = [](int c) { return (c << 16) | plain_groups_of(c); };
      const int per = (D + nt - 1) / nt, i0 = tid * per, i1 = min(D, i0 + per);
      int sum = 0;
#pragma unroll 1
      for (int d = i0; d < i1; ++d) {
        uint32_t c[kPlainMaxWarps];
#pragma unroll
        for (int v = 0; v < kPlainMaxWarps; ++v) c[v] = v < nwa ? cntw[v * ds + d] : 0u;
        uint32_t run = 0;
#pragma unroll
        for (int v = 0; v < kPlainMaxWarps; ++v) {
          if (v < nwa) cntw[v * ds + d] = static_cast<uint16_t>(run);
          run += c[v];
        }
        cnt[d] = static_cast<int>(run);
        sum += packed(static_cast<int>(run));
      }
      int tot;
      int ex = block_excl_scan(sum, wtot, &tot);
      mark(4);
#pragma unroll 1
      for (int d = i0; d < i1; ++d) {
        scan[d] = ex;
        ex += packed(cnt[d]);
      }
      __syncthreads();
      mark(5);
      // 4. (each warp over its pairs of step 2, so that the warp's row of cntw is its own: no
      // division by seg per pair)
#pragma unroll 1
      for (int p = w * seg + lane; p < p_end; p += 32) {
        const int k = key[p];
        if (k < 0) continue;
        const int d = dix[p];
        const int r = cntw[w * ds + d] + rl[p];
        const int sd = scan[d], m0 = sd >> 16;
        mem[m0 + r] = static_cast<uint16_t>(p);
        if (r % kStreamMaxBlock == 0) {
          const int g = (sd & 0xffff) + r / kStreamMaxBlock;
          gv[g] = static_cast<uint16_t>(k);
          gs[g] = static_cast<uint16_t>(m0 + r);
        }
      }
      const int groups = tot & 0xffff;
      if (tid == 0)
        gs[groups] = static_cast<uint16_t>(tot >> 16), *n_groups = static_cast<uint16_t>(groups);
    } else if (tid == 0) {
      *n_groups = 0;
    }
    mark(6);
  }
  // The tables end here. Their scratch may overlap the stages, which bulk copies (the async
  // proxy) fill next.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  mark(7);
  return *n_groups;
}
// plain_build for the kernel of x, into x.poff and x.pgroups. Not inlined, so that its tables and
// loops stay out of the kernels' register allocation (the call costs a save and restore of the
// kernel's live registers, once; ptxas reports 52-72 bytes of spill stores for the plain shrink
// kernels this way, 20-116 inlined).
//   kCheck (the expand kernels, with Plan::slot_check): every slot -1 (a batch of base-model
// requests) is found here, before the call, from the slots alone: each thread reads the slots of
// tokens tid, tid + threads, ... together with one expert id per 32-byte sector of them
// (plain_build reads the ids next, from L1, which fills sectors, not whole lines), and a CTA
// whose tokens have no slot in [0, S) has no group and skips plain_build (its code, cold in the
// instruction cache, and its save and restore). Such an expand costs 1.26-1.34 us against
// 1.61-2.54 (H100, N6144 T = 8-256; empty launch 0.96). Calls with adapters: -0.25 to +0.28 us
// (one id per 128-byte line, v0.31: +0.2-0.4 us; bench/NOTES.md "lora v0.32"). The shrink
// kernels, at their register cap, spilled with this check (28 / 0 / 12 -> 40-116 bytes of
// spill stores; calls with adapters 1-6% slower): theirs is plain_any_slot<false>, in the
// kernel.
// Whether any token's slot is in [0, S) (whole CTA). kLoops (the expand, plain_groups<true>):
// every token's slot and one expert id per sector of every pair. Else (the plain shrink, in the
// kernel): no loops, so that the shrink kernels, at their register cap, spill nothing more: the
// first slot and id of each thread only, and T > threads counts as a slot found. The shrink's
// every slot -1: 1.25-1.28 us against 1.98-2.72 (H100, N6144 T = 8-256); its calls with adapters
// pay 0.05-0.35 us (at most 1.5%): the grouping's loads wait for the check's (with one id per
// 128-byte line, a session before: 0.3-0.5; bench/NOTES.md "lora v0.32").
template <bool kLoops>
__device__ __forceinline__ bool plain_any_slot(const KernelArgs& a) {
  const int nt = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int P = static_cast<int>(a.P), T = static_cast<int>(a.T);
  // The first sector of expert ids and the first slot of each thread loaded at once (a real
  // load: the value joins the vote, an id of INT_MIN only ever taking the long way; with a
  // prefetch.global.L1 instead, or none, calls with adapters were 0.2-0.3 us slower at T = 8-32).
  const int p0 = tid * 8;  // (a 32-byte sector per 8 pairs)
  const int e0 = p0 < P ? __ldg(a.rt.topk_ids + p0) : 0;
  const int s0 = tid < T ? __ldg(a.rt.slot_ids + tid) : -1;
  bool any = (s0 >= 0 && s0 < a.S) || e0 == INT_MIN;
  if constexpr (kLoops) {
#pragma unroll 1
    for (int p = p0 + nt * 8; p < P; p += nt * 8) any |= __ldg(a.rt.topk_ids + p) == INT_MIN;
#pragma unroll 1
    for (int t = tid + nt; t < T; t += nt) {
      const int s = __ldg(a.rt.slot_ids + t);
      any |= s >= 0 && s < a.S;
    }
  } else {
    any |= T > nt;
  }
  return __syncthreads_or(any);
}
template <bool kCheck>
__device__ __forceinline__ void plain_groups(Ctx& x) {
  const KernelArgs& a = *x.a;
  int groups = 0;
  if (!kCheck || a.slot_check == 0 || plain_any_slot<true>(a)) {
    PlainIn in;
    in.topk = a.rt.topk_ids, in.slot = a.rt.slot_ids, in.fd_k = a.fd_k;
    in.P = static_cast<int>(a.P), in.S = a.S, in.E = a.E, in.V = x.V;
    in.trace = a.trace;
    in.dbg = a.dbg;
    groups = plain_build(in, x.smem, static_cast<uint32_t>(x.L.pmem),
                         static_cast<uint32_t>(x.L.scratch));
  }
  x.pgroups = groups;
  x.poff = static_cast<uint32_t>(x.L.pmem);
}

// Compacts the block's valid pair ids (p: this lane's entry) into ids[], ascending; returns the
// count. Whole warp.
__device__ __forceinline__ int compact_members(const KernelArgs& a, int p, int* ids) {
  const int lane = threadIdx.x & 31;
  const bool ok = p >= 0 && p < a.P;
  const unsigned bal = __ballot_sync(~0u, ok);
  if (ok) ids[__popc(bal & ((1u << lane) - 1u))] = p;
  __syncwarp();
  return __popc(bal);
}
__device__ __forceinline__ uint4 mask4(uint4 v, const uint4& keep) {
  v.x &= keep.x, v.y &= keep.y, v.z &= keep.z, v.w &= keep.w;
  return v;
}
// Tensor-core step: D += A (16 x 16, row) * B (16 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                        uint32_t a2, uint32_t a3, uint32_t b0,
                                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                 uint32_t a2, uint32_t a3, uint32_t b0,
                                                 uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// Tensor-core step: D += A (16 x 8, row) * B (8 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0);
template <>
__device__ __forceinline__ void mma1688<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                       uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
template <>
__device__ __forceinline__ void mma1688<__half>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
// The two 16-bit values of a 32-bit word packed from floats (round to nearest even).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The k order of the tensor-core steps. Lane l = 4 g + c (g = l / 4, c = l % 4) holds, in an
// m16n8k16 step, A elements (row g and g + 8; k 2c, 2c+1 and 2c+8, 2c+9) and B elements (column
// g; the same k). A sum over k may take the k in any order that A and B share, so lane c's four
// k of step s of "superstep" j (32 k) are taken as the physical k 32j + 8c + 4s + {0..3}: one
// 16-byte vector (vector 4j + c of a row) gives a lane both steps of a superstep, for either
// operand, and the 8 g-rows x 4 c-vectors of one load are contiguous in shared memory (no bank
// conflicts while a row is <= 64 bytes).
//   v.x: step 0, k 2c..2c+1   v.y: step 0, k 2c+8..   v.z: step 1, k 2c..   v.w: step 1, k 2c+8..
// The vector of a row past its nv = ceil(r / 8) vectors is zero, and its last vector is masked
// past r, for both operands (0 * NaN would be NaN).
//
// r_max <= 16 (one m16n8k16 step covers the row): lane c takes the physical k 4c..4c+3 as the
// step's k 2c, 2c+1 (word x) and 2c+8, 2c+9 (word y): one 8-byte load per operand and one step
// per 8-row tile, where the 32-k superstep above would spend half its steps and loads on zeros.

// A 4-byte global store when `c` holds, as one predicated instruction: no branch, so the
// compiler keeps a group's shared-memory loads and tensor-core steps ahead of its stores instead
// of sinking each tile's into the block of the store before it (one tile at a time, serialised).
__device__ __forceinline__ void st_global_if(uint32_t* p, uint32_t v, bool c) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.global.b32 [%0], %1;\n}" ::"l"(p),
               "r"(v), "r"(static_cast<uint32_t>(c))
               : "memory");
}

// The keep mask of a lane's 8-byte k16 vector (elements 4c..4c+3) for a row of rank r.
__device__ __forceinline__ uint2 keep_k16(int r, int cq) {
  const int e = 4 * cq;
  auto word = [r](int i) { return (i + 1 < r ? ~0u : i < r ? 0xffffu : 0u); };
  return make_uint2(word(e), word(e + 2));
}

// Lets kernel Kern take the stream layout's shared memory (once per kernel; the first result is
// kept).
template <auto Kern>
cudaError_t allow_stream_smem() {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kStreamSmemBytes);
  return attr;
}

}  // namespace
}  // namespace molora::lora::detail
