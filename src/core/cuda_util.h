// Internal helpers for host code that calls the CUDA runtime. Not a public header.
#pragma once

#include "molora/common.h"
#include "molora/status.h"

#if MOLORA_HAVE_CUDA
#include <cuda_runtime_api.h>

// Returns a Status naming the call and file:line from the enclosing function on CUDA failure.
#define MOLORA_CUDA_CHECK(call)                                                               \
  do {                                                                                        \
    cudaError_t molora_err_ = (call);                                                         \
    if (molora_err_ != cudaSuccess)                                                           \
      return ::molora::cuda_status(static_cast<int>(molora_err_), #call, __FILE__, __LINE__); \
  } while (0)
#endif

namespace molora {

// Ok when `ptr` is memory the GPU can read/write (device or managed memory); InvalidArgument
// naming `arg` when it is host memory. A null pointer is allowed only when `bytes` is 0.
Status check_device_pointer(const void* ptr, size_t bytes, const char* arg);
// Ok when a CUDA device is usable; Unavailable (with the reason) otherwise.
Status require_gpu();

}  // namespace molora
