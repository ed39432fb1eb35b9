// molora/safetensors.h — a hardened reader of the safetensors format.
//
// File layout: 8-byte little-endian header length n, then n bytes of JSON (an object mapping a
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
// "__metadata__" object of strings), then the data buffer; offsets are relative to the buffer.
//
// Everything in a file is treated as hostile: the header length must fit in the file and under
// kMaxSafetensorsHeaderBytes, the JSON must have exactly the structure above (depth-limited SAX
// parse, no DOM), every dtype must be a known safetensors dtype, every shape's element count ×
// dtype size must equal its byte range, ranges must lie in the buffer, must not overlap and must
// tile the buffer exactly (as the reference implementation requires). Every failure is a
// Status ParseError naming the file, the tensor (when there is one) and the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "molora/common.h"
#include "molora/status.h"

namespace molora {

// Largest JSON header accepted (the reference implementation's limit is also 100 MB).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
// Most dimensions of one tensor.
constexpr int kMaxSafetensorsRank = 16;

enum class StDType : int {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// Element size in bytes of a safetensors dtype.
size_t st_dtype_size(StDType dt) noexcept;
// The dtype's name as spelled in files ("BF16", "F32", ...).
const char* st_dtype_name(StDType dt) noexcept;
// True (and *out set) for F32, F16 and BF16, the dtypes molora converts.
bool st_dtype_to_float(StDType dt, DType* out) noexcept;

struct StTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  uint64_t numel() const;
};

struct StHeader {
  uint64_t header_bytes = 0;      // n
  uint64_t data_offset = 0;       // 8 + n: where the data buffer starts in the file
  std::vector<StTensor> tensors;  // in file order
  std::vector<std::pair<std::string, std::string>> metadata;
  // Index of `name` in tensors, or -1.
  int64_t find(const std::string& name) const;
};

// Parses and validates the header of a safetensors file whose first `size` bytes are `data`
// (the whole file: the data buffer's size is size − 8 − n). `file` names the file in errors.
// Never reads outside [data, data + size) and allocates O(n) memory.
Status parse_safetensors(const uint8_t* data, size_t size, const std::string& file, StHeader* out);

// A safetensors file mapped read-only into memory (mmap) with its validated header.
class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. IoError when it cannot be opened or mapped.
  static Status open(const std::string& path, std::unique_ptr<SafetensorsFile>* out);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const StHeader& header() const { return header_; }
  size_t file_size() const { return size_; }
  // Bytes of tensor `t` (a validated range inside the mapping).
  const uint8_t* data(const StTensor& t) const { return base_ + header_.data_offset + t.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  StHeader header_;
};

}  // namespace molora
