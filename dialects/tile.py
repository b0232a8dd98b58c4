"""The `tile` dialect: blocked, Triton-shaped kernels.

A `tile.kernel` is one GPU program over blocks: it reads its program id,
builds index blocks with `tile.arange`, loads and stores blocks through
pointers with masks, computes with `tile.apply` (NumPy-style broadcasting over
block shapes), reduces along block axes and multiplies tiles with `tile.dot`.
Host functions stay at the loop level (`loop.alloc`) and start kernels with
`tile.launch`. Values are typed as blocks (`tensor<64x1xf32>`) or scalars.

    tile.kernel {name = "triton_poi_exp_0", grid = [4], warps = 4} (%p0: ptr<f32>, %p1: ptr<f32>) {
      %pid = tile.program_id {axis = 0} : i32
      ...
    }
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
)
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    Operation,
    ParametrizedAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    param_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import (
    IsTerminator,
    NoTerminator,
    Pure,
    SymbolOpInterface,
    SymbolTable,
    SymbolUserOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from irc.analysis.tma import box_problem
from irc.dialects.attrs import (
    I32,
    MAX_BLOCK,
    MAX_GRID,
    MAX_GRID_Y,
    MAX_STAGES,
    MAX_WARPS,
    check_choice,
    check_flag,
    check_int,
    check_int_list,
    check_number,
)
from irc.dialects.loop import (
    REDUCE_KINDS,
    check_apply,
    check_apply_types,
    check_sum_element,
    fn_property,
)
from irc.ir.names import check_kernel_name, quoted
from irc.ir.types import ELEMENT_TYPES, F32, HALF_TYPES, element_bytes, format_type

DOT_PRECISIONS = ("ieee", "tf32", "tf32x3", "split-tf32")
"""Triton's `input_precision` values for f32 dots, and irc's `split-tf32`: three
TF32 products of operands split into rounded parts (`_irc_dot_split_tf32`)."""
MIN_DOT_K = 16
"""The smallest K of a dot Triton compiles for NVIDIA GPUs (16- and 32-bit operands);
its interpreter takes any, so a smaller one would fail on the GPU only."""
I32_MAX = 2**31 - 1
F64 = ELEMENT_TYPES["f64"]
DOT_ELEMENTS = frozenset({*HALF_TYPES, F32, F64})
"""The operand types of tl.dot among irc's element types."""


def _shape(t: Attribute) -> tuple[int, ...]:
    return t.get_shape() if isinstance(t, TensorType) else ()


