// The lora GPU suite's late writer (lora_gpu_writer.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace lora_test {

// Launches one CTA on `stream` that first lets the next kernel launch
// (griddepcontrol.launch_dependents), then spins for wait_us and only then copies `bytes`
// (a multiple of 16, 16-byte aligned) from src to dst.
cudaError_t launch_late_writer(void* dst, const void* src, size_t bytes, double wait_us,
                               cudaStream_t stream);

}  // namespace lora_test
