// Internal helpers of the lora part (not a public header): host fp16/bf16 conversion, the
// validation shared by the CPU and CUDA paths, and the kernel launch table.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "molora/lora.h"

namespace molora::lora::detail {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// Reads element i of a host array of dtype f32/f16/bf16 as double.
inline double load(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}
inline void store(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      break;
    default:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
      break;
  }
}

inline int round8(int r) { return (r + 7) / 8 * 8; }

// Kernel arguments (one struct for both ops; pointers are device memory).
struct KernelArgs {
  const void* w = nullptr;   // A [S,E,r_max,K] or B [S,E,N,r_max]
  const void* in = nullptr;  // x [T,K] or t [P,r_max]
  void* out = nullptr;       // t [P,r_max] or y [P,N]
  const int32_t* ranks = nullptr;
  const float* scales = nullptr;
  Routing rt;
  int64_t T = 0, P = 0;
  int k = 0, S = 0, E = 0, r_max = 0;
  int64_t dim = 0;  // K (shrink) or N (expand)
  int aligned = 0, block = 0;
  int64_t sorted_len = 0;
  int mode = 0;  // kModePairs, kModeGrouped or kModeAligned
  int tile = 0, chunks = 0;
};

// How a CTA finds its group (see lora.cu).
constexpr int kModePairs = 0;    // plain routing, one pair per group (P > kGroupCap)
constexpr int kModeGrouped = 1;  // plain routing, pairs of one virtual expert, led by the first
constexpr int kModeAligned = 2;  // the blocks of the align output
// Plain routing groups pairs when P <= this (the member list lives in shared memory).
constexpr int kGroupCap = 4096;
// Pairs per pass: shrink accumulators per thread, expand t rows staged in shared memory.
constexpr int kShrinkMembers = 4;
constexpr int kExpandMembers = 8;

// Launches the planned kernel (lora.cu). dtype kF16 or kBF16.
Status launch(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream);
// CTAs of the kernel (U = unroll) that fit on one SM with `smem` dynamic shared memory (0 if
// unknown).
int max_ctas_per_sm(Op op, DType dt, int unroll, size_t smem);
// Threads per CTA of each kernel.
constexpr int kThreads = 256;
// Dynamic shared memory of a launch (the member list of one group).
size_t smem_bytes(int mode, int64_t P, int block);

}  // namespace molora::lora::detail
