// moe_align_block_size, CUDA path: two launches, no host synchronisation, no allocation.
//
// The V experts are split into R ranges of kExpertsPerRange (512); CTA r owns range r.
//
// Launch 1 (molora_align_count): every CTA of the grid fills its share of sorted_token_ids with
//   the sentinel and of expert_ids with -1 (the fill is spread over up to 2 CTAs per SM). The
//   first R CTAs also each read all numel ids, form the virtual id, histogram the pairs of their
//   range in shared memory (warp-aggregated), and write the block offset of each of their experts
//   inside the range (loc) and the range's block total (part). CTA r also stores the virtual ids
//   of its share of the pairs (vbuf) for launch 2, and CTA 0 counts the dropped pairs.
// Launch 2 (molora_align_scatter): CTA r sums part[0..r) (its base) and part[0..R) (the total),
//   writes the expert id of each of its range's blocks, and places the pairs of its range: each
//   of its 16 warps takes a contiguous segment of vbuf, counts the pairs per expert (phase A),
//   the per-warp counts are turned into exclusive prefixes over the warps (B), and each warp walks
//   its segment again, ranking equal experts inside each 32-pair step with __match_any_sync (C).
//   Pairs therefore land in ascending flat index within a bucket — the CPU reference's order.
//
// Work: each owner CTA reads the numel ids three times (from L2); the fills are spread over the
// whole grid; nothing is serial over V or over the CTAs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "align/align_internal.h"
#include "core/cuda_util.h"
#include "molora/align.h"

namespace molora {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRange = static_cast<int>(align_detail::kExpertsPerRange);
constexpr int kUnroll = 4;
static_assert(kRange == kThreads, "one expert of the range per thread in the scans");

__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// Fills p[0, n) with `value`, the grid's threads each taking 16-byte stores.
__device__ void fill_i32(int32_t* p, int64_t n, int32_t value, int64_t tid, int64_t nthreads) {
  int64_t head = ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / 4;
  if (head > n) head = n;
  if (tid < head) p[tid] = value;
  const int64_t body = (n - head) / 4;
  int4* q = reinterpret_cast<int4*>(p + head);
  const int4 v4 = make_int4(value, value, value, value);
  for (int64_t j = tid; j < body; j += nthreads) q[j] = v4;
  const int64_t tail0 = head + body * 4;
  if (tid < n - tail0) p[tail0 + tid] = value;
}

// Virtual id of pair i: >= 0 its bucket, -1 invalid id, -2 slot -1 (no adapter).
template <typename Id>
__device__ __forceinline__ int vid_of(const Id* ids, const int32_t* slots, int64_t i, int topk,
                                      int64_t E, int64_t V) {
  int64_t e = static_cast<int64_t>(ids[i]);
  if (slots != nullptr) {
    int64_t s = slots[i / topk];
    if (s == -1) return -2;
    if (s < 0 || e < 0 || e >= E) return -1;
    e = s * E + e;
  }
  return (e >= 0 && e < V) ? static_cast<int>(e) : -1;
}

struct CountParams {
  int32_t* sorted_token_ids;
  int64_t sorted_len;
  int32_t* expert_ids;
  int64_t expert_len;
  int32_t* num_dropped;  // may be null
  int32_t* vbuf;
  int32_t* loc;
  int32_t* part;
  const int32_t* slot_ids;  // may be null
  int64_t numel, V, E;
  int topk, block_shift, ranges;
};

template <typename Id>
__global__ void __launch_bounds__(kThreads)
    molora_align_count(CountParams p, const Id* __restrict__ ids) {
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  fill_i32(p.sorted_token_ids, p.sorted_len, static_cast<int32_t>(p.numel), gtid, nthreads);
  fill_i32(p.expert_ids, p.expert_len, -1, gtid, nthreads);
  if (static_cast<int>(blockIdx.x) >= p.ranges) return;

  __shared__ int hist[kRange];
  const int r = blockIdx.x;
  const int lo = r * kRange;
  const int n_r = static_cast<int>(imin64(p.V - lo, kRange));
  const int lane = threadIdx.x & 31;
  hist[threadIdx.x] = 0;
  __syncthreads();

  int dropped = 0, no_adapter = 0;
  const int64_t step = static_cast<int64_t>(kThreads) * kUnroll;
  for (int64_t base = 0; base < p.numel; base += step) {  // warp-uniform trip count
    int v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      v[u] = i < p.numel ? vid_of(ids, p.slot_ids, i, p.topk, p.E, p.V) : -3;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      const int64_t iter = base / kThreads + u;
      if (i < p.numel && iter % p.ranges == r) p.vbuf[i] = v[u] < 0 ? -1 : v[u];
      dropped += v[u] == -1;
      no_adapter += v[u] == -2;
      const int x = v[u] - lo;
      const bool mine = v[u] >= 0 && x < n_r && x >= 0;
      const unsigned peers = __match_any_sync(0xffffffffu, mine ? x : kRange + lane);
      if (mine && lane == __ffs(peers) - 1) atomicAdd(&hist[x], __popc(peers));
    }
  }
  __syncthreads();

