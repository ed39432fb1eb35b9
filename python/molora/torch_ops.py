"""molora's ops as torch.library custom ops, for torch.compile and CUDA graph capture.

    import molora.torch_ops
    molora.torch_ops.register()            # idempotent; False (and nothing done) without torch
    srt, eids, ntpp = torch.ops.molora.moe_align_block_size(topk_ids, slot_ids, S * E, E, 16)
    t = torch.ops.molora.lora_shrink(x, A, ranks, None, None, srt, eids, ntpp, 16, k)
    torch.ops.molora.lora_expand(t, B, y, ranks, scales, None, None, srt, eids, ntpp, 16, k)

Schemas (``Tensor?`` = may be None; shapes as :mod:`molora.align` and :mod:`molora.lora`):

* ``molora::moe_align_block_size(Tensor topk_ids, Tensor? slot_ids, int num_experts,
  int num_base_experts, int block_size) -> (Tensor, Tensor, Tensor)`` — functional: returns
  fresh int32 ``sorted_token_ids`` [T*k + V*(B-1)], ``expert_ids`` [cdiv(len, B)],
  ``num_tokens_post_pad`` [1]; ``num_base_experts`` is used only with ``slot_ids`` (pass 0
  otherwise). The CUDA workspace is allocated from torch's caching allocator (inside a graph
  capture: from the graph's pool), so the op is capturable.
* ``molora::lora_shrink(Tensor x, Tensor A, Tensor ranks, Tensor? topk_ids, Tensor? slot_ids,
  Tensor? sorted_token_ids, Tensor? expert_ids, Tensor? num_tokens_post_pad, int block_size,
  int top_k) -> Tensor`` — returns ``t`` [T*k, r_max] in x's dtype, zero-filled where no
  adapter (plain routing: topk_ids/slot_ids; aligned: the three align outputs, block_size and
  top_k; the unused group is None / 0).
* ``molora::lora_expand(Tensor t, Tensor B, Tensor(a!) y, Tensor ranks, Tensor scales,
  Tensor? topk_ids, Tensor? slot_ids, Tensor? sorted_token_ids, Tensor? expert_ids,
  Tensor? num_tokens_post_pad, int block_size, int top_k) -> ()`` — adds into ``y`` in place
  (declared mutated, so torch.compile's functionalisation orders it).
* ``molora::lora_moe_delta(Tensor x, Tensor A, Tensor B, Tensor(a!) y, Tensor(b!) t,
  Tensor ranks, Tensor scales, Tensor? topk_ids, Tensor? slot_ids, Tensor? sorted_token_ids,
  Tensor? expert_ids, Tensor? num_tokens_post_pad, int block_size, int top_k) -> ()`` —
  shrink into the workspace ``t`` [T*k, r_max], then expand into ``y`` in place, in one call
  (:func:`molora.lora_moe_delta`); both declared mutated.

Each op has a fake (meta) implementation that computes output shapes from the input shapes
alone (no device work, no data access), which is what torch.compile traces with. This module
imports without torch; nothing is registered until :func:`register` is called (the wrappers
below call it).
"""
from typing import Any, Optional, Tuple  # no `from __future__ import annotations`: torch reads them

__all__ = ["register", "registered", "moe_align_block_size", "lora_shrink", "lora_expand",
           "lora_moe_delta"]

_state = {"done": False}


def registered() -> bool:
    return _state["done"]


def register() -> bool:
    """Registers molora::moe_align_block_size, molora::lora_shrink, molora::lora_expand and
    molora::lora_moe_delta with torch.library (once per process). Returns False when torch is
    not installed."""
    if _state["done"]:
        return True
    try:
        import torch
    except ImportError:
        return False
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.library.custom_op "
                           "(needs torch >= 2.4)")
    _define(torch)
    _state["done"] = True
    return True


