// The P2P all-reduce kernels: one-shot and two-shot, bounded waits, device-side epochs.
// Protocol and memory orders: docs/comm.md and models/allreduce.pml.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "comm/kernels.h"
#include "core/cuda_util.h"

namespace molora::comm {
namespace {

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
template <typename T>
__device__ __forceinline__ T ld_volatile(const T* p) {
  return *const_cast<const volatile T*>(p);
}

template <typename T>
struct Cvt;
template <>
struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ float to(uint32_t h) { return __uint_as_float(h << 16); }
  static __device__ __forceinline__ uint32_t from(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};
template <>
struct Cvt<__half> {
  static __device__ __forceinline__ float to(uint32_t h) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  }
  static __device__ __forceinline__ uint32_t from(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
};

// acc[8] += the 8 16-bit values of x.
template <typename T>
__device__ __forceinline__ void add8(float* acc, uint4 x) {
  uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] += Cvt<T>::to(w[i] & 0xffffu);
    acc[2 * i + 1] += Cvt<T>::to(w[i] >> 16);
  }
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float* acc) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = Cvt<T>::from(acc[2 * i]) | (Cvt<T>::from(acc[2 * i + 1]) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Records this rank's first error (device word + host mirror) and tells every peer.
__device__ void raise_error(const RankArgs& ra, int world, uint32_t code, uint32_t peer,
                            uint32_t epoch, uint32_t detail) {
  Header* hdr = ra.peer_hdr[ra.rank];
  if (atomicCAS(&hdr->error_code, 0u, code) != 0u) return;
  *const_cast<volatile uint32_t*>(&hdr->error_peer) = peer;
  *const_cast<volatile uint32_t*>(&hdr->error_epoch) = epoch;
  *const_cast<volatile uint32_t*>(&hdr->error_detail) = detail;
  volatile ErrorMirror* m = ra.mirror;
  m->peer = peer;
  m->epoch = epoch;
  m->detail = detail;
  __threadfence_system();
  m->code = code;
  __threadfence_system();
  if (code == kErrPeerAbort) return;  // the peer that failed has told everyone
  for (int k = 0; k < world; ++k)
    if (k != ra.rank) st_release_sys(&ra.peer_hdr[k]->abort_word, pack_abort(code, ra.rank, epoch));
}

// Spins until flag's epoch >= epoch. Returns kErrNone, kErrMismatch (same epoch, other hash,
// when check_hash), kErrTimeout (deadline passed) or kErrPeerAbort (a peer or another CTA of
// this rank failed). *seen = the last flag value read.
__device__ uint32_t wait_flag(const uint64_t* flag, uint32_t epoch, uint32_t hash, bool check_hash,
                              const Header* hdr, uint64_t deadline, uint64_t* seen) {
  for (uint32_t spin = 1;; ++spin) {
    uint64_t f = ld_acquire_sys(flag);
    *seen = f;
    if (epoch_ge(flag_epoch(f), epoch)) {
      if (check_hash && flag_epoch(f) == epoch && flag_hash(f) != hash) return kErrMismatch;
      return kErrNone;
    }
    if ((spin & 31u) == 0) {
      if (ld_volatile(&hdr->abort_word) != 0 || ld_volatile(&hdr->error_code) != 0)
        return kErrPeerAbort;
      if (globaltimer() > deadline) return kErrTimeout;
    }
  }
}

// Threads 0..world-1 (not this rank) wait on flags[t] (stride in uint64_t); the CTA agrees on
// the outcome. Returns true when the CTA must stop.
__device__ bool cta_wait(const RankArgs& ra, int world, const uint64_t* flags, size_t stride,
                         uint32_t epoch, uint32_t hash, bool check_hash, uint64_t deadline,
                         uint32_t* s_err) {
  const int t = threadIdx.x;
  const Header* hdr = ra.peer_hdr[ra.rank];
  if (t < world && t != ra.rank) {
    uint64_t seen = 0;
    uint32_t err = wait_flag(flags + t * stride, epoch, hash, check_hash, hdr, deadline, &seen);
    if (err != kErrNone) {
      atomicOr(s_err, 1u);
      uint32_t detail = err == kErrMismatch ? flag_hash(seen) : blockIdx.x;
      if (err == kErrPeerAbort) {
        uint64_t ab = ld_volatile(&hdr->abort_word);
        if (ab != 0)
          raise_error(ra, world, kErrPeerAbort, static_cast<uint32_t>(ab >> 48) & 0xff, epoch,
                      static_cast<uint32_t>(ab >> 56));
      } else {
        raise_error(ra, world, err, t, epoch, detail);
      }
    }
  }
  __syncthreads();
  return *s_err != 0;
}

template <typename T>
__device__ __forceinline__ void unpack8(uint4 x, float* v) {
  uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = Cvt<T>::to(w[i] & 0xffffu);
    v[2 * i + 1] = Cvt<T>::to(w[i] >> 16);
  }
}

