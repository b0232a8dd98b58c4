"""Autotuning: block sizes, warps and stages per kernel, measured on the GPU.

For each loop.kernel the candidates of its kind (`candidates`) are lowered on
their own, run on random buffers of the kernel's shapes and timed with
`triton.testing.do_bench`; the fastest is written on the kernel, where the
rest of the pipeline reads it. After one timing of every candidate, the best
few and the default are timed again in turns (`time_in_turns`): a GPU's clock
drifts with its temperature and power draw, so candidates timed early would
otherwise win for being early. The default is kept unless another is
faster by more than the timings' own noise (`beats_default`) and by at least
`MIN_GAIN`. Winners are cached in
`<cache dir>/autotune.json`, keyed by the kernel's loop IR (tiling removed),
the GPU's name and Triton's version, so a second run only reads the file.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from xdsl.dialects.builtin import MemRefType, ModuleOp, StringAttr
from xdsl.ir import SSAValue

from irc.dialects import loop
from irc.dialects.attrs import MAX_WARPS
from irc.ir.types import numel
from irc.ir.value_names import clone_keeping_names
from irc.passes.tile import (
    UNROLLED_ROW_ELEMENTS,
    KernelShape,
    Tiling,
    choose_tiling,
    kernel_shape,
    next_pow2,
    set_tiling,
    tiling_of,
)

FINALISTS = 3  # re-timed in turns after the first pass, with the default
FINAL_ROUNDS = 4  # even: a steady drift falls equally on every finalist
MIN_GAIN = 0.005  # another tiling must be at least 0.5% faster to replace the default
SELECTION = 7  # in the cache key: winners picked by an older rule are picked again

Timer = Callable[[loop.KernelOp, Tiling, str], float]
T = TypeVar("T", bound=Hashable)


def time_in_turns(
    items: Sequence[T], time_one: Callable[[T], float], rounds: int = FINAL_ROUNDS
) -> dict[T, float]:
    """The median of `rounds` timings of each item, taken in turns.

    Every other round runs in reverse order (ABC CBA ABC CBA): with an even
    number of rounds, a GPU that speeds up or slows down steadily over them
    shifts every item's median by the same amount.
    """
    times = timings_in_turns(items, time_one, rounds)
    return {item: statistics.median(ms) for item, ms in times.items()}


def timings_in_turns(
    items: Sequence[T], time_one: Callable[[T], float], rounds: int = FINAL_ROUNDS
) -> dict[T, list[float]]:
    """Every timing of `time_in_turns`, round by round."""
    times: dict[T, list[float]] = {item: [] for item in items}
    for r in range(rounds):
        for item in items if r % 2 == 0 else items[::-1]:
            times[item].append(time_one(item))
    return times


def beats_default(default_ms: Sequence[float], other_ms: Sequence[float]) -> bool:
    """Whether timings taken in turns show `other` faster than the default, beyond noise.

    Each round gives a ratio other/default; a round and the reversed one after it
    average out a steady drift, and how far those pair averages disagree is the
    noise. A GEMM at its power limit scatters by a few percent, an element-wise
    kernel by a few tenths: a fixed threshold would be too strict for one (an
    H100's 1.3% faster element-wise tiling stayed unused at 2%) or too lax for
    the other.
    """
    ratios = [o / d for d, o in zip(default_ms, other_ms, strict=True)]
    pairs = [(ratios[i] + ratios[i + 1]) / 2 for i in range(0, len(ratios) - 1, 2)] or ratios
    noise = max(pairs) - min(pairs)
    gain = 1 - statistics.median(other_ms) / statistics.median(default_ms)
    return gain > max(MIN_GAIN, noise)



def candidates(shape: KernelShape, default: Tiling | None = None) -> list[Tiling]:
    """The configurations worth trying for a kernel of this shape, `default` first
    (the kernel's own tiling; the tile pass's default choice if not given)."""
    out = [default or choose_tiling(shape)]
    if shape.kind == "pointwise":
        n = next_pow2(numel(shape.parallel))
        # 2 to 16 elements a thread: an H200 streams fastest at 4-8, an H100 at 2
        # (irc/target.py picks between those two without timing).
        for x, w in (
            (512, 4), (512, 8), (1024, 4), (1024, 8), (1024, 16),
            (2048, 8), (2048, 16), (4096, 8), (4096, 16),
        ):
            if x <= max(n, 512):
                out.append(Tiling((x,), w))
        if shape.across >= 0:  # a transposed access: 2-d tiles, each side a load's run
            a, b = next_pow2(shape.parallel[shape.across]), next_pow2(shape.parallel[-1])
            for ta, tb, w in ((32, 32, 4), (64, 64, 4), (64, 64, 8), (32, 128, 4), (128, 32, 4)):
                if ta <= max(a, 32) and tb <= max(b, 32):
                    out.append(Tiling((ta, tb), w))
    elif shape.kind == "attention":
        for bm, bn, w, s in (
            (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
            (128, 64, 4, 2), (128, 128, 4, 3), (64, 128, 4, 3),
        ):  # fmt: skip
            out.append(Tiling((bm, bn), w, s))
    elif shape.kind == "reduction" and shape.columns:
        # Column reductions: bytes side by side along the kept dim, rows a step.
        c, r = next_pow2(shape.columns), next_pow2(numel(shape.reduction))
        for x, rb, w in (
            (32, 32, 4), (32, 64, 4), (64, 16, 4), (64, 32, 4), (64, 64, 8), (128, 16, 4),
            (128, 32, 8), (128, 64, 8), (256, 16, 8), (256, 32, 8),
        ):  # fmt: skip
            if x <= max(c, 32) and rb <= max(r, 8):
                out.append(Tiling((x, rb), w))
    elif shape.kind == "reduction":
        rows, r = numel(shape.parallel), numel(shape.reduction)
        full = next_pow2(r)
        if full <= 8192:
            for x in (1, 2, 4, 8, 16, 32):
                if x <= next_pow2(rows) and x * full <= 16384:
                    for w in (1, 2, 4, 8, 16, 32):
                        # 1 to 128 elements a thread (a warp holds 32 or more)
                        if 32 * w <= x * full <= 128 * 32 * w:
                            out.append(Tiling((x, full), w))
        if shape.shared_bytes:  # rows sharing an operand: several a program, in chunks
            for x, rb, w in ((4, 1024, 8), (8, 256, 4), (8, 512, 8), (16, 256, 8), (32, 128, 8)):
                if x <= next_pow2(rows) and rb <= full:
                    out.append(Tiling((x, rb), w))
        for rb in (1024, 2048, 4096, 8192, 16384):  # rows streamed in chunks (vocabulary)
            if rb < full:
                for w in (4, 8, 16, 32):
                    if 4 * 32 * w <= rb <= 16 * 32 * w:  # 4 to 16 elements a thread
                        out.append(Tiling((1, rb), w))
                        if shape.row_reads > 1 and rows > 1:  # one program an SM walks them
                            out.append(Tiling((1, rb), w, persistent=True))
        if shape.run > 1024 and not shape.epilogue:  # runs of the last dims, nested loops
            for rb in (1024, 2048, 4096):
                for w in (4, 8, 16):
                    if rb <= 2 * next_pow2(shape.run) and 2 * 32 * w <= rb <= 16 * 32 * w:
                        out.append(Tiling((1, rb), w, nested=True))
        for rb in (1024, 2048, 4096):  # rows read twice, held in registers as chunks
            held = -(-r // rb) * rb
            if shape.row_reads > 1 and rb < r and held <= UNROLLED_ROW_ELEMENTS:
                for w in (rb // 128, rb // 64):  # 4 or 2 elements a thread a chunk
                    if w <= MAX_WARPS and held // (32 * w) <= 128:  # of 255 registers
                        out.append(Tiling((1, rb), w, unrolled=True))
    else:
        *_, m, n = shape.parallel
        (k,) = shape.reduction
        for bm, bn, bk, w, s in (
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
            (128, 128, 64, 8, 3),
            (128, 128, 64, 4, 4),
            (128, 128, 32, 4, 4),
            (64, 128, 64, 4, 4),
            (64, 64, 32, 4, 3),
        ):
            if (
                bm <= max(16, next_pow2(m))
                and bn <= max(16, next_pow2(n))
                and bk <= max(16, next_pow2(k))
            ):
                out.append(Tiling((bm, bn, bk), w, s))
        if len(shape.parallel) == 2 and shape.half:
            for bm, bn, bk, w, s in ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4)):
                if bm <= next_pow2(m) and bn <= next_pow2(n) and bk <= next_pow2(k):
                    out.append(Tiling((bm, bn, bk), w, s, persistent=True))
    unique: list[Tiling] = []
    for t in out:
        if t not in unique:
            unique.append(t)
    return unique


def kernel_key(kernel: loop.KernelOp, device_name: str, triton_version: str) -> str:
    from irc.syntax.printer import print_module

    clone = clone_keeping_names(kernel)
    for prop in ("block", "warps", "stages", "persistent", "unrolled", "nested", "tail"):
        clone.properties.pop(prop, None)
    clone.kernel_name = StringAttr("kernel")  # an identical kernel elsewhere reuses the winner
    text = print_module(clone)
    clone.erase()
    key = f"{SELECTION}|{device_name}|{triton_version}|{text}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, stream: Any = None):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr

    def step(self, label: str, n: int = 1) -> None:
        self.done += n
        filled = int(30 * self.done / self.total)
        bar = "#" * filled + "." * (30 - filled)
        self.stream.write(f"\rautotune [{bar}] {self.done}/{self.total} {label[:50]:<50}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def kernel_buffers(kernel: loop.KernelOp) -> list[SSAValue]:
    """Every buffer `kernel` loads or stores, in the order it first touches them."""
    memrefs: list[SSAValue] = []
    for op in kernel.body.walk():
        if isinstance(op, loop.LoadOp | loop.StoreOp) and op.buffer not in memrefs:
            memrefs.append(op.buffer)
    return memrefs


def random_buffers(kernel: loop.KernelOp, device: str) -> list[Any]:
    """Random inputs (zeros for integers) for each of `kernel_buffers`."""
    import torch

    from irc.testing.reference import torch_dtype

    out = []
    for m in kernel_buffers(kernel):
        t = m.type
        assert isinstance(t, MemRefType)
        dtype = torch_dtype(t.element_type)
        shape = list(t.get_shape())
        if dtype.is_floating_point:
            out.append(torch.randn(shape, device=device, dtype=dtype))
        else:
            out.append(torch.zeros(shape, device=device, dtype=dtype))
    return out


def time_tiling(kernel: loop.KernelOp, t: Tiling, device: str) -> float:
    """Milliseconds of one candidate (inf when it fails to compile or run)."""
    from triton.testing import do_bench

    from irc.lowering.loop_to_tile import KernelTranslator
    from irc.lowering.tile_to_triton import emit_triton
    from irc.passes.online_softmax import rewrite_kernel
    from irc.pipeline import LOWERING, run_pipeline
    from irc.runtime.loader import load_source

    trial = clone_keeping_names(kernel)
    # A split tail (`tile.tail_split`) is timed without its split: its persistent
    # kernel alone would leave out the tail's tiles, a flattering comparison.
    set_tiling(trial, replace(t, tail=None))
    rewrite_kernel(trial)  # as the online-softmax pass would, for this tiling
    name = "irc_autotune_kernel"
    tk = KernelTranslator(trial, name).build()
    lowered = ModuleOp([tk])
    cleanup = LOWERING[LOWERING.index("loop-to-tile") + 1 :]  # tile-cse, dce, tile-sink
    run_pipeline(lowered, ",".join(cleanup), verify_each=False)
    source = emit_triton(lowered, "autotune")
    try:
        mod = load_source(source, device)
        fn = getattr(mod, name)
        bufs = random_buffers(trial, device)
        grid = tuple(a.value.data for a in tk.grid.data)  # type: ignore[attr-defined]
        if t.persistent:
            grid = mod._persistent_grid(grid[0])
            mod._ensure_allocator()
        options: dict[str, Any] = {"num_warps": t.warps, "enable_fp_fusion": False}
        if t.stages > 1:
            options["num_stages"] = t.stages

        def launch() -> None:
            fn[grid](*bufs, **options)

        return float(do_bench(launch, warmup=10, rep=40))
    except Exception:  # a configuration that does not fit (registers, shared memory)
        return float("inf")
    finally:
        trial.erase()


def final_steps(n: int) -> int:
    """Timings after the first pass, at most, for a kernel with `n` candidates."""
    return FINAL_ROUNDS * min(n, FINALISTS + 1) if n > 1 else 0


def choose(
    kernel: loop.KernelOp,
    tilings: list[Tiling],
    device: str,
    timer: Timer,
    bar: Progress | None = None,
) -> tuple[float, Tiling]:
    """The fastest of `tilings` (the first is the default) and its milliseconds."""
    label = kernel.kernel_name.data
    default = tilings[0]
    first: dict[Tiling, float] = {}
    for t in tilings:
        first[t] = timer(kernel, t, device)
        if bar:
            bar.step(label)
    ranked = sorted((ms, i) for i, ms in enumerate(first.values()) if ms != float("inf"))
    finalists = [tilings[i] for _, i in ranked[:FINALISTS]]
    if default not in finalists and first[default] != float("inf"):
        finalists.append(default)
    if len(finalists) <= 1:
        if bar:
            bar.step(label, final_steps(len(tilings)))
        return (first[finalists[0]], finalists[0]) if finalists else (float("inf"), default)

    def time_one(t: Tiling) -> float:
        if bar:
            bar.step(label)
        return timer(kernel, t, device)

    times = timings_in_turns(finalists, time_one)
    median = {t: statistics.median(ms) for t, ms in times.items()}
    if bar:
        bar.step(label, final_steps(len(tilings)) - FINAL_ROUNDS * len(finalists))
    best = min(finalists, key=lambda t: median[t])
    if default in times and not beats_default(times[default], times[best]):
        best = default
    return median[best], best


def autotune_module(
    module: ModuleOp,
    device: str = "cuda",
    cache_file: Path | None = None,
    progress: bool = True,
    timer: Timer = time_tiling,
) -> dict[str, dict[str, Any]]:
    """Picks and records the fastest tiling of every loop.kernel in `module`."""
    import torch
    import triton

    from irc.runtime.loader import cache_dir

    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    path = cache_file or cache_dir() / "autotune.json"
    try:
        cache: dict[str, dict[str, Any]] = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    kernels = loop.kernels(module)
    todo = [(k, kernel_key(k, device_name, triton.__version__)) for k in kernels]
    # Each uncached kernel's candidates, listed once for both the bar's total and the timing.
    options = {key: candidates(kernel_shape(k), tiling_of(k)) for k, key in todo if key not in cache}
    bar = Progress(sum(len(c) + final_steps(len(c)) for c in options.values())) if progress else None
    results: dict[str, dict[str, Any]] = {}
    for k, key in todo:
        hit = cache.get(key)
        if hit is None:
            ms, best = choose(k, options[key], device, timer, bar)
            hit = {
                "block": list(best.block),
                "warps": best.warps,
                "stages": best.stages,
                "persistent": best.persistent,
                "unrolled": best.unrolled,
                "nested": best.nested,
                "tail": list(best.tail) if best.tail else None,
                "ms": ms,
            }
            cache[key] = hit
        block, warps, stages = tuple(hit["block"]), hit["warps"], hit["stages"]
        flags = hit.get("persistent", False), hit.get("unrolled", False)
        tail = tuple(hit["tail"]) if hit.get("tail") else None
        nested = hit.get("nested", False)
        set_tiling(k, Tiling(block, warps, stages, *flags, tail=tail, nested=nested))  # type: ignore[arg-type]
        results[k.kernel_name.data] = hit
    try:
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass
    return results
