"""MoE-LoRA expand: molora against a Triton kernel of the fused_moe structure (BLOCK_M=64,
BLOCK_N=64: the configuration engines fall back to without a tuned entry; the kernel is
molora._demo_gpu.triton_kernels()'s, shared with the demo), timed in the same run
as CUDA-graph replays over rotating routings (so weights come from HBM, not L2).

Prints the table last and SUMMARY lines. Needs torch with CUDA, triton and the molora package.
"""
from __future__ import annotations

import sys

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SUMMARY lora triton baseline skipped: {e}")
    sys.exit(0)

import molora
from molora._demo_gpu import capture, copy_gbps, time_graph, triton_kernels

SHAPES = [("N6144_r32_V160x8", 6144, 32, 160, 8), ("N2048_r16_V128x8", 2048, 16, 128, 8),
          ("N7168_r32_V256x4", 7168, 32, 256, 4), ("N4096_r32_V128x8", 4096, 32, 128, 8)]
TS = [1, 8, 32, 64, 128, 256]
K_TOP = 8
ROT = 16


def routing(T, S, E, none_frac, rng):
    z = np.cumsum(1.0 / np.arange(1, S + 1))
    slot = np.searchsorted(z, rng.uniform(0, z[-1], T)).astype(np.int32)
    slot[rng.permutation(T)[:int(np.floor(none_frac * T + 0.5))]] = -1
    topk = np.stack([rng.permutation(E)[:K_TOP] for _ in range(T)]).astype(np.int32)
    return topk, slot


