#!/usr/bin/env bash
# Re-tune this GPU's lora config and compare it with the committed one (device run, carry
# build-gpu, or GPU_BUILD=<folder>): `molora bench lora --tune` into $OUT/tuned.json, then the
# quick table with the new config and with the committed one, and the two tables' sums. Commit
# $OUT/tuned.json as configs/lora/<gpu>.json only if the new table is no worse.
cd "$(dirname "$0")/../.." || exit
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
# The quick table's rows (op shape T none routing us ...), best of the two rounds per row, summed
# per config, and the rows that moved by more than 5%.
awk '$1 == "expand" || $1 == "shrink" {
       k = $1 " " $2 " " $3 " " $4 " " $5; u = $6 + 0
       f = FILENAME ~ /new/ ? "new" : "old"
       if (!((f, k) in best) || u < best[f, k]) best[f, k] = u
       keys[k] = 1
     }
     END {
       for (k in keys) { so += best["old", k]; sn += best["new", k]; n++
         d = best["new", k] / best["old", k] - 1
         if (d > 0.05 || d < -0.05) printf "  %-40s %8.2f -> %8.2f us (%+.1f%%)\n", k, best["old", k], best["new", k], 100 * d }
       printf "quick table, %d rows, best of 2: committed config %.1f us, new config %.1f us\n", n, so, sn
     }' "$OUT"/quick_old1.txt "$OUT"/quick_old2.txt "$OUT"/quick_new1.txt "$OUT"/quick_new2.txt
grep -c '^TUNE.* (kept)' "$OUT/tune.log" | sed 's/^/tuner grid entries not the heuristic: /'
grep -c '^TUNE.*(faster: stream)$' "$OUT/tune.log" | sed 's/^/buckets where the stream kernel was faster: /'
grep -c '^TUNE.*(faster: grid)$' "$OUT/tune.log" | sed 's/^/buckets where the grid kernel was faster: /'
