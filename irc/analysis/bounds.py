"""Memory safety: a proof that every load and store stays inside its buffer.

The loop and tile levels can be written by hand, and an access outside a
buffer there is not an exception but a corrupted heap. So the verifier runs
this interval analysis on every module and rejects any access it cannot prove
in bounds (sound, not complete: "cannot prove" is an error too).

- Loop level: a kernel's, reduction's or foreach's index ranges over
  [0, bound - 1]; index arithmetic (`loop.apply`) is evaluated on intervals;
  every index of a `loop.load`/`loop.store` must lie in its buffer dimension.
- Tile level: program ids range over the grid, `tile.arange` over its size,
  `tile.for` and `tile.tiles` indices over their iterations; i32 results that
  could wrap are unknown. A `tile.load`/`tile.store` offset must lie in the
  buffer that each `tile.launch` of the kernel passes for its pointer. A mask
  that is a conjunction of comparisons narrows the compared values within the
  lanes where it holds, and the offsets are evaluated again under that
  narrowing (only where the lanes provably line up, see `_embed`). When plain
  intervals fail, scalars that depend on one program or tile index are
  enumerated exactly (grouped GEMM tile orders are not interval-friendly).
  TMA block accesses must declare their buffer's real shape: the copy engine
  clips to it. Launches must pass one memref of the pointee type per pointer;
  a mask is one i1 block; an access must sit in a kernel and use its pointers.

Every evaluation is memoized per value and iterative (no recursion), so the
check is linear in the size of the IR and deep chains cannot overflow the stack.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from xdsl.dialects.builtin import (
    ArrayAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue

from irc.dialects import graph, loop, tile
from irc.ir.types import broadcast_shapes, format_type, numel
from irc.syntax.diagnostics import Diagnostic, Note, op_location

Range = tuple[int, int]
"""A closed integer interval; lo > hi means empty (no lane can have the value)."""

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
BOOL = (0, 1)
EMPTY = (1, 0)
COMPARE = graph.COMPARISONS
"""The comparison functions, with what each says of its operands (its op's `COMPARISON`)."""
ENUMERATE_LIMIT = 1 << 20
"""Most values of one program or tile index that the exact scalar mode walks."""
ENUMERATE_BUDGET = 1 << 23
"""Most values the exact scalar mode computes for one kernel (64 MB of int64)."""
NARROW_BUDGET = 200_000
"""Most (value, lanes) evaluations one kernel's masks may cost; past it, plain intervals."""


def _empty(r: Range) -> bool:
    return r[0] > r[1]


def _meet(a: Range, b: Range) -> Range:
    return (max(a[0], b[0]), min(a[1], b[1]))


def _within(r: Range, limits: Range) -> bool:
    return _empty(r) or (limits[0] <= r[0] and r[1] <= limits[1])


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _arith(fn: str, args: list[Range]) -> Range | None:
    """Mathematical (unbounded) interval of an integer op, None if unsupported.

    Division and remainder are sound for both floor (Python) and truncating
    (C, Triton) semantics.
    """
    if any(_empty(a) for a in args):
        return EMPTY
    if len(args) == 1:
        ((a0, a1),) = args
        if fn == "neg":
            return (-a1, -a0)
        if fn == "abs":
            return (0 if a0 <= 0 <= a1 else min(abs(a0), abs(a1)), max(abs(a0), abs(a1)))
        if fn == "relu":
            return (max(a0, 0), max(a1, 0))
        return None
    if len(args) != 2:
        return None
    (a0, a1), (b0, b1) = args
    if fn == "add":
        return (a0 + b0, a1 + b1)
    if fn == "sub":
        return (a0 - b1, a1 - b0)
    if fn == "mul":
        c = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        return (min(c), max(c))
    if fn == "minimum":
        return (min(a0, b0), min(a1, b1))
    if fn == "maximum":
        return (max(a0, b0), max(a1, b1))
    if fn in ("floordiv", "mod") and b0 <= 0 <= b1:
        return None  # may divide by zero
    if fn == "floordiv":
        q = [f(x, y) for x in (a0, a1) for y in (b0, b1) for f in (int.__floordiv__, _trunc_div)]
        return (min(q), max(q))
    if fn == "mod":
        m = max(abs(b0), abs(b1)) - 1
        if a0 >= 0 and b0 > 0:
            return (a0, a1) if a1 < b0 else (0, min(a1, m))
        if a1 <= 0 and b1 < 0:
            return (a0, a1) if a0 > b1 else (max(a0, -m), 0)
        return (-m, m)
    return None


def _shape(v: SSAValue) -> tuple[int, ...]:
    t = v.type
    return t.get_shape() if type(t) is TensorType else ()  # type: ignore[attr-defined]


def _name(v: SSAValue) -> str:
    return "%" + v.name_hint if v.name_hint else "a value"


def _show(r: Range) -> str:
    return f"[{r[0]}, {r[1]}]"


def _evaluate(
    root: Hashable,
    memo: dict[Any, Any],
    deps: Callable[[Any], Iterable[Hashable]],
    compute: Callable[[Any], Any],
) -> Any:
    """`compute(root)` after `compute` of its dependencies, each once (no recursion).

    A dependency still missing when its dependent is computed (only a cycle,
    which the verifier rejects before this runs) reads as absent from `memo`.
    """
    if root in memo:
        return memo[root]
    stack: list[tuple[Hashable, bool]] = [(root, False)]
    while stack:
        key, expanded = stack.pop()
        if key in memo:
            continue
        if not expanded:
            stack.append((key, True))
            stack.extend((d, False) for d in deps(key) if d not in memo)
        else:
            memo[key] = compute(key)
    return memo[root]


# --- loop level ----------------------------------------------------------------------


def _loop_limits(t: Attribute) -> Range | None:
    """The values a loop-level scalar of type `t` can hold, None if not an integer."""
    if type(t) is IndexType:
        return I64
    if type(t) is IntegerType:
        w = t.width.data
        return BOOL if w == 1 else (-(2 ** (w - 1)), 2 ** (w - 1) - 1)
    return None


class LoopIntervals:
    """Interval of every integer loop-level value (None for floats), memoized."""

    def __init__(self) -> None:
        self.memo: dict[SSAValue, Range | None] = {}

    def get(self, v: SSAValue) -> Range | None:
        return _evaluate(v, self.memo, self._deps, self._compute)

    @staticmethod
    def _deps(v: SSAValue) -> Iterable[SSAValue]:
        op = v.owner
        return op.operands if type(op) is loop.ApplyOp else ()

    def _compute(self, v: SSAValue) -> Range | None:
        limits = _loop_limits(v.type)
        if limits is None:
            return None
        owner = v.owner
        kind = type(owner)
        if kind is Block:
            parent = owner.parent_op()  # type: ignore[union-attr]
            if isinstance(parent, loop.KernelOp | loop.LOOPS):
                bounds = _ints(parent.properties.get("bounds"))  # type: ignore[union-attr]
                index = v.index  # type: ignore[attr-defined]
                if bounds is not None and index < len(bounds):
                    return _meet((0, bounds[index] - 1), limits)
            return limits
        if kind is loop.ConstantOp:
            value = owner.properties.get("value")  # type: ignore[union-attr]
            if type(value) is IntegerAttr and limits != BOOL:
                n = value.value.data
                return (n, n) if limits[0] <= n <= limits[1] else limits
            return limits
        if kind is not loop.ApplyOp:
            return limits
        fn = _fn(owner)  # type: ignore[arg-type]
        args = [self.memo.get(a) for a in owner.operands]  # type: ignore[union-attr]
        if fn in COMPARE or limits == BOOL:
            return BOOL
        if fn == "cast":
            src = args[0] if args else None
            return src if src is not None and _within(src, limits) else limits
        if fn == "checked_index" and len(args) == 2 and args[1] is not None:
            # An index loaded from a tensor, clamped into [0, n) (and checked at run time).
            return _meet((0, args[1][1] - 1), limits) if args[1][0] >= 1 else limits
        if fn == "where":
            if len(args) != 3 or args[1] is None or args[2] is None:
                return limits
            r = (min(args[1][0], args[2][0]), max(args[1][1], args[2][1]))
            return r if _within(r, limits) else limits
        if any(a is None for a in args):
            return limits
        r = _arith(fn, args)  # type: ignore[arg-type]
        return r if r is not None and _within(r, limits) else limits


def _fn(op: Operation) -> str:
    fn = op.properties.get("fn")
    return str(fn.data) if isinstance(fn, loop.ApplyFnAttr) else ""


def _int_prop(op: Operation, name: str) -> int | None:
    attr = op.properties.get(name)
    return attr.value.data if type(attr) is IntegerAttr else None


def _ints(attr: Attribute | None) -> list[int] | None:
    if type(attr) is not ArrayAttr or not all(type(a) is IntegerAttr for a in attr.data):
        return None
    return [a.value.data for a in attr.data]  # type: ignore[attr-defined]


def _check_loop_access(op: Operation, intervals: LoopIntervals, out: list[Diagnostic]) -> None:
    """Every index of a loop.load/loop.store within its buffer dimension."""
    first = 0 if type(op) is loop.LoadOp else 1
    buffer = op.operands[first]
    t = buffer.type
    if type(t) is not MemRefType:
        return  # IRDL has reported it
    shape = t.get_shape()
    for k, (index, size) in enumerate(zip(op.operands[first + 1 :], shape, strict=False)):
        r = intervals.get(index)
        if r is not None and (r[0] > r[1] or (r[0] >= 0 and r[1] < size)):
            continue
        where = f"dimension {k} of {_name(buffer)} ({format_type(t)}) has size {size}"
        if r is None or r in (I32, I64):
            message = (
                f"cannot prove {op.name} index {k} ({_name(index)}) in bounds: only loop "
                f"indices, constants and index arithmetic on them are bounded; {where}"
            )
        elif r[0] >= 0:
            message = f"{op.name} index {k} ({_name(index)}) may reach {r[1]} but {where}"
        else:
            message = f"{op.name} index {k} ({_name(index)}) may range over {_show(r)} but {where}"
        out.append(Diagnostic(op_location(op), message))
        return


# --- tile level ----------------------------------------------------------------------


class Info(NamedTuple):
    """What is known of an integer tile value: its interval and its width.

    `bits` is 1 for booleans, 32 or 64 when Triton's type is certain, and 0
    when it could be either (arithmetic then must stay in i32 to be exact).
    A named tuple: one is made per value and evaluation, and these are cheap.
    """

    lo: int
    hi: int
    bits: int

    @property
    def range(self) -> Range:
        return (self.lo, self.hi)

    def meet(self, r: Range) -> Info:
        return Info(max(self.lo, r[0]), min(self.hi, r[1]), self.bits)


def _full(bits: int) -> Info:
    if bits == 1:
        return Info(0, 1, 1)
    if bits == 32:
        return Info(*I32, 32)
    return Info(*I64, bits)


def _info(r: Range, bits: int) -> Info:
    """`r` as a value of `bits`, or the whole type where the value may have wrapped."""
    exact = I64 if bits == 64 else BOOL if bits == 1 else I32
    return Info(r[0], r[1], bits) if _within(r, exact) else _full(bits)


def _type_bits(t: Attribute) -> int | None:
    """Triton's width for a declared type: None for floats."""
    e = t.element_type if type(t) is TensorType else t  # type: ignore[attr-defined]
    if type(e) is IntegerType:
        w = e.width.data
        return 1 if w == 1 else 64 if w > 32 else 32
    if type(e) is IndexType:
        return 64
    return None


def _promote(infos: list[Info]) -> int:
    """Triton's width of arithmetic on these operands (0: not certain)."""
    bits = [i.bits for i in infos]
    if 64 in bits:
        return 64
    if bits and all(b == 32 for b in bits):
        return 32
    return 0


Lanes = tuple[int, ...]
"""How a value's lanes sit in an access's lanes: per value axis, the access axis
whose index it follows, or -1 for an axis of size 1 (the same lane everywhere)."""


def _embed(inner: tuple[int, ...], outer: tuple[int, ...], lanes: Lanes) -> Lanes | None:
    """Lanes of an operand of shape `inner` broadcast (right-aligned) into a value of
    shape `outer` whose lanes are `lanes`; None when the shapes do not broadcast."""
    lead = len(outer) - len(inner)
    if lead < 0:
        return None
    out: list[int] = []
    for i, size in enumerate(inner):
        if size == 1:
            out.append(-1)
        elif size == outer[lead + i]:
            out.append(lanes[lead + i])
        else:
            return None
    return tuple(out)


def _expanded(
    inner: tuple[int, ...], outer: tuple[int, ...], axis: int, lanes: Lanes
) -> Lanes | None:
    """Lanes of the input of `tile.expand_dims` at `axis` (result shape `outer`)."""
    if axis < 0:
        axis += len(outer)
    if len(outer) != len(inner) + 1 or not 0 <= axis < len(outer):
        return None
    out: list[int] = []
    for i, size in enumerate(inner):
        j = i if i < axis else i + 1
        if size == 1:
            out.append(-1)
        elif size == outer[j]:
            out.append(lanes[j])
        else:
            return None
    return tuple(out)


LANEWISE = (tile.ApplyOp, tile.ExpandDimsOp, tile.BroadcastToOp)
"""Ops whose every result lane is computed from the same lane of each operand."""


def _operand_lanes(v: SSAValue, lanes: Lanes) -> list[tuple[SSAValue, Lanes]] | None:
    """Each operand of the lane-wise op computing `v`, with its lanes; None otherwise."""
    op = v.owner
    kind = type(op)
    if kind is tile.ApplyOp or kind is tile.BroadcastToOp:
        shape = _shape(v)
        out = []
        for a in op.operands:  # type: ignore[union-attr]
            m = _embed(_shape(a), shape, lanes)
            if m is None:
                return None
            out.append((a, m))
        return out
    if kind is tile.ExpandDimsOp:
        source = op.operands[0]  # type: ignore[union-attr]
        axis = _int_prop(op, "axis")  # type: ignore[arg-type]
        m = None if axis is None else _expanded(_shape(source), _shape(v), axis, lanes)
        return None if m is None else [(source, m)]
    return None


Key = tuple[SSAValue, Lanes]


class TileIntervals:
    """Intervals of the integer values of one tile.kernel (None for floats).

    `exact` enables the scalar mode: a scalar that depends on one program or
    tile index (and constants) is evaluated at every value of that index.
    """

    def __init__(self, kernel: tile.KernelOp, exact: bool = False):
        self.kernel = kernel
        self.grid = _ints(kernel.properties.get("grid"))
        self.exact = exact
        self.memo: dict[SSAValue, Info | None] = {}
        self.values: dict[SSAValue, Any] = {}  # exact mode: (source, numpy array) or int
        self.accesses: dict[tuple[SSAValue, SSAValue | None, tuple[int, ...]], Info | None] = {}
        self.budget = NARROW_BUDGET
        self.enumerated = 0  # values computed by the exact mode, against ENUMERATE_BUDGET

    # -- plain intervals --

    def get(self, v: SSAValue) -> Info | None:
        found = self.memo.get(v, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        return _evaluate(v, self.memo, self._deps, self._compute)

    @staticmethod
    def _deps(v: SSAValue) -> Iterable[SSAValue]:
        op = v.owner
        return op.operands if type(op) in LANEWISE else ()  # type: ignore[union-attr]

    def _compute(self, v: SSAValue) -> Info | None:
        op = v.owner
        if type(op) in LANEWISE:
            info = self.combine(v, [self.memo.get(a) for a in op.operands])  # type: ignore[union-attr]
        else:
            info = self._leaf(v)
        if info is not None and self.exact and not _shape(v):
            known = self._exact(v)
            if known is not None:
                info = info.meet(known)
        return info

    def _leaf(self, v: SSAValue) -> Info | None:
        """Values that no lane-wise op computes."""
        bits = _type_bits(v.type)
        if bits is None:
            return None
        owner = v.owner
        kind = type(owner)
        if kind is Block:
            return self._index(v, owner)  # type: ignore[arg-type]
        if kind is tile.ProgramIdOp:
            axis = _int_prop(owner, "axis")  # type: ignore[arg-type]
            if self.grid is None or axis is None or not 0 <= axis < 3:
                return _full(0)
            size = self.grid[axis] if axis < len(self.grid) else 1
            return Info(0, size - 1, 32) if size >= 1 else Info(*EMPTY, 32)
        if kind is tile.ArangeOp:
            size = _int_prop(owner, "size")  # type: ignore[arg-type]
            return Info(0, size - 1, 32) if size is not None and size >= 1 else _full(0)
        if kind is tile.ConstantOp:
            value = owner.properties.get("value")  # type: ignore[union-attr]
            if bits != 1 and type(value) is IntegerAttr:
                n = value.value.data
                fits = _within((n, n), I64 if bits == 64 else I32)
                return Info(n, n, bits) if fits else _full(bits)
            return _full(bits)
        if kind is tile.LoadOp:
            # A loaded integer (the indices of a gather) has its buffer's width exactly.
            return _full(bits)
        # Reductions, dots and loop results: any value of their type.
        return _full(bits if bits == 1 else 0)

    def _index(self, v: SSAValue, block: Block) -> Info | None:
        """A loop's index, or a carried value (anything)."""
        parent = block.parent_op()
        index = v.index  # type: ignore[attr-defined]
        if type(parent) is tile.ForOp and index == 0:
            its = _iterations(parent)  # type: ignore[arg-type]
            if its is None:
                return _full(0)
            bits = 32 if all(_within((x, x), I32) for x in (its.start, its.stop, its.step)) else 64
            if not its:
                return Info(*EMPTY, bits)
            return Info(min(its[0], its[-1]), max(its[0], its[-1]), bits)
        if type(parent) is tile.TilesOp and index < 2:
            count = _int_prop(parent, "count")  # type: ignore[arg-type]
            if count is None:
                return _full(0)
            return Info(0, count - 1, 32) if count >= 1 else Info(*EMPTY, 32)
        bits = _type_bits(v.type)
        return None if bits is None else _full(bits if bits == 1 else 0)

    @staticmethod
    def combine(v: SSAValue, args: list[Info | None]) -> Info | None:
        """A lane-wise op's result from its operands' intervals."""
        op = v.owner
        if type(op) is not tile.ApplyOp:
            return args[0] if args else None  # expand_dims, broadcast_to
        fn = _fn(op)  # type: ignore[arg-type]
        bits = _type_bits(v.type)
        if fn in COMPARE:
            return Info(0, 1, 1)
        if fn == "cast":
            if bits is None:
                return None
            src = args[0] if args else None
            if bits == 1:
                return Info(0, 1, 1)
            if src is None:
                return _full(bits)
            limits = I64 if bits == 64 else I32
            return Info(src.lo, src.hi, bits) if _within(src.range, limits) else _full(bits)
        if fn in ("and", "or") and all(a is not None and a.bits == 1 for a in args):
            return Info(0, 1, 1)
        if fn == "checked_index" and len(args) == 2 and args[1] is not None and args[1].lo >= 1:
            return Info(0, args[1].hi - 1, bits or 0)  # clamped into [0, n)
        if fn == "where":
            if len(args) != 3 or args[1] is None or args[2] is None:
                return None if bits is None else _full(0)
            a, b = args[1], args[2]
            return _info((min(a.lo, b.lo), max(a.hi, b.hi)), _promote([a, b]))
        if any(a is None for a in args):
            return None  # a float operand makes a float result
        infos: list[Info] = args  # type: ignore[assignment]
        if any(a.bits == 1 for a in infos):
            return _full(0)  # boolean arithmetic: Triton's widths are not modelled
        width = _promote(infos)
        r = _arith(fn, [a.range for a in infos])
        if r is None:
            return _full(width if width == 64 else 0)
        return _info(r, width)

    # -- masks --

    def access(
        self, offsets: SSAValue, mask: SSAValue | None, shape: tuple[int, ...]
    ) -> Info | None:
        """The offsets' interval over the lanes of an access of `shape` where `mask` holds."""
        key = (offsets, mask, shape)
        if key not in self.accesses:
            self.accesses[key] = self._access(offsets, mask, shape)
        return self.accesses[key]

    def _access(
        self, offsets: SSAValue, mask: SSAValue | None, shape: tuple[int, ...]
    ) -> Info | None:
        plain = self.get(offsets)
        if mask is None or plain is None:
            return plain
        lanes = tuple(i if s != 1 else -1 for i, s in enumerate(shape))
        facts: dict[Key, Range] = {}
        mask_lanes = _embed(_shape(mask), shape, lanes)
        if mask_lanes is not None:
            self._facts(mask, mask_lanes, facts)
        off_lanes = _embed(_shape(offsets), shape, lanes)
        if not facts or off_lanes is None:
            return plain
        memo: dict[Key, Info | None] = {}
        operands: dict[Key, list[Key] | None] = {}

        def deps(key: Key) -> Iterable[Key]:
            self.budget -= 1
            ops = _operand_lanes(*key) if self.budget > 0 else None
            operands[key] = ops
            return ops or ()

        def compute(key: Key) -> Info | None:
            v = key[0]
            info = self.get(v)
            ops = operands.get(key)
            if ops and info is not None and all(k in memo for k in ops):
                narrowed = self.combine(v, [memo[k] for k in ops])
                if narrowed is not None:
                    info = info.meet(narrowed.range)
            fact = facts.get(key)
            if fact is not None and info is not None:
                info = info.meet(fact)
            return info

        return _evaluate((offsets, off_lanes), memo, deps, compute)

    def _facts(self, mask: SSAValue, lanes: Lanes, facts: dict[Key, Range]) -> None:
        """What holds in every lane where `mask` (at `lanes`) is true: bounds on the
        values a conjunction of comparisons compares."""
        todo = [(mask, lanes)]
        while todo:
            m, at = todo.pop()
            op = m.owner
            kind = type(op)
            fn = _fn(op) if kind is tile.ApplyOp else ""  # type: ignore[arg-type]
            if kind is tile.ExpandDimsOp or kind is tile.BroadcastToOp or fn == "and":
                todo.extend(_operand_lanes(m, at) or ())
                continue
            if fn not in COMPARE or len(op.operands) != 2:  # type: ignore[union-attr]
                continue
            pair = _operand_lanes(m, at)
            if pair is None:
                continue
            (a, la), (b, lb) = pair
            ia, ib = self.get(a), self.get(b)
            if ia is None or ib is None:
                continue
            comparison = COMPARE[fn]
            bound_a = _compared_bound(comparison, ib)
            bound_b = _compared_bound(comparison.mirrored(), ia)
            for key, bound in (((a, la), bound_a), ((b, lb), bound_b)):
                if bound is not None:
                    facts[key] = _meet(facts.get(key, I64), bound)

    # -- exact scalars --

    def _exact(self, v: SSAValue) -> Range | None:
        """[min, max] of a scalar over every value of the one index it depends on."""
        found = _evaluate(v, self.values, self._scalar_deps, self._enumerate)
        if found is None:
            return None
        if isinstance(found, int):
            return (found, found)
        arr = found[1]
        return (int(arr.min()), int(arr.max())) if arr.size else EMPTY

    @staticmethod
    def _scalar_deps(v: SSAValue) -> Iterable[SSAValue]:
        op = v.owner
        return op.operands if type(op) is tile.ApplyOp and not _shape(v) else ()  # type: ignore[union-attr]

    def _enumerate(self, v: SSAValue) -> Any:
        """`v` as an int (a constant) or (index, its values at every value of the index)."""
        import numpy as np

        bits = _type_bits(v.type)
        if _shape(v) or bits is None:
            return None
        owner = v.owner
        kind = type(owner)
        if kind is tile.ConstantOp:
            info = self._leaf(v)
            return info.lo if info is not None and info.lo == info.hi else None
        if kind is tile.ProgramIdOp or kind is Block:
            info = self._leaf(v)
            if info is None or _empty(info.range) or info.hi - info.lo >= ENUMERATE_LIMIT:
                return None
            self.enumerated += info.hi - info.lo + 1
            if self.enumerated > ENUMERATE_BUDGET:
                return None
            parent = owner.parent_op() if kind is Block else None  # type: ignore[union-attr]
            if type(parent) is tile.ForOp:
                its = _iterations(parent)  # type: ignore[arg-type]
                return None if its is None else (v, np.array(its, dtype=np.int64))
            return (v, np.arange(info.lo, info.hi + 1, dtype=np.int64))
        if kind is not tile.ApplyOp:
            return None
        fn = _fn(owner)  # type: ignore[arg-type]
        # Integers only (booleans only as a where's condition): Triton's i1
        # arithmetic is not modelled. The widths are the plain analysis's, which
        # knows a comparison is i1 whatever type the IR gives it.
        infos = [self.memo.get(a) for a in owner.operands]  # type: ignore[union-attr]
        if fn == "where":
            infos = infos[1:]
        if any(i is None or i.bits == 1 for i in infos) or (bits == 1 and fn not in COMPARE):
            return None
        args = [self.values.get(a) for a in owner.operands]  # type: ignore[union-attr]
        if any(a is None for a in args):
            return None
        sources = {a[0] for a in args if not isinstance(a, int)}
        if len(sources) > 1:
            return None
        arrays = [a if isinstance(a, int) else a[1] for a in args]
        self.enumerated += max((a.size for a in arrays if not isinstance(a, int)), default=0)
        if self.enumerated > ENUMERATE_BUDGET:
            return None
        result = _numpy_apply(fn, arrays)
        if result is None or isinstance(result, int):
            return result
        return (next(iter(sources)), result) if sources else None


_MISSING = object()


def _iterations(op: tile.ForOp) -> range | None:
    """`range(lb, ub, step)` of a tile.for, None if it is not one."""
    lb, ub, step = (_int_prop(op, n) for n in ("lb", "ub", "step"))
    if lb is None or ub is None or step is None or step == 0:
        return None
    return range(lb, ub, step)


def _compared_bound(comparison: graph.Comparison, other: Info) -> Range | None:
    """What `x OP other` says of x where it holds, None if nothing (`!=`): at most
    other's largest value where x is never greater, at least its least where never
    less, one beyond where they are never equal."""
    low, high = I64
    strict = 0 if comparison.equal else 1
    if comparison.greater and comparison.less:
        return None
    return (
        low if comparison.less else other.lo + strict,
        high if comparison.greater else other.hi - strict,
    )


def _numpy_function(name: str) -> Callable[..., Any]:
    """The numpy function an op's NUMPY fact names (`numpy.add`)."""
    import numpy as np

    return getattr(np, name.removeprefix("numpy."))  # type: ignore[no-any-return]


def _numpy_apply(fn: str, args: list[Any]) -> Any:
    """Triton's integer semantics (truncating division) on arrays; None where a value
    might leave i32 (the exact mode proves only what stays inside i32)."""
    import numpy as np

    def span(a: Any) -> int:
        return abs(int(a)) if isinstance(a, int) else int(np.abs(a).max(initial=0))

    limit = I32[1]
    if any(span(a) > limit for a in args):
        return None
    op = graph.FUNCTION_OPS.get(fn)
    if op is not None and op.NUMPY is not None and len(args) == op.ARITY:
        r = np.asarray(_numpy_function(op.NUMPY)(*args), dtype=np.int64)
    elif fn in ("floordiv", "mod") and len(args) == 2:
        a, b = (np.asarray(x, dtype=np.int64) for x in args)
        if (b == 0).any():
            return None
        q = np.abs(a) // np.abs(b)
        q = np.where((a < 0) != (b < 0), -q, q)
        r = q if fn == "floordiv" else a - q * b
    elif fn == "cast" and len(args) == 1:
        r = np.asarray(args[0], dtype=np.int64)
    else:
        return None
    if r.ndim == 0:
        value = int(r)
        return value if abs(value) <= limit else None
    return r if span(r) <= limit else None


# --- launches and tile accesses --------------------------------------------------------


@dataclass
class KernelCheck:
    """A top-level kernel, the buffers of each of its launches, and its accesses."""

    kernel: tile.KernelOp
    launches: list[tuple[tile.LaunchOp, list[SSAValue]]] = field(
        default_factory=list[tuple[tile.LaunchOp, list[SSAValue]]]
    )
    accesses: list[Operation] = field(default_factory=list[Operation])


def _check_launch(
    op: tile.LaunchOp, kernels: dict[str, KernelCheck], out: list[Diagnostic]
) -> None:
    """One memref of the pointee type per pointer argument of an existing kernel."""
    symbol = op.properties.get("kernel")
    if not isinstance(symbol, SymbolRefAttr):
        return  # IRDL has reported it
    name = symbol.root_reference.data
    found = kernels.get(name)
    if found is None:
        out.append(Diagnostic(op_location(op), f"tile.launch: no tile.kernel named @{name}"))
        return
    kernel = found.kernel
    params = kernel.body.block.args
    args = list(op.operands)
    if len(args) != len(params):
        out.append(
            Diagnostic(
                op_location(op),
                f"tile.launch passes {len(args)} buffer(s) but @{name} takes "
                f"{len(params)} pointer(s)",
                notes=[Note(op_location(kernel), f"@{name} declared here")],
            )
        )
        return
    ok = True
    for i, (arg, param) in enumerate(zip(args, params, strict=True)):
        t = arg.type
        pointee = getattr(param.type, "pointee", None)
        static = type(t) is MemRefType and all(d >= 0 for d in t.get_shape())
        if not static or t.element_type != pointee:  # type: ignore[attr-defined]
            ok = False
            want = format_type(pointee) if pointee is not None else "its type"
            out.append(
                Diagnostic(
                    op_location(op),
                    f"tile.launch argument {i} ({_name(arg)}) is {format_type(t)} but "
                    f"@{name} takes {format_type(param.type)} there: a memref of {want} "
                    "is needed",
                    notes=[Note(op_location(kernel), f"@{name} declared here")],
                )
            )
    if ok:
        found.launches.append((op, args))


def _check_tile_access(
    op: Operation, check: KernelCheck, plain: TileIntervals, exact: list[TileIntervals],
    out: list[Diagnostic],
) -> None:  # fmt: skip
    """One tile.load/store/block_load/block_store against every launch of its kernel."""
    kind = type(op)
    ptr = op.operands[0]
    kernel = check.kernel
    if not (type(ptr) is BlockArgument and ptr.block is kernel.body.block):
        message = f"cannot prove {op.name} in bounds: its pointer is not an argument of its kernel"
        out.append(Diagnostic(op_location(op), message))
        return
    pointee = getattr(ptr.type, "pointee", None)
    if kind is tile.LoadOp or kind is tile.BlockLoadOp:
        data = op.results[0]
    else:
        data = op.operands[3] if kind is tile.BlockStoreOp else op.operands[2]
    element = data.type.element_type if type(data.type) is TensorType else data.type  # type: ignore[attr-defined]
    if element != pointee:
        out.append(
            Diagnostic(
                op_location(op),
                f"{op.name}: element type {format_type(element)} differs from the "
                f"pointer's {format_type(ptr.type)}",
            )
        )
        return
    if kind is tile.BlockLoadOp or kind is tile.BlockStoreOp:
        declared = op.buffer_shape()  # type: ignore[union-attr]
        for launch, buffers in check.launches:
            buffer = buffers[ptr.index]
            real = list(buffer.type.get_shape())  # type: ignore[attr-defined]
            if declared != real:
                out.append(
                    Diagnostic(
                        op_location(op),
                        f"{op.name} declares shape {declared} but the buffer launched as "
                        f"{_name(buffer)} is {format_type(buffer.type)}: TMA clips to the "
                        "declared shape, which must be the buffer's",
                        notes=[Note(op_location(launch), "launched here")],
                    )
                )
                return
        return
    offsets = op.operands[1]
    masks = op.operands[3:] if kind is tile.StoreOp else op.operands[2:]
    if len(masks) > 1:
        out.append(Diagnostic(op_location(op), f"{op.name} takes at most one mask"))
        return
    if masks and _type_bits(masks[0].type) != 1:
        message = f"{op.name}: the mask must be booleans (i1), not {format_type(masks[0].type)}"
        out.append(Diagnostic(op_location(op), message))
        return
    if not check.launches:
        return  # never started: nothing to read or write
    mask = masks[0] if masks else None
    shape = broadcast_shapes(_shape(offsets), _shape(data), *(_shape(m) for m in masks))
    info = plain.access(offsets, mask, shape) if shape is not None else None
    refined = False
    for launch, buffers in check.launches:
        buffer = buffers[ptr.index]
        size = numel(buffer.type.get_shape())  # type: ignore[attr-defined]
        if info is not None and _within(info.range, (0, size - 1)):
            continue
        if shape is not None and info is not None and not refined:
            refined = True
            if not exact:
                exact.append(TileIntervals(kernel, exact=True))
            info = exact[0].access(offsets, mask, shape)
            if info is not None and _within(info.range, (0, size - 1)):
                continue
        holds = (
            f"the buffer launched as {_name(buffer)} ({format_type(buffer.type)}) "
            f"holds {size} elements"
        )
        if info is None or info.range in (I32, I64):
            message = (
                f"cannot prove {op.name} offsets in bounds: only program ids, aranges, loop "
                f"indices, constants and integer arithmetic on them are bounded; {holds}"
            )
        elif mask is None:
            message = f"{op.name} offsets may reach {_show(info.range)} but {holds}; add a mask"
        else:
            message = (
                f"{op.name} offsets may reach {_show(info.range)} in lanes where the mask "
                f"holds, but {holds}"
            )
        out.append(
            Diagnostic(op_location(op), message, notes=[Note(op_location(launch), "launched here")])
        )
        return


TILE_ACCESSES = (tile.LoadOp, tile.StoreOp, tile.BlockLoadOp, tile.BlockStoreOp)


def _in_loop_kernel(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None and type(parent) is not loop.KernelOp:
        parent = parent.parent_op()
    return parent is not None


def _kernel_of(op: Operation) -> tile.KernelOp | None:
    parent = op.parent_op()
    while parent is not None and type(parent) is not tile.KernelOp:
        parent = parent.parent_op()
    return parent  # type: ignore[return-value]


def check_bounds(module: ModuleOp) -> list[Diagnostic]:
    """Diagnostics for every access not proven inside its buffer, and every launch
    whose buffers do not fit its kernel."""
    out: list[Diagnostic] = []
    kernels: dict[str, KernelCheck] = {}
    for op in module.body.ops:
        if type(op) is tile.KernelOp:
            attr = op.properties.get("sym_name")
            if not isinstance(attr, StringAttr):
                continue  # IRDL has reported it
            name = attr.data
            if name in kernels:
                out.append(
                    Diagnostic(
                        op_location(op),
                        f"tile.kernel @{name} is defined twice",
                        notes=[Note(op_location(kernels[name].kernel), "first defined here")],
                    )
                )
                continue
            kernels[name] = KernelCheck(op)
    loops = LoopIntervals()
    by_kernel = {c.kernel: c for c in kernels.values()}
    walk: list[Iterator[Operation]] = [iter(module.body.ops)]
    while walk:
        op = next(walk[-1], None)
        if op is None:
            walk.pop()
            continue
        kind = type(op)
        if kind is loop.LoadOp or kind is loop.StoreOp:
            if _in_loop_kernel(op):
                _check_loop_access(op, loops, out)
            else:
                message = (
                    f"{op.name} is outside any loop.kernel: loads and stores belong in kernels"
                )
                out.append(Diagnostic(op_location(op), message))
        elif kind is tile.LaunchOp:
            _check_launch(op, kernels, out)  # type: ignore[arg-type]
        elif kind in TILE_ACCESSES:
            kernel = _kernel_of(op)
            if kernel is None:
                message = f"cannot prove {op.name} in bounds: it is outside any tile.kernel"
                out.append(Diagnostic(op_location(op), message))
                continue
            if kernel not in by_kernel:  # nested, or a second of a name: never launched
                by_kernel[kernel] = KernelCheck(kernel)
            by_kernel[kernel].accesses.append(op)
        for region in reversed(op.regions):
            for block in reversed(region.blocks):
                walk.append(iter(block.ops))
    for check in by_kernel.values():
        if check.accesses:
            plain = TileIntervals(check.kernel)
            exact: list[TileIntervals] = []
            for op in check.accesses:
                _check_tile_access(op, check, plain, exact, out)
    return out
