"""Framework helpers of the Python layer: which framework an array belongs to, allocation of
outputs with the same framework and device, and stream resolution."""
from __future__ import annotations

from typing import Any

import numpy as np


def framework(a: Any) -> str:
    """'numpy', 'torch', 'cupy' or raise TypeError."""
    mod = type(a).__module__.split(".")[0]
    if isinstance(a, np.ndarray):
        return "numpy"
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    raise TypeError(f"expected a numpy array, torch tensor or cupy array, got {type(a).__name__}")


def is_cuda(a: Any) -> bool:
    fw = framework(a)
    if fw == "numpy":
        return False
    if fw == "torch":
        if a.device.type not in ("cpu", "cuda"):
            raise ValueError(f"unsupported torch device {a.device}")
        return a.device.type == "cuda"
    return True  # cupy


_NP_DTYPES = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float16": np.float16,
              "uint8": np.uint8}


def empty_like_framework(ref: Any, shape: tuple, dtype: str) -> Any:
    """An uninitialised array of `dtype` ('int32', 'float32', 'float16', 'bfloat16', ...) with the
    framework and device of `ref`."""
    fw = framework(ref)
    if fw == "numpy":
        if dtype == "bfloat16":
            raise TypeError("numpy has no bfloat16; pass ml_dtypes arrays or use torch")
        return np.empty(shape, dtype=_NP_DTYPES[dtype])
    if fw == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=ref.device)
    import cupy
    with cupy.cuda.Device(ref.device.id):
        return cupy.empty(shape, dtype=_NP_DTYPES[dtype])


def stream_handle(stream: Any, ref: Any) -> int:
    """The CUDA stream handle (int) to run on for an array `ref`: `stream` if given (int, or an
    object with .cuda_stream / .ptr), else torch's current stream for ref's device when torch is
    importable, else 0 (the default stream). CPU arrays get 0."""
    if stream is not None:
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        return int(stream)
    if not is_cuda(ref):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    dev = ref.device.index if framework(ref) == "torch" else ref.device.id
    return int(torch.cuda.current_stream(dev).cuda_stream)
