"""irc's dialects, one a file: `graph` (tensors), `loop` (loop nests), `tile` (blocks)."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Dialect


def _graph() -> Dialect:
    from irc.dialects.graph import Graph

    return Graph


def _loop() -> Dialect:
    from irc.dialects.loop import Loop

    return Loop


def _tile() -> Dialect:
    from irc.dialects.tile import Tile

    return Tile


DIALECTS: dict[str, Callable[[], Dialect]] = {"graph": _graph, "loop": _loop, "tile": _tile}
"""Dialect name -> lazy loader (the shape xDSL's `Universe` expects)."""


def all_dialects() -> list[Dialect]:
    return [load() for load in DIALECTS.values()]
