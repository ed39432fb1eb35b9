// `molora bench lora [--tune] [--out FILE] [--quick] [--shape S --op O --T 1,64 --routing R
// --kernel K --none F --mixed-ranks --layers L --timeline]`: the lora benchmark table, one shape,
// or the tuner that writes configs/lora/<gpu>.json (read by the planner; MOLORA_LORA_CONFIG
// overrides).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "lora/lora_bench.h"

namespace {
molora::cli::Registrar reg(20, [](CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Run a part's benchmark on this GPU");
  bench->require_subcommand(1);
  auto* lora = bench->add_subcommand("lora", "MoE-LoRA shrink/expand on the seed shapes");
  auto tune = std::make_shared<bool>(false);
  auto quick = std::make_shared<bool>(false);
  auto out = std::make_shared<std::string>();
  lora->add_flag("--tune", *tune, "Sweep tiles and CTAs/SM and write a tuned config JSON");
  lora->add_flag("--quick", *quick, "Fewer token counts (table only)");
  lora->add_option("--out", *out, "Config file to write (default: configs/lora/<gpu>.json)");
  // One shape instead of the table: --shape with --op, --T (list), --routing, --kernel, --none.
  auto shape = std::make_shared<std::string>();
  auto op = std::make_shared<std::string>("expand");
  auto routing = std::make_shared<std::string>("aligned");
  auto kernel = std::make_shared<std::string>();
  auto Ts = std::make_shared<std::vector<int>>(std::vector<int>{1, 8, 64, 256});
  auto none = std::make_shared<double>(0.0);
  lora->add_option("--shape", *shape,
                   "Seed shape name, e.g. N6144_r32_V160x8, or any "
                   "N<dim>_r<r_max>_V<experts>x<slots> (one-shape mode)");
  lora->add_option("--op", *op,
                   "expand, shrink, chain: shrink -> expand pairs, N = K, delta: the same "
                   "pairs as one moe_delta call each, or delta-after: deltas that each follow "
                   "another, reading their shrink's inputs early too (one-shape mode)")
      ->check(CLI::IsMember({"expand", "shrink", "chain", "delta", "delta-after"}));
  lora->add_option("--routing", *routing,
                   "plain, aligned, or align: the align kernel (slot ids, block 16) then the "
                   "aligned call, both timed, what a caller holding plain routing pays "
                   "(one-shape mode)")
      ->check(CLI::IsMember({"plain", "aligned", "align"}));
  lora->add_option("--kernel", *kernel, "grid or stream (default: the planner's choice)")
      ->check(CLI::IsMember({"", "grid", "stream"}));
  lora->add_option("--T", *Ts,
                   "Token counts, 1 to 8192 (T x top-8 pairs <= 65,536; one-shape mode)")
      ->delimiter(',')
      ->check(CLI::Range(1, 8192));
  auto tile = std::make_shared<int>(0);
  lora->add_option("--tile", *tile,
                   "Force the plan's tile (shrink: rank rows per work item, grid 1..r_max, "
                   "stream 8; expand: N rows; default 0: the planner's; one-shape mode)")
      ->check(CLI::Range(0, 16384));
  auto mixed = std::make_shared<bool>(false);
  lora->add_flag("--mixed-ranks", *mixed,
                 "Every second slot at rank r_max / 2 (one-shape mode; default: all at r_max)");
  auto copies = std::make_shared<int>(0);
  lora->add_option("--weight-copies", *copies,
                   "Distinct weight copies the timed calls cycle through, call i reading copy i "
                   "% W (default 0: one per rotating routing, 16, fewer where 16 would take more "
                   "than an eighth of the device's memory; 1: every call on one copy, so a small "
                   "shape's weights come partly from L2; above 16 the timed graph holds W calls; "
                   "one-shape mode)")
      ->check(CLI::Range(0, molora::lora::bench::kWeightCopiesMax));
  auto layers = std::make_shared<int>(0);
  lora->add_option("--layers", *layers,
                   "Also time eager host cost per call cycling over L layers' weights "
                   "(one-shape mode)")
      ->check(CLI::Range(1, 4096));
  auto timeline = std::make_shared<bool>(false);
  lora->add_flag("--timeline", *timeline,
                 "Also run each call with the stream kernels' timeline probe and print where "
                 "its time goes: CTA start, pdl_wait, first copy issued and landed, CTA ends "
                 "(one op, one-shape mode; needs a build configured with "
                 "-DMOLORA_LORA_TRACE=ON)");
  lora->add_option("--none", *none, "Share of tokens without adapter (one-shape mode)")
      ->check(CLI::Range(0.0, 1.0));
  lora->callback([=, &exit_code] {
    molora::Status st;
    if (!shape->empty()) {
      const bool pair = *op == "chain" || *op == "delta" || *op == "delta-after";
      const bool align = *routing == "align";
      if ((pair || align) && (*layers > 0 || *timeline)) {  // (both time one lora call alone)
        std::cerr << "molora bench lora: " << (*layers > 0 ? "--layers" : "--timeline")
                  << (align ? " times the lora call alone; it does not take --routing align"
                            : " times one op; it does not take --op " + *op)
                  << "\n";
        exit_code = 2;
        return;
      }
      molora::lora::bench::Case c;
      c.op = *op == "expand" ? molora::lora::Op::kExpand : molora::lora::Op::kShrink;
      c.chain = pair;
      c.delta = *op == "delta" || *op == "delta-after";
      c.after_delta = *op == "delta-after";
      c.routing = *routing == "plain" ? molora::lora::RoutingKind::kPlain
                                      : molora::lora::RoutingKind::kAligned;
      c.align_first = align;
      c.kernel = *kernel;
      c.none_frac = *none;
      c.mixed_ranks = *mixed;
      c.force_tile = *tile;
      c.layers = *layers;
      c.weight_copies = *copies;
      c.timeline = *timeline;
      if (!molora::lora::bench::parse_shape(*shape, &c.shape)) {
        std::cerr << "molora bench lora: unknown --shape " << *shape << " (seed shapes:";
        for (const auto& sh : molora::lora::bench::seed_shapes()) std::cerr << " " << sh.name;
        std::cerr << "; or N<dim>_r<r_max>_V<experts>x<slots>, dim a multiple of 8 <= 16384, "
                     "r_max 8/16/32/64/128, experts x slots <= 65536)\n";
        exit_code = 2;
        return;
      }
      if (c.shape.E < c.k) {  // (each token's k experts are distinct)
        std::cerr << "molora bench lora: --shape " << *shape << " has " << c.shape.E
                  << " experts, fewer than the benchmark's top-k of " << c.k << "\n";
        exit_code = 2;
        return;
      }
      double copy = 0;
      st = molora::lora::bench::measure_copy_gbps(&copy);
      for (int T : *Ts) {
        if (!st.ok()) break;
        c.T = T;
        molora::lora::bench::Result r;
        st = molora::lora::bench::run_case(c, copy, &r);
        if (st.ok())
          std::cout << *op << " " << *shape << " T=" << T << " " << *routing << " "
                    << r.plan.variant << " tile=" << r.plan.tile << ": " << r.us << " us, floor "
                    << r.floor_us << " us, " << r.pct_copy << "% of copy " << copy
                    << " GB/s, same-bytes copy " << r.copy_us << " us, weight copies "
                    << r.weight_copies << "\n";
        if (st.ok() && c.layers > 0)
          std::cout << "  eager host over " << c.layers << " layers: cold " << r.host_us_cold
                    << " us/call (" << r.encodes_cold << " map encodes/call), warm "
                    << r.host_us_warm << " us/call (" << r.encodes_warm
                    << " map encodes/call); one pointer check " << r.host_us_pointer_check
                    << " us, one empty launch " << r.host_us_empty_launch << " us\n";
        if (st.ok() && c.timeline) std::cout << molora::lora::bench::format_timeline(r.timeline);
      }
    } else if (*tune) {
      std::string path = *out;
      if (path.empty()) {
        path = molora::lora::default_config_path(molora::lora::bench::gpu_name());
      }
      st = molora::lora::bench::tune(path, std::cout);
    } else {
      int missed = 0;
      st = molora::lora::bench::run_table(std::cout, *quick, &missed);
    }
    if (!st.ok()) {
      std::cerr << "molora bench lora: " << st.to_string() << "\n";
      exit_code = st.code() == molora::StatusCode::kUnavailable ? 1 : 3;
      return;
    }
    exit_code = 0;
  });
});
}  // namespace
