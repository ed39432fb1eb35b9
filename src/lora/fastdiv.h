// Division by a divisor fixed for a launch, as one multiply-high, an add and a shift (internal to
// the lora part). The stream kernels divide by run-time values (experts, top-k, block size,
// chunks, pieces, stages, grid, warps) on the path before their first weight copy and once per
// task; each `/` by a run-time value is ~25 dependent instructions, and a warp ran ~8 of them
// before its first copy (bench/NOTES.md "lora v0.10"). The host makes one FastDiv per divisor
// and passes it in the kernel arguments.
//
// Method (Granlund and Montgomery, "round-up" multiplier): for 1 <= d < 2^31, s = ceil(log2 d)
// and m = floor(2^32 (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s for every
// 0 <= n < 2^31 (mulhi(n, m) <= n, so the sum fits 32 bits). tests/lora_test.cc checks it
// against `/` for edge and random values.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MOLORA_FD_HD __host__ __device__
#else
#define MOLORA_FD_HD
#endif

namespace molora::lora::detail {

struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;

  FastDiv() = default;
  // d in [1, 2^31); anything else is taken as 1 (the kernels' divisors are checked before).
  explicit FastDiv(int64_t divisor) {
    d = (divisor >= 1 && divisor < (int64_t{1} << 31)) ? static_cast<uint32_t>(divisor) : 1u;
    s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }
  // n / d for 0 <= n < 2^31.
  MOLORA_FD_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return (__umulhi(n, m) + n) >> s;
#else
    return (static_cast<uint32_t>((uint64_t{n} * m) >> 32) + n) >> s;
#endif
  }
  // n % d for 0 <= n < 2^31.
  MOLORA_FD_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

}  // namespace molora::lora::detail

#undef MOLORA_FD_HD
