// Programmatic dependent launch (sm_90), shared by the kernels that use it (align, lora).
//
// A kernel launched with programmatic stream serialization may start while the kernel before it
// in the stream is still running. Such a kernel calls pdl_wait() before its first global read or
// write (griddepcontrol.wait returns once the kernel before it has finished and its writes are
// visible), so the stream order of memory is kept whatever comes before or after. pdl_trigger()
// lets the next kernel of the stream start launching (it too waits in its own pdl_wait before
// touching memory). Launched without the attribute both are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace molora::pdl {

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
// when `pdl`; a launch the driver refuses with the attribute goes again without it.
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

}  // namespace molora::pdl
