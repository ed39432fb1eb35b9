// pool CPU suite: safetensors reader (valid and hostile files), dtype conversion, PEFT loading
// into the slot layout, scales, and the slot policy (LRU, pins, −1, limits).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "molora/safetensors.h"
#include "pool_test_util.h"

namespace molora {
namespace {

using pooltest::Model;
using pooltest::Spec;

class PoolFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root = pooltest::temp_dir("cpu");
    ASSERT_FALSE(root.empty());
  }
  void TearDown() override { std::system(("rm -rf '" + root + "'").c_str()); }
  std::string root;
};

// ---- safetensors reader ---------------------------------------------------------------------

TEST_F(PoolFiles, ReadsValidFile) {
  std::vector<pool::StWriteTensor> ts = {
      pooltest::make_tensor("a", "F32", 2, 3, 1, 0, 0, 0, 0),
      pooltest::make_tensor("b", "BF16", 4, 1, 1, 0, 1, 0, 0),
      {"empty", "F16", {0, 5}, {}},
  };
  std::string p = root + "/x.safetensors";
  ASSERT_TRUE(pool::write_safetensors(p, ts));
  std::unique_ptr<SafetensorsFile> f;
  Status s = SafetensorsFile::open(p, &f);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const StHeader& h = f->header();
  ASSERT_EQ(h.tensors.size(), 3u);
  int64_t ia = h.find("a"), ib = h.find("b");
  ASSERT_GE(ia, 0);
  ASSERT_GE(ib, 0);
  EXPECT_EQ(h.find("nope"), -1);
  EXPECT_EQ(h.tensors[ia].dtype, StDType::kF32);
  EXPECT_EQ(h.tensors[ia].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(f->data(h.tensors[ia]), ts[0].bytes.data(), ts[0].bytes.size()), 0);
  EXPECT_EQ(std::memcmp(f->data(h.tensors[ib]), ts[1].bytes.data(), ts[1].bytes.size()), 0);
  EXPECT_EQ(h.tensors[h.find("empty")].numel(), 0u);
}

TEST_F(PoolFiles, MetadataAndWhitespace) {
  std::string j = R"( {"__metadata__": {"format": "pt", "x": "y"},
                      "t": {"shape": [2], "dtype": "F32", "data_offsets": [0, 8]}}   )";
  j = "{" + j.substr(2);
  std::string p = root + "/m.safetensors";
  ASSERT_TRUE(pool::write_raw_safetensors(p, j, std::vector<uint8_t>(8, 0)));
  std::unique_ptr<SafetensorsFile> f;
  Status s = SafetensorsFile::open(p, &f);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(f->header().metadata.size(), 2u);
  EXPECT_EQ(f->header().metadata[0].first, "format");
}

struct Hostile {
  const char* what;
  std::string json;    // header (used unless raw is set)
  size_t data_bytes;   // zero bytes after the header
  const char* expect;  // substring of the message
  const char* tensor;  // tensor name that must be named ("" = none)
};

TEST_F(PoolFiles, HostileHeadersAreParseErrorsNamingFileAndTensor) {
  const std::string t8 = R"("t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  std::vector<Hostile> cases = {
      {"bad json", "{\"t\": {\"dtype\": ", 0, "bad JSON", ""},
      {"not an object", "[1, 2]", 0, "does not start with '{'", ""},
      {"trailing garbage", "{" + t8 + "} x", 8, "bad JSON", ""},
      {"unknown dtype", R"({"t": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8,
       "unknown dtype", "t"},
      {"shape x dtype != range", R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       8, "span", "t"},
      {"range past buffer", R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
       "past the data buffer", "t"},
      {"reversed", R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}})", 8, "reversed",
       "t"},
      {"overlap",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap", "b"},
      {"gap", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8, "gap", "t"},
      {"buffer not covered", "{" + t8 + "}", 16, "cover 8 of the 16", ""},
      {"duplicate tensor", "{" + t8 + ", " + t8 + "}", 8, "duplicate tensor", "t"},
      {"negative dim", R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8,
       "negative", "t"},
      {"float dim", R"({"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", 8,
       "non-integer", "t"},
      {"missing field", R"({"t": {"dtype": "F32", "shape": [2]}})", 8, "needs dtype", "t"},
      {"unknown field", R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}})",
       8, "unknown field", "t"},
      {"3 offsets", R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}})", 8,
       "2 numbers", "t"},
      {"nested", R"({"t": {"dtype": {"a": {"b": 1}}, "shape": [2], "data_offsets": [0, 8]}})", 8,
       "unexpected object", "t"},
      {"overflowing shape",
       R"({"t": {"dtype": "F64", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 8]}})",
       8, "overflow", "t"},
      {"metadata not string", R"({"__metadata__": {"a": 1}})", 0, "unexpected number", ""},
      {"null", R"({"t": null})", 0, "null", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string p = root + "/hostile.safetensors";
    ASSERT_TRUE(pool::write_raw_safetensors(p, c.json, std::vector<uint8_t>(c.data_bytes, 0)));
    std::unique_ptr<SafetensorsFile> f;
    Status s = SafetensorsFile::open(p, &f);
    EXPECT_EQ(s.code(), StatusCode::kParseError) << s.to_string();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
    if (*c.tensor) {
      EXPECT_NE(s.message().find(std::string("\"") + c.tensor + "\""), std::string::npos)
          << s.message();
    }
    EXPECT_EQ(f, nullptr);
  }
}

