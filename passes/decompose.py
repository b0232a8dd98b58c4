"""Rewrites the composite ops (`softmax`, `layer_norm`, `attention`) into spec primitives.

Fusion then sees only primitives, so one mechanism fuses a softmax whether the
user wrote `graph.softmax` or the five ops by hand. Half-precision inputs are
computed in f32 and rounded once at the end, as PyTorch's kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, ModuleOp, f64, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from irc.dialects import graph
from irc.ir.types import (
    ELEMENT_TYPES,
    F32,
    HALF_TYPES,
    I1,
    broadcast_shapes,
    element_of,
    int_array,
    shape_of,
    tensor,
)
from irc.ir.value_names import set_value_name, written_label

I32 = ELEMENT_TYPES["i32"]


class _Emitter:
    """Collects the replacement ops, each carrying the composite's location."""

    def __init__(self, origin: Operation):
        self.origin = origin
        self.ops: list[Operation] = []

    def __call__(self, op: Operation) -> SSAValue:
        op.location = self.origin.location
        self.ops.append(op)
        return op.results[0]

    def upcast(self, x: SSAValue) -> SSAValue:
        element = x.type.element_type  # type: ignore[attr-defined]
        if element not in HALF_TYPES:
            return x
        return self(graph.CastOp.make(x, result_type=tensor(x.type.get_shape(), F32)))  # type: ignore[attr-defined]

    def downcast(self, y: SSAValue, like: SSAValue) -> SSAValue:
        if y.type == like.type:
            return y
        return self(graph.CastOp.make(y, result_type=like.type))


def decompose_softmax(op: graph.SoftmaxOp) -> list[Operation]:
    emit = _Emitter(op)
    x = emit.upcast(op.input)
    keep = {"dims": int_array([op.axis()]), "keepdim": IntegerAttr(1, IntegerType(1))}
    m = emit(graph.ReduceMaxOp.make(x, **keep))
    e = emit(graph.ExpOp.make(emit(graph.SubOp.make(x, m))))
    s = emit(graph.ReduceSumOp.make(e, **keep))
    y = emit(graph.DivOp.make(e, s))
    emit.downcast(y, op.result)
    return emit.ops


def decompose_layer_norm(op: graph.LayerNormOp) -> list[Operation]:
    emit = _Emitter(op)
    x, w, b = emit.upcast(op.input), emit.upcast(op.weight), emit.upcast(op.bias)
    keep = {"dims": int_array(op.normalized_dims()), "keepdim": IntegerAttr(1, IntegerType(1))}
    mean = emit(graph.ReduceMeanOp.make(x, **keep))
    centered = emit(graph.SubOp.make(x, mean))
    var = emit(graph.ReduceMeanOp.make(emit(graph.MulOp.make(centered, centered)), **keep))
    eps = emit(
        graph.ConstantOp.make(
            result_type=tensor([], x.type.element_type),  # type: ignore[attr-defined]
            value=FloatAttr(op.epsilon(), f64),
        )
    )
    inv_std = emit(graph.RsqrtOp.make(emit(graph.AddOp.make(var, eps))))
    y = emit(graph.MulOp.make(centered, inv_std))
    y = emit(graph.AddOp.make(emit(graph.MulOp.make(y, w)), b))
    emit.downcast(y, op.result)
    return emit.ops


