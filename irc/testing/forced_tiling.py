"""Programs lowered with a tiling forced on some of their kernels, as autotuning
may choose one: tests run layouts the heuristic does not pick at their sizes
(persistent GEMMs of small tiles, epilogues in parts) through the interpreter."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import ModuleOp

import irc
from irc.compiler import CompiledModule
from irc.dialects import loop, tile
from irc.lowering.tile_to_triton import emit_triton
from irc.passes.tile import Tiling, set_tiling
from irc.pipeline import AFTER_TILING, LOWERING, run_pipeline

UP_TO_TILE = ",".join(["fuse", *LOWERING[: LOWERING.index("tile") + 1]])
"""The passes a graph-level program goes through before a tiling is forced: those
`irc.compile` runs, up to `tile`."""


def compile_with_tiling(
    text: str,
    tiling: Tiling | None,
    device: str,
    up_to_tile: str = UP_TO_TILE,
    chosen: Callable[[loop.KernelOp], bool] = lambda kernel: True,
) -> tuple[CompiledModule, ModuleOp]:
    """`text` (graph level) through `up_to_tile`, `tiling` set on every loop kernel
    `chosen` picks, the rest of the lowering (verified), and compiled for `device`;
    with the tile-level module."""
    module = irc.parse(text, "forced.ir")
    run_pipeline(module, up_to_tile)
    if tiling is not None:
        for kernel in module.walk():
            if isinstance(kernel, loop.KernelOp) and chosen(kernel):
                set_tiling(kernel, tiling)
    run_pipeline(module, ",".join(AFTER_TILING))
    irc.verify(module)
    kernels = len(tile.kernels(module))
    return CompiledModule(emit_triton(module, "forced.ir"), device, kernels, module), module