  using Scan = cub::BlockScan<int, kThreads>;
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  const int x = threadIdx.x;
  const int blocks = x < n_r ? (hist[x] + (1 << p.block_shift) - 1) >> p.block_shift : 0;
  int offset = 0, range_total = 0;
  Scan(tmp.scan).ExclusiveSum(blocks, offset, range_total);
  if (x < n_r) p.loc[lo + x] = offset;
  if (x == 0) p.part[r] = range_total;
  if (r == 0 && p.num_dropped != nullptr) {
    __syncthreads();
    const int d = Reduce(tmp.reduce).Sum(dropped);
    __syncthreads();
    const int na = Reduce(tmp.reduce).Sum(no_adapter);
    if (threadIdx.x == 0) {
      p.num_dropped[0] = d;
      p.num_dropped[1] = na;
    }
  }
}

struct ScatterParams {
  int32_t* sorted_token_ids;
  int32_t* expert_ids;
  int32_t* num_tokens_post_pad;
  const int32_t* vbuf;
  const int32_t* loc;
  const int32_t* part;
  int64_t numel, V;
  int block_shift, ranges;
};

__global__ void __launch_bounds__(kThreads) molora_align_scatter(ScatterParams p) {
  __shared__ int hw[kWarps][kRange];  // per-warp counts, then per-warp running offsets
  __shared__ int sloc[kRange + 1];
  __shared__ int s_base, s_total;
  const int r = blockIdx.x;
  const int lo = r * kRange;
  const int n_r = static_cast<int>(imin64(p.V - lo, kRange));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  if (threadIdx.x == 0) s_base = s_total = 0;
  for (int w = 0; w < kWarps; ++w) hw[w][threadIdx.x] = 0;
  if (static_cast<int>(threadIdx.x) < n_r) sloc[threadIdx.x] = p.loc[lo + threadIdx.x];
  __syncthreads();
  int my_base = 0, my_total = 0;
  for (int q = threadIdx.x; q < p.ranges; q += kThreads) {
    const int b = p.part[q];
    my_total += b;
    if (q < r) my_base += b;
  }
  if (my_total) atomicAdd(&s_total, my_total);
  if (my_base) atomicAdd(&s_base, my_base);
  if (threadIdx.x == 0) sloc[n_r] = p.part[r];
  __syncthreads();
  const int base_r = s_base;
  const int range_blocks = sloc[n_r];
  if (r == 0 && threadIdx.x == 0) p.num_tokens_post_pad[0] = s_total << p.block_shift;

  // Expert id of each block of the range: the last expert whose offset is <= the block.
  for (int j = threadIdx.x; j < range_blocks; j += kThreads) {
    int a = 0, b = n_r;  // invariant: sloc[a] <= j < sloc[b] (sloc[n_r] = range_blocks)
    while (b - a > 1) {
      const int m = (a + b) >> 1;
      if (sloc[m] <= j)
        a = m;
      else
        b = m;
    }
    p.expert_ids[base_r + j] = lo + a;
  }

  const int64_t seg = (p.numel + kWarps - 1) / kWarps;
  const int64_t seg_lo = imin64(seg * warp, p.numel);
  const int64_t seg_hi = imin64(seg_lo + seg, p.numel);
  int* my_hw = hw[warp];
  // Phase A: per-warp counts of the range's experts over the warp's segment.
  for (int64_t s0 = seg_lo; s0 < seg_hi; s0 += 32 * kUnroll) {
    int x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = s0 + u * 32 + lane;
      x[u] = i < seg_hi ? p.vbuf[i] - lo : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool mine = x[u] >= 0 && x[u] < n_r;
      const unsigned peers = __match_any_sync(0xffffffffu, mine ? x[u] : kRange + lane);
      if (mine && lane == __ffs(peers) - 1) my_hw[x[u]] += __popc(peers);
      __syncwarp();
    }
  }
  __syncthreads();
  // Phase B: exclusive prefix over the warps for each expert.
  if (static_cast<int>(threadIdx.x) < n_r) {
    int run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = hw[w][threadIdx.x];
      hw[w][threadIdx.x] = run;
      run += c;
    }
  }
  __syncthreads();
  // Phase C: place each pair at its bucket's start + pairs before it (ascending flat index).
  for (int64_t s0 = seg_lo; s0 < seg_hi; s0 += 32 * kUnroll) {
    int x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = s0 + u * 32 + lane;
      x[u] = i < seg_hi ? p.vbuf[i] - lo : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool mine = x[u] >= 0 && x[u] < n_r;
      const unsigned peers = __match_any_sync(0xffffffffu, mine ? x[u] : kRange + lane);
      const int leader = __ffs(peers) - 1;
      int before = 0;
      if (mine && lane == leader) {
        before = my_hw[x[u]];
        my_hw[x[u]] = before + __popc(peers);
      }
      before = __shfl_sync(0xffffffffu, before, leader);
      if (mine) {
        const int rank = __popc(peers & ((1u << lane) - 1u));
        const int64_t pos =
            (static_cast<int64_t>(base_r + sloc[x[u]]) << p.block_shift) + before + rank;
        p.sorted_token_ids[pos] = static_cast<int32_t>(s0 + u * 32 + lane);
      }
      __syncwarp();
    }
  }
}

}  // namespace

