// molora — command-line entry point. Subcommands live in cmd_*.cc.
#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "molora/version.h"

namespace molora::cli {
namespace {
std::vector<std::pair<int, Setup>>& registry() {
  static std::vector<std::pair<int, Setup>> r;
  return r;
}
}  // namespace

Registrar::Registrar(int order, Setup setup) { registry().emplace_back(order, std::move(setup)); }

}  // namespace molora::cli

int main(int argc, char** argv) {
  CLI::App app{"molora: MoE multi-LoRA decode kernels, all-reduce and trace analysis", "molora"};
  app.set_version_flag("--version", molora::version());
  app.require_subcommand(1);
  int exit_code = 0;
  auto& reg = molora::cli::registry();
  std::stable_sort(reg.begin(), reg.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : reg) setup(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return 2;     // every usage error exits 2
  }
  return exit_code;
}
