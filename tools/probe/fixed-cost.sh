#!/usr/bin/env bash
# Where the stream shrink's fixed cost goes at small T (device run, carry build-gpu):
# skeleton (probe 7) and full kernel at 12 / 4 / 1 warps, expand stream and shrink grid beside
# them, then (when ncu is on the machine) each kernel's own duration at T=1, to split the
# bench's per-call time into kernel time and launch gap.
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
SH=${SHAPE:-N6144_r32_V160x8}
TS=${1:-1,8,32}
b() { "$M" bench lora --shape $SH --routing aligned --T $TS "$@" 2>&1 | grep -E "us, floor" |
  sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//'; }
for w in 12 4 1; do
  for p in 7 0; do
    echo "-- shrink stream warps $w probe $p"
    MOLORA_LORA_STREAM_CONSUMERS=$w MOLORA_LORA_STREAM_STAGES=2 MOLORA_LORA_STREAM_PROBE=$p \
      b --op shrink --kernel stream
  done
done
echo "-- shrink grid"; b --op shrink --kernel grid
echo "-- expand stream"; b --op expand --kernel stream
echo "-- expand stream probe 7"; MOLORA_LORA_STREAM_PROBE=7 b --op expand --kernel stream
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  for cfg in "shrink stream 7" "shrink stream 0" "shrink grid 0" "expand stream 0" "expand stream 7"; do
    set -- $cfg
    echo "-- ncu $cfg T=1"
    MOLORA_LORA_STREAM_PROBE=$3 "$NCU" --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum \
      -k regex:molora_lora --launch-skip 40 --launch-count 3 \
      "$M" bench lora --shape $SH --routing aligned --T 1 --op $1 --kernel $2 2>&1 |
      grep -E "gpu__time|sm__cycles|inst_exec" | head -9
  done
else
  echo "-- no ncu on this machine"
fi
