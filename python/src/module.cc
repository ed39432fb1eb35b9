// NB_MODULE for molora._molora: runs every part's Binder.
#include <vector>

#include "binding.h"
#include "molora/info.h"

namespace molora::py {
namespace {
std::vector<std::function<void(nb::module_&)>>& binders() {
  static std::vector<std::function<void(nb::module_&)>> b;
  return b;
}
}  // namespace

Binder::Binder(std::function<void(nb::module_&)> fn) { binders().push_back(std::move(fn)); }

void throw_if_error(const Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      throw nb::value_error(s.message().c_str());
    case StatusCode::kTimeout: {
      PyErr_SetString(PyExc_TimeoutError, s.to_string().c_str());
      throw nb::python_error();
    }
    default:
      throw std::runtime_error(s.to_string());
  }
}

DType dtype_of(const nb::ndarray<>& a, const char* arg) {
  nb::dlpack::dtype d = a.dtype();
  using C = nb::dlpack::dtype_code;
  if (d.lanes == 1) {
    if (d.code == (uint8_t)C::Float && d.bits == 32) return DType::kF32;
    if (d.code == (uint8_t)C::Float && d.bits == 16) return DType::kF16;
    if (d.code == (uint8_t)C::Bfloat && d.bits == 16) return DType::kBF16;
    if (d.code == (uint8_t)C::Int && d.bits == 32) return DType::kI32;
    if (d.code == (uint8_t)C::Int && d.bits == 64) return DType::kI64;
    if (d.code == (uint8_t)C::UInt && d.bits == 8) return DType::kU8;
  }
  throw nb::type_error((std::string(arg) + ": unsupported dtype (code " + std::to_string(d.code) +
                        ", " + std::to_string(d.bits) + " bits)")
                           .c_str());
}

DType check_array(const nb::ndarray<>& a, const char* arg, std::vector<DType> allowed, int ndim) {
  DType dt = dtype_of(a, arg);
  bool ok = false;
  for (DType x : allowed) ok |= (x == dt);
  if (!ok) {
    std::string names;
    for (DType x : allowed) names += std::string(names.empty() ? "" : " or ") + dtype_name(x);
    throw nb::type_error(
        (std::string(arg) + " must be " + names + ", got " + dtype_name(dt)).c_str());
  }
  if (ndim >= 0 && (int)a.ndim() != ndim)
    throw nb::value_error((std::string(arg) + " must have " + std::to_string(ndim) +
                           " dimensions, got " + std::to_string(a.ndim()))
                              .c_str());
  int64_t expect = 1;
  for (int i = (int)a.ndim() - 1; i >= 0; --i) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      throw nb::value_error((std::string(arg) + " must be contiguous (row-major)").c_str());
    expect *= (int64_t)a.shape(i);
  }
  return dt;
}

bool is_cuda(const nb::ndarray<>& a, const char* arg) {
  int t = a.device_type();
  if (t == nb::device::cpu::value) return false;
  if (t == nb::device::cuda::value || t == nb::device::cuda_managed::value) return true;
  throw nb::value_error(
      (std::string(arg) + ": unsupported device type " + std::to_string(t) + " (CPU or CUDA only)")
          .c_str());
}

void check_same_device(const nb::ndarray<>& a, const char* an, const nb::ndarray<>& b,
                       const char* bn) {
  bool ca = is_cuda(a, an), cb = is_cuda(b, bn);
  if (ca != cb || (ca && a.device_id() != b.device_id()))
    throw nb::value_error((std::string(bn) + " must be on the same device as " + an).c_str());
}

void check_dim(const nb::ndarray<>& a, const char* arg, size_t dim, int64_t expected,
               const char* what) {
  if (dim >= a.ndim() || (int64_t)a.shape(dim) != expected)
    throw nb::value_error((std::string(arg) + ".shape[" + std::to_string(dim) + "] must be " +
                           std::to_string(expected) + " (" + what + "), got " +
                           (dim < a.ndim() ? std::to_string(a.shape(dim)) : std::string("none")))
                              .c_str());
}

}  // namespace molora::py

NB_MODULE(_molora, m) {
  m.doc() = "molora native extension (use the molora package, not this module)";
  for (auto& fn : molora::py::binders()) fn(m);
}
