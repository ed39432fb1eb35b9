#!/usr/bin/env bash
# Plain routing on the stream kernel, measured (device run, carry build-gpu, or GPU_BUILD=<folder>):
# per seed shape and op, two rounds, interleaved, µs per call (`molora bench lora`, one shape):
#   pl-grid   plain routing on the grid kernel (the planner's choice before)
#   pl-strm   plain routing on the stream kernel (each CTA groups the pairs itself)
#   al+align  the align kernel + the aligned call (what a caller holding plain routing pays)
#   al-new    aligned alone on this build, and al-base on the baseline staged in $B/base
#             (libmolora.so.0 of the commit before), where it exists: the aligned calls must not
#             have slowed down.
# TS (default 1,8,32,64,256), NONE (share of tokens without adapter, default 0), SHAPES.
# Prints "r<round> <variant> <op> <shape> T=<T> <us>".
cd "$(dirname "$0")/../.." || exit
B=${GPU_BUILD:-build-gpu}
DEP=$PWD/$B/deplib
M=$B/src/cli/molora
TS=${TS:-1,8,32,64,256}
for r in 1 2; do
  for sh in ${SHAPES:-N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8}; do
    for op in expand shrink; do
      one() {
        local label=$1 lib=$2
        shift 2
        LD_LIBRARY_PATH=$lib:$DEP "$M" bench lora --shape "$sh" --op "$op" --T "$TS" \
          --none "${NONE:-0}" "$@" 2>&1 |
          awk -v l="r$r $label" '/ us, floor/ {printf "%s %s %s %s %.2f\n", l, $1, $2, $3, $7}
                                 !/ us, floor/ {print l ": " $0}'
      }
      one pl-grid "$PWD/$B/src" --routing plain --kernel grid
      one pl-strm "$PWD/$B/src" --routing plain --kernel stream
      one al+align "$PWD/$B/src" --routing align
      [ -f "$B/base/libmolora.so.0" ] && one al-base "$PWD/$B/base" --routing aligned
      one al-new "$PWD/$B/src" --routing aligned
    done
  done
done