def decompose_attention(op: graph.AttentionOp) -> list[Operation]:
    """Attention written out, as passes/fuse_attention.py recognizes it: leading dims
    flattened into one batch dim (views), K and V heads repeated for grouped-query
    attention by a reshape, broadcast and reshape (views), the scores in f32 for
    half types, the mask and causality as `where`s (the causal one last, of two
    iotas: the attention kernel skips the key tiles above the diagonal)."""
    emit = _Emitter(op)
    q, k, v = op.query, op.key, op.value
    sq, sk, sv = (tuple(x.type.get_shape()) for x in (q, k, v))  # type: ignore[attr-defined]
    element = q.type.element_type  # type: ignore[attr-defined]
    lead = sq[:-2]
    batch = 1
    for n in lead:
        batch *= n
    tq, d = sq[-2:]
    tk, dv = sv[-2:]
    flat = (batch,) if lead else ()

    def reshape(x: SSAValue, shape: tuple[int, ...]) -> SSAValue:
        if tuple(x.type.get_shape()) == shape:  # type: ignore[attr-defined]
            return x
        return emit(graph.ReshapeOp.make(x, result_type=tensor(list(shape), element)))

    def heads(x: SSAValue, shape: tuple[int, ...]) -> SSAValue:
        """K or V with one head for each query head (views only)."""
        group = sq[-3] // shape[-3] if len(sq) >= 3 else 1
        if group > 1:
            split = (*shape[:-2], 1, *shape[-2:])
            wide = (*shape[:-2], group, *shape[-2:])
            x = emit(
                graph.BroadcastOp.make(reshape(x, split), result_type=tensor(list(wide), element))
            )
        return reshape(x, (*flat, *shape[-2:]))

    q3, k3, v3 = reshape(q, (*flat, tq, d)), heads(k, sk), heads(v, sv)
    rank = len(flat) + 2
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    kt = emit(graph.TransposeOp.make(k3, perm=int_array(perm)))
    # Half inputs: the scores are an f32 product of the widened operands (exact products,
    # f32 sums: what a half dot accumulating in f32 computes, and the attention kernel
    # does so), not rounded to half before the softmax.
    x = emit(graph.MatmulOp.make(emit.upcast(q3), emit.upcast(kt)))
    wide_type = x.type.element_type  # type: ignore[attr-defined]
    scale = graph.ConstantOp.make(
        result_type=tensor([], wide_type), value=FloatAttr(op.softmax_scale(), f64)
    )
    x = emit(graph.MulOp.make(x, emit(scale)))

    def minus_inf() -> SSAValue:
        return emit(
            graph.ConstantOp.make(
                result_type=tensor([], wide_type), value=FloatAttr(-float("inf"), f64)
            )
        )

    if op.mask is not None:
        m = op.mask
        scores = (*lead, tq, tk)
        shape = tuple(m.type.get_shape())  # type: ignore[attr-defined]
        if len(shape) > 2 and shape != (*flat, tq, tk):
            # Over the leading dims too: stretched to them, then flattened (views).
            m_type = m.type.element_type  # type: ignore[attr-defined]
            m = emit(graph.BroadcastOp.make(m, result_type=tensor(list(scores), m_type)))
            m = emit(graph.ReshapeOp.make(m, result_type=tensor([*flat, tq, tk], m_type)))
        if m.type.element_type == I1:  # type: ignore[attr-defined]
            x = emit(graph.WhereOp.make(m, x, minus_inf()))
        else:
            x = emit(graph.AddOp.make(x, emit.upcast(m)))
    if op.causal():
        index = tensor([tq, tk], I32)
        rows = emit(graph.IotaOp.make(result_type=index, dim=IntegerAttr(0, i64)))
        keys = emit(graph.IotaOp.make(result_type=index, dim=IntegerAttr(1, i64)))
        x = emit(graph.WhereOp.make(emit(graph.GeOp.make(rows, keys)), x, minus_inf()))
    keep = {"dims": int_array([rank - 1]), "keepdim": IntegerAttr(1, IntegerType(1))}
    top = emit(graph.ReduceMaxOp.make(x, **keep))
    e = emit(graph.ExpOp.make(emit(graph.SubOp.make(x, top))))
    p = emit(graph.DivOp.make(e, emit(graph.ReduceSumOp.make(e, **keep))))
    if p.type.element_type != element:  # type: ignore[attr-defined]
        p = emit(graph.CastOp.make(p, result_type=tensor([*flat, tq, tk], element)))
    out = emit(graph.MatmulOp.make(p, v3))
    reshape(out, (*lead, tq, dv))
    return emit.ops


def _replace(rewriter: PatternRewriter, op: Operation, new: list[Operation]) -> None:
    result = new[-1].results[0]
    name = op.results[0].name_hint
    rewriter.replace(op, new, [result])
    if name is not None:
        set_value_name(result, name)
    # xDSL copies the composite's name onto every new value; only the final
    # value stands for it, the intermediates print as numbers.
    for other in new[:-1]:
        for r in other.results:
            r.name_hint = None


class DecomposeSoftmax(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.SoftmaxOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_softmax(op))


class DecomposeAttention(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.AttentionOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_attention(op))


class DecomposeLayerNorm(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.LayerNormOp, rewriter: PatternRewriter) -> None:
        _replace(rewriter, op, decompose_layer_norm(op))


@dataclass(frozen=True)
class DecomposePass(ModulePass):
    """`decompose`: composite graph ops into primitives."""

    name = "decompose"
    levels = ("graph",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            # dce_enabled=False: decompose rewrites the composites and nothing else
            # (xDSL's applier would also erase every unused op of the program).
            GreedyRewritePatternApplier(
                [DecomposeSoftmax(), DecomposeLayerNorm(), DecomposeAttention()], dce_enabled=False
            ),
            apply_recursively=False,
        ).rewrite_module(op)


