# Shared by the libFuzzer scripts in tests/extra (sourced; not a test itself). Each script sets
# CXX, OUT and SECONDS_TO_RUN from its own <PART>_FUZZ_* variables, then calls these.

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
