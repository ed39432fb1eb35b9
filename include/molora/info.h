// molora/info.h — what this build and this machine offer (`molora info`, molora.info()).
#pragma once

#include <string>
#include <vector>

#include "molora/status.h"

namespace molora {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;
  int sm_count = 0;
};

struct BuildInfo {
  std::string version;
  bool cuda = false;                       // built with device code
  std::vector<std::string> architectures;  // e.g. {"sm_90a", "sm_100a", "sm_103a"}
  int cuda_build_version = 0;              // CUDART_VERSION at build time (0 without CUDA)
  int nccl_build_version = 0;              // NCCL_VERSION_CODE at build time (0 without NCCL)
};

struct RuntimeInfo {
  int cuda_runtime_version = 0;  // cudaRuntimeGetVersion, 0 if unavailable
  int cuda_driver_version = 0;   // cudaDriverGetVersion, 0 when no driver
  int nccl_version = 0;          // ncclGetVersion, 0 if unavailable
  std::string gpu_error;         // why no GPU is seen ("" when GPUs are listed)
  std::vector<GpuInfo> gpus;
  std::vector<std::vector<int>>
      peer_access;  // [i][j] = cudaDeviceCanAccessPeer(i, j); 1 on diagonal
};

BuildInfo build_info();
// Never fails: what cannot be queried is reported in gpu_error / zeros.
RuntimeInfo runtime_info();
// Number of GPUs usable now (0 without CUDA, driver or device).
int gpu_count() noexcept;
// Human-readable report: build, runtime, GPUs, peer matrix, settings (what `molora info` prints).
std::string info_text();
// The same as a JSON object (what `molora info --json` prints and molora.info() parses).
std::string info_json();

}  // namespace molora

namespace molora {
// Launches a small kernel of this library on `device` and checks its output: proves the device
// code was built for this GPU. Unavailable without CUDA or GPU.
Status device_selftest(int device = 0);
}  // namespace molora
