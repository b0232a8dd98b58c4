"""`fuse`: groups graph ops into kernels, greedily by HBM bytes saved.

Every compute op starts as its own group. Candidate pairs are groups joined by
a value (vertical: producer and consumer) or reading the same tensor
(horizontal: siblings). A pair's score is the traffic it removes:

    saved = bytes(A) + bytes(B) - bytes(A | B)

where bytes(G) counts the tensors G reads from outside plus those it writes
for outside use (a value both consumed inside and returned stays an output:
multi-output fusion). The best legal pair is merged, scores are refreshed,
and so on until no pair saves anything. Legality (`kernel_schema`) asks
whether one loop nest can compute the group:

- pointwise: every value is computed at the index of one output shape;
- reduction: reductions share one input shape and reduced dims (their rows:
  `irc.dialects.graph.row_geometry`, which graph-to-loop lowers by), every other value
  lives on that full space or on its rows (reduction prologue and epilogue:
  softmax and layer norm are one kernel);
- contraction: one matmul, element-wise epilogue on its output, and a guarded
  prologue on its operands: loads only (a gather, a concat; views are free),
  used only by the matmul. Element-wise work on an operand, a cast included,
  stays with its producer, which materializes the operand: a GEMM stages
  operands from memory through shared memory and reads each once per output
  tile, and a computed operand would defeat the one and repeat the other.

Limits: at most `max_ops` compute ops a kernel, and work is never duplicated
in a way that multiplies expensive ops (a transcendental op computed on a
smaller tensor than the kernel's space is not pulled in). Views (transpose,
reshape, broadcast, slice) and constants are index maps and splats, never kernels:
they go with their consumers. The groups made and the candidates turned down
between them, with the reason, are recorded in a `FusionReport`, whose kernels
`resolve_reports` names as the emitted Triton does once the module is lowered.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr, TensorType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.dialects import graph
from irc.dialects.graph import row_geometry
from irc.ir.kernel_kind import NAME_PREFIX, GeometryMismatch, KernelKind, RowGeometry
from irc.ir.types import (
    ELEMENT_TYPES,
    F32,
    element_bytes,
    element_of,
    int_array,
    numel,
    shape_of,
)
from irc.passes.fuse_attention import (
    Blocked,
    attention_problem,
    attention_seeds,
    match_attention,
)
from irc.passes.kernel_names import lowered_copy
from irc.passes.options import check_option
from irc.syntax.diagnostics import Diagnostic, IrcError

VIEW_OPS = graph.VIEW_OPS
GENERATOR_OPS = graph.GENERATOR_OPS
"""Ops of no operand that every reader computes itself (a splat, an index)."""
FREE_OPS = (*VIEW_OPS, *GENERATOR_OPS)
CHEAP_OPS = tuple(
    op for op in graph.Graph.operations if getattr(op, "COST", None) is graph.Cost.CHEAP
)
"""Ops cheap enough to recompute per element when broadcast into a larger space
(their COST; views and constants are free)."""

REINDEXING_OPS = graph.REINDEXING_OPS
"""Compute ops that read their operands at other indices than their own (rows and
contraction kernels compute a member only at its own row or tile)."""

MAX_TENSORS = 16
"""Tensors one kernel may read and write: the register-pressure estimate's limit."""

SIBLING_WINDOW = 4
"""Readers of one tensor on each side of an op that are tried as horizontal partners."""

def value_bytes(v: SSAValue) -> int:
    return numel(shape_of(v.type)) * element_bytes(element_of(v.type))


def op_short_name(op: Operation) -> str:
    """The op's word in kernel names: its `SHORT_NAME` fact."""
    if isinstance(op, graph.GraphOp):
        return op.short_name()
    return op.name.removeprefix("graph.")


# --- the fusion graph -------------------------------------------------------------


class FusionGraph:
    """Compute ops of one function, with views and constants seen through.

    The answers are memoized: the function does not change while fusion
    searches (only `materialize` rewrites it, at the end), and the search asks
    the same questions many times.
    """

    def __init__(self, fn: func.FuncOp | Block):
        """`fn`: a function, or the region of a graph.fused (whose graph.yield is its
        return) when a group written by hand is judged as the fusion's would be."""
        self.block = fn.body.block if isinstance(fn, func.FuncOp) else fn
        ops = list(self.block.ops)
        self.order = {op: i for i, op in enumerate(ops)}
        self.compute = [op for op in ops if is_compute(op)]
        self.is_compute_op = set(self.compute)
        self.returned: set[SSAValue] = set()
        for op in ops:
            if isinstance(op, func.ReturnOp | graph.YieldOp):
                self.returned.update(op.operands)
        self._sources: dict[SSAValue, list[SSAValue]] = {}
        self._inputs: dict[Operation, list[SSAValue]] = {}
        self._consumers: dict[SSAValue, list[Operation]] = {}
        self._escapes: dict[SSAValue, bool] = {}
        self._bytes: dict[SSAValue, int] = {}
        self._neighbors: dict[Operation, list[Operation]] = {}
        self._reader_at: dict[SSAValue, dict[Operation, int]] = {}
        self.labels: dict[Operation, str] = {}

    def sources(self, v: SSAValue) -> list[SSAValue]:
        """The tensors `v` really reads: views and constants are followed through."""
        found = self._sources.get(v)
        if found is None:
            owner = v.owner
            if isinstance(owner, VIEW_OPS):
                found = self.sources(owner.operands[0])
            elif isinstance(owner, GENERATOR_OPS):
                found = []
            else:
                found = [v]
            self._sources[v] = found
        return found

    def inputs(self, op: Operation) -> list[SSAValue]:
        found = self._inputs.get(op)
        if found is None:
            found = []
            for o in op.operands:
                for s in self.sources(o):
                    if s not in found:
                        found.append(s)
            self._inputs[op] = found
        return found

    def consumers(self, v: SSAValue) -> list[Operation]:
        """Compute ops reading `v`, directly or through views, in program order."""
        found = self._consumers.get(v)
        if found is None:
            readers: set[Operation] = set()
            for use in v.uses:
                user = use.operation
                if isinstance(user, VIEW_OPS):
                    readers.update(self.consumers(user.results[0]))
                elif user in self.is_compute_op:
                    readers.add(user)
            found = sorted(readers, key=self.order.__getitem__)
            self._consumers[v] = found
        return found

    def escapes(self, v: SSAValue) -> bool:
        """Returned, directly or through a view."""
        found = self._escapes.get(v)
        if found is None:
            found = v in self.returned or any(
                isinstance(u.operation, VIEW_OPS) and self.escapes(u.operation.results[0])
                for u in v.uses
            )
            self._escapes[v] = found
        return found

    def bytes(self, v: SSAValue) -> int:
        found = self._bytes.get(v)
        if found is None:
            found = self._bytes[v] = value_bytes(v)
        return found

    def neighbors(self, op: Operation) -> list[Operation]:
        """Compute ops that may fuse with `op`: its producers, its consumers, and
        readers of its inputs (siblings). Of the readers of a widely shared input
        only the nearest `SIBLING_WINDOW` on each side in program order are kept:
        that keeps the search linear when one tensor feeds thousands of ops."""
        found = self._neighbors.get(op)
        if found is None:
            near: dict[Operation, None] = {}
            for v in self.inputs(op):
                owner = v.owner
                if owner in self.is_compute_op:
                    near[owner] = None  # type: ignore[index]
                readers = self.consumers(v)
                if len(readers) <= 2 * SIBLING_WINDOW:
                    near.update(dict.fromkeys(readers))
                else:
                    at_of = self._reader_at.get(v)
                    if at_of is None:
                        at_of = self._reader_at[v] = {c: i for i, c in enumerate(readers)}
                    at = at_of[op]
                    window = readers[max(0, at - SIBLING_WINDOW) : at + SIBLING_WINDOW + 1]
                    near.update(dict.fromkeys(window))
            for r in op.results:
                near.update(dict.fromkeys(self.consumers(r)))
            near.pop(op, None)
            found = self._neighbors[op] = list(near)
        return found


