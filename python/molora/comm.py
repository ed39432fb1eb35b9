"""P2P all-reduce of one node (tensor-parallel reduction), that never hangs (docs/comm.md).

A :class:`Communicator` is one rank of a group. Its buffers are allocated and IPC-exchanged once
at creation; a call copies the tensor in, sums every rank's tensor in rank order in fp32 and
rounds once (bf16/fp16), so every rank gets the same bits, equal to :func:`all_reduce_reference`.
Calls are CUDA-graph capturable (the epoch lives on the device). Every wait is bounded
(``MOLORA_COMM_TIMEOUT_MS``, default 1000): a rank that stops makes the others report
``TimeoutError`` (naming rank and epoch) at the next call or :meth:`Communicator.check`, and every
later call goes to NCCL. A call that cannot take the P2P path (dtype, strided tensor, size,
alignment, world size, topology, IPC failure, an earlier timeout/mismatch) goes to NCCL and is
counted per reason in :meth:`Communicator.stats` and logged once — never silently.

Create with :meth:`Communicator.from_process_group` (a torch.distributed CPU/gloo group carries
the handle exchange), :meth:`Communicator.from_exchange` (any all-gather of bytes), or
:meth:`Communicator.local_group` (several ranks as streams of one process on one GPU: tests,
benchmarks).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from . import _molora
from ._arrays import framework, stream_handle

__all__ = ["Communicator", "all_reduce_reference", "all_reduce_residual_rmsnorm_reference",
           "FALLBACK_REASONS"]

#: Names of the fallback reasons, as :meth:`Communicator.stats` reports them.
FALLBACK_REASONS: list = list(_molora.comm_fallback_names())

_ALGOS = ("auto", "oneshot", "twoshot")


def _timeout(timeout_ms: Optional[int]) -> int:
    return -1 if timeout_ms is None else int(timeout_ms)


def _oneshot(oneshot_max_bytes: Optional[int]) -> int:
    return -1 if oneshot_max_bytes is None else int(oneshot_max_bytes)


def _current_device() -> int:
    try:
        import torch
        return int(torch.cuda.current_device())
    except (ImportError, RuntimeError, AssertionError):
        return 0


def _gloo_exchange(group: Any) -> Callable[[bytes], bytes]:
    """An all-gather of bytes over a torch.distributed group with a CPU backend (gloo)."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    if "gloo" not in backend:
        raise ValueError(f"group must have a CPU (gloo) backend for the handle exchange, got "
                         f"'{backend}' (create one with dist.new_group(backend='gloo'))")
    world = dist.get_world_size(group)

    def exchange(mine: bytes) -> bytes:
        t = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t, group=group)
        return b"".join(o.numpy().tobytes() for o in outs)

    return exchange


