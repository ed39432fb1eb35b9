// The lora planner: tile, grid and work decomposition for a Problem, the bytes it must move and
// the HBM floor; tuned entries from configs/lora/<gpu>.json override the heuristic.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/cuda_util.h"
#include "lora/lora_internal.h"
#include "molora/settings.h"

#ifndef MOLORA_SOURCE_DIR
#define MOLORA_SOURCE_DIR "."
#endif

namespace molora::lora {
namespace {

// A switch setting: "" leaves *out as it is (the default), "0" / "1" set it; anything else is an
// error naming the setting.
Status switch_setting(const char* name, int* out) {
  const std::string v = get_setting(name);
  if (v == "0" || v == "1") *out = v == "1" ? 1 : 0;
  if (v.empty() || v == "0" || v == "1") return Status::Ok();
  return Status::InvalidArgument(std::string(name) + " must be empty, 0 or 1, got '" + v + "'");
}
// A PlanOptions switch (-1 the setting, 0 off, 1 on) into *out: the option's 0 or 1, else the
// setting's (out stays -1 when it is empty); above 1 is an error naming the option.
Status option_or_setting(int value, const char* option, const char* setting, int* out) {
  *out = value;
  if (value < 0) return switch_setting(setting, out);
  if (value > 1)
    return Status::InvalidArgument(std::string("PlanOptions::") + option +
                                   " must be -1, 0 or 1, got " + std::to_string(value));
  return Status::Ok();
}

std::mutex& mu() {
  static std::mutex m;
  return m;
}

struct DeviceFacts {
  std::string name;
  int sm_count = 0;
};

DeviceFacts device_facts() {
  DeviceFacts f;
#if MOLORA_HAVE_CUDA
  static std::map<int, DeviceFacts> cache;  // hardware facts, not settings: safe to keep
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return f;
  }
  std::lock_guard<std::mutex> lock(mu());
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    f.name = prop.name;
    f.sm_count = prop.multiProcessorCount;
  } else {
    cudaGetLastError();
  }
  cache[dev] = f;
#endif
  return f;
}

struct Tuned {
  int tile = 0, unroll = 0;
  double us = -1;                // the entry's measured time ("us"; -1 where it has none)
  int64_t p_min = 0, p_max = 0;  // the entry's bucket of pairs
  bool heuristic = false;        // the tuner kept the heuristic's tile ("heuristic": true)
};

// A config entry's field, type-checked: a string, or an integer (a float or a string where an
// integer belongs, or an integer past int range, is not one). Missing: the default. A field of
// the wrong type sets *bad.
std::string str_field(const nlohmann::json& e, const char* key, const char* def, bool* bad) {
  auto it = e.find(key);
  if (it == e.end()) return def;
  if (!it->is_string()) {
    *bad = true;
    return def;
  }
  return it->get<std::string>();
}
int64_t int_field(const nlohmann::json& e, const char* key, int64_t def, bool* bad) {
  auto it = e.find(key);
  if (it == e.end()) return def;
  constexpr int64_t kLim = int64_t{1} << 31;  // an int's range: [-kLim, kLim)
  bool fits = false;                          // (a float, a string, null: not an integer)
  if (it->is_number_unsigned()) {
    fits = it->get<uint64_t>() < uint64_t{kLim};
  } else if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    fits = v >= -kLim && v < kLim;
  }
  if (!fits) {
    *bad = true;
    return def;
  }
  return it->get<int64_t>();
}
// A boolean field ("heuristic"): missing gives the default; anything but true or false sets *bad.
bool bool_field(const nlohmann::json& e, const char* key, bool def, bool* bad) {
  auto it = e.find(key);
  if (it == e.end()) return def;
  if (!it->is_boolean()) {
    *bad = true;
    return def;
  }
  return it->get<bool>();
}
// A number field ("us"): missing gives the default; anything but a finite number sets *bad.
double num_field(const nlohmann::json& e, const char* key, double def, bool* bad) {
  auto it = e.find(key);
  if (it == e.end()) return def;
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    *bad = true;
    return def;
  }
  return it->get<double>();
}

