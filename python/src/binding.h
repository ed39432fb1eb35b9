// Shared helpers of the nanobind bindings: validation of arrays with the argument's name,
// Status → Python exception, and the per-part registry. Bindings validate and convert; they
// hold no logic.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "molora/common.h"
#include "molora/status.h"

namespace molora::py {

namespace nb = nanobind;
using Array = nb::ndarray<nb::ro>;  // any dtype, any device, read-only view
using MutArray = nb::ndarray<>;     // any dtype, any device, writable

// Each bind_<part>.cc registers a function that adds its names to the module.
struct Binder {
  explicit Binder(std::function<void(nb::module_&)> fn);
};

// Raises ValueError (invalid_argument, out_of_range), TimeoutError (timeout) or RuntimeError
// (everything else, message prefixed with the code name) when `s` is not ok.
void throw_if_error(const Status& s);

// molora dtype of an array; TypeError naming `arg` for an unsupported dtype.
DType dtype_of(const nb::ndarray<>& a, const char* arg);
// Checks: dtype one of `allowed` (TypeError), `ndim` (ValueError, -1 = any), row-major contiguous
// (ValueError). Returns the dtype.
DType check_array(const nb::ndarray<>& a, const char* arg, std::vector<DType> allowed, int ndim);
// True when the array lives in CUDA memory; ValueError for other non-CPU devices.
bool is_cuda(const nb::ndarray<>& a, const char* arg);
// ValueError unless both arrays are on the same device (CPU/CPU, or the same CUDA device).
void check_same_device(const nb::ndarray<>& a, const char* an, const nb::ndarray<>& b,
                       const char* bn);
// ValueError unless dimension `dim` of `a` equals `expected`.
void check_dim(const nb::ndarray<>& a, const char* arg, size_t dim, int64_t expected,
               const char* what);
// A CUDA stream handle passed from Python (the Python layer resolves defaults: see
// molora/_arrays.py stream_handle).
inline cudaStream_t as_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

}  // namespace molora::py
