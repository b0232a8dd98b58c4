"""`split-reduction`: a large full reduction becomes two kernels.

A kernel with no parallel dims runs as one program, which leaves all but one
GPU core idle. When such a kernel has one large reduction (at least
`threshold` elements), it is split as Inductor and XLA do:

- stage 1 (`bounds = [G]`): G programs each reduce one contiguous chunk of
  N / G elements into a partial result (in f32 for half types);
- stage 2: the original kernel, whose reduction now reads the G partials.

G is the largest power of two that divides N (no chunk is ragged) and is at
most `splits` and N / `min_chunk`; a reduction whose size has no such divisor
of at least 16 is left alone.

Why up to 8192 chunks and not fewer, larger ones: the programs that run at the
same time should read a compact window of memory, and the last wave of
programs should be short. With 1024 chunks of an 8192x8192 f32 reduction, the
resident programs read 2048 streams spread over all 512 MB, and the same
kernel took 1.05 to 1.09 of the copy floor on an H200 depending on where the
allocator placed the inputs; with 4096 chunks 1.03 to 1.05 wherever they were,
and with 8192 (each program's chunk then fits in its registers) about 1.3%
less again. More chunks than that read as fast, but the final kernel, one
program summing all the partials, then costs more than they save
(docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import F32, HALF_TYPES, int_array, numel
from irc.passes.options import check_option

INDEX = IndexType()



def _index_const(block: Block, n: int, before: Operation) -> SSAValue:
    op = loop.ConstantOp.create(properties={"value": IntegerAttr(n, i64)}, result_types=[INDEX])
    block.insert_op_before(op, before)
    return op.result


def _apply(
    block: Block, fn: str, args: list[SSAValue], before: Operation, result=INDEX
) -> SSAValue:  # type: ignore[no-untyped-def]
    op = loop.ApplyOp.create(
        operands=args, result_types=[result], properties={"fn": StringAttr(fn)}
    )
    block.insert_op_before(op, before)
    return op.result


def split_count(n: int, splits: int) -> int:
    """The largest power of two up to `splits` that divides `n`."""
    g = 1
    while g * 2 <= splits and n % (g * 2) == 0:
        g *= 2
    return g


def _the_reduction(kernel: loop.KernelOp) -> loop.ReduceOp | None:
    reductions = [op for op in kernel.body.block.ops if isinstance(op, loop.ReduceOp)]
    others = [op for op in kernel.body.block.ops if isinstance(op, loop.ForeachOp)]
    if len(reductions) != 1 or others or reductions[0].contract is not None:
        return None
    return reductions[0]


def split_kernel(kernel: loop.KernelOp, threshold: int, splits: int, min_chunk: int = 1) -> bool:
    """Splits one kernel in place (before it: the partials buffer and stage 1)."""
    if kernel.parallel_bounds() or loop.kernel_kind(kernel) is not KernelKind.REDUCTION:
        return False
    red = _the_reduction(kernel)
    if red is None:
        return False
    bounds = loop.int_list(red.bounds)
    n = numel(bounds)
    g = split_count(n, min(splits, n // min_chunk))
    if n < threshold or g < 16:
        return False
    chunk = n // g
    acc = F32 if red.result.type in HALF_TYPES else red.result.type
    parent = kernel.parent_block()
    assert parent is not None
    partials = loop.AllocOp.create(result_types=[MemRefType(acc, [g])])
    parent.insert_op_before(partials, kernel)

    # Stage 1: a copy of the kernel, cut after its reduction, over G chunks.
    stage1 = kernel.clone()
    body1 = Block(arg_types=[INDEX])
    for op in list(stage1.body.block.ops):
        op.detach()
        body1.add_op(op)
    (gi,) = body1.args
    red1 = next(op for op in body1.ops if isinstance(op, loop.ReduceOp))
    for op in list(body1.ops)[::-1]:
        if op is red1:
            break
        body1.erase_op(op)
    rblock = red1.body.block
    chunk_block = Block(arg_types=[INDEX])
    first = rblock.first_op
    assert first is not None
    for op in list(rblock.ops):
        op.detach()
        chunk_block.add_op(op)
    (rr,) = chunk_block.args
    first = chunk_block.first_op
    assert first is not None
    flat = _apply(
        chunk_block,
        "add",
        [_apply(chunk_block, "mul", [gi, _index_const(chunk_block, chunk, first)], first), rr],
        first,
    )
    stride = n
    for d, (old, size) in enumerate(zip(rblock.args, bounds, strict=True)):
        stride //= size
        v = flat
        if stride != 1:
            v = _apply(
                chunk_block, "floordiv", [v, _index_const(chunk_block, stride, first)], first
            )
        if d > 0:
            v = _apply(chunk_block, "mod", [v, _index_const(chunk_block, size, first)], first)
        old.replace_all_uses_with(v)
    yielded = chunk_block.last_op
    assert isinstance(yielded, loop.YieldOp)
    if acc != red.result.type:
        value = _apply(chunk_block, "cast", [yielded.values[0]], yielded, acc)
        yielded.operands = [value]
    partial = loop.ReduceOp.create(
        properties={"kind": red1.kind, "bounds": int_array([chunk])},
        result_types=[acc],
        regions=[Region(chunk_block)],
    )
    body1.insert_op_before(partial, red1)
    body1.erase_op(red1)
    body1.add_op(loop.StoreOp.create(operands=[partial.result, partials.result, gi]))
    new_stage1 = loop.KernelOp.create(
        properties={
            "name": StringAttr(kernel.kernel_name.data + "_split"),
            "bounds": int_array([g]),
            "kind": StringAttr(KernelKind.REDUCTION),
        },
        regions=[Region(body1)],
    )
    new_stage1.location = kernel.location
    parent.insert_op_before(new_stage1, kernel)
    stage1.erase()

    # Stage 2: the original kernel reduces the partials instead.
    combine = Block(arg_types=[INDEX])
    load = loop.LoadOp.create(operands=[partials.result, combine.args[0]], result_types=[acc])
    combine.add_op(load)
    combine.add_op(loop.YieldOp.create(operands=[load.result]))
    final = loop.ReduceOp.create(
        properties={"kind": red.kind, "bounds": int_array([g])},
        result_types=[acc],
        regions=[Region(combine)],
    )
    block = kernel.body.block
    block.insert_op_before(final, red)
    result = final.result
    if acc != red.result.type:
        result = _apply(block, "cast", [result], red, red.result.type)
    red.result.replace_all_uses_with(result)
    block.erase_op(red)
    return True


@dataclass(frozen=True)
class SplitReductionPass(ModulePass):
    """`split-reduction{threshold=65536 splits=8192 min_chunk=1024}` on loop-level IR."""

    name = "split-reduction"
    levels = ("loop",)

    threshold: int = 65536
    splits: int = 8192
    min_chunk: int = 1024

    def __post_init__(self) -> None:
        check_option(self.name, "threshold", self.threshold, 0)
        check_option(self.name, "splits", self.splits, 1)
        check_option(self.name, "min_chunk", self.min_chunk, 1)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in [k for k in op.walk() if isinstance(k, loop.KernelOp)]:
            split_kernel(kernel, self.threshold, self.splits, self.min_chunk)
