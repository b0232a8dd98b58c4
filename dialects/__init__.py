"""irc's dialects, one a file: `graph` (tensors), `loop` (loop nests), `tile` (blocks)."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Dialect


def _graph() -> Dialect:
    from irc.dialects.graph import Graph

    return Graph


DIALECTS: dict[str, Callable[[], Dialect]] = {"graph": _graph}
"""Dialect name -> lazy loader (the shape xDSL's `Universe` expects)."""


def all_dialects() -> list[Dialect]:
    return [load() for load in DIALECTS.values()]
