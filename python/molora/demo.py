"""One MoE multi-LoRA decode layer through molora, end to end: ``python -m molora.demo``.

What one step does (docs/integration.md explains each call):

1. router: ``softmax(x @ W_r^T)``, top-k, weights renormalised (Qwen3 ``norm_topk_prob``);
2. align: :func:`molora.moe_align_block_size` over the ``V = S*E`` virtual experts
   (``v = slot*E + expert``; tokens with slot -1 go to no bucket);
3. base expert GEMMs gate/up (a plain reference: numpy grouped by expert on the CPU, torch
   ``bmm`` over all E experts on the GPU — the base MoE GEMM is not molora's product);
4. :func:`molora.lora_shrink` / :func:`molora.lora_expand` for gate and up (in place on the
   base outputs), ``silu(gate) * up``, base down GEMM, shrink/expand for down (``top_k = 1``
   over the pair rows);
5. weighted sum over the k experts of each token; all-reduce (world 1: a pass-through).

Adapters are real PEFT directories (``adapter_config.json`` + ``adapter_model.safetensors``)
written to a temporary directory and loaded with :class:`molora.AdapterPool`. The output is
checked against a dense per-token loop that uses no molora call (fp64 numpy on the CPU, fp32
torch on the GPU) with the router decision of the step (the router is plain numpy/torch shared
by both); the check is ``max|y - ref| <= tol * max|ref|`` (tol 1e-4 for the CPU fp32 path,
3e-2 for bf16 on the GPU). Exit status 1 when it fails.

Without a GPU the CPU references run (numpy). With one (torch CUDA and ``molora.gpu_count()``),
every part is captured into CUDA graphs (one per part for the per-part times, one for the whole
step) and replayed, timed with CUDA events; beside it the baseline path: a torch-only align
(eager: it synchronises with the host) and fused_moe-structured Triton LoRA kernels
(BLOCK_M=64, the configuration engines fall back to), when triton is installed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

import molora

# name: (hidden H, expert intermediate I, experts E, top-k)
SHAPES = {
    "qwen3-30b-quarter": (512, 192, 128, 8),  # default: Qwen3-30B-A3B at 1/4 width
    "qwen3-30b": (2048, 768, 128, 8),
    "qwen3-235b": (4096, 1536, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
    "glm-4.5": (5120, 1536, 160, 8),
    "glm-4.5-air": (4096, 1408, 128, 8),
    "mixtral": (4096, 14336, 8, 2),
}

PERTURB = ("none", "skip-down-lora", "output")
TOL_CPU = 1e-4
TOL_GPU = 3e-2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="molora demo",
        description="One MoE multi-LoRA decode step through molora (router top-k -> align -> "
        "base expert GEMMs -> LoRA shrink/expand -> weighted sum -> all-reduce), checked against "
        "a plain implementation; prints per-part time, bytes and %% of the HBM floor.")
    p.add_argument("--shape", default="qwen3-30b-quarter", choices=sorted(SHAPES),
                   help="model shape (default qwen3-30b-quarter: H=512 I=192 E=128 k=8)")
    p.add_argument("--tokens", "-T", type=int, default=64, help="decode batch (default 64)")
    p.add_argument("--slots", "-S", type=int, default=4, help="adapter slots S (default 4)")
    p.add_argument("--rank", "-r", type=int, default=16,
                   help="r_max (8, 16, 32, 64, 128); every second adapter has rank r/2")
    p.add_argument("--no-adapter", type=float, default=0.25,
                   help="fraction of tokens without adapter, slot -1 (default 0.25)")
    p.add_argument("--routing", default="aligned", choices=("aligned", "plain"),
                   help="LoRA routing input: the align layout (default) or topk/slot ids")
    p.add_argument("--block-size", type=int, default=16, help="align block size (default 16)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: cuda when torch CUDA and a molora GPU build are present")
    p.add_argument("--world", type=int, default=1,
                   help="tensor-parallel ranks (only 1: the all-reduce is a pass-through)")
    p.add_argument("--reps", type=int, default=0,
                   help="timed repetitions (default: 3 on the CPU, 200 graph replays on GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", metavar="OUT.json.gz", default=None,
                   help="GPU: write a torch.profiler trace of replayed steps (annotated "
                   "step[DECODE]) and print `molora prof summary` of it; CPU: says it needs a "
                   "GPU and is skipped")
    p.add_argument("--no-baseline", action="store_true",
                   help="GPU: skip the torch-align / Triton baseline columns")
    p.add_argument("--perturb", default="none", choices=PERTURB,
                   help="testing: make the molora path wrong on purpose (skip the down LoRA "
                   "expand, or disturb one output element) to show the check fails")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the result as JSON")
    p.add_argument("--keep-adapters", metavar="DIR", default=None,
                   help="write the PEFT adapters here (kept) instead of a temporary directory")
    return p.parse_args(argv)


# ---- model, adapters, batch --------------------------------------------------------------------

def peft_name(layer: int, e: int, proj: str, ab: str) -> str:
    return f"base_model.model.model.layers.{layer}.mlp.experts.{e}.{proj}.lora_{ab}.weight"


def adapter_ranks(S: int, r_max: int) -> list:
    return [r_max if s % 2 == 0 else max(8, r_max // 2) for s in range(S)]


def write_adapters(root: str, S: int, E: int, H: int, I: int, r_max: int,
                   rng: np.random.Generator) -> list:
    """S PEFT adapters (layer 0, every routed expert's gate/up/down), float32 files. Returns per
    adapter: name, dir, r, scale and the stacked weights Ag/Au [E,r,H], Bg/Bu [E,I,r],
    Ad [E,r,I], Bd [E,H,r] (what the reference uses: the files, not the pool)."""
    from safetensors.numpy import save_file

    out = []
    for a, r in enumerate(adapter_ranks(S, r_max)):
        alpha = 2.0 * r
        w = {
            "Ag": rng.standard_normal((E, r, H), dtype=np.float32) / np.float32(math.sqrt(H)),
            "Bg": rng.standard_normal((E, I, r), dtype=np.float32) / np.float32(2 * math.sqrt(r)),
            "Au": rng.standard_normal((E, r, H), dtype=np.float32) / np.float32(math.sqrt(H)),
            "Bu": rng.standard_normal((E, I, r), dtype=np.float32) / np.float32(2 * math.sqrt(r)),
            "Ad": rng.standard_normal((E, r, I), dtype=np.float32) / np.float32(math.sqrt(I)),
            "Bd": rng.standard_normal((E, H, r), dtype=np.float32) / np.float32(2 * math.sqrt(r)),
        }
        t = {}
        for e in range(E):
            for proj, ka, kb in (("gate_proj", "Ag", "Bg"), ("up_proj", "Au", "Bu"),
                                 ("down_proj", "Ad", "Bd")):
                t[peft_name(0, e, proj, "A")] = np.ascontiguousarray(w[ka][e])
                t[peft_name(0, e, proj, "B")] = np.ascontiguousarray(w[kb][e])
        name = f"adapter{a}"
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": False,
                       "target_modules": ["gate_proj", "up_proj", "down_proj"]}, f)
        save_file(t, os.path.join(d, "adapter_model.safetensors"))
        out.append(dict(name=name, dir=d, r=r, scale=alpha / r, **w))
    return out


def make_model(H: int, I: int, E: int, rng: np.random.Generator) -> dict:
    return {
        "Wr": rng.standard_normal((E, H), dtype=np.float32) / np.float32(math.sqrt(H)),
        "Wg": rng.standard_normal((E, I, H), dtype=np.float32) / np.float32(math.sqrt(H)),
        "Wu": rng.standard_normal((E, I, H), dtype=np.float32) / np.float32(math.sqrt(H)),
        "Wd": rng.standard_normal((E, H, I), dtype=np.float32) / np.float32(math.sqrt(I)),
    }


def make_model_torch(H: int, I: int, E: int, seed: int) -> dict:
    """The base weights generated on the GPU in bf16 (the real shapes run to 22 GB)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(shape, fan_in):
        w = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
        return (w / math.sqrt(fan_in)).to(torch.bfloat16)

    return {"Wr": rnd((E, H), H), "Wg": rnd((E, I, H), H), "Wu": rnd((E, I, H), H),
            "Wd": rnd((E, H, I), I)}


def make_batch(T: int, H: int, S: int, none_frac: float, rng: np.random.Generator):
    x = rng.standard_normal((T, H), dtype=np.float32)
    which = rng.integers(0, S, T)
    none = rng.permutation(T)[:int(math.floor(none_frac * T + 0.5))]
    names: list = [f"adapter{int(a)}" for a in which]
    for t in none:
        names[int(t)] = None
    return x, names


def silu(a):
    return a / (1.0 + np.exp(-a))


def router_np(x, Wr, k):
    logits = x @ Wr.T
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=1)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    return ids, w


