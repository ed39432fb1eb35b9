// A device self-test: proves the library's device code loads and runs on this GPU (the
// architecture it was built for matches), used by `molora info --selftest` and the GPU tests.
#include <cuda_runtime.h>

#include <vector>

#include "core/cuda_util.h"
#include "molora/info.h"

namespace molora {
namespace {
__global__ void molora_selftest_kernel(unsigned* out, unsigned n, unsigned seed) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 2654435761u ^ seed;
}
}  // namespace

Status device_selftest(int device) {
  MOLORA_RETURN_IF_ERROR(require_gpu());
  MOLORA_CUDA_CHECK(cudaSetDevice(device));
  const unsigned n = 4099, seed = 0x9e3779b9u;
  unsigned* d = nullptr;
  MOLORA_CUDA_CHECK(cudaMalloc(&d, n * sizeof(unsigned)));
  molora_selftest_kernel<<<(n + 255) / 256, 256>>>(d, n, seed);
  std::vector<unsigned> h(n);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(h.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) return cuda_status(e, "molora_selftest_kernel", __FILE__, __LINE__);
  for (unsigned i = 0; i < n; ++i)
    if (h[i] != (i * 2654435761u ^ seed))
      return Status::Internal("device self-test wrote a wrong value at " + std::to_string(i));
  return Status::Ok();
}

}  // namespace molora
