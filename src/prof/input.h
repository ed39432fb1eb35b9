// Byte sources for the trace reader: a file or a memory buffer, raw or gzip (zlib inflate as a
// stream, multi-member). Internal to molora_prof.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "molora/status.h"

namespace molora::prof::detail {

class Input {
 public:
  virtual ~Input() = default;
  // Fills up to `cap` bytes of uncompressed data; *got = 0 only at the end of the data.
  virtual Status read(char* dst, size_t cap, size_t* got) = 0;
  // Compressed (or raw) bytes consumed so far, and the total (0 if unknown).
  virtual uint64_t consumed() const = 0;
  virtual uint64_t total() const = 0;
  // Set when a gzip stream ended before its trailer (the data read so far is still good).
  bool truncated = false;
  std::string warning;
};

// Opens `path`; gzip is detected by its magic bytes, not the file name.
Status open_file(const std::string& path, std::unique_ptr<Input>* out);
// Wraps a memory buffer (not copied; it must outlive the Input).
std::unique_ptr<Input> open_memory(const void* data, size_t size);

}  // namespace molora::prof::detail
