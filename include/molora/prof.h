// molora/prof.h — torch-profiler / Kineto Chrome trace analysis (`molora prof`).
//
// read_trace() streams a .json or .json.gz trace of any size (multi-member gzip, > 4 GiB
// uncompressed included): it inflates with zlib as a stream, splits the `traceEvents` array at
// event boundaries into pieces well below simdjson's document limit and parses the pieces on
// MOLORA_PROF_THREADS threads. Only the events the analyses need are kept (kernels, memcpy,
// memset, runtime/driver calls, CPU user annotations), so memory stays a fraction of the input.
//
// The analyses count GPU time from `cat == "kernel"` events only (memcpy/memset apart) and
// attribute a kernel to a step through its `correlation` id: kernel → the runtime call that
// launched it → the innermost CPU `user_annotation` on that thread enclosing the call. GPU-side
// annotation spans are never used for time.
//
// Every function returns a molora::Status; nothing throws. Times are in microseconds (double)
// in the results; internally events are kept in integer nanoseconds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "molora/status.h"

namespace molora::prof {

// ---- categories and rules --------------------------------------------------------------------

enum class Category : int {
  kMoe = 0,
  kMoeLora,
  kAttention,
  kGemm,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kP2p,
  kOtherComm,
  kNorm,
  kElementwise,
  kRouting,
  kSampling,
  kSpeculative,
  kMemcpy,
  kMemset,
  kOther,
  kCount
};
constexpr int kNumCategories = static_cast<int>(Category::kCount);

// Stable id used in tables, JSON and rule files: "moe", "moe-lora", "attention", "gemm",
// "allreduce", "allgather", "reducescatter", "alltoall", "p2p", "other-comm", "norm",
// "elementwise", "routing", "sampling", "speculative", "memcpy", "memset", "other".
const char* category_name(Category c);
// Parses a category id (above); false when unknown.
bool parse_category(const std::string& name, Category* out);
// True for allreduce, allgather, reducescatter, alltoall, p2p and other-comm.
bool is_comm(Category c);

struct Rule {
  Category category = Category::kOther;
  std::string pattern;  // ECMAScript regex, searched (not anchored) in the kernel name
  std::string origin;   // "builtin:12" or "FILE:LINE"
};

// Ordered classification rules: the first rule whose regex matches a kernel name decides its
// category; no match → other. User rules come before the built-in ones.
class Rules {
 public:
  Rules();  // the built-in rules
  ~Rules();
  Rules(const Rules&);
  Rules& operator=(const Rules&);

  // Reads a rules file and puts its rules before the current ones. Format: one rule a line,
  // `<category> <regex>` (separated by whitespace; the regex is the rest of the line);
  // blank lines and lines starting with '#' are ignored. Unknown category or bad regex →
  // InvalidArgument naming FILE:LINE.
  Status add_file(const std::string& path);
  // Puts one rule before the current ones (origin names it in explain()).
  Status add_front(Category c, const std::string& pattern, const std::string& origin);

  // Category of a kernel name; `rule` (optional) gets the index of the matching rule, -1 if none.
  Category classify(const std::string& kernel_name, int* rule = nullptr) const;
  const std::vector<Rule>& rules() const;

