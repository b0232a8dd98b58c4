"""`tile`: chooses block sizes (and warps) for every loop.kernel.

The choice is written on the kernel (`block`, `warps`, `stages`) so that it
shows in the IR and can be overridden by hand. Heuristics, per kernel kind:

- pointwise over N elements: one axis, `block` / (32 x `thread-elements`)
  warps (default 1024 and 8: 4 warps; `irc.target` picks 512 and 2 for GPUs
  with less bandwidth an SM, such as the H100), which are the tiling of a
  kernel loading 8 bytes an element (two f32 operands). A thread takes as many
  elements as keep the same loaded bytes in flight (one bf16 operand: four
  times as many), twice that where transcendental functions dominate (and
  twice the warps where an element's chain of them is long), at most
  two 16-byte vectors an access, whatever the element count (tile-to-triton
  peels the last program of a count no vector divides, `pointwise_tiling`);
  shrunk to the next power of two of N for small kernels;
- reduction of rows of R elements: if next_pow2(R) <= `persistent_rblock`
  (default 32768) the whole row sits in registers ("persistent"): up to 8192
  several rows share a program so that a program holds about 4096 elements,
  longer ones take a program each, 64 f32 a thread (`whole_row_tiling`);
  a longer row that an epilogue reads again stays in registers as unrolled chunks
  of 2048 where they fit 116 f32 a thread of 16 warps (`unrolled_row_tiling`,
  `unrolled = 1`: rows of up to 59,392 elements, a 50,257-token vocabulary),
  and so is a row past 16384 whose reductions compute transcendental functions
  (`UNROLLED_TRANSCENDENTAL_ROWS`); otherwise one row a program, looped in chunks
  of 32 warps (16 where every chunk loads 16-byte vectors of half precision), at
  most `rblock` (default 8192) elements (`long_row_tiling`); a row only reduced
  whose loads are no whole rows of a buffer (a batch norm's over N and H*W) has an
  address an element: 8 elements a thread of 16 warps (`ADDRESSED_ROW_WARPS`);
  where its loads read runs of its last dims (H*W) not 16 bytes apart, its
  leading dims are looped an index at a time around steps of the run
  instead (`nested = 1`, `nested_run_tiling`), so that no lane divides a flat index.
  Rows that are
  only reduced give a thread 128 bytes of their loads (8 to 64 elements,
  `reduced_row_elements`): more programs an SM overlap one another's
  cross-warp reductions (a bf16 logsumexp row of 4258: 4 warps, 2.7x faster
  on an H200 than 32; three f32 operands keep 32 warps).
  Where an element-wise epilogue (`loop.foreach`) reads the rows again they
  stay in registers until the store: a warp per 512 elements (16 a thread),
  at most `epilogue-warps` (default 8). An H200 streams a row of 8192
  fastest with 8 warps (32 warps are 2-3% slower there), an H100 with 16
  (0.2-0.4% faster than 8, and at 4096 elements a program 8 warps beat 16
  there by 0.6-1%), so `irc.target` picks 16 for GPUs with less bandwidth an SM;
- reduction whose rows all read one operand alike (Inductor's test_neighbor,
  `max_j sum_k (a[i,k] - b[j,k])**2`): 16 rows a program (fewer where that
  leaves an SM without one) read it from L2 once between them, in chunks of
  4096 / 16 (`shared_rows_tiling`);
- contraction (matmul): f32 products get 64x64 output tiles (16 at least,
  fewer for small M, N) and K steps of 32; half-precision ones, where tensor
  cores want big tiles, take 128x256x64 (8 warps, 3 stages), 128x128x64 (8
  warps, 4 stages) or the small tiles, whichever a model of wave quantization
  over the GPU's SMs says is fastest (`gemm_tiling`). Unbatched tensor-core
  GEMMs are *persistent*: one program an SM walks the output tiles, so the
  epilogue of one tile overlaps the loads of the next, and plain row-major
  operands arrive by TMA (1.02x cuBLAS at 4096^3 bf16 on an H200, against
  1.07x for one program a tile).

Warps grow with the elements a program holds: in reductions one per 256 or
512 (see above), in element-wise kernels one per 32 x `thread-elements`,
1 to 32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, i64
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from irc.analysis.dot_operands import runs_in_half
from irc.analysis.reduction_groups import reduction_groups
from irc.analysis.tma import tma_buffer, wide_indices
from irc.dialects import graph, loop
from irc.dialects.attrs import MAX_BLOCK, MAX_WARPS
from irc.dialects.tile import BLOCK_STORE_PARTS
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import HALF_TYPES, element_bytes, int_array, numel
from irc.passes.options import check_option


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class KernelShape:
    """What the tiling depends on: the kind and the iteration space."""

    kind: KernelKind
    parallel: tuple[int, ...]
    reduction: tuple[int, ...]
    half: bool = False
    epilogue: bool = False  # a reduction whose rows an element-wise epilogue reads again
    columns: int = 0
    """A reduction whose streamed loads are contiguous along a kept dim, not the
    reduced one (a column sum): the extent its tiles run along, that kept dim's
    size times those of the kept dims folded in with it (`column_lanes`); 0 for
    row reductions."""
    element_bytes: int = 4  # the widest element the reduction streams
    epilogue_bytes: int = 2
    """A contraction's bytes an output element of the output-sized tiles its epilogue
    stages through shared memory: each full-size output it stores (the product, a
    residual sum, the square of it in f32 for the next RMS norm) and each full-size
    operand it reads (a SwiGLU's other half), at their element sizes."""
    tma_stored_bytes: int = 0
    """Of `epilogue_bytes`, those of outputs a persistent program stores by TMA, in
    `tile.BLOCK_STORE_PARTS` column slices that each stage a fraction of the tile."""
    across: int = -1
    """Element-wise kernels: the parallel dim that an access is contiguous along
    when it is not the last one (a transposed operand: `x.T + y`), else -1."""
    access_vectors: tuple[int, ...] = ()
    """Element-wise kernels with a transposed access: for each full-size access, the
    elements one vector of it loads or stores (`access_vectors`): 16 bytes' worth
    where its rows start 16 bytes apart, 1 where each element has an address."""
    banded: bool = False
    """An attention whose iota mask bounds each row's keys (causal): the work of its
    programs differs by their rows."""
    loaded_bytes: int = 0
    """Element-wise kernels: bytes an element of the full-size loads (a broadcast
    operand, read from cache, does not count); reductions: bytes a reduced element
    of the buffers their reducing loops read (each buffer once, however often)."""
    transcendentals: int = 0
    """Element-wise kernels: transcendental functions (exp, cos, division...) an
    element; reductions: those a reduced element computes (in its reducing loops)."""
    streamed_transcendentals: int = 0
    """Element-wise kernels: of `transcendentals`, those computed from the full-size
    loads (not from broadcast operands alone, such as a column's statistics)."""
    shared_bytes: int = 0
    """A reduction's loads that every row reads alike, bytes a reduced element: the
    `b[j, k]` of Inductor's test_neighbor (`max_j sum_k (a[i, k] - b[j, k])**2`).
    The rows of one program read them once between them."""
    row_reads: int = 1
    """Reductions: loops over the longest reduced space (a max, a sum, an
    epilogue); a looped row is read from memory that many times."""
    operand_tiles: tuple[int, int] = (1, 1)
    """Contractions: the buffers a K step loads tiles of, by rows (first factors) and
    by columns (second factors): (2, 2) for `split-tf32-gemm-operands`' TF32 parts
    (heads and tails)."""
    narrow_stores: tuple[tuple[int, int], ...] = ()
    """Contractions: each full-size output of the epilogue whose rows are not a
    multiple of 16 bytes (no TMA store, no 16-byte vector), as (bytes an element,
    bytes one store instruction writes: the largest power of two dividing the row's
    bytes). Every element of it is stored through its own address (`epilogue_parts`)."""
    split_epilogue: bool = False
    """Contractions: whether the epilogue may run on column parts, one after another
    (`column_split_epilogue`)."""
    contractions: int = 1
    """Contractions: the dots of the kernel (a SwiGLU's two share one kernel); only
    one can be split into a tail's chunks (`tail_split`)."""
    row_granule: int = 0
    """Row reductions whose rows do not start 8 bytes apart (`PEELED_ROW_BYTES`), or
    16 where no epilogue reads them again (`row_granule`), and whose every access
    along the row is a whole row of a full-size buffer: the elements of the
    narrowest such buffer in 16 bytes. A row a program in chunks
    (held in registers or looped) is then read from the 16-byte-aligned address
    before its start (`loop-to-tile`'s `RowPeel`), one more chunk at most. 1 for
    such rows only reduced that do start 16 bytes apart (peeled in place). 0
    otherwise."""
    row_vector_bytes: int = 0
    """Row reductions whose every access along the row is a whole row of a full-size
    buffer (as for `row_granule`): the widest vector, up to 16 bytes, that every
    chunk of a row read as it starts can load (the largest power of two dividing
    each row's bytes: 16 where the rows start 16 bytes apart). 0 otherwise."""
    run: int = 0
    """Reductions over several dims with no epilogue (`reduced_runs`), whose every load
    that moves with the reduced indices reads its last dims at the last reduced ones,
    unit-stride: the elements of those dims, the run each load reads (a batch norm's
    H*W, one dim or two). 0 otherwise."""
    run_vector_bytes: int = 0
    """With `run`: the widest vector, up to 16 bytes, at which every such load's rows
    start (`vector_bytes` of the rows' bytes)."""
    run_contiguous: bool = False
    """With `run`: every such load reads all the reduced dims as one contiguous span
    (`x.exp().sum((1, 2))`), so that a flat index over them is an offset, which no
    lane divides."""


def index_args(v: SSAValue) -> set[BlockArgument]:
    """The loop indices an index value is computed from."""
    seen: set[BlockArgument] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, BlockArgument):
            seen.add(x)
        elif isinstance(x.owner, loop.ApplyOp):
            stack.extend(x.owner.args)
    return seen


def column_extent(kernel: loop.KernelOp) -> tuple[int, int]:
    """(extent of the kept dims the reduction's loads are contiguous along, or 0
    (`column_lanes`); widest element in bytes).

    A load inside a reduction's loop that moves with the reduced indices is
    *streamed*. Its last index (stride 1) tells where memory is contiguous: along
    a reduced index (a row: tile the reduction across threads), or along a kept
    one only (a column sum, a reduction over a leading or middle dim: tile that
    kept dim across threads and reduce across the strided one). The majority of
    streamed loads, by bytes, decides; a tie stays a row.
    """
    parallel = list(kernel.body.block.args)
    rows = cols = 0
    widest = 1
    column_loads: list[loop.LoadOp] = []
    loops = [
        red
        for red in kernel.body.walk()
        if isinstance(red, loop.LOOPS) and not loop.is_contraction(red)
    ]
    longest = max((numel(loop.int_list(red.bounds)) for red in loops), default=0)
    for red in loops:
        # The widest element of the longest loops: a split stage's combine of a few
        # f32 partials does not make its bf16 stream count as f32.
        streams = numel(loop.int_list(red.bounds)) == longest
        reduced = set(red.body.block.args)
        for op in red.body.walk():
            if not isinstance(op, loop.LoadOp) or not op.indices:
                continue
            deps = [index_args(i) for i in op.indices]
            if not any(d & reduced for d in deps):
                continue  # read once a row: a weight, a bias
            buffer = op.buffer.type
            assert isinstance(buffer, MemRefType)
            size = element_bytes(buffer.element_type)
            if streams:
                widest = max(widest, size)
            last = deps[-1]
            if last & reduced or not parallel or last & set(parallel) != {parallel[-1]}:
                rows += size
            else:
                cols += size
                column_loads.append(op)
    inner = kernel.parallel_bounds()[-1] if parallel else 0
    if cols <= rows or inner <= 1:
        return 0, widest
    return column_lanes(kernel, column_loads, widest), widest


