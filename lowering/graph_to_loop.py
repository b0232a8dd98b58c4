"""graph -> loop: tensors become buffers, ops become loop nests.

Each graph value is given an *access*: a buffer written by a kernel, a view
(transpose, broadcast, reshape, slice: an index map over another access, so no
copy kernel is made for it), a splat constant, or an iota (each element its
index). A kernel computes its outputs element by element through
`KernelBuilder.value_at`, which follows accesses and, for ops inside the
kernel's group, emits their scalar computation in place (a concat: a select
between its operands, each read at its own index); that
is what makes a fused group one loop nest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.dialects import graph, loop
from irc.dialects.attrs import number_for
from irc.dialects.graph import kind_of_ops
from irc.ir.kernel_kind import NAME_PREFIX, KernelKind, RowGeometry
from irc.ir.types import F32, HALF_TYPES, I1, element_of, int_array, shape_of
from irc.ir.value_names import set_value_name
from irc.lowering.attention_to_loop import attention_kernel
from irc.syntax.diagnostics import IrcError, op_location

INDEX = IndexType()


def memref_of(t: Attribute) -> MemRefType[Attribute]:
    assert isinstance(t, TensorType)
    return MemRefType(t.element_type, list(t.get_shape()))


# --- accesses -------------------------------------------------------------------

IndexMap = Callable[["KernelBuilder", list[SSAValue]], list[SSAValue]]


@dataclass
class Buffer:
    """A value stored in memory (a function argument or a kernel's output)."""

    memref: SSAValue


@dataclass
class View:
    """Elements of `base` read through an index map (no data movement): transpose,
    broadcast, reshape and slice."""

    base: SSAValue
    index_map: IndexMap


@dataclass
class Splat:
    """Every element equals one constant."""

    value: Attribute


@dataclass
class Iota:
    """Every element is its index along `dim` (computed, never stored)."""

    dim: int


Access = Buffer | View | Splat | Iota


def _broadcast_map(src: Sequence[int], dst: Sequence[int]) -> IndexMap:
    """Indices of a `dst`-shaped result into a `src` operand broadcast to it."""
    lead = len(dst) - len(src)

    def index_map(kb: KernelBuilder, idx: list[SSAValue]) -> list[SSAValue]:
        return [
            kb.index_const(0) if s == 1 and dst[lead + d] != 1 else idx[lead + d]
            for d, s in enumerate(src)
        ]

    return index_map


def _transpose_map(perm: Sequence[int]) -> IndexMap:
    def index_map(kb: KernelBuilder, idx: list[SSAValue]) -> list[SSAValue]:
        out: list[SSAValue] = list(idx)
        for i, p in enumerate(perm):
            out[p] = idx[i]
        return out

    return index_map


def _strides(shape: Sequence[int]) -> list[int]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The reshape's reassociation (MLIR's collapse/expand groups): runs of source
    and result dims of equal products, split wherever both prefix products meet.
    Dims of size 1 belong to no group (their index is always 0)."""
    assert math.prod(src) == math.prod(dst), "graph.reshape's verifier keeps the count"
    src_dims = [d for d, n in enumerate(src) if n != 1]
    dst_dims = [d for d, n in enumerate(dst) if n != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src_dims) or j < len(dst_dims):
        a, b = [src_dims[i]], [dst_dims[j]]
        pa, pb = src[a[0]], dst[b[0]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                a.append(src_dims[i])
                pa, i = pa * src[src_dims[i]], i + 1
            else:
                b.append(dst_dims[j])
                pb, j = pb * dst[dst_dims[j]], j + 1
        groups.append((a, b))
    return groups


def _reshape_map(src: Sequence[int], dst: Sequence[int]) -> IndexMap:
    """Row-major, group by group: linearize the result dims of a group, then split
    that index by the group's source dims. A group of one dim each way is the index
    itself, so `[B, H, T, D] -> [B * H, T, D]` divides only the merged dims."""
    groups = reshape_groups(src, dst)

    def index_map(kb: KernelBuilder, idx: list[SSAValue]) -> list[SSAValue]:
        out: list[SSAValue] = [kb.index_const(0)] * len(src)
        for src_dims, dst_dims in groups:
            linear: SSAValue | None = None
            sizes = [dst[d] for d in dst_dims]
            for d, stride in zip(dst_dims, _strides(sizes), strict=True):
                term = (
                    idx[d] if stride == 1 else kb.index_apply("mul", idx[d], kb.index_const(stride))
                )
                linear = term if linear is None else kb.index_apply("add", linear, term)
            assert linear is not None
            sizes = [src[d] for d in src_dims]
            for k, (d, stride) in enumerate(zip(src_dims, _strides(sizes), strict=True)):
                v = (
                    linear
                    if stride == 1
                    else kb.index_apply("floordiv", linear, kb.index_const(stride))
                )
                out[d] = v if k == 0 else kb.index_apply("mod", v, kb.index_const(src[d]))
        return out

    return index_map


def _slice_map(start: Sequence[int], step: Sequence[int]) -> IndexMap:
    """Indices of a slice's result into its operand: `start + i * step` per dimension."""

    def index_map(kb: KernelBuilder, idx: list[SSAValue]) -> list[SSAValue]:
        out: list[SSAValue] = []
        for i, s, k in zip(idx, start, step, strict=True):
            v = i if k == 1 else kb.index_apply("mul", i, kb.index_const(k))
            out.append(v if s == 0 else kb.index_apply("add", v, kb.index_const(s)))
        return out

    return index_map


