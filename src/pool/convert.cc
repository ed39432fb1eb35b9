#include "pool/convert.h"

#include <cmath>

#include "pool/convert_kernels.h"

namespace molora::pool {

// The scalar references (the specification of every conversion loop).
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

#if MOLORA_POOL_AVX2
ConvertRowsFn convert_rows_avx2(int s, int d);  // convert_avx2.cc
#endif

namespace {

int dtype_index(DType dt) { return dt == DType::kF32 ? 0 : dt == DType::kF16 ? 1 : 2; }

bool avx2_available() {
#if MOLORA_POOL_AVX2
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

bool force_baseline = false;

ConvertRowsFn pick(DType src_dt, DType dst_dt) {
  const int s = dtype_index(src_dt), d = dtype_index(dst_dt);
#if MOLORA_POOL_AVX2
  if (!force_baseline && avx2_available()) return convert_rows_avx2(s, d);
#endif
  return convert_rows_table(s, d);
}

}  // namespace

const char* convert_isa() { return !force_baseline && avx2_available() ? "avx2" : "baseline"; }

bool convert_force_baseline(bool baseline) {
  force_baseline = baseline;
  return baseline || avx2_available();
}

void convert_rows(DType src_dt, const void* src, int64_t src_row_bytes, DType dst_dt, void* dst,
                  int64_t dst_stride, int64_t rows, int64_t cols, float mul) {
  if (rows <= 0) return;
  const size_t es = dtype_size(dst_dt);
  if (src_dt == dst_dt && mul == 1.0f) {  // a copy per row (bit-exact, NaN payloads kept)
    const uint8_t* s = static_cast<const uint8_t*>(src);
    uint8_t* d = static_cast<uint8_t*>(dst);
    const size_t row = static_cast<size_t>(cols) * es, pad = (dst_stride - cols) * es;
    if (row == static_cast<size_t>(src_row_bytes) && pad == 0) {
      std::memcpy(d, s, row * static_cast<size_t>(rows));
      return;
    }
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(d + i * dst_stride * es, s + i * src_row_bytes, row);
      if (pad) std::memset(d + i * dst_stride * es + row, 0, pad);
    }
    return;
  }
  const ConvertRowsFn f = pick(src_dt, dst_dt);
  if (dst_stride == cols && src_row_bytes == cols * static_cast<int64_t>(dtype_size(src_dt))) {
    f(static_cast<const uint8_t*>(src), 0, dst, 0, 1, cols * rows, mul);  // one long row
    return;
  }
  f(static_cast<const uint8_t*>(src), src_row_bytes, dst, dst_stride, rows, cols, mul);
}

void convert(DType src_dt, const void* src, DType dst_dt, void* dst, int64_t n, float mul) {
  if (n <= 0) return;
  convert_rows(src_dt, src, n * static_cast<int64_t>(dtype_size(src_dt)), dst_dt, dst, n, 1, n,
               mul);
}

}  // namespace molora::pool
