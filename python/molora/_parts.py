"""Imports the part modules that exist (align, lora, comm, pool, prof, ...) and re-exports their
public names from the top-level package."""
from __future__ import annotations

import importlib

PARTS = ["align", "lora", "comm", "pool", "prof"]


def load_parts(namespace: dict) -> list[str]:
    names: list[str] = []
    for part in PARTS:
        try:
            mod = importlib.import_module(f"molora.{part}")
        except ModuleNotFoundError as e:
            if e.name == f"molora.{part}":
                continue  # part not built into this package
            raise
        namespace[part] = mod
        for n in getattr(mod, "__all__", []):
            namespace[n] = getattr(mod, n)
            names.append(n)
    return names
