// Benchmark harness of the lora part (internal): used by bench/lora_bench.cc (bench_lora) and
// `molora bench lora [--tune]`. Times graph replays of calls over rotating routings, each call on
// its own copy of the weights (Case::weight_copies: so weights come from HBM, not from an
// earlier call in L2), and reports bytes that must move, GB/s and the floor.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "molora/lora.h"

namespace molora::lora::bench {

struct Shape {
  std::string name;  // e.g. "N6144_r32_V160x8"
  int64_t dim;       // N (expand) or K (shrink)
  int r;             // rank of every slot (r_max)
  int E, S;          // experts, slots: V = S*E
};

// The issue's seed shapes.
std::vector<Shape> seed_shapes();
// A seed shape by name, or any shape named "N<dim>_r<r_max>_V<E>x<S>" (dim a multiple of 8 up
// to 16,384, r_max in {8, 16, 32, 64, 128}, S * E up to 65,536); false (out untouched) else.
bool parse_shape(const std::string& name, Shape* out);

// Case::weight_copies = 0 takes this many (the rotating routings of a timed graph); the most a
// case may ask for is kWeightCopiesMax.
constexpr int kWeightCopiesAuto = 16, kWeightCopiesMax = 256;

struct Case {
  Op op = Op::kExpand;
  Shape shape;
  int T = 64, k = 8;
  double none_frac = 0;  // share of tokens without adapter
  RoutingKind routing = RoutingKind::kPlain;
  int block = 16;  // aligned layout block size
  int force_tile = 0, force_unroll = 0;
  std::string kernel;        // "" the planner's choice, "grid" or "stream"
  std::string config_path;   // "" default lookup, "none" heuristic only
  bool mixed_ranks = false;  // every second slot at rank r_max / 2 (else every slot at r_max)
  // > 0: also time eager calls (no graph) cycling over this many layers, i.e. weight pointers
  // 256 bytes apart (same shape), as an engine without graphs alternates layers: host_us_*.
  int layers = 0;
  // With op shrink: time shrink -> expand pairs instead (one graph; expand reads the t the
  // shrink wrote, N = K = shape.dim, the same routing): the two calls a fused shrink+expand
  // would replace. bytes and floor are those of both calls.
  bool chain = false;
  // With chain: the pair through one moe_delta call (DeltaPlan: the expand reads its routing,
  // ranks, scales and weights while the shrink finishes) instead of shrink() then expand().
  bool delta = false;
  // With delta: each delta reads its shrink's inputs early too (moe_delta's shrink_early: valid
  // here, where every call follows another delta and nothing writes the routing or weights).
  bool after_delta = false;
  // Distinct copies of the weights that the timed calls cycle through (call i reads copy
  // i % weight_copies). An engine's decode step never finds a call's weights in L2 (every layer
  // has its own, and the other layers' pass between two calls of one), so the timing should not
  // either. 0 (default): kWeightCopiesAuto copies, one per rotating routing, so a call's weights
  // come back only after the other 15 calls' (fewer where that many would take more than an
  // eighth of the device's memory: Result::weight_copies says how many). 1: every call reads
  // one copy, as before 2026-12-05: a small shape's weights (N2048 r16: 64 MiB against a 50 MB
  // L2) then come partly from L2 (bench/NOTES.md "lora v0.17"). Above kWeightCopiesAuto: the
  // timed graph holds that many calls, each on its own copy (routings still rotate over 16).
  int weight_copies = 0;
  // Also run the calls once more with the stream kernels' timeline probe on (one op, a stream
  // plan): Result::timeline.
  bool timeline = false;
  // With aligned routing: what a caller that holds plain routing (topk_ids, slot_ids) pays for
  // the aligned call. Each timed call is moe_align_block_size (slot ids, V = S*E, block `block`)
  // on the device, then the aligned call reading that output; both are in the timed graph. The
  // first run checks the device's align output against the layout built on the host. bytes and
  // floor are the lora call's (the align's ~4 bytes per position of sorted_token_ids not
  // counted). Not with layers or timeline (they time the lora call alone).
  bool align_first = false;
};

// The stream kernels' timeline probe (detail::set_stream_trace): each call's phases from the
// records of `calls` consecutive launches of `grid` CTAs (detail::kTraceWords words per CTA),
// in us from the previous call's last CTA end, summarised over the calls after the first as the
// median of each call's statistic. "end" is a CTA's last warp done; the call's own time is the
// last CTA's end (end_max).
struct Timeline {
  int calls = 0, grid = 0;              // calls summarised (0: none), CTAs per call
  double start_min = 0, start_med = 0;  // CTA start (negative: before the previous call ended)
  double wait_med = 0, wait_max = 0;    // pdl_wait returned
  double known_med = 0;                 // task count known (CTAs with it)
  double issue_med = 0, issue_max = 0;  // first weight copy issued (CTAs with one)
  double land_med = 0, land_max = 0;    // that copy landed
  double first_done_med = 0;            // a CTA's first warp done
  double end_min = 0, end_med = 0, end_max = 0;
  double tasks_mean = 0;  // grid-stride tasks per CTA
  int tasks_max = 0;
  double busiest_end = 0;     // end of the CTA with the most tasks (the first such)
  int64_t timer_step_ns = 0;  // smallest nonzero gap between two CTA starts (>= timer step)
  // From each CTA's own clock (clock64, exact where %globaltimer steps by 256 ns): the SM clock
  // (GHz, from CTAs that ran >= 2 us; 0: none did) and each event's mean time after the CTA's
  // start, us (0 without a clock).
  double clock_ghz = 0;
  double c_wait = 0, c_known = 0, c_issue = 0, c_land = 0, c_first_done = 0, c_end = 0;
  // Plain routing on the stream kernels: the grouping's steps (plain_build's marks j < 8), mean
  // us after the CTA's start by its clock; 0 where no CTA has the mark.
  double c_build[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  double probe_us = 0;  // time per call with the probe on (run_case)
  // CTAs that reached the task count, issued a first copy, and saw it land (median over the
  // calls); 0: none did, and format_timeline prints "none" for that event.
  double known_ctas = 0, issue_ctas = 0, land_ctas = 0;
};
// Fails (InvalidArgument) on a size mismatch, fewer than 2 calls or an unwritten record.
Status summarize_timeline(const std::vector<unsigned long long>& words, int calls, int grid,
                          Timeline* out);
// Lines for the CLI.
std::string format_timeline(const Timeline& t);

struct Result {
  double us = 0;          // per call
  int weight_copies = 0;  // weight copies the timed calls cycled through (Case::weight_copies)
  double floor_us = 0;    // bytes / copy bandwidth measured
  int64_t bytes = 0;      // bytes that must move (mean over the rotating routings)
  double gbps = 0;
  double pct_copy = 0;  // of the measured device-to-device copy bandwidth
  // A device-to-device copy of the same bytes (half read, half written; measure_copy_us), timed
  // as the call is: what the GPU's own copy pays at this size, launch and ramp included, where
  // floor_us counts the bytes alone. 0 when no byte must move.
  double copy_us = 0;
  Plan plan;         // the call's (a chain's: the shrink's)
  Plan plan_expand;  // a chain's expand (Case::chain)
  // With Case::layers: host time per eager call (enqueue only, the GPU runs behind), first over
  // the layers with the tensor-map cache emptied (every stream call encodes its maps: what a
  // cache of the last call's maps paid at every call when layers alternate), then warm (eight
  // more passes); and the maps encoded per call in each.
  double host_us_cold = 0, host_us_warm = 0;
  double encodes_cold = 0, encodes_warm = 0;
  // Beside it, host us of one cudaPointerGetAttributes (a call checks each of its 7-8 pointers
  // with one, outside captures) and of one empty kernel launch.
  double host_us_pointer_check = 0, host_us_empty_launch = 0;
  // With Case::timeline and a stream plan (else timeline.calls == 0).
  Timeline timeline;
};

// Device-to-device copy bandwidth (read + write counted), GB/s.
Status measure_copy_gbps(double* gbps);
// Time of one cudaMemcpyAsync device-to-device of bytes / 2 (so bytes read + written), us: graph
// replays like run_case's, each copy on memory no recent copy touched (from HBM, not L2).
// Measured once per size (4 KiB steps) per process; 0 for bytes <= 0.
Status measure_copy_us(int64_t bytes, double* us);
// One empty kernel of one CTA per SM x 384 threads, timed as run_case times a call (graph
// replays of kRot launches): the launch cost every call pays before it moves a byte, us.
Status measure_empty_launch_us(double* us);
// Times one case; copy_gbps from measure_copy_gbps.
Status run_case(const Case& c, double copy_gbps, Result* out);

// The full table (seed shapes x T x no-adapter share x routing x op); prints the table last and
// SUMMARY lines. Returns 0 when every target is met, 1 otherwise (not an error).
Status run_table(std::ostream& os, bool quick, int* targets_missed);
// Name of the current GPU ("" without one).
std::string gpu_name();
// Sweeps, for the seed shapes, both routings and each token count of tune_token_counts(), the
// grid kernel's tiles x unrolls and times the stream kernel where it applies; writes a config
// JSON to path (tune_entries' entries).
Status tune(const std::string& path, std::ostream& log);

// The token counts the tuner measures (each twice the one before, so that a bucket's P differ
// by at most 2x): an entry covers the pairs of its count down to the count below (p_min).
std::vector<int> tune_token_counts();
int64_t tune_p_min(int T, int k);

// One bucket's measurements (tune): the grid kernel on the heuristic's tile and on the sweep's
// best, and the stream kernel where it applies (its tile is the planner's, fixed by r_max).
struct TuneBucket {
  Op op = Op::kExpand;
  Shape shape;
  RoutingKind routing = RoutingKind::kPlain;
  int T = 1, k = 8;
  int heur_tile = 0, heur_unroll = 0;
  double heur_us = 0;
  int best_tile = 0, best_unroll = 0;
  double best_us = 0;
  bool stream = false;  // the stream kernel was timed
  int stream_tile = 0;
  double stream_us = 0;
};
// The bucket's config entries: the grid kernel's (its best tile where that beats the
// heuristic's by more than 3%, else the heuristic's own with "heuristic": true) and, where the
// stream kernel was timed, the stream kernel's. In a bucket that has both, plan() takes the
// other kernel than its bounds' where that one is more than 3% faster (Plan::kernel_source
// "tuned:<file>"), and the tile of the kernel it runs.
std::vector<nlohmann::json> tune_entries(const TuneBucket& b);
// The bucket's grid entry takes the sweep's best tile (else the heuristic's): best_us below
// detail::kTuneMargin of heur_us.
bool tune_keeps_best(const TuneBucket& b);

}  // namespace molora::lora::bench
