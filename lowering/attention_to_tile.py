"""loop -> tile for an attention kernel: the FlashAttention-2 schedule.

The loop nest graph-to-loop made (`lowering/attention_to_loop.py`) is

    %m, %l = loop.softmax_reduce (%j) { scores(b, i, j) }
    %acc = loop.reduce contract (%j) { exp(scores(b, i, j) - %m) * v[b, j, e] }
    ... %acc / %l ... stored at (b, i, e)

Each program takes BM rows `i` of one batch entry `b` (grid axes 0 and 1) and
every `e` (the value dim in one block). One `tile.for` walks the keys `j` in
tiles of BN and carries the running max `m`, the running sum `l` and the f32
accumulator: the scores of a tile are one dot of the resident Q rows with a
K tile, the element-wise work on them is translated as any fused body is (a
bias or mask is loaded at its (i, j) tile), a larger max rescales `l` and the
accumulator by exp(old - new), and the probabilities (in the values' type)
times the V tile are one more dot. The division by `l` is the epilogue's, after
the loop, with whatever element-wise work follows it, as the loop IR says.

The two copies of the scores in the loop IR (one in each loop) translate to
the same tile ops, which `tile-cse` shares: they are computed once a tile.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute, Block, SSAValue

from irc.dialects import loop, tile
from irc.ir.types import ELEMENT_TYPES, F32, HALF_TYPES, numel
from irc.passes.tile import next_pow2

if TYPE_CHECKING:
    from irc.lowering.loop_to_tile import KernelTranslator

I32 = ELEMENT_TYPES["i32"]
MINUS_INF = FloatAttr(-math.inf, f64)
MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second axis."""
ZERO = FloatAttr(0.0, f64)


def _parts(kernel: loop.KernelOp) -> tuple[loop.SoftmaxReduceOp, loop.ReduceOp]:
    softmax = values = None
    for op in kernel.body.block.ops:
        if isinstance(op, loop.SoftmaxReduceOp):
            softmax = op
        elif isinstance(op, loop.ReduceOp) and op.contract is not None:
            values = op
    assert softmax is not None and values is not None, "graph-to-loop's attention nest"
    return softmax, values


def _score_dots(block: Block) -> list[loop.ReduceOp]:
    """The contractions that make the scores in a loop body."""
    return [
        op for op in block.walk() if isinstance(op, loop.ReduceOp) and op.contract is not None
    ]


def _factors(op: loop.ReduceOp) -> tuple[SSAValue, SSAValue]:
    product = op.body.block.last_op.values[0].owner  # type: ignore[union-attr]
    assert isinstance(product, loop.ApplyOp) and product.fn.data == "mul"
    a, b = product.args
    return a, b


