#!/usr/bin/env bash
# libFuzzer on the align part's host side (moe_align_sizes, moe_align_check and the CPU
# reference on adversarial shapes, ids and capacities; fuzz/align_host_fuzz.cc says what it
# checks) for ALIGN_FUZZ_SECONDS (default 30) seconds. A small separate build without CUDA:
# clang (Debian clang 14 + libclang-rt-14-dev), the align host sources and Status/settings.
set -euo pipefail
cd "$(dirname "$0")/../.."
. fuzz/fuzz.sh
fuzz_setup align 30 align_host_fuzz
srcs=(fuzz/align_host_fuzz.cc src/align/align_cpu.cc src/core/status.cc src/core/settings.cc
      src/core/cuda_util.cc)
if fuzz_stale "$bin" "${srcs[@]}" fuzz/fuzz_bytes.h src/align/*.h include/molora/*.h; then
  echo "align_fuzz: building $bin with $CXX"
  fuzz_compile "$bin" -DMOLORA_HAVE_CUDA=0 "${srcs[@]}" -lpthread
fi
# Seeds: small valid shapes, with and without slot ids.
printf '\xff\x03\xff\x02\xff\x08\x00\x00\x01\x00' > "$OUT/corpus/small"
printf '\xff\x05\x01\xff\x10\x00\x01\x01\xff\x04\x02\x03\x01\x00\x02\x05\x06\x07' > "$OUT/corpus/slots"
fuzz_run align_fuzz "$bin" 1024
