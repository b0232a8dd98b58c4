"""Building graph ops for FX nodes: value names, scalars as constants, casts.

An `Emitter` appends graph ops to one block. Each op is built by the op's own
type inference (`GraphOp.make`), so a converter cannot produce a type irc
would reject; the importer then compares the last type with torch's.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, IntegerAttr, IntegerType, f64, i64
from xdsl.ir import Attribute, Block, SSAValue

from irc.dialects import graph
from irc.ir.types import FLOAT_TYPES, I1, element_of, shape_of, tensor
from irc.ir.value_names import set_value_name
from irc.pytorch.types import element

_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.$-]")


class Unsupported(Exception):
    """A node irc cannot take as it is: it runs in eager (the message says why)."""


def clean_name(name: str) -> str:
    """An irc value name from an FX node name (FX names are identifiers already)."""
    return _NAME_CHARS.sub("_", name) or "v"


def int_list(values: Any) -> ArrayAttr[IntegerAttr]:
    return ArrayAttr([IntegerAttr(int(v), i64) for v in values])


def boolean(value: bool) -> IntegerAttr:
    return IntegerAttr(int(value), IntegerType(1))


def number(value: float | int | bool, elem: Attribute) -> Attribute:
    """A constant's `value` for an element type (an i1 as true/false)."""
    if elem == I1:
        return boolean(bool(value))
    if elem in FLOAT_TYPES:
        return FloatAttr(float(value), f64)
    if isinstance(value, float) and not value.is_integer():
        raise Unsupported(f"{value} is not an integer")
    return IntegerAttr(int(value), i64)


class Emitter:
    """Appends graph ops to `block`, naming each result after the FX node it serves."""

    def __init__(self, block: Block, taken: set[str] | None = None):
        self.block = block
        self.taken: set[str] = taken if taken is not None else set()
        self.values: dict[Any, Any] = {}
        self.name = "v"
        """The FX node being converted: the stem of the names given to its values."""

    def unique(self, stem: str) -> str:
        stem = clean_name(stem)
        name, n = stem, 1
        while name in self.taken:
            name = f"{stem}.{n}"
            n += 1
        self.taken.add(name)
        return name

    def named(self, value: SSAValue, stem: str) -> SSAValue:
        set_value_name(value, self.unique(stem))
        return value

    def op(
        self,
        cls: type[graph.GraphOp],
        *operands: SSAValue,
        result_type: Attribute | None = None,
        **props: Attribute,
    ) -> SSAValue:
        op = cls.make(*operands, result_type=result_type, **props)
        self.block.add_op(op)
        return self.named(op.results[0], self.name)

    def arg(self, value: Any) -> SSAValue:
        """The irc value of an FX node argument."""
        if value in self.values:
            found = self.values[value]
            if isinstance(found, SSAValue):
                return found
        raise Unsupported(f"argument {value!r} is not a tensor irc holds")

    def operand(self, value: Any, elem: Attribute) -> SSAValue:
        """A tensor argument cast to `elem`, or a Python number as a rank-0 constant."""
        if isinstance(value, bool | int | float):
            return self.scalar(value, elem)
        return self.cast(self.arg(value), elem)

    def scalar(self, value: float | int | bool, elem: Attribute) -> SSAValue:
        return self.constant(value, tensor([], elem))

    def constant(self, value: float | int | bool, t: Attribute) -> SSAValue:
        if isinstance(value, float) and math.isnan(value) and element_of(t) not in FLOAT_TYPES:
            raise Unsupported("NaN in an integer tensor")
        return self.op(graph.ConstantOp, result_type=t, value=number(value, element_of(t)))

    def cast(self, value: SSAValue, elem: Attribute) -> SSAValue:
        if element_of(value.type) == elem:
            return value
        return self.op(graph.CastOp, value, result_type=tensor(shape_of(value.type), elem))

    def reshape(self, value: SSAValue, shape: list[int]) -> SSAValue:
        if list(shape_of(value.type)) == list(shape):
            return value
        return self.op(
            graph.ReshapeOp, value, result_type=tensor(shape, element_of(value.type))
        )


def dtype_elem(dtype: torch.dtype) -> Attribute:
    try:
        return element(dtype)
    except KeyError:
        raise Unsupported(f"dtype {dtype} is not an irc element type") from None