class AttentionLayout:
    """One program's rows and the key loop of an attention kernel."""

    def __init__(self, t: KernelTranslator):
        self.t = t
        self.softmax, self.values = _parts(t.kernel)
        self.bm, self.bn = t.tiling.block
        *self.batch, self.m, self.e = t.shape.parallel
        self.keys, self.head = t.shape.reduction
        # Tensor-core dots take at least 16 along every axis: narrower heads are padded
        # (and masked) to 16.
        self.be, self.bd = max(16, next_pow2(self.e)), max(16, next_pow2(self.head))
        self.element = self.values.result.type

    def build(self) -> None:
        t, bm, bn = self.t, self.bm, self.bn
        rows_iv = t.kernel.body.block.args[-2]
        offset = causal_offset(self.softmax, rows_iv)
        blocks = math.ceil(self.m / bm)
        if offset is not None and blocks <= MAX_GRID_Y:
            # Under a causal mask the last rows' programs see the most keys: they are
            # launched first (rows in reverse, every head of a row block together), so
            # the light programs fill the machine's last wave instead of the heavy ones.
            t.grid = [numel(self.batch), blocks]
            row_program = t.apply("sub", [t.const(blocks - 1, t.index), t.program_id(1)])
            batch_program = t.program_id(0)
        else:
            t.grid = [blocks, numel(self.batch)]
            row_program, batch_program = t.program_id(0), t.program_id(1)
        row_start = t.iapply("mul", row_program, bm)
        rows = t.expand(t.apply("add", [row_start, t.arange(bm)]), 1)
        cols = t.expand(t.arange(self.be), 0)
        self.row_mask = t.mask_below(rows, self.m, bm)
        self.col_mask = t.mask_below(cols, self.e, self.be)
        t.scopes[-1].axis_masks = [self.row_mask, self.col_mask]
        batch = t.unravel(batch_program, self.batch) if self.batch else []
        for iv, v in zip(t.kernel.body.block.args, [*batch, rows, cols], strict=True):
            t.bind(iv, v)
        kk = t.arange(self.bd)
        self.k_row, self.k_col = t.expand(kk, 0), t.expand(kk, 1)
        kmask = t.apply("lt", [kk, t.const(self.head, t.index)]) if self.head % self.bd else None
        self.kmask_row = None if kmask is None else t.expand(kmask, 0)
        self.kmask_col = None if kmask is None else t.expand(kmask, 1)
        # The Q rows stay resident: loaded once, before the key loop.
        self.queries: dict[loop.ReduceOp, SSAValue] = {}
        for dot in (*_score_dots(self.softmax.body.block), *_score_dots(self.values.body.block)):
            if dot is self.values:
                continue
            (kiv,) = dot.body.block.args
            with t.scope(axis_masks=[self.row_mask, self.kmask_row]):
                t.bind(kiv, self.k_row)
                q, element = _narrow(_factors(dot)[0], dot.result.type)
                self.queries[dot] = t.dot_operand(q, (bm, self.bd), element)
        carried = [
            t.full(MINUS_INF, F32, (bm, 1)),
            t.full(ZERO, F32, (bm, 1)),
            t.full(ZERO, F32, (bm, self.be)),
        ]
        # Two stages, as FlashAttention-2 runs them: the key tiles no mask touches
        # (whole tiles inside the keys, below every row's diagonal) without masks,
        # then the rest (the diagonal tiles, the ragged last tile) with them.
        whole = self.keys - self.keys % bn
        self.causal_masks: list[loop.ApplyOp] = []
        if offset is None:
            if whole:
                carried = self.key_loop(carried, whole, masked=False)
            if whole < self.keys:
                carried = self.key_loop(carried, self.keys, masked=True, lb=whole)
        else:
            self.causal_masks = causal_wheres(self.softmax, self.values, rows_iv, offset)
            # Keys past row + offset are masked for every row: the tiles of keys past
            # the program's last row + offset are not visited.
            stop = t.iapply("add", row_start, bm + offset)
            if whole and self.causal_masks:
                # Tile [j0, j0 + bn) is below every row's diagonal when
                # j0 + bn <= row_start + offset + 1.
                seen = t.iapply("add", row_start, offset + 1)
                seen = t.apply("maximum", [seen, t.const(0, t.index)])
                diagonal = t.iapply("mul", t.iapply("floordiv", seen, bn), bn)
                split = t.apply("minimum", [diagonal, t.const(whole, t.index)])
                carried = self.key_loop(carried, whole, masked=False, stop=split)
                carried = self.key_loop(carried, self.keys, masked=True, start=split, stop=stop)
            else:
                carried = self.key_loop(carried, self.keys, masked=True, stop=stop)
        m, total, acc = carried
        t.bind(self.softmax.maximum, m)
        t.bind(self.softmax.sum_exp, total)
        t.bind(self.values.result, acc)

    def key_loop(
        self,
        carried: list[SSAValue],
        ub: int,
        masked: bool,
        lb: int = 0,
        start: SSAValue | None = None,
        stop: SSAValue | None = None,
    ) -> list[SSAValue]:
        """One stage of the key loop, from `lb` (or `start`) to `ub` (or `stop`)."""
        t = self.t
        block = Block(arg_types=[I32, *(v.type for v in carried)])
        with t.scope(block=block):
            new = self.key_tile(block, masked)
            t.add(tile.YieldOp.create(operands=new))
        bounds = [tile.ForStartOp.create(operands=[start])] if start is not None else []
        if stop is not None:
            bounds.append(tile.ForStopOp.create(operands=[stop]))
        for op in reversed(bounds):
            first = block.first_op
            assert first is not None
            block.insert_op_before(op, first)
        return t.for_loop(block, carried, ub, self.bn, lb)

    def key_tile(self, block: Block, masked: bool) -> list[SSAValue]:
        """One step of the key loop: scores, running max and sum, accumulator.
        Unmasked, the tile lies inside the keys and below the causal diagonal: it
        neither masks the keys past the end nor applies the causal `where`."""
        t, bn = self.t, self.bn
        m_old, l_old, acc_old = block.args[1:]
        jj = t.apply("add", [t.arange(bn), t.loop_index(block)])
        ragged = masked and self.keys % bn
        jmask = t.apply("lt", [jj, t.const(self.keys, t.index)]) if ragged else None
        j_row, j_col = t.expand(jj, 0), t.expand(jj, 1)
        jmask_row = None if jmask is None else t.expand(jmask, 0)
        jmask_col = None if jmask is None else t.expand(jmask, 1)
        t.scopes[-1].axis_masks = [self.row_mask, jmask_row]

        (j_softmax,) = self.softmax.body.block.args
        t.bind(j_softmax, j_row)
        self.bind_scores(self.softmax.body.block, j_row, jmask_row, masked)
        x = self.tile_of(self.softmax.body.block.last_op.values[0])  # type: ignore[union-attr]
        if jmask_row is not None:
            x = t.apply("where", [jmask_row, x, t.const_attr(MINUS_INF, F32)])
        m_new = t.apply("maximum", [m_old, self.row_reduce("max", x)])
        # exp(-inf - -inf) is NaN: a row that has seen only -inf measures from 0.
        empty = t.apply("eq", [m_new, t.const_attr(MINUS_INF, F32)])
        base = t.apply("where", [empty, t.const(0.0, F32), m_new])
        alpha = t.apply("exp", [t.apply("sub", [m_old, base])])

        # The probabilities: the loop IR's exp(scores - m), with the running max.
        t.bind(self.softmax.maximum, base)
        (j_values,) = self.values.body.block.args
        t.bind(j_values, j_row)
        self.bind_scores(self.values.body.block, j_row, jmask_row, masked)
        p_value, v_value = _factors(self.values)
        p = self.tile_of(p_value)
        if jmask_row is not None:
            p = t.apply("where", [jmask_row, p, t.const(0.0, F32)])
        # The row sum is of the softmax's numerator exp(x - m) as the graph computes
        # it (in f32 for a graph.softmax of half values, rounded where the graph
        # rounds): the probabilities before their cast to the values' type.
        e = p
        numerator = p_value.owner
        if isinstance(numerator, loop.ApplyOp) and numerator.fn.data == "cast":
            e = self.tile_of(numerator.args[0])
            if jmask_row is not None:
                e = t.apply("where", [jmask_row, e, t.const(0.0, F32)])
        l_new = t.apply("add", [t.apply("mul", [l_old, alpha]), self.row_reduce("sum", e)])
        with t.scope(axis_masks=[jmask_col, self.col_mask]):
            t.bind(j_values, j_col)
            v = t.dot_operand(v_value, (bn, self.be), self.element)
        if self.element in HALF_TYPES:
            p = t.apply("cast", [p], self.element)
        acc = self.dot(p, v, t.apply("mul", [acc_old, alpha]))
        return [m_new, l_new, acc]

    def bind_scores(
        self, body: Block, j_row: SSAValue, jmask_row: SSAValue | None, masked: bool
    ) -> None:
        """Binds each score contraction in `body` to one dot of the Q rows and a K tile;
        unmasked, the causal `where` in `body` to the scores it keeps."""
        t = self.t
        for dot in _score_dots(body):
            if dot is self.values:
                continue
            (kiv,) = dot.body.block.args
            with t.scope(axis_masks=[self.kmask_col, jmask_row]):
                t.bind(kiv, self.k_col)
                k, element = _narrow(_factors(dot)[1], dot.result.type)
                k = t.dot_operand(k, (self.bd, self.bn), element)
            zero = t.full(ZERO, F32, (self.bm, self.bn))
            t.bind(dot.result, t.round_to(self.dot(self.queries[dot], k, zero), dot.result.type))
        if not masked:
            inside = set(body.walk())
            for where in self.causal_masks:
                if where in inside:
                    t.bind(where.result, t.value(where.args[1]))

    def tile_of(self, v: SSAValue) -> SSAValue:
        """`v` over the (rows, keys) tile, in f32."""
        t = self.t
        out = t.value(v)
        if out.type != F32 and getattr(out.type, "element_type", out.type) != F32:
            out = t.apply("cast", [out], F32)
        return t.broadcast_to(out, (self.bm, self.bn))

    def row_reduce(self, kind: str, x: SSAValue) -> SSAValue:
        t = self.t
        red = t.add(
            tile.ReduceOp.create(
                operands=[x],
                properties={"kind": StringAttr(kind), "axis": IntegerAttr(1, i64)},
                result_types=[_block(F32, (self.bm,))],
            )
        )
        return t.expand(red, 1)

    def dot(self, a: SSAValue, b: SSAValue, acc: SSAValue) -> SSAValue:
        element = getattr(a.type, "element_type", a.type)
        props = {}
        if element not in HALF_TYPES:
            # f32 products in full f32 as torch does by default; tf32 only when asked.
            props["precision"] = StringAttr("tf32" if self.t.tf32 else "ieee")
        return self.t.add(
            tile.DotOp.create(operands=[a, b, acc], properties=props, result_types=[acc.type])
        )