TEST_F(PoolFiles, HostileLengths) {
  std::string p = root + "/len.safetensors";
  auto write = [&](uint64_t n, size_t extra) {
    std::vector<uint8_t> b(8 + extra, '{');
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
    FILE* f = std::fopen(p.c_str(), "wb");
    std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
  };
  std::unique_ptr<SafetensorsFile> f;
  write(100, 10);  // header length past the file
  Status s = SafetensorsFile::open(p, &f);
  EXPECT_EQ(s.code(), StatusCode::kParseError);
  EXPECT_NE(s.message().find("past the end of the file"), std::string::npos) << s.message();
  write(~0ull, 10);  // huge header: refused before any allocation
  s = SafetensorsFile::open(p, &f);
  EXPECT_NE(s.message().find("exceeds the limit"), std::string::npos) << s.message();
  write(kMaxSafetensorsHeaderBytes + 1, 10);
  s = SafetensorsFile::open(p, &f);
  EXPECT_NE(s.message().find("exceeds the limit"), std::string::npos) << s.message();
  {  // shorter than 8 bytes
    FILE* fp = std::fopen(p.c_str(), "wb");
    std::fwrite("abc", 1, 3, fp);
    std::fclose(fp);
  }
  s = SafetensorsFile::open(p, &f);
  EXPECT_EQ(s.code(), StatusCode::kParseError);
  EXPECT_NE(s.message().find("shorter than"), std::string::npos);
  s = SafetensorsFile::open(root + "/does-not-exist", &f);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  // Deep nesting is refused at depth 3, not recursed into.
  std::string deep =
      "{\"t\": {\"dtype\": " + std::string(100000, '[') + std::string(100000, ']') + "}}";
  ASSERT_TRUE(pool::write_raw_safetensors(p, deep, {}));
  s = SafetensorsFile::open(p, &f);
  EXPECT_EQ(s.code(), StatusCode::kParseError);
}

TEST(PoolParse, RandomBytesNeverCrash) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  rng.seed(seed);
  const std::string good = pool::st_header_json({{"a", "F32", {2}, std::vector<uint8_t>(8)}});
  for (int it = 0; it < 2000; ++it) {
    std::vector<uint8_t> b(8 + good.size() + 8);
    uint64_t n = good.size();
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
    std::memcpy(b.data() + 8, good.data(), good.size());
    int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    StHeader h;
    Status s = parse_safetensors(b.data(), b.size(), "rand", &h);
    if (s.ok()) {
      for (const auto& t : h.tensors) EXPECT_LE(t.end, b.size() - h.data_offset);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kParseError);
    }
  }
}

// ---- conversion -----------------------------------------------------------------------------

TEST(PoolConvert, HalfRoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = pool::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(pool::float_to_half(f), h) << h;
  }
  EXPECT_EQ(pool::float_to_half(65520.f), 0x7c00);  // rounds to inf
  EXPECT_EQ(pool::float_to_half(65519.f), 0x7bff);
  EXPECT_EQ(pool::float_to_half(std::ldexp(1.f, -25)), 0);  // tie → even (0)
  EXPECT_EQ(pool::float_to_half(std::ldexp(1.5f, -25)), 1);
  EXPECT_EQ(pool::float_to_half(1.0f + std::ldexp(1.f, -11)), 0x3c00);  // tie → even
  EXPECT_EQ(pool::float_to_half(1.0f + 3 * std::ldexp(1.f, -11)), 0x3c02);
  EXPECT_TRUE(std::isnan(pool::half_to_float(pool::float_to_half(NAN))));
}

