"""The GPU path of :mod:`molora.demo`: the step's parts captured into CUDA graphs and timed, the
torch-only align and fused_moe-structured Triton LoRA kernels of the baseline, the fp32 torch
reference and the profiler capture. Imported by :func:`molora.demo.run` when it takes the GPU."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import molora

from .demo import TOL_GPU, find_cli, lora_plans, part_bytes

def torch_align(vids, V, B):
    """Torch-only moe_align_block_size (argsort/bincount/cumsum, as engines fall back to; also
    the baseline of bench/align_torch.py). vids int [T, k] of virtual ids, -1 = no bucket."""
    import torch

    numel = vids.numel()
    dev = vids.device
    flat = vids.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < V), flat, V)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=V + 1)[:V]
    padded = (counts + B - 1) // B * B
    offsets = torch.cumsum(padded, 0) - padded
    ustart = torch.cumsum(counts, 0) - counts
    L = numel + V * (B - 1)
    sorted_ids = torch.full((L,), numel, dtype=torch.int32, device=dev)
    sk = key[order]
    keep = sk < V
    skc = sk.clamp(max=V - 1)
    rank = torch.arange(numel, device=dev) - ustart[skc]
    pos = offsets[skc] + rank
    sorted_ids[pos[keep]] = order[keep].to(torch.int32)
    expert_ids = torch.full((-(-L // B),), -1, dtype=torch.int32, device=dev)
    blocks = torch.repeat_interleave(torch.arange(V, device=dev, dtype=torch.int32), padded // B)
    expert_ids[: blocks.numel()] = blocks
    post = padded.sum().to(torch.int32).reshape(1)
    return sorted_ids, expert_ids, post


def triton_kernels():
    """((shrink, expand), None): host wrappers of Triton kernels of the fused_moe structure
    (BLOCK_M=64, BLOCK_K / BLOCK_N=64, one program per block of sorted pairs; also the baseline
    of bench/lora_triton.py), or (None, reason) where triton is missing or fails to build."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return None, f"triton is not installed ({e})"
    try:
        return _define_triton(), None
    except Exception as e:  # pragma: no cover - depends on the triton version
        return None, f"triton kernels failed to build: {e}"


