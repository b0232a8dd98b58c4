"""The module verifier: xDSL's per-op checks plus what xDSL leaves out.

xDSL does not check that a value is defined before it is used, nor does it
locate its errors in the source; this verifier does both and collects every
error of a module (not just the first) as located diagnostics.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from irc.analysis.bounds import check_bounds
from irc.analysis.fused_groups import check_fused_group
from irc.dialects import graph, tile
from irc.gcpause import paused_gc
from irc.ir.types import format_type
from irc.syntax.diagnostics import Diagnostic, IrcError, Location, Note, op_location


def value_location(value: SSAValue) -> Location | None:
    if isinstance(value, BlockArgument):
        loc = Location.from_attr(value.location)
        if loc is not None:
            return loc
        return op_location(value.block.parent_op()) if value.block.parent_op() else None
    return op_location(value.owner)  # type: ignore[arg-type]


def value_name(value: SSAValue) -> str:
    return "%" + value.name_hint if value.name_hint else "this value"


@paused_gc()
def verify(module: ModuleOp, context: str | None = None) -> None:
    """Raises `IrcError` listing every problem in `module`.

    `context` names the pass that just ran, so that a pass producing invalid IR
    is reported as such rather than blamed on the input.
    """
    diagnostics: list[Diagnostic] = []
    visible: set[SSAValue] = set()  # values of top-level ops other than functions
    for op in module.body.ops:
        if isinstance(op, func.FuncOp):
            _verify_func(op, diagnostics)
        else:
            _verify_block_ops([op], visible, diagnostics)
    if not diagnostics:
        # Memory safety, once every op is well formed (irc/analysis/bounds.py).
        diagnostics.extend(check_bounds(module))
    if diagnostics:
        if context is not None:
            for d in diagnostics:
                d.message = f"after pass '{context}': {d.message}"
        raise IrcError(diagnostics)


def _verify_func(f: func.FuncOp, out: list[Diagnostic]) -> None:
    block = f.body.block
    expected = list(f.function_type.outputs.data)
    visible: set[SSAValue] = set(block.args)
    _verify_block_ops(list(block.ops), visible, out)
    last = block.last_op
    if not isinstance(last, func.ReturnOp):
        out.append(
            Diagnostic(op_location(f), f"function @{f.sym_name.data} must end with 'return'")
        )
        return
    got = [v.type for v in last.operands]
    if len(got) != len(expected):
        out.append(
            Diagnostic(
                op_location(last),
                f"return gives {len(got)} value(s) but @{f.sym_name.data} declares {len(expected)}",
                notes=[Note(op_location(f), "function declared here")],
            )
        )
        return
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            v = last.operands[i]
            out.append(
                Diagnostic(
                    op_location(last),
                    f"return value {i} ({value_name(v)}) has type {format_type(g)} but "
                    f"@{f.sym_name.data} declares {format_type(e)}",
                    notes=[Note(value_location(v), f"{value_name(v)} defined here")],
                )
            )


def _verify_block_ops(
    ops: list[Operation],
    visible: set[SSAValue],
    out: list[Diagnostic],
    defined: list[SSAValue] | None = None,
) -> None:
    """Checks ops in order; `visible` grows as values are defined and is restored
    after each nested region (no copies: big functions stay linear)."""
    for op in ops:
        ok = True
        for operand in op.operands:
            if operand not in visible:
                ok = False
                out.append(
                    Diagnostic(
                        op_location(op),
                        f"{value_name(operand)} is used before it is defined",
                        notes=[Note(value_location(operand), "defined here")],
                    )
                )
        if ok and not isinstance(op, func.ReturnOp):
            verify_op(op, out)
        for region in op.regions:
            for block in region.blocks:
                inner = [a for a in block.args if a not in visible]
                visible.update(inner)
                _verify_block_ops(list(block.ops), visible, out, inner)
                visible.difference_update(inner)
        visible.update(op.results)
        if defined is not None:
            defined.extend(op.results)


def verify_op(op: Operation, out: list[Diagnostic]) -> None:
    """Appends `op`'s own verification errors, located at the op, to `out`."""
    try:
        # IRDL's constraints, then the op's own checks (xDSL's verify_ runs both).
        op.verify_()
        tile.check_kernel_values(op)
        if isinstance(op, graph.FusedOp):
            check_fused_group(op)
    except VerifyException as e:
        notes: list[Note] = []
        index = getattr(e, "operand", None)
        if index is not None and index < len(op.operands):
            v = op.operands[index]
            notes.append(
                Note(value_location(v), f"{value_name(v)} defined here as {format_type(v.type)}")
            )
        # xDSL's own messages may span lines; a diagnostic is one line.
        message = ""
        for line in (part.strip() for part in str(e).splitlines()):
            if line:
                message += ("" if not message else " " if message.endswith(":") else "; ") + line
        message = message or type(e).__name__
        if not message.startswith(op.name):  # IRDL's own (`@k should be of base attribute
            message = f"{op.name}: {message}"  # string`) say nothing of the op they are in
        out.append(Diagnostic(op_location(op), message, notes=notes))


def enclosing_block(op: Operation) -> Block | None:
    return op.parent_block()
