// The safetensors header parser: a depth-bounded SAX walk (nlohmann_json) that accepts exactly
// the structure of the format and builds no DOM, then range checks. Kept free of everything but
// molora::Status so that the libFuzzer build (fuzz/pool_header_fuzz.cc) compiles only this file.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "molora/safetensors.h"

namespace molora {

namespace {

struct DTypeName {
  const char* name;
  StDType dt;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {"BOOL", StDType::kBool, 1},      {"U8", StDType::kU8, 1},          {"I8", StDType::kI8, 1},
    {"F8_E5M2", StDType::kF8E5M2, 1}, {"F8_E4M3", StDType::kF8E4M3, 1}, {"I16", StDType::kI16, 2},
    {"U16", StDType::kU16, 2},        {"F16", StDType::kF16, 2},        {"BF16", StDType::kBF16, 2},
    {"I32", StDType::kI32, 4},        {"U32", StDType::kU32, 4},        {"F32", StDType::kF32, 4},
    {"F64", StDType::kF64, 8},        {"I64", StDType::kI64, 8},        {"U64", StDType::kU64, 8},
};

using json = nlohmann::json;

// Accepts {"name": {"dtype": s, "shape": [u...], "data_offsets": [u, u]}, ...,
//          "__metadata__": {"k": "v", ...}} and nothing else.
class HeaderSax {
 public:
  explicit HeaderSax(StHeader* out) : out_(out) {}

  std::string error;  // first error, "" when none

  bool null() { return fail("null value"); }
  bool boolean(bool) { return fail("boolean value"); }
  bool number_integer(json::number_integer_t v) {
    if (v < 0) return fail("negative number " + std::to_string(v));
    return number(static_cast<uint64_t>(v));
  }
  bool number_unsigned(json::number_unsigned_t v) { return number(v); }
  bool number_float(json::number_float_t, const json::string_t& s) {
    return fail("non-integer number " + s.substr(0, 32));
  }
  bool binary(json::binary_t&) { return fail("binary value"); }
  bool string(json::string_t& v) {
    if (state_ == kMetaValue) {
      out_->metadata.emplace_back(std::move(meta_key_), std::move(v));
      state_ = kMeta;
      return true;
    }
    if (state_ == kTensorValue && field_ == kDtype) {
      for (const auto& d : kDTypes)
        if (v == d.name) {
          cur_.dtype = d.dt;
          have_ |= 1;
          state_ = kTensor;
          return true;
        }
      return fail("unknown dtype \"" + v.substr(0, 32) + "\"");
    }
    return fail("unexpected string");
  }
  bool start_object(std::size_t) {
    if (state_ == kStart) {
      state_ = kTop;
      return true;
    }
    if (state_ == kTopValue) {
      if (is_meta_) {
        if (seen_meta_) return fail("duplicate __metadata__");
        seen_meta_ = true;
        state_ = kMeta;
      } else {
        cur_ = StTensor();
        cur_.name = std::move(key_);
        have_ = 0;
        state_ = kTensor;
      }
      return true;
    }
    return fail("unexpected object");
  }
  bool key(json::string_t& k) {
    if (state_ == kTop) {
      is_meta_ = (k == "__metadata__");
      key_ = std::move(k);
      state_ = kTopValue;
      return true;
    }
    if (state_ == kMeta) {
      meta_key_ = std::move(k);
      state_ = kMetaValue;
      return true;
    }
    if (state_ == kTensor) {
      int bit;
      if (k == "dtype") {
        field_ = kDtype;
        bit = 1;
      } else if (k == "shape") {
        field_ = kShape;
        bit = 2;
      } else if (k == "data_offsets") {
        field_ = kOffsets;
        bit = 4;
      } else {
        return fail("unknown field \"" + k.substr(0, 32) + "\"");
      }
      if (seen_fields_ & bit) return fail("duplicate field \"" + k + "\"");
      seen_fields_ |= bit;
      state_ = kTensorValue;
      return true;
    }
    return fail("unexpected key");
  }
  bool end_object() {
    if (state_ == kMeta) {
      state_ = kTop;
      return true;
    }
    if (state_ == kTensor) {
      if (have_ != 7) return fail("needs dtype, shape and data_offsets");
      out_->tensors.push_back(std::move(cur_));
      seen_fields_ = 0;
      state_ = kTop;
      return true;
    }
    if (state_ == kTop) {
      state_ = kDone;
      return true;
    }
    return fail("unexpected end of object");
  }
  bool start_array(std::size_t) {
    if (state_ == kTensorValue && (field_ == kShape || field_ == kOffsets)) {
      state_ = kArray;
      count_ = 0;
      return true;
    }
    return fail("unexpected array");
  }
  bool end_array() {
    if (state_ != kArray) return fail("unexpected end of array");
    if (field_ == kShape) {
      have_ |= 2;
    } else {
      if (count_ != 2) return fail("data_offsets needs 2 numbers");
      have_ |= 4;
    }
    state_ = kTensor;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    if (error.empty())
      error = "bad JSON in header at byte " + std::to_string(8 + position) + ": " + e.what();
    return false;
  }

 private:
  enum State { kStart, kTop, kTopValue, kMeta, kMetaValue, kTensor, kTensorValue, kArray, kDone };
  enum Field { kDtype, kShape, kOffsets };

