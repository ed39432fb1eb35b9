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
#include <cuda.h>  // CUtensorMap and the cuTensorMapEncodeTiled types (no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/cuda_util.h"
#include "lora/lora_device.cuh"
#include "lora/lora_internal.h"
#include "lora/memo_cache.h"
#include "molora/settings.h"

namespace molora::lora::detail {
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

// Expand's tensor maps for slots whose rank rounds (to 8) below r_max: map j views B as
// [V, N, r_max] with boxes of (8 << j) columns x `tile` rows of one expert, so such a task is one
// copy of exactly its r8 columns per row, landing at the pitch r8 (rows past N arrive as zeros).
// Made on the host for r_max >= 32 (r_max <= 16: whole rows cost no extra DRAM sector); `ok` 0:
// none (the per-lane copies below are used).
struct ExpandMaps {
  CUtensorMap m[4];  // r8 = 8, 16, 32, 64
  int ok;
};
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
    if (static_cast<int64_t>(lg + 1) * a.block <= a.sorted_len)  // block lg exists
      pre = __ldg(a.rt.expert_ids + lg);
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
      ve = first ? pre : __ldg(a.rt.expert_ids + lg);
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
// output (num_tokens_post_pad, clamped to sorted_len).
__device__ __forceinline__ int cta_tasks(const KernelArgs& a) {
  int64_t used = __ldg(a.rt.num_tokens_post_pad);
  used = max(int64_t{0}, min(used, a.sorted_len));
  // The planner keeps groups x chunks below 2^31: 32-bit divisions (a 64-bit one is a long
  // subroutine that every warp runs before its first task).
  // (Divisions by the launch's constants as multiplies, fastdiv.h: n < 2^31.)
  const uint32_t groups = used < (int64_t{1} << 31) ? a.fd_block.div(static_cast<uint32_t>(used))
                                                    : static_cast<uint32_t>(used / a.block);
  const uint32_t n_tasks = groups * static_cast<uint32_t>(a.chunks);
  if (n_tasks <= blockIdx.x) return 0;
  const uint32_t n = n_tasks - blockIdx.x + gridDim.x - 1;
  return static_cast<int>(n < (1u << 31) ? a.fd_grid.div(n) : n / gridDim.x);
}
// This lane's entry of block g of the align output (-1 past the block or the used length).
__device__ __forceinline__ int block_entry(const KernelArgs& a, int64_t g) {
  const int lane = threadIdx.x & 31;
  const int64_t at = g * a.block + lane;
  return (lane < a.block && at < a.sorted_len) ? __ldg(a.rt.sorted_token_ids + at) : -1;
}
// --- expand producer ------------------------------------------------------------------------
template <typename T>
__device__ void produce(const Ctx& x, const TaskIter<Op::kExpand>& walk, const ExpandMaps& maps) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  const uint64_t pol = (a.dbg & 8) ? 0 : evict_first_policy();
  const int R = a.r_max;
  const T* W = static_cast<const T*>(a.w);
  // Waits for the stage of `pos` to be free, announces its bytes and issues its copies.
  // (Ring positions stepped without dividing measured 1-2% slower than dividing, v0.7; the
  // divisions are multiplies now, fastdiv.h.)
  auto issue = [&](int64_t pos, int c, int v, int r) {
    // Positions fit in 31 bits (a CTA's tasks < 2^31).
    const uint32_t up = static_cast<uint32_t>(pos);
    const uint32_t n = a.fd_stages.div(up);
    const int s = static_cast<int>(up - n * a.fd_stages.d);
    if (n > 0) bar_wait(x.empty + s, (n - 1) & 1u);
    uint8_t* dst = x.smem + static_cast<size_t>(s) * stream_stage_bytes(Op::kExpand);
    const int64_t N = a.dim, n0 = static_cast<int64_t>(c) * a.tile;
    const int rows = static_cast<int>(min(static_cast<int64_t>(a.tile), N - n0));
    const int r8 = (r + 7) / 8 * 8;
    const T* src = W + (static_cast<int64_t>(v) * N + n0) * R;
    // Whole rows as one bulk copy where the rows past r8 cost no DRAM sector more (r8 == r_max,
    // or rows of <= 32 bytes: r_max <= 16). Else the r8 columns of each row as 16-byte
    // asynchronous copies by every lane, their completion counted on the stage's barrier (one
    // bulk copy per row was ~35 cycles of copy-engine issue per row: a slot at rank r_max / 2
    // took 20.7 us for a 1 us call in the demo, bench/NOTES.md "lora v0.8").
    // Probe bit 128: whole rows for every rank (bytes at r_max; the consumers mask past r).
    const bool whole = r8 == R || R <= 16 || (a.dbg & 128);
    const int pitch = expand_pitch(r8, R, maps.ok, a.dbg);
    if (a.dbg & 4) {
      if (lane == 0) bar_arrive(x.full + s);
    } else if (pitch < R) {  // one tensor copy: `tile` rows x r8 columns at the pitch r8
      if (lane == 0) {
        bar_arrive_tx(x.full + s, static_cast<uint32_t>(a.tile) * r8 * 2);
        tma_3d(dst, &maps.m[__ffs(r8 >> 3) - 1], 0, static_cast<int>(n0), v, x.full + s, pol);
      }
    } else if (whole) {
      if (lane == 0) {
        bar_arrive_tx(x.full + s, static_cast<uint32_t>(rows) * R * 2);
        bulk_g2s(dst, src, static_cast<uint32_t>(rows) * R * 2, x.full + s, pol);
      }
    } else if (a.dbg & 32) {  // probe: one bulk copy per row (the form before v0.8)
      if (lane == 0) bar_arrive_tx(x.full + s, static_cast<uint32_t>(rows) * r8 * 2);
      __syncwarp();
      for (int j = lane; j < rows; j += 32)
        bulk_g2s(dst + static_cast<size_t>(j) * R * 2, src + static_cast<int64_t>(j) * R, r8 * 2,
                 x.full + s, pol);
    } else {
      const int nvr = r8 / 8;
      for (int j = lane; j < rows; j += 32)  // rows keep the r_max pitch in the stage
        for (int u = 0; u < nvr; ++u)
          cp_async16(dst + static_cast<size_t>(j) * R * 2 + u * 16,
                     src + static_cast<int64_t>(j) * R + u * 8);
      cp_async_arrive(x.full + s);  // (every lane: its copies, counted on the barrier)
      __syncwarp();
      if (lane == 0) bar_arrive(x.full + s);  // the phase's one expected arrival
    }
    __syncwarp();
    if (lane == 0) {  // after the stage's arrive: its phase for `pos` is the current one
      __threadfence_block();
      *x.issued = static_cast<int>(pos + 1);
      if (pos == 0) trace_set(a.trace, 3);
    }
  };
  for_valid_tasks<Op::kExpand>(walk,
                               [&](int vi, int64_t, int c, int v, int r) { issue(vi, c, v, r); });
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

// --- expand consumer: y[p, n0 + n] += scale * B[v, n0 + n, :r] . t[p, :r] --------------------
// Tensor cores, A = t (8 members of a batch in rows 0..7, rows 8..15 zero), B = the weight tile
// (k x 8 rows of N): per 8-row tile one shared-memory load per superstep (16 bytes; 8 bytes at
// r_max <= 16) and two m16n8k16 steps per superstep (one at r_max <= 16); the accumulator gives
// lane (g, c) rows 2c, 2c + 1 of member g, so y moves as one 4-byte word. The y words of member
// g for every 8-row tile (NT of them) and the t vectors are loaded into registers while the
// weights land (batches past the first: after). RM = r_max (compile time: the stage's row
// pitch, the tiles per task NT and the supersteps SUP follow from it).
//
// Every tile of a group of G is computed from registers of its own, with no branch around the
// steps or the loads: rows past the task's end compute from stale shared memory and only their
// stores are predicated off. (The first form branched on the run-time row count and vector
// count around each load and step; the compiler then reused one set of registers for every
// tile and chained them: ~150 cycles per tile, 6.8 us for one 64-tile task at r_max 16,
// bench/NOTES.md "lora v0.8".)
template <int RM>
struct ExpandTiles {
  static constexpr int kRows = stream_expand_tile(RM);
  static constexpr int NT = kRows / 8;              // 8-row tiles of a task at most
  static constexpr bool K16 = RM <= 16;             // one m16n8k16 step per tile
  static constexpr int SUP = K16 ? 1 : RM / 32;     // supersteps (32 k) of a row
  static constexpr int G = NT >= 64 ? 8 : 8 / SUP;  // tiles computed together
};
// FULL: every task of the launch has all NT tiles (tile = the stage's rows, N a multiple of
// it), so no tile is tested against the task's end.
template <typename T, int RM, bool FULL = false>
__device__ void expand_task(const Ctx& x, int vi, int c, int v, int r, int p, int* ids) {
  using E = ExpandTiles<RM>;
  constexpr int NT = E::NT, SUP = E::SUP, G = E::G;
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31, gq = lane >> 2, cq = lane & 3;
  const int64_t N = a.dim, n0 = static_cast<int64_t>(c) * a.tile;
  const int rows = static_cast<int>(min(static_cast<int64_t>(a.tile), N - n0));
  const int ntn = FULL ? NT : rows / 8;
  const float scale = scale_of(x, static_cast<int>(a.fd_E.div(static_cast<uint32_t>(v))));
  const T* tin = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const int count = (a.dbg & 2) ? 0 : compact_members(a, p, ids);
  const int nv = (r + 7) / 8;
  const uint4 tail = tail_mask(r), all = make_uint4(~0u, ~0u, ~0u, ~0u),
              zero = make_uint4(0, 0, 0, 0);
  uint4 keep[SUP];
#pragma unroll
  for (int j = 0; j < SUP; ++j) {
    const int vec = 4 * j + cq;
    keep[j] = vec < nv - 1 ? all : vec == nv - 1 ? tail : zero;
  }
  const uint2 keep2 = keep_k16(r, cq);
  const int64_t pos = vi;  // expand: one piece per task
  const int s = static_cast<int>(a.fd_stages.mod(static_cast<uint32_t>(pos)));
  const uint8_t* stage = x.smem + static_cast<size_t>(s) * stream_stage_bytes(Op::kExpand);
  const uint4* st = reinterpret_cast<const uint4*>(stage);
  const uint2* st2 = reinterpret_cast<const uint2*>(stage);
  const int batches = (a.dbg & 1) ? 0 : (count + 7) / 8;
#pragma unroll 1
  for (int bt = 0; bt <= max(batches - 1, 0); ++bt) {
    const int m0 = 8 * bt, mc = bt < batches ? min(8, count - m0) : 0;
    const int id = gq < mc ? ids[m0 + gq] : -1;
    const T* trow = tin + static_cast<int64_t>(id >= 0 ? id : 0) * a.r_max;  // (RM: the stage's)
    uint4 ta[SUP];
    uint2 ta2 = make_uint2(0, 0);
    if constexpr (E::K16) {
      if (id >= 0) {
        const uint2 t2 = __ldg(reinterpret_cast<const uint2*>(trow) + (RM == 8 ? (cq & 1) : cq));
        ta2 = make_uint2(t2.x & keep2.x, t2.y & keep2.y);
      }
    } else {
#pragma unroll
      for (int j = 0; j < SUP; ++j)
        ta[j] = id >= 0 ? mask4(__ldg(reinterpret_cast<const uint4*>(trow) + 4 * j + cq), keep[j])
                        : zero;
    }
    uint32_t* yp =
        reinterpret_cast<uint32_t*>(y + static_cast<int64_t>(id >= 0 ? id : 0) * N + n0 + 2 * cq);
    uint32_t yo[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) yo[nt] = (id >= 0 && (FULL || nt < ntn)) ? yp[nt * 4] : 0u;
    if (bt == 0) {
      wait_filled(x.issued, x.full + s, pos, a.fd_stages);
      if (vi == 0 && lane == 0) trace_set(a.trace, 4);
    }
    if (mc <= 0) break;
      // Groups of G 8-row tiles: the group's shared-memory loads, then its tensor-core steps, then
      // its y stores (a load after a store may not be moved above it: they could alias).
#pragma unroll
    for (int nt0 = 0; nt0 < NT; nt0 += G) {
      if (!FULL && nt0 >= ntn) break;  // (warp-uniform)
      float d[G][4];
      if constexpr (E::K16) {
        uint2 w[G];
#pragma unroll
        for (int u = 0; u < G; ++u) {
          // RM 8: rows of 2 vectors; lanes c >= 2 read their row's first two again (keep2 is 0)
          const uint2 wv = st2[((nt0 + u) * 8 + gq) * (RM / 4) + (RM == 8 ? (cq & 1) : cq)];
          w[u] = make_uint2(wv.x & keep2.x, wv.y & keep2.y);
        }
#pragma unroll
        for (int u = 0; u < G; ++u) {
          d[u][0] = d[u][1] = d[u][2] = d[u][3] = 0.f;
          mma16816<T>(d[u], ta2.x, 0u, ta2.y, 0u, w[u].x, w[u].y);
        }
      } else {
        uint4 w[G][SUP];
#pragma unroll
        for (int u = 0; u < G; ++u)
#pragma unroll
          for (int j = 0; j < SUP; ++j)
            w[u][j] = mask4(st[((nt0 + u) * 8 + gq) * (RM / 8) + 4 * j + cq], keep[j]);
#pragma unroll
        for (int u = 0; u < G; ++u) {
          d[u][0] = d[u][1] = d[u][2] = d[u][3] = 0.f;
#pragma unroll
          for (int j = 0; j < SUP; ++j) {  // rows g + 8 of A (a1, a3) are zero: 8 members
            mma16816<T>(d[u], ta[j].x, 0u, ta[j].y, 0u, w[u][j].x, w[u][j].y);
            mma16816<T>(d[u], ta[j].z, 0u, ta[j].w, 0u, w[u][j].z, w[u][j].w);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < G; ++u) {
        const int nt = nt0 + u;
        const float2 o = Cvt<T>::two(yo[nt]);
        st_global_if(yp + nt * 4, pack2<T>(fmaf(scale, d[u][0], o.x), fmaf(scale, d[u][1], o.y)),
                     id >= 0 && (FULL || nt < ntn));
      }
    }
  }
  __syncwarp();
  if (lane == 0) bar_arrive(x.empty + s);
}

// --- shrink: t[p, r0 + n] = A[v, r0 + n, :] . x[token(p), :] for n < 8, per-warp rings ------
// Tensor cores, per superstep one 16-byte shared-memory load of the weights. Batch 0 (members
// 0..7, the decode case): four m16n8k8 steps with A = the task's 8 rank rows as loaded (rows g
// and g + 8 of the step: words 0 and 1, or 2 and 3, of lane (g, c)'s weight vector) and B =
// one word of member g's x vector; the rows whose word pairs the same k are kept (g of the
// word-0/2 steps, g + 8 of the word-1/3 steps), so lane (g, c) ends with rank row g of members
// 2c, 2c + 1, and no operand register is copied into a zero-padded one. Batches past the first
// (prefill): two m16n8k16 steps with A = x (8 members in rows 0..7, rows 8..15 zero) and B =
// the weights, giving lane (g, c) rank rows 2c, 2c + 1 of member g. The sums are kept over every
// K-chunk and stored once: no cross-lane reduction. A stage is two boxes of 8 rows x 256
// columns (512 bytes per row): vector `vec` (8 columns) of row g is the 16-byte vector
// (vec / 32) * 256 + g * 32 + vec % 32. Batch 0's x vectors are loaded from global memory before
// the wait for the piece; members past 8 read x inline, 8 members per batch.
// KFULL: K is a multiple of the piece (kStreamShrinkKc), so no piece ends past K and the loads
// and steps of a piece carry no bounds test (a compare and a select per 16-byte vector, ~80 of a
// piece's ~300 instructions).
template <typename T, bool KFULL>
__global__ void __launch_bounds__(32 * stream_max_consumers(Op::kShrink), 1)
    molora_lora_shrink(KernelArgs a, int stages, const __grid_constant__ CUtensorMap map,
                       int use_map) {
  pdl_trigger();  // the next call may launch now; it waits for this one before touching memory
  trace_start(a.trace);
  extern __shared__ __align__(128) uint8_t smem[];
  const int W = static_cast<int>(blockDim.x >> 5), w = static_cast<int>(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, gq = lane >> 2, cq = lane & 3;
  Ctx x;
  x.a = &a;
  x.smem = smem;
  x.L = stream_layout(Op::kShrink, stages, W);
  x.full = reinterpret_cast<uint64_t*>(smem + x.L.full);
  x.empty = nullptr;
  x.issued = nullptr;
  int* s_rank = reinterpret_cast<int*>(smem + x.L.rank);
  x.rank = s_rank;
  x.scale = nullptr;
  x.V = a.S * a.E;
  const int64_t K = a.dim;
  x.kc = static_cast<int>(min(K, static_cast<int64_t>(kStreamShrinkKc)));
  x.pieces = static_cast<int>(a.fd_pieces.d);  // ceil(K / kc), made by the host (K <= 16384)
  uint64_t* ready = reinterpret_cast<uint64_t*>(smem + x.L.ready);
  float* part = reinterpret_cast<float*>(smem + x.L.part);
  // (One thread initialises every barrier: one per thread measured 1-4% slower, v0.10.)
  if (threadIdx.x == 0) {
    for (int s = 0; s < W * stages; ++s) bar_init(x.full + s, 1);
    for (int v = 0; v < W; ++v) bar_init(ready + v, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_wait();  // the kernel before this one is done (a no-op without the launch attribute)
  if (threadIdx.x == 0) trace_set(a.trace, 1);
  // The slots' ranks load first, so that they are in flight beside the first expert ids and
  // num_tokens_post_pad (SlotCache).
  const SlotCache slots(a, false);
  // (three walks below start from copies of it; its first expert ids load beside
  // num_tokens_post_pad)
  const TaskIter<Op::kShrink> walk(x);
  x.my_tasks = cta_tasks(a);
  slots.store(a, s_rank, nullptr);
  __syncthreads();
  if (kTrace && threadIdx.x == 0 && a.trace != nullptr) {
    trace_set(a.trace, 2);
    a.trace[blockIdx.x * kTraceWords + 7] = static_cast<unsigned long long>(x.my_tasks);
  }
  // The CTA's pieces (valid tasks x K-chunks, in task order) split evenly over the warps: warp w
  // takes pieces [begin(w), begin(w + 1)). A task cut between warps is finished by the warp that
  // holds its first piece: the later ones leave their partial sums in shared memory (`part`,
  // announced on `ready`), which it adds in warp order (fixed: the same bits run to run).
  const int total = TaskIter<Op::kShrink>(walk).count();
  const int64_t ptot = static_cast<int64_t>(total) * x.pieces;
  // Split points begin(v) = v * ptot / W, lane v holding begin(v) for v <= W (one division per
  // lane, all at once: the warp that finishes a cut task reads its helpers' from the lanes).
  // 32-bit where the products fit (always, in practice): a 64-bit division is a long subroutine.
  const bool small = ptot * W < (int64_t{1} << 31);
  const int64_t my_split = lane > W ? ptot
                           : small  ? static_cast<int64_t>(a.fd_warps.div(
                                          static_cast<uint32_t>(lane) * static_cast<uint32_t>(ptot)))
                                    : static_cast<int64_t>(lane) * ptot / W;
  const int64_t u0 = __shfl_sync(~0u, my_split, w), u1 = __shfl_sync(~0u, my_split, w + 1);
  // Lane v (w < v < W) is set when warp v holds pieces: the candidates to finish a task of ours.
  const int64_t next_split = __shfl_down_sync(~0u, my_split, 1);  // (every lane: a shuffle)
  const unsigned holders = __ballot_sync(~0u, lane > w && lane < W && next_split > my_split);
  // The valid task of piece u0 and the piece within it (later tasks start at piece 0).
  const int64_t ti0 =
      small ? static_cast<int64_t>(a.fd_pieces.div(static_cast<uint32_t>(u0))) : u0 / x.pieces;
  const int q0 = static_cast<int>(u0 - ti0 * x.pieces);
  constexpr int kStage = stream_stage_bytes(Op::kShrink);
  uint8_t* ring = smem + static_cast<size_t>(w) * stages * kStage;
  uint64_t* full = x.full + w * stages;
  int* ids = reinterpret_cast<int*>(smem + x.L.ids) + w * kStreamMaxBlock;
  const uint64_t pol = (a.dbg & 8) ? 0 : evict_first_policy();
  const T* A = static_cast<const T*>(a.w);
  const T* X = static_cast<const T*>(a.in);
  const int R = a.r_max;
  const bool boxes_ok = use_map != 0 && !(a.dbg & 16);
  auto seek = [&](TaskIter<Op::kShrink>& it, Task& t, int64_t i) {  // valid task i
    for (int64_t j = 0; j <= i; ++j) it.next(t);
  };

  // Issue side: this warp's pieces in order (task by task, K-chunk by K-chunk), `stages` ahead.
  TaskIter<Op::kShrink> iss(walk);
  Task it_t;
  int it_left = static_cast<int>(u1 - u0);  // < 2^31: a CTA's tasks x 32 pieces
  if (it_left > 0) seek(iss, it_t, ti0);
  // The first task's pair ids load now, ahead of the first copies (the x loads wait for them).
  // Issued after the copies, behind every warp's weights in the memory system, their wait was
  // a third of the stall samples at T=8 (ncu), and loading them here made T=8 6.6% faster
  // (bench/NOTES.md "lora v0.11").
  int p = it_left > 0 ? block_entry(a, it_t.g) : -1;
  int it_q = q0;
  int iss_s = 0;  // the stage of the next piece to issue
  auto issue_next = [&]() {
    if (it_left <= 0) return;
    const int s = iss_s;
    if (++iss_s == stages) iss_s = 0;
    uint8_t* dst = ring + static_cast<size_t>(s) * kStage;
    uint64_t* b = full + s;
    const int64_t k0 = static_cast<int64_t>(it_q) * x.kc;
    const int cols = static_cast<int>(min(static_cast<int64_t>(x.kc), K - k0));
    const int nbox = (cols + kBox - 1) / kBox;
    const int r0 = it_t.c * kStreamShrinkRows, rows = min(kStreamShrinkRows, it_t.r - r0);
    const int64_t row0 = static_cast<int64_t>(it_t.v) * R + r0;
    const bool boxes = boxes_ok && rows == kStreamShrinkRows;
    if (a.dbg & 4) {
      if (lane == 0) bar_arrive(b);
    } else {
      if (lane == 0)
        bar_arrive_tx(b, boxes ? static_cast<uint32_t>(nbox * kBoxBytes)
                               : static_cast<uint32_t>(rows * cols * 2));
      __syncwarp();
      if (boxes) {  // columns past K arrive as zeros (and count in the box's bytes)
        if (lane < nbox)
          tma_2d(dst + lane * kBoxBytes, &map, static_cast<int>(k0) + lane * kBox,
                 static_cast<int>(row0), b, pol);
      } else if (lane < rows * nbox) {  // one copy per row and box (rows * nbox <= 16)
        const int row = lane / nbox, bx = lane - row * nbox;
        const int cb = min(kBox, cols - bx * kBox);
        bulk_g2s(dst + bx * kBoxBytes + row * kBox * 2, A + (row0 + row) * K + k0 + bx * kBox,
                 static_cast<uint32_t>(cb) * 2, b, pol);
      }
    }
    --it_left;
    if (++it_q == x.pieces) {
      it_q = 0;
      if (it_left > 0) iss.next(it_t);
    }
  };
  for (int i = 0; i < stages; ++i) issue_next();
  if (kTrace && a.trace != nullptr && w == 0 && lane == 0) {
    // (Lane 0 waits for the first stage here, so that the piece loop carries no test: its x
    // loads follow the copy instead of preceding it, only while tracing.)
    trace_set(a.trace, 3);
    if (u0 < u1) bar_wait(full, 0), trace_set(a.trace, 4);
  }

  // Compute side: the same pieces in the same order; the next task's pair ids loaded ahead.
  constexpr int kB = kStreamMaxBlock / 8;     // batches of 8 members
  constexpr int kSup = kStreamShrinkKc / 32;  // supersteps of one piece
  const uint4 zero = make_uint4(0, 0, 0, 0);
  RingPos done;  // the next piece to compute
  TaskIter<Op::kShrink> cmp(walk);
  Task cur, nxt;
  int64_t u = u0;
  if (u < u1) seek(cmp, cur, ti0);  // (cur is it_t's task: p holds its pair ids)
  int64_t ti_next = ti0;
  int q_next = q0;
  while (u < u1) {
    const int64_t ti = ti_next++;  // this task's valid index and its pieces [q_lo, q_hi)
    const int q_lo = q_next;
    q_next = 0;
    const int q_hi = static_cast<int>(min(static_cast<int64_t>(x.pieces), q_lo + (u1 - u)));
    u += q_hi - q_lo;
    const bool have_n = u < u1;
    if (have_n) cmp.next(nxt);
    const int pn = have_n ? block_entry(a, nxt.g) : -1;
    const int count = (a.dbg & 2) ? 0 : compact_members(a, p, ids);
    const int nb = (count + 7) / 8;
    const int r0 = cur.c * kStreamShrinkRows, rows = min(kStreamShrinkRows, cur.r - r0);
    // x row offset of member gq (batch 0; -1: none); batches past it read theirs from ids[]
    const int64_t xrow0 =
        gq < count ? static_cast<int64_t>(a.fd_k.div(static_cast<uint32_t>(ids[gq]))) * K : -1;
    float acc[kB][2];
#pragma unroll
    for (int bt = 0; bt < kB; ++bt) acc[bt][0] = acc[bt][1] = 0.f;
    // Batch 0's accumulators: ch[i] takes word i of every superstep's vectors (see below).
    float ch[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) ch[u][0] = ch[u][1] = ch[u][2] = ch[u][3] = 0.f;
#pragma unroll 1
    for (int q = q_lo; q < q_hi; ++q) {
      const int64_t k0 = static_cast<int64_t>(q) * x.kc;
      const int nvec = static_cast<int>(min(static_cast<int64_t>(x.kc), K - k0)) / 8;
      const bool math = !(a.dbg & 1);
      uint4 xv[kSup];
#pragma unroll
      for (int j = 0; j < kSup; ++j) {
        const int vec = 4 * j + cq;
        xv[j] = (math && xrow0 >= 0 && (KFULL || vec < nvec))
                    ? __ldg(reinterpret_cast<const uint4*>(X + xrow0 + k0) + vec)
                    : zero;
      }
      const int s = done.s;
      bar_wait(full + s, done.n & 1u);
      const uint4* ws = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(s) * kStage);
      if (math) {
#pragma unroll
        for (int j = 0; j < kSup; ++j) {
          const int vec = 4 * j + cq;
          const uint4 wv =
              (KFULL || vec < nvec) ? ws[(vec >> 5) * 256 + gq * 32 + (vec & 31)] : zero;
          // m16n8k8 with A = the weights (word pairs as loaded: row g takes word 0 / 2, row
          // g + 8 word 1 / 3) and B = one word of x: each step's rows g (words 0, 2) or g + 8
          // (words 1, 3) pair the same k, the other half is discarded. No register of x or of
          // the weights is copied into a zero-padded operand (the k16 form with x as A spent
          // 8 moves per superstep on that).
          mma1688<T>(ch[0], wv.x, wv.y, xv[j].x);
          mma1688<T>(ch[1], wv.x, wv.y, xv[j].y);
          mma1688<T>(ch[2], wv.z, wv.w, xv[j].z);
          mma1688<T>(ch[3], wv.z, wv.w, xv[j].w);
        }
        // Batches past the first (blocks of more than 8 pairs): x from L2, half a piece of
        // loads in flight at a time (one load -> step chain per superstep serialised 16 L2
        // latencies per piece and made T=256 55% of copy where T=128 ran at 81%).
#pragma unroll
        for (int bt = 1; bt < kB; ++bt) {
          if (bt < nb) {
            const int m = bt * 8 + gq;
            const int64_t xrow =
                m < count ? static_cast<int64_t>(a.fd_k.div(static_cast<uint32_t>(ids[m]))) * K
                          : -1;
#pragma unroll 1
            for (int h = 0; h < kSup; h += kSup / 2) {
              uint4 xb[kSup / 2];
#pragma unroll
              for (int u = 0; u < kSup / 2; ++u) {
                const int vec = 4 * (h + u) + cq;
                xb[u] = ((KFULL || vec < nvec) && xrow >= 0)
                            ? __ldg(reinterpret_cast<const uint4*>(X + xrow + k0) + vec)
                            : zero;
              }
              float d[2][4] = {{acc[bt][0], acc[bt][1], 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
              for (int u = 0; u < kSup / 2; ++u) {
                const int vec = 4 * (h + u) + cq;
                const uint4 wv =
                    (KFULL || vec < nvec) ? ws[(vec >> 5) * 256 + gq * 32 + (vec & 31)] : zero;
                mma16816<T>(d[u & 1], xb[u].x, 0u, xb[u].y, 0u, wv.x, wv.y);
                mma16816<T>(d[u & 1], xb[u].z, 0u, xb[u].w, 0u, wv.z, wv.w);
              }
              acc[bt][0] = d[0][0] + d[1][0], acc[bt][1] = d[0][1] + d[1][1];
            }
          }
        }
      }
      __syncwarp();  // every lane is done with the stage: refill it
      done.step(1, stages);
      issue_next();
    }
    // Batch 0 in the m16n8k8 layout: lane (g, c) holds rank row g of members 2c, 2c + 1 (rows
    // g of the word-0/2 steps, rows g + 8 of the word-1/3 steps); batches past it rank rows 2c,
    // 2c + 1 of member g. Both are summed in a fixed order.
    acc[0][0] = (ch[0][0] + ch[2][0]) + (ch[1][2] + ch[3][2]);
    acc[0][1] = (ch[0][1] + ch[2][1]) + (ch[1][3] + ch[3][3]);
    float2* mine = reinterpret_cast<float2*>(part) + w * kB * 32 + lane;
    if (q_lo > 0) {  // the tail of a task begun by an earlier warp: leave the partial sums
#pragma unroll
      for (int bt = 0; bt < kB; ++bt) mine[bt * 32] = make_float2(acc[bt][0], acc[bt][1]);
      __syncwarp();
      __threadfence_block();
      if (lane == 0) bar_arrive(ready + w);
      __syncwarp();  // ids[] is rewritten by the next task
      cur = nxt, p = pn;
      continue;
    }
    if (q_hi < x.pieces) {  // finished by later warps: add their partial sums, in warp order
      // The helpers: warps past this one that hold pieces and start before the task's end
      // (a warp without pieces leaves nothing).
      const int64_t end = (ti + 1) * x.pieces;
      const unsigned helpers = __ballot_sync(~0u, ((holders >> lane) & 1u) && my_split < end);
      for (unsigned hm = helpers; hm != 0; hm &= hm - 1) {
        const int v = __ffs(hm) - 1;
        bar_wait(ready + v, 0);
        const float2* theirs = reinterpret_cast<const float2*>(part) + v * kB * 32 + lane;
#pragma unroll
        for (int bt = 0; bt < kB; ++bt) {
          const float2 o = theirs[bt * 32];
          acc[bt][0] += o.x, acc[bt][1] += o.y;
        }
      }
    }
    T* t = static_cast<T*>(a.out);
    {  // batch 0: rank row gq of members 2cq, 2cq + 1
      T* tp = t + r0 + gq;
      if (2 * cq < count && gq < rows)
        tp[static_cast<int64_t>(ids[2 * cq]) * a.r_max] = Cvt<T>::from(acc[0][0]);
      if (2 * cq + 1 < count && gq < rows)
        tp[static_cast<int64_t>(ids[2 * cq + 1]) * a.r_max] = Cvt<T>::from(acc[0][1]);
    }
    const int n = 2 * cq;
#pragma unroll
    for (int bt = 1; bt < kB; ++bt) {
      const int m = bt * 8 + gq;
      if (bt < nb && m < count && n < rows) {
        T* tp = t + static_cast<int64_t>(ids[m]) * a.r_max + r0 + n;
        if (n + 1 < rows)
          *reinterpret_cast<uint32_t*>(tp) = pack2<T>(acc[bt][0], acc[bt][1]);
        else
          *tp = Cvt<T>::from(acc[bt][0]);
      }
    }
    __syncwarp();  // ids[] is rewritten by the next task
    cur = nxt, p = pn;
  }
  trace_done(a.trace);
}

// --- expand kernel ----------------------------------------------------------------------------
// RM: r_max (see expand_task).
// NFULL: the tile is the stage's rows and N a multiple of it (every seed shape): the consumer
// of pitch RM runs expand_task's FULL form.
template <typename T, int RM, bool NFULL>
__global__ void __launch_bounds__(32 * (stream_max_consumers(Op::kExpand) + 1), 1)
    molora_lora_expand(KernelArgs a, int stages, const __grid_constant__ ExpandMaps maps) {
  pdl_trigger();  // the next call may launch now; it waits for this one before touching memory
  trace_start(a.trace);
  extern __shared__ __align__(128) uint8_t smem[];
  const int consumers = static_cast<int>(blockDim.x / 32) - 1;
  Ctx x;
  x.a = &a;
  x.smem = smem;
  x.L = stream_layout(Op::kExpand, stages, consumers);
  x.full = reinterpret_cast<uint64_t*>(smem + x.L.full);
  x.empty = reinterpret_cast<uint64_t*>(smem + x.L.empty);
  x.issued = reinterpret_cast<volatile int*>(smem + x.L.issued);
  int* s_rank = reinterpret_cast<int*>(smem + x.L.rank);
  float* s_scale = reinterpret_cast<float*>(smem + x.L.scale);
  x.rank = s_rank;
  x.scale = s_scale;
  x.V = a.S * a.E;
  x.kc = 0;
  x.pieces = 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bar_init(x.full + s, 1), bar_init(x.empty + s, 1);
    *x.issued = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_wait();  // the kernel before this one is done (a no-op without the launch attribute)
  if (threadIdx.x == 0) trace_set(a.trace, 1);
  const SlotCache slots(a, true);  // (ranks and scales in flight beside the loads below)
  TaskIter<Op::kExpand> it(x);     // (its first expert ids load beside num_tokens_post_pad)
  x.my_tasks = cta_tasks(a);
  slots.store(a, s_rank, s_scale);
  __syncthreads();
  if (kTrace && threadIdx.x == 0 && a.trace != nullptr) {
    trace_set(a.trace, 2);
    a.trace[blockIdx.x * kTraceWords + 7] = static_cast<unsigned long long>(x.my_tasks);
  }
  const int warp = threadIdx.x >> 5;
  if (warp == 0) {
    produce<T>(x, it, maps);
    return;
  }
  const int w = warp - 1;
  int* ids = reinterpret_cast<int*>(smem + x.L.ids) + w * kStreamMaxBlock;
  // This warp's tasks (valid task i is consumer i % consumers'), the pair ids of the next one
  // loaded while the current one runs. (Stepping through every task to find them was ~15
  // instructions per task of the CTA per consumer, bench/NOTES.md "lora v0.10".)
  auto next_mine = [&](Task& t) { return it.next_of(t, w, a.fd_consumers); };
  Task cur, nxt;
  bool have = next_mine(cur);
  int p = have ? block_entry(a, cur.g) : -1;
  while (have) {
    const bool have_n = next_mine(nxt);
    const int pn = have_n ? block_entry(a, nxt.g) : -1;
    // A task the producer copied at the pitch r8 < RM runs the consumer of that pitch (the
    // same arithmetic; t keeps its r_max row pitch).
    if constexpr (RM >= 32) {
      const int pitch = expand_pitch((cur.r + 7) / 8 * 8, RM, maps.ok, a.dbg);
      if (pitch == 8)
        expand_task<T, 8>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
      else if (pitch == 16)
        expand_task<T, 16>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
      else if (RM >= 64 && pitch == 32)
        expand_task<T, (RM >= 64 ? 32 : RM)>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
      else if (RM >= 128 && pitch == 64)
        expand_task<T, (RM >= 128 ? 64 : RM)>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
      else
        expand_task<T, RM, NFULL>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
    } else {
      expand_task<T, RM, NFULL>(x, cur.vi, cur.c, cur.v, cur.r, p, ids);
    }
    cur = nxt, p = pn, have = have_n;
  }
  trace_done(a.trace);
}

// Lets kernel Kern take the stream layout's shared memory (once per kernel; the first result is
// kept).
template <auto Kern>
cudaError_t allow_stream_smem() {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kStreamSmemBytes);
  return attr;
}

int probe_bits() {
  static const int probe = static_cast<int>(get_setting_int("MOLORA_LORA_STREAM_PROBE", 0));
  return probe;
}

// The driver's cuTensorMapEncodeTiled (null where the driver has none; looked up once).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The tensor maps of every distinct (weights, shape, box) key made so far, shared by both ops and
// every host thread: a map depends on nothing else, so a hit is exact. 512 keys cover the 4 ops
// x ~120 layers of an engine that calls every layer eagerly (memo_cache.h says why one entry per
// op was not enough). A failed encode is kept too (ok = 0: the kernels' fallback copies).
struct MapKey {
  uint64_t w;
  int64_t d0, d1, d2;  // shrink: K, rows, 0; expand: r_max, N, V
  int32_t kind, tile;  // 0 shrink (tile 0), 1 expand
};
struct MapValue {
  ExpandMaps maps;  // shrink: maps.m[0]
};
constexpr size_t kMapCacheKeys = 512;
MemoCache<MapKey, MapValue>& map_cache() {
  static MemoCache<MapKey, MapValue> c(kMapCacheKeys);
  return c;
}

// Expand's tensor maps (ExpandMaps) for r_max >= 32: B viewed as [V, N, r_max] (16-bit
// elements), map j with boxes of (8 << j) columns x tile rows x 1 expert for each 8 << j below
// r_max, no L2 promotion (a box row of r8 columns must not fetch the rest of its r_max row).
// ok = 0 where they cannot be made (tile > 256 rows, a driver without the entry point, a
// misaligned B): the kernel then uses its per-lane copies.
void expand_maps(const KernelArgs& a, ExpandMaps* out) {
  std::memset(out, 0, sizeof(*out));
  if (a.r_max < 32 || a.tile <= 0 || a.tile > 256) return;
  const auto fn = encode_fn();
  if (fn == nullptr) return;
  const int64_t V = static_cast<int64_t>(a.S) * a.E;
  const MapKey key{reinterpret_cast<uint64_t>(a.w), a.r_max, a.dim, V, 1, a.tile};
  *out = map_cache()
             .get(key,
                  [&](MapValue* v) {
                    ExpandMaps& m = v->maps;
                    std::memset(&m, 0, sizeof(m));
                    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.r_max),
                                                static_cast<cuuint64_t>(a.dim),
                                                static_cast<cuuint64_t>(V)};
                    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.r_max) * 2,
                                                   static_cast<cuuint64_t>(a.dim) * a.r_max * 2};
                    const cuuint32_t es[3] = {1, 1, 1};
                    for (int j = 0; (8 << j) < a.r_max; ++j) {
                      const cuuint32_t box[3] = {static_cast<cuuint32_t>(8 << j),
                                                 static_cast<cuuint32_t>(a.tile), 1};
                      if (fn(&m.m[j], CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(a.w),
                             dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
                        std::memset(&m, 0, sizeof(m));
                        return;
                      }
                    }
                    m.ok = 1;
                  })
             .maps;
}

template <typename T, int RM, bool NFULL>
Status launch_expand(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr auto kern = molora_lora_expand<T, RM, NFULL>;
  const int consumers = stream_consumers_of(Op::kExpand, plan.threads);
  const size_t smem = stream_layout(Op::kExpand, plan.stages, consumers).total;
  MOLORA_CUDA_CHECK(allow_stream_smem<kern>());
  KernelArgs k = a;
  k.dbg = probe_bits();
  ExpandMaps maps;
  expand_maps(a, &maps);
  MOLORA_CUDA_CHECK(launch_kernel(plan.pdl, kern, static_cast<unsigned>(plan.grid),
                                  static_cast<unsigned>(plan.threads), smem, stream, k, plan.stages,
                                  maps));
  return Status::Ok();
}

// The tensor map of A viewed as [S*E*r_max rows, K columns] (16-bit elements, boxes of 8 rows x
// 256 columns); false where it cannot be made (K < 256, or a driver without the entry point):
// the kernel then copies row by row.
bool shrink_map(const KernelArgs& a, CUtensorMap* out) {
  if (a.dim < kBox) return false;
  const auto fn = encode_fn();
  if (fn == nullptr) return false;
  const int64_t rows = static_cast<int64_t>(a.S) * a.E * a.r_max;
  const MapKey key{reinterpret_cast<uint64_t>(a.w), a.dim, rows, 0, 0, 0};
  const MapValue v = map_cache().get(key, [&](MapValue* mv) {
    std::memset(mv, 0, sizeof(*mv));
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.dim), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.dim) * 2};
    const cuuint32_t box[2] = {kBox, kStreamShrinkRows};
    const cuuint32_t es[2] = {1, 1};
    mv->maps.ok =
        fn(&mv->maps.m[0], CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(a.w), dims, strides,
           box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
  if (!v.maps.ok) return false;
  *out = v.maps.m[0];
  return true;
}

template <typename T, bool KFULL>
Status launch_shrink(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr auto kern = molora_lora_shrink<T, KFULL>;
  const int warps = stream_consumers_of(Op::kShrink, plan.threads);
  const size_t smem = stream_layout(Op::kShrink, plan.stages, warps).total;
  MOLORA_CUDA_CHECK(allow_stream_smem<kern>());
  KernelArgs k = a;
  k.dbg = probe_bits();
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const int use_map = shrink_map(a, &map) ? 1 : 0;
  MOLORA_CUDA_CHECK(launch_kernel(plan.pdl, kern, static_cast<unsigned>(plan.grid),
                                  static_cast<unsigned>(plan.threads), smem, stream, k, plan.stages,
                                  map, use_map));
  return Status::Ok();
}

// Expand's register tiles follow r_max (ExpandTiles: NT = stream_expand_tile(r_max) / 8).
// run() (lora_run.cc) has checked the plan: stream_shape_ok, stream_tile_ok.
template <Op OP, typename T>
Status launch_t(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if constexpr (OP == Op::kShrink) {
    return a.dim % kStreamShrinkKc == 0 ? launch_shrink<T, true>(a, plan, stream)
                                        : launch_shrink<T, false>(a, plan, stream);
  } else {
    static_assert(ExpandTiles<8>::kRows == 512 && ExpandTiles<16>::kRows == 512 &&
                      ExpandTiles<128>::kRows == 64,
                  "expand tiles: 512 rows up to r_max 16, one 16 KiB stage above");
    const bool full = a.tile == stream_expand_tile(a.r_max) && a.dim % a.tile == 0;
    switch (a.r_max) {  // 8, 16, 32, 64 or 128 (checked by the validation)
      case 8:
        return full ? launch_expand<T, 8, true>(a, plan, stream)
                    : launch_expand<T, 8, false>(a, plan, stream);
      case 16:
        return full ? launch_expand<T, 16, true>(a, plan, stream)
                    : launch_expand<T, 16, false>(a, plan, stream);
      case 32:
        return full ? launch_expand<T, 32, true>(a, plan, stream)
                    : launch_expand<T, 32, false>(a, plan, stream);
      case 64:
        return full ? launch_expand<T, 64, true>(a, plan, stream)
                    : launch_expand<T, 64, false>(a, plan, stream);
      default:
        return full ? launch_expand<T, 128, true>(a, plan, stream)
                    : launch_expand<T, 128, false>(a, plan, stream);
    }
  }
}

}  // namespace

namespace {
struct TraceState {
  std::atomic<bool> on{false};  // (read without the lock by every launch)
  std::mutex mu;
  unsigned long long* buf = nullptr;
  int64_t words = 0, used = 0;
};
TraceState& trace_state() {
  static TraceState t;
  return t;
}
}  // namespace

bool stream_trace_built() { return kTrace; }

void set_stream_trace(unsigned long long* buf, int64_t words) {
  TraceState& t = trace_state();
  std::lock_guard<std::mutex> lock(t.mu);
  t.buf = buf;
  t.words = buf != nullptr ? words : 0;
  t.used = 0;
  t.on.store(buf != nullptr, std::memory_order_release);
}

Status launch_stream(Op op, DType dt, const KernelArgs& args, const Plan& plan,
                     cudaStream_t stream) {
  KernelArgs a = args;
  a.trace = nullptr;
  if (TraceState& t = trace_state(); kTrace && t.on.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(t.mu);
    const int64_t need = static_cast<int64_t>(plan.grid) * kTraceWords;
    if (t.buf != nullptr && t.used + need <= t.words) a.trace = t.buf + t.used, t.used += need;
  }
  a.fd_E = FastDiv(a.E);
  a.fd_k = FastDiv(a.k);
  a.fd_block = FastDiv(a.block);
  a.fd_chunks = FastDiv(a.chunks);
  const int64_t kc = std::min<int64_t>(a.dim, kStreamShrinkKc);  // (as the shrink kernel)
  a.fd_pieces = FastDiv(op == Op::kShrink && kc > 0 ? (a.dim + kc - 1) / kc : 1);
  a.fd_stages = FastDiv(plan.stages);
  a.fd_grid = FastDiv(plan.grid);
  a.fd_warps = FastDiv(plan.threads / 32);
  a.fd_consumers = FastDiv(stream_consumers_of(op, plan.threads));
  if (dt == DType::kBF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __nv_bfloat16>(a, plan, stream)
                             : launch_t<Op::kExpand, __nv_bfloat16>(a, plan, stream);
  if (dt == DType::kF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __half>(a, plan, stream)
                             : launch_t<Op::kExpand, __half>(a, plan, stream);
  return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                 dtype_name(dt));
}

MapCacheStats tensor_map_cache_stats() {
  const auto st = map_cache().stats();
  return {st.hits, st.misses, st.size, st.capacity};
}
void tensor_map_cache_clear() { map_cache().clear(); }

}  // namespace molora::lora::detail
