"""`split-tf32-gemm-operands`: an f32 GEMM's operands are split into TF32 parts once.

f32 GEMMs run on tensor cores as three TF32 products of split operands
(`split-tf32`: a head and a tail each, the tails' product dropped), which keeps
f32's accuracy. Split in the K loop (`_irc_dot_split_tf32`), every tile is split
again each time a program reads it, and the parts go back to shared memory for the
tensor cores: the splitting, not the products, sets the time. This pass splits
each operand once, before the GEMM, in a copy kernel (`tf32_parts_N`) that writes
its heads and its tails K-major, in rows padded to 128 bytes (pad 0, as
`k-major-gemm-operands` pads to 16).

The GEMM then sums three products a K step, `ah bh + (at bf + af bt)`, each one
TF32 dot of values TF32 holds exactly (`irc.analysis.dot_operands.tf32_exact`),
in the order and with the inf and NaN handling of `_irc_dot_split_tf32`: `af` and
`bf`, the finite heads (0 for inf and NaN), are selected from the loaded heads in
the K loop. The same values, bit for bit. Four tiles a K step fit three stages
of 128x128x32 in shared memory; storing the finite heads too (six tiles, or five
with one side's) does not, and two stages ran 2-3x slower. Measured on an H200
(hand-written kernels of this form, GEMM + bias + erf GELU, us, one run; the GEMM
with both copies against the in-loop split as lowered then, and
`torch.compile`): 5343x312 @ 312x540 63 against 80 (61), 2243x758 @ 758x514 65
against 146 (66), 1710x716 @ 716x701 64 against 151 (82), 4429x820 @ 820x1208 169
against 210 (238), 3000x1023 @ 1023x2049 260 against 296 (333), 8192x4096 @
4096x4096 3537 against 4313 (5444).

A copy reads the operand once and writes it twice; the GEMM must read each tile
of both `rereads` times or more and reach `min_flops`, or neither is split. With
`irc.compile(tf32=True)` (one TF32 product) the pass is not run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    Float32Type,
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

from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import F32, int_array
from irc.passes.gemm_operand_copies import (
    GemmOperandCopyPass,
    Operand,
    gemm_k,
    gemm_operands,
    padded_columns,
)
from irc.passes.k_major_gemm_operands import run_k_over_padding
from irc.passes.kernel_names import kernel_names, numbered_name
from irc.passes.options import check_option
from irc.passes.split_k import split_choice
from irc.passes.tile import L2_BYTES

PARTS_MIN_FLOPS = 2**28
"""The smallest product (2 M N K) whose operands are split: the in-loop split ran
the GEMMs measured at a third to four fifths of the parts' speed, and a product of
2**28 takes it about 10 us (25 TFLOP/s), so that the parts save about what their
copy's launch and traffic cost from there (a few us for operands of a few MB)."""

KERNEL_PREFIX = "tf32_parts_"
"""The copies' kernel names: `tf32_parts_0`, `tf32_parts_1`..."""

WHY = (
    "split-tf32-gemm-operands stores an f32 GEMM operand once as TF32 parts (heads "
    "and tails, K-major), which tensor cores multiply without splitting every tile"
)
"""What the fusion report says of a copy (`irc.passes.fuse.resolve_reports`)."""

PARTS_ROW_BYTES = 128
"""The parts' rows are padded to whole 128-byte lines: 32 f32, a whole number of
the K steps the tile pass takes (32), so that K runs over the padded rows unmasked
(`run_k_over_padding`), and each row starts a line."""

PARTS = ("tf32_head", "tf32_tail")
"""The parts a copy writes of an operand, in order."""


def f32_operands(kernel: loop.KernelOp) -> list[Operand]:
    """The operands of `kernel`'s f32 contractions that are a lone product of two
    whole 2-d loads (the form graph-to-loop writes)."""
    found = {o.load: o for o in gemm_operands(kernel)}
    out: list[Operand] = []
    for red in kernel.body.block.ops:
        pair = _factors(red, found)
        if pair is not None:
            out.extend(pair)
    return out


