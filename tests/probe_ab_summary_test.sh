#!/usr/bin/env bash
# tools/probe/ab-summary.sh (the A/B means): per case and variant over the rounds, a case's
# extra flags kept apart, variants in the order they first appear, the change against the first;
# no A/B line at all is an error. Usage: probe_ab_summary_test.sh PATH/TO/ab-summary.sh
set -u
S=$1
fail=0
check() {  # check NAME PATTERN TEXT: TEXT must hold a line matching PATTERN (grep -E)
  if ! grep -Eq -- "$2" <<< "$3"; then
    echo "FAIL $1: no line matching '$2' in:"; echo "$3"; fail=1
  fi
}
in='r1 base shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 52.0 us, 80%, same-bytes copy 50 us, weight copies 16
r1 cand shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 50.0 us, 83%, same-bytes copy 50 us, weight copies 16
r1 base shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 31.0 us, 70%, same-bytes copy 30 us, weight copies 16 [--none 0.5]
r1 cand shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 33.0 us, 66%, same-bytes copy 30 us, weight copies 16 [--none 0.5]
r2 base shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 54.0 us, 78%, same-bytes copy 50 us, weight copies 16
r2 cand shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 52.0 us, 81%, same-bytes copy 50 us, weight copies 16
r2 base shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 33.0 us, 70%, same-bytes copy 30 us, weight copies 16 [--none 0.5]
r2 cand shrink N6144_r32_V160x8 T=64 aligned shrink tile=8: 33.0 us, 66%, same-bytes copy 30 us, weight copies 16 [--none 0.5]
some other line the A/B printed'
out=$("$S" <<< "$in")
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; fail=1; }
check header '^case \(mean us\) +base +cand +vs base$' "$out"
check all-adapter '^shrink N6144_r32_V160x8 T=64 aligned +53\.000 +51\.000 +-3\.77%$' "$out"
check half '^shrink N6144_r32_V160x8 T=64 aligned \[--none 0\.5\] +32\.000 +33\.000 +\+3\.12%$' "$out"
[ "$(wc -l <<< "$out")" -eq 3 ] || { echo "FAIL: expected 3 lines:"; echo "$out"; fail=1; }
# From a file too, and nothing to summarise is an error.
f=$(mktemp); printf '%s\n' "$in" > "$f"
[ "$("$S" "$f")" = "$out" ] || { echo "FAIL: file and stdin differ"; fail=1; }
rm -f "$f"
if "$S" <<< "no A/B here" > /dev/null 2>&1; then echo "FAIL: empty input exits 0"; fail=1; fi
[ $fail -eq 0 ] && echo "probe_ab_summary: ok"
exit $fail