def column_lanes(kernel: loop.KernelOp, loads: list[loop.LoadOp], widest: int) -> int:
    """The kept extent a column reduction's tiles run along (`KernelShape.columns`):
    the innermost kept dim, with the kept dims before it folded in, as one flat
    index, while every streamed load in `loads` reads them as adjacent dims of its
    buffer (`(b, c)` of `x[a, b, c]` summed over `a`: the flat index is contiguous,
    an odd `c` no longer pads every row's tiles or breaks its 16-byte vectors), and
    then, where the extent is odd (its rows load no vector wider than an element
    either way), while it would leave idle, in tiles of one 128-byte line, more than
    a quarter of its lanes and every streamed load indexes the dim before it
    (`x.amax(1)` of `[A, B, 33]`: 64 lanes, 31 of them idle, where the lanes of
    `(a, c)` pairs all work, an address computed once a program each; not a split's
    chunk, whose lanes would each start their own rows). On an H200 the second fold
    ran a bf16 999 x 2001 x 33 max 1.5x as fast, f32 ones of 35 and 7 columns 1.31x
    and 1.07x, but a split's 129 f32 and 109 bf16 columns (a fifth idle) 4-8%
    slower, hence the quarter, and bf16 ones of 4, 6, 8 and 28 columns (rows of 8-56
    bytes, loaded in vectors unfolded) 1.25-2x slower, hence odd extents only.
    loop-to-tile's `layout_columns` unravels the flat index into those dims."""
    bounds = kernel.parallel_bounds()
    ivs = list(kernel.body.block.args)
    flat, d = bounds[-1], len(bounds) - 1

    def adjacent(load: loop.LoadOp, d: int) -> bool:
        shape = load.buffer.type.get_shape()  # type: ignore[attr-defined]
        k = len(bounds) - d  # the trailing dims to match, dim d's included
        return len(load.indices) >= k and all(
            load.indices[-j] is ivs[-j] and (j == k or shape[-j] == bounds[-j])
            for j in range(1, k + 1)
        )

    while d > 0 and all(adjacent(load, d - 1) for load in loads):
        d -= 1
        flat *= bounds[d]
    line = max(1, LINE_BYTES // widest)
    while d > 0 and flat % 2 and 3 * _cdiv(flat, line) * line > 4 * flat:
        if not all(any(i is ivs[d - 1] for i in load.indices) for load in loads):
            break  # a split's chunk, whose lanes would start rows of their own
        d -= 1
        flat *= bounds[d]
    return flat


def reduced_loads(kernel: loop.KernelOp) -> Iterator[tuple[loop.LoadOp, set[BlockArgument]]]:
    """The loads in a kernel's reducing loops (not a contraction's) at indices that
    move with the reduced ones, each with the loop indices its indices use."""
    for red in kernel.body.walk():
        if not isinstance(red, loop.REDUCING_LOOPS) or loop.is_contraction(red):
            continue
        reduced = set(red.body.block.args)
        for op in red.body.walk():
            if isinstance(op, loop.LoadOp) and op.indices:
                deps = set().union(*(index_args(i) for i in op.indices))
                if deps & reduced:
                    yield op, deps


def shared_bytes(kernel: loop.KernelOp) -> int:
    """Bytes a reduced element of the loads in a reduction that move with the reduced
    indices and with no kept one: every row reads the same elements, from L2 once a
    program, so a program of one row each re-reads them once a row."""
    if numel(kernel.parallel_bounds()) <= 1:
        return 0  # one row: nothing to share
    kept = set(kernel.body.block.args)
    shared = {op for op, deps in reduced_loads(kernel) if not deps & kept}
    return sum(element_bytes(op.buffer.type.element_type) for op in shared)  # type: ignore[attr-defined]


def reduced_runs(kernel: loop.KernelOp) -> tuple[int, int, bool]:
    """`KernelShape`'s `run`, `run_vector_bytes` and `run_contiguous` of a reduction
    kernel: its loops are reductions of its body (no epilogue, no Welford or softmax pair)
    over one space of several dims, and every load that moves with their indices
    reads its last dims at the last reduced ones, in order, each whole but the first
    (so contiguous: a batch norm's H and W of NCHW), and no other index reads them.
    The run is those dims' elements, over as many dims as every load allows, short
    of all of them; else (0, 0, False)."""
    reds = [op for op in kernel.body.walk() if isinstance(op, loop.LOOPS)]
    if not reds or any(
        not isinstance(op, loop.ReduceOp) or loop.is_contraction(op) or op.parent_op() is not kernel
        for op in reds
    ):
        return 0, 0, False
    bounds = loop.int_list(reds[0].bounds)
    if len(bounds) < 2 or any(loop.int_list(op.bounds) != bounds for op in reds):
        return 0, 0, False
    loads = [load for load, _ in reduced_loads(kernel)]
    vector = VECTOR_BYTES
    k = len(bounds)
    for load in loads:
        red = load.parent_op()
        while not isinstance(red, loop.ReduceOp):
            red = red.parent_op()  # type: ignore[union-attr]
        args, indices = list(red.body.block.args), list(load.indices)
        shape = load.buffer.type.get_shape()  # type: ignore[attr-defined]
        while k and not (
            len(indices) >= k
            and indices[-k:] == args[-k:]
            and list(shape[len(shape) - k + 1 :]) == bounds[len(bounds) - k + 1 :]
            and not any(set(args[-k:]) & index_args(i) for i in indices[:-k])
        ):
            k -= 1
        if not k:
            return 0, 0, False
    contiguous = k == len(bounds)
    k = min(k, len(bounds) - 1)
    for load in loads:
        shape = load.buffer.type.get_shape()  # type: ignore[attr-defined]
        row = numel(shape[len(shape) - k :]) * element_bytes(load.buffer.type.element_type)  # type: ignore[attr-defined]
        vector = min(vector, vector_bytes(row))
    return numel(bounds[len(bounds) - k :]), vector, contiguous


def run_dims(bounds: Sequence[int], run: int) -> int:
    """How many of a reduction's last dims make up its `KernelShape.run` (the last
    one where they make none: a hand-written `nested = 1` nests any loop)."""
    for k in range(1, len(bounds)):
        if numel(bounds[len(bounds) - k :]) == run:
            return k
    return 1


def reduced_bytes(kernel: loop.KernelOp) -> int:
    """Bytes a reduced element of the distinct buffers a reduction kernel's reducing
    loops load at indices that move with the reduced ones (a row held in registers
    is read once however many loops read it)."""
    buffers = {op.buffer for op, _ in reduced_loads(kernel)}
    return sum(element_bytes(b.type.element_type) for b in buffers)  # type: ignore[attr-defined]


def tma_stored_bytes(kernel: loop.KernelOp, inside: set[Operation]) -> int:
    """Bytes an output element of an unbatched contraction's epilogue stores that
    loop-to-tile makes TMA block stores (`irc.analysis.tma`), in column slices."""
    parallel = tuple(kernel.parallel_bounds())
    accesses = [a for a in kernel.body.walk() if isinstance(a, loop.LoadOp | loop.StoreOp)]
    sizes = [numel(a.buffer.type.get_shape()) for a in accesses]  # type: ignore[attr-defined]
    if len(parallel) != 2 or wide_indices(sizes, numel(parallel)):
        return 0
    ivs = tuple(kernel.body.block.args)
    types = [
        a.buffer.type  # type: ignore[attr-defined]
        for a in accesses
        if isinstance(a, loop.StoreOp) and a not in inside and tuple(a.indices) == ivs
    ]
    return sum(
        element_bytes(t.element_type)
        for t in types
        if tma_buffer(t.get_shape(), t.element_type, parallel)
    )


def tile_sized(buffer: MemRefType) -> bool:
    """A buffer of two dims over 1 or more: a GEMM epilogue stages a tile of it."""
    return sum(d > 1 for d in buffer.get_shape()) >= 2


def narrow_stores(kernel: loop.KernelOp, inside: set[Operation]) -> tuple[tuple[int, int], ...]:
    """`KernelShape.narrow_stores` of a contraction kernel (`inside`: its K loop)."""
    found = []
    for store in kernel.body.walk():
        if not isinstance(store, loop.StoreOp) or store in inside:
            continue
        buffer: MemRefType = store.buffer.type  # type: ignore[assignment]
        if not tile_sized(buffer):  # (a scalar a reduction of the product stores, too)
            continue
        size = element_bytes(buffer.element_type)
        row = buffer.get_shape()[-1] * size
        if row % VECTOR_BYTES:  # neither TMA nor 16-byte vectors
            found.append((size, row & -row))  # the largest power of two dividing it
    return tuple(found)


def column_split_epilogue(kernel: loop.KernelOp) -> bool:
    """Whether a contraction kernel's epilogue may run on column parts: element-wise
    work on its contractions, and stores that each depend on the output column."""
    col = kernel.body.block.args[-1]
    for op in kernel.body.block.ops:
        if isinstance(op, loop.StoreOp):
            if not any(col in index_args(i) for i in op.indices):
                return False
        elif isinstance(op, loop.ReduceOp):
            if op.contract is None:
                return False
        elif not isinstance(op, loop.ApplyOp | loop.LoadOp | loop.ConstantOp):
            return False
    return True


def kernel_shape(kernel: loop.KernelOp) -> KernelShape:
    """The kernel's kind as recorded (`loop.kernel_kind`) and the sizes of its loops."""
    kind = loop.kernel_kind(kernel)
    parallel = tuple(kernel.parallel_bounds())
    if kind is KernelKind.CONTRACTION:
        for op in kernel.body.walk():
            if isinstance(op, loop.ReduceOp) and op.contract is not None:
                half = op.result.type in HALF_TYPES
                operand_bytes = max(
                    (
                        element_bytes(load.buffer.type.element_type)  # type: ignore[attr-defined]
                        for load in op.body.walk()
                        if isinstance(load, loop.LoadOp)
                    ),
                    default=4,
                )
                inside = set(op.body.walk())
                staged = sum(
                    element_bytes(access.buffer.type.element_type)  # type: ignore[attr-defined]
                    for access in kernel.body.walk()
                    if isinstance(access, loop.LoadOp | loop.StoreOp)
                    and access not in inside
                    and tile_sized(access.buffer.type)  # type: ignore[arg-type]
                )
                work = len(heavy_ops(e for e in kernel.body.walk() if e not in inside))
                bounds = tuple(loop.int_list(op.bounds))
                return KernelShape(
                    kind, parallel, bounds, half, element_bytes=operand_bytes,
                    epilogue_bytes=max(2, staged), transcendentals=work,
                    tma_stored_bytes=tma_stored_bytes(kernel, inside),
                    operand_tiles=operand_tiles(kernel, op),
                    narrow_stores=narrow_stores(kernel, inside),
                    split_epilogue=column_split_epilogue(kernel),
                    contractions=sum(map(loop.is_contraction, kernel.body.walk())),
                )  # fmt: skip
    if kind is KernelKind.ATTENTION:
        return attention_shape(kernel, parallel)
    if kind is KernelKind.REDUCTION:
        # The longest reduced space sets the tiling (a split stage also combines
        # the few partials of another reduction).
        # A group of reductions that one loop computes is one pass over the row.
        joined = {op for group in reduction_groups(kernel) for op in group[1:]}
        spaces = [
            tuple(loop.int_list(op.bounds))
            for op in kernel.body.walk()
            if isinstance(op, loop.LOOPS) and op not in joined
        ]
        if spaces:
            epilogue = any(isinstance(o, loop.ForeachOp) for o in kernel.body.walk())
            columns, widest = column_extent(kernel)
            longest = max(spaces, key=numel)
            reads = sum(numel(s) == numel(longest) for s in spaces)
            rows = None if columns else whole_rows(kernel)
            run, run_vector, contiguous = (
                (0, 0, False) if columns or epilogue else reduced_runs(kernel)
            )
            reduced = {
                e
                for red in kernel.body.walk()
                if isinstance(red, loop.REDUCING_LOOPS)
                for e in red.body.walk()
            }
            return KernelShape(
                kind, parallel, longest, False, epilogue, columns, widest,
                shared_bytes=shared_bytes(kernel), row_reads=reads,
                row_granule=row_granule(rows, epilogue), row_vector_bytes=row_vector_bytes(rows),
                transcendentals=len(heavy_ops(reduced)), loaded_bytes=reduced_bytes(kernel),
                run=run, run_vector_bytes=run_vector, run_contiguous=contiguous,
            )  # fmt: skip
    assert kind is KernelKind.POINTWISE, "the verifier holds a kernel's kind to its body"
    loaded, widest = streams(kernel)
    heavy = heavy_ops(kernel.body.walk())
    streamed = streamed_values(kernel)
    across = transposed_dim(kernel)
    return KernelShape(
        kind, parallel, (), element_bytes=widest, across=across,
        access_vectors=access_vectors(kernel) if across >= 0 else (),
        loaded_bytes=loaded, transcendentals=len(heavy),
        streamed_transcendentals=sum(op.result in streamed for op in heavy),
    )  # fmt: skip


def operand_tiles(kernel: loop.KernelOp, contraction: loop.ReduceOp) -> tuple[int, int]:
    """The buffers a contraction loads by its kernel's rows and by its columns
    (`KernelShape.operand_tiles`), at least one each."""
    *_, rows, cols = kernel.body.block.args
    sides: tuple[set[SSAValue], set[SSAValue]] = (set(), set())
    for load in contraction.body.walk():
        if isinstance(load, loop.LoadOp):
            for side, iv in zip(sides, (rows, cols), strict=True):
                if iv in load.indices:
                    side.add(load.buffer)
    return max(1, len(sides[0])), max(1, len(sides[1]))


PEELED_ROW_BYTES = 8
"""Rows whose starts are not this many bytes apart are peeled: they load 1 or 2
elements a lane (2- or 4-byte vectors). Rows 8 bytes apart already load 8-byte
vectors, and the peel's extra masked chunk did not pay there: on an H100, softmax
1094 x 59,372 bf16 held took 140 us peeled against 102 (ptxas spilled more at 29
chunks), where 4096 x 50,257 bf16 took 317 against 436, 5772 x 56,119 bf16 543
against 762 and 4163 x 51,938 bf16 (4-byte rows) 310 against 374; 4096 x 50,257 f32
556 against 564."""


def whole_rows(kernel: loop.KernelOp) -> list[tuple[int, int]] | None:
    """(row length, element bytes) of every load and store of a reduction kernel that
    a loop index of a reduction or foreach reaches, where each is `buffer[*kept, r]`,
    `r` that loop's own index over a whole row of a buffer shaped `[*parallel, R]`;
    None where one is not."""
    parallel = list(kernel.parallel_bounds())
    ivs = list(kernel.body.block.args)
    rows: list[tuple[int, int]] = []
    for op in kernel.body.walk():
        if not isinstance(op, loop.LoadOp | loop.StoreOp):
            continue
        indices = list(op.indices)
        if not set().union(*(index_args(i) for i in indices)) - set(ivs):
            continue  # a value per row (a reduction's result), or a constant
        shape = list(op.buffer.type.get_shape())  # type: ignore[attr-defined]
        last = indices[-1]
        owner = last.block.parent_op() if isinstance(last, BlockArgument) else None
        if (
            indices[:-1] != ivs
            or shape[:-1] != parallel
            or not isinstance(owner, loop.LOOPS)
            or loop.int_list(owner.bounds) != shape[-1:]
        ):
            return None
        rows.append((shape[-1], element_bytes(op.buffer.type.element_type)))  # type: ignore[attr-defined]
    return rows


def row_granule(rows: list[tuple[int, int]] | None, epilogue: bool) -> int:
    """`KernelShape.row_granule` of a reduction kernel's `whole_rows`: rows not
    `PEELED_ROW_BYTES` apart, and rows only reduced (no `epilogue` reads them again)
    not 16 bytes apart. A peeled row only reduced keeps no chunk in registers, and
    its 16-byte vectors paid even where the rows start 8 bytes apart (H200, kernel
    time, us, as they start at the rule's tiling / peeled at 4 a thread: logsumexp
    of 4096 x 100,004 bf16 492.9 / 323.2, 2000 x 75,002 f32 196.3 / 161.6); rows read
    again 8 bytes apart lost so (softmax 2048 x 128,260 bf16 494.6 / 521.8, 1000 x
    152,068 f16 294.3 / 304.2) and take two 8-byte vectors a thread instead
    (`long_row_tiling`).

    Rows only reduced that do start 16 bytes apart are peeled in place (granule 1):
    no lanes before the start to mask, but the loop over the chunks inside every
    row loads unmasked and only the chunk past the last whole one is masked, where
    the plain loop masks every chunk of a row whose length is no multiple of its
    chunk. Measured on an H200 (kernel time, us, every chunk masked / in place):
    logsumexp 4096 x 100,000 bf16 494.1 / 321.7, 3000 x 80,000 f16 246.1 / 210.8,
    2000 x 70,000 f32 165.5 / 150.1. Not rows read again: a softmax 1000 x 150,000
    f32 went 459.7 -> 508.0 so, 3000 x 100,000 bf16 499.4 -> 505.4."""
    if not rows or len({length for length, _ in rows}) != 1:
        return 0  # rows of different lengths (none, or a split stage's)
    if row_vector_bytes(rows) >= (PEELED_ROW_BYTES if epilogue else VECTOR_BYTES):
        return 0 if epilogue else 1  # rows only reduced 16 bytes apart: in place
    return VECTOR_BYTES // min(b for _, b in rows)  # a row's 16-byte vectors


def vector_bytes(row_bytes: int) -> int:
    """The widest vector, up to `VECTOR_BYTES`, that rows `row_bytes` long load or
    store from each start: the largest power of two dividing the row's bytes."""
    return math.gcd(row_bytes, VECTOR_BYTES)


def row_vector_bytes(rows: list[tuple[int, int]] | None) -> int:
    """`KernelShape.row_vector_bytes` of a reduction kernel's `whole_rows`."""
    if not rows:
        return 0
    return min(vector_bytes(length * b) for length, b in rows)


HEAVY = frozenset(
    fn
    for op in graph.ELEMENTWISE_OPS
    if op.COST is graph.Cost.TRANSCENDENTAL
    for fn in (op.FN, *op.EXTRA_FNS)
)
"""The `loop.apply` functions that cost a multi-instruction sequence (graph.Cost)."""


def heavy_ops(ops: Iterable[Operation]) -> list[loop.ApplyOp]:
    """The applies among `ops` that compute a transcendental function (`HEAVY`)."""
    return [op for op in ops if isinstance(op, loop.ApplyOp) and op.fn.data in HEAVY]


def full_size(buffer: MemRefType, space: int) -> bool:
    """A buffer an element-wise kernel streams, not a broadcast one read from cache."""
    return 2 * numel(buffer.get_shape()) >= space


def streams(kernel: loop.KernelOp) -> tuple[int, int]:
    """(bytes an element of the full-size loads, widest full-size access in bytes)."""
    space = numel(kernel.parallel_bounds())
    loaded, widest = 0, 1
    for op in kernel.body.walk():
        if isinstance(op, loop.LoadOp | loop.StoreOp):
            buffer = op.buffer.type
            assert isinstance(buffer, MemRefType)
            if full_size(buffer, space):
                size = element_bytes(buffer.element_type)
                widest = max(widest, size)
                if isinstance(op, loop.LoadOp):
                    loaded += size
    return loaded, widest


def streamed_values(kernel: loop.KernelOp) -> set[SSAValue]:
    """The values of an element-wise body computed from its full-size loads."""
    space = numel(kernel.parallel_bounds())
    out: set[SSAValue] = set()
    for op in kernel.body.walk():
        full = isinstance(op, loop.LoadOp) and full_size(op.buffer.type, space)  # type: ignore[arg-type]
        if full or any(v in out for v in op.operands):  # a gather by streamed indices too
            out.update(op.results)
    return out


def transposed_dim(kernel: loop.KernelOp) -> int:
    """The parallel dim (not the last) along which most bytes of transposed accesses
    are contiguous: the last index of a full-size load or store that is computed
    from that one index alone. -1 when every access runs along the last dim (or
    none can tell)."""
    args = list(kernel.body.block.args)
    if len(args) < 2:
        return -1
    votes: dict[int, int] = {}
    space = numel(kernel.parallel_bounds())
    for op in kernel.body.walk():
        if not isinstance(op, loop.LoadOp | loop.StoreOp) or not op.indices:
            continue
        buffer = op.buffer.type
        assert isinstance(buffer, MemRefType)
        if buffer.get_shape()[-1] == 1 or 2 * numel(buffer.get_shape()) < space:
            continue  # a broadcast operand (a bias, a column) is read from cache
        last = index_args(op.indices[-1])
        if len(last) == 1:
            (arg,) = last
            if arg in args and arg is not args[-1] and kernel.parallel_bounds()[-1] > 1:
                d = args.index(arg)
                votes[d] = votes.get(d, 0) + element_bytes(buffer.element_type)
    return max(votes, key=lambda d: votes[d]) if votes else -1


def access_vectors(kernel: loop.KernelOp) -> tuple[int, ...]:
    """`KernelShape.access_vectors`: the elements of the widest vector, up to 16
    bytes, dividing each full-size access's rows (the largest power of two dividing
    a row's bytes); 1 where the last index is not a loop index itself (a slice's
    offset, a stride), which no vector can load."""
    args = set(kernel.body.block.args)
    space = numel(kernel.parallel_bounds())
    out: list[int] = []
    for op in kernel.body.walk():
        if not isinstance(op, loop.LoadOp | loop.StoreOp) or not op.indices:
            continue
        buffer = op.buffer.type
        assert isinstance(buffer, MemRefType)
        if not full_size(buffer, space):
            continue
        size = element_bytes(buffer.element_type)
        row = buffer.get_shape()[-1] * size
        plain = op.indices[-1] in args
        out.append(vector_bytes(row) // size if plain and size < VECTOR_BYTES else 1)
    return tuple(out)


SHARED_BYTES = 227 * 1024
"""Shared memory a program may use on an H100 or H200 (Triton's limit there): the
`tile` pass's default; `irc.target` reads the GPU's own (`shared-bytes`)."""

L2_BYTES = 50 * 2**20
"""The L2 cache of an H100 or H200: what programs read again soon finds it there if
all that the resident programs read between fits."""


def attention_shape(kernel: loop.KernelOp, parallel: tuple[int, ...]) -> KernelShape:
    """An attention's sizes: parallel [batch, rows, value dim]; reduction (keys,
    head dim), the softmax's loop and the scores' contraction."""
    keys = head = 1
    half = False
    for op in kernel.body.walk():
        if isinstance(op, loop.SoftmaxReduceOp):
            (keys,) = loop.int_list(op.bounds)
            for inner in op.body.walk():
                if isinstance(inner, loop.ReduceOp) and inner.contract is not None:
                    (head,) = loop.int_list(inner.bounds)
        if isinstance(op, loop.ReduceOp) and op.contract is not None:
            half = runs_in_half(op)
    from irc.analysis.key_band import band_of

    banded = band_of(kernel) is not None
    return KernelShape(KernelKind.ATTENTION, parallel, (keys, head), half, banded=banded)


def attention_tiling(shape: KernelShape, shared_bytes: int = SHARED_BYTES) -> Tiling:
    """FlashAttention-2's tiles, from a program's registers and shared memory.

    A program keeps a [BM, E] f32 accumulator and a [BM, BN] block of f32 scores
    (then probabilities) live across the key loop: at most
    `ATTENTION_LIVE_F32` of them a thread, with 4 warps where they fit, else 8.
    Its shared memory holds the Q rows and `stages` K and V tiles in flight:
    two programs must fit an SM (`shared_bytes`), so that one's softmax runs
    while the other's dots do; stages go down from 3 (2 for f32) to 2 before
    BN goes down from 128 to 64 (a wider key tile rescales the accumulator
    half as often), and BN is 64 where 128 would make more than
    `ATTENTION_SCORES` scores, and always in half precision (`HALF_KEY_STEP`).
    Rows: 128, or 64 (one warp group's dot) under a banded
    (causal) mask, where the program of the last rows sees every key: halving
    the rows halves that heaviest program and doubles the programs that fill
    the machine's last wave. Measured on an H100 (bf16, T = 4096 and 16384,
    causal and not, d = 64 and 128, against ten other tilings): the choice is
    the fastest or within 5% of it on each. f32 products (`ieee`) run on FMA
    units, whose operands Triton holds in registers too: 32 rows (1.26 ms for
    96 x 1024^2 causal, head dim 64, on an H100; 64 rows 1.29-1.40 ms, 128
    spilled: 27.7 ms), and the Q, K and V tiles count among a thread's f32
    (`ATTENTION_FMA_LIVE_F32`). Short sequences get smaller tiles.
    """
    *_, m, e = shape.parallel
    keys, head = shape.reduction
    be, bd = max(16, next_pow2(e)), max(16, next_pow2(head))
    operand = 2 if shape.half else 4
    rows = (64 if shape.banded else 128) if shape.half else 32
    bm = min(rows, max(16, next_pow2(m)))
    budget = ATTENTION_LIVE_F32 if shape.half else ATTENTION_FMA_LIVE_F32

    def live(bn: int) -> int:
        """f32 values a program holds across a key step (`ATTENTION_FMA_LIVE_F32`)."""
        held = bm * (be + bn)
        return held if shape.half else held + bm * bd + bn * (bd + be)

    for widest in (128, 64):
        bn = min(widest, max(16, next_pow2(keys)))
        if widest > HALF_KEY_STEP and (shape.half or bm * bn > ATTENTION_SCORES):
            continue
        warps = 4 if live(bn) <= budget * 128 else 8
        if live(bn) > budget * 32 * warps:
            continue
        for stages in (3, 2) if shape.half else (2,):
            if 2 * operand * (bm * bd + stages * bn * (bd + be)) <= shared_bytes:
                return Tiling((bm, bn), warps, stages)
    # Two programs do not fit an SM (f32 heads of 128): one, with 64 keys a step, or
    # fewer keys, stages and rows where a GPU's shared memory is smaller still.
    stages = 3 if shape.half else 2
    bn = min(64, max(16, next_pow2(keys)))
    while operand * (bm * bd + stages * bn * (bd + be)) > shared_bytes:
        if bn > 16:
            bn //= 2
        elif stages > 1:
            stages -= 1
        elif bm > 16:
            bm //= 2
        else:
            break
    return Tiling((bm, bn), 4 if live(bn) <= budget * 128 else 8, stages)


ATTENTION_SCORES = 8192
"""Scores a program holds a key step at most (64 a thread of 4 warps): BN = 64 at
128 rows. Measured on an H100 once the probabilities took exp2 (bf16, d = 64,
not causal, 128 rows): 128 keys a step were 2.5-5% slower than 64 at T = 1024,
4096 and 16384 (33.6, 106.4 and 398.2 us against 32.8, 100.8 and 378.7)."""

HALF_KEY_STEP = 64
"""Keys a half-precision attention program steps at most, its 64 rows under a causal
band included. Measured on an H100 once the probabilities' exponent was one FMA
(bf16 SDPA, causal, d = 64, 64 rows, 4 warps, 3 stages): 64 keys against 128 took
42.4 us against 54.5 at B x H = 96 and T = 1024, 339 against 380 at 64 x 4096,
1214 against 1307 at 16 x 16384, 41.0 against 55.0 at 256 x 512 and 37.5 against
44.2 at 24 x 2000 (SDPA: 46.0, 327, 1202, 37.6, 46.2). Session 13 had measured
the other way (60.3 us against 73.8 at T = 4096), before exp2 and the FMA."""

ATTENTION_LIVE_F32 = 192
"""f32 values of an attention's accumulator and scores a thread may hold: 192 of
its 255 registers, the rest for addresses, the running max and sum and the dot
operands."""

ATTENTION_FMA_LIVE_F32 = 112
"""The same for an f32 attention, whose dots run on FMA units with their operands in
registers too: the accumulator, scores (then probabilities) and the Q, K and V
tiles, 112 a thread, which a head of 64 at 32 rows, 64 keys and 4 warps takes.
Measured on an H200 (causal, us): heads of 128 (8 x 1024) at 32 x 64 took 257
with 4 warps (208 a thread, spilled) and 153 with 8 (torch.compile 145; 32 x 32
at 8 warps 185); a head of 65, padded to 128 (39 x 1276), 37,489 and 1,865
(torch.compile 927); a head of 64 (16 x 1024) 163 with 4 warps, 181 with 8."""


@dataclass(frozen=True)
class Tiling:
    block: tuple[int, ...]
    warps: int
    stages: int = 1
    persistent: bool = False
    unrolled: bool = False
    """Reductions: the loop over a row's chunks is unrolled, so that the chunks stay
    in registers and a row read by several passes is read from memory once."""
    tail: tuple[int, int] | None = None
    """Persistent contractions: (T, S), the last T tiles split into S chunks of K
    (`tail_split`)."""
    nested: bool = False
    """Reductions over several dims: the leading reduced dims are looped an index at a
    time around chunks of the last (`nested_run_tiling`)."""


LONG_ROW_CHUNK = 8192
"""Most elements of a looped row a program loads a step (the `rblock` option)."""
READ_AGAIN_ROW_VECTORS = 2
"""Vectors (`row_vector_bytes` wide: 16 or 8 bytes) of a step a thread of a looped row
read again takes, and a step spans as many vectors whatever their width: chunks of
`LONG_ROW_CHUNK` elements where the rows start 16 bytes apart, half that where they
start 8 bytes apart (half precision at 16 warps, f32 at 32). Measured on an H200
(softmax, kernel time, us). 16-byte rows, 4 half elements a thread of 32 warps
against 16 of 16: 6000 x 80,000 f16 812.7 / 719.4, 2000 x 100,000 bf16 385.8 /
348.8, 4096 x 128,256 bf16 934.2 / 845.1, 1000 x 152,064 f16 279.7 / 248.3, 3000 x
65,600 bf16 368.1 / 343.7 (eager: 1001.5, 443.2, 1111.8, 336.6, 375.0). 8-byte rows,
the rule before (chunks of 4096 at 32 warps in half precision, 8192 at 32 in f32)
against this: 4000 x 75,004 bf16 549.8 / 518.6, 2048 x 128,260 bf16 494.6 / 463.4,
1000 x 152,068 f16 294.3 / 280.1, 333 x 100,002 f32 137.3 / 130.0, 1500 x 70,006 f32
378.1 / 323.6; at shapes not tuned on, 1777 x 120,006 f32 777.0 / 661.2, 2500 x
66,668 f16 304.4 / 282.5, but 3000 x 90,004 bf16 485.7 / 497.6 (eager 616.2). Rows
whose starts are less than 8 bytes apart are peeled (`row_granule`)."""


PEELED_ROW_THREAD_ELEMENTS = 4
"""Elements of a step a thread of a peeled looped row takes (`row_granule`: read from
its 16-byte-aligned start, `loop-to-tile`'s `RowPeel`), f32 as well as half precision:
its first and last chunks, masked, stay in registers across the loop for the pass that
reads the row again, so wider steps cost registers the loop's loads want. Measured on
an H200 (softmax, kernel time, us; chunks of 4096 at 32 warps against 8192 at 32):
333 x 100,003 f32 122.2 / 131.8, 1267 x 74,925 f32 293.7 / 331.5, 2000 x 70,001 f32
435.3 / 478.7, a logsumexp of 2000 x 75,001 f32 159.2 / 191.1; 6320 x 75,945 bf16
840.9 / 991.3, 4096 x 100,003 bf16 (logsumexp) 341.7 / 448.1."""


ADDRESSED_ROW_THREAD_ELEMENTS = 8
ADDRESSED_ROW_WARPS = 16
"""Looped rows only reduced whose loads are not whole rows of a buffer (no
`row_vector_bytes`: a reduction over several dims, such as a batch norm's over N
and H*W of NCHW, whose flat index is divided back into them; a split's chunk of a
row) take 8 elements a thread of 16 warps (chunks of 4096), not 32 warps of 8 f32
or 4 half elements: such loads have an address an element (or vectors Triton must
prove from a flat index), so elements, not bytes, make a thread's share, and
programs of half the warps let 4 share an SM. Measured on an H200 (kernel time,
us, the old tiling / this; 8 warps of 8 in brackets): batch-norm mean and mean of
squares over dims 0 and 2, 89 x 349 x 1728 f32 71.8 / 63.5 (63.6; torch.compile
61.2), 48 x 300 x 2304 f32 49.6 / 45.6 (44.0), 64 x 256 x 3136 bf16 40.8 / 39.1
(38.0), 16 x 64 x 50,176 f16 47.0 / 38.9 (38.0), 250 x 96 x 196 f32 15.2 / 13.1
(14.3); a sum of exp over dims 1 and 2, 300 x 129 x 1001 bf16 54.3 / 51.0 (57.3);
split row sums 100 x 500,001 f16 47.8 / 43.6, 64 x 1,000,000 f32 73.6 / 74.1 (77.8),
24 x 2,000,000 bf16 33.2 / 33.9 (34.8). Rows read whole, in vectors, keep their
tiling: 16 warps of 8 was mixed there (logsumexp, us: 4096 x 50,257 bf16 182.6 /
175.0, 1024 x 65,536 f32 73.9 / 75.5, 2000 x 75,001 f32 156.3 / 166.0)."""


NESTED_SHORT_RUN_CHUNK = 2048
NESTED_SHORT_RUN_WARPS = 4
NESTED_RUN_F32_CHUNK = 2048
NESTED_RUN_CHUNK = 4096
NESTED_RUN_WARPS = 8
NESTED_LONG_RUN_CHUNK = 2048
NESTED_LONG_RUN_WARPS = 16
NESTED_RUN_ONE_STEP_BUSY = 0.53
"""Reductions over several dims whose loads read runs of the last ones
(`KernelShape.run`) that do not start 16 bytes apart, too long to hold in a
program's rows (a batch norm's over N and H*W of NCHW, H*W = 2898): a flat index
over the reduced dims, divided back into them, costs a division and a remainder an
element and loads an element at a time. Looped an index of the leading dims at a
time, around steps along the run, each load is a run's vector at no division.

The steps, by the run's length and its elements' bytes:
- a run of up to `NESTED_SHORT_RUN_CHUNK` elements: one step of that, at 4 warps
  (16 elements a thread), where the run keeps `NESTED_RUN_ONE_STEP_BUSY` of its
  lanes busy (1086 elements or more);
- half-precision runs of up to `NESTED_RUN_CHUNK` (4096): one step of that, at 8
  warps, where the run keeps `NESTED_RUN_ONE_STEP_BUSY` of its lanes busy;
- longer half-precision runs: steps of `NESTED_LONG_RUN_CHUNK` (2048) at 16 warps,
  4 elements a thread (their steps keep two thirds of their lanes busy at least).
  At 8 warps, steps of 2048 or 4096 were fast on some rows and two- to three-fold
  slower on others (the rows below); at 16 warps none lost two-fold;
- longer f32 runs: steps of `NESTED_RUN_F32_CHUNK` (8 KB, the bytes of a bf16 step
  of 4096) at 8 warps, where they keep `NESTED_RUN_ONE_STEP_BUSY` of their lanes
  busy: unlike half precision, f32 won at every busy fraction measured (55-98%);
  not where the loads read all the reduced dims as one span
  (`KernelShape.run_contiguous`, `x.exp().sum((1, 2))`), whose flat index no lane
  divides: f32 40 x 500 x 2501 71.1 flat / 86.8 nested (torch.compile 69.6), where
  bf16 19 x 700 x 3001 was 58.0 / 44.4 (49.1).

Measured on an H200 (CUDA-graph time of the compiled function, us, the flat index /
nested, torch.compile in brackets), mean and mean of squares over N and H*W:
- half precision, long runs (session 42, 8 warps): 55 x 267 x 2898 bf16 52.1 / 31.8
  (40.5), 40 x 300 x 2900 bf16 27.8 / 22.2 (28.3), 32 x 1024 x 2898 bf16 67.0 / 54.6
  (66.6), 43 x 250 x 4020 bf16 44.3 / 26.7 (53.8), 16 x 128 x 53 x 55 bf16 6.7 / 5.9
  (11.6), 30 x 200 x 6001 bf16 47.7 / 27.2 (steps of 2048; 45.2 in 4096; 42.5), 20 x
  300 x 8500 bf16 47.0 / 29.9 (steps of 2048; 40.0), 40 x 300 x 2250 bf16 (55% busy)
  22.6 / 19.9 (23.6); a max over them of 100 x 200 x 3001 f16 54.3 / 36.8 (81.4).
  Not runs of 2100 (51%): 48 x 384 x 2100 bf16 26.5 / 33.8 (26.0), 64 x 96 x 2100
  8.9 / 8.8 (9.8).
- half precision, runs longer than 4096 (session 44; before: steps of 2048 or 4096
  at 8 warps where 80% busy, else flat / steps of 2048 at 16 warps): 72 x 275 x 4449
  bf16 101.9 / 64.5 (100.5; at 8 warps 117.7), 48 x 388 x 4891 bf16 83.9 / 55.7
  (77.4; at 8 warps 187.8), 40 x 500 x 4999 bf16 (2048 at 8 warps before) 160.8 /
  61.1 (96.5), 300 x 64 x 4700 f16 79.3 / 50.0 (73.8), 200 x 32 x 4401 bf16 42.7 /
  20.2 (34.4), 20 x 256 x 8001 bf16 (4096 at 8 warps before) 42.7 / 29.5 (54.8), 64
  x 128 x 70 x 70 bf16 30.0 / 22.7 (46.1); as fast: 30 x 200 x 6001, 16 x 512 x 9000,
  8 x 128 x 20000 bf16, 6 x 96 x 40000 f16; slower: 20 x 300 x 8500 bf16 (2048 at 8
  warps before) 29.4 / 35.2 (41.7). Steps of 4096 at 16 warps, or of 1024 at 8, lost
  up to three-fold on some of these rows.
- f32, long runs (session 43): 55 x 267 x 2898 52.7 / 45.2 (48.0), 30 x 316 x 2271
  (55% busy) 30.6 / 25.2 (25.5), 64 x 341 x 3822 91.8 / 78.3 (84.0), 100 x 130 x 3001
  49.8 / 41.8 (50.0), 40 x 333 x 2777 44.6 / 39.9 (53.9), 24 x 500 x 3333 44.5 / 41.0
  (46.3), 175 x 45 x 3465 40.4 / 30.8 (49.9), 154 x 47 x 3086 38.7 / 25.8 (32.9), 81
  x 105 x 2774 41.1 / 27.8 (31.6), 16 x 200 x 6001 22.5 / 22.4 (33.0); slower at 32 x
  256 x 45 x 67, 27.5 / 29.2 (28.3). Steps of 4096 at 16 warps lost (55 x 267 x 2898
  53.3 / 65.6).
- short runs, one step of 2048 at 4 warps (session 43): 85 x 385 x 1147 bf16 45.6 /
  32.6 (32.7), 31 x 317 x 1554 bf16 17.8 / 11.2 (13.8), 26 x 386 x 1794 bf16 12.3 /
  10.3 (13.7), 73 x 184 x 1861 bf16 38.7 / 22.4 (53.8), 88 x 83 x 1683 bf16 13.9 / 8.4
  (24.6), 24 x 682 x 1131 bf16 18.8 / 12.1 (21.6), 53 x 112 x 1133 f32 10.0 / 7.0
  (15.1); of 25 such rows 20 faster, 38 x 31 x 1259 bf16 4.6 / 5.2 (6.6) and 19 x
  400 x 1374 bf16 7.0 / 7.5 (9.2) slower, the rest within 4%. A channel one program
  could hold whole stays one kernel (`split_chunks`): split, the small rows were up
  to 35% slower. At 8 warps 85 x 385 x 1147 was as fast and three others slower; two
  steps of 1024 at 4 warps within 5% of one step. 179 x 101 x 1764 f32 gained too
  (42.6 / 37.4), but its runs start 16 bytes apart, which this rule leaves flat.
- runs whose loads read one span (`x.exp().sum((1, 2))`) of 1086-2048: 24 x 700 x
  1500 bf16 37.8 / 30.2 (28.8), 64 x 333 x 1801 bf16 53.3 / 45.8 (44.8), 16 x 1000 x
  1999 f32 40.3 / 38.4 (47.0); 8 x 300 x 1147 bf16 5.6 / 7.6 (6.2).
- not where the runs start 16 bytes apart, so that Triton proves the flat index's
  vectors and its full chunks beat the nested loop's padded ones (kernels written by
  hand, us, flat / nested): 64 x 256 x 3136 bf16 26.7 / 29.6, 64 x 384 x 1024 bf16
  13.4 / 14.8; through irc, f32 64 x 256 x 3136 51.2 / 50.9, 20 x 1000 x 2000 44.1 /
  44.1. Steps of 1024 at 2 or 4 warps on long bf16 runs were slower everywhere but
  64 x 96 x 2100 (8.5)."""


def nested_run_tiling(shape: KernelShape) -> Tiling | None:
    """Runs of a reduction over several dims looped an index of its leading dims at
    a time (`NESTED_RUN_ONE_STEP_BUSY` says where and why), or None."""
    if shape.epilogue or shape.element_bytes > 4 or shape.run_vector_bytes >= VECTOR_BYTES:
        return None
    run, busy = shape.run, NESTED_RUN_ONE_STEP_BUSY
    if not run:
        return None
    if run <= NESTED_SHORT_RUN_CHUNK:
        chunk, warps = NESTED_SHORT_RUN_CHUNK, NESTED_SHORT_RUN_WARPS
    elif shape.element_bytes > 2:
        if shape.run_contiguous:
            return None  # no division to save
        chunk, warps = NESTED_RUN_F32_CHUNK, NESTED_RUN_WARPS
    elif run <= NESTED_RUN_CHUNK:
        chunk, warps = NESTED_RUN_CHUNK, NESTED_RUN_WARPS
    else:
        chunk, warps = NESTED_LONG_RUN_CHUNK, NESTED_LONG_RUN_WARPS
    if run < busy * -(-run // chunk) * chunk:
        return None
    return Tiling((1, chunk), warps, nested=True)


def long_row_tiling(shape: KernelShape, rblock: int = LONG_ROW_CHUNK) -> Tiling:
    """A row too long for registers: one row a program, looped in chunks.

    A chunk is 32 warps' worth of elements, 4 a thread for 2-byte elements and 8
    for wider ones. Measured on an H100 (softmax of 4096 x 50,257 bf16 and f32, of
    1000 x 32,003 f16, logsumexp of 4096 x 32,000 bf16; chunks of 4096 to 16384,
    8 to 32 warps): the fastest or within 7% of it on each (f32 wants more bytes
    in flight a thread than bf16, whose rows of the same bytes hold twice the
    elements to compute on). A persistent kernel (one program an SM walks the
    rows, so that fewer rows are in flight and a row's second read finds it in
    L2) was 20-75% slower on every one of them: one program an SM keeps too few
    loads in flight. Persistent rows stay an autotuning candidate.
    Rows read again whose chunks load 8- or 16-byte vectors take
    `READ_AGAIN_ROW_VECTORS` of them a thread (it says why); peeled rows
    (`row_granule`) `PEELED_ROW_THREAD_ELEMENTS`.
    """
    if not shape.epilogue and not shape.row_vector_bytes:
        # `ADDRESSED_ROW_WARPS` says why.
        e = ADDRESSED_ROW_THREAD_ELEMENTS
        chunk = min(rblock, ADDRESSED_ROW_WARPS * 32 * e, next_pow2(numel(shape.reduction)))
        return Tiling((1, chunk), max(1, chunk // (32 * e)))
    e = min(8, 2 * shape.element_bytes)
    vector = shape.row_vector_bytes
    if shape.row_granule:
        e = PEELED_ROW_THREAD_ELEMENTS
    elif shape.epilogue and vector >= PEELED_ROW_BYTES:
        e = READ_AGAIN_ROW_VECTORS * vector // shape.element_bytes
        rblock = max(1, rblock * vector // VECTOR_BYTES)
    chunk = min(rblock, MAX_WARPS * 32 * e, next_pow2(numel(shape.reduction)))
    return Tiling((1, chunk), max(1, min(MAX_WARPS, chunk // (32 * e))))


SHARED_ROW_ELEMENTS = 8192
"""Rows up to this many elements (padded) share a program, about 4096 elements a
program; longer rows that fit `persistent-rblock` take a program each."""
PERSISTENT_ROW_ELEMENTS = 32768
"""The longest row (padded) a program holds whole in registers by default
(`persistent-rblock`, `whole_row_tiling` says why)."""
WHOLE_ROW_THREAD_F32 = 64
"""f32 values of a row a thread holds where one row fills a program (rows of
16384 or 32768 elements: 8 or 16 warps)."""


UNROLLED_TRANSCENDENTAL_ROWS = 16384
"""Rows longer than this (padded) that an epilogue reads again and whose reductions
compute transcendental functions (a softmax's exp) are held as unrolled chunks
(`unrolled_row_tiling`), not whole at 64 f32 a thread of 16 warps. Measured on an
H200 (kernel time, us, whole against chunks of 2048): softmax 2907 x 20,500 f32
168.7 / 118.8, 1217 x 20,174 f32 58.3 / 52.5, 5000 x 24,000 f32 297.5 / 246.7, 4000
x 30,000 bf16 185.8 / 173.7, 8192 x 32,000 bf16 374.9 / 352.7. Not where the
reductions compute none, nor at 16384 padded: layer norm 4000 x 20,000 f32 179.4 /
186.7, 4000 x 30,000 bf16 165.4 / 172.9, RMS norm 3000 x 24,000 f32 141.4 / 153.9;
softmax 8000 x 12,000 bf16 95.4 / 107.5, 6000 x 16,000 bf16 114.7 / 120.3 (but 3000 x
12,582 f32 79.7 / 77.1)."""


def whole_row_tiling(full: int) -> Tiling:
    """A row of 8192 to 32768 elements (padded) in one program's registers, read
    from memory once however often the kernel reads it.

    Measured on an H100 (softmax, one program a row): 16384 x 12,000 bf16 0.264 ms
    against 0.471 streamed in chunks, 8192 x 32,000 bf16 0.378 against 0.485,
    4096 x 30,000 f32 0.331 against 0.436, 8192 x 16,384 f32 0.358 against 0.362,
    all at 64 f32 a thread: the fastest warp count or within 4% of it on each (32
    a thread, 0.363 on 8192 x 32,000 bf16, was 9% slower on 1000 x 32,003 f16,
    whose 1000 rows make few programs).
    At 65,536 elements (a 50,257-token vocabulary) 64 f32 a thread of 32 warps
    spill: 2.4x slower than streaming, which is why `persistent-rblock` stops at
    32768."""
    return Tiling((1, full), max(1, min(MAX_WARPS, full // (32 * WHOLE_ROW_THREAD_F32))))


UNROLLED_CHUNK = 2048
"""A row too long for one Triton block, held in registers: chunks of 16 warps x 4."""
UNROLLED_ROW_ELEMENTS = 59392
"""Most elements (whole chunks) of a row held in registers: 29 chunks, 116 f32 a
thread of 16 warps, whose 128 registers a thread are all of an SM's 64K. ptxas
(sm_90) spills 2 registers of a bf16 softmax row held so and 8 of an f32 one; at
30 chunks 16 and 43, at 32 (65,536) 35 and more. Measured on an H200 (kernel time,
held against streamed, eager's softmax): 1094 x 59,372 bf16 92 us against 129
(eager 127), 4163 x 51,938 bf16 330 against 404 (384), 1000 x 57,000 f16 74
against 107 (122), 1094 x 59,372 f32 141 against 188 (272), 2000 x 53,001 f32
270 against 320 (421). The first limit, 51,200 (100 f32 a thread), left the
first two above eager. An H100 agreed (the same rows: 102 against 145, 374 against
459, 86 against 122, 190 against 256, 318 against 390 us). Layer norms with a
weight and a bias (H200): 4096 x 53,000 bf16 323 against 386 us, but 2048 x
56,000 f32 400 against 356, as the f32 layer norm below already lost at 40,000."""


def unrolled_row_tiling(shape: KernelShape, most: int = UNROLLED_ROW_ELEMENTS) -> Tiling | None:
    """A row past `persistent-rblock` that an epilogue reads again, held in registers as
    chunks of `UNROLLED_CHUNK` (one Triton block each, the last one masked), where
    they fit (`UNROLLED_ROW_ELEMENTS`): the row is read from memory once, and
    padded to a chunk rather than to a power of two (50,257 to 51,200, not 65,536).

    Measured on an H100 (softmax, one row a program, 16 warps, no spills), against
    streaming the row twice: 4096 x 50,257 f32 0.573 ms against 0.939 (eager
    1.056), bf16 0.436 against 0.480 (eager's shared-memory kernel 0.394), f16
    at 2048 rows 0.224 against 0.247 (eager 0.203), 4096 x 40,000 bf16 0.228
    against 0.313, 1000 x 50,304 bf16 0.078 against 0.107, 4096 x 33,000 f32
    0.363 against 0.487. Chunks of 4096 and 8192 were 1-5% slower at 50,257, 32
    warps (64 registers a thread) 3-6%. A row of 65,536 spilled and lost to
    streaming (0.267 against 0.220 ms).
    Only rows that an epilogue reads again are held: a row only reduced is read
    once however it is tiled (a logsumexp's max and sum share one pass, see
    `online-softmax`: 4096 x 50,257 bf16 streamed in 0.263 ms, held in 0.287).
    Rows of one chunk (whose whole block `persistent-rblock` turned down) and
    of more than `most` elements held (the `unrolled-rblock` option) stream.
    At other shapes (kernel time, held against streamed): softmax 777 x 51,200
    f32 115 against 151 us, 4096 x 45,000 bf16 253 against 364 (times a weight:
    297 against 385), 3000 x 36,001 bf16 227 against 222; layer norm 2048 x
    40,000 f32 without weight and bias 222 against 352, 4096 x 36,000 bf16 233
    against 239. One loses: that f32 layer norm with its weight and bias, 342
    against 297 us; the rule does not yet weigh an epilogue's other operands."""
    r = numel(shape.reduction)
    # A row read from its aligned start spans up to `row_granule - 1` lanes more.
    held = -(-(r + max(shape.row_granule - 1, 0)) // UNROLLED_CHUNK) * UNROLLED_CHUNK
    if not shape.epilogue or r <= UNROLLED_CHUNK or held > most:
        return None
    return Tiling((1, UNROLLED_CHUNK), UNROLLED_CHUNK // (32 * 4), unrolled=True)


REDUCED_ROW_THREAD_BYTES = 128
"""Loaded bytes of its row a thread of a row reduction without an epilogue takes
(`reduced_row_elements`). Fewer warps a program leave more programs an SM, whose
loads, cross-warp reductions and arithmetic overlap one another's. Measured on an
H200 (kernel time, us, the bytes a thread against 8 elements a thread, the rule
before): logsumexp of 5874 x 4258 bf16 22.1 against 58.6 (torch.compile 54.0),
9000 x 6000 bf16 38.0 / 92.3 (73.8), 12000 x 1500 bf16 18.2 / 36.2 (45.3), 8000 x
3000 bf16 21.6 / 37.7, 5874 x 4258 f32 35.3 / 59.4 (44.9), 6000 x 5000 f32 40.0 /
67.7; a bf16 row sum of 8192 x 6000 29.7 / 42.8. Rows of several operands were
within 1% at any count (x * y + z and (x - y)^2 of 8192 x 8192 f32 and bf16)."""
REDUCED_ROW_THREAD_ELEMENTS = (8, 64)
"""The fewest and most elements a thread of such a row takes."""


def reduced_row_elements(shape: KernelShape) -> int:
    """Elements a thread of a row reduction without an epilogue takes: its
    `REDUCED_ROW_THREAD_BYTES` of loads, within `REDUCED_ROW_THREAD_ELEMENTS`."""
    least, most = REDUCED_ROW_THREAD_ELEMENTS
    loaded = max(1, shape.loaded_bytes or shape.element_bytes)
    return max(least, min(most, floor_pow2(REDUCED_ROW_THREAD_BYTES // loaded)))


def _warps(elements: int, thread_elements: int = 8, most: int = 8) -> int:
    return max(1, min(most, elements // (32 * thread_elements)))


def choose_tiling(
    shape: KernelShape,
    block: int = 1024,
    rblock: int = LONG_ROW_CHUNK,
    persistent_rblock: int = PERSISTENT_ROW_ELEMENTS,
    thread_elements: int = 8,
    epilogue_warps: int = 8,
    sms: int = 132,
    shared_bytes: int = SHARED_BYTES,
    unrolled_rblock: int = UNROLLED_ROW_ELEMENTS,
) -> Tiling:
    """The heuristic of this module's docstring (`sms`: the GPU's SMs, which a
    column reduction's tiles should fill; `shared_bytes`: shared memory a program
    may use, which bounds GEMM and attention tiles)."""
    if shape.kind == "pointwise" and shape.across >= 0:
        return transpose_tiling(shape)
    if shape.kind == "pointwise":
        return pointwise_tiling(shape, block, thread_elements)
    if shape.kind == "reduction" and shape.columns:
        return column_tiling(shape, sms)
    if shape.kind == "reduction" and shape.shared_bytes and not shape.epilogue:
        return shared_rows_tiling(shape, sms)
    if shape.kind == "reduction":
        rows, r = numel(shape.parallel), numel(shape.reduction)
        full = next_pow2(r)
        if full <= min(persistent_rblock, SHARED_ROW_ELEMENTS):
            x = max(1, min(next_pow2(rows), 4096 // full))
            if shape.epilogue:  # the rows stay in registers until the epilogue's store
                return Tiling((x, full), _warps(x * full, 16, most=epilogue_warps))
            return Tiling((x, full), _warps(x * full, reduced_row_elements(shape), most=32))
        nested = nested_run_tiling(shape)
        if nested is not None:
            return nested
        unrolled = unrolled_row_tiling(shape, unrolled_rblock)
        if full <= persistent_rblock:
            if unrolled and shape.transcendentals and full > UNROLLED_TRANSCENDENTAL_ROWS:
                return unrolled
            return whole_row_tiling(full)
        return unrolled or long_row_tiling(shape, rblock)
    if shape.kind == "attention":
        return attention_tiling(shape, shared_bytes)
    return gemm_tiling(shape, sms, shared_bytes)


@dataclass(frozen=True)
class GemmTile:
    """A tensor-core GEMM program: its output tile, pipeline depth and warps, and
    the rate at which it computes output elements relative to 128x256 tiles."""

    bm: int
    bn: int
    stages: int
    warps: int
    rate: float
    deeper: int = 0
    """Stages a persistent program takes where they fit (its TMA-stored epilogue
    stages a column slice at a time): measured faster, 0 where none was."""


TENSOR_CORE_TILES = (GemmTile(128, 256, 3, 8, 1.0, deeper=4), GemmTile(128, 128, 4, 8, 0.88))
"""Measured on an H100 (bf16, 8192x768 @ 768x2304, K steps of 64, persistent):
128x256 tiles in 54 us for 4.4 rounds of tiles, 128x128 (4 stages; 3 took 68 us)
in 55 us for 8.7 rounds: a 128x128 program does 0.88 of a 128x256 one's output
elements a second (it reads more operand bytes per product)."""

SPLIT_TF32_STAGES = 3
"""Stages of a 64x64x32 f32 (split-tf32) program: three TF32 products a K step
leave the loads more to hide than one product does. Measured on an H200 (GEMM +
bias + erf GELU, K-major operands, us, 2 stages against 3): 2565x974 @ 974x939
170 against 134, 1769x1080 @ 1080x1380 190 / 139, 777x5000 @ 5000x1333 577 /
375, 4096^3 2878 / 2767; a fourth stage gained nothing (134.8, 374.6, 2761.9)."""

SPLIT_TF32_SMALL_RATE = 0.80
"""f32 GEMMs (split-tf32): the rate of 64x64x32 programs (4 warps,
`SPLIT_TF32_STAGES`) against 128x128x32 (8 warps, 3 stages), fitted as the median
over sixteen GEMM + bias + erf GELU shapes with K-major operands
(`k-major-gemm-operands`) on an H200, each tiling's time over its rounds of tiles:
0.70-0.88 (3000x1023 @ 1023x2049 303 us against 331; 4429x820 @ 820x1208 229
against 208; 1024^3 60 against 84, where 128x128 fills half the SMs). 128x128x32
takes 0.80-0.94 of cuBLAS's FFMA SGEMM at 4096^3 and GPT-2's shapes."""

SPLIT_TF32_WIDE_RATE = 0.85
"""f32 GEMMs (split-tf32): the rate of 128x64x32 programs (4 warps, 3 stages)
against 128x128x32, for unbatched GEMMs whose 128x128 and 64x64 rounds fill the
SMs worse. Implied by forced tilings on an H200 (GEMM + bias + erf GELU, each
tiling's time over its rounds of tiles, against 64x64 at its 0.80): 0.88 at
5343x312 @ 312x540 (80.6 us against 89.0 for 64x64 and 114.1 for 128x128), 0.91 at
4000x256 @ 256x1000, 1.03 at 8000x300 @ 300x300, 0.78 at 2000x400 @ 400x3000, 0.73
at 1769x1080 @ 1080x1380, 0.83 at 3000x1023 @ 1023x2049 (294.1 against 303.9 and
333.9); 0.85 the middle. Batched GEMMs (split-k's stages) were not measured."""

TF32_PARTS_NARROW_TILES = ((64, 128, 0.73), (128, 64, 0.70))
"""f32 GEMMs of operands stored as TF32 parts (`split-tf32-gemm-operands`, four
tiles a K step): the rates of 64x128x32 and 128x64x32 programs (4 warps, 3 stages)
against 128x128x32 (8 warps, 3 stages), each tiling's time over its rounds of
tiles, one H200 run of hand-written kernels of the lowering's form (GEMM + bias +
erf GELU): 64x128 0.70-0.75 (0.75 at 5343x312 @ 312x540, 0.70 at 1162x1051 @
1051x440, where 128x128 leaves 92 of 132 SMs idle: 48 us against 68), 128x64
0.66-0.73, over seven shapes from 1162x1051 @ 1051x440 to 4429x820 @ 820x1208."""

SMALL_TILE_RATE = 0.47
"""64x64x32 programs, 4 warps, 2 stages, against 128x256 on the same GEMM (101 us)."""

EPILOGUE_K = 256
"""A transcendental function an output element weighs in a persistent GEMM's
epilogue like this much K (the loop it does not overlap). Measured on an H200 (bf16
GEMM + bias + erf GELU, kernel time, a program a tile against persistent): 8192 x
K @ K x 3072 at K = 256 64.1 against 55.0 us, K = 512 78.8 / 69.7, K = 768 93.7 /
84.6; with operands padded for TMA, 8191x512 @ 512x3071 175.1 / 89.5, 6000x384 @
384x1999 71.6 / 42.0, 5000x700 @ 700x4001 188.5 / 82.6; but 2000x256 @ 256x2049,
one round of tiles, 28.8 / 38.3 (a program a tile of 128x128: 21.7). On an H100 a
wash had been measured at K = 768, before epilogues ran in parts; with libdevice's
tanh, whose branches spilled registers, at 3072."""

EPILOGUE_BYTE_K = 200
"""A byte an output element that a GEMM's epilogue stages beyond its own 2-byte
output (a residual operand, a second output) weighs like this much K in a
persistent program. Llama's residual GEMM, which reads `x` and stores `h` and
`float(h)**2` (8 bytes: 6 past the output, 1200 of K), on an H100: a program a
tile faster at K = 768 (39.3 us against 41.5 at 8192 x 768) and K = 1024 (27.5
against 29.8 at 3000 x 1024), persistent faster at K = 1536 (95.4 against 99.4
at 8192 x 1536) and K = 2048 (75.4 against 79.4 at 4096 x 2048)."""

EPILOGUE_PART_F32 = 64
"""Accumulator values a thread holds at most while a GEMM's epilogue computes on
them (`epilogue_parts`). A 128x256 tile of 8 warps holds 128 a thread: with an erf
GELU epilogue on it ptxas spilled 12-28 registers (offline sm_90 build, bf16), on
its two column halves none (187-231 registers). Measured on an H200 (bias + erf
GELU, bf16, hand-split kernels): 8192x768 @ 768x3072 102.0 -> 97.1 us, 8192x4096 @
4096x4096 382.6 -> 375.9 (bare `torch.mm` 56.0 and 338.1)."""


ADDRESS_REGISTERS = 2
"""Registers one store instruction's address takes (64 bits)."""

EPILOGUE_REGISTERS = 224
"""Registers a thread may give a GEMM's epilogue for the accumulator and the store
addresses of one column part (`epilogue_parts`), the rest of the 255 going to
indices, masks and the bias. An output whose rows are not 16-byte multiples is
stored an element (2-byte rows) or two (4-byte) at a time, each through an address:
with an erf GELU on 128x256 tiles of 8 warps (128 accumulators a thread, 64 a
half) ptxas gave 255 registers and spilled 16 for 2-byte stores (128 + 64 x 2),
none for 4-byte ones (191; 128 + 64), and none in quarters (254; 128 + 32 x 2) or
on 128x128 tiles whole (101; 64 + 64 x 2). Measured on an H200 (bf16, the GEMM
kernel alone, halves against quarters): 2339x1097 @ 1097x6257 95.6 -> 88.2 us,
6123x1388 @ 1388x6083 231.5 -> 217.2, 4099x2000 @ 2000x3001 99.7 -> 92.8; with
4-byte stores even (3002x5014 @ 5014x5714 291.8 / 295.0, 9774x1283 @ 1283x3238
178.6 / 177.6)."""


def epilogue_parts(tiling: Tiling, shape: KernelShape | None = None) -> int:
    """Column parts a contraction's epilogue runs on one after another, so that one
    part's temporaries (`EPILOGUE_PART_F32`), and the rest of the accumulator with
    one part's store addresses (`EPILOGUE_REGISTERS`), fit the registers; 1 where
    `shape`'s epilogue cannot be split."""
    if shape is not None and not shape.split_epilogue:
        return 1
    bm, bn = tiling.block[0], tiling.block[1]
    held = bm * bn // (32 * tiling.warps)
    addresses = sum(
        ADDRESS_REGISTERS * size / vector for size, vector in (shape.narrow_stores if shape else ())
    )  # registers an output element's stores take
    parts = 1

    def too_many(parts: int) -> bool:
        part = held // parts
        spills = addresses > 0 and held + part * addresses > EPILOGUE_REGISTERS
        return part > EPILOGUE_PART_F32 or spills

    while too_many(parts) and bn % (2 * parts) == 0 and bn // (2 * parts) >= 16:
        parts *= 2
    return parts


SHORT_K_STEP_RATE = 0.8
"""A halved K step (32 instead of 64: more barriers per product): 54 -> 67 us."""


def gemm_tiling(shape: KernelShape, sms: int = 132, shared_bytes: int = SHARED_BYTES) -> Tiling:
    """A contraction's tiles, from a model of wave quantization.

    The output tiles are shared among `sms` SMs in rounds; a kernel takes as long
    as its rounds, each as long as a program takes for one tile: its area over
    its rate. Half-precision products on tensor cores weigh 128x256 and 128x128
    tiles (K steps of 64 unless shared memory only holds a shorter one beside the
    epilogue's tiles) against the small tiling: 8192x768 outputs take 128x128
    (384 tiles, 2.9 rounds) rather than 128x256 (192 tiles, 1.45 rounds, half of
    the second round idle). f32 products (three TF32 tensor-core products,
    `split-tf32`) take 128x128x32 unless 128x64x32 tiles (unbatched) or 64x64x32
    ones (3 stages) fill the rounds enough better (`SPLIT_TF32_WIDE_RATE`,
    `SPLIT_TF32_SMALL_RATE`); f64 ones (FMA units) keep 64x64x32. Unbatched tensor-core GEMMs
    are persistent (one program an SM walks the tiles), unless their epilogue
    computes transcendental functions or stages bytes that outweigh the K loop
    (`EPILOGUE_K`, `EPILOGUE_BYTE_K`)
    or its staged tiles do not fit beside the K loop's buffers (`gemm_fits`). A
    persistent half GEMM's last, partial round of 128x256 tiles may run its K loops in
    chunks (`tail_split`), and its rounds are then counted so.
    Measured on an H100 (B=8, T=1024 blocks, bf16): for a Llama residual GEMM that
    also stores `float(h)**2`, 128x128x64 tiles a program each took 50 us where a
    persistent kernel, for its shared memory, had to step K by 16: 70 us."""
    *batch, m, n = shape.parallel
    (k,) = shape.reduction
    bm, bn = (min(64, max(16, next_pow2(x))) for x in (m, n))
    small = Tiling((bm, bn, min(32, max(16, next_pow2(k)))), 4, 2)
    count = numel(batch)

    def cost(bm: int, bn: int, rate: float, tail: tuple[int, int, float] | None = None) -> float:
        tiles = count * -(-m // bm) * -(-n // bn)
        rounds = -(-tiles // sms) if tail is None else tiles // sms + tail[2]
        return rounds * bm * bn / rate

    if not shape.half:
        if shape.element_bytes != 4:  # f64: FMA units
            return small
        # f32: TF32 tensor-core products of split operands (loop-to-tile's split-tf32),
        # or of operands stored as TF32 parts (split-tf32-gemm-operands)
        small = replace(small, stages=SPLIT_TF32_STAGES)
        lm, ln = (min(128, max(16, next_pow2(x))) for x in (m, n))
        bk = small.block[2]
        large = Tiling((lm, ln, bk), 8 if lm * ln >= 128 * 128 else 4, 3)
        options = [(large, 1.0)]
        if shape.operand_tiles != (1, 1):
            for tm, tn, rate in TF32_PARTS_NARROW_TILES:
                if tm <= lm and tn <= ln and (tm, tn) != (lm, ln):
                    options.append((Tiling((tm, tn, bk), 4, 3), rate))
        else:
            if not batch and (lm, bn) == (128, 64) and ln > bn:
                options.append((Tiling((lm, bn, bk), 4, 3), SPLIT_TF32_WIDE_RATE))
            options.append((small, SPLIT_TF32_SMALL_RATE))
        best, best_cost = small, math.inf
        for tiling, rate in options:
            c = cost(tiling.block[0], tiling.block[1], rate)
            if c < best_cost and (tiling is small or gemm_fits(tiling, shape, shared_bytes)):
                best, best_cost = tiling, c
        return best

    best, best_cost = small, cost(small.block[0], small.block[1], SMALL_TILE_RATE)
    extra_bytes = max(0, shape.epilogue_bytes - 2)
    epilogue_k = shape.transcendentals * EPILOGUE_K + extra_bytes * EPILOGUE_BYTE_K
    persistent = not batch and epilogue_k < k
    for t in TENSOR_CORE_TILES:
        rate = t.rate
        for bk in (64, 32, 16):
            tiling = Tiling((t.bm, t.bn, bk), t.warps, t.stages, persistent=persistent)
            deeper = replace(tiling, stages=t.deeper)
            if persistent and t.deeper and gemm_fits(deeper, shape, shared_bytes):
                tiling = deeper
            if not gemm_fits(tiling, shape, shared_bytes):
                tiling = replace(tiling, persistent=False)
            if gemm_fits(tiling, shape, shared_bytes):
                tail = tail_split(shape, tiling, sms, rate)
                c = cost(t.bm, t.bn, rate, tail)
                if c < best_cost:
                    best, best_cost = replace(tiling, tail=tail and tail[:2]), c
                break
            rate *= SHORT_K_STEP_RATE
    return best


TAIL_PROGRAM_STEPS = 4
"""K steps a partial program of a split tail (`tail_split`) costs beyond its chunk:
its pipeline's fill, and its f32 tile's store."""

TAIL_BYTES_PER_STEP = 2_300_000
"""Bytes of partials (written, then read) that cost as long as a 64-deep K step of a
128x256 program: about 0.65 us at 3.5 TB/s on an H200."""

TAIL_LAUNCH_STEPS = 6
"""The two kernels of a split tail beyond the persistent one: their launches, fills
and drains, in K steps (about 4 us)."""

TAIL_MIN_STEPS = 4
"""The fewest K steps of a tail's chunk: a pipeline of 3-4 stages fills in them."""

TAIL_GAIN = 0.58
"""A split tail must cost at most this much of the round of tiles it replaces.
Fitted on 18 split GEMMs (bf16/f16 GEMM + bias + erf GELU, whole program on an
H200, tail off / on): at 0.23-0.57 of a round all 12 ran faster (0.76-0.98:
1711x8899 @ 8899x2446 231.6 / 176.0 us, 3292x6146 @ 6146x4049 354.0 / 311.1,
3002x5014 @ 5014x5714 342.6 / 325.8), at 0.59-0.68 five of six did not (0.99-1.07:
4250x3771 @ 3771x1247 104.9 / 111.9; 6704x3329 @ 3329x3210 0.97). The model prices
the partials and the fixup near their measured kernel times; the rest is the
launches between the kernels and how much faster a last round of few tiles runs."""


def tail_split(
    shape: KernelShape, t: Tiling, sms: int, rate: float = 1.0
) -> tuple[int, int, float] | None:
    """(T, S, cost): the last, partial round of a persistent GEMM's tiles as partial
    products of S chunks of K, and what that costs as a fraction of a round; or None.

    A persistent GEMM takes as long as its rounds: 3002x5014 @ 5014x5714 makes 552
    tiles of 128x256, four rounds of 132 SMs and a fifth of 24 tiles, a fifth of its
    time for 108 idle SMs. A lone program's K step takes about as long whatever its
    tile, so smaller tiles do not shorten that round; shorter K loops do (CUTLASS's
    stream-K). Here the T = 24 tiles' K loops run in S chunks, one program each (S T
    programs, one round of them), each storing an f32 partial tile; a second kernel
    sums a tile's S partials and runs the epilogue. The split pays where a chunk, the
    partials' bytes (`TAIL_BYTES_PER_STEP`) and the two launches cost under
    `TAIL_GAIN` of the round they replace: a tile's K loop and its epilogue
    (`EPILOGUE_K`), at the tile's `rate` (against 128x256's, whose K steps the bytes
    and launches are counted in).

    Only 128x256 tiles are split. Their K step is the tensor cores' work, and a last
    round of few of them took as long as a full one (3002x5014 @ 5014x5714 f16 on an
    H200: 58.7 us against 63). A full round of 128x128 tiles waits on L2 instead
    (half the products a byte), and a last round of few of them ran twice as fast
    as a full one (2339x6257 @ 6257x1097 bf16: 23.4 us against 47.3), so its split
    (39 tiles in 3 chunks) saved nothing: 102.6 us against 100.5."""
    bm, bn, bk = t.block
    widest = TENSOR_CORE_TILES[0]
    if not t.persistent or not shape.half or len(shape.parallel) != 2:
        return None
    if shape.contractions != 1:
        return None  # the partials are one contraction's
    if (bm, bn) != (widest.bm, widest.bn):
        return None  # a partial round of smaller tiles runs faster than a full one
    (m, n), (k,) = shape.parallel, shape.reduction
    tiles = -(-m // bm) * -(-n // bn)
    tail = tiles % sms
    steps = -(-k // bk)
    splits = min(sms // tail if tail else 0, steps // TAIL_MIN_STEPS)
    if splits < 2:
        return None
    chunk = -(-steps // splits)
    splits = -(-steps // chunk)  # no empty chunk
    extra = max(0, shape.epilogue_bytes - 2)
    epilogue = (shape.transcendentals * EPILOGUE_K + extra * EPILOGUE_BYTE_K) / bk
    step = bm * bn * bk / (128 * 256 * 64) / rate  # a K step, in 128x256x64 steps
    round_steps = (steps + epilogue) * step
    partials = tail * splits * bm * bn * 4 * 2  # f32, written and read
    cost = (chunk + TAIL_PROGRAM_STEPS) * step + partials / TAIL_BYTES_PER_STEP + TAIL_LAUNCH_STEPS
    return (tail, splits, cost / round_steps) if cost <= TAIL_GAIN * round_steps else None


REFERENCE_BYTES = 8
"""Loaded bytes an element of the kernel the targets' element-wise options were
measured on (pw5, mul-add-relu: two f32 operands; irc/target.py)."""
VECTOR_BYTES = 16
"""The widest access of one thread (ld.global.v4.b32)."""
COMPUTE_BOUND_PER_BYTE = 0.5
"""Transcendental functions a loaded byte from which an element-wise kernel's time
goes to its arithmetic: a cos of a cos of f32 or ten tanh ran 1-5% faster on an H100
with twice the elements a thread (independent work between the loads)."""


def pointwise_tiling(shape: KernelShape, block: int, thread_elements: int) -> Tiling:
    """Element-wise programs that keep the loads in flight the target asks for.

    `block` and `thread_elements` are the target's tiling of a kernel that loads
    `REFERENCE_BYTES` an element; its warps stay, and a thread takes as many
    elements as keep the same loaded bytes in flight (an H100: two f32 operands 2
    elements a thread, one f32 operand 4, one bf16 operand 8: 16-byte vectors,
    where 2 bf16 a thread ran a permute 1.32x slower), twice as many in a kernel
    whose time goes to arithmetic, at most two 16-byte vectors an access (and 8
    elements where each computes a few functions, `SEVERAL_FUNCTIONS_THREAD_ELEMENTS`),
    and half as many where each element's chain of functions is long (`LONG_CHAIN`).
    The element count need not be a multiple of the vector width: tile-to-triton
    peels the last program of such a kernel (`partial_last_program`), whose mask
    would make Triton split every program's accesses into the widths the count
    allows. Without the peel, 8 scalar accesses a thread were up to twice as slow
    as 4; with it, 8 f32 of an odd count (two 16-byte vectors) were 11% faster than
    4 masked scalars on an H200 (cos -> reshape -> cos times a row, 5755 x 7611:
    111.2 us against 125.8, torch.compile 119.3; bf16 7001 x 5003: 89.6 against
    101.9, torch.compile 94.1).
    """
    n = numel(shape.parallel)
    warps = max(1, block // (32 * thread_elements))
    loaded = max(shape.loaded_bytes, shape.element_bytes)
    e = floor_pow2(max(1, thread_elements * REFERENCE_BYTES // loaded))
    if shape.transcendentals >= COMPUTE_BOUND_PER_BYTE * loaded:
        e *= 2
    e = min(e, max(1, 2 * VECTOR_BYTES // shape.element_bytes))
    if 1 < shape.streamed_transcendentals < LONG_CHAIN:
        e = min(e, SEVERAL_FUNCTIONS_THREAD_ELEMENTS)
    x = min(32 * warps * e, next_pow2(n))
    if shape.transcendentals >= LONG_CHAIN:
        e = max(1, e // 2)
    return Tiling((x,), _warps(x, e, most=32))


SEVERAL_FUNCTIONS_THREAD_ELEMENTS = 8
"""Elements a thread of an element-wise program takes at most where each computes 2
or 3 transcendental functions of the streamed elements (below `LONG_CHAIN`, whose
halving gives bf16 chains 8 a thread too): 8 bf16 elements rather than 16; f32
stays at its two 16-byte vectors, 8. Measured on an H100 (bf16, 1024 elements and
4 warps against 2048): sin(x) * cos(x) 140.4 us against 173.1 at 8192 x 8192 (45.4
against 56.9 at 4096 x 5120), cos(cos(x)) 139.5 against 143.3, cos -> reshape ->
cos times a row vector 188.3 against 207.5 at 11184 x 6515; f16 cos(cos(x)) 137.6
against 142.0. One function an element wants the 16 (GELU 94.6 against 101.5, cos
90.2 against 94.3). Functions of broadcast operands alone do not count: batch
norm's normalization (two divisions and an rsqrt of column statistics an element)
ran 21.4 us at 16 bf16 elements a thread and 23.6 at 4 (16384 x 1000)."""


LONG_CHAIN = 4
"""Transcendental functions an element from which an element-wise program takes
twice the warps for its elements (half the elements a thread): the chain of each
element is long, and more warps hide its latency where a thread's independent
elements no longer do. Ten tanh an element (chain20, libdevice's tanh) ran 12%
faster at 1024 elements and 8 warps than at 4 on an H200; sincos, pw5, an exp
and sigmoid (two) and bf16 GELU (one) were as fast or faster with 4.
"""


def floor_pow2(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


TRANSPOSE_TILE = 64
"""Sides of a transposing element-wise program's 2-d tile: 64 elements of each
access's contiguous dim, 256 bytes of f32 (two full 128-byte lines), whatever
the dim it runs along."""


TRANSPOSE_THREAD_ELEMENTS = 16
"""Elements a thread of a transposing program takes: two 16-byte vectors of bf16
an access, four of f32."""

TRANSCENDENTAL_THREAD_ADDRESSES = 24
"""Addresses a thread of a transposing program holds at most, over its full-size
accesses (one a vector, `access_vectors`), where its elements compute transcendental
functions: with more, half the elements a thread (twice the warps). An access whose
rows do not start 16 bytes apart takes an address an element, each a 64-bit
register pair; at 16 elements a thread, three such accesses took 66-76 registers, so
an SM held 24-32 warps, too few to hide the function's latency (a plain product
held 32 and ran as fast at either count). H200, `tanh(x.transpose(1, 2) * y)`,
16 elements and 8 warps against 8 and 16 on 64x64 tiles: bf16 64x1111x777 172.9 ->
132.4 us (torch.compile 121.8), 7x2049x4097 184.6 -> 138.5; f32 5x3001x2999 150.8
-> 145.2, 66x1041x536 (two such accesses) 124.1 -> 119.2. With 16-byte vectors the
16 elements stay: bf16 64x1024x768 77.0 against 95.9 at 8, 3x4096x3001 (one
access of odd rows: 20 addresses) 62.1 against 78.3."""


def transpose_tiling(shape: KernelShape) -> Tiling:
    """An element-wise kernel with a transposed access: a 2-d tile over the dim
    that access is contiguous along (block axis 0) and the last dim (axis 1).
    Each load is then vectorized along its own contiguous axis (Triton gives each
    its layout and converts through shared memory), and stores along the last.
    A thread takes `TRANSPOSE_THREAD_ELEMENTS`, or half as many where they would
    hold more addresses than `TRANSCENDENTAL_THREAD_ADDRESSES` for the functions."""
    a = min(TRANSPOSE_TILE, next_pow2(shape.parallel[shape.across]))
    b = min(TRANSPOSE_TILE, next_pow2(shape.parallel[-1]))
    e = TRANSPOSE_THREAD_ELEMENTS
    addresses = sum(max(1, e // v) for v in shape.access_vectors)
    if shape.transcendentals and addresses > TRANSCENDENTAL_THREAD_ADDRESSES:
        e //= 2
    return Tiling((a, b), max(1, a * b // (32 * e)))




def gemm_shared_bytes(
    bm: int,
    bn: int,
    bk: int,
    stages: int,
    operand_bytes: int,
    epilogue_bytes: int = 2,
    tiles: tuple[int, int] = (1, 1),
) -> int:
    """Shared memory of a pipelined GEMM program: `stages` copies of its A and B
    tiles as loaded (`tiles` of each: `KernelShape.operand_tiles`), and
    `epilogue_bytes` an output element for the tiles its epilogue stages
    (KernelShape.epilogue_bytes). Measured by Triton on an H100: a SwiGLU's
    `silu(a) * (x @ w)` (a bf16 output, a bf16 operand: 4 bytes) needed 240 KB at
    128x256 tiles and K steps of 64; a Llama block's `h + a @ wo` that also stores
    `float(h)**2` (bf16 and f32 outputs, a bf16 operand: 8 bytes) needed 262,144
    bytes at 128x128, 4 stages, K steps of 64, exactly this sum; on an H200 three
    stages of six f32 tiles (TF32 parts with finite heads stored too, 128x128x32)
    needed 294,912 bytes, and did not fit."""
    a_tiles, b_tiles = tiles
    loaded = (bm * bk * a_tiles + bk * bn * b_tiles) * operand_bytes
    return stages * loaded + bm * bn * epilogue_bytes


def gemm_fits(t: Tiling, shape: KernelShape, shared_bytes: int) -> bool:
    """Whether a tensor-core GEMM tiling fits a program's shared memory: a persistent
    program holds its K loop's buffers and its epilogue's tiles at once (the next
    tile's loads are in flight during the epilogue), a program a tile one after the
    other (the loop's buffers are free by its epilogue). A persistent program's TMA
    stores stage one column slice of the tile at a time (`tile.block_store`), and
    outputs stored by address narrower than 16 bytes one epilogue part at a time
    (`KernelShape.narrow_stores`: 16,416 bytes of a 128x256 bf16 tile in quarters
    as Triton allocated them); other epilogue tiles are staged whole."""
    bm, bn, bk = t.block
    loop_bytes = gemm_shared_bytes(
        bm, bn, bk, t.stages, shape.element_bytes, 0, shape.operand_tiles
    )
    # TMA stores stage a column slice at a time, narrow outputs one epilogue part
    tma = shape.tma_stored_bytes if t.persistent else 0
    narrow = sum(size for size, _ in shape.narrow_stores)
    whole = max(0, shape.epilogue_bytes - tma - narrow)
    parts = epilogue_parts(t, shape)
    staged = whole + tma / BLOCK_STORE_PARTS + narrow / parts  # bytes an output element
    epilogue = math.ceil(bm * bn * staged)
    need = loop_bytes + epilogue if t.persistent else max(loop_bytes, epilogue)
    return need <= shared_bytes


LINE_BYTES = 128
"""The narrowest run of a row a column reduction's program reads side by side: one
full 128-byte line (8 threads of 16 bytes), so every sector a load touches is used."""
COLUMN_ROW_BYTES = 256
"""The run of each row a column reduction's program reads side by side where the kept
dim is that wide: two lines. In a sweep of split-stage tilings on an H200 the
fastest were this wide (7608 x 11982 f32: 64 x 32 in 101 us, the best of 32 columns
105; 39 x 980 x 1173 bf16: 128 x 8 in 37.6 us, the best of 32 columns 41.5; a 768-
column f32 sum was as fast either way)."""
COLUMN_RUN_ELEMENTS = 128
"""Kept elements a column program reads side by side where its tiles, that wide, still
give every SM half of `COLUMN_PROGRAMS_PER_SM`: wider than `COLUMN_ROW_BYTES` for
4-byte elements (512 bytes), the same for 2-byte ones, and at most
`COLUMN_RUN_BYTES`. The chunks of a split are still counted on `COLUMN_ROW_BYTES`
tiles; their split stage then runs half as many programs, each reading runs twice
as long. f32 on an H200, this rule against 256 bytes (torch.compile in brackets),
us: column sums 9586 x 12387 140.5 against 183.7 (149.0), 6801 x 7852 64.0 / 72.0
(84.5), 8192 x 8192 74.9 / 81.6 (76.8), 12000 x 5001 77.9 / 94.1 (79.8), 4754 x
10222 58.9 / 67.1 (63.6), 30011 x 700 31.7 / 34.0 (54.7), 3682 x 3810 23.3 / 24.2;
row and column sums of 8192 x 8192 137.3 / 144.9 (142.7); leading, middle and
batch-norm reductions within 2% either way. Slower: 64 x 262144, unsplit, 25.2
against 23.9 (32.3). bf16 tiles of 256 elements were slower on three of four split
column sums (8192 x 8192 50.1 against 49.2, 9000 x 7001 54.3 / 52.0, 3000 x 12000
36.4 / 32.3; 6001 x 3001 24.4 / 32.7), and counting the chunks on the wider tiles
too (more chunks) lost the f32 gain (9586 x 12387: 170.8)."""
COLUMN_RUN_BYTES = 512
"""The most bytes of a row `COLUMN_RUN_ELEMENTS` makes a column program read side by
side (64 f64: wider was not measured)."""
COLUMN_THREAD_BYTES = 32
"""Bytes a thread of a column reduction loads a step: two 16-byte vectors."""
COLUMN_WARPS = 4
"""Warps of a column reduction's program: small programs, so that many are resident
and few registers hold a step (4 KB a step: 16 rows of 256 bytes)."""
IN_FLIGHT_BYTES = 65536
"""Loads an SM keeps outstanding to hide DRAM latency: an SM's share of the
bandwidth (25 GB/s on an H100, 36 on an H200) times a loaded round trip
(about 2 us) is 50-70 KB."""
COLUMN_PROGRAMS_PER_SM = IN_FLIGHT_BYTES // (COLUMN_WARPS * 32 * COLUMN_THREAD_BYTES)
"""Programs an SM gets from a column reduction (16: 64 warps, an SM's most): each holds
a 4 KB step in flight, `IN_FLIGHT_BYTES` between them. Fewer kept tiles than this
times the SMs call for a split. The split stages of three column sums (H200) ran
1.2-1.8x faster with 1100-2300 small programs than with the 4 programs an SM of 8
warps and 8 KB steps taken before, whose registers let too few be resident."""
COLUMN_MIN_STEPS = 4
"""Steps a split column reduction's program takes at least, which its start and its
store of partials cost little beside."""
ONE_STEP_ELEMENTS = 8192
"""The most elements a column reduction's program holds in one step when that
saves a loop: 32 f32 accumulators a thread of 8 warps."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def column_width(shape: KernelShape, sms: int) -> int:
    """Kept elements a column reduction's program reads side by side.

    `COLUMN_ROW_BYTES` of the contiguous kept dim where its tiles give every SM
    `COLUMN_PROGRAMS_PER_SM` programs and pad the kept dim by at most an eighth
    more lanes than one 128-byte line's (129 f32 columns: 3 tiles of 64 waste 63
    lanes, 5 tiles of 32 waste 31), and `COLUMN_RUN_ELEMENTS` where those are wider
    and still give half as many; otherwise one full line, which makes the most
    tiles (a split's chunks are counted on those); the kept dim itself where it is
    narrower."""
    columns = shape.columns
    wide, line = column_widths(shape)
    want = COLUMN_PROGRAMS_PER_SM * sms

    def snug(x: int) -> bool:  # pads the kept dim by at most an eighth more than a line
        return 8 * _cdiv(columns, x) * x <= 9 * _cdiv(columns, line) * line

    if column_programs(shape, wide) < want or not snug(wide):
        return line
    run = min(COLUMN_RUN_ELEMENTS, kept_width(shape, COLUMN_RUN_BYTES))
    if run > wide and 2 * column_programs(shape, run) >= want and snug(run):
        return run
    return wide


def column_widths(shape: KernelShape) -> tuple[int, int]:
    """The two widths a column reduction's tiles take: `COLUMN_ROW_BYTES` and one
    128-byte line of the kept dim, in elements (the kept dim where it is narrower)."""
    return kept_width(shape, COLUMN_ROW_BYTES), kept_width(shape, LINE_BYTES)


def kept_width(shape: KernelShape, row_bytes: int) -> int:
    """Kept elements in `row_bytes` of a column reduction's row (the kept dim where
    it is narrower)."""
    return min(next_pow2(shape.columns), max(1, row_bytes // shape.element_bytes))


def column_step_rows(x: int, element_bytes: int, warps: int = COLUMN_WARPS) -> int:
    """Rows a column program of `warps` takes a step, `COLUMN_THREAD_BYTES` a thread."""
    return max(1, warps * 32 * COLUMN_THREAD_BYTES // (x * element_bytes))


def column_programs(shape: KernelShape, x: int) -> int:
    """Programs of a column reduction whose tiles are `x` kept elements wide."""
    return _cdiv(shape.columns, x) * (numel(shape.parallel) // shape.columns)


def column_tiling(shape: KernelShape, sms: int = 132) -> Tiling:
    """A column reduction: `x` kept elements side by side along the contiguous dim
    (block axis 0, `column_width`), `r` rows of the strided reduced dims a step
    (block axis 1), summed across axis 1 at the end. Loads are coalesced along axis
    0; the loop walks the reduced dim `r` rows at a time.

    A step is `COLUMN_THREAD_BYTES` a thread of `COLUMN_WARPS` warps (4 KB) where
    the programs fill the GPU; where they fill at most half of it (a split capped
    in chunks, a narrow kept dim), 8 warps (8 KB), so that an SM keeps more loads
    outstanding (16 KB steps were 11-15% slower than 8 KB on two such bf16 batch-norm
    statistics on an H200). A kernel whose programs fill at most half the GPU
    takes all its rows in one step, with no loop, where that holds at most
    `ONE_STEP_ELEMENTS` (the second stage of a split reduction sums a few hundred
    partials: one round trip, not a loop of them on few SMs)."""
    x = column_width(shape, sms)
    rows = next_pow2(numel(shape.reduction))
    want = COLUMN_PROGRAMS_PER_SM * sms
    programs = column_programs(shape, x)
    warps = COLUMN_WARPS * (2 if 2 * programs <= want else 1)
    r = column_step_rows(x, shape.element_bytes, warps)
    if rows <= r or (x * rows <= ONE_STEP_ELEMENTS and 2 * programs < want):
        return Tiling((x, rows), _warps(x * rows, 8))
    held = held_column_lanes(shape, sms)
    if held:
        return Tiling((held, rows), held_warps(held * rows * shape.element_bytes))
    if shape.epilogue:
        warps = reread_warps(shape, x, programs, warps, sms)
        r = min(rows, column_step_rows(x, shape.element_bytes, warps))
    return Tiling((x, r), warps)


SECTOR_BYTES = 32
"""The unit DRAM and L2 move: a narrower run of a row would waste part of each."""


def held_column_lanes(shape: KernelShape, sms: int) -> int:
    """Kept elements side by side of a column reduction whose epilogue reads its rows
    again (`row_reads`: not a split's final kernel, whose rows are not the ones it
    reduced) and whose whole reduced dim fits in one program's registers
    (`held_elements`): as wide as that allows up to `column_width`, where the
    programs still give every SM `HELD_COLUMN_PROGRAMS_PER_SM` of them and a row's
    run is at least two `SECTOR_BYTES` sectors, or one where the tensor fits in L2
    (0 otherwise). The rows are read once, held, and the epilogue stores from
    registers: no second pass over them, as Inductor's persistent reductions.
    `split-reduction` leaves such a kernel whole. On an H200: permutes centered
    over their leading dim, 512 x 1024 x 96 and 427 x 763 x 125 f32 (32 lanes)
    129.2 -> 112.0 and 199.6 -> 151.2 us held, against 16 lanes at 8 warps; 413 x
    520 x 145 bf16 52.8 held, 84.6 split; softmax over the middle dim of 45 x 721 x
    199 f32 (8 lanes of 1024 rows, in L2) 34.2 held, 42.8 split. One sector a row of
    a tensor past L2 lost: to the split (813 x 1206 x 148 bf16, 323.7 against
    255.5) and to reading the rows again in steps (600 x 1024 x 160 bf16, 142.3
    against 121.9)."""
    if not shape.columns or not shape.epilogue or shape.row_reads < 2:
        return 0  # (a split's final kernel loops over rows it reduced none of)
    rows = next_pow2(numel(shape.reduction))
    tensor = numel(shape.parallel) * numel(shape.reduction) * shape.element_bytes
    sectors = 1 if tensor <= L2_BYTES else 2
    run = max(1, sectors * SECTOR_BYTES // shape.element_bytes)
    x = min(column_width(shape, sms), held_elements(shape) // rows)
    if x < run or column_programs(shape, x) < HELD_COLUMN_PROGRAMS_PER_SM * sms:
        return 0
    return x


HELD_COLUMN_PROGRAMS_PER_SM = 4
"""Programs an SM should get from a column reduction that holds its rows."""

HELD_VALUES = 16384
"""Values a column program holds at most (`held_column_lanes`), 32 a thread of
`HELD_MOST_WARPS`: every pass over the rows but the epilogue keeps one an element
live until the epilogue (a centered sum the rows; a softmax the rows and their
exponentials)."""


def held_elements(shape: KernelShape) -> int:
    """Elements of rows a column program may hold (`HELD_VALUES` over the values
    each keeps)."""
    return HELD_VALUES // max(1, shape.row_reads - 1)


HELD_THREAD_BYTES = 64
"""Bytes of rows a thread of a held column program loads: four 16-byte vectors."""
HELD_MOST_WARPS = 16
"""The most warps of a held column program (4 resident an SM)."""


def held_warps(held_bytes: int) -> int:
    """Warps of a program holding `held_bytes` of rows read again: `HELD_THREAD_BYTES`
    a thread, up to `HELD_MOST_WARPS`. H200, softmaxes over the middle dim held at
    8192 elements: f32 16 x 512 tiles 75.2 -> 62.6 us at 16 warps rather than 8
    (12 x 308 x 5154), 8 x 1024 41.6 -> 34.2 (45 x 721 x 199); bf16 16 x 512 at 8
    warps 40.1 against 64.1 at 16 (16 x 333 x 4096): the same vectors a thread."""
    return _warps(held_bytes, HELD_THREAD_BYTES, most=HELD_MOST_WARPS)


SM_WARPS = 64
"""Warps an SM holds resident (an H100's or H200's most)."""
REREAD_MOST_WARPS = 16
"""The most warps `reread_warps` gives a column program (4 resident an SM)."""


def resident_bytes(shape: KernelShape, x: int, programs: int, warps: int, sms: int) -> int:
    """Bytes the resident programs of a column reduction `x` kept elements wide read
    (each its whole reduced dim), `SM_WARPS` // `warps` of them an SM."""
    resident = min(programs, SM_WARPS // warps * sms)
    return resident * x * numel(shape.reduction) * shape.element_bytes


def reread_warps(shape: KernelShape, x: int, programs: int, warps: int, sms: int) -> int:
    """Warps of a column program whose epilogue reads its rows again: the fewest, from
    `warps` doubling up to `REREAD_MOST_WARPS`, with which what the resident programs
    read fits in L2 (`L2_BYTES`), so that the second pass finds it there; `warps`
    where none does. A program's step grows with its warps, so an SM keeps the
    same bytes in flight in fewer, larger programs. A permute centered over its
    leading dim (512 x 1024 x 96 f32: 64 KB a program, 138 MB resident at 4 warps)
    took 131 us at 16 warps on an H200 against 155 at 4 (144.5 at 8; torch.compile
    123), before `held_column_lanes` held those rows; where the rows fit at the
    warps taken, more were slower (a bf16 softmax over dim 1 of 16 x 333 x 4096, 8
    warps: 59.7 us at 16 against 48.0)."""
    w = warps
    while w <= REREAD_MOST_WARPS:
        if resident_bytes(shape, x, programs, w, sms) <= L2_BYTES:
            return w
        w *= 2
    return warps


SHARED_STEP_ELEMENTS = 4096
"""Elements a program of rows sharing an operand holds a step (16 x 256 at 8 warps
was the fastest of 40 tilings of a 4096 x 8 f32 neighbor on an H100)."""
SHARED_ROWS = 16
"""Most rows a program of a reduction with shared loads (`KernelShape.shared_bytes`)
holds: its shared elements come from L2 once for all of them."""
SHARED_ROWS_COMPUTING = 4
"""Most rows a program holds when its reduced elements also compute a transcendental
function: the shared operand's L2 reads then hide under that math, and more,
smaller programs balance the SMs (3350 rows: 838 programs instead of 210 for 132
SMs). cos(a_i * b_j) summed over either dim on an H100, four shapes in bf16 and
f32 whose rows are 1614-8769 long: 4 rows 24.7-143.0 us, 8 rows 25.6-145.1, 16 rows
31.1-157.8. Rows of `SHARED_STEP_ELEMENTS` / 8 or fewer (not measured) take as many
as still fill a step, up to `SHARED_ROWS`, so that a program is not a few dozen
elements (7-long rows: 16 rows of 8, as before, not 4)."""


def shared_rows_tiling(shape: KernelShape, sms: int) -> Tiling:
    """Rows that read a shared operand: up to `SHARED_ROWS` rows a program
    (`SHARED_ROWS_COMPUTING` where the elements compute a function and the rows are
    long enough that those fill a step), as many as
    leave a program for every SM, each step a chunk of the reduction that keeps
    `SHARED_STEP_ELEMENTS` in flight. Every row reading the whole shared operand
    from L2 is what bounds a kernel of cheap elements (4096 rows of a 4096 x 8 f32
    neighbor: 512 MiB of L2 reads at one row a program, 32 MiB at sixteen)."""
    rows, r = numel(shape.parallel), numel(shape.reduction)
    most = SHARED_ROWS
    if shape.transcendentals:  # rows of 512 or fewer still fill a step
        most = max(SHARED_ROWS_COMPUTING, min(SHARED_ROWS, SHARED_STEP_ELEMENTS // next_pow2(r)))
    x = min(most, next_pow2(rows))
    while x > 1 and -(-rows // x) < sms:
        x //= 2
    rb = min(next_pow2(r), max(1, SHARED_STEP_ELEMENTS // x))
    return Tiling((x, rb), _warps(x * rb, 16))


def programs(shape: KernelShape, t: Tiling) -> int:
    """Programs a reduction kernel launches with tiling `t` (see loop-to-tile's layouts)."""
    if shape.columns:
        inner = shape.columns
        return -(-inner // t.block[0]) * (numel(shape.parallel) // inner)
    return -(-numel(shape.parallel) // t.block[0])


def tiling_of(kernel: loop.KernelOp) -> Tiling:
    """The kernel's recorded tiling, or the default heuristic's choice."""
    if kernel.block is not None:
        warps = kernel.warps.value.data if kernel.warps is not None else 4
        stages = kernel.stages.value.data if kernel.stages is not None else 1
        # Flags are present or not (`= 1` or `= true`, which xDSL keeps as -1).
        persistent, unrolled = kernel.persistent is not None, kernel.unrolled is not None
        block = tuple(loop.int_list(kernel.block))
        tail = None
        if kernel.tail is not None:
            tiles, splits = loop.int_list(kernel.tail)
            tail = (tiles, splits)
        nested = kernel.nested is not None
        return Tiling(block, warps, stages, persistent, unrolled, tail, nested)
    return choose_tiling(kernel_shape(kernel))


@dataclass(frozen=True)
class TilePass(ModulePass):
    """`tile{block=1024 rblock=8192 persistent-rblock=32768 unrolled-rblock=59392
    thread-elements=8 epilogue-warps=8 sms=132 shared-bytes=232448}`."""

    name = "tile"
    levels = ("loop",)

    block: int = 1024
    rblock: int = LONG_ROW_CHUNK
    persistent_rblock: int = PERSISTENT_ROW_ELEMENTS
    unrolled_rblock: int = UNROLLED_ROW_ELEMENTS
    """Most elements of a longer row held in registers as unrolled chunks (where an
    epilogue reads it again: `unrolled_row_tiling`); 0 streams every such row."""
    thread_elements: int = 8
    epilogue_warps: int = 8
    sms: int = 132
    """The GPU's SM count (`irc.target` sets it): SMs the output tiles of a contraction
    are shared among (`gemm_tiling`), that column reductions' tiles fill, and that
    the rows sharing an operand fill (`shared_rows_tiling`)."""
    shared_bytes: int = SHARED_BYTES
    """Shared memory a program may use (`irc.target` reads the GPU's): it bounds the
    tiles and stages of GEMMs (`gemm_tiling`) and attentions (`attention_tiling`)."""

    def __post_init__(self) -> None:
        """Block sizes are Triton blocks: powers of two, at most its largest."""
        for key in ("block", "rblock", "persistent_rblock", "thread_elements"):
            check_option(
                "tile", key, getattr(self, key), 1, MAX_BLOCK, power_of_two=True,
                why="Triton's largest block",
            )  # fmt: skip
        check_option(
            "tile", "epilogue_warps", self.epilogue_warps, 1, MAX_WARPS, power_of_two=True,
            why="1024 threads a program",
        )  # fmt: skip
        check_option("tile", "sms", self.sms, 1, 1 << 16)
        check_option("tile", "unrolled_rblock", self.unrolled_rblock, 0, MAX_BLOCK)
        check_option("tile", "shared_bytes", self.shared_bytes, 16 * 1024)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in op.walk():
            if not isinstance(kernel, loop.KernelOp):
                continue
            t = choose_tiling(
                kernel_shape(kernel),
                self.block,
                self.rblock,
                self.persistent_rblock,
                self.thread_elements,
                self.epilogue_warps,
                self.sms,
                self.shared_bytes,
                self.unrolled_rblock,
            )
            set_tiling(kernel, t)


def set_tiling(kernel: loop.KernelOp, t: Tiling) -> None:
    """Writes a tiling on a kernel, where the IR shows it."""
    kernel.block = int_array(t.block)
    kernel.warps = IntegerAttr(t.warps, i64)
    kernel.stages = IntegerAttr(t.stages, i64)
    kernel.persistent = IntegerAttr(1, i64) if t.persistent else None
    kernel.unrolled = IntegerAttr(1, i64) if t.unrolled else None
    kernel.nested = IntegerAttr(1, i64) if t.nested else None
    kernel.tail = int_array(t.tail) if t.tail is not None and t.persistent else None
