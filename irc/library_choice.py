"""Which GEMM kernels run on the vendor's library (`library-gemm`), measured on the GPU.

irc's GEMM kernel with its epilogue fused, and cuBLAS's GEMM followed by the
epilogue as its own element-wise kernel, are each lowered exactly as the real
compile would lower them (the target's tile pass, split tails, the epilogue's
tiling) into a function of the kernel's buffers alone, and timed on random
inputs in turns (`irc.autotune.time_in_turns`). The library is chosen where it
is faster by more than the timings' noise and by `MIN_GAIN`: fusion also spares
the memory system, which a timing of the GEMM alone does not show. Products under
`MIN_FLOPS` (f32: `MIN_F32_FLOPS`) keep irc's kernel without a measurement: there
the library's extra launch and pass over the product cost more than any GEMM rate
can win back.

Decisions are cached beside the autotuner's (`autotune.json`), keyed by the
kernel's IR, the GPU's name and Triton's and torch's versions, and each chosen one
carries its measurement as the `loop.library_matmul`'s `reason`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region, SSAValue

from irc.autotune import (
    FINAL_ROUNDS,
    beats_default,
    kernel_buffers,
    kernel_key,
    random_buffers,
    timings_in_turns,
)
from irc.dialects import loop
from irc.ir.types import F32
from irc.ir.value_names import names_xdsl_accepts
from irc.passes.library_gemm import PlainGemm, plain_gemm, to_library
from irc.target import Target

MIN_FLOPS = 2**32
"""The smallest half-precision product (2 M N K) measured: about 7 us of an H200's
bf16 tensor cores, where a second launch and a pass over the product are a few us."""

MIN_F32_FLOPS = 2**29
"""The same for f32: about 13 us of cuBLAS's SGEMM (40 TFLOP/s on an H200:
1293x1310x1545 took 136 us)."""


def min_flops(gemm: PlainGemm) -> int:
    """The smallest product of `gemm`'s element type worth a measurement."""
    return MIN_F32_FLOPS if gemm.contraction.result.type == F32 else MIN_FLOPS


MIN_GAIN = 0.02
"""The library must be at least 2% faster than irc's fused kernel to be chosen."""

ALWAYS = 'library_gemm="always"'
"""The reason of a library GEMM that was asked for, not measured (`move_every_gemm`)."""

SELECTION = 1  # in the cache key: decisions made by an older rule are measured again

Variant = Callable[[], float]


def standalone(kernel: loop.KernelOp, library: bool) -> ModuleOp:
    """A module of one function that runs `kernel` alone (as the library's GEMM and
    its epilogue where `library`), taking every buffer it touches as an argument."""
    buffers = kernel_buffers(kernel)
    types = [b.type for b in buffers]
    block = Block(arg_types=types)
    mapping: dict[SSAValue, SSAValue] = dict(zip(buffers, block.args, strict=True))
    copy = kernel.clone(value_mapper=mapping, clone_name_hints=False)
    block.add_op(copy)
    block.add_op(func.ReturnOp())
    fn = func.FuncOp("irc_library_choice", (types, []), Region(block))
    module = ModuleOp([fn])
    if library:
        gemm = plain_gemm(copy)
        assert gemm is not None
        to_library(gemm)
    return module


Lower = Callable[[ModuleOp, Target], None]
"""Lowers a loop-level module to tile kernels for a target, in place (`irc.compiler`
passes its `lower_to_tile`, library GEMMs left out)."""


def timer(
    kernel: loop.KernelOp, library: bool, target: Target, device: str, lower: Lower
) -> Variant:
    """A function timing one variant: milliseconds a call of its compiled function."""
    from triton.testing import do_bench

    from irc.lowering.tile_to_triton import emit_triton
    from irc.runtime.loader import load_source

    module = standalone(kernel, library)
    lower(module, target)
    source = emit_triton(module, "library choice")
    fn = load_source(source, device).FUNCTIONS["irc_library_choice"]
    args = random_buffers(kernel, device)  # the function's arguments, in its order
    return lambda: float(do_bench(lambda: fn(*args), warmup=10, rep=40))