 private:
  struct Impl;
  Impl* impl_;
};

// ---- the trace -------------------------------------------------------------------------------

struct GpuEvent {  // a kernel, memcpy or memset
  int64_t ts_ns = 0, dur_ns = 0;
  int32_t name = -1;  // index into Trace::names
  int32_t device = -1, stream = -1;
  int64_t correlation = -1;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
};

struct CpuSpan {  // a runtime/driver call or a user annotation
  int64_t ts_ns = 0, dur_ns = 0;
  int64_t pid = 0, tid = 0;  // string pid/tid are hashed
  int64_t correlation = -1;  // runtime calls
  int32_t name = -1;         // annotations
};

struct Trace {
  std::string path;
  std::vector<std::string> names;     // interned kernel / annotation names
  std::vector<GpuEvent> kernels;      // cat == "kernel"
  std::vector<GpuEvent> memcpys;      // cat == "gpu_memcpy"
  std::vector<GpuEvent> memsets;      // cat == "gpu_memset"
  std::vector<CpuSpan> runtime;       // cat == "cuda_runtime" / "cuda_driver" with correlation
  std::vector<CpuSpan> annotations;   // cat == "user_annotation"
  int rank = -1;                      // distributedInfo.rank when present
  uint64_t events = 0;                // trace events seen (all categories)
  uint64_t bytes = 0;                 // uncompressed JSON bytes read
  bool truncated = false;             // input ended early: the result is partial
  std::vector<std::string> warnings;  // truncation etc.
};

struct ReadOptions {
  int threads = 0;                 // 0: MOLORA_PROF_THREADS, else hardware threads
  size_t piece_bytes = 32u << 20;  // target piece size (tests force tiny pieces)
  // Called now and then with (compressed or raw bytes consumed, file size).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Reads a trace file (.json, .json.gz, .pt.trace.json[.gz]; gzip is detected by magic bytes).
// Truncated input: ok Status, out->truncated = true and a warning (the events before the cut are
// kept). Malformed JSON: ParseError "FILE: byte N: ..." (N is the offset in the uncompressed
// JSON). Unreadable file: IoError.
Status read_trace(const std::string& path, const ReadOptions& opts, Trace* out);
// Same over an in-memory buffer of JSON or gzip bytes (tests and the fuzzer).
Status read_trace_buffer(const void* data, size_t size, const ReadOptions& opts, Trace* out);

// ---- analyses --------------------------------------------------------------------------------

struct CategoryStat {
  double time_us = 0;  // sum of durations
  double share = 0;    // time / kernel time (memcpy/memset rows too, outside the 100%)
  uint64_t count = 0;
};

struct KernelStat {
  std::string name;
  Category category = Category::kOther;
  uint64_t count = 0;
  double total_us = 0, mean_us = 0, min_us = 0, max_us = 0;
  std::vector<std::string> configs;  // distinct "grid [x,y,z] block [x,y,z]" seen (first 8)
  uint64_t num_configs = 0;
};

struct Summary {
  std::string path;
  int rank = -1;
  bool truncated = false;
  std::vector<std::string> warnings;
  uint64_t events = 0, bytes = 0;
  uint64_t kernels = 0, memcpys = 0, memsets = 0;
  double kernel_us = 0;  // sum of kernel durations
  double memcpy_us = 0, memset_us = 0;
  double busy_us = 0;  // union of kernel intervals, per device, summed over devices
  double wall_us = 0;  // first GPU event start to last GPU event end
  int devices = 0;
  CategoryStat categories[kNumCategories];
  std::vector<KernelStat> top;  // by total time, descending (all kernels by name)
};

Status summarize(const Trace& t, const Rules& rules, Summary* out);

struct StepsOptions {
  // Annotations that are steps; the innermost enclosing match is a kernel's step.
  std::string step_regex = R"(^(ProfilerStep#\d+|step\[.*\]|execute_model.*|.*decode_step.*)$)";
};

struct StepStat {
  int index = 0;            // 0, 1, ... in start order; -1: kernels under no step
  std::string name;         // annotation name ("(no step)" for index -1)
  double cpu_start_us = 0;  // annotation start, relative to the first step
  double cpu_us = 0;        // annotation duration (CPU)
  double kernel_us = 0, busy_us = 0, wall_us = 0;  // wall: first kernel start..last kernel end
  uint64_t launches = 0;
  double categories_us[kNumCategories] = {};
  std::string top_annotation;  // innermost annotation (by name) holding most kernel time
  double top_annotation_us = 0, top_annotation_share = 0;
};

struct Steps {
  std::string path;
  bool truncated = false;
  std::vector<std::string> warnings;
  uint64_t kernels = 0, attributed = 0;  // kernels with a launching runtime call found
  uint64_t unmatched = 0;                // no runtime call with that correlation
  std::vector<StepStat> steps;           // the "(no step)" row last, when any kernel has no step
};

Status compute_steps(const Trace& t, const Rules& rules, const StepsOptions& opts, Steps* out);

struct GridStat {
  std::string name;
  Category category = Category::kOther;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t ctas = 0, threads_per_cta = 0;
  uint64_t count = 0;
  double total_us = 0, mean_us = 0, min_us = 0, max_us = 0;
};

// One row per (kernel name, grid, block); `kernel_regex` (empty = all) filters by name.
Status compute_grids(const Trace& t, const Rules& rules, const std::string& kernel_regex,
                     std::vector<GridStat>* out);

// ---- reports (text tables, JSON with "schema", CSV, SVG) --------------------------------------

std::string summary_text(const Summary& s, int top_n);
std::string summary_json(const Summary& s, int top_n);  // schema molora.prof.summary/1
std::string summary_csv(const Summary& s, int top_n);
std::string steps_text(const Steps& s);
std::string steps_json(const Steps& s);  // schema molora.prof.steps/1
std::string steps_csv(const Steps& s);
std::string steps_svg(const Steps& s);  // stacked bar per step by category
std::string grids_text(const std::vector<GridStat>& g);
std::string grids_json(const std::vector<GridStat>& g);  // schema molora.prof.grids/1
std::string grids_csv(const std::vector<GridStat>& g);
// A vs B: per-category and per-kernel deltas (B - A).
std::string diff_text(const Summary& a, const Summary& b, int top_n);
std::string diff_json(const Summary& a, const Summary& b, int top_n);  // molora.prof.diff/1
std::string diff_csv(const Summary& a, const Summary& b, int top_n);
// Per-rank table, skew (max - min) per category, the slowest rank (most non-communication
// kernel time: the others wait for it in the collectives).
std::string ranks_text(const std::vector<Summary>& r);
std::string ranks_json(const std::vector<Summary>& r);  // molora.prof.ranks/1
std::string ranks_csv(const std::vector<Summary>& r);
// `NAME -> category (rule N: /regex/ from ORIGIN)`.
std::string explain(const Rules& rules, const std::string& kernel_name);

}  // namespace molora::prof
