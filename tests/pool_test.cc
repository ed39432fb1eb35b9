// pool CPU suite: safetensors reader (valid and hostile files), dtype conversion and the slot
// policy (LRU, pins, −1, limits). PEFT loading into the slot layout: pool_peft_test.cc.
#include "molora/pool.h"

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

// ---- create -------------------------------------------------------------------------------

// Every field within its limit, the storage past 2^63 bytes: an error naming the sizes. The
// product (slots x layers x bytes per slot and layer) wrapped before, and a host pool of a few
// bytes was created, "ok", for it.
TEST(PoolCreate, StoragePastInt64IsAnErrorNotAWrap) {
  PoolConfig c;
  c.num_slots = 4096, c.num_layers = 1024, c.num_experts = 65536;
  c.hidden = 1 << 20, c.intermediate = 1 << 20, c.r_max = 1024;
  c.dtype = DType::kF32, c.device = -1;
  std::unique_ptr<AdapterPool> p;
  const Status st = AdapterPool::create(c, &p);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("exceeds 2^63 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(p, nullptr);
}

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
