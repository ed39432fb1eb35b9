"""moe_align_block_size: group top-k (token, expert) pairs by (virtual) expert, each bucket
padded to a multiple of ``block_size``, in the layout the fused_moe family of kernels reads.

* ``sorted_token_ids`` int32 [T*k + V*(B-1)]: flat pair indices ``t*k + j``, bucket after bucket,
  ascending within a bucket; every other position holds the sentinel ``T*k``.
* ``expert_ids`` int32 [cdiv(len, B)]: the expert of each block of B positions, -1 past the used
  blocks.
* ``num_tokens_post_pad`` int32 [1]: the used positions (a multiple of B).

numpy arrays run the CPU reference; CUDA torch tensors / cupy arrays run the kernel (one
launch for T*k <= 4096, three above, no host synchronisation, capturable into CUDA graphs when ``out`` and ``workspace``
are preallocated). Outputs are allocated with the input's framework unless ``out`` is given.
Ids outside ``[0, num_experts)`` go to no bucket; so do the pairs of tokens whose slot is -1.
"""
from __future__ import annotations

from typing import Any

from . import _molora
from ._arrays import empty_like_framework, framework, is_cuda, stream_handle

__all__ = ["moe_align_block_size", "moe_align_sizes"]


def moe_align_sizes(num_tokens: int, topk: int, num_experts: int, block_size: int) -> dict:
    """Lengths of the three outputs and the CUDA workspace size (bytes) of one call shape.

    Raises ValueError naming the argument when the shape is outside the limits (num_experts in
    [1, 65536], block_size a power of two in [16, 256], num_tokens * topk <= 1,048,576)."""
    s, e, w = _molora.align_sizes(int(num_tokens), int(topk), int(num_experts), int(block_size))
    return {"sorted_token_ids": s, "expert_ids": e, "num_tokens_post_pad": 1,
            "num_dropped": 2, "workspace_bytes": w}


def _check_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np
            if isinstance(v, np.integer):
                return int(v)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return v


def moe_align_block_size(topk_ids, num_experts: int, block_size: int, *, slot_ids=None,
                         num_base_experts: int | None = None, out=None, num_dropped=None,
                         workspace=None, stream=None):
    """Align the pairs of ``topk_ids`` [T, k] (int32; int64 accepted and range-checked in the
    kernel, never truncated) to ``block_size`` over ``num_experts`` buckets.

    With ``slot_ids`` (int32 [T], -1 = no adapter) and ``num_base_experts`` E, pair (t, j) goes
    to virtual expert ``slot_ids[t] * E + topk_ids[t, j]`` (``num_experts`` = S*E).

    ``out``: optional ``(sorted_token_ids, expert_ids, num_tokens_post_pad)`` caller-owned
    int32 buffers of exactly the lengths of :func:`moe_align_sizes`. ``num_dropped``: optional
    int32 [2] buffer that receives [invalid ids, pairs with slot -1]. ``workspace``: optional
    int32 buffer of ``workspace_bytes // 4`` words for the CUDA path (allocated per call when
    omitted; pass one to capture the call into a CUDA graph). ``stream`` defaults to torch's
    current stream.

    Returns ``(sorted_token_ids, expert_ids, num_tokens_post_pad)``.
    """
    framework(topk_ids)  # TypeError for non-arrays
    num_experts = _check_int("num_experts", num_experts)
    block_size = _check_int("block_size", block_size)
    if getattr(topk_ids, "ndim", None) != 2:
        raise ValueError(f"topk_ids must have 2 dimensions [T, k], got shape "
                         f"{tuple(getattr(topk_ids, 'shape', ()))}")
    if slot_ids is not None:
        if num_base_experts is None:
            raise ValueError("num_base_experts is required with slot_ids")
        num_base_experts = _check_int("num_base_experts", num_base_experts)
    elif num_base_experts is not None:
        raise ValueError("num_base_experts is only meaningful with slot_ids")
    T, k = int(topk_ids.shape[0]), int(topk_ids.shape[1])
    sz = moe_align_sizes(T, k, num_experts, block_size)
    if out is None:
        out = (empty_like_framework(topk_ids, (sz["sorted_token_ids"],), "int32"),
               empty_like_framework(topk_ids, (sz["expert_ids"],), "int32"),
               empty_like_framework(topk_ids, (1,), "int32"))
    elif not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise TypeError("out must be a tuple (sorted_token_ids, expert_ids, num_tokens_post_pad)")
    cuda = is_cuda(topk_ids)
    if cuda and workspace is None:
        workspace = empty_like_framework(topk_ids, (sz["workspace_bytes"] // 4,), "int32")
    _molora.moe_align_block_size(topk_ids, slot_ids, num_experts,
                                 int(num_base_experts or 0), block_size, out[0], out[1], out[2],
                                 num_dropped, workspace,
                                 stream_handle(stream, topk_ids) if cuda else 0)
    return tuple(out)
