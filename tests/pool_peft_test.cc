// pool CPU suite, PEFT loading: adapters land in the slot layout exactly (source x slot dtypes,
// fused and separate gate/up), missing modules and experts, scales (alpha/r, rsLoRA, patterns,
// per-expert scales folded into B), Mixtral and adapter-named weights, target_modules forms, and
// broken or hostile adapters rejected with the pool unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "molora/safetensors.h"
#include "pool_test_util.h"

namespace molora {
namespace {

using pooltest::Model;
using pooltest::PoolFiles;
using pooltest::Spec;

// ---- PEFT loading ---------------------------------------------------------------------------

struct LoadCase {
  const char* src;
  DType dst;
  bool fused;
};

class PoolLoad : public PoolFiles, public ::testing::WithParamInterface<LoadCase> {};

TEST_P(PoolLoad, SlotHoldsTheAdapterExactly) {
  Model m;
  Spec s;
  s.dtype = GetParam().src;
  s.fused = GetParam().fused;
  s.seed = 3;
  s.attention = true;
  std::string dir = pooltest::write_adapter(root, "a", m, s);
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 2, GetParam().dst), &pool).ok());
  int32_t id = -1;
  Status st = pool->load("a", dir, &id);
  ASSERT_TRUE(st.ok()) << st.to_string();
  AdapterInfo info;
  ASSERT_TRUE(pool->info(id, &info).ok());
  EXPECT_EQ(info.ignored_tensors, 1);
  EXPECT_EQ(info.max_rank, 4);
  int32_t ids[3] = {-1, id, -1}, slots[3] = {7, 7, 7};
  ASSERT_TRUE(pool->prepare(ids, 3, slots).ok());
  EXPECT_EQ(slots[0], -1);
  EXPECT_EQ(slots[2], -1);
  ASSERT_GE(slots[1], 0);
  pooltest::expect_slot(*pool, m, slots[1], s);
  PoolLayerTensors t;
  ASSERT_TRUE(pool->layer_tensors(1, &t).ok());
  for (int mod = 0; mod < 3; ++mod) {
    EXPECT_EQ(t.rank[mod * 2 + slots[1]], 4);
    EXPECT_EQ(t.rank[mod * 2 + (1 - slots[1])], 0);  // the empty slot
    EXPECT_FLOAT_EQ(t.scale[mod * 2 + slots[1]], 2.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, PoolLoad,
    ::testing::Values(LoadCase{"F32", DType::kF32, false}, LoadCase{"F32", DType::kBF16, false},
                      LoadCase{"BF16", DType::kBF16, false}, LoadCase{"F16", DType::kF16, false},
                      LoadCase{"F16", DType::kF32, true}, LoadCase{"BF16", DType::kF16, true}));

TEST_F(PoolFiles, MissingModulesAndExpertsAreZeroWithRankZero) {
  Model m;
  Spec s;
  s.down = false;
  s.experts = 2;
  std::string dir = pooltest::write_adapter(root, "a", m, s);
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 1, DType::kF32), &pool).ok());
  int32_t id, slot;
  ASSERT_TRUE(pool->load("a", dir, &id).ok());
  ASSERT_TRUE(pool->prepare(&id, 1, &slot).ok());
  pooltest::expect_slot(*pool, m, slot, s);
  PoolLayerTensors t;
  ASSERT_TRUE(pool->layer_tensors(0, &t).ok());
  EXPECT_EQ(t.rank[kPoolGate], 4);
  EXPECT_EQ(t.rank[kPoolDown], 0);
}

