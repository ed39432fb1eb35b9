"""molora.comm: CPU reference against numpy, argument checks, and (gpu marker) ranks as streams
of one process on one GPU and two processes joined by a gloo group, bit-exact against the
reference."""
import os
import random

import numpy as np
import pytest

import molora
from molora import comm

SEED = random.SystemRandom().randrange(1 << 31)


def rng():
    print(f"seed {SEED}")
    return np.random.default_rng(SEED)


# ---- CPU: the reference is the specification -----------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_reference_is_rank_order_fp32_sum_rounded_once(dtype, world):
    g = rng()
    n = 1031
    inputs = [g.standard_normal(n).astype(dtype) for _ in range(world)]
    acc = np.zeros(n, np.float32)
    for x in inputs:  # rank order, fp32
        acc = (acc + x.astype(np.float32)).astype(np.float32)
    want = acc.astype(dtype)
    out = np.full(n, np.nan, dtype)
    got = comm.all_reduce_reference(inputs, out)
    assert got is out
    assert np.array_equal(got.view(np.uint16 if dtype == np.float16 else np.uint32),
                          want.view(np.uint16 if dtype == np.float16 else np.uint32))


def test_reference_rounds_once_not_per_step():
    # 2048 + 1 + 1 in fp16: per-step rounding gives 2048 (ties to even), round-once gives 2050.
    inputs = [np.array([2048.0], np.float16), np.array([1.0], np.float16),
              np.array([1.0], np.float16)]
    assert comm.all_reduce_reference(inputs)[0] == np.float16(2050.0)


def test_residual_rmsnorm_reference_matches_numpy():
    g = rng()
    rows, hidden, world = 3, 64, 4
    inputs = [g.standard_normal((rows, hidden)).astype(np.float32) for _ in range(world)]
    residual = g.standard_normal((rows, hidden)).astype(np.float32)
    weight = g.standard_normal(hidden).astype(np.float32)
    s = np.zeros((rows, hidden), np.float32)
    for x in inputs:
        s = (s + x).astype(np.float32)
    r = (s + residual).astype(np.float32)
    want = r / np.sqrt((r.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * weight
    res = residual.copy()
    out = comm.all_reduce_residual_rmsnorm_reference(inputs, res, weight, 1e-6)
    assert np.array_equal(res, r)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_reference_argument_errors():
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError):
        comm.all_reduce_reference([a, np.zeros(9, np.float32)])
    with pytest.raises(TypeError):
        comm.all_reduce_reference([np.zeros(8, np.int32)])
    with pytest.raises(ValueError):
        comm.all_reduce_reference([])


def test_fallback_reasons_named():
    for r in ["dtype", "not_contiguous", "size", "alignment", "world_size", "topology",
              "ipc_failure", "timeout", "mismatch", "disabled"]:
        assert r in comm.FALLBACK_REASONS
    assert "Communicator" in molora.__all__


def test_from_exchange_argument_errors():
    with pytest.raises(TypeError):
        comm.Communicator.from_exchange(0, 2, "not callable")
    with pytest.raises(ValueError):
        comm.Communicator.from_exchange(0, 2, lambda b: b, algo="ring")
    with pytest.raises(ValueError):
        comm.Communicator.from_exchange(3, 2, lambda b: b, device=0)  # rank outside [0, world)


@pytest.mark.skipif(molora.gpu_count() > 0, reason="checks the no-GPU error")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError):
        comm.Communicator.local_group(2)


# ---- GPU: ranks as streams of one process ----------------------------------------------------

def _bits(t):
    import torch
    return t.view(torch.int16)


