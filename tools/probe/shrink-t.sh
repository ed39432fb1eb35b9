#!/usr/bin/env bash
# Shrink on the stream kernel per seed shape at the given token counts (device run, carry
# build-gpu). Usage: tools/probe/shrink-t.sh [T-list] (default 32,64,128,256)
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
  "$M" bench lora --op shrink --routing aligned --kernel stream --shape $sh --T ${1:-32,64,128,256} 2>&1 |
    grep -E "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//; s/^shrink //'
done
