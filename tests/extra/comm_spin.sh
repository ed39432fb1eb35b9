#!/usr/bin/env bash
# Model-checks the all-reduce protocol (models/allreduce.pml) with spin: every interleaving of
# 2 and 3 ranks over 3-4 epochs, with and without timeouts and a stopping rank. The shipped
# protocol must pass; the variant without the end flag (single buffer) must FAIL, which shows
# the model can see an overwrite before read.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v spin >/dev/null || { echo "comm_spin: spin is not installed (apt-get install spin)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp models/allreduce.pml "$work/"
cd "$work"

# check NAME EXPECT(pass|fail) -D...: one full state-space search.
check() {
  local name=$1 expect=$2; shift 2
  rm -f pan pan.c allreduce.pml.trail
  spin -a "$@" allreduce.pml >/dev/null || { echo "$name: spin -a failed"; return 1; }
  gcc -O2 -DMEMLIM=2048 -DVECTORSZ=4096 -o pan pan.c || { echo "$name: gcc pan.c failed"; return 1; }
  local out errors states
  out=$(./pan -m1000000 2>&1)
  errors=$(echo "$out" | sed -n 's/.*errors: \([0-9]*\).*/\1/p' | head -1)
  states=$(echo "$out" | sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' | head -1)
  local got=pass
  [ "${errors:-1}" = 0 ] || got=fail
  if echo "$out" | grep -q "max search depth too small"; then got=fail; fi
  printf '%-44s %-4s (expected %s) states=%s errors=%s\n' "$name" "$got" "$expect" "$states" "$errors"
  if [ "$got" != "$expect" ]; then
    echo "$out" | tail -30
    [ -f allreduce.pml.trail ] && spin -t -p allreduce.pml | tail -40
    return 1
  fi
  rm -f allreduce.pml.trail
}

rc=0
check "2 ranks 4 epochs (shipped)"              pass -DNR=2 -DNE=4 || rc=1
check "3 ranks 3 epochs (shipped)"              pass -DNR=3 -DNE=3 || rc=1
check "2 ranks 4 epochs, timeouts"              pass -DNR=2 -DNE=4 -DTIMEOUT=1 || rc=1
check "3 ranks 3 epochs, timeouts + stop"       pass -DNR=3 -DNE=3 -DTIMEOUT=1 -DSTOP=1 || rc=1
check "2 ranks 4 epochs, 1 buffer + end flag"   pass -DNR=2 -DNE=4 -DNBUF=1 || rc=1
check "3 ranks 3 epochs, no end flag, 1 buffer" fail -DNR=3 -DNE=3 -DNBUF=1 -DEND=0 || rc=1
check "2 ranks 3 epochs, no end flag, 1 buffer" fail -DNR=2 -DNE=3 -DNBUF=1 -DEND=0 || rc=1
# For the record: double buffering without the end flag (every rank waits for every peer's
# arrival, so arrival of e+1 implies the read of e finished): reported, not required.
check "3 ranks 4 epochs, no end flag, 2 buffers" pass -DNR=3 -DNE=4 -DEND=0 || true
exit $rc