# --- small reductions that feed another reduction ---------------------------------

UNROLL_LIMIT = 32
"""Elements a reduction may have to be unrolled, whatever its ops (Inductor's
unroll_reductions_threshold is 8); `UNROLLED_SHARE` bounds the ops it becomes."""

UNROLLED_SHARE = 0.75
"""Of the ops one kernel takes (`fuse`'s `max-ops`), the share an unrolled reduction's
terms may take, leaving the rest to the reduction it feeds and that kernel's other
ops. Past it the unrolled terms do not fit one kernel: fusion writes some out
full-size, slower than the two kernels unrolling was to save (neighbor, H100:
16 terms of 4 ops with bf16's widening, 138 us against 122 not unrolled; 24 terms
of 3 ops in f32, 796 against 176). Within it, one kernel instead of two: 3288 x 11
bf16 35.6 us against 254.7, 4096 x 12 f32 23.2 against 161.5, 2000 x 16 f32 22.0
against 36.0."""

MAX_UNROLLED_CHAIN = 8
"""Element-wise ops before the reduction that each unrolled element recomputes."""


def unroll_small_reductions(block: Block, max_ops: int, kept: list[str] | None = None) -> list[str]:
    """Rewrites a reduction over at most `UNROLL_LIMIT` elements that feeds another
    reduction over other dims into element-wise ops, one term an element, where the
    terms' ops fit `UNROLLED_SHARE` of a kernel's `max_ops` (`unrolled_ops`); and a
    reduction over one element (its dims all of size 1) wherever it is, since it is
    its input reshaped and would otherwise be a kernel of its own.

    Two reductions over different dims are two kernels, the first writing its
    whole result for the second (Inductor's test_neighbor, `((a - b)**2).sum(-1)
    .amax(1)`: a 10x10 intermediate). Unrolled, the small one is element-wise work
    on the second's space, and both are one kernel: each term recomputes the
    element-wise ops the reduction read, on slices of their inputs (views, so no
    data moves). Sums are added in f32 and rounded once, as torch's reduction does.
    Returns a line for the fusion report for each reduction unrolled; `kept` gets
    one for each that feeds another but stays a reduction for its ops.
    """
    notes: list[str] = []
    for op in list(block.ops):
        if not isinstance(op, graph.ReduceOp) or op.parent_block() is not block:
            continue
        dims = op.reduced_dims()
        shape = shape_of(op.input.type)
        count = prod(shape[d] for d in dims)
        if count > UNROLL_LIMIT:
            continue
        fed = _reduction_fed(op)
        if fed is None and count > 1:
            continue
        name = op.result.name_hint
        label = written_label(op)
        fed_label = written_label(fed) if fed is not None else ""
        if not unrolled_fits(op, count, max_ops):
            if kept is not None:
                kept.append(
                    f"{label} over {count} elements stays a reduction: unrolled, it would "
                    f"be {unrolled_ops(op, count)} ops, more than "
                    f"{int(UNROLLED_SHARE * max_ops)} of the {max_ops} a kernel takes, "
                    f"beside {fed_label}"
                )
            continue
        result = _unroll(op, dims, block)
        if name is not None:
            set_value_name(result, name)
        if fed is None:
            notes.append(f"{label} over dims of size 1 is its input reshaped: no reduction left")
        else:
            notes.append(
                f"{label} over {count} element{'s' if count > 1 else ''} unrolled into "
                f"element-wise ops: it feeds {fed_label}, over other dims, and one kernel "
                "computes both"
            )
        chain = _chain(op.input)
        op.result.replace_all_uses_with(result)
        block.erase_op(op)
        for dead in reversed(chain):  # what only the reduction read
            if all(not r.uses for r in dead.results):
                block.erase_op(dead)
    return notes


def unrolled_fits(op: graph.ReduceOp, count: int, max_ops: int) -> bool:
    """Whether `op` over `count` elements unrolls into terms that fit one kernel of
    `max_ops` beside the reduction they feed (one element is no term: it always does)."""
    if count > UNROLL_LIMIT:
        return False
    return count == 1 or unrolled_ops(op, count) <= UNROLLED_SHARE * max_ops


def unrolled_ops(op: graph.ReduceOp, count: int) -> int:
    """Compute ops `_unroll` makes of `op` over `count` elements: each term's chain, a
    combine and, for a half-precision sum, a widening cast; then a mean's division
    and the narrowing cast (views are free, as fusion counts them)."""
    widen = op.COMBINER is graph.AddOp and element_of(op.result.type) in HALF_TYPES
    return count * (len(_chain(op.input)) + 1 + widen) + isinstance(op, graph.ReduceMeanOp) + widen


