#include "molora/info.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/cuda_util.h"
#include "molora/settings.h"
#include "molora/version.h"

#if MOLORA_HAVE_NCCL
#include <nccl.h>
#endif

#ifndef MOLORA_CUDA_ARCH_LIST
#define MOLORA_CUDA_ARCH_LIST ""
#endif

namespace molora {

BuildInfo build_info() {
  BuildInfo b;
  b.version = MOLORA_VERSION_STRING;
#if MOLORA_HAVE_CUDA
  b.cuda = true;
  b.cuda_build_version = CUDART_VERSION;
#endif
#if MOLORA_HAVE_NCCL
  b.nccl_build_version = NCCL_VERSION_CODE;
#endif
  std::stringstream ss(MOLORA_CUDA_ARCH_LIST);
  std::string a;
  while (std::getline(ss, a, ','))
    if (!a.empty()) b.architectures.push_back("sm_" + a);
  return b;
}

int gpu_count() noexcept {
#if MOLORA_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

RuntimeInfo runtime_info() {
  RuntimeInfo r;
#if MOLORA_HAVE_NCCL
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) r.nccl_version = nv;
#endif
#if MOLORA_HAVE_CUDA
  cudaRuntimeGetVersion(&r.cuda_runtime_version);
  cudaDriverGetVersion(&r.cuda_driver_version);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    r.gpu_error = cudaGetErrorString(e);
    cudaGetLastError();
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.total_memory = p.totalGlobalMem;
    g.sm_count = p.multiProcessorCount;
    r.gpus.push_back(g);
  }
  r.peer_access.assign(n, std::vector<int>(n, 1));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, i, j);
        r.peer_access[i][j] = can;
      }
  if (n == 0) r.gpu_error = "no CUDA device";
#else
  r.gpu_error = "molora was built without CUDA";
#endif
  return r;
}

static std::string version_str(int v, bool nccl) {
  if (v == 0) return "none";
  if (nccl)
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string info_json() {
  BuildInfo b = build_info();
  RuntimeInfo r = runtime_info();
  nlohmann::json j;
  j["schema"] = "molora.info/1";
  j["version"] = b.version;
  j["build"] = {{"cuda", b.cuda},
                {"architectures", b.architectures},
                {"cuda_version", version_str(b.cuda_build_version, false)},
                {"nccl_version", version_str(b.nccl_build_version, true)}};
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : r.gpus)
    gpus.push_back(
        {{"index", g.index},
         {"name", g.name},
         {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
         {"memory_bytes", g.total_memory},
         {"sm_count", g.sm_count}});
  j["runtime"] = {{"cuda_runtime", version_str(r.cuda_runtime_version, false)},
                  {"cuda_driver", version_str(r.cuda_driver_version, false)},
                  {"nccl", version_str(r.nccl_version, true)},
                  {"gpus", gpus},
                  {"gpu_error", r.gpu_error},
                  {"peer_access", r.peer_access}};
  nlohmann::json s = nlohmann::json::array();
  for (const auto& st : registered_settings())
    s.push_back({{"name", st.name},
                 {"value", get_setting(st.name)},
                 {"source", setting_source(st.name)},
                 {"help", st.help}});
  j["settings"] = s;
  return j.dump(2);
}

std::string info_text() {
  BuildInfo b = build_info();
  RuntimeInfo r = runtime_info();
  std::ostringstream o;
  o << "molora " << b.version << "\n";
  o << "build:   cuda=" << (b.cuda ? "yes" : "no") << "  archs=";
  for (size_t i = 0; i < b.architectures.size(); ++i) o << (i ? "," : "") << b.architectures[i];
  if (b.architectures.empty()) o << "none";
  o << "  cuda " << version_str(b.cuda_build_version, false) << "  nccl "
    << version_str(b.nccl_build_version, true) << "\n";
  o << "runtime: cuda runtime " << version_str(r.cuda_runtime_version, false) << "  driver "
    << version_str(r.cuda_driver_version, false) << "  nccl " << version_str(r.nccl_version, true)
    << "\n";
  if (r.gpus.empty()) o << "gpus:    none (" << r.gpu_error << ")\n";
  for (const auto& g : r.gpus)
    o << "gpu " << g.index << ":   " << g.name << "  sm_" << g.cc_major << g.cc_minor << "  "
      << g.sm_count << " SMs  " << (g.total_memory >> 20) << " MiB\n";
  if (r.gpus.size() > 1) {
    o << "peer access (row can access column):\n";
    for (size_t i = 0; i < r.peer_access.size(); ++i) {
      o << "  " << i << ":";
      for (int v : r.peer_access[i]) o << " " << v;
      o << "\n";
    }
  }
  o << "settings:\n";
  for (const auto& st : registered_settings())
    o << "  " << st.name << "=" << get_setting(st.name) << "  (" << setting_source(st.name) << ")  "
      << st.help << "\n";
  return o.str();
}

}  // namespace molora
