"""`online-softmax`: a row's max and its sum of exp(x - max) in one loop.

A softmax (or log-sum-exp) row reduces twice over the same values: `m =
max(x)`, then `s = sum(exp(x - m))`, which needs `m` first. When the row is
too long for registers (the `tile` pass loops over it in chunks) that is two
passes over memory before the output pass. This pass rewrites such a pair of
`loop.reduce`s into one `loop.softmax_reduce`, which `loop-to-tile` lowers to
a single loop: each lane keeps a running max and a sum rescaled to it (the
online softmax of Milakov and Gimelshein), so the row is read twice instead of
three times. Rows held in registers (one block, or chunks unrolled) are left
alone: they are read once anyway.

It reads the tiling, so it runs after `tile` (and after autotuning, which may
change it).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Region
from xdsl.passes import ModulePass

from irc.analysis.reduction_groups import same_value
from irc.dialects import loop
from irc.ir.types import ELEMENT_TYPES, F32, numel
from irc.passes.tile import kernel_shape, tiling_of

ELEMENTS = (F32, ELEMENT_TYPES["f64"])
"""Where the rewrite applies: a half-precision exp rounds before the sum."""


def looped_rows(kernel: loop.KernelOp) -> bool:
    """Whether `kernel` reduces rows in a loop over chunks (its rows do not fit one
    block, and its chunks are not unrolled into registers)."""
    shape, tiling = kernel_shape(kernel), tiling_of(kernel)
    if shape.kind != "reduction" or tiling.unrolled:
        return False
    return tiling.block[1] < numel(shape.reduction)


def softmax_partner(rmax: loop.ReduceOp) -> loop.ReduceOp | None:
    """The first `sum(exp(x - rmax))` in `rmax`'s block whose x is what `rmax` reduces."""
    element = rmax.result.type
    if rmax.kind.data != "max" or rmax.contract is not None or element not in ELEMENTS:
        return None
    block = rmax.parent_block()
    assert block is not None
    (x_max,) = rmax.body.block.last_op.values  # type: ignore[union-attr]
    for other in block.ops:
        if not isinstance(other, loop.ReduceOp) or other is rmax or other.kind.data != "sum":
            continue
        if other.bounds != rmax.bounds or other.result.type != element or other.contract:
            continue
        (yielded,) = other.body.block.last_op.values  # type: ignore[union-attr]
        exp = yielded.owner
        if not (isinstance(exp, loop.ApplyOp) and exp.fn.data == "exp"):
            continue
        sub = exp.args[0].owner
        if not (isinstance(sub, loop.ApplyOp) and sub.fn.data == "sub"):
            continue
        x, m = sub.args
        args = dict(zip(other.body.block.args, rmax.body.block.args, strict=True))
        if m is rmax.result and same_value(x, x_max, args):
            return other
    return None


def fuse_pair(rmax: loop.ReduceOp, rsum: loop.ReduceOp) -> loop.SoftmaxReduceOp:
    """Replaces `rmax` and its partner `rsum` by one `loop.softmax_reduce` where `rmax` was."""
    region = Region()
    rmax.body.move_blocks(region)
    t = rmax.result.type
    both = loop.SoftmaxReduceOp.create(
        properties={"bounds": rmax.bounds}, result_types=[t, t], regions=[region]
    )
    block = rmax.parent_block()
    assert block is not None
    block.insert_op_before(both, rmax)
    rmax.result.replace_all_uses_with(both.maximum)
    rsum.result.replace_all_uses_with(both.sum_exp)
    rsum.detach()
    rsum.erase()
    rmax.detach()
    rmax.erase()
    return both


def rewrite_kernel(kernel: loop.KernelOp) -> int:
    """Rewrites every max/sum-of-exps pair of `kernel`; returns how many."""
    if not looped_rows(kernel):
        return 0
    pairs = []
    for op in kernel.body.walk():
        if isinstance(op, loop.ReduceOp):
            partner = softmax_partner(op)
            if partner is not None:
                pairs.append((op, partner))
    for rmax, rsum in pairs:
        fuse_pair(rmax, rsum)
    return len(pairs)


@dataclass(frozen=True)
class OnlineSoftmaxPass(ModulePass):
    """`online-softmax`: a looped row's max and sum of exp(x - max) become one
    `loop.softmax_reduce`, read in one pass (see the module docstring)."""

    name = "online-softmax"
    levels = ("loop",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in op.walk():
            if isinstance(kernel, loop.KernelOp):
                rewrite_kernel(kernel)
