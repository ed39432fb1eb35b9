#!/usr/bin/env bash
# One device call that uses whichever card came (device run, carry build-gpu2): on an H200, the
# lora re-tune (tools/probe/retune.sh, outputs in $OUT) and then the full `molora bench lora`
# table ($OUT/bench_lora_h200.txt, the targets' card); on any other card, `tools/gpu-check run
# lora`. Prepare first: GPU_BUILD=build-gpu2 tools/gpu-check prepare.
cd "$(dirname "$0")/../.." || exit
export GPU_BUILD=${GPU_BUILD:-build-gpu2}
OUT=${OUT:-/tmp}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT timeout 330 tools/probe/retune.sh
  LD_LIBRARY_PATH=$PWD/$GPU_BUILD/deplib timeout 200 "$GPU_BUILD/src/cli/molora" bench lora \
    > "$OUT/bench_lora_h200.txt" 2>&1
  echo "bench rc=$?"
  grep -E "targets missed|Triton|^copy|^empty" "$OUT/bench_lora_h200.txt"
else
  tools/gpu-check run lora 2>&1 | tail -n 8
fi
