#!/usr/bin/env bash
# The plain grouping's cost, A/B (device run, carry build-trace): plain routing on the stream
# kernel, `molora bench lora` (one shape), two rounds, interleaved, over the libraries staged in
# build-trace: base and src (the commit before and this one, with the timeline probe: prints µs
# per call, tasks known (µs after the CTA's start, by its clock) and the "plain grouping" marks)
# and ntbase and nt (the same two without the probe: µs per call only). Stage by hand:
#   GPU_TRACE=ON GPU_BUILD=build-trace tools/gpu-check prepare   (src)
#   build-trace/base/libmolora.so.0   the commit before's, probe on
#   build-trace/ntbase/, build-trace/nt/   the two without it (tools/gpu-check prepare's)
# Env: SHAPES, OPS, TS, LIBS.
cd "$(dirname "$0")/../.." || exit
B=${GPU_BUILD:-build-trace}
M=$B/src/cli/molora
for r in 1 2; do
  for lib in ${LIBS:-base src ntbase nt}; do
    [ -f "$B/$lib/libmolora.so.0" ] || continue
    export LD_LIBRARY_PATH=$PWD/$B/$lib:$PWD/$B/deplib
    tl=--timeline
    case $lib in nt*) tl= ;; esac
    for sh in ${SHAPES:-N2048_r16_V128x8 N6144_r32_V160x8}; do
      for op in ${OPS:-expand shrink}; do
        "$M" bench lora --shape "$sh" --op "$op" --routing plain --kernel stream \
          --T "${TS:-8,64,256}" $tl 2>&1 |
          awk -v l="r$r $lib $sh $op" -v tl="$tl" '
            / us, floor/ {T = $3; us = $7; if (tl == "") print l, T, us}
            /by each CTA/ {match($0, /tasks known [0-9.]+/); tk = substr($0, RSTART + 12, RLENGTH - 12)}
            /plain grouping/ {sub(/.*start: /, ""); print l, T, us, "known", tk, "|", $0}'
      done
    done
  done
done
