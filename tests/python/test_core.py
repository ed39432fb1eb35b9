import os
import subprocess
import sys

import numpy as np
import pytest

import molora
from molora import _arrays


def test_version_matches_package_metadata():
    assert molora.__version__ == "0.1.0"


def test_info_mirrors_cli_fields():
    i = molora.info()
    assert i["schema"] == "molora.info/1"
    assert i["version"] == molora.__version__
    for key in ("cuda", "architectures", "cuda_version", "nccl_version"):
        assert key in i["build"]
    for key in ("cuda_runtime", "cuda_driver", "nccl", "gpus", "peer_access"):
        assert key in i["runtime"]
    assert len(i["runtime"]["gpus"]) == molora.gpu_count()
    names = [s["name"] for s in i["settings"]]
    assert "MOLORA_COMM_TIMEOUT_MS" in names
    assert "MOLORA_COMM_TIMEOUT_MS" in molora.info_text()


def test_settings_read_when_used(monkeypatch):
    monkeypatch.setenv("MOLORA_COMM_TIMEOUT_MS", "321")
    assert molora.get_setting("MOLORA_COMM_TIMEOUT_MS") == "321"
    molora.set_setting("MOLORA_COMM_TIMEOUT_MS", 77)
    try:
        assert molora.get_setting("MOLORA_COMM_TIMEOUT_MS") == "77"
        assert molora._molora.setting_source("MOLORA_COMM_TIMEOUT_MS") == "api"
    finally:
        molora.set_setting("MOLORA_COMM_TIMEOUT_MS", None)
    assert molora.get_setting("MOLORA_COMM_TIMEOUT_MS") == "321"
    vals = {s["name"]: s["value"] for s in molora.info()["settings"]}
    assert vals["MOLORA_COMM_TIMEOUT_MS"] == "321"


def test_framework_helpers():
    a = np.zeros((2, 3), np.int32)
    assert _arrays.framework(a) == "numpy"
    assert not _arrays.is_cuda(a)
    b = _arrays.empty_like_framework(a, (4,), "float32")
    assert b.dtype == np.float32 and b.shape == (4,)
    assert _arrays.stream_handle(None, a) == 0
    assert _arrays.stream_handle(1234, a) == 1234
    with pytest.raises(TypeError):
        _arrays.framework([1, 2])
    with pytest.raises(TypeError):
        _arrays.empty_like_framework(a, (1,), "bfloat16")
