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
from xdsl.ir import Block, SSAValue

from irc.analysis.dot_operands import dot_factors, narrowed
from irc.analysis.key_band import KeyBand, attention_parts, key_band
from irc.dialects import loop, tile
from irc.dialects.attrs import MAX_GRID_Y
from irc.ir.types import F32, HALF_TYPES, numel
from irc.passes.tile import next_pow2

if TYPE_CHECKING:
    from irc.lowering.loop_to_tile import KernelTranslator

MINUS_INF = FloatAttr(-math.inf, f64)
ZERO = FloatAttr(0.0, f64)
LOG2E = 1.4426950408889634


def _score_dots(block: Block) -> list[loop.ReduceOp]:
    """The contractions that make the scores in a loop body."""
    return [
        op for op in block.walk() if isinstance(op, loop.ReduceOp) and op.contract is not None
    ]


class AttentionLayout:
    """One program's rows and the key loop of an attention kernel."""

    def __init__(self, t: KernelTranslator):
        self.t = t
        self.softmax, self.values = attention_parts(t.kernel)
        self.bm, self.bn = t.tiling.block
        *self.batch, self.m, self.e = t.shape.parallel
        self.keys, self.head = t.shape.reduction
        # Tensor-core dots take at least 16 along every axis: narrower heads are padded
        # (and masked) to 16.
        self.be, self.bd = max(16, next_pow2(self.e)), max(16, next_pow2(self.head))
        self.element = self.values.result.type
        self.exp_op = self.log2_probabilities()
        # The probabilities are only summed (into l and P V): the fast exp, as
        # FlashAttention's, where they are not computed in log2 units. Other exps
        # (of the scores, of the output) keep the accurate one.
        probabilities = self.probabilities_exp()
        if probabilities is not None:
            t.fast_ops[probabilities] = "fast_exp"

    def log2_probabilities(self) -> loop.ApplyOp | None:
        """The values body's `exp(x - max)`, where the kernel may compute it as
        `exp2(x * log2(e) - max * log2(e))`, carrying the running max in log2 units:
        the probabilities are rounded to half precision for the second dot, `x - max`
        is an unrounded f32 (a rounded one, as torch computes written-out bf16
        attention, must stay as torch rounds it), and the max serves nothing else.

        The multiply by log2(e) takes the place of the one inside `tl.exp`, and a
        positive constant scale of the scores folds into it (`scaled_scores`): a
        multiply fewer a score. Measured on an H100 (bf16, `benchmarks/attention.py`,
        written-out attention through `graph.softmax`): 8 heads x 4096 tokens, d =
        64, 0.116 ms against 0.107, 2 x 16384 0.435 against 0.397, d = 128 0.178
        against 0.163. The multiply and the subtraction of the max are one FMA
        (`mul_add`; kernels launch without FP contraction): on an H100, SDPA's
        shapes 2-9% faster (B=4, 16 heads, T=4096, d=64: 678 -> 616 us not causal,
        395 -> 380 causal), with the same largest error against f64."""
        if self.element not in HALF_TYPES:
            return None
        p_value, _ = dot_factors(self.values)
        op = p_value.owner
        if isinstance(op, loop.ApplyOp) and op.fn.data == "cast":
            op = op.args[0].owner
        if not (isinstance(op, loop.ApplyOp) and op.fn.data == "exp" and op.result.type == F32):
            return None
        sub = op.args[0].owner
        if not (isinstance(sub, loop.ApplyOp) and sub.fn.data == "sub"):
            return None
        if sub.result.type != F32 or sub.args[1] is not self.softmax.maximum:
            return None
        if any(use.operation is not sub for use in self.softmax.maximum.uses):
            return None
        return op

    def probabilities_exp(self) -> loop.ApplyOp | None:
        """The values body's exp that makes the probabilities (through a cast to the
        values' half type, if any), or None."""
        p_value, _ = dot_factors(self.values)
        op = p_value.owner
        if isinstance(op, loop.ApplyOp) and op.fn.data == "cast":
            op = op.args[0].owner
        if isinstance(op, loop.ApplyOp) and op.fn.data == "exp":
            return op
        return None

    def scaled_scores(self, x: SSAValue, masked: bool) -> tuple[SSAValue, float] | None:
        """`(s, c)` where the scores `x` are a score dot `s` times a positive constant
        `c`, in f32 (an unmasked tile sees through the band's `where`s): then
        max(x) = c * max(s), and x * log2(e) is one multiply of `s`."""
        while not masked and isinstance(x.owner, loop.ApplyOp) and x.owner in self.band_masks:
            x = x.owner.args[1]
        op = x.owner
        if not (isinstance(op, loop.ApplyOp) and op.fn.data == "mul" and op.result.type == F32):
            return None
        for s, c in (op.args, reversed(op.args)):
            dot, const = s.owner, c.owner
            if not (isinstance(dot, loop.ReduceOp) and dot.contract is not None):
                continue
            if dot.result.type != F32 or not isinstance(const, loop.ConstantOp):
                continue
            value = const.value
            if isinstance(value, FloatAttr) and 0 < value.value.data < math.inf:
                return s, value.value.data
        return None

    def build(self) -> None:
        t, bm = self.t, self.bm
        rows_iv = t.kernel.body.block.args[-2]
        band = key_band(self.softmax, self.values, rows_iv)
        self.band_masks: tuple[loop.ApplyOp, ...] = () if band is None else band.wheres
        blocks = math.ceil(self.m / bm)
        if band is not None and band.lo is None and band.hi is not None and blocks <= MAX_GRID_Y:
            # Under a causal mask the last rows' programs see the most keys: they are
            # launched first (rows in reverse, every head of a row block together), so
            # the light programs fill the machine's last wave instead of the heavy ones.
            t.grid = [numel(self.batch), blocks]
            row_program = t.apply("sub", [t.const(blocks - 1, t.index), t.program_id(1)])
            batch_program = t.program_id(0)
        else:
            row_program, batch_program = t.grid_2d(blocks, numel(self.batch))
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
                q, element = narrowed(dot_factors(dot)[0], dot.result.type)
                self.queries[dot] = t.dot_operand(q, (bm, self.bd), element)
        carried = [
            t.full(MINUS_INF, F32, (bm, 1)),
            t.full(ZERO, F32, (bm, 1)),
            t.full(ZERO, F32, (bm, self.be)),
        ]
        carried = self.key_stages(carried, row_start, band)
        m, total, acc = carried
        if self.exp_op is not None:  # back from log2 units
            m = t.apply("mul", [m, t.const(1 / LOG2E, F32)])
        t.bind(self.softmax.maximum, m)
        t.bind(self.softmax.sum_exp, total)
        t.bind(self.values.result, acc)

    def key_stages(
        self, carried: list[SSAValue], row_start: SSAValue, band: KeyBand | None
    ) -> list[SSAValue]:
        """The key loop in stages, as FlashAttention-2 runs it: the key tiles no mask
        touches (whole tiles inside the keys and inside every row's band) without
        masks, the tiles at the band's edges and the ragged last tile with them, and
        none of the tiles outside every row's band.

        A program's rows are i = r .. r + BM - 1 and its band keeps keys
        i + lo <= j <= i + hi: tile [j0, j0 + BN) is kept whole by every row when
        j0 >= r + BM - 1 + lo and j0 + BN <= r + hi + 1, and seen at all when
        j0 + BN > r + lo and j0 < r + BM + hi. Each stage's bounds are multiples of BN.
        """
        t, bm, bn = self.t, self.bm, self.bn
        whole = self.keys - self.keys % bn

        def tile_at(c: int) -> SSAValue:  # floor(max(r + c, 0) / BN) * BN
            x = t.apply("maximum", [t.iapply("add", row_start, c), t.const(0, t.index)])
            return t.iapply("mul", t.iapply("floordiv", x, bn), bn)

        def lesser(a: SSAValue, b: SSAValue) -> SSAValue:
            return t.apply("minimum", [a, b])

        if band is None:
            if whole:
                carried = self.key_loop(carried, whole, masked=False)
            if whole < self.keys:
                carried = self.key_loop(carried, self.keys, masked=True, lb=whole)
            return carried
        first = full_from = None
        stop = full_to = None
        if band.lo is not None:
            first = tile_at(band.lo)
            full_from = tile_at(bm - 1 + band.lo + bn - 1)
        if band.hi is not None:
            # Keys past the last row + hi are masked for every row: not visited.
            stop = t.iapply("add", row_start, bm + band.hi)
            full_to = lesser(tile_at(band.hi + 1), t.const(whole, t.index))
        if full_from is not None:
            # The tiles before the band is whole for every row: masked.
            before = full_from if stop is None else lesser(full_from, stop)
            carried = self.key_loop(carried, self.keys, True, start=first, stop=before)
        if whole:
            carried = self.key_loop(carried, whole, False, start=full_from, stop=full_to)
        if full_to is None and whole == self.keys:
            return carried  # the band has no upper edge and the keys no ragged tile
        if full_to is None:
            after = full_from  # the ragged tile, from max(full_from, whole)
            lb = whole
        else:
            after = full_to if full_from is None else t.apply("maximum", [full_from, full_to])
            lb = 0
        return self.key_loop(carried, self.keys, True, lb=lb, start=after, stop=stop)

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
        block = t.loop_block(ub, self.bn, [v.type for v in carried])
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
        Unmasked, the tile lies inside the keys and inside every row's band: it
        neither masks the keys past the end nor applies the band's `where`s."""
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
        x_value = self.softmax.body.block.last_op.values[0]  # type: ignore[union-attr]
        scaled = self.scaled_scores(x_value, masked) if self.exp_op is not None else None
        if scaled is not None:  # x * log2(e) = s * (c * log2(e)), and max(x) = c * max(s)
            s, c = scaled
            x = self.tile_of(s)
            factor = t.const(c * LOG2E, F32)
        else:
            x = self.tile_of(x_value)
            factor = t.const(LOG2E, F32)
        if jmask_row is not None:
            x = t.apply("where", [jmask_row, x, t.const_attr(MINUS_INF, F32)])
        row_max = self.row_reduce("max", x)
        if self.exp_op is not None:
            row_max = t.apply("mul", [row_max, factor])
        m_new = t.apply("maximum", [m_old, row_max])
        # exp(-inf - -inf) is NaN: a row that has seen only -inf measures from 0.
        empty = t.apply("eq", [m_new, t.const_attr(MINUS_INF, F32)])
        base = t.apply("where", [empty, t.const(0.0, F32), m_new])
        exp = "fast_exp" if self.exp_op is None else "exp2"
        alpha = t.apply(exp, [t.apply("sub", [m_old, base])])
        if self.exp_op is not None:
            # One multiply-add a score (the scale and log2(e) in one factor, the max
            # subtracted in the same rounding), then exp2.
            exponent = t.apply("mul_add", [x, factor, t.apply("neg", [base])])
            t.bind(self.exp_op.result, t.apply("exp2", [exponent]))

        # The probabilities: the loop IR's exp(scores - m), with the running max.
        t.bind(self.softmax.maximum, base)
        (j_values,) = self.values.body.block.args
        t.bind(j_values, j_row)
        self.bind_scores(self.values.body.block, j_row, jmask_row, masked)
        p_value, v_value = dot_factors(self.values)
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
        unmasked, the band's `where`s in `body` to the scores they keep."""
        t = self.t
        for dot in _score_dots(body):
            if dot is self.values:
                continue
            (kiv,) = dot.body.block.args
            with t.scope(axis_masks=[self.kmask_col, jmask_row]):
                t.bind(kiv, self.k_col)
                k, element = narrowed(dot_factors(dot)[1], dot.result.type)
                k = t.dot_operand(k, (self.bd, self.bn), element)
            zero = t.full(ZERO, F32, (self.bm, self.bn))
            t.bind(dot.result, t.round_to(self.dot(self.queries[dot], k, zero), dot.result.type))
        if not masked:
            inside = set(body.walk())
            for where in reversed(self.band_masks):  # the innermost layer first
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


def _block(element: object, shape: tuple[int, ...]) -> object:
    from xdsl.dialects.builtin import TensorType

    return TensorType(element, list(shape))  # type: ignore[arg-type]


def lay_out_attention(t: KernelTranslator) -> None:
    """Lays out an attention kernel and translates its key loop (see the module
    docstring); the caller then translates the stores as for any kernel."""
    AttentionLayout(t).build()


__all__ = ["lay_out_attention"]
