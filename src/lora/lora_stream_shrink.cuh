// The stream shrink kernel (lora_stream.cuh says how the stream kernels work) and its launcher.
// Included by lora_stream.cu only (one translation unit: see there).
#pragma once

#include <type_traits>

#include "lora/lora_stream.cuh"

namespace molora::lora::detail {
namespace {

// --- shrink: t[p, r0 + n] = A[v, r0 + n, :] . x[token(p), :] for n < 8, per-warp rings ------
// Tensor cores, per superstep one 16-byte shared-memory load of the weights. Batch 0 (members
// 0..7, the decode case): four m16n8k8 steps with A = the task's 8 rank rows as loaded (rows g
// and g + 8 of the step: words 0 and 1, or 2 and 3, of lane (g, c)'s weight vector) and B =
// one word of member g's x vector; the rows whose word pairs the same k are kept (g of the
// word-0/2 steps, g + 8 of the word-1/3 steps), so lane (g, c) ends with rank row g of members
// 2c, 2c + 1, and no operand register is copied into a zero-padded one. Batches past the first
// (prefill): two m16n8k16 steps with A = x (8 members in rows 0..7, rows 8..15 zero) and B =
// the weights, giving lane (g, c) rank rows 2c, 2c + 1 of member g. The sums are kept over every
// K-chunk and stored once: no cross-lane reduction. Batch 0's x vectors are loaded from global
// memory before the wait for the piece; members past 8 read x inline, 8 members per batch.
// KFULL: K is a multiple of the piece (kStreamShrinkKc), so no piece ends past K and the loads
// and steps of a piece carry no bounds test (a compare and a select per 16-byte vector, ~80 of a
// piece's ~300 instructions). KFULL implies SWZ.
// The stage's layout. Not SWZ (K not a multiple of 64, or no swizzled map): two boxes of 8 rows x
// 256 columns (512 bytes per row): vector `vec` (8 columns) of row g is the 16-byte vector
// (vec / 32) * 256 + g * 32 + vec % 32. Rows 512 bytes apart share their banks, so the 8 lanes of
// a quarter warp (rows g = 2q, 2q + 1, vectors 4j + c) meet 4 bank groups twice: each 16-byte
// load takes 8 wavefronts instead of 4.
// SWZ (K a multiple of the 64-column chunk): one 3-D box per piece, 8 chunks of 64 columns x 8
// rows, [chunk][row][128 bytes], with TMA's 128-byte swizzle: vector u (0..7) of row r in chunk b
// is the 16-byte vector b * 64 + r * 8 + (u ^ ((line0 + r) & 7)), line0 the stage's 128-byte line
// index (0: stages are 1024-aligned). Not KFULL: the piece that ends at K takes a box of its own
// chunks only (ShrinkMaps::tail; an 8-chunk box there, its chunks past K zero-filled, made K=768
// T=256 1.9% slower than the unswizzled stages, bench/NOTES.md "lora v0.28").
// Lane (g, c) takes row pr = (g >> 1) | (g & 1) << 2 (the mma's row g is rank row pr): the
// quarter's rows 2q and 2q + 1 then differ in bit 2 of the swizzle, and its 8 loads meet 8 bank
// groups. The k order is as before (vector 4j + c), so x is read as before; only the rank row a
// lane stores changes. (Eight 2-D boxes of 64 columns per piece gave the same layout and were
// slower on large calls than the two unswizzled boxes: bench/NOTES.md "lora v0.27".)
// PLAIN: plain routing (plain_build groups the pairs first); a template parameter so that the
// aligned kernels carry none of its code or registers.
// The kernel's map parameter: ShrinkMaps for the swizzled kernel with bounds tests, else one map.
template <bool KFULL, bool SWZ>
using ShrinkMapT = std::conditional_t<SWZ && !KFULL, ShrinkMaps, CUtensorMap>;

template <typename T, bool KFULL, bool SWZ, bool PLAIN>
__global__ void __launch_bounds__(32 * stream_max_consumers(Op::kShrink), 1)
    molora_lora_shrink(KernelArgs a, int stages, const __grid_constant__ ShrinkMapT<KFULL, SWZ> map,
                       int use_map) {
  // The next call may launch now (it waits for this one before touching memory); with
  // late_trigger only after this CTA's wait below (moe_delta, KernelArgs).
  const bool late = a.late_trigger != 0;
  if (!late) pdl_trigger();
  trace_start(a.trace);
  // (1024-aligned: the swizzled stages' address arithmetic assumes it, below.)
  extern __shared__ __align__(1024) uint8_t smem[];
  const int W = static_cast<int>(blockDim.x >> 5), w = static_cast<int>(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, gq = lane >> 2, cq = lane & 3;
  // The box row this lane's weight vectors come from, and the rank row (of the task's 8) its
  // batch-0 sums belong to (SWZ: the swizzled layout above; else row gq).
  static_assert(SWZ || !KFULL, "KFULL implies SWZ");
  const int prow = SWZ ? ((gq >> 1) | ((gq & 1) << 2)) : gq;
  Ctx x;
  x.a = &a;
  x.smem = smem;
  x.L = stream_layout(Op::kShrink, stages, W, PLAIN);
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
  // Plan::early_inputs: the routing, ranks and weights are read before the wait for the kernel
  // before, x read and t written only after it.
  const bool early = a.early != 0;
  if (!early) {
    pdl_wait();  // the kernel before this one is done (no-op without the attribute)
    if (late) pdl_trigger();
  }
  if (threadIdx.x == 0) trace_set(a.trace, 1);
  // The slots' ranks load first, so that they are in flight beside the first expert ids and
  // num_tokens_post_pad (SlotCache).
  const SlotCache slots(a, false);
  if constexpr (PLAIN) {
    // Every slot -1 (Plan::slot_check): leave before the grouping, where leaving needs no wait
    // (early && late waits first: the grouping's own "No valid key" way out, below, does that).
    // A bare return: a pdl_wait here put spill loads into the task loop (bench/NOTES.md).
    if (a.slot_check != 0 && !(early && late) && !plain_any_slot<false>(a)) {
      trace_done(a.trace);
      return;
    }
    plain_groups<false>(x);  // plain routing: the groups, in shared memory
  }
  // (three walks below start from copies of it; its first expert ids load beside
  // num_tokens_post_pad)
  const TaskIter<Op::kShrink> walk(x);
  x.my_tasks = cta_tasks(x);
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
  // A CTA without a valid task (every slot -1, fewer tasks than CTAs, or ranks below the tasks'
  // rows) leaves here; the count stops at once when the CTA has no task at all. The split and
  // walks below cost a call whose slots are all -1 0.37 us on the H100 at 12 warps (1.76 against
  // 1.39 us at 4 warps, bench/NOTES.md "lora v0.15"). (After the barrier: it orders trace_start
  // before trace_done.)
  if (total == 0) {
    if (early && late) pdl_wait();  // (leaving counts as the trigger: only after the wait)
    trace_done(a.trace);
    return;
  }
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
  // The 16-byte vector `vec` = 4j + c (superstep j) of the lane's row in a stage. SWZ: every
  // stage is 1024-aligned (smem is declared so, and stages are 8 KiB), so line0 = 0 and vector
  // u = 4 (j & 1) + c of chunk j / 2 sits at prow * 8 + (u ^ prow).
  const int wsw = prow * 8 + (cq ^ prow);
  auto widx = [&](int j) {
    const int vec = 4 * j + cq;
    return SWZ ? (j >> 1) * 64 + (wsw ^ ((j & 1) << 2)) : (vec >> 5) * 256 + gq * 32 + (vec & 31);
  };
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
  int p = it_left > 0 ? block_entry(x, it_t.g) : -1;
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
    } else if constexpr (SWZ) {
      if (boxes) {  // one box: the piece's 8 chunks x 8 rows, swizzled (the kernel's comment);
                    // not KFULL, the last piece's box holds its chunks only (the tail map)
        const bool tail = !KFULL && cols < kStreamShrinkKc;
        const CUtensorMap* m;
        if constexpr (KFULL)
          m = &map;
        else
          m = tail ? &map.tail : &map.full;
        if (lane == 0)
          bar_arrive_tx(b, tail ? static_cast<uint32_t>(kStreamShrinkRows * cols * 2)
                                : static_cast<uint32_t>(kStage));
        __syncwarp();
        if (lane == 0)
          tma_3d(dst, m, 0, static_cast<int>(row0), static_cast<int>(k0) / kStreamShrinkSwzBox, b,
                 pol);
      } else {  // rows < 8 (a rank not a multiple of 8) or probe bit 16: one 16-byte copy
                // per vector, placed as the swizzle places it (rows past `rows` and columns
                // past K are not read, and not read by the steps either)
        if (lane == 0)
          bar_arrive_tx(b, static_cast<uint32_t>(rows * (KFULL ? kStreamShrinkKc : cols) * 2));
        __syncwarp();
#pragma unroll 1
        for (int i = lane; i < rows * (kStreamShrinkKc / 8); i += 32) {
          const int row = i >> 6, vec = i & 63;
          static_assert(kStreamShrinkKc / 8 == 64, "64 vectors per row of a piece");
          if (KFULL || vec < (cols >> 3))
            bulk_g2s(dst + 16 * ((vec >> 3) * 64 + row * 8 + ((vec & 7) ^ row)),
                     A + (row0 + row) * K + k0 + vec * 8, 16u, b, pol);
        }
      }
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
  if (early) {
    pdl_wait();  // (x is read and t written below)
    if (late) pdl_trigger();
  }
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
    const int pn = have_n ? block_entry(x, nxt.g) : -1;
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
          const uint4 wv = (KFULL || vec < nvec) ? ws[widx(j)] : zero;
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
                const uint4 wv = (KFULL || vec < nvec) ? ws[widx(h + u)] : zero;
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
    {  // batch 0: rank row prow of members 2cq, 2cq + 1
      T* tp = t + r0 + prow;
      if (2 * cq < count && prow < rows)
        tp[static_cast<int64_t>(ids[2 * cq]) * a.r_max] = Cvt<T>::from(acc[0][0]);
      if (2 * cq + 1 < count && prow < rows)
        tp[static_cast<int64_t>(ids[2 * cq + 1]) * a.r_max] = Cvt<T>::from(acc[0][1]);
    }
    // Batches past it: the step's columns 2c, 2c + 1 are rank rows prow(2c), prow(2c + 1), i.e.
    // 2c, 2c + 1 (one 4-byte store), or with the swizzle c and c + 4 (two 2-byte stores). (Two
    // loops: one loop choosing between the forms cost the plain kernel for other K 8 more bytes
    // of spills.)
    if constexpr (SWZ) {
#pragma unroll
      for (int bt = 1; bt < kB; ++bt) {
        const int m = bt * 8 + gq;
        if (bt < nb && m < count && cq < rows) {
          T* tp = t + static_cast<int64_t>(ids[m]) * a.r_max + r0 + cq;
          tp[0] = Cvt<T>::from(acc[bt][0]);
          if (cq + 4 < rows) tp[4] = Cvt<T>::from(acc[bt][1]);
        }
      }
    } else {
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
    }
    __syncwarp();  // ids[] is rewritten by the next task
    cur = nxt, p = pn;
  }
  trace_done(a.trace);
}

// `map`: the swizzled map(s) (SWZ, always made) or the plain one (use_map 0: none, row copies).
template <typename T, bool KFULL, bool SWZ, bool PLAIN>
Status launch_shrink_as(const KernelArgs& a, const Plan& plan, cudaStream_t stream,
                        const ShrinkMapT<KFULL, SWZ>& map, int use_map) {
  constexpr auto kern = molora_lora_shrink<T, KFULL, SWZ, PLAIN>;
  const int warps = stream_consumers_of(Op::kShrink, plan.threads);
  const size_t smem = stream_layout(Op::kShrink, plan.stages, warps, PLAIN).total;
  MOLORA_CUDA_CHECK(allow_stream_smem<kern>());
  KernelArgs k = a;
  k.dbg = probe_bits();
  MOLORA_CUDA_CHECK(launch_kernel(plan.pdl, kern, static_cast<unsigned>(plan.grid),
                                  static_cast<unsigned>(plan.threads), smem, stream, k, plan.stages,
                                  map, use_map));
  return Status::Ok();
}
template <typename T, bool KFULL, bool SWZ>
Status launch_shrink(const KernelArgs& a, const Plan& plan, cudaStream_t stream,
                     const ShrinkMapT<KFULL, SWZ>& map, int use_map) {
  return a.aligned ? launch_shrink_as<T, KFULL, SWZ, false>(a, plan, stream, map, use_map)
                   : launch_shrink_as<T, KFULL, SWZ, true>(a, plan, stream, map, use_map);
}

}  // namespace

// K a multiple of the 64-column chunk takes a kernel with swizzled stages where the swizzled
// maps can be made: the bounds-free one where K is a multiple of the piece, else the one with
// bounds tests (and a second map for the last piece). Other K (and where the maps cannot be
// made) take the unswizzled kernel with bounds tests.
template <typename T>
Status launch_stream_shrink(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (a.dim % kStreamShrinkSwzBox == 0) {
    if (a.dim % kStreamShrinkKc == 0) {
      CUtensorMap map;
      if (shrink_map(a, &map, kShrinkMapSwizzled))
        return launch_shrink<T, true, true>(a, plan, stream, map, 1);
    } else {
      ShrinkMaps maps;
      if (shrink_map(a, &maps.full, kShrinkMapSwizzled) &&
          shrink_map(a, &maps.tail, kShrinkMapTail))
        return launch_shrink<T, false, true>(a, plan, stream, maps, 1);
    }
  }
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const int use_map = shrink_map(a, &map, kShrinkMapPlain) ? 1 : 0;
  return launch_shrink<T, false, false>(a, plan, stream, map, use_map);
}
template Status launch_stream_shrink<__nv_bfloat16>(const KernelArgs&, const Plan&, cudaStream_t);
template Status launch_stream_shrink<__half>(const KernelArgs&, const Plan&, cudaStream_t);

}  // namespace molora::lora::detail
