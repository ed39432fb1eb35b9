// What the CUDA benchmarks of bench/ share (bench_align, bench_comm): a CUDA call that must
// succeed, and the device-to-device copy bandwidth each prints its numbers against.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

// Exits with the call, its error and the line when a CUDA call fails.
#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace molora::bench {

// GB/s of cudaMemcpyAsync device to device, 256 MiB ten times after one warm-up copy, bytes
// read + written (the "copy bandwidth" the benchmarks' % columns divide by).
inline double copy_bandwidth_gbs() {
  const size_t n = size_t{256} << 20;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * n * 10 / (ms * 1e-3) / 1e9;
}

}  // namespace molora::bench
