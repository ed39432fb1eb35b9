#!/usr/bin/env bash
# What a call costs when no token has an adapter, plain routing against aligned, every seed
# shape, both ops, T = 1 to 256 (device run, carry build-gpu). The contract: about one empty
# launch (`molora bench lora` prints the empty launch beside its table; ~1.0 us on the H100).
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/deplib
M=build-gpu/src/cli/molora
for sh in N6144_r32_V160x8 N2048_r16_V128x8 N7168_r32_V256x4 N4096_r32_V128x8; do
  for op in shrink expand; do
    for routing in plain aligned; do
      "$M" bench lora --shape "$sh" --routing "$routing" --op "$op" --none 1 --T 1,8,64,256 2>&1 |
        grep "us, floor" | sed -E 's/, floor.*//; s/^/none-cost /'
    done
  done
done
