// molora/common.h — types shared by every part: dtypes, streams, limits.
//
// Framework-free: no CUDA, torch or Python header is needed to include any molora header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "molora/status.h"

// The same declaration as cuda_runtime_api.h, so callers need no CUDA header.
typedef struct CUstream_st* cudaStream_t;  // NOLINT
typedef struct CUevent_st* cudaEvent_t;    // NOLINT

namespace molora {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kU8 = 5 };

// Size in bytes of one element of `dt`.
size_t dtype_size(DType dt) noexcept;
// Stable lower-case name ("bf16", "f32", ...).
const char* dtype_name(DType dt) noexcept;

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace molora
