"""Core ATen ops irc has no graph op for, as short formulas over graph ops.

A model that uses ELU, softplus, `x[:, 0]`, `F.pad`, `argmax` or group norm
should not leave an eager island for them. Each formula here gives what
torch's kernel gives: exactly for the selections and comparisons (sign,
trunc, argmax, pads, flips, `select`), and to torch's accuracy for log1p and
expm1, whose obvious forms (`log(1 + x)`, `exp(x) - 1`) lose every digit for
small `x`; near zero they are series that need neither an exact `log` nor an
exact `exp` from the device.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from xdsl.dialects.builtin import IntegerAttr, i64
from xdsl.ir import SSAValue

from irc.dialects import graph
from irc.ir.types import ELEMENT_TYPES, FLOAT_TYPES, I1, element_of, shape_of, tensor
from irc.passes.fuse import MAX_OPS
from irc.pytorch.aten import (
    _any,
    _arg,
    _dims,
    _from_the_end,
    _in_f32,
    _index_tensor,
    _reduce,
    _slice,
    converts,
    out_elem,
    out_shape,
)
from irc.pytorch.emitter import Emitter, Unsupported, int_list
from irc.pytorch.types import fake_of

aten = torch.ops.aten

INDEX = ELEMENT_TYPES["i64"]
"""The element type of indices, as torch's int64."""

SERIES_BOUND = 0.25
"""|x| below which log1p and expm1 take their series (the direct forms lose at
most two bits above it: 1 + x and e**x - 1 cancel by at most a factor 5)."""


def _float_operand(e: Emitter, node: fx.Node) -> tuple[SSAValue, Any]:
    """The node's first argument in its result type, widened to f32 if half."""
    elem = out_elem(node)
    if elem not in FLOAT_TYPES:
        raise Unsupported("its result is not floating-point")
    return _in_f32(e, e.cast(e.arg(node.args[0]), elem)), elem


def _num(e: Emitter, value: float, like: SSAValue) -> SSAValue:
    return e.scalar(value, element_of(like.type))