COMPARISONS = ("lt", "le", "gt", "ge")
INDEX_EXACT = 2**24
"""Indices below this are exact in f32 too (a float iota compares exactly)."""


def causal_offset(softmax: loop.SoftmaxReduceOp, row: SSAValue) -> int | None:
    """`off` such that the scores mask every key j > i + off of row i, if they do.

    The softmax's input must be `where(c, s, -inf)` (casts aside) with `c` a
    comparison of the row index and the key index, each plus a constant: what an
    iota-made causal mask (`i >= j`, `j <= i + 8`, ...) lowers to. None for any
    other scores (a mask tensor, a bias after the mask: nothing is skipped).
    """
    (key,) = softmax.body.block.args
    where = _uncast(softmax.body.block.last_op.values[0]).owner  # type: ignore[union-attr]
    return _mask_offset(where, row, key)


def causal_wheres(
    softmax: loop.SoftmaxReduceOp, values: loop.ReduceOp, row: SSAValue, offset: int
) -> list[loop.ApplyOp]:
    """The `where`s that apply the causal mask of `offset`, in the softmax's scores and
    in their copy in the values' loop; none unless both copies are found (then every
    tile keeps its mask)."""
    found: list[loop.ApplyOp] = []
    for body in (softmax.body.block, values.body.block):
        (key,) = body.args
        mine = [
            op
            for op in body.walk()
            if isinstance(op, loop.ApplyOp) and _mask_offset(op, row, key) == offset
        ]
        if not mine:
            return []
        found += mine
    return found


