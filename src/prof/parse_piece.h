// Parses one piece of the traceEvents array ("[" event, event, ... "]") with simdjson On-Demand
// into the events the analyses keep. Internal to molora_prof.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "molora/prof.h"

namespace molora::prof::detail {

// Interned strings: open addressing over string_view keys (no allocation per lookup).
class NameTable {
 public:
  int32_t intern(std::string_view s);
  std::vector<std::string> names;

 private:
  std::vector<int32_t> slots_;
  void grow();
};

struct PieceResult {
  NameTable names;
  std::vector<GpuEvent> kernels, memcpys, memsets;
  std::vector<CpuSpan> runtime, annotations;
  uint64_t events = 0;
  Status status;
};

// `data` points at "[" ... "]" of `len` bytes with at least 64 readable bytes after it.
// `base` is the offset of data[1] in the whole uncompressed stream (for error messages).
void parse_piece(const char* data, size_t len, uint64_t base, PieceResult* out);

}  // namespace molora::prof::detail
