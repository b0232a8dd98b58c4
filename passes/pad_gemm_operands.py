"""`pad-gemm-operands`: a GEMM operand whose rows are not 16-byte aligned is copied
once into a buffer whose rows are.

Tensor cores take their operand tiles from shared memory. A tile gets there by
TMA or by 16-byte `cp.async` copies, and both need rows that start 16 bytes
apart. A half-precision matrix of odd K or N has rows only 2 or 4 bytes apart,
and each tile then moves a few bytes at a time, through registers, without a
pipeline. Measured on an H100 (GEMM + bias + erf GELU; Inductor pads such
operands too, its `pad_mm`): 4937x4321 @ 4321x5553 f16 took 1.837 ms where
torch.compile took 0.490; 8295x5120 @ 5120x1140 bf16 took 0.534 against 0.222.

The copy kernel reads the operand once and writes it once, into rows padded to a
multiple of 16 bytes; the pad is never read (TMA reads the first columns of each
row, `tile.block_load {pitch}`; pointer loads index inside them). The GEMM reads
an operand's tiles once for every tile of its other output dimension, so the copy
pays where that is `PAD_REREADS` tiles or more and the product is large enough to
outweigh a launch (`PAD_MIN_FLOPS`), and where the GEMM is persistent (the tile
pass's choice, asked here): those lose the most, their operands then moving by
TMA. A GEMM a program a tile (a short K under a heavy epilogue, or batched) loads
by pointers either way: 2048x517 @ 517x2048 bf16 + erf GELU took 25.9 us
unaligned and 29.4 padded, the copy's 3.5 (H100, kernel time). It runs on loop IR
before `tile`, so the copy is tiled as any element-wise kernel is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IndexType, MemRefType, ModuleOp, StringAttr
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass

from irc.analysis.tma import TMA_BYTES
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import HALF_TYPES, element_bytes, int_array
from irc.passes.options import check_option
from irc.passes.tile import gemm_tiling, kernel_shape

PAD_REREADS = 2
"""Tiles of the other output dimension (of 128) from which an operand is padded:
read that many times by the GEMM, it is read once more and written once by the copy."""

PAD_MIN_FLOPS = 2**31
"""The smallest product (2 M N K) worth a copy kernel's launch (a few us): about
4 us of an H100's half-precision tensor cores."""

KERNEL_PREFIX = "pad_rows_"
"""The copies' kernel names: `pad_rows_0`, `pad_rows_1`..."""

WHY = (
    "pad-gemm-operands copies a GEMM operand whose rows are not 16-byte aligned into "
    "rows that are, which the GEMM reads by TMA"
)
"""What the fusion report says of a copy (`irc.passes.fuse.resolve_reports`)."""

GEMM_TILE = 128
"""The side of the output tiles the re-reads are counted in (`tile.gemm_tiling`'s)."""


def padded_columns(columns: int, element_bytes_: int) -> int:
    """`columns` rounded up to a whole number of 16-byte granules."""
    per_granule = TMA_BYTES // math.gcd(TMA_BYTES, element_bytes_)
    return -(-columns // per_granule) * per_granule


@dataclass(frozen=True)
class Operand:
    """A contraction's operand load from a whole 2-d buffer, and how often the GEMM
    reads each of its tiles."""

    load: loop.LoadOp
    rereads: int


def unaligned_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The half-precision operands of `kernel`'s contractions whose 2-d buffers have
    rows that are not 16-byte aligned."""
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
            if not isinstance(load, loop.LoadOp) or load.result.type not in HALF_TYPES:
                continue
            shape = list(load.buffer.type.get_shape())  # type: ignore[attr-defined]
            indices = list(load.indices)
            if len(shape) != 2 or kiv not in indices or len(set(indices)) != 2:
                continue
            (other,) = [i for i in indices if i is not kiv]
            if other not in ivs:
                continue
            if shape[1] * element_bytes(load.result.type) % TMA_BYTES == 0:
                continue
            # The tiles of the parallel dimension this operand does not index.
            across = parallel[1 - ivs.index(other)]
            out.append(Operand(load, -(-across // GEMM_TILE)))
    return out


def _flops(kernel: loop.KernelOp) -> int:
    m, n = kernel.parallel_bounds()
    k = max(
        (loop.int_list(r.bounds)[0] for r in kernel.body.block.ops if isinstance(r, loop.ReduceOp)),
        default=0,
    )
    return 2 * m * n * k


def copy_kernel(source: SSAValue, target: SSAValue, name: str) -> loop.KernelOp:
    """`target[i, j] = source[i, j]` over `source`'s shape."""
    shape = list(source.type.get_shape())  # type: ignore[attr-defined]
    body = Block(arg_types=[IndexType(), IndexType()])
    i, j = body.args
    value = loop.LoadOp.create(operands=[source, i, j], result_types=[source.type.element_type])  # type: ignore[attr-defined]
    body.add_op(value)
    body.add_op(loop.StoreOp.create(operands=[value.result, target, i, j]))
    return loop.KernelOp.create(
        properties={
            "name": StringAttr(name),
            "bounds": int_array(shape),
            "kind": StringAttr(KernelKind.POINTWISE),
        },
        regions=[Region(body)],
    )


@dataclass(frozen=True)
class PadGemmOperandsPass(ModulePass):
    """`pad-gemm-operands{min_flops=2147483648 rereads=2 persistent_only=true}` on
    loop-level IR."""

    name = "pad-gemm-operands"
    levels = ("loop",)

    min_flops: int = PAD_MIN_FLOPS
    rereads: int = PAD_REREADS
    persistent_only: bool = True
    """Pad only GEMMs the tile pass would make persistent (false: any GEMM)."""

    def __post_init__(self) -> None:
        check_option(self.name, "min_flops", self.min_flops, 0)
        check_option(self.name, "rereads", self.rereads, 1)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = {k.kernel_name.data for k in op.walk() if isinstance(k, loop.KernelOp)}
        padded: dict[SSAValue, SSAValue] = {}
        for kernel in [k for k in op.walk() if isinstance(k, loop.KernelOp)]:
            operands = unaligned_operands(kernel)  # contractions with 2-d outputs only
            if not operands or _flops(kernel) < self.min_flops:
                continue
            if self.persistent_only and not gemm_tiling(kernel_shape(kernel)).persistent:
                continue
            for operand in operands:
                if operand.rereads < self.rereads:
                    continue
                buffer = operand.load.buffer
                if buffer not in padded:
                    padded[buffer] = self.pad(kernel, buffer, taken)
                operand.load.operands[0] = padded[buffer]

    @staticmethod
    def pad(kernel: loop.KernelOp, buffer: SSAValue, taken: set[str]) -> SSAValue:
        """A row-padded copy of `buffer`, made just before `kernel`."""
        rows, cols = buffer.type.get_shape()  # type: ignore[attr-defined]
        element = buffer.type.element_type  # type: ignore[attr-defined]
        alloc = loop.AllocOp.create(
            result_types=[MemRefType(element, [rows, padded_columns(cols, element_bytes(element))])]
        )
        n = 0
        while f"{KERNEL_PREFIX}{n}" in taken:
            n += 1
        taken.add(f"{KERNEL_PREFIX}{n}")
        copy = copy_kernel(buffer, alloc.result, f"{KERNEL_PREFIX}{n}")
        copy.location = kernel.location
        block = kernel.parent_block()
        assert block is not None
        block.insert_ops_before([alloc, copy], kernel)
        return alloc.result
