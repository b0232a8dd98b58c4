"""Core ATen ops as graph ops: one converter an op overload.

A converter reads the FX node's arguments and `meta['val']` (torch's result
type, which decides the computation dtype, as torch's type promotion does)
and emits graph ops through an `Emitter`; it raises `Unsupported` for a case
irc does not take (the node then runs in eager, and the report says so).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute, SSAValue

from irc.dialects import graph
from irc.ir.types import F32, FLOAT_TYPES, HALF_TYPES, I1, element_of, shape_of, tensor
from irc.pytorch.emitter import Emitter, Unsupported, boolean, dtype_elem, int_list
from irc.pytorch.types import fake_of

aten = torch.ops.aten
Converter = Callable[[Emitter, fx.Node], Any]
CONVERTERS: dict[Any, Converter] = {}


def converts(*targets: Any) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for t in targets:
            CONVERTERS[t] = fn
        return fn

    return register


def out_elem(node: fx.Node) -> Attribute:
    val = fake_of(node)
    if val is None:
        raise Unsupported("its result is not a tensor")
    return dtype_elem(val.dtype)


def out_shape(node: fx.Node) -> list[int]:
    val = fake_of(node)
    assert val is not None
    return [int(d) for d in val.shape]


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _dims(dims: Any, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        return [dims % rank if rank else 0]
    return [d % rank for d in dims]


def _compute_elem(e: Emitter, node: fx.Node, operands: Sequence[Any]) -> Attribute:
    """The dtype an element-wise op computes in: torch's promotion of its operands."""
    tensors = [fake_of(a) for a in operands if isinstance(a, fx.Node)]
    scalars = [a for a in operands if not isinstance(a, fx.Node)]
    dtype = torch.result_type(
        *(t for t in tensors if t is not None), *scalars
    ) if len(tensors) + len(scalars) == 2 else None
    if dtype is None:
        return out_elem(node)
    return dtype_elem(dtype)


# --- element-wise ------------------------------------------------------------

_UNARY: dict[Any, type[graph.GraphOp]] = {
    aten.exp.default: graph.ExpOp,
    aten.log.default: graph.LogOp,
    aten.sqrt.default: graph.SqrtOp,
    aten.rsqrt.default: graph.RsqrtOp,
    aten.sin.default: graph.SinOp,
    aten.cos.default: graph.CosOp,
    aten.tanh.default: graph.TanhOp,
    aten.sigmoid.default: graph.SigmoidOp,
    aten.silu.default: graph.SiluOp,
    aten.relu.default: graph.ReluOp,
    aten.neg.default: graph.NegOp,
    aten.abs.default: graph.AbsOp,
    aten.erf.default: graph.ErfOp,
    aten.reciprocal.default: graph.ReciprocalOp,
    aten.floor.default: graph.FloorOp,
    aten.ceil.default: graph.CeilOp,
    aten.round.default: graph.RoundOp,
}


def _unary(e: Emitter, node: fx.Node) -> SSAValue:
    cls = _UNARY[node.target]
    x = e.cast(e.arg(node.args[0]), out_elem(node))
    return e.op(cls, x)


for _target in _UNARY:
    CONVERTERS[_target] = _unary

_BINARY: dict[Any, type[graph.GraphOp]] = {
    aten.add.Tensor: graph.AddOp,
    aten.add.Scalar: graph.AddOp,
    aten.sub.Tensor: graph.SubOp,
    aten.sub.Scalar: graph.SubOp,
    aten.mul.Tensor: graph.MulOp,
    aten.mul.Scalar: graph.MulOp,
    aten.div.Tensor: graph.DivOp,
    aten.div.Scalar: graph.DivOp,
    aten.maximum.default: graph.MaximumOp,
    aten.minimum.default: graph.MinimumOp,
    aten.pow.Tensor_Tensor: graph.PowOp,
    aten.pow.Tensor_Scalar: graph.PowOp,
    aten.pow.Scalar: graph.PowOp,
}
_COMPARE: dict[Any, type[graph.GraphOp]] = {}
for _cls in graph.ELEMENTWISE_OPS:
    if _cls.COMPARISON is not None:  # aten names its comparisons as graph does
        _COMPARE[getattr(aten, _cls.FN).Tensor] = _cls
        _COMPARE[getattr(aten, _cls.FN).Scalar] = _cls


