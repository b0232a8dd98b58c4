"""tile -> Triton: prints a tile-level module as one self-contained Python module.

The output reads like Inductor's `output_code.py`: imports, small NaN-aware
helpers, one `@triton.jit` function per tile.kernel, then one host function
per IR function that checks its torch tensors, allocates outputs and launches.
`FUNCTIONS` maps IR function names to host functions. No generated identifier
comes from an IR name: values are `v0, v1, ...`, host functions `fn0, ...`,
and IR names appear only inside string literals and comments.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import math
import operator
import re
from collections.abc import Callable

from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, MemRefType, ModuleOp, TensorType
from xdsl.ir import Attribute, Block, Operation, SSAValue

from irc.dialects import graph, loop, tile
from irc.dialects.graph import Template
from irc.ir.names import kernel_name_problem, quoted
from irc.ir.types import (
    ELEMENT_TYPES,
    ELEMENTS,
    FLOAT_NAMES,
    FLOAT_TYPES,
    I1,
    element_bytes,
    element_name,
    format_type,
)
from irc.passes.tile import VECTOR_BYTES
from irc.syntax.diagnostics import IrcError, op_location

TL_DTYPE = {n: f"tl.{e.triton}" for n, e in ELEMENTS.items()}
TORCH_DTYPE = {n: f"torch.{e.torch}" for n, e in ELEMENTS.items()}
# The sign bit alone, and the unsigned type of the same width, for each float type.
NEGATIVE_ZERO_BITS = {
    n: (hex(1 << (e.bits - 1)), f"tl.uint{e.bits}")
    for n, e in ELEMENTS.items()
    if e.kind == "float"
}

HEADER = """\
import torch
import triton
import triton.language as tl

from irc.runtime.helpers import (  # the @triton.jit helpers the kernels call
    _irc_dot_bf16, _irc_dot_split_tf32, _irc_exp, _irc_from_bf16, _irc_gelu_half, _irc_max,
    _irc_min, _irc_pow, _irc_tanh, _irc_tf32_head, _irc_tf32_parts, _irc_tf32_tail, _irc_to_bf16,
    _irc_wait_for_previous_kernel,
)
from irc.runtime.launch import (
    host_functions,
    library_matmul as _library_matmul,
    library_operand as _library_operand,
)