def is_compute(op: Operation) -> bool:
    return (
        isinstance(op, graph.GraphOp)
        and not isinstance(op, FREE_OPS)
        and not isinstance(op, graph.COMPOSITE_OPS)
    )


# --- groups and their cost ---------------------------------------------------------


@dataclass
class Group:
    ops: list[Operation]
    id: int
    reads: set[SSAValue] = field(default_factory=set[SSAValue])
    """Tensors the group reads from outside."""
    writes: set[SSAValue] = field(default_factory=set[SSAValue])
    """Values the group makes for use outside (or returns)."""
    out_ops: set[Operation] = field(default_factory=set[Operation])
    """Compute ops outside the group that read its values."""
    in_ops: set[Operation] = field(default_factory=set[Operation])
    """Compute ops outside the group whose values it reads."""

    def __hash__(self) -> int:
        return self.id


def group_io(g: FusionGraph, ops: Sequence[Operation]) -> tuple[list[SSAValue], list[SSAValue]]:
    """External tensors a set of ops reads, and the values it must write."""
    members = set(ops)
    reads: list[SSAValue] = []
    writes: list[SSAValue] = []
    for op in ops:
        for v in g.inputs(op):
            if (not isinstance(v.owner, Operation) or v.owner not in members) and v not in reads:
                reads.append(v)
        for r in op.results:
            if g.escapes(r) or any(c not in members for c in g.consumers(r)):
                writes.append(r)
    return reads, writes


def group_bytes(g: FusionGraph, ops: Sequence[Operation]) -> int:
    reads, writes = group_io(g, ops)
    return sum(g.bytes(v) for v in reads) + sum(g.bytes(v) for v in writes)