// Rows [row_begin, row_end) of: residual = round(sum + residual);
// out = round(residual * rsqrt(mean(residual^2) + eps) * weight). The whole CTA works on one row
// at a time; `sum` may alias `out`. kVector: 16-byte accesses (hidden % 8 == 0, every pointer
// 16-byte aligned). Shared by the fused kernel and the standalone one, which choose kVector by
// the same rule (rmsnorm_vectorised), so both paths give the same bits.
template <typename T, bool kVector>
__device__ void residual_rmsnorm_rows(const uint16_t* sum, uint16_t* residual,
                                      const uint16_t* weight, uint16_t* out, int64_t row_begin,
                                      int64_t row_end, int64_t hidden, float eps) {
  __shared__ float red[kThreads / 32];
  __shared__ float s_inv;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const uint16_t* s = sum + row * hidden;
    uint16_t* res = residual + row * hidden;
    uint16_t* o = out + row * hidden;
    float ss = 0.0f;
    if (kVector) {
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      uint4* r4 = reinterpret_cast<uint4*>(res);
      for (int64_t j = threadIdx.x; j < hidden / 8; j += kThreads) {
        float a[8], b[8];
        unpack8<T>(s4[j], a);
        unpack8<T>(r4[j], b);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          a[i] = Cvt<T>::to(Cvt<T>::from(a[i] + b[i]));
          ss += a[i] * a[i];
        }
        r4[j] = pack8<T>(a);
      }
    } else {
      for (int64_t j = threadIdx.x; j < hidden; j += kThreads) {
        float r = Cvt<T>::to(Cvt<T>::from(Cvt<T>::to(s[j]) + Cvt<T>::to(res[j])));
        res[j] = static_cast<uint16_t>(Cvt<T>::from(r));
        ss += r * r;
      }
    }
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float tot = 0.0f;
      for (int i = 0; i < kThreads / 32; ++i) tot += red[i];
      s_inv = rsqrtf(tot / static_cast<float>(hidden) + eps);
    }
    __syncthreads();
    const float inv = s_inv;
    if (kVector) {
      const uint4* r4 = reinterpret_cast<const uint4*>(res);
      const uint4* w4 = reinterpret_cast<const uint4*>(weight);
      uint4* o4 = reinterpret_cast<uint4*>(o);
      for (int64_t j = threadIdx.x; j < hidden / 8; j += kThreads) {
        float r[8], w[8];
        unpack8<T>(r4[j], r);
        unpack8<T>(w4[j], w);
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = r[i] * inv * w[i];
        o4[j] = pack8<T>(r);
      }
    } else {
      for (int64_t j = threadIdx.x; j < hidden; j += kThreads)
        o[j] =
            static_cast<uint16_t>(Cvt<T>::from(Cvt<T>::to(res[j]) * inv * Cvt<T>::to(weight[j])));
    }
    __syncthreads();  // s_inv and red are rewritten by the next row
  }
}

