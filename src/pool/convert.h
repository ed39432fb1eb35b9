// Host dtype conversion of the pool (round to nearest even, NaN kept NaN), exact where the
// target holds the source (same dtype, f16/bf16 → f32). The scalar functions below are the
// reference; convert()/convert_rows() run vectorised loops (convert_kernels.h) that equal them
// bit for bit, with an AVX2 build of the loops chosen at run time on x86-64.
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

// A rows × cols block: source row i at byte src + i·src_row_bytes (may be unaligned),
// destination row i at dst + i·dst_stride elements; destination columns [cols, dst_stride)
// are set to zero. Same conversion as convert().
void convert_rows(DType src_dt, const void* src, int64_t src_row_bytes, DType dst_dt, void* dst,
                  int64_t dst_stride, int64_t rows, int64_t cols, float mul = 1.0f);

// Which build of the loops runs: "avx2" (x86-64 with AVX2, the default there) or "baseline".
const char* convert_isa();
// Tests and benchmarks: use the baseline build even where AVX2 exists (false: back to the
// default). Not thread-safe; returns false when AVX2 was requested but is not available.
bool convert_force_baseline(bool baseline);

}  // namespace molora::pool
