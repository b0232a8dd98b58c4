"""irc's passes, one a file, each an xDSL `ModulePass`.

`PASSES` maps each pass name to a loader of its class (the shape xDSL's
`Universe` and `PassPipeline.parse_spec` expect), so importing this package
stays cheap and an xDSL-based compiler can pick passes by name.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass

LEVELS = ("graph", "loop", "tile")
"""The levels of irc's IR, highest first. Each pass names those it runs on in a
`levels` class attribute; `irc.pipeline` refuses a module of another level."""


def _decompose() -> type[ModulePass]:
    from irc.passes.decompose import DecomposePass

    return DecomposePass


def _graph_to_loop() -> type[ModulePass]:
    from irc.lowering.graph_to_loop import GraphToLoopPass

    return GraphToLoopPass


def _one_pass_variance() -> type[ModulePass]:
    from irc.passes.one_pass_variance import OnePassVariancePass

    return OnePassVariancePass


def _split_reduction() -> type[ModulePass]:
    from irc.passes.split_reduction import SplitReductionPass

    return SplitReductionPass


def _pad_gemm_operands() -> type[ModulePass]:
    from irc.passes.pad_gemm_operands import PadGemmOperandsPass

    return PadGemmOperandsPass


def _k_major_gemm_operands() -> type[ModulePass]:
    from irc.passes.k_major_gemm_operands import KMajorGemmOperandsPass

    return KMajorGemmOperandsPass


def _split_k() -> type[ModulePass]:
    from irc.passes.split_k import SplitKPass

    return SplitKPass


def _split_tf32_gemm_operands() -> type[ModulePass]:
    from irc.passes.split_tf32_gemm_operands import SplitTf32GemmOperandsPass

    return SplitTf32GemmOperandsPass


def _library_gemm() -> type[ModulePass]:
    from irc.passes.library_gemm import LibraryGemmPass

    return LibraryGemmPass


def _tile() -> type[ModulePass]:
    from irc.passes.tile import TilePass

    return TilePass


def _loop_to_tile() -> type[ModulePass]:
    from irc.lowering.loop_to_tile import LoopToTilePass

    return LoopToTilePass


def _fuse() -> type[ModulePass]:
    from irc.passes.fuse import FusePass

    return FusePass


def _online_softmax() -> type[ModulePass]:
    from irc.passes.online_softmax import OnlineSoftmaxPass

    return OnlineSoftmaxPass


def _tile_cse() -> type[ModulePass]:
    from irc.passes.tile_cse import TileCSEPass

    return TileCSEPass


def _dce() -> type[ModulePass]:
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    return DeadCodeElimination


def _contract_mul_add() -> type[ModulePass]:
    from irc.passes.contract_mul_add import ContractMulAddPass

    return ContractMulAddPass


def _tile_sink() -> type[ModulePass]:
    from irc.passes.tile_sink import TileSinkPass

    return TileSinkPass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "decompose": _decompose,
    "fuse": _fuse,
    "graph-to-loop": _graph_to_loop,
    "one-pass-variance": _one_pass_variance,
    "split-reduction": _split_reduction,
    "pad-gemm-operands": _pad_gemm_operands,
    "split-tf32-gemm-operands": _split_tf32_gemm_operands,
    "k-major-gemm-operands": _k_major_gemm_operands,
    "split-k": _split_k,
    "library-gemm": _library_gemm,
    "tile": _tile,
    "online-softmax": _online_softmax,
    "loop-to-tile": _loop_to_tile,
    "tile-cse": _tile_cse,
    "dce": _dce,
    "contract-mul-add": _contract_mul_add,
    "tile-sink": _tile_sink,
}
"""Every pass by name, in pipeline order (`irc-opt` makes one flag of each)."""

XDSL_PASSES = frozenset({"dce"})
"""The entries of `PASSES` that are xDSL's own passes (`xdsl-opt` has them already)."""
