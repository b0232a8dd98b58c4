"""Kernel names: a new kernel's own (`unique_name`), and the names a module's
kernels get once lowered, for a pass that reports them.

`fuse{report=...}` names its kernels as `irc-opt --emit triton` does, which only
the lowering decides (split-reduction adds stages, loop-to-tile names them). A
pass may not import the driver that runs it (`irc.pipeline` imports every pass),
so the driver hands its lowering down here while it runs a pipeline: the
passes and their order have one home, `irc.pipeline.LOWERING`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from xdsl.dialects.builtin import ModuleOp

from irc.dialects import loop

Lowering = Callable[[ModuleOp], ModuleOp]
"""Takes a copy of a module down to tile kernels; the module itself is left alone."""

_LOWERING: ContextVar[Lowering | None] = ContextVar("irc_lowering_for_names", default=None)


@contextmanager
def lowering_for_names(lower: Lowering) -> Iterator[None]:
    """Inside the block, `lowered_copy` lowers by `lower` (irc.pipeline sets it)."""
    token = _LOWERING.set(lower)
    try:
        yield
    finally:
        _LOWERING.reset(token)


def lowered_copy(module: ModuleOp) -> ModuleOp:
    """A copy of `module` taken down to tile kernels by the running pipeline's lowering."""
    lower = _LOWERING.get()
    if lower is None:
        raise RuntimeError(
            "kernel names need the lowering: run the pass through irc.pipeline.run_pipeline"
        )
    return lower(module)


def kernel_names(op: ModuleOp) -> set[str]:
    """The names `op`'s kernels take, which a new kernel's must not (`unique_name`)."""
    return {k.kernel_name.data for k in loop.kernels(op)}


def numbered_name(prefix: str, taken: set[str]) -> str:
    """`prefix` and the first number no kernel has (`k_major_0`, `k_major_1`...);
    taken from then on."""
    n = 0
    while f"{prefix}{n}" in taken:
        n += 1
    taken.add(f"{prefix}{n}")
    return f"{prefix}{n}"


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_`, `name__`... where a kernel already has it (hand-written IR
    may name a kernel `r_split` beside the `r` a pass splits); taken from then on."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name
