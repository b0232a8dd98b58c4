"""What a contraction's dot reads: its two factors, and the type it runs in.

A dot operand widened from half precision to f32 is read as its half load: the
products of half values are exact in f32, so a half dot accumulating in f32
computes the f32 product of the widened values (up to the order of its sums).
The tile pass sizes tiles by the type the dot runs in and the lowering emits
the dot in it; both read it here.
"""

from __future__ import annotations

from xdsl.ir import Attribute, SSAValue

from irc.dialects import loop
from irc.ir.types import F32, HALF_TYPES


def dot_factors(op: loop.ReduceOp) -> tuple[SSAValue, SSAValue]:
    """The two factors of a contraction's product."""
    product = op.body.block.last_op.values[0].owner  # type: ignore[union-attr]
    assert isinstance(product, loop.ApplyOp) and product.fn.data == "mul"
    a, b = product.args
    return a, b


def narrowed(v: SSAValue, element: Attribute) -> tuple[SSAValue, Attribute]:
    """A dot operand of type `element`, as the half load it was widened from (and
    that load's type), or as itself."""
    cast = v.owner
    if isinstance(cast, loop.ApplyOp) and cast.fn.data == "cast" and element == F32:
        load = cast.args[0].owner
        if isinstance(load, loop.LoadOp) and load.result.type in HALF_TYPES:
            return load.result, load.result.type
    return v, element


def runs_in_half(op: loop.ReduceOp) -> bool:
    """Whether a contraction's dot runs on half operands (tensor cores): its
    result is half, or both its factors are half values widened to f32."""
    if op.result.type in HALF_TYPES:
        return True
    element = op.result.type
    return all(narrowed(f, element)[1] in HALF_TYPES for f in dot_factors(op))