def _binary(e: Emitter, node: fx.Node) -> SSAValue:
    cls = _BINARY[node.target]
    a, b = node.args[0], node.args[1]
    elem = out_elem(node)
    if elem == I1:
        return _bool_binary(e, node)
    if issubclass(cls, graph.BinaryOp) and cls.KIND == "float" and elem not in FLOAT_TYPES:
        raise Unsupported(f"integer {cls.FN} is not a graph op (graph.{cls.FN} takes floats)")
    lhs, rhs = e.operand(a, elem), e.operand(b, elem)
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        rhs = e.op(graph.MulOp, rhs, e.scalar(alpha, elem))
    return e.op(cls, lhs, rhs)


def _compare(e: Emitter, node: fx.Node) -> SSAValue:
    cls = _COMPARE[node.target]
    a, b = node.args[0], node.args[1]
    elem = _compute_elem(e, node, [a, b])
    return e.op(cls, e.operand(a, elem), e.operand(b, elem))


for _target in _BINARY:
    CONVERTERS[_target] = _binary
for _target in _COMPARE:
    CONVERTERS[_target] = _compare


def _to_bool(e: Emitter, value: SSAValue) -> SSAValue:
    if element_of(value.type) == I1:
        return value
    return e.op(graph.NeOp, value, e.scalar(0, element_of(value.type)))


_LOGICAL = {
    aten.logical_not.default: "not", aten.logical_and.default: "and",
    aten.logical_or.default: "or", aten.logical_xor.default: "xor",
    aten.bitwise_not.default: "not", aten.bitwise_and.Tensor: "and",
    aten.bitwise_or.Tensor: "or", aten.bitwise_xor.Tensor: "xor",
}  # fmt: skip


_BOOL_ARITHMETIC = {
    aten.mul.Tensor: "and", aten.mul.Scalar: "and", aten.minimum.default: "and",
    aten.add.Tensor: "or", aten.add.Scalar: "or", aten.maximum.default: "or",
}  # fmt: skip
"""Arithmetic on bool tensors, as torch computes it: a product is true where both
are (`isfinite`'s decomposition multiplies two masks), a sum where either is."""


def _truth(e: Emitter, which: str, a: SSAValue, b: SSAValue) -> SSAValue:
    """`a and b`, `a or b` or `a xor b` of two i1 values."""
    if which == "and":
        return e.op(graph.WhereOp, a, b, e.scalar(False, I1))
    if which == "or":
        return e.op(graph.WhereOp, a, e.scalar(True, I1), b)
    return e.op(graph.NeOp, a, b)


def _bool_binary(e: Emitter, node: fx.Node) -> SSAValue:
    which = _BOOL_ARITHMETIC.get(node.target)
    if which is None or node.kwargs.get("alpha", 1) != 1:
        raise Unsupported(f"{node.target} of bool tensors is not a graph op")
    return _truth(e, which, e.operand(node.args[0], I1), e.operand(node.args[1], I1))


@converts(*_LOGICAL)
def _logical(e: Emitter, node: fx.Node) -> SSAValue:
    """Truth-value ops (nonzero is true); the bitwise ones of masks (bool tensors)
    only, as integer bits have no graph op."""
    if node.target._overloadpacket.__name__.startswith("bitwise") and out_elem(node) != I1:  # type: ignore[union-attr]
        raise Unsupported("bitwise ops on integers are not graph ops")
    a = _to_bool(e, e.arg(node.args[0]))
    which = _LOGICAL[node.target]
    if which == "not":
        return e.op(graph.EqOp, a, e.scalar(False, I1))
    return _truth(e, which, a, _to_bool(e, e.arg(node.args[1])))


@converts(aten.where.self)
def _where(e: Emitter, node: fx.Node) -> SSAValue:
    elem = out_elem(node)
    cond = _to_bool(e, e.arg(node.args[0]))
    return e.op(graph.WhereOp, cond, e.operand(node.args[1], elem), e.operand(node.args[2], elem))


