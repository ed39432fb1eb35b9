// prof: analyses over generated traces with known answers (summary, steps, grids, rules,
// reports, ranks, diff).
#include "molora/prof.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "prof_tracegen.h"

namespace mp = molora::prof;
namespace tg = molora::prof::testgen;

namespace {

mp::Trace read_str(const std::string& s, mp::ReadOptions ro = {}) {
  mp::Trace t;
  molora::Status st = mp::read_trace_buffer(s.data(), s.size(), ro, &t);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return t;
}

double us(int64_t ns) { return ns * 1e-3; }

TEST(ProfSummary, GeneratedTraceKnownAnswers) {
  tg::Options o;
  std::string json;
  tg::Expected e = tg::generate(o, &json);
  mp::Trace t = read_str(json);
  EXPECT_FALSE(t.truncated);
  EXPECT_EQ(t.events, e.events);
  mp::Summary s;
  ASSERT_TRUE(mp::summarize(t, mp::Rules(), &s).ok());
  EXPECT_EQ(s.kernels, e.kernels);
  EXPECT_NEAR(s.kernel_us, us(e.kernel_ns), 1e-6);
  EXPECT_NEAR(s.busy_us, us(e.busy_ns), 1e-6);
  EXPECT_LT(s.busy_us, s.kernel_us);  // the side stream overlaps
  EXPECT_EQ(s.memcpys, e.memcpys);
  EXPECT_NEAR(s.memcpy_us, us(e.memcpy_ns), 1e-6);
  EXPECT_NEAR(s.memset_us, us(e.memset_ns), 1e-6);
  double share = 0;
  for (int i = 0; i < mp::kNumCategories; ++i) {
    auto c = static_cast<mp::Category>(i);
    if (c == mp::Category::kMemcpy || c == mp::Category::kMemset) continue;
    std::string n = mp::category_name(c);
    EXPECT_NEAR(s.categories[i].time_us, us(e.category_ns[n]), 1e-6) << n;
    EXPECT_EQ(s.categories[i].count, e.category_count[n]) << n;
    share += s.categories[i].share;
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  ASSERT_FALSE(s.top.empty());
  for (size_t i = 1; i < s.top.size(); ++i) EXPECT_GE(s.top[i - 1].total_us, s.top[i].total_us);
  // The escaped name comes back unescaped.
  bool found = false;
  for (auto& k : s.top) found |= k.name == "eagle_draft_tree_kernel \"quoted\\name\"";
  EXPECT_TRUE(found);
}

TEST(ProfSteps, AttributionByCorrelationToInnermostStep) {
  tg::Options o;
  o.steps = 5;
  std::string json;
  tg::Expected e = tg::generate(o, &json);
  mp::Trace t = read_str(json);
  mp::Steps st;
  ASSERT_TRUE(mp::compute_steps(t, mp::Rules(), mp::StepsOptions(), &st).ok());
  ASSERT_EQ(st.steps.size(), static_cast<size_t>(o.steps + 1));  // + "(no step)"
  EXPECT_EQ(st.unmatched, e.unmatched);
  for (int i = 0; i < o.steps; ++i) {
    EXPECT_EQ(st.steps[i].index, i);
    EXPECT_EQ(st.steps[i].name, "step[DECODE]");  // innermost step annotation, not ProfilerStep#
    EXPECT_NEAR(st.steps[i].kernel_us, us(e.step_kernel_ns[i]), 1e-6);
    EXPECT_EQ(st.steps[i].launches, e.step_launches[i]);
    EXPECT_LE(st.steps[i].busy_us, st.steps[i].kernel_us + 1e-9);
    EXPECT_GE(st.steps[i].wall_us, st.steps[i].busy_us - 1e-9);
    double sum = 0;
    for (double c : st.steps[i].categories_us) sum += c;
    EXPECT_NEAR(sum, st.steps[i].kernel_us, 1e-6);
    EXPECT_TRUE(st.steps[i].top_annotation == "attention" || st.steps[i].top_annotation == "moe")
        << st.steps[i].top_annotation;
  }
  EXPECT_EQ(st.steps.back().index, -1);
  EXPECT_NEAR(st.steps.back().kernel_us, us(e.nostep_kernel_ns), 1e-6);
  EXPECT_EQ(st.steps.back().launches, e.nostep_launches);

  // ProfilerStep# as the step: same per-step numbers (step[DECODE] holds every launch).
  mp::StepsOptions so;
  so.step_regex = "^ProfilerStep#";
  mp::Steps st2;
  ASSERT_TRUE(mp::compute_steps(t, mp::Rules(), so, &st2).ok());
  ASSERT_EQ(st2.steps.size(), st.steps.size());
  EXPECT_EQ(st2.steps[0].name, "ProfilerStep#10");
  EXPECT_NEAR(st2.steps[0].kernel_us, st.steps[0].kernel_us, 1e-9);
  // Text, JSON, CSV and SVG carry the rows.
  auto j = nlohmann::json::parse(mp::steps_json(st));
  EXPECT_EQ(j["schema"], "molora.prof.steps/1");
  EXPECT_EQ(j["steps"].size(), st.steps.size());
  EXPECT_NE(mp::steps_text(st).find("step[DECODE]"), std::string::npos);
  EXPECT_NE(mp::steps_csv(st).find("top_annotation"), std::string::npos);
  EXPECT_NE(mp::steps_svg(st).find("<svg"), std::string::npos);
  mp::StepsOptions bad;
  bad.step_regex = "(";
  EXPECT_EQ(mp::compute_steps(t, mp::Rules(), bad, &st2).code(),
            molora::StatusCode::kInvalidArgument);
}

TEST(ProfRules, BuiltinFamilies) {
  mp::Rules r;
  auto cat = [&](const char* n) { return std::string(mp::category_name(r.classify(n))); };
  EXPECT_EQ(cat("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            "allreduce");
  EXPECT_EQ(cat("ncclSymkDevKernel_AllReduce_LL_sum_bf16"), "allreduce");
  EXPECT_EQ(cat("ncclDevKernel_AllGather_RING_LL"), "allgather");
  EXPECT_EQ(cat("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"), "reducescatter");
  EXPECT_EQ(cat("ncclDevKernel_SendRecv"), "p2p");
  EXPECT_EQ(cat("ncclDevKernel_Broadcast_RING_LL"), "other-comm");
  EXPECT_EQ(cat("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>"), "allreduce");
  EXPECT_EQ(
      cat("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport"),
      "allreduce");
  EXPECT_EQ(cat("void tensorrt_llm::kernels::oneShotAllReduceKernel<float>"), "allreduce");
  EXPECT_EQ(cat("fused_moe_kernel"), "moe");
  EXPECT_EQ(cat("_fused_moe_lora_kernel"), "moe-lora");
  // molora's own kernels as CUPTI names them (demangled, in namespaces)
  EXPECT_EQ(cat("molora::lora::detail::(anonymous namespace)::molora_lora_kernel("
                "molora::lora::detail::(anonymous namespace)::KernelArgs)"),
            "moe-lora");
  EXPECT_EQ(cat("molora::(anonymous namespace)::molora_align_small("
                "molora::(anonymous namespace)::SmallParams)"),
            "routing");
  EXPECT_EQ(cat("molora::(anonymous namespace)::molora_align_scatter("
                "molora::(anonymous namespace)::ScatterParams)"),
            "routing");
  EXPECT_EQ(cat("void molora::comm::(anonymous namespace)::molora_allreduce_kernel<"
                "__nv_bfloat16, 1>(molora::comm::(anonymous namespace)::LaunchArgs)"),
            "allreduce");
  EXPECT_EQ(cat("molora::comm::(anonymous namespace)::molora_residual_rmsnorm_kernel("
                "unsigned short const*, unsigned short*, unsigned short const*, int, int, float)"),
            "norm");
  EXPECT_EQ(cat("molora_lora_kernel"), "moe-lora");
  EXPECT_EQ(cat("xmolora_align_foo"), "other");  // molora_ must start a word
  EXPECT_EQ(cat("void moe_align_block_size_kernel<int>"), "routing");
  EXPECT_EQ(cat("void topkGatingSoftmax<8, 128>"), "routing");
  EXPECT_EQ(cat("flash_fwd_splitkv_kernel"), "attention");
  EXPECT_EQ(cat("fmha_v2_flash_attention_bf16_64_128_S_q_paged_kv_128_sm90_kernel"), "attention");
  EXPECT_EQ(cat("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>"), "attention");
  EXPECT_EQ(cat("void flashinfer::BatchPrefillWithRaggedKVCacheKernel<...>"), "attention");
  EXPECT_EQ(cat("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3"), "attention");
  EXPECT_EQ(cat("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNT"), "gemm");
  EXPECT_EQ(cat("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), "gemm");
  EXPECT_EQ(
      cat("void "
          "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>"),
      "gemm");
  EXPECT_EQ(
      cat("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"),
      "elementwise");
  EXPECT_EQ(cat("void vllm::rms_norm_kernel<c10::BFloat16>"), "norm");
  EXPECT_EQ(cat("void flashinfer::sampling::TopPSamplingFromProbKernel"), "sampling");
  EXPECT_EQ(cat("eagle_draft_extend"), "speculative");
  EXPECT_EQ(cat("something_else"), "other");
}

TEST(ProfRules, UserRulesFirstAndExplain) {
  mp::Rules r;
  ASSERT_TRUE(r.add_front(mp::Category::kAttention, "^fused_moe", "test:1").ok());
  EXPECT_EQ(r.classify("fused_moe_kernel"), mp::Category::kAttention);
  std::string ex = mp::explain(r, "fused_moe_kernel");
  EXPECT_NE(ex.find("attention"), std::string::npos);
  EXPECT_NE(ex.find("test:1"), std::string::npos);
  EXPECT_EQ(r.add_front(mp::Category::kMoe, "(", "test:2").code(),
            molora::StatusCode::kInvalidArgument);
  std::string path = ::testing::TempDir() + "/prof_rules.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("# comment\n\nmoe-lora  ^my_unknown\nnot-a-category x\n", f);
  std::fclose(f);
  mp::Rules r2;
  molora::Status s = r2.add_file(path);
  EXPECT_EQ(s.code(), molora::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(":4"), std::string::npos) << s.message();
  f = std::fopen(path.c_str(), "w");
  std::fputs("moe-lora ^my_unknown\nsampling kernel$\n", f);
  std::fclose(f);
  mp::Rules r3;
  ASSERT_TRUE(r3.add_file(path).ok());
  EXPECT_EQ(r3.classify("my_unknown_kernel"), mp::Category::kMoeLora);  // file order kept
  EXPECT_EQ(r3.classify("fused_moe_kernel"), mp::Category::kSampling);
  // memcpy/memset name copy events, not kernels: a kernel rule there is refused (its kernels
  // would vanish from the category table, whose memcpy/memset rows come from copy events)
  for (const char* cat : {"memcpy", "memset"}) {
    f = std::fopen(path.c_str(), "w");
    std::fprintf(f, "moe ^x\n%s fused_moe\n", cat);
    std::fclose(f);
    mp::Rules r4;
    s = r4.add_file(path);
    EXPECT_EQ(s.code(), molora::StatusCode::kInvalidArgument) << cat;
    EXPECT_NE(s.message().find(":2"), std::string::npos) << s.message();
    EXPECT_EQ(r4.classify("fused_moe_kernel"), mp::Category::kMoe) << "rules unchanged";
  }
}

TEST(ProfGrids, ConfigsPerKernel) {
  tg::Options o;
  std::string json;
  tg::generate(o, &json);
  mp::Trace t = read_str(json);
  std::vector<mp::GridStat> g;
  ASSERT_TRUE(mp::compute_grids(t, mp::Rules(), "fused_moe", &g).ok());
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].ctas, 1536u);
  EXPECT_EQ(g[0].threads_per_cta, 128u);
  ASSERT_TRUE(mp::compute_grids(t, mp::Rules(), "", &g).ok());
  uint64_t n = 0;
  for (auto& x : g) n += x.count;
  EXPECT_EQ(n, t.kernels.size());
  auto j = nlohmann::json::parse(mp::grids_json(g));
  EXPECT_EQ(j["schema"], "molora.prof.grids/1");
  EXPECT_EQ(mp::compute_grids(t, mp::Rules(), "[", &g).code(),
            molora::StatusCode::kInvalidArgument);
}

TEST(ProfReports, SummaryJsonCsvText) {
  tg::Options o;
  std::string json;
  tg::generate(o, &json);
  mp::Trace t = read_str(json);
  mp::Summary s;
  ASSERT_TRUE(mp::summarize(t, mp::Rules(), &s).ok());
  auto j = nlohmann::json::parse(mp::summary_json(s, 5));
  EXPECT_EQ(j["schema"], "molora.prof.summary/1");
  EXPECT_NEAR(j["kernel_us"].get<double>(), s.kernel_us, 1e-9);
  EXPECT_EQ(j["categories"].size(), static_cast<size_t>(mp::kNumCategories));
  EXPECT_EQ(j["top_kernels"].size(), 5u);
  EXPECT_NE(mp::summary_text(s, 5).find("kernel total"), std::string::npos);
  EXPECT_NE(mp::summary_csv(s, 5).find("category,moe,moe"), std::string::npos);
  // --top -1: every kernel, in every format
  ASSERT_GT(s.top.size(), 5u);
  auto lines = [](const std::string& x) { return std::count(x.begin(), x.end(), '\n'); };
  EXPECT_EQ(lines(mp::summary_text(s, -1)) - lines(mp::summary_text(s, 0)),
            static_cast<long>(s.top.size()));
  EXPECT_EQ(nlohmann::json::parse(mp::summary_json(s, -1))["top_kernels"].size(), s.top.size());
  // diff CSV carries the totals the text table has
  std::string dc = mp::diff_csv(s, s, 3);
  for (const char* row : {"total,kernel total,", "total,busy,", "total,wall,"})
    EXPECT_NE(dc.find(row), std::string::npos) << row << "\n" << dc;
}

TEST(ProfRanks, SkewAndSlowestRank) {
  std::vector<mp::Summary> sums;
  for (int r = 0; r < 3; ++r) {
    tg::Options o;
    o.rank = r;
    o.scale = r == 1 ? 1.5 : 1.0;  // rank 1 computes slowest
    std::string json;
    tg::generate(o, &json);
    mp::Trace t = read_str(json);
    EXPECT_EQ(t.rank, r);
    mp::Summary s;
    ASSERT_TRUE(mp::summarize(t, mp::Rules(), &s).ok());
    sums.push_back(s);
  }
  auto j = nlohmann::json::parse(mp::ranks_json(sums));
  EXPECT_EQ(j["schema"], "molora.prof.ranks/1");
  EXPECT_EQ(j["slowest_rank"], 1);
  EXPECT_GT(j["skew_us"]["moe"].get<double>(), 0);
  EXPECT_NE(mp::ranks_text(sums).find("slowest rank: 1"), std::string::npos);
  auto d = nlohmann::json::parse(mp::diff_json(sums[0], sums[1], 10));
  EXPECT_EQ(d["schema"], "molora.prof.diff/1");
  EXPECT_NEAR(d["categories"][0]["delta_us"].get<double>(),
              sums[1].categories[0].time_us - sums[0].categories[0].time_us, 1e-9);
  EXPECT_NE(mp::diff_text(sums[0], sums[1], 10).find("kernel total"), std::string::npos);
  EXPECT_NE(mp::ranks_csv(sums).find("rank,path"), std::string::npos);
}

}  // namespace