Status moe_align_block_size(const AlignArgs& a, cudaStream_t stream) {
  MOLORA_RETURN_IF_ERROR(align_detail::check_values(a, true));
  // Under stream capture the pointer attribute query is skipped (it is not a stream operation
  // and some capture modes forbid it); an eager call checks every pointer.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOLORA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone)
    MOLORA_RETURN_IF_ERROR(align_detail::check_pointers(a));
  AlignSizes sz;
  MOLORA_RETURN_IF_ERROR(moe_align_sizes(a.num_tokens, a.topk, a.num_experts, a.block_size, &sz));
  const int64_t numel = a.num_tokens * a.topk;
  const int ranges = static_cast<int>(align_detail::num_ranges(a.num_experts));
  int shift = 0;
  while ((int64_t{1} << shift) < a.block_size) ++shift;

  int device = 0, sms = 0;
  MOLORA_CUDA_CHECK(cudaGetDevice(&device));
  MOLORA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Fill: about 16 KB per CTA, at most two CTAs per SM, never fewer CTAs than ranges.
  const int64_t fill_ctas = cdiv(sz.sorted_token_ids * 4 + sz.expert_ids * 4, 16384);
  const int grid1 =
      static_cast<int>(std::max<int64_t>(ranges, std::min<int64_t>(fill_ctas, 2 * sms)));

  int32_t* ws = static_cast<int32_t*>(a.workspace);
  CountParams cp{};
  cp.sorted_token_ids = a.sorted_token_ids;
  cp.sorted_len = sz.sorted_token_ids;
  cp.expert_ids = a.expert_ids;
  cp.expert_len = sz.expert_ids;
  cp.num_dropped = a.num_dropped;
  cp.vbuf = ws;
  cp.loc = ws + numel;
  cp.part = ws + numel + a.num_experts;
  cp.slot_ids = a.slot_ids;
  cp.numel = numel;
  cp.V = a.num_experts;
  cp.E = a.slot_ids != nullptr ? a.num_base_experts : a.num_experts;
  cp.topk = static_cast<int>(a.topk);
  cp.block_shift = shift;
  cp.ranges = ranges;
  if (a.topk_dtype == DType::kI64)
    molora_align_count<<<grid1, kThreads, 0, stream>>>(cp, static_cast<const int64_t*>(a.topk_ids));
  else
    molora_align_count<<<grid1, kThreads, 0, stream>>>(cp, static_cast<const int32_t*>(a.topk_ids));
  MOLORA_CUDA_CHECK(cudaGetLastError());

  ScatterParams sp{};
  sp.sorted_token_ids = a.sorted_token_ids;
  sp.expert_ids = a.expert_ids;
  sp.num_tokens_post_pad = a.num_tokens_post_pad;
  sp.vbuf = cp.vbuf;
  sp.loc = cp.loc;
  sp.part = cp.part;
  sp.numel = numel;
  sp.V = a.num_experts;
  sp.block_shift = shift;
  sp.ranges = ranges;
  molora_align_scatter<<<ranges, kThreads, 0, stream>>>(sp);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace molora
