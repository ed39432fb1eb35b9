#!/usr/bin/env bash
# Same-machine A/B of library builds (device run, carry ["build-ab"]): machines differ by up to
# ~6% on one build (bench/NOTES.md "lora v0.10"), so variants are only compared within one call.
# Here: build each variant's libmolora.so and copy it to build-ab/<name>/libmolora.so.0, the CLI
# to build-ab/molora and build-gpu/deplib/* to build-ab/deplib (tools/probe/ab.sh --stage NAME
# does the copies after a `tools/gpu-check prepare`). On the device: for each round, each case
# runs every variant under every setting in turn (interleaved), printing
# "r<round> <variant>[+<setting>] <bench line>".
# Usage: tools/probe/ab.sh [--stage NAME] | [ROUNDS] (default 2; cases in AB_CASES, one per line:
#   "<op> <shape> <T-list> [more bench flags]"; a case's flags end each of its lines as
#   " [<flags>]", so that tools/probe/ab-summary.sh keeps such cases apart)
# Env: ENVS (settings, one per line, e.g. MOLORA_LORA_EARLY_INPUTS=1; "-" = none; default "-"),
#   ROUTING (aligned (default) or plain: every case's routing),
#   LIBS (library folders to compare instead of build-ab's variants, e.g. build-gpu/src; labelled
#   by the folder), M (the CLI; default build-ab/molora) and GPU_BUILD (whose deplib/ the runs
#   also take: default build-gpu). A variant folder that holds its own
#   `molora` runs that CLI (builds of other commits, whose bench or CLI differ from this one's).
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --stage ]; then
  set -e
  mkdir -p "build-ab/$2" build-ab/deplib
  cp -L build-gpu/src/libmolora.so.0 "build-ab/$2/"
  cp build-gpu/src/cli/molora build-ab/
  cp build-gpu/deplib/* build-ab/deplib/ 2>/dev/null || true
  du -sh build-ab
  exit 0
fi
ROUNDS=${1:-2}
CASES=${AB_CASES:-"shrink N6144_r32_V160x8 1,8,32,64
expand N6144_r32_V160x8 1,8,32,64"}
LIBS=${LIBS:-$(cd build-ab && ls -d -- */ | tr -d / | grep -v '^deplib$' | sed 's#^#build-ab/#')}
M=${M:-build-ab/molora}
ENVS=${ENVS:-"-"}
for r in $(seq "$ROUNDS"); do
  while read -r op shape Ts rest; do
    [ -n "$op" ] || continue
    for lib in $LIBS; do
      v=${lib#build-ab/}
      while read -r setting; do
        [ -n "$setting" ] || continue
        label=$v
        [ "$setting" = - ] && setting= || label=$v+${setting// /,}
        # shellcheck disable=SC2086
        cli=$M
        [ -x "$lib/molora" ] && cli=$lib/molora
        env $setting LD_LIBRARY_PATH="$PWD/$lib:$PWD/build-ab/deplib:$PWD/${GPU_BUILD:-build-gpu}/deplib" "$cli" \
          bench lora --shape "$shape" --routing "${ROUTING:-aligned}" --op "$op" --T "$Ts" $rest 2>&1 |
          grep "us, floor" |
          sed -E 's/ floor [0-9.]+ us,//; s/ of copy [0-9.]+ GB\/s//; s/\.aligned-stream\.bf16//' |
          sed "s#^#r$r $label #; s#\$#${rest:+ [$rest]}#"
      done <<< "$ENVS"
    done
  done <<< "$CASES"
done