@converts(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(e: Emitter, node: fx.Node) -> SSAValue:
    elem = out_elem(node)
    x, mask, value = node.args[:3]
    return e.op(graph.WhereOp, _to_bool(e, e.arg(mask)), e.operand(value, elem), e.operand(x, elem))


@converts(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default,
          aten.clamp_max.default, aten.hardtanh.default)  # fmt: skip
def _clamp(e: Emitter, node: fx.Node) -> SSAValue:
    """Bounds that are numbers or tensors; hardtanh (ReLU6) is a clamp to [-1, 1] unless told."""
    elem = out_elem(node)
    x = e.operand(node.args[0], elem)
    if node.target == aten.clamp_min.default:
        low, high = node.args[1], None
    elif node.target == aten.clamp_max.default:
        low, high = None, node.args[1]
    elif node.target == aten.hardtanh.default:
        low, high = _arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)
    else:
        low, high = _arg(node, 1, "min"), _arg(node, 2, "max")
    if low is not None:
        x = e.op(graph.MaximumOp, x, e.operand(low, elem))
    if high is not None:
        x = e.op(graph.MinimumOp, x, e.operand(high, elem))
    return x


def _in_f32(e: Emitter, x: SSAValue) -> SSAValue:
    """Half-precision inputs of a multi-op formula compute in f32, as torch's kernels do."""
    return e.cast(x, F32) if element_of(x.type) in HALF_TYPES else x


@converts(aten.gelu.default)
def _gelu(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate == "none":
        return e.op(graph.GeluOp, x)
    if approximate != "tanh":
        raise Unsupported(f"gelu approximate={approximate!r}")
    return e.op(graph.GeluOp, x, approximate=StringAttr("tanh"))


# --- type, layout, creation --------------------------------------------------


@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          aten.view_copy.default, aten.flatten.using_ints)  # fmt: skip
def _reshape(e: Emitter, node: fx.Node) -> SSAValue:
    return e.reshape(e.arg(node.args[0]), out_shape(node))