// Parsed config files, keyed by path. A file that does not parse, or
// whose "entries" is not a list, is ignored; so is an entry that is not an object or has a field
// of the wrong type. Each is logged once (log_once: never silent).
bool lookup_tuned(const std::string& path, const Problem& pb, const std::string& kernel,
                  Tuned* out) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0) return false;
  // (Reread when its modification time, to the nanosecond, or its size changes: a file
  // rewritten within the same second is read again.)
  static std::map<std::string, std::pair<std::string, std::shared_ptr<const nlohmann::json>>> files;
  const std::string stamp = std::to_string(st.st_mtim.tv_sec) + "." +
                            std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_size);
  std::shared_ptr<const nlohmann::json> doc;  // (shared, not copied: a plan looks up twice)
  {
    std::lock_guard<std::mutex> lock(mu());
    auto& slot = files[path];
    if (slot.first != stamp || slot.second == nullptr) {
      std::ifstream in(path);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("entries") ||
          !j["entries"].is_array()) {
        log_once("lora-config-bad:" + path,
                 "lora: ignoring unreadable config " + path + " (want {\"entries\": [...]})");
        return false;
      }
      slot = {stamp, std::make_shared<const nlohmann::json>(std::move(j))};
    }
    doc = slot.second;
  }
  const int64_t P = pb.num_tokens * pb.top_k;
  const int64_t dim = pb.op == Op::kShrink ? pb.K : pb.N;
  int64_t best_p = -1;
  size_t index = 0;
  for (const auto& e : (*doc)["entries"]) {
    const size_t i = index++;
    bool bad = !e.is_object();
    if (!bad &&
        (str_field(e, "op", "", &bad) != op_name(pb.op) ||
         str_field(e, "dtype", "", &bad) != dtype_name(pb.dtype) ||
         str_field(e, "routing", "", &bad) != routing_name(pb.routing) ||
         int_field(e, "dim", 0, &bad) != dim || int_field(e, "r_max", 0, &bad) != pb.r_max ||
         str_field(e, "kernel", "grid", &bad) != kernel) &&
        !bad)
      continue;
    // [p_min, p_max]: the pairs of the token count the entry was tuned at, down to the bucket
    // below (an entry without p_min covers every P up to p_max). A P in a bucket the tuner
    // measured and left to the heuristic has no entry, so it must not take a larger bucket's.
    const int64_t pm = bad ? 0 : int_field(e, "p_max", 0, &bad);
    const int64_t pmin = bad ? 0 : int_field(e, "p_min", 0, &bad);
    const int64_t tile = bad ? 0 : int_field(e, "tile", 0, &bad);
    const int64_t unroll = bad ? 0 : int_field(e, "unroll", 0, &bad);
    const double us = bad ? -1 : num_field(e, "us", -1, &bad);
    const bool heur = bad ? false : bool_field(e, "heuristic", false, &bad);
    bad = bad || tile < 1;  // (no tile, or none a kernel takes)
    if (bad) {
      log_once("lora-config-entry:" + path + ":" + std::to_string(i),
               "lora: ignoring entry " + std::to_string(i) + " of config " + path +
                   " (not an object, a field of the wrong type, or no tile >= 1)");
      continue;
    }
    if (pm < P || pmin > P) continue;
    if (best_p < 0 || pm < best_p) {
      best_p = pm;
      out->tile = static_cast<int>(tile);
      out->unroll = static_cast<int>(unroll);
      out->us = us;
      out->p_min = pmin;
      out->p_max = pm;
      out->heuristic = heur;
    }
  }
  return best_p >= 0;
}

int pow2_ceil(int64_t x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

}  // namespace

std::string default_config_path(const std::string& gpu_name) {
  std::string n;
  for (char c : gpu_name) n += std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '_';
  return std::string(MOLORA_SOURCE_DIR) + "/configs/lora/" + n + ".json";
}

