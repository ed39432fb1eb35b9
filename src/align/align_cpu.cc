// moe_align_block_size: sizes, argument checks and the CPU reference (the specification).
#include <string>
#include <vector>

#include "align/align_internal.h"
#include "core/cuda_util.h"
#include "molora/align.h"

namespace molora {
namespace {

bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string str(int64_t x) { return std::to_string(x); }

Status capacity(const char* arg, const void* ptr, int64_t have, int64_t need) {
  if (ptr == nullptr) return Status::InvalidArgument(std::string(arg) + " is null");
  if (have < need)
    return Status::InvalidArgument(std::string(arg) + " holds " + str(have) +
                                   " elements; the call needs " + str(need));
  return Status::Ok();
}

// Virtual id of flat pair i, or -1 (invalid id) / -2 (slot -1: no adapter).
template <typename Id>
int64_t virtual_id(const Id* ids, const int32_t* slots, int64_t i, int64_t topk, int64_t E,
                   int64_t V) {
  int64_t e = static_cast<int64_t>(ids[i]);
  if (slots != nullptr) {
    int64_t s = slots[i / topk];
    if (s == -1) return -2;
    if (s < 0 || e < 0 || e >= E) return -1;
    e = s * E + e;  // s < 2^31, E <= 2^16: no overflow in int64
  }
  return (e >= 0 && e < V) ? e : -1;
}

template <typename Id>
void align_cpu(const AlignArgs& a, const Id* ids) {
  const int64_t numel = a.num_tokens * a.topk, V = a.num_experts, B = a.block_size;
  const int64_t E = a.num_base_experts;
  AlignSizes sz;
  moe_align_sizes(a.num_tokens, a.topk, V, B, &sz);
  std::vector<int64_t> vid(numel), count(V, 0);
  int32_t dropped = 0, no_adapter = 0;
  for (int64_t i = 0; i < numel; ++i) {
    vid[i] = virtual_id(ids, a.slot_ids, i, a.topk, E, V);
    if (vid[i] >= 0) {
      ++count[vid[i]];
    } else if (vid[i] == -2) {
      ++no_adapter;
    } else {
      ++dropped;
    }
  }
  // Padded exclusive prefix sum: bucket v starts at offset[v], a multiple of B.
  std::vector<int64_t> offset(V + 1, 0);
  for (int64_t v = 0; v < V; ++v) offset[v + 1] = offset[v] + (count[v] + B - 1) / B * B;
  const int64_t used = offset[V];

  for (int64_t p = 0; p < sz.sorted_token_ids; ++p)
    a.sorted_token_ids[p] = static_cast<int32_t>(numel);
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for (int64_t i = 0; i < numel; ++i)  // ascending flat index within each bucket
    if (vid[i] >= 0) a.sorted_token_ids[fill[vid[i]]++] = static_cast<int32_t>(i);

  for (int64_t b = 0; b < sz.expert_ids; ++b) a.expert_ids[b] = -1;
  for (int64_t v = 0; v < V; ++v)
    for (int64_t p = offset[v]; p < offset[v + 1]; p += B)
      a.expert_ids[p / B] = static_cast<int32_t>(v);
  a.num_tokens_post_pad[0] = static_cast<int32_t>(used);
  if (a.num_dropped != nullptr) {
    a.num_dropped[0] = dropped;
    a.num_dropped[1] = no_adapter;
  }
}

}  // namespace

Status moe_align_sizes(int64_t num_tokens, int64_t topk, int64_t num_experts, int64_t block_size,
                       AlignSizes* sizes) {
  if (sizes == nullptr) return Status::InvalidArgument("sizes is null");
  if (num_tokens < 0)
    return Status::InvalidArgument("num_tokens must be >= 0, got " + str(num_tokens));
  if (topk < 1) return Status::InvalidArgument("topk must be >= 1, got " + str(topk));
  // (each factor first: the product of a huge one would overflow)
  if (num_tokens > kAlignMaxPairs || topk > kAlignMaxPairs || num_tokens * topk > kAlignMaxPairs)
    return Status::InvalidArgument("topk_ids: num_tokens * topk must be <= " + str(kAlignMaxPairs) +
                                   ", got " + str(num_tokens) + " * " + str(topk));
  if (num_experts < 1 || num_experts > kAlignMaxExperts)
    return Status::InvalidArgument("num_experts must be in [1, " + str(kAlignMaxExperts) +
                                   "], got " + str(num_experts));
  if (!is_pow2(block_size) || block_size < kAlignMinBlockSize || block_size > kAlignMaxBlockSize)
    return Status::InvalidArgument("block_size must be a power of two in [16, 256], got " +
                                   str(block_size));
  const int64_t numel = num_tokens * topk;
  sizes->sorted_token_ids = numel + num_experts * (block_size - 1);
  sizes->expert_ids = cdiv(sizes->sorted_token_ids, block_size);
  sizes->num_tokens_post_pad = 1;
  sizes->num_dropped = 2;
  sizes->workspace_bytes =
      static_cast<size_t>(align_detail::workspace_words(numel, num_experts)) * sizeof(int32_t);
  return Status::Ok();
}

namespace align_detail {

Status check_pointers(const AlignArgs& a) {
  const int64_t numel = a.num_tokens * a.topk;
  const size_t id_bytes = static_cast<size_t>(numel) * dtype_size(a.topk_dtype);
  MOLORA_RETURN_IF_ERROR(check_device_pointer(a.topk_ids, id_bytes, "topk_ids"));
  if (a.slot_ids != nullptr)
    MOLORA_RETURN_IF_ERROR(check_device_pointer(a.slot_ids, 4 * a.num_tokens, "slot_ids"));
  MOLORA_RETURN_IF_ERROR(check_device_pointer(a.sorted_token_ids, 4, "sorted_token_ids"));
  MOLORA_RETURN_IF_ERROR(check_device_pointer(a.expert_ids, 4, "expert_ids"));
  MOLORA_RETURN_IF_ERROR(check_device_pointer(a.num_tokens_post_pad, 4, "num_tokens_post_pad"));
  if (a.num_dropped != nullptr)
    MOLORA_RETURN_IF_ERROR(check_device_pointer(a.num_dropped, 4, "num_dropped"));
  return check_device_pointer(a.workspace, 4, "workspace");
}

Status check_values(const AlignArgs& a, bool cuda_path) {
  AlignSizes sz;
  MOLORA_RETURN_IF_ERROR(moe_align_sizes(a.num_tokens, a.topk, a.num_experts, a.block_size, &sz));
  const int64_t numel = a.num_tokens * a.topk;
  if (a.topk_dtype != DType::kI32 && a.topk_dtype != DType::kI64)
    return Status::InvalidArgument(std::string("topk_ids must be int32 or int64, got ") +
                                   dtype_name(a.topk_dtype));
  if (a.topk_ids == nullptr && numel > 0) return Status::InvalidArgument("topk_ids is null");
  if (a.slot_ids != nullptr) {
    if (a.num_base_experts < 1 || a.num_base_experts > a.num_experts)
      return Status::InvalidArgument(
          "num_base_experts must be in [1, num_experts=" + str(a.num_experts) +
          "] with slot_ids, got " + str(a.num_base_experts));
  }
  MOLORA_RETURN_IF_ERROR(capacity("sorted_token_ids", a.sorted_token_ids, a.sorted_token_ids_len,
                                  sz.sorted_token_ids));
  MOLORA_RETURN_IF_ERROR(capacity("expert_ids", a.expert_ids, a.expert_ids_len, sz.expert_ids));
  if (a.num_tokens_post_pad == nullptr)
    return Status::InvalidArgument("num_tokens_post_pad is null");
  if (cuda_path && (a.workspace == nullptr || a.workspace_bytes < sz.workspace_bytes))
    return Status::InvalidArgument("workspace holds " + str(a.workspace_bytes) +
                                   " bytes; the call needs " + str(sz.workspace_bytes) +
                                   " (moe_align_sizes)");
  return Status::Ok();
}

}  // namespace align_detail

Status moe_align_check(const AlignArgs& a, bool cuda_path) {
  MOLORA_RETURN_IF_ERROR(align_detail::check_values(a, cuda_path));
  return cuda_path ? align_detail::check_pointers(a) : Status::Ok();
}

Status moe_align_block_size_cpu(const AlignArgs& a) {
  MOLORA_RETURN_IF_ERROR(moe_align_check(a, false));
  if (a.topk_dtype == DType::kI64)
    align_cpu(a, static_cast<const int64_t*>(a.topk_ids));
  else
    align_cpu(a, static_cast<const int32_t*>(a.topk_ids));
  return Status::Ok();
}

}  // namespace molora
