// The CLI's command registry: each cmd_*.cc file registers its subcommand at static-init time,
// so parts add commands without editing main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace molora::cli {

// Adds a subcommand to `app`. The subcommand's callback stores the process exit code in
// `exit_code` (0 ok, 2 usage error, 3 bad input, 1 other failure).
using Setup = std::function<void(CLI::App& app, int& exit_code)>;

struct Registrar {
  // `order` sorts subcommands in --help (info=0, prof=10, bench=20, demo=30, ...).
  Registrar(int order, Setup setup);
};

}  // namespace molora::cli