def _mask_offset(where: object, row: SSAValue, key: SSAValue) -> int | None:
    """`off` when `where` is `where(i + ca OP j + cb, s, -inf)` keeping only the keys
    j <= i + off of row i; None otherwise."""
    if not (isinstance(where, loop.ApplyOp) and where.fn.data == "where"):
        return None
    cond, _, other = where.args
    if _number(_uncast(other)) != -math.inf:
        return None
    cmp = cond.owner
    if not (isinstance(cmp, loop.ApplyOp) and cmp.fn.data in COMPARISONS):
        return None
    a, b = (_linear(x) for x in cmp.args)
    if a is None or b is None:
        return None
    fn = cmp.fn.data
    if a[0] is key and b[0] is row:  # j + ca OP i + cb: flip to i + cb OP' j + ca
        a, b = b, a
        fn = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[fn]
    if not (a[0] is row and b[0] is key) or fn not in ("gt", "ge"):
        return None  # keys kept below a row's diagonal only (or not a mask of rows by keys)
    offset = a[1] - b[1]  # i + ca >= j + cb: j <= i + (ca - cb)
    return offset if fn == "ge" else offset - 1


def _uncast(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, loop.ApplyOp) and v.owner.fn.data == "cast":
        v = v.owner.args[0]
    return v


def _number(v: SSAValue) -> float | None:
    owner = v.owner
    if isinstance(owner, loop.ConstantOp):
        value = owner.value
        if isinstance(value, FloatAttr | IntegerAttr):
            return float(value.value.data)
    return None


def _linear(v: SSAValue) -> tuple[SSAValue, int] | None:
    """(index, c) when `v` is a loop index plus a whole constant (casts aside)."""
    v = _uncast(v)
    if isinstance(v.owner, Block):
        bounds = v.owner.parent_op()
        sizes = bounds.properties.get("bounds") if bounds is not None else None
        if sizes is None or max(loop.int_list(sizes)) >= INDEX_EXACT:  # type: ignore[arg-type]
            return None
        return v, 0
    op = v.owner
    if not (isinstance(op, loop.ApplyOp) and op.fn.data in ("add", "sub")):
        return None
    x, y = op.args
    c = _number(_uncast(y))
    inner = _linear(x)
    if c is None and op.fn.data == "add":
        c, inner = _number(_uncast(x)), _linear(y)
    if c is None or inner is None or c != int(c) or abs(c) >= INDEX_EXACT:
        return None
    return inner[0], inner[1] + int(c) * (1 if op.fn.data == "add" else -1)


def _narrow(v: SSAValue, element: Attribute) -> tuple[SSAValue, Attribute]:
    """A dot operand widened from half precision to f32, as its half load: the
    products of half values are exact in f32, so a half dot accumulating in f32
    computes the f32 product of the widened values (up to the order of its sums)."""
    cast = v.owner
    if isinstance(cast, loop.ApplyOp) and cast.fn.data == "cast" and element == F32:
        load = cast.args[0].owner
        if isinstance(load, loop.LoadOp) and load.result.type in HALF_TYPES:
            return load.result, load.result.type
    return v, element


def _block(element: object, shape: tuple[int, ...]) -> object:
    from xdsl.dialects.builtin import TensorType

    return TensorType(element, list(shape))  # type: ignore[arg-type]


def lay_out_attention(t: KernelTranslator) -> None:
    """Lays out an attention kernel and translates its key loop (see the module
    docstring); the caller then translates the stores as for any kernel."""
    AttentionLayout(t).build()


__all__ = ["lay_out_attention"]
