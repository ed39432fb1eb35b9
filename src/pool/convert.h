// Host dtype conversion of the pool (round to nearest even, NaN kept NaN), exact where the
// target holds the source (same dtype, f16/bf16 → f32).
#pragma once

#include <cstdint>
#include <cstring>

#include "molora/common.h"

namespace molora::pool {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// dst[i] = convert(src[i] * mul) for n elements; src may be unaligned. mul == 1 skips the
// multiply (and same-dtype is a memcpy, bit-exact).
void convert(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, float mul = 1.0f);

}  // namespace molora::pool
