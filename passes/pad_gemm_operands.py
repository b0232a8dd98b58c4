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
TMA. A GEMM a program a tile (K of 256 or less under a transcendental epilogue,
or batched) loads by pointers either way: 2048x517 @ 517x2048 bf16 + erf GELU,
then a program a tile, took 25.9 us unaligned and 29.4 padded, the copy's 3.5
(H100, kernel time); persistent now (`tile.EPILOGUE_K`), padded and read by TMA,
it takes 22.9 us in all against 30.3 (H200). It runs on loop IR before `tile`, so
the copy is tiled as any element-wise kernel is.

The right operand stored [K, N] (`w` in `x @ w`) wants more: rows 128 bytes apart
(`LINE_ALIGNED_BYTES`). Where its rows are 16 bytes apart but not 128, the GEMM
runs up to a third slower rather than several times, and the copy, which takes
e R / (M BW) of the GEMM's time (e bytes an element, R/BW about 233 flops a byte
on an H100), pays only where M is long: from `LINE_REREADS` row tiles. Such an
operand is padded to whole lines whichever rule copies it.
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
    gemm_operands,
    padded_columns,
)
from irc.passes.kernel_names import kernel_names
from irc.passes.options import check_option
from irc.passes.tile import gemm_tiling, kernel_shape

KERNEL_PREFIX = "pad_rows_"
"""The copies' kernel names: `pad_rows_0`, `pad_rows_1`..."""

WHY = (
    "pad-gemm-operands copies a GEMM operand whose rows are not 16-byte aligned (for "
    "the right operand stored [K, N], 128) into rows that are, which the GEMM reads by TMA"
)
"""What the fusion report says of a copy (`irc.passes.fuse.resolve_reports`)."""

LINE_REREADS = 32
"""Row tiles (of 128) from which a right operand whose rows are 16 bytes aligned but
not `LINE_ALIGNED_BYTES` is copied. The copy takes e R / (M BW) of the GEMM's time
(bf16 on an H100: 466 / M); what the lines save ranged from nothing to a quarter
of the GEMM (H100, bf16 + bias + erf GELU, kernel time with the copy, 16-byte rows
-> lines: 12800x4096 @ 4096x4088 783 -> 652 us, 8295x5120 @ 5120x1140 231 -> 185,
but 2100x4096 @ 4096x1000 51.0 -> 55.4 and 2048x1024 @ 1024x4088 44.9 -> 46.8).
At 32 tiles (M over 3968) the copy costs under 12% of the GEMM."""


def unaligned_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The half-precision operands of `kernel`'s contractions whose 2-d buffers have
    rows that do not start `Operand.row_granule` bytes apart (16, or 128 for the
    right operand stored [K, N])."""
    return [
        operand
        for operand in gemm_operands(kernel)
        if operand.load.result.type in HALF_TYPES and not operand.line_aligned_rows
    ]


@dataclass(frozen=True)
class PadGemmOperandsPass(GemmOperandCopyPass):
    """`pad-gemm-operands{min_flops=2147483648 rereads=2 line_rereads=32
    persistent_only=true}` on loop-level IR."""

    name = "pad-gemm-operands"
    levels = ("loop",)

    line_rereads: int = LINE_REREADS
    """The fewest re-reads from which an operand only missing its 128-byte rows is
    copied (`rereads` or more)."""
    persistent_only: bool = True
    """Pad only GEMMs the tile pass would make persistent (false: any GEMM)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_option(self.name, "line_rereads", self.line_rereads, 1)

    def copies_for(self, kernel: loop.KernelOp) -> bool:
        """Only GEMMs the tile pass makes persistent, unless `persistent_only` is off."""
        return not self.persistent_only or gemm_tiling(kernel_shape(kernel)).persistent

    def least_rereads(self, operand: Operand) -> int:
        """`rereads` where the operand's rows are not 16 bytes aligned, and at least
        `line_rereads` where only the line is missing (the GEMM loses up to a quarter
        of its time there, not several times it)."""
        return self.rereads if not operand.aligned_rows else max(self.rereads, self.line_rereads)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = kernel_names(op)
        padded: dict[tuple[SSAValue, int], SSAValue] = {}
        for kernel, operands in self.gemms_to_copy(op, unaligned_operands):
            for operand in operands:
                key = (operand.load.buffer, operand.row_granule)
                if key not in padded:
                    padded[key] = self.pad(kernel, *key, taken)
                operand.load.operands[0] = padded[key]

    @staticmethod
    def pad(kernel: loop.KernelOp, buffer: SSAValue, granule: int, taken: set[str]) -> SSAValue:
        """A copy of `buffer` whose rows are padded to `granule` bytes, made just before
        `kernel`."""
        rows, cols = buffer.type.get_shape()  # type: ignore[attr-defined]
        element = buffer.type.element_type  # type: ignore[attr-defined]
        width = padded_columns(cols, element_bytes(element), granule)
        padded = MemRefType(element, [rows, width])
        return copy_before(kernel, buffer, padded, KERNEL_PREFIX, taken)
