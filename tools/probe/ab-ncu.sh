#!/usr/bin/env bash
# Hardware counters of one launch per library build (device run, carry the builds): for each
# folder in LIBS, one `molora bench lora` case under ncu (clocks and caches left alone, so the
# weights come from HBM as in the bench's rotation), printing duration, DRAM bytes, L2 hits,
# instructions issued, shared-memory bank conflicts and SM activity, labelled by the folder.
# Usage: LIBS="build-ab/v27 build-gpu2/src" OP=shrink SHAPE=N768_r32_V128x8 T=256 \
#          [ROUTING=aligned] [SKIP=40] tools/probe/ab-ncu.sh
cd "$(dirname "$0")/../.."
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
M=${M:-build-ab/molora}
MET=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__warps_issue_stalled_barrier.sum,launch__registers_per_thread
for lib in ${LIBS:-build-gpu/src}; do
  for t in ${T:-256}; do
    echo "-- $lib T=$t"
    LD_LIBRARY_PATH="$PWD/$lib:$PWD/build-ab/deplib:$PWD/${GPU_BUILD:-build-gpu}/deplib" \
      "$NCU" --clock-control none --cache-control none --metrics "$MET" -k regex:molora_lora \
      --launch-skip "${SKIP:-40}" --launch-count 1 "$M" bench lora --shape "${SHAPE:-N768_r32_V128x8}" \
      --routing "${ROUTING:-aligned}" --op "${OP:-shrink}" --T "$t" 2>&1 |
      grep -E "^\s+(gpu__|dram__|lts__|smsp__|l1tex__|sm__|launch__)" | sed -E 's/ +/ /g'
  done
done
