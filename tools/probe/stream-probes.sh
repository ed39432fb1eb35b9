#!/usr/bin/env bash
# Where the stream kernels' time goes, per shape (device run, carry build-gpu): the planner's
# kernel and the stream kernel with each probe bit (1 no math, 2 no pair ids / activations,
# 4 no weight copies, 7 all three), then ncu durations at T=1 for expand r=16 vs r=32.
# Usage: tools/probe/stream-probes.sh [T-list]
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
TS=${1:-1,8,32,256}
b() { "$M" bench lora --routing aligned --T $TS "$@" 2>&1 | grep -E "us, floor" |
  sed -E 's/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned //'; }
for cfg in "expand N2048_r16_V128x8" "expand N4096_r32_V128x8" "shrink N4096_r32_V128x8" \
           "shrink N2048_r16_V128x8"; do
  set -- $cfg
  for p in 0 1 2 4 7; do
    echo "-- $1 $2 stream probe $p"
    MOLORA_LORA_STREAM_PROBE=$p b --op $1 --shape $2 --kernel stream
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  for cfg in "N2048_r16_V128x8 0" "N2048_r16_V128x8 7" "N4096_r32_V128x8 0"; do
    set -- $cfg
    echo "-- ncu expand stream $1 probe $2 T=1"
    MOLORA_LORA_STREAM_PROBE=$2 "$NCU" --metrics gpu__time_duration.sum,sm__cycles_active.max,sm__cycles_active.avg,smsp__inst_executed.sum \
      -k regex:molora_lora --launch-skip 40 --launch-count 2 \
      "$M" bench lora --shape $1 --routing aligned --T 1 --op expand --kernel stream 2>&1 |
      grep -E "gpu__time|sm__cycles|inst_exec" | head -8
  done
fi
