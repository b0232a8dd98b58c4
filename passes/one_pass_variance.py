"""`one-pass-variance`: a mean and the variance about it in one loop (Welford).

A variance written out, as batch norm and layer norm are, reduces twice over
the same values: `mean = sum(x) / n`, then `sum((x - mean)**2)`, which needs
the mean first. Where the values stream from memory (a column's statistics
over many rows, split across programs; a row too long for registers) that is
two passes over the input before the normalizing one. This pass rewrites such
a pair of `loop.reduce`s into one `loop.welford_reduce`, whose partial results
(mean, M2, count) combine exactly (Chan et al.), so the input is read once for
both statistics and `split-reduction` makes one stage of them, not two.

It is as accurate as the two passes: every part's squares are taken about its
own mean, never `sum(x**2) - n * mean**2`. Rows held in registers lose
nothing: `loop-to-tile` lowers their `loop.welford_reduce` as the two sweeps
over the loaded values they were. f32 and f64 only: a half-precision variance
rounds `x - mean` and its square to the half type first, which this op does not.

It runs on loop IR before `split-reduction`, which splits the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f64
from xdsl.ir import Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.analysis.reduction_groups import same_value
from irc.dialects import loop
from irc.ir.types import ELEMENT_TYPES, F32, numel

ELEMENTS = (F32, ELEMENT_TYPES["f64"])
"""Where the rewrite applies (the module docstring says why not half types)."""


@dataclass(frozen=True)
class Variance:
    """A `sum(x)` whose only use is `mean = sum / n`, and the `sum((x - mean)**2)`
    over the same values and space."""

    total: loop.ReduceOp
    mean: loop.ApplyOp
    squares: loop.ReduceOp


def _plain_sum(op: Operation) -> bool:
    return (
        isinstance(op, loop.ReduceOp)
        and op.kind.data == "sum"
        and op.contract is None
        and op.result.type in ELEMENTS
    )


def _mean_of(total: loop.ReduceOp) -> loop.ApplyOp | None:
    """`total / n` (n its element count), if that is all `total` is used for."""
    div = total.result.get_user_of_unique_use()
    if not (isinstance(div, loop.ApplyOp) and div.fn.data == "div"):
        return None
    if div.operands[0] is not total.result or div.result.type != total.result.type:
        return None
    n = div.operands[1].owner
    if not isinstance(n, loop.ConstantOp) or not isinstance(n.value, FloatAttr):
        return None
    return div if n.value.value.data == numel(loop.int_list(total.bounds)) else None


def _squared_deviation(value: SSAValue, mean: SSAValue) -> SSAValue | None:
    """x, if `value` is `d * d` for d = `x - mean` or `mean - x`."""
    square = value.owner
    if not (isinstance(square, loop.ApplyOp) and square.fn.data == "mul"):
        return None
    d, d2 = square.operands
    if d is not d2 or not isinstance(sub := d.owner, loop.ApplyOp) or sub.fn.data != "sub":
        return None
    a, b = sub.operands
    if b is mean:
        return a
    return b if a is mean else None


def find_variance(total: loop.ReduceOp) -> Variance | None:
    """The variance that `total`'s mean is the centre of, if one is in its block."""
    if not _plain_sum(total) or (mean := _mean_of(total)) is None:
        return None
    (x,) = total.body.block.last_op.values  # type: ignore[union-attr]
    block = total.parent_block()
    assert block is not None
    for other in block.ops:
        if other is total or not _plain_sum(other):
            continue
        assert isinstance(other, loop.ReduceOp)
        if other.bounds != total.bounds or other.result.type != total.result.type:
            continue
        (yielded,) = other.body.block.last_op.values  # type: ignore[union-attr]
        centred = _squared_deviation(yielded, mean.result)
        args = dict(zip(other.body.block.args, total.body.block.args, strict=True))
        if centred is not None and same_value(centred, x, args):
            return Variance(total, mean, other)
    return None


def fuse_variance(v: Variance) -> loop.WelfordReduceOp:
    """Replaces the pair by one `loop.welford_reduce` where the sum was."""
    t = v.total.result.type
    region = Region()
    v.total.body.move_blocks(region)
    body = region.block
    yielded = body.last_op
    assert isinstance(yielded, loop.YieldOp)
    zero, one = (
        loop.ConstantOp.create(properties={"value": FloatAttr(c, f64)}, result_types=[t])
        for c in (0.0, 1.0)
    )
    body.insert_ops_before([zero, one], yielded)
    yielded.operands = [yielded.values[0], zero.result, one.result]
    welford = loop.WelfordReduceOp.create(
        properties={"bounds": v.total.bounds}, result_types=[t, t, t], regions=[region]
    )
    block = v.total.parent_block()
    assert block is not None
    block.insert_op_before(welford, v.total)
    v.mean.result.replace_all_uses_with(welford.mean)
    v.squares.result.replace_all_uses_with(welford.m2)
    n = v.mean.operands[1].owner
    for op in (v.squares, v.mean, v.total):
        op.detach()
        op.erase()
    if isinstance(n, Operation) and not n.results[0].uses:
        n.detach()
        n.erase()
    return welford


def rewrite_kernel(kernel: loop.KernelOp) -> int:
    """Rewrites every mean-and-variance pair of `kernel`; returns how many."""
    count = 0
    while True:
        found = next(
            (
                v
                for op in kernel.body.walk()
                if isinstance(op, loop.ReduceOp) and (v := find_variance(op)) is not None
            ),
            None,
        )
        if found is None:
            return count
        fuse_variance(found)
        count += 1


@dataclass(frozen=True)
class OnePassVariancePass(ModulePass):
    """`one-pass-variance`: a mean and the variance about it become one
    `loop.welford_reduce` (see the module docstring)."""

    name = "one-pass-variance"
    levels = ("loop",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in loop.kernels(op):
            rewrite_kernel(kernel)
