"""Adapter slot pool: PEFT LoRA adapters of a MoE model's routed experts, loaded from
safetensors into ``num_slots`` slots that the lora kernels read (see docs/pool.md).

Slot layout, per layer (the pool's dtype, row-major)::

    a_gate_up [2, S, E, r_max, H]   slice 0 gate_proj, 1 up_proj
    b_gate_up [2, S, E, I, r_max]
    a_down    [S, E, r_max, I]
    b_down    [S, E, H, r_max]
    rank      [3, S] int32          gate, up, down (0 = empty / not adapted)
    scale     [3, S] float32        lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora

A token without adapter (``None``) gets slot ``-1`` and never takes a slot.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from . import _molora
from ._arrays import stream_handle

__all__ = ["AdapterPool"]


def _device_index(device: Any) -> int:
    if device is None or device == "cpu":
        return -1
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or N >= 0, got {device}")
        return device
    s = str(device)
    if s == "cuda":
        try:
            import torch
            return int(torch.cuda.current_device())
        except ImportError:
            return 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or N >= 0, got {device!r}")


class AdapterPool:
    """A pool of ``num_slots`` adapter slots for a MoE model.

    Args:
        num_slots: S, adapters resident at once.
        num_layers: L, model layers (layer ids of the tensor names; layers without experts stay
            empty).
        num_experts: E, routed experts per layer.
        hidden: H. intermediate: I (the expert intermediate size).
        r_max: the largest rank a slot holds.
        dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"`` (the slot dtype; files are
            converted, round to nearest even).
        device: ``"cpu"`` (host memory, the CPU reference path) or a CUDA device
            (``"cuda"``, ``"cuda:1"``, ``1``).
        pinned_images: device pool only: keep loaded adapters in pinned host memory (fastest
            upload) rather than pageable memory copied through pinned staging buffers.
        staging_bytes: size of each of the two staging buffers.
    """

    def __init__(self, num_slots: int, num_layers: int, num_experts: int, hidden: int,
                 intermediate: int, r_max: int = 16, dtype: str = "bfloat16",
                 device: Any = "cpu", pinned_images: bool = True,
                 staging_bytes: int = 32 << 20):
        self._device = _device_index(device)
        self._dtype = dtype
        self._pool = _molora.Pool(int(num_slots), int(num_layers), int(num_experts), int(hidden),
                                  int(intermediate), int(r_max), str(dtype), self._device,
                                  bool(pinned_images), int(staging_bytes))
        self._ids: dict[str, int] = {}
        self.num_slots = int(num_slots)
        self.num_layers = int(num_layers)

    @property
    def device(self) -> str:
        return "cpu" if self._device < 0 else f"cuda:{self._device}"

    def load(self, name: str, path: str) -> None:
        """Reads the PEFT adapter in directory ``path`` (``adapter_config.json`` and
        ``adapter_model.safetensors``), validates it against the model and converts it. It takes
        a slot at the first ``prepare`` that needs it. Raises ``ValueError`` (shape, rank,
        layer or expert not matching the pool) or ``RuntimeError`` (``parse_error: <file>:
        tensor "<name>": ...``, ``io_error: ...``); the pool is unchanged then."""
        self._ids[name] = self._pool.load(str(name), str(path))

    def _id(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise ValueError(f"adapter {name!r} is not loaded") from None

    def unload(self, name: str) -> None:
        """Forgets an adapter; its slot becomes free. ``ValueError`` when pinned."""
        self._pool.unload(self._id(name))
        del self._ids[name]

    def pin(self, name: str) -> None:
        """A pinned adapter is never evicted (pins do not nest)."""
        self._pool.pin(self._id(name))

    def unpin(self, name: str) -> None:
        self._pool.unpin(self._id(name))

    def prepare(self, names: Iterable[Optional[str]], stream: Any = None) -> Any:
        """Slot id per token for a batch: ``names[i]`` is a loaded adapter's name or ``None``
        (base model → ``-1``). Uploads missing adapters, evicting least recently used unpinned
        ones. Returns an int32 numpy array (CPU pool) or an int32 CUDA tensor on the pool's
        device (device pool; ``stream`` — default torch's current stream — waits for the
        uploads and the ids). A batch with more distinct adapters than slots, or not enough
        unpinned slots, raises ``RuntimeError`` (``resource_exhausted: ...``) and changes
        nothing."""
        ids = np.array([-1 if n is None or n == "" else self._id(n) for n in names],
                       dtype=np.int32)
        out = np.empty_like(ids)
        if ids.shape[0] == 0:  # nothing to place
            if self._device < 0:
                return out
            import torch
            return torch.empty(0, dtype=torch.int32, device=f"cuda:{self._device}")
        if self._device < 0:
            self._pool.prepare(ids, out, None, 0)
            return out
        import torch
        dev = torch.empty(ids.shape[0], dtype=torch.int32, device=f"cuda:{self._device}")
        self._pool.prepare(ids, out, dev, stream_handle(stream, dev))
        return dev

    def slot_of(self, name: str) -> int:
        """The adapter's slot, or -1 when not resident."""
        return int(self._pool.info(self._id(name))["slot"])

    def slot_adapter(self, slot: int) -> Optional[str]:
        """Name of the adapter in ``slot`` (None when empty)."""
        i = self._pool.slot_adapter(int(slot))
        if i < 0:
            return None
        return self._pool.info(i)["name"]

    def info(self, name: str) -> dict:
        """What the pool knows of an adapter: r, lora_alpha, use_rslora, per-layer rank and
        scale ([L*3]), slot, pinned, tensors placed and ignored, bytes."""
        return self._pool.info(self._id(name))

    def adapters(self) -> list:
        return self._pool.adapters()

    def stats(self) -> dict:
        """Counters: resident, pinned, adapters, prepares, hits, uploads, evictions, rejected,
        bytes_uploaded, host_image_bytes, slot_bytes, device_bytes."""
        return self._pool.stats()

    def synchronize(self) -> None:
        """Waits until every upload finished."""
        self._pool.synchronize()

    def tensors(self, layer: int) -> dict:
        """Views (no copy) of layer ``layer``'s slot tensors: ``a_gate_up``, ``b_gate_up``,
        ``a_down``, ``b_down``, ``rank``, ``scale``. CPU pool: numpy arrays (bfloat16 slots are
        shown as uint16 bit patterns: numpy has no bfloat16); device pool: torch CUDA tensors.
        The views keep the pool alive; their contents change with later ``prepare`` calls."""
        out = {}
        for which in ("a_gate_up", "b_gate_up", "a_down", "b_down", "rank", "scale"):
            if self._device < 0:
                out[which] = np.from_dlpack(self._pool.view(int(layer), which, True))
            else:
                import torch
                out[which] = torch.from_dlpack(self._pool.view(int(layer), which, False))
        return out
