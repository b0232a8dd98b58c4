"""Element types and tensor shapes shared by every level.

irc uses xDSL's builtin types (`tensor<4x8xf32>`, `f32`, `i1`, `index`) so that
`--emit mlir` output is understood by xdsl-opt and mlir-opt as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    TensorType,
    i64,
)
from xdsl.ir import Attribute

ELEMENT_TYPES: dict[str, Attribute] = {
    "f32": Float32Type(),
    "f16": Float16Type(),
    "bf16": BFloat16Type(),
    "f64": Float64Type(),
    "i64": IntegerType(64),
    "i32": IntegerType(32),
    "i1": IntegerType(1),
}
"""The spec's element types, by their spelling in `.ir` files."""

SCALAR_TYPES: dict[str, Attribute] = {**ELEMENT_TYPES, "index": IndexType()}
"""Scalar types the lower levels add (loop indices are `index`)."""

FLOAT_TYPES = frozenset(ELEMENT_TYPES[n] for n in ("f32", "f16", "bf16", "f64"))
HALF_TYPES = frozenset(ELEMENT_TYPES[n] for n in ("f16", "bf16"))
I1 = ELEMENT_TYPES["i1"]
F32 = ELEMENT_TYPES["f32"]

MAX_ELEMENTS = 2**48
"""Tensors larger than this (256 Ti elements) are rejected as surely a typo."""

_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i1": 1, "index": 8}


def element_name(t: Attribute) -> str:
    """The spelling of a scalar type (`f32`, `i1`, `index`)."""
    for name, ty in SCALAR_TYPES.items():
        if ty == t:
            return name
    raise ValueError(f"not an irc element type: {t}")


def element_bytes(t: Attribute) -> int:
    return _BYTES[element_name(t)]


def is_float(t: Attribute) -> bool:
    return t in FLOAT_TYPES


def shape_of(t: Attribute) -> tuple[int, ...]:
    assert isinstance(t, TensorType | MemRefType), t
    return tuple(t.get_shape())


def element_of(t: Attribute) -> Attribute:
    assert isinstance(t, TensorType | MemRefType), t
    return t.element_type


def tensor(shape: Sequence[int], element: Attribute) -> TensorType[Attribute]:
    return TensorType(element, list(shape))


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def format_type(t: Attribute) -> str:
    """`tensor<4x8xf32>`, `memref<4xf32>`, `f32`: the irc spelling of a type."""
    if isinstance(t, TensorType | MemRefType):
        kind = "tensor" if isinstance(t, TensorType) else "memref"
        dims = "".join(f"{d}x" for d in t.get_shape())
        return f"{kind}<{dims}{element_name(t.element_type)}>"
    pointee = getattr(t, "pointee", None)
    if pointee is not None:  # tile.ptr
        return f"ptr<{element_name(pointee)}>"
    try:
        return element_name(t)
    except ValueError:
        return str(t)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy broadcasting of several shapes, or None when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        size = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if size not in (1, d):
                return None
            size = d
        out.append(size)
    return tuple(out)


def int_array(values: Sequence[int]) -> ArrayAttr[IntegerAttr]:
    """`[1, 2, 3]` as an attribute (dims, bounds, block sizes, grids, shapes)."""
    return ArrayAttr([IntegerAttr(v, i64) for v in values])
