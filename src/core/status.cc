#include "molora/status.h"

#include <string>

#include "molora/common.h"
#include "molora/version.h"

namespace molora {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kOutOfRange:
      return "out_of_range";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kCudaError:
      return "cuda_error";
    case StatusCode::kNcclError:
      return "nccl_error";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kMismatch:
      return "mismatch";
    case StatusCode::kIoError:
      return "io_error";
    case StatusCode::kParseError:
      return "parse_error";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

size_t dtype_size(DType dt) noexcept {
  switch (dt) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) noexcept {
  switch (dt) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "unknown";
}

const char* version() noexcept { return MOLORA_VERSION_STRING; }

}  // namespace molora
