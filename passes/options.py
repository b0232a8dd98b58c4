"""Pass options checked when a pass is made, so that a bad `-p` fails with the
option's name and range, not deep inside the pass."""

from __future__ import annotations


def check_option(
    pass_name: str,
    option: str,
    value: int,
    lo: int,
    hi: int | None = None,
    *,
    power_of_two: bool = False,
    why: str = "",
) -> None:
    """A pass option's range, checked when the pass is made: raises `IrcError`
    (`tile: 'block' must be a power of two, got 3`) naming it as it is spelled."""
    from irc.syntax.diagnostics import Diagnostic, IrcError

    spelled = option.replace("_", "-")
    problem = None
    if power_of_two and (value < 1 or value & (value - 1)):
        problem = "a power of two"
    elif value < lo:
        problem = f"at least {lo}"
    elif hi is not None and value > hi:
        problem = f"at most {hi}" + (f" ({why})" if why else "")
    if problem is not None:
        raise IrcError(Diagnostic(None, f"{pass_name}: '{spelled}' must be {problem}, got {value}"))
