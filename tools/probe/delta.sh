#!/usr/bin/env bash
# One device call for moe_delta (carry build-gpu): its GPU tests (and under compute-sanitizer
# memcheck), then the `molora bench lora` pair forms in OPS (default "chain delta": shrink ->
# expand as two calls against one moe_delta; "delta delta-after": deltas against deltas that
# each follow another, their shrink reading early too) per seed shape, interleaved, ROUNDS
# rounds (default 3), aligned routing.
# Usage: [OPS="chain delta"] [ROUNDS=3] [TS=1,8,32,64] tools/probe/delta.sh
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
nvidia-smi --query-gpu=name --format=csv,noheader
build-gpu/tests/lora_gpu_test --gtest_filter='*Delta*:*DependentLaunch*' 2>&1 |
  grep -E "^\[lora\] control|FAILED|PASSED|Failure|error|OK \]" | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$CS" --tool memcheck --error-exitcode 9 build-gpu/tests/lora_gpu_test \
  --gtest_filter='*Delta*' > /tmp/delta-memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' /tmp/delta-memcheck.log | tail -1)"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
    for op in ${OPS:-chain delta}; do
      "$M" bench lora --op $op --routing aligned --shape $sh --T "${TS:-1,8,32,64}" 2>&1 |
        grep -E "us, floor|rror" |
        sed -E "s/^/r$round /; s/ floor [0-9.]+ us,//; s/of copy.*//; s/aligned shrink[^:]*//"
    done
  done
done
