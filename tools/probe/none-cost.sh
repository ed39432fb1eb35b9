#!/usr/bin/env bash
# What a call whose slots are all -1 costs, by kernel and launch shape (device run, carry
# build-gpu): the stream shrink (1.74 us on the H100 in v0.14) against the stream expand (1.3)
# and grid shrink (1.4), under consumer-warp counts and stages (the CTA's threads and shared
# memory), dependent launch on and off; then, where ncu is on the machine, each kernel's own
# duration (so the per-call time splits into kernel and launch gap).
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
SH=${SHAPE:-N2048_r16_V128x8}
b() { "$M" bench lora --shape "$SH" --routing aligned --none 1 --T 1,64 "$@" 2>&1 |
  grep -E "us, floor" | sed -E 's/, floor.*//'; }
for pdl in 1 0; do
  for op in shrink expand; do
    echo "-- $op grid pdl=$pdl"
    MOLORA_LORA_PDL=$pdl b --op $op --kernel grid
    for cfg in "-" "1 2" "4 2" "8 2"; do  # (consumer warps, stages; stages >= 2)
      set -- $cfg
      if [ "$1" = - ]; then env=; lab=default; else
        env="MOLORA_LORA_STREAM_CONSUMERS=$1 MOLORA_LORA_STREAM_STAGES=$2"; lab="c=$1 s=$2"; fi
      echo "-- $op stream $lab pdl=$pdl"  # (an invalid setting prints its error)
      # shellcheck disable=SC2086
      env $env MOLORA_LORA_PDL=$pdl "$M" bench lora --shape "$SH" --routing aligned --none 1 \
        --T 1,64 --op $op --kernel stream 2>&1 | grep -E "us, floor|rror|must be" | sed -E 's/, floor.*//'
    done
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 0; }
for cfg in "shrink stream" "shrink grid" "expand stream"; do
  set -- $cfg
  echo "-- ncu $cfg all -1 T=64"
  "$NCU" --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum,launch__shared_mem_per_block_dynamic,launch__block_size \
    -k regex:molora_lora --launch-skip 40 --launch-count 2 \
    "$M" bench lora --shape "$SH" --routing aligned --none 1 --T 64 --op $1 --kernel $2 2>&1 |
    grep -E "^\s+(gpu__|sm__|smsp__|launch__)" | sort | uniq
done
