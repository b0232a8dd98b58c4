"""What `pad-gemm-operands` and `k-major-gemm-operands` share: finding a GEMM's
operands, counting how often the GEMM reads each tile of one, and copying one
once, just before the GEMM, into the layout the tensor cores read well.

A copy reads the operand once and writes it once; the GEMM reads each of the
operand's tiles once for every output tile of the dimension the operand does not
index. The copy pays where that is a few tiles or more (`rereads`) and the
product outweighs a launch (`min_flops`); both passes take those as options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    i1,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.analysis.tma import TMA_BYTES
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import element_bytes, int_array
from irc.passes.kernel_names import numbered_name
from irc.passes.options import check_option

MIN_FLOPS = 2**31
"""The smallest product (2 M N K) worth a copy kernel's launch (a few us): about
4 us of an H100's half-precision tensor cores."""

REREADS = 2
"""Tiles of the other output dimension (of `GEMM_TILE`) from which an operand is
copied: read that many times by the GEMM, it is read once more and written once
by the copy."""

GEMM_TILE = 128
"""The side of the output tiles the re-reads are counted in (`tile.gemm_tiling`'s)."""


@dataclass(frozen=True)
class GemmOperandCopyPass(ModulePass):
    """The options both GEMM-operand passes take, checked alike."""

    min_flops: int = MIN_FLOPS
    """The smallest product (2 M N K) whose operands are copied."""
    rereads: int = REREADS
    """The fewest times the GEMM reads each tile of an operand it copies."""

    def __post_init__(self) -> None:
        check_option(self.name, "min_flops", self.min_flops, 0)
        check_option(self.name, "rereads", self.rereads, 1)

    def gemms_to_copy(
        self, op: ModuleOp, operands_of: Callable[[loop.KernelOp], list[Operand]]
    ) -> Iterator[tuple[loop.KernelOp, list[Operand]]]:
        """Each GEMM kernel of `op` whose product reaches `min_flops` and that
        `copies_for` takes, with those of its operands (`operands_of`) that it reads
        `least_rereads` times or more."""
        for kernel in loop.kernels(op):
            operands = operands_of(kernel)  # contractions with 2-d outputs only
            if not operands or gemm_flops(kernel) < self.min_flops:
                continue
            if not self.copies_for(kernel):
                continue
            chosen = [o for o in operands if o.rereads >= self.least_rereads(o)]
            if chosen:
                yield kernel, chosen

    def copies_for(self, kernel: loop.KernelOp) -> bool:
        """Whether the pass copies operands of this GEMM at all."""
        return True

    def least_rereads(self, operand: Operand) -> int:
        """The fewest re-reads from which `operand` is copied."""
        return self.rereads


@dataclass(frozen=True)
class Operand:
    """A contraction's operand load from a whole 2-d buffer, how often the GEMM reads
    each of its tiles, whether K is the buffer's contiguous (last) dimension, and
    whether its other index is N (the output's columns: `w` in `x @ w`)."""

    load: loop.LoadOp
    rereads: int
    k_contiguous: bool
    indexes_n: bool

    @property
    def row_granule(self) -> int:
        """Bytes the buffer's rows should start apart: 16 (TMA's and `cp.async`'s unit),
        or a whole 128-byte line for the N-major right operand (`LINE_ALIGNED_BYTES`)."""
        return LINE_ALIGNED_BYTES if self.indexes_n and not self.k_contiguous else TMA_BYTES

    @property
    def aligned_rows(self) -> bool:
        """Whether the buffer's rows start 16 bytes apart (TMA's and `cp.async`'s unit)."""
        return self.row_bytes % TMA_BYTES == 0

    @property
    def line_aligned_rows(self) -> bool:
        """Whether the buffer's rows start `row_granule` bytes apart."""
        return self.row_bytes % self.row_granule == 0

    @property
    def row_bytes(self) -> int:
        columns = self.load.buffer.type.get_shape()[1]  # type: ignore[attr-defined]
        return columns * element_bytes(self.load.result.type)


LINE_ALIGNED_BYTES = 128
"""Bytes apart the rows of an N-major right operand (`w` in `x @ w`, stored [K, N])
should start. Rows only 16 bytes aligned made the whole GEMM up to a third slower on
an H100 (bf16 + bias + erf GELU, 128x256 tiles, the GEMM kernel's time: 12800x4096 @
4096x4088 783 us against 632 with `w`'s rows 128-byte aligned, 7768x2988 @
2988x2680 303 against 228, 8295x5120 @ 5120x1144 223 against 178; 32-byte rows,
4080 columns, 629 against 614 at 4096). Rows of the left operand ran as fast 16
bytes aligned, K-major (12800x4004 padded to 4008: 616 us against 615 at K = 4096)
or M-major (`x.T @ w`, x 4096x4088: 197.5 against 195.4; 2048x2000: 33.2 against
33.1)."""


