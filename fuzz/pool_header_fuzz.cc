// libFuzzer target: the safetensors header parser on arbitrary bytes (the whole "file").
// Built by tests/extra/pool_fuzz.sh with clang -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>

#include "molora/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  molora::StHeader h;
  molora::Status s = molora::parse_safetensors(data, size, "fuzz", &h);
  if (s.ok()) {
    // Every accepted range lies inside the buffer: touch its first and last byte.
    volatile uint8_t sink = 0;
    for (const auto& t : h.tensors) {
      if (t.end > size - h.data_offset || t.begin > t.end) __builtin_trap();
      if (t.end > t.begin) sink ^= data[h.data_offset + t.begin] ^ data[h.data_offset + t.end - 1];
    }
    (void)sink;
  }
  return 0;
}