# --- legality --------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """How one loop nest computes a group (see the module docstring): its kind and,
    for a reduction, the rows it was judged on (written on graph.fused, lowered by)."""

    kind: KernelKind
    geometry: RowGeometry | None = None


class Rejected(Exception):
    """A group that no single loop nest computes; the message says why."""


def kernel_schema(
    g: FusionGraph,
    ops: Sequence[Operation],
    max_ops: int | None,
    io: tuple[Iterable[SSAValue], Iterable[SSAValue]] | None = None,
    *,
    costs: bool = True,
) -> Schema:
    """How one loop nest computes `ops`, or `Rejected` with the reason.

    `io` is the group's (reads, writes) when the caller already knows them.
    With `costs` false only whether one loop nest computes the group at all is
    asked, not whether it pays (`max_ops`, the register-pressure estimate,
    recomputed expensive ops): the verifier judges a graph.fused written by
    hand so.
    """
    if max_ops is not None and len(ops) > max_ops:
        raise Rejected(f"more than {max_ops} ops in one kernel")
    members = set(ops)
    matmuls = [op for op in ops if isinstance(op, graph.MatmulOp)]
    reductions = [op for op in ops if isinstance(op, graph.ReduceOp)]
    reads, writes = (list(io[0]), list(io[1])) if io is not None else group_io(g, ops)
    if costs and len(reads) + len(writes) > MAX_TENSORS:
        # Each tensor a kernel streams is at least one live block per thread
        # (16 registers a block for an 8192-wide row on 16 warps): past this
        # many, register spills cost more than the traffic fusion saves.
        raise Rejected(
            f"{len(reads) + len(writes)} tensors in and out: estimated register pressure "
            f"over the limit of {MAX_TENSORS}"
        )
    if len(matmuls) > 1:
        # Only an attention (two contractions joined by a row softmax) fuses two.
        problem = attention_problem(ops)
        if problem is not None:
            raise Rejected(problem)
        return Schema(KernelKind.ATTENTION)
    if matmuls and reductions:
        raise Rejected("a matmul and a reduction in one kernel")
    if reductions and not matmuls:  # contractions check their epilogue themselves
        _check_no_reindexing(g, ops, members)
    if matmuls:
        return _contraction_schema(g, ops, matmuls[0], writes, costs)
    if reductions:
        return _rows_schema(g, ops, reductions, members, writes, costs)
    out_shapes = {shape_of(v.type) for v in writes}
    if len(out_shapes) > 1:
        raise Rejected("outputs of different shapes: " + ", ".join(map(str, sorted(out_shapes))))
    space = numel(next(iter(out_shapes))) if out_shapes else 0
    if costs:
        _check_recompute(ops, space)
    return Schema(KernelKind.POINTWISE)


def _check_no_reindexing(g: FusionGraph, ops: Sequence[Operation], members: set[Operation]) -> None:
    """Rows and contraction kernels compute each value where its row (or tile) is:
    a transpose or reshape between two of their ops would read another row.
    (Broadcasts stretch size-1 dims as element-wise ops do: they are fine.)"""
    for op in ops:
        if isinstance(op, REINDEXING_OPS):
            for operand in op.operands:
                if any(v.owner in members for v in g.sources(operand)):
                    raise Rejected(
                        f"{op.name} reads another op of a kernel that works row by row "
                        "at other indices"
                    )
        for operand in op.operands:
            view = operand.owner
            reindexes = False
            while isinstance(view, VIEW_OPS):
                source = view.operands[0]
                if isinstance(view, graph.ReshapeOp):
                    reindexes |= shape_of(source.type) != shape_of(view.results[0].type)
                elif isinstance(view, graph.TransposeOp):
                    reindexes |= view.permutation() != list(range(len(shape_of(source.type))))
                elif isinstance(view, graph.SliceOp):
                    reindexes |= shape_of(source.type) != shape_of(view.results[0].type)
                view = source.owner
            if reindexes and isinstance(view, Operation) and view in members:
                raise Rejected(
                    "a transpose, reshape or slice between two ops of a kernel that works "
                    "row by row"
                )


def _check_recompute(ops: Iterable[Operation], space: int) -> None:
    for op in ops:
        n = numel(shape_of(op.results[0].type))
        if n < space and not isinstance(op, CHEAP_OPS):
            raise Rejected(
                f"{op.name} on {n} elements would be recomputed for each of {space} (expensive)"
            )


def _rows_schema(
    g: FusionGraph,
    ops: Sequence[Operation],
    reductions: list[Operation],
    members: set[Operation],
    writes: list[SSAValue],
    costs: bool = True,
) -> Schema:
    try:
        geometry = row_geometry(reductions)
    except GeometryMismatch as e:
        raise Rejected(str(e)) from None
    full, row_keep, row = geometry.space, geometry.row_keep, geometry.row
    for op in ops:
        shape = shape_of(op.results[0].type)
        if shape in (full, row_keep, row):
            continue
        from irc.ir.types import broadcast_shapes

        if broadcast_shapes(shape, full) != full:
            raise Rejected(f"{op.name} of shape {list(shape)} is outside the rows of {list(full)}")
        if costs and not isinstance(op, CHEAP_OPS):
            raise Rejected(f"{op.name} of shape {list(shape)} would be recomputed per element")
    strays = [v for v in writes if shape_of(v.type) not in (full, row_keep, row)]
    if strays:
        v = min(strays, key=lambda v: g.order[v.owner])  # type: ignore[index]
        raise Rejected(
            f"an output of shape {list(shape_of(v.type))} is neither a row nor an element "
            f"of {list(full)}"
        )
    for r in reductions:
        assert isinstance(r, graph.ReduceOp)
        if r.keeps_dims() or not row:
            continue
        for c in g.consumers(r.result):
            if c in members and shape_of(c.results[0].type) != row:
                raise Rejected("a reduction without keepdim feeds the full space")
    if row and len(row) < len(full):
        # The same through element-wise ops: abs(sum(x, dims=[2])) times x broadcasts
        # the row value along the trailing dims, not along its rows.
        derived: set[Operation] = set(reductions)
        for op in ops:
            if op not in derived and any(v.owner in derived for v in g.inputs(op)):
                derived.add(op)
        for op in ops:
            if shape_of(op.results[0].type) == row:
                continue
            for v in g.inputs(op):
                if v.owner in derived and shape_of(v.type) == row:
                    raise Rejected(
                        f"{op.name} broadcasts a row value without keepdim into the full space"
                    )
    return Schema(KernelKind.REDUCTION, geometry)


def _contraction_schema(
    g: FusionGraph,
    ops: Sequence[Operation],
    mm: Operation,
    writes: list[SSAValue],
    costs: bool = True,
) -> Schema:
    out = shape_of(mm.results[0].type)
    members = set(ops)
    epilogue = _downstream(g, mm, members)
    for op in ops:
        if op is mm:
            continue
        shape = shape_of(op.results[0].type)
        if op in epilogue:
            if shape != out:
                raise Rejected(
                    f"epilogue {op.name} of shape {list(shape)} differs from the matmul's"
                )
            if not isinstance(op, (graph.ElementwiseOp, *VIEW_OPS)):
                raise Rejected(
                    f"epilogue {op.name} is not element-wise: it reads the matmul's tile at "
                    "other elements than the one it writes (the accumulator cannot be re-indexed)"
                )
            moved = _moving_view(op, epilogue | {mm})
            if moved is not None:
                raise Rejected(
                    f"epilogue {op.name} reads the matmul's tile through a {moved.name} "
                    "(the accumulator cannot be re-indexed)"
                )
            continue
        # Prologue: loads only (a gather, a concat), feeding only the matmul. Other
        # uses of its values recompute or store them: correct, but not worth it.
        if not costs:
            continue
        if isinstance(op, graph.ElementwiseOp):
            raise Rejected(
                f"prologue {op.name} computes a matmul operand: a GEMM streams its operands "
                "from memory into shared memory (asynchronous copies) and reads each once per "
                "output tile; a computed operand goes through registers and is recomputed per "
                "tile, so its producer materializes it instead"
            )
        if not isinstance(op, CHEAP_OPS):
            raise Rejected(f"prologue {op.name} is not cheap enough to recompute per tile")
        for r in op.results:
            if r in writes:
                raise Rejected(f"prologue {op.name} result is needed outside the kernel")
            for c in g.consumers(r):
                if c not in members or c in epilogue:
                    raise Rejected(f"prologue {op.name} also feeds other ops")
    for v in writes:
        if shape_of(v.type) != out:
            raise Rejected("an output of the contraction kernel is not of the matmul's shape")
    return Schema(KernelKind.CONTRACTION)


def _moving_view(op: Operation, producers: set[Operation]) -> Operation | None:
    """A view that moves elements between `op` and a value it reads from `producers`."""
    for o in op.operands:
        v, moved = o, None
        while isinstance(v.owner, VIEW_OPS):
            view = v.owner
            if moved is None and not _is_identity_view(view):
                moved = view
            v = view.operands[0]
        if moved is not None and v.owner in producers:
            return moved
    return None


def _is_identity_view(view: Operation) -> bool:
    src, dst = shape_of(view.operands[0].type), shape_of(view.results[0].type)
    if src != dst:
        return False
    if isinstance(view, graph.TransposeOp):
        return view.permutation() == list(range(len(src)))
    return True


def _downstream(g: FusionGraph, root: Operation, members: set[Operation]) -> set[Operation]:
    seen: set[Operation] = set()
    stack = [root]
    while stack:
        op = stack.pop()
        for r in op.results:
            for c in g.consumers(r):
                if c in members and c not in seen:
                    seen.add(c)
                    stack.append(c)
    return seen


# --- the report ----------------------------------------------------------------


@dataclass
class GroupRecord:
    """One fusion group. `kernel` is its graph.fused name until `resolve_reports`
    names it as the emitted Triton does; `kernels` are then all the Triton kernels
    it launches, in order (two when split-reduction splits it)."""

    kernel: str
    kind: str
    ops: list[str]
    bytes_before: int
    bytes_after: int
    kernels: list[str] = field(default_factory=list[str])


@dataclass
class Rejection:
    """Two final groups that were not merged, and why (the last attempt's reason)."""

    first_kernel: str
    second_kernel: str
    first: list[str]
    second: list[str]
    saved: int
    reason: str


@dataclass
class OtherKernel:
    """A kernel the module launches that no fusion group made (a copy graph-to-loop adds)."""

    kernel: str
    why: str


@dataclass
class Recompute:
    """A value one kernel would write for another to read, computed again in the
    reader from what it is made of instead (`done`), or why not."""

    value: str
    ops: list[str]
    producer_kernel: str
    consumer_kernel: str
    saved: int
    work: int
    """Element ops the reader computes again (a transcendental one counts
    TRANSCENDENTAL_WORK)."""
    done: bool
    reason: str


@dataclass
class FusionReport:
    """The kernels of one function and the candidates turned down between them.

    Only final decisions: a pair turned down while its groups were still growing,
    and later fused or superseded by a bigger group, is not listed. After
    `resolve_reports`, `launched` counts every kernel the function launches,
    the copies in `other` included.
    """

    function: str = ""
    groups: list[GroupRecord] = field(default_factory=list[GroupRecord])
    rejected: list[Rejection] = field(default_factory=list[Rejection])
    other: list[OtherKernel] = field(default_factory=list[OtherKernel])
    recomputed: list[Recompute] = field(default_factory=list[Recompute])
    unrolled: list[str] = field(default_factory=list[str])
    """Small reductions rewritten into element-wise ops before the search, and why."""
    not_unrolled: list[str] = field(default_factory=list[str])
    """Small reductions feeding another that stay reductions (their ops), and why."""
    nested: list[str] = field(default_factory=list[str])
    """Reductions over several dims split around a row reduction (`nest_reductions`)."""
    moved_transposes: list[str] = field(default_factory=list[str])
    """Returned transposes moved past element-wise ops to a view (`sink_transposes`)."""
    copies: dict[str, str] = field(default_factory=dict[str, str])
    """Copy kernels fuse adds (graph.fused name -> why): `copy_swapped_operands`."""
    launched: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "function": self.function,
            "kernels_launched": self.launched,
            "groups": [vars(gr) for gr in self.groups],
            "other_kernels": [vars(o) for o in self.other],
            "rejected": [vars(r) for r in self.rejected],
            "recomputed": [vars(r) for r in self.recomputed],
            "unrolled": list(self.unrolled),
            "not_unrolled": list(self.not_unrolled),
            "nested": list(self.nested),
            "moved_transposes": list(self.moved_transposes),
        }

    def text(self) -> str:
        count = ""
        if self.launched is not None:
            count = f" {self.launched} kernel{'' if self.launched == 1 else 's'} launched"
        lines = [f"fusion report for @{self.function}:{count}"]
        for gr in self.groups:
            saved = gr.bytes_before - gr.bytes_after
            names, how = gr.kernel, gr.kind
            if len(gr.kernels) > 1:  # split-k splits contractions, split-reduction the rest
                splitter = "split-k" if gr.kind == "contraction" else "split-reduction"
                if any(k.endswith("_tail") for k in gr.kernels):  # tile.tail_split
                    splitter = "tile: its last round of tiles in chunks of K"
                names, how = " + ".join(gr.kernels), f"{gr.kind}, split by {splitter}"
            lines.append(
                f"  kernel {names} ({how}): {', '.join(gr.ops)}; "
                f"HBM bytes {_mb(gr.bytes_before)} unfused -> {_mb(gr.bytes_after)} fused "
                f"(saves {_mb(saved)})"
            )
        for o in self.other:
            lines.append(f"  kernel {o.kernel} (copy): {o.why}")
        for r in self.rejected:
            lines.append(
                f"  not fused: {r.first_kernel} [{', '.join(r.first)}] with "
                f"{r.second_kernel} [{', '.join(r.second)}] "
                f"(would save {_mb(r.saved)}): {r.reason}"
            )
        for note in self.unrolled:
            lines.append(f"  unrolled: {note}")
        for note in self.not_unrolled:
            lines.append(f"  not unrolled: {note}")
        for note in self.nested:
            lines.append(f"  nested: {note}")
        for note in self.moved_transposes:
            lines.append(f"  view: {note}")
        for c in self.recomputed:
            what = "recomputed" if c.done else "not recomputed"
            lines.append(
                f"  {what}: {c.value} [{', '.join(c.ops)}] of {c.producer_kernel} in "
                f"{c.consumer_kernel} (saves {_mb(c.saved)} for {c.work} element ops): {c.reason}"
            )
        return "\n".join(lines)