template <typename T, int kMode>
__global__ void __launch_bounds__(kThreads) molora_allreduce_kernel(LaunchArgs a) {
  constexpr bool kTwoShot = kMode == static_cast<int>(Kernel::kTwoShot);
  constexpr bool kFused = kMode == static_cast<int>(Kernel::kOneShotResidualRmsnorm);
  const RankArgs& ra = a.ranks[blockIdx.y];
  const int me = ra.rank, world = a.world, t = threadIdx.x;
  const uint64_t b = blockIdx.x, grid = gridDim.x;
  Header* hdr = ra.peer_hdr[me];
  __shared__ uint32_t s_err;
  __shared__ uint32_t s_epoch;
  if (t == 0) {
    uint64_t ab = ld_volatile(&hdr->abort_word);
    s_err = (ld_volatile(&hdr->error_code) != 0 || ab != 0) ? 1u : 0u;
    s_epoch = static_cast<uint32_t>(ld_volatile(&hdr->epoch)) + 1u;
    if (ab != 0 && ld_volatile(&hdr->error_code) == 0)
      raise_error(ra, world, kErrPeerAbort, static_cast<uint32_t>(ab >> 48) & 0xff, s_epoch,
                  static_cast<uint32_t>(ab >> 56));
  }
  __syncthreads();
  if (s_err) return;  // this communicator has failed: the host falls back
  const uint32_t e = s_epoch;
  const uint64_t deadline = globaltimer() + a.timeout_ns;
  const uint64_t flag = pack_flag(e, a.hash);
  const uint4* in = static_cast<const uint4*>(ra.in);
  uint4* out = static_cast<uint4*>(ra.out);
  const uint64_t slot_vec = a.slot_bytes / kVec;
  auto slot = [&](int owner, int src) {  // owner's staging slot of (e, src)
    return reinterpret_cast<uint4*>(ra.peer_data[owner]) + slot_index(e, world, src) * slot_vec;
  };

  // 1. Every peer finished reading the slots of epoch e-2 (the end flag): safe to overwrite.
  if (cta_wait(ra, world, hdr->done, 1, e - 2u, 0, false, deadline, &s_err)) return;

  if (!kTwoShot) {
    uint64_t vb, ve;
    int64_t rb = 0, re = 0;
    if (kFused) {  // whole rows per CTA: the norm needs the row's full sum
      const uint64_t per_row = static_cast<uint64_t>(a.hidden) * 2 / kVec;
      uint64_t r0, r1;
      split(a.nvec / per_row, grid, b, &r0, &r1);
      rb = static_cast<int64_t>(r0), re = static_cast<int64_t>(r1);
      vb = r0 * per_row, ve = r1 * per_row;
    } else {
      split(a.nvec, grid, b, &vb, &ve);
    }
    // 2. Push this rank's partial into every peer's slot (e, me).
    for (uint64_t v = vb + t; v < ve; v += kThreads) {
      uint4 x = in[v];
      for (int k = 0; k < world; ++k)
        if (k != me) slot(k, me)[v] = x;
    }
    __syncthreads();
    // 3. Release flag to every peer; wait for every peer's flag of epoch e.
    if (t < world && t != me) st_release_sys(&ra.peer_hdr[t]->arrive[0][b][me], flag);
    if (cta_wait(ra, world, &hdr->arrive[0][b][0], 1, e, a.hash, true, deadline, &s_err)) return;
    // 4. Sum in rank order in fp32, round once.
    for (uint64_t v = vb + t; v < ve; v += kThreads) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < world; ++k) add8<T>(acc, k == me ? in[v] : __ldcg(slot(me, k) + v));
      out[v] = pack8<T>(acc);
    }
    if (kFused) {  // 5. residual + rmsnorm of this CTA's rows (the sums are in out)
      __syncthreads();
      auto* o16 = static_cast<uint16_t*>(ra.out);
      residual_rmsnorm_rows<T, true>(o16, static_cast<uint16_t*>(ra.residual),
                                     static_cast<const uint16_t*>(ra.weight), o16, rb, re, a.hidden,
                                     a.eps);
    }
  } else {
    uint64_t cb[kMaxWorld], sb[kMaxWorld], se[kMaxWorld];
    for (int j = 0; j < world; ++j) {
      uint64_t ce, lo, hi;
      split(a.nvec, world, j, &cb[j], &ce);
      split(ce - cb[j], grid, b, &lo, &hi);
      sb[j] = cb[j] + lo;
      se[j] = cb[j] + hi;
    }
    // 2. Reduce-scatter: chunk j of this rank's partial goes to rank j's slot (e, me).
    for (int j = 0; j < world; ++j) {
      if (j == me) continue;
      uint4* dst = slot(j, me);
      for (uint64_t v = sb[j] + t; v < se[j]; v += kThreads) dst[v] = in[v];
    }
    __syncthreads();
    if (t < world && t != me) st_release_sys(&ra.peer_hdr[t]->arrive[0][b][me], flag);
    if (cta_wait(ra, world, &hdr->arrive[0][b][0], 1, e, a.hash, true, deadline, &s_err)) return;
    // 3. Sum chunk `me` in rank order; the result goes to out and to every peer's slot (e, me).
    for (uint64_t v = sb[me] + t; v < se[me]; v += kThreads) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < world; ++k) add8<T>(acc, k == me ? in[v] : __ldcg(slot(me, k) + v));
      uint4 r = pack8<T>(acc);
      for (int k = 0; k < world; ++k)
        if (k != me) slot(k, me)[v] = r;
      out[v] = r;
    }
    __syncthreads();
    // 4. All-gather: wait for every peer's reduced chunk, copy it out.
    if (t < world && t != me) st_release_sys(&ra.peer_hdr[t]->arrive[1][b][me], flag);
    if (cta_wait(ra, world, &hdr->arrive[1][b][0], 1, e, a.hash, true, deadline, &s_err)) return;
    for (int k = 0; k < world; ++k) {
      if (k == me) continue;
      const uint4* src = slot(me, k);
      for (uint64_t v = sb[k] + t; v < se[k]; v += kThreads) out[v] = __ldcg(src + v);
    }
  }

  // 6. Exit: the last CTA advances the device epoch and stores the end flag into every peer.
  __syncthreads();
  if (t == 0) {
    __threadfence_system();
    uint32_t prev = atomicAdd(&hdr->exit_count, 1u);
    if (prev == grid - 1) {
      __threadfence_system();
      *const_cast<volatile uint32_t*>(&hdr->exit_count) = 0u;
      *const_cast<volatile uint64_t*>(&hdr->epoch) = e;
      for (int k = 0; k < world; ++k)
        if (k != me) st_release_sys(&ra.peer_hdr[k]->done[me], pack_flag(e, 0));
    }
  }
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    molora_residual_rmsnorm_kernel(const uint16_t* sum, uint16_t* residual, const uint16_t* weight,
                                   uint16_t* out, int64_t hidden, float eps) {
  residual_rmsnorm_rows<T, kVector>(sum, residual, weight, out, blockIdx.x, blockIdx.x + 1, hidden,
                                    eps);
}
using RmsnormFn = void (*)(const uint16_t*, uint16_t*, const uint16_t*, uint16_t*, int64_t, float);
// [bf16][vector]
const RmsnormFn kRmsnorm[2][2] = {
    {molora_residual_rmsnorm_kernel<__half, false>, molora_residual_rmsnorm_kernel<__half, true>},
    {molora_residual_rmsnorm_kernel<__nv_bfloat16, false>,
     molora_residual_rmsnorm_kernel<__nv_bfloat16, true>},
};

