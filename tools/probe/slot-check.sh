#!/usr/bin/env bash
# The plain stream kernels' every-slot -1 check (Plan::slot_check) on and off in one binary
# (device run, carry ["build-gpu2"]; prepare with GPU_BUILD=build-gpu2 tools/gpu-check prepare):
# calls whose slots are all -1 (shrink and expand N6144, T = 4-256) and calls with
# adapters (seed shapes, plain routing), ROUNDS rounds interleaved (default 3), then each row's
# mean with the check off and on. docs/lora.md "Every slot -1 (`Plan::slot_check`)" has the
# numbers of the thirty-seventh session (there as build-ab/call32.sh).
cd "$(dirname "$0")/../.." || exit
export GPU_BUILD=${GPU_BUILD:-build-gpu2}
export M=$GPU_BUILD/src/cli/molora ROUTING=plain LIBS="$GPU_BUILD/src"
export ENVS="-
MOLORA_LORA_SLOT_CHECK=0"
# SLOT_CASES replaces the cases (AB_CASES' form). The default's T cover both grouping ways: the
# warp sorts (P <= 256 at top-8: T <= 32), whose own "no valid key" way out skips the network
# since the forty-first session (still 2.4 us against the check's 1.3 in the forty-third), and
# the tables (T >= 64). The shrink at T=4 runs the grid kernel, which has no check: a control.
export AB_CASES=${SLOT_CASES:-"shrink N6144_r32_V160x8 4,8,16,32,64,256 --none 1
expand N6144_r32_V160x8 4,8,16,32,64,256 --none 1
shrink N4096_r32_V128x8 16,32,256
shrink N6144_r32_V160x8 8,16,32
shrink N2048_r16_V128x8 16,32,64
expand N6144_r32_V160x8 8,16,32,64,256
expand N4096_r32_V128x8 8,32,256
expand N2048_r16_V128x8 32,64"}
raw=${OUT:-/tmp}/slot-check.txt
tools/probe/ab.sh "${1:-3}" > "$raw" 2>&1
# Rows "r<round> <lib>[+MOLORA_LORA_SLOT_CHECK=0] <op> <shape> T=<T> ...: <us> us, ..., <pct>%": a
# call without adapters moves almost nothing (pct < 1).
awk '{ off = $2 ~ /SLOT_CHECK=0/; us = 0; pct = 0
       for (i = 1; i <= NF; i++) { if ($(i) == "us," && us == 0) us = $(i - 1); if ($(i) ~ /%,$/) pct = $(i) + 0 }
       k = $3 " " $4 " " $5 " " (pct < 1 ? "no-adapter" : "adapters")
       if (!(k in seen)) { seen[k] = 1; order[++n] = k }
       s[k, off] += us; c[k, off]++ }
     END { printf "%-48s %9s %9s\n", "call (means, us)", "check off", "check on"
           for (i = 1; i <= n; i++) { k = order[i]
             printf "%-48s %9.2f %9.2f\n", k, s[k, 1] / c[k, 1], s[k, 0] / c[k, 0] } }' "$raw"