TEST(PoolConvert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(pool::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(pool::float_to_bf16(1.0f + std::ldexp(1.f, -8)), 0x3f80);      // tie → even
  EXPECT_EQ(pool::float_to_bf16(1.0f + 3 * std::ldexp(1.f, -8)), 0x3f82);  // tie → even (up)
  EXPECT_TRUE(std::isnan(pool::bf16_to_float(pool::float_to_bf16(NAN))));
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = pool::bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(pool::float_to_bf16(f), h);
    }
  }
}

// ---- vectorised conversion loops against the scalar references -------------------------------

// Bits of element i of a buffer of dtype dt.
uint32_t elem_bits(DType dt, const uint8_t* p, int64_t i) {
  if (dt == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, p + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return h;
}

// The specification: same dtype and mul == 1 copies the bits; otherwise the scalar references.
uint32_t ref_bits(DType src, uint32_t bits, DType dst, float mul) {
  if (src == dst && mul == 1.0f) return bits;
  float f;
  if (src == DType::kF32) {
    std::memcpy(&f, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    f = src == DType::kBF16 ? pool::bf16_to_float(h) : pool::half_to_float(h);
  }
  if (mul != 1.0f) f *= mul;
  if (dst == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  return dst == DType::kBF16 ? pool::float_to_bf16(f) : pool::float_to_half(f);
}

// Source values of dtype dt: every 16-bit pattern (f16/bf16), or f32 specials (NaN payloads,
// infinities, zeros, f32 and f16 subnormals, f16 overflow and bf16/f16 rounding ties) followed
// by random bit patterns.
std::vector<uint8_t> conversion_inputs(DType dt, std::mt19937& gen, int64_t* n) {
  std::vector<uint8_t> b;
  if (dt != DType::kF32) {
    *n = 65536;
    b.resize(2 * 65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      b[2 * h] = static_cast<uint8_t>(h);
      b[2 * h + 1] = static_cast<uint8_t>(h >> 8);
    }
    return b;
  }
  std::vector<uint32_t> v = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
      0x7fbfffffu, 0xff812345u, 0x7fe00001u, 0x00000001u, 0x807fffffu, 0x00400000u, 0x7f7fffffu,
      0xff7fffffu, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0xc77ff000u, 0x38800000u, 0x387fffffu,
      0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu,
      0x3f800fffu, 0x3f801000u, 0x3f803000u, 0x7f7f8000u, 0x7f7f7fffu};
  for (int s = 0; s < 1 << 18; ++s) v.push_back(static_cast<uint32_t>(gen()));
  // Values that land on f16 subnormals and near ties after any multiply.
  for (int s = 0; s < 4096; ++s)
    v.push_back(0x33000000u + static_cast<uint32_t>(gen() % 0x5800000u));
  *n = static_cast<int64_t>(v.size());
  b.resize(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class PoolConvertLoops : public ::testing::TestWithParam<bool> {  // true: the baseline build
 protected:
  void SetUp() override {
    if (!pool::convert_force_baseline(GetParam()))
      GTEST_SKIP() << "this CPU has no AVX2 (the baseline run covers it)";
    EXPECT_STREQ(pool::convert_isa(), GetParam() ? "baseline" : "avx2");
  }
  void TearDown() override { pool::convert_force_baseline(false); }
};

const DType kConvDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
// 1 (no multiply), exact, inexact, tiny (results become f16/bf16 subnormals or zero), huge
// (results overflow to inf), negative.
const float kMuls[] = {1.0f, 0.375f, 1.7f, 3.0517578125e-5f, 1.5e-7f, 60000.0f, -0.4142135f};

TEST_P(PoolConvertLoops, EveryPairEqualsTheScalarReferenceBitForBit) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 gen(seed);
  for (DType src : kConvDTypes) {
    int64_t n = 0;
    const std::vector<uint8_t> in = conversion_inputs(src, gen, &n);
    const size_t ses = dtype_size(src);
    for (DType dst : kConvDTypes)
      for (float mul : kMuls) {
        SCOPED_TRACE(std::string(dtype_name(src)) + " -> " + dtype_name(dst) + " mul " +
                     std::to_string(mul));
        const size_t des = dtype_size(dst);
        // One long row (n is even), then an odd length read from an odd (unaligned) address.
        for (int64_t off : {int64_t{0}, int64_t{1}}) {
          const int64_t len = n - off;
          std::vector<uint8_t> src_buf(in.size() + 1);
          std::memcpy(src_buf.data() + 1, in.data() + off * ses, len * ses);
          std::vector<uint8_t> out((len + 1) * des, 0xab);
          pool::convert(src, src_buf.data() + 1, dst, out.data(), len, mul);
          int bad = 0;
          for (int64_t i = 0; i < len; ++i) {
            const uint32_t x = elem_bits(src, in.data(), i + off);
            const uint32_t want = ref_bits(src, x, dst, mul), got = elem_bits(dst, out.data(), i);
            if (got != want && bad++ < 5)
              ADD_FAILURE() << "element " << i << " input 0x" << std::hex << x << ": got 0x" << got
                            << ", want 0x" << want;
          }
          ASSERT_EQ(bad, 0);
          for (size_t k = len * des; k < out.size(); ++k) ASSERT_EQ(out[k], 0xab) << "overrun";
        }
      }
  }
}

TEST_P(PoolConvertLoops, RowsWithPaddingAndStridesEqualTheReference) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 gen(seed);
  struct Shape {
    int64_t rows, cols, src_gap_bytes, dst_pad;
  };
  const Shape shapes[] = {{1, 1, 0, 0},  {3, 7, 0, 9},   {5, 16, 0, 16}, {4, 17, 3, 15},
                          {2, 33, 1, 0}, {7, 31, 0, 1},  {64, 8, 0, 8},  {3, 0, 0, 4},
                          {0, 5, 0, 3},  {9, 127, 5, 1}, {2, 128, 0, 0}, {130, 4, 2, 124}};
  for (DType src : kConvDTypes)
    for (DType dst : kConvDTypes)
      for (float mul : {1.0f, 1.7f, -0.375f})
        for (const Shape& sh : shapes) {
          SCOPED_TRACE(std::string(dtype_name(src)) + " -> " + dtype_name(dst) + " mul " +
                       std::to_string(mul) + " rows " + std::to_string(sh.rows) + " cols " +
                       std::to_string(sh.cols) + " gap " + std::to_string(sh.src_gap_bytes) +
                       " pad " + std::to_string(sh.dst_pad));
          const size_t ses = dtype_size(src), des = dtype_size(dst);
          const int64_t src_row = sh.cols * static_cast<int64_t>(ses) + sh.src_gap_bytes;
          const int64_t stride = sh.cols + sh.dst_pad;
          std::vector<uint8_t> in(static_cast<size_t>(sh.rows * src_row + 1));
          for (auto& c : in) c = static_cast<uint8_t>(gen());
          const int64_t guard = 8;
          std::vector<uint8_t> out(static_cast<size_t>((sh.rows * stride + guard) * des), 0xcd);
          pool::convert_rows(src, in.data() + 1, src_row, dst, out.data(), stride, sh.rows, sh.cols,
                             mul);
          int bad = 0;
          for (int64_t r = 0; r < sh.rows; ++r)
            for (int64_t c = 0; c < stride; ++c) {
              const uint32_t got = elem_bits(dst, out.data(), r * stride + c);
              uint32_t want = 0;
              if (c < sh.cols) {
                uint32_t x = 0;
                std::memcpy(&x, in.data() + 1 + r * src_row + c * static_cast<int64_t>(ses), ses);
                want = ref_bits(src, x, dst, mul);
              }
              if (got != want && bad++ < 5)
                ADD_FAILURE() << "[" << r << "," << c << "]: got 0x" << std::hex << got
                              << ", want 0x" << want;
            }
          ASSERT_EQ(bad, 0);
          for (size_t k = static_cast<size_t>(sh.rows * stride) * des; k < out.size(); ++k)
            ASSERT_EQ(out[k], 0xcd) << "overrun";
        }
}

INSTANTIATE_TEST_SUITE_P(Isa, PoolConvertLoops, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "baseline" : "avx2"; });

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

// ---- slot policy ----------------------------------------------------------------------------

class PoolPolicy : public PoolFiles {
 protected:
  void SetUp() override {
    PoolFiles::SetUp();
    m.L = 1;
    m.E = 2;
    m.H = 8;
    m.I = 8;
    ASSERT_TRUE(AdapterPool::create(pooltest::pool_config(m, 3, DType::kF32), &pool).ok());
    for (int i = 0; i < 6; ++i) {
      Spec s;
      s.seed = i;
      specs.push_back(s);
      std::string name = "ad" + std::to_string(i);
      int32_t id;
      ASSERT_TRUE(pool->load(name, pooltest::write_adapter(root, name, m, s), &id).ok());
      ids.push_back(id);
    }
  }
  std::vector<int32_t> run(std::vector<int32_t> batch, Status* s = nullptr) {
    std::vector<int32_t> out(batch.size(), 99);
    Status st = pool->prepare(batch.data(), static_cast<int64_t>(batch.size()), out.data());
    if (s)
      *s = st;
    else
      EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
  Model m;
  std::unique_ptr<AdapterPool> pool;
  std::vector<Spec> specs;
  std::vector<int32_t> ids;
};

TEST_F(PoolPolicy, BaseTokensTakeNoSlot) {
  auto out = run({-1, -1, -1, -1});
  EXPECT_EQ(out, (std::vector<int32_t>{-1, -1, -1, -1}));
  EXPECT_EQ(pool->stats().resident, 0);
  out = run({});
  EXPECT_EQ(pool->stats().uploads, 0);
}

TEST_F(PoolPolicy, FillsFreeSlotsThenEvictsLeastRecentlyUsed) {
  auto out = run({ids[0], -1, ids[1], ids[0], ids[2]});
  EXPECT_EQ(out, (std::vector<int32_t>{0, -1, 1, 0, 2}));
  run({ids[1]});
  run({ids[0]});
  // LRU order now: 2 (oldest), 1, 0 → ad3 takes ad2's slot 2.
  out = run({ids[3]});
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(pool->slot_adapter(2), ids[3]);
  out = run({ids[4], ids[0]});  // victim: ad1 (slot 1)
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0}));
  PoolStats st = pool->stats();
  EXPECT_EQ(st.evictions, 2);
  EXPECT_EQ(st.uploads, 5);
  for (int s = 0; s < 3; ++s) {
    int id = pool->slot_adapter(s);
    pooltest::expect_slot(*pool, m, s, specs[id]);
  }
}