# irc.compile sets DEVICE before running this module; run on its own, it picks.
DEVICE = globals().get("DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
# Argument checks, kernel launches and grids for DEVICE (irc/runtime/launch.py).
_check, _launch, _persistent_grid, _ensure_allocator = host_functions(DEVICE)
"""


def _number(value: float | int, element: str) -> str:
    if element in FLOAT_NAMES:
        try:
            v = float(value)
        except OverflowError:  # an integer beyond every float: it rounds to infinity
            v = math.copysign(math.inf, value)
        if math.isnan(v):
            text = 'float("nan")'
        elif math.isinf(v):
            text = 'float("inf")' if v > 0 else 'float("-inf")'
        else:
            text = repr(v)
        return text
    if element == "i1":
        return "1" if value else "0"
    # An integral float (`0.0 : i32`, as the verifier allows) is written as the integer.
    return str(int(value) if isinstance(value, float) else operator.index(value))


def _attr_number(attr: Attribute) -> float | int:
    if isinstance(attr, FloatAttr):
        return attr.value.data
    assert isinstance(attr, IntegerAttr)
    return attr.value.data


def _int(attr: Attribute) -> int:
    """An integer attribute as an `int`: its text in the source is only digits."""
    assert isinstance(attr, IntegerAttr), f"tile-to-triton: {attr} is not an integer"
    return operator.index(attr.value.data)


def _element(v: SSAValue) -> Attribute:
    t = v.type
    return t.element_type if isinstance(t, TensorType) else t


def _elem(v: SSAValue) -> str:
    return element_name(_element(v))


def _shape(v: SSAValue) -> tuple[int, ...]:
    return tuple(map(operator.index, v.type.get_shape())) if isinstance(v.type, TensorType) else ()


# The functions of tile.apply that are no graph op: index arithmetic and mask logic.
INDEX_TEMPLATES: dict[str, Template] = {
    "floordiv": "{0} // {1}",
    "mod": "{0} % {1}",
    "and": "{0} & {1}",
    "or": "{0} | {1}",
    # The clamp alone: loop-to-tile checks the index itself (tile.check) before it.
    "checked_index": "tl.minimum(tl.maximum({0}, 0), {1} - 1)",
}
# Float functions the lowerings add (loop.LOWERING_FNS).
LOWERING_TEMPLATES: dict[str, Template] = {
    "mul_add": "tl.fma({0}, {1}, {2})",
    "tf32_head": "_irc_tf32_head({0})",
    "tf32_tail": "_irc_tf32_tail({0})",
}
# fn -> Triton template, by arity: each element-wise graph op's own TRITON (a
# mapping where it differs by element type), and the functions above; cast is
# built by `apply` from its source and target types.
TEMPLATES: dict[int, dict[str, Template]] = {1: {}, 2: {}, 3: {}}
for _op in graph.ELEMENTWISE_OPS:
    if _op.TRITON is not None:
        TEMPLATES[_op.ARITY][_op.FN] = _op.TRITON
    TEMPLATES[_op.ARITY].update(_op.EXTRA_FNS)
TEMPLATES[2].update(INDEX_TEMPLATES)
for _fn, _template in LOWERING_TEMPLATES.items():
    TEMPLATES[loop.LOWERING_FNS[_fn]][_fn] = _template
UNARY, BINARY = TEMPLATES[1], TEMPLATES[2]


def template_for(template: Template, element: str, half_result: bool = False) -> str:
    """The template's form for operands of `element` (by name, then float or int);
    its `HALF_RESULT` form for f32 operands where `half_result` says the result is
    only rounded to a half type."""
    if isinstance(template, str):
        return template
    if half_result and element == "f32" and graph.HALF_RESULT in template:
        return template[graph.HALF_RESULT]
    if element in template:
        return template[element]
    return template["float" if element in FLOAT_NAMES else "int"]


def rounded_to_half(v: SSAValue) -> bool:
    """Whether every use of `v` rounds it to f16 or bf16, and nothing reads it wider
    (a `graph.HALF_RESULT` form's few f32 ulps then vanish in that rounding)."""
    uses = [use.operation for use in v.uses]
    return bool(uses) and all(
        isinstance(u, tile.ApplyOp) and u.fn.data == "cast" and _elem(u.result) in ("f16", "bf16")
        for u in uses
    )


REDUCE_COMBINE = {"sum": "sum", "max": "_irc_max", "min": "_irc_min"}
"""tile.reduce kinds -> the combine function of tl.reduce (tl.sum for sums)."""


def vector_elements(n: int, element_bytes: int) -> int:
    """Elements of the widest access (at most 16 bytes) that a masked kernel over `n`
    elements can make: the largest power of two dividing `n`. Triton's mask `i < n`
    is constant over such groups only, and splits a wider access into these; where
    that is narrower than 16 bytes, `partial_last_program` peels the last program,
    and the others make 16-byte accesses."""
    width = max(1, VECTOR_BYTES // element_bytes)
    while width > 1 and n % width:
        width //= 2
    return width


def partial_last_program(kernel: tile.KernelOp) -> tuple[SSAValue, int] | None:
    """(mask, full programs) of a kernel whose programs take `block` consecutive
    elements each, `i = program_id * block + arange(block)`, under the bounds mask
    `i < n`, where `n` is no multiple of the block and a masked access of `i` is
    narrower than 16 bytes for it: Triton splits an access into the widths over
    which the mask is constant, element by element for an odd `n`. Before the last
    program the mask is all true; written so, it lets the accesses of those
    programs be 16-byte vectors."""
    grid = [_int(g) for g in kernel.grid.data]
    if len(grid) != 1 or kernel.persistent is not None:
        return None
    for op in kernel.body.block.ops:
        match = _bounds_mask(op)
        if match is None:
            continue
        mask, index, block, n = match
        if n % block == 0 or grid[0] != -(-n // block) or grid[0] < 2:
            continue
        for use in mask.uses:
            access = use.operation
            if isinstance(access, tile.LoadOp | tile.StoreOp) and access.offsets is index:
                size = element_bytes(access.ptr.type.pointee)  # type: ignore[attr-defined]
                if vector_elements(n, size) * size < VECTOR_BYTES:
                    return mask, n // block
    return None


def _bounds_mask(op: Operation) -> tuple[SSAValue, SSAValue, int, int] | None:
    """(mask, index, block, n) where `op` is `index < n` of a constant `n` and `index`
    is `program_id(0) * block + arange(block)` (the first program's block first)."""
    if not (isinstance(op, tile.ApplyOp) and op.fn.data == "lt" and len(op.args) == 2):
        return None
    index, bound = op.args
    n = _constant(bound)
    add = index.owner
    if n is None or not (isinstance(add, tile.ApplyOp) and add.fn.data == "add"):
        return None
    for start, lanes in (add.args, add.args[::-1]):
        if not isinstance(lanes.owner, tile.ArangeOp):
            continue
        block = _int(lanes.owner.size)
        mul = start.owner
        if isinstance(mul, tile.ApplyOp) and mul.fn.data == "mul" and len(mul.args) == 2:
            pid, step = mul.args
            if _constant(pid) == block:
                pid, step = step, pid
            if (
                isinstance(pid.owner, tile.ProgramIdOp)
                and _int(pid.owner.axis) == 0
                and _constant(step) == block
            ):
                return op.results[0], index, block, n
    return None


def _constant(v: SSAValue) -> int | None:
    """The value of an integer scalar `tile.constant`, else None."""
    c = v.owner
    if isinstance(c, tile.ConstantOp) and not _shape(v) and isinstance(c.value, IntegerAttr):
        return _int(c.value)
    return None


class KernelPrinter:
    """One @triton.jit function from one tile.kernel."""

    def __init__(self, kernel: tile.KernelOp, identifier: str):
        self.kernel = kernel
        self.identifier = identifier  # from kernel_identifiers: a checked kernel name
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.counter = 0
        self.true_mask: SSAValue | None = None  # emitted as all true (`partial_last_program`)

    def name(self, v: SSAValue) -> str:
        if v not in self.names:
            self.names[v] = f"v{self.counter}"
            self.counter += 1
        return self.names[v]

    def text(self) -> str:
        args = self.kernel.body.block.args
        for i, a in enumerate(args):
            self.names[a] = f"ptr{i}"
        head = f"def {self.identifier}({', '.join(self.names[a] for a in args)}):"
        self.descriptors()
        if self.kernel.pdl is not None:
            self.emit(1, "_irc_wait_for_previous_kernel()")
        peel = partial_last_program(self.kernel)
        if peel is None:
            self.block(self.kernel.body.block, 1)
        else:
            # The programs before the last see their bounds mask all true: a constant
            # mask, over which Triton keeps 16-byte accesses (docs/lowering.md).
            self.true_mask, full = peel
            self.emit(1, f"if tl.program_id(0) < {full}:")
            self.block(self.kernel.body.block, 2)
            self.true_mask = None
            self.emit(1, "else:")
            self.block(self.kernel.body.block, 2)
        text = "@triton.jit\n" + head + "\n" + "\n".join(self.lines)
        if self.identifier != self.kernel.kernel_name.data:
            text = f"# tile.kernel {quoted(self.kernel.kernel_name.data)}\n" + text
        return text

    def block(self, block: Block, depth: int) -> None:
        """The block's statements; `pass` where none are left (a kernel or loop whose
        ops all fed nothing it stores, which dce removed), so the Python parses."""
        emitted = len(self.lines)
        for op in block.ops:
            self.op(op, depth)
        if len(self.lines) == emitted:
            self.emit(depth, "pass")

    def descriptors(self) -> None:
        """One TMA descriptor per buffer and box that block loads or stores use, made once."""
        self.descriptor: dict[tile.BlockLoadOp | tile.BlockStoreOp, str] = {}
        made: dict[tuple[SSAValue, tuple[int, ...]], str] = {}
        for op in self.kernel.body.walk():
            if not isinstance(op, tile.BlockLoadOp | tile.BlockStoreOp):
                continue
            box = op.box()
            key = (op.ptr, box)
            if key not in made:
                made[key] = f"d{len(made)}"
                rows, cols = (_int(d) for d in op.shape.data)
                pitch = op.buffer_shape()[1]
                self.emit(
                    1,
                    f"{made[key]} = tl.make_tensor_descriptor({self.name(op.ptr)}, "
                    f"shape=[{rows}, {cols}], strides=[{pitch}, 1], block_shape={list(box)})",
                )
            self.descriptor[op] = made[key]

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def fresh(self) -> str:
        """A name for a temporary of the generated code."""
        self.counter += 1
        return f"v{self.counter - 1}"

    def split_columns(
        self, value: str, rows: int, cols: int, depth: int, names: list[str] | None = None
    ) -> list[str]:
        """Emits the two column halves of the block `value` (`names`, or fresh ones):
        a reshape to [rows, 2, cols / 2], a permute and a split, which move no data."""
        halves = names if names is not None else [self.fresh(), self.fresh()]
        self.emit(
            depth,
            f"{halves[0]}, {halves[1]} = "
            f"tl.split(tl.permute(tl.reshape({value}, ({rows}, 2, {cols // 2})), (0, 2, 1)))",
        )
        return halves

    def column_part(self, op: tile.ColumnPartOp, depth: int) -> None:
        """Halves the columns until the part is left (`split_columns`), the high half
        second at each step."""
        value = self.name(op.input)
        rows, cols = _shape(op.input)
        parts, part = _int(op.parts), _int(op.part)
        while parts > 1:
            names = [self.fresh(), self.fresh()]
            if parts == 2:  # the last halving makes the result
                names[part] = self.name(op.result)
            value = self.split_columns(value, rows, cols, depth, names)[part * 2 // parts]
            cols, parts, part = cols // 2, parts // 2, part % (parts // 2)

    def block_store(self, op: tile.BlockStoreOp, depth: int) -> None:
        """One TMA store a column slice (`tile.BlockStoreOp.slices`): the value's
        halves (`split_columns`)."""
        d, row, col, value = self.descriptor[op], self.name(op.row), self.name(op.col), self.name(op.value)
        rows, cols = _shape(op.value)
        if op.slices() == 1:
            self.emit(depth, f"{d}.store([{row}, {col}], {value})")
            return
        left, right = self.split_columns(value, rows, cols, depth)
        self.emit(depth, f"{d}.store([{row}, {col}], {left})")
        self.emit(depth, f"{d}.store([{row}, {col} + {cols // 2}], {right})")

    def address(self, ptr: SSAValue, offsets: SSAValue) -> str:
        """`ptr + offsets`; where the offsets are `a + b` of a narrower and a wider
        block, `ptr + a + b`: the narrow part (a row's start, plus an unrolled
        chunk's) joins the pointer first, so that accesses sharing the sum do not
        keep a block of it in registers between them. A softmax row held in 25
        unrolled chunks spilled 82-160 registers on an H100 without this, and ran
        1.6-2.7x slower; the ten benchmark workloads ran as fast either way."""
        add = offsets.owner
        if isinstance(add, tile.ApplyOp) and add.fn.data == "add":
            small, large = sorted(add.args, key=lambda v: math.prod(_shape(v)))
            if math.prod(_shape(small)) < math.prod(_shape(large)):
                return f"{self.name(ptr)} + {self.name(small)} + {self.name(large)}"
        return f"{self.name(ptr)} + {self.name(offsets)}"

    def assign(self, op: Operation, depth: int, expr: str) -> None:
        self.emit(depth, f"{self.name(op.results[0])} = {expr}")

    def op(self, op: Operation, depth: int) -> None:
        n = self.name
        if op.results and op.results[0] is self.true_mask:
            self.assign(op, depth, f"tl.full({list(_shape(op.results[0]))}, 1, tl.int1)")
        elif isinstance(op, tile.ProgramIdOp):
            self.assign(op, depth, f"tl.program_id({_int(op.axis)})")
        elif isinstance(op, tile.ArangeOp):
            self.assign(op, depth, f"tl.arange(0, {_int(op.size)})")
        elif isinstance(op, tile.ExpandDimsOp):
            self.assign(op, depth, f"tl.expand_dims({n(op.input)}, {_int(op.axis)})")
        elif isinstance(op, tile.ColumnPartOp):
            self.column_part(op, depth)
        elif isinstance(op, tile.BroadcastToOp):
            self.assign(op, depth, f"tl.broadcast_to({n(op.input)}, {_shape(op.result)})")
        elif isinstance(op, tile.ConstantOp):
            elem = _elem(op.result)
            number = _attr_number(op.value)
            shape = list(_shape(op.result))
            if elem in NEGATIVE_ZERO_BITS and number == 0 and math.copysign(1.0, number) < 0:
                # Triton makes any constant equal to 0 a +0.0: -0.0 is built from its bits.
                bits, unsigned = NEGATIVE_ZERO_BITS[elem]
                expr = f"tl.full({shape}, {bits}, {unsigned}).to({TL_DTYPE[elem]}, bitcast=True)"
            else:
                expr = f"tl.full({shape}, {_number(number, elem)}, {TL_DTYPE[elem]})"
            self.assign(op, depth, expr)
        elif isinstance(op, tile.ApplyOp):
            self.assign(op, depth, self.apply(op))
        elif isinstance(op, tile.LoadOp):
            ptr = self.address(op.ptr, op.offsets)
            hint = f", eviction_policy={'evict_' + op.evict.data!r}" if op.evict is not None else ""
            if op.mask:
                other = _number(_attr_number(op.other), _elem(op.result)) if op.other else "0"
                self.assign(op, depth, f"tl.load({ptr}, mask={n(op.mask[0])}, other={other}{hint})")
            else:
                self.assign(op, depth, f"tl.load({ptr}{hint})")
        elif isinstance(op, tile.StoreOp):
            mask = f", mask={n(op.mask[0])}" if op.mask else ""
            self.emit(depth, f"tl.store({self.address(op.ptr, op.offsets)}, {n(op.value)}{mask})")
        elif isinstance(op, tile.CheckOp):
            # The message is irc's own text, passed as a Python literal (never as code).
            self.emit(depth, f"tl.device_assert({n(op.cond)}, {op.what.data!r})")
        elif isinstance(op, tile.BlockLoadOp):
            block = f"{self.descriptor[op]}.load([{n(op.row)}, {n(op.col)}])"
            self.assign(op, depth, f"tl.trans({block})" if op.transposed is not None else block)
        elif isinstance(op, tile.BlockStoreOp):
            self.block_store(op, depth)
        elif isinstance(op, tile.ReduceOp):
            axis = _int(op.axis)
            combine = REDUCE_COMBINE[op.kind.data]  # the verifier allows these kinds only
            if combine == "sum":
                self.assign(op, depth, f"tl.sum({n(op.input)}, {axis})")
            else:
                self.assign(op, depth, f"tl.reduce({n(op.input)}, {axis}, {combine})")
        elif isinstance(op, tile.DotOp) and op.precision and op.precision.data == "split-tf32":
            self.assign(op, depth, f"_irc_dot_split_tf32({n(op.a)}, {n(op.b)}, {n(op.acc)})")
        elif isinstance(op, tile.DotOp):
            precision = f", input_precision={op.precision.data!r}" if op.precision else ""
            if _elem(op.acc) == "f64":
                precision += ", out_dtype=tl.float64"  # tl.dot's default out_dtype is f32
            dot = "_irc_dot_bf16" if _elem(op.a) == "bf16" and not precision else "tl.dot"
            self.assign(op, depth, f"{dot}({n(op.a)}, {n(op.b)}, {n(op.acc)}{precision})")
        elif isinstance(op, tile.ForOp):
            self.for_loop(op, depth)
        elif isinstance(op, tile.TilesOp):
            # flatten: Triton pipelines a GEMM's tile loop and the K loop inside it as
            # one (a persistent row's two loops over its chunks stay loops of their own).
            t, out = op.body.block.args
            flatten = ", flatten=True" if any(isinstance(o, tile.DotOp) for o in op.walk()) else ""
            self.emit(depth, f"{n(out)} = tl.program_id(0) - tl.num_programs(0)")
            self.emit(
                depth,
                f"for {n(t)} in tl.range(tl.program_id(0), "
                f"{_int(op.count)}, tl.num_programs(0){flatten}):",
            )
            self.emit(depth + 1, f"{n(out)} = {n(out)} + tl.num_programs(0)")
            self.block(op.body.block, depth + 1)
        elif isinstance(op, tile.ForStopOp | tile.ForStartOp):
            return  # in the loop's range (for_loop)
        elif isinstance(op, tile.YieldOp):
            parent = op.parent_op()
            if isinstance(parent, tile.TilesOp):
                return
            assert isinstance(parent, tile.ForOp)
            for carried, value in zip(parent.body.block.args[1:], op.values, strict=True):
                if n(carried) != n(value):
                    self.emit(depth, f"{n(carried)} = {n(value)}")
        else:
            raise NotImplementedError(f"tile-to-triton: no Triton form for {op.name}")

    def for_loop(self, op: tile.ForOp, depth: int) -> None:
        block = op.body.block
        iv, *carried = block.args
        for arg, init, result in zip(carried, op.inits, op.results_, strict=True):
            self.names[result] = self.name(arg)
            self.emit(depth, f"{self.name(arg)} = {self.name(init)}")
        lb, ub = str(_int(op.lb)), str(_int(op.ub))
        if iv.type == ELEMENT_TYPES["i64"]:
            lb = f"tl.full([], {lb}, tl.int64)"  # Triton counts in i32 where the bounds fit it
        stop = block.first_op
        if isinstance(stop, tile.ForStartOp):  # starts late, at max(lb, start)
            lb = f"tl.maximum({self.name(stop.start)}, {lb})"
            stop = stop.next_op
        if isinstance(stop, tile.ForStopOp):  # ends early, at min(ub, stop)
            ub = f"tl.minimum({self.name(stop.stop)}, {ub})"
        self.emit(depth, f"for {self.name(iv)} in range({lb}, {ub}, {_int(op.step)}):")
        self.block(block, depth + 1)

    def apply(self, op: tile.ApplyOp) -> str:
        fn = op.fn.data
        args = [self.name(a) for a in op.args]
        if fn == "cast":
            target = _elem(op.result)
            if target == "i1":
                return f"{args[0]} != 0"
            if target == "bf16":
                return f"_irc_to_bf16({args[0]})"
            if _elem(op.args[0]) == "bf16":
                wide = f"_irc_from_bf16({args[0]})"
                return wide if target == "f32" else f"{wide}.to({TL_DTYPE[target]})"
            if target in ("f16", "bf16") and _elem(op.args[0]) not in ("f32", "f16", "bf16"):
                # Through f32, as torch converts (and the interpreter casts to bf16 only so).
                return f"{args[0]}.to(tl.float32).to({TL_DTYPE[target]})"
            if isinstance(op.args[0].owner, Block) and isinstance(
                op.args[0].owner.parent_op(), tile.ForOp
            ):
                # A loop's index: the interpreter's is a Python int, which has no .to().
                return f"tl.cast({args[0]}, {TL_DTYPE[target]})"
            return f"{args[0]}.to({TL_DTYPE[target]})"
        template = TEMPLATES.get(len(args), {}).get(fn)
        if template is not None:
            form = template_for(template, _elem(op.args[0]), rounded_to_half(op.result))
            return form.format(*args)
        raise NotImplementedError(f"tile-to-triton: no Triton form for fn '{fn}'")


class HostPrinter:
    """The host function of one IR function: checks, allocations, launches."""

    def __init__(
        self,
        fn: func.FuncOp,
        index: int,
        kernels: dict[str, tile.KernelOp],
        identifiers: dict[tile.KernelOp, str],
    ):
        self.fn = fn
        self.index = index
        self.kernels = kernels
        self.identifiers = identifiers
        self.names: dict[SSAValue, str] = {}

    def text(self) -> str:
        block = self.fn.body.block
        args = [f"arg{i}" for i in range(len(block.args))]
        for a, name in zip(block.args, args, strict=True):
            self.names[a] = name
        ir_name = self.fn.sym_name.data
        sig = ", ".join(format_type(a.type).replace("memref", "tensor", 1) for a in block.args)
        # Arguments by position cost nothing more; keywords (the IR's names) and wrong
        # calls go through _irc_bind, which reports them with the IR's names.
        params = "".join(f"{a}=_IRC_UNSET, " for a in args) + ("/, " if args else "")
        lines = [
            f"def fn{self.index}({params}*_irc_rest, **_irc_named):",
            f"    # {_comment(f'@{ir_name}({sig})')}",
        ]
        listed = "".join(a + ", " for a in args)  # "arg0, arg1, "
        names = tuple(a.name_hint for a in block.args)
        bind = f"_irc_bind({'@' + ir_name!r}, {names!r}, ({listed}*_irc_rest,), _irc_named)"
        unset = f" or {args[-1]} is _IRC_UNSET" if args else ""
        lines.append(f"    if _irc_rest or _irc_named{unset}:")
        lines.append(f"        {listed}= {bind}" if args else f"        {bind}")
        for i, a in enumerate(block.args):
            shape = tuple(map(operator.index, a.type.get_shape()))  # type: ignore[attr-defined]
            dtype = TORCH_DTYPE[element_name(a.type.element_type)]  # type: ignore[attr-defined]
            # Errors name the function and the argument as the IR does: "@f: argument %x ...".
            label = f"%{a.name_hint}" if a.name_hint is not None else i
            lines.append(
                f"    arg{i} = _check(arg{i}, {shape}, {dtype}, {'@' + ir_name!r}, {label!r})"
            )
        n_bufs = n_views = 0
        for op in block.ops:
            if isinstance(op, loop.AllocOp):
                name = f"buf{n_bufs}"
                n_bufs += 1
                self.names[op.result] = name
                t = op.result.type
                assert isinstance(t, MemRefType)
                shape = tuple(map(operator.index, t.get_shape()))
                dtype = TORCH_DTYPE[element_name(t.element_type)]
                # Cheapest first (microseconds count in small calls): empty_like of a
                # checked (contiguous) argument of the same type, else new_empty, which
                # skips building a device object.
                twin = next((i for i, a in enumerate(block.args) if a.type == t), None)
                if twin is not None:
                    lines.append(f"    {name} = torch.empty_like(arg{twin})")
                elif args:
                    lines.append(f"    {name} = arg0.new_empty({shape}, dtype={dtype})")
                else:
                    lines.append(f"    {name} = torch.empty({shape}, device=DEVICE, dtype={dtype})")
            elif isinstance(op, tile.LaunchOp):
                kname = op.kernel.root_reference.data
                k = self.kernels.get(kname)
                if k is None:  # the verifier reports it first; emit_triton may run alone
                    raise IrcError.at(
                        op_location(op), f"tile.launch: no tile.kernel is named {quoted(kname)}"
                    )
                grid = str(tuple(_int(a) for a in k.grid.data))
                if k.persistent is not None:
                    grid = f"_persistent_grid({_int(k.grid.data[0])})"
                if any(isinstance(o, tile.BlockLoadOp | tile.BlockStoreOp) for o in k.walk()):
                    lines.append("    _ensure_allocator()")
                warps = _int(k.warps) if k.warps is not None else 4
                stages = f", {_int(k.stages)}" if k.stages is not None else ""
                if k.pdl is not None:
                    stages += ", pdl=True"
                call_args = "".join(self.names[a] + ", " for a in op.args)
                kernel = self.identifiers[k]
                lines.append(f"    _launch({kernel}, {grid}, ({call_args}), {warps}{stages})")
            elif isinstance(op, loop.ViewOp):
                name = f"view{n_views}"
                n_views += 1
                self.names[op.result] = name
                lines.append(f"    {name} = {strided_view(op, self.names[op.input])}")
            elif isinstance(op, loop.LibraryMatmulOp):
                if op.reason is not None:
                    lines.append(f"    # {_comment(op.reason.data)}")
                lines.append(f"    {library_call(op, self.names)}")
            elif isinstance(op, func.ReturnOp):
                outs = [self.names[v] for v in op.operands]
                if len(outs) == 1:
                    lines.append(f"    return {outs[0]}")
                else:
                    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
            else:
                raise NotImplementedError(f"tile-to-triton: unexpected host op {op.name}")
        return "\n".join(lines)


def strided_view(op: loop.ViewOp, name: str) -> str:
    """The torch view of buffer `name` a `loop.view` makes (`Tensor.as_strided`; its
    offset counted from where the buffer starts in its storage)."""
    sizes, strides, offset = op.sizes_and_strides()
    start = f", {name}.storage_offset() + {offset}" if offset else ""
    return f"{name}.as_strided({tuple(sizes)}, {tuple(strides)}{start})"


def library_call(op: loop.LibraryMatmulOp, names: dict[SSAValue, str]) -> str:
    """The `torch.matmul` of a `loop.library_matmul` (`_library_matmul`): K rounded up
    to whole granules (`loop.library_extent`), and the columns too where the output's
    rows have room for them (`library_operand` pads what is short with zeros)."""
    out = op.out.type
    assert isinstance(out, MemRefType)
    element = out.element_type
    per = loop.library_granule(element)
    *_, m, n = (_int(s) for s in op.sizes.data)
    k = loop.library_extent(_int(op.k), element)
    n = max(n, min(loop.library_extent(n, element), out.get_shape()[-1]))
    a = library_view(op, 0, names[op.a])
    b = library_view(op, 1, names[op.b])
    return (
        f"_library_matmul(_library_operand({a}, {m}, {k}, {per}), "
        f"_library_operand({b}, {k}, {n}, {per}), {library_view(op, 2, names[op.out], n)})"
    )


def library_view(op: loop.LibraryMatmulOp, which: int, name: str, columns: int = 0) -> str:
    """Operand `which` (0: `a`, 1: `b`, 2: `out`, its first `columns` where given)
    of a `loop.library_matmul` as the torch view `torch.matmul` takes: its dimensions
    permuted to [batch..., M, K] (or [..., K, N]), each cut to what is read or
    written, with a size-1 dimension for a batch dimension it broadcasts over after
    one it has (leading ones broadcast by themselves)."""
    out = op.out.type
    buffer = (op.a, op.b, op.out)[which].type
    assert isinstance(out, MemRefType) and isinstance(buffer, MemRefType)
    rank = out.get_num_dims()
    sizes = [_int(s) for s in op.sizes.data]
    if which == 2:
        sizes[-1] = columns or sizes[-1]
        cuts = [":" if o == s else f":{s}" for o, s in zip(out.get_shape(), sizes, strict=True)]
        return name if all(c == ":" for c in cuts) else f"{name}[{', '.join(cuts)}]"
    labels = [_int(d) for d in (op.a_dims, op.b_dims)[which].data]
    own = rank - 2 + which  # the rows for `a`, the columns for `b`
    matrix = [own, loop.LIBRARY_K] if which == 0 else [loop.LIBRARY_K, own]
    batch = [d for d in range(rank - 2) if d in labels]
    target = batch + matrix
    order = [labels.index(d) for d in target]
    view = name
    if order != list(range(len(order))):
        view += f".permute{tuple(order)}"
    shape = buffer.get_shape()
    k = _int(op.k)

    def cut(d: int) -> str:
        want = k if d == loop.LIBRARY_K else sizes[d]
        return ":" if shape[labels.index(d)] == want else f":{want}"

    first = batch[0] if batch else rank - 2
    parts = [cut(d) if d in labels else "None" for d in range(first, rank - 2)]
    parts += [cut(d) for d in matrix]
    if any(p != ":" for p in parts):
        view += f"[{', '.join(parts)}]"
    return view


def emit_triton(module: ModuleOp, source: str = "irc") -> str:
    """The Python module for a tile-level `module`."""
    kernels: dict[str, tile.KernelOp] = {}
    for op in module.body.ops:
        if isinstance(op, tile.KernelOp):
            if op.kernel_name.data in kernels:
                name = quoted(op.kernel_name.data)
                raise IrcError.at(
                    op_location(op), f"tile.kernel: a kernel above is named {name} too"
                )
            kernels[op.kernel_name.data] = op
    funcs = [op for op in module.body.ops if isinstance(op, func.FuncOp)]
    identifiers = kernel_identifiers(list(kernels.values()))
    parts = [
        f"# Generated by irc from {_comment(source)}: {len(kernels)} kernel(s), "
        f"{len(funcs)} function(s).",
        HEADER,
        BINDING,
    ]
    parts += [KernelPrinter(k, identifiers[k]).text() + "\n" for k in kernels.values()]
    parts += [HostPrinter(f, i, kernels, identifiers).text() + "\n" for i, f in enumerate(funcs)]
    table = ", ".join(f"{f.sym_name.data!r}: fn{i}" for i, f in enumerate(funcs))
    parts.append(f"FUNCTIONS = {{{table}}}\n")
    return "\n\n".join(parts)


# --- names: which IR names may become Python identifiers ------------------------------

BINDING = "from irc.runtime.binding import UNSET as _IRC_UNSET, bind as _irc_bind\n"
"""What host functions call for keyword arguments and wrong calls (irc.runtime.binding)."""

GENERATED = re.compile(r"(?:fn|arg|buf|v|ptr|d)[0-9]+")
"""The identifiers the printers make: host functions, their arguments and buffers,
kernel values, kernel arguments and TMA descriptors."""


@functools.cache
def reserved_identifiers() -> frozenset[str]:
    """Global names of the generated module that a kernel must not rebind.

    What the header binds at module level (`torch`, `tl`, `DEVICE`, `_launch`...),
    Python's builtins (kernels call `range` and `float`), and `FUNCTIONS`.
    """
    names = set(dir(builtins)) | set(keyword.kwlist) | {"FUNCTIONS"}
    for node in ast.parse(HEADER + BINDING).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def _is_reserved(name: str) -> bool:
    return (
        name in reserved_identifiers()
        or GENERATED.fullmatch(name) is not None
        or name.startswith(("__", "_irc", "_IRC"))
    )


def kernel_identifiers(kernels: list[tile.KernelOp]) -> dict[tile.KernelOp, str]:
    """The Python name of each kernel's @triton.jit function.

    A kernel keeps its IR name (which profilers then show), verified to be an
    ASCII identifier and not a keyword; one that would shadow a name the module
    uses, or another kernel's new name, gets `k_` in front until it does not.
    """
    out: dict[tile.KernelOp, str] = {}
    taken = {k.kernel_name.data for k in kernels}
    for k in kernels:
        name = k.kernel_name.data
        problem = kernel_name_problem(name)
        if problem is not None:  # the verifier reports it first; emit_triton may run alone
            raise IrcError.at(op_location(k), f"tile.kernel: {problem}")
        identifier = name
        while _is_reserved(identifier) or (identifier != name and identifier in taken):
            identifier = "k_" + identifier
        taken.add(identifier)
        out[k] = identifier
    return out


def _comment(text: str) -> str:
    """`text` for a comment: nothing in it ends the line."""
    return "".join(c if c.isprintable() else "?" for c in text)


Emitter = Callable[[ModuleOp], str]
__all__ = ["emit_triton", "FLOAT_TYPES", "I1"]