namespace detail {
size_t smem_bytes(int mode, int64_t P, int block) {
  const int64_t ints = mode == kModeGrouped   ? std::min<int64_t>(P, kGroupCap)
                       : mode == kModeAligned ? block
                                              : 1;
  return static_cast<size_t>(ints + 3) / 4 * 16;
}

bool stream_routing_ok(const Problem& pb) {
  if (pb.routing == RoutingKind::kAligned) return pb.block_size <= kStreamMaxBlock;
  return stream_plain_ok(pb.num_tokens * pb.top_k,
                         static_cast<int64_t>(pb.num_slots) * pb.num_experts);
}
std::string stream_routing_error() {
  return "the stream kernel needs aligned routing with block_size <= " +
         std::to_string(kStreamMaxBlock) +
         ", or plain routing with num_tokens * top_k <= " + std::to_string(kStreamPlainPairs) +
         " and num_slots * num_experts <= " + std::to_string(kStreamPlainMaxV);
}

std::string tile_rule_error(const Problem& pb, bool stream, int64_t tile, int64_t unroll) {
  if (stream) {
    if (pb.op == Op::kShrink && !stream_tile_ok(pb.op, pb.r_max, static_cast<int>(tile)))
      return "stream shrink tile must be " + std::to_string(kStreamShrinkRows) + ", got " +
             std::to_string(tile);
    if (pb.op == Op::kExpand && !stream_tile_ok(pb.op, pb.r_max, static_cast<int>(tile)))
      return "stream expand tile must be a multiple of 32 in [32, " +
             std::to_string(stream_expand_tile(pb.r_max)) + "], got " + std::to_string(tile);
    return "";
  }
  if (pb.op == Op::kShrink && (tile < 1 || tile > pb.r_max || (tile & (tile - 1)) != 0))
    return "shrink tile must be a power of two in [1, r_max], got " + std::to_string(tile);
  if (pb.op == Op::kExpand && (tile < 8 || tile % 8 != 0 || tile > 16384))
    return "expand tile must be a multiple of 8 in [8, 16384], got " + std::to_string(tile);
  if (unroll != 4 && unroll != 8) return "unroll must be 4 or 8, got " + std::to_string(unroll);
  return "";
}

Status check_plan(const Problem& pb, const Plan& pl) {
  const bool aligned = pb.routing == RoutingKind::kAligned;
  const int64_t P = pb.num_tokens * pb.top_k;
  const int64_t dim = pb.op == Op::kShrink ? pb.K : pb.N;
  std::string why;
  const bool stream = pl.kernel == "stream";
  if (!stream && pl.kernel != "grid") {
    why = "kernel must be grid or stream, got '" + pl.kernel + "'";
  } else if (stream && !stream_routing_ok(pb)) {
    why = stream_routing_error();
  } else if (stream && !stream_shape_ok(pb.op, pl.threads, pl.stages, !aligned)) {
    why = "stream threads " + std::to_string(pl.threads) + " / stages " +
          std::to_string(pl.stages) + " are not a shape the kernel takes";
  } else if (why = tile_rule_error(pb, stream, pl.tile, pl.unroll); !why.empty()) {
  } else if (!stream && !aligned && pl.group_cap > 0 && P > kGroupCap) {
    why = "plain pairs are grouped only up to " + std::to_string(kGroupCap);
  } else {
    const int64_t groups = aligned ? cdiv(pb.sorted_len, pb.block_size) : P;
    const int64_t chunks = cdiv(pb.op == Op::kShrink ? pb.r_max : dim, pl.tile);
    const int mode = aligned ? kModeAligned : pl.group_cap > 0 ? kModeGrouped : kModePairs;
    if (pl.chunks != chunks || pl.max_items != groups * chunks) {
      why = "chunks " + std::to_string(pl.chunks) + " and items " + std::to_string(pl.max_items) +
            " are not this problem's " + std::to_string(chunks) + " and " +
            std::to_string(groups * chunks);
    } else if (pl.grid < 1) {
      why = "grid must be >= 1";
    } else if (!stream && pl.smem_bytes < smem_bytes(mode, P, pb.block_size)) {
      why = "shared memory " + std::to_string(pl.smem_bytes) + " bytes is below the " +
            std::to_string(smem_bytes(mode, P, pb.block_size)) + " its member list needs";
    }
  }
  if (why.empty()) return Status::Ok();
  return Status::InvalidArgument(std::string(op_name(pb.op)) +
                                 " plan does not match the problem: " + why +
                                 " (plan: " + pl.to_string() + ")");
}
}  // namespace detail

