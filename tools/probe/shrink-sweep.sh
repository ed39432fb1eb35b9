#!/usr/bin/env bash
# Shrink stream kernel sweeps on the GPU machine (device run, carry build-gpu): warps x stages
# per seed shape and token count, the timing probes, and the grid kernel for comparison.
# Usage: [GRID=1] tools/probe/shrink-sweep.sh [cfgs]   (cfgs: "W:S ..." warps:stages per warp;
# GRID=1 adds the grid kernel rows)
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
CFGS=${1:-"2:13 4:6 8:3 12:2"}
b() { "$M" bench lora --op shrink --routing aligned "$@" 2>&1 | grep -E "us, floor" |
      sed -E 's/shrink\.aligned-?//; s/ floor [0-9.]+ us,//; s/of copy.*//; s/^shrink //'; }
for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
  for cs in $CFGS; do
    echo "-- $cs"
    MOLORA_LORA_STREAM_CONSUMERS=${cs%:*} MOLORA_LORA_STREAM_STAGES=${cs#*:} \
      b --shape $sh --kernel stream --T 1,8,32,64,128,256
  done
done
if [ -n "${GRID:-}" ]; then
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    echo "-- grid"; b --shape $sh --kernel grid --T 1,8,32,64,128,256
  done
fi
echo "== probes N6144 T=256 (8:3): none, 1 no math, 4 no copies, 8 no L2 hint, 16 row copies"
for p in 0 1 4 8 16; do echo -n "probe $p "; MOLORA_LORA_STREAM_PROBE=$p b --shape N6144_r32_V160x8 --kernel stream --T 256; done