TEST_F(PoolFiles, ScalesRsloraAndPatterns) {
  Model m;
  m.r_max = 16;
  Spec s;
  s.r = 4;
  s.alpha = 16;
  s.rslora = true;
  std::string dir = pooltest::write_adapter(root, "rs", m, s);
  // rank_pattern / alpha_pattern: down_proj of layer 1 has rank 8 and alpha 4.
  Spec p;
  p.alpha = 8;
  p.extra_config = R"(, "rank_pattern": {"layers.1.mlp.experts.\\d+.down_proj": 8},
                      "alpha_pattern": {"down_proj": 4})";
  auto ts = pooltest::adapter_tensors(m, p);
  for (auto& t : ts)
    if (t.name.find("layers.1.") != std::string::npos &&
        t.name.find("down_proj") != std::string::npos) {
      bool a = t.name.find("lora_A") != std::string::npos;
      int e = t.name[t.name.find("experts.") + 8] - '0';
      t = pooltest::make_tensor(t.name, "F32", a ? 8 : m.H, a ? m.I : 8, 0, 1, 2, e, a ? 0 : 1);
    }
  std::string pdir = pooltest::write_adapter(root, "pat", m, p, &ts);
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 2, DType::kF32), &pool).ok());
  int32_t ids[2], slots[2];
  ASSERT_TRUE(pool->load("rs", dir, &ids[0]).ok());
  Status st = pool->load("pat", pdir, &ids[1]);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(pool->prepare(ids, 2, slots).ok());
  PoolLayerTensors t0, t1;
  ASSERT_TRUE(pool->layer_tensors(0, &t0).ok());
  ASSERT_TRUE(pool->layer_tensors(1, &t1).ok());
  EXPECT_FLOAT_EQ(t0.scale[kPoolGate * 2 + slots[0]], 16.0f / 2.0f);  // alpha / sqrt(4)
  EXPECT_FLOAT_EQ(t0.scale[kPoolGate * 2 + slots[1]], 8.0f / 4.0f);
  EXPECT_FLOAT_EQ(t0.scale[kPoolDown * 2 + slots[1]], 4.0f / 4.0f);  // alpha_pattern
  EXPECT_EQ(t0.rank[kPoolDown * 2 + slots[1]], 4);
  EXPECT_EQ(t1.rank[kPoolDown * 2 + slots[1]], 8);  // rank_pattern
  EXPECT_FLOAT_EQ(t1.scale[kPoolDown * 2 + slots[1]], 4.0f / 8.0f);
}

struct BadAdapter {
  const char* what;
  StatusCode code;
  const char* expect;
};

