"""Checks of the attributes of loop and tile ops, shared by their `verify_` methods.

Each raises `VerifyException` with a message that names the op and the
attribute, so that the verifier can report it at the op in the source: a bad
number caught here would otherwise surface as a crash of the printer or a
Triton compile error.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, IntegerAttr, StringAttr, TensorType
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import Attribute, Operation
from xdsl.irdl import BaseAttr
from xdsl.irdl.constraints import VerificationContext
from xdsl.utils.exceptions import VerifyException

from irc.ir.types import ELEMENT_TYPES, FLOAT_TYPES, I1, SCALAR_TYPES, format_type

I32 = ELEMENT_TYPES["i32"]
I64 = ELEMENT_TYPES["i64"]

MAX_BLOCK = 2**20
"""Elements of one Triton block at most (Triton's TRITON_MAX_TENSOR_NUMEL)."""

MAX_WARPS = 32
"""Warps of one program at most: 1024 threads, CUDA's limit for a block."""

MAX_STAGES = 16
"""Software-pipelining stages at most; autotuning tries 1 to 4, and each stage
holds a copy of the loop's operand tiles in shared memory."""

MAX_UNROLLED_CHUNKS = 64
"""Chunks of a row a reduction kernel unrolls at most (`unrolled = 1`): each is
straight-line code, and a row longer than that stays a loop."""

MAX_GRID = 2**31 - 1
"""Programs along one grid axis at most (CUDA's limit on the x axis)."""
MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second and third axes."""


def int_value(op: Operation, name: str, attr: Attribute | None) -> int:
    """The integer in `attr`, or a message that `name` must be an integer."""
    if not isinstance(attr, IntegerAttr):
        raise VerifyException(f"{op.name}: '{name}' must be an integer")
    return attr.value.data


def check_int(
    op: Operation,
    name: str,
    attr: Attribute | None,
    lo: int,
    hi: int | None = None,
    *,
    power_of_two: bool = False,
) -> int:
    """An integer attribute in lo..hi (a power of two if asked); returns its value."""
    value = int_value(op, name, attr)
    if value < lo or (hi is not None and value > hi) or (power_of_two and value & (value - 1)):
        kind = "a power of two" if power_of_two else "an integer"
        span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        raise VerifyException(f"{op.name}: '{name}' must be {kind} {span}, got {value}")
    return value


def check_int_list(
    op: Operation,
    name: str,
    attr: Attribute | None,
    lo: int,
    hi: int,
    *,
    lengths: tuple[int, ...],
    power_of_two: bool = False,
) -> list[int]:
    """A list of `lengths` entries, each as `check_int` wants it."""
    entries = attr.data if isinstance(attr, ArrayAttr) else None
    if entries is None or len(entries) not in lengths:
        counts = " or ".join(str(n) for n in lengths)
        raise VerifyException(f"{op.name}: '{name}' must be a list of {counts} integers")
    return [check_int(op, f"{name}[{i}]", e, lo, hi, power_of_two=power_of_two)
            for i, e in enumerate(entries)]  # fmt: skip


def check_flag(op: Operation, name: str, attr: Attribute | None) -> None:
    """A marker attribute: 1 (or true) where present; the op's code tests presence."""
    if attr is None:
        return
    if not isinstance(attr, IntegerAttr) or attr.value.data != (-1 if _is_bool(attr) else 1):
        raise VerifyException(
            f"{op.name}: '{name}' is 1 (or true) where given; leave it out otherwise"
        )


def _is_bool(attr: Attribute) -> bool:
    """`true`/`false` as written (xDSL keeps an i1 true as -1)."""
    return isinstance(attr, IntegerAttr) and attr.type == I1


def check_choice(op: Operation, name: str, attr: Attribute | None, choices: tuple[str, ...]) -> str:
    """A string attribute that is one of `choices`."""
    allowed = ", ".join(f'"{c}"' for c in choices)
    if not isinstance(attr, StringAttr) or attr.data not in choices:
        got = f'"{attr.data}"' if isinstance(attr, StringAttr) else "a non-string"
        raise VerifyException(f"{op.name}: '{name}' must be one of {allowed}, got {got}")
    return attr.data


def element_type(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def check_number(op: Operation, name: str, value: Attribute | None, t: Attribute) -> None:
    """`value` is a number that an element of type `t` can hold exactly as written:
    a whole number for integer and index types (0 or 1 for i1), any number for floats."""
    element = element_type(t)
    if element not in SCALAR_TYPES.values():
        raise VerifyException(
            f"{op.name}: the type must be a scalar or a block of scalars, got {format_type(t)}"
        )
    if not isinstance(value, IntegerAttr | FloatAttr):
        raise VerifyException(f"{op.name}: '{name}' must be a number")
    if _is_bool(value):
        if element != I1:
            raise VerifyException(
                f"{op.name}: a true/false '{name}' needs the i1 type, got {format_type(t)}"
            )
        return
    if element in FLOAT_TYPES:
        return
    number = value.value.data
    if isinstance(value, FloatAttr) and not float(number).is_integer():
        raise VerifyException(
            f"{op.name}: '{name}' is {number}, not an integer as {format_type(t)} needs"
        )
    if isinstance(value, FloatAttr):
        # A whole float still says "float": at this level the literal is the value's
        # type as Triton sees it (`8.0` makes an fp32 constant), so it must match.
        raise VerifyException(
            f"{op.name}: '{name}' is the float {number}, but {format_type(t)} needs an "
            f"integer (write {int(number)})"
        )
    whole = int(number)
    if element == I1:
        if whole not in (0, 1, -1):  # -1: xDSL keeps a signless i1 true as all bits set
            raise VerifyException(f"{op.name}: '{name}' of an i1 must be 0 or 1, got {whole}")
        return
    bits = 32 if element == I32 else 64  # i64 and index
    if not -(2 ** (bits - 1)) <= whole < 2 ** (bits - 1):
        raise VerifyException(f"{op.name}: '{name}' {whole} does not fit in {format_type(element)}")


def number_for(value: Attribute, t: Attribute) -> Attribute:
    """`value` (a graph constant's) written as the loop and tile levels want it for
    an element of type `t`: a whole float becomes an integer for integer types."""
    if isinstance(value, FloatAttr) and element_type(t) not in FLOAT_TYPES:
        number = value.value.data
        if float(number).is_integer():
            return IntegerAttr(int(number), I64)
    return value


@dataclass(frozen=True, init=False)
class NamedEnum(BaseAttr[EnumAttribute[Any]]):
    """An IRDL constraint: the property is one member of an `EnumAttribute`.

    irc text writes the member as a string (`{fn = "exp"}`): the parser turns a
    string that names a member into the attribute (`from_text`), and one that
    names none stays a string, which this constraint reports with the member
    it was closest to. xDSL's MLIR syntax writes the attribute itself
    (`#loop<fn exp>`) and refuses an unknown member while it parses.
    """

    op_name: str
    key: str
    what: str

    def __init__(self, attr: type[EnumAttribute[Any]], op_name: str, key: str, what: str):
        super().__init__(attr)
        object.__setattr__(self, "op_name", op_name)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "what", what)

    def members(self) -> list[str]:
        return [m.value for m in self.attr.enum_type]

    def from_text(self, value: Attribute) -> Attribute:
        """The attribute a string written in irc text stands for (as written if no member)."""
        if isinstance(value, StringAttr) and value.data in self.members():
            return self.attr(self.attr.enum_type(value.data))
        return value

    def verify(self, attr: Attribute, constraint_context: VerificationContext) -> None:
        if isinstance(attr, self.attr):
            return
        if isinstance(attr, StringAttr) and attr.data in self.members():
            raise VerifyException(
                f"{self.op_name}: '{self.key}' is the string \"{attr.data}\", not the {self.what}"
                f" ({self.attr.__name__}, which irc text writes as that string)"
            )
        if isinstance(attr, StringAttr):
            close = difflib.get_close_matches(attr.data, self.members(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise VerifyException(f"{self.op_name}: unknown {self.what} '{attr.data}'{hint}")
        raise VerifyException(
            f"{self.op_name}: '{self.key}' must name a {self.what}, like \"{self.members()[0]}\""
        )
