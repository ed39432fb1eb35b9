#!/usr/bin/env bash
# Where the stream shrink's time goes at small T (device run, carry build-gpu): per seed shape,
# the probe bits (0 full, 1 no math, 2 no activations, 4 no weight copies, 7 skeleton) at the
# default warps x stages, then warps x stages variants with the full kernel.
# Usage: tools/probe/shrink-small-t.sh [T-list] (default 8,32)
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
TS=${1:-8,32}
for sh in N6144_r32_V160x8 N4096_r32_V128x8; do
  b() { "$M" bench lora --shape $sh --routing aligned --T $TS --op shrink --kernel stream 2>&1 |
    grep -E "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//; s/shrink.aligned-stream.bf16 //'; }
  for p in 0 1 2 4 7; do MOLORA_LORA_STREAM_PROBE=$p b | sed "s/^/probe=$p /"; done
  for ws in 12x2 8x3 6x4 4x6; do
    MOLORA_LORA_STREAM_CONSUMERS=${ws%x*} MOLORA_LORA_STREAM_STAGES=${ws#*x} b | sed "s/^/w x s=$ws /"
  done
done
