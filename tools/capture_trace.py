#!/usr/bin/env python3
"""Captures a small, real torch.profiler (Kineto) trace of a MoE-decode-like loop on one GPU.

    python3 tools/capture_trace.py OUT.pt.trace.json.gz

Each decode step is a ProfilerStep#N holding a record_function("step[DECODE]") with nested
per-layer annotations; the layers run matmuls (cuBLAS), softmax/topk routing, elementwise ops,
an RMS-norm, a toy Triton MoE kernel named fused_moe_kernel, a side-stream GEMM and one CUDA
graph replay. Written for tests/data (molora prof's real-trace test); keep it < 1 MB gzipped.
"""
import gzip
import json
import os
import shutil
import sys
import tempfile

import torch
import triton
import triton.language as tl


@triton.jit
def fused_moe_kernel(x_ptr, w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    w = tl.load(w_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x * w + x, mask=m)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "h200_decode.pt.trace.json.gz"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    T, H, I, E, K, L = 16, 1024, 512, 16, 2, 3
    x0 = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    wn = torch.ones(H, device=dev, dtype=torch.bfloat16)
    wq = torch.randn(H, H, device=dev, dtype=torch.bfloat16) / 32
    wr = torch.randn(H, E, device=dev, dtype=torch.bfloat16) / 32
    w1 = torch.randn(H, I, device=dev, dtype=torch.bfloat16) / 32
    w2 = torch.randn(I, H, device=dev, dtype=torch.bfloat16) / 32
    tw = torch.randn(T * H, device=dev, dtype=torch.float32)
    side = torch.cuda.Stream()

    def layer(x, li):
        with torch.profiler.record_function(f"layer{li}"):
            with torch.profiler.record_function("attention"):
                h = rms_norm(x, wn)
                q = h @ wq
                a = torch.softmax(q.float() @ q.float().t() / 32.0, dim=-1).to(x.dtype) @ q
                x = x + a
            with torch.profiler.record_function("moe"):
                h = rms_norm(x, wn)
                logits = (h @ wr).float()
                p = torch.softmax(logits, dim=-1)
                tv, ti = torch.topk(p, K, dim=-1)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    shared = torch.nn.functional.silu(h @ w1) @ w2
                flat = h.float().reshape(-1).contiguous()
                o = torch.empty_like(flat)
                n = flat.numel()
                fused_moe_kernel[(triton.cdiv(n, 1024),)](flat, tw, o, n, BLOCK=1024)
                torch.cuda.current_stream().wait_stream(side)
                x = x + o.reshape(T, H).to(x.dtype) * tv[:, :1].to(x.dtype) + shared
        return x

    # warm up (compiles the Triton kernel, cuBLAS handles) and a graph of one layer
    x = x0.clone()
    for li in range(L):
        x = layer(x, li)
    static_x = x0.clone()
    g, static_y = None, torch.zeros_like(x0)
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(static_x, 0)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            static_y = layer(static_x, 0)
    except Exception as e:  # the trace is still useful without the graph replay
        print(f"CUDA graph capture failed ({e}); continuing without it")
        g, static_y = None, torch.zeros_like(x0)
    torch.cuda.synchronize()

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=5, repeat=1)
    tmp = tempfile.mkdtemp()
    raw = os.path.join(tmp, "trace.json")
    with torch.profiler.profile(activities=acts, schedule=sched, record_shapes=False,
                                on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for step in range(7):
            with torch.profiler.record_function("step[DECODE]"):
                x = x0.clone()
                for li in range(L):
                    x = layer(x, li)
                if g is not None:
                    with torch.profiler.record_function("graph_replay"):
                        g.replay()
                y = x + static_y
                with torch.profiler.record_function("sampling"):
                    probs = torch.softmax(y.float()[:, :256], dim=-1)
                    tok = torch.argmax(probs, dim=-1)
                tok_cpu = tok.cpu()  # memcpy DtoH + sync, as a real decode loop does
                torch.cuda.synchronize()
            prof.step()
    with open(raw, "rb") as f, gzip.open(out, "wb", compresslevel=9) as g2:
        shutil.copyfileobj(f, g2)
    with open(raw) as f:
        ev = json.load(f)["traceEvents"]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    print(f"wrote {out}: {os.path.getsize(out)} bytes gz, {os.path.getsize(raw)} bytes json, "
          f"{len(ev)} events, {len(kern)} kernels, "
          f"{sum(e['dur'] for e in kern):.1f} us kernel time, tok {tok_cpu[:4].tolist()}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
