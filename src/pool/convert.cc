#include "pool/convert.h"

#include <cmath>

namespace molora::pool {

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13 | (man ? 0x400000u : 0u);
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to ≥ 65520 → inf (and inf)
  if (a < 0x38800000u) {                        // below the smallest normal half: subnormal/zero
    if (a < 0x33000000u) return sign;           // < 2^-25 → 0 (2^-25 exactly ties to even 0)
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m·2^(e−150); half subnormal unit 2^-24 → m >> (126−e)
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 → 15 and round
  return sign | static_cast<uint16_t>(r >> 13);
}

namespace {

template <typename Load>
void store_all(Load load, DType dst_dt, void* dst, int64_t n, float mul) {
  if (dst_dt == DType::kF32) {
    float* d = static_cast<float*>(dst);
    if (mul == 1.0f)
      for (int64_t i = 0; i < n; ++i) d[i] = load(i);
    else
      for (int64_t i = 0; i < n; ++i) d[i] = load(i) * mul;
  } else if (dst_dt == DType::kBF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (mul == 1.0f)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(load(i));
    else
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(load(i) * mul);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(mul == 1.0f ? load(i) : load(i) * mul);
  }
}

}  // namespace

void convert(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, float mul) {
  if (n <= 0) return;
  if (src_dt == dst_dt && mul == 1.0f) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_dt));
    return;
  }
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (src_dt) {
    case DType::kF32:
      store_all(
          [s](int64_t i) {
            float f;
            std::memcpy(&f, s + 4 * i, 4);
            return f;
          },
          dst_dt, dst, n, mul);
      break;
    case DType::kBF16:
      store_all(
          [s](int64_t i) {
            uint16_t h;
            std::memcpy(&h, s + 2 * i, 2);
            return bf16_to_float(h);
          },
          dst_dt, dst, n, mul);
      break;
    default:
      store_all(
          [s](int64_t i) {
            uint16_t h;
            std::memcpy(&h, s + 2 * i, 2);
            return half_to_float(h);
          },
          dst_dt, dst, n, mul);
      break;
  }
}

}  // namespace molora::pool
