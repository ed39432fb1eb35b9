// moe_align_block_size without device code: Unavailable (the CPU reference still works).
#include "molora/align.h"

namespace molora {
Status moe_align_block_size(const AlignArgs& args, cudaStream_t) {
  MOLORA_RETURN_IF_ERROR(moe_align_check(args, true));
  return Status::Unavailable("molora was built without CUDA; use moe_align_block_size_cpu");
}
}  // namespace molora