COPY_WHY = "graph-to-loop writes a returned view or constant into a buffer of its own"


def launched_kernels(lowered: ModuleOp) -> dict[str, list[tuple[str, str]]]:
    """Function name -> (graph.fused name it was made from, Python name) of each kernel
    it launches, in order, in `lowered`: a module brought down to tile kernels.

    loop-to-tile names a tile.kernel after its loop.kernel with
    `irc.ir.names.tile_kernel_name`, graph-to-loop a loop.kernel after its graph.fused
    op, and split-reduction adds `_split` to its first stage (`_combine` to a kernel
    combining partials once); the Python name is the
    emitted @triton.jit function's (what profilers show).
    """
    from irc.dialects import tile
    from irc.ir.names import loop_kernel_name
    from irc.lowering.tile_to_triton import kernel_identifiers

    kernels = tile.kernels(lowered)
    python_name = {k.kernel_name.data: n for k, n in kernel_identifiers(kernels).items()}
    out: dict[str, list[tuple[str, str]]] = {}
    for fn in lowered.body.ops:
        if isinstance(fn, func.FuncOp):
            names = [
                op.kernel.root_reference.data
                for op in fn.body.block.ops
                if isinstance(op, tile.LaunchOp)
            ]
            out[fn.sym_name.data] = [
                (_unsplit(loop_kernel_name(n)), python_name.get(n, n)) for n in names
            ]
    return out


def _why_other(origin: str) -> str:
    """Why a kernel made from no group is launched: a GEMM operand's copy (padded,
    K-major or TF32 parts), or graph-to-loop's copy of a returned view or constant."""
    from irc.passes import k_major_gemm_operands, pad_gemm_operands, split_tf32_gemm_operands

    for copies in (pad_gemm_operands, k_major_gemm_operands, split_tf32_gemm_operands):
        if origin.startswith(copies.KERNEL_PREFIX):
            return copies.WHY
    return COPY_WHY


def _unsplit(name: str) -> str:
    """The group a split-reduction stage (`NAME_split`, `NAME_split1`, `NAME_combine`...)
    or a split tail's kernel (`NAME_tail`, `NAME_fixup`: `tile.tail_split`) came from."""
    return re.sub(r"_(split|combine|tail|fixup)\d*$", "", name)


def resolve_reports(reports: Sequence[FusionReport], lowered: ModuleOp) -> None:
    """Names the reports' kernels as the emitted Triton does, from `lowered` (the
    fused module brought down to tile kernels, see `launched_kernels`); kernels made
    from no group are listed apart, and every launch is counted. A group that
    launches nothing (nothing reads it) is dropped with its rejections."""
    launches = launched_kernels(lowered)
    for report in reports:
        launched = launches.get(report.function, [])
        made: dict[str, list[str]] = {}
        for origin, name in launched:
            made.setdefault(origin, []).append(name)
        final: dict[str, str] = {}
        groups: list[GroupRecord] = []
        for gr in report.groups:
            names = made.pop(gr.kernel, [])
            if not names:
                continue
            main = names[-1]  # split-reduction's final stage keeps the group's name
            final[gr.kernel] = main
            groups.append(dataclasses.replace(gr, kernel=main, kernels=names))
        report.groups = groups
        report.rejected = [
            dataclasses.replace(
                r, first_kernel=final[r.first_kernel], second_kernel=final[r.second_kernel]
            )
            for r in report.rejected
            if r.first_kernel in final and r.second_kernel in final
        ]
        report.recomputed = [
            dataclasses.replace(
                c, producer_kernel=final[c.producer_kernel], consumer_kernel=final[c.consumer_kernel]
            )
            for c in report.recomputed
            if c.producer_kernel in final and c.consumer_kernel in final
        ]
        report.other = [
            OtherKernel(n, report.copies.get(origin, _why_other(origin)))
            for origin, names in made.items()
            for n in names
        ]
        report.launched = len(launched)


_REPORT_SINK: ContextVar[list[FusionReport] | None] = ContextVar("irc_fusion_reports", default=None)


@contextmanager
def collecting_reports() -> Iterator[list[FusionReport]]:
    """Inside the block the fuse pass hands its reports to the list instead of
    printing them: irc-opt names their kernels once the run has lowered the module."""
    reports: list[FusionReport] = []
    token = _REPORT_SINK.set(reports)
    try:
        yield reports
    finally:
        _REPORT_SINK.reset(token)


