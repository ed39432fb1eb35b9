// PEFT adapter loading: config, tensor-name mapping, validation, conversion into a slot image.
#include "pool/peft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "molora/safetensors.h"
#include "molora/settings.h"
#include "pool/convert.h"

namespace molora::pool {

namespace {

using json = nlohmann::json;
constexpr size_t kMaxConfigBytes = 16u << 20;

Status perr(const std::string& file, const std::string& what) {
  return Status::ParseError(file + ": " + what);
}

// Compiles `pattern` (a config regex) within the bounds of peft.h; false with *err set when it
// is too long, too nested or not a valid ECMAScript regex.
bool compile_pattern(const std::string& pattern, std::shared_ptr<const std::regex>* out,
                     std::string* err) {
  if (pattern.size() > kMaxPatternChars) {
    *err = "is longer than " + std::to_string(kMaxPatternChars) + " characters";
    return false;
  }
  if (std::count(pattern.begin(), pattern.end(), '(') > kMaxPatternGroups) {
    *err = "has more than " + std::to_string(kMaxPatternGroups) + " groups";
    return false;
  }
  auto flags = std::regex::ECMAScript;
#ifdef __GLIBCXX__
  flags |= std::regex_constants::__polynomial;  // BFS matcher: no exponential backtracking
#endif
  try {
    *out = std::make_shared<const std::regex>(pattern, flags);
  } catch (const std::exception& e) {
    *err = std::string("is not a valid regex (") + e.what() + ")";
    return false;
  }
  return true;
}

// "(.*\.)?(key)$" full match, as PEFT's get_pattern_key (re is that regex, compiled).
bool pattern_matches(const std::string& key, const std::regex* re, const std::string& module) {
  if (module == key) return true;
  if (module.size() > key.size() &&
      module.compare(module.size() - key.size(), key.size(), key) == 0 &&
      module[module.size() - key.size() - 1] == '.')
    return true;
  return re && std::regex_match(module, *re);
}

// Parses the decimal at s[pos...] (≤ 9 digits) and advances pos; false when none.
bool parse_index(const std::string& s, size_t* pos, int64_t* out) {
  size_t p = *pos;
  int64_t v = 0;
  while (p < s.size() && p - *pos < 10 && s[p] >= '0' && s[p] <= '9') v = v * 10 + (s[p++] - '0');
  if (p == *pos || p - *pos > 9) return false;
  *pos = p;
  *out = v;
  return true;
}

enum Proj { kGate, kUp, kDown, kGateUp, kNotExpert };

struct Parsed {
  bool lora = false;  // a lora_A/lora_B weight
  bool is_b = false;
  int64_t layer = -1, expert = -1;
  Proj proj = kNotExpert;
  std::string module;  // "model.layers.L.mlp.experts.E.gate_proj" (PEFT module key)
};

// base_model.model.<module>.lora_{A,B}[.<adapter>].weight with <module> =
// <...>layers.{L}.{mlp|block_sparse_moe}.experts.{E}.{gate_proj|up_proj|down_proj|gate_up_proj|w1|w2|w3}
Parsed parse_name(const std::string& name) {
  Parsed p;
  std::string s = name;
  const std::string base = "base_model.model.";
  if (s.compare(0, base.size(), base) == 0) s = s.substr(base.size());
  size_t la = s.find(".lora_A."), lb = s.find(".lora_B.");
  size_t at = la != std::string::npos ? la : lb;
  if (at == std::string::npos || (la != std::string::npos && lb != std::string::npos)) return p;
  std::string tail = s.substr(at + 8);
  if (tail != "weight" && !(tail.size() > 7 && tail.compare(tail.size() - 7, 7, ".weight") == 0 &&
                            tail.find('.') == tail.size() - 7))
    return p;
  p.lora = true;
  p.is_b = (at == lb);
  p.module = s.substr(0, at);
  const std::string& m = p.module;
  size_t pos = m.find("layers.");
  if (pos == std::string::npos || (pos > 0 && m[pos - 1] != '.')) return p;
  pos += 7;
  int64_t layer, expert;
  if (!parse_index(m, &pos, &layer)) return p;
  const char* mids[] = {".mlp.experts.", ".block_sparse_moe.experts."};
  bool mid = false;
  for (const char* x : mids) {
    size_t len = std::strlen(x);
    if (m.compare(pos, len, x) == 0) {
      pos += len;
      mid = true;
      break;
    }
  }
  if (!mid || !parse_index(m, &pos, &expert) || pos >= m.size() || m[pos] != '.') return p;
  std::string proj = m.substr(pos + 1);
  if (proj == "gate_proj" || proj == "w1")
    p.proj = kGate;
  else if (proj == "up_proj" || proj == "w3")
    p.proj = kUp;
  else if (proj == "down_proj" || proj == "w2")
    p.proj = kDown;
  else if (proj == "gate_up_proj")
    p.proj = kGateUp;
  else
    return p;
  p.layer = layer;
  p.expert = expert;
  return p;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Status read_text(const std::string& path, size_t cap, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::IoError(path + ": cannot open");
  f.seekg(0, std::ios::end);
  std::streamoff n = f.tellg();
  if (n < 0) return Status::IoError(path + ": cannot read");
  if (static_cast<uint64_t>(n) > cap)
    return perr(path, "file of " + std::to_string(n) + " bytes exceeds the limit of " +
                          std::to_string(cap));
  f.seekg(0);
  out->assign(static_cast<size_t>(n), '\0');
  f.read(&(*out)[0], n);
  if (!f) return Status::IoError(path + ": cannot read");
  return Status::Ok();
}

}  // namespace

int64_t ImageLayout::a_offset(int layer, int m) const {
  int64_t off = layer * layer_bytes;
  for (int i = 0; i < m; ++i) off += a_bytes[i] + b_bytes[i];
  return off;
}

Status make_layout(const PoolConfig& cfg, ImageLayout* out) {
  ImageLayout l;
  const int64_t es = static_cast<int64_t>(dtype_size(cfg.dtype));
  l.k[kPoolGate] = l.k[kPoolUp] = cfg.hidden;
  l.n[kPoolGate] = l.n[kPoolUp] = cfg.intermediate;
  l.k[kPoolDown] = cfg.intermediate;
  l.n[kPoolDown] = cfg.hidden;
  for (int m = 0; m < kPoolModules; ++m) {
    l.a_bytes[m] = cfg.num_experts * cfg.r_max * l.k[m] * es;
    l.b_bytes[m] = cfg.num_experts * l.n[m] * cfg.r_max * es;
    l.layer_bytes += l.a_bytes[m] + l.b_bytes[m];
  }
  l.total_bytes = l.layer_bytes * cfg.num_layers;
  *out = l;
  return Status::Ok();
}

int PeftConfig::rank_for(const std::string& module) const {
  for (size_t i = 0; i < rank_pattern.size(); ++i)
    if (pattern_matches(rank_pattern[i].first, i < rank_re.size() ? rank_re[i].get() : nullptr,
                        module))
      return rank_pattern[i].second;
  return r;
}

double PeftConfig::alpha_for(const std::string& module) const {
  for (size_t i = 0; i < alpha_pattern.size(); ++i)
    if (pattern_matches(alpha_pattern[i].first, i < alpha_re.size() ? alpha_re[i].get() : nullptr,
                        module))
      return alpha_pattern[i].second;
  return lora_alpha;
}

bool PeftConfig::targets_module(const std::string& module) const {
  if (!has_targets || target_all_linear) return true;
  if (target_regex) return target_re && std::regex_match(module, *target_re);
  for (const auto& t : targets) {
    if (module == t) return true;
    if (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
        module[module.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

Status parse_peft_config(const std::string& text, const std::string& file, PeftConfig* out) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return perr(file, "bad JSON");
  if (!j.is_object()) return perr(file, "not a JSON object");
  PeftConfig c;
  auto get = [&](const char* k) -> const json* {
    auto it = j.find(k);
    return (it == j.end() || it->is_null()) ? nullptr : &*it;
  };
  if (const json* v = get("peft_type")) {
    if (!v->is_string() || v->get<std::string>() != "LORA")
      return perr(file, "peft_type must be \"LORA\"");
  }
  if (const json* v = get("r")) {
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > 65536)
      return perr(file, "\"r\" must be a positive integer");
    c.r = static_cast<int>(v->get<int64_t>());
  }
  if (const json* v = get("lora_alpha")) {
    if (!v->is_number()) return perr(file, "\"lora_alpha\" must be a number");
    c.lora_alpha = v->get<double>();
  }
  if (const json* v = get("use_rslora")) {
    if (!v->is_boolean()) return perr(file, "\"use_rslora\" must be a boolean");
    c.use_rslora = v->get<bool>();
  }
  if (const json* v = get("use_dora")) {
    if (!v->is_boolean()) return perr(file, "\"use_dora\" must be a boolean");
    if (v->get<bool>()) return perr(file, "use_dora: DoRA adapters are not supported");
  }
  if (const json* v = get("fan_in_fan_out")) {
    if (v->is_boolean() && v->get<bool>())
      return perr(file, "fan_in_fan_out: transposed (Conv1D) weights are not supported");
  }
  if (const json* v = get("target_modules")) {
    c.has_targets = true;
    if (v->is_string()) {
      c.targets.push_back(v->get<std::string>());
      if (c.targets[0] == "all-linear")
        c.target_all_linear = true;
      else
        c.target_regex = true;
    } else if (v->is_array()) {
      for (const auto& t : *v) {
        if (!t.is_string()) return perr(file, "target_modules must hold strings");
        c.targets.push_back(t.get<std::string>());
      }
    } else {
      return perr(file, "target_modules must be a list or a string");
    }
  }
  if (const json* v = get("rank_pattern")) {
    if (!v->is_object()) return perr(file, "rank_pattern must be an object");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > 65536)
        return perr(file,
                    "rank_pattern[\"" + it.key().substr(0, 64) + "\"] must be a positive integer");
      c.rank_pattern.emplace_back(it.key(), static_cast<int>(it->get<int64_t>()));
    }
  }
  if (const json* v = get("alpha_pattern")) {
    if (!v->is_object()) return perr(file, "alpha_pattern must be an object");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it->is_number())
        return perr(file, "alpha_pattern[\"" + it.key().substr(0, 64) + "\"] must be a number");
      c.alpha_pattern.emplace_back(it.key(), it->get<double>());
    }
  }
  // Compile every regex once, bounded (a hostile pattern is an error, not a crash or a hang).
  auto shown = [](const std::string& k) { return k.size() > 64 ? k.substr(0, 64) + "..." : k; };
  std::string err;
  if (c.target_regex && !compile_pattern(c.targets[0], &c.target_re, &err))
    return perr(file, "target_modules \"" + shown(c.targets[0]) + "\" " + err);
  for (const auto& kv : c.rank_pattern) {
    c.rank_re.emplace_back();
    if (!compile_pattern("(.*\\.)?(" + kv.first + ")", &c.rank_re.back(), &err))
      return perr(file, "rank_pattern key \"" + shown(kv.first) + "\" " + err);
  }
  for (const auto& kv : c.alpha_pattern) {
    c.alpha_re.emplace_back();
    if (!compile_pattern("(.*\\.)?(" + kv.first + ")", &c.alpha_re.back(), &err))
      return perr(file, "alpha_pattern key \"" + shown(kv.first) + "\" " + err);
  }
  *out = std::move(c);
  return Status::Ok();
}

