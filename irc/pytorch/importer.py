"""The importer: a core-ATen FX graph as a `graph` dialect function.

One importer serves `irc.compile`, `torch.compile(backend="irc")` and
`irc.export_ir`. Placeholders become the function's arguments, each
`call_function` node one or more graph ops (irc/pytorch/aten.py), the output
node its `return`. Value names are the FX node names (`%addmm_1`,
`%p_attn_c_attn_weight`), so the printed `.ir` reads like the FX graph.

Every node's result is checked against torch: the type irc infers for it
must be the shape and dtype of `meta['val']` (a mismatch is a bug in a
converter, and says which node).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp
from xdsl.ir import Block, Region, SSAValue

from irc.ir.types import format_type, shape_of
from irc.ir.value_names import set_value_name
from irc.pytorch import formulas  # noqa: F401  (registers its converters in CONVERTERS)
from irc.pytorch.aten import CONVERTERS
from irc.pytorch.emitter import Emitter, Unsupported, clean_name
from irc.pytorch.sink_views import sink_views
from irc.pytorch.types import dtype_supported, fake_of, is_static, tensor_type

IGNORED = {
    torch.ops.aten._assert_tensor_metadata.default,
}
"""Nodes with no result that only assert what the boundary already checks."""


class TypeMismatch(Exception):
    """irc's type inference disagrees with torch's `meta['val']` for a node."""


def op_name(node: fx.Node) -> str:
    """`aten.add.Tensor`, as the eager report names an op."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _check(node: fx.Node, produced: Any) -> None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        pairs: list[tuple[Any, Any]] = [(val, produced)]
    elif isinstance(val, list | tuple) and isinstance(produced, list | tuple):
        pairs = list(zip(val, produced, strict=False))
    else:
        raise Unsupported("its result is not a tensor")
    for expected, got in pairs:
        if got is None or not isinstance(expected, torch.Tensor):
            continue
        want = tensor_type(expected)
        if got.type != want:
            raise TypeMismatch(
                f"{op_name(node)} (node {node.name}): irc infers {format_type(got.type)}, "
                f"torch says {format_type(want)}"
            )


def _tensor_inputs_ok(node: fx.Node) -> None:
    for value in [node, *node.all_input_nodes]:
        val = value.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        for v in vals:
            if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
                raise Unsupported("it has a symbolic size")
            if isinstance(v, torch.Tensor):
                if not is_static(v):
                    raise Unsupported("it has a symbolic size")
                if not dtype_supported(v):
                    raise Unsupported(f"dtype {v.dtype} is not an irc element type")
                if value is node and 0 in v.shape:  # an empty input is fine: cat drops it
                    raise Unsupported("its result is empty (irc's dimensions are positive)")


class Support:
    """Whether irc takes a node, decided by converting it alone (op, dtypes, ranks)."""

    def __init__(self) -> None:
        self.reasons: dict[fx.Node, str | None] = {}

    def why_not(self, node: fx.Node) -> str | None:
        """None when irc takes `node`; otherwise why not, in a few words."""
        if node not in self.reasons:
            self.reasons[node] = self._decide(node)
        return self.reasons[node]

    def _decide(self, node: fx.Node) -> str | None:
        if node.op != "call_function":
            return None if node.op in ("placeholder", "output", "get_attr") else node.op
        if node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, fx.Node) and self.why_not(source) is None:
                return None
            return "its source runs in eager"
        if node.target not in CONVERTERS:
            return "no graph op for it"
        try:
            _tensor_inputs_ok(node)
            block = Block()
            e = Emitter(block)
            for value in node.all_input_nodes:
                val = fake_of(value)
                if val is not None:
                    e.values[value] = block.insert_arg(tensor_type(val), len(block.args))
            produced = CONVERTERS[node.target](e, node)
            _check(node, produced)
        except Unsupported as why:
            return str(why)
        except TypeMismatch as why:
            return f"type mismatch: {why}"
        except Exception as why:  # a converter's case it does not handle: eager, said so
            if any(0 in shape_of(arg.type) for arg in block.args):
                # An empty tensor may reach a converter that drops it (`cat` of an empty
                # KV cache), never a graph op (the verifier's: dimensions are positive).
                return "an input is empty (irc's dimensions are positive)"
            return f"{type(why).__name__}: {why}"
        return None


def import_graph(
    graph: fx.Graph, name: str = "forward", arg_names: Sequence[str] | None = None
) -> ModuleOp:
    """A module with one function `@name` computing `graph` (every node supported).

    Raises `Unsupported` (naming the node) for a node irc cannot take, and
    `TypeMismatch` where irc's types disagree with torch's.
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    block = Block()
    e = Emitter(block)
    for i, p in enumerate(placeholders):
        val = fake_of(p)
        if val is None or not is_static(val) or not dtype_supported(val):
            raise Unsupported(f"input {p.name} is not a static tensor of an irc dtype")
        arg = block.insert_arg(tensor_type(val), len(block.args))
        e.named(arg, arg_names[i] if arg_names else p.name)
        e.values[p] = arg
    outputs: list[SSAValue] = []
    for node in graph.nodes:
        if node.op in ("placeholder",) or node.target in IGNORED:
            continue
        if node.op == "output":
            outputs = [e.arg(v) for v in _flat(node.args[0])]
            continue
        if node.op != "call_function" or node.target not in CONVERTERS:
            raise Unsupported(f"{op_name(node)} (node {node.name}) has no graph op")
        e.name = node.name
        start = len(block.ops)
        e.taken.add(clean_name(node.name))  # the node's own value takes its name below
        try:
            _tensor_inputs_ok(node)
            produced = CONVERTERS[node.target](e, node)
        except Unsupported as why:
            raise Unsupported(f"{op_name(node)} (node {node.name}): {why}") from None
        _check(node, produced)
        new = {r for op in list(block.ops)[start:] for r in op.results}
        if isinstance(produced, SSAValue) and produced in new:
            set_value_name(produced, clean_name(node.name))
        e.values[node] = produced
    fn_type = FunctionType.from_lists([a.type for a in block.args], [v.type for v in outputs])
    block.add_op(func.ReturnOp(*outputs))
    fn = func.FuncOp(clean_name(name), fn_type, Region(block))
    sink_views(fn)
    return ModuleOp([fn])


def _flat(value: Any) -> Iterable[Any]:
    if isinstance(value, list | tuple):
        for v in value:
            yield from _flat(v)
    else:
        yield value
