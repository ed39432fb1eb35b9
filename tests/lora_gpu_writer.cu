// A kernel for the lora GPU suite's ordering tests: a predecessor that lets the next kernel
// launch at once (griddepcontrol.launch_dependents, as a GEMM using dependent launch may), then
// writes late. A kernel after it that read its inputs before waiting would read them stale.
#include <cuda_runtime.h>

#include <cstdint>

#include "lora_gpu_writer.h"

namespace lora_test {
namespace {

__global__ void late_writer(uint4* dst, const uint4* src, size_t n16, unsigned long long wait_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < wait_ns);
  for (size_t i = threadIdx.x + size_t(blockIdx.x) * blockDim.x; i < n16;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

cudaError_t launch_late_writer(void* dst, const void* src, size_t bytes, double wait_us,
                               cudaStream_t stream) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(src) % 16 != 0)
    return cudaErrorInvalidValue;
  late_writer<<<1, 256, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src),
                                     bytes / 16, static_cast<unsigned long long>(wait_us * 1e3));
  return cudaGetLastError();
}

}  // namespace lora_test