TEST_F(PoolPolicy, LimitCountsOnlyRealAdaptersAndTooManyLeavesThePoolUnchanged) {
  // 3 slots: 3 distinct adapters plus base tokens fit.
  auto out = run({-1, ids[0], -1, ids[1], ids[2], -1});
  EXPECT_EQ(pool->stats().resident, 3);
  Status s;
  out = run({ids[3], ids[4], ids[5], ids[0]}, &s);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("4 distinct adapters"), std::string::npos) << s.message();
  EXPECT_EQ(out, (std::vector<int32_t>{99, 99, 99, 99}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pool->slot_adapter(i), ids[i]);
  EXPECT_EQ(pool->stats().rejected, 1);
  out = run({ids[0], 77}, &s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("adapter_ids[1] = 77"), std::string::npos);
  out = run({-2}, &s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST_F(PoolPolicy, PinnedAdaptersAreNeverEvicted) {
  run({ids[0], ids[1], ids[2]});
  ASSERT_TRUE(pool->pin(ids[0]).ok());
  ASSERT_TRUE(pool->pin(ids[1]).ok());
  auto out = run({ids[3]});  // only ad2 is evictable
  EXPECT_EQ(out[0], 2);
  Status s;
  out = run({ids[4], ids[5]}, &s);  // needs 2 slots, 1 evictable (ad3)
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("2 adapters pinned"), std::string::npos) << s.message();
  EXPECT_EQ(pool->slot_adapter(2), ids[3]);
  EXPECT_EQ(pool->unload(ids[0]).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(pool->unpin(ids[0]).ok());
  out = run({ids[4], ids[5]});  // now ad0 (LRU among unpinned... ad0 older than ad3) and ad3 go
  EXPECT_EQ(pool->slot_adapter(1), ids[1]);
  EXPECT_EQ(pool->stats().pinned, 1);
  ASSERT_TRUE(pool->unload(ids[4]).ok());
  EXPECT_EQ(pool->stats().resident, 2);
  EXPECT_EQ(pool->prepare(&ids[4], 1, &out[0]).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace molora
