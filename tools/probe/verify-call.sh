#!/usr/bin/env bash
# One device call for a session short of device time (device run, carry ["build-gpu", "build-ab"],
# build-ab/trace holding a -DMOLORA_LORA_TRACE=ON libmolora.so.0): the lora GPU tests under the
# settings in TEST_ENVS, the same-machine A/B of settings on build-gpu (ab.sh: ENVS, AB_CASES), the
# shrink timeline under each probe setting (TL_PROBES), then `tools/gpu-check run` in the time left
# (CALL_S, default 590 s, minus what the rest took). Everything goes to $OUT (7 files at most).
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-.out}
mkdir -p "$OUT"
t0=$SECONDS
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/summary.txt"
while read -r setting; do
  [ -n "$setting" ] || continue
  # shellcheck disable=SC2086
  env $setting build-gpu/tests/lora_gpu_test --gtest_brief=1 >>"$OUT/gpu_tests.txt" 2>&1
  echo "lora_gpu_test with $setting rc=$?" | tee -a "$OUT/summary.txt"
done <<< "${TEST_ENVS:-MOLORA_LORA_EARLY_INPUTS=1}"
LIBS=build-gpu/src M=build-gpu/src/cli/molora tools/probe/ab.sh "${ROUNDS:-2}" >"$OUT/envab.txt" 2>&1
if [ -f build-ab/trace/libmolora.so.0 ]; then
  for pr in ${TL_PROBES:-0}; do
    echo "== MOLORA_LORA_STREAM_PROBE=$pr"
    MOLORA_LORA_STREAM_PROBE=$pr M=build-gpu/src/cli/molora LIB=build-ab/trace \
      SHAPES=${TL_SHAPES:-N6144_r32_V160x8} TS=${TL_TS:-8,32} NONES=0 tools/probe/timeline.sh
  done >"$OUT/timeline.txt" 2>&1
fi
left=$(( ${CALL_S:-590} - (SECONDS - t0) ))
echo "gpu-check run with ${left} s left" | tee -a "$OUT/summary.txt"
OUT=$OUT timeout "$left" tools/gpu-check run >"$OUT/full.txt" 2>&1
echo "gpu-check rc=$?" | tee -a "$OUT/summary.txt"
[ -f "$OUT/gpu-check-logs.tgz" ] || tar czf "$OUT/gpu-check-logs.tgz" -C /tmp/gpu-check-logs . 2>/dev/null
sed -n '/== gpu-check summary/,$p' "$OUT/full.txt" | head -n 60
sort -k3,3 -k4,4 -k5,5 -k2,2 -k1,1 "$OUT/envab.txt" | awk '{print $1, $2, $3, $4, $5, $8, $9}'
