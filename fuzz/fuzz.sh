# shellcheck shell=bash
# Shared by the libFuzzer scripts in tests/extra (sourced; not a test itself). Each script calls
# fuzz_setup, then the others.

# fuzz_setup PART SECONDS BIN_NAME: sets CXX, OUT, SECONDS_TO_RUN and bin from the part's own
# <PART>_FUZZ_CXX (default clang++-14, else clang++), <PART>_FUZZ_DIR (default build-fuzz-<part>)
# and <PART>_FUZZ_SECONDS (default SECONDS), bin=$OUT/BIN_NAME; makes $OUT/corpus.
fuzz_setup() {
  local up
  up=$(printf '%s' "$1" | tr '[:lower:]' '[:upper:]')
  local v_cxx=${up}_FUZZ_CXX v_dir=${up}_FUZZ_DIR v_sec=${up}_FUZZ_SECONDS
  CXX=${!v_cxx:-$(command -v clang++-14 || command -v clang++)}
  OUT=${!v_dir:-build-fuzz-$1}
  SECONDS_TO_RUN=${!v_sec:-$2}
  mkdir -p "$OUT/corpus"
  bin=$OUT/$3
}

# fuzz_stale BIN FILE...: true when BIN is missing or older than one of the files.
fuzz_stale() {
  local bin=$1
  shift
  [ ! -x "$bin" ] || [ -n "$(find "$@" -newer "$bin")" ]
}

# fuzz_compile BIN ARG...: one clang run with libFuzzer, ASan and UBSan (a UB report ends the
# run) and the project's include folders; ARG are the sources, objects, flags and libraries.
fuzz_compile() {
  local bin=$1
  shift
  "$CXX" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -Isrc "$@" -o "$bin"
}

# fuzz_run NAME BIN MAX_LEN: runs BIN on $OUT/corpus for $SECONDS_TO_RUN seconds, crashes saved
# under $OUT; a crash fails the script (set -o pipefail).
fuzz_run() {
  echo "$1: running $SECONDS_TO_RUN s"
  "$2" -max_total_time="$SECONDS_TO_RUN" -max_len="$3" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$OUT/" "$OUT/corpus" 2>&1 | tail -n 15
  echo "$1: no crash"
}
