"""A kernel's kind and row geometry: decided once, by `fuse`, and read after.

One vocabulary for every level: `pointwise` (one index space, element by
element), `reduction` (rows of a space, reduced along some of its dims, with
an element-wise prologue and epilogue), `contraction` (a matmul with its
epilogue) and `attention` (a contraction whose scores go through element-wise
work and a row softmax into a second contraction over the softmax's dim:
one FlashAttention-2 kernel, passes/fuse_attention.py). `fuse` writes the kind on `graph.fused` (and, for a reduction, the
geometry its legality relied on); `graph-to-loop` carries the kind onto
`loop.kernel`; `split-reduction`, `tile`, `loop-to-tile` and the kernel-name
prefix read it. IR written by hand without it gets the kind its body has, by
the same functions the passes use, and a kind written by hand must be that one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class KernelKind(StrEnum):
    """What one loop nest computes; the values are the IR spelling."""

    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    CONTRACTION = "contraction"
    ATTENTION = "attention"


KINDS = ", ".join(f'"{k}"' for k in KernelKind)
"""The kinds as a verifier message lists them."""

NAME_PREFIX: dict[KernelKind, str] = {
    KernelKind.POINTWISE: "poi",
    KernelKind.REDUCTION: "red",
    KernelKind.CONTRACTION: "mm",
    KernelKind.ATTENTION: "attn",
}
"""The first part of a kernel's name, as in Inductor (`per` for a persistent
reduction is chosen where the tiling is known: irc.ir.names.tile_kernel_name)."""


def parse_kind(text: str) -> KernelKind | None:
    """The kind spelled `text`, or None when it is not one."""
    try:
        return KernelKind(text)
    except ValueError:
        return None


class GeometryMismatch(ValueError):
    """Reductions that no one row space holds."""


@dataclass(frozen=True)
class RowGeometry:
    """The rows of a reduction kernel: its reductions' input shape and reduced dims."""

    space: tuple[int, ...]
    dims: tuple[int, ...]  # sorted

    @property
    def row(self) -> tuple[int, ...]:
        """A row value's shape without keepdim: the kernel's parallel bounds."""
        return tuple(s for d, s in enumerate(self.space) if d not in self.dims)

    @property
    def row_keep(self) -> tuple[int, ...]:
        """A row value's shape with keepdim (reduced dims of size 1)."""
        return tuple(1 if d in self.dims else s for d, s in enumerate(self.space))

    @property
    def reduced(self) -> tuple[int, ...]:
        """The sizes of the reduced dims: the bounds of the reduction loop."""
        return tuple(self.space[d] for d in self.dims)


__all__ = [
    "KINDS",
    "NAME_PREFIX",
    "GeometryMismatch",
    "KernelKind",
    "RowGeometry",
    "parse_kind",
]
