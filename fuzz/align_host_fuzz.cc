// libFuzzer target: moe_align_sizes and the align CPU reference (moe_align_block_size_cpu, which
// runs moe_align_check first) on adversarial input. Built by tests/extra/align_fuzz.sh with clang
// -fsanitize=fuzzer,address,undefined and without CUDA.
//
// The bytes pick the call shape (every argument at its edges, past them and at the type's
// extremes, or small), the ids (topk_ids int32 or int64 and optional slot_ids, in range or not)
// and the output capacities (enough, one short, none). Then:
//   - moe_align_sizes must return; every size it gives is non-negative;
//   - a call that fails leaves every output as it was;
//   - a call that succeeds wrote the layout of align.h: num_tokens_post_pad a multiple of B
//     within the buffer; every used block's expert in [0, V) and every later one -1; every
//     position either the sentinel numel or a pair of that block's expert, each pair at most
//     once, ascending within a bucket; and every pair either placed or counted in num_dropped.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_bytes.h"
#include "molora/align.h"

namespace {

using molora::AlignArgs;
using molora::AlignSizes;
using molora::DType;
using namespace molora::fuzz;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes b{data, size};
  const int64_t T = b.pick({0, 1, molora::kAlignMaxPairs, molora::kAlignMaxPairs + 1, -1, kI64Max,
                            kI64Min, int64_t{1} << 62},
                           12);
  const int64_t k = b.pick({1, 8, molora::kAlignMaxPairs, 0, -1, kI64Max, int64_t{1} << 62}, 4);
  const int64_t V =
      b.pick({1, molora::kAlignMaxExperts, molora::kAlignMaxExperts + 1, 0, -1, kI64Max}, 40);
  const int64_t B = b.pick({16, 32, 256, 512, 24, 8, 0, -16, kI64Max}, 0);
  AlignSizes sz;
  const molora::Status ss = molora::moe_align_sizes(T, k, V, B, &sz);
  if (ss.ok() && (sz.sorted_token_ids < 0 || sz.expert_ids < 0)) fail();
  // The reference, on shapes small enough to hold.
  if (!ss.ok() || T * k > 96 || V > 64 || B > 64) return 0;
  const int64_t numel = T * k;
  const bool i64 = b.u8() & 1;
  std::vector<int32_t> ids32(numel);
  std::vector<int64_t> ids64(numel);
  const bool slots = b.u8() & 1;
  const int64_t E = slots ? b.pick({0, -1, V + 1}, V) : 0;
  const int64_t id_max = slots ? E : V;
  for (int64_t i = 0; i < numel; ++i) {
    const int64_t v = b.pick({-1, id_max, kI64Max, kI64Min, kI32Max}, id_max);
    ids64[i] = v;
    ids32[i] = static_cast<int32_t>(v);
  }
  std::vector<int32_t> slot_ids(T);
  for (auto& s : slot_ids) s = static_cast<int32_t>(b.pick({-1, -2, kI32Max}, 4));
  // Capacities: enough, one short, or none.
  auto cap = [&](int64_t need) {
    const uint8_t c = b.u8() % 8;
    return c == 0 ? need - 1 : c == 1 ? 0 : need;
  };
  const int64_t sl = cap(sz.sorted_token_ids), el = cap(sz.expert_ids);
  std::vector<int32_t> sorted(sz.sorted_token_ids + 1, 0x5a5a5a5a),
      eids(sz.expert_ids + 1, 0x5a5a5a5a);
  int32_t ntpp = 0x5a5a5a5a;
  int32_t dropped[2] = {0x5a5a5a5a, 0x5a5a5a5a};
  AlignArgs a;
  a.topk_ids = i64 ? static_cast<const void*>(ids64.data()) : ids32.data();
  a.topk_dtype = i64 ? DType::kI64 : DType::kI32;
  if (b.u8() % 16 == 0) a.topk_dtype = DType::kF32;
  a.num_tokens = T, a.topk = k, a.num_experts = V, a.block_size = B;
  if (slots) a.slot_ids = slot_ids.data(), a.num_base_experts = E;
  a.sorted_token_ids = sorted.data(), a.sorted_token_ids_len = sl;
  a.expert_ids = eids.data(), a.expert_ids_len = el;
  a.num_tokens_post_pad = &ntpp;
  a.num_dropped = dropped;
  const auto sorted0 = sorted, eids0 = eids;
  const molora::Status st = molora::moe_align_block_size_cpu(a);
  if (!st.ok()) {
    if (sorted != sorted0 || eids != eids0 || ntpp != 0x5a5a5a5a || dropped[0] != 0x5a5a5a5a ||
        dropped[1] != 0x5a5a5a5a)
      fail();  // an error wrote an output
    return 0;
  }
  // The layout.
  const int64_t L = sz.sorted_token_ids;
  if (ntpp < 0 || ntpp > L || ntpp % B != 0) fail();
  std::vector<char> seen(numel, 0);
  int64_t placed = 0;
  for (int64_t g = 0; g < sz.expert_ids; ++g) {
    const int32_t e = eids[g];
    if (g * B >= ntpp) {
      if (e != -1) fail();  // a block past the used ones
      continue;
    }
    if (e < 0 || e >= V) fail();
    int64_t last = -1;
    for (int64_t i = g * B; i < (g + 1) * B; ++i) {
      const int32_t p = sorted[i];
      if (p == numel) continue;  // sentinel
      if (p < 0 || p > numel || seen[p]) fail();
      seen[p] = 1;
      ++placed;
      if (p <= last) fail();  // ascending within a block (and so within a bucket)
      last = p;
      const int64_t id = i64 ? ids64[p] : ids32[p];
      const int64_t want = slots ? int64_t{slot_ids[p / k]} * E + id : id;
      if (want != e) fail();  // the pair is in another expert's block
    }
  }
  for (int64_t i = ntpp; i < L; ++i)
    if (sorted[i] != numel) fail();  // past the used positions: the sentinel
  if (dropped[0] < 0 || dropped[1] < 0 || placed + dropped[0] + dropped[1] != numel) fail();
  return 0;
}
