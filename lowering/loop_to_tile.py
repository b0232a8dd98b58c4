"""loop -> tile: each loop.kernel becomes a blocked tile.kernel plus a tile.launch.

The kernel's parallel indices are laid over block axes (a *layout*): one axis
of X elements for pointwise kernels; rows (X) by reduction chunk (R) for
reductions; output rows by columns for contractions, whose K loop uses one
layout per dot operand. Loop values are then translated on demand, each index
argument standing for an index block of its layout, so the same translation
serves every kind and every fused body. A `loop.softmax_reduce` (made by the
`online-softmax` pass) becomes one loop carrying a running max and sum.

This step translates and does nothing else: a value is translated once for
each loop body that uses it, and the passes after it share equal ops
(`tile-cse`), drop unused ones (`dce`) and move a persistent GEMM's epilogue
indices below its K loop (`tile-sink`).

Numerics: half-precision values are computed in f32 (rounded at explicit casts
and at stores); reductions accumulate in f32 and see the identity in masked
lanes; max/min propagate NaN; indices are 64-bit when a buffer or the grid
passes 2**31 elements.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.analysis.dot_operands import tf32_buffers, tf32_exact
from irc.analysis.reduction_groups import read_once, reduction_groups
from irc.analysis.tma import tma_pitch, wide_indices
from irc.dialects import graph, loop, tile
from irc.dialects.attrs import MAX_GRID, MAX_GRID_Y
from irc.dialects.tile import I32_MAX
from irc.ir.names import tile_kernel_name
from irc.ir.types import (
    ELEMENT_TYPES,
    F32,
    FLOAT_TYPES,
    HALF_TYPES,
    I1,
    int_array,
    numel,
)
from irc.lowering.attention_to_tile import lay_out_attention
from irc.passes.kernel_names import unique_name
from irc.passes.tile import (
    VECTOR_BYTES,
    KernelShape,
    Tiling,
    epilogue_parts,
    kernel_shape,
    run_dims,
    tiling_of,
)
from irc.syntax.diagnostics import IrcError, op_location

I32 = ELEMENT_TYPES["i32"]
I64 = ELEMENT_TYPES["i64"]
INDEX = IndexType()


def compute_type(element: Attribute) -> Attribute:
    """The type a value is computed in: f32 for half precision, else itself."""
    return F32 if element in HALF_TYPES else element


def block_type(element: Attribute, shape: Sequence[int]) -> Attribute:
    return TensorType(element, list(shape)) if shape else element


def shape_of(v: SSAValue) -> tuple[int, ...]:
    return tuple(v.type.get_shape()) if isinstance(v.type, TensorType) else ()


def element_of(v: SSAValue) -> Attribute:
    return v.type.element_type if isinstance(v.type, TensorType) else v.type


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        size = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j >= 0 and s[j] != 1:
                size = s[j]
        out.append(size)
    return tuple(out)


def identity(kind: str, element: Attribute) -> Attribute:
    if kind == "sum":
        return FloatAttr(0.0, f64) if element in FLOAT_TYPES else IntegerAttr(0, i64)
    if element in FLOAT_TYPES:
        return FloatAttr(-math.inf if kind == "max" else math.inf, f64)
    if element == I1:
        return IntegerAttr(0 if kind == "max" else 1, i64)
    bits = 64 if element == I64 else 32
    return IntegerAttr(-(2 ** (bits - 1)) if kind == "max" else 2 ** (bits - 1) - 1, i64)


def _conjuncts(mask: SSAValue) -> set[SSAValue]:
    """The values whose `and` a mask is (itself, where it is no `and`)."""
    owner = mask.owner
    if isinstance(owner, tile.ApplyOp) and owner.fn.data == "and":
        return set().union(*(_conjuncts(a) for a in owner.args))
    return {mask}


def _same_number(a: Attribute | None, b: Attribute) -> bool:
    return (
        isinstance(a, FloatAttr | IntegerAttr)
        and isinstance(b, FloatAttr | IntegerAttr)
        and a.value.data == b.value.data
    )


def neutral_outside(value: SSAValue, mask: SSAValue, neutral: Attribute) -> bool:
    """Whether `value` is already `neutral` wherever `mask` fails: a load masked at
    least as tightly whose `other` is `neutral`, through casts and through
    `where`s that give `neutral` elsewhere. A reduction then needs no `where` of
    its own on it, and that `where` cost more than its select: with it, ptxas
    issued a column sum's 16 loads a thread one at a time, each waiting for the
    add before it (32 registers, 72.7 us for a 17x3001x777 bf16 split stage on an
    H200); without it, all 16 before the adds (48 registers, 40 us)."""
    owner = value.owner
    if isinstance(owner, tile.ApplyOp) and owner.fn.data == "cast":
        return neutral_outside(owner.args[0], mask, neutral)
    if isinstance(owner, tile.ApplyOp) and owner.fn.data == "where":
        _, chosen, other = owner.args
        given = other.owner
        return (
            isinstance(given, tile.ConstantOp)
            and _same_number(given.value, neutral)
            and neutral_outside(chosen, mask, neutral)
        )
    if isinstance(owner, tile.LoadOp) and owner.mask:
        return _same_number(owner.other, neutral) and _conjuncts(mask) <= _conjuncts(owner.mask[0])
    return False


COMBINE = {op.COMBINE: op.COMBINER.FN for op in graph.REDUCE_OPS}
"""The function that accumulates each loop.reduce kind (its reduce ops' COMBINER)."""
# Half-precision ops that commute with rounding: monotone (max, min, relu) or
# sign-symmetric (neg, abs), or a choice (where), so op(round(x)) == round(op(x)).
# They take their operands before rounding and round once after (see apply_op).
ROUNDING_COMMUTES = frozenset(op.FN for op in graph.ELEMENTWISE_OPS if op.ROUNDING_COMMUTES)
EXACT = frozenset(op.FN for op in graph.ELEMENTWISE_OPS if op.EXACT)
"""Functions whose result is exactly representable (floor, max, eq...): every value of a
half type is one (rounded when made), so such a result needs no rounding of its own."""
PREDICATES = graph.PREDICATE_FUNCTIONS | {"and", "or"}
"""Functions whose result is `i1`: comparisons, and the mask logic of this level."""
INDEX_FOLDS = frozenset(
    {"floordiv", "mod"} | {op.FN for op in graph.ELEMENTWISE_OPS if op.RIGHT_IDENTITY is not None}
)
"""Index arithmetic that `iapply` builds with a constant right operand (and folds where
that is the function's RIGHT_IDENTITY, or a division by 1)."""


def half_value(x: float, element: Attribute) -> float:
    """`x` as an f16 or bf16 constant holds it (nearest even; other types: `x`).

    Half-precision values are computed in f32, so a constant must be rounded here:
    an f16 splat of 0.7 is 0.69970703125 in torch.
    """
    if element not in HALF_TYPES or math.isnan(x) or math.isinf(x):
        return x
    try:
        if element == ELEMENT_TYPES["f16"]:
            return struct.unpack("<e", struct.pack("<e", x))[0]
        bits = struct.unpack("<I", struct.pack("<f", x))[0]  # through f32, as torch does
    except OverflowError:
        return math.copysign(math.inf, x)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


@dataclass
class Scope:
    """Loop value -> tile value, plus the masks of the current layout's axes."""

    values: dict[SSAValue, SSAValue] = field(default_factory=dict[SSAValue, SSAValue])
    axis_masks: list[SSAValue | None] = field(default_factory=list[SSAValue | None])


def streamed_buffers(kernel: loop.KernelOp, shape: KernelShape) -> set[SSAValue]:
    """The input a reduction kernel streams: read once, element by element.

    A buffer as large as the kernel's iteration space whose elements the kernel
    reads once (one `loop.load`, or loads of one element in reductions that one
    loop computes, `read_once`) is streamed (more than half as large: a split
    stage pads its space to whole chunks, and evict_last there made a column
    sum's split stage 1.2x slower on an H200): no program reads its lines
    again, so its loads ask L2 to evict them first and keep the lines that are
    read again (a broadcast weight, the rows an epilogue reloads, whatever the
    kernel before left for the one after). Row sums of 128-8192 elements ran
    2-17% faster on an H100 and an H200, and faster than torch.compile, which
    does the same. Only a kernel that streams one input gets the hint: with two
    or three (mean squared error, a sum of x*y+z) evict_first was 0-2.5% slower
    on both GPUs.
    Batch-norm statistics (a mean and a mean of squares, two loads of x) ran up to
    20% faster streamed on an H200 (CUDA-graph us, evict_last / evict_first: 131 x 86
    x 2893 bf16 39.4 / 31.3, 72 x 275 x 4449 bf16 103.1 / 95.9, 65 x 403 x 1418 f32
    45.0 / 42.6, 65536 x 256 f32 over rows 22.9 / 21.2); inputs that fit in L2, timed
    again and again with nothing between, lose what evict_last kept there (76 x 193 x
    794 f32, 47 MB, 9.6 / 13.0, torch.compile 18.0), and win where timing flushes L2
    between runs (21.2 / 18.7).
    """
    if shape.kind != "reduction":
        return set()
    loads: dict[SSAValue, list[loop.LoadOp]] = {}
    for op in kernel.body.walk():
        if isinstance(op, loop.LoadOp):
            loads.setdefault(op.buffer, []).append(op)
    space = numel(shape.parallel) * numel(shape.reduction)
    # More than half the space: no broadcast (whose operand is at most half of it),
    # and a split stage's space, padded to whole chunks, may exceed the buffer.
    streamed = {
        b
        for b, reads in loads.items()
        if 2 * numel(b.type.get_shape()) > space  # type: ignore[attr-defined]
        and read_once(reads, kernel)
    }
    return streamed if len(streamed) == 1 else set()


def combined(terms: list[tuple[SSAValue, int]]) -> list[tuple[SSAValue, int]]:
    """Terms of one value added up (first appearance keeps its place), zeros dropped."""
    out: dict[SSAValue, int] = {}
    for t, c in terms:
        out[t] = out.get(t, 0) + c
    return [(t, c) for t, c in out.items() if c != 0]


class RowPeel(NamedTuple):
    """A row held in chunks read from the 16-byte-aligned address at or before its start.

    Rows whose starts are not 16 bytes apart (a 50,257-token bf16 vocabulary) load
    a few bytes a lane: Triton vectorizes an access only where it can prove the
    address a multiple of 16 bytes. Each chunk here starts at `aligned`, `(row_start
    // granule) * granule`, which it can, and masks the lanes before `row_start` and
    past the row's end. Measured on an H100 (softmax 4096 x 50,257 bf16, rows in
    registers): 437 us as the rows start, 297 from their aligned starts; eager 393.
    A looped row masks only its first chunk and the one or two past the last whole
    one (`peeled_loop`); the loop between loads unmasked. With every chunk masked, a
    first version ran 1.4-1.5x slower than the rows as they start; so, on an H200
    (kernel time, us, as they start / peeled, each at the tiling its rule takes):
    softmax 6320 x 75,945 bf16 937.5 / 840.9 (eager 928.8), 333 x 100,003 f32 143.5
    / 122.2, logsumexp 4096 x 100,003 bf16 492.5 / 341.7. (`KernelShape.row_granule`
    says where it applies; `PEELED_ROW_THREAD_ELEMENTS` how wide the steps are.)"""

    granule: int
    row_start: SSAValue
    aligned: SSAValue
    row_terms: list[tuple[SSAValue, int]]
    """`row_start` as the kept indices' terms (`KernelTranslator.row_terms`)."""


class TmaOperand(NamedTuple):
    """A dot operand TMA fetches: its load, whether its buffer holds it transposed,
    the rows and columns of the buffer it reads and the buffer's row length."""

    load: loop.LoadOp
    transposed: bool
    extent: tuple[int, int]
    pitch: int


class KernelTranslator:
    """Builds one tile.kernel from one loop.kernel."""

    def __init__(
        self,
        kernel: loop.KernelOp,
        name: str,
        tf32: bool = False,
        tf32_buffers: frozenset[SSAValue] = frozenset(),
        role: str = "whole",
        workspace: SSAValue | None = None,
    ):
        self.kernel = kernel
        self.tf32_buffers = tf32_buffers
        """The function's buffers whose values TF32 holds exactly (`tf32_buffers`)."""
        self.name = name
        self.role = role
        """A GEMM with a split tail (`tile.tail_split`) makes three kernels: `main`
        (the persistent programs, the tiles before the tail), `partial` (the tail's
        K chunks) and `fixup` (their sums and the epilogue); `whole` otherwise."""
        self.workspace = workspace
        """The tail's partial tiles, [T S BM, BN] in the accumulator's type (`partial`
        and `fixup`)."""
        self.memrefs: list[SSAValue] = []
        for op in kernel.body.walk():
            if isinstance(op, loop.LoadOp | loop.StoreOp):
                if op.buffer not in self.memrefs:
                    self.memrefs.append(op.buffer)
        if workspace is not None:
            self.memrefs.append(workspace)
        arg_types = [tile.PtrType(m.type.element_type) for m in self.memrefs]  # type: ignore[attr-defined]
        self.body = Block(arg_types=arg_types)
        self.ptr = dict(zip(self.memrefs, self.body.args, strict=True))
        self.blocks = [self.body]
        self.scopes = [Scope()]
        self.constants: dict[SSAValue, int] = {}
        # Index block -> (flat index F, div, mod): the block is (F // div) % mod.
        self.digits: dict[SSAValue, tuple[SSAValue, int, int | None]] = {}
        # Index sum -> its terms (value, coefficient), values that are no sums
        # themselves: `refold` sees through the row-major linearization the loop IR
        # writes for a reshape (`i * m + j` of the digits of one flat index).
        self.sums: dict[SSAValue, list[tuple[SSAValue, int]]] = {}
        self.const_cache: dict[tuple[int | float, Attribute], SSAValue] = {}
        self.shape = kernel_shape(kernel)
        self.tiling = tiling_of(kernel)
        self.streamed = streamed_buffers(kernel, self.shape)
        self.together = {
            op: group for group in reduction_groups(kernel) if len(group) > 1 for op in group
        }
        """Each reduction that one loop computes with others, to its group (whose
        results `value` binds all at once)."""
        self.tf32 = tf32
        self.fast_ops: dict[Operation, str] = {}
        """Ops of the loop IR emitted as a faster, less accurate function (an
        attention's probabilities' exp as `fast_exp`: they are only summed)."""
        sizes = [numel(m.type.get_shape()) for m in self.memrefs]  # type: ignore[attr-defined]
        # A loop past i32 (a reduction or K of 2**31 elements or more) indexes in i64 too.
        space = max(numel(self.shape.parallel), numel(self.shape.reduction))
        self.index = I64 if wide_indices(sizes, space) else I32
        self.grid: list[int] = [1]
        self.tma = False  # TMA block loads/stores (persistent GEMMs)
        self.peel: RowPeel | None = None  # a chunked row read from its aligned start
        self.chunk_limit: SSAValue | None = None  # a ragged split chunk's rows (`ragged_chunk`)
        self.positions: dict[frozenset[tuple[SSAValue, int]], SSAValue] = {}
        """Peeled chunks' element offsets by their terms (`bind_peeled`): a load or store
        at those terms takes that very value, whose mask bounds it."""
        self.row_iv: SSAValue | None = None  # a contraction's output row and column indices
        self.col_iv: SSAValue | None = None

    # -- building blocks --

    def add(self, op: Operation) -> SSAValue:
        """Appends `op` to the block being built; returns its first result.

        Equal ops are made as often as the loop IR asks for them: `tile-cse`
        shares them afterwards (loads included, which are pure in a tile.kernel).
        """
        self.blocks[-1].add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def const(self, value: int | float, element: Attribute) -> SSAValue:
        """A scalar constant, made once per kernel at its top."""
        key = (value, element)
        if key in self.const_cache:
            return self.const_cache[key]
        attr: Attribute = (
            FloatAttr(float(value), f64) if element in FLOAT_TYPES else IntegerAttr(int(value), i64)
        )
        op = tile.ConstantOp.create(properties={"value": attr}, result_types=[element])
        if self.body.first_op is None:
            self.body.add_op(op)
        else:
            self.body.insert_op_before(op, self.body.first_op)
        v = op.result
        if isinstance(value, int):
            self.constants[v] = value
        self.const_cache[key] = v
        return v

    def full(self, value: Attribute, element: Attribute, shape: Sequence[int]) -> SSAValue:
        return self.add(
            tile.ConstantOp.create(
                properties={"value": value}, result_types=[block_type(element, shape)]
            )
        )

    def apply(
        self, fn: str, args: Sequence[SSAValue], element: Attribute | None = None
    ) -> SSAValue:
        if fn == "cast" and element in HALF_TYPES:
            widened = args[0].owner
            if (
                isinstance(widened, tile.ApplyOp)
                and widened.fn.data == "cast"
                and element_of(widened.args[0]) == element
            ):
                return widened.args[0]  # widening a half value is exact: narrowing gives it back
        shape = broadcast(*(shape_of(a) for a in args))
        if element is None:
            element = I1 if fn in PREDICATES else element_of(args[-1])
        return self.add(
            tile.ApplyOp.create(
                operands=list(args),
                result_types=[block_type(element, shape)],
                properties={"fn": loop.apply_fn(fn)},
            )
        )

    def iapply(self, fn: str, a: SSAValue, b: int) -> SSAValue:
        """Index arithmetic with a constant, folding the trivial cases.

        Quotients and remainders are remembered as digits `(F // div) % mod`
        of a flat index F, so that `refold` can put a row-major sum of them
        back together.
        """
        op = graph.FUNCTION_OPS.get(fn)
        if op is not None and b == op.RIGHT_IDENTITY or fn == "floordiv" and b == 1:
            return a
        v = self.apply(fn, [a, self.const(b, self.index)])
        if fn == "mul":
            self.sums[v] = [(t, c * b) for t, c in self.terms_of(a)]
        flat, div, mod = self.digits.get(a, (a, 1, None))
        if fn == "floordiv" and mod is None:
            self.digits[v] = (flat, div * b, None)
        elif fn == "mod" and mod is None:
            self.digits[v] = (flat, div, b)
        return v

    def arange(self, size: int) -> SSAValue:
        r = self.add(
            tile.ArangeOp.create(
                properties={"size": IntegerAttr(size, i64)}, result_types=[TensorType(I32, [size])]
            )
        )
        return r if self.index == I32 else self.apply("cast", [r], self.index)

    def expand(self, v: SSAValue, axis: int) -> SSAValue:
        shape = list(shape_of(v))
        shape.insert(axis, 1)
        return self.add(
            tile.ExpandDimsOp.create(
                operands=[v],
                properties={"axis": IntegerAttr(axis, i64)},
                result_types=[block_type(element_of(v), shape)],
            )
        )

    def broadcast_to(self, v: SSAValue, shape: tuple[int, ...]) -> SSAValue:
        if shape_of(v) == shape:
            return v
        return self.add(
            tile.BroadcastToOp.create(operands=[v], result_types=[block_type(element_of(v), shape)])
        )

    def program_id(self, axis: int) -> SSAValue:
        pid = self.add(
            tile.ProgramIdOp.create(properties={"axis": IntegerAttr(axis, i64)}, result_types=[I32])
        )
        return pid if self.index == I32 else self.apply("cast", [pid], self.index)

    def grid_2d(self, first: int, second: int) -> tuple[SSAValue, SSAValue]:
        """Program ids along two axes of `first` and `second` programs: a 2-d grid,
        or one axis of `first * second` where `second` passes CUDA's limit on a
        grid's second axis (a batched matmul or an attention of 65,536 batches)."""
        if second <= MAX_GRID_Y:
            self.grid = [first, second]
            return self.program_id(0), self.program_id(1)
        self.grid = [first * second]
        pid = self.program_id(0)
        return self.iapply("mod", pid, first), self.iapply("floordiv", pid, first)

    def mask_below(self, v: SSAValue, bound: int, block: int) -> SSAValue | None:
        """`v < bound`, or None when every lane is in range by construction."""
        if bound % block == 0:
            return None
        return self.apply("lt", [v, self.const(bound, self.index)])

    def unravel(self, flat: SSAValue, bounds: Sequence[int]) -> list[SSAValue]:
        """Row-major multi-index of a flat index block."""
        out: list[SSAValue] = []
        stride = numel(bounds)
        for d, size in enumerate(bounds):
            stride //= size
            if size == 1:
                out.append(self.const(0, self.index))
                continue
            v = self.iapply("floordiv", flat, stride) if stride != 1 else flat
            if d > 0:
                v = self.iapply("mod", v, size)
            out.append(v)
        return out

    @contextmanager
    def scope(
        self, axis_masks: list[SSAValue | None] | None = None, block: Block | None = None
    ) -> Iterator[Scope]:
        s = Scope(
            axis_masks=list(axis_masks if axis_masks is not None else self.scopes[-1].axis_masks)
        )
        self.scopes.append(s)
        if block is not None:
            self.blocks.append(block)
        try:
            yield s
        finally:
            self.scopes.pop()
            if block is not None:
                self.blocks.pop()

    def bind(self, loop_value: SSAValue, tile_value: SSAValue) -> None:
        self.scopes[-1].values[loop_value] = tile_value

    def lookup(self, v: SSAValue) -> SSAValue | None:
        for s in reversed(self.scopes):
            if v in s.values:
                return s.values[v]
        return None

    def mask_for(self, shape: tuple[int, ...]) -> SSAValue | None:
        masks = self.scopes[-1].axis_masks
        mask: SSAValue | None = None
        if len(shape) != len(masks):
            return None
        for d, size in enumerate(shape):
            m = masks[d]
            if size > 1 and m is not None:
                mask = m if mask is None else self.apply("and", [mask, m])
        return mask

    # -- the kernel --

    def build(self) -> tile.KernelOp:
        kind = self.shape.kind
        rows = kind == "reduction" and not self.shape.columns
        persistent = self.tiling.persistent and (
            rows or (kind == "contraction" and len(self.shape.parallel) == 2)
        )
        if self.role in ("partial", "fixup"):
            persistent = False
            self.tail_partials() if self.role == "partial" else self.tail_fixup()
        elif persistent and rows:
            self.persistent_rows()
        elif persistent:
            self.persistent_tiles()
        else:
            if kind == "pointwise" and len(self.tiling.block) == 2:
                self.layout_pointwise_2d()
            elif kind == "pointwise":
                self.layout_pointwise()
            elif kind == "reduction" and self.shape.columns:
                self.layout_columns()
            elif kind == "reduction":
                self.layout_rows()
            elif kind == "attention":
                lay_out_attention(self)
            else:
                self.layout_contraction()
            self.statements(self.kernel.body.block)
        if self.grid[0] > MAX_GRID:
            raise IrcError.at(
                op_location(self.kernel),
                f"kernel {self.name} would launch {self.grid[0]} programs of block "
                f"{list(self.tiling.block)}; a CUDA grid holds at most {MAX_GRID} (no GPU "
                "holds a tensor this large)",
            )
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(self.name),
            "grid": int_array(self.grid),
            "warps": IntegerAttr(self.tiling.warps, i64),
        }
        if self.tiling.stages > 1:
            props["stages"] = IntegerAttr(self.tiling.stages, i64)
        if persistent:
            props["persistent"] = IntegerAttr(1, i64)
        k = tile.KernelOp.create(properties=props, regions=[Region(self.body)])
        k.location = self.kernel.location
        return k

    def statements(self, block: Block) -> None:
        """Translates the side effects of a loop body in order; values follow on demand."""
        parts = self.epilogue_parts(block)
        if parts > 1:
            self.epilogue_in_parts(block, parts)
            return
        for op in block.ops:
            if isinstance(op, loop.StoreOp):
                self.store(op)
            elif isinstance(op, loop.ForeachOp):
                self.foreach(op)
            elif isinstance(op, loop.REDUCING_LOOPS):
                # Per-row values are made where the loop IR puts them, before
                # any inner loop that reads them.
                self.value(op.results[0])

    def layout_pointwise(self) -> None:
        (xb,) = self.tiling.block
        n = numel(self.shape.parallel)
        self.grid = [math.ceil(n / xb)]
        x = self.apply("add", [self.iapply("mul", self.program_id(0), xb), self.arange(xb)])
        self.scopes[-1].axis_masks = [self.mask_below(x, n, xb)]
        for iv, v in zip(
            self.kernel.body.block.args, self.unravel(x, self.shape.parallel), strict=True
        ):
            self.bind(iv, v)

    def layout_pointwise_2d(self) -> None:
        """A transposing element-wise kernel: a 2-d tile over dim `a` (the one a
        transposed access is contiguous along; block axis 0) and the last dim
        (axis 1); the other dims are one index a program.

        Programs walk the last dim's tiles first, then `a`'s, then the rest:
        `pid = (rest * tiles_a + tile_a) * tiles_b + tile_b`.
        """
        ab, bb = self.tiling.block
        bounds = self.shape.parallel
        a = self.shape.across if self.shape.across >= 0 else len(bounds) - 2
        last = len(bounds) - 1
        rest = [d for d in range(len(bounds)) if d not in (a, last)]
        tiles_a, tiles_b = math.ceil(bounds[a] / ab), math.ceil(bounds[last] / bb)
        self.grid = [tiles_a * tiles_b * numel([bounds[d] for d in rest])]
        pid = self.program_id(0)
        tile_b = self.iapply("mod", pid, tiles_b) if tiles_b > 1 else self.const(0, self.index)
        upper = self.iapply("floordiv", pid, tiles_b)
        tile_a = self.iapply("mod", upper, tiles_a) if tiles_a > 1 else self.const(0, self.index)
        outer = self.iapply("floordiv", upper, tiles_a)
        ia = self.apply("add", [self.iapply("mul", tile_a, ab), self.arange(ab)])
        ib = self.apply("add", [self.iapply("mul", tile_b, bb), self.arange(bb)])
        ia, ib = self.expand(ia, 1), self.expand(ib, 0)
        self.scopes[-1].axis_masks = [
            self.mask_below(ia, bounds[a], ab),
            self.mask_below(ib, bounds[last], bb),
        ]
        values = dict(zip(rest, self.unravel(outer, [bounds[d] for d in rest]), strict=True))
        values[a], values[last] = ia, ib
        for d, iv in enumerate(self.kernel.body.block.args):
            self.bind(iv, values[d])

    def layout_rows(self, row_id: SSAValue | None = None) -> None:
        """Rows `row_id * xb ...` (the program id unless persistent) across axis 0."""
        xb, rb = self.tiling.block
        n = numel(self.shape.parallel)
        self.grid = [math.ceil(n / xb)]
        a_program_a_row = row_id is None and xb == 1
        row_id = self.program_id(0) if row_id is None else row_id
        x = self.apply("add", [self.iapply("mul", row_id, xb), self.arange(xb)])
        x = self.expand(x, 1)
        self.scopes[-1].axis_masks = [self.mask_below(x, n, xb), None]
        for iv, v in zip(
            self.kernel.body.block.args, self.unravel(x, self.shape.parallel), strict=True
        ):
            self.bind(iv, v)
        self.rbase = self.expand(self.arange(rb), 0)
        granule = self.shape.row_granule
        # Chunks narrower than a granule could not load 16 bytes a lane anyway.
        if granule and a_program_a_row and granule <= rb < numel(self.shape.reduction):
            row_start = self.iapply("mul", x, numel(self.shape.reduction))
            aligned = self.iapply("mul", self.iapply("floordiv", row_start, granule), granule)
            self.peel = RowPeel(granule, row_start, aligned, self.row_terms())

    def row_terms(self) -> list[tuple[SSAValue, int]]:
        """A row's offset in a `[*parallel, R]` buffer as the terms `offsets` expands
        the bound kept indices to: a peeled row's index carries them negated, so that
        an access's offset cancels to the chunk's position."""
        r = numel(self.shape.reduction)
        parallel = self.shape.parallel
        terms = [
            (self.value(iv), numel(parallel[d + 1 :]) * r)
            for d, iv in enumerate(self.kernel.body.block.args)
            if parallel[d] != 1
        ]
        return combined([(a, c * k) for t, k in terms for a, c in self.terms_of(t)])

    def layout_columns(self) -> None:
        """A column reduction: axis 0 runs along the innermost kept dim (contiguous in
        memory, so loads are coalesced along it) and the kept dims the tile pass
        folded in with it (`column_lanes`: one flat index, unravelled), axis 1
        along the reduced dims.

        Programs take `xb`-wide tiles of the flat index, in order, then the outer
        kept dims (a split reduction's chunk first): `pid = outer * tiles + tile`.
        """
        xb, rb = self.tiling.block
        parallel = self.shape.parallel
        folded = next(
            k for k in range(1, len(parallel) + 1) if numel(parallel[-k:]) == self.shape.columns
        )
        outer, lanes = parallel[:-folded], parallel[-folded:]
        inner = self.shape.columns
        tiles = math.ceil(inner / xb)
        self.grid = [tiles * numel(outer)]
        pid = self.program_id(0)
        if outer:
            tile_id = self.iapply("mod", pid, tiles) if tiles > 1 else self.const(0, self.index)
            outer_ivs = self.unravel(self.iapply("floordiv", pid, tiles), outer)
        else:
            tile_id, outer_ivs = pid, []
        x = self.apply("add", [self.iapply("mul", tile_id, xb), self.arange(xb)])
        x = self.expand(x, 1)
        self.scopes[-1].axis_masks = [self.mask_below(x, inner, xb), None]
        lane_ivs = self.unravel(x, lanes)
        for iv, v in zip(self.kernel.body.block.args, [*outer_ivs, *lane_ivs], strict=True):
            self.bind(iv, v)
        self.rbase = self.expand(self.arange(rb), 0)

    def layout_contraction(
        self, tile_id: SSAValue | None = None, out_id: SSAValue | None = None
    ) -> None:
        """Output tile `tile_id` (the program id unless persistent) in grouped order.

        A persistent kernel passes the same index twice: `tile_id` places the K
        loop's operand tiles, `out_id` (a separate counter) the epilogue, so that
        Triton's pipeliner need not keep one tile's indices alive into the next.
        """
        bm, bn, _ = self.tiling.block
        *batch, m, n = self.shape.parallel
        gm, gn = math.ceil(m / bm), math.ceil(n / bn)
        if tile_id is None:
            tile_id, batch_id = self.grid_2d(gm * gn, numel(batch))
        else:  # persistent: one tile a step, no batch
            self.grid = [gm * gn]
            batch_id = None
        pid_m, pid_n = self.grouped_order(tile_id, gm, gn)
        self.row_start = self.iapply("mul", pid_m, bm)
        self.col_start = self.iapply("mul", pid_n, bn)
        if out_id is not None:
            pid_m, pid_n = self.grouped_order(out_id, gm, gn)
        self.out_row_start = self.iapply("mul", pid_m, bm)
        self.out_col_start = self.iapply("mul", pid_n, bn)
        self.out_cols = bn  # the columns the epilogue computes and stores at a time
        rm = self.expand(self.apply("add", [self.out_row_start, self.arange(bm)]), 1)
        rn = self.expand(self.apply("add", [self.out_col_start, self.arange(bn)]), 0)
        self.rows, self.cols = rm, rn
        self.row_mask = self.mask_below(rm, m, bm)
        self.col_mask = self.mask_below(rn, n, bn)
        self.scopes[-1].axis_masks = [self.row_mask, self.col_mask]
        ivs = list(self.kernel.body.block.args)
        self.row_iv, self.col_iv = ivs[-2], ivs[-1]
        batch_ivs = self.unravel(batch_id, batch) if batch and batch_id is not None else []
        for iv, v in zip(ivs, [*batch_ivs, rm, rn], strict=True):
            self.bind(iv, v)

    def persistent_tiles(self) -> None:
        """A persistent GEMM: each program walks output tiles `pid, pid + programs, ...`.

        Triton pipelines the flattened tile and K loops, so the next tile's
        loads overlap this tile's epilogue; row-major operands and outputs go
        through TMA (`block_access`).
        """
        block = Block(arg_types=[I32, I32])
        with self.scope(block=block):
            ids = list(block.args)
            if self.index != I32:
                ids = [self.apply("cast", [i], self.index) for i in ids]
            self.layout_contraction(*ids)
            self.tma = self.index == I32
            self.statements(self.kernel.body.block)
            self.add(tile.YieldOp.create(operands=[]))
        count = self.grid[0]
        if self.tiling.tail is not None:  # the tiles before the split tail
            count -= self.tiling.tail[0]
        self.grid = [count]
        self.add(
            tile.TilesOp.create(
                properties={"count": IntegerAttr(count, i64)}, regions=[Region(block)]
            )
        )

    def tail_layout(self) -> tuple[int, int, int, int]:
        """A split tail's (T, S, tiles before it, K chunk): whole K steps, S of them."""
        tail, splits = self.tiling.tail  # type: ignore[misc]
        bk = self.tiling.block[2]
        (k,) = self.shape.reduction
        steps = -(-k // bk)
        chunk = -(-steps // splits) * bk
        return tail, splits, tiles_before_tail(self.shape, self.tiling), chunk

    def workspace_offsets(self, row: SSAValue, rows: int) -> SSAValue:
        """Offsets of `rows` rows of the split tail's workspace from row `row`."""
        bn = self.tiling.block[1]
        r = self.expand(self.apply("add", [row, self.arange(rows)]), 1)
        return self.apply("add", [self.iapply("mul", r, bn), self.expand(self.arange(bn), 0)])

    def tail_partials(self) -> None:
        """A split tail's partial products: program p takes chunk p % S of the K loop of
        tile `first + p // S` and stores its f32 accumulator as tile p of the
        workspace. Operands move by TMA where they can (zero past K)."""
        tail, splits, first, chunk = self.tail_layout()
        bm = self.tiling.block[0]
        pid = self.program_id(0)
        tile_id = self.apply(
            "add", [self.iapply("floordiv", pid, splits), self.const(first, self.index)]
        )
        self.layout_contraction(tile_id, tile_id)
        self.grid = [tail * splits]
        self.tma = self.index == I32
        start = self.iapply("mul", self.iapply("mod", pid, splits), chunk)
        acc = self.accumulate(the_contraction(self.kernel), (start, chunk))
        offsets = self.workspace_offsets(self.iapply("mul", pid, bm), bm)
        assert self.workspace is not None
        self.add(tile.StoreOp.create(operands=[self.ptr[self.workspace], offsets, acc]))

    def tail_fixup(self) -> None:
        """A split tail's sums and epilogue: program p takes `TAIL_FIXUP_ROWS` rows of
        tile `first + p // (BM / rows)`, adds the S partials of them in order and runs
        the kernel's epilogue and stores on the sum, as the persistent programs do."""
        tail, splits, first, _ = self.tail_layout()
        bm, bn, bk = self.tiling.block
        m, n = self.shape.parallel
        rows = min(bm, TAIL_FIXUP_ROWS)
        parts = bm // rows
        gm, gn = math.ceil(m / bm), math.ceil(n / bn)
        pid = self.program_id(0)
        local = self.iapply("floordiv", pid, parts)
        tile_id = self.apply("add", [local, self.const(first, self.index)])
        pid_m, pid_n = self.grouped_order(tile_id, gm, gn)
        sub = self.iapply("mul", self.iapply("mod", pid, parts), rows)
        self.out_row_start = self.apply("add", [self.iapply("mul", pid_m, bm), sub])
        self.out_col_start = self.iapply("mul", pid_n, bn)
        self.out_cols = bn
        rm = self.expand(self.apply("add", [self.out_row_start, self.arange(rows)]), 1)
        rn = self.expand(self.apply("add", [self.out_col_start, self.arange(bn)]), 0)
        self.rows, self.cols = rm, rn
        self.row_mask = self.mask_below(rm, m, bm)  # the tile's rows may pass m
        self.col_mask = self.mask_below(rn, n, bn)
        self.scopes[-1].axis_masks = [self.row_mask, self.col_mask]
        self.row_iv, self.col_iv = self.kernel.body.block.args
        self.bind(self.row_iv, rm)
        self.bind(self.col_iv, rn)
        self.grid = [tail * parts]
        # The workspace row of partial s of these rows: ((local S + s) BM + sub + r).
        base = self.apply("add", [self.iapply("mul", local, splits * bm), sub])
        red = the_contraction(self.kernel)
        element = accumulator_type(red.result.type)
        init = self.full(FloatAttr(0.0, f64), element, (rows, bn))
        block = self.loop_block(splits, 1, [init.type])
        with self.scope(block=block):
            s = self.loop_index(block)
            offsets = self.workspace_offsets(
                self.apply("add", [base, self.iapply("mul", s, bm)]), rows
            )
            assert self.workspace is not None
            part = self.add(
                tile.LoadOp.create(
                    operands=[self.ptr[self.workspace], offsets],
                    result_types=[block_type(element, (rows, bn))],
                )
            )
            self.add(tile.YieldOp.create(operands=[self.apply("add", [block.args[1], part])]))
        (acc,) = self.for_loop(block, [init], splits, 1)
        self.bind(red.result, self.round_to(acc, red.result.type))
        self.tiling = Tiling((rows, bn, bk), 4)  # the epilogue's, whole (`epilogue_parts`)
        self.statements(self.kernel.body.block)

    def persistent_rows(self) -> None:
        """Looped rows, persistent: each program walks row blocks `pid, pid + programs,
        ...`, so that only a program an SM holds a row at a time and the row's second
        read (the epilogue's, or the second reduction's) finds it in L2 (an autotuning
        candidate; `tile`'s `long_row_tiling` says why it is not the default)."""
        block = Block(arg_types=[I32, I32])
        with self.scope(block=block):
            row_id, _ = block.args
            if self.index != I32:
                row_id = self.apply("cast", [row_id], self.index)
            self.layout_rows(row_id)
            self.statements(self.kernel.body.block)
            self.add(tile.YieldOp.create(operands=[]))
        (count,) = self.grid
        self.add(
            tile.TilesOp.create(
                properties={"count": IntegerAttr(count, i64)}, regions=[Region(block)]
            )
        )

    def block_access(
        self,
        access: loop.LoadOp | loop.StoreOp,
        indices: tuple[SSAValue | None, SSAValue | None],
        extent: tuple[int, int],
    ) -> int | None:
        """The row length of the 2-d row-major buffer `access` touches at loop `indices`
        where a tile of it is a TMA box (its rows 16-byte aligned, the first
        `extent[1]` columns of each read, `tma_pitch`), else None."""
        if not self.tma or tuple(access.indices) != indices:
            return None
        shape = tuple(access.buffer.type.get_shape())  # type: ignore[attr-defined]
        return tma_pitch(shape, access.buffer.type.element_type, extent)  # type: ignore[attr-defined]

    def grouped_order(
        self, pid: SSAValue, gm: int, gn: int, group: int = 8
    ) -> tuple[SSAValue, SSAValue]:
        """Output tile (row, column) of a program, in groups of `group` rows.

        Consecutive programs then share the same few rows of A and columns of
        B, which keeps them in L2 (the ordering of Triton's matmul tutorial).
        """
        if gn == 1:
            return pid, self.const(0, self.index)
        if gm <= group:
            return self.iapply("mod", pid, gm), self.iapply("floordiv", pid, gm)
        in_group = group * gn
        first_m = self.iapply("mul", self.iapply("floordiv", pid, in_group), group)
        size_m = self.apply(
            "minimum",
            [
                self.apply("sub", [self.const(gm, self.index), first_m]),
                self.const(group, self.index),
            ],
        )
        local = self.iapply("mod", pid, in_group)
        pid_m = self.apply("add", [first_m, self.apply("mod", [local, size_m])])
        pid_n = self.apply("floordiv", [local, size_m])
        return pid_m, pid_n

    # -- values --

    def value(self, v: SSAValue) -> SSAValue:
        found = self.lookup(v)
        if found is not None:
            return found
        op = v.owner
        assert isinstance(op, Operation), f"unbound loop index {v}"
        if isinstance(op, loop.SoftmaxReduceOp):
            self.softmax_reduce(op)  # binds both results
            return self.value(v)
        if isinstance(op, loop.WelfordReduceOp):
            self.welford_reduce(op)  # binds all three
            return self.value(v)
        together = self.together.get(op)
        if together is not None:  # binds every result of the group
            for member, result in zip(together, self.reduce_together(together), strict=True):
                self.bind(member.result, result)
            return self.value(v)
        result = self.translate(op)
        self.bind(v, result)
        return result

    def translate(self, op: Operation) -> SSAValue:
        if isinstance(op, loop.ConstantOp):
            return self.constant(op.value, op.result.type)
        if isinstance(op, loop.ApplyOp):
            return self.apply_op(op)
        if isinstance(op, loop.LoadOp):
            return self.load(op)
        if isinstance(op, loop.ReduceOp):
            if op.contract is not None:
                return self.contraction(op)
            return self.reduce(op)
        raise NotImplementedError(f"loop-to-tile: cannot translate {op.name}")

    def constant(self, value: Attribute, element: Attribute) -> SSAValue:
        number = value.value.data  # type: ignore[attr-defined]
        if element == INDEX:
            return self.const(int(number), self.index)
        if element in FLOAT_TYPES:
            return self.const(half_value(float(number), element), compute_type(element))
        return self.const(int(number), element)

    def apply_op(self, op: loop.ApplyOp) -> SSAValue:
        fn = op.fn.data
        args = [self.value(a) for a in op.args]
        result = op.result.type
        if fn == "checked_index":
            return self.checked_index(op, args)
        if result == INDEX:
            if fn in INDEX_FOLDS and args[1] in self.constants:
                return self.iapply(fn, args[0], self.constants[args[1]])
            if fn == "add":
                return self.index_add(args[0], args[1])
            return self.apply(fn, args, self.index)
        if fn == "cast":
            target = result
            source = element_of(args[0])
            out = self.apply("cast", args, target) if source != target else args[0]
            if target in HALF_TYPES:
                # Round to half precision as torch does, then compute on in f32.
                out = self.apply("cast", [out], F32)
            return out
        if fn == "pow":
            special = self.pow_by_constant(op, args, result)
            if special is not None:
                return special
        if fn in ROUNDING_COMMUTES and result in HALF_TYPES:
            # round(relu(round(s))) is round(relu(s)): the inner rounding (a conversion
            # to half and back over every element) goes. Only the sign of a zero can
            # differ (relu of a negative that rounds to -0.0). In a bf16 GEMM's epilogue
            # the round trip cost 2% of the kernel.
            args = [self.unrounded(a, result) for a in args]
        elif fn in EXACT:
            # floor(x) of a half value is a half value: there is nothing to round.
            return self.apply(fn, args, compute_type(result))
        fn = self.fast_ops.get(op, fn)
        return self.round_to(self.apply(fn, args, compute_type(result)), result)

    def checked_index(self, op: loop.ApplyOp, args: list[SSAValue]) -> SSAValue:
        """An index loaded from a tensor, checked to lie in `[0, n)` in every live lane
        (tile.check) and clamped into it: a bad index never makes a wild load."""
        i, bound = args
        n = self.constants[bound]
        element = element_of(i)
        inside = self.apply(
            "and",
            [
                self.apply("ge", [i, self.const(0, element)]),
                self.apply("lt", [i, self.const(n, element)]),
            ],
        )
        mask = self.mask_for(shape_of(inside))
        if mask is not None:  # lanes past the end hold no index
            inside = self.apply("or", [inside, self.apply("eq", [mask, self.const(0, I1)])])
        self.add(
            tile.CheckOp.create(
                operands=[inside],
                properties={"what": StringAttr(f"index out of range [0, {n})")},
            )
        )
        # Clamped in the index's own type: an i64 index past 2**32 must not wrap into range.
        pos = self.apply("maximum", [i, self.const(0, element)])
        pos = self.apply("minimum", [pos, self.const(n - 1, element)])
        return self.apply("cast", [pos], self.index) if element != self.index else pos

    @staticmethod
    def unrounded(v: SSAValue, element: Attribute) -> SSAValue:
        """The f32 value that `v` is the rounding to `element` of, else `v` itself."""
        widen = v.owner
        if not (
            isinstance(widen, tile.ApplyOp) and widen.fn.data == "cast" and element_of(v) == F32
        ):
            return v  # a where's condition, say, stays as it is
        narrow = widen.args[0].owner
        if (
            isinstance(narrow, tile.ApplyOp)
            and narrow.fn.data == "cast"
            and element_of(widen.args[0]) == element
            and element_of(narrow.args[0]) == F32
        ):
            return narrow.args[0]
        return v

    def pow_by_constant(
        self, op: loop.ApplyOp, args: list[SSAValue], result: Attribute
    ) -> SSAValue | None:
        """pow(x, c) for the constants torch computes exactly: 1, x, x*x, x*x*x, 1/x,
        1/(x*x), and sqrt/rsqrt (f32, f64). exp2(c * log2|x|) is a few ulps off those, which a
        cancellation downstream makes visible."""
        owner = op.args[1].owner
        if not isinstance(owner, loop.ConstantOp):
            return None
        value = owner.value
        if not isinstance(value, FloatAttr | IntegerAttr):
            return None
        c = float(value.value.data)
        x, t = args[0], compute_type(result)
        if c == 0.0:
            return self.const(1.0, t)  # 1 for every x, NaN and inf included, as torch
        if c == 1.0:
            out = x
        elif c in (2.0, -2.0):
            out = self.apply("mul", [x, x], t)
            if c < 0:
                out = self.apply("div", [self.const(1.0, t), out], t)
        elif c == 3.0:
            out = self.apply("mul", [self.apply("mul", [x, x], t), x], t)
        elif c == -1.0:
            out = self.apply("div", [self.const(1.0, t), x], t)
        elif c in (0.5, -0.5) and result not in HALF_TYPES:  # half: torch calls pow itself
            out = self.apply("sqrt" if c > 0 else "rsqrt", [x], t)
        else:
            return None
        return self.round_to(out, result)

    def round_to(self, v: SSAValue, element: Attribute) -> SSAValue:
        """Rounds an f32 value to half precision where torch's op would, staying in f32."""
        if element not in HALF_TYPES:
            return v
        return self.apply("cast", [self.apply("cast", [v], element)], F32)

    def terms_of(self, v: SSAValue) -> list[tuple[SSAValue, int]]:
        """An index value as a sum of (value, coefficient) terms."""
        return self.sums.get(v, [(v, 1)])

    def index_add(self, a: SSAValue, b: SSAValue) -> SSAValue:
        """`a + b` of two index blocks, refolded where their terms are the digits of
        one flat index: a reshape's `i * m + j` is the flat index itself, which
        Triton sees as contiguous (the digits' sum it cannot)."""
        terms = combined(self.terms_of(a) + self.terms_of(b))
        folded = self.refold(terms)
        if len(folded) < len(terms):
            return self.index_sum(folded, terms)
        v = self.apply("add", [a, b], self.index)
        self.sums[v] = terms
        return v

    def index_sum(
        self, terms: list[tuple[SSAValue, int]], expanded: list[tuple[SSAValue, int]]
    ) -> SSAValue:
        """The block of sum(value * coefficient), remembered as the sum of `expanded`."""
        total: SSAValue | None = None
        for t, c in terms:
            term = self.iapply("mul", t, c)
            total = term if total is None else self.apply("add", [total, term])
        if total is None:
            return self.const(0, self.index)
        if total not in self.sums and len(terms) > 1:
            self.sums[total] = expanded
        return total

    def offsets(self, memref: SSAValue, indices: Sequence[SSAValue]) -> SSAValue:
        """Element offsets of a row-major buffer at loop `indices`."""
        shape = tuple(memref.type.get_shape())  # type: ignore[attr-defined]
        values = [self.value(i) for i in indices]
        strides = [numel(shape[d + 1 :]) for d in range(len(shape))]
        terms = [
            (t, stride)
            for t, size, stride in zip(values, shape, strides, strict=True)
            if size != 1 and self.constants.get(t) != 0
        ]
        # Through the index sums: a load of a reshaped buffer at `(b * S + s, h)`
        # is at the flat index its digits come from.
        expanded = combined([(a, c * stride) for t, stride in terms for a, c in self.terms_of(t)])
        folded = combined(self.refold(expanded))
        position = self.positions.get(frozenset(folded))
        if position is not None:  # a peeled row's element: its aligned address
            return position
        if len(folded) < len(expanded):
            return self.index_sum(folded, expanded)
        unmasked = all(m is None for m in self.scopes[-1].axis_masks)
        if unmasked and any(t in self.constants for t, _ in expanded):
            # A constant (an unrolled chunk's start, a slice's) joins the smaller
            # blocks before the widest: one scalar add, and a chunk's addresses are
            # its row's plus an immediate, not a block of registers of their own.
            # (Where a mask bounds the sum, the sum stays as the mask reads it.)
            return self.index_sum(sorted(folded, key=lambda tc: numel(shape_of(tc[0]))), expanded)
        return self.index_sum(self.refold(terms), expanded)

    def refold(self, terms: list[tuple[SSAValue, int]]) -> list[tuple[SSAValue, int]]:
        """Sum(digit_k * stride_k) over all the digits of one flat index F is F times
        the smallest stride: `(x // C) * C + x % C` becomes `x`."""
        by_flat: dict[SSAValue, list[tuple[int, int | None, int, SSAValue]]] = {}
        for t, stride in terms:
            flat, div, mod = self.digits.get(t, (t, 1, None))
            by_flat.setdefault(flat, []).append((div, mod, stride, t))
        out: list[tuple[SSAValue, int]] = []
        for flat, run in by_flat.items():
            run.sort(key=lambda r: r[0])
            base = run[0][2]
            expected_div = 1
            whole = True
            for k, (div, mod, stride, _) in enumerate(run):
                last = k == len(run) - 1
                if div != expected_div or stride != base * div or (mod is None) != last:
                    whole = False
                    break
                expected_div = div * (mod or 1)
            if whole and (len(run) > 1 or run[0][3] is flat):
                out.append((flat, base))
            else:
                out += [(t, stride) for _, _, stride, t in run]
        return out

    def load(self, op: loop.LoadOp, widen: bool = True) -> SSAValue:
        """A block load; half-precision values are widened to f32 unless `widen` is off."""
        offs = self.offsets(op.buffer, op.indices)
        shape = shape_of(offs)
        mask = self.mask_for(shape)
        element = op.result.type
        operands = [self.ptr[op.buffer], offs] + ([mask] if mask is not None else [])
        props: dict[str, Attribute] = {}
        if mask is not None:
            props["other"] = identity("sum", element) if element != I1 else IntegerAttr(0, i64)
        if self.shape.kind not in ("contraction", "attention"):
            # Measured on an H200: softmax and layer norm run 3-5% faster, element-wise
            # kernels up to 2% faster, when their loads ask L2 to keep the lines
            # (evict_first made their rows slower). A reduction's input that nothing
            # reads again is the exception (see `streamed_buffers`). GEMM operands
            # are left alone.
            props["evict"] = StringAttr("first" if op.buffer in self.streamed else "last")
        v = self.add(
            tile.LoadOp.create(
                operands=operands, properties=props, result_types=[block_type(element, shape)]
            )
        )
        if element in HALF_TYPES and widen:
            v = self.apply("cast", [v], F32)
        return v

    def store(self, op: loop.StoreOp) -> None:
        value = self.value(op.value)
        element = op.buffer.type.element_type  # type: ignore[attr-defined]
        if element_of(value) != element:
            value = self.apply("cast", [value], element)
        extent = self.shape.parallel[-2:]
        pitch = self.block_access(op, (self.row_iv, self.col_iv), extent)
        if pitch is not None and pitch == extent[-1]:  # an output is exactly its buffer
            bm, bn = self.tiling.block[0], self.out_cols
            props: dict[str, Attribute] = {"shape": int_array(op.buffer.type.get_shape())}  # type: ignore[attr-defined]
            if bn < self.tiling.block[1]:  # a column part of the epilogue: one TMA store
                props["whole"] = IntegerAttr(1, i64)
            self.add(
                tile.BlockStoreOp.create(
                    operands=[
                        self.ptr[op.buffer],
                        self.out_row_start,
                        self.out_col_start,
                        self.broadcast_to(value, (bm, bn)),
                    ],
                    properties=props,
                )
            )
            return
        offs = self.offsets(op.buffer, op.indices)
        shape = broadcast(shape_of(offs), shape_of(value))
        offs, value = self.broadcast_to(offs, shape), self.broadcast_to(value, shape)
        mask = self.mask_for(shape)
        operands = [self.ptr[op.buffer], offs, value] + ([mask] if mask is not None else [])
        self.add(tile.StoreOp.create(operands=operands))

    # -- loops over the reduction axis --

    def reduction_chunks(
        self,
        bounds: Sequence[int],
        carried: Sequence[SSAValue],
        body: object,
        backwards: bool = False,
        nestable: bool = False,
    ) -> list[SSAValue]:
        """Runs `body(results_so_far)` over the reduction space, persistently or in a loop.

        `body` gets the carried values and returns their new values; the
        reduction indices are bound in the scope it runs in. A loop `backwards`
        visits the chunks last to first. A `nestable` one (plain reductions'
        accumulators) nests its loops where the kernel's tiling says so.
        """
        _, rb = self.tiling.block
        r = numel(bounds)
        xmask = self.scopes[-1].axis_masks[0]
        region_args: list[SSAValue]
        if rb >= r:
            with self.scope():
                self.bind_reduction(self.rbase, bounds, xmask, r, rb)
                return body(list(carried))  # type: ignore[operator]
        # A peeled row (`RowPeel`) is walked from its aligned start: up to
        # `granule - 1` lanes more.
        span = r + self.peel.granule - 1 if self.peel is not None else r
        if self.tiling.unrolled:
            # Chunk by chunk in straight-line code: each pass over the row asks for
            # the same loads, which tile-cse shares, so the row is read once.
            results = list(carried)
            for start in range(0, span, rb):
                if self.peel is not None:
                    results = self.peeled_chunk(start, r, xmask, body, results)
                    continue
                with self.scope():
                    offset = self.const(start, self.index)
                    rflat = self.index_add(self.rbase, offset) if start else self.rbase
                    self.bind_reduction(rflat, bounds, xmask, r, rb, ragged=start + rb > r)
                    results = body(results)  # type: ignore[operator]
            return results
        if self.peel is not None:
            return self.peeled_loop(r, carried, body, backwards)
        if nestable and self.tiling.nested and len(bounds) > 1 and self.chunk_limit is None:
            return self.nested_loop(bounds, carried, body)
        block = self.loop_block(r, rb, [c.type for c in carried])
        with self.scope(block=block):
            roff = self.loop_index(block)
            if backwards:
                last = (r - 1) // rb * rb
                roff = self.apply("sub", [self.const(last, self.index), roff])
            region_args = list(block.args[1:])
            self.bind_reduction(self.apply("add", [self.rbase, roff]), bounds, xmask, r, rb)
            new = body(region_args)
            self.add(tile.YieldOp.create(operands=new))
        return self.for_loop(block, carried, r, rb)

    def nested_loop(
        self, bounds: Sequence[int], carried: Sequence[SSAValue], body: object
    ) -> list[SSAValue]:
        """`body` over a reduction space looped an index of its leading dims at a time
        (a scalar, unravelled once a step), around chunks of its last dim (`nested`
        kernels: `tile.nested_run_tiling`), so that no lane divides a flat index."""
        _, rb = self.tiling.block
        k = run_dims(bounds, self.shape.run)
        outer, inner, run = bounds[:-k], bounds[-k:], numel(bounds[-k:])
        types = [c.type for c in carried]
        xmask = self.scopes[-1].axis_masks[0]
        rows = self.loop_block(numel(outer), 1, types)
        with self.scope(block=rows):
            outer_ivs = self.unravel(self.loop_index(rows), outer)
            chunks = self.loop_block(run, rb, types)
            with self.scope(block=chunks):
                roff = self.loop_index(chunks)
                rrun = self.apply("add", [self.rbase, roff])
                rmask = self.mask_below(rrun, run, rb)
                self.scopes[-1].axis_masks = [xmask, rmask]
                self.pending_rivs = [*outer_ivs, *self.unravel(rrun, inner)]
                new = body(list(chunks.args[1:]))  # type: ignore[operator]
                self.add(tile.YieldOp.create(operands=new))
            inner = self.for_loop(chunks, list(rows.args[1:]), run, rb)
            self.add(tile.YieldOp.create(operands=inner))
        return self.for_loop(rows, carried, numel(outer), 1)

    def peeled_loop(
        self, r: int, carried: Sequence[SSAValue], body: object, backwards: bool
    ) -> list[SSAValue]:
        """A looped peeled row (`RowPeel`): its first chunk (masked before the row's
        start), a loop over the chunks that lie inside every row (`r // rb` chunks
        from the aligned start, less the first: no mask, so each lane loads whole
        16-byte vectors) and the one or two chunks left (masked past the row's end),
        in that order or, `backwards`, the reverse."""
        _, rb = self.tiling.block
        assert self.peel is not None
        xmask = self.scopes[-1].axis_masks[0]
        inside = r // rb * rb
        tail = list(range(inside, r + self.peel.granule - 1, rb))

        def middle(results: list[SSAValue]) -> list[SSAValue]:
            if inside <= rb:
                return results
            block = self.loop_block(inside, rb, [c.type for c in results])
            with self.scope(block=block):
                roff = self.loop_index(block)
                if backwards:  # rb .. inside - rb, last to first
                    roff = self.apply("sub", [self.const(inside, self.index), roff])
                rflat = self.apply("add", [self.rbase, roff])
                self.bind_peeled(rflat, xmask, r, first=False, last=False)
                self.add(tile.YieldOp.create(operands=body(list(block.args[1:]))))  # type: ignore[operator]
            return self.for_loop(block, results, inside, rb, lb=rb)

        if backwards:
            results = list(carried)
            for start in reversed(tail):
                results = self.peeled_chunk(start, r, xmask, body, results)
            return self.peeled_chunk(0, r, xmask, body, middle(results))
        results = middle(self.peeled_chunk(0, r, xmask, body, list(carried)))
        for start in tail:
            results = self.peeled_chunk(start, r, xmask, body, results)
        return results

    def peeled_chunk(
        self, start: int, r: int, xmask: SSAValue | None, body: object, results: list[SSAValue]
    ) -> list[SSAValue]:
        """`body` over the chunk `start` lanes past a peeled row's aligned start, in
        straight-line code: masked before the row's start if it is the first (which,
        a granule wide at least, holds all of those lanes) and past its end if it
        reaches there."""
        _, rb = self.tiling.block
        with self.scope():
            rflat = self.index_add(self.rbase, self.const(start, self.index)) if start else self.rbase
            self.bind_peeled(rflat, xmask, r, first=start == 0, last=start + rb > r)
            return body(results)  # type: ignore[operator]

    def loop_block(self, ub: int, step: int, carried: Sequence[Attribute]) -> Block:
        """The body of a tile.for up to `ub` by `step` carrying values of `carried`
        types: its induction variable is i32, as Triton counts, or i64 where its last
        step would pass i32's range (an i32 one would wrap, and never stop)."""
        return Block(arg_types=[I32 if ub + step - 1 <= I32_MAX else I64, *carried])

    def loop_index(self, block: Block) -> SSAValue:
        """A tile.for body's induction variable, in the kernel's index type."""
        iv = block.args[0]
        return iv if iv.type == self.index else self.apply("cast", [iv], self.index)

    def for_loop(
        self, block: Block, inits: Sequence[SSAValue], ub: int, step: int, lb: int = 0
    ) -> list[SSAValue]:
        """`for iv in range(lb, ub, step)` over a built body carrying `inits`."""
        loop_op = tile.ForOp.create(
            operands=list(inits),
            result_types=[c.type for c in inits],
            properties={
                "lb": IntegerAttr(lb, i64),
                "ub": IntegerAttr(ub, i64),
                "step": IntegerAttr(step, i64),
            },
            regions=[Region(block)],
        )
        self.add(loop_op)
        return list(loop_op.results)

    def bind_reduction(
        self,
        rflat: SSAValue,
        bounds: Sequence[int],
        xmask: SSAValue | None,
        r: int,
        rb: int,
        ragged: bool = True,
    ) -> None:
        """Binds the reduction indices (read by the loop body) and the row x chunk masks
        (a chunk known not to be `ragged` needs none)."""
        if self.chunk_limit is not None:
            rmask = self.apply("lt", [rflat, self.chunk_limit])
        else:
            masked = ragged and r % rb
            rmask = self.apply("lt", [rflat, self.const(r, self.index)]) if masked else None
        self.scopes[-1].axis_masks = [xmask, rmask]
        self.pending_rivs = self.unravel(rflat, bounds)

    def bind_peeled(
        self, rflat: SSAValue, xmask: SSAValue | None, r: int, first: bool, last: bool
    ) -> None:
        """Binds the reduction index of a peeled row's chunk at `rflat` lanes past its
        aligned start: element `aligned + rflat` of the buffers, index `aligned +
        rflat - row_start` of the row; masks keep the lanes before the row's start
        (`first` chunk) and past its end (`last`) off. The masks compare the offsets
        themselves, which the bounds analysis narrows."""
        peel = self.peel
        assert peel is not None
        position = self.apply("add", [peel.aligned, rflat], self.index)
        terms = combined(self.terms_of(peel.aligned) + self.terms_of(rflat))
        self.sums[position] = terms
        self.positions[frozenset(terms)] = position
        index = self.apply("sub", [position, peel.row_start], self.index)
        self.sums[index] = combined(terms + [(t, -c) for t, c in peel.row_terms])
        rmask: SSAValue | None = None
        if first and peel.granule > 1:  # a row peeled in place has no lanes before it
            rmask = self.apply("ge", [position, peel.row_start])
        if last:
            end = self.apply("add", [peel.row_start, self.const(r, self.index)])
            below = self.apply("lt", [position, end])
            rmask = below if rmask is None else self.apply("and", [rmask, below])
        self.scopes[-1].axis_masks = [xmask, rmask]
        self.pending_rivs = [index]

    def reduce(self, op: loop.ReduceOp) -> SSAValue:
        (acc,) = self.reduce_together([op])
        return acc

    def reduce_together(self, ops: Sequence[loop.ReduceOp]) -> list[SSAValue]:
        """Reductions over one space in one pass over it, an accumulator each
        (`irc.analysis.reduction_groups`): each row's elements are loaded once
        (tile-cse shares the loads of their bodies)."""
        xb, rb = self.tiling.block
        kinds = [op.kind.data for op in ops]
        elements = [compute_type(op.result.type) for op in ops]
        neutrals = [identity(k, e) for k, e in zip(kinds, elements, strict=True)]
        yielded = [op.body.block.last_op.values[0] for op in ops]  # type: ignore[union-attr]
        outer_limit, self.chunk_limit = self.chunk_limit, None  # a reduction inside one
        if len(ops) == 1 and (ragged := self.ragged_chunk(ops[0], neutrals[0])) is not None:
            yielded[0], self.chunk_limit = ragged

        def body(carried: list[SSAValue]) -> list[SSAValue]:
            new = []
            rivs = list(self.pending_rivs)  # a reduction nested in a member sets its own
            for i, op in enumerate(ops):
                for iv, v in zip(op.body.block.args, rivs, strict=True):
                    self.bind(iv, v)
                v = self.value(yielded[i])
                if element_of(v) != elements[i]:
                    v = self.apply("cast", [v], elements[i])
                mask = self.mask_for((xb, rb))
                if mask is not None and not neutral_outside(v, mask, neutrals[i]):
                    v = self.apply("where", [mask, v, self.const_attr(neutrals[i], elements[i])])
                v = self.broadcast_to(v, (xb, rb))
                new.append(self.apply(COMBINE[kinds[i]], [carried[i], v]) if carried else v)
            return new

        bounds = loop.int_list(ops[0].bounds)
        if rb >= numel(bounds) or self.tiling.unrolled:
            accs = self.reduction_chunks(bounds, [], body)
        else:
            inits = [self.full(n, e, (xb, rb)) for n, e in zip(neutrals, elements, strict=True)]
            accs = self.reduction_chunks(bounds, inits, body, nestable=True)
        self.chunk_limit = outer_limit
        return [
            self.round_to(self.across_lanes(kind, acc), op.result.type)
            for kind, acc, op in zip(kinds, accs, ops, strict=True)
        ]

    def ragged_chunk(self, op: loop.ReduceOp, neutral: Attribute) -> tuple[SSAValue, SSAValue] | None:
        """(value, limit) where a column reduction's `op` yields `where(start + r < n,
        value, identity)` over its index `r`: a split stage's chunk that may run past
        the last row (`split-reduction`, its index clamped to that row). The chunk
        is then `limit = min(chunk, n - start)` rows long, a bound of the reduction's
        own mask, and `value` is accumulated under it with no `where`. With that
        `where`, ptxas issued a 16-bit column sum's loads a step one at a time, each
        after the add before it: the split stage of a 10100x10503 bf16 sum took
        2.1x torch.compile's time on an H200 (83.4 us with the bound, 231.8 with
        the `where`). Rows of whole 16-byte vectors keep the `where`: their loads
        are two vectors a thread a step, and the bound was 7% slower (8192x8192
        bf16, 52.9 us against 49.3)."""
        if not self.shape.columns or len(op.body.block.args) != 1:
            return None
        if self.shape.columns * self.shape.element_bytes % VECTOR_BYTES == 0:
            return None
        r = op.body.block.args[0]
        where = op.body.block.last_op.values[0].owner  # type: ignore[union-attr]
        if isinstance(where, loop.ApplyOp) and where.fn.data == "cast":
            # A widening to the accumulated type, which `reduce` makes itself.
            if not (element_of(where.args[0]) in FLOAT_TYPES and where.result.type == op.result.type):
                return None
            where = where.args[0].owner
        if not (isinstance(where, loop.ApplyOp) and where.fn.data == "where"):
            return None
        cond, value, other = where.args
        lt, given = cond.owner, other.owner
        if not (
            isinstance(given, loop.ConstantOp)
            and _same_number(given.value, neutral)
            and isinstance(lt, loop.ApplyOp)
            and lt.fn.data == "lt"
            and isinstance(lt.args[1].owner, loop.ConstantOp)
        ):
            return None
        add = lt.args[0].owner
        if not (isinstance(add, loop.ApplyOp) and add.fn.data == "add" and r in add.args):
            return None
        start = add.args[0] if add.args[1] is r else add.args[1]
        if r in loop.indices_read(start, self.kernel, {r}):
            return None
        chunk = numel(loop.int_list(op.bounds))
        n = self.value(lt.args[1])
        left = self.apply("sub", [n, self.value(start)], self.index)
        return value, self.apply("minimum", [self.const(chunk, self.index), left], self.index)

    def across_lanes(self, kind: str, v: SSAValue) -> SSAValue:
        """A reduction's `[X, R]` lanes reduced along R with `kind`, as `[X, 1]`."""
        xb = shape_of(v)[0]
        red = self.add(
            tile.ReduceOp.create(
                operands=[v],
                properties={"kind": StringAttr(kind), "axis": IntegerAttr(1, i64)},
                result_types=[block_type(element_of(v), (xb,))],
            )
        )
        return self.expand(red, 1)

    def softmax_reduce(self, op: loop.SoftmaxReduceOp) -> None:
        """max(x) and sum(exp(x - max(x))) in one pass over the row (online softmax).

        Each lane keeps a running max m and a sum s scaled to it. A new value x
        takes one exp, e = exp(-|x - m|): where x is larger, s becomes s * e + 1
        (the sum rescaled to x, plus x's own term); elsewhere s + e. That is the
        same arithmetic as rescaling by exp(m - max(m, x)) and adding
        exp(x - max(m, x)), which took two exps an element. The lanes combine at
        the end by rescaling.
        """
        element = op.maximum.type
        xb, rb = self.tiling.block
        full = (xb, rb)
        (x_value,) = op.body.block.last_op.values  # type: ignore[union-attr]
        minus_inf = FloatAttr(-math.inf, f64)

        def finite(m: SSAValue) -> SSAValue:
            # exp(-inf - -inf) is NaN: measure from 0 while a lane has seen nothing.
            empty = self.apply("eq", [m, self.const_attr(minus_inf, element)])
            return self.apply("where", [empty, self.const(0.0, element), m])

        def body(carried: list[SSAValue]) -> list[SSAValue]:
            m_acc, s_acc = carried
            for iv, v in zip(op.body.block.args, self.pending_rivs, strict=True):
                self.bind(iv, v)
            x = self.value(x_value)
            mask = self.mask_for(full)
            if mask is not None:
                x = self.apply("where", [mask, x, self.const_attr(minus_inf, element)])
            x = self.broadcast_to(x, full)
            # Measured from 0 while a lane has seen nothing (m = -inf): its sum is 0,
            # so a first x gives 0 * e + 1 = 1 whatever e is; a masked x (-inf) adds 0.
            d = self.apply("sub", [x, finite(m_acc)])
            # The statistics keep only sums of exps: the fast exp (`graph.ExpOp`), whose
            # error grows with |x - max|, the size of the terms shrinks with it.
            e = self.apply("fast_exp", [self.apply("neg", [self.apply("abs", [d])])])
            one = self.const(1.0, element)
            grown = self.apply("mul_add", [s_acc, e, one])
            s_new = self.apply("where", [self.apply("gt", [x, m_acc]), grown, self.apply("add", [s_acc, e])])
            return [self.apply("maximum", [m_acc, x]), s_new]

        inits = [self.full(minus_inf, element, full), self.full(FloatAttr(0.0, f64), element, full)]
        m_acc, s_acc = self.reduction_chunks(loop.int_list(op.bounds), inits, body)
        m_row = self.across_lanes("max", m_acc)
        scaled = self.apply(
            "mul", [s_acc, self.apply("fast_exp", [self.apply("sub", [m_acc, finite(m_row)])])]
        )
        self.bind(op.maximum, m_row)
        self.bind(op.sum_exp, self.across_lanes("sum", scaled))

    def welford_reduce(self, op: loop.WelfordReduceOp) -> None:
        """The mean, M2 and weight of the parts a row yields, in one pass over it.

        The parts of a whole block combine exactly in two sweeps: W = sum(w),
        mean = sum(w * m) / W, M2 = sum(m2 + w * (m - mean)**2). Rows held in
        registers (one block, or unrolled chunks) do just that over their loaded
        values (tile-cse shares the loads of the two sweeps). A looped row keeps
        a running part in each lane, merged with each new element's by Chan's
        formula, and a running sum, whose S / W is the mean a plain sum gives;
        the lanes' parts combine at the end as a block's do.
        """
        element = op.mean.type
        xb, rb = self.tiling.block
        full = (xb, rb)
        bounds = loop.int_list(op.bounds)
        yielded = op.body.block.last_op.values  # type: ignore[union-attr]

        # A weight the same in every kept lane (each row's 1, or a split chunk's
        # row validity) is kept `[1, R]`: the running weights and Chan's ratio (a
        # division) are then computed once a row of the step for all kept lanes,
        # not once an element (which also split ptxas's batches of loads).
        w_lanes = full if self.varies_across_kept(yielded[2], set(op.body.block.args)) else (1, rb)

        def part() -> list[SSAValue]:
            """This chunk's (mean, m2, weight), weight 0 where it is masked.

            Only the reduced axis is masked: a lane past the kept axis's end
            reduces to a result no store keeps."""
            for iv, v in zip(op.body.block.args, self.pending_rivs, strict=True):
                self.bind(iv, v)
            values = [self.value(v) for v in yielded]
            mask = self.mask_for((1, rb))
            if mask is not None:
                zero = self.const(0.0, element)
                values = [self.apply("where", [mask, v, zero]) for v in values]
            m, m2, w = values
            return [
                self.broadcast_to(m, full),
                self.broadcast_to(m2, full),
                self.broadcast_to(w, w_lanes),
            ]

        def accumulate(carried: list[SSAValue], terms: list[SSAValue]) -> list[SSAValue]:
            if not carried:
                return terms
            return [self.apply("add", [c, t]) for c, t in zip(carried, terms, strict=True)]

        def deviations(m: SSAValue, m2: SSAValue, w: SSAValue, mean: SSAValue) -> SSAValue:
            d = self.apply("sub", [m, mean])
            return self.apply("add", [m2, self.apply("mul", [w, self.apply("mul", [d, d])])])

        if rb >= numel(bounds) or self.tiling.unrolled:

            def first_sweep(carried: list[SSAValue]) -> list[SSAValue]:
                m, _, w = part()
                return accumulate(carried, [w, self.apply("mul", [w, m])])

            w_acc, s_acc = self.reduction_chunks(bounds, [], first_sweep)
            weight = self.across_lanes("sum", w_acc)
            mean = self.apply("div", [self.across_lanes("sum", s_acc), weight])

            def second_sweep(carried: list[SSAValue]) -> list[SSAValue]:
                m, m2, w = part()
                return accumulate(carried, [deviations(m, m2, w, mean)])

            (q_acc,) = self.reduction_chunks(bounds, [], second_sweep)
        else:
            shift = self.first_part_mean(op, element)

            def merge(carried: list[SSAValue]) -> list[SSAValue]:
                m_a, q_a, w_a, s_a = carried
                m_x, q_b, w_b = part()
                m_b = self.apply("sub", [m_x, shift])
                w = self.apply("add", [w_a, w_b])
                zero = self.const(0.0, element)
                empty = self.apply("eq", [w, zero])
                ratio = self.apply("where", [empty, zero, self.apply("div", [w_b, w])])
                d = self.apply("sub", [m_b, m_a])
                m = self.apply("add", [m_a, self.apply("mul", [d, ratio])])
                grown = self.apply("mul", [self.apply("mul", [d, d]), self.apply("mul", [w_a, ratio])])
                q = self.apply("add", [self.apply("add", [q_a, q_b]), grown])
                s = self.apply("add", [s_a, self.apply("mul", [w_b, m_x])])
                return [m, q, w, s]

            inits = [
                self.full(FloatAttr(0.0, f64), element, shape)
                for shape in (full, full, w_lanes, full)
            ]
            m_acc, q_lanes, w_acc, s_acc = self.reduction_chunks(bounds, inits, merge)
            weight = self.across_lanes("sum", w_acc)
            mean = self.apply("div", [self.across_lanes("sum", s_acc), weight])
            # The lanes' running means are about `shift`; so is the centre they
            # deviate from (mean - shift, taken from them, not rounded near `mean`).
            weighted = self.apply("mul", [w_acc, m_acc])
            centre = self.apply("div", [self.across_lanes("sum", weighted), weight])
            q_acc = deviations(m_acc, q_lanes, w_acc, centre)
        self.bind(op.mean, mean)
        self.bind(op.m2, self.across_lanes("sum", q_acc))
        self.bind(op.weight, self.broadcast_to(weight, (xb, 1)))

    def first_part_mean(self, op: loop.WelfordReduceOp, element: Attribute) -> SSAValue:
        """The mean of a Welford reduction's first part in each kept lane (0 where that
        part weighs nothing): a looped reduction's lanes keep their running means about
        it. Welford's running mean rounds at the scale of the data's mean, and each
        deviation from it carries that error, so M2 about a far mean (values of spread 3
        about 1000) came out 20-30x further from f64 than torch's two passes; about a
        value of the data, the mean lies within sqrt(n) deviations of it, however far
        from zero both are."""
        xmask = self.scopes[-1].axis_masks[0]
        with self.scope(axis_masks=[xmask, None]):
            for iv in op.body.block.args:
                self.bind(iv, self.const(0, self.index))
            m, _, w = (self.value(v) for v in op.body.block.last_op.values)  # type: ignore[union-attr]
            zero = self.const(0.0, element)
            return self.apply("where", [self.apply("eq", [w, zero]), zero, m])

    def varies_across_kept(self, v: SSAValue, row_ivs: set[SSAValue]) -> bool:
        """Whether a reduction body's `v` may differ between the kept lanes (axis 0)
        of the tile it will be built in: it reads memory, or an index bound to
        more than one kept lane. `row_ivs`, the body's own indices, run along
        axis 1."""
        if v in row_ivs:
            return False
        bound = self.lookup(v)
        if bound is not None:
            return shape_of(bound)[:1] not in ((), (1,))
        op = v.owner
        if isinstance(op, loop.ConstantOp):
            return False
        if isinstance(op, loop.ApplyOp):
            return any(self.varies_across_kept(a, row_ivs) for a in op.args)
        return True

    def const_attr(self, value: Attribute, element: Attribute) -> SSAValue:
        return self.add(tile.ConstantOp.create(properties={"value": value}, result_types=[element]))

    def foreach(self, op: loop.ForeachOp) -> None:
        def body(carried: list[SSAValue]) -> list[SSAValue]:
            for iv, v in zip(op.body.block.args, self.pending_rivs, strict=True):
                self.bind(iv, v)
            self.statements(op.body.block)
            return []

        self.reduction_chunks(loop.int_list(op.bounds), [], body, backwards=FINAL_PASS_BACKWARDS)

    def contraction(self, op: loop.ReduceOp) -> SSAValue:
        return self.round_to(self.accumulate(op), op.result.type)

    def accumulate(self, op: loop.ReduceOp, chunk: tuple[SSAValue, int] | None = None) -> SSAValue:
        """The K loop of a contraction: its accumulator tile, not yet rounded. A sum
        of products is a dot each, chained where a product adds to the sum before it
        (`split-tf32-gemm-operands`' `at bf + af bt`), added to the accumulator once a
        step, as `_irc_dot_split_tf32` adds its three. With `chunk` (start, length:
        whole K steps), the loop runs over that chunk of K only (a split tail's)."""
        bm, bn, bk = self.tiling.block
        (k,) = loop.int_list(op.bounds)
        (kiv,) = op.body.block.args
        summed = op.body.block.last_op.values[0]  # type: ignore[union-attr]
        element = op.result.type
        acc_type = accumulator_type(element)
        init = self.full(FloatAttr(0.0, f64), acc_type, (bm, bn))
        length = k if chunk is None else chunk[1]
        block = self.loop_block(length, bk, [init.type])
        with self.scope(block=block):
            k0 = self.loop_index(block)
            if chunk is not None:  # the last chunk may run past k: masked as a ragged k
                k0 = self.apply("add", [k0, chunk[0]])
            kk = self.apply("add", [self.arange(bk), k0])
            ragged = k % bk or chunk is not None
            kmask = self.apply("lt", [kk, self.const(k, self.index)]) if ragged else None
            *_, m, n = self.shape.parallel

            def factors(product: loop.ApplyOp) -> tuple[SSAValue, SSAValue]:
                a, b = product.args
                a_tma = self.tma_operand(a, (self.row_iv, kiv), (m, k), element)
                b_tma = self.tma_operand(b, (kiv, self.col_iv), (k, n), element)
                if a_tma is not None:
                    av = self.block_load(a_tma, self.row_start, k0, (bm, bk))
                else:
                    with self.scope(axis_masks=[self.row_mask, None]):
                        krow = self.expand(kk, 0)
                        self.scopes[-1].axis_masks = [
                            self.row_mask,
                            None if kmask is None else self.expand(kmask, 0),
                        ]
                        self.bind(kiv, krow)
                        av = self.dot_operand(a, (bm, bk), element)
                if b_tma is not None:
                    bv = self.block_load(b_tma, k0, self.col_start, (bk, bn))
                else:
                    with self.scope(axis_masks=[None, self.col_mask]):
                        kcol = self.expand(kk, 1)
                        self.scopes[-1].axis_masks = [
                            None if kmask is None else self.expand(kmask, 1),
                            self.col_mask,
                        ]
                        self.bind(kiv, kcol)
                        bv = self.dot_operand(b, (bk, bn), element)
                return av, bv

            def dot(product: loop.ApplyOp, acc: SSAValue) -> SSAValue:
                av, bv = factors(product)
                # f32 products to f32's accuracy on tensor cores (three TF32 products
                # of split operands); one TF32 product of factors TF32 holds exactly,
                # or when asked; f64 on FMA units.
                exact = all(tf32_exact(f, self.tf32_buffers) for f in product.args)
                tf32 = self.tf32 or exact
                precision = ("tf32" if tf32 else "split-tf32") if element == F32 else "ieee"
                props = {"precision": StringAttr(precision)} if element not in HALF_TYPES else {}
                return self.add(
                    tile.DotOp.create(
                        operands=[av, bv, acc], properties=props, result_types=[init.type]
                    )
                )

            def total(v: SSAValue) -> SSAValue:
                """A sum of products from zero: a product's dot, or two sums added."""
                owner = v.owner
                assert isinstance(owner, loop.ApplyOp)
                if owner.fn.data == "mul":
                    return dot(owner, init)
                left, right = owner.args
                if isinstance(p := right.owner, loop.ApplyOp) and p.fn.data == "mul":
                    return dot(p, total(left))
                return self.apply("add", [total(left), total(right)])

            owner = summed.owner
            if isinstance(owner, loop.ApplyOp) and owner.fn.data == "mul":
                acc = dot(owner, block.args[1])
            else:
                acc = self.apply("add", [block.args[1], total(summed)])
            self.add(tile.YieldOp.create(operands=[acc]))
        (acc,) = self.for_loop(block, [init], length, bk)
        return acc

    def epilogue_parts(self, block: Block) -> int:
        """Column parts the epilogue of a contraction kernel's `block` runs on
        (`tile.epilogue_parts`); 1 unless the block is element-wise work on its
        contractions and stores that each depend on the output column
        (`tile.column_split_epilogue`); 1 in a split tail's fixup, whose 16-row tiles
        are small and whose accumulator is the partials' sum, not a K loop."""
        if self.shape.kind != "contraction" or block is not self.kernel.body.block:
            return 1
        if self.role == "fixup":
            return 1
        return epilogue_parts(self.tiling, self.shape)

    def epilogue_in_parts(self, block: Block, parts: int) -> None:
        """The K loops once on the whole tile, then the epilogue and its stores on
        each column part in turn (`tile.column_part` of the accumulators)."""
        contractions = [op for op in block.ops if isinstance(op, loop.ReduceOp)]
        accumulators = [self.accumulate(op) for op in contractions]
        bm, bn, _ = self.tiling.block
        width = bn // parts
        n = self.shape.parallel[-1]
        whole = self.out_col_start
        for part in range(parts):
            with self.scope():
                start = whole
                if part:
                    start = self.apply("add", [whole, self.const(part * width, self.index)])
                cols = self.expand(self.apply("add", [start, self.arange(width)]), 0)
                # Masked where the whole tile is (a part may lie wholly past n).
                mask = self.mask_below(cols, n, bn)
                self.scopes[-1].axis_masks = [self.row_mask, mask]
                self.bind(self.col_iv, cols)
                for op, acc in zip(contractions, accumulators, strict=True):
                    piece = self.add(
                        tile.ColumnPartOp.create(
                            operands=[acc],
                            properties={"part": IntegerAttr(part, i64), "parts": IntegerAttr(parts, i64)},
                            result_types=[block_type(element_of(acc), (bm, width))],
                        )
                    )
                    self.bind(op.result, self.round_to(piece, op.result.type))
                self.out_col_start, self.out_cols = start, width
                for op in block.ops:
                    if isinstance(op, loop.StoreOp):
                        self.store(op)
        self.out_col_start, self.out_cols = whole, bn

    def tma_operand(
        self,
        v: SSAValue,
        indices: tuple[SSAValue | None, SSAValue | None],
        extent: tuple[int, int],
        element: Attribute,
    ) -> TmaOperand | None:
        """The load behind a dot operand that TMA can fetch as it is, or transposed
        (a buffer that holds the operand's columns as rows: an `nn.Linear` weight
        read as `w.T`), if any; `indices` and `extent` are the operand's own."""
        owner = v.owner
        if isinstance(owner, loop.LoadOp) and owner.result.type == element:
            for transposed in (False, True):
                ivs, sizes = (indices[::-1], extent[::-1]) if transposed else (indices, extent)
                pitch = self.block_access(owner, ivs, sizes)
                if pitch is not None:
                    return TmaOperand(owner, transposed, sizes, pitch)
        return None

    def block_load(
        self, operand: TmaOperand, row: SSAValue, col: SSAValue, shape: tuple[int, int]
    ) -> SSAValue:
        """The operand's `shape` block at (`row`, `col`) of it; where the buffer holds
        it `transposed`, the block at (`col`, `row`) of the buffer, transposed. A
        buffer whose rows are longer than the operand's (`pitch`) is read in its
        first columns only."""
        op, (rows, cols) = operand.load, operand.extent
        props: dict[str, Attribute] = {"shape": int_array([rows, cols])}
        if operand.pitch != cols:
            props["pitch"] = IntegerAttr(operand.pitch, i64)
        if operand.transposed:
            row, col = col, row
            props["transposed"] = IntegerAttr(1, i64)
        return self.add(
            tile.BlockLoadOp.create(
                operands=[self.ptr[op.buffer], row, col],
                properties=props,
                result_types=[block_type(op.result.type, shape)],
            )
        )

    def dot_operand(self, v: SSAValue, shape: tuple[int, int], element: Attribute) -> SSAValue:
        """One dot operand as a full tile, zero in masked lanes, in the dot's input type."""
        owner = v.owner
        if isinstance(owner, loop.LoadOp) and owner.result.type == element:
            # Straight from memory into the tensor cores, without an f32 round trip.
            raw = self.load(owner, widen=False)
            if shape_of(raw) == shape:
                return raw
        t = self.value(v)
        # A load's mask covers only the axes its offsets span: one broadcast along K
        # (a size-1 dim, e.g. K = 1) must be zeroed past K here too.
        if not isinstance(v.owner, loop.LoadOp) or shape_of(t) != shape:
            mask = self.mask_for(shape)
            if mask is not None:
                t = self.apply("where", [mask, t, self.const(0.0, compute_type(element))])
        t = self.broadcast_to(t, shape)
        if element_of(t) != element:
            t = self.apply("cast", [t], element)
        return t


def accumulator_type(element: Attribute) -> Attribute:
    """The type a contraction of `element` results accumulates in: f32 for half
    precision and f32 (tensor cores), f64 for f64."""
    return F32 if element in HALF_TYPES or element == F32 else element


def the_contraction(kernel: loop.KernelOp) -> loop.ReduceOp:
    """The one contraction of a GEMM kernel with a split tail (the verifier's rule)."""
    (red,) = [op for op in kernel.body.block.ops if isinstance(op, loop.ReduceOp)]
    return red


def tiles_before_tail(shape: KernelShape, tiling: Tiling) -> int:
    """The output tiles a GEMM with a split tail leaves to its persistent programs."""
    assert tiling.tail is not None
    (m, n), (bm, bn, _) = shape.parallel, tiling.block
    return -(-m // bm) * -(-n // bn) - tiling.tail[0]


TAIL_FIXUP_ROWS = 16
"""Rows of a split tail's tile one program of its fixup sums and finishes, so that
its programs (BM / 16 a tile) fill the SMs the tail's tiles did not."""


FINAL_PASS_BACKWARDS = True
"""A looped row's last pass (the `loop.foreach` that stores) walks its chunks last
to first: the chunks the reductions before it read last are still in L2 and are
read again first. Measured on an H100 (softmax, one program a row in chunks):
6% faster on 2048 x 128,256 bf16 and 333 x 100,003 f32, even on 4096 x 50,257
bf16, 2% slower on 4096 x 50,257 f32."""


def lower_function(fn: func.FuncOp, names: set[str], tf32: bool = False) -> list[tile.KernelOp]:
    """Replaces the loop.kernels of `fn` with launches; returns the new kernels."""
    kernels: list[tile.KernelOp] = []
    exact = tf32_buffers(fn.walk())
    for op in list(fn.body.block.ops):
        if not isinstance(op, loop.KernelOp):
            continue
        shape, tiling = kernel_shape(op), tiling_of(op)
        persistent = shape.kind == "reduction" and (
            tiling.block[1] >= numel(shape.reduction) or tiling.unrolled
        )
        name = unique_name(tile_kernel_name(op.kernel_name.data, persistent), names)
        translators = [KernelTranslator(op, name, tf32, exact)]
        if tiling.tail is not None and shape.kind == "contraction":
            translators = tail_translators(fn, op, name, names, tf32, exact)
        for translator in translators:
            kernel = translator.build()
            if isinstance(previous_work(op), tile.LaunchOp):
                # Not the function's first kernel: its launch can overlap the previous one.
                kernel.pdl = IntegerAttr(1, i64)
            kernels.append(kernel)
            launch = tile.LaunchOp.create(
                operands=translator.memrefs,
                properties={"kernel": SymbolRefAttr(translator.name)},
            )
            launch.location = op.location
            fn.body.block.insert_op_before(launch, op)
        op.detach()
        op.erase()
    return kernels


def previous_work(op: Operation) -> Operation | None:
    """The launch or library GEMM before `op` in its function, if any. A kernel after
    a library GEMM is not launched early (PDL), a precaution: where cuBLAS's kernel
    lets dependents start before it ends, their waiting programs would hold SMs its
    last tiles need."""
    prev = op.prev_op
    while prev is not None and not isinstance(prev, tile.LaunchOp | loop.LibraryMatmulOp):
        prev = prev.prev_op
    return prev


def tail_translators(
    fn: func.FuncOp,
    op: loop.KernelOp,
    name: str,
    names: set[str],
    tf32: bool,
    exact: frozenset[SSAValue],
) -> list[KernelTranslator]:
    """The kernels of a GEMM with a split tail (`tile.tail_split`), in launch order:
    the tail's partial products (`NAME_tail`), their sums and epilogue (`NAME_fixup`),
    then the persistent programs over the other tiles (`NAME`, none where the tail is
    every tile). Their workspace, in the accumulator's type, is allocated just before
    them."""
    tiling = tiling_of(op)
    assert tiling.tail is not None
    tail, splits = tiling.tail
    bm, bn, _ = tiling.block
    element = accumulator_type(the_contraction(op).result.type)
    workspace = loop.AllocOp.create(result_types=[MemRefType(element, [tail * splits * bm, bn])])
    fn.body.block.insert_op_before(workspace, op)
    out = [
        KernelTranslator(op, unique_name(name + suffix, names), tf32, exact, role, workspace.result)
        for role, suffix in (("partial", "_tail"), ("fixup", "_fixup"))
    ]
    if tiles_before_tail(kernel_shape(op), tiling):
        out.append(KernelTranslator(op, name, tf32, exact, "main"))
    return out


def lower_module(module: ModuleOp, tf32: bool = False) -> None:
    names: set[str] = set()
    for fn in list(module.body.ops):
        if isinstance(fn, func.FuncOp):
            for k in lower_function(fn, names, tf32):
                module.body.block.insert_op_before(k, fn)


@dataclass(frozen=True)
class LoopToTilePass(ModulePass):
    """`loop-to-tile`: loop nests become blocked tile kernels and launches."""

    name = "loop-to-tile"
    levels = ("loop",)

    tf32: bool = False
    """f32 GEMMs as one TF32 product (about 10 bits of mantissa) instead of three of
    split operands (`split-tf32`, f32's accuracy)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_module(op, self.tf32)


__all__ = ["LoopToTilePass", "lower_module", "MemRefType"]
