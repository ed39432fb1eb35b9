#!/usr/bin/env bash
# Same-machine A/B of settings on one build (device run, carry ["build-ab"]): each round runs
# every case under each setting in turn (interleaved), printing "r<round> <setting> <bench line>".
# The build: LIB (a folder holding libmolora.so.0, e.g. build-gpu/src) and M (the CLI), default
# the first variant staged by tools/probe/ab.sh --stage NAME and build-ab/molora.
# Env: ENVS (settings, one per line; "-" = none), AB_CASES (ab.sh's), ROUNDS (default 3).
# Example: ENVS=$'-\nMOLORA_LORA_STREAM_PROBE=512' tools/probe/env-ab.sh
cd "$(dirname "$0")/../.." || exit 1
if [ -z "${LIB:-}" ]; then
  V=$(cd build-ab && ls -d -- */ | tr -d / | grep -v '^deplib$' | head -n 1)
  LIB=build-ab/$V
fi
V=${V:-$(basename "$(dirname "$LIB")")}
M=${M:-build-ab/molora}
DEP=$PWD/build-ab/deplib:$PWD/build-gpu/deplib
CASES=${AB_CASES:-"shrink N6144_r32_V160x8 1,8,32,64"}
ENVS=${ENVS:-"-"}
for r in $(seq "${ROUNDS:-3}"); do
  while read -r op shape Ts rest; do
    [ -n "$op" ] || continue
    while read -r setting; do
      [ -n "$setting" ] || continue
      label=$V+${setting#-}
      [ "$setting" = - ] && setting=
      # shellcheck disable=SC2086
      env $setting LD_LIBRARY_PATH="$PWD/$LIB:$DEP" "$M" bench \
        lora --shape "$shape" --routing aligned --op "$op" --T "$Ts" $rest 2>&1 |
        grep "us, floor" | sed -E 's/ floor [0-9.]+ us,//; s/ of copy [0-9.]+ GB\/s//' |
        sed -E 's/\.aligned-stream\.bf16//' | sed "s/^/r$r ${label// /,} /"
    done <<< "$ENVS"
  done <<< "$CASES"
done
