#!/usr/bin/env bash
# Re-tune this GPU's lora config and compare it with the committed one (device run, carry
# build-gpu, or GPU_BUILD=<folder>): `molora bench lora --tune` into $OUT/tuned.json, then the quick table with the new
# config and with the committed one. Commit $OUT/tuned.json as configs/lora/<gpu>.json only if
# the new table is no worse.
cd "$(dirname "$0")/../.."
B=${GPU_BUILD:-build-gpu}
export LD_LIBRARY_PATH=$PWD/$B/deplib
M=$B/src/cli/molora
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
SECONDS=0
"$M" bench lora --tune --out "$OUT/tuned.json" > "$OUT/tune.log" 2>&1
echo "tune rc=$? (${SECONDS}s)"
for round in 1 2; do
  MOLORA_LORA_CONFIG=$OUT/tuned.json "$M" bench lora --quick > "$OUT/quick_new$round.txt" 2>&1
  echo "new rc=$?"
  "$M" bench lora --quick > "$OUT/quick_old$round.txt" 2>&1
  echo "old rc=$?"
done
grep "^SUMMARY" "$OUT/quick_old1.txt" | grep "no-adapter" | head -4