def measure(
    gemm: PlainGemm, target: Target, device: str, lower: Lower
) -> tuple[list[float], list[float]]:
    """Timings of irc's fused kernel and of the library's GEMM and epilogue, in turns."""
    variants = {
        False: timer(gemm.kernel, False, target, device, lower),
        True: timer(gemm.kernel, True, target, device, lower),
    }
    times = timings_in_turns([False, True], lambda v: variants[v](), FINAL_ROUNDS)
    return times[False], times[True]


def reason(irc_ms: float, library_ms: float) -> str:
    return (
        f"measured: the library's GEMM and epilogue {library_ms * 1e3:.1f} us, irc's "
        f"fused kernel {irc_ms * 1e3:.1f} us"
    )


def library_candidates(
    module: ModuleOp, skip: set[loop.KernelOp] | None = None, f32: bool = True
) -> list[PlainGemm]:
    """The GEMM kernels of `module` the library can run, but those in `skip`, and
    f32 ones only if `f32` (with `tf32=True` they are one TF32 product, which the
    library's SGEMM is not)."""
    gemms = [g for k in loop.kernels(module) if k not in (skip or ()) and (g := plain_gemm(k))]
    return [g for g in gemms if f32 or g.contraction.result.type != F32]


def move(module: ModuleOp, moves: list[tuple[PlainGemm, str]]) -> dict[str, str]:
    """Moves each GEMM of `module` to the library with its reason (in place), under
    names xDSL accepts once for all of them; returns each moved kernel's name and
    reason."""
    moved = {gemm.kernel.kernel_name.data: why for gemm, why in moves}
    with names_xdsl_accepts(module):
        for gemm, why in moves:
            to_library(gemm, why)
    return moved


def move_every_gemm(
    module: ModuleOp, skip: set[loop.KernelOp] | None = None, f32: bool = True
) -> list[str]:
    """`library_gemm="always"`: every `library_candidates` kernel, unmeasured, moved
    to the library (in place); returns their names."""
    return list(move(module, [(g, ALWAYS) for g in library_candidates(module, skip, f32)]))


def choose_library_gemms(
    module: ModuleOp,
    target: Target,
    device: str = "cuda",
    cache_file: Path | None = None,
    measure_fn: Callable[
        [PlainGemm, Target, str, Lower], tuple[list[float], list[float]]
    ] = measure,
    skip: set[loop.KernelOp] | None = None,
    lower: Lower | None = None,
    f32: bool = True,
) -> dict[str, str]:
    """Moves the `library_candidates` of `module` that run faster on the library
    there (in place); returns each moved kernel's name and the measurement that
    moved it. `lower` lowers the variants that are timed."""
    import statistics

    gemms = [g for g in library_candidates(module, skip, f32) if g.flops >= min_flops(g)]
    if not gemms:
        return {}

    import torch
    import triton

    from irc.runtime.loader import cache_dir

    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    versions = f"library{SELECTION}|{triton.__version__}|{torch.__version__}"
    path = cache_file or cache_dir() / "autotune.json"
    try:
        cache: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    chosen: list[tuple[PlainGemm, str]] = []
    for gemm in gemms:
        key = kernel_key(gemm.kernel, device_name, versions)  # (`versions` names the library)
        hit = cache.get(key)
        if hit is None:
            assert lower is not None, "a measured choice lowers its variants"
            try:
                irc_ms, library_ms = measure_fn(gemm, target, device, lower)
            except Exception:  # noqa: BLE001 (out of memory, a library error: irc's kernel)
                continue  # not cached: the next compile measures again
            faster = beats_default(irc_ms, library_ms)
            gain = 1 - statistics.median(library_ms) / statistics.median(irc_ms)
            hit = {
                "library": faster and gain >= MIN_GAIN,
                "irc_ms": statistics.median(irc_ms),
                "library_ms": statistics.median(library_ms),
            }
            cache[key] = hit
        if hit["library"]:
            chosen.append((gemm, reason(hit["irc_ms"], hit["library_ms"])))
    try:
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass
    return move(module, chosen)
