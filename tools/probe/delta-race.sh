#!/usr/bin/env bash
# LoraGpu.DeltaMatchesReferenceAndTheTwoCalls under load, old test binary against new (device
# run, carry build-gpu2): PAR processes at once, each REP repeats; prints the failed repeats of
# each. Old = build-gpu2/tests/lora_gpu_test.old (Dev::set without the device sync), new = the
# current binary.
cd "$(dirname "$0")/../.." || exit
export LD_LIBRARY_PATH=$PWD/build-gpu2/deplib
OUT=${OUT:-/tmp}
PAR=${PAR:-6} REP=${REP:-8}
for v in old new; do
  bin=build-gpu2/tests/lora_gpu_test; [ $v = old ] && bin=$bin.old
  SECONDS=0
  for i in $(seq "$PAR"); do
    timeout 150 "$bin" --gtest_filter='*DeltaMatches*:*GraphCapture*' --gtest_repeat="$REP" \
      > "$OUT/$v.$i.log" 2>&1 &
  done
  wait
  runs=$(cat "$OUT"/$v.*.log | grep -c '^\[       OK \]\|^\[  FAILED  \] LoraGpu.*ms)')
  fails=$(cat "$OUT"/$v.*.log | grep -c '^\[  FAILED  \] LoraGpu.*ms)')
  echo "$v: $fails failed of $runs test runs ($PAR processes x $REP repeats, ${SECONDS}s)"
  grep -h '^replay\|differs from\|with the plan' "$OUT"/$v.*.log | sort | uniq -c | head -5
done
