// MoE-LoRA shrink and expand kernels over virtual experts (v = slot * E + expert).
//
// One persistent grid per call (the plan's CTA count) walks the work items grid-stride. A work
// item is (group, chunk): a group is the set of routed pairs that share one virtual expert — one
// block of the aligned layout, or, for plain routing, the pairs a CTA-local counting sort puts
// together — and a chunk is a slice of the weight (shrink: `tile` rank rows, expand: `tile` of
// the N output columns). Each weight byte of a chunk is read once (16-byte streaming loads) and
// applied to every pair of the group, so the bytes follow the distinct (slot, expert) set and
// the ranks r_s; pairs with slot -1 never form a group and cost nothing. Every output element
// is written by exactly one thread (no atomics into outputs: same bits run to run).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "lora/lora_internal.h"

namespace molora::lora::detail {
namespace {

template <typename T>
struct Cvt;
template <>
struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ float2 two(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  }
  static __device__ __forceinline__ float one(__nv_bfloat16 h) { return __bfloat162float(h); }
  static __device__ __forceinline__ __nv_bfloat16 from(float f) { return __float2bfloat16_rn(f); }
};
template <>
struct Cvt<__half> {
  static __device__ __forceinline__ float2 two(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  }
  static __device__ __forceinline__ float one(__half h) { return __half2float(h); }
  static __device__ __forceinline__ __half from(float f) { return __float2half_rn(f); }
};

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  float2 a = Cvt<T>::two(v.x), b = Cvt<T>::two(v.y), c = Cvt<T>::two(v.z), d = Cvt<T>::two(v.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

__device__ __forceinline__ int vid_of(const KernelArgs& a, int64_t q) {
  const int s = a.rt.slot_ids[q / a.k];
  const int e = a.rt.topk_ids[q];
  if (s < 0 || s >= a.S || e < 0 || e >= a.E) return -1;
  return s * a.E + e;
}

// In-place exclusive scan of n ints in shared memory by the whole CTA; returns the total.
__device__ int block_exclusive_scan(int* data, int n, int* s_wsum) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * per), hi = min(n, lo + per);
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += data[i];
  int incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    int o = __shfl_up_sync(~0u, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) s_wsum[warp] = incl;
  __syncthreads();
  int wbase = 0, total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) wbase += s_wsum[w];
    total += s_wsum[w];
  }
  int run = wbase + incl - sum;
  for (int i = lo; i < hi; ++i) {
    int c = data[i];
    data[i] = run;
    run += c;
  }
  __syncthreads();
  return total;
}

// Plain routing: CTA-local counting sort of the P pairs by virtual expert. Afterwards
// s_cnt[v]..s_cnt[v+1] index the pairs of v in s_mem, and s_gv lists the used v ascending.
__device__ int build_groups(const KernelArgs& a, int V, int* s_cnt, int* s_cur, int* s_mem,
                            int* s_gv, int* s_wsum) {
  const int tid = threadIdx.x;
  for (int i = tid; i < V; i += kThreads) s_cnt[i] = 0;
  __syncthreads();
  for (int64_t q = tid; q < a.P; q += kThreads) {
    int v = vid_of(a, q);
    if (v >= 0) atomicAdd(&s_cnt[v], 1);
  }
  __syncthreads();
  for (int i = tid; i < V; i += kThreads) s_cur[i] = s_cnt[i] > 0 ? 1 : 0;
  __syncthreads();
  const int total = block_exclusive_scan(s_cnt, V, s_wsum);
  const int groups = block_exclusive_scan(s_cur, V, s_wsum);
  if (tid == 0) s_cnt[V] = total;
  __syncthreads();
  for (int v = tid; v < V; v += kThreads)
    if (s_cnt[v + 1] > s_cnt[v]) s_gv[s_cur[v]] = v;
  __syncthreads();
  for (int i = tid; i < V; i += kThreads) s_cur[i] = 0;
  __syncthreads();
  for (int64_t q = tid; q < a.P; q += kThreads) {
    int v = vid_of(a, q);
    if (v >= 0) s_mem[s_cnt[v] + atomicAdd(&s_cur[v], 1)] = static_cast<int>(q);
  }
  __syncthreads();
  return groups;
}

__device__ __forceinline__ int64_t member(const int* mem, int64_t g, int i) {
  return mem ? mem[i] : g;
}