__global__ void molora_probe_wait(volatile uint32_t* flag, uint64_t timeout_ns, uint32_t* ok) {
  uint64_t end = globaltimer() + timeout_ns;
  while (*flag == 0 && globaltimer() < end) {
  }
  *ok = *flag;
}
__global__ void molora_probe_set(volatile uint32_t* flag) { *flag = 1; }

using AllReduceFn = void (*)(LaunchArgs);
template <typename T>
struct Kernels {
  static constexpr AllReduceFn fn[3] = {
      molora_allreduce_kernel<T, 0>, molora_allreduce_kernel<T, 1>, molora_allreduce_kernel<T, 2>};
};

}  // namespace

Status launch_all_reduce(const LaunchArgs& a, int grid_x, int grid_y, DType dtype, Kernel kernel,
                         cudaStream_t stream) {
  if (dtype != DType::kBF16 && dtype != DType::kF16)
    return Status::InvalidArgument("all-reduce kernel: dtype must be bf16 or f16");
  if (grid_x < 1 || grid_x > kMaxBlocks || grid_y < 1 || grid_y > kMaxWorld)
    return Status::Internal("all-reduce kernel: bad grid");
  const int k = static_cast<int>(kernel);
  if (k < 0 || k > 2) return Status::Internal("all-reduce kernel: bad kernel");
  if (kernel == Kernel::kOneShotResidualRmsnorm && (a.hidden <= 0 || a.hidden % 8 != 0))
    return Status::Internal("fused kernel: hidden must be a positive multiple of 8");
  AllReduceFn fn = dtype == DType::kBF16 ? Kernels<__nv_bfloat16>::fn[k] : Kernels<__half>::fn[k];
  fn<<<dim3(grid_x, grid_y), kThreads, 0, stream>>>(a);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status preload_kernels(int device) {
  int prev = -1;
  MOLORA_CUDA_CHECK(cudaGetDevice(&prev));
  MOLORA_CUDA_CHECK(cudaSetDevice(device));
  cudaFuncAttributes attr;
  cudaError_t err = cudaSuccess;
  for (int k = 0; k < 3 && err == cudaSuccess; ++k) {
    err = cudaFuncGetAttributes(&attr, Kernels<__nv_bfloat16>::fn[k]);
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, Kernels<__half>::fn[k]);
  }
  for (int k = 0; k < 4 && err == cudaSuccess; ++k)
    err = cudaFuncGetAttributes(&attr, kRmsnorm[k / 2][k % 2]);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, molora_probe_wait);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, molora_probe_set);
  cudaSetDevice(prev);
  MOLORA_CUDA_CHECK(err);
  return Status::Ok();
}

