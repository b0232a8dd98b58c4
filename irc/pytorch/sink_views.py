"""Element-wise work on a Linear's 2-D output stays 2-D: reshapes sink below it.

`nn.Linear` on a [B, T, K] input exports as a reshape to [B*T, K], a matmul and a
reshape back to [B, T, N]; the bias, GELU or residual add that follow read the
3-D view. irc's `fuse` takes an epilogue into a matmul's kernel only at the
matmul's own shape, so each of them would be a kernel of its own. Here an
element-wise op reading such a reshape is rebuilt on the 2-D value (its other
operands reshaped alike, or broadcast along the last dimension only) and the
reshape moves after it; reshapes of reshapes fold. The values are the same
elements in the same order: nothing is computed differently.

A cast to a wider type whose value goes on to a reduction stays where it is:
in the matmul's kernel it would make that kernel store the wider value for the
reduction's row kernel, which can widen the narrower value it loads itself.
Llama's RMSNorm after the attention's residual add reads `float(h)` and
`float(h)**2`: sunk, the GEMM stored both in f32 (85 MiB of traffic, and 60 for
the norm's kernel at B=8, T=1024, d=768) where it stores `h` in bf16 and the norm
squares it (37 and 24). A widening cast read by nothing but element-wise work
(a head's `logits.float()`) still sinks: the GEMM stores the f32 value once.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import element_bytes, element_of, shape_of, tensor
from irc.ir.value_names import set_value_name


def _leading_split(op: graph.ReshapeOp) -> bool:
    """[M, N] -> [.., N] with the same N: only the leading dimension is split."""
    src, dst = shape_of(op.input.type), shape_of(op.result.type)
    return len(src) == 2 and len(dst) > 2 and src[-1] == dst[-1]


def _reshaped(value: SSAValue, shape: tuple[int, ...], before: Operation, name: str) -> SSAValue:
    while isinstance(value.owner, graph.ReshapeOp):
        value = value.owner.input
    if shape_of(value.type) == shape:
        return value
    op = graph.ReshapeOp.make(value, result_type=tensor(shape, element_of(value.type)))
    _insert_before(op, before)
    set_value_name(op.results[0], name)
    return op.results[0]


def _erase(op: Operation) -> None:
    block = op.parent_block()
    assert block is not None
    block.erase_op(op)


def _insert_before(new: Operation, existing: Operation) -> None:
    block = existing.parent_block()
    assert block is not None
    block.insert_op_before(new, existing)


def _widens(op: graph.ElementwiseOp) -> bool:
    """A cast to a type of more bytes (bf16 to f32)."""
    return isinstance(op, graph.CastOp) and element_bytes(element_of(op.results[0].type)) > (
        element_bytes(element_of(op.operands[0].type))
    )


def _feeds_reduction(op: Operation) -> bool:
    """Whether `op`'s value reaches a reduction (or a softmax or layer norm) through
    element-wise ops and reshapes."""
    seen: set[Operation] = set()
    stack = [op]
    while stack:
        for use in stack.pop().results[0].uses:
            user = use.operation
            if isinstance(user, graph.ReduceOp | graph.SoftmaxOp | graph.LayerNormOp):
                return True
            if isinstance(user, graph.ElementwiseOp | graph.ReshapeOp) and user not in seen:
                seen.add(user)
                stack.append(user)
    return False


def _sink_once(op: graph.ElementwiseOp) -> bool:
    if _widens(op) and _feeds_reduction(op):
        return False
    out = shape_of(op.results[0].type)
    views = [
        v.owner for v in op.operands
        if isinstance(v.owner, graph.ReshapeOp) and _leading_split(v.owner)
        and shape_of(v.type) == out
    ]  # fmt: skip
    if not views:
        return False
    flat = shape_of(views[0].input.type)
    name = op.results[0].name_hint or "v"
    operands: list[SSAValue] = []
    for v in op.operands:
        shape = shape_of(v.type)
        if shape == out:
            operands.append(_reshaped(v, flat, op, f"{name}.in"))
        elif all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, flat[-1])):
            operands.append(_reshaped(v, shape[-1:], op, f"{name}.in") if len(shape) > 1 else v)
        else:
            return False  # broadcasts along a leading dimension: the 2-D form would not
    props = dict(op.properties)
    result_type = tensor(flat, element_of(op.results[0].type))
    flat_op = type(op).make(*operands, result_type=result_type, **props)
    _insert_before(flat_op, op)
    set_value_name(flat_op.results[0], name)
    back = graph.ReshapeOp.make(flat_op.results[0], result_type=op.results[0].type)
    _insert_before(back, op)
    set_value_name(back.results[0], f"{name}.view")
    op.results[0].replace_all_uses_with(back.results[0])
    _erase(op)
    return True


def _fold_reshape(op: graph.ReshapeOp) -> bool:
    inner = op.input.owner
    if not isinstance(inner, graph.ReshapeOp):
        return False
    source = inner.input
    if shape_of(source.type) == shape_of(op.result.type):
        op.results[0].replace_all_uses_with(source)
        _erase(op)
        return True
    op.operands[0] = source
    return True


def sink_views(fn: func.FuncOp) -> None:
    """Rewrites `fn` in place until no element-wise op reads a split 2-D value."""
    changed = True
    while changed:
        changed = False
        for op in list(fn.body.block.ops):
            if op.parent is None:
                continue
            if isinstance(op, graph.ElementwiseOp):
                changed |= _sink_once(op)
            elif isinstance(op, graph.ReshapeOp):
                changed |= _fold_reshape(op)
        for op in reversed(list(fn.body.block.ops)):
            if isinstance(op, graph.ReshapeOp) and not op.results[0].uses:
                _erase(op)
