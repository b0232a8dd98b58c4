"""The cyclic garbage collector, paused while irc builds or rewrites IR.

A module of a few thousand ops is hundreds of thousands of Python objects
(ops, values, uses, attributes), all alive until the compile ends. CPython's
full collections walk every one of them, and they keep coming while the
passes allocate: on a 10,000-op graph they took a fifth of `irc-opt --fuse
--emit triton`, a share that grows with the graph. IR is freed when the
module goes, so irc turns the collector off while it works on a module and
back on when done (as it was: a caller that turned it off keeps it off).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic cyclic collection inside; also a decorator (`@paused_gc()`)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
