"""Rewrites the composite ops (`softmax`, `layer_norm`) into spec primitives.

Fusion then sees only primitives, so one mechanism fuses a softmax whether the
user wrote `graph.softmax` or the five ops by hand. Half-precision inputs are
computed in f32 and rounded once at the end, as PyTorch's kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, ModuleOp, f64
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
from irc.ir.types import F32, HALF_TYPES, int_array, tensor
from irc.ir.value_names import set_value_name


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
                [DecomposeSoftmax(), DecomposeLayerNorm()], dce_enabled=False
            ),
            apply_recursively=False,
        ).rewrite_module(op)
