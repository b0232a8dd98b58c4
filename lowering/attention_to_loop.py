"""graph -> loop for an attention kernel (kind `attention`, passes/fuse_attention.py).

The kernel runs over the output's elements (`[batch, rows, value dims]`), as a
contraction's does, and its body is a loop nest that computes the attention
literally, in the order the FlashAttention-2 schedule needs:

    %m, %l = loop.softmax_reduce {bounds = [N]} (%j) { scores at (b, i, j) }
    %acc = loop.reduce {kind = "sum", contract} (%j) { exp(scores - %m) * v[b, j, e] }
    out = %acc / %l, then the epilogue, stored

The softmax's max and sum are one `loop.softmax_reduce` (as `online-softmax`
makes for a looped row), and the division by the sum moves after the second
contraction (it is the same for every j of a row). loop-to-tile
(`lowering/attention_to_tile.py`) lays that nest out as one loop over tiles of
j that carries the running max, sum and accumulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import IndexType, IntegerAttr, StringAttr
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from irc.dialects import graph, loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import F32, I1, element_of, int_array, shape_of
from irc.passes.fuse_attention import AttentionPattern, match_attention

if TYPE_CHECKING:
    from irc.lowering.graph_to_loop import FunctionLowering, KernelBuilder

INDEX = IndexType()
F64_NAME = "f64"


def attention_of(members: list[Operation]) -> AttentionPattern:
    """The attention the group's ops make (fuse judged the group so)."""
    for op in members:
        if isinstance(op, graph.MatmulOp):
            found = match_attention(op)
            if not isinstance(found, str):
                return found
    raise AssertionError("an attention kernel without an attention")  # the verifier's check


def attention_kernel(
    lowering: FunctionLowering,
    members: list[Operation],
    outputs: list[SSAValue],
    name: str | None,
) -> None:
    """One loop.kernel of kind attention computing the group's `outputs`."""
    pattern = attention_of(members)
    out_shape = shape_of(pattern.values_mm.result.type)
    bufs = [lowering.alloc(v) for v in outputs]
    body = Block(arg_types=[INDEX] * len(out_shape))
    kb = lowering.builder(body, set(members))
    idx = list(body.args)
    n = shape_of(pattern.scores.type)[-1]
    wide = F32 if element_of(pattern.scores.type) != _f64() else _f64()

    with kb.region(1) as (block, (j,)):
        x = kb.value_at(pattern.scores, [*idx[:-1], j])
        kb.add(loop.YieldOp.create(operands=[_cast(kb, x, wide)]))
    softmax = loop.SoftmaxReduceOp.create(
        properties={"bounds": int_array([n])}, result_types=[wide, wide], regions=[Region(block)]
    )
    kb.add(softmax)
    row_max, row_sum = softmax.results

    kb.overrides[pattern.row_max] = lambda _: _cast(
        kb, row_max, element_of(pattern.row_max.result.type)
    )
    kb.overrides[pattern.row_sum] = lambda _: _cast(
        kb, row_sum, element_of(pattern.row_sum.result.type)
    )
    # exp(x - m) / l: the division waits until after the second contraction.
    numerator = pattern.normalize.operands[0]
    kb.overrides[pattern.normalize] = lambda at: kb.value_at(numerator, at)
    # Computed once, at the kernel's own index: an epilogue that reads the output
    # through a reshape of the batch dims (fuse allows no other view) reads it there.
    values: list[SSAValue] = []

    def values_once(at: list[SSAValue]) -> SSAValue:
        if not values:
            values.append(_values(kb, pattern, n, idx, row_sum, wide))
        return values[0]

    kb.overrides[pattern.values_mm] = values_once

    for v, buf in zip(outputs, bufs, strict=True):
        shape = shape_of(v.type)
        at = idx if shape == out_shape else lowering.reshaped_index(kb, shape, out_shape, idx)
        lowering.store(kb, v, buf, at)
    lowering.add_kernel(members, body, out_shape, name, KernelKind.ATTENTION)
    lowering.bind_outputs(outputs, bufs)


def _values(
    kb: KernelBuilder,
    pattern: AttentionPattern,
    n: int,
    at: list[SSAValue],
    row_sum: SSAValue,
    wide: Attribute,
) -> SSAValue:
    """sum_j exp(x - m)[.., i, j] * v[.., j, e], divided by the row sum."""
    mm = pattern.values_mm
    element = element_of(mm.result.type)
    *batch, i, e = at
    with kb.region(1) as (block, (j,)):
        p = kb.value_at(mm.lhs, [*batch, i, j])
        v = kb.value_at(mm.rhs, [*batch, j, e])
        kb.add(loop.YieldOp.create(operands=[kb.apply("mul", [p, v], element)]))
    props: dict[str, Attribute] = {
        "kind": StringAttr("sum"),
        "bounds": int_array([n]),
        "contract": IntegerAttr(1, I1),
    }
    acc = kb.add(
        loop.ReduceOp.create(properties=props, result_types=[element], regions=[Region(block)])
    )
    out = kb.apply("div", [_cast(kb, acc, wide), row_sum], wide)
    return _cast(kb, out, element)


def _cast(kb: KernelBuilder, v: SSAValue, element: Attribute) -> SSAValue:
    return v if v.type == element else kb.apply("cast", [v], element)


def _f64() -> Attribute:
    from irc.ir.types import ELEMENT_TYPES

    return ELEMENT_TYPES[F64_NAME]


__all__ = ["attention_kernel", "attention_of"]
