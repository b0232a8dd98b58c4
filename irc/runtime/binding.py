"""Arguments of generated host functions, by the IR's names.

A host function takes its tensors by position under generated names
(`def fn0(arg0=UNSET, arg1=UNSET, /, *rest, **named)`), which costs a call
nothing. Only a call that gives keywords, or the wrong number of arguments,
goes through `bind`: it accepts the IR's argument names as keywords (`x=t`,
or `**{"x.y": t}` for a name that is no Python identifier) and reports a wrong
call with the IR's names (`@softmax takes 1 argument (%x), got 2`), never
the generated `fn0` and `arg0`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class _Unset:
    """The default of every host-function parameter: an argument not given by position."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def bind(
    fn: str, names: Sequence[str | None], given: Sequence[Any], named: dict[str, Any]
) -> list[Any]:
    """The arguments of IR function `fn` (like "@softmax") in order.

    `names` are its arguments' IR names without `%` (None for one without a
    name), `given` what came by position (trailing UNSETs are the defaults),
    `named` what came by keyword; a leading `%` on a keyword is accepted.
    """
    labels = [f"%{n}" if n is not None else f"argument {i}" for i, n in enumerate(names)]
    signature = ", ".join(labels) or "none"
    count = f"{len(names)} argument{'' if len(names) == 1 else 's'} ({signature})"
    given = list(given)
    while given and given[-1] is UNSET:
        given.pop()
    if len(given) > len(names):
        raise TypeError(f"{fn} takes {count}, got {len(given)}")
    args = given + [UNSET] * (len(names) - len(given))
    for key, value in named.items():
        name = key.removeprefix("%")
        if name not in names:
            raise TypeError(f"{fn} has no argument %{name} (its arguments: {signature})")
        if names.count(name) > 1:  # only in a module built in Python, not parsed
            raise TypeError(f"{fn} has several arguments named %{name}: pass them by position")
        i = names.index(name)
        if args[i] is not UNSET:
            raise TypeError(f"{fn} got %{name} twice, by position and by name")
        args[i] = value
    missing = [label for label, a in zip(labels, args, strict=True) if a is UNSET]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise TypeError(f"{fn} takes {count}; {', '.join(missing)} {verb} missing")
    return args