def _inputs(torch, world, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(world)]


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("n", [8, 4096, 1 << 19])
def test_local_group_bit_exact(world, n):
    import torch
    ranks = comm.Communicator.local_group(world, 0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    for epoch in range(3):
        dtype = torch.bfloat16 if epoch % 2 == 0 else torch.float16
        host = _inputs(torch, world, n, dtype, SEED + epoch)
        xs = [h.cuda() for h in host]
        outs = [torch.full_like(x, float("nan")) for x in xs]
        torch.cuda.synchronize()
        for r in range(world):
            with torch.cuda.stream(streams[r]):
                ranks[r].all_reduce(xs[r], outs[r])  # default stream = torch's current
        torch.cuda.synchronize()
        want = comm.all_reduce_reference(host)
        for r in range(world):
            ranks[r].check()
            assert torch.equal(_bits(outs[r].cpu()), _bits(want)), f"rank {r} epoch {epoch}"
    st = ranks[0].stats()
    assert st["p2p_calls"] == 3
    assert sum(st["fallback"].values()) == 0
    assert ranks[0].epoch() == 3


@pytest.mark.gpu
def test_local_group_residual_rmsnorm():
    import torch
    world, rows, hidden = 4, 5, 1024
    ranks = comm.Communicator.local_group(world, 0)
    streams = [torch.cuda.Stream() for _ in range(world)]
    host = [h.view(rows, hidden) for h in _inputs(torch, world, rows * hidden, torch.bfloat16,
                                                  SEED)]
    g = torch.Generator().manual_seed(SEED + 1)
    res0 = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
    weight = torch.rand(hidden, generator=g).to(torch.bfloat16)
    xs = [h.cuda() for h in host]
    res = [res0.cuda() for _ in range(world)]
    outs = [None] * world
    w = weight.cuda()
    torch.cuda.synchronize()
    for r in range(world):
        outs[r] = ranks[r].all_reduce_residual_rmsnorm(xs[r], res[r], w, 1e-6,
                                                       stream=streams[r])
    torch.cuda.synchronize()
    ref_res = res0.clone()
    ref = comm.all_reduce_residual_rmsnorm_reference(host, ref_res, weight, 1e-6)
    for r in range(world):
        assert torch.equal(_bits(res[r].cpu()), _bits(ref_res))
        assert torch.equal(_bits(outs[r].cpu()), _bits(outs[0].cpu()))
        torch.testing.assert_close(outs[r].cpu().float(), ref.float(), rtol=1 / 128, atol=0)
    assert ranks[0].stats()["fused_calls"] == 1


@pytest.mark.gpu
def test_fallbacks_counted_and_raised():
    import torch
    ranks = comm.Communicator.local_group(2, 0)
    x = torch.ones(64, dtype=torch.float32, device="cuda")
    with pytest.raises(RuntimeError):  # no NCCL for a one-device group: Unavailable
        ranks[0].all_reduce(x)
    xb = torch.ones(64, 2, dtype=torch.bfloat16, device="cuda").t()  # strided
    with pytest.raises(RuntimeError):
        ranks[0].all_reduce(xb)
    with pytest.raises(ValueError):
        ranks[0].all_reduce(torch.ones(8, dtype=torch.bfloat16))  # CPU tensor
    st = ranks[0].stats()
    assert st["fallback"]["dtype"] == 1
    assert st["fallback"]["not_contiguous"] == 1
    assert st["unavailable"] == 2


@pytest.mark.gpu
def test_stopped_rank_raises_timeout():
    import torch
    ranks = comm.Communicator.local_group(2, 0, timeout_ms=100)
    x = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    ranks[0].all_reduce(x)  # rank 1 never calls
    torch.cuda.synchronize()
    with pytest.raises(TimeoutError, match="epoch 1"):
        ranks[0].check()


# ---- GPU: two processes, a gloo group for the exchange, IPC on one GPU ----------------------

def _pg_rank(rank, world, init, seed, q):
    import torch
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        torch.cuda.set_device(0)
        c = comm.Communicator.from_process_group(timeout_ms=20000, create_nccl=False)
        ok = c.p2p_enabled
        for epoch in range(4):
            n = 4096 if epoch % 2 == 0 else (1 << 18)
            host = _inputs(torch, world, n, torch.bfloat16, seed + epoch)
            out = c.all_reduce(host[rank].cuda())
            torch.cuda.synchronize()
            c.check()
            want = comm.all_reduce_reference(host)
            ok = ok and torch.equal(_bits(out.cpu()), _bits(want))
        q.put((rank, bool(ok), c.stats()["p2p_calls"], c.p2p_disabled_reason))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # reported to the parent
        q.put((rank, False, -1, repr(e)))


@pytest.mark.gpu
def test_from_process_group_two_processes(tmp_path):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tmp_path}/rendezvous"
    procs = [ctx.Process(target=_pg_rank, args=(r, 2, init, SEED, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for rank, ok, calls, note in results:
        assert ok, f"rank {rank}: {note}"
        assert calls == 4
