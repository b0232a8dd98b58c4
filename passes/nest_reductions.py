"""Nests a reduction over several dims inside the row reduction its input is made from.

Layer norm followed by `amax(abs(y))` over the whole tensor (Inductor's
test_reduction_pointwise_multi_level_reduction): `y` is computed per row from
the rows' mean and variance, reductions over dim 1. The full `amax` is over dims
[0, 1], another space, so fusion cannot put it in the layer norm's kernel; a
second kernel then reads `x` again (and `y`'s epilogue goes with it).

Written as `amax(amax(y, [1]), [0, 1])`, the inner reduction is over the layer
norm's own dims: it joins that kernel (each program's rows reduced while they
are in registers), and the outer one reduces one value a row. `x` is read once.

Only where the result does not change: max and min of any type, sums and means
of f32, f64 and integers (a half-precision inner sum would round to half before
the outer one, which torch does not do). A mean of means over equal counts is
the mean.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr, IntegerType
from xdsl.ir import Block, SSAValue

from irc.dialects import graph
from irc.ir.types import HALF_TYPES, element_of, int_array, shape_of
from irc.ir.value_names import set_value_name, written_label

EXACT_ANY_TYPE = frozenset({"max", "min"})
"""Combining kinds (`graph.ReduceOp.COMBINE`) whose nesting changes no bit whatever
the element type."""


def row_reduction_feeding(op: graph.ReduceOp) -> graph.ReduceOp | None:
    """A reduction over a proper subset of `op`'s dims, of an input of `op`'s input's
    shape, that `op`'s input is computed from through element-wise ops."""
    dims = set(op.reduced_dims())
    shape = shape_of(op.input.type)
    stack, seen = [op.input], set[SSAValue]()
    while stack:
        owner = stack.pop().owner
        if isinstance(owner, graph.ReduceOp):
            inner = set(owner.reduced_dims())
            if shape_of(owner.input.type) == shape and inner < dims:
                return owner
        elif isinstance(owner, graph.ElementwiseOp):
            for v in owner.operands:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
    return None


def nest_reductions(block: Block) -> list[str]:
    """Rewrites each reduction of `block` over several dims whose input is computed
    from a row reduction over some of them (`row_reduction_feeding`) into a
    reduction over those dims (kept, size 1) and one over all of them of that.
    Returns a line for the fusion report for each one nested."""
    notes: list[str] = []
    for op in list(block.ops):
        if not isinstance(op, graph.ReduceOp) or len(op.reduced_dims()) < 2:
            continue
        element = element_of(op.result.type)
        if op.COMBINE not in EXACT_ANY_TYPE and element in HALF_TYPES:
            continue
        anchor = row_reduction_feeding(op)
        if anchor is None:
            continue
        dims = sorted(op.reduced_dims())
        keep = IntegerAttr(1, IntegerType(1))
        inner_dims = sorted(anchor.reduced_dims())
        inner = type(op).make(op.input, dims=int_array(inner_dims), keepdim=keep)
        props = dict(op.properties)
        outer = type(op).make(inner, result_type=op.result.type, **props)
        inner.location = outer.location = op.location
        block.insert_ops_before([inner, outer], op)
        name = op.result.name_hint
        op.result.replace_all_uses_with(outer.results[0])
        block.erase_op(op)
        if name is not None:
            set_value_name(outer.results[0], name)
            set_value_name(inner.results[0], name + "_rows")
        label = written_label(outer)
        notes.append(
            f"{label} over dims {dims} nested: dims {inner_dims} first, "
            f"in the kernel of the reduction over them that its input is computed from"
        )
    return notes
