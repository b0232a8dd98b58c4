"""Moves a transpose past the ops that read it, to the function's return.

`x.permute(0, 2, 1, 3) * 0.125` returned: computed as written, its kernel reads `x`
across rows (rows of 122 bf16 elements load 4 bytes a lane) and stores row-major.
Torch computes it in `x`'s order and returns a permuted view (TensorIterator keeps
its input's layout), and so does torch.compile. After this rewrite irc does too:
`transpose(x * 0.125)` is computed in `x`'s order, a straight copy's accesses, and
graph-to-loop returns the transpose as a view of the kernel's buffer
(`returned_views`, `loop.view`). Reductions that keep their dims move as well:
`z - z.sum(1, keepdim=True)` of `z = x.permute(2, 0, 1) + w` becomes a column sum
over `x`'s leading dim, read and written in order (torch.compile's kernel does the
same), where the kernel as written read every element 4 bytes a sector.

Every full-size operand of the ops moved over is a transpose by the same
permutation or another op moved, and every reader of an op moved but the returned
one is moved too (nothing else sees a value change order). Operands that broadcast
go along as views in the other order (a rank-0 one, or fewer dims that the
permutation leaves in place, unchanged). A full-size operand that is neither (the
`y` of `tanh(x.T * y)`) is read across its rows in exchange only where the output
then stores vectors at least 4 times as wide (`exchange_pays`), where no reduction
moves, and not for results a caller wants row-major (`ROW_MAJOR_RESULTS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Block, Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import element_bytes, element_of, int_array, numel, shape_of
from irc.ir.value_names import set_value_name, written_name
from irc.passes.tile import vector_bytes


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _full_size(o: SSAValue, shape: tuple[int, ...]) -> bool:
    """Whether operand `o` of a result of `shape` is read once an element, not broadcast
    (then it must be a transpose or an op moved: otherwise the move would read it
    across rows)."""
    return numel(shape_of(o.type)) == numel(shape)


def _keepdim_reduction(v: SSAValue) -> bool:
    return isinstance(v.owner, graph.ReduceOp) and v.owner.keeps_dims()


def moved_ops(
    root: SSAValue, exchange: bool = False
) -> tuple[list[int], list[Operation], list[SSAValue]] | None:
    """(`p`, the ops moved, the operands exchanged) such that `root` is
    `transpose(w, p)` for a `w` computed by the same ops over the transposes'
    inputs, or None where it is not so made. With `exchange`, a full-size operand
    that is neither (a function's argument, an op not moved) is exchanged: read
    through a transpose by the inverse of `p` (`exchange_pays` says when), as long
    as no reduction moves (a sum would change the dim it runs along).

    The ops moved are element-wise ops and reductions that keep their dims (a
    softmax's max and sum, a mean subtracted again), each of whose full-size
    operands is a transpose by `p` or another op moved; a reduction's operand is.
    An operand that broadcasts is moved too where it is such a reduction, else it
    goes along as a view. Every reader of an op moved but `root` is one too
    (nothing else sees a value change order).
    """
    perms: list[list[int]] = []
    moved: dict[Operation, None] = {}
    exchanged: dict[SSAValue, None] = {}

    def restore(
        kept_perms: list[list[int]],
        kept_moved: dict[Operation, None],
        kept_exchanged: dict[SSAValue, None],
    ) -> None:
        perms[:] = kept_perms
        moved.clear()
        moved.update(kept_moved)
        exchanged.clear()
        exchanged.update(kept_exchanged)

    def visit(v: SSAValue) -> bool:
        owner = v.owner
        if isinstance(owner, graph.TransposeOp):
            _, perm = graph.under_transposes(v)
            perms.append(perm)
            return perm != sorted(perm)
        if not isinstance(owner, Operation) or owner in moved:
            return owner in moved
        if _keepdim_reduction(v):
            assert isinstance(owner, graph.ReduceOp)
            if not visit(owner.input):
                return False
        elif isinstance(owner, graph.ElementwiseOp):
            shape = shape_of(v.type)
            full = [o for o in owner.operands if _full_size(o, shape)]
            if not full:
                return False
            for o in full:
                kept = list(perms), dict(moved), dict(exchanged)
                if visit(o):
                    continue
                if not exchange:
                    return False
                restore(*kept)  # a failed visit leaves nothing behind
                exchanged[o] = None
            for o in owner.operands:
                if not _full_size(o, shape) and _keepdim_reduction(o):
                    # Moved where it can be, else a broadcast view: try on a copy.
                    kept = list(perms), dict(moved), dict(exchanged)
                    if not visit(o) or any(p != perms[0] for p in perms):
                        restore(*kept)
        else:
            return False
        moved[owner] = None
        return True

    if not visit(root) or not perms or any(p != perms[0] for p in perms):
        return None
    if any(o.owner in moved for o in exchanged):
        return None  # read in both orders
    if exchanged and any(isinstance(op, graph.ReduceOp) for op in moved):
        return None  # `exchange_pays` weighs element-wise kernels' accesses, not reductions'
    for op in moved:
        if op is not root.owner and any(use.operation not in moved for use in op.results[0].uses):
            return None
    return perms[0], list(moved), list(exchanged)


def exchange_pays(result: TensorType, perm: list[int]) -> tuple[bool, str]:  # type: ignore[type-arg]
    """Whether computing `result`, an element-wise value of operands some of which
    are transposes by `perm`, in the transposes' order pays for reading the others
    across their rows, and why.

    A transposing kernel reads and writes each buffer through tiles coalesced along
    its own rows, so each access's vectors are those its own rows allow, whichever
    order the kernel runs in; only the output's rows change: `result`'s last dim,
    or the transposes' input's. Measured on an H200 (kernel time, us, as written /
    moved; torch.compile, which writes in the first operand's order as eager does,
    in brackets): tanh(x.transpose(1, 2) * y) of 78 x 1635 x 268 bf16 85.2 / 78.9
    (66.1), f32 113.4 / 105.4 (105.6), 30 x 4001 x 200 bf16 62.1 / 53.3 (51.3), 99 x
    591 x 1152 bf16 154.1 / 114.0 (103.4), 66 x 1041 x 536 f32 120.0 / 111.4 (111.3),
    30 x 1501 x 604 f16 67.8 / 59.8 (50.9); x.T + y of 4096 x 4097 bf16 35.2 / 31.6
    (36.7). Where the output's rows would get no wider vectors it was slower or
    even: 40 x 2000 x 300 bf16 45.1 / 47.1, 100 x 300 x 1500 bf16 77.3 / 80.1, 64 x
    1111 x 777 bf16 131.4 / 155.7, x.T + y of 4097 x 2048 bf16 18.8 / 21.0, 5001 x
    3000 f32 50.7 / 51.2. Vectors only twice as wide (`EXCHANGE_VECTOR_GAIN`) were
    mixed: 50 x 777 x 1002 bf16 (2 to 4 bytes) 97.0 / 90.3, x.T + y of 2002 x 3001
    bf16 18.1 / 16.7 and 8090 x 5327 f32 (4 to 8) 133.0 / 130.7, but 40 x 1001 x 1002
    f32 (4 to 8) 123.7 / 131.7."""
    shape, size = shape_of(result), element_bytes(element_of(result))
    now, moved = shape[-1], shape[_inverse(perm)[-1]]
    before, after = vector_bytes(now * size), vector_bytes(moved * size)
    why = (
        f"its rows of {moved} elements store {after}-byte vectors where rows of {now} "
        f"stored {before}-byte ones"
    )
    return after >= EXCHANGE_VECTOR_GAIN * before, why


EXCHANGE_VECTOR_GAIN = 4
"""How many times wider the output's vectors must get for an operand to be read
across its rows in exchange (`exchange_pays`)."""


class _Mover:
    """Rebuilds the ops `moved_ops` accepted in the transposes' order."""

    def __init__(
        self,
        block: Block,
        perm: list[int],
        members: list[Operation],
        at: Operation,
        exchanged: Iterable[SSAValue] = (),
    ):
        self.block, self.perm, self.at = block, perm, at
        self.members = set(members)
        self.exchanged = set(exchanged)
        self.inverse = _inverse(perm)
        self.built: dict[SSAValue, SSAValue] = {}
        self.moved: list[Operation] = []
        """The ops rebuilt, each after its operands'."""
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
        """The value `w` with `v == transpose(w, perm)` (built once however often read)."""
        if v in self.built:
            return self.built[v]
        owner = v.owner
        if isinstance(owner, graph.TransposeOp):
            while isinstance(v.owner, graph.TransposeOp):  # outermost first
                self.read.append(v.owner)
                v = v.owner.input
            return v
        t = v.type
        assert isinstance(t, TensorType)
        if v in self.exchanged:  # read across its rows
            like = owner if isinstance(owner, Operation) else self.at
            transpose = graph.TransposeOp.make(
                v, result_type=self.source_type(t), perm=int_array(self.inverse)
            )
            self.built[v] = self.add(transpose, like)
            return self.built[v]
        if isinstance(owner, graph.ReduceOp):
            dims = sorted(self.perm[d] for d in owner.reduced_dims())
            props = {**dict(owner.properties), "dims": int_array(dims)}
            new = type(owner).make(
                self.source(owner.input), result_type=self.source_type(t), **props
            )
        else:
            assert isinstance(owner, graph.ElementwiseOp)
            shape = shape_of(t)
            operands = [
                self.source(o)
                if _full_size(o, shape) or o.owner in self.members
                else self.broadcast_operand(o, len(shape), owner)
                for o in owner.operands
            ]
            new = type(owner).make(
                *operands, result_type=self.source_type(t), **dict(owner.properties)
            )
        self.moved.append(owner)
        self.built[v] = self.add(new, owner)
        return self.built[v]


def sink_transposes(block: Block) -> list[str]:
    """Rewrites each returned value made of element-wise ops and reductions over
    transposes by one permutation (`moved_ops`) into a transpose of those ops over
    the transposes' inputs. Returns a line for the fusion report for each one moved."""
    ret = block.last_op
    if not isinstance(ret, func.ReturnOp):
        return []
    notes: list[str] = []
    for r in dict.fromkeys(ret.operands):
        if not isinstance(r.owner, graph.ElementwiseOp) or r.uses.get_length() != 1:
            continue
        plan = moved_ops(r)
        why = ""
        if plan is None and not row_major(ret, r):
            plan = moved_ops(r, exchange=True)
            if plan is not None:
                pays, why = exchange_pays(r.type, plan[0])  # type: ignore[arg-type]
                plan = plan if pays else None
        if plan is None:
            continue
        perm, members, exchanged = plan
        mover = _Mover(block, perm, members, ret, exchanged)
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
        reductions = sum(isinstance(op, graph.ReduceOp) for op in mover.moved)
        count = len(mover.moved) - reductions
        past = f"{count} element-wise op{'s' if count != 1 else ''}"
        if reductions:
            past += f" and {reductions} reduction{'s' if reductions != 1 else ''}"
        note = (
            f"{label}: transpose {perm} moved past {past} to the return, a view of its "
            f"kernel's output (its {numel(shape_of(r.type))} elements computed in their "
            "operands' order)"
        )
        if exchanged:
            names = ", ".join(
                f"%{n}" if (n := written_name(v)) else "an operand" for v in exchanged
            )
            note += f"; {names} read across rows instead: {why}"
        notes.append(note)
    return notes


ROW_MAJOR_RESULTS: ContextVar[frozenset[int]] = ContextVar("ROW_MAJOR_RESULTS", default=frozenset())
"""Indices of the results whose caller wants them row-major (the PyTorch frontend,
where eager's output is contiguous): no operand is exchanged for them, since the
caller would copy the view (`irc.pytorch.islands`)."""


def row_major(ret: func.ReturnOp, r: SSAValue) -> bool:
    """Whether a caller wants returned value `r` row-major (`ROW_MAJOR_RESULTS`)."""
    wanted = ROW_MAJOR_RESULTS.get()
    return any(o is r and i in wanted for i, o in enumerate(ret.operands))