def _mb(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def _op_label(g: FusionGraph, op: Operation) -> str:
    label = g.labels.get(op)
    if label is None:
        from irc.ir.value_names import written_name

        name = written_name(op.results[0]) if op.results else None
        tag = f"%{name}" if name else f"#{g.order[op]}"
        label = g.labels[op] = f"{op.name.removeprefix('graph.')} {tag}"
    return label


# --- the greedy search ---------------------------------------------------------------

MAX_OPS = 64
"""Ops one kernel takes at most by default (`fuse{max-ops=...}`): past that, the
kernel's live values would spill registers."""


def fuse_function(
    fn: func.FuncOp,
    counter: list[int],
    max_ops: int = MAX_OPS,
    recompute_rounds: int = 1,
    labels: dict[Operation, str] | None = None,
) -> FusionReport:
    """Fuses one graph function in place; returns what was decided and why.

    After the search, cheap producers that one kernel writes for others to read
    are copied into their readers where that saves traffic (`recompute_plans`),
    and the search runs again on the graph with the copies (`recompute_rounds`
    times at most); `labels` names such copies in the report."""
    # Views and constants nobody reads go: a dead view of a group's value would
    # otherwise make that value an output the group's schema never saw.
    for op in reversed(list(fn.body.block.ops)):
        if isinstance(op, FREE_OPS) and not op.results[0].uses:
            op.detach()
            op.erase()
    g = FusionGraph(fn)
    g.labels.update(labels or {})
    report = FusionReport(function=fn.sym_name.data)
    group_of: dict[Operation, Group] = {}
    for i, op in enumerate(g.compute):
        group_of[op] = Group([op], i)
    next_id = len(g.compute)
    cost: dict[int, int] = {gr.id: group_bytes(g, gr.ops) for gr in group_of.values()}
    single_cost = {gr.ops[0]: cost[gr.id] for gr in group_of.values()}
    # Attention starts as one group (passes/fuse_attention.py): pairwise merges would
    # pass through groups no kernel computes (a matmul and a softmax without the other).
    seeded: list[Group] = []
    for pattern in attention_seeds(g.compute):
        members = [op for op in pattern.core if op in group_of]
        try:
            kernel_schema(g, members, max_ops)
        except Rejected:
            continue  # left to the pairwise search, which records why
        seed = Group(members, next_id)
        next_id += 1
        for op in members:
            del cost[group_of[op].id]
            group_of[op] = seed
        cost[seed.id] = group_bytes(g, members)
        seeded.append(seed)
    rejected_pairs: set[tuple[int, int]] = set()
    rejections: list[tuple[Group, Group, Rejection]] = []

    def candidates(gr: Group) -> set[Group]:
        """Groups connected to `gr` by a value, or reading one of its inputs
        (`FusionGraph.neighbors` of its ops)."""
        out = {group_of[c] for op in gr.ops for c in g.neighbors(op)}
        out.discard(gr)
        return out

    def merged_io(a: Group, b: Group) -> tuple[set[SSAValue], set[SSAValue]]:
        """The traffic of a and b as one group, from theirs: no walk over their ops."""

        def inside(op: object) -> bool:
            owner = group_of.get(op) if isinstance(op, Operation) else None
            return owner is a or owner is b

        reads = {v for v in a.reads | b.reads if not inside(v.owner)}
        writes = {
            v
            for v in a.writes | b.writes
            if g.escapes(v) or any(not inside(c) for c in g.consumers(v))
        }
        return reads, writes

    def traffic(reads: set[SSAValue], writes: set[SSAValue]) -> int:
        return sum(g.bytes(v) for v in reads) + sum(g.bytes(v) for v in writes)

    for gr in group_of.values():
        reads, writes = group_io(g, gr.ops)
        gr.reads, gr.writes = set(reads), set(writes)

    def internal(v: SSAValue, a: Group, b: Group) -> bool:
        """Whether `v`, written by one of a and b, is read by nothing else."""
        if g.escapes(v):
            return False
        for c in g.consumers(v):
            owner = group_of[c]
            if owner is not a and owner is not b:
                return False
        return True

    def score(a: Group, b: Group) -> int:
        """Bytes saved by merging a and b: cost(a) + cost(b) - cost(a | b), counted
        from what changes: a value one makes and the other reads is no longer read
        (and no longer written if nothing else reads it); a tensor both read is
        read once. No other value changes sides."""
        saved = 0
        b_reads = b.reads
        for v in a.reads:
            if group_of.get(v.owner) is b:  # type: ignore[call-overload]
                saved += g.bytes(v) * (2 if internal(v, a, b) else 1)
            elif v in b_reads:
                saved += g.bytes(v)
        for v in b_reads:
            if group_of.get(v.owner) is a:  # type: ignore[call-overload]
                saved += g.bytes(v) * (2 if internal(v, a, b) else 1)
        return saved

    # A topological order of the groups, kept as labels that compare like the
    # order: every path between groups goes from a lower label to a higher one,
    # so a merge's cycle check only searches between the two groups' labels.
    # Labels are tuples so that groups can be moved right after (or before) any
    # other without renumbering the rest: (7,) < (7, -2, 1) < (7, -1, 1) < (8,).
    # A seeded group takes its last op's place: what it reads comes before that.
    pos: dict[int, tuple[int, ...]] = {
        gr.id: (g.order[gr.ops[-1]],) for gr in group_of.values()
    }
    stamp = 0

    for gr in group_of.values():
        inside = set(gr.ops)
        gr.out_ops = {c for op in gr.ops for r in op.results for c in g.consumers(r)} - inside
        gr.in_ops = {
            v.owner
            for op in gr.ops
            for v in g.inputs(op)
            if isinstance(v.owner, Operation) and v.owner in group_of
        } - inside

    def successors(gr: Group) -> set[Group]:
        return {group_of[c] for c in gr.out_ops}

    def predecessors(gr: Group) -> set[Group]:
        return {group_of[p] for p in gr.in_ops}

    def separate(lo: Group, hi: Group) -> tuple[bool, list[Group]] | None:
        """None if a path from `lo` to `hi` goes through another group (merging them
        would make a cycle). Else the groups to move so that the merged group has a
        place in the order: (True, what `lo` reaches below `hi`), to go right after
        `hi`, or (False, what reaches `hi` above `lo`), to go right before `lo`.

        Both searches run in turns and the first to finish answers, so a merge
        costs the smaller of the two sets, not the whole window between the two
        groups (which is most of the graph for a long edge).
        """
        lo_at, hi_at = pos[lo.id], pos[hi.id]
        down: set[Group] = set()
        up: set[Group] = set()
        # A direct edge between the two groups is the fusion itself, not a cycle.
        down_stack = [x for x in successors(lo) if x is not hi]
        up_stack = [x for x in predecessors(hi) if x is not lo]
        while True:
            while down_stack:
                x = down_stack.pop()
                if x in down:
                    continue
                if x is hi or x in up:
                    return None
                if pos[x.id] < hi_at:
                    down.add(x)
                    down_stack += successors(x)
                    break
            else:
                return True, sorted(down, key=lambda x: pos[x.id])
            while up_stack:
                x = up_stack.pop()
                if x in up:
                    continue
                if x is lo or x in down:
                    return None
                if pos[x.id] > lo_at:
                    up.add(x)
                    up_stack += predecessors(x)
                    break
            else:
                return False, sorted(up, key=lambda x: pos[x.id])

    def place(new: Group, lo: Group, hi: Group, after_hi: bool, moved: list[Group]) -> None:
        """Labels the merged group and the groups `separate` found in order."""
        nonlocal stamp
        stamp += 1
        if after_hi:
            # What `lo` reaches follows the merged group, which takes `hi`'s label.
            pos[new.id] = pos[hi.id]
            sequence = moved
            base = pos[hi.id] + (-stamp,)
        else:
            # What reaches `hi` goes, in order, where `lo` was; the merged group after it.
            sequence = [*moved, new]
            base = pos[lo.id] + (-stamp,)
            if not moved:
                pos[new.id] = pos[lo.id]
                sequence = []
        for k, x in enumerate(sequence, 1):
            pos[x.id] = (*base, k)
        del pos[lo.id], pos[hi.id]
        if len(base) > 32:
            # Labels grow by two entries a move: number the groups afresh now and then.
            live = sorted(pos, key=pos.__getitem__)
            pos.update((gid, (i,)) for i, gid in enumerate(live))

    heap: list[tuple[int, int, int, Group, Group]] = []

    def push(a: Group, b: Group) -> None:
        if a.id > b.id:
            a, b = b, a
        s = score(a, b)
        if s > 0:
            heapq.heappush(heap, (-s, a.id, b.id, a, b))

    for gr in list(group_of.values()):
        for other in candidates(gr):
            if gr.id < other.id:
                push(gr, other)

    while heap:
        neg, _, _, a, b = heapq.heappop(heap)
        if group_of.get(a.ops[0]) is not a or group_of.get(b.ops[0]) is not b:
            continue  # stale: one side was merged since
        merged_ops = sorted(a.ops + b.ops, key=g.order.__getitem__)
        lo, hi = (a, b) if pos[a.id] < pos[b.id] else (b, a)
        try:
            merged_reads, merged_writes = merged_io(a, b)
            kernel_schema(g, merged_ops, max_ops, (merged_reads, merged_writes))
            found = separate(lo, hi)
            if found is None:
                raise Rejected("the merge would create a cycle through another kernel")
        except Rejected as e:
            key = (a.id, b.id)
            if key not in rejected_pairs:
                rejected_pairs.add(key)
                first = [_op_label(g, o) for o in a.ops]
                second = [_op_label(g, o) for o in b.ops]
                rejection = Rejection("", "", first, second, -neg, str(e))
                rejections.append((a, b, rejection))
            continue
        new = Group(merged_ops, next_id)
        next_id += 1
        new.reads, new.writes = merged_reads, merged_writes
        new.out_ops = {
            c for c in a.out_ops | b.out_ops if group_of[c] is not a and group_of[c] is not b
        }
        new.in_ops = {
            p for p in a.in_ops | b.in_ops if group_of[p] is not a and group_of[p] is not b
        }
        place(new, lo, hi, *found)
        for op in merged_ops:
            group_of[op] = new
        cost[new.id] = traffic(new.reads, new.writes)
        for other in candidates(new):
            push(new, other)

    groups = sorted(
        {id(gr): gr for gr in group_of.values()}.values(), key=lambda gr: g.order[gr.ops[0]]
    )
    plans, turned_down = recompute_plans(g, groups, group_of, max_ops)
    if plans and recompute_rounds > 0:
        copies: dict[Operation, str] = dict(g.labels)
        done = [apply_recompute(g, plan, copies) for plan in plans]
        report = fuse_function(fn, counter, max_ops, recompute_rounds - 1, copies)
        for plan, (root, clones) in zip(plans, done, strict=True):
            for consumer, clone in zip(plan.consumers, clones, strict=True):
                record = dataclasses.replace(
                    plan.records[consumer],
                    producer_kernel=_kernel_holding(root),
                    consumer_kernel=_kernel_holding(clone),
                )
                report.recomputed.append(record)
        return report
    name_of: dict[int, str] = {}
    blocked_attention = _blocked_attention(g, group_of)  # asked before the groups move
    for gr in groups:
        before = sum(single_cost[op] for op in gr.ops)
        schema = kernel_schema(g, gr.ops, len(gr.ops), (gr.reads, gr.writes))
        kind = schema.kind
        name = name_of[gr.id] = _kernel_name(gr.ops, kind, counter)
        report.groups.append(
            GroupRecord(name, kind, [_op_label(g, o) for o in gr.ops], before, cost[gr.id])
        )
        materialize(g, gr.ops, name, schema)
    for blocked in blocked_attention:
        blocked.first_kernel = name_of[blocked.first_kernel]  # type: ignore[index]
        blocked.second_kernel = name_of[blocked.second_kernel]  # type: ignore[index]
        report.rejected.append(blocked)
    # Only what was turned down between the final groups: a pair rejected while its
    # groups were still growing is either inside one kernel now or superseded by the
    # attempt between the groups they grew into.
    for a, b, rejection in rejections:
        if a.id in name_of and b.id in name_of:
            rejection.first_kernel, rejection.second_kernel = name_of[a.id], name_of[b.id]
            report.rejected.append(rejection)
    for p, c, record in turned_down:
        if p.id in name_of and c.id in name_of:
            record.producer_kernel, record.consumer_kernel = name_of[p.id], name_of[c.id]
            report.recomputed.append(record)
    _drop_unread_views(fn.body.block)
    copy_swapped_operands(fn.body.block, counter, report)
    _restore_order(fn.body.block)
    return report


def _blocked_attention(g: FusionGraph, group_of: dict[Operation, Group]) -> list[Rejection]:
    """Attentions the data flow makes but one kernel cannot (a score or probability
    read elsewhere): their two matmuls' groups (ids, named later), what fusing them
    would have saved, and why."""
    out: list[Rejection] = []
    for op in g.compute:
        if not isinstance(op, graph.MatmulOp):
            continue
        found = match_attention(op)
        if not isinstance(found, Blocked) or found.scores_mm is None:
            continue
        first, second = group_of[found.scores_mm], group_of[op]
        if first is second:
            continue
        groups = {id(group_of[o]): group_of[o] for o in found.ops if o in group_of}
        parts = [o for gr in groups.values() for o in gr.ops]
        saved = sum(group_bytes(g, gr.ops) for gr in groups.values()) - group_bytes(g, parts)
        first_ops = [_op_label(g, o) for o in first.ops]
        second_ops = [_op_label(g, o) for o in second.ops]
        out.append(
            Rejection(first.id, second.id, first_ops, second_ops, saved, str(found))  # type: ignore[arg-type]
        )
    return out


# --- recomputing cheap producers in their readers -------------------------------------

MAX_RECOMPUTED_OPS = 8
"""Element-wise ops one recomputation may copy into a reading kernel."""

WORK_PER_BYTE = 4
"""Element ops a recomputation may add for each HBM byte it saves. A GPU computes
far more than it moves (an H100 or H200 issues about 60 T f32 operations a second
against 3.3-4.8 TB/s of HBM: 12-18 an HBM byte); a quarter of that leaves room
for the kernel's own work."""

TRANSCENDENTAL_WORK = 8
"""What an exp, cos or division costs next to an add: the special-function units
run at a quarter of the ALUs' rate, and most such ops take a few instructions more."""


@dataclass
class RecomputePlan:
    """Copy `ops` (the cheap element-wise ops `value` is made of inside `producer`)
    into each of `consumers`, which then read the copy's inputs instead of `value`."""

    value: SSAValue
    ops: list[Operation]
    producer: Group
    consumers: list[Group]
    records: dict[Group, Recompute]


def _work(op: Operation) -> int:
    weight = 1 if isinstance(op, CHEAP_OPS) else TRANSCENDENTAL_WORK
    return numel(shape_of(op.results[0].type)) * weight


def producer_chain(
    g: FusionGraph, root: Operation, members: set[Operation]
) -> tuple[list[Operation], list[SSAValue]]:
    """The element-wise ops of a group that `root`'s value is made of (up to
    `MAX_RECOMPUTED_OPS`, stopping at reductions and matmuls), and the tensors
    they read from elsewhere: the group's inputs and its other values."""
    chain = [root]
    seen = {root}
    stack = [root]
    while stack:
        for v in g.inputs(stack.pop()):
            owner = v.owner
            if (
                isinstance(owner, graph.ElementwiseOp)
                and owner in members
                and owner not in seen
                and len(chain) < MAX_RECOMPUTED_OPS
            ):
                seen.add(owner)
                chain.append(owner)
                stack.append(owner)
    chain.sort(key=g.order.__getitem__)
    leaves: list[SSAValue] = []
    for op in chain:
        for v in g.inputs(op):
            if v.owner not in seen and v not in leaves:
                leaves.append(v)
    return chain, leaves


def _views_split_cleanly(g: FusionGraph, v: SSAValue, group_of: dict[Operation, Group]) -> bool:
    """Whether each view of `v` is read by one kernel only (`apply_recompute` moves
    a reader's views to the copy, and a view read by two kernels cannot go to both)."""
    for use in v.uses:
        user = use.operation
        if isinstance(user, VIEW_OPS):
            readers = {group_of[c] for c in g.consumers(user.results[0])}
            if len(readers) > 1 or g.escapes(user.results[0]):
                return False
    return True


def recompute_plans(
    g: FusionGraph,
    groups: Sequence[Group],
    group_of: dict[Operation, Group],
    max_ops: int | None,
) -> tuple[list[RecomputePlan], list[tuple[Group, Group, Recompute]]]:
    """Values a kernel writes only for other kernels to read, made of cheap
    element-wise ops: recomputed in each reader when that saves bytes and the
    extra work is within `WORK_PER_BYTE` of them (Inductor's test_partitioning_keops:
    cos(a * b) summed over both dims; layer norm's `x - mean` read by a second
    reduction). Returns the plans, and the candidates turned down with the reason."""
    plans: list[RecomputePlan] = []
    turned_down: list[tuple[Group, Group, Recompute]] = []
    for p in groups:
        members = set(p.ops)
        for v in sorted(p.writes, key=lambda v: g.order[v.owner]):  # type: ignore[index]
            root = v.owner
            if not isinstance(root, graph.ElementwiseOp) or not isinstance(root, Operation):
                continue
            readers = sorted(
                {group_of[c] for c in g.consumers(v)} - {p}, key=lambda r: g.order[r.ops[0]]
            )
            if not readers or not _views_split_cleanly(g, v, group_of):
                continue
            chain, leaves = producer_chain(g, root, members)
            work = sum(_work(op) for op in chain)
            labels = [_op_label(g, op) for op in chain]
            name = _op_label(g, root).split(" ", 1)[1]
            new_writes = [x for x in leaves if x.owner in members and x not in p.writes]
            extra_write = sum(g.bytes(x) for x in new_writes)
            chosen: list[Group] = []
            records: dict[Group, Recompute] = {}
            saved = 0
            for c in readers:
                fresh = sum(g.bytes(x) for x in leaves if x not in c.reads)
                gain = g.bytes(v) - fresh
                record = Recompute(name, labels, "", "", gain, work, False, "")
                try:
                    reads = (c.reads - {v}) | set(leaves)
                    ops = sorted([*c.ops, *chain], key=g.order.__getitem__)
                    kernel_schema(g, ops, max_ops, (reads, c.writes))
                except Rejected as e:
                    if gain > 0:
                        record.reason = f"the reader cannot compute it: {e}"
                        turned_down.append((p, c, record))
                    continue
                chosen.append(c)
                records[c] = record
                saved += gain
            if not chosen:
                continue
            unwritten = not g.escapes(v) and len(chosen) == len(readers)
            saved += (g.bytes(v) if unwritten else 0) - extra_write
            total_work = work * len(chosen)
            if saved <= 0:
                continue  # not a candidate: nothing to report
            reason = ""
            if total_work > WORK_PER_BYTE * saved:
                reason = f"over {WORK_PER_BYTE} element ops an HBM byte saved"
            elif new_writes:
                writes = (p.writes - {v} if unwritten else p.writes) | set(new_writes)
                try:
                    kernel_schema(g, p.ops, max_ops, (p.reads, writes))
                except Rejected as e:
                    reason = f"the producer cannot write its inputs: {e}"
            share = saved // len(chosen)
            for c in chosen:
                records[c].saved = share
                records[c].reason = reason or (
                    f"{total_work} element ops for {_mb(saved)} saved, within "
                    f"{WORK_PER_BYTE} an HBM byte"
                )
                records[c].done = not reason
                if reason:
                    turned_down.append((p, c, records[c]))
            if not reason:
                plans.append(RecomputePlan(v, chain, p, chosen, records))
    return plans, turned_down


def apply_recompute(
    g: FusionGraph, plan: RecomputePlan, labels: dict[Operation, str]
) -> tuple[Operation, list[Operation]]:
    """Copies the plan's ops once for each reading kernel, right after the original,
    and points that kernel's reads of the value (or of its views) at the copy.
    Returns the original op that made the value and the copies that make it now;
    `labels` gets each copy's report label."""
    root = plan.value.owner
    assert isinstance(root, Operation)
    clones: list[Operation] = []
    for consumer in plan.consumers:
        readers = set(consumer.ops)
        mapping: dict[SSAValue, SSAValue] = {}
        at = root
        for op in plan.ops:
            copy = op.clone(value_mapper=dict(mapping), clone_name_hints=False)
            g.block.insert_op_after(copy, at)
            labels[copy] = f"{_op_label(g, op)} (copy)"
            at = copy
            for old, new in zip(op.results, copy.results, strict=True):
                mapping[old] = new
        fresh = mapping[plan.value]
        for use in list(plan.value.uses):
            user = use.operation
            if user in readers or (
                isinstance(user, VIEW_OPS) and set(g.consumers(user.results[0])) <= readers
            ):
                user.operands = [fresh if o is plan.value else o for o in user.operands]
        clones.append(at)
    return root, clones


def _kernel_holding(op: Operation) -> str:
    """The graph.fused kernel `op` was materialized in."""
    parent = op.parent_op()
    if isinstance(parent, graph.FusedOp) and isinstance(parent.kernel, StringAttr):
        return parent.kernel.data
    return ""


def _drop_unread_views(block: Block) -> None:
    """Views and constants that nothing reads any more (their readers moved into kernels)."""
    for op in reversed(list(block.ops)):
        if isinstance(op, FREE_OPS) and not op.results[0].uses:
            block.erase_op(op)


def _restore_order(block: Block) -> None:
    """Sorts a block topologically, keeping the original order where it is free.

    Each graph.fused op is placed after its last member, which may come before
    the graph.fused op of another group that it reads.
    """
    ops = list(block.ops)
    index = {op: i for i, op in enumerate(ops)}
    users: dict[Operation, list[Operation]] = {op: [] for op in ops}
    waiting: dict[Operation, int] = {}
    for op in ops:
        deps = {o.owner for o in op.operands if isinstance(o.owner, Operation) and o.owner in index}
        waiting[op] = len(deps)
        for d in deps:
            users[d].append(op)
    ready = [index[op] for op in ops if waiting[op] == 0]
    heapq.heapify(ready)
    order: list[Operation] = []
    while ready:
        op = ops[heapq.heappop(ready)]
        order.append(op)
        for u in users[op]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, index[u])
    assert len(order) == len(ops), "fusion groups form a cycle"
    if order == ops:
        return
    for op in ops:
        op.detach()
    for op in order:
        block.add_op(op)


