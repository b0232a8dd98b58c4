"""Moves a transpose past the element-wise ops that read it, to the function's return.

`x.permute(0, 2, 1, 3) * 0.125` returned: computed as written, its kernel reads `x`
across rows (rows of 122 bf16 elements load 4 bytes a lane) and stores row-major.
Torch computes it in `x`'s order and returns a permuted view (TensorIterator keeps
its input's layout), and so does torch.compile. After this rewrite irc does too:
`transpose(x * 0.125)` is computed in `x`'s order, a straight copy's accesses, and
graph-to-loop returns the transpose as a view of the kernel's buffer
(`returned_views`, `loop.view`).

Only where the move reads no operand across rows in exchange: every full-size
operand of the ops moved over is a transpose by the same permutation, and each op
but the returned one has no other reader (nothing else sees a value change order).
Operands that broadcast go along as views in the other order (a rank-0 one, or
fewer dims that the permutation leaves in place, unchanged).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Block, Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import element_of, int_array, numel, shape_of
from irc.ir.value_names import set_value_name, written_name


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _full_size(o: SSAValue, shape: tuple[int, ...]) -> bool:
    """Whether operand `o` of a result of `shape` is read once an element, not broadcast
    (then it must be a moved transpose: otherwise the move would read it across rows)."""
    return numel(shape_of(o.type)) == numel(shape)


def moved_permutation(v: SSAValue, root: bool = True) -> list[int] | None:
    """The permutation `p` such that `v` is `transpose(w, p)` for a `w` computed by
    the same element-wise ops over the transposes' inputs, or None where `v` is not so
    made: a transpose, or an element-wise op (with no reader but the one it is
    reached from, unless it is the `root`) whose full-size operands all are."""
    owner = v.owner
    if isinstance(owner, graph.TransposeOp):
        _, perm = graph.under_transposes(v)
        return None if perm == sorted(perm) else perm
    if not isinstance(owner, graph.ElementwiseOp) or (not root and v.uses.get_length() != 1):
        return None
    shape = shape_of(v.type)
    perms = [moved_permutation(o, False) for o in owner.operands if _full_size(o, shape)]
    if not perms or any(p is None or p != perms[0] for p in perms):
        return None
    return perms[0]


class _Mover:
    """Rebuilds the ops `moved_permutation` accepted in the transposes' order."""

    def __init__(self, block: Block, perm: list[int], at: Operation):
        self.block, self.perm, self.at = block, perm, at
        self.inverse = _inverse(perm)
        self.moved: list[Operation] = []
        """The element-wise ops rebuilt, each after its operands'."""
        self.read: list[Operation] = []
        """The transposes read through, each before the one under it."""

    def source_type(self, t: TensorType) -> TensorType:  # type: ignore[type-arg]
        shape = shape_of(t)
        return TensorType(element_of(t), [shape[i] for i in self.inverse])

    def add(self, op: Operation, like: Operation) -> SSAValue:
        op.location = like.location
        self.block.insert_op_before(op, self.at)
        return op.results[0]

    def broadcast_operand(self, o: SSAValue, rank: int, like: Operation) -> SSAValue:
        """`o`, which broadcasts to the result, as a view in the transposes' order."""
        shape = shape_of(o.type)
        lead = rank - len(shape)
        if not shape or self.perm[lead:] == list(range(lead, rank)):
            return o  # it lines up with the trailing dims, which stay where they are
        if lead:
            o = self.add(
                graph.ReshapeOp.make(
                    o, result_type=TensorType(element_of(o.type), [1] * lead + list(shape))
                ),
                like,
            )
        t = o.type
        assert isinstance(t, TensorType)
        return self.add(
            graph.TransposeOp.make(
                o, result_type=self.source_type(t), perm=int_array(self.inverse)
            ),
            like,
        )

    def source(self, v: SSAValue) -> SSAValue:
        """The value `w` with `v == transpose(w, perm)`."""
        owner = v.owner
        if isinstance(owner, graph.TransposeOp):
            while isinstance(v.owner, graph.TransposeOp):  # outermost first
                self.read.append(v.owner)
                v = v.owner.input
            return v
        assert isinstance(owner, graph.ElementwiseOp)
        shape = shape_of(v.type)
        operands = [
            self.source(o) if _full_size(o, shape) else self.broadcast_operand(o, len(shape), owner)
            for o in owner.operands
        ]
        t = v.type
        assert isinstance(t, TensorType)
        new = type(owner).make(*operands, result_type=self.source_type(t), **dict(owner.properties))
        self.moved.append(owner)
        return self.add(new, owner)


def sink_transposes(block: Block) -> list[str]:
    """Rewrites each returned value made of element-wise ops over transposes by one
    permutation (`moved_permutation`) into a transpose of those ops over the
    transposes' inputs. Returns a line for the fusion report for each one moved."""
    ret = block.last_op
    if not isinstance(ret, func.ReturnOp):
        return []
    notes: list[str] = []
    for r in dict.fromkeys(ret.operands):
        if not isinstance(r.owner, graph.ElementwiseOp) or r.uses.get_length() != 1:
            continue
        perm = moved_permutation(r)
        if perm is None:
            continue
        mover = _Mover(block, perm, ret)
        source = mover.source(r)
        view = graph.TransposeOp.make(source, result_type=r.type, perm=int_array(perm))
        mover.add(view, r.owner)
        name = written_name(r)
        r.replace_all_uses_with(view.results[0])
        set_value_name(view.results[0], name)
        if name is not None:
            set_value_name(source, f"{name}_unpermuted")
        for op in [*reversed(mover.moved), *mover.read]:
            if op.parent is not None and not any(res.uses for res in op.results):
                block.erase_op(op)
        label = f"%{name}" if name else "a returned value"
        count = len(mover.moved)
        notes.append(
            f"{label}: transpose {perm} moved past {count} element-wise "
            f"op{'s' if count != 1 else ''} to the return, a view of its kernel's output "
            f"(its {numel(shape_of(r.type))} elements computed in their operands' order)"
        )
    return notes
