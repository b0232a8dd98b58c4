"""Kernel names: the one kind of IR name that becomes a Python identifier.

A kernel's name is the name of its `@triton.jit` function, so that profilers
show `triton_poi_fused_exp_0` as Inductor's kernels do. Every other IR name
(functions, arguments, values) reaches the generated Python only as a string
literal. So the verifier holds kernel names to ASCII identifiers that are not
Python keywords (non-ASCII letters are out: Python folds them, NFKC, onto other
names), and the emitter renames the few that would shadow a name the generated
module uses (`torch`, `range`, `fn0`...).
"""

from __future__ import annotations

import keyword
import re

KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A kernel name: an ASCII letter or `_`, then letters, digits and `_`."""


def kernel_name_problem(name: str) -> str | None:
    """Why `name` cannot name a kernel, or None when it can."""
    if KERNEL_NAME.fullmatch(name) is None:
        return (
            f"kernel name {quoted(name)} is not an identifier "
            "(ASCII letters, digits and _, not starting with a digit)"
        )
    if keyword.iskeyword(name):
        return f"kernel name {quoted(name)} is a Python keyword"
    return None


def tile_kernel_name(loop_name: str, persistent: bool) -> str:
    """The tile.kernel (and Triton function) name of a loop.kernel named `loop_name`:
    `triton_` in front and, as in Inductor, `per_` for `red_` when the whole row is
    held in registers. loop-to-tile adds `_` to tell equal names apart."""
    name = "triton_" + loop_name
    if persistent:
        name = name.replace("triton_red_", "triton_per_", 1)
    return name


def loop_kernel_name(tile_name: str) -> str:
    """The loop.kernel name a tile.kernel name was made from (`tile_kernel_name`
    undone, with the `_`s loop-to-tile adds to tell equal names apart)."""
    name = tile_name.rstrip("_") or tile_name
    name = name.removeprefix("triton_")
    return "red_" + name[len("per_") :] if name.startswith("per_") else name


def quoted(name: str, limit: int = 60) -> str:
    """`name` as an IR string literal on one line, shortened when long."""
    text = format_string(name)
    return text if len(text) <= limit else text[: limit - 4] + '..."'


def check_kernel_name(op_name: str, name: str) -> None:
    """Raises the verifier's error, located at the op, for a name no kernel can have."""
    from xdsl.utils.exceptions import VerifyException

    problem = kernel_name_problem(name)
    if problem is not None:
        raise VerifyException(f"{op_name}: {problem}")


_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def format_string(text: str) -> str:
    """A string literal that `irc.syntax.parser.unescape_string` reads back as `text`."""
    out = []
    for c in text:
        if c in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[c])
        elif not c.isprintable() and ord(c) < 0x10000:
            out.append(f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'