def _define_triton():
    # module globals: triton resolves the names a kernel uses in its __globals__, not closures
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def fused_moe_lora_shrink(x_ptr, a_ptr, t_ptr, sorted_ptr, eids_ptr, ntpp_ptr, P, K, top_k,
                              R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        # one program per block of BLOCK_M sorted pairs (worst-case grid), K in BLOCK_K steps
        pid_m = tl.program_id(0)
        if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
            return
        v = tl.load(eids_ptr + pid_m)
        if v < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m)
        mmask = pair < P
        tok = (pair // top_k).to(tl.int64)
        offs_r = tl.arange(0, R)
        acc = tl.zeros((BLOCK_M, R), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < K
            xa = tl.load(x_ptr + tok[:, None] * K + offs_k[None, :],
                         mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(a_ptr + v.to(tl.int64) * R * K + offs_r[None, :] * K + offs_k[:, None],
                        mask=kmask[:, None], other=0.0)
            acc += tl.dot(xa, w)
        tp = t_ptr + pair[:, None].to(tl.int64) * R + offs_r[None, :]
        tl.store(tp, acc.to(t_ptr.dtype.element_ty), mask=mmask[:, None])

    @triton.jit
    def fused_moe_lora_expand(t_ptr, b_ptr, y_ptr, scale_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                              P, N, E, R: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr):
        # one program per (block of BLOCK_M sorted pairs, BLOCK_N output columns), the grid
        # sized for the worst-case padded length
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
            return
        v = tl.load(eids_ptr + pid_m)
        if v < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + offs_m)
        mmask = pair < P
        offs_r = tl.arange(0, R)
        a = tl.load(t_ptr + pair[:, None].to(tl.int64) * R + offs_r[None, :],
                    mask=mmask[:, None], other=0.0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        b = tl.load(b_ptr + v.to(tl.int64) * N * R + offs_n[None, :] * R + offs_r[:, None],
                    mask=nmask[None, :], other=0.0)
        acc = tl.dot(a, b)
        scale = tl.load(scale_ptr + v // E)
        yp = y_ptr + pair[:, None].to(tl.int64) * N + offs_n[None, :]
        m2 = mmask[:, None] & nmask[None, :]
        y = tl.load(yp, mask=m2, other=0.0).to(tl.float32)
        tl.store(yp, (y + scale * acc).to(y_ptr.dtype.element_ty), mask=m2)

    def shrink(x, A, t, srt, eids, ntpp, top_k):
        P = t.shape[0]
        K = x.shape[1]
        R = A.shape[2]
        fused_moe_lora_shrink[(eids.numel(),)](x, A, t, srt, eids, ntpp, P, K, top_k, R=R,
                                                BLOCK_M=64, BLOCK_K=64)

    def expand(t, B, y, scales, srt, eids, ntpp, E):
        P, N = y.shape
        R = B.shape[3]
        fused_moe_lora_expand[(eids.numel(), triton.cdiv(N, 64))](
            t, B, y, scales, srt, eids, ntpp, P, N, E, R=R, BLOCK_M=64, BLOCK_N=64)

    return shrink, expand


def copy_gbps(torch, nbytes: int = 1 << 28, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second, GB/s) of torch's copy_."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * reps / (e0.elapsed_time(e1) * 1e-3) / 1e9


def capture(torch, fn, stream):
    """fn captured into a CUDA graph on `stream` (after one eager warm-up run there)."""
    stream.wait_stream(torch.cuda.current_stream())  # weights, uploads, earlier parts
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    torch.cuda.synchronize()
    return g


def time_graph(torch, g, reps) -> float:
    """µs per replay of graph g: one warm-up replay, then `reps` timed between two events."""
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def run_gpu(args, ctx) -> dict:
    import torch

    T, H, I, E, k, S = ctx["T"], ctx["H"], ctx["I"], ctx["E"], ctx["k"], ctx["S"]
    dev = torch.device("cuda")
    dt = torch.bfloat16
    V, P, Bsz = S * E, T * k, args.block_size
    reps = args.reps or 200
    m = ctx["model"]  # bf16 CUDA tensors (make_model_torch)
    Wr, Wg, Wu, Wd = m["Wr"], m["Wg"], m["Wu"], m["Wd"]
    x = ctx["x_dev"]
    pool, slots = ctx["pool"], ctx["slots"]  # device pool: slots is an int32 CUDA tensor
    v = pool.tensors(0)
    A_g, A_u, B_g, B_u = v["a_gate_up"][0], v["a_gate_up"][1], v["b_gate_up"][0], v["b_gate_up"][1]
    A_d, B_d, rank, scale = v["a_down"], v["b_down"], v["rank"], v["scale"]
    r_max = A_g.shape[2]
    sz = molora.moe_align_sizes(T, k, V, Bsz)
    buf = dict(
        topk_ids=torch.zeros(T, k, dtype=torch.int32, device=dev),
        topk_w=torch.zeros(T, k, dtype=torch.float32, device=dev),
        srt=torch.empty(sz["sorted_token_ids"], dtype=torch.int32, device=dev),
        eids=torch.empty(sz["expert_ids"], dtype=torch.int32, device=dev),
        ntpp=torch.empty(1, dtype=torch.int32, device=dev),
        ws=torch.empty(sz["workspace_bytes"] // 4, dtype=torch.int32, device=dev),
        t_g=torch.zeros(P, r_max, dtype=dt, device=dev),
        t_u=torch.zeros(P, r_max, dtype=dt, device=dev),
        t_d=torch.zeros(P, r_max, dtype=dt, device=dev),
        gate=torch.zeros(P, I, dtype=dt, device=dev),
        up=torch.zeros(P, I, dtype=dt, device=dev),
        h=torch.zeros(P, I, dtype=dt, device=dev),
        out_p=torch.zeros(P, H, dtype=dt, device=dev),
        y=torch.zeros(T, H, dtype=dt, device=dev),
    )
    b = buf
    tok_of_pair = torch.arange(T, device=dev).repeat_interleave(k)
    pair_ids = torch.arange(P, device=dev)
    down_slots = slots.repeat_interleave(k)

    def routing(aligned_tuple, top_k):
        if args.routing == "aligned":
            srt, eids, ntpp = aligned_tuple
            return (), dict(sorted_token_ids=srt, expert_ids=eids, num_tokens_post_pad=ntpp,
                            block_size=Bsz, top_k=top_k)
        if top_k == k:
            return (b["topk_ids"], slots), {}
        return (b["topk_ids"].view(P, 1), down_slots), {}

    def p_router():
        logits = (x @ Wr.t()).float()
        p = torch.softmax(logits, dim=-1)
        w, ids = torch.topk(p, k, dim=-1)
        b["topk_w"].copy_(w / w.sum(dim=-1, keepdim=True))
        b["topk_ids"].copy_(ids.to(torch.int32))

    def p_align():
        molora.moe_align_block_size(b["topk_ids"], V, Bsz, slot_ids=slots, num_base_experts=E,
                                    out=(b["srt"], b["eids"], b["ntpp"]), workspace=b["ws"])

    def base_in(W, out):  # torch bmm over all E experts, then each pair's row (reference base)
        allx = torch.bmm(x.unsqueeze(0).expand(E, T, H), W.transpose(1, 2))  # [E, T, I]
        out.copy_(allx[b["topk_ids"].reshape(-1).long(), tok_of_pair])

    def p_base_gate():
        base_in(Wg, b["gate"])

    def p_base_up():
        base_in(Wu, b["up"])

    al = (b["srt"], b["eids"], b["ntpp"])

    def mk_shrink(xin, A, t, mi, top_k):
        def f():
            pos, kw = routing(al, top_k)
            molora.lora_shrink(xin, A, *pos, ranks=rank[mi], out=t, **kw)
        return f

    def mk_expand(t, Bm, y, mi, top_k):
        def f():
            pos, kw = routing(al, top_k)
            molora.lora_expand(t, Bm, y, *pos, ranks=rank[mi], scales=scale[mi], **kw)
        return f

    def mk_delta(xin, A, Bm, t, y, mi, top_k, after_delta=False):
        def f():
            pos, kw = routing(al, top_k)
            molora.lora_moe_delta(xin, A, Bm, y, *pos, ranks=rank[mi], scales=scale[mi], t=t,
                                  after_delta=after_delta, **kw)
        return f

    def p_act():
        b["h"].copy_(torch.nn.functional.silu(b["gate"].float()) * b["up"].float())

    def p_base_down():
        allp = torch.bmm(b["h"].unsqueeze(0).expand(E, P, I), Wd.transpose(1, 2))  # [E, P, H]
        b["out_p"].copy_(allp[b["topk_ids"].reshape(-1).long(), pair_ids])

    def p_combine():
        b["y"].copy_((b["out_p"].view(T, k, H).float() * b["topk_w"].unsqueeze(-1)).sum(1))

    parts = [
        ("router (softmax top-k)", p_router),
        ("align (molora, V=S*E)", p_align),
        ("base gate GEMM (ref)", p_base_gate),
        ("base up GEMM (ref)", p_base_up),
    ]

    def lora(proj, xin, A, Bm, t, y, mi, top_k, after_delta=False):
        """One projection's LoRA parts: one delta call, or shrink then expand (--lora-call)."""
        if args.lora_call == "delta":
            return [(f"lora delta {proj}", mk_delta(xin, A, Bm, t, y, mi, top_k, after_delta))]
        return [(f"lora shrink {proj}", mk_shrink(xin, A, t, mi, top_k)),
                (f"lora expand {proj}", mk_expand(t, Bm, y, mi, top_k))]

    # up's delta directly follows gate's on the stream (same x and routing): after_delta. Timed
    # alone (its own graph) it follows nothing of molora's, which is still valid: after_delta
    # only lets its shrink read early, and nothing it reads is written before it.
    parts += lora("gate", x, A_g, B_g, b["t_g"], b["gate"], 0, k)
    parts += lora("up", x, A_u, B_u, b["t_u"], b["up"], 1, k, after_delta=True)
    parts += [("act silu(gate)*up", p_act), ("base down GEMM (ref)", p_base_down)]
    parts += lora("down", b["h"], A_d, B_d, b["t_d"], b["out_p"], 2, 1)
    parts.append(("combine (weighted sum)", p_combine))
    if args.perturb == "skip-down-lora":
        parts = [p for p in parts if p[0] not in ("lora expand down", "lora delta down")]

    def step():
        for _, fn in parts:
            fn()

    stream = torch.cuda.Stream()
    bw = copy_gbps(torch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g_step = capture(torch, step, stream)
    g_step.replay()
    torch.cuda.synchronize()
    y = b["y"].float().cpu().numpy()
    topk_ids = b["topk_ids"].cpu().numpy()
    topk_w = b["topk_w"].cpu().numpy()
    if args.perturb == "output":
        y = y.copy()
        y[0, 0] += 10 * TOL_GPU * float(np.abs(y).max()) + 1e-2
    ref = reference_torch(torch, ctx, topk_ids, topk_w)
    # per-part times: each part in its own graph (same buffers), replayed `reps` times
    rows = []
    ctx["distinct_experts"] = int(np.unique(topk_ids).size)
    slots_np = slots.cpu().numpy()
    plans = lora_plans(args, T, H, I, E, k, S, r_max, topk_ids, slots_np, ctx["ranks_list"],
                       "bf16", bw, sms)
    for name, fn in parts:
        us = time_graph(torch, capture(torch, fn, stream), reps)
        fl = plans[name]["floor_us"] if name in plans else None
        rows.append(dict(part=name, us=us, bytes=part_bytes(name, ctx, plans, 2), floor_us=fl))
    rows.append(dict(part="all-reduce (world 1: pass-through)", us=0.0, bytes=0, floor_us=None))
    total = time_graph(torch, g_step, reps)
    res = dict(device=torch.cuda.get_device_name(), y=y, ref=ref, tol=TOL_GPU, rows=rows,
               total_us=total, total_note=f"whole step, one CUDA graph, {reps} replays",
               plans=plans, copy_gbps=bw)
    if not args.no_baseline:  # a side column: its failure is reported, never fatal
        try:
            res["baseline"] = run_gpu_baseline(torch, args, ctx, b, parts, al, stream, reps,
                                               dict(A_g=A_g, A_u=A_u, B_g=B_g, B_u=B_u,
                                                    A_d=A_d, B_d=B_d, scale=scale), ref)
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize()
            res["baseline"] = {"note": [f"baseline failed: {type(e).__name__}: {e}"]}
    if args.profile:
        res["profile"] = profile_gpu(torch, g_step, args.profile)
    return res


def run_gpu_baseline(torch, args, ctx, b, parts, al, stream, reps, w, ref) -> dict:
    """The same step with the baseline pieces: torch-only align (eager, B=64) and the fused_moe
    Triton LoRA (graph-captured). Shared parts (router, base GEMMs, act, combine) are the same
    graphs as molora's. Returns {part: us or None, 'note': ..., 'max_err': ...}."""
    E, S = ctx["E"], ctx["S"]
    V = S * E
    out: dict = {"note": []}
    slots = ctx["slots"]

    def vids():
        return torch.where(slots[:, None] >= 0, slots[:, None] * E + b["topk_ids"],
                           torch.full_like(b["topk_ids"], -1))

    # torch align: eager (it synchronises with the host), wall time per call
    for _ in range(3):
        torch_align(vids(), V, 64)
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        al64 = torch_align(vids(), V, 64)
    torch.cuda.synchronize()
    out["align (molora, V=S*E)"] = (time.perf_counter() - t0) * 1e6 / n
    out["note"].append("align: torch-only (argsort/bincount/cumsum), eager wall time, B=64")
    kern, why = triton_kernels()
    r_max = w["A_g"].shape[2]
    if kern is None or r_max < 16:
        out["note"].append("LoRA: Triton column skipped: " +
                           (why or f"r_max={r_max} < 16 (tl.dot needs >= 16)"))
        return out
    try:
        _triton_baseline(torch, ctx, b, parts, stream, reps, w, ref, kern, al64, out)
    except Exception as e:  # noqa: BLE001  (a side column: reported, never fatal)
        torch.cuda.synchronize()
        out["note"].append(f"LoRA: Triton baseline failed: {type(e).__name__}: {e}")
    return out


def _triton_baseline(torch, ctx, b, parts, stream, reps, w, ref, kern, al64, out) -> None:
    T, E, k = ctx["T"], ctx["E"], ctx["k"]
    P = T * k
    r_max = w["A_g"].shape[2]
    shrink, expand = kern
    srt, eids, ntpp = (a.clone() for a in al64)
    tb = {n_: torch.zeros(P, r_max, dtype=torch.bfloat16, device="cuda") for n_ in "gud"}
    sc = w["scale"]
    tri = {
        "lora shrink gate": lambda: shrink(ctx["x_dev"], w["A_g"], tb["g"], srt, eids, ntpp, k),
        "lora expand gate": lambda: expand(tb["g"], w["B_g"], b["gate"], sc[0], srt, eids, ntpp,
                                           E),
        "lora shrink up": lambda: shrink(ctx["x_dev"], w["A_u"], tb["u"], srt, eids, ntpp, k),
        "lora expand up": lambda: expand(tb["u"], w["B_u"], b["up"], sc[1], srt, eids, ntpp, E),
        "lora shrink down": lambda: shrink(b["h"], w["A_d"], tb["d"], srt, eids, ntpp, 1),
        "lora expand down": lambda: expand(tb["d"], w["B_d"], b["out_p"], sc[2], srt, eids,
                                           ntpp, E),
    }
    for proj in ("gate", "up", "down"):  # molora's delta rows: the same two Triton kernels
        tri[f"lora delta {proj}"] = (lambda s_, e_: lambda: (s_(), e_()))(
            tri[f"lora shrink {proj}"], tri[f"lora expand {proj}"])
    names = {nm for nm, _ in parts}
    tri = {nm: fn for nm, fn in tri.items() if nm in names}
    # the baseline step (eager align outside, everything else in order), checked like molora's
    ordered = [(nm, tri.get(nm, fn)) for nm, fn in parts if nm != "align (molora, V=S*E)"]
    for nm, fn in ordered:
        fn()
    torch.cuda.synchronize()
    yb = b["y"].float().cpu().numpy()
    out["max_err"] = float(np.abs(yb - ref).max() / max(np.abs(ref).max(), 1e-30))
    step = [fn for _, fn in ordered]
    g = capture(torch, lambda: [f() for f in step], stream)
    out["total_graph_us"] = time_graph(torch, g, reps)
    for nm, fn in tri.items():
        out[nm] = time_graph(torch, capture(torch, fn, stream), reps)
    out["note"].append("LoRA: Triton fused_moe structure, BLOCK_M=64 BLOCK_N/K=64, graph replay")


def reference_torch(torch, ctx, topk_ids, topk_w) -> np.ndarray:
    """Dense per-token loop in fp32 on the GPU, from the adapter files' weights (no molora)."""
    dev = "cuda"
    W = ctx["model"]  # the base weights as the step saw them (bf16), used in fp32 below
    x = ctx["x_dev"].float()
    ads = {a["name"]: {kk: torch.from_numpy(a[kk]).to(dev) for kk in
                       ("Ag", "Bg", "Au", "Bu", "Ad", "Bd")} | {"scale": a["scale"]}
           for a in ctx["adapters"]}
    T, k = topk_ids.shape
    y = torch.zeros(T, x.shape[1], device=dev)
    for t in range(T):
        ad = ads.get(ctx["names"][t]) if ctx["names"][t] else None
        for j in range(k):
            e = int(topk_ids[t, j])
            g = W["Wg"][e].float() @ x[t]
            u = W["Wu"][e].float() @ x[t]
            if ad is not None:
                g = g + ad["scale"] * (ad["Bg"][e] @ (ad["Ag"][e] @ x[t]))
                u = u + ad["scale"] * (ad["Bu"][e] @ (ad["Au"][e] @ x[t]))
            h = torch.nn.functional.silu(g) * u
            o = W["Wd"][e].float() @ h
            if ad is not None:
                o = o + ad["scale"] * (ad["Bd"][e] @ (ad["Ad"][e] @ h))
            y[t] += float(topk_w[t, j]) * o
    return y.cpu().numpy().astype(np.float64)


def profile_gpu(torch, g_step, path: str, steps: int = 10) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    g_step.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("step[DECODE]"):
                g_step.replay()
        torch.cuda.synchronize()
    if path.endswith(".gz"):  # gzip it ourselves: not every torch version does for .gz
        import gzip

        with tempfile.TemporaryDirectory() as d:
            raw = os.path.join(d, "trace.json")
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as fin, gzip.open(path, "wb") as fout:
                shutil.copyfileobj(fin, fout)
    else:
        prof.export_chrome_trace(path)
    cli = find_cli()
    if cli is None:
        return {"trace": path, "summary": None,
                "note": "molora CLI not found (set MOLORA_CLI): no summary"}
    r = subprocess.run([cli, "prof", "summary", path], capture_output=True, text=True)
    return {"trace": path, "summary": r.stdout + r.stderr, "rc": r.returncode, "cli": cli}