Status plan(const Problem& pb, Plan* out, const PlanOptions& opt) {
  MOLORA_RETURN_IF_ERROR(validate_problem(pb));
  if (out == nullptr) return Status::InvalidArgument("plan: out is null");
  Plan pl;
  const int64_t P = pb.num_tokens * pb.top_k;
  const int64_t V = static_cast<int64_t>(pb.num_slots) * pb.num_experts;
  const int64_t dim = pb.op == Op::kShrink ? pb.K : pb.N;
  const int64_t es = static_cast<int64_t>(dtype_size(pb.dtype));
  const bool aligned = pb.routing == RoutingKind::kAligned;
  DeviceFacts dev = device_facts();
  const int sms = opt.sm_count > 0 ? opt.sm_count : (dev.sm_count > 0 ? dev.sm_count : 132);
  const RoutingStats* st = opt.stats;
  pl.bytes_exact = st != nullptr && st->distinct_rank8 >= 0 && st->active_pairs >= 0 &&
                   st->active_tokens >= 0 && st->active_rank8 >= 0;

  const int mode = aligned                  ? detail::kModeAligned
                   : P <= detail::kGroupCap ? detail::kModeGrouped
                                            : detail::kModePairs;
  // Kernel: the stream pipeline applies to aligned routing with blocks of <= 32 pairs. The
  // planner takes it where it measured faster than the grid kernel on the H200: expand always
  // (bench/NOTES.md "lora v0.8": with its tiles computed side by side it is faster at every
  // seed shape and T, e.g. T=1 N=6144 4.37 vs 4.88 us, N=2048 r=16 T=32 6.5 vs 12.9 us), shrink
  // from P >= 16 pairs ("lora v0.11", since the stream shrink loads a warp's first pair ids
  // ahead of its copies: T=2 k=8 K=6144 6.82 vs 6.89 us, K=7168 7.21 vs 8.77, K=4096 5.59 vs
  // 6.05, K=2048 4.43 vs 4.46; T=4 6-18% faster; T=1, P=8, stays on the grid kernel: K=4096
  // 5.23 vs 4.93 us, K=6144 6.28 vs 5.17, K=7168 6.63 vs 5.29, only K=2048 4.39 vs 4.60).
  // With dependent launch on grid shrink too (v0.14), K=2048 T=1 is a tie on the H100 (4.04 vs
  // 4.04 us) and a call whose slots are all -1 cost 1.42 us on grid against 1.74 on stream, so
  // K=2048 keeps the grid kernel below 16 pairs as well. (Since v0.15 both leave at once when
  // they have no task: 1.19 vs 1.20 us, still no reason to move K=2048.)
  std::string kernel = opt.kernel.empty() ? get_setting("MOLORA_LORA_KERNEL") : opt.kernel;
  const bool stream_ok = detail::stream_routing_ok(pb);
  const int64_t stream_from = pb.op == Op::kShrink ? 16 : 0;
  // Plain routing (v0.21): the stream kernel groups the pairs itself (plain_build), which costs
  // it 0.7-9 us over the aligned call (T = 1 to 256; ~0.8 us less since v0.22). The planner takes
  // it for plain routing where it measured faster than the grid kernel (H100, same run; k = 8,
  // bench/NOTES.md "lora v0.21", "v0.22" and "v0.29"), by a virtual expert's weight in elements:
  // - shrink, K * r_max > 131072: from 33 pairs (T=5 / 6 / 7 at K=6144: 11.6 / 12.8 / 13.8 vs
  //   13.0 / 13.6 / 14.2 us; from 64 until v0.29). At 32 pairs and below the grid kernel's
  //   grouped mode wins (T=4: 8.78 vs 9.35; T=1 4.91 vs 6.39), though not everywhere (K=7168 T=2
  //   7.74 on stream vs 8.83, and T=6 grid 13.04 vs 13.57).
  // - shrink, else: from 128 (T=16: K=2048 r16 8.3 vs 12.0, K=4096 r32 16.1 vs 21.0; grid at T=8,
  //   6.0 vs 6.9 and 11.3 vs 11.5).
  // - expand, N * r_max >= 131072: always (v0.29: T=1 / 2 / 4 / 6 at N6144 4.70 / 5.71 / 7.67 /
  //   10.47 vs 5.01 / 13.19 / 14.95 / 16.02 us on grid, its tile tuned for T=8; N4096 4.33 / 5.05
  //   / 6.42 / 8.53 vs 4.62 / 8.31 / 9.30 / 10.26; the H200's v0.28 table at T=1 too, N6144 /
  //   N7168 / N4096 4.44 / 4.60 / 4.16 vs 4.75 / 4.92 / 4.46; from 64 pairs until v0.29).
  // - expand, else: from 96 (v0.29, N2048 r16: T=12 / 16 7.13 / 7.76 vs 7.50 / 8.54; grid at
  //   T=8 / 10, 5.68 / 6.88 vs 6.44 / 6.93, and T=1, 3.76 vs 4.18 on the H200; from 256 until
  //   v0.29).
  const int64_t weight = dim * pb.r_max;
  const int64_t plain_from =
      pb.op == Op::kShrink ? (weight > 131072 ? 33 : 128) : (weight >= 131072 ? 0 : 96);
  // The config file (tuned entries): PlanOptions::config_path, else MOLORA_LORA_CONFIG, else the
  // GPU's file under configs/lora; "none" skips it.
  std::string cfg = opt.config_path;
  if (cfg.empty()) cfg = get_setting("MOLORA_LORA_CONFIG");
  if (cfg.empty() && !dev.name.empty()) cfg = default_config_path(dev.name);
  // Each kernel's tuned entry for this P (the stream kernel's only where the routing allows it),
  // looked up once: for the kernel choice here and for the tile below.
  Tuned tuned_of[2];  // [grid, stream]
  bool found[2] = {false, false};
  if (cfg != "none") {
    found[0] = lookup_tuned(cfg, pb, "grid", &tuned_of[0]);
    found[1] = stream_ok && lookup_tuned(cfg, pb, "stream", &tuned_of[1]);
  }
  pl.kernel_source = kernel.empty() ? "heuristic" : "forced";
  if (kernel.empty()) {
    kernel = stream_ok && P >= (aligned ? stream_from : plain_from) ? "stream" : "grid";
    // Where the tuner timed both kernels at this P's token count (a grid and a stream entry of
    // the same bucket, each with its "us"), the other kernel where it was faster than
    // kTuneMargin of the bounds' (the tuner's rule for tiles: a closer time is within its
    // noise): the bounds come from one GPU (mostly the H100), the file from the GPU at hand.
    // (Without the margin, K=2048 aligned shrink at T=1 took the stream kernel on the H100's
    // file, 4.01 vs 4.12 us, and a call whose slots are all -1 then cost 1.36 us against 1.19.)
    const Tuned &tg = tuned_of[0], &ts = tuned_of[1];
    if (found[0] && found[1] && tg.us > 0 && ts.us > 0 && tg.p_min == ts.p_min &&
        tg.p_max == ts.p_max) {
      const bool on_stream = kernel == "stream";
      if ((on_stream ? tg.us : ts.us) < detail::kTuneMargin * (on_stream ? ts.us : tg.us))
        kernel = on_stream ? "grid" : "stream";
      pl.kernel_source = "tuned:" + cfg;
    }
  }
  if (kernel != "grid" && kernel != "stream")
    return Status::InvalidArgument("lora kernel must be grid or stream, got '" + kernel + "'");
  if (kernel == "stream" && !stream_ok)
    return Status::InvalidArgument(detail::stream_routing_error());
  const bool stream = kernel == "stream";
  pl.kernel = kernel;
  pl.threads = detail::kThreads;
  if (stream) {  // consumer warps and stages: the defaults unless the tuning settings say
    const int64_t cons = get_setting_int("MOLORA_LORA_STREAM_CONSUMERS", 0);
    const int64_t stg = get_setting_int("MOLORA_LORA_STREAM_STAGES", 0);
    const int c = static_cast<int>(
        std::min<int64_t>(cons > 0 ? cons : detail::stream_consumers(pb.op), 1 << 20));
    pl.threads = detail::stream_threads(pb.op, c);
    pl.stages =
        static_cast<int>(std::min<int64_t>(stg > 0 ? stg : detail::stream_stages(pb.op), 1 << 20));
    if (cons < 0 || !detail::stream_shape_ok(pb.op, pl.threads, pl.stages, !aligned))
      return Status::InvalidArgument(
          std::string("MOLORA_LORA_STREAM_CONSUMERS / _STAGES must be in [1, ") +
          std::to_string(detail::stream_max_consumers(pb.op)) + "] / [2, " +
          std::to_string(detail::stream_max_stages(
              pb.op, std::min(std::max(c, 1), detail::stream_max_consumers(pb.op)), !aligned)) +
          "]" + (pb.op == Op::kShrink ? " (shrink: stages per consumer warp)" : "") + ", got " +
          std::to_string(cons) + " / " + std::to_string(stg));
  }
  pl.group_cap = stream && !aligned             ? detail::kStreamPlainPairs
                 : mode == detail::kModeGrouped ? detail::kGroupCap
                                                : 0;
  pl.groups = aligned ? cdiv(pb.sorted_len, pb.block_size) : P;
  const char* mode_name = stream    ? (aligned ? "aligned-stream" : "plain-stream")
                          : aligned ? "aligned"
                                    : (pl.group_cap > 0 ? "plain-grouped" : "plain-pairs");
  pl.variant = std::string(op_name(pb.op)) + "." + mode_name + "." + dtype_name(pb.dtype);
  // Programmatic dependent launch on every kernel (bench/NOTES.md "lora v0.7": 0.5-1 us per call
  // on the stream kernels and grid expand on the H200). Grid shrink had it off from v0.7, where
  // T=1 measured up to 0.8 us slower with it, but that T=1 ran the T=8 config entry's tile 8
  // (the bug p_min fixed); on its own tile 1 it is faster with it ("lora v0.14", H100, 3 rounds:
  // T=1 N6144 / N7168 / N4096 aligned 5.42 / 5.62 / 5.03 -> 4.89 / 5.10 / 4.49 us, plain the
  // same; T=8 1-3%; H200, same day: T=1 N6144 5.17 -> 4.62, N2048 r16 4.62 -> 4.14, T=8 2-9%).
  int pdl = -1;
  MOLORA_RETURN_IF_ERROR(switch_setting("MOLORA_LORA_PDL", &pdl));
  pl.pdl = pdl != 0;
  // Early inputs: only the caller knows that nothing still running writes them (Plan).
  int early = -1;
  MOLORA_RETURN_IF_ERROR(
      option_or_setting(opt.early_inputs, "early_inputs", "MOLORA_LORA_EARLY_INPUTS", &early));
  pl.early_inputs = early == 1 && stream && pl.pdl;  // (off unless asked for)
  // The every-slot -1 check of the plain stream kernels (Plan::slot_check; on unless turned off).
  int check = -1;
  MOLORA_RETURN_IF_ERROR(
      option_or_setting(opt.slot_check, "slot_check", "MOLORA_LORA_SLOT_CHECK", &check));
  pl.slot_check = check != 0 && stream && !aligned;

  // Heuristic. Groups that will hold work: the distinct (slot, expert) pairs when known, else
  // min(P, V) (every pair its own virtual expert; plain-pairs: every pair).
  int64_t est_groups = std::max<int64_t>(1, mode == detail::kModePairs ? P : std::min(P, V));
  if (pl.bytes_exact && st->distinct_pairs >= 0 && mode != detail::kModePairs)
    est_groups = std::max<int64_t>(1, st->distinct_pairs);
  int tile, unroll = 4;
  if (stream) {
    // One pipeline stage per task: expand, the N rows whose r_max-wide rows fill 16 KiB;
    // shrink, 8 rank rows (the K-chunks of a task are its stages).
    tile = pb.op == Op::kShrink ? detail::kStreamShrinkRows : detail::stream_expand_tile(pb.r_max);
    unroll = 0;
  } else if (pb.op == Op::kShrink) {
    // Enough items for one per SM; each item as large as that allows (the per-item cost is
    // finding the group, a few dependent loads, and re-reading its x row). Each of the 8 warps
    // owns rows of K (tile >= 8); smaller tiles split a row over warps. With P >= 256 pairs the
    // full 16-row tile wins over splitting rows to fill the SMs: the tuner chose it for 9 of
    // the 10 shrink shapes in configs/lora/nvidia_h200.json, 5-40% faster than the split. Below
    // that, splitting until the items reach 8 per SM (this rule before v0.14) made T=8 1.7-2.4x
    // slower than the tuners' picks on both GPUs (tile 4 or 8 at r_max 32, 4 at r_max 16: one
    // to two items per SM); one item per SM is what they chose.
    tile = std::min(16, pb.r_max);
    while (P < 256 && tile > 1 && est_groups * cdiv(pb.r_max, tile) < sms) tile /= 2;
  } else {
    // Four passes of 256 threads x 8 16-byte vectors over rows of r_max elements; halved
    // while the items would not reach one per SM, but no item below 16 KiB of weights
    // (8192 / r_max rows): smaller items pay the group lookup and the load latency for too few
    // bytes. The tuners (H100 and H200) picked exactly this at T = 1 and 8 on the seed shapes
    // (tile 256 at r_max 32 and T = 1, 512 at r_max 16); the rule before v0.14 (two items per
    // SM, down to 64 rows) took 128 and 64 there, 1.1-1.5x slower.
    const int lpr = std::max(1, pow2_ceil(cdiv(pb.r_max, 8)));
    tile = static_cast<int>(
        std::min<int64_t>(4 * 8 * (detail::kThreads / lpr), std::max<int64_t>(8, dim / 8 * 8)));
    const int min_tile = std::max(64, 8192 / pb.r_max / 8 * 8);
    while (tile > min_tile && est_groups * cdiv(dim, tile) < sms)
      tile = std::max(min_tile, tile / 16 * 8);
  }
  pl.source = "heuristic";
  // An entry whose tile the tuner left to the heuristic ("heuristic": true: it was within
  // kTuneMargin of the best at the bucket's own token count) gives the heuristic's tile at this
  // P, not the tile the heuristic took at the bucket's P: the heuristic follows P, a fixed tile
  // does not. (Files before v0.30 have buckets of 8x in P; with the H200's, a grid expand at T=2
  // took the T=8 bucket's 2,048 rows, a few items for 132 SMs: 13.2 us, more than the 12.5 of
  // T=8 itself, bench/NOTES.md "lora v0.29". In the H100's v0.30 tuning, with buckets of 2x, the
  // tuner kept the heuristic at 78 of the 96 grid entries up to 256 pairs.)
  const Tuned& tuned = tuned_of[stream ? 1 : 0];
  if (found[stream ? 1 : 0] && !tuned.heuristic) {
    const int tu = tuned.unroll > 0 && !stream ? tuned.unroll : unroll;
    const std::string why = detail::tile_rule_error(pb, stream, tuned.tile, tu);
    if (why.empty()) {
      tile = tuned.tile;
      unroll = tu;
      pl.source = "tuned:" + cfg;
    } else {  // an entry the kernel cannot take: the heuristic, and the log says why
      log_once("lora-config-invalid:" + cfg + ":" + std::to_string(tuned.tile) + ":" +
                   std::to_string(tu),
               "lora: ignoring a config entry of " + cfg + " for " + op_name(pb.op) +
                   " dim=" + std::to_string(pb.op == Op::kShrink ? pb.K : pb.N) +
                   " r_max=" + std::to_string(pb.r_max) + ": " + why);
    }
  }
  if (opt.force_tile > 0) {
    tile = opt.force_tile;
    pl.source = "forced";
  }
  if (opt.force_unroll > 0) {
    if (stream) return Status::InvalidArgument("the stream kernel has no unroll to force");
    unroll = opt.force_unroll;
    pl.source = "forced";
  }
  if (const std::string why = detail::tile_rule_error(pb, stream, tile, unroll); !why.empty())
    return Status::InvalidArgument(why);
  pl.tile = tile;
  pl.unroll = unroll;
  if (!stream) pl.stages = 0;
  pl.chunks = static_cast<int>(pb.op == Op::kShrink ? cdiv(pb.r_max, tile) : cdiv(dim, tile));
  pl.max_items = pl.groups * pl.chunks;
  pl.est_items = std::min(pl.max_items, est_groups * pl.chunks);
  if (pl.max_items > 0x7fffffffLL)
    return Status::OutOfRange("lora: " + std::to_string(pl.max_items) +
                              " work items exceed one grid; use a larger tile");
  if (stream) {
    // One CTA per SM (the stages fill its shared memory), walking tasks grid-stride.
    pl.smem_bytes = detail::stream_layout(pb.op, pl.stages,
                                          detail::stream_consumers_of(pb.op, pl.threads), !aligned)
                        .total;
    pl.ctas_per_sm = 1;
    pl.grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pl.max_items, sms)));
  } else {
    pl.smem_bytes = detail::smem_bytes(mode, P, aligned ? pb.block_size : 0);
#if MOLORA_HAVE_CUDA
    if (dev.sm_count > 0 && pb.dtype != DType::kF32)
      pl.ctas_per_sm = detail::max_ctas_per_sm(pb.op, pb.dtype, !aligned, unroll, pl.smem_bytes);
#endif
    // A grid of the CTAs that are resident at once, each walking items grid-stride; items past
    // the ones the device finds (aligned: num_tokens_post_pad) are never visited.
    const int resident = pl.ctas_per_sm > 0 ? pl.ctas_per_sm : 2;
    pl.grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(pl.max_items, 1LL * sms * resident)));
  }

  // Bytes that must move: each distinct (slot, expert) weight once at its rank, plus activations.
  int64_t wrank = pl.bytes_exact ? st->distinct_rank8 : std::min(P, V) * pb.r_max;
  int64_t arank = pl.bytes_exact ? st->active_rank8 : P * pb.r_max;
  int64_t apairs = pl.bytes_exact ? st->active_pairs : P;
  int64_t atok = pl.bytes_exact ? st->active_tokens : pb.num_tokens;
  int64_t b = wrank * dim * es;
  if (pb.op == Op::kShrink)
    b += atok * dim * es + arank * es;  // x rows read, t written
  else
    b += arank * es + 2 * apairs * dim * es;     // t read, y read and written
  b += aligned ? 0 : P * 4 + pb.num_tokens * 4;  // routing ids
  pl.bytes = b;
  pl.bandwidth_gbps = opt.bandwidth_gbps > 0 ? opt.bandwidth_gbps : 4300.0;
  pl.floor_us = static_cast<double>(b) / (pl.bandwidth_gbps * 1e3);
  *out = pl;

  if (log_enabled("plan")) {
    static std::set<std::string> seen;
    std::ostringstream key;
    key << pl.variant << " T=" << pb.num_tokens << " k=" << pb.top_k << " S=" << pb.num_slots
        << " E=" << pb.num_experts << " r_max=" << pb.r_max
        << (pb.op == Op::kShrink ? " K=" : " N=") << dim;
    if (aligned) key << " B=" << pb.block_size << " sorted_len=" << pb.sorted_len;
    bool fresh;
    {
      std::lock_guard<std::mutex> lock(mu());
      fresh = seen.insert(key.str() + pl.source + pl.kernel_source).second;
    }
    if (fresh) log("plan", key.str() + ": " + pl.to_string());
  }
  return Status::Ok();
}

