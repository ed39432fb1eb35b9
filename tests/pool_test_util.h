// Test helpers of the pool suites: PEFT adapters written by the test itself, with
// position-encoded values (a wrong index shows as a wrong value), and the expected slot contents.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "molora/pool.h"
#include "pool/convert.h"
#include "pool/safetensors_writer.h"

namespace molora::pooltest {

struct Model {
  int L = 2, E = 3;
  int64_t H = 16, I = 8;
  int r_max = 8;
};

struct Spec {
  int r = 4;
  double alpha = 8;
  bool rslora = false;
  std::string dtype = "F32";  // of every tensor
  int seed = 0;
  bool fused = false;        // gate_up_proj instead of gate_proj + up_proj
  bool down = true;          // down_proj present
  int experts = -1;          // experts present (−1: all)
  std::string extra_config;  // appended JSON members, e.g. ,"rank_pattern": {...}
  bool attention = false;    // also write a q_proj LoRA (ignored by the pool)
};

// File module ids: 0 gate, 1 up, 2 down, 3 gate_up.
inline float enc(int seed, int l, int fm, int e, int isb, int64_t i, int64_t j) {
  int v =
      static_cast<int>((seed * 31 + l * 7 + fm * 3 + e * 5 + isb * 13 + i * 11 + j) % 251) - 125;
  return static_cast<float>(v) / 64.0f;
}

inline void put(const std::string& dt, float v, std::vector<uint8_t>* out) {
  if (dt == "F32") {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    out->insert(out->end(), b, b + 4);
  } else {
    uint16_t h = dt == "BF16" ? pool::float_to_bf16(v) : pool::float_to_half(v);
    out->push_back(static_cast<uint8_t>(h));
    out->push_back(static_cast<uint8_t>(h >> 8));
  }
}

inline std::string tensor_name(int l, int e, const std::string& proj, const char* ab) {
  return "base_model.model.model.layers." + std::to_string(l) + ".mlp.experts." +
         std::to_string(e) + "." + proj + ".lora_" + ab + ".weight";
}

inline pool::StWriteTensor make_tensor(const std::string& name, const std::string& dt, int64_t rows,
                                       int64_t cols, int seed, int l, int fm, int e, int isb) {
  pool::StWriteTensor t{name, dt, {rows, cols}, {}};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) put(dt, enc(seed, l, fm, e, isb, i, j), &t.bytes);
  return t;
}

inline std::string temp_dir(const std::string& tag) {
  std::string d = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") +
                  "/molora_pool_" + tag + "_" + std::to_string(::getpid()) + "_XXXXXX";
  std::vector<char> buf(d.begin(), d.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) return "";
  return buf.data();
}

inline void write_config(const std::string& dir, const Spec& s) {
  std::ofstream f(dir + "/adapter_config.json");
  f << "{\"peft_type\": \"LORA\", \"r\": " << s.r << ", \"lora_alpha\": " << s.alpha
    << ", \"use_rslora\": " << (s.rslora ? "true" : "false")
    << ", \"target_modules\": [\"gate_proj\", \"up_proj\", \"down_proj\", \"gate_up_proj\", "
       "\"q_proj\"]"
    << s.extra_config << "}";
}

inline std::vector<pool::StWriteTensor> adapter_tensors(const Model& m, const Spec& s) {
  std::vector<pool::StWriteTensor> ts;
  const int ne = s.experts < 0 ? m.E : s.experts;
  for (int l = 0; l < m.L; ++l)
    for (int e = 0; e < ne; ++e) {
      if (s.fused) {
        ts.push_back(make_tensor(tensor_name(l, e, "gate_up_proj", "A"), s.dtype, s.r, m.H, s.seed,
                                 l, 3, e, 0));
        ts.push_back(make_tensor(tensor_name(l, e, "gate_up_proj", "B"), s.dtype, 2 * m.I, s.r,
                                 s.seed, l, 3, e, 1));
      } else {
        ts.push_back(make_tensor(tensor_name(l, e, "gate_proj", "A"), s.dtype, s.r, m.H, s.seed, l,
                                 0, e, 0));
        ts.push_back(make_tensor(tensor_name(l, e, "gate_proj", "B"), s.dtype, m.I, s.r, s.seed, l,
                                 0, e, 1));
        ts.push_back(
            make_tensor(tensor_name(l, e, "up_proj", "A"), s.dtype, s.r, m.H, s.seed, l, 1, e, 0));
        ts.push_back(
            make_tensor(tensor_name(l, e, "up_proj", "B"), s.dtype, m.I, s.r, s.seed, l, 1, e, 1));
      }
      if (s.down) {
        ts.push_back(make_tensor(tensor_name(l, e, "down_proj", "A"), s.dtype, s.r, m.I, s.seed, l,
                                 2, e, 0));
        ts.push_back(make_tensor(tensor_name(l, e, "down_proj", "B"), s.dtype, m.H, s.r, s.seed, l,
                                 2, e, 1));
      }
    }
  if (s.attention) {
    ts.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                  s.dtype,
                  {s.r, m.H},
                  {}});
    for (int64_t i = 0; i < s.r * m.H; ++i) put(s.dtype, 1.0f, &ts.back().bytes);
  }
  return ts;
}

