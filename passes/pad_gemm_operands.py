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
pays where that is `REREADS` tiles or more and the product is large enough to
outweigh a launch (`MIN_FLOPS`), and where the GEMM is persistent (the tile
pass's choice, asked here): those lose the most, their operands then moving by
TMA. A GEMM a program a tile (a short K under a heavy epilogue, or batched) loads
by pointers either way: 2048x517 @ 517x2048 bf16 + erf GELU took 25.9 us
unaligned and 29.4 padded, the copy's 3.5 (H100, kernel time). It runs on loop IR
before `tile`, so the copy is tiled as any element-wise kernel is.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.ir import SSAValue

from irc.dialects import loop
from irc.ir.types import HALF_TYPES, element_bytes
from irc.passes.gemm_operand_copies import (
    GemmOperandCopyPass,
    Operand,
    copy_before,
    gemm_flops,
    gemm_operands,
    padded_columns,
)
from irc.passes.tile import gemm_tiling, kernel_shape

KERNEL_PREFIX = "pad_rows_"
"""The copies' kernel names: `pad_rows_0`, `pad_rows_1`..."""

WHY = (
    "pad-gemm-operands copies a GEMM operand whose rows are not 16-byte aligned into "
    "rows that are, which the GEMM reads by TMA"
)
"""What the fusion report says of a copy (`irc.passes.fuse.resolve_reports`)."""


def unaligned_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The half-precision operands of `kernel`'s contractions whose 2-d buffers have
    rows that are not 16-byte aligned."""
    return [
        operand
        for operand in gemm_operands(kernel)
        if operand.load.result.type in HALF_TYPES and not operand.aligned_rows
    ]


@dataclass(frozen=True)
class PadGemmOperandsPass(GemmOperandCopyPass):
    """`pad-gemm-operands{min_flops=2147483648 rereads=2 persistent_only=true}` on
    loop-level IR."""

    name = "pad-gemm-operands"
    levels = ("loop",)

    persistent_only: bool = True
    """Pad only GEMMs the tile pass would make persistent (false: any GEMM)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = {k.kernel_name.data for k in op.walk() if isinstance(k, loop.KernelOp)}
        padded: dict[SSAValue, SSAValue] = {}
        for kernel in [k for k in op.walk() if isinstance(k, loop.KernelOp)]:
            operands = unaligned_operands(kernel)  # contractions with 2-d outputs only
            if not operands or gemm_flops(kernel) < self.min_flops:
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
        padded = MemRefType(element, [rows, padded_columns(cols, element_bytes(element))])
        return copy_before(kernel, buffer, padded, KERNEL_PREFIX, taken)
