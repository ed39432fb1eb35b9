// PEFT LoRA adapter loader: adapter_config.json + adapter_model.safetensors → one slot image in
// the pool's layout (see include/molora/pool.h). Internal to the pool part.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "molora/pool.h"
#include "molora/status.h"

namespace molora::pool {

// Byte offsets of one slot image: for layer l and module m, A_m [E, r_max, K_m] then
// B_m [E, N_m, r_max]; layers one after the other.
struct ImageLayout {
  int64_t k[kPoolModules] = {0, 0, 0}, n[kPoolModules] = {0, 0, 0};
  int64_t a_bytes[kPoolModules] = {0, 0, 0}, b_bytes[kPoolModules] = {0, 0, 0};
  int64_t layer_bytes = 0, total_bytes = 0;
  int64_t a_offset(int layer, int m) const;
  int64_t b_offset(int layer, int m) const { return a_offset(layer, m) + a_bytes[m]; }
};
Status make_layout(const PoolConfig& cfg, ImageLayout* out);

// Parsed adapter_config.json.
struct PeftConfig {
  int r = 8;
  double lora_alpha = 8;
  bool use_rslora = false;
  bool has_targets = false;          // target_modules given
  bool target_regex = false;         // a string (regex) rather than a list
  bool target_all_linear = false;    // "all-linear"
  std::vector<std::string> targets;  // list entries, or the one regex
  std::vector<std::pair<std::string, int>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  // Compiled once by parse_peft_config (bounded: see kMaxPatternChars): the target regex and
  // "(.*\.)?(key)" of every rank_pattern / alpha_pattern key, in the same order.
  std::shared_ptr<const std::regex> target_re;
  std::vector<std::shared_ptr<const std::regex>> rank_re, alpha_re;
  // Resolves rank, alpha and whether `module` (e.g. "model.layers.3.mlp.experts.7.up_proj")
  // is targeted, as PEFT does.
  int rank_for(const std::string& module) const;
  double alpha_for(const std::string& module) const;
  bool targets_module(const std::string& module) const;
};
// Regexes from a config (target_modules string, rank_pattern / alpha_pattern keys) are refused
// above this length or with more than kMaxPatternGroups '(' (std::regex compiles and matches
// recursively: a hostile pattern could otherwise exhaust the stack), and run with the
// polynomial-time matcher where the standard library has one (libstdc++).
constexpr size_t kMaxPatternChars = 512;
constexpr int kMaxPatternGroups = 32;
// Parses JSON text of adapter_config.json; `file` names it in errors.
Status parse_peft_config(const std::string& text, const std::string& file, PeftConfig* out);

// Allocates `bytes` of host memory for an image (pinned for device pools).
using ImageAlloc = std::function<Status(size_t bytes, uint8_t** out)>;

// Loads the adapter in directory `path`. On success *image (from alloc) holds the slot image
// and *info its description; on error nothing is allocated (every check runs before alloc).
Status load_peft(const PoolConfig& cfg, const ImageLayout& layout, const std::string& path,
                 const ImageAlloc& alloc, uint8_t** image, AdapterInfo* info);

}  // namespace molora::pool
