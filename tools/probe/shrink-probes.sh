#!/usr/bin/env bash
# Shrink stream timing probes at small T (device run, carry build-gpu): 0 full, 1 no math,
# 2 no pair ids (no x), 4 no weight copies, 7 none of them (the kernel's skeleton).
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
for p in 0 1 2 4 7; do
  echo "-- probe $p"
  MOLORA_LORA_STREAM_PROBE=$p "$M" bench lora --op shrink --routing aligned --kernel stream \
    --shape ${SHAPE:-N6144_r32_V160x8} --T ${1:-1,8,32} 2>&1 | grep -E "us, floor" |
    sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//; s/^shrink //'
done
echo "-- grid"
"$M" bench lora --op shrink --routing aligned --kernel grid --shape ${SHAPE:-N6144_r32_V160x8} \
  --T ${1:-1,8,32} 2>&1 | grep -E "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//'
echo "-- expand stream (reference)"
"$M" bench lora --op expand --routing aligned --kernel stream --shape ${SHAPE:-N6144_r32_V160x8} \
  --T ${1:-1,8,32} 2>&1 | grep -E "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//'
