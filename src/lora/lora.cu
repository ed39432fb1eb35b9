// MoE-LoRA shrink and expand kernels over virtual experts (v = slot * E + expert).
//
// One CTA per work item, the grid fixed by the plan (groups x chunks, the worst case for the
// shape, so the launch is graph-capturable). A work item is (group, chunk): a group is the set
// of routed pairs that share one virtual expert and a chunk a slice of that expert's weight
// (shrink: `tile` rank rows x K, expand: `tile` of the N output rows x r_s).
//   aligned routing:  group g = block g of the align output (expert_ids[g], its pair ids).
//   plain, grouped:   group g = pair g if it is the first pair (lowest index) of its virtual
//                     expert; the CTA scans the P routing ids (ballot, in order) to gather the
//                     other pairs of that expert and exits if a lower pair has it (P <= cap).
//   plain, pairs:     group g = pair g alone (prefill beyond the cap).
// Each weight byte of a chunk is read once, U 16-byte streaming loads per thread in flight, and
// applied to every pair of the group: bytes follow the distinct (slot, expert) set and r_s.
// Pairs with slot -1 never form a group: their CTAs read two ids and exit. Every output element
// is written by exactly one thread and every sum is taken in a fixed order (no atomics into
// outputs: same bits run to run).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "lora/lora_device.cuh"
#include "lora/lora_internal.h"

namespace molora::lora::detail {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kSlotCache = 64;
// Members of a shrink group whose x vectors are loaded a step ahead with the weights (the
// others are loaded at use).
constexpr int kShrinkXPrefetch = 1;  // slots whose rank and scale a CTA keeps in shared memory

__device__ __forceinline__ int vid_of(const KernelArgs& a, int64_t q) {
  const int s = __ldg(a.rt.slot_ids + q / a.k);
  const int e = __ldg(a.rt.topk_ids + q);
  if (s < 0 || s >= a.S || e < 0 || e >= a.E) return -1;
  return s * a.E + e;
}

// Appends, in ascending q, the q of this round whose `keep` is set to s_mem (ordered block
// compaction by ballot). `total` is the count so far, the same in every thread.
__device__ __forceinline__ int compact_round(bool keep, int val, int* s_mem, int total,
                                             int* s_wcnt) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned bal = __ballot_sync(~0u, keep);
  if (lane == 0) s_wcnt[warp] = __popc(bal);
  __syncthreads();
  int off = total, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int c = s_wcnt[w];
    off += w < warp ? c : 0;
    all += c;
  }
  if (keep) s_mem[off + __popc(bal & ((1u << lane) - 1u))] = val;
  __syncthreads();  // s_wcnt is rewritten by the next round
  return total + all;
}

// Finds work item group g: its virtual expert (*v) and its pairs (s_mem[0..count), ascending).
// Returns 0 when the CTA has nothing to do. Every branch is uniform over the CTA.
// Aligned: the block's expert id and this thread's first pair id, loaded one item ahead (see
// the kernel loop) so that finding a group waits on no global load.
struct AlignedIds {
  int ve = -1, p = -1;
};
__device__ __forceinline__ AlignedIds load_aligned_ids(const KernelArgs& a, int64_t g) {
  AlignedIds r;
  r.ve = __ldg(a.rt.expert_ids + g);
  const int i = static_cast<int>(threadIdx.x);
  if (i < a.block && g * a.block + i < a.sorted_len)
    r.p = __ldg(a.rt.sorted_token_ids + g * a.block + i);
  return r;
}

