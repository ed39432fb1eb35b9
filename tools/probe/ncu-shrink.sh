#!/usr/bin/env bash
# ncu of one stream-shrink launch (device run, carry build-gpu): details and per-instruction
# SASS (stall samples) into $OUT. Usage: PROBE=7 WARPS=12 T=1 tools/probe/ncu-shrink.sh
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
OUTD=${OUT:-.out}; mkdir -p "$OUTD"
tag=${TAG:-p${PROBE:-7}w${WARPS:-12}t${T:-1}${OP:-shrink}}
MOLORA_LORA_STREAM_CONSUMERS=${WARPS:-12} MOLORA_LORA_STREAM_STAGES=${STAGES:-2} MOLORA_LORA_STREAM_PROBE=${PROBE:-7} \
  "$NCU" --set full --import-source no -k regex:molora_lora --launch-skip 40 --launch-count 1 \
  -o "$OUTD/$tag" -f "$M" bench lora --shape ${SHAPE:-N6144_r32_V160x8} --routing aligned --T ${T:-1} \
  --op ${OP:-shrink} --kernel stream >/dev/null 2>&1
"$NCU" -i "$OUTD/$tag.ncu-rep" --page details --metrics sm__cycles_active.max,sm__cycles_active.min,sm__cycles_active.avg 2>&1 | \
  grep -vE "^\s*$" | grep -E "Duration|Elapsed Cycles|SM Active|Registers|Shared Memory|Warp Cycles|Issued|No Eligible|Achieved|sm__cycles|Block Limit|Waves|Threads|Grid" | head -40
"$NCU" -i "$OUTD/$tag.ncu-rep" --page source --csv --print-source sass > "$OUTD/$tag-sass.csv" 2>&1
wc -l "$OUTD/$tag-sass.csv"
