// What the libFuzzer targets in this folder share: a reader that turns the input bytes into
// arguments (edge values or small ones), the integer extremes they pick from, and the trap a
// broken invariant ends the run with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace molora::fuzz {

struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {  // 0 once the input is used up
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  // One of the edge values, or (past them) a small value from the next byte: a multiple of
  // `step` in [0, small_max].
  int64_t pick(std::initializer_list<int64_t> edges, int64_t small_max, int64_t step = 1) {
    const uint8_t c = u8();
    if (c < edges.size()) return edges.begin()[c];
    return small_max > 0 ? static_cast<int64_t>(u8()) % (small_max / step + 1) * step : 0;
  }
};

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();

[[noreturn]] inline void fail() { __builtin_trap(); }

}  // namespace molora::fuzz
