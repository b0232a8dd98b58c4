"""The band of keys an attention's iota mask keeps for each row.

A causal mask written out (`where(i >= j, s, -inf)`), a mask of the keys past
the diagonal or a sliding window is a band: row i keeps keys i + lo <= j <= i + hi.
The tile pass sizes an attention's tiles by whether it has one, and the
lowering skips the tiles outside it and masks only those it crosses; both read
it here, so that the analysis has one home below both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerAttr
from xdsl.ir import Block, SSAValue

from irc.dialects import graph, loop


def attention_parts(kernel: loop.KernelOp) -> tuple[loop.SoftmaxReduceOp, loop.ReduceOp]:
    softmax = values = None
    for op in kernel.body.block.ops:
        if isinstance(op, loop.SoftmaxReduceOp):
            softmax = op
        elif isinstance(op, loop.ReduceOp) and op.contract is not None:
            values = op
    assert softmax is not None and values is not None, "graph-to-loop's attention nest"
    return softmax, values




COMPARISONS = {fn: c for fn, c in graph.COMPARISONS.items() if c.order}
"""The orders (<, <=, >, >=) a causal mask compares a row and a key index by (the
COMPARISON facts of the comparison ops that are orders)."""
INDEX_EXACT = 2**24
"""Indices below this are exact in f32 too (a float iota compares exactly)."""


@dataclass(frozen=True)
class KeyBand:
    """The keys an iota mask keeps for row i: i + lo <= j <= i + hi (None: no bound)."""

    lo: int | None
    hi: int | None
    wheres: tuple[loop.ApplyOp, ...]
    """The `where(c, s, -inf)` layers that apply it, in the softmax's scores and in
    their copy in the values' loop: an unmasked tile takes `s` as it is."""


def band_of(kernel: loop.KernelOp) -> KeyBand | None:
    """The band of keys an attention kernel's iota mask keeps, if it has one."""
    softmax, values = attention_parts(kernel)
    return key_band(softmax, values, kernel.body.block.args[-2])


def key_band(
    softmax: loop.SoftmaxReduceOp, values: loop.ReduceOp, row: SSAValue
) -> KeyBand | None:
    """The band of keys the softmax's input keeps for each row, if iotas make it.

    The input must be `where(c, s, -inf)` (casts aside), possibly nested, with
    each `c` a comparison of the row index and the key index, each plus a
    constant, or a conjunction of those (`where(a, b, a)`, `where(a, b, false)`):
    what an iota-made causal mask (`i >= j`, `j <= i + 8`), a mask of keys past
    the diagonal (`i <= j`) or a sliding window (both) lowers to. None for any
    other scores (a mask tensor, a bias after the mask: every tile is visited
    and masked as the scores say).
    """
    (key,) = softmax.body.block.args
    last = softmax.body.block.last_op.values[0]  # type: ignore[union-attr]
    found = _band_layers(last, row, key)
    if found is None:
        return None
    lo, hi, wheres = found
    # The same layers in the values' copy of the scores: its outermost band of the
    # same bounds.
    (vkey,) = values.body.block.args
    copies = [
        layers
        for op in values.body.block.walk()
        if isinstance(op, loop.ApplyOp)
        and (layers := _band_layers(op.result, row, vkey)) is not None
        and layers[:2] == (lo, hi)
    ]
    if not copies:
        return None
    copy = max(copies, key=lambda c: len(c[2]))[2]
    return KeyBand(lo, hi, (*wheres, *copy))


def _band_layers(
    v: SSAValue, row: SSAValue, key: SSAValue
) -> tuple[int | None, int | None, list[loop.ApplyOp]] | None:
    """(lo, hi, the where layers) of the iota masks applied to `v` outermost first."""
    lo: int | None = None
    hi: int | None = None
    wheres: list[loop.ApplyOp] = []
    where = uncast(v).owner
    while isinstance(where, loop.ApplyOp) and where.fn.data == "where":
        cond, kept, other = where.args
        bounds = _conjuncts(cond, row, key)
        if number(uncast(other)) != -math.inf or bounds is None:
            break
        for side, off in bounds:
            if side == "lo":
                lo = off if lo is None else max(lo, off)
            else:
                hi = off if hi is None else min(hi, off)
        wheres.append(where)
        where = uncast(kept).owner
    return (lo, hi, wheres) if wheres else None


def _conjuncts(cond: SSAValue, row: SSAValue, key: SSAValue) -> list[tuple[str, int]] | None:
    """The bounds ("lo" or "hi", off) whose conjunction `cond` is, if it is one."""
    op = cond.owner
    if not isinstance(op, loop.ApplyOp):
        return None
    if op.fn.data in COMPARISONS:
        bound = _key_bound(op, row, key)
        return None if bound is None else [bound]
    if op.fn.data == "where":  # a and b: where(a, b, a) or where(a, b, false)
        a, b, c = op.args
        if c is a or number(c) == 0:
            left, right = _conjuncts(a, row, key), _conjuncts(b, row, key)
            if left is not None and right is not None:
                return left + right
    return None


def _key_bound(cmp: loop.ApplyOp, row: SSAValue, key: SSAValue) -> tuple[str, int] | None:
    """("hi", off) for a comparison keeping keys j <= i + off of row i, ("lo", off)
    for one keeping j >= i + off; None for any other."""
    a, b = (linear(x) for x in cmp.args)
    if a is None or b is None:
        return None
    comparison = COMPARISONS[cmp.fn.data]
    if a[0] is key and b[0] is row:  # j + ca OP i + cb: flip to i + cb OP' j + ca
        a, b = b, a
        comparison = comparison.mirrored()
    if not (a[0] is row and b[0] is key):
        return None  # not a comparison of rows with keys
    offset = a[1] - b[1]  # i + ca OP j + cb: j OP' i + (ca - cb)
    strict = 0 if comparison.equal else 1  # i + c > j is i + c - 1 >= j on integers
    if comparison.greater:  # i + c >= j: an upper bound on the keys
        return "hi", offset - strict
    return "lo", offset + strict


def uncast(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, loop.ApplyOp) and v.owner.fn.data == "cast":
        v = v.owner.args[0]
    return v


def number(v: SSAValue) -> float | None:
    owner = v.owner
    if isinstance(owner, loop.ConstantOp):
        value = owner.value
        if isinstance(value, FloatAttr | IntegerAttr):
            return float(value.value.data)
    return None


def linear(v: SSAValue) -> tuple[SSAValue, int] | None:
    """(index, c) when `v` is a loop index plus a whole constant (casts aside)."""
    v = uncast(v)
    if isinstance(v.owner, Block):
        bounds = v.owner.parent_op()
        sizes = bounds.properties.get("bounds") if bounds is not None else None
        if sizes is None or max(loop.int_list(sizes)) >= INDEX_EXACT:  # type: ignore[arg-type]
            return None
        return v, 0
    op = v.owner
    fact = graph.FUNCTION_OPS.get(op.fn.data) if isinstance(op, loop.ApplyOp) else None
    signs = fact.LINEAR if fact is not None else None  # a sum: x + c, c + x, x - c
    if signs is None:
        return None
    x, y = op.args  # type: ignore[union-attr]
    c, inner = number(uncast(y)), linear(x)
    if c is None and signs[1] == 1:  # the constant on the left
        c, inner, signs = number(uncast(x)), linear(y), signs[::-1]
    if c is None or inner is None or signs[0] != 1 or c != int(c) or abs(c) >= INDEX_EXACT:
        return None
    return inner[0], inner[1] + int(c) * signs[1]