TEST_F(PoolFiles, BrokenAdaptersAreRejectedAndThePoolIsUnchanged) {
  Model m;
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 2, DType::kBF16), &pool).ok());
  Spec good;
  int32_t gid, slot;
  ASSERT_TRUE(pool->load("good", pooltest::write_adapter(root, "good", m, good), &gid).ok());
  ASSERT_TRUE(pool->prepare(&gid, 1, &slot).ok());
  const PoolStats before = pool->stats();

  auto base = [&] { return pooltest::adapter_tensors(m, good); };
  auto find = [](std::vector<pool::StWriteTensor>& ts,
                 const std::string& sub) -> pool::StWriteTensor& {
    for (auto& t : ts)
      if (t.name.find(sub) != std::string::npos) return t;
    static pool::StWriteTensor none;
    return none;
  };
  const std::string a000 = "layers.0.mlp.experts.0.gate_proj.lora_A";
  const std::string b000 = "layers.0.mlp.experts.0.gate_proj.lora_B";
  int n = 0;
  auto check = [&](const char* what, std::vector<pool::StWriteTensor> ts, StatusCode code,
                   const char* expect, const std::string& tensor, Spec spec = Spec()) {
    SCOPED_TRACE(what);
    std::string name = "bad" + std::to_string(n++);
    std::string dir = pooltest::write_adapter(root, name, m, spec, &ts);
    int32_t id = -1;
    Status s = pool->load(name, dir, &id);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(dir), std::string::npos) << s.message();
    if (!tensor.empty()) {
      EXPECT_NE(s.message().find(tensor), std::string::npos) << s.message();
    }
    EXPECT_EQ(id, -1);
    PoolStats now = pool->stats();
    EXPECT_EQ(now.adapters, before.adapters);
    EXPECT_EQ(now.host_image_bytes, before.host_image_bytes);
    int32_t f;
    EXPECT_EQ(pool->find(name, &f).code(), StatusCode::kNotFound);
  };
  {
    auto ts = base();
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [&](auto& t) { return t.name.find(b000) != std::string::npos; }),
             ts.end());
    check("missing B", ts, StatusCode::kParseError, "lora_A without its lora_B", a000);
  }
  {
    auto ts = base();
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [&](auto& t) { return t.name.find(a000) != std::string::npos; }),
             ts.end());
    check("missing A", ts, StatusCode::kParseError, "lora_B without its lora_A", b000);
  }
  {
    auto ts = base();
    auto& b = find(ts, b000);
    b = pooltest::make_tensor(b.name, "F32", m.I, 3, 0, 0, 0, 0, 1);
    check("A/B rank mismatch", ts, StatusCode::kParseError, "has rank 4 but", b000);
  }
  {
    Spec big;
    big.r = 9;  // r_max is 8
    check("rank over r_max", pooltest::adapter_tensors(m, big), StatusCode::kOutOfRange,
          "exceeds the pool's r_max 8", "lora_A", big);
  }
  {
    auto ts = base();
    auto& a = find(ts, a000);
    a = pooltest::make_tensor(a.name, "F32", 4, m.H + 1, 0, 0, 0, 0, 0);
    check("A shape", ts, StatusCode::kInvalidArgument, "does not match the model", a000);
  }
  {
    auto ts = base();
    auto& b = find(ts, b000);
    b = pooltest::make_tensor(b.name, "F32", m.I * 2, 4, 0, 0, 0, 0, 1);
    check("B shape", ts, StatusCode::kInvalidArgument, "does not match the model", b000);
  }
  {
    Model big = m;
    big.L = 3;
    check("layer past the model", pooltest::adapter_tensors(big, good),
          StatusCode::kInvalidArgument, "past the model's 2 layers", "layers.2.");
  }
  {
    Model big = m;
    big.E = 4;
    check("expert past the model", pooltest::adapter_tensors(big, good),
          StatusCode::kInvalidArgument, "past the model's 3 experts", "experts.3.");
  }
  {
    auto ts = base();
    auto& a = find(ts, a000);
    a.dtype = "I32";
    check("integer dtype", ts, StatusCode::kParseError, "not supported", a000);
  }
  {
    Spec cfg;
    cfg.r = 8;  // the file's tensors have rank 4
    check("config rank disagrees", base(), StatusCode::kParseError, "adapter_config.json gives 8",
          a000, cfg);
  }
  {
    Spec dora;
    dora.extra_config = ", \"use_dora\": true";
    check("DoRA", base(), StatusCode::kParseError, "DoRA", "", dora);
  }
  {
    auto ts = base();
    auto extra = find(ts, a000);
    extra.name = "base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.default.weight";
    ts.push_back(extra);
    check("duplicate A", ts, StatusCode::kParseError, "duplicate lora_A", "lora_A.default");
  }
  {
    auto ts = base();
    ts.push_back(pooltest::make_tensor(
        "base_model.model.model.layers.0.mlp.experts.0.gate_up_proj.lora_A.weight", "F32", 4, m.H,
        0, 0, 3, 0, 0));
    ts.push_back(pooltest::make_tensor(
        "base_model.model.model.layers.0.mlp.experts.0.gate_up_proj.lora_B.weight", "F32", 2 * m.I,
        4, 0, 0, 3, 0, 1));
    check("fused and separate", ts, StatusCode::kParseError, "both gate_up_proj and",
          "gate_up_proj");
  }
  {
    std::vector<pool::StWriteTensor> none = {
        pooltest::make_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                              "F32", 4, m.H, 0, 0, 0, 0, 0)};
    check("no expert tensors", none, StatusCode::kParseError, "no routed-expert LoRA", "");
  }
  {  // a broken safetensors file surfaces the reader's error
    std::string dir = root + "/hostile";
    ::mkdir(dir.c_str(), 0755);
    pooltest::write_config(dir, good);
    ASSERT_TRUE(pool::write_raw_safetensors(dir + "/adapter_model.safetensors", "{\"x\": 1}", {}));
    int32_t id;
    Status s = pool->load("hostile", dir, &id);
    EXPECT_EQ(s.code(), StatusCode::kParseError);
    EXPECT_NE(s.message().find("adapter_model.safetensors"), std::string::npos);
  }
  {  // bad adapter_config.json
    std::string dir = root + "/badcfg";
    ::mkdir(dir.c_str(), 0755);
    std::ofstream(dir + "/adapter_config.json") << "{\"r\": \"four\"}";
    int32_t id;
    Status s = pool->load("badcfg", dir, &id);
    EXPECT_EQ(s.code(), StatusCode::kParseError);
    EXPECT_NE(s.message().find("adapter_config.json"), std::string::npos);
  }
  int32_t id;
  EXPECT_EQ(pool->load("missing", root + "/nothing-here", &id).code(), StatusCode::kIoError);
  EXPECT_EQ(pool->load("good", root + "/good", &id).code(), StatusCode::kInvalidArgument);
  // The good adapter is still resident and intact.
  pooltest::expect_slot(*pool, m, slot, good);
  EXPECT_EQ(pool->stats().uploads, before.uploads);
}