def _kernel_name(ops: Sequence[Operation], kind: KernelKind, counter: list[int]) -> str:
    prefix = NAME_PREFIX[kind]
    names: list[str] = []
    for op in ops:
        n = op_short_name(op)
        if n not in names:
            names.append(n)
    number = counter[0]
    counter[0] += 1
    fused = "fused_" if len(ops) > 1 else ""
    return f"{prefix}_{fused}{'_'.join(names[:8])}_{number}"


# --- operands an FMA dot reads across its rows ---------------------------------------

SWAPPED_OPERAND_WHY = (
    "a row-major copy of a transposed operand of an f64 matmul or an f32 attention: FMA "
    "dots read an operand across its rows 2.7-3.3x slower (on an H100, 96 causal f32 "
    "heads of 1024 keys: 1.24 ms, from a copy of K^T 0.46 ms); the copy moves the "
    "operand's bytes twice"
)


FMA_DOT_KINDS = (KernelKind.CONTRACTION, KernelKind.ATTENTION)


def copy_swapped_operands(block: Block, counter: list[int], report: FusionReport) -> None:
    """A transpose that swaps the matrix dims of an operand of a matmul computed in
    f32 or f64 (FMA units), in a GEMM or an attention kernel, reads a row-major copy
    made by a kernel of its own: a view is free for element-wise readers, not for an
    FMA dot. Where the views under the transpose keep the matrix dims (grouped-query
    attention's K: heads reshaped and broadcast), the copy is of the value under
    them, and the views are made again over it, so that the repeated heads are read
    in place, not written."""
    for op in list(block.ops):
        for v in _fma_matmul_operands(op):
            view = v.owner
            if not (isinstance(view, graph.TransposeOp) and _swaps_matrix_dims(view)):
                continue
            below = _views_keeping_matrix_dims(view.operands[0])
            if below is not None and below[1]:
                base, chain = below
                name = _kernel_name([view], KernelKind.POINTWISE, counter)
                swapped = _swapped_transpose(base)
                block.insert_op_before(swapped, view)
                copy = _copy_kernel(swapped, name)
                top = copy.results[0]
                for old in chain:
                    new = type(old).create(
                        operands=[top],
                        result_types=[_swap_last_two(old.results[0].type)],
                        properties=dict(old.properties),
                    )
                    new.location = old.location
                    block.insert_op_before(new, view)
                    top = new.results[0]
                view.results[0].replace_all_uses_with(top)
                block.erase_op(view)
                for old in reversed(chain):  # the repeat over the old K, now unread
                    if not old.results[0].uses:
                        block.erase_op(old)
            elif not _repeats_elements(view.operands[0]):
                name = _kernel_name([view], KernelKind.POINTWISE, counter)
                _copy_kernel(view, name)
            else:
                continue
            report.copies[name] = SWAPPED_OPERAND_WHY


