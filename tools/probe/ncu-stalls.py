#!/usr/bin/env python3
"""Stall reasons of an Nsight Compute source-page CSV (tools/probe/ncu-sass.sh's *_sass.csv.gz).

Prints the kernel's code size, the samples and stall reasons summed inside each called
subroutine (CALL.REL target to its RET) and outside, and the instructions with the most samples.
Usage: ncu-stalls.py FILE.csv[.gz] [TOP]
"""
import csv
import gzip
import re
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    hdr = next(r for r in rows if "Address" in r)
    data = rows[rows.index(hdr) + 1:]
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ri = [hdr.index(h) for h in reasons]
    ins = []
    for r in data:
        try:
            a = int(r[ia], 16)
        except (ValueError, IndexError):
            continue
        ins.append((a, r[isrc].strip(), [int(r[i] or 0) for i in ri]))
    if not ins:
        sys.exit("no instructions in " + path)
    base = ins[0][0]
    print(f"kernel {(ins[-1][0] - base + 16) / 1024:.1f} KB, {len(ins)} instructions")
    # Subroutines: each CALL.REL target up to the first RET after it.
    regions = []
    for a, s, _ in ins:
        if "CALL.REL" in s:
            t = int(re.search(r"0x([0-9a-f]+)", s).group(1), 16)
            end = min((b for b, s2, _ in ins if b >= t and "RET" in s2), default=ins[-1][0])
            regions.append((t, end))
    regions = sorted(set(regions))

    def name(a):
        for t, e in regions:
            if t <= a <= e:
                return f"sub@{t - base:#x}"
        return "kernel"

    agg = {}
    for a, _, v in ins:
        d = agg.setdefault(name(a), [0] * len(reasons))
        for i, x in enumerate(v):
            d[i] += x
    total = sum(sum(v) for v in agg.values())
    for n, v in agg.items():
        s = sum(v)
        sz = next(((e - t + 16) / 1024 for t, e in regions if n == f"sub@{t - base:#x}"), None)
        tops = sorted(((x, reasons[i][6:]) for i, x in enumerate(v) if x), reverse=True)[:6]
        print(f"{n}: {s} samples ({100 * s / max(total, 1):.0f}%)"
              + (f", {sz:.1f} KB" if sz else "") + ": "
              + ", ".join(f"{r} {x}" for x, r in tops))
    print(f"top {top} instructions (offset, samples, leading reasons):")
    for a, s, v in sorted(ins, key=lambda x: -sum(x[2]))[:top]:
        tops = sorted(((x, reasons[i][6:]) for i, x in enumerate(v) if x), reverse=True)[:2]
        print(f"  {a - base:#7x} {sum(v):4d} {name(a):>12} {s[:56]:56} "
              + ", ".join(f"{r} {x}" for x, r in tops))


if __name__ == "__main__":
    main()