// Rewrites the adapter_config.json of `dir` with `json`.
void rewrite_config(const std::string& dir, const std::string& json) {
  std::ofstream(dir + "/adapter_config.json", std::ios::trunc) << json;
}

TEST_F(PoolFiles, MixtralNamesAndAdapterNamedWeightsMapLikeTheDefaultNames) {
  // Mixtral: <...>.block_sparse_moe.experts.{E}.{w1 = gate, w3 = up, w2 = down}, and PEFT's
  // ".lora_A.<adapter>.weight" spelling.
  Model m;
  Spec s;
  s.seed = 5;
  auto ts = pooltest::adapter_tensors(m, s);
  auto swap = [](std::string* n, const std::string& from, const std::string& to) {
    size_t p = n->find(from);
    if (p != std::string::npos) n->replace(p, from.size(), to);
  };
  for (size_t i = 0; i < ts.size(); ++i) {
    std::string& n = ts[i].name;
    swap(&n, ".mlp.experts.", ".block_sparse_moe.experts.");
    swap(&n, ".gate_proj.", ".w1.");
    swap(&n, ".up_proj.", ".w3.");
    swap(&n, ".down_proj.", ".w2.");
    if (i % 2 == 0) swap(&n, ".weight", ".default.weight");
  }
  std::string dir = pooltest::write_adapter(root, "mixtral", m, s, &ts);
  rewrite_config(dir, R"({"r": 4, "lora_alpha": 8, "target_modules": ["w1", "w2", "w3"]})");
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 1, DType::kF32), &pool).ok());
  int32_t id, slot;
  Status st = pool->load("mixtral", dir, &id);
  ASSERT_TRUE(st.ok()) << st.to_string();
  AdapterInfo info;
  ASSERT_TRUE(pool->info(id, &info).ok());
  EXPECT_EQ(info.ignored_tensors, 0);
  EXPECT_EQ(info.tensors, m.L * m.E * 3);  // (A, B) pairs placed
  ASSERT_TRUE(pool->prepare(&id, 1, &slot).ok());
  pooltest::expect_slot(*pool, m, slot, s);
}

