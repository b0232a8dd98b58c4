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


TMA_BYTES = 16
"""The copy engine's granule: a buffer's rows are a multiple of it, a box's rows at
least it (CUDA's tensor maps; Triton refuses narrower boxes)."""


def tma_buffer(shape: Sequence[int], element: Attribute, extent: Sequence[int]) -> bool:
    """Whether a buffer of `shape` and `element` is a whole 2-d row-major buffer of
    `extent` (the GEMM's output rows and columns) with 16-byte aligned rows."""
    return tuple(shape) == tuple(extent) and tma_pitch(shape, element, extent) is not None


def tma_pitch(shape: Sequence[int], element: Attribute, extent: Sequence[int]) -> int | None:
    """The row length at which TMA reads the first `extent[1]` columns of every row of
    a 2-d row-major buffer of `shape` and `element` (an operand of `extent`; rows
    padded past it, as `pad-gemm-operands` makes them), or None where it cannot:
    other rows, too few columns, rows not 16-byte aligned."""
    if element not in TMA_ELEMENTS or len(extent) != 2 or len(shape) != 2:
        return None
    if shape[0] != extent[0] or shape[1] < extent[1]:
        return None
    return shape[1] if shape[1] * element_bytes(element) % TMA_BYTES == 0 else None


TMA_BOX_SIDE = 256
"""The most elements a TMA box spans along any dimension (CUDA's tensor maps)."""


def box_problem(shape: Sequence[int], box: Sequence[int], element: Attribute) -> str | None:
    """Why TMA cannot move `box` blocks of a row-major buffer of `shape` and `element`
    (None if it can): rows not 16-byte aligned, a box's rows under 16 bytes, or a
    box side over `TMA_BOX_SIDE` elements."""
    size = element_bytes(element)
    if max(box) > TMA_BOX_SIDE:
        return (
            f"its box is {'x'.join(map(str, box))}; a TMA box spans at most "
            f"{TMA_BOX_SIDE} elements a side"
        )
    if shape[-1] * size % TMA_BYTES:
        return (
            f"its buffer's rows are {shape[-1] * size} bytes; TMA moves blocks of buffers "
            f"whose rows are a multiple of {TMA_BYTES} bytes"
        )
    if box[-1] * size < TMA_BYTES:
        return (
            f"its box's rows are {box[-1] * size} bytes; a TMA box's rows are at least "
            f"{TMA_BYTES} bytes"
        )
    return None
