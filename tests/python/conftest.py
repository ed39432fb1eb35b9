"""Shared pytest fixtures: the `gpu` marker skips (with the reason) when no CUDA device or no
torch is present."""
import pytest

import molora


def _gpu_reason():
    if molora.gpu_count() == 0:
        return "no CUDA device: " + (molora.info()["runtime"]["gpu_error"] or "none seen")
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (GPU tests use torch CUDA tensors)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test skipped: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
