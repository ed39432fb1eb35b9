"""pool: adapters written by the `safetensors` package (numpy API) round-trip bit-exact into the
slot layout; hostile files raise; the slot policy matches a simple Python model on random
sequences; the device pool (gpu marker) matches the CPU pool."""
import json
import os
import random

import numpy as np
import pytest
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

import molora

L, E, H, I, RMAX = 2, 3, 16, 8, 8


def f32_to_bf16_bits(x):
    """Round to nearest even, the reference for the pool's conversion."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def save_bf16(tensors, path):
    """BF16 file through the safetensors package (numpy has no bfloat16: raw bit patterns)."""
    keep = {k: np.ascontiguousarray(f32_to_bf16_bits(v)) for k, v in tensors.items()}
    serialize_file({k: TensorSpec(dtype="bfloat16", shape=v.shape, data_ptr=v.ctypes.data,
                                  data_len=v.nbytes) for k, v in keep.items()}, path)


def name(l, e, proj, ab):
    return f"base_model.model.model.layers.{l}.mlp.experts.{e}.{proj}.lora_{ab}.weight"


def make_adapter(root, tag, rng, r=4, alpha=8.0, dtype="float32", fused=False, rslora=False,
                 extra=None, layers=L, experts=E):
    """Random weights (fresh every run) as float32 arrays, written in `dtype`."""
    t = {}
    for l in range(layers):
        for e in range(experts):
            if fused:
                t[name(l, e, "gate_up_proj", "A")] = rng.standard_normal((r, H), dtype=np.float32)
                t[name(l, e, "gate_up_proj", "B")] = rng.standard_normal((2 * I, r), dtype=np.float32)
            else:
                for p in ("gate_proj", "up_proj"):
                    t[name(l, e, p, "A")] = rng.standard_normal((r, H), dtype=np.float32)
                    t[name(l, e, p, "B")] = rng.standard_normal((I, r), dtype=np.float32)
            t[name(l, e, "down_proj", "A")] = rng.standard_normal((r, I), dtype=np.float32)
            t[name(l, e, "down_proj", "B")] = rng.standard_normal((H, r), dtype=np.float32)
    d = os.path.join(root, tag)
    os.makedirs(d, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": rslora,
           "target_modules": ["gate_proj", "up_proj", "down_proj", "gate_up_proj"]}
    cfg.update(extra or {})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    path = os.path.join(d, "adapter_model.safetensors")
    if dtype == "bfloat16":
        save_bf16(t, path)
        t = {k: bf16_bits_to_f32(f32_to_bf16_bits(v)) for k, v in t.items()}
    else:
        t = {k: v.astype(dtype) for k, v in t.items()}
        save_file(t, path)
    return d, t


def expected_bits(x, pool_dtype):
    """What the pool must hold for source values x (numpy array of the file's dtype)."""
    if pool_dtype == "bfloat16":
        return f32_to_bf16_bits(x.astype(np.float32))
    return x.astype(pool_dtype)


def check_slot(pool, slot, t, r, pool_dtype, fused=False):
    for l in range(L):
        v = pool.tensors(l)
        for e in range(E):
            for m, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
                if fused and m < 2:
                    a = t[name(l, e, "gate_up_proj", "A")]
                    b = t[name(l, e, "gate_up_proj", "B")][m * I:(m + 1) * I]
                else:
                    a, b = t[name(l, e, proj, "A")], t[name(l, e, proj, "B")]
                A = v["a_down"][slot, e] if m == 2 else v["a_gate_up"][m, slot, e]
                B = v["b_down"][slot, e] if m == 2 else v["b_gate_up"][m, slot, e]
                np.testing.assert_array_equal(A[:r], expected_bits(a, pool_dtype))
                np.testing.assert_array_equal(B[:, :r], expected_bits(b, pool_dtype))
                assert not A[r:].any() and not B[:, r:].any()


@pytest.fixture
def rng():
    seed = random.SystemRandom().randrange(2**32)
    print("seed", seed)
    return np.random.default_rng(seed)


def new_pool(slots=2, dtype="bfloat16", device="cpu", **kw):
    return molora.AdapterPool(slots, L, E, H, I, RMAX, dtype=dtype, device=device, **kw)


@pytest.mark.parametrize("src,dst,fused", [
    ("float32", "float32", False), ("float16", "float16", False), ("bfloat16", "bfloat16", False),
    ("float32", "bfloat16", False), ("float32", "float16", False), ("float16", "float32", True),
    ("bfloat16", "float32", True)])
def test_round_trip_bit_exact(tmp_path, rng, src, dst, fused):
    d, t = make_adapter(str(tmp_path), "a", rng, dtype=src, fused=fused)
    pool = new_pool(dtype=dst)
    pool.load("a", d)
    slots = pool.prepare([None, "a", None, "a"])
    assert slots.dtype == np.int32 and slots.tolist()[0] == -1 and slots[1] == slots[3] >= 0
    check_slot(pool, int(slots[1]), t, 4, dst, fused)
    v = pool.tensors(0)
    assert v["rank"][:, slots[1]].tolist() == [4, 4, 4]
    assert v["rank"][:, 1 - slots[1]].tolist() == [0, 0, 0]
    np.testing.assert_allclose(v["scale"][:, slots[1]], 2.0)


def test_rslora_and_patterns(tmp_path, rng):
    d, _ = make_adapter(str(tmp_path), "rs", rng, r=4, alpha=16.0, rslora=True)
    d2, _ = make_adapter(str(tmp_path), "pat", rng, r=4, alpha=8.0,
                         extra={"alpha_pattern": {"down_proj": 2.0}})
    pool = new_pool()
    pool.load("rs", d)
    pool.load("pat", d2)
    s = pool.prepare(["rs", "pat"])
    sc = pool.tensors(1)["scale"]
    np.testing.assert_allclose(sc[:, s[0]], 16.0 / 2.0)
    np.testing.assert_allclose(sc[:, s[1]], [2.0, 2.0, 0.5])
    info = pool.info("rs")
    assert info["use_rslora"] and info["r"] == 4 and len(info["rank"]) == L * 3


def write_raw(path, header: bytes, data: bytes = b"", length=None):
    n = len(header) if length is None else length
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little") + header + data)


@pytest.mark.parametrize("header,data,length,expect", [
    (b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8, 1000,
     "past the end of the file"),
    (b"{}", b"", 2**40, "exceeds the limit"),
    (b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]', b"\0" * 8, None, "bad JSON"),
    (b'{"t": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8, None, "unknown dtype"),
    (b'{"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}', b"\0" * 8, None, "span"),
    (b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 4, None,
     "past the data buffer"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
     b'"b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}', b"\0" * 12, None, "overlap"),
])
def test_hostile_files_raise_and_leave_the_pool_unchanged(tmp_path, rng, header, data, length,
                                                          expect):
    good, _ = make_adapter(str(tmp_path), "good", rng)
    pool = new_pool()
    pool.load("good", good)
    pool.prepare(["good"])
    before = pool.stats()
    d = tmp_path / "bad"
    d.mkdir()
    (d / "adapter_config.json").write_text('{"r": 4}')
    write_raw(str(d / "adapter_model.safetensors"), header, data, length)
    with pytest.raises(RuntimeError, match="parse_error") as e:
        pool.load("bad", str(d))
    assert expect in str(e.value) and "adapter_model.safetensors" in str(e.value)
    assert pool.stats() == before
    with pytest.raises(ValueError):
        pool.prepare(["bad"])


def test_rank_over_r_max_and_shape_mismatch(tmp_path, rng):
    pool = new_pool()
    d, _ = make_adapter(str(tmp_path), "big", rng, r=RMAX + 1)
    with pytest.raises(ValueError, match="exceeds the pool's r_max"):
        pool.load("big", d)
    d, _ = make_adapter(str(tmp_path), "more", rng, experts=E + 1)
    with pytest.raises(ValueError, match="past the model's 3 experts"):
        pool.load("more", d)
    assert pool.stats()["adapters"] == 0


def rewrite(d, tensors, cfg=None):
    """Re-saves an adapter directory's tensors (float32, through the safetensors package) and,
    optionally, its adapter_config.json."""
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(d, "adapter_model.safetensors"))
    if cfg is not None:
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(cfg, f)


def test_broken_adapters_name_file_and_tensor(tmp_path, rng):
    pool = new_pool()
    d, t = make_adapter(str(tmp_path), "a", rng)
    a0 = name(0, 1, "up_proj", "A")
    b0 = name(0, 1, "up_proj", "B")
    missing_b = {k: v for k, v in t.items() if k != b0}
    rewrite(d, missing_b)
    with pytest.raises(RuntimeError, match="parse_error") as e:
        pool.load("a", d)
    assert "lora_A without its lora_B" in str(e.value) and a0 in str(e.value)
    assert "adapter_model.safetensors" in str(e.value)
    mismatch = dict(t)
    mismatch[b0] = rng.standard_normal((I, 3), dtype=np.float32)
    rewrite(d, mismatch)
    with pytest.raises(RuntimeError, match="has rank 4 but") as e:
        pool.load("a", d)
    assert b0 in str(e.value)
    wrong = dict(t)
    wrong[a0] = rng.standard_normal((4, H + 8), dtype=np.float32)
    rewrite(d, wrong)
    with pytest.raises(ValueError, match="does not match the model") as e:
        pool.load("a", d)
    assert a0 in str(e.value)
    assert pool.stats()["adapters"] == 0 and pool.stats()["host_image_bytes"] == 0


def test_rank_pattern_and_mixtral_names(tmp_path, rng):
    d, t = make_adapter(str(tmp_path), "p", rng, r=4)
    # down_proj of every expert at rank 2 (rank_pattern), alpha 6 (alpha_pattern); Mixtral names.
    t2, ren = {}, {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    for k, v in t.items():
        if "down_proj" in k:
            v = v[:2] if "lora_A" in k else v[:, :2]
        for a, b in ren.items():
            k = k.replace(f".{a}.", f".{b}.")
        t2[k.replace(".mlp.experts.", ".block_sparse_moe.experts.")] = v
    rewrite(d, t2, {"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                    "target_modules": ["w1", "w2", "w3"], "rank_pattern": {"w2": 2},
                    "alpha_pattern": {"w2": 6}})
    pool = new_pool(dtype="float32")
    pool.load("p", d)
    s = int(pool.prepare(["p"])[0])
    for l in range(L):
        v = pool.tensors(l)
        assert v["rank"][:, s].tolist() == [4, 4, 2]
        np.testing.assert_allclose(v["scale"][:, s], [2.0, 2.0, 3.0])
        for e in range(E):
            key = f"base_model.model.model.layers.{l}.block_sparse_moe.experts.{e}"
            np.testing.assert_array_equal(v["a_down"][s, e, :2], t2[key + ".w2.lora_A.weight"])
            np.testing.assert_array_equal(v["b_down"][s, e, :, :2], t2[key + ".w2.lora_B.weight"])
            assert not v["a_down"][s, e, 2:].any() and not v["b_down"][s, e, :, 2:].any()
            np.testing.assert_array_equal(v["b_gate_up"][1, s, e, :, :4],
                                          t2[key + ".w3.lora_B.weight"])


class PolicyModel:
    """The slot policy, as simply as possible: free slots lowest first, then the least recently
    used unpinned adapter not in the batch; the batch's adapters are touched in order of first
    appearance; a batch that does not fit changes nothing."""

    def __init__(self, slots):
        self.owner = [None] * slots
        self.last = {}
        self.clock = 0
        self.pinned = set()

    def prepare(self, names):
        distinct = list(dict.fromkeys(n for n in names if n is not None))
        if len(distinct) > len(self.owner):
            return None
        missing = [n for n in distinct if n not in self.owner]
        free = [s for s, o in enumerate(self.owner) if o is None]
        victims = sorted((s for s, o in enumerate(self.owner)
                          if o is not None and o not in self.pinned and o not in distinct),
                         key=lambda s: self.last[self.owner[s]])
        if len(missing) > len(free) + len(victims):
            return None
        for n, s in zip(missing, free + victims):
            self.owner[s] = n
        for n in distinct:
            self.clock += 1
            self.last[n] = self.clock
        return [-1 if n is None else self.owner.index(n) for n in names]

    def unload(self, n):
        if n in self.owner:
            self.owner[self.owner.index(n)] = None


def test_policy_matches_the_model_on_random_sequences(tmp_path, rng):
    names = [f"ad{i}" for i in range(7)]
    dirs = {n: make_adapter(str(tmp_path), n, rng, r=1 + i % RMAX)[0] for i, n in enumerate(names)}
    for trial in range(4):
        pool = new_pool(slots=3, dtype="float32")
        model = PolicyModel(3)
        loaded = set()
        for n in names:
            pool.load(n, dirs[n])
            loaded.add(n)
        for step in range(300):
            op = rng.random()
            if op < 0.1:
                n = names[rng.integers(len(names))]
                if n in loaded:
                    pool.pin(n)
                    model.pinned.add(n)
            elif op < 0.25:
                n = names[rng.integers(len(names))]
                if n in loaded:
                    pool.unpin(n)
                    model.pinned.discard(n)
            elif op < 0.3:
                n = names[rng.integers(len(names))]
                if n in loaded and n not in model.pinned:
                    pool.unload(n)
                    model.unload(n)
                    loaded.discard(n)
                elif n not in loaded:
                    pool.load(n, dirs[n])
                    loaded.add(n)
            else:
                pick = [None] + [n for n in names if n in loaded]
                k = int(rng.integers(1, 5))
                choice = [pick[rng.integers(len(pick))] for _ in range(k)]
                batch = [choice[rng.integers(k)] for _ in range(int(rng.integers(0, 12)))]
                want = model.prepare(batch)
                before = [pool.slot_adapter(s) for s in range(3)]
                if want is None:
                    with pytest.raises(RuntimeError, match="resource_exhausted"):
                        pool.prepare(batch)
                    assert [pool.slot_adapter(s) for s in range(3)] == before
                else:
                    assert pool.prepare(batch).tolist() == want, (trial, step, batch)
            assert [pool.slot_adapter(s) for s in range(3)] == model.owner
        st = pool.stats()
        assert st["resident"] == sum(o is not None for o in model.owner)
        assert st["pinned"] == len(model.pinned & loaded)
        for s, n in enumerate(model.owner):  # contents follow the owners
            if n is not None:
                assert pool.tensors(0)["rank"][0, s] == 1 + names.index(n) % RMAX


def test_bad_arguments():
    with pytest.raises(ValueError):
        molora.AdapterPool(0, L, E, H, I)
    with pytest.raises(TypeError):
        molora.AdapterPool(2, L, E, H, I, dtype="int8")
    with pytest.raises(ValueError):
        molora.AdapterPool(2, L, E, H, I, device="tpu")
    pool = new_pool()
    with pytest.raises(ValueError, match="not loaded"):
        pool.prepare(["nope"])
    with pytest.raises(ValueError):
        pool.tensors(L)


@pytest.mark.gpu
@pytest.mark.parametrize("pinned", [True, False])
def test_device_pool_matches_cpu_pool(tmp_path, rng, pinned):
    import torch
    dirs = [make_adapter(str(tmp_path), f"g{i}", rng, r=2 + 2 * i,
                         dtype=["float32", "bfloat16", "float16"][i % 3])[0] for i in range(4)]
    gpu = new_pool(slots=2, device="cuda", pinned_images=pinned, staging_bytes=4096)
    cpu = new_pool(slots=2)
    for i, d in enumerate(dirs):
        gpu.load(f"g{i}", d)
        cpu.load(f"g{i}", d)
    stream = torch.cuda.Stream()
    for batch in (["g0", None, "g1"], ["g2"], [None], ["g3", "g2", "g3"], ["g0", "g1"]):
        with torch.cuda.stream(stream):
            s = gpu.prepare(batch)
            assert s.is_cuda and s.dtype == torch.int32
            got = s.cpu().tolist()
        assert got == cpu.prepare(batch).tolist()
        for l in range(L):
            tg, tc = gpu.tensors(l), cpu.tensors(l)
            for k in tg:
                g = tg[k].cpu()
                if g.dtype == torch.bfloat16:
                    g = g.view(torch.int16)
                np.testing.assert_array_equal(g.numpy().view(tc[k].dtype), tc[k])
    assert gpu.stats()["bytes_uploaded"] == cpu.stats()["bytes_uploaded"]
