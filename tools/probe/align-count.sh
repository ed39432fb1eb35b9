#!/usr/bin/env bash
# Same-machine A/B of two align builds (device run, carry build-gpu, or GPU_BUILD=<folder>): the
# build's own libmolora.so and bench_align against a baseline staged by hand in $B/base/
# (libmolora.so.0 and bench_align of the commit before), and $B/mid/ (the same of another
# commit) where it exists. Two rounds, interleaved:
#   bench_align of each ("r<round> <variant> <bench_align row>"), then per seed shape and op
#   `molora bench lora --routing align` (the align kernel + the aligned call, timed together) on
#   each library ("r<round> <variant> <op> <shape> T=<T> <us>").
cd "$(dirname "$0")/../.." || exit
B=${GPU_BUILD:-build-gpu}
[ -f "$B/base/libmolora.so.0" ] && [ -x "$B/base/bench_align" ] ||
  { echo "align-count: stage the baseline in $B/base first (see the header)" >&2; exit 2; }
DEP=$PWD/$B/deplib
VARIANTS="base new"
[ -f "$B/mid/libmolora.so.0" ] && [ -x "$B/mid/bench_align" ] && VARIANTS="base mid new"
for r in 1 2; do
  for v in $VARIANTS; do
    exe=$B/bench/bench_align
    [ $v != new ] && exe=$B/$v/bench_align
    LD_LIBRARY_PATH=$DEP "$exe" 2>&1 | awk -v l="r$r $v" '$1 ~ /^[0-9]+$/ {print l, $0}'
  done
  for sh in ${SHAPES:-N6144_r32_V160x8 N2048_r16_V128x8}; do
    for op in expand shrink; do
      for v in $VARIANTS; do
        lib=$PWD/$B/src
        [ $v != new ] && lib=$PWD/$B/$v
        LD_LIBRARY_PATH=$lib:$DEP "$B/src/cli/molora" bench lora --shape "$sh" --op "$op" \
          --routing align --T 1,8,16,17,32,64 2>&1 |
          awk -v l="r$r $v" '/ us, floor/ {printf "%s %s %s %s %.2f\n", l, $1, $2, $3, $7}
                             !/ us, floor/ {print l ": " $0}'
      done
    done
  done
done
