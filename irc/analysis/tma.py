"""Which accesses of a GEMM go through the TMA copy engine: both the tile pass
(which counts the shared memory their staged tiles take) and loop-to-tile (which
makes them `tile.block_load` / `tile.block_store`) ask here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xdsl.ir import Attribute

from irc.ir.types import ELEMENT_TYPES, F32, HALF_TYPES, element_bytes

TMA_ELEMENTS = (*HALF_TYPES, F32, ELEMENT_TYPES["i32"])
"""Element types whose whole-buffer tiles persistent GEMMs move by TMA."""

WIDE = 2**31
"""Elements past which a kernel's offsets need i64 (`wide_indices`)."""


def wide_indices(buffer_sizes: Iterable[int], space: int) -> bool:
    """Whether a kernel indexes in i64: a buffer of `WIDE` elements or more, or an
    iteration space of `space` elements whose doubled offsets would reach it.
    TMA boxes take i32 coordinates: such a kernel keeps pointer loads and stores."""
    return max(buffer_sizes, default=1) >= WIDE or space * 2 >= WIDE


def tma_buffer(shape: Sequence[int], element: Attribute, extent: Sequence[int]) -> bool:
    """Whether a buffer of `shape` and `element` is a whole 2-d row-major buffer of
    `extent` (the GEMM's output rows and columns) with 16-byte aligned rows."""
    if element not in TMA_ELEMENTS or tuple(shape) != tuple(extent) or len(extent) != 2:
        return False
    return shape[1] * element_bytes(element) % 16 == 0