  bool number(uint64_t v) {
    if (state_ != kArray) return fail("unexpected number");
    if (field_ == kShape) {
      if (cur_.shape.size() >= static_cast<size_t>(kMaxSafetensorsRank))
        return fail("more than " + std::to_string(kMaxSafetensorsRank) + " dimensions");
      if (v > (uint64_t{1} << 62)) return fail("dimension too large");
      cur_.shape.push_back(static_cast<int64_t>(v));
    } else {
      if (count_ >= 2) return fail("data_offsets needs 2 numbers");
      (count_ == 0 ? cur_.begin : cur_.end) = v;
    }
    ++count_;
    return true;
  }
  bool fail(const std::string& what) {
    if (error.empty()) {
      error = "header: " + what;
      if (state_ >= kTensor && state_ <= kArray && !cur_.name.empty())
        error += " in tensor \"" + cur_.name.substr(0, 200) + "\"";
    }
    return false;
  }

  StHeader* out_;
  State state_ = kStart;
  Field field_ = kDtype;
  bool is_meta_ = false, seen_meta_ = false;
  int have_ = 0, seen_fields_ = 0, count_ = 0;
  std::string key_, meta_key_;
  StTensor cur_;
};

Status perr(const std::string& file, const std::string& what) {
  return Status::ParseError(file + ": " + what);
}

}  // namespace

size_t st_dtype_size(StDType dt) noexcept {
  for (const auto& d : kDTypes)
    if (d.dt == dt) return d.size;
  return 0;
}

const char* st_dtype_name(StDType dt) noexcept {
  for (const auto& d : kDTypes)
    if (d.dt == dt) return d.name;
  return "?";
}

bool st_dtype_to_float(StDType dt, DType* out) noexcept {
  switch (dt) {
    case StDType::kF32:
      *out = DType::kF32;
      return true;
    case StDType::kF16:
      *out = DType::kF16;
      return true;
    case StDType::kBF16:
      *out = DType::kBF16;
      return true;
    default:
      return false;
  }
}

uint64_t StTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) {
    uint64_t r;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &r)) return UINT64_MAX;
    n = r;
  }
  return n;
}

int64_t StHeader::find(const std::string& name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

Status parse_safetensors(const uint8_t* data, size_t size, const std::string& file, StHeader* out) {
  *out = StHeader();
  if (size < 8)
    return perr(file, "file of " + std::to_string(size) +
                          " bytes is shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxSafetensorsHeaderBytes)
    return perr(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n > size - 8)
    return perr(file, "header length " + std::to_string(n) + " runs past the end of the file (" +
                          std::to_string(size) + " bytes)");
  if (n < 2)
    return perr(file, "header of " + std::to_string(n) + " bytes cannot hold a JSON object");
  const char* h = reinterpret_cast<const char*>(data + 8);
  if (h[0] != '{') return perr(file, "header does not start with '{' (byte 8)");

  StHeader hdr;
  hdr.header_bytes = n;
  hdr.data_offset = 8 + n;
  HeaderSax sax(&hdr);
  bool ok = false;
  try {
    ok = json::sax_parse(h, h + n, &sax, nlohmann::detail::input_format_t::json, true);
  } catch (const std::exception& e) {
    if (sax.error.empty()) sax.error = std::string("header: ") + e.what();
    ok = false;
  }
  if (!ok || !sax.error.empty())
    return perr(file, sax.error.empty() ? std::string("header: bad JSON") : sax.error);

  // Ranges: each consistent with its shape and dtype, inside the buffer, tiling it exactly.
  const uint64_t buffer = size - hdr.data_offset;
  std::vector<size_t> order(hdr.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  {
    std::set<std::string> names;
    for (const auto& t : hdr.tensors) {
      if (!names.insert(t.name).second)
        return perr(file, "duplicate tensor \"" + t.name.substr(0, 200) + "\"");
    }
  }
  for (const auto& t : hdr.tensors) {
    const std::string tn = "tensor \"" + t.name.substr(0, 200) + "\"";
    if (t.begin > t.end)
      return perr(file, tn + ": data_offsets [" + std::to_string(t.begin) + ", " +
                            std::to_string(t.end) + "] are reversed");
    if (t.end > buffer)
      return perr(file, tn + ": data_offsets end " + std::to_string(t.end) +
                            " is past the data buffer (" + std::to_string(buffer) + " bytes)");
    uint64_t numel = t.numel(), bytes;
    if (numel == UINT64_MAX || __builtin_mul_overflow(numel, st_dtype_size(t.dtype), &bytes))
      return perr(file, tn + ": element count overflows");
    if (bytes != t.end - t.begin)
      return perr(file, tn + ": shape x " + st_dtype_name(t.dtype) + " is " +
                            std::to_string(bytes) + " bytes but data_offsets span " +
                            std::to_string(t.end - t.begin));
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = hdr.tensors[a], &y = hdr.tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t pos = 0;
  for (size_t i : order) {
    const auto& t = hdr.tensors[i];
    const std::string tn = "tensor \"" + t.name.substr(0, 200) + "\"";
    if (t.begin < pos)
      return perr(file, tn + ": data_offsets [" + std::to_string(t.begin) + ", " +
                            std::to_string(t.end) + "] overlap another tensor");
    if (t.begin > pos)
      return perr(file, tn + ": data_offsets begin " + std::to_string(t.begin) +
                            " leaves a gap after byte " + std::to_string(pos));
    pos = t.end;
  }
  if (pos != buffer)
    return perr(file, "tensors cover " + std::to_string(pos) + " of the " + std::to_string(buffer) +
                          " bytes of the data buffer");
  *out = std::move(hdr);
  return Status::Ok();
}

}  // namespace molora
