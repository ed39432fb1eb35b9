#!/usr/bin/env bash
# Where a stream call's time goes, instruction by instruction (device run, carry build-gpu2):
# Nsight Compute's warp-state sampling (SourceCounters) on one stream launch (default plain
# routing, expand N2048_r16_V128x8 T=64), the per-SASS-instruction table (stall reasons per
# instruction) written gzipped to $OUT/<ROUTING>_<OP>_sass.csv.gz. Env: OP, SHAPE, T, ROUTING, B (build
# folder). Read it with tools/probe/ncu-stalls.py.
cd "$(dirname "$0")/../.." || exit
B=${B:-build-gpu2}
export LD_LIBRARY_PATH=$PWD/$B/src:$PWD/$B/deplib
M=$B/src/cli/molora
OUT=${OUT:-/tmp}
NAME=${ROUTING:-plain}_${OP:-expand}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
"$NCU" --section SourceCounters --warp-sampling-interval ${SI:-0} -k regex:molora_lora_${OP:-expand} \
  --launch-skip 30 --launch-count 1 -f -o "$OUT/${NAME}" \
  "$M" bench lora --shape "${SHAPE:-N2048_r16_V128x8}" --op "${OP:-expand}" --routing "${ROUTING:-plain}" \
  --kernel stream --T "${T:-64}" > "$OUT/ncu_run.log" 2>&1
echo "ncu rc=$?"; tail -n 3 "$OUT/ncu_run.log"
"$NCU" -i "$OUT/${NAME}.ncu-rep" --page source --csv --print-source sass > "$OUT/${NAME}_sass.csv" 2>&1
echo "source page rc=$? lines $(wc -l < "$OUT/${NAME}_sass.csv")"
gzip -f "$OUT/${NAME}_sass.csv"
rm -f "$OUT/${NAME}.ncu-rep"
