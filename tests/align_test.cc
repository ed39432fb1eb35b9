// The align contract against the CPU reference (label cpu).
#include "align_contract.h"

namespace molora::align_test {

INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, AlignContract, CpuBackend);

TEST(AlignSizes, LayoutOfTheFusedMoeFamily) {
  AlignSizes s;
  ASSERT_TRUE(moe_align_sizes(256, 8, 8192, 64, &s).ok());
  EXPECT_EQ(s.sorted_token_ids, 256 * 8 + 8192 * 63);
  EXPECT_EQ(s.expert_ids, cdiv(256 * 8 + 8192 * 63, 64));
  EXPECT_EQ(s.num_tokens_post_pad, 1);
  EXPECT_EQ(s.num_dropped, 2);
  EXPECT_EQ(s.workspace_bytes, 16u);  // one-launch path: no scratch, one 16-byte unit asked for
  ASSERT_TRUE(moe_align_sizes(4096, 8, 8192, 64, &s).ok());
  // Three-launch path: vbuf [numel] + counts [slices][V] + loc [V] + part [ranges] + drops.
  EXPECT_GE(s.workspace_bytes, (4096 * 8 + 8 * 8192 + 8192 + 16 + 16) * sizeof(int32_t));
  EXPECT_EQ(s.workspace_bytes % 16, 0u);
  ASSERT_TRUE(moe_align_sizes(0, 1, 1, 16, &s).ok());
  EXPECT_EQ(s.sorted_token_ids, 15);
  EXPECT_EQ(s.expert_ids, 1);
  EXPECT_FALSE(moe_align_sizes(1, 1, 1, 16, nullptr).ok());
  // A topk whose product with num_tokens overflows int64 (2 * 2^62 wrapped negative and passed
  // the pair limit; found with UBSan while fuzzing lora's checks): an error naming topk_ids.
  const Status st = moe_align_sizes(2, int64_t{1} << 62, 8, 16, &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("topk_ids"), std::string::npos) << st.message();
  EXPECT_FALSE(moe_align_sizes(int64_t{1} << 62, 4, 8, 16, &s).ok());
  EXPECT_TRUE(moe_align_sizes(1, kAlignMaxPairs, 8, 16, &s).ok());
  EXPECT_FALSE(moe_align_sizes(1, kAlignMaxPairs + 1, 8, 16, &s).ok());
}

TEST(AlignCpu, ReferenceOrderIsAscendingFlatIndexPerBucket) {
  // Hand-checked: T=3, k=2, ids [[2,0],[2,2],[0,1]], V=3, B=16.
  int32_t ids[6] = {2, 0, 2, 2, 0, 1};
  AlignSizes sz;
  ASSERT_TRUE(moe_align_sizes(3, 2, 3, 16, &sz).ok());
  std::vector<int32_t> sorted(sz.sorted_token_ids), eids(sz.expert_ids);
  int32_t post = -1, dropped[2] = {-1, -1};
  AlignArgs a;
  a.topk_ids = ids, a.num_tokens = 3, a.topk = 2, a.num_experts = 3, a.block_size = 16;
  a.sorted_token_ids = sorted.data(), a.sorted_token_ids_len = sz.sorted_token_ids;
  a.expert_ids = eids.data(), a.expert_ids_len = sz.expert_ids;
  a.num_tokens_post_pad = &post, a.num_dropped = dropped;
  ASSERT_TRUE(moe_align_block_size_cpu(a).ok());
  EXPECT_EQ(post, 48);
  EXPECT_EQ(sorted[0], 1);
  EXPECT_EQ(sorted[1], 4);
  EXPECT_EQ(sorted[2], 6);
  EXPECT_EQ(sorted[16], 5);
  EXPECT_EQ(sorted[17], 6);
  EXPECT_EQ(sorted[32], 0);
  EXPECT_EQ(sorted[33], 2);
  EXPECT_EQ(sorted[34], 3);
  EXPECT_EQ(sorted[35], 6);
  EXPECT_EQ(eids[0], 0);
  EXPECT_EQ(eids[1], 1);
  EXPECT_EQ(eids[2], 2);
  for (size_t b = 3; b < eids.size(); ++b) EXPECT_EQ(eids[b], -1);
  EXPECT_EQ(dropped[0], 0);
  EXPECT_EQ(dropped[1], 0);
}

}  // namespace molora::align_test