def _broadcast(op: Operation, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy's broadcast of block shapes, as Triton does it."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        sizes = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise VerifyException(
                f"{op.name}: block shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _element(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def _check_result(op: Operation, shape: tuple[int, ...], element: Attribute | None) -> None:
    """The written result type is the one the operands give (Triton would compute another)."""
    t = op.results[0].type
    if _shape(t) != shape or (element is not None and _element(t) != element):
        want: object = list(shape)
        if element is not None:
            want = f"{list(shape)} of {format_type(element)}" if shape else format_type(element)
        raise VerifyException(f"{op.name}: the result must be {want}, got {format_type(t)}")


def check_kernel_values(op: Operation) -> None:
    """Kernel ops stand in a tile.kernel, hold no `index` values (Triton has none),
    and no block of more than MAX_BLOCK elements (Triton's largest)."""
    if not op.name.startswith("tile.") or isinstance(op, KernelOp | LaunchOp):
        return
    kernel = op.parent_op()
    while kernel is not None and not isinstance(kernel, KernelOp):
        kernel = kernel.parent_op()
    if kernel is None:
        if op.parent_op() is not None:
            raise VerifyException(
                f"{op.name} is outside any tile.kernel: a host function only allocates and launches"
            )
        return
    values = [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]
    for v in values:
        t = v.type
        if (t.element_type if isinstance(t, TensorType) else t) == IndexType():
            raise VerifyException(
                f"{op.name}: a tile kernel has no index values (Triton has no index type); "
                "use i32 or i64"
            )
        if isinstance(t, TensorType) and math.prod(t.get_shape()) > MAX_BLOCK:
            raise VerifyException(
                f"{op.name}: a block of {math.prod(t.get_shape())} elements "
                f"({format_type(t)}); a Triton block holds at most {MAX_BLOCK}"
            )
        if isinstance(t, TensorType) and any(d & (d - 1) for d in t.get_shape()):
            raise VerifyException(
                f"{op.name}: a block of shape {list(t.get_shape())}; Triton's block sizes "
                "are powers of two"
            )


@irdl_attr_definition
class PtrType(ParametrizedAttribute, TypeAttribute):
    """A pointer to global memory holding elements of `pointee` (`ptr<f32>`)."""

    name = "tile.ptr"
    pointee: Attribute = param_def()


class _LaunchUsesKernel(SymbolUserOpInterface):
    """`tile.launch @name` names a `tile.kernel` of the module, with as many buffers."""

    def verify(self, op: Operation) -> None:
        assert isinstance(op, LaunchOp)
        op.verify_kernel()


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One Triton kernel; `grid` is the number of programs along each axis.

    A symbol (`sym_name`), so that `tile.launch @name` resolves through the
    module's symbol table in MLIR tools too; irc's text spells it `name`.
    """

    name = "tile.kernel"
    sym_name = prop_def(StringAttr)
    grid = prop_def(ArrayAttr)
    warps = opt_prop_def(IntegerAttr)
    stages = opt_prop_def(IntegerAttr)
    persistent = opt_prop_def(IntegerAttr)
    """1: the host starts min(grid, SMs) programs, which share the work in a tile.tiles loop."""
    pdl = opt_prop_def(IntegerAttr)
    """1: launched as a dependent of the kernel before it (programmatic dependent
    launch, on GPUs that have it): it starts early and first waits for that kernel."""
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), SymbolOpInterface())

    TEXT_KEYS: ClassVar[dict[str, str]] = {"name": "sym_name"}
    """irc's text names for properties (`{name = "..."}` is `sym_name`)."""

    @property
    def kernel_name(self) -> StringAttr:
        return self.sym_name

    @kernel_name.setter
    def kernel_name(self, value: StringAttr) -> None:
        self.sym_name = value

    def verify_(self) -> None:
        name = self.kernel_name.data
        check_kernel_name(self.name, name)
        for other in _kernels_before(self):
            # A kernel above whose name is no string fails its own verification.
            if isinstance(other.sym_name, StringAttr) and other.sym_name.data == name:
                raise VerifyException(
                    f"tile.kernel: a kernel above is named {quoted(name)} too (names are unique)"
                )
        for a in self.body.block.args:
            if not isinstance(a.type, PtrType):
                raise VerifyException("tile.kernel: every argument is a pointer (ptr<T>)")
        self._check_launch()
        _check_loads_unwritten(self)

    def _check_launch(self) -> None:
        """The launch parameters, as CUDA and Triton take them."""
        check_int_list(self, "grid", self.grid, 1, MAX_GRID, lengths=(1, 2, 3))
        for axis, attr in enumerate(self.grid.data[1:], 1):
            size = attr.value.data  # type: ignore[attr-defined]
            if size > MAX_GRID_Y:
                raise VerifyException(
                    f"tile.kernel: grid axis {axis} has {size} programs; CUDA launches at most "
                    f"{MAX_GRID_Y} along axes 1 and 2"
                )
        if self.warps is not None:
            check_int(self, "warps", self.warps, 1, MAX_WARPS, power_of_two=True)
        if self.stages is not None:
            check_int(self, "stages", self.stages, 1, MAX_STAGES)
        check_flag(self, "persistent", self.persistent)
        check_flag(self, "pdl", self.pdl)
        if self.persistent is not None and len(self.grid.data) != 1:
            raise VerifyException("tile.kernel: a persistent kernel has a one-axis grid")


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """Starts `kernel` on buffers (host side)."""

    name = "tile.launch"
    kernel = prop_def(SymbolRefAttr)
    args = var_operand_def()
    traits = traits_def(_LaunchUsesKernel())

    def verify_(self) -> None:
        if self.kernel.nested_references.data:
            raise VerifyException("tile.launch: kernel is one name, like @triton_poi_exp_0")

    def verify_kernel(self) -> None:
        """Resolves `@kernel` through the nearest symbol table (the module)."""
        name = self.kernel.root_reference.data
        if self.kernel.nested_references.data:
            return  # verify_ reports it
        try:
            kernel = SymbolTable.lookup_symbol(self, self.kernel)
        except ValueError:
            return  # not in a module (yet): nothing to look the kernel up in
        if not isinstance(kernel, KernelOp):
            raise VerifyException(f"tile.launch: no tile.kernel is named {quoted(name)}")
        want = len(kernel.body.block.args)
        if len(self.args) != want:
            raise VerifyException(
                f"tile.launch: kernel {quoted(name)} takes {want} buffers, got {len(self.args)}"
            )
        for i in sorted(_arguments_accessed(kernel, StoreOp | BlockStoreOp)):
            for j, other in enumerate(self.args):
                if j != i and other == self.args[i]:
                    raise VerifyException(
                        f"tile.launch: the buffer of argument {i}, which {quoted(name)} stores "
                        f"to, is argument {j} too (a kernel may not write a buffer it reads)"
                    )


def _arguments_accessed(kernel: KernelOp, kinds: Any) -> set[int]:
    """Indices of the kernel arguments its ops of `kinds` (loads or stores) access."""
    pointers = {op.ptr for op in kernel.body.walk() if isinstance(op, kinds)}
    return {a.index for a in kernel.body.block.args if a in pointers}


def _check_loads_unwritten(kernel: KernelOp) -> None:
    """No buffer is both loaded and stored by one kernel: what makes loads `Pure`."""
    both = _arguments_accessed(kernel, LoadOp | BlockLoadOp) & _arguments_accessed(
        kernel, StoreOp | BlockStoreOp
    )
    if both:
        raise VerifyException(
            f"tile.kernel: argument {min(both)} is both loaded and stored (a kernel's "
            "loads are pure: it may not write a buffer it reads)"
        )


def kernels(module: ModuleOp) -> list[KernelOp]:
    """The module's tile kernels, in order (its top-level `tile.kernel` ops)."""
    return [op for op in module.body.ops if isinstance(op, KernelOp)]


def _kernels_before(kernel: KernelOp) -> list[KernelOp]:
    """The tile.kernels above `kernel` in its block (kernel names are unique there)."""
    out: list[KernelOp] = []
    op = kernel.prev_op
    while op is not None:
        if isinstance(op, KernelOp):
            out.append(op)
        op = op.prev_op
    return out


@irdl_op_definition
class ProgramIdOp(IRDLOperation):
    name = "tile.program_id"
    axis = prop_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        axis = check_int(self, "axis", self.axis, 0, 2)
        kernel = self.parent_op()
        while kernel is not None and not isinstance(kernel, KernelOp):
            kernel = kernel.parent_op()
        grid = kernel.properties.get("grid") if kernel is not None else None
        if isinstance(grid, ArrayAttr):  # a missing grid is the kernel's own error
            axes = len(grid.data)
            if axis >= axes:
                raise VerifyException(
                    f"tile.program_id: axis {axis}, but the kernel's grid has "
                    f"{axes} ax{'i' if axes == 1 else 'e'}s"
                )
        _check_result(self, (), I32)  # tl.program_id is an i32


@irdl_op_definition
class ArangeOp(IRDLOperation):
    """`[0, 1, ..., size-1]` as a block (size a power of two)."""

    name = "tile.arange"
    size = prop_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        size = check_int(self, "size", self.size, 1, MAX_BLOCK, power_of_two=True)
        t = self.result.type
        if not isinstance(t, TensorType) or t.get_shape() != (size,):
            raise VerifyException(
                f"tile.arange: size {size} makes a block of shape [{size}], not {format_type(t)}"
            )
        _check_result(self, (size,), I32)  # tl.arange makes i32 lanes


@irdl_op_definition
class ExpandDimsOp(IRDLOperation):
    """Inserts a size-1 axis (`x[:, None]` is axis 1)."""

    name = "tile.expand_dims"
    input = operand_def()
    axis = prop_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        shape = _shape(self.input.type)
        check_int(self, "axis", self.axis, 0, len(shape))
        axis = self.axis.value.data
        _check_result(self, shape[:axis] + (1,) + shape[axis:], _element(self.input.type))


@irdl_op_definition
class BroadcastToOp(IRDLOperation):
    """Broadcasts a block or scalar to the result's block shape."""

    name = "tile.broadcast_to"
    input = operand_def()
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        out = _shape(self.result.type)
        shape = _shape(self.input.type)
        if len(shape) > len(out) or _broadcast(self, [shape, out]) != out:
            raise VerifyException(
                f"{self.name}: a block of shape {list(shape)} does not broadcast to {list(out)}"
            )
        _check_result(self, out, _element(self.input.type))


@irdl_op_definition
class ColumnPartOp(IRDLOperation):
    """Columns [part * w, (part + 1) * w) of a 2-d block, w its columns over `parts`.

    A GEMM's epilogue runs on parts of a wide accumulator (loop-to-tile's
    `epilogue_parts`): the temporaries of one part and the rest of the
    accumulator fit the registers where those of the whole tile spilled. In
    Triton a part is a `tl.split` of a reshape, which moves no data.
    """

    name = "tile.column_part"
    input = operand_def()
    part = prop_def(IntegerAttr)
    parts = prop_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        shape = _shape(self.input.type)
        if len(shape) != 2:
            raise VerifyException(f"{self.name}: the input must be a 2-d block, got {list(shape)}")
        rows, cols = shape
        parts = check_int(self, "parts", self.parts, 2, max(2, cols), power_of_two=True)
        check_int(self, "part", self.part, 0, parts - 1)
        if cols % parts:
            raise VerifyException(f"{self.name}: {cols} columns do not split into {parts} parts")
        _check_result(self, (rows, cols // parts), _element(self.input.type))


@irdl_op_definition
class ApplyOp(IRDLOperation):
    """Element-wise op on blocks and scalars, broadcasting; `fn` as in loop.apply."""

    name = "tile.apply"
    fn = fn_property("tile.apply")
    args = var_operand_def()
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        check_apply(self, self.fn, len(self.args))
        for a in self.args:
            if isinstance(a.type, PtrType):
                raise VerifyException(
                    f"{self.name}: operands are blocks or scalars, not pointers "
                    f"({format_type(a.type)})"
                )
        check_apply_types(self, self.fn.data, [a.type for a in self.args], self.result.type)
        shape = _broadcast(self, [_shape(a.type) for a in self.args])
        if _shape(self.result.type) != shape:
            raise VerifyException(
                f"{self.name}: the operands broadcast to shape {list(shape)}, but the result "
                f"is {format_type(self.result.type)}"
            )


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A scalar, or a block filled with `value` when the type is a block."""

    name = "tile.constant"
    value = prop_def(Attribute)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        check_number(self, "value", self.value, self.result.type)


@irdl_op_definition
class LoadOp(IRDLOperation):
    """`ptr[offsets]` where `mask` holds (`other` elsewhere); mask is optional.

    Pure: a kernel never stores to a buffer it loads from (`tile.kernel`
    checks), so a load gives the same block wherever it stands in the kernel;
    `cse` shares equal loads (a persistent softmax reads its row once) and
    `dce` drops unused ones.
    """

    name = "tile.load"
    ptr = operand_def(PtrType)
    offsets = operand_def()
    mask = var_operand_def()
    other = opt_prop_def(Attribute)
    evict = opt_prop_def(StringAttr)
    """L2 eviction hint, "first" or "last" (Triton's eviction_policy)."""
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        if self.evict is not None and self.evict.data not in ("first", "last"):
            raise VerifyException('tile.load: evict is "first" or "last"')
        if self.other is not None:
            check_number(self, "other", self.other, self.result.type)
        shapes = [_shape(self.offsets.type), *(_shape(m.type) for m in self.mask)]
        shape = _broadcast(self, shapes)
        if _shape(self.result.type) != shape:
            raise VerifyException(
                f"{self.name}: the offsets (and mask) have shape {list(shape)}, but the result "
                f"is {format_type(self.result.type)}"
            )


@irdl_op_definition
class StoreOp(IRDLOperation):
    """`ptr[offsets] = value` where `mask` holds; mask is optional."""

    name = "tile.store"
    ptr = operand_def(PtrType)
    offsets = operand_def()
    value = operand_def()
    mask = var_operand_def()

    def verify_(self) -> None:
        # Triton's tl.store broadcasts the value and the mask to the offsets' shape,
        # never the offsets to theirs: a wider value would be a compile error on the
        # GPU (and several values for one address, a race).
        offsets = _shape(self.offsets.type)
        shapes = [offsets, _shape(self.value.type), *(_shape(m.type) for m in self.mask)]
        shape = _broadcast(self, shapes)
        if shape != offsets:
            raise VerifyException(
                f"{self.name}: the value (and mask) broadcast to shape {list(shape)}, wider "
                f"than the offsets' {list(offsets)}: a store writes one value an offset"
            )


def _check_block_access(
    op: IRDLOperation,
    shape: ArrayAttr,
    box: tuple[int, ...],
    element: Attribute,
    pitch: IntegerAttr | None = None,
) -> None:
    """The buffer's two sizes, and a box of it that the copy engine can move (CUDA
    would refuse it at run time, Triton when it compiles the kernel)."""
    if len(shape.data) != 2 or not all(isinstance(d, IntegerAttr) for d in shape.data):
        raise VerifyException(f"{op.name}: 'shape' is the buffer's two sizes")
    sizes = [d.value.data for d in shape.data]  # type: ignore[attr-defined]
    if pitch is not None:
        sizes[1] = check_int(op, "pitch", pitch, sizes[1], I32_MAX)
    problem = box_problem(sizes, box, element) if len(box) == 2 else None
    if problem is not None:
        raise VerifyException(f"{op.name}: {problem}")


@irdl_op_definition
class BlockLoadOp(IRDLOperation):
    """The block at (`row`, `col`) of a row-major 2-d buffer of `shape` (zero outside),
    or with `transposed = 1` that block transposed (the result's rows are its columns).
    With `pitch`, the buffer's rows are `pitch` elements long and `shape` is its first
    `shape[1]` columns (a row-padded copy, `pad-gemm-operands`): the copy engine reads
    nothing past them.

    Lowered to a TMA descriptor load: the copy engine moves the tile to shared
    memory, so dot operands need neither index math nor masks. A transposed one
    is a dot operand read along K from a buffer stored the other way round (an
    `nn.Linear` weight, `[N, K]`), which the tensor cores take from shared memory
    as it lies. Pure, as `tile.load` is.
    """

    name = "tile.block_load"
    ptr = operand_def(PtrType)
    row = operand_def()
    col = operand_def()
    shape = prop_def(ArrayAttr)
    transposed = opt_prop_def(IntegerAttr)
    pitch = opt_prop_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        check_flag(self, "transposed", self.transposed)
        _check_block_access(
            self, self.shape, self.box(), _element(self.result.type), self.pitch
        )

    def buffer_shape(self) -> list[int]:
        """The shape of the buffer the block is read from (rows of `pitch` elements)."""
        rows, cols = (int(d.value.data) for d in self.shape.data)  # type: ignore[attr-defined]
        return [rows, cols if self.pitch is None else int(self.pitch.value.data)]

    def box(self) -> tuple[int, ...]:
        """The block of the buffer the copy engine moves (the result, untransposed)."""
        t = self.result.type
        dims = tuple(int(d) for d in t.get_shape()) if isinstance(t, TensorType) else ()
        return dims[::-1] if self.transposed is not None else dims


BLOCK_STORE_PARTS = 2
"""Column slices a `tile.block_store` is written in, where each keeps a TMA box's
16-byte rows. Measured on an H100 (persistent bf16 GEMMs, 128x256x64 tiles, 8
warps): in halves, 8192x768 @ 768x3072 took 64.3 us at 3 stages and 62.9 at 4
(which only halves leave shared memory for), against 65.8 whole (cuBLAS 62.0);
4096^3 190.9 against 193.2 (cuBLAS 190.3)."""


def block_store_parts(cols: int, element: Attribute) -> int:
    """Column slices a block store of `cols` columns of `element` is written in."""
    parts = BLOCK_STORE_PARTS
    if cols % parts or cols // parts * element_bytes(element) < 16:
        return 1
    return parts


@irdl_op_definition
class BlockStoreOp(IRDLOperation):
    """Stores a block at (`row`, `col`) of a row-major 2-d buffer; lanes outside are dropped.

    Lowered to `slices()` TMA stores of column slices (Triton's epilogue
    subtiles): each stages its slice in shared memory, so a persistent GEMM's
    epilogue takes a fraction of the tile there and its K loop a deeper pipeline.
    With `whole = 1` it is one store: the value is already a column part of the
    tile (`tile.column_part`), stored while the next part is computed.
    """

    name = "tile.block_store"
    ptr = operand_def(PtrType)
    row = operand_def()
    col = operand_def()
    value = operand_def()
    shape = prop_def(ArrayAttr)
    whole = opt_prop_def(IntegerAttr)

    def verify_(self) -> None:
        check_flag(self, "whole", self.whole)
        _check_block_access(self, self.shape, self.box(), _element(self.value.type))

    def buffer_shape(self) -> list[int]:
        """The shape of the buffer the block is stored into (its `shape`)."""
        return [int(d.value.data) for d in self.shape.data]  # type: ignore[attr-defined]

    def slices(self) -> int:
        """The TMA stores the value is written in, one a column slice."""
        dims = _shape(self.value.type)
        if self.whole is not None or len(dims) != 2:
            return 1
        return block_store_parts(dims[1], _element(self.value.type))

    def box(self) -> tuple[int, ...]:
        """The block of the buffer one TMA store moves: a column slice of the value."""
        dims = tuple(int(d) for d in _shape(self.value.type))
        if len(dims) != 2:
            return dims
        rows, cols = dims
        return (rows, cols // self.slices())


@irdl_op_definition
class TilesOp(IRDLOperation):
    """`for t in range(program_id, count, programs)`: a persistent program's share of tiles.

    The region takes the tile index twice: the second copy is counted
    separately in the generated loop, for the epilogue, so that Triton's
    pipeliner does not keep the next tile's indices alive across it (the
    persistent matmul of Triton's tutorials does the same).
    """

    name = "tile.tiles"
    count = prop_def(IntegerAttr)
    body = region_def("single_block")

    def verify_(self) -> None:
        check_int(self, "count", self.count, 1, I32_MAX)
        block = self.body.block
        if len(block.args) != 2 or any(a.type != I32 for a in block.args):
            raise VerifyException(
                "tile.tiles: the region takes the tile index, twice, as i32 values"
            )
        last = block.last_op
        if not isinstance(last, YieldOp) or last.values:
            raise VerifyException("tile.tiles: the region must end in an empty tile.yield")


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """Reduces a block along `axis` (`kind` sum, max or min; NaN propagating)."""

    name = "tile.reduce"
    kind = prop_def(StringAttr)
    axis = prop_def(IntegerAttr)
    input = operand_def()
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        check_choice(self, "kind", self.kind, REDUCE_KINDS)
        check_sum_element(self, self.kind.data, self.input.type)
        rank = len(_shape(self.input.type))
        if rank == 0:
            raise VerifyException("tile.reduce: the input must be a block, not a scalar")
        check_int(self, "axis", self.axis, 0, rank - 1)
        shape = _shape(self.input.type)
        axis = self.axis.value.data
        # The result keeps the input's element type, as the tl.sum / tl.reduce that
        # tile-to-triton prints gives it; another written type would be a lie that
        # the values after it (stores, applies) would be checked against.
        _check_result(self, shape[:axis] + shape[axis + 1 :], _element(self.input.type))


@irdl_op_definition
class DotOp(IRDLOperation):
    """`acc + a @ b` on tiles; `precision` is Triton's input_precision."""

    name = "tile.dot"
    a = operand_def()
    b = operand_def()
    acc = operand_def()
    precision = opt_prop_def(StringAttr)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        if self.precision is not None:
            check_choice(self, "precision", self.precision, DOT_PRECISIONS)
        a, b, acc = (_shape(v.type) for v in (self.a, self.b, self.acc))
        if len(a) != 2 or len(b) != 2 or a[1] != b[0] or acc != (a[0], b[1]):
            raise VerifyException(
                f"{self.name}: shapes {list(a)} @ {list(b)} + {list(acc)} do not make a product"
            )
        if a[1] < MIN_DOT_K:
            raise VerifyException(
                f"{self.name}: K = {a[1]}; Triton compiles dots of K >= {MIN_DOT_K} only"
            )
        # tl.dot's types: one float operand type, accumulated in f32 (f64 for f64).
        element, acc_element = _element(self.a.type), _element(self.acc.type)
        want = F64 if element == F64 else F32
        if element != _element(self.b.type) or element not in DOT_ELEMENTS or acc_element != want:
            raise VerifyException(
                f"{self.name}: the operands are f16, bf16, f32 or f64 tiles of one type, "
                f"accumulated in f32 (f64 for f64); got {format_type(self.a.type)} @ "
                f"{format_type(self.b.type)} + {format_type(self.acc.type)}"
            )
        if self.precision is not None and self.precision.data != "ieee" and element != F32:
            raise VerifyException(
                f"{self.name}: precision {quoted(self.precision.data)} is for f32 operands; "
                f"got {format_type(self.a.type)}"
            )
        _check_result(self, acc, acc_element)


@irdl_op_definition
class ForOp(IRDLOperation):
    """`for iv in range(lb, ub, step)` carrying values (the region's extra arguments)."""

    name = "tile.for"
    lb = prop_def(IntegerAttr)
    ub = prop_def(IntegerAttr)
    step = prop_def(IntegerAttr)
    inits = var_operand_def()
    results_ = var_result_def()
    body = region_def("single_block")

    def verify_(self) -> None:
        check_int(self, "step", self.step, 1)
        block = self.body.block
        if len(block.args) != len(self.inits) + 1:
            raise VerifyException("tile.for: the region takes the index and one value per init")
        iv = block.args[0].type
        bits = iv.width.data if isinstance(iv, IntegerType) else 64
        for name in ("lb", "ub"):
            check_int(self, name, getattr(self, name), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if self.ub.value.data + self.step.value.data - 1 > 2 ** (bits - 1) - 1:
            raise VerifyException(
                f"tile.for: an i{bits} index stepping by {self.step.value.data} past "
                f"ub = {self.ub.value.data} would wrap around (and never stop): index in i64"
            )
        last = block.last_op
        if not isinstance(last, YieldOp) or len(last.values) != len(self.inits):
            raise VerifyException(
                "tile.for: the region must end in tile.yield of the carried values"
            )
        carried = [v.type for v in self.inits]
        for what, types in (
            ("region arguments", [a.type for a in block.args[1:]]),
            ("yielded values", [v.type for v in last.values]),
            ("results", [r.type for r in self.results]),
        ):
            if types != carried:
                raise VerifyException(
                    f"tile.for: the {what} ({', '.join(format_type(t) for t in types)}) must "
                    f"have the types of the carried values ({', '.join(format_type(t) for t in carried)})"
                )


@irdl_op_definition
class ForStopOp(IRDLOperation):
    """Ends the enclosing `tile.for` early: it runs while its index is below
    min(ub, `stop`), a scalar computed before the loop. The first op of the loop's
    body (after its `tile.for_start`, if any). The loop's iterations are a prefix
    of `range(lb, ub, step)`, so what is proved of those holds
    (irc.analysis.bounds). An attention under a causal mask stops at the diagonal
    of its rows, skipping the key tiles it would mask whole
    (lowering/attention_to_tile.py)."""

    name = "tile.for_stop"
    stop = operand_def()

    def verify_(self) -> None:
        loop = self.parent_op()
        first = loop.body.block.first_op if isinstance(loop, ForOp) else None
        if first is not self and not (isinstance(first, ForStartOp) and first.next_op is self):
            raise VerifyException("tile.for_stop: the first op of a tile.for's body")
        _check_loop_bound(self, self.stop, loop)


@irdl_op_definition
class ForStartOp(IRDLOperation):
    """Starts the enclosing `tile.for` late: its first index is max(lb, `start`), a
    scalar computed before the loop that its maker keeps lb plus a multiple of
    step. The first op of the loop's body. The iterations are then a subset of
    `range(lb, ub, step)`, so what is proved of those holds. An attention under a
    causal mask runs its key tiles below the diagonal in one loop without the mask
    and starts a second, masked, loop at the diagonal tiles
    (lowering/attention_to_tile.py)."""

    name = "tile.for_start"
    start = operand_def()

    def verify_(self) -> None:
        loop = self.parent_op()
        if not isinstance(loop, ForOp) or loop.body.block.first_op is not self:
            raise VerifyException("tile.for_start: the first op of a tile.for's body")
        _check_loop_bound(self, self.start, loop)


def _check_loop_bound(op: Operation, bound: SSAValue, loop: Operation | None) -> None:
    """A dynamic loop bound is an integer scalar computed before the loop."""
    t = bound.type
    if not isinstance(t, IntegerType) or t.width.data not in (32, 64):
        raise VerifyException(f"{op.name}: the bound is an i32 or i64 scalar, not {format_type(t)}")
    owner = bound.owner
    inside = owner.parent_op() if isinstance(owner, Block) else owner
    while inside is not None:
        if inside is loop:
            raise VerifyException(f"{op.name}: the bound is computed before the loop")
        inside = inside.parent_op()


@irdl_op_definition
class CheckOp(IRDLOperation):
    """Asserts `cond` in every lane at run time (`tl.device_assert`, active when
    Triton's debug mode is): the loaded indices of index_select and gather are in
    range. Not pure, so nothing removes it; `what` names the check in words."""

    name = "tile.check"
    cond = operand_def()
    what = prop_def(StringAttr)

    def verify_(self) -> None:
        t = self.cond.type
        element = t.element_type if isinstance(t, TensorType) else t
        if element != IntegerType(1):
            raise VerifyException(f"tile.check: the condition must be i1, got {format_type(t)}")


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "tile.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator())

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), ForOp | TilesOp | None):
            raise VerifyException("tile.yield ends the region of a tile.for or tile.tiles only")


Tile = Dialect(
    "tile",
    [
        KernelOp, LaunchOp, ProgramIdOp, ArangeOp, ExpandDimsOp, BroadcastToOp, ColumnPartOp, ApplyOp,
        ConstantOp, LoadOp, StoreOp, BlockLoadOp, BlockStoreOp, ReduceOp, DotOp, ForOp,
        ForStopOp, ForStartOp, TilesOp, YieldOp, CheckOp,
    ],
    [PtrType],
)  # fmt: skip