// Writes an adapter directory; returns its path.
inline std::string write_adapter(const std::string& root, const std::string& name, const Model& m,
                                 const Spec& s,
                                 std::vector<pool::StWriteTensor>* override = nullptr) {
  std::string dir = root + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  write_config(dir, s);
  auto ts = override ? *override : adapter_tensors(m, s);
  EXPECT_TRUE(pool::write_safetensors(dir + "/adapter_model.safetensors", ts));
  return dir;
}

inline PoolConfig pool_config(const Model& m, int slots, DType dt, int device = -1) {
  PoolConfig c;
  c.num_slots = slots;
  c.num_layers = m.L;
  c.num_experts = m.E;
  c.hidden = m.H;
  c.intermediate = m.I;
  c.r_max = m.r_max;
  c.dtype = dt;
  c.device = device;
  return c;
}

inline float load_elem(DType dt, const uint8_t* p) {
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == DType::kBF16 ? pool::bf16_to_float(h) : pool::half_to_float(h);
}

// Checks the slot of `s` in every layer of `pool` holds exactly the adapter of spec `s`.
inline void expect_slot(const AdapterPool& pool, const Model& m, int slot, const Spec& s) {
  const DType dt = pool.config().dtype;
  const size_t es = dtype_size(dt);
  const int R = m.r_max;
  const int ne = s.experts < 0 ? m.E : s.experts;
  for (int l = 0; l < m.L; ++l) {
    PoolLayerTensors t;
    ASSERT_TRUE(pool.layer_tensors(l, &t).ok());
    for (int mod = 0; mod < kPoolModules; ++mod) {
      const int64_t K = t.k[mod], N = t.n[mod];
      const uint8_t* abase = static_cast<const uint8_t*>(mod == kPoolDown ? t.a_down : t.a_gate_up);
      const uint8_t* bbase = static_cast<const uint8_t*>(mod == kPoolDown ? t.b_down : t.b_gate_up);
      if (mod == kPoolUp) {
        abase += t.a_gate_up_slice_stride * es;
        bbase += t.b_gate_up_slice_stride * es;
      }
      std::vector<uint8_t> a(t.a_slot_stride[mod] * es), b(t.b_slot_stride[mod] * es);
      ASSERT_TRUE(
          pool.read_back(abase + slot * t.a_slot_stride[mod] * es, a.size(), a.data()).ok());
      ASSERT_TRUE(
          pool.read_back(bbase + slot * t.b_slot_stride[mod] * es, b.size(), b.data()).ok());
      const bool present = mod != kPoolDown || s.down;
      const int fm = s.fused && mod != kPoolDown ? 3 : mod;
      int bad = 0;
      for (int e = 0; e < m.E; ++e)
        for (int i = 0; i < R; ++i)
          for (int64_t k = 0; k < K; ++k) {
            float want = (present && e < ne && i < s.r) ? enc(s.seed, l, fm, e, 0, i, k) : 0.f;
            float got = load_elem(dt, a.data() + ((e * R + i) * K + k) * es);
            if (got != want && bad++ < 5)
              ADD_FAILURE() << "A layer " << l << " " << pool_module_name(mod) << " slot " << slot
                            << " expert " << e << " [" << i << "," << k << "] = " << got
                            << ", want " << want;
          }
      for (int e = 0; e < m.E; ++e)
        for (int64_t n = 0; n < N; ++n)
          for (int j = 0; j < R; ++j) {
            const int64_t row = (s.fused && mod == kPoolUp) ? n + m.I : n;
            float want = (present && e < ne && j < s.r) ? enc(s.seed, l, fm, e, 1, row, j) : 0.f;
            float got = load_elem(dt, b.data() + ((e * N + n) * R + j) * es);
            if (got != want && bad++ < 5)
              ADD_FAILURE() << "B layer " << l << " " << pool_module_name(mod) << " slot " << slot
                            << " expert " << e << " [" << n << "," << j << "] = " << got
                            << ", want " << want;
          }
      EXPECT_EQ(bad, 0);
    }
  }
}

// A test with a fresh temporary folder (root), removed after it.
class PoolFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root = temp_dir("cpu");
    ASSERT_FALSE(root.empty());
  }
  void TearDown() override { std::system(("rm -rf '" + root + "'").c_str()); }
  std::string root;
};

}  // namespace molora::pooltest
