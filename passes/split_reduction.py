"""`split-reduction`: a large full reduction becomes two kernels.

A kernel with no parallel dims runs as one program, which leaves all but one
GPU core idle. When such a kernel has one large reduction (at least
`threshold` elements), it is split as Inductor and XLA do:

- stage 1 (`bounds = [G]`): G programs each reduce one contiguous chunk of
  N / G elements into a partial result (in f32 for half types);
- stage 2: the original kernel, whose reduction now reads the G partials.

G is the largest power of two that divides N (no chunk is ragged) and is at
most `splits` and N / `min_chunk`, where that gives every SM `PROGRAMS_PER_SM`
programs (or reaches those bounds); otherwise the chunks are of a power-of-two
length, about N / the bound, the last one short (`ragged_count`), and a
reduction too small for 16 chunks is left alone.

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

A reduction with kept dims whose grid would leave the GPU idle (a column sum:
`column_chunks`) is split along its reduced rows the same way. Where something
reads its combined value again and it streams `combine-once-bytes` or more, a
small kernel over the kept dims combines the partials once (`_combine_once`),
and an epilogue that reads them becomes an element-wise kernel over the whole
tensor (`_elementwise_kernel`); below that, every program of the next kernel
combines the partials it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from xdsl.context import Context
from xdsl.dialects.builtin import (
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import (
    ELEMENT_TYPES,
    F32,
    FLOAT_TYPES,
    HALF_TYPES,
    I1,
    element_bytes,
    int_array,
    numel,
)
from irc.passes.kernel_names import kernel_names, unique_name
from irc.passes.online_softmax import fuse_pair, softmax_partner
from irc.passes.options import check_option
from irc.passes.tile import (
    COLUMN_MIN_STEPS,
    COLUMN_PROGRAMS_PER_SM,
    COLUMN_WARPS,
    L2_BYTES,
    LINE_BYTES,
    ONE_STEP_ELEMENTS,
    PERSISTENT_ROW_ELEMENTS,
    REREAD_MOST_WARPS,
    KernelShape,
    choose_tiling,
    column_programs,
    column_step_rows,
    column_width,
    column_widths,
    held_column_lanes,
    kernel_shape,
    next_pow2,
    programs,
    resident_bytes,
    run_dims,
)

INDEX = IndexType()


def _index_const(block: Block, n: int, before: Operation) -> SSAValue:
    op = loop.ConstantOp.create(properties={"value": IntegerAttr(n, i64)}, result_types=[INDEX])
    block.insert_op_before(op, before)
    return op.result


def _apply(
    block: Block, fn: str, args: list[SSAValue], before: Operation, result=INDEX
) -> SSAValue:  # type: ignore[no-untyped-def]
    op = loop.ApplyOp.create(
        operands=args, result_types=[result], properties={"fn": loop.apply_fn(fn)}
    )
    block.insert_op_before(op, before)
    return op.result


def split_count(n: int, splits: int) -> int:
    """The largest power of two up to `splits` that divides `n`."""
    g = 1
    while g * 2 <= splits and n % (g * 2) == 0:
        g *= 2
    return g


Reduction = loop.ReduceOp | loop.SoftmaxReduceOp | loop.WelfordReduceOp


def _reductions(kernel: loop.KernelOp) -> list[Reduction]:
    """The kernel's own reductions (not a contraction's), in order."""
    return [
        op
        for op in kernel.body.block.ops
        if isinstance(op, Reduction) and not loop.is_contraction(op)
    ]


def _slice(ops: list[Operation], roots: list[Operation]) -> set[Operation]:
    """The top-level ops of `ops` that `roots` use, roots included (operands of ops
    nested in their regions count)."""
    top = set(ops)
    keep: set[Operation] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op in keep:
            continue
        keep.add(op)
        for inner in op.walk():
            for v in inner.operands:
                owner = v.owner
                if isinstance(owner, Operation) and owner in top:
                    stack.append(owner)
    return keep


def _levels(kernel: loop.KernelOp) -> list[list[Reduction]]:
    """The reductions by dependence: level 0 reads none of the others, level k one of level k-1."""
    reductions = _reductions(kernel)
    ops = list(kernel.body.block.ops)
    level: dict[Operation, int] = {}
    for red in reductions:
        needs = _slice(ops, [red]) - {red}
        level[red] = 1 + max((level[r] for r in needs if r in level), default=-1)
    out: list[list[Reduction]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for red in reductions:
        out[level[red]].append(red)
    return out


def _identity(kind: str, element: Attribute) -> Attribute:
    """What a masked-off element of a ragged chunk contributes to a `kind` reduction
    (`welford`: each of its part's mean, m2 and weight)."""
    if element in FLOAT_TYPES:
        value = {"sum": 0.0, "max": -math.inf, "min": math.inf, "welford": 0.0}[kind]
        return FloatAttr(value, f64)
    if element == I1:
        return IntegerAttr({"sum": 0, "max": 0, "min": 1}[kind], i64)
    bits = 64 if element == ELEMENT_TYPES["i64"] else 32
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return IntegerAttr({"sum": 0, "max": lo, "min": hi}[kind], i64)


def _chunk_region(
    block: Block,
    g: SSAValue,
    chunk: int,
    bounds: list[int],
    kind: str | None = None,
    run: int = 0,
) -> list[int]:
    """Re-indexes a region over `bounds` as chunk `g` of `chunk` flat elements:
    its argument becomes the offset in the chunk and the old indices are computed;
    returns the region's new bounds. With a `run` (the elements of the last dims,
    `run_dims`; `chunk` a multiple of it), chunks are whole runs: the region keeps
    those dims' indices, and its first becomes the run in the chunk.

    Where chunks are ragged (the last one runs past the end), indices are clamped
    to the last element, and a reduction (`kind`) yields its identity there; a
    foreach writes the last element again, with the same value. A contraction's
    last chunk is the last `chunk` elements instead, both factors 0 where the
    chunk before it has them (0 * 0: an inf factor there would make NaN of 0 * inf):
    clamped indices would break the K loop's runs of contiguous, aligned elements,
    and a dot's product stays a product (loop.ReduceOp's contract)."""
    first = block.first_op
    assert first is not None
    old_args = list(block.args)
    kept: list[int] = []
    if run:
        k = run_dims(bounds, run)
        assert chunk % run == 0 and k < len(bounds)
        bounds, kept, chunk, old_args = bounds[:-k], bounds[-k:], chunk // run, old_args[:-k]
    n = numel(bounds)
    rr = block.insert_arg(INDEX, 0)
    start = _apply(block, "mul", [g, _index_const(block, chunk, first)], first)
    flat = _apply(block, "add", [start, rr], first)
    inside = flat
    contraction = loop.is_contraction(parent := block.parent_op())
    if n % chunk:
        if kind is not None and contraction:
            assert isinstance(parent, loop.ReduceOp)
            summed = parent.body.block.last_op.values[0]  # type: ignore[union-attr]
            order = {op: i for i, op in enumerate(block.ops)}
            products = sorted(loop.contraction_products(summed), key=order.__getitem__)
            window = _apply(block, "minimum", [start, _index_const(block, n - chunk, first)], first)
            inside = _apply(block, "add", [window, rr], first)
            valid = _apply(block, "ge", [inside, start], products[0], I1)
            for product in products:  # (split-tf32-gemm-operands sums three)
                zero = loop.ConstantOp.create(
                    properties={"value": _identity("sum", product.result.type)},
                    result_types=[product.result.type],
                )
                block.insert_op_before(zero, product)
                product.operands = [
                    _apply(block, "where", [valid, f, zero.result], product, f.type)
                    for f in product.args
                ]
        else:
            inside = _apply(block, "minimum", [flat, _index_const(block, n - 1, first)], first)
        if kind is not None and not contraction:
            yielded = block.last_op
            assert isinstance(yielded, loop.YieldOp)
            valid = _apply(block, "lt", [flat, _index_const(block, n, first)], yielded, I1)
            masked = []
            for value in yielded.values:
                neutral = loop.ConstantOp.create(
                    properties={"value": _identity(kind, value.type)}, result_types=[value.type]
                )
                block.insert_op_before(neutral, yielded)
                masked.append(
                    _apply(block, "where", [valid, value, neutral.result], yielded, value.type)
                )
            yielded.operands = masked
    stride = n
    for d, (old, size) in enumerate(zip(old_args, bounds, strict=True)):
        stride //= size
        v = inside
        if stride != 1:
            v = _apply(block, "floordiv", [v, _index_const(block, stride, first)], first)
        if d > 0:
            v = _apply(block, "mod", [v, _index_const(block, size, first)], first)
        old.replace_all_uses_with(v)
        block.erase_arg(old)
    return [chunk, *kept]


def chunked_kernel(
    kernel: loop.KernelOp,
    keep: list[Operation],
    chunked: list[Operation],
    g: int,
    chunk: int,
    name: str,
    stage_kind: KernelKind = KernelKind.REDUCTION,
    run: int = 0,
) -> tuple[loop.KernelOp, dict[Operation, Operation]]:
    """A copy of `kernel` over `[g, *parallel]` holding what `keep` needs, whose
    loops `chunked` (over the split space) run over one chunk each, of whole runs of
    the last dim where `run` is its length (`_chunk_region`); a kernel of
    `stage_kind` (a contraction's chunks make one: `split-k`).

    Returns the copy and the map from the original's top-level ops to the copy's."""
    ops = list(kernel.body.block.ops)
    needed = _slice(ops, keep)
    copy = kernel.clone()
    mapping = dict(zip(ops, copy.body.block.ops, strict=True))
    for op in reversed(ops):
        if op not in needed:
            copy.body.block.erase_op(mapping.pop(op))
    parallel = kernel.parallel_bounds()
    body = Block(arg_types=[INDEX] * (1 + len(parallel)))
    for old, new in zip(copy.body.block.args, body.args[1:], strict=True):
        old.replace_all_uses_with(new)
    for op in list(copy.body.block.ops):
        op.detach()
        body.add_op(op)
    gi = body.args[0]
    for op in chunked:
        c = mapping[op]
        assert isinstance(c, Reduction | loop.ForeachOp)
        kind = None  # a foreach: no identity to yield past the end
        if isinstance(c, loop.ReduceOp):
            kind = c.kind.data
        elif isinstance(c, loop.WelfordReduceOp):
            kind = "welford"
        elif isinstance(c, loop.SoftmaxReduceOp):
            kind = "max"  # -inf: a max it does not raise, and exp(-inf - m) = 0 to the sum
        c.bounds = int_array(
            _chunk_region(c.body.block, gi, chunk, loop.int_list(c.bounds), kind, run)
        )
    stage = loop.KernelOp.create(
        properties={
            "name": StringAttr(name),
            "bounds": int_array([g, *parallel]),
            "kind": StringAttr(stage_kind),
        },
        regions=[Region(body)],
    )
    stage.location = kernel.location
    copy.erase()
    return stage, mapping


def _partial_accumulator(red: loop.ReduceOp) -> Attribute:
    return F32 if red.result.type in HALF_TYPES else red.result.type


def combine_partials(
    kernel: loop.KernelOp, red: loop.ReduceOp, partials: SSAValue, g: int
) -> list[SSAValue]:
    """Replaces `red` in `kernel` by the reduction of its `g` partials (returned)."""
    acc = _partial_accumulator(red)
    combine = Block(arg_types=[INDEX])
    load = loop.LoadOp.create(
        operands=[partials, combine.args[0], *kernel.body.block.args], result_types=[acc]
    )
    combine.add_op(load)
    combine.add_op(loop.YieldOp.create(operands=[load.result]))
    final = loop.ReduceOp.create(
        properties={"kind": red.kind, "bounds": int_array([g])},
        result_types=[acc],
        regions=[Region(combine)],
    )
    block = red.parent_block()
    assert block is not None
    block.insert_op_before(final, red)
    result = final.result
    if acc != red.result.type:
        result = _apply(block, "cast", [result], red, red.result.type)
    red.result.replace_all_uses_with(result)
    block.erase_op(red)
    return [result]


def _combine_parts(
    kernel: loop.KernelOp, red: loop.WelfordReduceOp, parts: list[SSAValue], g: int
) -> list[SSAValue]:
    """Replaces `red` in `kernel` by the combination of its `g` chunks' parts (the
    buffers `parts` of their means, M2s and weights)."""
    combine = Block(arg_types=[INDEX])
    loads = [
        loop.LoadOp.create(
            operands=[p, combine.args[0], *kernel.body.block.args], result_types=[r.type]
        )
        for p, r in zip(parts, red.results, strict=True)
    ]
    combine.add_ops(loads)
    combine.add_op(loop.YieldOp.create(operands=[ld.result for ld in loads]))
    final = loop.WelfordReduceOp.create(
        properties={"bounds": int_array([g])},
        result_types=[r.type for r in red.results],
        regions=[Region(combine)],
    )
    block = red.parent_block()
    assert block is not None
    block.insert_op_before(final, red)
    for old, new in zip(red.results, final.results, strict=True):
        old.replace_all_uses_with(new)
    block.erase_op(red)
    return list(final.results)


def _combine_softmax_parts(
    kernel: loop.KernelOp, red: loop.SoftmaxReduceOp, parts: list[SSAValue], g: int
) -> list[SSAValue]:
    """Replaces `red` in `kernel` by the combination of its `g` chunks' maxima m_i and
    sums s_i of exp(x - m_i): M = max(m_i), S = sum(s_i * exp(m_i - M)), with M
    taken as 0 where it is -inf (every chunk empty of finite values: each s_i is 0,
    and exp(-inf - -inf) would be NaN)."""
    m_parts, s_parts = parts
    element = red.maximum.type
    block = red.parent_block()
    assert block is not None
    kept = kernel.body.block.args

    def reduce(kind: str, make: Callable[[Block], SSAValue]) -> SSAValue:
        body = Block(arg_types=[INDEX])
        body.add_op(loop.YieldOp.create(operands=[make(body)]))
        final = loop.ReduceOp.create(
            properties={"kind": StringAttr(kind), "bounds": int_array([g])},
            result_types=[element],
            regions=[Region(body)],
        )
        block.insert_op_before(final, red)
        return final.result

    def load(body: Block, buffer: SSAValue) -> SSAValue:
        op = loop.LoadOp.create(operands=[buffer, body.args[0], *kept], result_types=[element])
        body.add_op(op)
        return op.result

    def constant(value: float) -> SSAValue:
        c = loop.ConstantOp.create(
            properties={"value": FloatAttr(value, f64)}, result_types=[element]
        )
        block.insert_op_before(c, red)
        return c.result

    maximum = reduce("max", lambda body: load(body, m_parts))
    empty = _apply(block, "eq", [maximum, constant(-math.inf)], red, I1)
    base = _apply(block, "where", [empty, constant(0.0), maximum], red, element)

    def append(body: Block, fn: str, args: list[SSAValue]) -> SSAValue:
        op = loop.ApplyOp.create(
            operands=args, result_types=[element], properties={"fn": loop.apply_fn(fn)}
        )
        body.add_op(op)
        return op.result

    def rescaled(body: Block) -> SSAValue:
        m, s = load(body, m_parts), load(body, s_parts)
        return append(body, "mul", [s, append(body, "exp", [append(body, "sub", [m, base])])])

    sum_exp = reduce("sum", rescaled)
    red.maximum.replace_all_uses_with(maximum)
    red.sum_exp.replace_all_uses_with(sum_exp)
    block.erase_op(red)
    return [maximum, sum_exp]


def _store_parts(
    stage: loop.KernelOp,
    kernel: loop.KernelOp,
    red: loop.WelfordReduceOp | loop.SoftmaxReduceOp,
    g: int,
) -> list[SSAValue]:
    """Buffers for a split stage's `red` to store each chunk's part in (a welford's
    mean, M2 and weight; a softmax's max and sum of exps), allocated before `kernel`;
    the stores end `stage`."""
    parent = kernel.parent_block()
    assert parent is not None
    g_index, *p_index = stage.body.block.args
    parts = []
    for result in red.results:
        buffer = loop.AllocOp.create(
            result_types=[MemRefType(result.type, [g, *kernel.parallel_bounds()])]
        )
        parent.insert_op_before(buffer, kernel)
        stage.body.block.add_op(
            loop.StoreOp.create(operands=[result, buffer.result, g_index, *p_index])
        )
        parts.append(buffer.result)
    return parts


COMBINE_ONCE_BYTES = 48 << 20
"""Bytes a split column reduction streams from which its partials are combined once,
in a kernel of their own (`_combine_once`): below it, the extra launch and buffers
cost as much as combining in every program saves. On an H200, 48374x338 f32
batch-norm statistics (65 MB) and a column softmax of 12554x1422 f32 (71 MB) took
0.64x and 0.79x the time combined once; a bf16 column softmax of 8191x2047 (34 MB)
1.1x, and rows of 12-21 MB, where the host's launches and allocations (4.5 us a
buffer on that host) bound the call, 1.0-1.8x."""

REREAD_FACTOR = 2
"""From half of `COMBINE_ONCE_BYTES`, partials are also combined once where every
program of the next kernel, combining its columns' partials from all G chunks,
would read this many times its own chunk's bytes from L2 before its chunk's
loads start. On an H200 (session 19 of docs/benchmarks.md), batch-norm
statistics of 69190x149 f32 (41 MB, 2.7 times) and 16384x1000 bf16 (33 MB, 4
times) took 0.72x and 0.63x the kernel time combined once; a 8192x1024 f32 column
softmax (34 MB, 1 time) 1.02x, and one of 8191x2047 bf16 (34 MB, 2 times) 1.0x."""

WIDE_COMBINE_ONCE_SHARE = 2
WIDE_REREAD_SHARE = 6
WIDE_REREAD_FACTOR = 1
"""Elements of 4 bytes or more also combine once from `COMBINE_ONCE_BYTES /
WIDE_COMBINE_ONCE_SHARE` (24 MB), and from `/ WIDE_REREAD_SHARE` (8 MB) where every
program of the next kernel would read `WIDE_REREAD_FACTOR` times its chunk's bytes of
partials, in the chunks of a split that combines in every program (their count
capped at the square root of the reduced length). Combined in every program, the
kernel after the split inherits its grid: few programs, each reading all G partials
of its columns before its chunk, with loads of a column tile (no 16-byte vectors
where a row's bytes are no multiple of 16). Combined once, that kernel is
element-wise over a flat index and gathers a column's statistics (4-byte values)
for each element: for half-precision elements twice the bytes per byte streamed
that it is for f32. On an H200 (CUDA-graph us, every program / once, torch.compile
in brackets; session 45 of docs/benchmarks.md), f32 batch-norm 64905x137 68.9 /
53.7 (49.5), 30426x263 60.3 / 43.5 (45.5), 33693x91 27.9 / 19.6 (17.8), 27203x149
19.5 / 16.9 (21.2), 11153x491 (22 MB) 24.5 / 23.1 (36.2); f32 column softmaxes
2815x3718 47.7 / 39.7 (51.5), 8192x1024 33.8 / 31.7 (38.8); softmaxes over the
middle dim 84x1248x69 44.8 / 30.7 (45.8): 24 rows, none slower (30011x96, 12 MB,
14.9 / 14.7). Given the chunks of a split that combines once (uncapped), 4 of 20
rows lost 3-21% (11153x491 29.5); the same bounds for bf16 lost up to 29%
(7082x1109 batch-norm 29.2 / 37.8, a 2707x5813 column softmax 49.4 / 61.2), so half
precision keeps `COMBINE_ONCE_BYTES` and `REREAD_FACTOR`."""


REREAD_FILL = 4
"""A column reduction whose rows are read again (a softmax's output, a normalization)
stays one kernel where its unsplit programs give the SMs at least 1 / REREAD_FILL of
the programs a column reduction wants (`COLUMN_PROGRAMS_PER_SM` each) and what the
resident ones read (`resident_bytes`, at `COLUMN_WARPS`) fits in L2 (`L2_BYTES`):
each program reads its columns' rows again right after it reduced them, from L2,
where the kernel after a split reads them all from DRAM again. On an H200, a softmax
over dim 1 of 16x333x4096 bf16 (1024 programs of 64 columns, 43 KB each, for 2112
wanted) took 47.9 us unsplit against 81.5 in 6 chunks (torch.compile 66.3); one of
64x1024x129 f32 (320 programs) 68.4 against 49.3, so it is split. Where the resident
programs read more than L2 holds, the split won: softmaxes over dim 0 of 2000x100000
bf16 (400 MB) and 3000x40000 f32 (480 MB) took 464.2 and 374.0 us unsplit, 400.1 and
351.5 split; `z - z.sum(1, keepdim=True)` of a 413x520x145 bf16 permute (82 MB) 91.0
against 85.4. The split is decided at `COLUMN_WARPS` (16 resident programs an SM): a
kernel left whole at the tile pass's `reread_warps` instead (fewer, larger programs)
lost to its split, 79.5 us against 68.3 for a softmax over dim 1 of 12x308x5154 f32."""


def unsplit_rereads_from_l2(shape: KernelShape, sms: int) -> bool:
    """Whether a column reduction read again stays whole (`REREAD_FILL`), at the
    tiles of its rows read in steps (`column_width`: not `held_column_lanes`'s,
    which a kernel left whole may then take)."""
    x = column_width(shape, sms)
    programs = column_programs(shape, x)
    want = COLUMN_PROGRAMS_PER_SM * sms
    resident = resident_bytes(shape, x, programs, COLUMN_WARPS, sms)
    return REREAD_FILL * programs >= want and resident <= L2_BYTES


def rereads_from_dram(shape: KernelShape, sms: int) -> bool:
    """Whether a column reduction whose rows are read again, left whole, would read
    them again from DRAM: what its resident programs read passes L2 even at the
    most warps `tile`'s `reread_warps` gives them. Its second pass then reads
    the rows in the order of the first, a few hundred bytes of each of many rows a
    step, where a split that combines its partials once (`combines_once`) ends in
    an element-wise kernel that reads and writes the tensor flat."""
    x = column_width(shape, sms)
    resident = resident_bytes(shape, x, column_programs(shape, x), REREAD_MOST_WARPS, sms)
    return resident > L2_BYTES


def partial_bytes(kernel: loop.KernelOp) -> int:
    """Bytes of partials a chunk of a split of `kernel` stores a kept element: every
    result of its reductions (a mean, M2 and weight; a softmax's max and sum), half
    values as the f32 they accumulate in."""
    results = [r.type for level in _levels(kernel) for red in level for r in red.results]
    return sum(4 if t in HALF_TYPES else element_bytes(t) for t in results)


def combines_once(
    shape: KernelShape,
    n: int,
    least: int = COMBINE_ONCE_BYTES,
    chunks: int = 0,
    partials: int = 0,
    wide: bool = True,
) -> bool:
    """Whether a split of a kernel of `shape` (`n` reduced elements) into `chunks`
    combines its partials once in a kernel of their own: a column reduction
    streaming `least` bytes or more, or half that where the partials every program
    of the next kernel reads (`chunks` times `partials` bytes a column) are
    `REREAD_FACTOR` times its chunk's own bytes; for elements of 4 bytes or more
    (unless not `wide`), the shares and factor of `WIDE_REREAD_FACTOR`. That ratio
    grows with the chunk count, so a split chosen with more chunks because it
    combines once still does."""
    if not shape.columns:
        return False
    streamed = n * numel(shape.parallel) * shape.element_bytes
    share, reread_share, factor = 1, 2, REREAD_FACTOR
    if wide and shape.element_bytes >= 4:
        share, reread_share, factor = WIDE_COMBINE_ONCE_SHARE, WIDE_REREAD_SHARE, WIDE_REREAD_FACTOR
    if share * streamed >= least:
        return True
    if reread_share * streamed < least or chunks <= 1:
        return False
    chunk = -(-n // chunks)
    return chunks * partials >= factor * chunk * shape.element_bytes


def _combine_once(kernel: loop.KernelOp, values: list[SSAValue], name: str) -> None:
    """Moves the combining of a split's partials out of `kernel` into a kernel of its
    own over the kept dims, which stores the combined `values` (a column's mean, its
    variance...) for `kernel` to load.

    Otherwise every program of the kernel that reads them (a normalizing epilogue
    over row chunks, the next statistic's split stage) combines all G partials of
    its columns: G times the partials read from L2, and a chain of dependent steps
    before its own loads start (batch-norm statistics of 99371x331 f32 on an H200:
    Inductor's separate reductions and element-wise kernel took 0.77x the time)."""
    parent = kernel.parent_block()
    assert parent is not None
    ops = list(kernel.body.block.ops)
    # Outputs stored once a column from these values alone (a mean returned beside
    # the normalized tensor) are stored by the combining kernel instead.
    combining = {v.owner for v in values}
    moved = [
        op
        for op in ops
        if isinstance(op, loop.StoreOp)
        and not any(
            isinstance(o, loop.ForeachOp) or (isinstance(o, Reduction) and o not in combining)
            for o in _slice(ops, [op])
        )
    ]
    values = [v for v in values if any(u.operation not in moved for u in v.uses)]
    stats = kernel.clone()
    mapping = dict(zip(ops, stats.body.block.ops, strict=True))
    stats.properties["name"] = StringAttr(name)
    kept = stats.body.block.args
    keep = {mapping[op] for op in moved}
    buffers: list[SSAValue] = []
    for v in values:
        buffer = loop.AllocOp.create(result_types=[MemRefType(v.type, kernel.parallel_bounds())])
        parent.insert_op_before(buffer, kernel)
        buffers.append(buffer.result)
        owner = v.owner
        assert isinstance(owner, Operation)
        clone = mapping[owner].results[v.index]  # type: ignore[attr-defined]
        stats.body.block.add_op(loop.StoreOp.create(operands=[clone, buffer.result, *kept]))
    for op in list(stats.body.block.ops):
        if isinstance(op, loop.ForeachOp) or (
            isinstance(op, loop.StoreOp) and op not in keep and op.operands[1] not in buffers
        ):
            stats.body.block.erase_op(op)
    _drop_unused_top(stats)
    parent.insert_op_before(stats, kernel)
    block = kernel.body.block
    for op in moved:
        block.erase_op(op)
    first = block.first_op
    assert first is not None
    for v, buffer in zip(values, buffers, strict=True):
        load = loop.LoadOp.create(operands=[buffer, *block.args], result_types=[v.type])
        block.insert_op_before(load, first)
        v.replace_all_uses_with(load.result)
    _drop_unused_top(kernel)


def _elementwise_kernel(kernel: loop.KernelOp, name: str) -> loop.KernelOp | None:
    """`kernel` (kept dims, top-level loads of combined statistics, foreach loops over
    the reduced dims) as an element-wise kernel over the whole space, its dims in the
    order of the tensor its loops store (a normalizing epilogue, a softmax's output),
    or None where the loops store at other indices or the kernel stores anything else.

    The tile pass then tiles it as any element-wise kernel, flat and contiguous: as
    column chunks a row of 331 f32 was read and written 64 elements at a time, on
    rows of no 16-byte alignment (no vector access), half as fast as Inductor's
    element-wise kernel on an H200."""
    block = kernel.body.block
    loops = [op for op in block.ops if isinstance(op, loop.ForeachOp)]
    if any(isinstance(op, loop.StoreOp) for op in block.ops):
        return None  # a statistic returned as well: stored once a column, not an element
    if len({tuple(loop.int_list(f.bounds)) for f in loops}) != 1:
        return None
    stored = {op.buffer for f in loops for op in f.walk() if isinstance(op, loop.StoreOp)}
    if any(isinstance(op, loop.LoadOp) and op.buffer in stored for f in loops for op in f.walk()):
        return None  # one loop reads what another stores: their order matters
    kept = list(block.args)
    order: list[tuple[str, int]] | None = None  # each stored index: kept or reduced, which
    for f in loops:
        reduced = list(f.body.block.args)
        for op in f.body.walk():
            if not isinstance(op, loop.StoreOp):
                continue
            indices = list(op.indices)
            if set(indices) != set(kept) | set(reduced) or len(indices) != len(kept) + len(reduced):
                return None
            roles = [
                ("kept", kept.index(i)) if i in kept else ("reduced", reduced.index(i))
                for i in indices
            ]
            if order is None:
                order = roles
            elif roles != order:
                return None
    if order is None:
        return None
    bounds = [
        kernel.parallel_bounds()[k] if role == "kept" else loop.int_list(loops[0].bounds)[k]
        for role, k in order
    ]
    body = Block(arg_types=[INDEX] * len(bounds))
    new_kept = {k: body.args[pos] for pos, (role, k) in enumerate(order) if role == "kept"}
    new_reduced = {k: body.args[pos] for pos, (role, k) in enumerate(order) if role == "reduced"}
    values: dict[SSAValue, SSAValue] = {a: new_kept[i] for i, a in enumerate(kept)}
    for op in block.ops:
        if isinstance(op, loop.ForeachOp):
            for i, a in enumerate(op.body.block.args):
                values[a] = new_reduced[i]
            for inner in op.body.block.ops:
                if not isinstance(inner, loop.YieldOp):
                    body.add_op(inner.clone(value_mapper=values))  # type: ignore[arg-type]
            continue
        body.add_op(op.clone(value_mapper=values))  # type: ignore[arg-type]
    final = loop.KernelOp.create(
        properties={
            "name": StringAttr(name),
            "bounds": int_array(bounds),
            "kind": StringAttr(KernelKind.POINTWISE),
        },
        regions=[Region(body)],
    )
    final.location = kernel.location
    return final


def split_kernel(
    kernel: loop.KernelOp,
    g: int,
    taken: set[str],
    final_chunks: Callable[[loop.KernelOp, int], int] | None = None,
    combine_once_bytes: int = COMBINE_ONCE_BYTES,
) -> None:
    """Splits the reduced space of `kernel` into `g` chunks, in place; the kernels
    it adds take names no kernel in `taken` has (`unique_name`).

    Reductions that read no other go first: one kernel over `[g, *parallel]`
    stores each one's partial per chunk (with any foreach loop that reads no
    reduction, so a full-size output beside a full reduction is written while
    its input is read for it). Reductions that read those come next, in a
    kernel that combines the partials they read in every program, and so on.
    The original kernel then combines the partials; a foreach loop left in it
    (one that reads a reduction) is split into chunks as well: with kept dims,
    into `final_chunks(kernel, n)` chunks of its own (it loads the statistics a
    combining kernel stored), else into the g chunks, its programs combining
    the partials they need.
    """
    parent = kernel.parent_block()
    assert parent is not None
    parallel = kernel.parallel_bounds()
    levels = _levels(kernel)
    n = numel(loop.int_list(levels[0][0].bounds))
    shape = kernel_shape(kernel)
    run = split_runs(shape) if parallel else 0  # a full one splits flat
    chunk = run_chunk(n, g, run) if run else chunk_length(n, g, full=not parallel)
    assert -(-n // chunk) == g, "no chunk is empty"
    base = kernel.kernel_name.data
    once = bool(parallel) and combines_once(shape, n, combine_once_bytes, g, partial_bytes(kernel))
    for depth, level in enumerate(levels):
        keep: list[Operation] = list(level)
        if depth == 0:
            reds = set(_reductions(kernel))
            ops = list(kernel.body.block.ops)
            keep += [
                op
                for op in ops
                if isinstance(op, loop.ForeachOp) and not (_slice(ops, [op]) & reds)
            ]
        name = unique_name(base + "_split" + (str(depth) if depth else ""), taken)
        stage, mapping = chunked_kernel(kernel, keep, keep, g, chunk, name, run=run)
        body = stage.body.block
        g_index, *p_index = body.args
        combined: list[SSAValue] = []
        for red in level:
            copy = mapping[red]
            if isinstance(copy, loop.WelfordReduceOp):
                assert isinstance(red, loop.WelfordReduceOp)
                parts = _store_parts(stage, kernel, copy, g)
                combined += _combine_parts(kernel, red, parts, g)
                continue
            if isinstance(copy, loop.SoftmaxReduceOp):
                assert isinstance(red, loop.SoftmaxReduceOp)
                parts = _store_parts(stage, kernel, copy, g)
                combined += _combine_softmax_parts(kernel, red, parts, g)
                continue
            assert isinstance(copy, loop.ReduceOp) and isinstance(red, loop.ReduceOp)
            acc = _partial_accumulator(red)
            partials = loop.AllocOp.create(result_types=[MemRefType(acc, [g, *parallel])])
            parent.insert_op_before(partials, kernel)
            value: SSAValue = copy.result
            if acc != copy.result.type:  # half values: partials accumulate in f32
                yielded = copy.body.block.last_op
                assert isinstance(yielded, loop.YieldOp)
                cast = _apply(copy.body.block, "cast", [yielded.values[0]], yielded, acc)
                yielded.operands = [cast]
                wide = loop.ReduceOp.create(
                    properties={"kind": copy.kind, "bounds": copy.bounds},
                    result_types=[acc],
                    regions=[copy.body.clone()],
                )
                body.insert_op_before(wide, copy)
                narrow = _apply(body, "cast", [wide.result], copy, copy.result.type)
                copy.result.replace_all_uses_with(narrow)
                body.erase_op(copy)
                value = wide.result
            body.add_op(loop.StoreOp.create(operands=[value, partials.result, g_index, *p_index]))
            combined += combine_partials(kernel, red, partials.result, g)
        for op in keep:
            if isinstance(op, loop.ForeachOp):
                kernel.body.block.erase_op(op)
        _drop_unused_top(stage)
        parent.insert_op_before(stage, kernel)
        last = depth == len(levels) - 1
        foreach = any(isinstance(op, loop.ForeachOp) for op in kernel.body.block.ops)
        if (foreach or not last) and once:
            combine = unique_name(base + "_combine" + (str(depth) if depth else ""), taken)
            _combine_once(kernel, combined, combine)
    if any(isinstance(op, loop.ForeachOp) for op in kernel.body.block.ops):
        rest = list(kernel.body.block.ops)
        loops = [op for op in rest if isinstance(op, loop.ForeachOp)]
        final = None
        if parallel and not _reductions(kernel):
            # It reads no partials now (`_combine_once`): element-wise over the whole
            # space where it can be, else chunked for its own streaming.
            final = _elementwise_kernel(kernel, base)
            if final is None and final_chunks is not None:
                g = final_chunks(kernel, n)
                chunk = chunk_length(n, g, full=False)
        if final is None:
            final, _ = chunked_kernel(kernel, rest, loops, g, chunk, base)
        parent.insert_op_before(final, kernel)
        parent.erase_op(kernel)


def fuse_softmax_pairs(kernel: loop.KernelOp) -> None:
    """A softmax's max and sum of exp(x - max) over the split space become one
    `loop.softmax_reduce` (as `online-softmax` makes for looped rows): each chunk
    stores its max and its sum rescaled to it, and the two combine in one step, so
    a split softmax reads x twice (statistics, output) where it read it three times
    and launched a stage for each statistic."""
    for op in list(kernel.body.block.ops):
        if isinstance(op, loop.ReduceOp):
            partner = softmax_partner(op)
            if partner is not None and partner.parent_op() is kernel:
                fuse_pair(op, partner)


def _drop_unused_top(kernel: loop.KernelOp) -> None:
    """Removes pure top-level ops nobody reads (a stage keeps only what it stores)."""
    changed = True
    while changed:
        changed = False
        for op in reversed(list(kernel.body.block.ops)):
            if isinstance(op, loop.StoreOp | loop.ForeachOp):
                continue
            if all(not r.uses for r in op.results):
                kernel.body.block.erase_op(op)
                changed = True


def split_chunks(
    kernel: loop.KernelOp,
    threshold: int,
    splits: int,
    min_chunk: int,
    sms: int,
    combine_once_bytes: int = COMBINE_ONCE_BYTES,
) -> int:
    """How many chunks to split `kernel`'s reduced space into (1: leave it).

    No parallel dims (a full reduction): the largest power of two dividing N
    that is at most `splits` and N / `min_chunk`, where it fills the GPU, else
    about that bound in ragged chunks of a power-of-two length (`ragged_count`),
    and at least 16 (the module docstring says why). With parallel dims: the fewest power-of-two chunks that give the GPU
    `PROGRAMS_PER_SM` programs an SM under the tiling `tile` would choose, as
    long as a chunk is at least `min_chunk` elements a program and a full step of
    its tile (rows that an epilogue or a dependent reduction reads again, a
    softmax's, stay one kernel, as does a nested one a program could hold whole:
    `PERSISTENT_ROW_ELEMENTS`). Where programs combine partials they did not
    make (a reduction reading another, a foreach reading one), chunks are at
    least G long, so that combining (reads of a small partials buffer, from L2)
    costs no more reads than the chunk's own from DRAM.
    """
    if loop.kernel_kind(kernel) is not KernelKind.REDUCTION:
        return 1
    if any(isinstance(op, loop.SoftmaxReduceOp) for op in kernel.body.walk()):
        return 1
    levels = _levels(kernel)
    if not levels:
        return 1
    bounds = loop.int_list(levels[0][0].bounds)
    n = numel(bounds)
    ops = list(kernel.body.block.ops)
    reds = set(_reductions(kernel))
    for op in ops:
        if (op in reds or isinstance(op, loop.ForeachOp)) and loop.int_list(op.bounds) != bounds:  # type: ignore[attr-defined]
            return 1  # one split of one space
    recombines = len(levels) > 1 or any(
        isinstance(op, loop.ForeachOp) and _slice(ops, [op]) & reds for op in ops
    )
    most = n
    if recombines:
        most = 1
        while (most * 2) ** 2 <= n:
            most *= 2
    parallel = kernel.parallel_bounds()
    if not parallel:
        if n < threshold:
            return 1
        cap = min(splits, most, n // min_chunk)
        g = split_count(n, cap)
        if g >= min(cap, PROGRAMS_PER_SM * sms) and g >= 16:
            return g
        # The even chunks would leave SMs idle (9100 x 5372 is 16 x an odd number:
        # 16 programs of 3 million elements took 7x torch.compile's time on an H200).
        return ragged_count(kernel_shape(kernel), n, cap, sms)
    shape = kernel_shape(kernel)
    if shape.shared_bytes:
        # Rows that read a shared operand fill the GPU with rows (shared_rows_tiling):
        # chunks would not read it less, and would add a kernel.
        return 1
    if shape.columns:
        if numel(parallel) * n < threshold:
            return 1
        if recombines and (unsplit_rereads_from_l2(shape, sms) or held_column_lanes(shape, sms)):
            return 1  # read again from L2, or held in registers (tile)
        g = column_chunks(shape, n, most, min_chunk, sms)
        if combines_once(shape, n, combine_once_bytes, g, partial_bytes(kernel), wide=False):
            g = column_chunks(shape, n, n, min_chunk, sms)  # no program reads all partials
        # (Wider elements may combine once under `WIDE_REREAD_FACTOR` too, in these g.)
        once = recombines and combines_once(shape, n, combine_once_bytes, wide=False)
        if g == 1 and once and rereads_from_dram(shape, sms):
            return 2  # the epilogue becomes an element-wise kernel of its own
        return g
    if recombines and not shape.columns:
        # Rows with an epilogue or dependent statistics (softmax, layer norm) keep
        # their one kernel: few long rows stream in chunks (online-softmax).
        return 1
    unsplit = choose_tiling(shape, sms=sms)
    now = programs(shape, unsplit)
    want = PROGRAMS_PER_SM * sms
    if now >= want or numel(parallel) * n < threshold:
        return 1
    if unsplit.nested and next_pow2(n) <= PERSISTENT_ROW_ELEMENTS:
        # A row a program could hold whole stays one kernel, nested: split in two
        # kernels, 19 x 400 x 1374 bf16 took 9.2 us, one kernel 7.5 (H200, CUDA
        # graphs; 24 x 160 x 1138 f32 5.6 against 5.0, 27 x 365 x 1129 9.7 / 7.4).
        return 1
    run = split_runs(shape)
    best = 1
    g = 2
    while g <= min(splits, most):
        chunk = run_chunk(n, g, run) if run else -(-n // g)
        count = -(-n // chunk)  # ragged: no chunk left empty
        reduced = (chunk // run, run) if run else (chunk,)
        split = replace(shape, parallel=(count, *parallel), reduction=reduced)
        t = choose_tiling(split, sms=sms)
        kept = t.block[0] if not shape.columns else min(t.block[0], parallel[-1])
        if chunk * kept < min_chunk or chunk < unsplit.block[1] or run and not t.nested:
            break  # (a chunk of runs too short to loop them would divide a flat index)
        best = count
        if programs(split, t) >= want:
            break
        g *= 2
    return best if best > 1 else 1


def split_runs(shape: KernelShape) -> int:
    """The run of a reduction whose tiling loops its leading dims around chunks of the
    last (`tile.nested_run_tiling`): its split's chunks are whole runs, which that
    tiling keeps. 0 for any other reduction (chunks of a flat index)."""
    return shape.run if choose_tiling(shape).nested else 0


def run_chunk(n: int, g: int, run: int) -> int:
    """The flat elements of each of `g` chunks of whole runs of `n // run` runs."""
    return -(-(n // run) // g) * run


def column_chunks(
    shape: KernelShape, n: int, most: int, min_chunk: int, sms: int, partials: bool = True
) -> int:
    """Chunks of a column reduction's `n` reduced rows (1: leave it whole).

    Its kept tiles times the chunks should give every SM `COLUMN_PROGRAMS_PER_SM`
    programs, so that an SM keeps `IN_FLIGHT_BYTES` of loads outstanding: tiles
    `COLUMN_ROW_BYTES` wide where at most `most` chunks (programs that combine
    partials they did not make read all of them) and at most as many as the
    second stage sums in one step (`ONE_STEP_ELEMENTS` over a line's columns; no
    bound where the chunks store no `partials`) do that, else a line wide (twice
    the tiles; `tile`'s `column_width` decides the same from the split's shape).
    The count is taken from chunks of a whole number of the split stage's steps
    (a ragged last step costs a round trip for a sliver of rows; rounded down, so
    that the programs still fill the GPU), at least `COLUMN_MIN_STEPS` of them
    and `min_chunk` elements a program; `split_kernel` then makes the chunks as
    even as that count allows (`ceil(n / count)` rows), which may end within a
    step (8192 rows in 18 chunks: 456 rows, 28.5 steps of 16). Which lengths
    made ptxas issue a step's loads one at a time is in docs/benchmarks.md,
    session 18."""
    shape = replace(shape, epilogue=False)  # counted at `COLUMN_WARPS`, as `REREAD_FILL`
    unsplit = choose_tiling(shape, sms=sms)
    want = COLUMN_PROGRAMS_PER_SM * sms
    if column_programs(shape, unsplit.block[0]) >= want:
        return 1
    if partials:
        most = min(most, ONE_STEP_ELEMENTS // min(next_pow2(shape.columns), LINE_BYTES // 4))
    wide, line = column_widths(shape)
    g = -(-want // column_programs(shape, wide))
    if g > most:
        g = min(-(-want // column_programs(shape, line)), most)
    split = replace(shape, parallel=(g, *shape.parallel), reduction=(-(-n // g),))
    x, rows = choose_tiling(split, sms=sms).block
    chunk = -(-n // g) // rows * rows or -(-n // g)
    step = column_step_rows(x, shape.element_bytes)  # a 4 KB step's rows
    chunk = max(
        chunk, step * COLUMN_MIN_STEPS, -(-min_chunk // min(x, shape.columns)), -(-n // most)
    )
    if chunk > rows:
        chunk = -(-chunk // rows) * rows  # whole steps, where a bound made it longer
    count = -(-n // chunk)
    return count if count > 1 else 1


def ragged_count(shape: KernelShape, n: int, most: int, sms: int) -> int:
    """Chunks for a full reduction (`shape`) of `n` elements with no power-of-two
    divisor worth splitting by, the last one short (its missing elements masked):
    chunks of the power of two at or above ceil(n / G), G the largest power of two
    up to `most` (`chunk_length` gives them that length), if there are 16 or more
    and, under the tile pass's tiling, they fill the GPU (`PROGRAMS_PER_SM`) or
    make no fewer programs than the alternative; else G chunks of ceil(n / G), if
    G is 16 or more; else 1.

    A power-of-two chunk keeps every lane of a program's block working and every
    chunk's start aligned: 8292 x 12768 bf16 in 8192 chunks of 12,924 took 1.19x
    torch.compile's time on an H200, each chunk starting 8 bytes from a 16-byte
    boundary, in blocks of 16,384 lanes 79% of them active. It can halve the
    chunks (1025 elements become 2048), and short chunks share a program (the tile
    pass packs rows to 4096 lanes), hence the test of the grid: a reduction too
    small to fill the GPU either way keeps its programs."""
    g = 1
    while g * 2 <= most:
        g *= 2
    if g < 16:
        return 1
    plain = -(-n // -(-n // g))
    aligned = -(-n // next_pow2(-(-n // g)))
    if aligned < 16:
        return plain

    def grid(count: int) -> int:
        split = replace(shape, parallel=(count,), reduction=(chunk_length(n, count, True),))
        return programs(split, choose_tiling(split, sms=sms))

    if grid(aligned) >= min(PROGRAMS_PER_SM * sms, grid(plain)):
        return aligned
    return plain


def chunk_length(n: int, g: int, full: bool) -> int:
    """The length of each of `g` chunks of `n` reduced elements: ceil(n / g), or,
    for a `full` reduction in ragged chunks, the power of two at or above that where
    `g` such chunks leave none empty (as `ragged_count` counts them: with 16 or
    more, ceil(n / g) is above half the power of two, so it is the one)."""
    chunk = -(-n // g)
    if full and n % g and -(-n // next_pow2(chunk)) == g:
        return next_pow2(chunk)
    return chunk


PROGRAMS_PER_SM = 4
"""Programs a kernel should give each SM: several resident at once keep enough
loads in flight, and the last wave is short."""


@dataclass(frozen=True)
class SplitReductionPass(ModulePass):
    """`split-reduction{threshold=65536 splits=8192 min_chunk=1024
    combine_once_bytes=50331648}` on loop-level IR."""

    name = "split-reduction"
    levels = ("loop",)

    threshold: int = 65536
    splits: int = 8192
    min_chunk: int = 1024
    sms: int = 132
    """The GPU's SM count (`irc.target` sets it), which a split must keep busy."""
    combine_once_bytes: int = COMBINE_ONCE_BYTES
    """Bytes a split column reduction streams from which a kernel of its own combines
    its partials once (`COMBINE_ONCE_BYTES`); the other bounds of `combines_once`
    are shares of it (for elements of 4 bytes or more, a half and a sixth)."""

    def __post_init__(self) -> None:
        check_option(self.name, "threshold", self.threshold, 0)
        check_option(self.name, "splits", self.splits, 1)
        check_option(self.name, "min_chunk", self.min_chunk, 1)
        check_option(self.name, "sms", self.sms, 1, 1 << 16)
        check_option(self.name, "combine_once_bytes", self.combine_once_bytes, 0)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        taken = kernel_names(op)
        for kernel in loop.kernels(op):
            g = split_chunks(
                kernel,
                self.threshold,
                self.splits,
                self.min_chunk,
                self.sms,
                self.combine_once_bytes,
            )
            if g > 1:
                fuse_softmax_pairs(kernel)
                split_kernel(kernel, g, taken, self._final_chunks, self.combine_once_bytes)

    def _final_chunks(self, kernel: loop.KernelOp, n: int) -> int:
        """Chunks of a split's final element-wise kernel (over its kept dims, a loop
        over n rows): a column kernel's as `column_chunks` gives them, which reads
        each row 256 bytes wide where its tiles then fill the GPU (the partials'
        chunks of 338 f32 columns made 128-byte runs, and a normalizing kernel half
        the speed of Inductor's element-wise one on an H200)."""
        shape = kernel_shape(kernel)
        if not shape.columns:
            return 1
        return column_chunks(shape, n, n, self.min_chunk, self.sms, partials=False)
