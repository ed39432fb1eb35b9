"""molora.lora_shrink / lora_expand / lora_plan: numpy → CPU reference, CUDA torch → kernels."""
import json
import os
import random

import numpy as np
import pytest

import molora

SEED = int(os.environ.get("MOLORA_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
print(f"[lora] seed {SEED}")


def make(T=6, k=3, S=3, E=5, r_max=16, K=40, N=24, none_every=4, seed=SEED, dtype=np.float16):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (T, K)).astype(dtype)
    A = (rng.uniform(-1, 1, (S, E, r_max, K)) / np.sqrt(K)).astype(dtype)
    B = (rng.uniform(-1, 1, (S, E, N, r_max)) / np.sqrt(r_max)).astype(dtype)
    topk = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    slot = rng.integers(0, S, T).astype(np.int32)
    slot[::none_every] = -1
    ranks = np.array([min(r_max, 8 * (s + 1)) for s in range(S)], np.int32)
    ranks[-1] = r_max - 3
    scales = np.linspace(0.5, 2, S).astype(np.float32)
    return x, A, B, topk, slot, ranks, scales


def ref_shrink(x, A, topk, slot, ranks):
    T, k = topk.shape
    t = np.zeros((T * k, A.shape[2]), np.float64)
    for p in range(T * k):
        s = slot[p // k]
        if s < 0:
            continue
        r = ranks[s]
        t[p, :r] = A[s, topk[p // k, p % k], :r].astype(np.float64) @ x[p // k].astype(np.float64)
    return t


def ref_expand(t, B, y, topk, slot, ranks, scales):
    T, k = topk.shape
    out = y.astype(np.float64).copy()
    for p in range(T * k):
        s = slot[p // k]
        if s < 0:
            continue
        r = ranks[s]
        out[p] += scales[s] * (B[s, topk[p // k, p % k], :, :r].astype(np.float64)
                               @ t[p, :r].astype(np.float64))
    return out


def align(topk, slot, S, E, block):
    """moe_align_block_size's layout over virtual experts, built in numpy."""
    T, k = topk.shape
    P, V = T * k, S * E
    length = P + V * (block - 1)
    sorted_ids = np.full(length, P, np.int32)
    eids = np.full(-(-length // block), -1, np.int32)
    pos = 0
    buckets = {}
    for p in range(P):
        s = slot[p // k]
        if s >= 0:
            buckets.setdefault(int(s) * E + int(topk[p // k, p % k]), []).append(p)
    for v in sorted(buckets):
        ids = buckets[v]
        sorted_ids[pos:pos + len(ids)] = ids
        nb = -(-len(ids) // block)
        eids[pos // block:pos // block + nb] = v
        pos += nb * block
    return sorted_ids, eids, np.array([pos], np.int32)


def test_cpu_shrink_matches_numpy():
    x, A, B, topk, slot, ranks, _ = make()
    t = molora.lora_shrink(x, A, topk, slot, ranks=ranks)
    want = ref_shrink(x, A, topk, slot, ranks)
    k = topk.shape[1]
    for p in range(t.shape[0]):
        s = slot[p // k]
        if s < 0:
            assert not t[p].any()
            continue
        np.testing.assert_allclose(t[p, :ranks[s]].astype(np.float64), want[p, :ranks[s]],
                                   rtol=2e-3, atol=2e-3)


def test_cpu_expand_matches_numpy_and_aligned_agrees():
    x, A, B, topk, slot, ranks, scales = make()
    t = molora.lora_shrink(x, A, topk, slot, ranks=ranks)
    y0 = np.random.default_rng(SEED).uniform(-1, 1, (t.shape[0], B.shape[2])).astype(np.float16)
    y = molora.lora_expand(t, B, y0.copy(), topk, slot, ranks=ranks, scales=scales)
    want = ref_expand(t, B, y0, topk, slot, ranks, scales)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    k = topk.shape[1]
    for p in range(y.shape[0]):
        if slot[p // k] < 0:
            assert (y[p] == y0[p]).all()
    srt, eids, ntpp = align(topk, slot, A.shape[0], A.shape[1], 4)
    y2 = molora.lora_expand(t, B, y0.copy(), ranks=ranks, scales=scales, sorted_token_ids=srt,
                            expert_ids=eids, num_tokens_post_pad=ntpp, block_size=4, top_k=k)
    assert (y2 == y).all()


def test_float32_cpu():
    x, A, B, topk, slot, ranks, scales = make(dtype=np.float32)
    t = molora.lora_shrink(x, A, topk, slot, ranks=ranks)
    want = ref_shrink(x, A, topk, slot, ranks)
    np.testing.assert_allclose(t, want, rtol=1e-5, atol=1e-5)


def test_errors_name_the_argument_and_write_nothing():
    x, A, B, topk, slot, ranks, scales = make()
    t = np.zeros((topk.size, A.shape[2]), np.float16)
    bad = slot.copy()
    bad[1] = A.shape[0]
    with pytest.raises(ValueError, match="slot_ids"):
        molora.lora_shrink(x, A, topk, bad, ranks=ranks, out=t)
    assert not t.any()
    with pytest.raises(ValueError, match="ranks"):
        molora.lora_shrink(x, A, topk, slot, ranks=np.full(A.shape[0], 99, np.int32), out=t)
    assert not t.any()
    with pytest.raises(ValueError, match="A"):
        molora.lora_shrink(x, A[:, :, :, :8].copy(), topk, slot, ranks=ranks)
    with pytest.raises(TypeError, match="A"):
        molora.lora_shrink(x, A.astype(np.float32), topk, slot, ranks=ranks)
    with pytest.raises(TypeError, match="topk_ids"):
        molora.lora_shrink(x, A, topk.astype(np.int64), slot, ranks=ranks)
    with pytest.raises(ValueError, match="contiguous"):
        molora.lora_shrink(np.asfortranarray(x), A, topk, slot, ranks=ranks)
    y = np.zeros((topk.size, B.shape[2]), np.float16)
    with pytest.raises(ValueError, match="y"):
        molora.lora_expand(t, B, y[:, :8].copy(), topk, slot, ranks=ranks, scales=scales)
    with pytest.raises(ValueError, match="r_max"):
        molora.lora_expand(t, np.zeros((3, 5, 24, 12), np.float16), y, topk, slot)


def test_plan_kernel_choice_by_default():
    # Aligned routing with blocks <= 32: stream for every expand, for shrink from 16 pairs.
    kw = dict(top_k=8, num_slots=8, num_experts=128, r_max=16, routing="aligned",
              block_size=16, config_path="none")
    e = molora.lora_plan("expand", num_tokens=1, N=2048, **kw)
    assert e["kernel"] == "stream" and e["tile"] == 512 and e["pdl"] is True
    assert molora.lora_plan("shrink", num_tokens=2, K=2048, **kw)["kernel"] == "stream"
    assert molora.lora_plan("shrink", num_tokens=1, K=2048, **kw)["kernel"] == "grid"
    kw["block_size"] = 64
    assert molora.lora_plan("expand", num_tokens=64, N=2048, **kw)["kernel"] == "grid"


def test_plan_early_inputs_only_when_asked():
    # Off by default; MOLORA_LORA_EARLY_INPUTS=1 turns it on for stream plans with dependent
    # launch (read when planning, not cached), never for the grid kernel; other values: error.
    kw = dict(top_k=8, num_slots=8, num_experts=128, r_max=16, routing="aligned",
              block_size=16, config_path="none")
    assert molora.lora_plan("expand", num_tokens=8, N=2048, **kw)["early_inputs"] is False
    try:
        molora.set_setting("MOLORA_LORA_EARLY_INPUTS", "1")
        assert molora.lora_plan("expand", num_tokens=8, N=2048, **kw)["early_inputs"] is True
        assert molora.lora_plan("shrink", num_tokens=8, K=2048, **kw)["early_inputs"] is True
        g = molora.lora_plan("expand", num_tokens=8, N=2048, kernel="grid", **kw)
        assert g["early_inputs"] is False
        molora.set_setting("MOLORA_LORA_EARLY_INPUTS", "on")
        with pytest.raises(ValueError, match="MOLORA_LORA_EARLY_INPUTS"):
            molora.lora_plan("expand", num_tokens=8, N=2048, **kw)
    finally:
        molora.set_setting("MOLORA_LORA_EARLY_INPUTS", None)
    assert molora.lora_plan("expand", num_tokens=8, N=2048, **kw)["early_inputs"] is False


def test_plan_slot_check_on_plain_stream_unless_turned_off():
    # On by default for the plain stream kernels (shrink and expand), never for aligned routing
    # or the grid kernel; MOLORA_LORA_SLOT_CHECK=0 turns it off; other values: error.
    kw = dict(top_k=8, num_slots=8, num_experts=160, r_max=32, routing="plain",
              config_path="none")
    s = molora.lora_plan("shrink", num_tokens=64, K=6144, **kw)
    e = molora.lora_plan("expand", num_tokens=64, N=6144, **kw)
    assert s["kernel"] == "stream" and s["slot_check"] is True
    assert e["kernel"] == "stream" and e["slot_check"] is True
    assert molora.lora_plan("shrink", num_tokens=64, K=6144, kernel="grid",
                            **kw)["slot_check"] is False
    al = dict(kw, routing="aligned", block_size=16)
    a = molora.lora_plan("shrink", num_tokens=64, K=6144, **al)
    assert a["kernel"] == "stream" and a["slot_check"] is False
    try:
        molora.set_setting("MOLORA_LORA_SLOT_CHECK", "0")
        assert molora.lora_plan("shrink", num_tokens=64, K=6144, **kw)["slot_check"] is False
        d = molora.lora_plan("delta", num_tokens=64, K=2048, N=2048, **kw)
        assert d["shrink"]["slot_check"] is False and d["expand"]["slot_check"] is False
        molora.set_setting("MOLORA_LORA_SLOT_CHECK", "no")
        with pytest.raises(ValueError, match="MOLORA_LORA_SLOT_CHECK"):
            molora.lora_plan("shrink", num_tokens=64, K=6144, **kw)
    finally:
        molora.set_setting("MOLORA_LORA_SLOT_CHECK", None)
    assert molora.lora_plan("expand", num_tokens=64, N=6144, **kw)["slot_check"] is True


def test_plan_names_who_chose_the_kernel(tmp_path):
    # kernel_source: the planner's bounds, a kernel asked for, or the tuned file's faster kernel
    # where it timed both at this token count (plain expand N2048 r16, T=8: the bounds say grid).
    kw = dict(num_tokens=8, top_k=8, num_slots=8, num_experts=128, r_max=16, N=2048,
              sm_count=132)
    p = molora.lora_plan("expand", config_path="none", **kw)
    assert (p["kernel"], p["kernel_source"]) == ("grid", "heuristic")
    p = molora.lora_plan("expand", config_path="none", kernel="stream", **kw)
    assert (p["kernel"], p["kernel_source"]) == ("stream", "forced")
    base = dict(op="expand", dtype="bf16", routing="plain", dim=2048, r_max=16, p_min=33,
                p_max=64)
    cfg = tmp_path / "tuned.json"
    cfg.write_text(json.dumps({"entries": [
        dict(base, kernel="grid", tile=256, unroll=4, us=6.5),
        dict(base, kernel="stream", tile=512, unroll=0, us=5.25)]}))
    p = molora.lora_plan("expand", config_path=str(cfg), **kw)
    assert (p["kernel"], p["kernel_source"]) == ("stream", "tuned:" + str(cfg))
    assert p["variant"] == "expand.plain-stream.bf16"


def test_plan_reports_grid_bytes_floor():
    p = molora.lora_plan("expand", num_tokens=64, top_k=8, num_slots=8, num_experts=160,
                         r_max=32, N=6144, config_path="none", sm_count=132, kernel="grid")
    for key in ("variant", "source", "tile", "grid", "ctas", "bytes", "floor_us", "threads"):
        assert key in p
    assert p["source"] == "heuristic"
    assert p["variant"] == "expand.plain-grouped.bf16"
    assert p["floor_us"] > 0 and p["bytes"] > 512 * 32 * 6144 * 2 - 1
    a = molora.lora_plan("shrink", num_tokens=1, top_k=8, num_slots=8, num_experts=256,
                         r_max=32, K=7168, routing="aligned", block_size=16, config_path="none")
    assert a["variant"] == "shrink.aligned.bf16" and a["kernel"] == "grid" and a["stages"] == 0
    assert a["pdl"] is True  # programmatic dependent launch on every kernel by default
    st = molora.lora_plan("shrink", num_tokens=1, top_k=8, num_slots=8, num_experts=256,
                          r_max=32, K=7168, routing="aligned", block_size=16, config_path="none",
                          kernel="stream")
    assert st["variant"] == "shrink.aligned-stream.bf16"
    assert st["kernel"] == "stream" and st["stages"] > 0 and st["tile"] == 8
    assert st["pdl"] is True
    with pytest.raises(ValueError, match="block_size"):
        molora.lora_plan("shrink", num_tokens=1, top_k=8, num_slots=8, num_experts=256,
                         r_max=32, K=7168, routing="aligned", block_size=64, kernel="stream")
    # Plain routing on the stream kernel (it groups the pairs itself): up to 2048 pairs.
    ps = molora.lora_plan("expand", num_tokens=256, top_k=8, num_slots=8, num_experts=160,
                          r_max=32, N=6144, config_path="none", kernel="stream")
    assert ps["variant"] == "expand.plain-stream.bf16" and ps["kernel"] == "stream"
    assert ps["groups"] == 2048 and ps["group_cap"] == 2048
    with pytest.raises(ValueError, match="num_tokens \\* top_k <= 2048"):
        molora.lora_plan("expand", num_tokens=257, top_k=8, num_slots=8, num_experts=160,
                         r_max=32, N=6144, kernel="stream")
    with pytest.raises(ValueError, match="K"):
        molora.lora_plan("shrink", num_tokens=1, top_k=8, num_slots=8, num_experts=256,
                         r_max=32, K=7170)
    with pytest.raises(ValueError, match="r_max"):
        molora.lora_plan("expand", num_tokens=1, top_k=8, num_slots=8, num_experts=256,
                         r_max=24, N=128)


def _torch_cuda():
    import torch
    return torch


def _cuda_routing(torch, routing, topk, slot, S, E):
    """The routing on the GPU as the calls take it: (positional args, keyword args). plain:
    topk_ids and slot_ids; aligned: align's layout over S*E virtual experts, blocks of 16."""
    dev = "cuda"
    if routing == "plain":
        return (torch.from_numpy(topk).to(dev), torch.from_numpy(slot).to(dev)), {}
    srt, eids, ntpp = align(topk, slot, S, E, 16)
    return (), dict(sorted_token_ids=torch.from_numpy(srt).to(dev),
                    expert_ids=torch.from_numpy(eids).to(dev),
                    num_tokens_post_pad=torch.from_numpy(ntpp).to(dev), block_size=16,
                    top_k=topk.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("routing", ["plain", "aligned"])
def test_gpu_matches_reference(dtype, routing):
    torch = _torch_cuda()
    x, A, B, topk, slot, ranks, scales = make(T=33, k=8, S=4, E=16, r_max=32, K=520, N=264,
                                               dtype=np.float32)
    tdt = getattr(torch, dtype)
    dev = "cuda"
    xc, Ac, Bc = (torch.from_numpy(a).to(dev, tdt) for a in (x, A, B))
    k = topk.shape[1]
    args, kw = _cuda_routing(torch, routing, topk, slot, 4, 16)
    kw["ranks"] = torch.from_numpy(ranks).to(dev)
    t = molora.lora_shrink(xc, Ac, *args, **kw)
    want_t = ref_shrink(xc.float().cpu().numpy(), Ac.float().cpu().numpy(), topk, slot, ranks)
    tol = 1e-2 if dtype == "bfloat16" else 2e-3
    tt = t.float().cpu().numpy()
    mask = np.zeros_like(tt, bool)
    for p in range(tt.shape[0]):
        if slot[p // k] >= 0:
            mask[p, :ranks[slot[p // k]]] = True
    assert np.abs(tt - want_t)[mask].max() <= tol * np.abs(want_t).max()
    y0 = torch.randn(t.shape[0], B.shape[2], device=dev).to(tdt)
    y = molora.lora_expand(t, Bc, y0.clone(), *args, scales=torch.from_numpy(scales).to(dev),
                           **kw)
    want = ref_expand(t.float().cpu().numpy(), Bc.float().cpu().numpy(),
                      y0.float().cpu().numpy(), topk, slot, ranks, scales)
    got = y.float().cpu().numpy()
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    y_again = molora.lora_expand(t, Bc, y0.clone(), *args,
                                 scales=torch.from_numpy(scales).to(dev), **kw)
    assert torch.equal(y, y_again)  # deterministic


@pytest.mark.gpu
def test_gpu_rejects_mixed_devices_and_dtypes():
    torch = _torch_cuda()
    x, A, B, topk, slot, ranks, scales = make()
    xc = torch.from_numpy(x).cuda()
    Ac = torch.from_numpy(A).cuda()
    with pytest.raises(ValueError, match="topk_ids"):
        molora.lora_shrink(xc, Ac, torch.from_numpy(topk), torch.from_numpy(slot).cuda(),
                           ranks=torch.from_numpy(ranks).cuda())
    with pytest.raises(TypeError, match="A"):
        molora.lora_shrink(xc, Ac.to(torch.bfloat16), torch.from_numpy(topk).cuda(),
                           torch.from_numpy(slot).cuda(), ranks=torch.from_numpy(ranks).cuda())


def test_cpu_moe_delta_is_shrink_then_expand():
    # One call, the same bits as lora_shrink then lora_expand (t rounded to the storage type
    # between them), plain and aligned; t is the workspace and holds the shrink's rows.
    x, A, B, topk, slot, ranks, scales = make(T=7, k=3, S=3, E=5, r_max=16, K=40, N=24)
    y0 = np.random.default_rng(SEED + 1).uniform(-1, 1, (topk.size, B.shape[2])).astype(np.float16)
    t_want = molora.lora_shrink(x, A, topk, slot, ranks=ranks)
    y_want = molora.lora_expand(t_want, B, y0.copy(), topk, slot, ranks=ranks, scales=scales)
    t = np.zeros_like(t_want)
    y = molora.lora_moe_delta(x, A, B, y0.copy(), topk, slot, ranks=ranks, scales=scales, t=t)
    assert (y == y_want).all() and (t == t_want).all()
    y1 = molora.lora_moe_delta(x, A, B, y0.copy(), topk, slot, ranks=ranks, scales=scales,
                               after_delta=True)  # (no effect on the CPU)
    assert (y1 == y_want).all()
    np.testing.assert_allclose(
        y.astype(np.float64),
        ref_expand(t_want, B, y0, topk, slot, ranks, scales), rtol=2e-3, atol=2e-3)
    k = topk.shape[1]
    srt, eids, ntpp = align(topk, slot, A.shape[0], A.shape[1], 4)
    y2 = molora.lora_moe_delta(x, A, B, y0.copy(), ranks=ranks, scales=scales,
                               sorted_token_ids=srt, expert_ids=eids, num_tokens_post_pad=ntpp,
                               block_size=4, top_k=k)
    assert (y2 == y_want).all()


def test_plain_routing_through_molora_align_is_the_plain_result():
    # The module docstring's advice for plain routing from ~32 tokens: molora's own align (slot
    # ids, V = S*E, block 16), then the aligned call. Same bits as the plain call, and the align
    # output is the layout the reference helper builds.
    T, k, S, E = 40, 3, 3, 5
    x, A, B, topk, slot, ranks, scales = make(T=T, k=k, S=S, E=E, r_max=16, K=40, N=24)
    y0 = np.random.default_rng(SEED + 2).uniform(-1, 1, (topk.size, B.shape[2])).astype(np.float16)
    y_plain = molora.lora_moe_delta(x, A, B, y0.copy(), topk, slot, ranks=ranks, scales=scales)
    srt, eids, ntpp = molora.moe_align_block_size(topk, S * E, 16, slot_ids=slot,
                                                  num_base_experts=E)
    want = align(topk, slot, S, E, 16)
    assert (srt == want[0]).all() and (eids == want[1]).all() and int(ntpp[0]) == int(want[2][0])
    y = molora.lora_moe_delta(x, A, B, y0.copy(), ranks=ranks, scales=scales,
                              sorted_token_ids=srt, expert_ids=eids, num_tokens_post_pad=ntpp,
                              block_size=16, top_k=k)
    assert (y == y_plain).all()
    assert not (y == y0).all()  # (some token has an adapter: the call changed y)


def test_cpu_moe_delta_errors_write_nothing():
    x, A, B, topk, slot, ranks, scales = make()
    t = np.zeros((topk.size, A.shape[2]), np.float16)
    y = np.ones((topk.size, B.shape[2]), np.float16)
    bad = slot.copy()
    bad[1] = A.shape[0]
    with pytest.raises(ValueError, match="slot_ids"):
        molora.lora_moe_delta(x, A, B, y, topk, bad, ranks=ranks, scales=scales, t=t)
    with pytest.raises(ValueError, match="B"):  # B's experts are not A's
        molora.lora_moe_delta(x, A, B[:, :4].copy(), y, topk, slot, ranks=ranks, t=t)
    with pytest.raises(ValueError, match="B"):  # B's rank is not A's
        molora.lora_moe_delta(x, A, B[..., :8].copy(), y, topk, slot, ranks=ranks, t=t)
    with pytest.raises(ValueError, match="y"):
        molora.lora_moe_delta(x, A, B, y[:, :8].copy(), topk, slot, ranks=ranks, t=t)
    with pytest.raises(ValueError, match="t"):
        molora.lora_moe_delta(x, A, B, y, topk, slot, ranks=ranks, t=t[:, :8].copy())
    with pytest.raises(TypeError, match="B"):
        molora.lora_moe_delta(x, A, B.astype(np.float32), y, topk, slot, ranks=ranks, t=t)
    with pytest.raises(ValueError, match="ranks"):
        molora.lora_moe_delta(x, A, B, y, topk, slot, ranks=np.full(3, 99, np.int32), t=t)
    assert not t.any() and (y == 1).all()


def test_plan_delta_reads_the_expands_inputs_early():
    kw = dict(top_k=8, num_slots=8, num_experts=128, r_max=16, routing="aligned",
              block_size=16, config_path="none", sm_count=132)
    d = molora.lora_plan("delta", num_tokens=8, K=2048, N=4096, **kw)
    assert set(d) == {"shrink", "expand"}
    assert d["shrink"]["variant"] == "shrink.aligned-stream.bf16"
    assert d["expand"]["variant"] == "expand.aligned-stream.bf16"
    assert d["shrink"]["early_inputs"] is False and d["expand"]["early_inputs"] is True
    e = molora.lora_plan("expand", num_tokens=8, N=4096, **kw)
    assert e["tile"] == d["expand"]["tile"] and e["early_inputs"] is False
    kw["routing"], kw["block_size"] = "plain", 0
    p = molora.lora_plan("delta", num_tokens=8, K=2048, N=4096, **kw)
    assert p["expand"]["kernel"] == "grid" and p["expand"]["early_inputs"] is False
    with pytest.raises(ValueError, match="N must be"):
        molora.lora_plan("delta", num_tokens=8, K=2048, N=12, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["plain", "aligned"])
@pytest.mark.parametrize("T", [1, 8, 40])
def test_gpu_moe_delta_matches_reference_and_the_two_calls(routing, T):
    torch = _torch_cuda()
    x, A, B, topk, slot, ranks, scales = make(T=T, k=8, S=4, E=16, r_max=32, K=1024, N=520,
                                               dtype=np.float32)
    dev = "cuda"
    xc, Ac, Bc = (torch.from_numpy(a).to(dev, torch.bfloat16) for a in (x, A, B))
    k = topk.shape[1]
    args, kw = _cuda_routing(torch, routing, topk, slot, 4, 16)
    kw.update(ranks=torch.from_numpy(ranks).to(dev), scales=torch.from_numpy(scales).to(dev))
    y0 = torch.randn(T * k, B.shape[2], device=dev).to(torch.bfloat16)
    t = torch.full((T * k, A.shape[2]), float("nan"), device=dev, dtype=torch.bfloat16)
    y = molora.lora_moe_delta(xc, Ac, Bc, y0.clone(), *args, t=t, **kw)
    t_ref = ref_shrink(xc.float().cpu().numpy(), Ac.float().cpu().numpy(), topk, slot, ranks)
    want = ref_expand(t_ref, Bc.float().cpu().numpy(), y0.float().cpu().numpy(), topk, slot,
                      ranks, scales)
    got = y.float().cpu().numpy()
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    shrink_kw = {kk: v for kk, v in kw.items() if kk != "scales"}
    t2 = molora.lora_shrink(xc, Ac, *args, **shrink_kw)
    y2 = molora.lora_expand(t2, Bc, y0.clone(), *args, **kw)
    assert torch.equal(y, y2)  # the same kernels' bits
    # A second delta right after the first (as up's after gate's): its shrink may read early.
    y3 = y0.clone()
    molora.lora_moe_delta(xc, Ac, Bc, y0.clone(), *args, t=t, **kw)
    molora.lora_moe_delta(xc, Ac, Bc, y3, *args, t=t2, after_delta=True, **kw)
    assert torch.equal(y3, y)
