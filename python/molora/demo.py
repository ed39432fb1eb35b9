"""One MoE multi-LoRA decode layer through molora, end to end: ``python -m molora.demo``.

What one step does (docs/integration.md explains each call):

1. router: ``softmax(x @ W_r^T)``, top-k, weights renormalised (Qwen3 ``norm_topk_prob``);
2. align: :func:`molora.moe_align_block_size` over the ``V = S*E`` virtual experts
   (``v = slot*E + expert``; tokens with slot -1 go to no bucket);
3. base expert GEMMs gate/up (a plain reference: numpy grouped by expert on the CPU, torch
   ``bmm`` over all E experts on the GPU — the base MoE GEMM is not molora's product);
4. :func:`molora.lora_moe_delta` for gate and up (in place on the base outputs; up's call with
   ``after_delta``), ``silu(gate) * up``, base down GEMM, the delta for down (``top_k = 1``
   over the pair rows); ``--lora-call pair`` runs :func:`molora.lora_shrink` then
   :func:`molora.lora_expand` apart instead (the same bits, one row each in the table);
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
    p.add_argument("--lora-call", default="delta", choices=("delta", "pair"),
                   help="LoRA per projection: one lora_moe_delta call (default) or lora_shrink "
                   "then lora_expand (the same bits)")
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
                   help="testing: make the molora path wrong on purpose (skip the down LoRA: "
                   "its expand, or its whole delta; or disturb one output element) to show the "
                   "check fails")
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
    for proj in ("gate", "up", "down"):  # lora_moe_delta: the pair's bytes and floors together
        sh, ex = out[f"lora shrink {proj}"], out[f"lora expand {proj}"]
        out[f"lora delta {proj}"] = dict(bytes=sh["bytes"] + ex["bytes"],
                                         floor_us=sh["floor_us"] + ex["floor_us"],
                                         shrink=sh, expand=ex)
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

    def lora(proj, xin, A, Bm, y, m, pos, kw, skip_expand=False):
        """One projection's LoRA: one delta call, or shrink then expand (--lora-call);
        skip_expand (--perturb skip-down-lora) leaves out its expand (the whole delta)."""
        if args.lora_call == "delta":
            if not skip_expand:
                timed(f"lora delta {proj}", lambda: molora.lora_moe_delta(
                    xin, A, Bm, y, *pos, ranks=rank[m], scales=scale[m], **kw))
            return
        t = timed(f"lora shrink {proj}", lambda: molora.lora_shrink(
            xin, A, *pos, ranks=rank[m], **kw))
        if not skip_expand:
            timed(f"lora expand {proj}", lambda: molora.lora_expand(
                t, Bm, y, *pos, ranks=rank[m], scales=scale[m], **kw))

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
        lora("gate", x, A_g, B_g, gate, 0, gu_pos, gu_kw)
        lora("up", x, A_u, B_u, up, 1, gu_pos, gu_kw)
        h = timed("act silu(gate)*up", lambda: (silu(gate) * up).astype(np.float32))
        out_p = timed("base down GEMM (ref)", lambda: base_grouped(model["Wd"], h,
                                                                   np.arange(P), experts))
        lora("down", h, A_d, B_d, out_p, 2, d_pos, d_kw,
             skip_expand=args.perturb == "skip-down-lora")
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
        if device == "cuda":
            from ._demo_gpu import run_gpu  # (torch and triton are imported there, when used)

            res = run_gpu(args, ctx)
        else:
            res = run_cpu(args, ctx)
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
             f"{a['routing']} routing B={a['block_size']}, LoRA as "
             f"{'lora_moe_delta' if a['lora_call'] == 'delta' else 'shrink + expand'}, world 1",
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