__device__ int find_group(const KernelArgs& a, int64_t g, const AlignedIds& pre, int vp, int* s_mem,
                          int* s_wcnt, int* v) {
  const int V = a.S * a.E;
  if (a.mode == kModeAligned) {
    const int ve = pre.ve;
    if (ve < 0 || ve >= V) return 0;
    *v = ve;
    int total = compact_round(pre.p >= 0 && pre.p < a.P, pre.p, s_mem, 0, s_wcnt);
    for (int base = kThreads; base < a.block; base += kThreads) {
      const int i = base + static_cast<int>(threadIdx.x);
      int p = -1;
      if (i < a.block && g * a.block + i < a.sorted_len)
        p = __ldg(a.rt.sorted_token_ids + g * a.block + i);
      total = compact_round(p >= 0 && p < a.P, p, s_mem, total, s_wcnt);
    }
    return total;
  }
  if (vp < 0) return 0;  // (plain: vp = vid_of(a, g), loaded by the kernel's item loop)
  *v = vp;
  if (a.mode == kModePairs) {
    if (threadIdx.x == 0) s_mem[0] = static_cast<int>(g);
    __syncthreads();
    return 1;
  }
  int total = 0;
  for (int64_t base = 0; base < a.P; base += kThreads) {
    const int64_t q = base + threadIdx.x;
    const bool match = q < a.P && vid_of(a, q) == vp;
    // A lower pair of the same virtual expert leads this group: that CTA does the work.
    if (__syncthreads_or(match && q < g)) return 0;
    total = compact_round(match, static_cast<int>(q), s_mem, total, s_wcnt);
  }
  return total;
}

// t[p, row] for rows [c*tile, min((c+1)*tile, r)) of virtual expert v, every pair of the group.
// tile >= 8: each warp owns whole rows; tile < 8: 8/tile warps split K of one row and reduce
// through shared memory in warp order.
template <typename T, int U>
__device__ void shrink_item(const KernelArgs& a, int v, int r, const int* mem, int count, int c,
                            float (*s_red)[kShrinkMembers]) {
  const int tile = a.tile;
  const int row0 = c * tile;
  const int row_end = min(row0 + tile, r);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wpr = tile >= kWarps ? 1 : kWarps / tile;
  const int rows_pass = kWarps / wpr;
  const int kpart = warp % wpr, rsub = warp / wpr;
  const int64_t K = a.dim, nvec = K / 8;
  const T* A = static_cast<const T*>(a.w) + static_cast<int64_t>(v) * a.r_max * K;
  const uint4* x = static_cast<const uint4*>(a.in);
  T* t = static_cast<T*>(a.out);
  const int64_t vstep = static_cast<int64_t>(wpr) * 32;
  constexpr int XP = U <= 4 ? kShrinkXPrefetch : 0;
  for (int rb = row0; rb < row_end; rb += rows_pass) {
    const int row = rb + rsub;
    const bool live = row < row_end;
    const uint4* wrow = reinterpret_cast<const uint4*>(A + static_cast<int64_t>(row) * K);
    for (int m0 = 0; m0 < count; m0 += kShrinkMembers) {
      const int mc = min(kShrinkMembers, count - m0);
      const uint4* xr[kShrinkMembers];
#pragma unroll
      for (int j = 0; j < kShrinkMembers; ++j)
        xr[j] = x + static_cast<int64_t>(mem[m0 + min(j, mc - 1)] / a.k) * nvec;
      float acc[kShrinkMembers];
#pragma unroll
      for (int j = 0; j < kShrinkMembers; ++j) acc[j] = 0.f;
      if (live) {
        // Double-buffered: the next U weight vectors, and the x vectors of the first XP
        // members, are in flight while these are used.
        int64_t kv0 = kpart * 32 + lane;
        uint4 wv[U], xv[XP > 0 ? XP : 1][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t kv = kv0 + u * vstep;
          wv[u] = kv < nvec ? __ldcs(wrow + kv) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int j = 0; j < XP; ++j)
            xv[j][u] = (j < mc && kv < nvec) ? __ldg(xr[j] + kv) : make_uint4(0, 0, 0, 0);
        }
        for (; kv0 < nvec; kv0 += vstep * U) {
          uint4 wn[U], xn[XP > 0 ? XP : 1][U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int64_t kv = kv0 + (U + u) * vstep;
            wn[u] = kv < nvec ? __ldcs(wrow + kv) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < XP; ++j)
              xn[j][u] = (j < mc && kv < nvec) ? __ldg(xr[j] + kv) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int j = 0; j < kShrinkMembers; ++j) {
            if (j < mc) {
#pragma unroll
              for (int u = 0; u < U; ++u) {
                const int64_t kv = kv0 + u * vstep;
                if (kv < nvec)
                  acc[j] += dot8<T>(wv[u], j < XP ? xv[j < XP ? j : 0][u] : __ldg(xr[j] + kv));
              }
            }
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            wv[u] = wn[u];
#pragma unroll
            for (int j = 0; j < XP; ++j) xv[j][u] = xn[j][u];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kShrinkMembers; ++j)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(~0u, acc[j], off);
      if (wpr == 1) {
        if (live && lane < mc) {
          float s = acc[0];
#pragma unroll
          for (int j = 1; j < kShrinkMembers; ++j) s = lane == j ? acc[j] : s;
          t[static_cast<int64_t>(mem[m0 + lane]) * a.r_max + row] = Cvt<T>::from(s);
        }
      } else {
        if (lane == 0)
#pragma unroll
          for (int j = 0; j < kShrinkMembers; ++j) s_red[warp][j] = acc[j];
        __syncthreads();
        if (live && kpart == 0 && lane < mc) {
          float s = 0.f;
          for (int w2 = 0; w2 < wpr; ++w2) s += s_red[warp + w2][lane];
          t[static_cast<int64_t>(mem[m0 + lane]) * a.r_max + row] = Cvt<T>::from(s);
        }
        __syncthreads();
      }
    }
  }
}

