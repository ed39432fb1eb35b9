#!/usr/bin/env bash
# libFuzzer on the lora part's host side (validate_problem, plan, plan_delta and the CPU
# references on adversarial Problems, options, ranks and routing ids; fuzz/lora_host_fuzz.cc says
# what it checks) for LORA_FUZZ_SECONDS (default 60) seconds. A small separate build without
# CUDA: clang (Debian clang 14 + libclang-rt-14-dev), the lora host sources, Status/settings and
# nlohmann-json from Debian.
set -euo pipefail
cd "$(dirname "$0")/../.."
. fuzz/fuzz.sh
fuzz_setup lora 60 lora_host_fuzz
srcs=(fuzz/lora_host_fuzz.cc src/lora/lora_cpu.cc src/lora/lora_plan.cc src/core/status.cc
      src/core/settings.cc)
if fuzz_stale "$bin" "${srcs[@]}" fuzz/fuzz_bytes.h src/lora/*.h include/molora/*.h; then
  echo "lora_fuzz: building $bin with $CXX"
  fuzz_compile "$bin" -DMOLORA_HAVE_CUDA=0 "${srcs[@]}" -lpthread
fi
# Seeds: a small valid shrink (plain), a small valid aligned expand, a large planner-only case.
printf '\x00\x02\x00\xff\x03\xff\x02\xff\x01\xff\x01\x00\xff\x02\xff\x04\xff\x10\x00' > "$OUT/corpus/shrink"
printf '\x01\x01\x01\xff\x02\xff\x01\xff\x02\xff\x02\x01\xff\x03\xff\x20\x00\xff\x01' > "$OUT/corpus/expand"
printf '\x00\x02\x01\x02\x01\x01\x01\x03\x01\x03\x02\x00\x00' > "$OUT/corpus/large"
# Config-file inputs ('C' + the file): the committed configs' first entries, and near-misses.
python3 - "$OUT/corpus" <<'PY'
import json, sys
out = sys.argv[1]
docs = {}
for name in ("nvidia_h200", "nvidia_h100_80gb_hbm3"):
    with open(f"configs/lora/{name}.json") as f:
        d = json.load(f)
    docs[name] = {"entries": d["entries"][:6]}
e = {"op": "shrink", "dtype": "bf16", "routing": "plain", "dim": 6144, "r_max": 32,
     "p_min": 57, "p_max": 64, "tile": 4, "unroll": 4}
docs["one"] = {"entries": [e]}
docs["bad_tile"] = {"entries": [dict(e, tile=3)]}
docs["float_tile"] = {"entries": [dict(e, tile=1e30)]}
docs["string_dim"] = {"entries": [dict(e, dim="6144")]}
docs["not_list"] = {"entries": 5}
# The v0.30 kernel choice: a grid and a stream entry of one bucket, and near-misses.
g, st = dict(e, kernel="grid", us=9.0), dict(e, kernel="stream", tile=8, unroll=0, us=7.0)
docs["both"] = {"entries": [g, st]}
docs["both_bad_stream_tile"] = {"entries": [g, dict(st, tile=4)]}
docs["us_string"] = {"entries": [g, dict(st, us="7")]}
docs["other_bucket"] = {"entries": [g, dict(st, p_min=1)]}
for k, v in docs.items():
    with open(f"{out}/config_{k}", "wb") as f:
        f.write(b"C" + json.dumps(v).encode())
PY
fuzz_run lora_fuzz "$bin" 2048
