// A minimal safetensors writer (header-only) for tests and benchmarks: writes files exactly as
// the reference implementation lays them out (header padded with spaces to 8 bytes).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace molora::pool {

struct StWriteTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The header of `ts`; `sizes` (optional) gives each tensor's byte count instead of bytes.size(),
// so a caller can learn the header (and file size) before it generates the data.
inline std::string st_header_json(const std::vector<StWriteTensor>& ts,
                                  const std::vector<uint64_t>* sizes = nullptr) {
  std::string h = "{";
  uint64_t off = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    const uint64_t nb = sizes ? (*sizes)[i] : t.bytes.size();
    h += (i ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" + t.dtype +
         "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) h += (d ? "," : "") + std::to_string(t.shape[d]);
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + nb) + "]}";
    off += nb;
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  return h;
}

// Writes header `json` (taken as is) and `data`; returns false on an I/O error.
inline bool write_raw_safetensors(const std::string& path, const std::string& json,
                                  const std::vector<uint8_t>& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  uint64_t n = json.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 &&
            std::fwrite(json.data(), 1, json.size(), f) == json.size() &&
            (data.empty() || std::fwrite(data.data(), 1, data.size(), f) == data.size());
  return std::fclose(f) == 0 && ok;
}

inline bool write_safetensors(const std::string& path, const std::vector<StWriteTensor>& ts) {
  std::vector<uint8_t> data;
  for (const auto& t : ts) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  return write_raw_safetensors(path, st_header_json(ts), data);
}

}  // namespace molora::pool
