// `molora bench lora [--tune] [--out FILE] [--quick]`: the lora benchmark table, or the tuner
// that writes configs/lora/<gpu>.json (read by the planner; MOLORA_LORA_CONFIG overrides).
#include <iostream>
#include <memory>
#include <string>

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
  lora->callback([tune, quick, out, &exit_code] {
    molora::Status st;
    if (*tune) {
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