// y[p, n] += scale_s * B[v, n, :r] . t[p, :r] for n in [c*tile, min((c+1)*tile, N)).
// lpr = pow2ceil(cdiv(r, 8)) lanes share one row (one 16-byte vector each) and reduce by a
// butterfly shuffle, so every lane of the row holds each member's sum; lane li of the row
// read-modify-writes y of members li, li + lpr, ... The y of the first lpr members is loaded
// with the weights of the pass, a pass ahead of its use (U rows per thread in flight).
template <typename T, int U>
__device__ void expand_item(const KernelArgs& a, int v, int r, float scale, const int* mem,
                            int count, int c, float* s_t) {
  const int64_t N = a.dim;
  const int64_t n0 = static_cast<int64_t>(c) * a.tile;
  const int64_t n1 = min(N, n0 + a.tile);
  const int nv = (r + 7) / 8;
  int lpr = 1;
  while (lpr < nv) lpr *= 2;
  const int rows_pass = kThreads / lpr;
  const int tid = threadIdx.x, li = tid & (lpr - 1), rl = tid / lpr;
  const int R = a.r_max, ldt = lpr * 8;
  const T* Bw = static_cast<const T*>(a.w) + static_cast<int64_t>(v) * N * R;
  const T* tin = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const uint4 keep = tail_mask(r);     // valid elements of the last vector (1..8)
  const int row_step = rows_pass * R;  // elements between the rows of u and u + 1
  const int64_t pass_rows = static_cast<int64_t>(rows_pass) * U;
  // This lane's member of the first round (members 0..lpr-1), whose y is prefetched.
  const bool own0 = li < count;
  const T* const y0row = y + static_cast<int64_t>(mem[own0 ? li : 0]) * N;
  // Loads of one pass: U weight vectors per thread, and y of this lane's first-round member.
  auto load_pass = [&](int64_t base, uint4(&w)[U], float(&y0)[U]) {
    const int64_t lim64 = n1 - base - rl;
    const int lim = lim64 <= 0 ? 0 : static_cast<int>(min(lim64, static_cast<int64_t>(INT32_MAX)));
    const T* bp = Bw + (base + rl) * R + li * 8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w[u] = (u * rows_pass < lim && li < nv)
                 ? __ldcs(reinterpret_cast<const uint4*>(bp + u * row_step))
                 : make_uint4(0, 0, 0, 0);
      y0[u] = (own0 && u * rows_pass < lim) ? Cvt<T>::one(y0row[base + rl + u * rows_pass]) : 0.f;
    }
  };
  auto stage = [&](int m0, int mc) {
    __syncthreads();  // earlier readers of s_t are done
    for (int i = tid; i < mc * ldt; i += kThreads) {
      const int m = i / ldt, j = i % ldt;
      s_t[i] = j < r ? Cvt<T>::one(tin[static_cast<int64_t>(mem[m0 + m]) * R + j]) : 0.f;
    }
    __syncthreads();
  };
  uint4 wv[U];
  float y0v[U];
  load_pass(n0, wv, y0v);
  const bool one_tile = count <= kExpandMembers;
  if (one_tile) stage(0, count);
  for (int64_t base = n0; base < n1; base += pass_rows) {
    uint4 wn[U];
    float y0n[U];
    load_pass(base + pass_rows, wn, y0n);  // next pass in flight during this one
    const int lim64c =
        static_cast<int>(min(max(n1 - base - rl, int64_t{0}), static_cast<int64_t>(INT32_MAX)));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (li == nv - 1) {  // past r_s: ignore whatever the padding holds
        wv[u].x &= keep.x, wv[u].y &= keep.y, wv[u].z &= keep.z, wv[u].w &= keep.w;
      }
    }
    float mine[U];  // this lane's member's sums of the current round
