"""Whether a `graph.fused` group is one kernel, by the fusion pass's own rules
(passes/fuse.py, less its cost limits), so that a group written by hand is refused
in terms of its ops. Called by the module verifier once the op's own checks pass;
it lives here, not in the dialect, because the rule belongs to a pass."""

from __future__ import annotations

from irc.dialects import graph
from irc.passes.fuse import FusionGraph, Rejected, kernel_schema


def check_fused_group(op: graph.FusedOp) -> None:
    """Raises `GraphVerifyError` when no single kernel computes `op`'s group, or
    when its written kind or rows differ from the ones fusion derives."""
    if any(isinstance(o, graph.FusedOp) for o in op.body.block.ops):
        return  # reported at the inner group
    written = op.written_kind()
    g = FusionGraph(op.body.block)
    try:
        schema = kernel_schema(g, g.compute, None, costs=False)
    except Rejected as e:
        raise graph.GraphVerifyError(
            f"graph.fused: one kernel cannot compute this group: {e}"
        ) from None
    if written is not None and written != schema.kind:
        raise graph.GraphVerifyError(
            f'graph.fused: kind "{written}", but the group is a "{schema.kind}" kernel'
        )
    geometry = op.written_geometry()
    if geometry is not None and geometry != schema.geometry:
        rows = schema.geometry
        why = (
            f"its reductions have space = {list(rows.space)}, dims = {list(rows.dims)}"
            if rows is not None
            else f'a "{schema.kind}" kernel has no rows'
        )
        raise graph.GraphVerifyError(
            f"graph.fused: space = {list(geometry.space)}, dims = {list(geometry.dims)}, "
            f"but {why}"
        )

