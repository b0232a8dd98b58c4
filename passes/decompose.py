"""Rewrites the composite ops (`softmax`, `layer_norm`, `attention`) into spec primitives.

Fusion then sees only primitives, so one mechanism fuses a softmax whether the
user wrote `graph.softmax` or the five ops by hand. Half-precision inputs are
computed in f32 and rounded once at the end, as PyTorch's kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, ModuleOp, f64, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from irc.dialects import graph
from irc.ir.types import ELEMENT_TYPES, F32, HALF_TYPES, I1, int_array, tensor
from irc.ir.value_names import set_value_name

I32 = ELEMENT_TYPES["i32"]


class _Emitter:
    """Collects the replacement ops, each carrying the composite's location."""

    def __init__(self, origin: Operation):
        self.origin = origin
        self.ops: list[Operation] = []

    def __call__(self, op: Operation) -> SSAValue:
        op.location = self.origin.location
        self.ops.append(op)
        return op.results[0]

    def upcast(self, x: SSAValue) -> SSAValue:
        element = x.type.element_type  # type: ignore[attr-defined]
        if element not in HALF_TYPES:
            return x
        return self(graph.CastOp.make(x, result_type=tensor(x.type.get_shape(), F32)))  # type: ignore[attr-defined]

    def downcast(self, y: SSAValue, like: SSAValue) -> SSAValue:
        if y.type == like.type:
            return y
        return self(graph.CastOp.make(y, result_type=like.type))


def decompose_softmax(op: graph.SoftmaxOp) -> list[Operation]:
    emit = _Emitter(op)
    x = emit.upcast(op.input)
    keep = {"dims": int_array([op.axis()]), "keepdim": IntegerAttr(1, IntegerType(1))}
    m = emit(graph.ReduceMaxOp.make(x, **keep))
    e = emit(graph.ExpOp.make(emit(graph.SubOp.make(x, m))))
    s = emit(graph.ReduceSumOp.make(e, **keep))
    y = emit(graph.DivOp.make(e, s))
    emit.downcast(y, op.result)
    return emit.ops


def decompose_layer_norm(op: graph.LayerNormOp) -> list[Operation]:
    emit = _Emitter(op)
    x, w, b = emit.upcast(op.input), emit.upcast(op.weight), emit.upcast(op.bias)
    keep = {"dims": int_array(op.normalized_dims()), "keepdim": IntegerAttr(1, IntegerType(1))}
    mean = emit(graph.ReduceMeanOp.make(x, **keep))
    centered = emit(graph.SubOp.make(x, mean))
    var = emit(graph.ReduceMeanOp.make(emit(graph.MulOp.make(centered, centered)), **keep))
    eps = emit(
        graph.ConstantOp.make(
            result_type=tensor([], x.type.element_type),  # type: ignore[attr-defined]
            value=FloatAttr(op.epsilon(), f64),
        )
    )
    inv_std = emit(graph.RsqrtOp.make(emit(graph.AddOp.make(var, eps))))
    y = emit(graph.MulOp.make(centered, inv_std))
    y = emit(graph.AddOp.make(emit(graph.MulOp.make(y, w)), b))
    emit.downcast(y, op.result)
    return emit.ops


