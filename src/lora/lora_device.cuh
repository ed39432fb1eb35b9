// Device helpers shared by the lora kernels (lora.cu, lora_stream.cu): 16-bit <-> float
// conversion per storage type, the 8-element dot product of two 16-byte vectors, and the mask
// of a row's last vector past rank r.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

namespace molora::lora::detail {

// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
// serialization may start while the kernel before it in the stream is still running. Every lora
// kernel lets the next one start at once (pdl_trigger: the next one waits for this one in
// pdl_wait before it touches memory) and waits for the one before it before its first global
// read or write. Launched without the attribute both are no-ops.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kern<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization
// when `pdl` (the plan's choice); a launch the driver refuses with the attribute goes again
// without it.
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(bool pdl, void (*kern)(KArgs...), unsigned grid, unsigned block,
                          size_t smem, cudaStream_t stream, Args&&... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...) == cudaSuccess)
      return cudaSuccess;
    cudaGetLastError();
  }
  kern<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

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

// The 8 elements of a 16-byte vector as floats.
template <typename T>
__device__ __forceinline__ void to8(const uint4& v, float (&f)[8]) {
  const float2 a = Cvt<T>::two(v.x), b = Cvt<T>::two(v.y), c = Cvt<T>::two(v.z),
               d = Cvt<T>::two(v.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

// sum_i w[i] * t[i] over the 8 elements of w (16-bit) and t (fp32: t0 = elements 0..3, t1 =
// 4..7), in element order.
template <typename T>
__device__ __forceinline__ float dot8f(const uint4& w, const float4& t0, const float4& t1) {
  const float2 w0 = Cvt<T>::two(w.x), w1 = Cvt<T>::two(w.y), w2 = Cvt<T>::two(w.z),
               w3 = Cvt<T>::two(w.w);
  float s = w0.x * t0.x;
  s = fmaf(w0.y, t0.y, s);
  s = fmaf(w1.x, t0.z, s);
  s = fmaf(w1.y, t0.w, s);
  s = fmaf(w2.x, t1.x, s);
  s = fmaf(w2.y, t1.y, s);
  s = fmaf(w3.x, t1.z, s);
  s = fmaf(w3.y, t1.w, s);
  return s;
}
// sum_i w[i] * x[i] over the 8 elements, in element order.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  const float2 x0 = Cvt<T>::two(x.x), x1 = Cvt<T>::two(x.y), x2 = Cvt<T>::two(x.z),
               x3 = Cvt<T>::two(x.w);
  return dot8f<T>(w, make_float4(x0.x, x0.y, x1.x, x1.y), make_float4(x2.x, x2.y, x3.x, x3.y));
}

// The 16-bit lanes of a row's last 16-byte vector that hold elements < r (r % 8 of them, or
// all 8): AND it into that vector so whatever the padding past r_s holds is ignored.
__device__ __forceinline__ uint4 tail_mask(int r) {
  const int tail = r - ((r + 7) / 8 - 1) * 8;  // 1..8
  auto word = [tail](int i) {                  // elements 2i, 2i+1
    return tail > 2 * i + 1 ? ~0u : tail > 2 * i ? 0xffffu : 0u;
  };
  return make_uint4(word(0), word(1), word(2), word(3));
}

}  // namespace molora::lora::detail