def _where(e: Emitter, cond: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
    return e.op(graph.WhereOp, cond, a, b)


def _small(e: Emitter, x: SSAValue) -> SSAValue:
    return e.op(graph.LtOp, e.op(graph.AbsOp, x), _num(e, SERIES_BOUND, x))


def _horner(e: Emitter, x: SSAValue, coefficients: list[float]) -> SSAValue:
    """c0 + x (c1 + x (c2 + ...))."""
    acc = _num(e, coefficients[-1], x)
    for c in reversed(coefficients[:-1]):
        acc = e.op(graph.AddOp, e.op(graph.MulOp, x, acc), _num(e, c, x))
    return acc


def log1p(e: Emitter, x: SSAValue) -> SSAValue:
    """log(1 + x); near 0 as 2 atanh(s), s = x / (2 + x): 2 (s + s^3/3 + ... + s^11/11)."""
    s = e.op(graph.DivOp, x, e.op(graph.AddOp, x, _num(e, 2.0, x)))
    series = e.op(graph.MulOp, s, _horner(e, e.op(graph.MulOp, s, s), [2 / (2 * k + 1) for k in range(6)]))
    direct = e.op(graph.LogOp, e.op(graph.AddOp, x, _num(e, 1.0, x)))
    return _where(e, _small(e, x), series, direct)


def expm1(e: Emitter, x: SSAValue) -> SSAValue:
    """e**x - 1; near 0 as x (1 + x/2 (1 + x/3 (...))) to x^9/9!."""
    series = _num(e, 1.0, x)
    for k in range(9, 1, -1):
        series = e.op(graph.AddOp, e.op(graph.MulOp, e.op(graph.MulOp, x, _num(e, 1 / k, x)), series),
                      _num(e, 1.0, x))  # fmt: skip
    series = e.op(graph.MulOp, x, series)
    direct = e.op(graph.SubOp, e.op(graph.ExpOp, x), _num(e, 1.0, x))
    return _where(e, _small(e, x), series, direct)


@converts(aten.log1p.default, aten.expm1.default)
def _log1p_expm1(e: Emitter, node: fx.Node) -> SSAValue:
    x, elem = _float_operand(e, node)
    formula = log1p if node.target == aten.log1p.default else expm1
    return e.cast(formula(e, x), elem)


@converts(aten.log2.default, aten.log10.default, aten.exp2.default)
def _log_exp_base(e: Emitter, node: fx.Node) -> SSAValue:
    x, elem = _float_operand(e, node)
    if node.target == aten.exp2.default:
        out = e.op(graph.ExpOp, e.op(graph.MulOp, x, _num(e, math.log(2.0), x)))
    else:
        base = 2.0 if node.target == aten.log2.default else 10.0
        out = e.op(graph.MulOp, e.op(graph.LogOp, x), _num(e, 1 / math.log(base), x))
    return e.cast(out, elem)


@converts(aten.elu.default)
def _elu(e: Emitter, node: fx.Node) -> SSAValue:
    """x > 0 ? scale x : alpha scale expm1(input_scale x) (ELU, SELU, CELU)."""
    x, elem = _float_operand(e, node)
    alpha, scale = _arg(node, 1, "alpha", 1.0), _arg(node, 2, "scale", 1.0)
    input_scale = _arg(node, 3, "input_scale", 1.0)
    positive = e.op(graph.MulOp, x, _num(e, scale, x))
    negative = e.op(graph.MulOp, expm1(e, e.op(graph.MulOp, x, _num(e, input_scale, x))),
                    _num(e, alpha * scale, x))  # fmt: skip
    out = _where(e, e.op(graph.GtOp, x, _num(e, 0.0, x)), positive, negative)
    return e.cast(out, elem)


@converts(aten.leaky_relu.default)
def _leaky_relu(e: Emitter, node: fx.Node) -> SSAValue:
    x, elem = _float_operand(e, node)
    slope = _arg(node, 1, "negative_slope", 0.01)
    out = _where(e, e.op(graph.GtOp, x, _num(e, 0.0, x)), x, e.op(graph.MulOp, x, _num(e, slope, x)))
    return e.cast(out, elem)


@converts(aten.sign.default)
def _sign(e: Emitter, node: fx.Node) -> SSAValue:
    """1, -1 or 0 (NaN and -0 give 0, as torch.sign)."""
    elem = out_elem(node)
    x = e.arg(node.args[0])
    if elem == I1:
        return x
    one, zero = e.scalar(1, elem), e.scalar(0, elem)
    negative = _where(e, e.op(graph.LtOp, x, zero), e.scalar(-1, elem), zero)
    return _where(e, e.op(graph.GtOp, x, zero), one, negative)


@converts(aten.trunc.default)
def _trunc(e: Emitter, node: fx.Node) -> SSAValue:
    elem = out_elem(node)
    x = e.arg(node.args[0])
    if elem not in FLOAT_TYPES:
        return x
    return _truncated(e, x)


def _truncated(e: Emitter, x: SSAValue) -> SSAValue:
    """A float rounded toward zero: ceil below 0, floor above."""
    negative = e.op(graph.LtOp, x, e.scalar(0, element_of(x.type)))
    return _where(e, negative, e.op(graph.CeilOp, x), e.op(graph.FloorOp, x))


@converts(aten.round.decimals)
def _round_decimals(e: Emitter, node: fx.Node) -> SSAValue:
    """torch.round(x, decimals=d) as torch computes it: round(x * 10^d) / 10^d, or
    round(x / 10^-d) * 10^-d for negative d (half to even, in the input's type)."""
    x, elem = e.arg(node.args[0]), out_elem(node)
    if elem not in FLOAT_TYPES:
        raise Unsupported("round with decimals takes floats")
    decimals = _arg(node, 1, "decimals", 0)
    scale = e.scalar(10.0 ** abs(decimals), elem)
    if decimals >= 0:
        return e.op(graph.DivOp, e.op(graph.RoundOp, e.op(graph.MulOp, x, scale)), scale)
    return e.op(graph.MulOp, e.op(graph.RoundOp, e.op(graph.DivOp, x, scale)), scale)


@converts(aten.isnan.default)
def _isnan(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    return e.op(graph.NeOp, x, x)


# --- norms and arg-reductions ----------------------------------------------------


@converts(aten.linalg_vector_norm.default)
def _vector_norm(e: Emitter, node: fx.Node) -> SSAValue:
    """sum(|x|^p)^(1/p), with p = 2, 1, inf, -inf and 0 as torch computes them."""
    elem = out_elem(node)
    if elem not in FLOAT_TYPES:
        raise Unsupported("its result is not floating-point")
    x = _in_f32(e, e.cast(e.arg(node.args[0]), elem))
    order = float(_arg(node, 1, "ord", 2))
    dims = _dims(_arg(node, 2, "dim"), len(shape_of(x.type)))
    keep = bool(_arg(node, 3, "keepdim", False))
    size = e.op(graph.AbsOp, x)
    if order == math.inf:
        out = _reduce(e, graph.ReduceMaxOp, size, dims, keep)
    elif order == -math.inf:
        out = _reduce(e, graph.ReduceMinOp, size, dims, keep)
    elif order == 0:
        nonzero = e.cast(e.op(graph.NeOp, x, _num(e, 0.0, x)), element_of(x.type))
        out = _reduce(e, graph.ReduceSumOp, nonzero, dims, keep)
    elif order == 1:
        out = _reduce(e, graph.ReduceSumOp, size, dims, keep)
    elif order == 2:
        out = e.op(graph.SqrtOp, _reduce(e, graph.ReduceSumOp, e.op(graph.MulOp, x, x), dims, keep))
    else:
        powered = e.op(graph.PowOp, size, _num(e, order, x))
        out = e.op(graph.PowOp, _reduce(e, graph.ReduceSumOp, powered, dims, keep), _num(e, 1 / order, x))
    return e.cast(out, elem)


def _arg_extreme(
    e: Emitter, x: SSAValue, dim: int | None, keep: bool, largest: bool
) -> tuple[SSAValue, SSAValue]:
    """(values, indices) of the first max (or min) along `dim`, a NaN first of all:
    torch's argmax/argmin and max/min(dim), from two reductions and an iota."""
    if element_of(x.type) == I1:
        raise Unsupported("arg-reductions of bool tensors")
    shape = list(shape_of(x.type))
    whole_shape = None  # the result's shape when the reduction is over every element
    if dim is None:  # of the flattened tensor
        whole_shape = [1] * len(shape) if keep else []
        x, dim = e.reshape(x, [math.prod(shape)]), 0
    else:
        dim %= max(len(shape), 1)
    if not shape_of(x.type):
        return x, e.constant(0, tensor([], INDEX))
    size = shape_of(x.type)[dim]
    reduce_cls = graph.ReduceMaxOp if largest else graph.ReduceMinOp
    extreme = _reduce(e, reduce_cls, x, [dim], True)
    hit = e.op(graph.EqOp, x, extreme)
    if element_of(x.type) in FLOAT_TYPES:  # a NaN is the extreme: the first NaN's index
        hit = _where(e, e.op(graph.NeOp, x, x), e.scalar(True, I1), hit)
    index = e.op(graph.IotaOp, result_type=tensor(shape_of(x.type), INDEX), dim=IntegerAttr(dim, i64))
    candidates = _where(e, hit, index, e.scalar(size, INDEX))
    indices = _reduce(e, graph.ReduceMinOp, candidates, [dim], keep)
    values = extreme if keep else e.reshape(extreme, list(shape_of(indices.type)))
    if whole_shape is not None:
        values, indices = e.reshape(values, whole_shape), e.reshape(indices, whole_shape)
    return values, indices


@converts(aten.argmax.default, aten.argmin.default)
def _argmax(e: Emitter, node: fx.Node) -> SSAValue:
    x = e.arg(node.args[0])
    dim, keep = _arg(node, 1, "dim"), bool(_arg(node, 2, "keepdim", False))
    return _arg_extreme(e, x, dim, keep, node.target == aten.argmax.default)[1]


@converts(aten.max.dim, aten.min.dim)
def _max_dim(e: Emitter, node: fx.Node) -> list[SSAValue]:
    x = e.arg(node.args[0])
    dim, keep = _arg(node, 1, "dim"), bool(_arg(node, 2, "keepdim", False))
    return list(_arg_extreme(e, x, dim, keep, node.target == aten.max.dim))


# --- layout: select, pad, flip, repeat, as_strided ---------------------------------


@converts(aten.select.int)
def _select(e: Emitter, node: fx.Node) -> SSAValue:
    """x[..., i, ...]: a slice of one, then the dimension dropped."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    dim = node.args[1] % len(shape)
    index = node.args[2]
    if not -shape[dim] <= index < shape[dim]:
        raise Unsupported(f"index {index} is out of range")
    index %= shape[dim]
    return e.reshape(_slice(e, x, dim, index, index + 1), out_shape(node))


@converts(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(e: Emitter, node: fx.Node) -> SSAValue:
    """x.diagonal(offset, dim1, dim2): the two dimensions moved last and merged, then
    every (columns + 1)-th element from the diagonal's first (torch puts the
    diagonal last)."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    rank = len(shape)
    offset = _arg(node, 1, "offset", 0)
    first, second = _arg(node, 2, "dim1", 0) % rank, _arg(node, 3, "dim2", 1) % rank
    kept = [d for d in range(rank) if d not in (first, second)]
    perm = [*kept, first, second]
    if perm != list(range(rank)):
        x = e.op(graph.TransposeOp, x, perm=int_list(perm))
    rows, columns = shape[first], shape[second]
    count = out_shape(node)[-1]
    start = offset if offset >= 0 else -offset * columns
    flat = e.reshape(x, [*(shape[d] for d in kept), rows * columns])
    return _slice(e, flat, -1, start, start + (count - 1) * (columns + 1) + 1, columns + 1)


@converts(aten.scatter.value, aten.scatter.src)
def _scatter(e: Emitter, node: fx.Node) -> SSAValue:
    """`x.scatter(dim, index, value)` as a select, where(iota == index, value, x)
    along `dim` (a one-hot: cross-entropy's backward), for an index that covers x
    whole in every other dimension. Several indices a row are each compared (any
    of them); a tensor `src` only with one index a row, where no two writes meet.
    An index out of range writes nothing (torch raises)."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    dim = node.args[1] % len(shape)
    index = _index_tensor(e, node.args[2])
    covers = list(shape_of(index.type))
    count = covers[dim]
    if covers[:dim] + covers[dim + 1 :] != shape[:dim] + shape[dim + 1 :]:
        raise Unsupported("its index covers part of the tensor")
    positions = e.op(graph.IotaOp, result_type=tensor(shape, INDEX), dim=IntegerAttr(dim, i64))
    index = e.cast(index, INDEX)
    if count == 1:
        hit = e.op(graph.EqOp, positions, index)
    else:  # [.., size, .., 1] against [.., 1, .., count]: a hit where any index is the position
        last = len(shape)
        moved = e.op(graph.TransposeOp, e.reshape(index, [*covers, 1]),
                     perm=int_list([*range(dim), last, *range(dim + 1, last), dim]))  # fmt: skip
        hit = _any(e, e.op(graph.EqOp, e.reshape(positions, [*shape, 1]), moved), [last], False)
    elem = element_of(x.type)
    if node.target == aten.scatter.value:
        value = e.operand(node.args[3], elem)
    elif count == 1:
        src = e.cast(e.arg(node.args[3]), elem)
        value = src if list(shape_of(src.type)) == covers else _window(e, src, covers)
    else:
        raise Unsupported("several indices a row write several values to one place")
    return _where(e, hit, value, x)


@converts(aten.index_put.default)
def _index_put(e: Emitter, node: fx.Node) -> SSAValue:
    """`x[mask] = v` and `x[..., idx, ...] = v` as torch.export functionalizes them,
    as where(hit, v, x): `hit` is the mask, or along the indexed dim whether any
    index (negative ones from the end) is the position. For one index tensor and
    values that do not vary from one written position to the next (a number, or
    one row every written position takes); an index out of range writes nothing
    (torch raises)."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    if _arg(node, 3, "accumulate", False):
        raise Unsupported("accumulating writes need atomics")
    given = [(d, i) for d, i in enumerate(node.args[1]) if i is not None]
    if len(given) != 1:
        raise Unsupported("it writes through several index tensors")
    dim, index_node = given[0]
    value = e.cast(e.arg(node.args[2]), element_of(x.type))
    if fake_of(index_node) is not None and fake_of(index_node).dtype == torch.bool:  # type: ignore[union-attr]
        mask = e.arg(index_node)
        covered = len(shape_of(mask.type))
        rest = len(shape) - dim - covered
        hit = e.reshape(mask, [1] * dim + list(shape_of(mask.type)) + [1] * rest)
        return _where(e, hit, _written_value(e, value, dim, 1, covered, rest), x)
    index = e.cast(_index_tensor(e, index_node), INDEX)
    spanned = len(shape_of(index.type))
    count, size = math.prod(shape_of(index.type)), shape[dim]
    flat = _from_the_end(e, e.reshape(index, [1, count]), size)
    positions = e.op(graph.IotaOp, result_type=tensor([size, 1], INDEX), dim=IntegerAttr(0, i64))
    hit = _any(e, e.op(graph.EqOp, positions, flat), [1], False)
    rest = len(shape) - dim - 1
    hit = e.reshape(hit, [1] * dim + [size] + [1] * rest)
    return _where(e, hit, _written_value(e, value, dim, spanned, 1, rest), x)


def _written_value(
    e: Emitter, value: SSAValue, dim: int, spanned: int, covered: int, rest: int
) -> SSAValue:
    """An index_put's value in x's rank. torch broadcasts it to x.shape[:dim] +
    [written positions, `spanned` dims] + `rest` trailing dims; it must not vary along
    the positions, whose dims become x's `covered` indexed ones (size 1)."""
    written_rank = dim + spanned + rest
    vshape = list(shape_of(value.type))
    if len(vshape) > written_rank:
        raise Unsupported("its values have more dims than the written part")
    aligned = [1] * (written_rank - len(vshape)) + vshape
    if any(size != 1 for size in aligned[dim : dim + spanned]):
        raise Unsupported("its values differ from one written position to the next")
    return e.reshape(value, aligned[:dim] + [1] * covered + aligned[dim + spanned :])


def _window(e: Emitter, x: SSAValue, shape: list[int]) -> SSAValue:
    """x[:shape[0], :shape[1], ...]: the part of `src` a scatter reads."""
    for d, size in enumerate(shape):
        x = _slice(e, x, d, 0, size)
    return x


def _filled(e: Emitter, x: SSAValue, dim: int, width: int, value: Any, elem: Any) -> SSAValue | None:
    """A constant as `x` but `width` wide along `dim`; None where nothing is padded."""
    if width <= 0:
        return None
    shape = list(shape_of(x.type))
    shape[dim] = width
    return e.constant(value, tensor(shape, elem))


@converts(aten.constant_pad_nd.default)
def _constant_pad(e: Emitter, node: fx.Node) -> SSAValue:
    """F.pad's constant mode: the value concatenated on each side, or a slice
    where the pad is negative (all the value where the slice keeps nothing)."""
    elem = out_elem(node)
    x = e.arg(node.args[0])
    pad, value = list(node.args[1]), _arg(node, 2, "value", 0)
    rank = len(shape_of(x.type))
    for k in range(len(pad) // 2):
        dim = rank - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        start, end = max(-before, 0), shape_of(x.type)[dim] - max(-after, 0)
        if end <= start:  # nothing of x is left along dim: only the pads (one is > 0)
            filled = _filled(e, x, dim, max(before, 0) + max(after, 0), value, elem)
            assert filled is not None, "an empty result is left to eager (importer)"
            x = filled
            continue
        x = _slice(e, x, dim, start, end)
        parts = [_filled(e, x, dim, before, value, elem), x, _filled(e, x, dim, after, value, elem)]
        parts = [p for p in parts if p is not None]
        if len(parts) > 1:
            x = e.op(graph.ConcatOp, *parts, dim=IntegerAttr(dim, i64))
    return x


@converts(aten.flip.default)
def _flip(e: Emitter, node: fx.Node) -> SSAValue:
    """Each flipped dimension indexed by size - 1 - iota."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    for dim in sorted({d % len(shape) for d in node.args[1]}):
        if shape[dim] <= 1:
            continue
        iota = e.op(graph.IotaOp, result_type=tensor([shape[dim]], INDEX), dim=IntegerAttr(0, i64))
        reverse = e.op(graph.SubOp, e.scalar(shape[dim] - 1, INDEX), iota)
        x = e.op(graph.IndexSelectOp, x, reverse, dim=IntegerAttr(dim, i64))
    return x


@converts(aten.roll.default)
def _roll(e: Emitter, node: fx.Node) -> SSAValue:
    """torch.roll: along each dim, the last `shift` elements, then the others (a
    Swin block's shifted windows); with no dims, the flattened tensor's."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    shifts, dims = list(node.args[1]), list(_arg(node, 2, "dims", []))
    if not dims:
        x, dims = e.reshape(x, [math.prod(shape)]), [0]
    for shift, dim in zip(shifts, dims, strict=True):
        dim %= len(shape_of(x.type))
        n = shape_of(x.type)[dim]
        cut = n - shift % n
        if cut != n:
            tail, head = _slice(e, x, dim, cut, n), _slice(e, x, dim, 0, cut)
            x = e.op(graph.ConcatOp, tail, head, dim=IntegerAttr(dim, i64))
    return e.reshape(x, shape)


@converts(aten.copy.default)
def _copy(e: Emitter, node: fx.Node) -> SSAValue:
    """`self.copy_(src)` functionalized: src in self's type, broadcast to its shape."""
    src = e.cast(e.arg(node.args[1]), out_elem(node))
    shape = out_shape(node)
    if list(shape_of(src.type)) == shape:
        return src
    src = e.reshape(src, [1] * (len(shape) - len(shape_of(src.type))) + list(shape_of(src.type)))
    return e.op(graph.BroadcastOp, src, result_type=tensor(shape, element_of(src.type)))


def _replaced(e: Emitter, x: SSAValue, dim: int, start: int, stop: int, part: SSAValue) -> SSAValue:
    """`x` with elements start:stop along `dim` replaced by `part` (as wide)."""
    n = shape_of(x.type)[dim]
    pieces = [_slice(e, x, dim, 0, start) if start > 0 else None, part,
              _slice(e, x, dim, stop, n) if stop < n else None]  # fmt: skip
    kept = [p for p in pieces if p is not None]
    return kept[0] if len(kept) == 1 else e.op(graph.ConcatOp, *kept, dim=IntegerAttr(dim, i64))


@converts(aten.slice_scatter.default)
def _slice_scatter(e: Emitter, node: fx.Node) -> SSAValue:
    """`x[..., start:end:step] = src` functionalized: x's other elements concatenated
    around src; with a step, the run of x it covers is seen as [src's length, step]
    and src takes the first of each step."""
    x, src = e.arg(node.args[0]), e.cast(e.arg(node.args[1]), out_elem(node))
    shape = list(shape_of(x.type))
    dim = _arg(node, 2, "dim", 0) % len(shape)
    start, _, step = slice(_arg(node, 3, "start", None), _arg(node, 4, "end", None),
                           _arg(node, 5, "step", 1)).indices(shape[dim])  # fmt: skip
    count = shape_of(src.type)[dim]
    return _scattered(e, x, src, dim, start, step, count) if count else x


def _scattered(
    e: Emitter, x: SSAValue, src: SSAValue, dim: int, start: int, step: int, count: int
) -> SSAValue:
    """`x` with x[start::step][:count] along `dim` replaced by `src`."""
    if step == 1:
        return _replaced(e, x, dim, start, start + count, src)
    shape = list(shape_of(x.type))
    whole = min(count, (shape[dim] - start) // step)  # steps that end inside x
    if whole:
        stop = start + whole * step
        run = e.reshape(_slice(e, x, dim, start, stop), [*shape[:dim], whole, step, *shape[dim + 1 :]])
        part = e.reshape(_slice(e, src, dim, 0, whole), [*shape[:dim], whole, 1, *shape[dim + 1 :]])
        run = e.reshape(_replaced(e, run, dim + 1, 0, 1, part), [*shape[:dim], whole * step, *shape[dim + 1 :]])
        x = _replaced(e, x, dim, start, stop, run)
    if whole < count:  # the last one, in a step cut short by the end of x
        last = start + whole * step
        x = _replaced(e, x, dim, last, last + 1, _slice(e, src, dim, whole, whole + 1))
    return x


@converts(aten.select_scatter.default)
def _select_scatter(e: Emitter, node: fx.Node) -> SSAValue:
    """`x[..., i, ...] = src` functionalized."""
    x, src = e.arg(node.args[0]), e.cast(e.arg(node.args[1]), out_elem(node))
    shape = list(shape_of(x.type))
    dim = node.args[2] % len(shape)
    index = node.args[3] % shape[dim]
    part = e.reshape(src, [*shape[:dim], 1, *shape[dim + 1 :]])
    return _replaced(e, x, dim, index, index + 1, part)


@converts(aten.unfold.default)
def _unfold(e: Emitter, node: fx.Node) -> SSAValue:
    """`x.unfold(dim, size, step)` (audio frames, hand-made patches): window i's
    element j is x[i * step + j] along `dim`, gathered by an index of two iotas,
    the window dim in place and its elements last."""
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    if not shape:
        return e.reshape(x, out_shape(node))
    dim, size, step = node.args[1] % len(shape), node.args[2], node.args[3]
    windows = (shape[dim] - size) // step + 1
    if windows <= 0 or out_shape(node) != [*shape[:dim], windows, *shape[dim + 1 :], size]:
        raise Unsupported(f"its result {out_shape(node)} is not its windows'")
    starts = e.op(graph.IotaOp, result_type=tensor([windows, size], INDEX), dim=IntegerAttr(0, i64))
    offsets = e.op(graph.IotaOp, result_type=tensor([windows, size], INDEX), dim=IntegerAttr(1, i64))
    index = e.op(graph.AddOp, e.op(graph.MulOp, starts, e.scalar(step, INDEX)), offsets)
    flat = e.reshape(index, [windows * size])
    x = e.op(graph.IndexSelectOp, x, flat, dim=IntegerAttr(dim, i64))
    x = e.reshape(x, [*shape[:dim], windows, size, *shape[dim + 1 :]])
    rank = len(shape) + 1
    perm = [*range(dim + 1), *range(dim + 2, rank), dim + 1]
    return x if perm == list(range(rank)) else e.op(graph.TransposeOp, x, perm=int_list(perm))


@converts(aten.repeat.default)
def _repeat(e: Emitter, node: fx.Node) -> SSAValue:
    """x.repeat(r...): x broadcast along a new dimension before each, then merged."""
    x = e.arg(node.args[0])
    repeats = list(node.args[1])
    shape = [1] * (len(repeats) - len(shape_of(x.type))) + list(shape_of(x.type))
    spread = [d for size in shape for d in (1, size)]
    wide = [d for r, size in zip(repeats, shape, strict=True) for d in (r, size)]
    x = e.reshape(x, spread)
    if wide != spread:
        x = e.op(graph.BroadcastOp, x, result_type=tensor(wide, element_of(x.type)))
    return e.reshape(x, out_shape(node))


@converts(aten.as_strided.default)
def _as_strided(e: Emitter, node: fx.Node) -> SSAValue:
    """A row-major window of a contiguous tensor (what decompositions such as
    group norm's produce): the flattened tensor sliced, then reshaped."""
    source = fake_of(node.args[0])  # type: ignore[arg-type]
    size, stride = list(node.args[1]), list(node.args[2])
    offset = _arg(node, 3, "storage_offset", None) or 0
    row_major = [math.prod(size[i + 1:]) for i in range(len(size))]
    if source is None or not source.is_contiguous() or source.storage_offset() != 0:
        raise Unsupported("it views a non-contiguous tensor")
    if any(n > 1 and s != r for n, s, r in zip(size, stride, row_major, strict=True)):
        raise Unsupported("its strides are not row-major")
    x = e.arg(node.args[0])
    count = math.prod(size)
    if offset < 0 or offset + count > source.numel():
        raise Unsupported("it reaches outside its source")
    flat = e.reshape(x, [source.numel()])
    return e.reshape(_slice(e, flat, 0, offset, offset + count), size)


# --- convolutions whose windows do not overlap --------------------------------------


def _overlapping_windows(kernel: list[int], stride: list[int], dilation: list[int]) -> str | None:
    """Why a convolution's windows overlap (None when none do): every spatial dim
    has a kernel of 1 (any stride) or a kernel equal to its stride, undilated."""
    for k, s, d in zip(kernel, stride, dilation, strict=True):
        if k != 1 and (k != s or d != 1):
            return f"its windows overlap (kernel {kernel}, stride {stride}, dilation {dilation})"
    return None


@converts(aten.convolution.default)
def _convolution(e: Emitter, node: fx.Node) -> SSAValue:
    """A convolution whose windows do not overlap, as one GEMM over a view of its
    input: a ViT's patch embedding (stride = kernel), a 1x1 convolution, strided
    or not. Each output pixel's window is a contiguous block of the (padded,
    cut) input, so `[N, C, L1, k1, ...]` transposed to `[N*P, C*K]` times the
    weight `[C*K, O]` is the convolution, summed in another order.

    Others stay with cuDNN (eager): as a GEMM over im2col copies of the input
    they would move kernel-size times its bytes, which no fusion wins back.
    """
    x, w = e.arg(node.args[0]), e.arg(node.args[1])
    stride, padding, dilation, transposed, _, groups = node.args[3:9]
    if transposed:
        raise Unsupported("it is a transposed convolution (cuDNN's)")
    n, c, *spatial = shape_of(x.type)
    o, per_group, *kernel = shape_of(w.type)
    rank = len(spatial)
    stride, padding, dilation = (list(v) * (rank // len(v)) for v in (stride, padding, dilation))
    if groups == c == o and per_group == 1:
        return _depthwise(e, node, _Pool(kernel, stride, padding, dilation))
    if groups != 1:
        raise Unsupported(f"it is a grouped convolution of {groups} groups (cuDNN's)")
    why = _overlapping_windows(kernel, stride, dilation)
    if why is not None:
        raise Unsupported(why)
    sizes = _pool_sizes(x, _Pool(kernel, stride, padding, dilation), out_shape(node))
    if out_shape(node)[:2] != [n, o]:
        raise Unsupported(f"its result {out_shape(node)} is not [{n}, {o}, ...]")
    elem = element_of(x.type)
    x = _padded(e, x, padding, 0)
    for i, (k, s, size) in enumerate(zip(kernel, stride, sizes, strict=True)):
        if k == 1:  # every s-th element; a patch's dim is cut by _windows
            x = _slice(e, x, 2 + i, 0, (size - 1) * s + 1, s)
    # [N, C, L1.., K] -> [N, L1.., C, K]: a row of C * K a pixel
    x = e.op(graph.TransposeOp, _windows(e, x, kernel), perm=int_list([0, *range(2, rank + 2), 1, rank + 2]))
    patch = c * math.prod(kernel)
    cols = e.reshape(x, [n * math.prod(sizes), patch])
    weights = e.op(graph.TransposeOp, e.reshape(w, [o, patch]), perm=int_list([1, 0]))
    y = e.op(graph.MatmulOp, cols, weights)
    if node.args[2] is not None:
        y = e.op(graph.AddOp, y, e.cast(e.arg(node.args[2]), elem))
    y = e.reshape(y, [n, *sizes, o])
    return e.op(graph.TransposeOp, y, perm=int_list([0, rank + 1, *range(1, rank + 1)]))


def _depthwise(e: Emitter, node: fx.Node, pool: _Pool) -> SSAValue:
    """A depthwise convolution (one filter a channel: MobileNet's 3x3, Mamba's causal
    conv1d) as the sum of the kernel's shifted views of the input, each times its
    weight a channel: element-wise work that fuses with what follows, in f32 for
    half types, where a GEMM would be a batch of 1 x K products. Up to the taps
    one kernel's ops hold (5x5); ConvNeXt's 7x7 would split into kernels that
    write the padded input and a partial sum, and stays with cuDNN."""
    taps = math.prod(pool.kernel)
    if 2 * taps + 2 > MAX_OPS:
        raise Unsupported(
            f"its {taps} taps pass the ops one kernel takes ({MAX_OPS}): cuDNN's in one kernel"
        )
    x, w = e.arg(node.args[0]), e.arg(node.args[1])
    elem = element_of(x.type)
    c, rank = shape_of(x.type)[1], len(pool.kernel)
    sizes = _pool_sizes(x, pool, out_shape(node))
    views = _shifted_views(e, _in_f32(e, x), pool, sizes, 0.0)
    weights = e.reshape(_in_f32(e, w), [c, len(views)])
    filters = [e.reshape(_slice(e, weights, 1, t, t + 1), [c, *([1] * rank)]) for t in range(taps)]
    total = _fold(e, graph.AddOp, [e.op(graph.MulOp, v, f) for v, f in zip(views, filters, strict=True)])
    if node.args[2] is not None:
        bias = e.reshape(_in_f32(e, e.arg(node.args[2])), [c, *([1] * rank)])
        total = e.op(graph.AddOp, total, bias)
    return e.cast(total, elem)


# --- running sums -----------------------------------------------------------------

EXACT_F32_INTEGERS = 2**24
"""Integers up to here are exact in f32, and so are sums of them that stay below."""

_INTEGER_BOUNDS = {torch.bool: 1, torch.uint8: 255, torch.int8: 128}
"""Types whose every value TF32 holds too (11 bits): `tf32=True` keeps such sums exact."""


def _magnitude_bound(value: Any) -> int | None:
    """A bound on |element| of an integer FX value known from where it comes from
    (a bool mask, a narrow integer type, a copy of one), else None."""
    fake = fake_of(value)
    if fake is None:
        return None
    if fake.dtype in _INTEGER_BOUNDS:
        return _INTEGER_BOUNDS[fake.dtype]
    if isinstance(value, fx.Node) and value.target in (aten._to_copy.default, aten.clone.default):
        return _magnitude_bound(value.args[0])
    return None


EXACT_F64_INTEGERS = 2**53
"""f64 holds every integer below this: the quotient of two such, rounded once and
floored (or truncated), is the exact integer quotient."""


_SAME_ELEMENTS = {
    aten._to_copy.default, aten.clone.default, aten.view.default, aten._unsafe_view.default,
    aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.expand.default, aten.permute.default, aten.slice.Tensor, aten.select.int,
    aten.neg.default, aten.abs.default,
}  # fmt: skip
"""Ops whose integer elements are no larger than their first operand's."""


def _integer_bound(value: Any, depth: int = 0) -> int | None:
    """A bound on |element| of an integer FX value from where it comes from (i32,
    a narrow type, an arange, views, sums and products of such, numbers), else None."""
    if isinstance(value, bool | int):
        return abs(int(value))
    fake = fake_of(value)
    if fake is None or fake.is_floating_point() or depth > 64:
        return None
    if fake.dtype == torch.int32:
        return 2**31
    if fake.dtype in _INTEGER_BOUNDS:
        return _INTEGER_BOUNDS[fake.dtype]
    if not isinstance(value, fx.Node):
        return None
    args = value.args
    if value.target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        ends = args[:2] if value.target != aten.arange.default else args[:1]
        return max(abs(a) for a in ends) if all(isinstance(a, int) for a in ends) else None
    if value.target in _SAME_ELEMENTS:
        return _integer_bound(args[0], depth + 1)
    if value.target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor):
        a, b = _integer_bound(args[0], depth + 1), _integer_bound(args[1], depth + 1)
        if a is None or b is None or value.kwargs.get("alpha", 1) != 1:
            return None
        return a * b if value.target == aten.mul.Tensor else a + b
    return None


@converts(aten.div.Tensor_mode, aten.remainder.Scalar, aten.fmod.Scalar)
def _integer_division(e: Emitter, node: fx.Node) -> SSAValue:
    """Integer division by a nonzero number (`pos // window`, `i % n`, `torch.div(i,
    n, rounding_mode="trunc")`, `fmod`), through f64: exact where the dividend is
    known to stay below 2**53 (`_integer_bound`). remainder takes the divisor's
    sign, fmod the dividend's, as torch's. Floats, tensor divisors (which may be 0,
    where torch raises) and other dividends run in eager."""
    x, divisor = node.args[0], node.args[1]
    elem = out_elem(node)
    if node.target == aten.div.Tensor_mode:
        mode = node.kwargs.get("rounding_mode")
    else:
        mode = "floor" if node.target == aten.remainder.Scalar else "trunc"
    if elem in FLOAT_TYPES or mode not in ("floor", "trunc"):
        raise Unsupported("only integer division by a number is taken (floats' rounds differ)")
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor == 0:
        raise Unsupported("its divisor is not a nonzero number")
    bound = _integer_bound(x)
    if bound is None or bound >= EXACT_F64_INTEGERS:
        raise Unsupported("its integers may pass 2**53, past f64's exact integers")
    f64 = ELEMENT_TYPES["f64"]
    a = e.cast(e.arg(x), elem)
    quotient = e.op(graph.DivOp, e.cast(a, f64), e.scalar(float(divisor), f64))
    rounded = e.op(graph.FloorOp, quotient) if mode == "floor" else _truncated(e, quotient)
    quotient = e.cast(rounded, elem)
    if node.target == aten.div.Tensor_mode:
        return quotient
    return e.op(graph.SubOp, a, e.op(graph.MulOp, quotient, e.scalar(divisor, elem)))


@converts(aten.cumsum.default)
def _cumsum(e: Emitter, node: fx.Node) -> SSAValue:
    """A running sum as a matmul by a triangle of ones (`y[k] = sum_j<=k x[j]`).

    Floats sum in f32 (half types too, as torch's kernels accumulate), or in f64
    where the input or the asked-for result is f64.
    Integers sum in f32 where that is exact: a mask's running count (position
    ids from an attention mask: `mask.long().cumsum(-1)`) or any values whose
    source type (bool, 8-bit) bounds their sums below 2**24; other integer sums
    stay in eager.
    The triangle is n x n: meant for sequence-long rows, not for huge ones.
    """
    x = e.arg(node.args[0])
    shape = list(shape_of(x.type))
    if not shape:
        return e.cast(x, out_elem(node))
    dim = node.args[1] % len(shape)
    n = shape[dim]
    source = element_of(x.type)
    f64 = ELEMENT_TYPES["f64"]
    if source in FLOAT_TYPES:
        compute = f64 if f64 in (source, out_elem(node)) else ELEMENT_TYPES["f32"]
    else:
        bound = _magnitude_bound(node.args[0])
        if bound is None or bound * n >= EXACT_F32_INTEGERS:
            raise Unsupported("its integer running sums may pass 2**24, past f32's exact integers")
        compute = ELEMENT_TYPES["f32"]
    last = len(shape) - 1
    perm = list(range(len(shape)))
    perm[dim], perm[last] = last, dim
    moved = x if dim == last else e.op(graph.TransposeOp, x, perm=int_list(perm))
    moved_shape = list(shape_of(moved.type))
    rows = e.reshape(e.cast(moved, compute), [math.prod(moved_shape[:-1]), n])
    iota = [e.op(graph.IotaOp, result_type=tensor([n, n], INDEX), dim=IntegerAttr(d, i64)) for d in (0, 1)]
    triangle = e.cast(e.op(graph.LeOp, *iota), compute)  # [j, k]: 1 where j <= k
    sums = e.reshape(e.op(graph.MatmulOp, rows, triangle), moved_shape)
    if dim != last:
        sums = e.op(graph.TransposeOp, sums, perm=int_list(perm))
    return e.cast(sums, out_elem(node))


# --- pooling over windows that do not overlap -------------------------------------


@dataclass(frozen=True)
class _Pool:
    """A pool's window geometry, one entry a spatial dim."""

    kernel: list[int]
    stride: list[int]
    padding: list[int]
    dilation: list[int]

    @property
    def tiles(self) -> bool:
        """Whether the windows tile the input: each element in exactly one window."""
        return self.stride == self.kernel and not any(self.padding) and set(self.dilation) <= {1}


def _pool_args(node: fx.Node, rank: int, dilated: bool) -> _Pool:
    """Arguments after the input: kernel, stride (the kernel when empty), padding,
    then dilation where `dilated`, ceil_mode (refused)."""

    def per_dim(value: Any) -> list[int]:
        values = [value] if isinstance(value, int) else list(value)
        return values * (rank // len(values))

    kernel = per_dim(node.args[1])
    stride = per_dim(_arg(node, 2, "stride", []) or kernel)
    padding = per_dim(_arg(node, 3, "padding", [0]))
    dilation = per_dim(_arg(node, 4, "dilation", [1]) if dilated else [1])
    if _arg(node, 5 if dilated else 4, "ceil_mode", False):
        raise Unsupported("its ceil_mode windows run past the padded input")
    return _Pool(kernel, stride, padding, dilation)


def _pool_sizes(x: SSAValue, pool: _Pool, result: list[int]) -> list[int]:
    """The pooled sizes torch gives (and checks that they are `result`'s)."""
    spatial = list(shape_of(x.type))[-len(pool.kernel) :]
    sizes = [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(spatial, pool.kernel, pool.stride, pool.padding, pool.dilation,
                                 strict=True)
    ]  # fmt: skip
    if result[-len(sizes) :] != sizes or min(sizes) <= 0:
        raise Unsupported(f"its result {result} is not its windows' {sizes}")
    return sizes


def _shifted_views(
    e: Emitter, x: SSAValue, pool: _Pool, sizes: list[int], fill: Any
) -> list[SSAValue]:
    """One strided view of the input (padded with `fill`) a kernel offset: element i
    of the view for offset a is x[i * stride + a * dilation - padding], so that a
    window's elements are the views' elements at one position."""
    n = len(shape_of(x.type)) - len(pool.kernel)
    x = _padded(e, x, pool.padding, fill)
    views = []
    for offset in itertools.product(*(range(k) for k in pool.kernel)):
        v = x
        for i, (a, size) in enumerate(zip(offset, sizes, strict=True)):
            first = a * pool.dilation[i]
            v = _slice(e, v, n + i, first, first + (size - 1) * pool.stride[i] + 1, pool.stride[i])
        views.append(v)
    return views


def _padded(e: Emitter, x: SSAValue, padding: list[int], fill: Any) -> SSAValue:
    """`x` with `padding[i]` elements of `fill` on both sides of the i-th of its last
    len(padding) dims."""
    n = len(shape_of(x.type)) - len(padding)
    for i, p in enumerate(padding):
        if p:
            pad = _filled(e, x, n + i, p, fill, element_of(x.type))
            x = e.op(graph.ConcatOp, pad, x, pad, dim=IntegerAttr(n + i, i64))  # type: ignore[arg-type]
    return x


def _fold(e: Emitter, cls: type[graph.GraphOp], values: list[SSAValue]) -> SSAValue:
    """values[0] cls values[1] cls ..., left to right (a sum or max of views)."""
    return functools.reduce(lambda a, b: e.op(cls, a, b), values)


def _windows(e: Emitter, x: SSAValue, kernel: list[int]) -> SSAValue:
    """`x` as `[*lead, L1, ..., Lr, K]`: the windows of `kernel` that tile its last
    r dims (a ragged edge cut off), each flattened last."""
    rank = len(kernel)
    shape = list(shape_of(x.type))
    n = len(shape) - rank
    lead, sizes = shape[:n], [s // k for s, k in zip(shape[n:], kernel, strict=True)]
    for i, (size, k) in enumerate(zip(sizes, kernel, strict=True)):
        x = _slice(e, x, n + i, 0, size * k)
    x = e.reshape(x, [*lead, *(d for size, k in zip(sizes, kernel, strict=True) for d in (size, k))])
    perm = [*range(n), *(n + 2 * i for i in range(rank)), *(n + 2 * i + 1 for i in range(rank))]
    x = e.op(graph.TransposeOp, x, perm=int_list(perm))
    return e.reshape(x, [*lead, *sizes, math.prod(kernel)])


@converts(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(e: Emitter, node: fx.Node) -> SSAValue:
    """The mean of each window. Windows that tile the input (VGG's and U-Net's 2x2
    pools) are a reduction over each; others (overlapping, padded) the sum of the
    kernel's shifted views over the divisor torch takes: the kernel's size, the
    window's elements inside the input (count_include_pad=False), or the override.
    Half types average in f32, as torch."""
    rank = 2 if node.target == aten.avg_pool2d.default else 3
    x = e.arg(node.args[0])
    pool = _pool_args(node, rank, False)
    sizes = _pool_sizes(x, pool, out_shape(node))
    elem = element_of(x.type)
    if pool.tiles and _arg(node, 6, "divisor_override", None) is None:
        windows = _windows(e, x, pool.kernel)
        last = len(shape_of(windows.type)) - 1
        return e.cast(_reduce(e, graph.ReduceMeanOp, _in_f32(e, windows), [last], False), elem)
    wide = _in_f32(e, x)
    total = _fold(e, graph.AddOp, _shifted_views(e, wide, pool, sizes, 0.0))
    override = _arg(node, 6, "divisor_override", None)
    if override is not None:
        divisor: SSAValue = _num(e, float(override), total)
    elif _arg(node, 5, "count_include_pad", True) or not any(pool.padding):
        divisor = _num(e, float(math.prod(pool.kernel)), total)
    else:  # the window's elements inside the input: ones, padded with zeros, summed alike
        spatial = list(shape_of(x.type))[-rank:]
        ones = e.constant(1.0, tensor(spatial, element_of(total.type)))
        divisor = _fold(e, graph.AddOp, _shifted_views(e, ones, pool, sizes, 0.0))
    return e.cast(e.op(graph.DivOp, total, divisor), elem)


@converts(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(e: Emitter, node: fx.Node) -> SSAValue:
    """An adaptive average pool whose output divides its input: windows of in / out
    that tile it, as torch's start = floor(i in / out), end = ceil((i + 1) in / out)."""
    x = e.arg(node.args[0])
    out = list(node.args[1])
    spatial = list(shape_of(x.type))[-len(out) :]
    if any(o <= 0 or s % o for s, o in zip(spatial, out, strict=True)):
        raise Unsupported(f"its output {out} does not divide its input {spatial}")
    windows = _windows(e, x, [s // o for s, o in zip(spatial, out, strict=True)])
    last = len(shape_of(windows.type)) - 1
    mean = _reduce(e, graph.ReduceMeanOp, _in_f32(e, windows), [last], False)
    return e.cast(mean, element_of(x.type))


@converts(aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec)
def _upsample_nearest(e: Emitter, node: fx.Node) -> SSAValue:
    """Nearest upsampling by whole factors (U-Net's and FPN's 2x): each element
    repeated `s` times along each dim, a broadcast between reshapes. Torch's
    source index, floor(dst * in / out), is dst // s there."""
    x = e.arg(node.args[0])
    result = out_shape(node)
    rank = len(result) - 2
    shape = list(shape_of(x.type))
    spatial, wanted = shape[-rank:], result[-rank:]
    if any(w % s for s, w in zip(spatial, wanted, strict=True)):
        raise Unsupported(f"its size {wanted} is not a whole multiple of {spatial}")
    factors = [w // s for s, w in zip(spatial, wanted, strict=True)]
    scales = _arg(node, 2, "scale_factors", None)
    if scales is not None and [float(s) for s in scales] != [float(f) for f in factors]:
        raise Unsupported(f"its scale factors {list(scales)} are not whole numbers")
    lead = shape[:-rank]
    spread = [*lead, *(d for s in spatial for d in (s, 1))]
    wide = [*lead, *(d for s, f in zip(spatial, factors, strict=True) for d in (s, f))]
    x = e.op(graph.BroadcastOp, e.reshape(x, spread), result_type=tensor(wide, element_of(x.type)))
    return e.reshape(x, result)


@converts(aten.sinh.default, aten.cosh.default)
def _hyperbolic(e: Emitter, node: fx.Node) -> SSAValue:
    """sinh as (expm1(x) - expm1(-x)) / 2, which keeps its digits near 0 (the two
    terms have opposite signs there), cosh as (e**x + e**-x) / 2."""
    x, elem = _float_operand(e, node)
    minus = e.op(graph.NegOp, x)
    if node.target == aten.sinh.default:
        out = e.op(graph.SubOp, expm1(e, x), expm1(e, minus))
    else:
        out = e.op(graph.AddOp, e.op(graph.ExpOp, x), e.op(graph.ExpOp, minus))
    return e.cast(e.op(graph.MulOp, out, _num(e, 0.5, out)), elem)


@converts(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(e: Emitter, node: fx.Node) -> list[SSAValue | None]:
    """The max of each window, NaN propagating (as torch). Windows that tile the
    input are a reduction over each, with torch's indices (into each flattened input
    plane; NaN first, then the first largest) where something reads them. Others
    (ResNet's 3x3 stride-2 pool, padded with -inf) are the maximum of the kernel's
    shifted views; their indices stay in eager."""
    rank = 2 if node.target == aten.max_pool2d_with_indices.default else 3
    x = e.arg(node.args[0])
    pool = _pool_args(node, rank, True)
    sizes = _pool_sizes(x, pool, list(node.meta["val"][0].shape))
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if not pool.tiles:
        if 1 in used:
            raise Unsupported("its windows overlap or are padded, and its indices are read")
        if element_of(x.type) not in FLOAT_TYPES and any(pool.padding):
            raise Unsupported("it pads integers (with -inf)")
        views = _shifted_views(e, x, pool, sizes, -math.inf)
        return [_fold(e, graph.MaximumOp, views), None]
    kernel = pool.kernel
    windows = _windows(e, x, kernel)
    last = len(shape_of(windows.type)) - 1
    values, offset = _arg_extreme(e, windows, last, False, True)
    if 1 not in used:
        return [values, None]
    # The window offset's digits (row-major over the kernel) place it in the plane.
    spatial = list(shape_of(e.arg(node.args[0]).type))[-rank:]
    out = list(shape_of(offset.type))
    f32 = ELEMENT_TYPES["f32"]
    rest = e.cast(offset, f32)
    index = e.scalar(0, INDEX)
    for i in range(rank):
        inner = math.prod(kernel[i + 1 :])
        digit = e.op(graph.FloorOp, e.op(graph.DivOp, rest, e.scalar(float(inner), f32)))
        rest = e.op(graph.SubOp, rest, e.op(graph.MulOp, digit, e.scalar(float(inner), f32)))
        position = e.op(graph.IotaOp, result_type=tensor(out, INDEX),
                        dim=IntegerAttr(len(out) - rank + i, i64))  # fmt: skip
        coordinate = e.op(graph.AddOp, e.op(graph.MulOp, position, e.scalar(kernel[i], INDEX)),
                          e.cast(digit, INDEX))  # fmt: skip
        index = e.op(graph.AddOp, e.op(graph.MulOp, index, e.scalar(spatial[i], INDEX)), coordinate)
    return [values, index]
