#!/usr/bin/env bash
# One device call for a lora change when build-gpu and the A/B builds do not fit the 64 MiB carry
# together (device run, carry ["build-ab"]): the candidate's lora GPU tests (and memcheck), the
# same-machine A/B of every staged variant (ab.sh), the timeline of a build with the probe, and the
# candidate's full `molora bench lora` table. Everything goes to $OUT; a short summary is printed
# last.
# Here, before the call: tools/gpu-check prepare for each variant, tools/probe/ab.sh --stage NAME
# (the candidate as $CAND, default "pfx"; a build configured with -DMOLORA_LORA_TRACE=ON as
# "trace"), then cp build-gpu/tests/lora_gpu_test build-ab/ (the candidate's, statically linked).
# Env: CAND, AB_CASES (ab.sh's), ROUNDS (default 2), AB_ENV, TL_SHAPES, MEMCHECK_S and TABLE_S
# (time limits, default 150 s each), TABLE=0 to skip the table.
cd "$(dirname "$0")/../.."
OUT=${OUT:-.out}
mkdir -p "$OUT"
CAND=${CAND:-pfx}
export LD_LIBRARY_PATH=$PWD/build-ab/deplib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
build-ab/lora_gpu_test --gtest_brief=1 >"$OUT/gpu_test.txt" 2>&1
echo "lora_gpu_test rc=$?" | tee -a "$OUT/summary.txt"
# AB_ENV (e.g. "MOLORA_LORA_EARLY_INPUTS=1"): every variant also with those settings (ab.sh's
# ENVS: lines labelled "<variant>+<settings>"), and the GPU tests once more under them.
ENVS=$'-'${AB_ENV:+$'\n'$AB_ENV} tools/probe/ab.sh "${ROUNDS:-2}" >"$OUT/ab.txt" 2>&1
if [ -n "${AB_ENV:-}" ]; then
  # shellcheck disable=SC2086
  env $AB_ENV build-ab/lora_gpu_test --gtest_brief=1 >"$OUT/gpu_test_env.txt" 2>&1
  echo "lora_gpu_test with $AB_ENV rc=$?" | tee -a "$OUT/summary.txt"
fi
if [ -d build-ab/trace ]; then
  M=build-ab/molora LIB=build-ab/trace SHAPES=${TL_SHAPES:-"N6144_r32_V160x8 N2048_r16_V128x8"} \
    TS=1,8,32,64 NONES="0 0.5" tools/probe/timeline.sh >"$OUT/timeline.txt" 2>&1
fi
timeout "${MEMCHECK_S:-150}" compute-sanitizer --tool memcheck --error-exitcode 1 \
  build-ab/lora_gpu_test --gtest_brief=1 >"$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? ($(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/memcheck.txt") clean summaries)" |
  tee -a "$OUT/summary.txt"
if [ "${TABLE:-1}" != 0 ]; then
  LD_LIBRARY_PATH=$PWD/build-ab/$CAND:$LD_LIBRARY_PATH timeout "${TABLE_S:-150}" \
    build-ab/molora bench lora >"$OUT/table.txt" 2>&1
  echo "table rc=$?" | tee -a "$OUT/summary.txt"
fi
tail -n 3 "$OUT/gpu_test.txt"
grep -h SUMMARY "$OUT/table.txt" 2>/dev/null | tail -n 20
# The A/B: one line per case and variant, rounds side by side.
sort -k3,3 -k4,4 -k5,5 -k2,2 -k1,1 "$OUT/ab.txt" | awk '{print $1, $2, $3, $4, $5, $8, $9}'