@converts(aten.permute.default, aten.permute_copy.default)
def _permute(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    rank = len(shape_of(x.type))
    perm = [p % rank for p in node.args[1]]
    if perm == list(range(rank)):
        return x
    return e.op(graph.TransposeOp, x, perm=int_list(perm))


@converts(aten.t.default, aten.transpose.int)
def _transpose(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    rank = len(shape_of(x.type))
    if rank < 2:
        return x
    a, b = (node.args[1] % rank, node.args[2] % rank) if len(node.args) > 2 else (0, 1)
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return e.op(graph.TransposeOp, x, perm=int_list(perm))


@converts(aten.expand.default, aten.expand_copy.default)
def _expand(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    shape = out_shape(node)
    if list(shape_of(x.type)) == shape:
        return x
    return e.op(graph.BroadcastOp, x, result_type=tensor(shape, element_of(x.type)))


@converts(aten.clone.default, aten.alias.default, aten.detach.default,
          aten.lift_fresh_copy.default, aten.contiguous.default)  # fmt: skip
def _identity(e: Emitter, node: fx.Node) -> SSAValue:
    return e.arg(node.args[0])


@converts(aten._to_copy.default)
def _to_copy(e: Emitter, node: fx.Node) -> SSAValue:
    src, val = fake_of(node.args[0]), fake_of(node)  # type: ignore[arg-type]
    if src is None or val is None or src.device != val.device:
        raise Unsupported("it moves a tensor between devices")
    return e.cast(e.arg(node.args[0]), out_elem(node))


@converts(aten.full.default, aten.full_like.default, aten.scalar_tensor.default,
          aten.zeros.default, aten.ones.default, aten.zeros_like.default,
          aten.ones_like.default, aten.new_full.default, aten.new_zeros.default,
          aten.new_ones.default)  # fmt: skip
def _full(e: Emitter, node: fx.Node) -> SSAValue:
    name = node.target._overloadpacket.__name__  # type: ignore[union-attr]
    if name.startswith("zeros") or name == "new_zeros":
        value: Any = 0
    elif name.startswith("ones") or name == "new_ones":
        value = 1
    elif name == "scalar_tensor":
        value = node.args[0]
    elif name == "new_full":
        value = node.args[2]
    else:
        value = node.args[1]
    if not isinstance(value, bool | int | float):
        raise Unsupported("its fill value is not a number")
    return e.constant(value, tensor(out_shape(node), out_elem(node)))


# --- reductions, contractions, composites ------------------------------------


def _reduce(
    e: Emitter, cls: type[graph.GraphOp], x: SSAValue, dims: list[int], keep: bool
) -> SSAValue:
    if not shape_of(x.type):  # a rank-0 reduction is the value itself
        return x
    return e.op(cls, x, dims=int_list(dims), keepdim=boolean(keep))


@converts(aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
          aten.sum.default, aten.mean.default, aten.any.dim, aten.any.dims,
          aten.any.default, aten.max.default, aten.min.default)  # fmt: skip
def _reduction(e: Emitter, node: fx.Node) -> SSAValue:
    name = node.target._overloadpacket.__name__  # type: ignore[union-attr]
    x = e.arg(node.args[0])
    rank = len(shape_of(x.type))
    dims = _dims(_arg(node, 1, "dim"), rank)
    keep = bool(_arg(node, 2, "keepdim", False))
    elem = out_elem(node)
    if name == "any":
        return _any(e, _to_bool(e, x), dims, keep)
    cls = {"sum": graph.ReduceSumOp, "mean": graph.ReduceMeanOp,
           "amax": graph.ReduceMaxOp, "amin": graph.ReduceMinOp,
           "max": graph.ReduceMaxOp, "min": graph.ReduceMinOp}[name]  # fmt: skip
    if name in ("sum", "mean"):
        x = e.cast(x, elem)
    return _reduce(e, cls, x, dims, keep)


def _any(e: Emitter, mask: SSAValue, dims: list[int], keep: bool) -> SSAValue:
    """Whether any of an i1 tensor's elements along `dims` is true (a max of 0s and 1s)."""
    counted = e.cast(mask, dtype_elem(torch.int32))
    return e.cast(_reduce(e, graph.ReduceMaxOp, counted, dims, keep), I1)


def _variance(
    e: Emitter, x: SSAValue, dims: list[int], correction: float, keep: bool
) -> tuple[SSAValue, SSAValue]:
    """(var, mean) over `dims`: the two-pass formula, in f32 for half inputs."""
    xf = _in_f32(e, x)
    mean = e.op(graph.ReduceMeanOp, xf, dims=int_list(dims), keepdim=boolean(True))
    d = e.op(graph.SubOp, xf, mean)
    sq = e.op(graph.ReduceSumOp, e.op(graph.MulOp, d, d), dims=int_list(dims), keepdim=boolean(keep))
    count = math.prod(shape_of(x.type)[i] for i in dims)
    var = e.op(graph.DivOp, sq, e.scalar(max(count - correction, 0), element_of(xf.type)))
    if not keep:
        mean = e.reshape(mean, list(shape_of(var.type)))
    return var, mean


@converts(aten.var.correction, aten.var_mean.correction)
def _var(e: Emitter, node: fx.Node) -> Any:
    x = e.arg(node.args[0])
    dims = _dims(_arg(node, 1, "dim"), len(shape_of(x.type)))
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    var, mean = _variance(e, x, dims, correction, bool(node.kwargs.get("keepdim", False)))
    elem = element_of(x.type)
    if node.target == aten.var.correction:
        return e.cast(var, elem)
    return [e.cast(var, elem), e.cast(mean, elem)]


@converts(aten.mm.default, aten.bmm.default)
def _matmul(e: Emitter, node: fx.Node) -> SSAValue:
    return e.op(graph.MatmulOp, e.arg(node.args[0]), e.arg(node.args[1]))


@converts(aten.addmm.default)
def _addmm(e: Emitter, node: fx.Node) -> SSAValue:
    bias, a, b = (e.arg(x) for x in node.args[:3])
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    elem = element_of(a.type)
    prod = e.op(graph.MatmulOp, a, b)
    if alpha != 1:
        prod = e.op(graph.MulOp, prod, e.scalar(alpha, elem))
    if beta != 1:
        bias = e.op(graph.MulOp, bias, e.scalar(beta, elem))
    return e.op(graph.AddOp, prod, bias)


@converts(aten._softmax.default)
def _softmax(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.cast(e.arg(node.args[0]), out_elem(node))
    return e.op(graph.SoftmaxOp, x, dim=IntegerAttr(node.args[1], i64))


@converts(aten._log_softmax.default)
def _log_softmax(e: Emitter, node: fx.Node) -> SSAValue:
    """x - max - log(sum(exp(x - max))): exact where log(softmax) underflows."""
    elem = out_elem(node)
    x = _in_f32(e, e.cast(e.arg(node.args[0]), elem))
    dim = [node.args[1] % max(len(shape_of(x.type)), 1)]
    m = e.op(graph.ReduceMaxOp, x, dims=int_list(dim), keepdim=boolean(True))
    shifted = e.op(graph.SubOp, x, m)
    total = e.op(graph.ReduceSumOp, e.op(graph.ExpOp, shifted), dims=int_list(dim),
                 keepdim=boolean(True))  # fmt: skip
    return e.cast(e.op(graph.SubOp, shifted, e.op(graph.LogOp, total)), elem)


@converts(aten.native_layer_norm.default)
def _layer_norm(e: Emitter, node: fx.Node) -> list[SSAValue | None]:
    x = e.arg(node.args[0])
    normalized = list(node.args[1])
    shape = list(shape_of(x.type))
    elem = element_of(x.type)
    dims = list(range(len(shape) - len(normalized), len(shape)))
    weight, bias, eps = node.args[2], node.args[3], node.args[4]
    w = e.arg(weight) if weight is not None else e.constant(1, tensor(normalized, elem))
    b = e.arg(bias) if bias is not None else e.constant(0, tensor(normalized, elem))
    out = e.op(graph.LayerNormOp, x, w, b, dims=int_list(dims), eps=FloatAttr(float(eps), f64))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    results: list[SSAValue | None] = [out, None, None]
    if used & {1, 2}:
        vals = node.meta["val"]
        var, mean = _variance(e, x, dims, 0, True)
        rstd = e.op(graph.RsqrtOp, e.op(graph.AddOp, var, e.scalar(eps, element_of(var.type))))
        results[1] = e.cast(mean, dtype_elem(vals[1].dtype))
        results[2] = e.cast(rstd, dtype_elem(vals[2].dtype))
    return results


@converts(operator.getitem)
def _getitem(e: Emitter, node: fx.Node) -> SSAValue:
    source, index = node.args
    found = e.values.get(source)
    if not isinstance(found, list | tuple) or found[index] is None:  # type: ignore[index]
        raise Unsupported("it takes an item of a value irc does not hold")
    return found[index]  # type: ignore[index]


# --- slices and joins ---------------------------------------------------------


def _slice(e: Emitter, x: SSAValue, dim: int, start: int, end: int, step: int = 1) -> SSAValue:
    shape = list(shape_of(x.type))
    dim %= len(shape)
    start, end, _ = slice(start, end, step).indices(shape[dim])
    if (start, end, step) == (0, shape[dim], 1):
        return x
    starts, ends, steps = [0] * len(shape), list(shape), [1] * len(shape)
    starts[dim], ends[dim], steps[dim] = start, max(end, start), step
    return e.op(graph.SliceOp, x, start=int_list(starts), end=int_list(ends), step=int_list(steps))


@converts(aten.slice.Tensor)
def _slice_tensor(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    dim = _arg(node, 1, "dim", 0)
    start, end, step = _arg(node, 2, "start", None), _arg(node, 3, "end", None), _arg(node, 4, "step", 1)
    return _slice(e, x, dim, start, end, step or 1)


@converts(aten.split_with_sizes.default, aten.split.Tensor)
def _split(e: Emitter, node: fx.Node) -> list[SSAValue]:
    x = e.arg(node.args[0])
    dim = _arg(node, 2, "dim", 0) % len(shape_of(x.type))
    size = shape_of(x.type)[dim]
    sizes = node.args[1]
    if isinstance(sizes, int):
        sizes = [min(sizes, size - s) for s in range(0, size, sizes)]
    out, start = [], 0
    for s in sizes:
        out.append(_slice(e, x, dim, start, start + s))
        start += s
    return out


@converts(aten.cat.default)
def _cat(e: Emitter, node: fx.Node) -> SSAValue:
    elem = out_elem(node)
    parts = [e.cast(e.arg(t), elem) for t in node.args[0]]
    parts = [p for p in parts if 0 not in shape_of(p.type)]
    dim = _arg(node, 1, "dim", 0)
    if len(parts) == 1:
        return parts[0]
    return e.op(graph.ConcatOp, *parts, dim=IntegerAttr(dim, i64))


@converts(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(e: Emitter, node: fx.Node) -> SSAValue:
    """start + step * iota: the numbers torch.arange gives."""
    args = list(node.args)
    if node.target == aten.arange.default:
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
    if not all(isinstance(v, int | float) for v in (start, step)):
        raise Unsupported("its bounds are not numbers")
    out = tensor(out_shape(node), out_elem(node))
    value = e.op(graph.IotaOp, result_type=out, dim=IntegerAttr(0, i64))
    if step != 1:
        value = e.op(graph.MulOp, value, e.scalar(step, element_of(out)))
    if start != 0:
        value = e.op(graph.AddOp, value, e.scalar(start, element_of(out)))
    return value


# --- indexing ----------------------------------------------------------------


def _index_tensor(e: Emitter, value: Any) -> SSAValue:
    index = e.arg(value)
    if element_of(index.type) not in (dtype_elem(torch.int64), dtype_elem(torch.int32)):
        raise Unsupported("its indices are not i32 or i64")
    return index


def _from_the_end(e: Emitter, index: SSAValue, size: int) -> SSAValue:
    """Negative indices counted from the end of a dim `size` long, as torch's `x[i]`."""
    elem = element_of(index.type)
    negative = e.op(graph.LtOp, index, e.scalar(0, elem))
    return e.op(graph.WhereOp, negative, e.op(graph.AddOp, index, e.scalar(size, elem)), index)


@converts(aten.index_select.default)
def _index_select(e: Emitter, node: fx.Node) -> SSAValue:
    x, dim, index = node.args[:3]
    return e.op(graph.IndexSelectOp, e.arg(x), _index_tensor(e, index), dim=IntegerAttr(dim, i64))


@converts(aten.embedding.default)
def _embedding(e: Emitter, node: fx.Node) -> SSAValue:
    weight, indices = node.args[:2]
    return e.op(
        graph.IndexSelectOp, e.arg(weight), _index_tensor(e, indices), dim=IntegerAttr(0, i64)
    )


@converts(aten.gather.default)
def _gather(e: Emitter, node: fx.Node) -> SSAValue:
    x, dim, index = node.args[:3]
    return e.op(graph.GatherOp, e.arg(x), _index_tensor(e, index), dim=IntegerAttr(dim, i64))


@converts(aten.index.Tensor)
def _index(e: Emitter, node: fx.Node) -> SSAValue:
    """`x[..., idx, ...]` and `x[i, j]` (index tensors broadcast together), a
    negative index counting from the end as in torch: one index_select, over the
    indexed dims merged into one by the linear index `i * size_j + j`, each index
    clamped into its own dim first (as index_select clamps one). Indexed dims
    apart (`x[i, :, j]`) are moved first, where torch puts their result."""
    x = e.arg(node.args[0])
    given = [(d, i) for d, i in enumerate(node.args[1]) if i is not None]
    if any(fake_of(i) is not None and fake_of(i).dtype == torch.bool for _, i in given):  # type: ignore[union-attr]
        raise Unsupported("a boolean mask index has a data-dependent shape")
    dims = [d for d, _ in given]
    shape = list(shape_of(x.type))
    if dims != list(range(dims[0], dims[0] + len(dims))):
        perm = dims + [d for d in range(len(shape)) if d not in dims]
        x = e.op(graph.TransposeOp, x, perm=int_list(perm))
        shape, dims = [shape[p] for p in perm], list(range(len(dims)))
    index = dtype_elem(torch.int64)
    linear: SSAValue | None = None
    for d, (_, node_index) in zip(dims, given, strict=True):
        i = _from_the_end(e, e.cast(_index_tensor(e, node_index), index), shape[d])
        if len(dims) > 1:
            i = e.op(graph.MinimumOp, e.op(graph.MaximumOp, i, e.scalar(0, index)), e.scalar(shape[d] - 1, index))
        if linear is not None:
            i = e.op(graph.AddOp, e.op(graph.MulOp, linear, e.scalar(shape[d], index)), i)
        linear = i
    assert linear is not None
    first, last = dims[0], dims[-1] + 1
    x = e.reshape(x, [*shape[:first], math.prod(shape[first:last]), *shape[last:]])
    return e.op(graph.IndexSelectOp, x, linear, dim=IntegerAttr(first, i64))


@converts(aten.scaled_dot_product_attention.default)
def _attention(e: Emitter, node: fx.Node) -> SSAValue:
    """SDPA as graph.attention: q, k, v, an optional mask; scale and is_causal."""
    q, k, v = (e.arg(a) for a in node.args[:3])
    mask = _arg(node, 3, "attn_mask")
    if _arg(node, 4, "dropout_p", 0.0):
        raise Unsupported("dropout")
    operands = [q, k, v] + ([e.arg(mask)] if mask is not None else [])
    props: dict[str, Attribute] = {}
    scale = node.kwargs.get("scale", node.args[6] if len(node.args) > 6 else None)
    if scale is not None:
        props["scale"] = FloatAttr(float(scale), f64)
    if _arg(node, 5, "is_causal", False):
        props["is_causal"] = boolean(True)
    return e.op(graph.AttentionOp, *operands, **props)