class Communicator:
    """One rank of an all-reduce group (see the module docstring)."""

    def __init__(self, native: Any):
        self._c = native

    # ---- creation --------------------------------------------------------------------------
    @classmethod
    def from_exchange(cls, rank: int, world: int, fn: Callable[[bytes], bytes], *,
                      device: Optional[int] = None, max_bytes: int = 0,
                      timeout_ms: Optional[int] = None, oneshot_max_bytes: Optional[int] = None,
                      algo: str = "auto", create_nccl: bool = True,
                      nccl_comm: Optional[int] = None) -> "Communicator":
        """Collective: every rank calls it. ``fn(mine: bytes) -> bytes`` is an all-gather over
        any CPU channel: it receives this rank's bytes (the same length on every rank) and returns
        ``world * len(mine)`` bytes, rank i's at offset ``i * len(mine)``; it is called 2-3 times,
        in the same order on every rank. ``device`` defaults to torch's current device;
        ``max_bytes`` (0 = ``MOLORA_COMM_MAX_BYTES``, 16 MiB) is the largest P2P message;
        ``nccl_comm`` is an ``ncclComm_t`` (as int) for the fallbacks, else molora creates one
        through ``fn`` when ``create_nccl``."""
        if not callable(fn):
            raise TypeError("fn must be callable: fn(mine: bytes) -> bytes")
        if algo not in _ALGOS:
            raise ValueError(f"algo must be one of {_ALGOS}, got {algo!r}")
        dev = _current_device() if device is None else int(device)
        native = _molora.Communicator.create(int(rank), int(world), dev, fn, int(max_bytes),
                                             _timeout(timeout_ms), _oneshot(oneshot_max_bytes),
                                             algo, bool(create_nccl), int(nccl_comm or 0))
        return cls(native)

    @classmethod
    def from_process_group(cls, group: Any = None, **kwargs) -> "Communicator":
        """Collective over a torch.distributed group whose backend is CPU (gloo); ``None`` is
        the default group. Rank and world come from the group; keyword arguments as
        :meth:`from_exchange`."""
        import torch.distributed as dist

        rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        return cls.from_exchange(rank, world, _gloo_exchange(group), **kwargs)

    @classmethod
    def local_group(cls, world: int, device: int = 0, *, max_bytes: int = 0,
                    timeout_ms: Optional[int] = None, oneshot_max_bytes: Optional[int] = None,
                    algo: str = "auto") -> list:
        """``world`` ranks in this process on one device (the peer table points into the same
        device's memory); run rank i on its own stream. No NCCL serves such a group: its
        fallbacks raise RuntimeError (Unavailable), counted."""
        if algo not in _ALGOS:
            raise ValueError(f"algo must be one of {_ALGOS}, got {algo!r}")
        natives = _molora.Communicator.create_local_group(int(world), int(device), int(max_bytes),
                                                          _timeout(timeout_ms),
                                                          _oneshot(oneshot_max_bytes), algo)
        return [cls(n) for n in natives]

    # ---- calls ---------------------------------------------------------------------------
    def all_reduce(self, x: Any, out: Any = None, *, stream: Any = None) -> Any:
        """``out = sum over ranks of x`` (fp32 in rank order, rounded once); ``out`` defaults to a
        new tensor like ``x``; ``out is x`` is allowed. Runs on ``stream`` (default: torch's
        current stream). A strided tensor is made contiguous and goes to NCCL, counted as
        ``not_contiguous``."""
        if out is None:
            out = _empty_like(x)
        s = stream_handle(stream, x)
        if _contiguous(x) and _contiguous(out):
            self._c.all_reduce(x, out, s)
            return out
        xc = x.contiguous()
        oc = _empty_like(xc)
        self._c.fallback_all_reduce(xc, oc, "not_contiguous", s)
        out.copy_(oc)
        return out

    def all_reduce_residual_rmsnorm(self, x: Any, residual: Any, weight: Any, eps: float = 1e-6,
                                    out: Any = None, *, stream: Any = None) -> Any:
        """``residual += all_reduce(x)`` (rounded as the unfused sequence), then
        ``out = rmsnorm(residual) * weight`` per row of ``hidden = x.shape[-1]``; returns out.
        One kernel on the one-shot path."""
        if out is None:
            out = _empty_like(x)
        self._c.all_reduce_residual_rmsnorm(x, residual, weight, out, float(eps),
                                            stream_handle(stream, x))
        return out

    def check(self) -> None:
        """Raises TimeoutError (a wait expired) or RuntimeError (Mismatch: ranks called in a
        different order or shape), naming rank and epoch, when a kernel of this rank has failed.
        Non-blocking; synchronise the stream first to see the latest call."""
        self._c.check()

    def stats(self) -> dict:
        """Counters: p2p_calls, oneshot_calls, twoshot_calls, fused_calls, nccl_calls,
        unavailable, and fallback: {reason: calls}."""
        return self._c.stats()

    def epoch(self) -> int:
        """The device epoch (completed P2P calls of this rank); synchronises."""
        return self._c.epoch()

    def set_max_bytes(self, nbytes: int) -> None:
        self._c.set_max_bytes(int(nbytes))

    def set_timeout_ms(self, ms: Optional[int]) -> None:
        self._c.set_timeout_ms(_timeout(ms))

    def set_algo(self, algo: str) -> None:
        if algo not in _ALGOS:
            raise ValueError(f"algo must be one of {_ALGOS}, got {algo!r}")
        self._c.set_algo(algo)

    rank = property(lambda self: self._c.rank)
    world = property(lambda self: self._c.world)
    device = property(lambda self: self._c.device)
    p2p_enabled = property(lambda self: self._c.p2p_enabled)
    p2p_disabled_reason = property(lambda self: self._c.p2p_disabled_reason)
    max_bytes = property(lambda self: self._c.max_bytes)
    capacity_bytes = property(lambda self: self._c.capacity_bytes)
    oneshot_max_bytes = property(lambda self: self._c.oneshot_max_bytes)


def _contiguous(a: Any) -> bool:
    return a.is_contiguous() if framework(a) == "torch" else bool(a.flags.c_contiguous)


def _empty_like(a: Any) -> Any:
    if framework(a) == "torch":
        import torch
        return torch.empty_like(a, memory_format=torch.contiguous_format)
    import cupy
    return cupy.empty_like(a, order="C")


def all_reduce_reference(inputs: Sequence[Any], out: Any = None) -> Any:
    """The specification on CPU arrays (numpy, or torch CPU tensors for bf16): rank-order fp32
    sum of ``inputs`` (one array per rank), rounded once to their dtype."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("inputs must hold one array per rank")
    if out is None:
        out = _host_empty_like(inputs[0])
    _molora.comm_all_reduce_reference(inputs, out)
    return out


def all_reduce_residual_rmsnorm_reference(inputs: Sequence[Any], residual: Any, weight: Any,
                                          eps: float = 1e-6, out: Any = None) -> Any:
    """The fused variant's specification on CPU arrays; updates ``residual``, returns out."""
    if out is None:
        out = _host_empty_like(inputs[0])
    _molora.comm_all_reduce_residual_rmsnorm_reference(list(inputs), residual, weight, out,
                                                       int(inputs[0].shape[-1]), float(eps))
    return out


def _host_empty_like(a: Any) -> Any:
    if framework(a) == "torch":
        import torch
        return torch.empty_like(a, memory_format=torch.contiguous_format)
    import numpy as np
    return np.empty_like(a, order="C")