#pragma unroll
    for (int u = 0; u < U; ++u) mine[u] = 0.f;
    for (int m0 = 0; m0 < count; m0 += kExpandMembers) {
      const int mc = min(kExpandMembers, count - m0);
      if (!one_tile) stage(m0, mc);
      for (int m = 0; m < mc; ++m) {
        const int mm = m0 + m;
        const float4 t0 = *reinterpret_cast<const float4*>(s_t + m * ldt + li * 8);
        const float4 t1 = *reinterpret_cast<const float4*>(s_t + m * ldt + li * 8 + 4);
        float part[U];
#pragma unroll
        for (int u = 0; u < U; ++u) part[u] = dot8f<T>(wv[u], t0, t1);
        for (int off = lpr >> 1; off > 0; off >>= 1)
#pragma unroll
          for (int u = 0; u < U; ++u) part[u] += __shfl_xor_sync(~0u, part[u], off);
        const int owner = mm & (lpr - 1);
#pragma unroll
        for (int u = 0; u < U; ++u) mine[u] = li == owner ? part[u] : mine[u];
        if (owner == lpr - 1 || mm == count - 1) {  // round complete: each lane writes its member
          const int rbase = mm - owner;
          if (li <= owner) {
            const int mine_m = rbase + li;
            T* yp = y + static_cast<int64_t>(mem[mine_m]) * N + base + rl;
#pragma unroll
            for (int u = 0; u < U; ++u) {
              if (u * rows_pass < lim64c) {
                const float yold = rbase == 0 ? y0v[u] : Cvt<T>::one(yp[u * rows_pass]);
                yp[u * rows_pass] = Cvt<T>::from(yold + scale * mine[u]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = wn[u], y0v[u] = y0n[u];
  }
}

// PLAIN: plain routing (kModePairs, kModeGrouped); else aligned. (Two kernels, each compiled
// for its routing alone: the aligned one measured 1-6% faster than the one kernel with both
// paths, H100, bench/NOTES.md "lora v0.15" and "lora v0.16".)
template <Op OP, typename T, int U, bool PLAIN>
__global__ void __launch_bounds__(kThreads, 2) molora_lora_kernel(KernelArgs a) {
  // The next call may launch now (it waits for this one before touching memory); with
  // late_trigger only once the kernel before this one is done (moe_delta, KernelArgs).
  if (!a.late_trigger) pdl_trigger();
  pdl_wait();  // the kernel before this one is done (a no-op without the launch attribute)
  if (a.late_trigger) pdl_trigger();
  extern __shared__ int s_mem[];
  __shared__ int s_wcnt[kWarps];
  __shared__ float s_red[kWarps][kShrinkMembers];
  __shared__ __align__(16) float s_t[OP == Op::kExpand ? kExpandMembers * 128 : 4];
  __shared__ int s_rank[kSlotCache];
  __shared__ float s_scale[kSlotCache];
  // Items the device can hold work in: aligned, the used blocks only (num_tokens_post_pad).
  // The planner keeps groups x chunks below 2^31, so items are counted in 32 bits and walked
  // without divisions (a 64-bit division is ~100 dependent instructions; there were four per
  // item).
  uint32_t n_groups = static_cast<uint32_t>(a.P);
  if (a.mode == kModeAligned) {
    int64_t used = __ldg(a.rt.num_tokens_post_pad);
    used = max(int64_t{0}, min(used, a.sorted_len));
    n_groups = used < (int64_t{1} << 31)
                   ? static_cast<uint32_t>(used) / static_cast<uint32_t>(a.block)
                   : static_cast<uint32_t>(used / a.block);
  }
  const uint32_t chunks = static_cast<uint32_t>(a.chunks);
  const uint32_t n_items = n_groups * chunks;
  // Ranks and scales of the first kSlotCache slots in shared memory: one load per CTA instead
  // of a dependent global load between finding a group and its first weight load.
  const bool cached = a.S <= kSlotCache;
  if (cached && blockIdx.x < n_items) {  // (a CTA without items reads nothing more)
    for (int s = threadIdx.x; s < a.S; s += kThreads) {
      s_rank[s] = min(max(__ldg(a.ranks + s), 0), a.r_max);
      s_scale[s] = a.scales != nullptr ? __ldg(a.scales + s) : 0.f;
    }
  }
  // Shrink chunks past the largest rank hold nothing (checked again against r_s in run_item).
  auto past_rmax = [&](auto c) { return OP == Op::kShrink && c * a.tile >= a.r_max; };
  // Item i is (group i / chunks, chunk i % chunks); stepping by gridDim.x adds (dg, dc).
  const uint32_t dg = gridDim.x / chunks, dc = gridDim.x - dg * chunks;
  // One item: group g, chunk c; aligned: cur holds its ids, loaded one item ahead; plain: vp
  // is its pair's virtual expert.
  auto run_item = [&](int64_t g, int c, const AlignedIds& cur, int vp) {
    int v = -1;
    if (past_rmax(c)) return;
    __syncthreads();  // the previous item's readers of s_mem are done (and s_rank written)
    const int count = find_group(a, g, cur, vp, s_mem, s_wcnt, &v);
    if (count == 0) return;
    const int slot = v / a.E;
    const int r = cached ? s_rank[slot] : min(max(__ldg(a.ranks + slot), 0), a.r_max);
    if (r == 0) return;
    if (OP == Op::kShrink) {
      if (c * a.tile >= r) return;
      shrink_item<T, U>(a, v, r, s_mem, count, c, s_red);
    } else {
      const float scale = cached ? s_scale[slot] : __ldg(a.scales + slot);
      expand_item<T, U>(a, v, r, scale, s_mem, count, c, s_t);
    }
  };
  if constexpr (PLAIN) {
    // Items grid-stride, each one's pair loaded when it is reached (one load round trip). On
    // an item without an adapter the CTA looks at its next kThreads items at once (one load
    // per thread) and jumps to the first with one, or past them all: a run of items without
    // adapters costs one round trip per kThreads items instead of one per item (walked item
    // by item, a T=256 call whose slots are all -1 took 13.4 us, N=7168, H100; 2.0 us with
    // the look; bench/NOTES.md "lora v0.16"). Items with adapters pay no extra load: a look
    // before the first item (even one that loads the first item too) cost 0.2-0.6 us at T=1-8
    // with adapters (the same notes).
    __shared__ int2 s_look[2][kWarps];  // per warp: first item offset with an adapter, its vid
    uint32_t item = blockIdx.x, g = item / chunks, c = item - g * chunks;
    int vp = -2;  // g's virtual expert: -2 not loaded yet, -1 none
    int parity = 0;
    while (item < n_items) {
      if (past_rmax(c)) {  // (nothing to load or to run)
        vp = -2;
      } else {
        if (vp == -2) vp = vid_of(a, g);
        if (vp >= 0) {
          run_item(g, c, AlignedIds{}, vp);
          vp = -2;
        } else {
          // Look: thread i checks the CTA's item i + 1 steps ahead.
          const uint64_t mine = item + static_cast<uint64_t>(threadIdx.x + 1) * gridDim.x;
          int mv = -1;
          if (mine < n_items) {
            const uint32_t gm = static_cast<uint32_t>(mine) / chunks;
            const uint32_t cm = static_cast<uint32_t>(mine) - gm * chunks;
            if (!past_rmax(cm)) mv = vid_of(a, gm);
          }
          const unsigned bal = __ballot_sync(~0u, mv >= 0);
          const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
          if (bal != 0) {
            const int first = __ffs(bal) - 1;
            const int fv = __shfl_sync(~0u, mv, first);
            if (lane == 0) s_look[parity][warp] = make_int2(warp * 32 + first, fv);
          } else if (lane == 0) {
            s_look[parity][warp] = make_int2(kThreads, -1);
          }
          __syncthreads();  // (the look before read the other parity: no thread is still there)
          int2 best = make_int2(kThreads, -1);
#pragma unroll
          for (int w = 0; w < kWarps; ++w) {
            const int2 l = s_look[parity][w];
            if (l.x < best.x) best = l;
          }
          parity ^= 1;
          // Found: the item best.x + 1 steps ahead, its vid known; none: the last one looked at
          // (known to have none, so the next pass looks again without a load).
          const int steps = best.x < kThreads ? best.x + 1 : kThreads;
          const uint64_t next = item + static_cast<uint64_t>(steps) * gridDim.x;
          if (next >= n_items) break;
          item = static_cast<uint32_t>(next);
          g = item / chunks, c = item - g * chunks;
          vp = best.y;  // (-1 when none was found: that item has none)
          continue;
        }
      }
      item += gridDim.x;
      g += dg, c += dc;
      if (c >= chunks) c -= chunks, ++g;
    }
  } else {
    // The CTA's items grid-stride, each one's ids loaded one item ahead (pre).
    AlignedIds pre;
    uint32_t ng = blockIdx.x / chunks, nc = blockIdx.x - ng * chunks;
    if (blockIdx.x < n_items) pre = load_aligned_ids(a, ng);
    for (uint32_t item = blockIdx.x; item < n_items; item += gridDim.x) {
      const int64_t g = ng;
      const int c = static_cast<int>(nc);
      ng += dg, nc += dc;
      if (nc >= chunks) nc -= chunks, ++ng;
      const AlignedIds cur = pre;
      if (item + gridDim.x < n_items) pre = load_aligned_ids(a, ng);
      run_item(g, c, cur, -1);
    }
  }
}

template <Op OP, typename T, int U>
Status launch_t(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  auto kern = a.mode == kModeAligned ? molora_lora_kernel<OP, T, U, false>
                                     : molora_lora_kernel<OP, T, U, true>;
  if (plan.smem_bytes > 48 * 1024)
    MOLORA_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(plan.smem_bytes)));
  MOLORA_CUDA_CHECK(launch_kernel(plan.pdl, kern, static_cast<unsigned>(plan.grid), kThreads,
                                  plan.smem_bytes, stream, a));
  return Status::Ok();
}

template <Op OP, typename T>
Status launch_u(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return plan.unroll == 4 ? launch_t<OP, T, 4>(a, plan, stream)
                          : launch_t<OP, T, 8>(a, plan, stream);
}

template <Op OP, typename T, int U>
int fit_t(bool plain, size_t smem) {
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, plain ? molora_lora_kernel<OP, T, U, true> : molora_lora_kernel<OP, T, U, false>,
      kThreads, smem);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <Op OP, typename T>
int fit_u(bool plain, int unroll, size_t smem) {
  return unroll == 4 ? fit_t<OP, T, 4>(plain, smem) : fit_t<OP, T, 8>(plain, smem);
}

}  // namespace

int max_ctas_per_sm(Op op, DType dt, bool plain, int unroll, size_t smem) {
  if (dt == DType::kF16)
    return op == Op::kShrink ? fit_u<Op::kShrink, __half>(plain, unroll, smem)
                             : fit_u<Op::kExpand, __half>(plain, unroll, smem);
  return op == Op::kShrink ? fit_u<Op::kShrink, __nv_bfloat16>(plain, unroll, smem)
                           : fit_u<Op::kExpand, __nv_bfloat16>(plain, unroll, smem);
}

Status launch(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (dt == DType::kBF16)
    return op == Op::kShrink ? launch_u<Op::kShrink, __nv_bfloat16>(a, plan, stream)
                             : launch_u<Op::kExpand, __nv_bfloat16>(a, plan, stream);
  if (dt == DType::kF16)
    return op == Op::kShrink ? launch_u<Op::kShrink, __half>(a, plan, stream)
                             : launch_u<Op::kExpand, __half>(a, plan, stream);
  return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                 dtype_name(dt));
}

__global__ void molora_lora_empty() {}

Status launch_empty(int grid, int threads, cudaStream_t stream) {
  molora_lora_empty<<<static_cast<unsigned>(grid), static_cast<unsigned>(threads), 0, stream>>>();
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace molora::lora::detail