TEST_F(PoolFiles, TargetModulesListRegexAndAllLinear) {
  Model m;
  Spec s;
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 1, DType::kF32), &pool).ok());
  std::string dir = pooltest::write_adapter(root, "t", m, s);
  int32_t id = -1;
  // A list that leaves gate_proj out: the file's gate_proj tensors are an error naming them.
  rewrite_config(dir, R"({"r": 4, "lora_alpha": 8, "target_modules": ["up_proj", "down_proj"]})");
  Status st = pool->load("list", dir, &id);
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.to_string();
  EXPECT_NE(st.message().find("is not in target_modules"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("gate_proj.lora_"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
  // A regex is a full match of the module name, as in PEFT.
  rewrite_config(
      dir,
      R"({"r": 4, "lora_alpha": 8, "target_modules": ".*experts\\.\\d+\\.(gate|up|down)_proj"})");
  st = pool->load("regex", dir, &id);
  EXPECT_TRUE(st.ok()) << st.to_string();
  rewrite_config(dir, R"({"r": 4, "lora_alpha": 8, "target_modules": ".*\\.up_proj"})");
  st = pool->load("regex-miss", dir, &id);
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.to_string();
  rewrite_config(dir, R"({"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})");
  st = pool->load("all", dir, &id);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(pool->stats().adapters, 2);
}

TEST_F(PoolFiles, DifferentScalesAcrossExpertsAreFoldedIntoB) {
  // rank_pattern gives expert 1's down_proj of layer 0 rank 8 (scale 8/8 = 1) while the other
  // experts keep r = 4 (scale 8/4 = 2): one slot scale cannot hold both, so each expert's scale
  // is multiplied into its lora_B and the module's slot scale is 1.
  Model m;
  Spec s;
  s.extra_config = R"(, "rank_pattern": {"model.layers.0.mlp.experts.1.down_proj": 8})";
  auto ts = pooltest::adapter_tensors(m, s);
  for (auto& t : ts)
    if (t.name.find("layers.0.mlp.experts.1.down_proj") != std::string::npos) {
      const bool a = t.name.find("lora_A") != std::string::npos;
      t = pooltest::make_tensor(t.name, "F32", a ? 8 : m.H, a ? m.I : 8, 0, 0, 2, 1, a ? 0 : 1);
    }
  std::string dir = pooltest::write_adapter(root, "fold", m, s, &ts);
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 1, DType::kF32), &pool).ok());
  int32_t id, slot;
  Status st = pool->load("fold", dir, &id);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(pool->prepare(&id, 1, &slot).ok());
  PoolLayerTensors t0, t1;
  ASSERT_TRUE(pool->layer_tensors(0, &t0).ok());
  ASSERT_TRUE(pool->layer_tensors(1, &t1).ok());
  EXPECT_EQ(t0.rank[kPoolDown], 8);  // the largest rank of the module
  EXPECT_EQ(t0.scale[kPoolDown], 1.0f);
  EXPECT_EQ(t0.scale[kPoolGate], 2.0f);  // other modules and layers keep alpha / r
  EXPECT_EQ(t1.scale[kPoolDown], 2.0f);
  const int64_t H = m.H, R = m.r_max;
  std::vector<float> b(t0.b_slot_stride[kPoolDown]);
  ASSERT_TRUE(pool->read_back(t0.b_down, b.size() * 4, b.data()).ok());
  for (int e = 0; e < m.E; ++e) {
    const int r = e == 1 ? 8 : 4;
    const float mul = e == 1 ? 1.0f : 2.0f;
    for (int64_t n = 0; n < H; ++n)
      for (int j = 0; j < R; ++j) {
        const float want =
            j < r ? pooltest::enc(e == 1 ? 0 : s.seed, 0, 2, e, 1, n, j) * mul : 0.0f;
        ASSERT_EQ(b[(e * H + n) * R + j], want) << "expert " << e << " [" << n << "," << j << "]";
      }
  }
}

