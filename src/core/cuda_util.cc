#include "core/cuda_util.h"

#include <string>

#if MOLORA_HAVE_NCCL
#include <nccl.h>
#endif

namespace molora {

Status cuda_status(int err, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed at " + file + ":" + std::to_string(line);
#if MOLORA_HAVE_CUDA
  msg += ": " + std::string(cudaGetErrorName(static_cast<cudaError_t>(err))) + " (" +
         cudaGetErrorString(static_cast<cudaError_t>(err)) + ")";
#else
  msg += ": error " + std::to_string(err);
#endif
  return Status(StatusCode::kCudaError, msg);
}

Status nccl_status(int res, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed at " + file + ":" + std::to_string(line);
#if MOLORA_HAVE_NCCL
  msg += ": " + std::string(ncclGetErrorString(static_cast<ncclResult_t>(res)));
#else
  msg += ": error " + std::to_string(res);
#endif
  return Status(StatusCode::kNcclError, msg);
}

#if MOLORA_HAVE_CUDA
Status check_device_pointer(const void* ptr, size_t bytes, const char* arg) {
  if (ptr == nullptr) {
    if (bytes == 0) return Status::Ok();
    return Status::InvalidArgument(std::string(arg) + " is null");
  }
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error
    return Status::InvalidArgument(std::string(arg) + " is not CUDA memory (" +
                                   cudaGetErrorString(e) + ")");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return Status::InvalidArgument(std::string(arg) +
                                   " is host memory; the CUDA path needs device memory");
  return Status::Ok();
}

Status require_gpu() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (n == 0) return Status::Unavailable("no CUDA device");
  return Status::Ok();
}
#else
Status check_device_pointer(const void*, size_t, const char* arg) {
  return Status::Unavailable(std::string("molora was built without CUDA; ") + arg +
                             " cannot be device memory");
}
Status require_gpu() { return Status::Unavailable("molora was built without CUDA"); }
#endif

}  // namespace molora
