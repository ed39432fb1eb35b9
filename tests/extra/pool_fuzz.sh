#!/usr/bin/env bash
# libFuzzer on the safetensors header parser for POOL_FUZZ_SECONDS (default 60) seconds.
# A small separate build: clang (Debian clang 14 + libclang-rt-14-dev), the parser and Status only.
set -euo pipefail
cd "$(dirname "$0")/../.."
. fuzz/fuzz.sh
fuzz_setup pool 60 pool_header_fuzz
srcs=(fuzz/pool_header_fuzz.cc src/pool/safetensors_header.cc src/core/status.cc)
if fuzz_stale "$bin" "${srcs[@]}" include/molora/safetensors.h; then
  echo "pool_fuzz: building $bin with $CXX"
  fuzz_compile "$bin" "${srcs[@]}"
fi
# Seeds: a valid file, metadata, an empty header, a few near-misses.
seed() {  # seed NAME JSON DATA_BYTES
  python3 - "$OUT/corpus/$1" "$2" "$3" <<'PY'
import sys
path, js, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
open(path, "wb").write(len(js).to_bytes(8, "little") + js + b"\x01" * n)
PY
}
seed valid '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}' 12
seed meta '{"__metadata__":{"format":"pt"},"t":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}' 0
seed empty '{}' 0
seed overlap '{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[4],"data_offsets":[4,12]}}' 12
seed nested '{"a":{"dtype":"F64","shape":[1,1,1,1],"data_offsets":[0,8]}}' 8
fuzz_run pool_fuzz "$bin" 4096
