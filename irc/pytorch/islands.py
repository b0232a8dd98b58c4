"""Running an FX graph with irc: supported islands compiled, the rest in eager.

`CapabilityBasedPartitioner` groups the nodes irc takes (`Support`, decided
node by node from the op, its dtypes and ranks) into islands; each island is
imported as one graph function, compiled by irc and called in place of its
nodes, and what is left runs as torch ops. The `EagerReport` lists every op
left to eager, and `log_report` says it once, on one line.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from xdsl.dialects.builtin import ModuleOp

from irc.passes.sink_transposes import ROW_MAJOR_RESULTS
from irc.pytorch.importer import IGNORED, Support, import_graph, op_name
from irc.pytorch.types import fake_of, is_static

log = logging.getLogger("irc")

CompileModule = Callable[[ModuleOp, str], Any]
"""Compiles a graph module for a device ("cpu"/"cuda"): `irc.compile` itself, passed
in by the caller (irc.compiler imports this package, not the other way round)."""


@dataclass
class EagerReport:
    """What ran where: irc's islands and the ops left to eager, with why."""

    eager_ops: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)
    islands: int = 0
    irc_nodes: int = 0
    kernels: int = 0
    fallback: str | None = None
    """Set when the whole graph ran in eager (a symbolic size, say): why."""

    def line(self) -> str:
        """`irc: 2 ops ran in eager: aten.foo x2 (no graph op for it)`."""
        if self.fallback is not None:
            return f"irc: the graph ran in eager: {self.fallback}"
        total = sum(self.eager_ops.values())
        if not total:
            return f"irc: no op ran in eager ({self.irc_nodes} nodes in {self.islands} irc islands)"
        listed = ", ".join(
            f"{name} x{count} ({self.reasons.get(name, '?')})"
            for name, count in sorted(self.eager_ops.items())
        )
        return f"irc: {total} op{'s' if total != 1 else ''} ran in eager: {listed}"

    def merge(self, other: EagerReport) -> None:
        self.eager_ops.update(other.eager_ops)
        for k, v in other.reasons.items():
            self.reasons.setdefault(k, v)
        self.islands += other.islands
        self.irc_nodes += other.irc_nodes
        self.kernels += other.kernels
        if other.fallback and not self.fallback:
            self.fallback = other.fallback

    def __str__(self) -> str:
        return self.line()


class _IrcSupport(OperatorSupportBase):
    def __init__(self, support: Support):
        self.support = support

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return node.op == "call_function" and self.support.why_not(node) is None


class Island(torch.nn.Module):
    """One irc-compiled island, called where its nodes were (inputs made contiguous)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        tuple_out: bool,
        name: str,
        kernels: int,
        device: str,
        contiguous: tuple[bool, ...] = (),
    ):
        super().__init__()
        self.fn = fn
        self.tuple_out = tuple_out
        self.contiguous = contiguous
        """Per output, whether eager's is contiguous: irc may return a permuted view
        where eager's op (a softmax of a transposed tensor) returns a contiguous
        tensor, which callers may `.view()`."""
        self.island_name = name
        self.kernels = kernels
        self.device = torch.device(device)

    def _argument(self, a: Any) -> Any:
        """A tensor as the island's kernels read it: contiguous, and a 0-dim CPU tensor
        on the island's device (eager takes one beside CUDA tensors as a scalar:
        `x[:, 0] = 0.5` exports as a CPU constant)."""
        if not isinstance(a, torch.Tensor):
            return a
        if a.dim() == 0 and a.device.type != self.device.type:
            a = a.to(self.device)
        return a.contiguous()

    def forward(self, *args: Any) -> Any:
        out = self.fn(*(self._argument(a) for a in args))
        if not self.tuple_out:
            return self._laid_out(out, 0)
        outs = out if isinstance(out, tuple | list) else (out,)
        return tuple(self._laid_out(o, i) for i, o in enumerate(outs))

    def _laid_out(self, out: Any, i: int) -> Any:
        """Output `i` contiguous where eager's is (`contiguous`)."""
        if i < len(self.contiguous) and self.contiguous[i] and isinstance(out, torch.Tensor):
            return out.contiguous()  # itself where it already is
        return out


def _eager_contiguous(node: Any) -> bool:
    """Whether the traced value of an island's output is a contiguous tensor."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_contiguous()


def symbolic_reason(gm: fx.GraphModule) -> str | None:
    """Why the graph is not static (irc compiles static shapes), or None."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
            return f"{node.name} is a symbolic {type(val).__name__} ({val})"
        if isinstance(val, torch.Tensor) and not is_static(val):
            return f"{node.name} has symbolic shape {list(val.shape)}"
    return None


def _drop_assertions(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in IGNORED and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


def partition_and_compile(
    gm: fx.GraphModule, compile_module: CompileModule, device: str, name: str = "island"
) -> tuple[fx.GraphModule, EagerReport]:
    """`gm` with its irc islands compiled: a GraphModule that runs as `gm` does."""
    gm.graph._codegen = fx.graph.CodeGen()  # flat arguments (export's is a pytree's)
    _drop_assertions(gm)
    support = Support()
    report = EagerReport()
    partitioner = CapabilityBasedPartitioner(
        gm, _IrcSupport(support), allows_single_node_partition=True
    )
    partitions = partitioner.propose_partitions()
    partitions = [p for p in partitions if _computes(p.nodes)]
    fused = partitioner.fuse_partitions(partitions, prefix="irc_island_")
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("irc_island_"):
            sub = fused.get_submodule(str(node.target))
            _fill_placeholder_meta(sub, node)
            module = import_graph(sub.graph, f"{name}_{report.islands}")
            out = next(n for n in sub.graph.nodes if n.op == "output")
            results = out.args[0] if isinstance(out.args[0], tuple | list) else [out.args[0]]
            contiguous = tuple(_eager_contiguous(r) for r in results)
            row_major = ROW_MAJOR_RESULTS.set(frozenset(i for i, c in enumerate(contiguous) if c))
            try:
                compiled = compile_module(module, device)
            finally:
                ROW_MAJOR_RESULTS.reset(row_major)
            fn = next(iter(compiled.functions.values()))
            island = Island(fn, isinstance(out.args[0], tuple | list), module.ops.first.sym_name.data,
                            compiled.kernel_count, device, contiguous)  # fmt: skip
            setattr(fused, str(node.target), island)
            report.islands += 1
            report.kernels += compiled.kernel_count
            report.irc_nodes += sum(
                1 for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
            )
        elif node.op == "call_function":
            if node.target is operator.getitem:  # Python indexing, not an op
                continue
            name_ = op_name(node)
            report.eager_ops[name_] += 1
            report.reasons.setdefault(name_, support.why_not(node) or "outside any island")
    fused.recompile()
    return fused, report


def _computes(nodes: Any) -> bool:
    """An island worth a kernel: not only getitems of eager values."""
    return any(n.target is not operator.getitem for n in nodes)


def _fill_placeholder_meta(sub: fx.GraphModule, call: fx.Node) -> None:
    """Gives the island's placeholders the example values of the call's arguments."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for p, a in zip(placeholders, call.args, strict=False):
        if fake_of(p) is None and isinstance(a, fx.Node) and "val" in a.meta:
            p.meta["val"] = a.meta["val"]


def log_report(report: EagerReport) -> None:
    """The report's one line: a warning when ops ran in eager, info otherwise."""
    if report.fallback or sum(report.eager_ops.values()):
        log.warning(report.line())
    else:
        log.info(report.line())