# --- kernels -------------------------------------------------------------------

# Element-wise graph ops and the `fn` of the loop.apply that mirrors them (the op's FN).
ELEMENTWISE_FN: dict[type[Operation], str] = {op: op.FN for op in graph.ELEMENTWISE_OPS}


class KernelBuilder:
    """Builds one loop.kernel body; computes graph values at index tuples."""

    def __init__(self, lowering: FunctionLowering, block: Block, members: set[Operation]):
        self.lowering = lowering
        self.blocks = [block]
        self.members = members
        # One cache per open block: a value computed inside a loop region is
        # not visible after it, so its cache entry goes when the region closes.
        self.caches: list[dict[tuple[SSAValue, tuple[SSAValue, ...]], SSAValue]] = [{}]
        self.consts: dict[tuple[str, int | float], SSAValue] = {}
        # Ops a kernel kind computes its own way (attention: the softmax's
        # reductions and the second contraction; lowering/attention_to_loop.py).
        self.overrides: dict[Operation, Callable[[list[SSAValue]], SSAValue]] = {}

    def add(self, op: Operation) -> SSAValue:
        self.blocks[-1].add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def index_const(self, n: int) -> SSAValue:
        key = ("index", n)
        if key not in self.consts:
            op = loop.ConstantOp.create(
                properties={"value": IntegerAttr(n, i64)}, result_types=[INDEX]
            )
            # Constants go first in the kernel so that every nested region sees them.
            root = self.blocks[0]
            if root.first_op is None:
                root.add_op(op)
            else:
                root.insert_op_before(op, root.first_op)
            self.consts[key] = op.result
        return self.consts[key]

    def index_apply(self, fn: str, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.apply(fn, [a, b], INDEX)

    def apply(self, fn: str, args: Sequence[SSAValue], result: Attribute) -> SSAValue:
        return self.add(
            loop.ApplyOp.create(
                operands=list(args), result_types=[result], properties={"fn": loop.apply_fn(fn)}
            )
        )

    def constant(self, value: Attribute, element: Attribute) -> SSAValue:
        value = number_for(value, element)  # graph.constant's 8.0 for an i32 is 8 here
        return self.add(loop.ConstantOp.create(properties={"value": value}, result_types=[element]))

    def value_at(self, v: SSAValue, idx: list[SSAValue]) -> SSAValue:
        """The scalar `v[idx]`, loaded or computed (once per kernel and index)."""
        key = (v, tuple(idx))
        for cache in reversed(self.caches):
            if key in cache:
                return cache[key]
        element = element_of(v.type)
        access = self.lowering.access.get(v)
        owner = v.owner if isinstance(v.owner, Operation) else None
        if owner is not None and owner in self.members:
            result = self.compute(owner, idx)
        elif isinstance(access, Buffer):
            result = self.add(
                loop.LoadOp.create(operands=[access.memref, *idx], result_types=[element])
            )
        elif isinstance(access, View):
            return self.value_at(access.base, access.index_map(self, idx))
        elif isinstance(access, Splat):
            result = self.constant(access.value, element)
        elif isinstance(access, Iota):
            result = self.apply("cast", [idx[access.dim]], element)
        else:  # pragma: no cover - the lowering orders kernels topologically
            raise AssertionError(f"no access for {v}")
        self.caches[-1][key] = result
        return result

    def compute(self, op: Operation, idx: list[SSAValue]) -> SSAValue:
        """Emits the scalar computation of a group member at `idx`."""
        override = self.overrides.get(op)
        if override is not None:
            return override(idx)
        out_shape = shape_of(op.results[0].type)
        element = element_of(op.results[0].type)
        if isinstance(op, graph.ElementwiseOp):
            fn = op.scalar_fn()
            args = [
                self.value_at(o, _broadcast_map(shape_of(o.type), out_shape)(self, idx))
                for o in op.operands
            ]
            return self.apply(fn, args, element)
        view = view_map(op)
        if view is not None:
            return self.value_at(op.operands[0], view(self, idx))
        if isinstance(op, graph.ConstantOp):
            return self.constant(op.value, element)  # type: ignore[arg-type]
        if isinstance(op, graph.IotaOp):
            return self.apply("cast", [idx[op.axis()]], element)
        if isinstance(op, graph.ReduceOp):
            return self.reduce(op, idx)
        if isinstance(op, graph.MatmulOp):
            return self.matmul(op, idx)
        if isinstance(op, graph.ConcatOp):
            return self.concat(op, idx)
        if isinstance(op, graph.IndexSelectOp):
            d, rank = op.axis(), len(shape_of(op.indices.type))
            pos = self.checked_index(op, self.value_at(op.indices, idx[d : d + rank]))
            return self.value_at(op.input, [*idx[:d], pos, *idx[d + rank :]])
        if isinstance(op, graph.GatherOp):
            d = op.axis()
            pos = self.checked_index(op, self.value_at(op.indices, idx))
            return self.value_at(op.input, [pos if i == d else x for i, x in enumerate(idx)])
        raise NotImplementedError(f"cannot lower {op.name} inside a kernel")

    @contextmanager
    def region(self, n_indices: int) -> Iterator[tuple[Block, list[SSAValue]]]:
        """Opens a nested loop body taking `n_indices` index arguments."""
        block = Block(arg_types=[INDEX] * n_indices)
        self.blocks.append(block)
        self.caches.append({})
        try:
            yield block, list(block.args)
        finally:
            self.blocks.pop()
            self.caches.pop()

    def reduce(self, op: graph.ReduceOp, idx: list[SSAValue]) -> SSAValue:
        x = op.input
        in_shape = shape_of(x.type)
        dims = sorted(op.reduced_dims())  # bounds follow the input's dim order
        keep = op.keeps_dims()
        element = element_of(op.result.type)
        bounds = [in_shape[d] for d in dims]
        # A half-precision mean sums and divides in f32 and rounds once, as torch does
        # (a sum rounded to f16 first overflows past 65504).
        mean = isinstance(op, graph.ReduceMeanOp)
        acc = F32 if mean and element in HALF_TYPES else element
        with self.region(len(bounds)) as (block, rivs):
            self._reduce_body(x, in_shape, dims, keep, idx, rivs, acc)
        props: dict[str, Attribute] = {
            "kind": StringAttr(op.COMBINE),
            "bounds": int_array(bounds),
        }
        red = self.add(
            loop.ReduceOp.create(properties=props, result_types=[acc], regions=[Region(block)])
        )
        if mean:
            n = 1
            for b in bounds:
                n *= b
            red = self.apply("div", [red, self.constant(FloatAttr(float(n), f64), acc)], acc)
        if acc != element:
            red = self.apply("cast", [red], element)
        return red

    def _reduce_body(
        self,
        x: SSAValue,
        in_shape: Sequence[int],
        dims: Sequence[int],
        keep: bool,
        idx: list[SSAValue],
        rivs: list[SSAValue],
        acc: Attribute | None = None,
    ) -> None:
        """Yields x at (reduced dims from the loop, the others from idx), as `acc`."""
        out_iter = iter(idx)
        r_iter = iter(rivs)
        x_idx: list[SSAValue] = []
        for d in range(len(in_shape)):
            if d in dims:
                if keep:
                    next(out_iter)
                x_idx.append(next(r_iter))
            else:
                x_idx.append(next(out_iter))
        value = self.value_at(x, x_idx)
        if acc is not None and acc != element_of(x.type):
            value = self.apply("cast", [value], acc)
        self.add(loop.YieldOp.create(operands=[value]))

    def concat(self, op: graph.ConcatOp, idx: list[SSAValue]) -> SSAValue:
        """`where(i < end_0, part_0, where(i < end_1, part_1, ...))` along the concat dim.

        Each part is read at the index clamped into it, so every load stays in its
        buffer (the bounds proof sees it) and a lane of another part reads a valid,
        cached element that the select then drops.
        """
        d = op.axis()
        element = element_of(op.result.type)
        parts = list(op.inputs)
        starts = [0]
        for p in parts:
            starts.append(starts[-1] + shape_of(p.type)[d])
        out: SSAValue | None = None
        for k in reversed(range(len(parts))):
            size, start = shape_of(parts[k].type)[d], starts[k]
            pos = idx[d]
            if start:
                shifted = self.index_apply("sub", pos, self.index_const(start))
                pos = self.index_apply("maximum", shifted, self.index_const(0))
            if k < len(parts) - 1 and size > 1:
                pos = self.index_apply("minimum", pos, self.index_const(size - 1))
            elif size == 1:
                pos = self.index_const(0)
            v = self.value_at(parts[k], [pos if i == d else x for i, x in enumerate(idx)])
            if out is None:
                out = v
            else:
                inside = self.apply("lt", [idx[d], self.index_const(starts[k + 1])], I1)
                out = self.apply("where", [inside, v, out], element)
        assert out is not None
        return out

    def checked_index(self, op: graph.IndexingOp, i: SSAValue) -> SSAValue:
        """A loaded index as a position along `op`'s dim: checked and clamped."""
        size = shape_of(op.input.type)[op.axis()]
        return self.apply("checked_index", [i, self.index_const(size)], INDEX)

    def matmul(self, op: graph.MatmulOp, idx: list[SSAValue]) -> SSAValue:
        a, b = op.lhs, op.rhs
        k = shape_of(a.type)[-1]
        element = element_of(op.result.type)
        batch = idx[:-2]
        with self.region(1) as (block, (kiv,)):
            av = self.value_at(a, [*batch, idx[-2], kiv])
            bv = self.value_at(b, [*batch, kiv, idx[-1]])
            self.add(loop.YieldOp.create(operands=[self.apply("mul", [av, bv], element)]))
        props: dict[str, Attribute] = {
            "kind": StringAttr("sum"),
            "bounds": int_array([k]),
            "contract": IntegerAttr(1, I1),
        }
        return self.add(
            loop.ReduceOp.create(properties=props, result_types=[element], regions=[Region(block)])
        )


def view_map(op: Operation) -> IndexMap | None:
    """The index map of a layout-only op, or None for ops that compute."""
    if isinstance(op, graph.TransposeOp):
        return _transpose_map(op.permutation())
    if isinstance(op, graph.BroadcastOp):
        return _broadcast_map(shape_of(op.input.type), shape_of(op.result.type))
    if isinstance(op, graph.ReshapeOp):
        return _reshape_map(shape_of(op.input.type), shape_of(op.result.type))
    if isinstance(op, graph.SliceOp):
        start, _, step = op.slice_bounds()
        return _slice_map(start, step)
    return None


COMPOSITE_OPS = graph.COMPOSITE_OPS


def _not_decomposed(op: Operation) -> IrcError:
    return IrcError.at(
        op_location(op),
        f"{op.name} must be decomposed before graph-to-loop (run decompose first)",
    )


class FunctionLowering:
    """Lowers one graph function into a loop function over memrefs."""

    def __init__(self, fn: func.FuncOp, counter: count[int]):
        self.fn = fn
        self.counter = counter
        self.access: dict[SSAValue, Access] = {}
        arg_types = [memref_of(a.type) for a in fn.body.block.args]
        self.block = Block(arg_types=arg_types)
        for old, new in zip(fn.body.block.args, self.block.args, strict=True):
            self.access[old] = Buffer(new)
            if old.name_hint:
                set_value_name(new, old.name_hint)
        self.store_as: dict[SSAValue, SSAValue] = {}
        """A kernel's output -> the returned reshape of it that its buffer is laid out as."""

    def lower(self) -> func.FuncOp:
        ops = list(self.fn.body.block.ops)
        ret = ops[-1]
        assert isinstance(ret, func.ReturnOp)
        self.store_as = returned_reshapes(ret)
        for op in ops[:-1]:
            self.lower_op(op)
        views = returned_views(ret)
        results = [self.returned(v, views.get(v)) for v in ret.operands]
        self.block.add_op(func.ReturnOp(*results))
        out_types = [r.type for r in results]
        new = func.FuncOp(
            self.fn.sym_name.data,
            FunctionType.from_lists(list(self.block.arg_types), out_types),
            Region(self.block),
        )
        new.location = self.fn.location
        return new

    def lower_op(self, op: Operation) -> None:
        if op.results and op.results[0] in self.access:
            return  # a returned reshape: its kernel stored it in place (`returned_reshapes`)
        view = view_map(op)
        if view is not None:
            self.access[op.results[0]] = View(op.operands[0], view)
        elif isinstance(op, graph.ConstantOp):
            self.access[op.results[0]] = Splat(op.value)  # type: ignore[arg-type]
        elif isinstance(op, graph.IotaOp):
            self.access[op.results[0]] = Iota(op.axis())
        elif isinstance(op, graph.FusedOp):
            self.fused(op)
        elif isinstance(op, COMPOSITE_OPS):
            raise _not_decomposed(op)
        else:
            self.kernel([op], list(op.results))

    def fused(self, op: graph.FusedOp) -> None:
        """One kernel for a fusion group: its region's ops, its yields as outputs."""
        block = op.body.block
        for arg, operand in zip(block.args, op.inputs, strict=True):
            self.access[arg] = self.access[operand]
        members = [o for o in block.ops if not isinstance(o, graph.YieldOp)]
        for o in members:
            if isinstance(o, COMPOSITE_OPS):
                raise _not_decomposed(o)
        last = block.last_op
        assert isinstance(last, graph.YieldOp)
        outputs = list(last.values)
        if not outputs:
            return  # a group of dead ops: nothing to compute, no kernel
        for result, inner in zip(op.results, outputs, strict=True):
            if result in self.store_as:
                self.store_as[inner] = self.store_as[result]
        name = op.kernel.data if isinstance(op.kernel, StringAttr) else None
        kind = op.kernel_kind()  # as fuse decided it
        if kind is KernelKind.REDUCTION:
            self.rows_kernel(members, outputs, name, op.row_geometry())
        elif kind is KernelKind.ATTENTION:
            attention_kernel(self, members, outputs, name)
        else:
            self.kernel(members, outputs, name, kind)
        for result, inner in zip(op.results, outputs, strict=True):
            self.access[result] = self.access[inner]

    def rows_kernel(
        self,
        members: list[Operation],
        outputs: list[SSAValue],
        name: str | None,
        geometry: RowGeometry,
    ) -> None:
        """A kernel over the rows of its reductions (`geometry`, the rows fusion
        judged the group on).

        Reductions are computed first, once per row; row-shaped outputs are
        stored per row; full-shaped outputs in one `loop.foreach` over the
        reduced dims (the reduction epilogue).
        """
        reductions = [o for o in members if isinstance(o, graph.ReduceOp)]
        full, dims = geometry.space, geometry.dims
        rows = list(geometry.row)
        row_keep = geometry.row_keep
        body = Block(arg_types=[INDEX] * len(rows))
        kb = KernelBuilder(self, body, set(members))
        pivs = list(body.args)

        def row_index(shape: tuple[int, ...]) -> list[SSAValue]:
            if len(shape) == len(full) and shape == row_keep:
                it = iter(pivs)
                return [kb.index_const(0) if d in dims else next(it) for d in range(len(full))]
            return list(pivs)

        bufs = [self.alloc(v) for v in outputs]
        for r in reductions:
            kb.value_at(r.results[0], row_index(shape_of(r.results[0].type)))
        full_outputs: list[tuple[SSAValue, SSAValue]] = []
        for v, buf in zip(outputs, bufs, strict=True):
            shape = shape_of(v.type)
            if shape in (row_keep, tuple(rows)):
                self.store(kb, v, buf, row_index(shape))
            else:
                full_outputs.append((v, buf))
        if full_outputs:
            reduced = list(geometry.reduced)
            with kb.region(len(reduced)) as (fblock, rivs):
                pit, rit = iter(pivs), iter(rivs)
                idx = [next(rit) if d in dims else next(pit) for d in range(len(full))]
                for v, buf in full_outputs:
                    self.store(kb, v, buf, idx)
            kb.add(
                loop.ForeachOp.create(
                    properties={"bounds": int_array(reduced)}, regions=[Region(fblock)]
                )
            )
        self.add_kernel(members, body, rows, name, KernelKind.REDUCTION)
        self.bind_outputs(outputs, bufs)

    @staticmethod
    def reshaped_index(
        kb: KernelBuilder, src: Sequence[int], dst: Sequence[int], idx: list[SSAValue]
    ) -> list[SSAValue]:
        """The index into a `src`-shaped value of element `idx` of its row-major
        reshape to `dst` (for lowerings of other kernel kinds)."""
        return _reshape_map(src, dst)(kb, idx)

    def builder(self, body: Block, members: set[Operation]) -> KernelBuilder:
        """A builder of one kernel's body (for lowerings of other kernel kinds)."""
        return KernelBuilder(self, body, members)

    def alloc(self, v: SSAValue) -> SSAValue:
        """The buffer a kernel stores `v` in: shaped as its returned reshape, if any."""
        shaped = self.store_as.get(v, v)
        alloc = loop.AllocOp.create(result_types=[memref_of(shaped.type)])
        self.block.add_op(alloc)
        return alloc.result

    def store(self, kb: KernelBuilder, v: SSAValue, buf: SSAValue, idx: list[SSAValue]) -> None:
        """Stores `v[idx]` in `buf`; at the reshaped index where `buf` is `v` reshaped
        (row-major: the same element offset, so the store is as contiguous)."""
        value = kb.value_at(v, idx)
        shaped = self.store_as.get(v)
        if shaped is not None:
            idx = _reshape_map(shape_of(shaped.type), shape_of(v.type))(kb, idx)
        kb.add(loop.StoreOp.create(operands=[value, buf, *idx]))

    def bind_outputs(self, outputs: Sequence[SSAValue], bufs: Sequence[SSAValue]) -> None:
        """Kernel outputs are their buffers, or views of their returned reshapes."""
        for v, buf in zip(outputs, bufs, strict=True):
            shaped = self.store_as.get(v)
            if shaped is None:
                self.access[v] = Buffer(buf)
            else:
                self.access[shaped] = Buffer(buf)
                self.access[v] = View(shaped, _reshape_map(shape_of(shaped.type), shape_of(v.type)))

    def add_kernel(
        self,
        members: list[Operation],
        body: Block,
        bounds: Sequence[int],
        name: str | None,
        kind: KernelKind,
    ) -> None:
        """Adds the loop.kernel, with the kind decided for it (by fuse, or for an
        unfused op by the same `kind_of_ops`) carried on for the passes after."""
        if name is None:
            ops_named = [
                o.name.removeprefix("graph.").removeprefix("reduce_") for o in members
            ] or ["copy"]
            name = f"{NAME_PREFIX[kind]}_{'_'.join(ops_named)}_{next(self.counter)}"
        kernel = loop.KernelOp.create(
            properties={
                "name": StringAttr(name),
                "bounds": int_array(bounds),
                "kind": StringAttr(kind),
            },
            regions=[Region(body)],
        )
        kernel.location = members[-1].location if members else self.fn.location
        self.block.add_op(kernel)

    def returned(self, v: SSAValue, view: tuple[SSAValue, list[Operation]] | None) -> SSAValue:
        """The buffer returned for `v`: where `v` is a view of a kernel's output
        (`returned_views`) that strides can express, a `loop.view` of that kernel's
        buffer; else a buffer holding `v` (`materialize`)."""
        access = self.access[v]
        if view is not None and not isinstance(access, Buffer):
            base, chain = view
            under = self.access[base]
            strided = view_strides(shape_of(base.type), chain)
            if isinstance(under, Buffer) and under.memref not in self.block.args and strided:
                strides, offset = strided
                props: dict[str, Attribute] = {"strides": int_array(strides)}
                if offset:
                    props["offset"] = IntegerAttr(offset, i64)
                op = loop.ViewOp.create(
                    operands=[under.memref], properties=props, result_types=[memref_of(v.type)]
                )
                self.block.add_op(op)
                return op.result
        return self.materialize(v)

    def materialize(self, v: SSAValue) -> SSAValue:
        """A buffer holding `v`: views and constants that are returned get a copy kernel."""
        access = self.access[v]
        if isinstance(access, Buffer):
            return access.memref
        self.kernel([], [v])
        access = self.access[v]
        assert isinstance(access, Buffer)
        return access.memref

    def kernel(
        self,
        members: list[Operation],
        outputs: list[SSAValue],
        name: str | None = None,
        kind: KernelKind | None = None,
    ) -> None:
        """One loop.kernel computing `outputs` over their (common) shape; `kind`
        is the group's, else that of `members` (one unfused op, or a copy)."""
        shape = shape_of(outputs[0].type)
        for v in outputs[1:]:
            # Stored over another output's space, it would be written out of bounds.
            if shape_of(v.type) != shape:
                raise ValueError(
                    f"kernel {name or ''} has outputs of shapes {list(shape)} and "
                    f"{list(shape_of(v.type))}: one loop nest cannot store both"
                )
        bufs = [self.alloc(v) for v in outputs]
        body = Block(arg_types=[INDEX] * len(shape))
        kb = KernelBuilder(self, body, set(members))
        idx = list(body.args)
        for v, buf in zip(outputs, bufs, strict=True):
            self.store(kb, v, buf, idx)
        self.add_kernel(members, body, shape, name, kind or kind_of_ops(members))
        self.bind_outputs(outputs, bufs)


def returned_reshapes(ret: func.ReturnOp) -> dict[SSAValue, SSAValue]:
    """Kernel outputs whose buffer can be laid out as a returned reshape of them.

    A row-major reshape changes no element's offset: the kernel that computes
    `v` can store it straight into the buffer of `reshape(v)`, which is then
    returned without a copy kernel (reshapes are views). Not for a function's
    arguments or constants (they have no kernel), nor when `v` itself, or
    another reshape of it, is returned too (one buffer cannot have two shapes).
    """
    base_of: dict[SSAValue, SSAValue] = {}
    for r in ret.operands:
        v = r
        while isinstance(v.owner, graph.ReshapeOp):
            v = v.owner.operands[0]
        if (
            v is not r
            and isinstance(v.owner, Operation)
            and not isinstance(v.owner, (*VIEW_OPS, graph.ConstantOp))
        ):
            base_of[r] = v
    returned = set(ret.operands)
    out: dict[SSAValue, SSAValue] = {}
    for r, v in base_of.items():
        if v not in returned and sum(1 for v2 in base_of.values() if v2 is v) == 1:
            out[v] = r
    return out


def returned_views(ret: func.ReturnOp) -> dict[SSAValue, tuple[SSAValue, list[Operation]]]:
    """Returned views (transposes, broadcasts, reshapes, slices, one or several in a
    row) of values that no other returned value is or is a view of: each -> the value
    under them and the view ops from it outward. Where that value is a kernel's output
    (graph-to-loop knows once it is lowered), the view is returned as a view of the
    kernel's buffer (`loop.view`), no copy kernel, as torch's `exp(x).T` or
    `x.sum(1, keepdim=True).expand(n, m)` is a view too. A returned view never aliases
    another output or an input."""
    found: dict[SSAValue, tuple[SSAValue, list[Operation]]] = {}
    for r in ret.operands:
        v, chain = r, list[Operation]()
        while isinstance(v.owner, VIEW_OPS):
            chain.append(v.owner)
            v = v.owner.operands[0]
        if chain and not isinstance(v.owner, graph.ConstantOp):
            found[r] = (v, chain[::-1])
    bases = [base for base, _ in found.values()]
    returned = set(ret.operands)
    return {
        r: (base, chain)
        for r, (base, chain) in found.items()
        if base not in returned and bases.count(base) == 1
    }


def view_strides(shape: Sequence[int], chain: Sequence[Operation]) -> tuple[list[int], int] | None:
    """The strides and offset, in elements of a row-major buffer of `shape`, of the
    view `chain` makes of it (view ops, innermost first); None where one is a reshape
    of elements not laid out row-major (not a view in torch either)."""
    sizes, strides, offset = list(shape), _strides(shape), 0
    for op in chain:
        out = list(shape_of(op.results[0].type))
        if isinstance(op, graph.TransposeOp):
            perm = op.permutation()
            strides = [strides[p] for p in perm]
        elif isinstance(op, graph.BroadcastOp):
            lead = len(out) - len(sizes)
            stretched = zip(sizes, strides, out[lead:], strict=True)
            strides = [0] * lead + [k if n == m else 0 for n, k, m in stretched]
        elif isinstance(op, graph.ReshapeOp):
            dense = _strides(sizes)
            if any(n > 1 and k != d for n, k, d in zip(sizes, strides, dense, strict=True)):
                return None
            strides = _strides(out)
        elif isinstance(op, graph.SliceOp):
            start, _, step = op.slice_bounds()
            offset += sum(s * k for s, k in zip(start, strides, strict=True))
            strides = [k * t for k, t in zip(strides, step, strict=True)]
        else:
            return None
        sizes = out
    return strides, offset


VIEW_OPS = graph.VIEW_OPS


def lower_module(module: ModuleOp) -> None:
    """Replaces every graph function of `module` with its loop-level form."""
    counter = count()
    for op in list(module.body.ops):
        if isinstance(op, func.FuncOp) and _is_graph_level(op):
            new = FunctionLowering(op, counter).lower()
            module.body.block.insert_op_before(new, op)
            op.detach()
            op.erase()


def _is_graph_level(fn: func.FuncOp) -> bool:
    return all(isinstance(a.type, TensorType) for a in fn.body.block.args) and not any(
        isinstance(o, loop.KernelOp) for o in fn.body.block.ops
    )


@dataclass(frozen=True)
class GraphToLoopPass(ModulePass):
    """`graph-to-loop`: graph functions become loop nests over buffers."""

    name = "graph-to-loop"
    levels = ("graph",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_module(op)


__all__ = ["GraphToLoopPass", "lower_module", "KernelBuilder", "FunctionLowering", "f64"]
