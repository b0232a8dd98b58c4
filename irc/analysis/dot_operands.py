"""What a contraction's dot reads: its two factors, and the type it runs in.

A dot operand widened from half precision to f32 is read as its half load: the
products of half values are exact in f32, so a half dot accumulating in f32
computes the f32 product of the widened values (up to the order of its sums).
The tile pass sizes tiles by the type the dot runs in and the lowering emits
the dot in it; both read it here, and which f32 factors TF32 holds exactly (a
dot of two such runs as one TF32 product, exact).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Set

from xdsl.dialects.builtin import FloatAttr
from xdsl.ir import Attribute, Operation, SSAValue

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
    result is half, or the factors of its products are half values widened to f32."""
    if op.result.type in HALF_TYPES:
        return True
    element = op.result.type
    products = loop.contraction_products(op.body.block.last_op.values[0])  # type: ignore[union-attr]
    return all(narrowed(f, element)[1] in HALF_TYPES for p in products for f in p.args)


def tf32_buffers(ops: Iterable[Operation]) -> frozenset[SSAValue]:
    """The `loop.alloc` buffers among `ops` (a function's, walked) that hold values
    TF32 holds exactly: every store to one writes such a value (`tf32_exact`), from
    those of buffers already known so (the least fixed point: a buffer only stored
    from itself is not). An f32 dot of two such factors multiplies them as TF32,
    exactly, once: `split-tf32-gemm-operands` stores an f32 GEMM's operands as TF32
    parts so (`loop.TF32_FNS`)."""
    stores: dict[SSAValue, list[loop.StoreOp]] = {}
    allocs: set[SSAValue] = set()
    for op in ops:
        if isinstance(op, loop.StoreOp):
            stores.setdefault(op.buffer, []).append(op)
        elif isinstance(op, loop.AllocOp):
            allocs.add(op.result)
    exact: set[SSAValue] = set()
    while True:
        more = {
            b
            for b, written in stores.items()
            if b in allocs and b not in exact and all(tf32_exact(s.value, exact) for s in written)
        }
        if not more:
            return frozenset(exact)
        exact |= more


def tf32_exact(value: SSAValue, buffers: Set[SSAValue]) -> bool:
    """Whether `value` (loop IR) is an f32 that TF32 holds exactly: a TF32 part
    (`loop.TF32_FNS`), a constant of 10 mantissa bits or fewer, a load of one of
    `buffers`, or a `where` between such values."""
    if value.type != F32:
        return False
    op = value.owner
    if isinstance(op, loop.LoadOp):
        return op.buffer in buffers
    if isinstance(op, loop.ConstantOp):
        number = op.value
        if not isinstance(number, FloatAttr):
            return False
        bits = struct.unpack("<I", struct.pack("<f", number.value.data))[0]
        return bits & TF32_DROPPED_BITS == 0
    if isinstance(op, loop.ApplyOp):
        if op.fn.data in loop.TF32_FNS:
            return True
        if op.fn.data == "where":
            return all(tf32_exact(v, buffers) for v in op.args[1:])
    return False


TF32_DROPPED_BITS = (1 << 13) - 1
"""The f32 mantissa bits TF32 drops (23 - 10)."""
