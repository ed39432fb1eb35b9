#!/usr/bin/env bash
# Where a stream call's time goes (device run, carry build-gpu or build-ab): `molora bench lora
# --timeline` for both ops over the seed shapes, T = 1/8/32/64, all tokens with an adapter, half
# and none. Env: M (the CLI; default build-gpu's), LIB (its library folder), SHAPES, TS, NONES.
# The library must be built with the probe: GPU_TRACE=ON GPU_BUILD=build-trace tools/gpu-check
# prepare, then M=build-trace/src/cli/molora LIB=build-trace/src (or tools/probe/ab.sh --stage
# trace to carry it in build-ab).
cd "$(dirname "$0")/../.."
M=${M:-build-gpu/src/cli/molora}
LIB=${LIB:-build-gpu/src}
export LD_LIBRARY_PATH=$PWD/$LIB:$PWD/${LIB%/src}/deplib:$PWD/build-gpu/deplib:$PWD/build-ab/deplib
SHAPES=${SHAPES:-"N6144_r32_V160x8 N4096_r32_V128x8"}
TS=${TS:-1,8,32,64}
for sh in $SHAPES; do
  for op in shrink expand; do
    for none in ${NONES:-0 0.5 1}; do
      echo "== $op $sh none=$none"
      "$M" bench lora --shape "$sh" --op "$op" --routing aligned --T "$TS" --none "$none" \
        --timeline 2>&1 | sed -E 's/ floor [0-9.]+ us,//; s/ of copy [0-9.]+ GB\/s//'
    done
  done
done