def align(topk, slot, S, E, block):
    T, k = topk.shape
    P, V = T * k, S * E
    length = P + V * (block - 1)
    srt = np.full(length, P, np.int32)
    eids = np.full(-(-length // block), -1, np.int32)
    v = np.where(slot[:, None] >= 0, slot[:, None] * E + topk, -1).reshape(-1)
    order = np.argsort(v, kind="stable")
    order = order[v[order] >= 0]
    pos = 0
    vals, starts, counts = np.unique(v[order], return_index=True, return_counts=True)
    for val, st, c in zip(vals, starts, counts):
        srt[pos:pos + c] = order[st:st + c]
        nb = -(-c // block)
        eids[pos // block:pos // block + nb] = val
        pos += nb * block
    return srt, eids, np.array([pos], np.int32)


def must_move(topk, slot, E, N, r):
    act = slot >= 0
    pairs = int(act.sum()) * topk.shape[1]
    distinct = len(set((slot[:, None] * E + topk)[act].reshape(-1).tolist()))
    return distinct * N * r * 2 + pairs * r * 2 + 2 * pairs * N * 2


def graph_time(fn, reps=8):
    """µs per call: fn (ROT calls) captured into one CUDA graph, replayed `reps` times."""
    g = capture(torch, fn, torch.cuda.Stream())
    return time_graph(torch, g, reps) / ROT


def main():
    dev = "cuda"
    kern, why = triton_kernels()
    if kern is None:
        print(f"SUMMARY lora triton baseline skipped: {why}")
        return
    _, triton_expand = kern
    bw = copy_gbps(torch, 1 << 30, 10)
    rows, summary = [], []
    hdr = (f"{'shape':18s} {'T':>4s} {'none':>5s} {'floor_us':>9s} {'molora_us':>10s} "
           f"{'%copy':>6s} {'aligned_us':>10s} {'triton_us':>10s} {'speedup':>8s} "
           f"{'maxdiff':>8s}")
    for name, N, r, E, S in SHAPES:
        Bw = (torch.randn(S, E, N, r, device=dev) * 0.1).to(torch.bfloat16)
        # One copy of the weights per rotating routing (as `molora bench lora` does), so no
        # call finds its weights in L2 from an earlier one; fewer where 16 would take more than
        # an eighth of the device's memory.
        total = torch.cuda.get_device_properties(0).total_memory
        n_copies = max(1, min(ROT, total // 8 // (Bw.numel() * 2)))
        Bws = [Bw] + [Bw.clone() for _ in range(n_copies - 1)]
        scales = torch.full((S,), 0.5, device=dev)
        ranks = torch.full((S,), r, dtype=torch.int32, device=dev)
        for T in TS:
            for none in (0.0, 0.5):
                rng = np.random.default_rng(1000 * T + N)
                P = T * K_TOP
                t = (torch.randn(P, r, device=dev) * 0.1).to(torch.bfloat16)
                y = torch.zeros(P, N, device=dev, dtype=torch.bfloat16)
                sets, mv = [], 0
                for _ in range(ROT):
                    topk, slot = routing(T, S, E, none, rng)
                    mv += must_move(topk, slot, E, N, r)
                    a64 = align(topk, slot, S, E, 64)
                    a16 = align(topk, slot, S, E, 16)
                    sets.append(dict(
                        topk=torch.from_numpy(topk).to(dev), slot=torch.from_numpy(slot).to(dev),
                        s64=[torch.from_numpy(z).to(dev) for z in a64],
                        s16=[torch.from_numpy(z).to(dev) for z in a16]))
                mv /= ROT
                floor = mv / (bw * 1e3)

                def run_molora():
                    for i, s in enumerate(sets):
                        molora.lora_expand(t, Bws[i % n_copies], y, s["topk"], s["slot"],
                                           ranks=ranks, scales=scales)

                def run_aligned():
                    for i, s in enumerate(sets):
                        srt, eids, ntpp = s["s16"]
                        molora.lora_expand(t, Bws[i % n_copies], y, ranks=ranks, scales=scales,
                                           sorted_token_ids=srt, expert_ids=eids,
                                           num_tokens_post_pad=ntpp, block_size=16,
                                           top_k=K_TOP)

                def run_triton():
                    for i, s in enumerate(sets):
                        triton_expand(t, Bws[i % n_copies], y, scales, *s["s64"], E)

                # correctness of both against each other on one routing
                s0 = sets[0]
                y.zero_()
                molora.lora_expand(t, Bw, y, s0["topk"], s0["slot"], ranks=ranks, scales=scales)
                y_m = y.float().clone()
                y.zero_()
                triton_expand(t, Bw, y, scales, *s0["s64"], E)
                diff = (y.float() - y_m).abs().max().item()
                um = graph_time(run_molora)
                ua = graph_time(run_aligned)
                ut = graph_time(run_triton)
                pct = 100 * mv / (um * 1e3) / bw
                rows.append(f"{name:18s} {T:4d} {none * 100:4.0f}% {floor:9.2f} {um:10.2f} "
                            f"{pct:5.1f}% {ua:10.2f} {ut:10.2f} {ut / um:7.1f}x {diff:8.4f}")
                if name.startswith("N6144") and T == 64 and none == 0.0:
                    # The Triton kernel reads the align layout too (its align not timed either):
                    # the target is judged on molora's faster routing, both are printed.
                    best = min(um, ua)
                    ok = ut / best >= 4
                    summary.append(f"SUMMARY lora expand N6144_r32 T=64 vs Triton fused_moe "
                                   f"BLOCK_M=64/N=64: molora plain {um:.1f} us ({ut / um:.1f}x), "
                                   f"aligned {ua:.1f} us ({ut / ua:.1f}x), triton {ut:.1f} us "
                                   f"(target >=4x) {'MET' if ok else 'MISSED'}")
        Bw = Bws = None  # (freed before the next shape's weights)
        torch.cuda.empty_cache()
    print(f"copy bandwidth (device-to-device, read+write): {bw:.0f} GB/s")
    print("expand, bf16, top-8, Zipf slots; molora = plain routing, aligned = molora on the "
          "align layout (B=16, align itself not timed); triton = fused_moe structure (B=64); "
          f"the {ROT} rotating calls cycle through up to {ROT} copies of the weights (within an "
          "eighth of the device memory), so none finds its weights in L2")
    print()
    print(hdr)
    for r_ in rows:
        print(r_)
    print()
    for s in summary:
        print(s)


if __name__ == "__main__":
    main()