def padded_columns(columns: int, element_bytes_: int, granule: int = TMA_BYTES) -> int:
    """`columns` rounded up to a whole number of `granule`-byte granules."""
    per_granule = granule // math.gcd(granule, element_bytes_)
    return -(-columns // per_granule) * per_granule


def gemm_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The operands of `kernel`'s contractions that are 2-d buffers indexed by the
    reduced index and one output index (a GEMM with a 2-d output only)."""
    parallel = kernel.parallel_bounds()
    if len(parallel) != 2:
        return []
    ivs = list(kernel.body.block.args)
    out = []
    for red in kernel.body.block.ops:
        if not (isinstance(red, loop.ReduceOp) and red.contract is not None):
            continue
        (kiv,) = red.body.block.args
        for load in red.body.block.ops:
            if not isinstance(load, loop.LoadOp):
                continue
            indices = list(load.indices)
            if len(indices) != 2 or kiv not in indices or len(set(indices)) != 2:
                continue
            (other,) = [i for i in indices if i is not kiv]
            if other not in ivs:
                continue
            # The tiles of the output dimension this operand does not index.
            across = parallel[1 - ivs.index(other)]
            indexes_n = ivs.index(other) == 1
            out.append(Operand(load, -(-across // GEMM_TILE), indices[1] is kiv, indexes_n))
    return out


def gemm_k(kernel: loop.KernelOp) -> int:
    """K of a GEMM kernel: its longest loop.reduce of the body (0 for none)."""
    return max(
        (loop.int_list(r.bounds)[0] for r in kernel.body.block.ops if isinstance(r, loop.ReduceOp)),
        default=0,
    )


def gemm_flops(kernel: loop.KernelOp) -> int:
    """2 M N K of a GEMM kernel (K: `gemm_k`)."""
    m, n = kernel.parallel_bounds()
    return 2 * m * n * gemm_k(kernel)


def copy_kernel(
    source: SSAValue,
    target: SSAValue,
    name: str,
    order: Sequence[int] = (0, 1),
    zero_pad: bool = False,
) -> loop.KernelOp:
    """`target[i_order[0], i_order[1]] = source[i, j]`: a copy, or with `order = (1, 0)`
    a transposition, over `source`'s shape; with `zero_pad`, over `target`'s, whose
    rows and columns past the source's are written 0 (a GEMM may then run its K loop
    over them, unmasked)."""
    element = source.type.element_type  # type: ignore[attr-defined]
    shape = list((target if zero_pad else source).type.get_shape())  # type: ignore[attr-defined]
    body = Block(arg_types=[IndexType(), IndexType()])
    if not zero_pad:
        value = loop.LoadOp.create(operands=[source, *body.args], result_types=[element])
        body.add_op(value)
        store_at = [body.args[d] for d in order]
        body.add_op(loop.StoreOp.create(operands=[value.result, target, *store_at]))
    else:
        ops: list[Operation] = []
        at: list[SSAValue] = []  # target [r, c] reads source [r, c] or [c, r]
        inside: SSAValue | None = None
        for axis, index in enumerate(body.args):
            extent = source.type.get_shape()[order[axis]]  # type: ignore[attr-defined]
            if extent == shape[axis]:
                at.append(index)
                continue
            last = loop.ConstantOp.create(
                properties={"value": IntegerAttr(extent - 1, i64)}, result_types=[IndexType()]
            )
            width = loop.ConstantOp.create(
                properties={"value": IntegerAttr(extent, i64)}, result_types=[IndexType()]
            )
            clamped = _apply("minimum", [index, last.result], IndexType())
            within = _apply("lt", [index, width.result], i1)
            ops += [last, width, clamped, within]
            if inside is not None:
                both = _apply("and", [inside, within.result], i1)
                ops.append(both)
                within = both
            inside = within.result
            at.append(clamped.result)
        value = loop.LoadOp.create(
            operands=[source, *(at if tuple(order) == (0, 1) else at[::-1])],
            result_types=[element],
        )
        ops.append(value)
        stored = value.result
        if inside is not None:  # zero past the source
            zero = loop.ConstantOp.create(
                properties={"value": FloatAttr(0.0, element)}, result_types=[element]
            )
            chosen = _apply("where", [inside, value.result, zero.result], element)
            ops = [zero, *ops, chosen]
            stored = chosen.result
        body.add_ops(ops)
        body.add_op(loop.StoreOp.create(operands=[stored, target, *body.args]))
    return loop.KernelOp.create(
        properties={
            "name": StringAttr(name),
            "bounds": int_array(shape),
            "kind": StringAttr(KernelKind.POINTWISE),
        },
        regions=[Region(body)],
    )


def _apply(fn: str, args: list[SSAValue], result: Attribute) -> loop.ApplyOp:
    return loop.ApplyOp.create(
        operands=args, properties={"fn": loop.apply_fn(fn)}, result_types=[result]
    )


def copy_before(
    kernel: loop.KernelOp,
    buffer: SSAValue,
    target: MemRefType,
    prefix: str,
    taken: set[str],
    order: Sequence[int] = (0, 1),
    zero_pad: bool = False,
) -> SSAValue:
    """A new `target` buffer filled from `buffer` (`copy_kernel`) just before
    `kernel`, by a kernel named `prefix` and the first number no kernel has."""
    alloc = loop.AllocOp.create(result_types=[target])
    copy = copy_kernel(buffer, alloc.result, numbered_name(prefix, taken), order, zero_pad)
    copy.location = kernel.location
    block = kernel.parent_block()
    assert block is not None
    block.insert_ops_before([alloc, copy], kernel)
    return alloc.result
