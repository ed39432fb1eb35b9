"""The all-reduce across processes, one per GPU: correctness, faults and speed beside NCCL.

``python3 -m molora.comm_multi`` (or ``tools/comm-multi``) starts one process per rank (spawned
with multiprocessing); the ranks meet in a gloo group (which carries molora's IPC handles and the
script's own checks) and, with one GPU per rank, an NCCL group for the baseline. Per world size:

1. **correctness** — sizes 16 B to 16 MiB, bf16 and fp16, algorithms auto / one-shot / two-shot:
   every rank's output against the CPU reference (``all_reduce_reference``) and against every
   other rank's (a digest of the output bits, all-gathered), inputs drawn from a fresh seed;
2. **graph replay** — one all-reduce captured in a CUDA graph and replayed ``--iters`` times
   (default 10,000) with new inputs each time (``base_r + i * step_r``, made on the device), each
   replay compared bit for bit with the rank-order fp32 sum made on the device (itself checked
   against the CPU reference); the fused residual + RMSNorm call likewise, with the CPU
   reference taken every ``--ref-every`` replays; every replay's output hash compared across
   ranks;
3. **faults** (world >= 2) — the last rank is late: the others' wait ends within the deadline +
   10% (``TimeoutError`` from ``check()``), the late rank's call ends at once and raises too, and
   the next call of every rank runs on NCCL and is exact; a mismatched call order gives
   ``RuntimeError`` (Mismatch) on every rank, well before the deadline;
4. **speed** — 1 KB to 16 MB: molora one-shot, two-shot and auto against ``ncclAllReduce``
   (called directly), the same on symmetric windows, and torch.distributed's all_reduce, each a
   CUDA graph of ``--calls`` calls replayed ``--reps`` times, median per call (the slowest
   rank's), and bus bandwidth ``2 (w - 1) / w * bytes / time``.

The table is printed last, with the issue's targets (world 8 at <= 256 KB: 2x lower latency than
ncclAllReduce and no slower than its symmetric kernels; >= 4 MB: bus bandwidth >= NCCL's).
``--share-gpu`` runs every rank on GPU 0 (a rehearsal on a one-GPU machine: molora's path across
processes is real, the times are not NVLink's, and NCCL, which needs one GPU per rank, is left
out and said so). World 1 runs too: molora falls back to NCCL (reason ``world_size``), counted.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the like are set before torch loads). Exit
status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

# Multicast off in this process and every rank it starts (they inherit the environment).
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}

CHECK_SIZES = [16 << (2 * i) for i in range(11)]     # 16 B .. 16 MiB
SPEED_SIZES = [1024 << (2 * i) for i in range(8)]    # 1 KB .. 16 MB
ALGOS = ("auto", "oneshot", "twoshot")


# ---- pure helpers (tested on the CPU: tests/python/test_comm_multi.py) --------------------------

def parse_worlds(text: str) -> List[int]:
    """'2,4,8' -> [2, 4, 8]; each world in 1..8, no repeats, in the order given."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            w = int(part)
        except ValueError:
            raise ValueError(f"--worlds: {part!r} is not an integer") from None
        if not 1 <= w <= 8:
            raise ValueError(f"--worlds: {w} is outside 1..8")
        if w in out:
            raise ValueError(f"--worlds: {w} is listed twice")
        out.append(w)
    if not out:
        raise ValueError("--worlds: no world size given")
    return out


def plan_worlds(requested: Optional[Sequence[int]], gpus: int, share_gpu: bool) -> Dict[str, Any]:
    """Which worlds run, and which are left out and why. Without ``requested``: 2, 4 and 8 up to
    the GPUs there are (one GPU: world 1, the NCCL fallback, only; ask --share-gpu for more)."""
    if gpus < 1:
        return {"run": [], "skipped": {}, "error": "no CUDA device"}
    if requested is None:
        requested = [w for w in (2, 4, 8) if share_gpu or w <= gpus] or [1]
    run, skipped = [], {}
    for w in requested:
        if w > gpus and not share_gpu:
            skipped[w] = f"needs {w} GPUs, this machine has {gpus} (--share-gpu rehearses on one)"
        else:
            run.append(w)
    return {"run": run, "skipped": skipped, "error": None}


def bus_gbps(nbytes: int, world: int, us: float) -> float:
    """NCCL's bus bandwidth of an all-reduce: 2 (w - 1) / w * bytes / time (GB/s)."""
    if world < 2 or us <= 0:
        return 0.0
    return 2.0 * (world - 1) / world * nbytes / (us * 1e-6) / 1e9


def fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def judge_targets(world: int, rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The issue's targets for one world from the speed rows ({bytes, molora_us, molora_gbps,
    nccl_us, nccl_gbps, symm_us}; None where that baseline did not run): world 8 at <= 256 KiB
    2x lower latency than ncclAllReduce and no slower than NCCL's symmetric kernels; >= 4 MiB
    bus bandwidth >= NCCL's (judged on the times: at one size they order as the bandwidths do;
    not judged for world 1, where bus bandwidth is 0). Lines 'TARGET ... MET/MISSED'."""
    lines = []
    small = [r for r in rows if r["bytes"] <= 256 * 1024 and r.get("nccl_us")]
    large = [r for r in rows if r["bytes"] >= 4 << 20 and r.get("nccl_us")]
    if world == 8 and small:
        worst = max(small, key=lambda r: r["molora_us"] / r["nccl_us"])
        ratio = worst["nccl_us"] / worst["molora_us"]
        lines.append(f"TARGET world 8 <= 256 KiB: >= 2x lower latency than NCCL: worst "
                     f"{ratio:.2f}x at {fmt_bytes(worst['bytes'])} "
                     f"{'MET' if ratio >= 2 else 'MISSED'}")
        sym = [r for r in small if r.get("symm_us")]
        if sym:
            worst = max(sym, key=lambda r: r["molora_us"] / r["symm_us"])
            ok = worst["molora_us"] <= worst["symm_us"]
            lines.append(f"TARGET world 8 <= 256 KiB: no slower than NCCL's symmetric kernels: "
                         f"worst {worst['molora_us']:.2f} vs {worst['symm_us']:.2f} us at "
                         f"{fmt_bytes(worst['bytes'])} {'MET' if ok else 'MISSED'}")
    if large and world >= 2:  # one size, so bus bandwidth >= NCCL's is time <= NCCL's
        worst = max(large, key=lambda r: r["molora_us"] / r["nccl_us"])
        ok = worst["molora_us"] <= worst["nccl_us"]
        lines.append(f"TARGET world {world} >= 4 MiB: bus bandwidth >= NCCL's: worst "
                     f"{worst['molora_gbps']:.0f} vs {worst['nccl_gbps']:.0f} GB/s at "
                     f"{fmt_bytes(worst['bytes'])} {'MET' if ok else 'MISSED'}")
    return lines


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


# ---- one rank -------------------------------------------------------------------------------

class _Rank:
    def __init__(self, rank: int, world: int, args: Any, init: str):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world, self.args = rank, world, args
        self.device = 0 if args.share_gpu else rank
        torch.cuda.set_device(self.device)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        self.use_nccl = not args.share_gpu
        self.nccl = dist.new_group(backend="nccl") if self.use_nccl else None
        self.failures: List[str] = []
        self.report: Dict[str, Any] = {"world": world, "rank": rank}
        self._weights: Dict[int, Any] = {}  # bits_hash's position weights, per size

    # helpers
    def gather(self, obj: Any) -> List[Any]:
        out: List[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def make_comm(self, **kw: Any) -> Any:
        from molora import comm
        return comm.Communicator.from_process_group(None, create_nccl=self.use_nccl, **kw)

    def bits(self, t: Any) -> Any:
        return t.view(self.torch.int16)

    def bits_hash(self, *ts: Any) -> Any:
        """A device int64 of the tensors' bits (position-weighted), compared across ranks."""
        torch = self.torch
        h = torch.zeros((), dtype=torch.int64, device="cuda")
        for j, t in enumerate(ts):
            b = self.bits(t).reshape(-1).to(torch.int64)
            w = self._weights.get(b.numel())
            if w is None:  # made once per size, not per replay
                w = self._weights[b.numel()] = torch.arange(1, b.numel() + 1, device="cuda")
            h += (b * w).sum() * (2 * j + 1)
        return h

    def ranks_agree(self, hashes: Any) -> bool:
        """Every rank's per-replay hashes are the same (a digest of them, all-gathered)."""
        return len(set(self.gather(digest(hashes.cpu().numpy().tobytes())))) == 1

    @staticmethod
    def rank_order_sum(x: Any, dtype: Any) -> Any:
        """The specification on the device: x [world, n] summed in fp32 in rank order, rounded
        once to dtype (checked against the CPU reference before it is trusted)."""
        acc = x[0].float()
        for r in range(1, x.shape[0]):
            acc += x[r].float()
        return acc.to(dtype)

    # 1. correctness, eager
    def correctness(self, seed: int) -> None:
        torch = self.torch
        from molora import comm as mc
        c = self.make_comm(timeout_ms=self.args.timeout_ms)
        cases = bad = 0
        paths: Dict[str, int] = {}
        for di, dtype in enumerate((torch.bfloat16, torch.float16)):
            for ai, algo in enumerate(ALGOS):
                c.set_algo(algo)
                for si, nbytes in enumerate(CHECK_SIZES):
                    n = nbytes // 2
                    g = torch.Generator().manual_seed(seed * 1000 + di * 100 + ai * 20 + si)
                    ins = [torch.randn(n, generator=g).to(dtype) for _ in range(self.world)]
                    want = mc.all_reduce_reference(ins)
                    before = c.stats()
                    out = c.all_reduce(ins[self.rank].cuda())
                    torch.cuda.synchronize()
                    c.check()
                    after = c.stats()
                    path = ("p2p" if after["p2p_calls"] > before["p2p_calls"] else
                            "nccl" if after["nccl_calls"] > before["nccl_calls"] else "other")
                    paths[path] = paths.get(path, 0) + 1
                    got = out.cpu()
                    cases += 1
                    name = f"{str(dtype)[6:]} {algo} {fmt_bytes(nbytes)}"
                    if not torch.equal(self.bits(got), self.bits(want)):
                        bad += 1
                        self.fail(f"correctness {name}: differs from the CPU reference")
                    ds = self.gather(digest(self.bits(got).numpy().tobytes()))
                    if len(set(ds)) != 1:
                        bad += 1
                        self.fail(f"correctness {name}: ranks' outputs differ ({ds})")
        self.report["correctness"] = {"cases": cases, "failed": bad, "paths": paths,
                                      "stats": c.stats()}
        self.quiesce()

    # 2. graph replay with changing inputs
    def graph_replay(self, seed: int) -> None:
        torch = self.torch
        from molora import comm as mc
        iters = self.args.iters
        c = self.make_comm(timeout_ms=max(self.args.timeout_ms, 10000))
        out: Dict[str, Any] = {}
        for dtype in (torch.bfloat16, torch.float16):
            for n in (self.args.graph_numel, self.args.graph_numel_large):
                g = torch.Generator(device="cuda").manual_seed(seed + n)
                base = torch.randn(self.world, n, generator=g, device="cuda")
                step = torch.randn(self.world, n, generator=g, device="cuda") * 1e-3

                def inputs(i: int) -> Any:
                    return (base + step * float(i)).to(dtype)  # [world, n], same on every rank

                xin = torch.empty(n, dtype=dtype, device="cuda")
                xout = torch.empty(n, dtype=dtype, device="cuda")
                # the device reference against the CPU one, at the first and the last input
                for i in (0, iters - 1):
                    x = inputs(i)
                    cpu = mc.all_reduce_reference(list(x.cpu()))
                    if not torch.equal(self.bits(self.rank_order_sum(x, dtype).cpu()),
                                       self.bits(cpu)):
                        self.fail(f"graph {str(dtype)[6:]} n={n}: the device reference differs "
                                  f"from the CPU one at input {i}")
                xin.copy_(inputs(0)[self.rank])
                c.all_reduce(xin, out=xout)  # warm up outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    c.all_reduce(xin, out=xout)
                torch.cuda.synchronize()
                self.dist.barrier()
                mism = torch.zeros((), dtype=torch.int64, device="cuda")
                hashes = torch.zeros(iters, dtype=torch.int64, device="cuda")
                t0 = time.perf_counter()
                for i in range(iters):
                    x = inputs(i)
                    xin.copy_(x[self.rank])
                    graph.replay()
                    mism += (self.bits(xout) != self.bits(self.rank_order_sum(x, dtype))).sum()
                    hashes[i] = self.bits_hash(xout)
                torch.cuda.synchronize()
                secs = time.perf_counter() - t0
                c.check()
                m = int(mism.item())
                agree = self.ranks_agree(hashes)
                key = f"{str(dtype)[6:]} {fmt_bytes(n * 2)}"
                if m:
                    self.fail(f"graph {key}: {m} elements differ from the reference over "
                              f"{iters} replays")
                if not agree:
                    self.fail(f"graph {key}: the ranks' per-replay output hashes differ")
                out[key] = {"replays": iters, "mismatches": m, "seconds": round(secs, 2),
                            "ranks_agree_every_replay": agree}
                del graph
        out["rmsnorm"] = self._graph_rmsnorm(c, seed)
        self.report["graph"] = out
        self.quiesce()

    def _graph_rmsnorm(self, c: Any, seed: int) -> Dict[str, Any]:
        torch = self.torch
        from molora import comm as mc
        rows, hidden, eps = self.args.rms_rows, self.args.rms_hidden, 1e-6
        dtype = torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(seed + 7)
        base = torch.randn(self.world, rows, hidden, generator=g, device="cuda")
        step = torch.randn(self.world, rows, hidden, generator=g, device="cuda") * 1e-3
        rbase = torch.randn(rows, hidden, generator=g, device="cuda")
        weight = (torch.rand(hidden, generator=g, device="cuda") + 0.5).to(dtype)
        xin = torch.empty(rows, hidden, dtype=dtype, device="cuda")
        res = torch.empty(rows, hidden, dtype=dtype, device="cuda")
        out = torch.empty(rows, hidden, dtype=dtype, device="cuda")

        def load(i: int) -> Any:
            x = (base + step * float(i)).to(dtype)
            xin.copy_(x[self.rank])
            res.copy_((rbase + step[0] * float(i)).to(dtype))
            return x

        before = c.stats()["fused_calls"]
        load(0)
        c.all_reduce_residual_rmsnorm(xin, res, weight, eps, out=out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            c.all_reduce_residual_rmsnorm(xin, res, weight, eps, out=out)
        torch.cuda.synchronize()
        self.dist.barrier()
        iters, every = self.args.iters, self.args.ref_every
        hashes = torch.zeros(iters, dtype=torch.int64, device="cuda")
        checked = bad = 0
        for i in range(iters):
            x = load(i)
            r0 = res.clone() if (i % every == 0 or i == iters - 1) else None
            graph.replay()
            hashes[i] = self.bits_hash(out, res)
            if r0 is not None:
                rr = r0.cpu()
                want = mc.all_reduce_residual_rmsnorm_reference(list(x.cpu()), rr, weight.cpu(),
                                                                eps)
                checked += 1
                # the residual (an fp32 sum rounded once) is bit-exact; the normalised output
                # goes through the device's rsqrt, so it is held to 1/128 relative (one bf16
                # ulp), as tests/python/test_comm.py holds the fused call
                close = torch.allclose(out.cpu().float(), want.float(), rtol=1 / 128, atol=0)
                if not (close and torch.equal(self.bits(res.cpu()), self.bits(rr))):
                    bad += 1
        torch.cuda.synchronize()
        c.check()
        agree = self.ranks_agree(hashes)
        fused = c.stats()["fused_calls"] - before
        if bad:
            self.fail(f"graph rmsnorm: {bad} of {checked} checked replays differ from the CPU "
                      f"reference")
        if not agree:
            self.fail("graph rmsnorm: the ranks' per-replay output hashes differ")
        del graph
        return {"replays": iters, "checked_against_cpu": checked, "mismatched": bad,
                "ranks_agree_every_replay": agree, "fused_calls": fused,
                "shape": [rows, hidden]}

    # 3. faults
    def quiesce(self) -> None:
        """Every rank's calls have finished: only then may a communicator be released (its
        peers map its buffer)."""
        self.torch.cuda.synchronize()
        self.dist.barrier()

    def faults(self, seed: int) -> None:
        torch = self.torch
        from molora import comm as mc
        rep: Dict[str, Any] = {}
        deadline = self.args.fault_timeout_ms
        c = self.make_comm(timeout_ms=deadline)
        x = torch.randn(4096, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        x = x.cuda()  # once: no host copy inside the timed waits below
        c.all_reduce(x)  # one good call first
        torch.cuda.synchronize()
        c.check()
        self.dist.barrier()
        # The last rank is late: the others' wait ends at the deadline (TimeoutError from
        # check()); the late rank's call, made after that, ends at once (its peers told it) and
        # its check() raises too. Then every rank's next call runs on NCCL.
        late = self.world - 1
        got_err = None
        t0 = time.perf_counter()
        if self.rank != late:
            c.all_reduce(x)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if self.rank != late:
            limit = deadline * 1.1 + 20  # + launch and synchronisation
            if ms > limit or ms < deadline * 0.99:
                self.fail(f"fault late rank: rank {self.rank} waited {ms:.1f} ms, deadline "
                          f"{deadline} ms (+10% = {deadline * 1.1:.0f})")
        self.dist.barrier()  # every waiting rank has given up
        if self.rank == late:
            t0 = time.perf_counter()
            c.all_reduce(x)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            if ms > 50:
                self.fail(f"fault late rank: its late call took {ms:.1f} ms (not told at once)")
        try:
            c.check()
        except Exception as e:
            got_err = f"{type(e).__name__}: {e}"
        if got_err is None or not got_err.startswith("TimeoutError"):
            self.fail(f"fault late rank: rank {self.rank} got {got_err!r}, not TimeoutError")
        rep["late_rank"] = {"deadline_ms": deadline, "ms": round(ms, 1), "error": got_err}
        self.dist.barrier()
        if self.use_nccl:
            ins = [torch.randn(8192, generator=torch.Generator().manual_seed(seed + r))
                   .to(torch.bfloat16) for r in range(self.world)]
            before = c.stats()
            try:
                out = c.all_reduce(ins[self.rank].cuda())
                torch.cuda.synchronize()
                after = c.stats()
                ok = torch.equal(self.bits(out.cpu()), self.bits(mc.all_reduce_reference(ins)))
                on_nccl = after["nccl_calls"] == before["nccl_calls"] + 1
                if not (ok and on_nccl):
                    self.fail(f"fault continue: exact={ok}, on NCCL={on_nccl}")
                rep["continue_on_nccl"] = {"exact": ok, "on_nccl": on_nccl,
                                           "fallback": {k: v for k, v in after["fallback"].items()
                                                        if v}}
            except Exception as e:
                self.fail(f"fault continue: {type(e).__name__}: {e}")
        else:
            rep["continue_on_nccl"] = "not run: ranks share one GPU, so there is no NCCL"
        self.quiesce()
        # Mismatched call order (a fresh communicator): rank 0 calls another size.
        c = self.make_comm(timeout_ms=max(deadline, 1000))
        c.set_algo("oneshot")
        n = 4096 if self.rank == 0 else 8192
        t0 = time.perf_counter()
        c.all_reduce(torch.ones(n, dtype=torch.bfloat16, device="cuda"))
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        err = None
        try:
            c.check()
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        if err is None or "mismatch" not in err.lower():
            self.fail(f"fault mismatch: rank {self.rank} got {err!r}")
        elif ms > max(deadline, 1000) * 0.5:
            self.fail(f"fault mismatch: found after {ms:.1f} ms, not before the deadline")
        rep["mismatch"] = {"error": err, "ms": round(ms, 1)}
        self.report["faults"] = rep
        self.quiesce()

    # 4. speed
    def _time_graph(self, fn: Any, eager_ok: bool = False) -> Any:
        """The slowest rank's median µs per call over --reps replays of a graph of --calls calls
        of fn, and how it was timed ("graph"; "eager" when the capture failed and eager_ok:
        --calls eager calls between two events instead; "empty" when the capture held no work)."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        how, graph = "graph", torch.cuda.CUDAGraph()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph):
                    for _ in range(self.args.calls):
                        fn()
            # torch warns when a capture holds no work (torch.distributed at world 1 does none)
            if any("Graph is empty" in str(w.message) for w in caught):
                how = "empty"
        except Exception:
            if not eager_ok:
                raise
            how, graph = "eager", None
            torch.cuda.synchronize()
        run = graph.replay if graph is not None else (
            lambda: [fn() for _ in range(self.args.calls)])
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        # every rank must have timed it the same way (an NCCL capture that failed on one rank)
        if len(set(self.gather(how))) != 1:
            raise RuntimeError("ranks timed the call differently (a capture failed on some)")
        times = []
        for _ in range(self.args.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3 / self.args.calls)
        del graph
        return max(self.gather(statistics.median(times))), how

    def speed(self) -> None:
        torch = self.torch
        c = self.make_comm(timeout_ms=max(self.args.timeout_ms, 10000))
        notes: Dict[str, str] = {}
        nd = symm = None
        if self.use_nccl:
            try:
                nd = _NcclDirect(self.rank, self.world, lambda o: self.gather(o)[0])
                notes["nccl_version"] = str(nd.version)
            except Exception as e:
                notes["nccl"] = f"direct NCCL not run: {e}"
            if nd is not None:
                try:
                    symm, err = nd.symmetric(max(SPEED_SIZES)), None
                except Exception as e:
                    symm, err = None, f"{type(e).__name__}: {e}"
                if not all(self.gather(symm is not None)):  # every rank or none
                    symm = None
                    notes["nccl_symm"] = f"symmetric windows not run: {err or 'failed on a peer'}"
        else:
            notes["nccl"] = "not run: ranks share one GPU (NCCL needs one GPU per rank)"
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        rows = []
        for nbytes in SPEED_SIZES:
            n = nbytes // 2
            x = torch.randn(n, device="cuda").to(torch.bfloat16) * 1e-3
            out = torch.empty_like(x)
            row: Dict[str, Any] = {"bytes": nbytes}
            for algo in ALGOS:
                c.set_algo(algo)
                before = c.stats()["p2p_calls"]
                row[f"{algo}_us"], how = self._time_graph(lambda: c.all_reduce(x, out=out))
                if how == "empty":
                    self.fail(f"speed {algo} {fmt_bytes(nbytes)}: molora's captured call did no "
                              f"work")
                row[f"{algo}_p2p"] = c.stats()["p2p_calls"] > before
            c.check()
            row["molora_us"] = min(row[f"{a}_us"] for a in ALGOS)
            row["molora_gbps"] = bus_gbps(nbytes, self.world, row["molora_us"])
            row["nccl_us"] = row["nccl_gbps"] = row["symm_us"] = row["torch_us"] = None
            if nd is not None:  # ncclAllReduce itself, out of place, on torch's buffers
                y = torch.empty_like(x)
                row["nccl_us"], row["nccl_timed"] = self._time_graph(
                    lambda: nd.all_reduce(x.data_ptr(), y.data_ptr(), n, stream()), eager_ok=True)
            if symm is not None:  # the same on buffers registered as symmetric windows
                row["symm_us"], row["symm_timed"] = self._time_graph(
                    lambda: nd.all_reduce(symm[0], symm[1], n, stream()), eager_ok=True)
            if self.use_nccl:  # torch.distributed.all_reduce (NCCL backend), in place
                y = x.clone()
                row["torch_us"], row["torch_timed"] = self._time_graph(
                    lambda: self.dist.all_reduce(y, group=self.nccl), eager_ok=True)
                if row["nccl_us"] is None and row["torch_timed"] != "empty":
                    # the baseline: NCCL direct, else through torch
                    row["nccl_us"], row["nccl_timed"] = row["torch_us"], row["torch_timed"]
            if row["nccl_us"]:
                row["nccl_gbps"] = bus_gbps(nbytes, self.world, row["nccl_us"])
            rows.append(row)
        if nd is not None:
            nd.close()
        self.report["speed"] = rows
        self.report["speed_notes"] = notes
        self.report["speed_stats"] = c.stats()
        self.quiesce()


class _UniqueId(ctypes.Structure):  # ncclUniqueId
    _fields_ = [("internal", ctypes.c_char * 128)]


class _NcclDirect:
    """ncclAllReduce (bf16, sum) called through ctypes on a communicator of its own: on any
    buffers, and on buffers from ncclMemAlloc registered as symmetric windows
    (ncclCommWindowRegister, NCCL >= 2.27), where NCCL runs its symmetric kernels."""

    BF16, SUM, WIN_SYMMETRIC = 9, 0, 1

    def __init__(self, rank: int, world: int, bcast: Any):
        import ctypes as ct
        self.ct = ct
        self.lib = _load_nccl()
        lib = self.lib
        lib.ncclGetErrorString.restype = ct.c_char_p
        lib.ncclCommInitRank.argtypes = [ct.POINTER(ct.c_void_p), ct.c_int, _UniqueId, ct.c_int]
        lib.ncclAllReduce.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_int,
                                      ct.c_void_p, ct.c_void_p]
        lib.ncclMemAlloc.argtypes = [ct.POINTER(ct.c_void_p), ct.c_size_t]
        lib.ncclMemFree.argtypes = [ct.c_void_p]
        lib.ncclCommDestroy.argtypes = [ct.c_void_p]
        v = ct.c_int()
        self._ok(lib.ncclGetVersion(ct.byref(v)), "ncclGetVersion")
        self.version = v.value
        uid = _UniqueId()
        if rank == 0:
            self._ok(lib.ncclGetUniqueId(ct.byref(uid)), "ncclGetUniqueId")
        raw = bcast(bytes(ct.string_at(ct.addressof(uid), 128)) if rank == 0 else None)
        uid = _UniqueId.from_buffer_copy(raw)
        self.comm = ct.c_void_p()
        self._ok(lib.ncclCommInitRank(ct.byref(self.comm), world, uid, rank), "ncclCommInitRank")
        self.bufs: List[Any] = []
        self.wins: List[Any] = []

    def _ok(self, r: int, what: str) -> None:
        if r != 0:
            msg = self.lib.ncclGetErrorString(r)
            raise RuntimeError(f"{what}: ncclResult {r} ({msg.decode() if msg else '?'})")

    def symmetric(self, nbytes: int) -> List[int]:
        """Two buffers of nbytes (send, receive), registered as symmetric windows: collective."""
        ct = self.ct
        if self.version < 22700 or not hasattr(self.lib, "ncclCommWindowRegister"):
            raise RuntimeError(f"NCCL {self.version} has no symmetric windows (2.27+)")
        self.lib.ncclCommWindowRegister.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t,
                                                    ct.POINTER(ct.c_void_p), ct.c_int]
        self.lib.ncclCommWindowDeregister.argtypes = [ct.c_void_p, ct.c_void_p]
        ptrs = []
        for _ in range(2):
            p, w = ct.c_void_p(), ct.c_void_p()
            self._ok(self.lib.ncclMemAlloc(ct.byref(p), nbytes), "ncclMemAlloc")
            self.bufs.append(p)
            self._ok(self.lib.ncclCommWindowRegister(self.comm, p, nbytes, ct.byref(w),
                                                     self.WIN_SYMMETRIC),
                     "ncclCommWindowRegister")
            self.wins.append(w)
            ptrs.append(p.value)
        return ptrs

    def all_reduce(self, send: int, recv: int, count: int, stream: int) -> None:
        self._ok(self.lib.ncclAllReduce(send, recv, count, self.BF16, self.SUM, self.comm,
                                        stream), "ncclAllReduce")

    def close(self) -> None:
        for w in self.wins:
            self.lib.ncclCommWindowDeregister(self.comm, w)
        for p in self.bufs:
            self.lib.ncclMemFree(p)
        self.lib.ncclCommDestroy(self.comm)


def _load_nccl() -> Any:
    """libnccl.so.2: the one already in the process (torch's), else the nvidia-nccl wheel's."""
    import ctypes as ct
    try:
        return ct.CDLL("libnccl.so.2")
    except OSError:
        import nvidia.nccl  # the wheel torch depends on
        return ct.CDLL(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))


def _rank_main(rank: int, world: int, args: Any, init: str, q: Any) -> None:
    os.environ.update(_NO_MULTICAST)
    try:
        r = _Rank(rank, world, args, init)
        seed = r.gather(args.seed if args.seed is not None
                        else int.from_bytes(os.urandom(4), "little"))[0]
        r.report["seed"] = seed
        for phase in args.phases:
            if phase == "faults" and world < 2:
                r.report["faults"] = "not run: world 1 has no peer to stop"
                continue
            t0 = time.perf_counter()
            {"check": r.correctness, "graph": r.graph_replay, "faults": r.faults,
             "speed": lambda _seed: r.speed()}[phase](seed)
            r.report.setdefault("seconds", {})[phase] = round(time.perf_counter() - t0, 1)
        r.report["failures"] = r.failures
        r.dist.barrier()
        r.dist.destroy_process_group()
        q.put((rank, r.report))
    except BaseException as e:  # reported to the parent, which stops the others
        import traceback
        q.put((rank, {"error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()}))


def run_world(world: int, args: Any, target: Any = None) -> Dict[str, Any]:
    """Starts `world` processes running target(rank, world, args, init, queue) (default: one
    rank of this run), collects each rank's (rank, report) from the queue and returns
    {world, reports, error}. The error is set, and every process killed, when a rank reports an
    error, a process ends without reporting, or the world takes over args.world_timeout s."""
    import multiprocessing as mp
    import queue as queue_mod
    ctx = mp.get_context("spawn")  # (CUDA cannot be forked)
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        procs = [ctx.Process(target=target or _rank_main, args=(r, world, args, init, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        reports: Dict[int, Any] = {}
        error = None
        deadline = time.time() + args.world_timeout
        while len(reports) < world and error is None:
            left = deadline - time.time()
            if left <= 0:
                missing = sorted(set(range(world)) - set(reports))
                error = f"ranks {missing} did not finish within {args.world_timeout} s"
                break
            try:
                rank, rep = q.get(timeout=min(1.0, left))
            except queue_mod.Empty:
                # a process that ended without its report (a crash, os._exit, a signal)
                gone = [r for r, p in enumerate(procs)
                        if p.exitcode is not None and r not in reports]
                if gone:
                    time.sleep(0.5)  # (its report may still be in the queue's pipe)
                    try:
                        while True:
                            rank, rep = q.get_nowait()
                            reports[rank] = rep
                    except queue_mod.Empty:
                        pass
                    gone = [r for r in gone if r not in reports]
                    if gone:
                        error = (f"rank {gone[0]}'s process ended without a report (exit code "
                                 f"{procs[gone[0]].exitcode})")
                continue
            reports[rank] = rep
            if "error" in rep:
                error = f"rank {rank}: {rep['error']}\n{rep.get('traceback', '')}"
        for p in procs:
            p.join(timeout=30 if error is None else 1)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return {"world": world, "reports": reports, "error": error}


def print_world(res: Dict[str, Any], share_gpu: bool) -> List[str]:
    """Prints one world's sections; returns its failure lines."""
    w = res["world"]
    print(f"\n=== world {w}{' (ranks share GPU 0)' if share_gpu else ''} ===")
    if res["error"]:
        print("ERROR", res["error"])
        return [f"world {w}: {res['error'].splitlines()[0]}"]
    r0 = res["reports"][0]
    print(f"seed {r0['seed']}; seconds per phase {r0.get('seconds')}")
    fails = []
    for rank in sorted(res["reports"]):
        for f in res["reports"][rank].get("failures", []):
            fails.append(f"world {w} rank {rank}: {f}")
    if "correctness" in r0:
        cr = r0["correctness"]
        fb = {k: v for k, v in cr["stats"]["fallback"].items() if v}
        print(f"correctness: {cr['cases']} cases (16 B..16 MiB x bf16/fp16 x "
              f"auto/oneshot/twoshot), {cr['failed']} failed on rank 0; paths {cr['paths']}; "
              f"fallbacks {fb}")
    if "graph" in r0:
        for k, v in r0["graph"].items():
            print(f"graph replay {k}: {v}")
    if "faults" in r0:
        for rank in sorted(res["reports"]):
            print(f"faults rank {rank}: {res['reports'][rank]['faults']}")
    return fails


def speed_table(results: Sequence[Dict[str, Any]], share_gpu: bool) -> List[str]:
    lines = [f"{'world':>5} {'bytes':>8} {'oneshot':>9} {'twoshot':>9} {'auto':>9} {'nccl':>9} "
             f"{'nccl-sym':>9} {'torch':>9} {'x nccl':>7} {'busGB/s':>8} {'nccl GB/s':>9}"]
    targets, notes = [], []
    for res in results:
        if res["error"] or "speed" not in res["reports"].get(0, {}):
            continue
        w = res["world"]
        rows = res["reports"][0]["speed"]
        for k, v in res["reports"][0].get("speed_notes", {}).items():
            notes.append(f"world {w} {k}: {v}")
        for r in rows:
            def cell(a: str) -> str:
                return f"{r[a + '_us']:8.2f}{'' if r[a + '_p2p'] else '*'}"

            def base(k: str) -> str:
                if not r.get(k + "_us"):
                    return f"{'n/a':>9}"
                if r.get(k + "_timed") == "empty":
                    return f"{'no-op':>9}"
                return f"{r[k + '_us']:8.2f}{'e' if r.get(k + '_timed') == 'eager' else ' '}"
            ratio = f"{r['nccl_us'] / r['molora_us']:6.2f}x" if r.get("nccl_us") else f"{'':>7}"
            ng = f"{r['nccl_gbps']:9.0f}" if r.get("nccl_gbps") else f"{'':>9}"
            lines.append(f"{w:>5} {fmt_bytes(r['bytes']):>8} {cell('oneshot'):>9} "
                         f"{cell('twoshot'):>9} {cell('auto'):>9} {base('nccl')} "
                         f"{base('symm')} {base('torch')} {ratio} {r['molora_gbps']:8.0f} {ng}")
        targets += judge_targets(w, rows)
    lines.append("us per call, median of graph replays, the slowest rank; * = not molora's P2P "
                 "path (a fallback); nccl = ncclAllReduce, nccl-sym = the same on symmetric "
                 "windows, torch = torch.distributed.all_reduce; e = timed eagerly (its graph "
                 "capture failed); no-op = its capture held no work (torch.distributed at "
                 "world 1); x nccl = nccl's time over molora's best")
    if share_gpu:
        lines.append("ranks share one GPU as processes: the GPU time-slices their contexts, so "
                     "a call that waits for a peer costs about a slice (ms); these are not NVLink "
                     "times, and NCCL (one GPU per rank) did not run")
    return lines + notes + targets


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="molora.comm_multi", description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", help="world sizes, e.g. 2,4,8 (default: 2, 4, 8 up to the GPUs)")
    ap.add_argument("--share-gpu", action="store_true",
                    help="every rank on GPU 0 (rehearsal on one GPU; no NCCL)")
    ap.add_argument("--phases", default="check,graph,faults,speed",
                    help="any of check, graph, faults, speed (default all)")
    ap.add_argument("--iters", type=int, default=10000, help="graph replays per case (10000)")
    ap.add_argument("--ref-every", type=int, default=20,
                    help="fused rmsnorm: CPU reference every N replays (20)")
    ap.add_argument("--graph-numel", type=int, default=32 * 1024)
    ap.add_argument("--graph-numel-large", type=int, default=1 << 20)
    ap.add_argument("--rms-rows", type=int, default=4)
    ap.add_argument("--rms-hidden", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed graph (20)")
    ap.add_argument("--reps", type=int, default=50, help="timed replays (50)")
    ap.add_argument("--timeout-ms", type=int, default=2000, help="molora's wait deadline")
    ap.add_argument("--fault-timeout-ms", type=int, default=200,
                    help="the deadline in the stopped-rank fault (200)")
    ap.add_argument("--world-timeout", type=int, default=1800,
                    help="seconds a world may take before its ranks are killed")
    ap.add_argument("--seed", type=int, default=None, help="(default: drawn fresh)")
    ap.add_argument("--json", help="write every rank's report here")
    args = ap.parse_args(argv)
    try:
        worlds = parse_worlds(args.worlds) if args.worlds else None
        args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
        for p in args.phases:
            if p not in ("check", "graph", "faults", "speed"):
                raise ValueError(f"--phases: unknown phase {p!r}")
        for name in ("iters", "ref_every", "graph_numel", "graph_numel_large", "rms_rows",
                     "rms_hidden", "calls", "reps", "fault_timeout_ms"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    except ValueError as e:
        ap.error(str(e))
    os.environ.update(_NO_MULTICAST)
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    plan = plan_worlds(worlds, gpus, args.share_gpu)
    if plan["error"]:
        print(f"molora.comm_multi: {plan['error']}; nothing run")
        return 2
    print(f"molora.comm_multi: {gpus} GPU(s) ({torch.cuda.get_device_name(0)}), worlds "
          f"{plan['run']}, phases {args.phases}, {args.iters} replays per graph case")
    for w, why in plan["skipped"].items():
        print(f"world {w}: not run ({why})")
    results, fails = [], []
    for w in plan["run"]:
        res = run_world(w, args)
        results.append(res)
        fails += print_world(res, args.share_gpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"skipped": plan["skipped"], "results": results}, f, indent=1, default=str)
    print("\n=== all-reduce speed (bf16) ===")
    for line in speed_table(results, args.share_gpu):
        print(line)
    print(f"\nRESULT {'PASS' if not fails else 'FAIL'}: {len(plan['run'])} world(s) run, "
          f"{len(plan['skipped'])} not run, {len(fails)} failed check(s)")
    for f in fails:
        print("  FAIL", f)
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
