#!/usr/bin/env bash
# Same-machine A/B of the align kernel's dependent launch under the lora calls (device run, carry
# build-gpu, or GPU_BUILD=<folder>): per seed shape and op, the aligned call alone, then the align
# kernel + the aligned call (`molora bench lora --routing align`) with MOLORA_ALIGN_PDL=0 and 1,
# interleaved, two rounds. Prints "r<round> <variant> <op> <shape> T=<T> <us>".
cd "$(dirname "$0")/../.." || exit
B=${GPU_BUILD:-build-gpu}
export LD_LIBRARY_PATH=$PWD/$B/deplib
M=$B/src/cli/molora
for sh in ${SHAPES:-N6144_r32_V160x8 N2048_r16_V128x8}; do
  for op in expand shrink; do
    for r in 1 2; do
      for v in aligned align:0 align:1; do
        ro=${v%%:*} p=1
        [ "$ro" != "$v" ] && p=${v#*:}
        MOLORA_ALIGN_PDL=$p "$M" bench lora --shape "$sh" --op "$op" --routing "$ro" --T 1,8,64 2>&1 |
          awk -v l="r$r $v" '/ us, floor/ {printf "%s %s %s %s %.2f\n", l, $1, $2, $3, $7}
                             !/ us, floor/ {print l ": " $0}'
      done
    done
  done
done
