"""`split-k`: an f32 GEMM whose output tiles leave SMs idle splits its K loop.

A GEMM of few output tiles and a long K (`300x9000 @ 9000x700`: 18 tiles of
128x128 for 132 SMs) runs each tile's whole K loop in one program while most
SMs wait. Split, as cuBLAS and Inductor's templates do, it becomes two kernels
(split-reduction's stages, `chunked_kernel` and `combine_partials`):

- stage 1 (`NAME_split`, bounds `[S, M, N]`): a batched GEMM whose batch s
  multiplies chunk s of K (whole K steps, `K_STEP`), storing f32 partials;
- stage 2 (the kernel itself, now a reduction): sums the S partials of each
  output element and runs the epilogue (bias, GELU...) as before.

S follows a model of the kernel and the GPU (`split_cost`), at the tiles the tile
pass would choose for each (`gemm_tiling`): a round of 128x128 programs (one an
SM), or of 64x64 ones (two an SM: one alone did not keep an SM busy, at the tile
pass's `SPLIT_TF32_SMALL_RATE`), takes its chunk's K steps plus `PROGRAM_K` for a
program's start and end; chunks that overrun K cost more (`RAGGED_RATE`); the
partials cost their bytes, written and read, at `PARTIAL_BYTES_PER_K` a K step.
Its constants were fitted on two H200 runs: 170 forced splits of 12 odd-sized
GEMMs (`PROGRAM_K`, `RAGGED_RATE`), and this table (GEMM + bias + erf GELU,
`x @ w.T`, written as the split; us, S = 1 / 2 / 4 / 8; torch.compile):

| GEMM | S=1 | 2 | 4 | 8 | torch.compile |
|---|---:|---:|---:|---:|---:|
| 300x8960 @ 8960x700 | 295 | 147 | 107 | 113 | 119 |
| 1000x3072 @ 3072x1500 | 308 | 224 | **177** | 204 | 217 |
| 1536x4096 @ 4096x1536 | 454 | 388 | **357** | 370 | 450 |
| 2048x8192 @ 8192x1024 | **534** | 563 | 558 | 586 | 703 |

(300x8960 takes 14 chunks: 96.0 against 96.4 for 7, another run.) What the pass
then did, end to end in one run (`x @ w`, us: whole, split, torch.compile):

| GEMM | whole | split (S x chunk) | torch.compile |
|---|---:|---:|---:|
| 300x8960 @ 8960x700 | 307.5 | 111.2 (14 x 640) | 112.1 |
| 1000x3072 @ 3072x1500 | 321.4 | 187.6 (4 x 768) | 214.4 |
| 1536x4096 @ 4096x1536 | 467.9 | 371.3 (4 x 1024) | 402.6 |
| 777x4992 @ 4992x1333 | 372.9 | 270.5 (3 x 1664) | 295.6 |
| 777x5000 @ 5000x1333 | 374.4 | 293.4 (5 x 1024, ragged) | 316.5 |
| 2000x2500 @ 2500x600 | 194.9 | 173.2 (3 x 864, ragged) | 182.5 |
| 64x65536 @ 65536x64 | 3604.7 | 32.1 (256 x 256) | 60.7 |
| 500x20000 @ 20000x300 | 611.0 | 159.0 (25 x 800) | 154.0 |
| 300x9000 @ 9000x700 | 310.7 | 146.2 (9 x 1024, ragged) | 112.8 |

A ragged last chunk masks both factors in every chunk's K loop; the last row is
the cost of that (123 us for its batched GEMM against 86 for 8960). Where S
divides K into whole 16-byte runs (`ALIGN_ELEMENTS`), the chunks are exact
instead, though not whole K steps: 9000 = 9 x 1000, each chunk's last step masked
at its loads as an unsplit K's is. In one later run: 300x9000 @ 9000x700 118.3
us against 146.4 ragged (torch.compile 112.6), 777x5000 @ 5000x1333 252.3
against 292.8 (318.2), 1000x3000 @ 3000x1500 219.0 against 233.7 whole (211.1).
Exact chunks also split some GEMMs of many tiles whose last round the split
fills better (H200, split over whole: 1710x716 @ 716x701 0.64, 1772x4071 @
4071x1600 0.73, 3004x4694 @ 4694x1620 0.84, 5169x5928 @ 5928x1248 0.86; the
model's misses: 2611x1285 @ 1285x548 1.06, 783x990 @ 990x1565 1.15). Only f32
products are split: half-precision GEMMs run persistent, by TMA, and were not
measured split.

A GEMM of operands stored as TF32 parts (`split-tf32-gemm-operands`, which asks
this model whether a GEMM would split) is priced at the parts' tiles
(`split_cost(parts=True)`: 64x128 and 128x64 at their rates, one program an SM),
with the same `PROGRAM_K` and `RAGGED_RATE`, which were not refitted for it. One
H200 run (us, whole / the model's split, forced): 1162x1051 @ 1051x440 82.2 /
62.7 (3 x 352), 511x700 @ 700x613 55.7 / 47.8 (3 chunks); it keeps 2243x758 @
758x514 whole (70.4, where the in-loop model's 3 chunks of 128x64 took 107.6) and
1710x716 @ 716x701 (67.7; 2 x 384 took 101.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import MemRefType, ModuleOp, StringAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from irc.analysis.dot_operands import runs_in_half
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import F32
from irc.passes.kernel_names import kernel_names, unique_name
from irc.passes.options import check_option
from irc.passes.split_reduction import chunked_kernel, combine_partials
from irc.passes.tile import (
    SPLIT_TF32_SMALL_RATE,
    SPLIT_TF32_WIDE_RATE,
    TF32_PARTS_NARROW_TILES,
    KernelShape,
    gemm_tiling,
    operand_tiles,
)

K_STEP = 32
"""A chunk is whole K steps of the f32 tiles (the tile pass's 32)."""

ALIGN_ELEMENTS = 4
"""An exact chunk's length is a multiple of this many f32 elements, so that every
chunk starts 16 bytes apart in K (a row of the operand stored [M, K] or [N, K])
and its loads stay vectorized."""

MIN_CHUNK = 256
"""The shortest chunk: 8 K steps, past the pipeline's fill."""

MOST_SPLITS = 256
"""The most chunks: 64x65536 @ 65536x64 makes one output tile, which 256 chunks of
256 spread over the SMs (on an H200: 3605 us whole, 123 in 32 chunks, 32 in 256)."""

RAGGED_RATE = 0.85
"""The rate of a split whose last chunk runs past K (its chunk overlaps the one
before, both factors masked in every chunk's loop) against chunks that divide K.
GEMM + bias + erf GELU on an H200, one run (us, exact against ragged chunks of
about the same length): 300x9000 @ 9000x700 in 2 x 4500 171.5, 2 x 4512 228.2;
400x12000 @ 12000x500 in 4 x 3000 177.8, 4 x 3008 211.0, 8 x 1500 139.0, 8 x 1504
156.0; 256x10000 @ 10000x1000 in 4 x 2500 153.3, 4 x 2528 169.2; 96x30000 @
30000x200 in 4 x 7500 427.8, 4 x 7520 513.4 (0.75-0.93, 0.85 the middle)."""

PROGRAM_K = 60
"""A program's start and end (its pipeline's fill, the partial tile's store) cost
like this many K steps of its loop: about 4 us against 65 ns a K step of a
128x128 f32 program. Fitted on two H200 runs: the table's S = 8 and 16 against S =
4 (77), and 170 forced splits of 12 GEMMs (`x @ w`, odd sizes; the second run).
40 picked the fastest forced split of the second run's GEMMs but moved the
table's picks to slower ones; 60 keeps those, and of the second run's picks 8
are within 3% of its fastest split, one 6% (640x7500 @ 7500x360: 8 x 960, 99.1
against 15 x 500, 93.4), two were not among the forced ones, and 123x7777 @
7777x45 (rows of 31,108 bytes: no 16-byte alignment) was left out of the fit."""

PARTS_RATES = {(tm, tn): rate for tm, tn, rate in TF32_PARTS_NARROW_TILES}
"""The narrow tiles' rates of a GEMM of TF32 parts, by tile (the tile pass's)."""

SPLIT_GAIN = 0.9
"""A split must cost at most this much of the unsplit GEMM (by `split_cost`): the
model is a few percent from the measured times, and a split adds a kernel and
its partials' traffic (1024^3 and 2565x976 @ 976x939, 4% and 2% cheaper by the
model, stay whole)."""

PARTIAL_BYTES_PER_K = 227_500
"""Partial bytes (written by stage 1, read by stage 2) that cost as long as one K
step of a round: 65 ns at about 3.5 TB/s."""


def split_cost(
    m: int, n: int, k: int, chunk: int, splits: int, sms: int, parts: bool = False
) -> float:
    """An m x k @ k x n GEMM's time in K steps of a round of 128x128 programs, split
    into `splits` chunks of `chunk` (1 of k: whole), at the tiles the tile pass would
    give it: rounds of its programs (`RAGGED_RATE` where the chunks overrun k) and its
    partials. `parts`: operands stored as TF32 parts (`split-tf32-gemm-operands`),
    whose 64x128 and 128x64 programs run at `TF32_PARTS_NARROW_TILES`' rates."""
    parallel = (splits, m, n) if splits > 1 else (m, n)
    tiles_a_step = (2, 2) if parts else (1, 1)
    shape = KernelShape(
        KernelKind.CONTRACTION, parallel, (chunk,), element_bytes=4, operand_tiles=tiles_a_step
    )
    bm, bn, _ = gemm_tiling(shape, sms).block
    tiles = splits * -(-m // bm) * -(-n // bn)
    steps = -(-chunk // K_STEP) * K_STEP + PROGRAM_K  # a chunk's last step is whole work
    programs, rate = 1, 1.0  # programs an SM, and their rate against 128x128's
    if bm * bn >= 128 * 128:
        pass
    elif parts:
        rate = PARTS_RATES.get((bm, bn), 1.0)
    elif (bm, bn) == (128, 64):  # unbatched only: the whole GEMM
        rate = SPLIT_TF32_WIDE_RATE
    else:  # two programs an SM, each at the small tiles' rate
        programs, rate = 2, SPLIT_TF32_SMALL_RATE
    area = programs * bm * bn / (128 * 128)
    time = math.ceil(tiles / (programs * sms)) * steps * area / rate
    if splits * chunk > k:
        time /= RAGGED_RATE
    partials = 0.0 if splits == 1 else 8 * splits * m * n / PARTIAL_BYTES_PER_K
    return time + partials


def split_choice(m: int, n: int, k: int, sms: int, parts: bool = False) -> tuple[int, int]:
    """(S, chunk) of the cheapest split of an m x k @ k x n GEMM; (1, k) for none.
    Every S up to `MOST_SPLITS` is tried, in chunks of whole K steps and, where S
    divides K into whole `ALIGN_ELEMENTS`, in exact chunks (9000 = 9 x 1000: each
    chunk's last step masked, as an unsplit K's is, and no chunk overlaps another).
    Chunks that divide K beat ragged ones by `RAGGED_RATE`."""
    best, best_cost = (1, k), SPLIT_GAIN * split_cost(m, n, k, k, 1, sms, parts)
    tried: set[int] = set()
    for s in range(2, MOST_SPLITS + 1):
        stepped = -(-k // s // K_STEP) * K_STEP
        if stepped < MIN_CHUNK:
            break
        exact = k // s if k % s == 0 and k // s % ALIGN_ELEMENTS == 0 else stepped
        for chunk in (stepped, exact if exact >= MIN_CHUNK else stepped):
            splits = -(-k // chunk)
            if splits < 2 or chunk in tried:
                continue
            tried.add(chunk)
            cost = split_cost(m, n, k, chunk, splits, sms, parts)
            if cost < best_cost:
                best, best_cost = (splits, chunk), cost
    return best


def splittable(kernel: loop.KernelOp) -> loop.ReduceOp | None:
    """The contraction of an untiled f32 GEMM kernel with a 2-d output, if that is
    what `kernel` is (one contraction of f32 products, no batch)."""
    if kernel.block is not None or loop.kernel_kind(kernel) is not KernelKind.CONTRACTION:
        return None
    if len(kernel.parallel_bounds()) != 2:
        return None
    contractions = [op for op in kernel.body.walk() if loop.is_contraction(op)]
    if len(contractions) != 1:
        return None
    (red,) = contractions
    assert isinstance(red, loop.ReduceOp)
    if red.parent_op() is not kernel or red.result.type != F32 or runs_in_half(red):
        return None
    return red


@dataclass(frozen=True)
class SplitKPass(ModulePass):
    """`split-k{sms=132}` on loop-level IR."""

    name = "split-k"
    levels = ("loop",)

    sms: int = 132
    """The GPU's SM count (`irc.target` sets it), which the rounds are counted in."""

    def __post_init__(self) -> None:
        check_option(self.name, "sms", self.sms, 1, 1 << 16)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = kernel_names(op)
        for kernel in loop.kernels(op):
            red = splittable(kernel)
            if red is None:
                continue
            m, n = kernel.parallel_bounds()
            (k,) = loop.int_list(red.bounds)
            parts = operand_tiles(kernel, red) != (1, 1)  # split-tf32-gemm-operands'
            splits, chunk = split_choice(m, n, k, self.sms, parts)
            if splits > 1:
                split_gemm(kernel, red, splits, chunk, taken)


def split_gemm(
    kernel: loop.KernelOp, red: loop.ReduceOp, splits: int, chunk: int, taken: set[str]
) -> None:
    """`kernel`'s contraction as `splits` chunks of `chunk` (a GEMM kernel before
    it storing their partials), and `kernel` summing them."""
    parent = kernel.parent_block()
    assert parent is not None
    name = unique_name(kernel.kernel_name.data + "_split", taken)
    stage, mapping = chunked_kernel(
        kernel, [red], [red], splits, chunk, name, KernelKind.CONTRACTION
    )
    partials = loop.AllocOp.create(
        result_types=[MemRefType(F32, [splits, *kernel.parallel_bounds()])]
    )
    body = stage.body.block
    copy: Operation = mapping[red]
    body.add_op(loop.StoreOp.create(operands=[copy.results[0], partials.result, *body.args]))
    parent.insert_ops_before([partials, stage], kernel)
    combine_partials(kernel, red, partials.result, splits)
    kernel.kind = StringAttr(KernelKind.REDUCTION)