namespace {

// One (layer, module, expert) LoRA pair of the file, validated.
struct Pair {
  int64_t a = -1, b = -1;  // tensor indices
  int rank = 0;
  float scale = 0;
  int64_t b_row0 = 0;  // first row of B to read (gate_up_proj's up half starts at I)
  bool fused = false;
};

}  // namespace

Status load_peft(const PoolConfig& cfg, const ImageLayout& layout, const std::string& path,
                 const ImageAlloc& alloc, uint8_t** image, AdapterInfo* info) {
  *image = nullptr;
  const std::string cfg_path = path + "/adapter_config.json";
  const std::string st_path = path + "/adapter_model.safetensors";
  std::string text;
  MOLORA_RETURN_IF_ERROR(read_text(cfg_path, kMaxConfigBytes, &text));
  PeftConfig pc;
  MOLORA_RETURN_IF_ERROR(parse_peft_config(text, cfg_path, &pc));
  std::unique_ptr<SafetensorsFile> file;
  MOLORA_RETURN_IF_ERROR(SafetensorsFile::open(st_path, &file));
  const StHeader& h = file->header();

  const int L = cfg.num_layers, E = cfg.num_experts;
  // pairs[(l * 3 + m) * E + e]
  std::vector<Pair> pairs(static_cast<size_t>(L) * kPoolModules * E);
  AdapterInfo ai;
  ai.path = path;
  ai.r = pc.r;
  ai.lora_alpha = pc.lora_alpha;
  ai.use_rslora = pc.use_rslora;
  std::vector<std::string> ignored;
  std::map<std::pair<int64_t, int64_t>, int> kinds;  // (layer, expert) → 1 separate, 2 fused

  for (size_t ti = 0; ti < h.tensors.size(); ++ti) {
    const StTensor& t = h.tensors[ti];
    const std::string tn = "tensor \"" + t.name + "\"";
    Parsed p = parse_name(t.name);
    if (!p.lora || p.proj == kNotExpert) {
      ++ai.ignored_tensors;
      if (ignored.size() < 3) ignored.push_back(t.name);
      continue;
    }
    if (p.layer >= L)
      return Status::InvalidArgument(st_path + ": " + tn + ": layer " + std::to_string(p.layer) +
                                     " is past the model's " + std::to_string(L) + " layers");
    if (p.expert >= E)
      return Status::InvalidArgument(st_path + ": " + tn + ": expert " + std::to_string(p.expert) +
                                     " is past the model's " + std::to_string(E) + " experts");
    DType dt;
    if (!st_dtype_to_float(t.dtype, &dt))
      return perr(st_path,
                  tn + ": dtype " + st_dtype_name(t.dtype) + " is not supported (F32, F16, BF16)");
    if (!pc.targets_module(p.module))
      return perr(st_path, tn + ": module \"" + p.module + "\" is not in target_modules");
    if (p.proj != kDown) {
      int kind = p.proj == kGateUp ? 2 : 1;
      int& k = kinds[{p.layer, p.expert}];
      if (k != 0 && k != kind)
        return perr(st_path, tn + ": both gate_up_proj and gate_proj/up_proj for layer " +
                                 std::to_string(p.layer) + " expert " + std::to_string(p.expert));
      k = kind;
    }
    int mods[2] = {p.proj == kGateUp ? kPoolGate : static_cast<int>(p.proj), -1};
    if (p.proj == kGateUp) mods[1] = kPoolUp;
    for (int mi = 0; mi < 2 && mods[mi] >= 0; ++mi) {
      Pair& pr = pairs[(static_cast<size_t>(p.layer) * kPoolModules + mods[mi]) * E + p.expert];
      int64_t& slot = p.is_b ? pr.b : pr.a;
      if (slot >= 0)
        return perr(st_path, tn + ": duplicate lora_" + (p.is_b ? "B" : "A") + " for " + p.module);
      slot = static_cast<int64_t>(ti);
      pr.fused = (p.proj == kGateUp);
      pr.b_row0 = (p.proj == kGateUp && mods[mi] == kPoolUp) ? cfg.intermediate : 0;
    }
  }

  // Validate every pair before allocating anything.
  std::vector<int32_t> mod_rank(static_cast<size_t>(L) * kPoolModules, 0);
  std::vector<float> mod_scale(static_cast<size_t>(L) * kPoolModules, 0.f);
  std::vector<char> mod_fold(static_cast<size_t>(L) * kPoolModules, 0);
  for (int l = 0; l < L; ++l)
    for (int m = 0; m < kPoolModules; ++m)
      for (int e = 0; e < E; ++e) {
        Pair& pr = pairs[(static_cast<size_t>(l) * kPoolModules + m) * E + e];
        if (pr.a < 0 && pr.b < 0) continue;
        const StTensor& any = h.tensors[pr.a >= 0 ? pr.a : pr.b];
        const std::string tn = "tensor \"" + any.name + "\"";
        if (pr.a < 0) return perr(st_path, tn + ": lora_B without its lora_A");
        if (pr.b < 0) return perr(st_path, tn + ": lora_A without its lora_B");
        const StTensor& A = h.tensors[pr.a];
        const StTensor& B = h.tensors[pr.b];
        const std::string an = "tensor \"" + A.name + "\"", bn = "tensor \"" + B.name + "\"";
        const int64_t K = layout.k[m];
        const int64_t N = pr.fused ? 2 * cfg.intermediate : layout.n[m];
        if (A.shape.size() != 2 || A.shape[1] != K)
          return Status::InvalidArgument(st_path + ": " + an + ": shape " + shape_str(A.shape) +
                                         " does not match the model (expected [r, " +
                                         std::to_string(K) + "])");
        if (B.shape.size() != 2 || B.shape[0] != N)
          return Status::InvalidArgument(st_path + ": " + bn + ": shape " + shape_str(B.shape) +
                                         " does not match the model (expected [" +
                                         std::to_string(N) + ", r])");
        if (A.shape[0] != B.shape[1])
          return perr(st_path, an + " has rank " + std::to_string(A.shape[0]) + " but " + bn +
                                   " has rank " + std::to_string(B.shape[1]));
        const int64_t r = A.shape[0];
        if (r == 0) return perr(st_path, an + ": rank 0");
        if (r > cfg.r_max)
          return Status::OutOfRange(st_path + ": " + an + ": rank " + std::to_string(r) +
                                    " exceeds the pool's r_max " + std::to_string(cfg.r_max));
        std::string module = parse_name(A.name).module;
        const int rc = pc.rank_for(module);
        if (r != rc)
          return perr(st_path, an + ": rank " + std::to_string(r) +
                                   " but adapter_config.json gives " + std::to_string(rc) +
                                   " for " + module);
        const double alpha = pc.alpha_for(module);
        pr.rank = static_cast<int>(r);
        pr.scale = static_cast<float>(pc.use_rslora ? alpha / std::sqrt(static_cast<double>(r))
                                                    : alpha / static_cast<double>(r));
        const size_t mi = static_cast<size_t>(l) * kPoolModules + m;
        if (mod_rank[mi] == 0) {
          mod_scale[mi] = pr.scale;
        } else if (mod_scale[mi] != pr.scale) {
          mod_fold[mi] = 1;
        }
        mod_rank[mi] = std::max<int32_t>(mod_rank[mi], pr.rank);
        ++ai.tensors;
        ai.file_bytes += static_cast<int64_t>((A.end - A.begin) + (B.end - B.begin));
      }

  if (ai.tensors == 0)
    return perr(st_path,
                "no routed-expert LoRA tensor (names like base_model.model.model.layers.0"
                ".mlp.experts.0.gate_proj.lora_A.weight)");
  if (ai.ignored_tensors > 0) {
    std::string ex;
    for (const auto& n : ignored) ex += (ex.empty() ? "" : ", ") + n;
    log_once("pool-ignored:" + path, "pool: " + st_path + ": " +
                                         std::to_string(ai.ignored_tensors) +
                                         " tensors that are not routed-expert LoRA are ignored (" +
                                         ex + (ai.ignored_tensors > 3 ? ", ..." : "") + ")");
  }
  for (size_t mi = 0; mi < mod_fold.size(); ++mi)
    if (mod_fold[mi]) {
      log_once("pool-fold:" + path,
               "pool: " + path +
                   ": experts of one module have different scales (alpha_pattern / "
                   "rank_pattern); their scales are folded into lora_B and the slot scale is 1");
      mod_scale[mi] = 1.0f;
    }

  // Convert into the image. Every byte of it is written exactly once.
  uint8_t* img = nullptr;
  MOLORA_RETURN_IF_ERROR(alloc(static_cast<size_t>(layout.total_bytes), &img));
  const size_t es = dtype_size(cfg.dtype);
  const int64_t R = cfg.r_max;
  for (int l = 0; l < L; ++l)
    for (int m = 0; m < kPoolModules; ++m) {
      const size_t mi = static_cast<size_t>(l) * kPoolModules + m;
      const int64_t K = layout.k[m], N = layout.n[m];
      uint8_t* a0 = img + layout.a_offset(l, m);
      uint8_t* b0 = img + layout.b_offset(l, m);
      for (int e = 0; e < E; ++e) {
        const Pair& pr = pairs[mi * E + e];
        uint8_t* a = a0 + static_cast<size_t>(e) * R * K * es;
        uint8_t* b = b0 + static_cast<size_t>(e) * N * R * es;
        if (pr.rank == 0) {
          std::memset(a, 0, static_cast<size_t>(R * K) * es);
          std::memset(b, 0, static_cast<size_t>(N * R) * es);
          continue;
        }
        const StTensor& A = h.tensors[pr.a];
        const StTensor& B = h.tensors[pr.b];
        DType adt, bdt;
        st_dtype_to_float(A.dtype, &adt);
        st_dtype_to_float(B.dtype, &bdt);
        const int64_t r = pr.rank;
        convert(adt, file->data(A), cfg.dtype, a, r * K);
        std::memset(a + static_cast<size_t>(r * K) * es, 0, static_cast<size_t>((R - r) * K) * es);
        const float mul = mod_fold[mi] ? pr.scale : 1.0f;
        const size_t bes = dtype_size(bdt);
        const uint8_t* bs = file->data(B) + static_cast<size_t>(pr.b_row0 * r) * bes;
        // N rows of r in the file → N rows of r_max in the image (columns r..r_max zero).
        convert_rows(bdt, bs, r * static_cast<int64_t>(bes), cfg.dtype, b, R, N, r, mul);
      }
      ai.max_rank = std::max<int>(ai.max_rank, mod_rank[mi]);
    }
  ai.rank = std::move(mod_rank);
  ai.scale = std::move(mod_scale);
  ai.image_bytes = layout.total_bytes;
  *image = img;
  *info = std::move(ai);
  return Status::Ok();
}

}  // namespace molora::pool
