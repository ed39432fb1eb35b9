"""Torch-only moe_align_block_size (argsort / bincount / cumsum, as engines fall back to) against
molora's kernel through the Python package, in the same run on the same device.

torch: eager calls (the path cannot be graph-captured: it synchronises with the host),
  µs per call = wall time of 20 calls / 20 after a warm-up.
molora: 20 calls captured into one torch CUDA graph, replayed 25 times, µs = event time / 500.
Both results are checked equal before timing. Prints the table last, then SUMMARY lines.
"""
import time

import torch

import molora
from molora._demo_gpu import torch_align  # the baseline, shared with the demo


def time_torch(ids, V, B, n=20):
    for _ in range(3):
        torch_align(ids, V, B)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        torch_align(ids, V, B)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def time_molora(ids, V, B, calls=20, reps=25):
    T, k = ids.shape
    sz = molora.moe_align_sizes(T, k, V, B)
    out = tuple(torch.empty(n, dtype=torch.int32, device="cuda")
                for n in (sz["sorted_token_ids"], sz["expert_ids"], 1))
    ws = torch.empty(sz["workspace_bytes"] // 4, dtype=torch.int32, device="cuda")
    molora.moe_align_block_size(ids, V, B, out=out, workspace=ws)
    ref = torch_align(ids, V, B)
    for a, b in zip(out, ref):
        assert torch.equal(a, b), f"molora != torch baseline at V={V} T={T} B={B}"
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            molora.moe_align_block_size(ids, V, B, out=out, workspace=ws)
    for _ in range(3):
        g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (calls * reps)


def main():
    torch.manual_seed(0)
    rows = []
    for V in (256, 1024, 8192, 65536):
        for T in (1, 16, 64, 256, 4096):
            for B in (16, 64):
                ids = torch.randint(0, V, (T, 8), dtype=torch.int32, device="cuda")
                rows.append((V, T, B, time_torch(ids, V, B), time_molora(ids, V, B)))
    print(f"\nalign_torch: torch-only align (eager) vs molora (graph replay), k=8, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'V':>7} {'T':>6} {'B':>4} {'torch us':>10} {'molora us':>10} {'ratio':>8}")
    for V, T, B, tt, tm in rows:
        print(f"{V:>7} {T:>6} {B:>4} {tt:>10.1f} {tm:>10.2f} {tt / tm:>7.1f}x")
    dec = [r for r in rows if r[1] <= 256]
    worst = min(dec, key=lambda r: r[3] / r[4])
    print(f"SUMMARY align vs torch, decode T<=256: min ratio {worst[3] / worst[4]:.1f}x at "
          f"V={worst[0]} T={worst[1]} B={worst[2]} (target >= 30x)")
    w8 = max(r[4] for r in dec if r[0] == 8192)
    print(f"SUMMARY align (python graph) V=8192 T<=256: worst {w8:.2f} us (target <= 10)")


if __name__ == "__main__":
    main()
