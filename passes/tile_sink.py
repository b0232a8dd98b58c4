"""`tile-sink`: index math and constants of a persistent tile loop move down to
their first use.

`loop-to-tile` builds a persistent GEMM's `tile.tiles` body top-down, so the
epilogue's row and column indices and masks come before the K loop and stay
live across it. Hand-written persistent kernels compute them after the loop;
this pass does the same by moving each such op to just before the first op of
the block that uses it. Loads, reductions and dots stay where they are (where
a load is issued is a scheduling choice), and other blocks are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block
from xdsl.passes import ModulePass

from irc.dialects import tile

SINKABLE_OPS = (tile.ApplyOp, tile.ExpandDimsOp, tile.BroadcastToOp, tile.ArangeOp, tile.ConstantOp)
"""Ops that compute indices, masks and constants: pure and cheap to place anywhere."""


def sink_to_first_use(block: Block) -> None:
    """Moves sinkable ops of `block` down to just before their first use in it."""
    for op in reversed(list(block.ops)):
        if not isinstance(op, SINKABLE_OPS):
            continue
        users = [block.find_ancestor_op_in_block(u.operation) for r in op.results for u in r.uses]
        if not users or any(u is None for u in users):
            continue
        first = min(users, key=block.get_operation_index)  # type: ignore[arg-type]
        if first is not op.next_op:
            op.detach()
            block.insert_op_before(op, first)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TileSinkPass(ModulePass):
    """`tile-sink`: pure index ops in `tile.tiles` bodies move to their first use."""

    name = "tile-sink"
    levels = ("tile",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in tile.kernels(op):
            for tiles in kernel.body.block.ops:
                if isinstance(tiles, tile.TilesOp):
                    sink_to_first_use(tiles.body.block)
