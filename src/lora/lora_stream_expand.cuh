// The stream expand kernel (lora_stream.cuh says how the stream kernels work): its producer
// warp, its consumers (expand_task) and its launcher.
// Included by lora_stream.cu only (one translation unit: see there).
#pragma once

#include "lora/lora_stream.cuh"

namespace molora::lora::detail {
namespace {

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

// --- expand kernel ----------------------------------------------------------------------------
// RM: r_max (see expand_task).
// NFULL: the tile is the stage's rows and N a multiple of it (every seed shape): the consumer
// of pitch RM runs expand_task's FULL form.
// PLAIN: plain routing (plain_build groups the pairs first); a template parameter so that the
// aligned kernels carry none of its code or registers.
template <typename T, int RM, bool NFULL, bool PLAIN>
__global__ void __launch_bounds__(32 * (stream_max_consumers(Op::kExpand) + 1), 1)
    molora_lora_expand(KernelArgs a, int stages, const __grid_constant__ ExpandMaps maps) {
  pdl_trigger();  // the next call may launch now; it waits for this one before touching memory
  trace_start(a.trace);
  extern __shared__ __align__(1024) uint8_t smem[];  // (the same symbol as the shrink's)
  const int consumers = static_cast<int>(blockDim.x / 32) - 1;
  Ctx x;
  x.a = &a;
  x.smem = smem;
  x.L = stream_layout(Op::kExpand, stages, consumers, PLAIN);
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
  // Plan::early_inputs: the routing, ranks, scales and weights are read before the wait for the
  // kernel before (the producer never waits), t and y read and y written only after it.
  const bool early = a.early != 0;
  if (!early) pdl_wait();  // the kernel before this one is done (no-op without the attribute)
  if (threadIdx.x == 0) trace_set(a.trace, 1);
  const SlotCache slots(a, true);  // (ranks and scales in flight beside the loads below)
  if constexpr (PLAIN) plain_groups<true>(x);  // plain routing: the groups, in shared memory
  TaskIter<Op::kExpand> it(x);  // (its first expert ids load beside num_tokens_post_pad)
  x.my_tasks = cta_tasks(x);
  slots.store(a, s_rank, s_scale);
  __syncthreads();
  if (kTrace && threadIdx.x == 0 && a.trace != nullptr) {
    trace_set(a.trace, 2);
    a.trace[blockIdx.x * kTraceWords + 7] = static_cast<unsigned long long>(x.my_tasks);
  }
  if (x.my_tasks == 0) {  // (as the shrink: a CTA without tasks leaves at once)
    trace_done(a.trace);
    return;
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
  int p = have ? block_entry(x, cur.g) : -1;
  if (early) pdl_wait();  // (t and y are read and y written below)
  while (have) {
    const bool have_n = next_mine(nxt);
    const int pn = have_n ? block_entry(x, nxt.g) : -1;
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

template <typename T, int RM, bool NFULL, bool PLAIN>
Status launch_expand_as(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr auto kern = molora_lora_expand<T, RM, NFULL, PLAIN>;
  const int consumers = stream_consumers_of(Op::kExpand, plan.threads);
  const size_t smem = stream_layout(Op::kExpand, plan.stages, consumers, PLAIN).total;
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
template <typename T, int RM, bool NFULL>
Status launch_expand(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return a.aligned ? launch_expand_as<T, RM, NFULL, false>(a, plan, stream)
                   : launch_expand_as<T, RM, NFULL, true>(a, plan, stream);
}

}  // namespace

// Expand's register tiles follow r_max (ExpandTiles: NT = stream_expand_tile(r_max) / 8).
template <typename T>
Status launch_stream_expand(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
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
template Status launch_stream_expand<__nv_bfloat16>(const KernelArgs&, const Plan&, cudaStream_t);
template Status launch_stream_expand<__half>(const KernelArgs&, const Plan&, cudaStream_t);

}  // namespace molora::lora::detail
