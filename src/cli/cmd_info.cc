// `molora info`: build architectures, CUDA runtime/driver, GPUs, peer matrix, NCCL, settings.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "molora/info.h"

namespace {
molora::cli::Registrar reg(0, [](CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("info", "Print what this build and this machine offer");
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "Print a JSON object (schema molora.info/1)");
  sub->callback([json, &exit_code] {
    std::cout << (*json ? molora::info_json() : molora::info_text());
    if (*json) std::cout << "\n";
    exit_code = 0;
  });
});
}  // namespace