Status launch_residual_rmsnorm(const void* sum, void* residual, const void* weight, void* out,
                               int64_t rows, int64_t hidden, float eps, DType dtype,
                               cudaStream_t stream) {
  if (rows == 0) return Status::Ok();
  auto* s = static_cast<const uint16_t*>(sum);
  auto* r = static_cast<uint16_t*>(residual);
  auto* w = static_cast<const uint16_t*>(weight);
  auto* o = static_cast<uint16_t*>(out);
  const bool vec = rmsnorm_vectorised(sum, residual, weight, out, hidden);
  kRmsnorm[dtype == DType::kBF16 ? 1 : 0][vec ? 1 : 0]<<<rows, kThreads, 0, stream>>>(s, r, w, o,
                                                                                      hidden, eps);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status probe_concurrent_streams(int device, bool* concurrent) {
  // Both probe kernels must be loaded before the first is launched: under lazy loading, the
  // second launch would otherwise wait for the spinning first one to finish (a false
  // "serialised", which is what the probe reported on the H200 before this was added).
  MOLORA_RETURN_IF_ERROR(preload_kernels(device));
  MOLORA_CUDA_CHECK(cudaSetDevice(device));
  uint32_t* mem = nullptr;
  MOLORA_CUDA_CHECK(cudaMalloc(&mem, 2 * sizeof(uint32_t)));
  cudaStream_t s1 = nullptr, s2 = nullptr;
  cudaMemset(mem, 0, 2 * sizeof(uint32_t));
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaDeviceSynchronize();
  molora_probe_wait<<<1, 1, 0, s1>>>(mem, 200ull * 1000 * 1000, mem + 1);
  molora_probe_set<<<1, 1, 0, s2>>>(mem);
  cudaError_t err = cudaDeviceSynchronize();
  uint32_t ok = 0;
  if (err == cudaSuccess) err = cudaMemcpy(&ok, mem + 1, sizeof(ok), cudaMemcpyDeviceToHost);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(mem);
  MOLORA_CUDA_CHECK(err);
  *concurrent = ok != 0;
  return Status::Ok();
}

}  // namespace molora::comm
