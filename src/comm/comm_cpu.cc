// CPU reference of the all-reduce: the specification every GPU result is compared against.
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/numeric.h"
#include "molora/comm.h"

namespace molora {
namespace {

float load(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::kBF16:
      return comm::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return comm::f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
void store(void* p, int64_t i, DType dt, float v) {
  switch (dt) {
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = comm::float_to_bf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = comm::float_to_f16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}
float round_to(float v, DType dt) {
  if (dt == DType::kBF16) return comm::bf16_to_float(comm::float_to_bf16(v));
  if (dt == DType::kF16) return comm::f16_to_float(comm::float_to_f16(v));
  return v;
}

Status check_args(const void* const* inputs, int world, const void* out, int64_t numel,
                  DType dtype) {
  if (world < 1 || world > 64) return Status::InvalidArgument("world must be in 1..64");
  if (numel < 0) return Status::InvalidArgument("numel must be >= 0");
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
    return Status::InvalidArgument("dtype must be bf16, f16 or f32");
  if (numel > 0) {
    if (!inputs || !out) return Status::InvalidArgument("inputs/out must not be null");
    for (int r = 0; r < world; ++r)
      if (!inputs[r]) return Status::InvalidArgument("inputs[" + std::to_string(r) + "] is null");
  }
  return Status::Ok();
}

}  // namespace

Status all_reduce_reference(const void* const* inputs, int world, void* out, int64_t numel,
                            DType dtype) {
  MOLORA_RETURN_IF_ERROR(check_args(inputs, world, out, numel, dtype));
  for (int64_t i = 0; i < numel; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) acc += load(inputs[r], i, dtype);
    store(out, i, dtype, acc);
  }
  return Status::Ok();
}

Status all_reduce_residual_rmsnorm_reference(const void* const* inputs, int world, void* residual,
                                             const void* weight, void* out, int64_t numel,
                                             int64_t hidden, float eps, DType dtype) {
  MOLORA_RETURN_IF_ERROR(check_args(inputs, world, out, numel, dtype));
  if (hidden <= 0 || numel % hidden != 0)
    return Status::InvalidArgument("hidden must be > 0 and divide numel");
  if (numel > 0 && (!residual || !weight))
    return Status::InvalidArgument("residual/weight must not be null");
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t r0 = 0; r0 < numel; r0 += hidden) {
    float ss = 0.0f;
    for (int64_t j = 0; j < hidden; ++j) {
      float acc = 0.0f;
      for (int r = 0; r < world; ++r) acc += load(inputs[r], r0 + j, dtype);
      float s = round_to(acc, dtype);
      float res = round_to(s + load(residual, r0 + j, dtype), dtype);
      store(residual, r0 + j, dtype, res);
      row[j] = res;
      ss += res * res;
    }
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(hidden) + eps);
    for (int64_t j = 0; j < hidden; ++j)
      store(out, r0 + j, dtype, row[j] * inv * load(weight, j, dtype));
  }
  return Status::Ok();
}

}  // namespace molora
