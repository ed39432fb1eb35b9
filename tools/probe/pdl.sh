#!/usr/bin/env bash
# Programmatic dependent launch on and off (device run, carry build-gpu): the lora GPU tests
# with MOLORA_LORA_PDL=1, then every seed shape on the planner's kernel, aligned, both ways.
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
for pdl in 0 1; do
  echo "-- lora_gpu_test MOLORA_LORA_PDL=$pdl"
  MOLORA_LORA_PDL=$pdl build-gpu/tests/lora_gpu_test --gtest_brief=1 2>&1 | grep -E "FAILED|PASSED|Failure" | head -8
done
for op in shrink expand; do
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    for pdl in 0 1; do
      MOLORA_LORA_PDL=$pdl "$M" bench lora --op $op --routing aligned --shape $sh --T ${1:-1,8,32,64} 2>&1 |
        grep -E "us, floor" | sed -E "s/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned //; s/^/pdl=$pdl /"
    done
  done
done
