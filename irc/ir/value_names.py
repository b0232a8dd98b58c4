"""Value names as the user wrote them (`%0`, `%x_1`), which xDSL's own `name_hint` would
rewrite or refuse."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from contextlib import contextmanager

from xdsl.ir import Operation, SSAValue


def set_value_name(value: SSAValue, name: str | None) -> None:
    """Keeps the user's spelling of a value name.

    xDSL's `name_hint` setter drops `_N` suffixes and rejects names such as
    `0`; irc prints names as written, so it stores them unchanged.
    """
    value._name = name  # pyright: ignore[reportPrivateUsage]


# irc keeps value names as written (`%0`, `%1`), but xDSL's rewriter copies a
# replaced op's name onto the new values through a setter that rejects names
# starting with a digit (a ValueError inside any pass that replaces such an op).
# Around each pass those names carry a prefix that xDSL accepts.
_NAME_PREFIX = "$irc$"


def _named_values(module: Operation) -> Iterator[SSAValue]:
    for op in module.walk():
        yield from op.results
        for region in op.regions:
            for block in region.blocks:
                yield from block.args


def encode_value_names(module: Operation) -> None:
    """Gives every name xDSL would reject a prefix that makes it acceptable."""
    for value in _named_values(module):
        name = value.name_hint
        if name is not None and not SSAValue.is_valid_name(name):
            set_value_name(value, _NAME_PREFIX + name)


def decode_value_names(module: Operation) -> None:
    """Undoes `encode_value_names`, also on values a pass named after old ones."""
    for value in _named_values(module):
        name = value.name_hint
        if name is not None and name.startswith(_NAME_PREFIX):
            set_value_name(value, name[len(_NAME_PREFIX) :] or None)


@contextmanager
def names_xdsl_accepts(op: Operation) -> Iterator[None]:
    """Names xDSL accepts while a rewrite runs, the written ones after
    (`encode_value_names`, then `decode_value_names`): every pass runs so, and so
    must a rewrite that runs outside a pass pipeline."""
    encode_value_names(op)
    try:
        yield
    finally:
        decode_value_names(op)


def written_name(value: SSAValue) -> str | None:
    """`value`'s name as written, also while a pass runs (when some names are encoded)."""
    name = value.name_hint
    return name.removeprefix(_NAME_PREFIX) or None if name is not None else None


def written_label(op: Operation) -> str:
    """`op` as a report names it: `reduce_sum %x` (its first value's name as written,
    also while a pass runs), or `reduce_sum` for an unnamed value."""
    short = op.name.removeprefix("graph.")
    name = written_name(op.results[0]) if op.results else None
    return f"{short} %{name}" if name else short


OpT = typing.TypeVar("OpT", bound=Operation)


def clone_keeping_names(op: OpT) -> OpT:
    """A copy of `op` whose values keep their names as written: xDSL's `clone` copies a
    name through a setter that rejects `%0` (the printer's own names), a ValueError."""
    encode_value_names(op)
    try:
        copy = op.clone()
    finally:
        decode_value_names(op)
    decode_value_names(copy)
    return copy
