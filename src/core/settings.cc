#include "molora/settings.h"

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace molora {
namespace {

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::string>& overrides() {
  static std::map<std::string, std::string> o;
  return o;
}

}  // namespace

const std::vector<SettingInfo>& registered_settings() {
  static const std::vector<SettingInfo> kSettings = {
      {"MOLORA_LOG", "", "comma-separated log categories (plan, comm, pool, align, all)"},
      {"MOLORA_COMM_TIMEOUT_MS", "1000", "deadline of every all-reduce wait, in milliseconds"},
      {"MOLORA_COMM_MAX_BYTES", "16777216", "largest all-reduce message on the P2P path"},
      {"MOLORA_COMM_ONESHOT_MAX_BYTES", "",
       "one-shot/two-shot switch point (bytes); empty = measured default"},
      {"MOLORA_COMM_DISABLE_P2P", "0",
       "1 = send every all-reduce to NCCL (counted as reason 'disabled')"},
      {"MOLORA_LORA_CONFIG", "",
       "path of a tuned LoRA config JSON (default: the file for this GPU)"},
      {"MOLORA_LORA_KERNEL", "",
       "LoRA kernel: empty = the planner's choice, grid or stream (aligned with block <= 32, or "
       "plain up to 2048 pairs)"},
      {"MOLORA_LORA_PDL", "",
       "programmatic dependent launch of the LoRA kernels (sm_90: a call's launch overlaps the "
       "kernel before it): empty = where it measured faster (stream kernels, grid expand), 1 = "
       "always, 0 = never"},
      {"MOLORA_LORA_EARLY_INPUTS", "",
       "1 = the stream LoRA kernels read the routing, ranks, scales and weights before waiting "
       "for the kernel before them (only where nothing still running writes those); empty or 0 "
       "= off"},
      {"MOLORA_LORA_SLOT_CHECK", "",
       "plain-routing stream LoRA kernels: check the slots before grouping and leave when all "
       "are -1 (about an empty launch; the check costs calls with adapters up to ~0.35 us): "
       "empty or 1 = on, 0 = off"},
      {"MOLORA_LORA_STREAM_PROBE", "0",
       "stream kernel probe (timing only, results wrong): 1 no math, 2 no activations, 4 no "
       "copies, 8 no L2 hint, 16 shrink copies row by row (no tensor map)"},
      {"MOLORA_LORA_STREAM_CONSUMERS", "",
       "stream kernel consumer warps per CTA (tuning; empty = the planner's default)"},
      {"MOLORA_LORA_STREAM_STAGES", "",
       "stream kernel shared-memory pipeline stages (tuning; empty = the planner's default)"},
      {"MOLORA_PROF_THREADS", "", "parser threads for molora prof (default: hardware threads)"},
      {"MOLORA_PROF_GZIP", "isal",
       "molora prof's gzip inflater: isal (ISA-L igzip, when built with it) or zlib"},
  };
  return kSettings;
}

static const SettingInfo* find_setting(const std::string& name) {
  for (const auto& s : registered_settings())
    if (s.name == name) return &s;
  return nullptr;
}

std::string get_setting(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu());
    auto it = overrides().find(name);
    if (it != overrides().end()) return it->second;
  }
  if (const char* v = std::getenv(name.c_str())) return v;
  const SettingInfo* s = find_setting(name);
  return s ? s->default_value : std::string();
}

std::string setting_source(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu());
    if (overrides().count(name)) return "api";
  }
  if (std::getenv(name.c_str())) return "env";
  return "default";
}

long long get_setting_int(const std::string& name, long long fallback) {
  std::string v = get_setting(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0') return fallback;
  return x;
}

void set_setting(const std::string& name, std::optional<std::string> value) {
  std::lock_guard<std::mutex> lock(mu());
  if (value)
    overrides()[name] = *value;
  else
    overrides().erase(name);
}

bool log_enabled(const std::string& category) {
  std::string v = get_setting("MOLORA_LOG");
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ','))
    if (item == category || item == "all") return true;
  return false;
}

void log(const std::string& category, const std::string& message) {
  if (!log_enabled(category)) return;
  std::lock_guard<std::mutex> lock(mu());
  std::cerr << "[molora:" << category << "] " << message << std::endl;
}

void log_once(const std::string& key, const std::string& message) {
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu());
  if (!seen.insert(key).second) return;
  std::cerr << "[molora] " << message << std::endl;
}

}  // namespace molora
