// molora/status.h — the error model of every molora library call.
//
// Every public function returns a molora::Status. No exception crosses the library boundary and
// library code never calls exit() or abort(). CUDA and NCCL errors are turned into a Status that
// names the failing call and its file:line.
#pragma once

#include <string>
#include <utility>

namespace molora {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // bad shape, dtype, size, pointer or value (message names the argument)
  kOutOfRange = 2,          // a size or id past a documented limit
  kUnavailable = 3,         // the build or the machine lacks what the call needs (no CUDA, no GPU)
  kCudaError = 4,           // a CUDA runtime/driver call failed
  kNcclError = 5,           // an NCCL call failed
  kTimeout = 6,             // a bounded wait expired (comm)
  kMismatch = 7,            // ranks disagree on the call sequence or shape (comm)
  kIoError = 8,             // a file could not be opened/read/mapped
  kParseError = 9,          // malformed input file (message carries file and byte offset)
  kNotFound = 10,           // a named thing (adapter, tensor, setting) does not exist
  kResourceExhausted = 11,  // no free slot / buffer too small
  kInternal = 12,           // a molora bug: please report
};

// Short, stable name of a code ("ok", "invalid_argument", ...).
const char* status_code_name(StatusCode code) noexcept;

class Status {
 public:
  Status() noexcept = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status ParseError(std::string m) { return {StatusCode::kParseError, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  explicit operator bool() const noexcept { return ok(); }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "invalid_argument: topk_ids must be int32 or int64" (or "ok").
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds the Status for a failed CUDA runtime call (err is a cudaError_t value).
Status cuda_status(int err, const char* call, const char* file, int line);
// Builds the Status for a failed NCCL call (res is an ncclResult_t value).
Status nccl_status(int res, const char* call, const char* file, int line);

}  // namespace molora

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define MOLORA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::molora::Status molora_status_ = (expr);        \
    if (!molora_status_.ok()) return molora_status_; \
  } while (0)
