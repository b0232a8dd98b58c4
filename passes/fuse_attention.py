"""Attention found by its structure: two contractions joined by a row softmax.

A matmul whose scores go through element-wise work (any: a scale, a bias
tensor, `where` masks, `tanh` soft-capping) into a row softmax over their
last dim (max, exp of the difference, sum, divide: the same two reductions
`online-softmax` rewrites), whose probabilities are the left operand of a
second matmul contracting that same dim, is one kernel with the
FlashAttention-2 schedule (`lowering/attention_to_tile.py`): a tile of rows
stays resident, the second matmul's operand streams along the softmax dim,
the scores live in registers and the running max rescales the sum and the
accumulator. No op is named for being attention: only the data flow is
matched, so variants no library ships fuse the same way.

`fuse` seeds a group with the pattern's ops (`attention_seeds`) before its
greedy search, which may then add an element-wise epilogue on the output;
`attention_problem` is the legality of such a group (fuse's kernel_schema
asks it for any group of two matmuls).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import numel, shape_of

VIEWS = graph.WHOLE_VIEW_OPS
"""The views the matcher looks through: those that keep every element (a slice would
drop keys)."""


@dataclass(frozen=True)
class AttentionPattern:
    """The ops of one attention, as the data flow gives them."""

    scores_mm: graph.MatmulOp
    """The first contraction: scores[.., i, j] = sum_k q[.., i, k] * kt[.., k, j]."""
    values_mm: graph.MatmulOp
    """The second: out[.., i, e] = sum_j p[.., i, j] * v[.., j, e]."""
    row_max: graph.ReduceMaxOp
    row_sum: graph.ReduceSumOp
    normalize: Operation
    """The division by the row sum, which the kernel does once, at the end."""
    scores: SSAValue
    """The value the softmax reduces: the scores after their element-wise work."""
    chain: tuple[Operation, ...]
    """Element-wise ops between the first matmul and `scores`."""
    side: tuple[Operation, ...]
    """Cheap element-wise ops feeding only the chain (a mask from index
    comparisons): recomputed in the kernel, never stored."""
    core: tuple[Operation, ...]
    """Every op above, in program order: the group fuse starts from."""


class Blocked(str):
    """Why an attention that the data flow makes is not one kernel: a value between
    its matmuls is needed outside (the message), with the ops it would have held."""

    ops: tuple[Operation, ...] = ()
    scores_mm: Operation | None = None


def _blocked(message: str, ops: Sequence[Operation], mm1: Operation) -> Blocked:
    out = Blocked(message)
    out.ops, out.scores_mm = tuple(ops), mm1
    return out


def readers(v: SSAValue) -> tuple[list[Operation], bool]:
    """Ops reading `v` (through views), and whether it is returned or yielded."""
    out: list[Operation] = []
    escapes = False
    for use in v.uses:
        user = use.operation
        if isinstance(user, VIEWS):
            more, esc = readers(user.results[0])
            out += [o for o in more if o not in out]
            escapes |= esc
        elif isinstance(user, func.ReturnOp | graph.YieldOp):
            escapes = True
        elif user not in out:
            out.append(user)
    return out, escapes


def _only_read_by(v: SSAValue, allowed: Iterable[Operation]) -> bool:
    found, escapes = readers(v)
    allowed = set(allowed)
    return not escapes and all(o in allowed for o in found)


def _last_dim_row(op: Operation, kind: type[graph.ReduceOp]) -> bool:
    if not isinstance(op, kind):
        return False
    rank = len(shape_of(op.input.type))
    return op.reduced_dims() == [rank - 1] and op.keeps_dims()


def _producer(v: SSAValue) -> Operation | None:
    owner = v.owner
    return owner if isinstance(owner, Operation) else None


def match_attention(mm2: Operation) -> AttentionPattern | str:
    """The attention whose second contraction is `mm2`, or why it is not one."""
    if not isinstance(mm2, graph.MatmulOp):
        return "not a matmul"
    p = mm2.lhs
    cast = _producer(p)
    casts: list[Operation] = []
    if isinstance(cast, graph.CastOp):
        casts.append(cast)
        p = cast.operands[0]
    div = _producer(p)
    if div is None or div.name != "graph.div":
        return "the matmul's left operand is not a division by a row sum"
    e, s = div.operands
    row_sum = _producer(s)
    if not (_last_dim_row(row_sum, graph.ReduceSumOp) and row_sum.input is e):  # type: ignore[union-attr]
        return "the division is not by the row sum of its numerator"
    exp = _producer(e)
    if exp is None or exp.name != "graph.exp":
        return "the row sum is not of an exp"
    sub = _producer(exp.operands[0])
    if sub is None or sub.name != "graph.sub":
        return "the exp is not of a difference from the row max"
    x, mx = sub.operands
    row_max = _producer(mx)
    if not (_last_dim_row(row_max, graph.ReduceMaxOp) and row_max.input is x):  # type: ignore[union-attr]
        return "the exp is not of a difference from the row max"
    score_shape = shape_of(x.type)
    if shape_of(p.type) != score_shape:
        return "the probabilities are broadcast into the matmul"
    # The chain: element-wise ops of the scores' shape back to the first matmul.
    ancestors: list[Operation] = []
    mm1: graph.MatmulOp | None = None
    stack = [x]
    seen: set[SSAValue] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        op = _producer(v)
        if isinstance(op, graph.MatmulOp) and shape_of(op.result.type) == score_shape:
            if mm1 is not None and mm1 is not op:
                return "the scores come from two matmuls"
            mm1 = op
        elif isinstance(op, graph.ElementwiseOp) and shape_of(op.results[0].type) == score_shape:
            ancestors.append(op)
            stack += list(op.operands)
    if mm1 is None:
        return "the softmax's input is not element-wise work on a matmul's scores"
    downstream: set[Operation] = set()
    for op in sorted(ancestors, key=_position):
        if any(_producer(o) is mm1 or _producer(o) in downstream for o in op.operands):
            downstream.add(op)
    chain = [op for op in ancestors if op in downstream]
    rank = len(score_shape)
    if rank not in (2, 3) or len(shape_of(mm2.result.type)) != rank:
        return "the matmuls are not 2-d or batched 3-d"
    inner = [mm1, *chain, row_max, sub, exp, row_sum, div, *casts]
    for op in inner:
        for r in op.results:
            if not _only_read_by(r, {*inner, mm2}):
                name = r.name_hint or op.name.removeprefix("graph.")
                return _blocked(
                    f"an attention, but %{name} is needed outside its kernel", [*inner, mm2], mm1
                )
    # Operands of the scores' matmul widened from half precision: read as they are
    # (the kernel's dot takes the half values and sums in f32, which is the same).
    widened = [
        op
        for op in (_producer(mm1.lhs), _producer(mm1.rhs))
        if isinstance(op, graph.CastOp) and _only_read_by(op.result, {mm1})
    ]
    inner += widened
    core_set = {*inner, mm2, *_side_inputs(chain, {*inner, mm2})}
    core = tuple(sorted(core_set, key=_position))
    return AttentionPattern(
        scores_mm=mm1,
        values_mm=mm2,
        row_max=row_max,  # type: ignore[arg-type]
        row_sum=row_sum,  # type: ignore[arg-type]
        normalize=div,
        scores=x,
        chain=tuple(sorted(chain, key=_position)),
        side=tuple(sorted(core_set - {*inner, mm2}, key=_position)),
        core=core,
    )


def _side_inputs(chain: Sequence[Operation], inner: set[Operation]) -> set[Operation]:
    """Cheap element-wise ops that feed the chain (a mask made of index
    comparisons, say) and nothing else: recomputed in the kernel, never stored."""
    side: set[Operation] = set()
    stack = list(chain)
    while stack:
        op = stack.pop()
        for o in op.operands:
            prod = _source_op(o)
            if (
                isinstance(prod, graph.ElementwiseOp)
                and prod.COST is graph.Cost.CHEAP
                and prod not in side
                and prod not in inner
            ):
                side.add(prod)
                stack.append(prod)
    # Those read outside too are stored by their own kernel anyway: left out, with
    # whatever only they read.
    changed = True
    while changed:
        changed = False
        for op in list(side):
            if not _only_read_by(op.results[0], inner | side):
                side.discard(op)
                changed = True
    return side


def _position(op: Operation) -> int:
    block = op.parent_block()
    assert block is not None
    return block.get_operation_index(op)


def attention_seeds(ops: Iterable[Operation]) -> list[AttentionPattern]:
    """Every attention among `ops` (a function's compute ops), each once."""
    found: list[AttentionPattern] = []
    taken: set[Operation] = set()
    for op in ops:
        if not isinstance(op, graph.MatmulOp):
            continue
        pattern = match_attention(op)
        if isinstance(pattern, str) or taken & set(pattern.core):
            continue
        # A side op that another pattern also reads is left to its own kernel.
        found.append(pattern)
        taken |= set(pattern.core)
    return found


def attention_problem(ops: Sequence[Operation]) -> str | None:
    """Why one attention kernel cannot compute the group `ops` (None: it can).

    The group is an attention's ops, an element-wise epilogue on its output
    (of the output's shape, reading the output tile where it is), and
    nothing else; it writes only the output and epilogue values.
    """
    members = set(ops)
    matmuls = [op for op in ops if isinstance(op, graph.MatmulOp)]
    if len(matmuls) != 2:
        return f"{len(matmuls)} matmuls in one kernel"
    pattern: AttentionPattern | None = None
    for mm in matmuls:
        found = match_attention(mm)
        if not isinstance(found, str):
            pattern = found
    if pattern is None:
        return "two matmuls in one kernel"
    missing = [op for op in pattern.core if op not in members]
    if missing:
        return f"an attention kernel needs all of its softmax ({missing[0].name} is outside)"
    out_shape = shape_of(pattern.values_mm.result.type)
    epilogue: set[Operation] = {pattern.values_mm}
    core = set(pattern.core)
    for op in sorted(members - core, key=_position):
        reads_epilogue = any(_source_op(o) in epilogue for o in op.operands)
        if not reads_epilogue:
            return f"{op.name} is neither the attention nor an epilogue on its output"
        if not isinstance(op, graph.ElementwiseOp):
            return f"epilogue {op.name} is not element-wise"
        shape = shape_of(op.results[0].type)
        if not _same_rows(shape, out_shape):
            return f"epilogue {op.name} of shape {list(shape)} differs from the output's"
        for o in op.operands:
            if _source_op(o) in epilogue and o.owner not in epilogue and not _batch_view(o):
                return f"epilogue {op.name} reads the output tile through a view"
        epilogue.add(op)
    return None


def _same_rows(shape: Sequence[int], out: Sequence[int]) -> bool:
    """`shape` is the output's, or the output with its batch dim split (a 4-d
    attention's [batch, heads] flattened for the matmuls): the same elements in
    the same row-major order, so the kernel computes it at its own index."""
    return tuple(shape) == tuple(out) or (
        tuple(shape[-2:]) == tuple(out[-2:]) and numel(shape) == numel(out)
    )


def _batch_view(v: SSAValue) -> bool:
    """Views that keep every element in place, or only split or merge the batch dims."""
    while isinstance(view := _producer(v), VIEWS):
        src = view.operands[0]
        if isinstance(view, graph.ReshapeOp):
            if not _same_rows(shape_of(v.type), shape_of(src.type)):
                return False
        elif not _identity(v):
            return False
        v = src
    return True


def _source_op(v: SSAValue) -> Operation | None:
    while isinstance(_producer(v), VIEWS):
        v = _producer(v).operands[0]  # type: ignore[union-attr]
    return _producer(v)


def _identity(v: SSAValue) -> bool:
    """Whether the views between `v` and what it views keep every element in place."""
    while isinstance(view := _producer(v), VIEWS):
        src = view.operands[0]
        if shape_of(src.type) != shape_of(v.type):
            return False
        if isinstance(view, graph.TransposeOp):
            rank = len(shape_of(src.type))
            perm = [p.value.data % rank for p in view.perm.data]  # type: ignore[union-attr]
            if perm != list(range(rank)):
                return False
        v = src
    return True


__all__ = [
    "AttentionPattern",
    "Blocked",
    "attention_problem",
    "attention_seeds",
    "match_attention",
    "readers",
]
