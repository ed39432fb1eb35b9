"""molora: MoE multi-LoRA decode kernels, P2P all-reduce, adapter pool and trace analysis.

Arrays cross the boundary through DLPack: numpy arrays run the CPU reference, CUDA tensors
(torch, cupy) run the kernels. A ``stream`` argument defaults to torch's current stream when
torch is importable, else the default stream.
"""
from __future__ import annotations

import json as _json

from . import _molora

__version__: str = _molora.version()


def info() -> dict:
    """Build architectures, CUDA runtime/driver, GPUs, peer-access matrix, NCCL version and the
    effective MOLORA_* settings, as a dict (the same data as ``molora info --json``)."""
    return _json.loads(_molora.info_json())


def info_text() -> str:
    """The same report as text, exactly as ``molora info`` prints it."""
    return _molora.info_text()


def gpu_count() -> int:
    """Number of usable CUDA devices (0 on a machine without GPU or a build without CUDA)."""
    return _molora.gpu_count()


def get_setting(name: str) -> str:
    """Effective value of a ``MOLORA_*`` switch, read now (not cached)."""
    return _molora.get_setting(name)


def set_setting(name: str, value: str | None) -> None:
    """Override a ``MOLORA_*`` switch for this process; ``None`` removes the override."""
    _molora.set_setting(name, None if value is None else str(value))


__all__ = ["__version__", "info", "info_text", "gpu_count", "get_setting", "set_setting"]

# Parts add their public names here (each module defines __all__).
from ._parts import load_parts as _load_parts  # noqa: E402

__all__ += _load_parts(globals())