// t[p, row] for rows [c*tile, min((c+1)*tile, r)) of virtual expert v, every pair of the group.
// tile >= 8: each warp owns whole rows; tile < 8: 8/tile warps split K of one row and reduce
// through shared memory in a fixed order.
template <typename T>
__device__ void shrink_item(const KernelArgs& a, int v, int r, const int* mem, int64_t g, int count,
                            int c, float (*s_red)[4]) {
  const int tile = a.tile;
  const int row0 = c * tile;
  if (row0 >= r) return;
  const int row_end = min(row0 + tile, r);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wpr = tile >= 8 ? 1 : 8 / tile;
  const int rows_pass = 8 / wpr;
  const int kpart = warp % wpr, rsub = warp / wpr;
  const int64_t K = a.dim;
  const T* A = static_cast<const T*>(a.w) + static_cast<int64_t>(v) * a.r_max * K;
  const T* x = static_cast<const T*>(a.in);
  T* t = static_cast<T*>(a.out);
  const int64_t kstep = static_cast<int64_t>(wpr) * 256;
  for (int rb = row0; rb < row_end; rb += rows_pass) {
    const int row = rb + rsub;
    const bool live = row < row_end;
    const uint4* wrow = reinterpret_cast<const uint4*>(A + static_cast<int64_t>(row) * K);
    for (int m0 = 0; m0 < count; m0 += 4) {
      const int mc = min(4, count - m0);
      const T* xr[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) xr[j] = x + (member(mem, g, m0 + min(j, mc - 1)) / a.k) * K;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      if (live) {
        for (int64_t kb = static_cast<int64_t>(kpart * 32 + lane) * 8; kb < K; kb += kstep * 4) {
          uint4 wv[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int64_t kk = kb + u * kstep;
            wv[u] = kk < K ? __ldcs(wrow + kk / 8) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int64_t kk = kb + u * kstep;
            if (kk >= K) break;
            float wf[8];
            unpack8<T>(wv[u], wf);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (j < mc) {
                float xf[8];
                unpack8<T>(__ldg(reinterpret_cast<const uint4*>(xr[j] + kk)), xf);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[j] = fmaf(wf[i], xf[i], acc[j]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(~0u, acc[j], off);
      if (wpr == 1) {
        if (live && lane == 0)
          for (int j = 0; j < mc; ++j)
            t[member(mem, g, m0 + j) * a.r_max + row] = Cvt<T>::from(acc[j]);
      } else {
        if (lane == 0)
#pragma unroll
          for (int j = 0; j < 4; ++j) s_red[warp][j] = acc[j];
        __syncthreads();
        if (live && kpart == 0 && lane < mc) {
          float s = 0.f;
          for (int w2 = 0; w2 < wpr; ++w2) s += s_red[warp + w2][lane];
          t[member(mem, g, m0 + lane) * a.r_max + row] = Cvt<T>::from(s);
        }
        __syncthreads();
      }
    }
  }
}

// y[p, n] += scale_s * B[v, n, :r] . t[p, :r] for n in [c*tile, min((c+1)*tile, N)).
// lpr = pow2ceil(cdiv(r, 8)) lanes share one row (one 16-byte vector each) and reduce by shuffle.
template <typename T>
__device__ void expand_item(const KernelArgs& a, int v, int r, const int* mem, int64_t g, int count,
                            int c, float* s_t) {
  if (r == 0) return;
  const int64_t N = a.dim;
  const int64_t n0 = static_cast<int64_t>(c) * a.tile;
  const int64_t n1 = min(N, n0 + a.tile);
  if (n0 >= N) return;
  const int nv = (r + 7) / 8;
  int lpr = 1;
  while (lpr < nv) lpr *= 2;
  const int rows_pass = kThreads / lpr;
  const int tid = threadIdx.x, li = tid & (lpr - 1), rl = tid / lpr;
  const int R = a.r_max, ldt = lpr * 8;
  const float scale = a.scales[v / a.E];
  const T* Bw = static_cast<const T*>(a.w) + static_cast<int64_t>(v) * N * R;
  const T* tin = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const int tail = r - (nv - 1) * 8;  // valid elements of the last vector (1..8)
  for (int m0 = 0; m0 < count; m0 += kExpandGroupTile) {
    const int mc = min(kExpandGroupTile, count - m0);
    __syncthreads();
    for (int i = tid; i < mc * ldt; i += kThreads) {
      const int m = i / ldt, j = i % ldt;
      s_t[i] = j < r ? Cvt<T>::one(tin[member(mem, g, m0 + m) * R + j]) : 0.f;
    }
    __syncthreads();
    for (int64_t base = n0; base < n1; base += static_cast<int64_t>(rows_pass) * 4) {
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t n = base + u * rows_pass + rl;
        wv[u] = (n < n1 && li < nv) ? __ldcs(reinterpret_cast<const uint4*>(Bw + n * R) + li)
                                    : make_uint4(0, 0, 0, 0);
      }
      float wf[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        unpack8<T>(wv[u], wf[u]);
        if (li == nv - 1)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (i >= tail) wf[u][i] = 0.f;  // past r_s: ignore whatever the padding holds
      }
      for (int m = 0; m < mc; ++m) {
        const float4 t0 = *reinterpret_cast<const float4*>(s_t + m * ldt + li * 8);
        const float4 t1 = *reinterpret_cast<const float4*>(s_t + m * ldt + li * 8 + 4);
        float part[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float* w = wf[u];
          part[u] = w[0] * t0.x + w[1] * t0.y + w[2] * t0.z + w[3] * t0.w + w[4] * t1.x +
                    w[5] * t1.y + w[6] * t1.z + w[7] * t1.w;
        }
        for (int off = lpr >> 1; off > 0; off >>= 1)
#pragma unroll
          for (int u = 0; u < 4; ++u) part[u] += __shfl_xor_sync(~0u, part[u], off);
        if (li == 0) {
          T* yrow = y + member(mem, g, m0 + m) * N;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int64_t n = base + u * rows_pass + rl;
            if (n < n1) yrow[n] = Cvt<T>::from(Cvt<T>::one(yrow[n]) + scale * part[u]);
          }
        }
      }
    }
  }
}

template <Op OP, typename T>
__global__ void __launch_bounds__(kThreads, 2) molora_lora_kernel(KernelArgs a) {
  extern __shared__ __align__(16) int smem[];
  __shared__ int s_wsum[kThreads / 32];
  __shared__ int s_count;
  __shared__ float s_red[kThreads / 32][4];
  const int tid = threadIdx.x;
  const int V = a.S * a.E;
  const bool grouped = !a.aligned && a.group_cap > 0;
  int *s_cnt = nullptr, *s_gv = nullptr, *s_mem = smem;
  int64_t n_groups;
  size_t ints;
  if (grouped) {
    s_cnt = smem;
    int* s_cur = smem + V + 1;
    s_mem = s_cur + V;
    s_gv = s_mem + a.P;
    n_groups = build_groups(a, V, s_cnt, s_cur, s_mem, s_gv, s_wsum);
    ints = static_cast<size_t>(2 * V + 1) + a.P + min(a.P, static_cast<int64_t>(V));
  } else if (a.aligned) {
    int64_t used = a.rt.num_tokens_post_pad[0];
    used = max(int64_t{0}, min(used, a.sorted_len));
    n_groups = used / a.block;
    ints = a.block;
  } else {
    n_groups = a.P;
    ints = 0;
  }
  float* s_t = reinterpret_cast<float*>(smem + (ints + 3) / 4 * 4);
  const int64_t n_items = n_groups * a.chunks;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int64_t g = item / a.chunks;
    const int c = static_cast<int>(item % a.chunks);
    int v, count;
    const int* mem;
    if (grouped) {
      v = s_gv[g];
      const int st = s_cnt[v];
      count = s_cnt[v + 1] - st;
      mem = s_mem + st;
    } else if (a.aligned) {
      v = a.rt.expert_ids[g];
      if (v < 0 || v >= V) continue;
      __syncthreads();  // the previous item may still read s_mem
      if (tid == 0) s_count = 0;
      __syncthreads();
      for (int i = tid; i < a.block; i += kThreads) {
        const int p = a.rt.sorted_token_ids[g * a.block + i];
        if (p >= 0 && p < a.P) s_mem[atomicAdd(&s_count, 1)] = p;
      }
      __syncthreads();
      count = s_count;
      mem = s_mem;
      if (count == 0) continue;
    } else {
      v = vid_of(a, g);
      if (v < 0) continue;
      count = 1;
      mem = nullptr;
    }
    const int r = min(max(a.ranks[v / a.E], 0), a.r_max);
    if (OP == Op::kShrink)
      shrink_item<T>(a, v, r, mem, g, count, c, s_red);
    else
      expand_item<T>(a, v, r, mem, g, count, c, s_t);
  }
}

template <Op OP, typename T>
Status launch_t(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  auto kern = molora_lora_kernel<OP, T>;
  if (plan.smem_bytes > 48 * 1024)
    MOLORA_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(plan.smem_bytes)));
  kern<<<plan.grid, kThreads, plan.smem_bytes, stream>>>(a);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

int max_ctas_per_sm(Op op, DType dt, size_t smem) {
  int n = 0;
  cudaError_t e;
  if (dt == DType::kF16)
    e = op == Op::kShrink ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                &n, molora_lora_kernel<Op::kShrink, __half>, kThreads, smem)
                          : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                &n, molora_lora_kernel<Op::kExpand, __half>, kThreads, smem);
  else
    e = op == Op::kShrink ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                &n, molora_lora_kernel<Op::kShrink, __nv_bfloat16>, kThreads, smem)
                          : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                &n, molora_lora_kernel<Op::kExpand, __nv_bfloat16>, kThreads, smem);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

Status launch(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (dt == DType::kBF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __nv_bfloat16>(a, plan, stream)
                             : launch_t<Op::kExpand, __nv_bfloat16>(a, plan, stream);
  if (dt == DType::kF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __half>(a, plan, stream)
                             : launch_t<Op::kExpand, __half>(a, plan, stream);
  return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                 dtype_name(dt));
}

}  // namespace molora::lora::detail
