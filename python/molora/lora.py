"""MoE multi-LoRA shrink and expand over virtual experts (v = slot * E + expert).

Shapes (N and K named explicitly; never swapped):

* ``x`` [T, K] input rows, ``A`` [S, E, r_max, K] shrink weights, ``t`` [T*k, r_max]
* ``B`` [S, E, N, r_max] expand weights, ``y`` [T*k, N] updated in place
* ``ranks`` int32 [S] (``r_s <= r_max``), ``scales`` float32 [S]
* routing, one of: ``topk_ids`` int32 [T, k] with ``slot_ids`` int32 [T] (slot -1 = no
  adapter), or the aligned layout of ``moe_align_block_size`` over the S*E virtual experts
  (``sorted_token_ids``, ``expert_ids``, ``num_tokens_post_pad``, ``block_size``, ``top_k``).

numpy arrays (and CPU torch tensors) run the fp64 CPU reference; CUDA tensors run the kernels
on ``stream`` (default: torch's current stream). Pairs with slot -1 are left untouched.

Which routing: pass what you hold. With plain routing the planner runs the grid kernel for a
few tokens and, from 8-32 tokens (by op and shape), the stream kernel, which groups the pairs
itself: 1.4-2.4x faster than the grid kernel there and 0-15% faster than aligning first
(``molora.moe_align_block_size``) and passing the aligned layout. An engine that already has
the aligned layout (one align for the base MoE and the adapters) passes that: it is 0.7-9 us
faster again (docs/lora.md "Routing input" has the measured table).
"""
from __future__ import annotations

import json
from typing import Any

from . import _molora
from ._arrays import empty_like_framework, framework, is_cuda, stream_handle

__all__ = ["lora_shrink", "lora_expand", "lora_moe_delta", "lora_plan"]

_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "bf16": "bf16",
                "f16": "f16", "f32": "f32", "fp16": "f16", "half": "f16"}


