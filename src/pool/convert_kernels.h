// Branch-free element conversions of the pool (f32 / f16 / bf16, round to nearest even, NaN
// kept NaN and quieted) written so that the compiler vectorises the row loops. Included by
// convert.cc (baseline ISA) and, on x86-64, by convert_avx2.cc (compiled with -mavx2); the
// anonymous namespace gives each translation unit its own copy (no ODR clash between ISAs).
// Every function here equals its scalar reference in convert.cc bit for bit (tests/pool_test.cc
// checks all 2^16 half and bf16 inputs and random f32 bit patterns).
#pragma once

#include <cstdint>
#include <cstring>

namespace molora::pool {
namespace {

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f16 bits → f32. Normal and inf/NaN by rebiasing; subnormals by an exact float subtraction
// (m·2^-24 = (2^-14 + m·2^-24) − 2^-14).
inline float vhalf_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa at f32 place
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23);  // rebias 15 → 127
  const uint32_t infnan = (em + (224u << 23)) | ((em & 0x7fffffu) ? 0x400000u : 0u);  // quiet NaN
  const float sub = u2f(em + (113u << 23)) - u2f(113u << 23);
  uint32_t u = exp == 0x0f800000u ? infnan : normal;
  u = exp == 0 ? f2u(sub) : u;
  return u2f(u | sign);
}

// f32 → f16 bits, round to nearest even; overflow → inf; NaN → quiet NaN keeping the payload's
// top bits. Subnormal results by a float addition that rounds at 2^-24 (0.5 has ulp 2^-24).
inline uint16_t vfloat_to_half(float f) {
  const uint32_t u = f2u(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  const uint32_t sub = f2u(u2f(a) + 0.5f) - 0x3f000000u;
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;
  r = a > 0x7f800000u ? nan : r;
  return static_cast<uint16_t>(r | sign);
}

inline float vbf16_to_float(uint16_t h) { return u2f(static_cast<uint32_t>(h) << 16); }

inline uint16_t vfloat_to_bf16(float f) {
  const uint32_t u = f2u(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Element types: raw storage and the float conversions.
struct F32 {
  using T = float;
  static float load(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  static T store(float f) { return f; }
};
struct F16 {
  using T = uint16_t;
  static float load(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return vhalf_to_float(h);
  }
  static T store(float f) { return vfloat_to_half(f); }
};
struct BF16 {
  using T = uint16_t;
  static float load(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return vbf16_to_float(h);
  }
  static T store(float f) { return vfloat_to_bf16(f); }
};

// rows × cols elements: row i of src starts at byte src + i·src_stride_bytes (may be
// unaligned), row i of dst at dst + i·dst_stride (elements of D, aligned); dst columns
// [cols, dst_stride) become zero. dst[i][j] = D(S(src[i][j]) · mul) (no multiply when mul == 1).
template <class S, class D>
void convert_rows_t(const uint8_t* src, int64_t src_stride_bytes, typename D::T* dst,
                    int64_t dst_stride, int64_t rows, int64_t cols, float mul) {
  constexpr int64_t ss = sizeof(typename S::T);
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* __restrict s = src + i * src_stride_bytes;
    typename D::T* __restrict d = dst + i * dst_stride;
    if (mul == 1.0f) {
      for (int64_t j = 0; j < cols; ++j) d[j] = D::store(S::load(s + j * ss));
    } else {
      for (int64_t j = 0; j < cols; ++j) d[j] = D::store(S::load(s + j * ss) * mul);
    }
    for (int64_t j = cols; j < dst_stride; ++j) d[j] = 0;
  }
}

// The 9 (source, destination) pairs, indexed [src][dst] with 0 = f32, 1 = f16, 2 = bf16.
using ConvertRowsFn = void (*)(const uint8_t*, int64_t, void*, int64_t, int64_t, int64_t, float);

template <class S, class D>
void convert_rows_erased(const uint8_t* src, int64_t sst, void* dst, int64_t dst_stride,
                         int64_t rows, int64_t cols, float mul) {
  convert_rows_t<S, D>(src, sst, static_cast<typename D::T*>(dst), dst_stride, rows, cols, mul);
}

template <class S>
constexpr ConvertRowsFn row_fn(int d) {
  return d == 0   ? &convert_rows_erased<S, F32>
         : d == 1 ? &convert_rows_erased<S, F16>
                  : &convert_rows_erased<S, BF16>;
}

inline ConvertRowsFn convert_rows_table(int s, int d) {
  return s == 0 ? row_fn<F32>(d) : s == 1 ? row_fn<F16>(d) : row_fn<BF16>(d);
}

}  // namespace
}  // namespace molora::pool
