#!/usr/bin/env bash
# The tuned config against the heuristic (MOLORA_LORA_CONFIG=none) on the grid kernel at small
# T (device run, carry build-gpu). Usage: tools/probe/tuned-vs-heuristic.sh [T-list]
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
for op in shrink expand; do
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    for cfg in "" none; do
      MOLORA_LORA_CONFIG=$cfg "$M" bench lora --op $op --routing aligned --kernel grid --shape $sh \
        --T ${1:-1,8} 2>&1 | grep -E "us, floor" |
        sed -E "s/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned //; s/^/cfg=${cfg:-tuned} /"
    done
  done
done
