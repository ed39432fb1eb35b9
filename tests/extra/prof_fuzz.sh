#!/usr/bin/env bash
# libFuzzer on the prof trace reader (scanner, piece parser, gzip) for PROF_FUZZ_SECONDS
# (default 60) seconds. A small separate build: clang (Debian clang 14 + libclang-rt-14-dev),
# the reader sources, Status/settings, simdjson and zlib from Debian.
set -euo pipefail
cd "$(dirname "$0")/../.."
. fuzz/fuzz.sh
fuzz_setup prof 60 prof_reader_fuzz
srcs=(fuzz/prof_reader_fuzz.cc src/prof/input.cc src/prof/names.cc src/prof/parse_piece.cc
      src/prof/reader.cc src/core/status.cc src/core/settings.cc)
extra=()
libs=(-lsimdjson -lz -lpthread)
if [ -f /usr/include/isa-l/igzip_lib.h ]; then  # the reader's gzip path, as the library builds it
  extra+=(-DMOLORA_PROF_ISAL=1)
  libs+=(-lisal)
fi
case "$(uname -m)" in
  x86_64) extra+=(-DMOLORA_PROF_AVX2=1) ;;
esac
if fuzz_stale "$bin" "${srcs[@]}" src/prof/*.h src/prof/parse_piece_avx2.cc include/molora/prof.h; then
  echo "prof_fuzz: building $bin with $CXX"
  objs=()
  if [[ " ${extra[*]} " == *" -DMOLORA_PROF_AVX2=1 "* ]]; then
    "$CXX" -std=c++17 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
      -mavx2 -mbmi -mbmi2 -mpclmul -mpopcnt -mlzcnt -Iinclude -Isrc -Isrc/prof \
      -c src/prof/parse_piece_avx2.cc -o "$OUT/parse_piece_avx2.o"
    objs=("$OUT/parse_piece_avx2.o")
  fi
  fuzz_compile "$bin" "${extra[@]}" -Isrc/prof "${srcs[@]}" "${objs[@]}" "${libs[@]}"
fi
# Seeds: small Kineto-like traces (pretty, compact, top-level array, truncated, escaped names)
# and the committed fixtures.
python3 - "$OUT/corpus" <<'PY'
import gzip, json, os, sys
d = sys.argv[1]
ev = [
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
     "ts": 10.5, "dur": 2.25, "args": {"correlation": 7, "External id": 7}},
    {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel \"q\\\\", "pid": 0, "tid": 7,
     "ts": 12.125, "dur": 3.5, "args": {"correlation": 7, "device": 0, "stream": 7,
     "grid": [1, 2, 3], "block": [128, 1, 1]}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
     "ts": 1, "dur": 100},
    {"ph": "s", "id": 7, "pid": 1, "tid": 1, "ts": 10.5, "cat": "ac2g", "name": "ac2g"},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 20,
     "dur": 1, "args": {"device": 0, "stream": "stream 7"}},
]
docs = {
    "pretty": json.dumps({"schemaVersion": 1, "traceEvents": ev,
                          "distributedInfo": {"rank": 3}}, indent=2),
    "compact": json.dumps({"traceEvents": ev}, separators=(",", ":")),
    "array": json.dumps(ev),
}
docs["truncated"] = docs["pretty"][: len(docs["pretty"]) * 2 // 3]
for k, v in docs.items():
    b = v.encode()
    open(os.path.join(d, k), "wb").write(b"\x05" + b)
    open(os.path.join(d, k + "_big"), "wb").write(b"\x40" + b)
open(os.path.join(d, "gzip"), "wb").write(b"\x03" + gzip.compress(docs["pretty"].encode()))
open(os.path.join(d, "gzip_zlib"), "wb").write(b"\x83" + gzip.compress(docs["pretty"].encode()))
open(os.path.join(d, "gzip_cut"), "wb").write(b"\x83" + gzip.compress(docs["pretty"].encode())[:300])
PY
for f in tests/data/prof_*.json; do
  [ -f "$f" ] && { printf '\x09'; head -c 65536 "$f"; } > "$OUT/corpus/fixture_$(basename "$f")"
done
# Inputs the fuzzer once failed on (option byte included): every run starts from them.
for f in tests/data/prof_fuzz_*.bin; do
  [ -f "$f" ] && cp "$f" "$OUT/corpus/regression_$(basename "$f")"
done
fuzz_run prof_fuzz "$bin" 16384
