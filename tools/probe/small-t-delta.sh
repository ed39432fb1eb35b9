#!/usr/bin/env bash
# The delta's shrink at small T on the stream kernel instead of the planner's grid kernel
# (device run, carry build-gpu, or GPU_BUILD=<folder>): `molora bench lora --op delta` and
# `--op delta-after` (the shrink reading early: only the stream kernel can), each with the
# planner's kernels and with `--kernel stream`, per seed shape, interleaved, ROUNDS rounds
# (default 2), aligned routing, T in TS (default 1,2,4,8,16).
# Usage: [ROUNDS=2] [TS=1,2,4,8,16] [GPU_BUILD=build-gpu] tools/probe/small-t-delta.sh
cd "$(dirname "$0")/../.."
B=${GPU_BUILD:-build-gpu}
export LD_LIBRARY_PATH=$PWD/$B/deplib
M=$B/src/cli/molora
nvidia-smi --query-gpu=name --format=csv,noheader
for round in $(seq 1 "${ROUNDS:-2}"); do
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    for op in delta delta-after; do
      for k in planner stream; do
        kern=()
        [ "$k" = stream ] && kern=(--kernel stream)
        "$M" bench lora --op $op --routing aligned --shape $sh --T "${TS:-1,2,4,8,16}" "${kern[@]}" 2>&1 |
          grep -E "us, floor|rror" |
          sed -E "s/^/r$round $op $k /; s/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned shrink[^:]*//"
      done
    done
  done
done