def _define(torch: Any) -> None:
    from . import align as _align
    from . import lora as _lora

    Tensor = torch.Tensor

    @torch.library.custom_op("molora::moe_align_block_size", mutates_args=())
    def moe_align_block_size_op(topk_ids: Tensor, slot_ids: Optional[Tensor], num_experts: int,
                                num_base_experts: int, block_size: int
                                ) -> Tuple[Tensor, Tensor, Tensor]:
        kw = {}
        if slot_ids is not None:
            kw = dict(slot_ids=slot_ids, num_base_experts=num_base_experts)
        s, e, n = _align.moe_align_block_size(topk_ids, num_experts, block_size, **kw)
        return s, e, n

    @moe_align_block_size_op.register_fake
    def _(topk_ids, slot_ids, num_experts, num_base_experts, block_size):
        T, k = topk_ids.shape
        sz = _align.moe_align_sizes(int(T), int(k), num_experts, block_size)
        mk = lambda n: topk_ids.new_empty((n,), dtype=torch.int32)  # noqa: E731
        return mk(sz["sorted_token_ids"]), mk(sz["expert_ids"]), mk(1)

    def _routing(topk_ids, slot_ids, sorted_token_ids, expert_ids, num_tokens_post_pad,
                 block_size, top_k):
        if sorted_token_ids is not None:
            return (), dict(sorted_token_ids=sorted_token_ids, expert_ids=expert_ids,
                            num_tokens_post_pad=num_tokens_post_pad, block_size=block_size,
                            top_k=top_k)
        return (topk_ids, slot_ids), {}

    @torch.library.custom_op("molora::lora_shrink", mutates_args=())
    def lora_shrink_op(x: Tensor, A: Tensor, ranks: Tensor, topk_ids: Optional[Tensor],
                       slot_ids: Optional[Tensor], sorted_token_ids: Optional[Tensor],
                       expert_ids: Optional[Tensor], num_tokens_post_pad: Optional[Tensor],
                       block_size: int, top_k: int) -> Tensor:
        pos, kw = _routing(topk_ids, slot_ids, sorted_token_ids, expert_ids,
                           num_tokens_post_pad, block_size, top_k)
        k = topk_ids.shape[1] if topk_ids is not None else top_k
        out = torch.zeros((x.shape[0] * k, A.shape[2]), dtype=x.dtype, device=x.device)
        _lora.lora_shrink(x, A, *pos, ranks=ranks, out=out, **kw)
        return out

    @lora_shrink_op.register_fake
    def _(x, A, ranks, topk_ids, slot_ids, sorted_token_ids, expert_ids, num_tokens_post_pad,
          block_size, top_k):
        k = topk_ids.shape[1] if topk_ids is not None else top_k
        return x.new_empty((x.shape[0] * k, A.shape[2]))

    @torch.library.custom_op("molora::lora_expand", mutates_args=("y",))
    def lora_expand_op(t: Tensor, B: Tensor, y: Tensor, ranks: Tensor, scales: Tensor,
                       topk_ids: Optional[Tensor], slot_ids: Optional[Tensor],
                       sorted_token_ids: Optional[Tensor], expert_ids: Optional[Tensor],
                       num_tokens_post_pad: Optional[Tensor], block_size: int,
                       top_k: int) -> None:
        pos, kw = _routing(topk_ids, slot_ids, sorted_token_ids, expert_ids,
                           num_tokens_post_pad, block_size, top_k)
        _lora.lora_expand(t, B, y, *pos, ranks=ranks, scales=scales, **kw)

    @lora_expand_op.register_fake
    def _(t, B, y, ranks, scales, topk_ids, slot_ids, sorted_token_ids, expert_ids,
          num_tokens_post_pad, block_size, top_k):
        return None

    @torch.library.custom_op("molora::lora_moe_delta", mutates_args=("y", "t"))
    def lora_moe_delta_op(x: Tensor, A: Tensor, B: Tensor, y: Tensor, t: Tensor, ranks: Tensor,
                          scales: Tensor, topk_ids: Optional[Tensor], slot_ids: Optional[Tensor],
                          sorted_token_ids: Optional[Tensor], expert_ids: Optional[Tensor],
                          num_tokens_post_pad: Optional[Tensor], block_size: int,
                          top_k: int) -> None:
        pos, kw = _routing(topk_ids, slot_ids, sorted_token_ids, expert_ids,
                           num_tokens_post_pad, block_size, top_k)
        _lora.lora_moe_delta(x, A, B, y, *pos, ranks=ranks, scales=scales, t=t, **kw)

    @lora_moe_delta_op.register_fake
    def _(x, A, B, y, t, ranks, scales, topk_ids, slot_ids, sorted_token_ids, expert_ids,
          num_tokens_post_pad, block_size, top_k):
        return None


# ---- keyword-friendly wrappers (same arguments as molora.align / molora.lora) -------------

def _ops():
    if not register():
        raise ImportError("molora.torch_ops needs torch (pip install torch)")
    import torch
    return torch.ops.molora


def moe_align_block_size(topk_ids, num_experts: int, block_size: int, *, slot_ids=None,
                         num_base_experts: int = 0):
    """torch.ops.molora.moe_align_block_size with molora.moe_align_block_size's arguments."""
    return _ops().moe_align_block_size(topk_ids, slot_ids, int(num_experts),
                                       int(num_base_experts), int(block_size))


def lora_shrink(x, A, topk_ids=None, slot_ids=None, *, ranks, sorted_token_ids=None,
                expert_ids=None, num_tokens_post_pad=None, block_size: int = 0, top_k: int = 0):
    """torch.ops.molora.lora_shrink (``ranks`` is required: int32 [S])."""
    return _ops().lora_shrink(x, A, ranks, topk_ids, slot_ids, sorted_token_ids, expert_ids,
                              num_tokens_post_pad, int(block_size), int(top_k))


def lora_expand(t, B, y, topk_ids=None, slot_ids=None, *, ranks, scales,
                sorted_token_ids=None, expert_ids=None, num_tokens_post_pad=None,
                block_size: int = 0, top_k: int = 0):
    """torch.ops.molora.lora_expand: updates ``y`` in place and returns it."""
    _ops().lora_expand(t, B, y, ranks, scales, topk_ids, slot_ids, sorted_token_ids, expert_ids,
                       num_tokens_post_pad, int(block_size), int(top_k))
    return y


def lora_moe_delta(x, A, B, y, topk_ids=None, slot_ids=None, *, ranks, scales, t=None,
                   sorted_token_ids=None, expert_ids=None, num_tokens_post_pad=None,
                   block_size: int = 0, top_k: int = 0):
    """torch.ops.molora.lora_moe_delta: updates ``y`` in place and returns it; ``t`` is the
    workspace [T*k, r_max] (a fresh one when not given)."""
    if t is None:
        import torch
        k = topk_ids.shape[1] if topk_ids is not None else top_k
        t = torch.zeros((x.shape[0] * k, A.shape[2]), dtype=x.dtype, device=x.device)
    _ops().lora_moe_delta(x, A, B, y, t, ranks, scales, topk_ids, slot_ids, sorted_token_ids,
                          expert_ids, num_tokens_post_pad, int(block_size), int(top_k))
    return y