def _reduction_fed(op: graph.ReduceOp) -> graph.ReduceOp | None:
    """A reduction over another space that `op`'s value reaches through element-wise ops."""
    stack, seen = [op.result], set[SSAValue]()
    while stack:
        v = stack.pop()
        for use in v.uses:
            user = use.operation
            if isinstance(user, graph.ReduceOp):
                if shape_of(user.input.type) != shape_of(op.input.type):
                    return user
            elif isinstance(user, graph.ElementwiseOp) and user.results[0] not in seen:
                seen.add(user.results[0])
                stack.append(user.results[0])
    return None


def _chain(root: SSAValue) -> list[Operation]:
    """The element-wise ops `root` is made of, in program order (at most MAX_UNROLLED_CHAIN)."""
    found: list[Operation] = []
    stack = [root]
    while stack:
        owner = stack.pop().owner
        if (
            isinstance(owner, graph.ElementwiseOp)
            and owner not in found
            and len(found) < MAX_UNROLLED_CHAIN
        ):
            found.append(owner)
            stack += list(owner.operands)
    block = root.owner.parent_block() if isinstance(root.owner, Operation) else None
    if block is None:
        return found
    order = {o: i for i, o in enumerate(block.ops)}
    return sorted(found, key=order.__getitem__)


def _unroll(op: graph.ReduceOp, dims: list[int], block: Block) -> SSAValue:
    shape = shape_of(op.input.type)
    keep = op.keeps_dims()
    chain = _chain(op.input)
    made = {r for c in chain for r in c.results}
    new: list[Operation] = []

    def emit(o: Operation) -> SSAValue:
        o.location = op.location
        new.append(o)
        return o.results[0]

    def sliced(leaf: SSAValue, at: dict[int, int]) -> SSAValue:
        """`leaf` at one element of the reduced dims, those dims dropped unless kept."""
        lshape = shape_of(leaf.type)
        lead = len(shape) - len(lshape)
        start, end = [0] * len(lshape), list(lshape)
        for d, j in at.items():
            a = d - lead
            if a >= 0 and lshape[a] != 1:
                start[a], end[a] = j, j + 1
        v = leaf
        if start != [0] * len(lshape) or end != list(lshape):
            v = emit(graph.SliceOp.make(leaf, start=int_array(start), end=int_array(end)))
        if not keep:
            kept = [size for a, size in enumerate(lshape) if a + lead not in at]
            if len(kept) != len(lshape):
                v = emit(graph.ReshapeOp.make(v, result_type=tensor(kept, element_of(leaf.type))))
        return v

    terms: list[SSAValue] = []
    for index in product(*(range(shape[d]) for d in dims)):
        at = dict(zip(dims, index, strict=True))
        mapping: dict[SSAValue, SSAValue] = {}
        for c in chain:
            operands = []
            for o in c.operands:
                if o not in mapping:
                    mapping[o] = o if o in made else sliced(o, at)
                operands.append(mapping[o])
            out = broadcast_shapes(*(shape_of(o.type) for o in operands))
            assert out is not None
            result_type = tensor(out, element_of(c.results[0].type))
            mapping[c.results[0]] = emit(
                type(c).create(
                    operands=operands, result_types=[result_type], properties=dict(c.properties)
                )
            )
        terms.append(mapping[op.input] if op.input in mapping else sliced(op.input, at))
    element = element_of(op.result.type)
    combine = op.COMBINER
    widen = combine is graph.AddOp and element in HALF_TYPES and len(terms) > 1
    if widen:
        terms = [
            emit(graph.CastOp.make(t, result_type=tensor(shape_of(t.type), F32))) for t in terms
        ]
    total = terms[0]
    for t in terms[1:]:
        if element == I1:
            # maximum and minimum are not defined on i1: a max is an or, a min an and.
            is_max = isinstance(op, graph.ReduceMaxOp)
            total = emit(graph.WhereOp.make(total, *((total, t) if is_max else (t, total))))
        else:
            total = emit(combine.make(total, t))
    if isinstance(op, graph.ReduceMeanOp) and len(terms) > 1:
        count = emit(
            graph.ConstantOp.make(
                result_type=tensor([], element_of(total.type)),
                value=FloatAttr(float(len(terms)), f64),
            )
        )
        total = emit(graph.DivOp.make(total, count))
    if widen:
        total = emit(graph.CastOp.make(total, result_type=op.result.type))
    block.insert_ops_before(new, op)
    return total