TEST_F(PoolFiles, MoreHostileAdapters) {
  Model m;
  std::unique_ptr<AdapterPool> pool;
  ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 1, DType::kBF16), &pool).ok());
  Spec s;
  const std::string a000 = "layers.0.mlp.experts.0.gate_proj.lora_A";
  auto expect_error = [&](const char* what, const std::string& dir, StatusCode code,
                          const char* msg, const std::string& tensor) {
    SCOPED_TRACE(what);
    int32_t id = -1;
    Status st = pool->load(what, dir, &id);
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(msg), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
    if (!tensor.empty()) {
      EXPECT_NE(st.message().find(tensor), std::string::npos) << st.message();
    }
    EXPECT_EQ(id, -1);
    EXPECT_EQ(pool->stats().adapters, 0);
    EXPECT_EQ(pool->stats().host_image_bytes, 0);
  };
  {
    auto ts = pooltest::adapter_tensors(m, s);
    for (auto& t : ts)
      if (t.name.find("layers.0.mlp.experts.0.gate_proj.") != std::string::npos) {
        const bool a = t.name.find("lora_A") != std::string::npos;
        t = {t.name, "F32", a ? std::vector<int64_t>{0, m.H} : std::vector<int64_t>{m.I, 0}, {}};
      }
    expect_error("rank 0", pooltest::write_adapter(root, "r0", m, s, &ts), StatusCode::kParseError,
                 "rank 0", a000);
  }
  {
    auto ts = pooltest::adapter_tensors(m, s);
    for (auto& t : ts)
      if (t.name.find(a000) != std::string::npos) t.shape = {2, 2, m.H};  // same bytes, 3-D
    expect_error("3-D A", pooltest::write_adapter(root, "a3", m, s, &ts),
                 StatusCode::kInvalidArgument, "does not match the model", a000);
  }
  {  // adapter_config.json over 16 MB is refused before it is read (sparse file)
    std::string dir = pooltest::write_adapter(root, "bigcfg", m, s);
    ASSERT_EQ(::truncate((dir + "/adapter_config.json").c_str(), 17 << 20), 0);
    expect_error("huge config", dir, StatusCode::kParseError, "exceeds the limit",
                 "adapter_config.json");
  }
  {
    std::string dir = pooltest::write_adapter(root, "notobj", m, s);
    rewrite_config(dir, "[4]");
    expect_error("config not an object", dir, StatusCode::kParseError, "not a JSON object", "");
    rewrite_config(dir, R"({"r": 4, "rank_pattern": {"down_proj": -1}})");
    expect_error("negative rank_pattern", dir, StatusCode::kParseError, "positive integer",
                 "down_proj");
    rewrite_config(dir, R"({"r": 4, "peft_type": "IA3"})");
    expect_error("not LoRA", dir, StatusCode::kParseError, "peft_type", "");
    rewrite_config(dir, R"({"r": 4, "fan_in_fan_out": true})");
    expect_error("fan_in_fan_out", dir, StatusCode::kParseError, "fan_in_fan_out", "");
  }
  {  // regexes of the config: bounded, never a crash (deep groups) or a hang (backtracking)
    std::string dir = pooltest::write_adapter(root, "regex", m, s);
    const std::string deep = std::string(100000, '(') + "x" + std::string(100000, ')');
    rewrite_config(dir, R"({"r": 4, "rank_pattern": {")" + deep + R"(": 8}})");
    expect_error("deep rank_pattern key", dir, StatusCode::kParseError, "longer than 512", "");
    const std::string groups = std::string(40, '(') + "x" + std::string(40, ')');
    rewrite_config(dir, R"({"r": 4, "alpha_pattern": {")" + groups + R"(": 8}})");
    expect_error("many groups", dir, StatusCode::kParseError, "more than 32 groups", "");
    rewrite_config(dir, R"({"r": 4, "alpha_pattern": {"down[": 8}})");
    expect_error("bad regex", dir, StatusCode::kParseError, "not a valid regex", "down[");
    // Exponential for a backtracking matcher on these ~45-character module names.
    rewrite_config(dir, R"({"r": 4, "target_modules": "(.*)*(.*)*(.*)*(.*)*(.*)*Q"})");
    expect_error("backtracking regex", dir, StatusCode::kParseError, "not in target_modules",
                 "gate_proj");
    rewrite_config(dir, R"({"r": 4, "rank_pattern": {"(.*)*(.*)*(.*)*(.*)*(.*)*Q": 8}})");
    int32_t id = -1;
    Status st = pool->load("backtracking pattern", dir, &id);  // matches nothing: r = 4 holds
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (st.ok()) {
      ASSERT_TRUE(pool->unload(id).ok());
    }
    // A config nested a million levels deep is parsed without recursion.
    rewrite_config(dir, std::string(1000000, '[') + std::string(1000000, ']'));
    expect_error("deep config", dir, StatusCode::kParseError, "not a JSON object", "");
  }
  {  // no adapter_model.safetensors
    std::string dir = pooltest::write_adapter(root, "nofile", m, s);
    ASSERT_EQ(::unlink((dir + "/adapter_model.safetensors").c_str()), 0);
    expect_error("no safetensors", dir, StatusCode::kIoError, "cannot open",
                 "adapter_model.safetensors");
  }
}

}  // namespace
}  // namespace molora
