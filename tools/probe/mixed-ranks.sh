#!/usr/bin/env bash
# One device call for expand with mixed ranks (carry build-gpu): the lora GPU tests, memcheck of
# the mixed-rank cases, then the stream expand with every second slot at r_max / 2 under each copy
# form: default (one tensor copy per task at the pitch r8), probe 64 (per-lane cp.async copies at
# the pitch r_max), probe 128 (whole rows: bytes at r_max), and uniform ranks for reference.
# Usage: tools/probe/mixed-ranks.sh [T-list]
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
build-gpu/tests/lora_gpu_test --gtest_brief=1 2>&1 | grep -E "FAILED|PASSED|Failure|error" | head -12
compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/lora_gpu_test \
  --gtest_filter='*MatchesReferenceAcrossShapes*:*StreamKernelEdges*' --gtest_brief=1 2>&1 |
  grep -E "ERROR SUMMARY|FAILED|PASSED" | head -4
TS=${1:-1,8,64,256}
for sh in N6144_r32_V160x8 N4096_r32_V128x8 N4096_r64_V128x8 N4096_r128_V64x8; do
  for probe in 0 64 128; do
    MOLORA_LORA_STREAM_PROBE=$probe "$M" bench lora --op expand --routing aligned --kernel stream \
      --shape $sh --T $TS --mixed-ranks 2>&1 | grep -E "us, floor" |
      sed -E "s/of copy.*//; s/aligned //; s/^/probe=$probe mixed /"
  done
  "$M" bench lora --op expand --routing aligned --kernel stream --shape $sh --T $TS 2>&1 |
    grep -E "us, floor" | sed -E 's/of copy.*//; s/aligned //; s/^/uniform /'
done
