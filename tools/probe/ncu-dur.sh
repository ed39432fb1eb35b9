#!/usr/bin/env bash
# Kernel duration against SM activity for one stream launch at T (device run, carry build-gpu):
# splits a call into SM time (max / avg / min over SMs) and the rest.
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for cfg in "${@:-shrink stream 7 1}"; do
  set -- $cfg
  echo "-- $cfg"
  MOLORA_LORA_STREAM_PROBE=$3 "$NCU" --metrics gpu__time_duration.sum,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_active.min,smsp__cycles_active.max,gpc__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__registers_per_thread,sm__ctas_launched.max,sm__ctas_launched.sum \
    -k regex:molora_lora --launch-skip 40 --launch-count 2 \
    "$M" bench lora --shape ${SHAPE:-N6144_r32_V160x8} --routing aligned --T $4 --op $1 --kernel $2 2>&1 |
    grep -E "^\s+(gpu__|sm__|smsp__|gpc__|launch__)" | sort | uniq | head -24
done