def _views_keeping_matrix_dims(v: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """The value under `v`'s views and those views, bottom up, if each keeps the
    last two dims as they are (reshapes and broadcasts of the leading dims,
    transposes of them): a transpose of those two dims then commutes with them."""
    chain: list[Operation] = []
    while isinstance(v.owner, VIEW_OPS):
        op = v.owner
        src, dst = shape_of(op.operands[0].type), shape_of(op.results[0].type)
        if len(src) < 2 or len(dst) < 2 or src[-2:] != dst[-2:]:
            return None
        if isinstance(op, graph.SliceOp):
            return None
        if isinstance(op, graph.TransposeOp) and op.permutation()[-2:] != [len(src) - 2, len(src) - 1]:
            return None
        chain.append(op)
        v = op.operands[0]
    return v, chain[::-1]


def _swap_last_two(t: Attribute) -> TensorType[Attribute]:
    shape = list(shape_of(t))
    shape[-2], shape[-1] = shape[-1], shape[-2]
    return TensorType(element_of(t), shape)


def _swapped_transpose(v: SSAValue) -> graph.TransposeOp:
    """`v` with its last two dims swapped, as a graph.transpose."""
    rank = len(shape_of(v.type))
    perm = [*range(rank - 2), rank - 1, rank - 2]
    op = graph.TransposeOp.create(
        operands=[v], result_types=[_swap_last_two(v.type)], properties={"perm": int_array(perm)}
    )
    if isinstance(v.owner, Operation):
        op.location = v.owner.location
    return op


def _fma_matmul_operands(op: Operation, kind: KernelKind | None = None) -> list[SSAValue]:
    """The values `op` (a matmul in a `kind` kernel, or a contraction or attention
    kernel) multiplies on FMA units: f64 products, and an attention's f32 ones
    (a contraction kernel's f32 products are TF32 tensor-core products of split
    operands, `split-tf32`, which read a transposed operand as fast)."""
    if isinstance(op, graph.MatmulOp):
        element = element_of(op.results[0].type)
        on_fma = element == ELEMENT_TYPES["f64"] or (element == F32 and kind == KernelKind.ATTENTION)
        return list(op.operands) if on_fma else []
    if not isinstance(op, graph.FusedOp) or op.kernel_kind() not in FMA_DOT_KINDS:
        return []
    outer = dict(zip(op.body.block.args, op.operands, strict=True))
    return [
        outer[v]
        for inner in op.body.block.ops
        for v in _fma_matmul_operands(inner, op.kernel_kind())
        if v in outer
    ]


def _repeats_elements(v: SSAValue) -> bool:
    """Whether `v` is a view through a broadcast: a copy of it would write every
    repeat, which the kernel reads in place (where the views keep the matrix dims
    the copy is made under them instead: `_views_keeping_matrix_dims`)."""
    while isinstance(v.owner, VIEW_OPS):
        if isinstance(v.owner, graph.BroadcastOp):
            return True
        v = v.owner.operands[0]
    return False


def _swaps_matrix_dims(op: graph.TransposeOp) -> bool:
    """Whether the transpose moves another dim into the last (a matrix's rows and columns)."""
    perm = op.permutation()
    return len(perm) >= 2 and perm[-1] != len(perm) - 1


def _copy_kernel(view: graph.TransposeOp, name: str) -> graph.FusedOp:
    """Moves `view` into a graph.fused of its own: a kernel that writes it row-major."""
    source = view.operands[0]
    body = Block(arg_types=[source.type])
    fused = graph.FusedOp.create(
        operands=[source],
        result_types=[view.results[0].type],
        properties={"kernel": StringAttr(name), **graph.kind_properties(KernelKind.POINTWISE, None)},
        regions=[Region(body)],
    )
    fused.location = view.location
    parent = view.parent_block()
    assert parent is not None
    parent.insert_op_after(fused, view)
    view.results[0].replace_all_uses_with(fused.results[0])
    view.detach()
    body.add_op(view)
    view.operands = [body.args[0]]
    body.add_op(graph.YieldOp.create(operands=[view.results[0]]))
    return fused


# --- rewriting a group into graph.fused ---------------------------------------------


def materialize(
    g: FusionGraph, ops: Sequence[Operation], name: str, schema: Schema
) -> graph.FusedOp:
    """Moves a group's ops (and the views between them) into one graph.fused op,
    which records the kernel's kind and rows (`schema`) for the passes after."""
    members = set(ops)
    fn_block = g.block
    # Views of values made in the group (chains of them too) that the group reads go
    # in: moved when only the group reads them, else copied, so that the kernel never
    # reads a view of its own output from outside (a cycle). Constants read only
    # inside go in too.
    # Only the ops around the group are looked at (not the whole function),
    # so materializing every group stays linear in the function's size.
    rank: dict[Operation, float] = {op: float(g.order[op]) for op in members}
    made_inside: set[Operation] = set()
    frontier = [u.operation for op in members for r in op.results for u in r.uses]
    while frontier:
        op = frontier.pop()
        if isinstance(op, VIEW_OPS) and op not in made_inside and op in g.order:
            made_inside.add(op)
            rank[op] = float(g.order[op])
            frontier += [u.operation for u in op.results[0].uses]
    needed: set[Operation] = set()
    for op in sorted(made_inside, key=rank.__getitem__, reverse=True):
        if any(u.operation in members or u.operation in needed for u in op.results[0].uses):
            needed.add(op)
    # The needed views are copied into the group as a chain; the originals stay
    # for any reader outside, reading the group's real output (not a view of it,
    # whose shape the kernel's schema never saw). Originals left unread go later.
    copies: dict[SSAValue, SSAValue] = {}
    compute_members = list(members)
    for op in sorted(needed, key=rank.__getitem__):
        copy = op.clone(value_mapper=dict(copies), clone_name_hints=False)
        fn_block.insert_op_after(copy, op)
        copies[op.results[0]] = copy.results[0]
        members.add(copy)
        rank[copy] = rank[op] + 0.5
    for op in compute_members:
        op.operands = [copies.get(o, o) for o in op.operands]
    # An original that nothing reads now must go before the outputs are found: it
    # would still read the group's value and make it an output the schema never saw
    # (a contraction kernel then took that output's shape as its iteration space
    # and stored the matmul tile out of bounds).
    for op in sorted(needed, key=rank.__getitem__, reverse=True):
        if not op.results[0].uses:
            fn_block.erase_op(op)
    for op in list(members):
        for operand in op.operands:
            const = operand.owner
            if isinstance(const, GENERATOR_OPS) and const not in members and const in g.order:
                users = [u.operation for u in const.results[0].uses]
                if all(u in members for u in users):
                    members.add(const)
                    rank[const] = float(g.order[const])
    inner = sorted(members, key=rank.__getitem__)
    external: list[SSAValue] = []
    for op in inner:
        for o in op.operands:
            owner = o.owner
            if (not isinstance(owner, Operation) or owner not in members) and o not in external:
                external.append(o)
    outputs = [
        r for op in inner for r in op.results if any(u.operation not in members for u in r.uses)
    ]
    block = Block(arg_types=[v.type for v in external])
    for arg, v in zip(block.args, external, strict=True):
        if v.name_hint:
            arg._name = v.name_hint  # pyright: ignore[reportPrivateUsage]
    fused = graph.FusedOp.create(
        operands=external,
        result_types=[v.type for v in outputs],
        properties={
            "kernel": StringAttr(name),
            **graph.kind_properties(schema.kind, schema.geometry),
        },
        regions=[Region(block)],
    )
    fused.location = inner[-1].location
    last = inner[-1]
    parent = last.parent_block()
    assert parent is not None
    parent.insert_op_after(fused, last)
    for old, new in zip(outputs, fused.results, strict=True):
        if old.name_hint:
            new._name = old.name_hint  # pyright: ignore[reportPrivateUsage]
        old.replace_uses_with_if(new, lambda use: use.operation not in members)
    for op in inner:
        op.detach()
        block.add_op(op)
    arg_of = dict(zip(external, block.args, strict=True))
    for op in inner:
        op.operands = [arg_of.get(o, o) for o in op.operands]
    for v in outputs:
        v._name = None  # pyright: ignore[reportPrivateUsage]
    block.add_op(graph.YieldOp.create(operands=outputs))
    return fused


def fuse_module(module: ModuleOp, max_ops: int = MAX_OPS) -> list[FusionReport]:
    """Decomposes composites, moves returned transposes past element-wise ops
    (`sink_transposes`), unrolls small reductions that feed another reduction
    (`unroll_small_reductions`), nests reductions over several dims in the row
    reductions their inputs are made from (`nest_reductions`), then fuses every
    graph function of `module`."""
    from irc.passes.decompose import DecomposePass, unroll_small_reductions
    from irc.passes.nest_reductions import nest_reductions
    from irc.passes.sink_transposes import sink_transposes

    DecomposePass().apply(Context(), module)
    counter = [0]
    reports: list[FusionReport] = []
    for op in list(module.body.ops):
        if isinstance(op, func.FuncOp) and _is_unfused_graph(op):
            moved = sink_transposes(op.body.block)
            kept: list[str] = []
            unrolled = unroll_small_reductions(op.body.block, max_ops, kept)
            nested = nest_reductions(op.body.block)
            report = fuse_function(op, counter, max_ops)
            report.unrolled = unrolled
            report.not_unrolled = kept
            report.nested = nested
            report.moved_transposes = moved
            reports.append(report)
    return reports


def _is_unfused_graph(fn: func.FuncOp) -> bool:
    ops = list(fn.body.block.ops)
    return any(isinstance(op, graph.GraphOp) for op in ops) and not any(
        isinstance(op, graph.FusedOp) for op in ops
    )


@dataclass(frozen=True)
class FusePass(ModulePass):
    """`fuse{max-ops=64, report=""}`: kernels by bytes saved; report = text|json."""

    name = "fuse"
    levels = ("graph",)

    max_ops: int = MAX_OPS
    report: str = ""

    def __post_init__(self) -> None:
        check_option("fuse", "max_ops", self.max_ops, 1)
        if self.report not in ("", "text", "json"):
            raise IrcError(
                Diagnostic(None, f"fuse: 'report' must be text or json, got '{self.report}'")
            )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        reports = fuse_module(op, self.max_ops)
        sink = _REPORT_SINK.get()
        if sink is not None:
            sink.extend(reports)  # irc-opt names the kernels after the whole run
            return
        if not self.report:
            return
        resolve_reports(reports, lowered_copy(op))
        if self.report == "json":
            sys.stderr.write(json.dumps([r.as_dict() for r in reports], indent=2) + "\n")
        else:
            sys.stderr.write("\n".join(r.text() for r in reports) + "\n")
