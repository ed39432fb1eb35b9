#!/usr/bin/env bash
# How much of a lora call's time its weights' L2 reuse between the timed calls hides (device
# run, carry build-gpu): every seed shape and op, aligned routing, T=1/8/32/64, with the timed
# calls on one weight copy (1: what the bench did before 2026-12-05), one copy per rotating
# routing (the default, 16) and as many as fit a quarter of the device memory up to 256 (the
# timed graph then holds that many calls, so a call's weights come back only after all the
# others': what is left of L2 reuse at T <= 8 shows as the difference to 16).
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=${M:-build-gpu/src/cli/molora}
nvidia-smi --query-gpu=name --format=csv,noheader
# shape  most copies within a quarter of 80 GB (weights: 503 / 470 / 268 / 64 MiB)
while read -r shape most; do
  for op in expand shrink; do
    for w in 1 16 "$most"; do
      "$M" bench lora --shape "$shape" --routing aligned --op "$op" --T "${TS:-1,8,32,64}" \
        --weight-copies "$w" 2>&1 | grep "us, floor" |
        sed -E 's/ floor [0-9.]+ us,//; s/ of copy [0-9.]+ GB\/s//; s/\.aligned-stream\.bf16//'
    done
  done
done <<'SHAPES'
N6144_r32_V160x8 32
N7168_r32_V256x4 32
N4096_r32_V128x8 64
N2048_r16_V128x8 256
SHAPES