def reference_np(x, topk_ids, topk_w, names, model, adapters) -> np.ndarray:
    """The layer as a dense per-token loop in fp64, from the adapter files' weights (no molora)."""
    by_name = {a["name"]: a for a in adapters}
    T, k = topk_ids.shape
    H = x.shape[1]
    y = np.zeros((T, H), np.float64)
    f = np.float64
    for t in range(T):
        xt = x[t].astype(f)
        ad = by_name.get(names[t]) if names[t] else None
        for j in range(k):
            e = int(topk_ids[t, j])
            g = model["Wg"][e].astype(f) @ xt
            u = model["Wu"][e].astype(f) @ xt
            if ad is not None:
                g += ad["scale"] * (ad["Bg"][e].astype(f) @ (ad["Ag"][e].astype(f) @ xt))
                u += ad["scale"] * (ad["Bu"][e].astype(f) @ (ad["Au"][e].astype(f) @ xt))
            h = silu(g) * u
            o = model["Wd"][e].astype(f) @ h
            if ad is not None:
                o += ad["scale"] * (ad["Bd"][e].astype(f) @ (ad["Ad"][e].astype(f) @ h))
            y[t] += float(topk_w[t, j]) * o
    return y


def routing_stats(topk_ids, slots, ranks_list, E, top_k_view: int) -> dict:
    """RoutingStats of lora_plan for one call: gate/up see T tokens x k, down sees P rows x 1."""
    slots = np.asarray(slots)
    ids = np.asarray(topk_ids)
    act = slots >= 0
    r8 = {s: -(-r // 8) * 8 for s, r in enumerate(ranks_list)}
    pairs = [(int(s), int(e)) for s, row in zip(slots, ids) if s >= 0 for e in row]
    distinct = set(pairs)
    return {"active_pairs": len(pairs),
            "active_tokens": int(act.sum()) if top_k_view > 1 else len(pairs),
            "distinct_pairs": len(distinct),
            "distinct_rank8": sum(r8[s] for s, _ in distinct),
            "active_rank8": sum(r8[s] for s, _ in pairs)}


def lora_plans(args, T, H, I, E, k, S, r_max, topk_ids, slots, ranks_list, dtype, bw, sms):
    """lora_plan for the six LoRA calls: {row name: plan}."""
    routing = args.routing
    B = args.block_size if routing == "aligned" else 0
    common = dict(dtype=dtype, num_slots=S, num_experts=E, r_max=r_max, routing=routing,
                  block_size=B, bandwidth_gbps=bw, sm_count=sms)
    st_gu = routing_stats(topk_ids, slots, ranks_list, E, k)
    st_d = routing_stats(topk_ids, slots, ranks_list, E, 1)
    P = T * k
    out = {}
    for proj in ("gate", "up"):
        out[f"lora shrink {proj}"] = molora.lora_plan("shrink", num_tokens=T, top_k=k, K=H,
                                                      stats=st_gu, **common)
        out[f"lora expand {proj}"] = molora.lora_plan("expand", num_tokens=T, top_k=k, N=I,
                                                      stats=st_gu, **common)
    d = dict(common)
    if routing == "aligned":  # same layout: pair rows with top_k = 1
        d["sorted_len"] = P + S * E * (B - 1)
    out["lora shrink down"] = molora.lora_plan("shrink", num_tokens=P, top_k=1, K=I,
                                               stats=st_d, **d)
    out["lora expand down"] = molora.lora_plan("expand", num_tokens=P, top_k=1, N=H,
                                               stats=st_d, **d)
    return out


# ---- CPU path -------------------------------------------------------------------------------

def _lora_kwargs(args, topk_ids, slots, aligned, k):
    """Routing keyword/positional arguments of lora_shrink/lora_expand: (gate/up, down)."""
    if args.routing == "aligned":
        srt, eids, ntpp = aligned
        base = dict(sorted_token_ids=srt, expert_ids=eids, num_tokens_post_pad=ntpp,
                    block_size=args.block_size)
        return ((), dict(base, top_k=k)), ((), dict(base, top_k=1))
    P = topk_ids.size
    if isinstance(topk_ids, np.ndarray):
        down_ids = topk_ids.reshape(P, 1)
        down_slots = np.repeat(slots, k)
    else:
        down_ids = topk_ids.reshape(P, 1)
        down_slots = slots.repeat_interleave(k)
    return ((topk_ids, slots), {}), ((down_ids, down_slots), {})


def run_cpu(args, ctx) -> dict:
    T, H, I, E, k, S = ctx["T"], ctx["H"], ctx["I"], ctx["E"], ctx["k"], ctx["S"]
    model, x, pool, slots = ctx["model"], ctx["x"], ctx["pool"], ctx["slots"]
    v = pool.tensors(0)
    A_g, A_u = v["a_gate_up"][0], v["a_gate_up"][1]
    B_g, B_u = v["b_gate_up"][0], v["b_gate_up"][1]
    A_d, B_d = v["a_down"], v["b_down"]
    rank, scale = v["rank"], v["scale"]
    V = S * E
    P = T * k
    reps = args.reps or 3
    times: dict = {}
    st: dict = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        r = fn()
        times.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)
        return r

    def base_grouped(W, rows_in, row_of_pair, experts):
        """out[p] = W[experts[p]] @ rows_in[row_of_pair[p]], grouped by expert (reference)."""
        out = np.empty((P, W.shape[1]), np.float32)
        order = np.argsort(experts, kind="stable")
        uniq, starts = np.unique(experts[order], return_index=True)
        ends = list(starts[1:]) + [P]
        for e, a, b in zip(uniq, starts, ends):
            idx = order[a:b]
            out[idx] = rows_in[row_of_pair[idx]] @ W[e].T
        return out

    tok_of_pair = np.repeat(np.arange(T), k)
    for _ in range(reps):
        st["topk_ids"], st["topk_w"] = timed("router (softmax top-k)",
                                             lambda: router_np(x, model["Wr"], k))
        topk_ids = st["topk_ids"]
        aligned = timed("align (molora, V=S*E)", lambda: molora.moe_align_block_size(
            topk_ids, V, args.block_size, slot_ids=slots, num_base_experts=E))
        (gu_pos, gu_kw), (d_pos, d_kw) = _lora_kwargs(args, topk_ids, slots, aligned, k)
        experts = topk_ids.reshape(-1)
        gate = timed("base gate GEMM (ref)", lambda: base_grouped(model["Wg"], x, tok_of_pair,
                                                                  experts))
        up = timed("base up GEMM (ref)", lambda: base_grouped(model["Wu"], x, tok_of_pair,
                                                              experts))
        for proj, A, Bm, y, m in (("gate", A_g, B_g, gate, 0), ("up", A_u, B_u, up, 1)):
            t = timed(f"lora shrink {proj}", lambda: molora.lora_shrink(
                x, A, *gu_pos, ranks=rank[m], **gu_kw))
            timed(f"lora expand {proj}", lambda: molora.lora_expand(
                t, Bm, y, *gu_pos, ranks=rank[m], scales=scale[m], **gu_kw))
        h = timed("act silu(gate)*up", lambda: (silu(gate) * up).astype(np.float32))
        out_p = timed("base down GEMM (ref)", lambda: base_grouped(model["Wd"], h,
                                                                   np.arange(P), experts))
        td = timed("lora shrink down", lambda: molora.lora_shrink(h, A_d, *d_pos, ranks=rank[2],
                                                                   **d_kw))
        if args.perturb != "skip-down-lora":
            timed("lora expand down", lambda: molora.lora_expand(
                td, B_d, out_p, *d_pos, ranks=rank[2], scales=scale[2], **d_kw))
        y = timed("combine (weighted sum)", lambda: np.einsum(
            "tkh,tk->th", out_p.reshape(T, k, H), st["topk_w"]))
        timed("all-reduce (world 1: pass-through)", lambda: y)
        st["y"] = y
    y = st["y"]
    if args.perturb == "output":
        y = y.copy()
        y[0, 0] += 10 * TOL_CPU * float(np.abs(y).max()) + 1e-3
    ref = reference_np(x, st["topk_ids"], st["topk_w"], ctx["names"], model, ctx["adapters"])
    ctx["distinct_experts"] = int(np.unique(st["topk_ids"]).size)
    plans = lora_plans(args, T, H, I, E, k, S, ctx["r_max"], st["topk_ids"], slots,
                       ctx["ranks_list"], "f32", 0.0, 0)
    rows = []
    for name, ts in times.items():
        rows.append(dict(part=name, us=min(ts), bytes=part_bytes(name, ctx, plans, 4),
                         floor_us=plans[name]["floor_us"] if name in plans else None))
    total = sum(r["us"] for r in rows)
    return dict(device="cpu", y=y, ref=ref, tol=TOL_CPU, rows=rows, total_us=total,
                total_note="sum of parts (CPU references, no graph)", plans=plans)


def part_bytes(name: str, ctx: dict, plans: dict, esize: int) -> Optional[int]:
    """Bytes a part must move (LoRA: the plan's exact count; others: inputs + outputs, weights
    of the distinct routed experts)."""
    if name in plans:
        return int(plans[name]["bytes"])
    T, H, I, E, k, S = ctx["T"], ctx["H"], ctx["I"], ctx["E"], ctx["k"], ctx["S"]
    P = T * k
    ne = ctx.get("distinct_experts", E)
    if name.startswith("router"):
        return (T * H + E * H) * esize + P * 8
    if name.startswith("align"):
        B = ctx["block_size"]
        L = P + S * E * (B - 1)
        return P * 4 + T * 4 + (L + -(-L // B) + 1) * 4
    if "gate GEMM" in name or "up GEMM" in name:
        return (ne * I * H + T * H + P * I) * esize
    if "down GEMM" in name:
        return (ne * H * I + P * I + P * H) * esize
    if name.startswith("act"):
        return 3 * P * I * esize
    if name.startswith("combine"):
        return (P * H + T * H) * esize + P * 4
    return 0


# ---- GPU path -------------------------------------------------------------------------------

def _torch_align(vids, V, B):
    """Torch-only moe_align_block_size (argsort/bincount/cumsum, as engines fall back to; the
    same as bench/align_torch.py). vids int [T, k] of virtual ids, -1 = no bucket."""
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


def _triton_kernels():
    """(shrink, expand) Triton kernels of the fused_moe structure, or (None, reason)."""
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
        # as bench/lora_triton.py: one program per (block of pairs, BLOCK_N output columns)
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


def _copy_gbps(torch) -> float:
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 20 / (e0.elapsed_time(e1) * 1e-3) / 1e9


def _capture(torch, fn, stream):
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


def _time_graph(torch, g, reps) -> float:
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
        ("lora shrink gate", mk_shrink(x, A_g, b["t_g"], 0, k)),
        ("lora expand gate", mk_expand(b["t_g"], B_g, b["gate"], 0, k)),
        ("lora shrink up", mk_shrink(x, A_u, b["t_u"], 1, k)),
        ("lora expand up", mk_expand(b["t_u"], B_u, b["up"], 1, k)),
        ("act silu(gate)*up", p_act),
        ("base down GEMM (ref)", p_base_down),
        ("lora shrink down", mk_shrink(b["h"], A_d, b["t_d"], 2, 1)),
        ("lora expand down", mk_expand(b["t_d"], B_d, b["out_p"], 2, 1)),
        ("combine (weighted sum)", p_combine),
    ]
    if args.perturb == "skip-down-lora":
        parts = [p for p in parts if p[0] != "lora expand down"]

    def step():
        for _, fn in parts:
            fn()

    stream = torch.cuda.Stream()
    bw = _copy_gbps(torch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g_step = _capture(torch, step, stream)
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
        us = _time_graph(torch, _capture(torch, fn, stream), reps)
        fl = plans[name]["floor_us"] if name in plans else None
        rows.append(dict(part=name, us=us, bytes=part_bytes(name, ctx, plans, 2), floor_us=fl))
    rows.append(dict(part="all-reduce (world 1: pass-through)", us=0.0, bytes=0, floor_us=None))
    total = _time_graph(torch, g_step, reps)
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
        _torch_align(vids(), V, 64)
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        al64 = _torch_align(vids(), V, 64)
    torch.cuda.synchronize()
    out["align (molora, V=S*E)"] = (time.perf_counter() - t0) * 1e6 / n
    out["note"].append("align: torch-only (argsort/bincount/cumsum), eager wall time, B=64")
    kern, why = _triton_kernels()
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
    # the baseline step (eager align outside, everything else in order), checked like molora's
    ordered = [(nm, tri.get(nm, fn)) for nm, fn in parts if nm != "align (molora, V=S*E)"]
    for nm, fn in ordered:
        fn()
    torch.cuda.synchronize()
    yb = b["y"].float().cpu().numpy()
    out["max_err"] = float(np.abs(yb - ref).max() / max(np.abs(ref).max(), 1e-30))
    step = [fn for _, fn in ordered]
    g = _capture(torch, lambda: [f() for f in step], stream)
    out["total_graph_us"] = _time_graph(torch, g, reps)
    for nm, fn in tri.items():
        out[nm] = _time_graph(torch, _capture(torch, fn, stream), reps)
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


def find_cli() -> Optional[str]:
    """The molora CLI: $MOLORA_CLI, the build tree this package sits in (<build>/python/molora
    or <build>/py/python/molora -> <build>/src/cli/molora), else `molora` on PATH."""
    env = os.environ.get("MOLORA_CLI")
    if env and os.access(env, os.X_OK):
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # <build>/python/molora, or tools/gpu-check's <build>/py/python/molora
    for up in (("..", ".."), ("..", "..", "..")):
        cand = os.path.normpath(os.path.join(here, *up, "src", "cli", "molora"))
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("molora")


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


# ---- driver ---------------------------------------------------------------------------------

def gpu_available() -> tuple:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    if molora.gpu_count() == 0:
        return False, "this molora build has no usable GPU (CPU-only build or no device)"
    return True, ""


def setup(args, device: str, tmp: str) -> dict:
    H, I, E, k = SHAPES[args.shape]
    T, S, r_max = args.tokens, args.slots, args.rank
    if args.world != 1:
        raise SystemExit("molora demo: --world > 1 is not implemented yet (the all-reduce of a "
                         "single rank is a pass-through); run with --world 1")
    rng = np.random.default_rng(args.seed)
    model = make_model(H, I, E, rng) if device == "cpu" else make_model_torch(H, I, E, args.seed)
    adapters = write_adapters(tmp, S, E, H, I, r_max, rng)
    x, names = make_batch(T, H, S, args.no_adapter, rng)
    pool = molora.AdapterPool(S, 1, E, H, I, r_max,
                              dtype="float32" if device == "cpu" else "bfloat16",
                              device="cpu" if device == "cpu" else "cuda")
    for a in adapters:
        pool.load(a["name"], a["dir"])
    slots = pool.prepare(names)
    ctx = dict(T=T, H=H, I=I, E=E, k=k, S=S, r_max=r_max, model=model, adapters=adapters,
               x=x, names=names, pool=pool, slots=slots, block_size=args.block_size,
               ranks_list=[0] * S)
    for a in adapters:  # per slot rank, for the plans' byte counts
        if pool.slot_of(a["name"]) >= 0:
            ctx["ranks_list"][pool.slot_of(a["name"])] = a["r"]
    if device != "cpu":
        import torch
        ctx["x_dev"] = torch.from_numpy(x).to("cuda", torch.bfloat16)
    return ctx


def run(argv=None) -> dict:
    """Runs the demo and returns the result (``ok``, ``max_err``, ``tol``, ``rows``, ...);
    prints nothing. :func:`main` prints it."""
    args = parse_args(argv)
    want = args.device
    ok_gpu, why = gpu_available() if want != "cpu" else (False, "--device cpu")
    if want == "cuda" and not ok_gpu:
        raise SystemExit(f"molora demo: --device cuda: {why}")
    device = "cuda" if ok_gpu else "cpu"
    tmp = args.keep_adapters or tempfile.mkdtemp(prefix="molora-demo-")
    try:
        ctx = setup(args, device, tmp)
        res = run_gpu(args, ctx) if device == "cuda" else run_cpu(args, ctx)
    finally:
        if not args.keep_adapters:
            shutil.rmtree(tmp, ignore_errors=True)
    y, ref = np.asarray(res["y"], np.float64), res["ref"]
    scale = max(float(np.abs(ref).max()), 1e-30)
    res["max_err"] = float(np.abs(y - ref).max()) / scale
    res["ok"] = bool(res["max_err"] <= res["tol"] and np.isfinite(y).all())
    res["gpu_reason"] = why
    res["args"] = vars(args)
    res["shape"] = dict(zip(("H", "I", "E", "k"), SHAPES[args.shape]),
                        T=args.tokens, S=args.slots, r_max=args.rank)
    res["no_adapter_tokens"] = sum(1 for n in ctx["names"] if n is None)
    return res


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def format_table(res: dict) -> str:
    sh = res["shape"]
    a = res["args"]
    lines = [f"molora demo: {a['shape']} H={sh['H']} I={sh['I']} E={sh['E']} top-{sh['k']}, "
             f"T={sh['T']} tokens ({res['no_adapter_tokens']} without adapter), S={sh['S']} "
             f"slots r_max={sh['r_max']}, V={sh['S'] * sh['E']} virtual experts, "
             f"{a['routing']} routing B={a['block_size']}, world 1",
             f"device: {res['device']}" + ("" if res["device"] != "cpu" else
                                           f" (GPU path not taken: {res['gpu_reason']})")]
    base = res.get("baseline")
    hdr = f"{'part':36s} {'us':>10s} {'bytes':>10s} {'floor us':>9s} {'% floor':>8s}"
    if base is not None:
        hdr += f" {'baseline us':>12s}"
    lines += ["", hdr]
    for r in res["rows"]:
        pct = "-"
        if r["floor_us"] is not None and res["device"] != "cpu" and r["us"] > 0:
            pct = f"{100 * r['floor_us'] / r['us']:.0f}%"
        fl = f"{r['floor_us']:.2f}" if r["floor_us"] is not None else "-"
        line = f"{r['part']:36s} {r['us']:10.1f} {_fmt_bytes(r['bytes']):>10s} {fl:>9s} {pct:>8s}"
        if base is not None:
            bv = base.get(r["part"])
            line += f" {bv:12.1f}" if isinstance(bv, float) else f" {'(same)':>12s}"
        lines.append(line)
    tl = f"{'total':36s} {res['total_us']:10.1f}"
    if base is not None and "total_graph_us" in base:
        btot = base["total_graph_us"] + base["align (molora, V=S*E)"]
        tl += f" {'':10s} {'':9s} {'':8s} {btot:12.1f}"
    lines.append(tl + f"   ({res['total_note']})")
    notes = ["base GEMMs are a plain reference (numpy grouped by expert / torch bmm over all E), "
             "not molora's product; all-reduce: world 1, a pass-through"]
    if res["device"] == "cpu":
        notes.append("CPU: molora runs its fp64 CPU references; floors are at 4300 GB/s (H200), "
                     "% floor is shown on the GPU only")
    else:
        notes.append(f"floors at the measured copy bandwidth {res['copy_gbps']:.0f} GB/s")
    if base is not None:
        notes += base["note"]
        if "total_graph_us" in base:
            notes.append(f"baseline total = its graph ({base['total_graph_us']:.1f} us) + eager "
                         f"torch align; baseline max err {base['max_err']:.2e}")
    lines += [""] + [f"note: {n}" for n in notes]
    lines.append(f"check: max|y - ref| / max|ref| = {res['max_err']:.2e} (tol {res['tol']:.0e}) "
                 f"{'PASS' if res['ok'] else 'FAIL'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.profile:
        ok_gpu, why = gpu_available() if args.device != "cpu" else (False, "--device cpu")
        if not ok_gpu:
            print(f"molora demo: --profile needs a GPU ({why}); running without profiling")
    res = run(argv)
    print(format_table(res))
    prof = res.get("profile")
    if prof is not None:
        print(f"\nprofile: {prof['trace']}")
        if prof.get("summary") is None:
            print(prof["note"])
        else:
            print(f"$ {prof['cli']} prof summary {prof['trace']}\n{prof['summary']}")
    if args.json:
        doc = {k_: v_ for k_, v_ in res.items() if k_ not in ("y", "ref")}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
