// `molora demo [args]`: runs `python3 -m molora.demo args...` (one MoE multi-LoRA decode layer
// end to end, see python/molora/demo.py) with this build tree's Python package (<build>/python,
// found from /proc/self/exe: <build>/src/cli/molora) put first on PYTHONPATH; without one there,
// PYTHONPATH is left as it is (an installed molora, or one the caller points at). Every argument,
// --help included, goes to the Python side unchanged; the exit code is the demo's (0 check passed,
// 1 check failed, 2 usage), 127 when no Python starts. MOLORA_PYTHON overrides the interpreter
// (default: python3 on PATH).
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/command.h"

namespace {

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

bool is_file(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// <build>/python (or tools/gpu-check's <build>/py/python) when this executable is
// <build>/src/cli/molora and the package with its extension is there; "" otherwise.
std::string build_python_dir() {
  std::string d = self_dir();
  if (d.empty()) return "";
  for (const char* rel : {"/../../python", "/../../py/python"}) {
    std::string py = d + rel;
    if (!is_file(py + "/molora/__init__.py") || !is_file(py + "/molora/demo.py")) continue;
    char real[PATH_MAX];
    return realpath(py.c_str(), real) ? std::string(real) : py;
  }
  return "";
}

int run_demo(const std::vector<std::string>& args) {
  const char* env_py = std::getenv("MOLORA_PYTHON");
  std::string python = env_py && *env_py ? env_py : "python3";
  std::string pkg = build_python_dir();
  if (!pkg.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    std::string v = pkg + (old && *old ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", v.c_str(), 1);
  }
  std::vector<std::string> argv_s = {python, "-m", "molora.demo"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = fork();
  if (pid < 0) {
    std::cerr << "molora demo: fork failed: " << std::strerror(errno) << "\n";
    return 1;
  }
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::cerr << "molora demo: cannot run " << python << ": " << std::strerror(errno)
              << " (set MOLORA_PYTHON to a Python 3 with numpy and safetensors)\n";
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::cerr << "molora demo: waitpid failed: " << std::strerror(errno) << "\n";
      return 1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

molora::cli::Registrar reg(30, [](CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "demo",
      "One MoE multi-LoRA decode layer end to end, checked (runs python3 -m molora.demo; "
      "`molora demo --help` lists its options)");
  sub->set_help_flag();  // --help goes to the Python side
  sub->prefix_command();
  sub->allow_extras();
  sub->callback([sub, &exit_code] { exit_code = run_demo(sub->remaining()); });
});

}  // namespace
