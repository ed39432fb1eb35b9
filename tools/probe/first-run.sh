#!/usr/bin/env bash
# One lean device call for code that has not yet run on a GPU (device run, carry [build-gpu2]):
# the largest lora call's GPU test, the Python extension, comm-multi's two one-GPU rehearsals and
# the demo, each under its own time limit, logs to $OUT. Prepare first: GPU_BUILD=build-gpu2
# tools/gpu-check prepare.
cd "$(dirname "$0")/../.." || exit
B=${GPU_BUILD:-build-gpu2}
OUT=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/$B/deplib PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
res=()
st() {  # st NAME LIMIT_S CMD...: runs CMD under a time limit, log in $OUT/NAME.log
  local n=$1 lim=$2; shift 2; local t0=$SECONDS
  timeout "$lim" "$@" >"$OUT/$n.log" 2>&1; local rc=$?
  res+=("$(printf '%-14s rc=%-3s %4ss' "$n" "$rc" $((SECONDS - t0)))")
  echo "== $n rc=$rc"; tail -n "${TAILN:-15}" "$OUT/$n.log"
}
st largest 150 "$B/tests/lora_gpu_test" --gtest_filter='*LargestPairCount*'
st pybuild 240 bash -c "cmake -S . -B $B/py -G Ninja -DMOLORA_PREBUILT_LIB=$PWD/$B/src/libmolora.so \
  -DMOLORA_WERROR=OFF -DPython_EXECUTABLE=$(command -v python3) && cmake --build $B/py -j 16"
export PYTHONPATH=$PWD/$B/py/python
TAILN=40 st comm_w1 150 tools/comm-multi --worlds 1 --iters 1000
TAILN=40 st comm_shared 200 tools/comm-multi --share-gpu --worlds 2 --iters 200 --calls 5 --reps 5
st demo 120 python3 -m molora.demo
printf '%s\n' "${res[@]}"
