"""Element types and tensor shapes shared by every level.

irc uses xDSL's builtin types (`tensor<4x8xf32>`, `f32`, `i1`, `index`) so that
`--emit mlir` output is understood by xdsl-opt and mlir-opt as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ElementInfo:
    """Everything the levels know of one element type: the one table of them."""

    name: str
    """Its spelling in `.ir` files (`f32`)."""
    type: Attribute
    bits: int
    """Storage bits (`i1` takes a byte, as in torch and Triton)."""
    kind: str
    """"float", "int" or "bool"."""
    torch: str
    """The torch dtype: `torch.<torch>`."""
    triton: str
    """The Triton dtype: `tl.<triton>`."""
    mantissa: int = 0
    """Significand bits of a float type, the implicit bit included (precision order)."""


ELEMENTS: dict[str, ElementInfo] = {
    e.name: e
    for e in (
        ElementInfo("f32", Float32Type(), 32, "float", "float32", "float32", 24),
        ElementInfo("f16", Float16Type(), 16, "float", "float16", "float16", 11),
        ElementInfo("bf16", BFloat16Type(), 16, "float", "bfloat16", "bfloat16", 8),
        ElementInfo("f64", Float64Type(), 64, "float", "float64", "float64", 53),
        ElementInfo("i64", IntegerType(64), 64, "int", "int64", "int64"),
        ElementInfo("i32", IntegerType(32), 32, "int", "int32", "int32"),
        ElementInfo("i1", IntegerType(1), 8, "bool", "bool", "int1"),
    )
}
"""The spec's element types, by their spelling in `.ir` files."""

ELEMENT_TYPES: dict[str, Attribute] = {n: e.type for n, e in ELEMENTS.items()}

SCALAR_TYPES: dict[str, Attribute] = {**ELEMENT_TYPES, "index": IndexType()}
"""Scalar types the lower levels add (loop indices are `index`)."""

FLOAT_NAMES = tuple(n for n, e in ELEMENTS.items() if e.kind == "float")
HALF_NAMES = tuple(n for n in FLOAT_NAMES if ELEMENTS[n].bits == 16)
INT_NAMES = tuple(n for n, e in ELEMENTS.items() if e.kind == "int")
FLOAT_TYPES = frozenset(ELEMENT_TYPES[n] for n in FLOAT_NAMES)
HALF_TYPES = frozenset(ELEMENT_TYPES[n] for n in HALF_NAMES)
I1 = ELEMENT_TYPES["i1"]
F32 = ELEMENT_TYPES["f32"]

MAX_ELEMENTS = 2**48
"""Tensors larger than this (256 Ti elements) are rejected as surely a typo."""

_BYTES = {**{n: e.bits // 8 for n, e in ELEMENTS.items()}, "index": 8}


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
