"""molora.moe_align_block_size: the numpy path (CPU reference) here, the CUDA path with torch
tensors on the device (marker gpu). Expected results come from an independent numpy oracle."""
import random

import numpy as np
import pytest

import molora


def oracle(ids, V, B, slots=None, E=None):
    ids = np.asarray(ids, np.int64)
    T, k = ids.shape
    flat = ids.reshape(-1)
    v = flat.copy()
    if slots is not None:
        s = np.repeat(np.asarray(slots, np.int64), k)
        v = np.where((s < 0) | (flat < 0) | (flat >= E), -1, s * E + flat)
    v = np.where((v >= 0) & (v < V), v, -1)
    numel = T * k
    L = numel + V * (B - 1)
    sorted_ids = np.full(L, numel, np.int32)
    eids = np.full(-(-L // B), -1, np.int32)
    pos = 0
    for e in range(V):
        idx = np.nonzero(v == e)[0]
        if len(idx) == 0:
            continue
        sorted_ids[pos:pos + len(idx)] = idx
        padded = -(-len(idx) // B) * B
        eids[pos // B:(pos + padded) // B] = e
        pos += padded
    return sorted_ids, eids, np.array([pos], np.int32)


def seeded():
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    return np.random.default_rng(seed)


@pytest.mark.parametrize("T,k,V,B", [(0, 8, 64, 16), (1, 8, 256, 16), (15, 2, 64, 16),
                                     (16, 8, 1024, 64), (17, 1, 3, 32), (200, 8, 8192, 256)])
def test_numpy_matches_oracle(T, k, V, B):
    rng = seeded()
    ids = rng.integers(-2, V + 2, size=(T, k), dtype=np.int32)
    got = molora.moe_align_block_size(ids, V, B)
    for g, e in zip(got, oracle(ids, V, B)):
        assert g.dtype == np.int32
        np.testing.assert_array_equal(g, e)


def test_int64_slots_and_num_dropped():
    rng = seeded()
    T, k, E, S = 50, 4, 16, 4
    ids = rng.integers(-1, E + 1, size=(T, k)).astype(np.int64)
    ids[0, 0] = 2**40
    slots = rng.integers(-1, S + 1, size=T).astype(np.int32)
    dropped = np.zeros(2, np.int32)
    got = molora.moe_align_block_size(ids, S * E, 16, slot_ids=slots, num_base_experts=E,
                                      num_dropped=dropped)
    for g, e in zip(got, oracle(ids, S * E, 16, slots, E)):
        np.testing.assert_array_equal(g, e)
    assert dropped[1] == (slots == -1).sum() * k
    assert dropped.sum() == T * k - np.isin(got[0], np.arange(T * k)).sum()


def test_out_buffers_are_used():
    ids = np.arange(12, dtype=np.int32).reshape(6, 2) % 5
    sz = molora.moe_align_sizes(6, 2, 5, 16)
    out = (np.empty(sz["sorted_token_ids"], np.int32), np.empty(sz["expert_ids"], np.int32),
           np.empty(1, np.int32))
    got = molora.moe_align_block_size(ids, 5, 16, out=out)
    assert all(g is o for g, o in zip(got, out))
    np.testing.assert_array_equal(out[0], oracle(ids, 5, 16)[0])


def test_errors_name_the_argument():
    ids = np.zeros((4, 2), np.int32)
    with pytest.raises(ValueError, match="block_size"):
        molora.moe_align_block_size(ids, 8, 24)
    with pytest.raises(ValueError, match="num_experts"):
        molora.moe_align_block_size(ids, 0, 16)
    with pytest.raises(ValueError, match="num_experts"):
        molora.moe_align_block_size(ids, 65537, 16)
    with pytest.raises(TypeError, match="topk_ids"):
        molora.moe_align_block_size(ids.astype(np.float32), 8, 16)
    with pytest.raises(ValueError, match="topk_ids"):
        molora.moe_align_block_size(np.zeros(8, np.int32), 8, 16)
    with pytest.raises(ValueError, match="contiguous"):
        molora.moe_align_block_size(np.zeros((4, 4), np.int32)[:, ::2], 8, 16)
    with pytest.raises(ValueError, match="slot_ids"):
        molora.moe_align_block_size(ids, 8, 16, slot_ids=np.zeros(3, np.int32),
                                    num_base_experts=4)
    with pytest.raises(ValueError, match="num_base_experts"):
        molora.moe_align_block_size(ids, 8, 16, slot_ids=np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="num_experts"):
        molora.moe_align_block_size(ids, 8.0, 16)
    with pytest.raises(TypeError):
        molora.moe_align_block_size([[1, 2]], 8, 16)
    bad = (np.empty(3, np.int32), np.empty(1, np.int32), np.empty(1, np.int32))
    with pytest.raises(ValueError, match="sorted_token_ids"):
        molora.moe_align_block_size(ids, 8, 16, out=bad)


@pytest.mark.gpu
def test_torch_cuda_matches_cpu_and_oracle():
    import torch
    rng = seeded()
    for T, V, B in [(1, 256, 16), (64, 8192, 64), (256, 65536, 16), (4096, 8192, 64)]:
        ids = rng.integers(-1, V + 1, size=(T, 8), dtype=np.int32)
        t = torch.from_numpy(ids).cuda()
        got = molora.moe_align_block_size(t, V, B)
        torch.cuda.synchronize()
        assert all(g.device.type == "cuda" and g.dtype == torch.int32 for g in got)
        for g, e in zip(got, molora.moe_align_block_size(ids, V, B)):
            np.testing.assert_array_equal(g.cpu().numpy(), e)


@pytest.mark.gpu
def test_torch_cuda_graph_replay_with_new_ids():
    import torch
    rng = seeded()
    T, k, V, B, E = 128, 8, 8192, 16, 256
    ids = torch.zeros((T, k), dtype=torch.int32, device="cuda")
    slots = torch.zeros(T, dtype=torch.int32, device="cuda")
    sz = molora.moe_align_sizes(T, k, V, B)
    out = tuple(torch.empty(n, dtype=torch.int32, device="cuda")
                for n in (sz["sorted_token_ids"], sz["expert_ids"], 1))
    ws = torch.empty(sz["workspace_bytes"] // 4, dtype=torch.int32, device="cuda")
    kw = dict(slot_ids=slots, num_base_experts=E, out=out, workspace=ws)
    molora.moe_align_block_size(ids, V, B, **kw)  # warm-up, eager
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        molora.moe_align_block_size(ids, V, B, **kw)
    for _ in range(2):
        h_ids = rng.integers(0, E, size=(T, k), dtype=np.int32)
        h_slots = rng.integers(-1, V // E, size=T, dtype=np.int32)
        ids.copy_(torch.from_numpy(h_ids))
        slots.copy_(torch.from_numpy(h_slots))
        g.replay()
        torch.cuda.synchronize()
        for o, e in zip(out, oracle(h_ids, V, B, h_slots, E)):
            np.testing.assert_array_equal(o.cpu().numpy(), e)


@pytest.mark.gpu
def test_cuda_rejects_cpu_outputs():
    import torch
    ids = torch.zeros((4, 2), dtype=torch.int32, device="cuda")
    sz = molora.moe_align_sizes(4, 2, 8, 16)
    bad = (np.empty(sz["sorted_token_ids"], np.int32), np.empty(sz["expert_ids"], np.int32),
           np.empty(1, np.int32))
    with pytest.raises(ValueError, match="sorted_token_ids"):
        molora.moe_align_block_size(ids, 8, 16, out=bad)
