#!/usr/bin/env bash
# One device call for a lora kernel change (carry build-gpu): the lora GPU tests, then shrink
# and expand per seed shape on the planner's kernel and on both kernels at small T.
# Usage: [OPS="expand"] tools/probe/lora-quick.sh [T-list]
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
build-gpu/tests/lora_gpu_test --gtest_brief=1 2>&1 | grep -E "FAILED|PASSED|Failure|error" | head -12
TS=${1:-1,8,32,64,128,256}
for op in ${OPS:-shrink expand}; do
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    for k in stream grid; do
      "$M" bench lora --op $op --routing aligned --kernel $k --shape $sh --T $TS 2>&1 |
        grep -E "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned //'
    done
  done
done
