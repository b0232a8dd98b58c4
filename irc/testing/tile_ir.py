"""Facts the tests read from tile IR."""

from __future__ import annotations

from xdsl.ir import SSAValue

from irc.dialects import tile


def unit_stride_axes(v: SSAValue) -> set[int]:
    """Block axes along which the offsets `v` step by one element: an arange that
    reaches them unscaled (added, expanded, cast), not multiplied by a stride."""
    op = v.owner
    if isinstance(op, tile.ArangeOp):
        return {0}
    if isinstance(op, tile.ExpandDimsOp):
        inner = unit_stride_axes(op.operands[0])
        axis = op.axis.value.data
        return {a + (1 if a >= axis else 0) for a in inner}
    if isinstance(op, tile.BroadcastToOp):
        return unit_stride_axes(op.operands[0])
    # tile.apply functions (not graph ops): a sum or a conversion keeps the step
    if isinstance(op, tile.ApplyOp) and (op.fn.data == "add" or op.fn.data == "cast"):
        out: set[int] = set()
        for a in op.args:
            out |= unit_stride_axes(a)
        return out
    return set()