def _factors(red: Operation, found: dict[loop.LoadOp, Operand]) -> tuple[Operand, Operand] | None:
    """A contraction's (left, right) operands where its body is `mul(load, load)` of
    f32 GEMM operands, one indexed by the rows and one by the columns."""
    if not (isinstance(red, loop.ReduceOp) and red.contract is not None):
        return None
    if not isinstance(red.result.type, Float32Type):
        return None
    product = red.body.block.last_op.values[0].owner  # type: ignore[union-attr]
    if not (isinstance(product, loop.ApplyOp) and product.fn.data == "mul"):
        return None
    loads = [a.owner for a in product.args]
    if not all(isinstance(ld, loop.LoadOp) and ld in found for ld in loads):
        return None
    left, right = (found[ld] for ld in loads)  # type: ignore[index]
    if left.indexes_n or not right.indexes_n:
        return None
    return left, right


@dataclass(frozen=True)
class SplitTf32GemmOperandsPass(GemmOperandCopyPass):
    """`split-tf32-gemm-operands{min_flops=268435456 rereads=2 sms=132}` on loop-level IR."""

    name = "split-tf32-gemm-operands"
    levels = ("loop",)

    min_flops: int = PARTS_MIN_FLOPS
    sms: int = 132
    """The GPU's SM count (`irc.target` sets it), for split-k's choice (`copies_for`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_option(self.name, "sms", self.sms, 1, 1 << 16)

    def copies_for(self, kernel: loop.KernelOp) -> bool:
        """Not where the parts outgrow L2 (`L2_BYTES`) and split-k would split the GEMM
        in loop-split form (few output tiles for its K, `split_k.split_choice`): then
        its many programs read the parts at once, from memory, twice the bytes of the
        operands. Measured on an H200 (GEMM + bias + erf GELU, us, in-loop split
        against parts, both at split-k's choice): 300x9000 @ 9000x700 120 / 191,
        777x5000 @ 5000x1333 253 / 322, 256x10000 @ 10000x1000 139 / 168, 400x12000 @
        12000x500 141 / 185, 640x7500 @ 7500x360 99 / 124; the fastest forced split
        of parts did no better (139, 369, 158)."""
        m, n = kernel.parallel_bounds()
        k = gemm_k(kernel)
        parts_bytes = 2 * (m + n) * padded_columns(k, 4, PARTS_ROW_BYTES) * 4
        return parts_bytes <= L2_BYTES or split_choice(m, n, k, self.sms)[0] == 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = kernel_names(op)
        made: dict[tuple[SSAValue, bool], list[SSAValue]] = {}
        for kernel, operands in self.gemms_to_copy(op, f32_operands):
            chosen = {o.load: o for o in operands}
            copies: set[SSAValue] = set()
            for red in list(kernel.body.block.ops):
                pair = _factors(red, chosen)
                if pair is None:
                    continue
                assert isinstance(red, loop.ReduceOp)
                parts = []
                for operand in pair:
                    # (both sides' parts are alike: x @ x.T splits x once)
                    key = (operand.load.buffer, operand.k_contiguous)
                    if key not in made:
                        made[key] = parts_before(kernel, operand, taken)
                    parts.append(made[key])
                    copies.update(made[key])
                sum_parts(red, pair, parts[0], parts[1])
            run_k_over_padding(kernel, copies)


def parts_before(kernel: loop.KernelOp, operand: Operand, taken: set[str]) -> list[SSAValue]:
    """`operand`'s buffer as TF32 parts (`PARTS`), each in
    K-major rows padded to `PARTS_ROW_BYTES` (pad 0), written by one kernel just
    before `kernel`."""
    buffer = operand.load.buffer
    rows, cols = buffer.type.get_shape()  # type: ignore[attr-defined]
    if not operand.k_contiguous:
        rows, cols = cols, rows
    target = MemRefType(F32, [rows, padded_columns(cols, 4, PARTS_ROW_BYTES)])
    allocs = [loop.AllocOp.create(result_types=[target]) for _ in PARTS]
    copy = parts_kernel(
        buffer, [a.result for a in allocs], numbered_name(KERNEL_PREFIX, taken), cols,
        transpose=not operand.k_contiguous,
    )  # fmt: skip
    copy.location = kernel.location
    block = kernel.parent_block()
    assert block is not None
    block.insert_ops_before([*allocs, copy], kernel)
    return [a.result for a in allocs]


class Ops:
    """Loop ops made in order, to be inserted together."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def add(self, op: Operation) -> SSAValue:
        self.ops.append(op)
        return op.results[0]

    def apply(self, fn: str, args: list[SSAValue], result: Attribute = F32) -> SSAValue:
        return self.add(
            loop.ApplyOp.create(
                operands=args, properties={"fn": loop.apply_fn(fn)}, result_types=[result]
            )
        )

    def index(self, n: int) -> SSAValue:
        return self.add(
            loop.ConstantOp.create(
                properties={"value": IntegerAttr(n, i64)}, result_types=[IndexType()]
            )
        )

    def zero(self) -> SSAValue:
        return self.add(
            loop.ConstantOp.create(properties={"value": FloatAttr(0.0, F32)}, result_types=[F32])
        )

    def load(self, buffer: SSAValue, *indices: SSAValue) -> SSAValue:
        return self.add(loop.LoadOp.create(operands=[buffer, *indices], result_types=[F32]))

    def finite(self, head: SSAValue, zero: SSAValue) -> SSAValue:
        """`head` where it is finite, else 0 (as `_irc_dot_split_tf32`'s `a_finite`)."""
        difference = self.apply("sub", [head, head])
        return self.apply("where", [self.apply("eq", [difference, zero], i1), head, zero])


def parts_kernel(
    source: SSAValue,
    targets: Sequence[SSAValue],
    name: str,
    columns: int,
    transpose: bool,
) -> loop.KernelOp:
    """`targets[p][r, c]` = part `PARTS[p]` of `source[r, c]` (of `source[c, r]` where
    `transpose`) for `c < columns`, 0 past them."""
    shape = list(targets[0].type.get_shape())  # type: ignore[attr-defined]
    body = Block(arg_types=[IndexType(), IndexType()])
    row, col = body.args
    b = Ops()
    zero = b.zero()
    clamped = b.apply("minimum", [col, b.index(columns - 1)], IndexType())
    inside = b.apply("lt", [col, b.index(columns)], i1)
    value = b.load(source, *([clamped, row] if transpose else [row, clamped]))
    for part, target in zip(PARTS, targets, strict=True):
        stored = b.apply("where", [inside, b.apply(part, [value]), zero])
        b.ops.append(loop.StoreOp.create(operands=[stored, target, row, col]))
    body.add_ops(b.ops)
    return loop.KernelOp.create(
        properties={
            "name": StringAttr(name),
            "bounds": int_array(shape),
            "kind": StringAttr(KernelKind.POINTWISE),
        },
        regions=[Region(body)],
    )


def sum_parts(
    red: loop.ReduceOp,
    pair: tuple[Operand, Operand],
    left: list[SSAValue],
    right: list[SSAValue],
) -> None:
    """`red`'s product of two loads becomes `ah bh + (at bf + af bt)` of the parts."""
    block = red.body.block
    yield_op = block.last_op
    assert isinstance(yield_op, loop.YieldOp)
    (kiv,) = block.args
    product = yield_op.values[0].owner
    assert isinstance(product, loop.ApplyOp)

    def other_index(operand: Operand) -> SSAValue:
        (other,) = [i for i in operand.load.indices if i is not kiv]
        return other

    row, col = (other_index(o) for o in pair)
    b = Ops()
    ah, at = (b.load(buffer, row, kiv) for buffer in left)
    bh, bt = (b.load(buffer, col, kiv) for buffer in right)
    zero = b.zero()
    af, bf = (b.finite(head, zero) for head in (ah, bh))
    small = b.apply("add", [b.apply("mul", [at, bf]), b.apply("mul", [af, bt])])
    total = b.apply("add", [b.apply("mul", [ah, bh]), small])
    block.insert_ops_before(b.ops, yield_op)
    yield_op.operands = [total]
    for dead in (product, *(o.load for o in pair)):
        if not any(True for _ in dead.results[0].uses):
            dead.detach()
            dead.erase()
