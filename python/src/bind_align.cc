// align bindings: align_sizes, moe_align_block_size. Validation and conversion only; CPU arrays
// run the reference, CUDA arrays the kernels.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <tuple>

#include "binding.h"
#include "molora/align.h"

namespace molora::py {
namespace {

using Opt = std::optional<nb::ndarray<>>;

void out_i32(const nb::ndarray<>& a, const char* name, int64_t len, const nb::ndarray<>& ref) {
  check_array(a, name, {DType::kI32}, 1);
  check_same_device(ref, "topk_ids", a, name);
  check_dim(a, name, 0, len, "moe_align_block_size layout");
}

Binder bind_align([](nb::module_& m) {
  m.def(
      "align_sizes",
      [](int64_t num_tokens, int64_t topk, int64_t num_experts, int64_t block_size) {
        AlignSizes s;
        throw_if_error(moe_align_sizes(num_tokens, topk, num_experts, block_size, &s));
        return std::make_tuple(s.sorted_token_ids, s.expert_ids,
                               static_cast<int64_t>(s.workspace_bytes));
      },
      nb::arg("num_tokens"), nb::arg("topk"), nb::arg("num_experts"), nb::arg("block_size"),
      "(sorted_token_ids length, expert_ids length, workspace bytes) of one call shape.");

  m.def(
      "moe_align_block_size",
      [](nb::ndarray<> topk_ids, Opt slot_ids, int64_t num_experts, int64_t num_base_experts,
         int64_t block_size, nb::ndarray<> sorted, nb::ndarray<> eids, nb::ndarray<> post,
         Opt dropped, Opt workspace, uintptr_t stream) {
        // An empty [0, k] array may carry any strides: only its dtype and rank are checked.
        DType dt = topk_ids.size() == 0
                       ? dtype_of(topk_ids, "topk_ids")
                       : check_array(topk_ids, "topk_ids", {DType::kI32, DType::kI64}, 2);
        if (dt != DType::kI32 && dt != DType::kI64)
          throw nb::type_error("topk_ids must be int32 or int64");
        if (topk_ids.ndim() != 2) throw nb::value_error("topk_ids must have 2 dimensions");
        const bool cuda = is_cuda(topk_ids, "topk_ids");
        AlignArgs a;
        a.topk_ids = topk_ids.data();
        a.topk_dtype = dt;
        a.num_tokens = static_cast<int64_t>(topk_ids.shape(0));
        a.topk = static_cast<int64_t>(topk_ids.shape(1));
        a.num_experts = num_experts;
        a.block_size = block_size;
        AlignSizes sz;
        throw_if_error(moe_align_sizes(a.num_tokens, a.topk, num_experts, block_size, &sz));
        if (slot_ids) {
          check_array(*slot_ids, "slot_ids", {DType::kI32}, 1);
          check_same_device(topk_ids, "topk_ids", *slot_ids, "slot_ids");
          check_dim(*slot_ids, "slot_ids", 0, a.num_tokens, "num_tokens = topk_ids.shape[0]");
          a.slot_ids = static_cast<const int32_t*>(slot_ids->data());
          a.num_base_experts = num_base_experts;
        }
        out_i32(sorted, "sorted_token_ids", sz.sorted_token_ids, topk_ids);
        out_i32(eids, "expert_ids", sz.expert_ids, topk_ids);
        out_i32(post, "num_tokens_post_pad", 1, topk_ids);
        a.sorted_token_ids = static_cast<int32_t*>(sorted.data());
        a.sorted_token_ids_len = sz.sorted_token_ids;
        a.expert_ids = static_cast<int32_t*>(eids.data());
        a.expert_ids_len = sz.expert_ids;
        a.num_tokens_post_pad = static_cast<int32_t*>(post.data());
        if (dropped) {
          out_i32(*dropped, "num_dropped", 2, topk_ids);
          a.num_dropped = static_cast<int32_t*>(dropped->data());
        }
        if (cuda) {
          if (!workspace) throw nb::value_error("workspace is required for CUDA arrays");
          check_array(*workspace, "workspace", {DType::kI32}, 1);
          check_same_device(topk_ids, "topk_ids", *workspace, "workspace");
          a.workspace = workspace->data();
          a.workspace_bytes = workspace->shape(0) * sizeof(int32_t);
          throw_if_error(moe_align_block_size(a, as_stream(stream)));
        } else {
          nb::gil_scoped_release nogil;
          throw_if_error(moe_align_block_size_cpu(a));
        }
      },
      nb::arg("topk_ids"), nb::arg("slot_ids").none(), nb::arg("num_experts"),
      nb::arg("num_base_experts"), nb::arg("block_size"), nb::arg("sorted_token_ids"),
      nb::arg("expert_ids"), nb::arg("num_tokens_post_pad"), nb::arg("num_dropped").none(),
      nb::arg("workspace").none(), nb::arg("stream"),
      "moe_align_block_size into caller buffers (see molora.moe_align_block_size).");
});

}  // namespace
}  // namespace molora::py
