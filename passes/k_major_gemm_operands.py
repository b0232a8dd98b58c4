"""`k-major-gemm-operands`: an f32 GEMM operand not stored in rows along K that
start 16 bytes apart is copied once into such rows.

f32 GEMMs run on tensor cores in TF32 (three products of split operands by
default, `split-tf32`). Hopper's wgmma reads 16-bit operands from shared memory
in either order, but TF32 ones only K-major: each row of a tile runs along K.
An operand whose contiguous dimension is M or N (`x @ w` with `w` stored
`[K, N]`, or `x.T @ w`) cannot be read that way, and Triton moves its tiles
through a slower path; one whose rows are not 16 bytes apart (K odd) cannot be
copied to shared memory 16 bytes at a time. Measured on an H200 (f32 GEMM + bias
+ erf GELU, kernel time with the copies, one run; cuBLAS's SGEMM for scale):

| GEMM | layout | before (ms) | after (ms) | `torch.mm` (ms) |
|---|---|---:|---:|---:|
| 6430x6456 @ 6456x4924 | `x @ w` | 15.93 | 7.46 | 8.67 |
| 6430x6456 @ 6456x4924 | `x.T @ w` | 17.42 | 7.56 | 8.67 |
| 4096x4096 @ 4096x4096 | `x @ w` | 5.20 | 2.16 | 2.68 |
| 4429x820 @ 820x1208 | `x @ w` | 0.400 | 0.210 | 0.224 |
| 3000x1023 @ 1023x2049 | `x @ w` | 1.344 | 0.428 | 0.315 |

A copy costs a read and a write of the operand (0.23 ms for the first `w`).

The copy pays where the GEMM reads the operand's tiles `rereads` times or more
and the product outweighs a launch (`min_flops`), as for `pad-gemm-operands`.
Its rows are padded to 16 bytes, and the pad written 0: where every operand of a
contraction is such a copy, K runs over the padded width with no mask
(`run_k_over_padding`; on an H100, 3000x1023 @ 1023x2049 then took 333 us
against 393). It runs on loop IR before `tile`, so the copy is tiled as any copy
or transposition is (both sides coalesced).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import Float32Type, MemRefType, ModuleOp
from xdsl.ir import SSAValue

from irc.dialects import loop
from irc.ir.types import element_bytes, int_array
from irc.passes.gemm_operand_copies import (
    GemmOperandCopyPass,
    Operand,
    copy_before,
    gemm_operands,
    padded_columns,
)
from irc.passes.kernel_names import kernel_names

KERNEL_PREFIX = "k_major_"
"""The copies' kernel names: `k_major_0`, `k_major_1`..."""

WHY = (
    "k-major-gemm-operands copies an f32 GEMM operand into rows along K that start "
    "16 bytes apart, the layout TF32 tensor cores read fast"
)
"""What the fusion report says of a copy (`irc.passes.fuse.resolve_reports`)."""


def slow_f32_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The f32 operands of `kernel`'s contractions stored with K strided, or in rows
    that do not start 16 bytes apart."""
    return [
        operand
        for operand in gemm_operands(kernel)
        if isinstance(operand.load.result.type, Float32Type)
        and not (operand.k_contiguous and operand.aligned_rows)
    ]


@dataclass(frozen=True)
class KMajorGemmOperandsPass(GemmOperandCopyPass):
    """`k-major-gemm-operands{min_flops=2147483648 rereads=2}` on loop-level IR."""

    name = "k-major-gemm-operands"
    levels = ("loop",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = kernel_names(op)
        copies: dict[tuple[SSAValue, bool], SSAValue] = {}
        for kernel, operands in self.gemms_to_copy(op, slow_f32_operands):
            for operand in operands:
                load, transpose = operand.load, not operand.k_contiguous
                key = (load.buffer, transpose)
                if key not in copies:
                    copies[key] = self.copy(kernel, load.buffer, transpose, taken)
                first, second = load.indices
                # operands are (buffer, *indices); a transposed copy is read [other, k].
                load.operands = [copies[key], *((second, first) if transpose else (first, second))]
            run_k_over_padding(kernel, set(copies.values()))

    @staticmethod
    def copy(kernel: loop.KernelOp, buffer: SSAValue, transpose: bool, taken: set[str]) -> SSAValue:
        """`buffer` (transposed where `transpose`) in rows padded to 16 bytes, made
        just before `kernel`."""
        rows, cols = buffer.type.get_shape()  # type: ignore[attr-defined]
        if transpose:
            rows, cols = cols, rows
        element = buffer.type.element_type  # type: ignore[attr-defined]
        target = MemRefType(element, [rows, padded_columns(cols, element_bytes(element))])
        order = (1, 0) if transpose else (0, 1)
        return copy_before(kernel, buffer, target, KERNEL_PREFIX, taken, order, zero_pad=True)


def run_k_over_padding(kernel: loop.KernelOp, copies: set[SSAValue]) -> None:
    """A contraction whose every operand is a copy made here runs K over the copies'
    padded rows: their pads hold 0, a product of pads adds 0, and the K loop needs
    no mask. A mask along K, the contiguous dimension, leaves Triton unable to prove
    4 lanes alike, and it loads f32 operands one element a lane: 3000x1023 @
    1023x2049 took 1.25-1.36x `torch.mm` with K = 1023 masked (134 global loads in
    the sm_90 build, 62 at K = 1024)."""
    for red in kernel.body.block.ops:
        if not (isinstance(red, loop.ReduceOp) and red.contract is not None):
            continue
        (kiv,) = red.body.block.args
        loads = [op for op in red.body.walk() if isinstance(op, loop.LoadOp) and kiv in op.indices]
        widths = {ld.buffer.type.get_shape()[-1] for ld in loads}  # type: ignore[attr-defined]
        if (
            loads
            and all(ld.buffer in copies and ld.indices[-1] is kiv for ld in loads)
            and len(widths) == 1
        ):
            red.bounds = int_array(list(widths))
