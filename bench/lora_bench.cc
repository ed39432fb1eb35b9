// bench_lora: MoE-LoRA shrink/expand on the seed shapes (see src/lora/lora_bench.h).
// Usage: bench_lora [--quick]. Prints the table last, then SUMMARY lines; exit 0 even when a
// target is missed (the SUMMARY says MET/MISSED), 1 on error.
#include "lora/lora_bench.h"

#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int missed = 0;
  molora::Status st = molora::lora::bench::run_table(std::cout, quick, &missed);
  if (!st.ok()) {
    std::cerr << "bench_lora: " << st.to_string() << "\n";
    return 1;
  }
  std::cout << "SUMMARY lora targets missed: " << missed << "\n";
  return 0;
}