def decompose_attention(op: graph.AttentionOp) -> list[Operation]:
    """Attention written out, as passes/fuse_attention.py recognizes it: leading dims
    flattened into one batch dim (views), K and V heads repeated for grouped-query
    attention by a reshape, broadcast and reshape (views), the scores in f32 for
    half types, the mask and causality as `where`s (the causal one last, of two
    iotas: the attention kernel skips the key tiles above the diagonal)."""
    emit = _Emitter(op)
    q, k, v = op.query, op.key, op.value
    sq, sk, sv = (tuple(x.type.get_shape()) for x in (q, k, v))  # type: ignore[attr-defined]
    element = q.type.element_type  # type: ignore[attr-defined]
    lead = sq[:-2]
    batch = 1
    for n in lead:
        batch *= n
    tq, d = sq[-2:]
    tk, dv = sv[-2:]
    flat = (batch,) if lead else ()

    def reshape(x: SSAValue, shape: tuple[int, ...]) -> SSAValue:
        if tuple(x.type.get_shape()) == shape:  # type: ignore[attr-defined]
            return x
        return emit(graph.ReshapeOp.make(x, result_type=tensor(list(shape), element)))

    def heads(x: SSAValue, shape: tuple[int, ...]) -> SSAValue:
        """K or V with one head for each query head (views only)."""
        group = sq[-3] // shape[-3] if len(sq) >= 3 else 1
        if group > 1:
            split = (*shape[:-2], 1, *shape[-2:])
            wide = (*shape[:-2], group, *shape[-2:])
            x = emit(
                graph.BroadcastOp.make(reshape(x, split), result_type=tensor(list(wide), element))
            )
        return reshape(x, (*flat, *shape[-2:]))

    q3, k3, v3 = reshape(q, (*flat, tq, d)), heads(k, sk), heads(v, sv)
    rank = len(flat) + 2
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    kt = emit(graph.TransposeOp.make(k3, perm=int_array(perm)))
    # Half inputs: the scores are an f32 product of the widened operands (exact products,
    # f32 sums: what a half dot accumulating in f32 computes, and the attention kernel
    # does so), not rounded to half before the softmax.
    x = emit(graph.MatmulOp.make(emit.upcast(q3), emit.upcast(kt)))
    wide_type = x.type.element_type  # type: ignore[attr-defined]
    scale = graph.ConstantOp.make(
        result_type=tensor([], wide_type), value=FloatAttr(op.softmax_scale(), f64)
    )
    x = emit(graph.MulOp.make(x, emit(scale)))

    def minus_inf() -> SSAValue:
        return emit(
            graph.ConstantOp.make(
                result_type=tensor([], wide_type), value=FloatAttr(-float("inf"), f64)
            )
        )

    if op.mask is not None:
        m = op.mask
        scores = (*lead, tq, tk)
        shape = tuple(m.type.get_shape())  # type: ignore[attr-defined]
        if len(shape) > 2 and shape != (*flat, tq, tk):
            # Over the leading dims too: stretched to them, then flattened (views).
            m_type = m.type.element_type  # type: ignore[attr-defined]
            m = emit(graph.BroadcastOp.make(m, result_type=tensor(list(scores), m_type)))
            m = emit(graph.ReshapeOp.make(m, result_type=tensor([*flat, tq, tk], m_type)))
        if m.type.element_type == I1:  # type: ignore[attr-defined]
            x = emit(graph.WhereOp.make(m, x, minus_inf()))
        else:
            x = emit(graph.AddOp.make(x, emit.upcast(m)))
    if op.causal():
        index = tensor([tq, tk], I32)
        rows = emit(graph.IotaOp.make(result_type=index, dim=IntegerAttr(0, i64)))
        keys = emit(graph.IotaOp.make(result_type=index, dim=IntegerAttr(1, i64)))
        x = emit(graph.WhereOp.make(emit(graph.GeOp.make(rows, keys)), x, minus_inf()))
    keep = {"dims": int_array([rank - 1]), "keepdim": IntegerAttr(1, IntegerType(1))}
    top = emit(graph.ReduceMaxOp.make(x, **keep))
    e = emit(graph.ExpOp.make(emit(graph.SubOp.make(x, top))))
    p = emit(graph.DivOp.make(e, emit(graph.ReduceSumOp.make(e, **keep))))
    if p.type.element_type != element:  # type: ignore[attr-defined]
        p = emit(graph.CastOp.make(p, result_type=tensor([*flat, tq, tk], element)))
    out = emit(graph.MatmulOp.make(p, v3))
    reshape(out, (*lead, tq, dv))
    return emit.ops


def _replace(rewriter: PatternRewriter, op: Operation, new: list[Operation]) -> None:
    result = new[-1].results[0]
    name = op.results[0].name_hint
    rewriter.replace(op, new, [result])
    if name is not None:
        set_value_name(result, name)
    # xDSL copies the composite's name onto every new value; only the final
    # value stands for it, the intermediates print as numbers.
    for other in new[:-1]:
        for r in other.results:
            r.name_hint = None


class DecomposeSoftmax(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.SoftmaxOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_softmax(op))


class DecomposeAttention(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.AttentionOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_attention(op))


class DecomposeLayerNorm(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.LayerNormOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_layer_norm(op))


@dataclass(frozen=True)
class DecomposePass(ModulePass):
    """`decompose`: composite graph ops into primitives."""

    name = "decompose"
    levels = ("graph",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            # dce_enabled=False: decompose rewrites the composites and nothing else
            # (xDSL's applier would also erase every unused op of the program).
            GreedyRewritePatternApplier(
                [DecomposeSoftmax(), DecomposeLayerNorm(), DecomposeAttention()], dce_enabled=False
            ),
            apply_recursively=False,
        ).rewrite_module(op)
