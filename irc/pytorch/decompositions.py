"""The decomposition table both entry points capture with.

It starts from `core_aten_decompositions()`, keeps whole the ops irc has a
graph op or composite for (softmax, layer norm, GELU, SiLU: one op each, so
the compiler sees and fuses them as such), and lets everything else
decompose. Scaled dot-product attention stays whole for torch.export, as
`graph.attention`; dynamo's graphs (whose SDPA aot_autograd would lower to the
device's fused-kernel op) take `attention` below, the matmul-softmax-matmul flow
`fuse` makes one kernel of (passes/fuse_attention.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

aten = torch.ops.aten

KEPT_WHOLE = (
    aten._softmax.default,
    aten.native_layer_norm.default,
    aten.gelu.default,
    aten.silu.default,
    aten._log_softmax.default,
    aten.var_mean.correction,
    aten.addmm.default,
    aten.roll.default,
)
"""Core ATen ops irc converts itself (irc/pytorch/aten.py): addmm as matmul + add,
var_mean and _log_softmax as short formulas over graph ops, roll as two slices
concatenated (irc/pytorch/formulas.py), where torch's decomposition indexes by
an `fmod` of integers, which irc has no graph op for."""

DECOMPOSED_TOO = (
    aten.native_group_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit_functional.default,
    aten.upsample_bilinear2d.vec,
    aten.upsample_bilinear2d.default,
)
"""Core ATen ops that core_aten_decompositions keeps and irc takes decomposed:
group norm, batch norm (eval and training mode, whose running statistics come
back as buffer updates) and instance norm become var_mean and element-wise ops,
which fuse; bilinear upsampling, the four neighbours' gathers and weights
(as linear, bicubic and trilinear come already)."""


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """SDPA as softmax(q k^T * scale, causal mask of two aranges) v.

    torch's own decomposition guards rows whose every score is -inf (they give
    0, not NaN) with an `any` over the row after the softmax, which hides the
    softmax-into-matmul flow irc fuses into one attention kernel. Without a
    mask tensor no row is all -inf (a causal row i keeps keys 0..i), so the
    guard is dropped here; with a mask, dropout or GQA flag, torch's own
    decomposition runs (NotImplemented). The output has the strides of torch's
    fused kernels (a later `.view` of the captured graph relies on them).
    """
    if attn_mask is not None or dropout_p != 0.0 or enable_gqa:
        return NotImplemented
    rows, keys, width = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.dim() < 3 or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        return NotImplemented
    factor = 1.0 / math.sqrt(width) if scale is None else scale
    # Batched [N, L, E] matmuls, one batch dim, so that the two contractions and the
    # softmax between them meet without a rank change (fuse_attention's pattern).
    q3 = q.reshape(-1, rows, width)
    k3 = k.reshape(-1, keys, width)
    v3 = v.reshape(-1, keys, v.shape[-1])
    scores = torch.bmm(q3, k3.transpose(1, 2)) * factor
    if is_causal:
        i = torch.arange(rows, device=q.device)[:, None]
        j = torch.arange(keys, device=q.device)[None, :]
        scores = torch.where(j <= i, scores, float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1), v3).view(*q.shape[:-1], v.shape[-1])
    if out.dim() == 4:  # the fused kernels' layout, [B, L, H, E] in memory, as torch's
        out = out.transpose(1, 2).contiguous().transpose(1, 2)  # decomposition gives it
    return out


def irc_decompositions() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    table.update(get_decompositions(list(DECOMPOSED_TOO)))
    for op in KEPT_WHOLE:
        table.pop(op, None)
    # graph.attention is SDPA itself: export keeps the op whole (a CompositeImplicit
    # op left out of the table is preserved); aot_autograd meets `attention` instead
    # (irc/pytorch/backend.py rewrites dynamo's SDPA calls before tracing).
    table.pop(aten.scaled_dot_product_attention.default, None)
    return table


def attention_or_sdpa(*args: Any, **kwargs: Any) -> Any:
    """`attention`, or torch's SDPA where that declines: what dynamo's graphs call
    instead of SDPA (aot_autograd would otherwise meet the device's fused-kernel
    op, which has no decomposition on CUDA)."""
    out = attention(*args, **kwargs)
    if out is NotImplemented:
        return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
    return out


SDPA_CALLS = (torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
