"""xDSL IR to irc text: the inverse of `irc.syntax.parser` at every level.

The output re-parses to the same IR and prints identically (a fixed point).
Value names are kept as written; unnamed values (made by passes) get numbers
that avoid every name already in the function.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import Attribute, Block, Operation, SSAValue

from irc.ir.names import format_string
from irc.ir.types import I1, format_type


def format_float(x: float) -> str:
    """Shortest text that reads back as the same double, always with a dot or exponent."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = repr(x)
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


def format_attr(attr: Attribute) -> str:
    if isinstance(attr, IntegerAttr):
        if attr.type == I1:
            return "true" if attr.value.data else "false"
        return str(attr.value.data)
    if isinstance(attr, FloatAttr):
        return format_float(attr.value.data)
    if isinstance(attr, ArrayAttr):
        return "[" + ", ".join(format_attr(a) for a in attr.data) + "]"
    if isinstance(attr, StringAttr):
        return format_string(attr.data)
    if isinstance(attr, EnumAttribute):
        return format_string(attr.data.value)  # written as a string (irc.syntax.parser)
    if isinstance(attr, SymbolRefAttr):
        return "@" + attr.root_reference.data
    return format_type(attr)


class _Names:
    """SSA names for one function: as written where possible, else fresh numbers."""

    def __init__(self, fn: Operation):
        self.names: dict[SSAValue, str] = {}
        self.taken: set[str] = set()
        self.next_number = 0
        for value in _values(fn):
            hint = value.name_hint
            if hint is not None and hint not in self.taken:
                self.names[value] = hint
                self.taken.add(hint)

    def __getitem__(self, value: SSAValue) -> str:
        name = self.names.get(value)
        if name is None:
            while str(self.next_number) in self.taken:
                self.next_number += 1
            name = str(self.next_number)
            self.taken.add(name)
            self.names[value] = name
        return "%" + name


def _values(fn: Operation) -> Iterator[SSAValue]:
    for op in fn.walk():
        for region in op.regions:
            for block in region.blocks:
                yield from block.args
        if op is not fn:
            yield from op.results


def print_module(module: ModuleOp | Operation) -> str:
    """The whole module as irc text (functions separated by blank lines)."""
    ops = list(module.body.ops) if isinstance(module, ModuleOp) else [module]
    return "\n".join(_Printer(op).text() for op in ops)


class _Printer:
    def __init__(self, top: Operation):
        self.top = top
        self.names = _Names(top)
        self.lines: list[str] = []

    def text(self) -> str:
        if isinstance(self.top, func.FuncOp):
            self._func(self.top)
        else:
            self._op(self.top, 0)
        return "\n".join(self.lines) + "\n"

    def _func(self, f: func.FuncOp) -> None:
        block = f.body.block
        args = ", ".join(f"{self.names[a]}: {format_type(a.type)}" for a in block.args)
        outs = f.function_type.outputs.data
        if len(outs) == 1:
            sig = f" -> {format_type(outs[0])}"
        elif outs:
            sig = " -> (" + ", ".join(format_type(t) for t in outs) + ")"
        else:
            sig = ""
        self.lines.append(f"func @{f.sym_name.data}({args}){sig} {{")
        self._block(block, 1)
        self.lines.append("}")

    def _block(self, block: Block, depth: int) -> None:
        for op in block.ops:
            self._op(op, depth)

    def _op(self, op: Operation, depth: int) -> None:
        pad = "  " * depth
        if isinstance(op, func.ReturnOp):
            if op.operands:
                vals = ", ".join(self.names[v] for v in op.operands)
                types = ", ".join(format_type(v.type) for v in op.operands)
                self.lines.append(f"{pad}return {vals} : {types}")
            else:
                self.lines.append(f"{pad}return")
            return
        parts: list[str] = []
        if op.results:
            parts.append(", ".join(self.names[r] for r in op.results) + " = ")
        parts.append(op.name)
        if op.operands:
            parts.append(" " + ", ".join(self.names[v] for v in op.operands))
        # An op may leave out properties its text shows already (`elided_properties`).
        elided = op.elided_properties() if hasattr(op, "elided_properties") else ()
        props = {k: v for k, v in op.properties.items() if k not in elided}
        if props:
            spelled = {v: k for k, v in getattr(op, "TEXT_KEYS", {}).items()}
            entries = ", ".join(f"{spelled.get(k, k)} = {format_attr(v)}" for k, v in props.items())
            parts.append(" {" + entries + "}")
        tail = ""
        if op.results:
            tail = " : " + ", ".join(format_type(r.type) for r in op.results)
        if op.regions:
            (region,) = op.regions
            block = region.block
            args = ", ".join(f"{self.names[a]}: {format_type(a.type)}" for a in block.args)
            self.lines.append(pad + "".join(parts) + f" ({args}) {{")
            self._block(block, depth + 1)
            self.lines.append(pad + "}" + tail)
        else:
            self.lines.append(pad + "".join(parts) + tail)
