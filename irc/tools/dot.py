"""Graphviz drawing of graph-level IR, one cluster per fusion group (`--emit dot`).

A cluster is labelled with the Triton kernel(s) its group becomes, named as the
emitted code, the fusion report and profilers name them: a copy of the module is
lowered to learn the names (`per` or `red` depends on the tiling).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import format_type
from irc.syntax.diagnostics import Diagnostic, IrcError


def _quote(text: str) -> str:
    """A DOT string literal; newlines become DOT's line breaks."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class _Drawing:
    def __init__(self, kernels: dict[str, list[str]]) -> None:
        self.kernels = kernels  # graph.fused name -> its Triton kernels
        self.lines: list[str] = []
        self.node_of: dict[SSAValue, str] = {}
        self.count = 0

    def node(self, label: str, indent: str, shape: str = "box") -> str:
        name = f"n{self.count}"
        self.count += 1
        self.lines.append(f"{indent}{name} [label={_quote(label)}, shape={shape}];")
        return name

    def block(self, block: Block, indent: str) -> None:
        for op in block.ops:
            self.op(op, indent)

    def op(self, op: Operation, indent: str) -> None:
        if isinstance(op, graph.YieldOp):
            return
        if isinstance(op, func.ReturnOp):
            n = self.node("return", indent, "oval")
            self.edges(op, n, indent)
            return
        if isinstance(op, graph.FusedOp):
            name = op.kernel.data if isinstance(op.kernel, StringAttr) else "fused"
            label = " + ".join(self.kernels.get(name, [name]))
            self.lines.append(f"{indent}subgraph cluster_{self.count} {{")
            self.count += 1
            self.lines.append(f"{indent}  label={_quote(label)}; style=rounded; color=blue;")
            for arg, operand in zip(op.body.block.args, op.inputs, strict=True):
                self.node_of[arg] = self.node_of[operand]
            self.block(op.body.block, indent + "  ")
            self.lines.append(f"{indent}}}")
            yielded = op.body.block.last_op
            assert isinstance(yielded, graph.YieldOp)
            for result, inner in zip(op.results, yielded.values, strict=True):
                self.node_of[result] = self.node_of[inner]
            return
        label = op.name.removeprefix("graph.")
        if op.results:
            label += "\n" + format_type(op.results[0].type)
        n = self.node(label, indent)
        self.edges(op, n, indent)
        for r in op.results:
            self.node_of[r] = n

    def edges(self, op: Operation, target: str, indent: str) -> None:
        for v in op.operands:
            self.lines.append(f"{indent}{self.node_of[v]} -> {target};")


def triton_names(module: ModuleOp) -> dict[str, list[str]]:
    """graph.fused kernel name -> the names of the Triton kernels it becomes."""
    from irc.compiler import lower_to_tile
    from irc.ir.value_names import clone_keeping_names
    from irc.passes.fuse import launched_kernels

    if not any(isinstance(op, graph.FusedOp) for op in module.walk()):
        return {}
    out: dict[str, list[str]] = {}
    for launches in launched_kernels(lower_to_tile(clone_keeping_names(module))).values():
        for origin, name in launches:
            out.setdefault(origin, []).append(name)
    return out


def emit_dot(module: ModuleOp) -> str:
    """One digraph per function; fused groups are drawn as clusters."""
    functions = [fn for fn in module.body.ops if isinstance(fn, func.FuncOp)]
    for fn in module.body.ops:
        if not isinstance(fn, func.FuncOp) or not all(
            isinstance(o, graph.GraphOp | graph.FusedOp | func.ReturnOp) for o in fn.body.block.ops
        ):
            raise IrcError(Diagnostic(None, "--emit dot draws graph-level IR only"))
    d = _Drawing(triton_names(module))
    d.lines.append("digraph irc {")
    d.lines.append("  rankdir=TB; node [fontname=monospace];")
    for fn in functions:
        d.lines.append(f"  subgraph cluster_fn{d.count} {{")
        d.count += 1
        d.lines.append(f"    label={_quote('@' + fn.sym_name.data)}; style=dashed;")
        for arg in fn.body.block.args:
            name = "%" + arg.name_hint if arg.name_hint else "arg"
            d.node_of[arg] = d.node(f"{name}\n{format_type(arg.type)}", "    ", "oval")
        d.block(fn.body.block, "    ")
        d.lines.append("  }")
    d.lines.append("}")
    return "\n".join(d.lines) + "\n"