def _dtype_str(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def _full(ref: Any, n: int, value, dtype: str) -> Any:
    """A 1-D array of `n` copies of `value` with ref's framework and device."""
    out = empty_like_framework(ref, (n,), dtype)
    if framework(ref) == "torch":
        out.fill_(value)
    else:
        out[...] = value
    return out


def _zeros(ref: Any, shape: tuple, dtype: str) -> Any:
    out = empty_like_framework(ref, shape, dtype)
    if framework(ref) == "torch":
        out.zero_()
    else:
        out[...] = 0
    return out


def _shrink_defaults(x, A, topk_ids, top_k: int, ranks, t):
    """``ranks`` (r_max for every slot) and ``t`` (a fresh zero-filled [T*k, r_max] array) where
    not given: what lora_shrink and lora_moe_delta default alike."""
    S, _, r_max, _ = A.shape
    if ranks is None:
        ranks = _full(A, S, r_max, "int32")
    if t is None:
        k = topk_ids.shape[1] if topk_ids is not None else top_k
        t = _zeros(x, (x.shape[0] * k, r_max), _dtype_str(x))
    return ranks, t


def lora_shrink(x, A, topk_ids=None, slot_ids=None, *, ranks=None, sorted_token_ids=None,
                expert_ids=None, num_tokens_post_pad=None, block_size: int = 0,
                top_k: int = 0, out=None, stream=None):
    """``t[p, :r_s] = A[s, e, :r_s, :] @ x[token(p), :]`` for every pair with slot ``s >= 0``.

    Returns ``t`` [T*k, r_max] (``out`` if given; a fresh zero-filled array otherwise). Rows of
    pairs without an adapter and columns past ``r_s`` are not written. ``ranks`` defaults to
    ``r_max`` for every slot.
    """
    ranks, out = _shrink_defaults(x, A, topk_ids, top_k, ranks, out)
    _molora.lora_shrink(x, A, ranks, topk_ids, slot_ids, sorted_token_ids, expert_ids,
                        num_tokens_post_pad, int(block_size), int(top_k), out,
                        stream_handle(stream, x) if is_cuda(x) else 0)
    return out


def lora_expand(t, B, y, topk_ids=None, slot_ids=None, *, ranks=None, scales=None,
                sorted_token_ids=None, expert_ids=None, num_tokens_post_pad=None,
                block_size: int = 0, top_k: int = 0, stream=None):
    """``y[p, :] += scale_s * B[s, e, :, :r_s] @ t[p, :r_s]`` in place for every pair with slot
    ``s >= 0``; returns ``y``. fp32 accumulation, stored in y's dtype. ``ranks`` defaults to
    ``r_max``, ``scales`` to 1."""
    S = B.shape[0]
    r_max = B.shape[3]
    if ranks is None:
        ranks = _full(B, S, r_max, "int32")
    if scales is None:
        scales = _full(B, S, 1.0, "float32")
    _molora.lora_expand(t, B, ranks, scales, topk_ids, slot_ids, sorted_token_ids, expert_ids,
                        num_tokens_post_pad, int(block_size), int(top_k), y,
                        stream_handle(stream, t) if is_cuda(t) else 0)
    return y


def lora_moe_delta(x, A, B, y, topk_ids=None, slot_ids=None, *, ranks=None, scales=None,
                   sorted_token_ids=None, expert_ids=None, num_tokens_post_pad=None,
                   block_size: int = 0, top_k: int = 0, t=None, stream=None,
                   after_delta: bool = False):
    """One layer's whole LoRA delta in one call: ``t[p, :r_s] = A[s, e, :r_s, :] @ x[token(p)]``,
    then ``y[p, :] += scale_s * B[s, e, :, :r_s] @ t[p, :r_s]`` in place, for every pair with
    slot ``s >= 0``; returns ``y``.

    The same results, bit for bit, as :func:`lora_shrink` then :func:`lora_expand`. On CUDA it
    is faster: the expand reads its routing, ranks, scales and weights while the shrink is still
    finishing (always valid here, since the kernel before it is this call's own shrink; see
    docs/lora.md "moe_delta"). ``t`` [T*k, r_max] is the workspace between the two kernels
    (give one to avoid an allocation per call; a fresh zero-filled array otherwise). ``ranks``
    defaults to ``r_max`` for every slot, ``scales`` to 1. Every argument is checked before
    either kernel runs: on an error nothing is written.

    ``after_delta=True`` (CUDA): the call directly follows another ``lora_moe_delta`` on the same
    stream (e.g. up's after gate's, the same ``x`` and routing), so its shrink may read its
    routing, ranks and ``A`` early as well; valid only when nothing else runs between the two
    calls on the stream and the earlier call's ``t`` and ``y`` are not this call's routing,
    ranks or ``A`` (docs/lora.md "moe_delta"). Ignored on the CPU.
    """
    ranks, t = _shrink_defaults(x, A, topk_ids, top_k, ranks, t)
    if scales is None:
        scales = _full(A, A.shape[0], 1.0, "float32")
    _molora.lora_moe_delta(x, A, B, ranks, scales, topk_ids, slot_ids, sorted_token_ids,
                           expert_ids, num_tokens_post_pad, int(block_size), int(top_k), t, y,
                           stream_handle(stream, x) if is_cuda(x) else 0, bool(after_delta))
    return y


def lora_plan(op: str, *, dtype: str = "bf16", num_tokens: int, top_k: int, num_slots: int,
              num_experts: int, r_max: int, K: int = 0, N: int = 0, routing: str = "plain",
              block_size: int = 0, sorted_len: int | None = None, stats: dict | None = None,
              bandwidth_gbps: float = 0.0, sm_count: int = 0, config_path: str = "",
              tile: int = 0, unroll: int = 0, kernel: str = "") -> dict:
    """The plan the kernels would use for one call: ``variant``, ``kernel`` ("stream" with
    aligned routing and block_size <= 32 for every expand and for shrink from 16 pairs, and with
    plain routing for shrink from 33 pairs (128 where K * r_max <= 131072) and expand at any
    size (from 96 where N * r_max < 131072),
    else "grid", unless the GPU's tuned config timed both kernels at this token count and the other
    was more than 3% faster; pass ``kernel`` to force one; "stream" needs aligned routing with
    block_size <= 32 or plain routing with num_tokens * top_k <= 2048 and
    num_slots * num_experts <= 65536), ``kernel_source`` (which of those chose it: "heuristic",
    "tuned:<file>" or "forced"),
    ``source`` (the tile's: "heuristic" or "tuned:<file>" or "forced"), ``tile`` (shrink: rank rows,
    expand: N rows per work item), ``unroll`` (grid: 16-byte loads in flight per thread),
    ``stages`` (stream: pipeline stages; shrink: per warp), ``chunks``, ``groups``, ``max_items``,
    ``est_items``, ``grid``/``ctas`` (one CTA per possible item), ``ctas_per_sm`` (resident,
    0 without a GPU), ``threads``, ``smem_bytes``, ``bytes`` that
    must move (exact when ``stats`` gives active_pairs, active_tokens, distinct_pairs,
    distinct_rank8, active_rank8), ``floor_us`` at ``bandwidth_gbps`` (default 4300) and
    ``pdl`` (launched with programmatic dependent launch: by default every kernel;
    MOLORA_LORA_PDL=0 turns it off) and ``early_inputs`` (stream
    kernels with pdl: the routing, ranks, scales and weights read before waiting for the kernel
    before; off unless MOLORA_LORA_EARLY_INPUTS=1, valid only where nothing still running
    writes them; docs/lora.md "Early inputs") and ``slot_check`` (plain-routing stream kernels:
    each CTA checks the first slots before grouping the pairs and leaves when all are -1, so
    that such a call costs about one empty launch; the check costs calls with adapters up to
    ~0.35 us; on unless MOLORA_LORA_SLOT_CHECK=0; docs/lora.md "Every slot -1").

    Shrink takes ``K`` (input features), expand takes ``N`` (output features). ``op="delta"``
    gives the two plans of :func:`lora_moe_delta` (``K`` and ``N``) as ``{"shrink": {...},
    "expand": {...}}``; its expand reads its inputs early wherever its kernel can."""
    if op not in ("shrink", "expand", "delta"):
        raise ValueError(f"op must be 'shrink', 'expand' or 'delta', got {op!r}")
    dt = _DTYPE_NAMES.get(str(dtype).replace("torch.", ""))
    if dt is None:
        raise TypeError(f"dtype must be bf16, f16 or f32, got {dtype!r}")
    if sorted_len is None:
        sorted_len = (num_tokens * top_k + num_slots * num_experts * (block_size - 1)
                      if routing == "aligned" else 0)
    s = stats or {}
    doc = _molora.lora_plan(op, dt, int(num_tokens), int(top_k), int(num_slots),
                            int(num_experts), int(r_max), int(K), int(N), routing,
                            int(block_size), int(sorted_len), int(s.get("active_pairs", -1)),
                            int(s.get("active_tokens", -1)), int(s.get("distinct_pairs", -1)),
                            int(s.get("distinct_rank8", -1)), int(s.get("active_rank8", -1)),
                            float(bandwidth_gbps), int(sm_count), config_path, int(tile),
                            int(unroll), str(kernel))
    return json.loads(doc)
