"""molora.torch_ops: torch.library registration, fake (meta) shape inference, CPU tensors through
the CPU references, and on a GPU (marker gpu) torch.compile(fullgraph) and CUDA graph capture.
Skipped without torch (CI has no torch)."""
import numpy as np
import pytest

import molora
import molora.torch_ops as ops

torch = pytest.importorskip(
    "torch", reason="torch is not installed (CI has no torch): torch.library ops untested here")


def _problem(device="cpu", dtype=None, T=9, k=4, S=3, E=8, r=16, K=64, N=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    x = torch.randn(T, K, generator=g).to(dtype)
    A = (torch.randn(S, E, r, K, generator=g) / 8).to(dtype)
    B = (torch.randn(S, E, N, r, generator=g) / 4).to(dtype)
    topk = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    slot = torch.randint(0, S, (T,), generator=g, dtype=torch.int32)
    slot[::3] = -1
    ranks = torch.tensor([r, 8, r][:S], dtype=torch.int32)
    scales = torch.linspace(0.5, 2.0, S)
    return [a.to(device) for a in (x, A, B, topk, slot, ranks, scales)]


def test_register_is_idempotent_and_defines_the_ops():
    assert ops.register() and ops.register() and ops.registered()
    for name in ("moe_align_block_size", "lora_shrink", "lora_expand", "lora_moe_delta"):
        assert hasattr(torch.ops.molora, name)
    schema = str(torch.ops.molora.lora_expand.default._schema)
    # y is declared mutated: "Tensor(a!) y" (the alias name is torch's to choose, e.g. a2!)
    import re
    assert re.search(r"Tensor\(a\d*!\) y\b", schema), schema


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops.register()
    T, k, S, E, r, K, N, Bs = 9, 4, 3, 8, 16, 64, 48, 16
    with FakeTensorMode():
        topk = torch.empty(T, k, dtype=torch.int32)
        slot = torch.empty(T, dtype=torch.int32)
        srt, eids, ntpp = torch.ops.molora.moe_align_block_size(topk, slot, S * E, E, Bs)
        sz = molora.moe_align_sizes(T, k, S * E, Bs)
        assert tuple(srt.shape) == (sz["sorted_token_ids"],) and srt.dtype == torch.int32
        assert tuple(eids.shape) == (sz["expert_ids"],) and tuple(ntpp.shape) == (1,)
        x = torch.empty(T, K, dtype=torch.bfloat16)
        A = torch.empty(S, E, r, K, dtype=torch.bfloat16)
        ranks = torch.empty(S, dtype=torch.int32)
        t = torch.ops.molora.lora_shrink(x, A, ranks, None, None, srt, eids, ntpp, Bs, k)
        assert tuple(t.shape) == (T * k, r) and t.dtype == torch.bfloat16
        t2 = torch.ops.molora.lora_shrink(x, A, ranks, topk, slot, None, None, None, 0, 0)
        assert tuple(t2.shape) == (T * k, r)
        y = torch.empty(T * k, N, dtype=torch.bfloat16)
        B = torch.empty(S, E, N, r, dtype=torch.bfloat16)
        assert torch.ops.molora.lora_expand(t, B, y, ranks, torch.empty(S), None, None, srt,
                                            eids, ntpp, Bs, k) is None


def test_cpu_tensors_match_the_numpy_path():
    x, A, B, topk, slot, ranks, scales = _problem()
    k = topk.shape[1]
    S, E = A.shape[:2]
    srt, eids, ntpp = ops.moe_align_block_size(topk, S * E, 16, slot_ids=slot,
                                               num_base_experts=E)
    want = molora.moe_align_block_size(topk.numpy(), S * E, 16, slot_ids=slot.numpy(),
                                       num_base_experts=E)
    for a, b in zip((srt, eids, ntpp), want):
        np.testing.assert_array_equal(a.numpy(), b)
    t = ops.lora_shrink(x, A, ranks=ranks, sorted_token_ids=srt, expert_ids=eids,
                        num_tokens_post_pad=ntpp, block_size=16, top_k=k)
    t_np = molora.lora_shrink(x.numpy(), A.numpy(), topk.numpy(), slot.numpy(),
                              ranks=ranks.numpy())
    np.testing.assert_allclose(t.numpy(), t_np, rtol=1e-6, atol=1e-6)
    y = torch.zeros(t.shape[0], B.shape[2])
    ops.lora_expand(t, B, y, topk, slot, ranks=ranks, scales=scales)
    y_np = molora.lora_expand(t.numpy(), B.numpy(), np.zeros(y.shape, np.float32), topk.numpy(),
                              slot.numpy(), ranks=ranks.numpy(), scales=scales.numpy())
    np.testing.assert_allclose(y.numpy(), y_np, rtol=1e-6, atol=1e-6)


def test_cpu_moe_delta_matches_shrink_then_expand():
    x, A, B, topk, slot, ranks, scales = _problem()
    k = topk.shape[1]
    t = ops.lora_shrink(x, A, topk, slot, ranks=ranks)
    want = ops.lora_expand(t, B, torch.zeros(t.shape[0], B.shape[2]), topk, slot, ranks=ranks,
                           scales=scales)
    tw = torch.zeros_like(t)  # (lora_shrink's t is zero where nothing is written)
    y = ops.lora_moe_delta(x, A, B, torch.zeros_like(want), topk, slot, ranks=ranks,
                           scales=scales, t=tw)
    assert torch.equal(y, want) and torch.equal(tw, t)
    assert torch.count_nonzero(y[(slot >= 0).repeat_interleave(k)]) > 0
    torch.library.opcheck(torch.ops.molora.lora_moe_delta.default,
                          (x, A, B, torch.zeros_like(want), torch.zeros_like(t), ranks, scales,
                           topk, slot, None, None, None, 0, 0))


def test_opcheck_cpu():
    x, A, B, topk, slot, ranks, scales = _problem()
    ops.register()
    S, E = A.shape[:2]
    k = topk.shape[1]
    torch.library.opcheck(torch.ops.molora.moe_align_block_size.default,
                          (topk, slot, S * E, E, 16))
    torch.library.opcheck(torch.ops.molora.lora_shrink.default,
                          (x, A, ranks, topk, slot, None, None, None, 0, 0))
    t = torch.ops.molora.lora_shrink(x, A, ranks, topk, slot, None, None, None, 0, 0)
    y = torch.zeros(x.shape[0] * k, B.shape[2])
    torch.library.opcheck(torch.ops.molora.lora_expand.default,
                          (t, B, y, ranks, scales, topk, slot, None, None, None, 0, 0))


def _layer(x, A, B, topk, slot, ranks, scales, y):
    S, E = A.shape[:2]
    k = topk.shape[1]
    srt, eids, ntpp = torch.ops.molora.moe_align_block_size(topk, slot, S * E, E, 16)
    t = torch.ops.molora.lora_shrink(x, A, ranks, None, None, srt, eids, ntpp, 16, k)
    torch.ops.molora.lora_expand(t, B, y, ranks, scales, None, None, srt, eids, ntpp, 16, k)
    return y


def _layer_delta(x, A, B, topk, slot, ranks, scales, y, t):
    S, E = A.shape[:2]
    k = topk.shape[1]
    srt, eids, ntpp = torch.ops.molora.moe_align_block_size(topk, slot, S * E, E, 16)
    torch.ops.molora.lora_moe_delta(x, A, B, y, t, ranks, scales, None, None, srt, eids, ntpp,
                                    16, k)
    return y


@pytest.mark.gpu
def test_gpu_moe_delta_compile_fullgraph_and_cuda_graph():
    ops.register()
    x, A, B, topk, slot, ranks, scales = _problem("cuda", torch.bfloat16)
    P = x.shape[0] * topk.shape[1]
    y0 = torch.randn(P, B.shape[2], device="cuda").to(torch.bfloat16)
    t = torch.empty(P, A.shape[2], device="cuda", dtype=torch.bfloat16)
    want = _layer(x, A, B, topk, slot, ranks, scales, y0.clone())
    got = torch.compile(_layer_delta, fullgraph=True)(x, A, B, topk, slot, ranks, scales,
                                                       y0.clone(), t)
    assert torch.equal(got, want)  # the same kernels as shrink then expand: the same bits
    y = y0.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _layer_delta(x, A, B, topk, slot, ranks, scales, y, t)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y.copy_(y0)
        _layer_delta(x, A, B, topk, slot, ranks, scales, y, t)
    y.fill_(7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)


@pytest.mark.gpu
def test_gpu_compile_fullgraph_and_cuda_graph():
    ops.register()
    x, A, B, topk, slot, ranks, scales = _problem("cuda", torch.bfloat16)
    y0 = torch.zeros(x.shape[0] * topk.shape[1], B.shape[2], device="cuda",
                     dtype=torch.bfloat16)
    want = _layer(x, A, B, topk, slot, ranks, scales, y0.clone())
    compiled = torch.compile(_layer, fullgraph=True)
    got = compiled(x, A, B, topk, slot, ranks, scales, y0.clone())
    torch.testing.assert_close(got, want)
    y = y0.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _layer(x, A, B, topk, slot, ranks, scales, y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y.zero_()
        _layer(x, A, B, topk, slot, ranks, scales, y)
    y.fill_(7)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, want)