std::string Plan::to_string() const {
  std::ostringstream o;
  o << variant << " [" << source << "] kernel=" << kernel << " [" << kernel_source
    << "] tile=" << tile;
  if (stages > 0)
    o << " stages=" << stages;
  else
    o << " unroll=" << unroll;
  o << " chunks=" << chunks << " groups=" << groups << " items~" << est_items << " grid=" << grid
    << "x" << threads << " (" << ctas_per_sm << "/SM) smem=" << smem_bytes << " bytes"
    << (bytes_exact ? "=" : "<=") << bytes << " floor=" << floor_us << "us@" << bandwidth_gbps
    << "GB/s" << (pdl ? " pdl" : "") << (early_inputs ? " early-inputs" : "")
    << (slot_check ? " slot-check" : "");
  return o.str();
}

std::string Plan::to_json() const {
  nlohmann::json j = {{"variant", variant},
                      {"kernel", kernel},
                      {"kernel_source", kernel_source},
                      {"stages", stages},
                      {"source", source},
                      {"threads", threads},
                      {"tile", tile},
                      {"unroll", unroll},
                      {"chunks", chunks},
                      {"groups", groups},
                      {"est_items", est_items},
                      {"max_items", max_items},
                      {"ctas_per_sm", ctas_per_sm},
                      {"grid", grid},
                      {"ctas", grid},
                      {"group_cap", group_cap},
                      {"smem_bytes", smem_bytes},
                      {"bytes", bytes},
                      {"bytes_exact", bytes_exact},
                      {"bandwidth_gbps", bandwidth_gbps},
                      {"floor_us", floor_us},
                      {"pdl", pdl},
                      {"early_inputs", early_inputs},
                      {"slot_check", slot_check}};
  return j.dump();
}

Problem delta_expand_problem(const Problem& pb, int64_t N) {
  Problem e = pb;
  e.op = Op::kExpand;
  e.K = 0;
  e.N = N;
  return e;
}

Status plan_delta(const Problem& pb, int64_t N, DeltaPlan* out, const PlanOptions& opt) {
  if (out == nullptr) return Status::InvalidArgument("plan_delta: out is null");
  MOLORA_RETURN_IF_ERROR(detail::validate_delta("plan_delta", pb, N));
  DeltaPlan d;
  MOLORA_RETURN_IF_ERROR(plan(pb, &d.shrink, opt));
  PlanOptions oe = opt;
  oe.early_inputs = 1;  // (valid after the call's own shrink: lora.h)
  MOLORA_RETURN_IF_ERROR(plan(delta_expand_problem(pb, N), &d.expand, oe));
  *out = d;
  return Status::Ok();
}

std::string DeltaPlan::to_string() const {
  return "shrink: " + shrink.to_string() + "; expand: " + expand.to_string();
}

std::string DeltaPlan::to_json() const {
  return "{\"shrink\": " + shrink.to_json() + ", \"expand\": " + expand.to_json() + "}";
}

}  // namespace molora::lora
