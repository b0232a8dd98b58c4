"""The GPU that compiled code will run on, as far as the tiling heuristics care.

Element-wise kernels stream memory; how many elements a thread should keep in
flight depends on how much bandwidth each SM must cover. Timed against each
other in turns on the pw5 and mul-add-relu workloads:

- an H200 (4.8 TB/s, 36 GB/s an SM) streams fastest with 4-8 elements a
  thread (1024 a program, 4 warps, is the default); 2 a thread in programs of
  512 (8 warps) are 2-3% slower;
- an H100 (3.35 TB/s, 25 GB/s an SM) is the other way round: 512 and 8 warps
  are 1.2-1.3% faster than 1024 and 4, and the only choice that beats
  torch.compile (which autotunes its way to the same tiling) on both rows.

Both load 8 bytes an element; the `tile` pass scales the elements a thread of
other kernels to the same loaded bytes (`irc.passes.tile.pointwise_tiling`).
The tile pass's `sms` is the SM count, which a kernel's grid should fill, and
its `shared-bytes` the shared memory one program may use (Triton's
`max_shared_mem`), which bounds GEMM and attention tiles.

Reductions whose rows an element-wise epilogue reads again (softmax, layer
norm) follow the same split: the H200 is fastest with at most 8 warps for a
row of 8192 (32 warps are 2-3% slower), the H100 with 16 (0.2-0.4% faster
than 8, which is what separates irc from torch.compile on layer norm there).

The threshold between them (`SMALL_TILES_BELOW_GBPS_PER_SM`) is a guess that
no third GPU has checked; `--autotune` measures instead of guessing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from xdsl.dialects.builtin import ModuleOp

from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import numel
from irc.passes.tile import (
    SHARED_BYTES,
    KernelShape,
    Tiling,
    kernel_shape,
    next_pow2,
    set_tiling,
    tiling_of,
)

SMALL_TILES_BELOW_GBPS_PER_SM = 30.0


@dataclass(frozen=True)
class Target:
    """Options of the `tile` pass for one GPU; the default is the portable choice."""

    block: int = 1024  # elements a program of an element-wise kernel
    thread_elements: int = 8  # elements a thread of an element-wise kernel
    epilogue_warps: int = 8  # most warps of a reduction with an element-wise epilogue
    reason: str = "default tiling"
    sms: int = 132  # SMs, which a reduction's grid must fill (split-reduction)
    shared_bytes: int = SHARED_BYTES  # shared memory a program may use (GEMM, attention tiles)
    splits: int = 8192  # most chunks a full reduction is split into (split-reduction)
    interpreted: bool = False  # Triton's interpreter: `interpreter_tiling` re-tiles kernels

    def tile_pass(self) -> str:
        """The `tile` step of a pipeline, with this target's options."""
        gpu = f" sms={self.sms}" if self.sms != Target.sms else ""
        if self.shared_bytes != Target.shared_bytes:
            gpu += f" shared-bytes={self.shared_bytes}"
        return (
            f"tile{{block={self.block} thread-elements={self.thread_elements} "
            f"epilogue-warps={self.epilogue_warps}{gpu}}}"
        )

    def split_pass(self) -> str:
        """The `split-reduction` step of a pipeline, for this GPU's SM count."""
        splits = f" splits={self.splits}" if self.splits != Target.splits else ""
        return f"split-reduction{{sms={self.sms}{splits}}}"

    def split_tf32_pass(self) -> str:
        """The `split-tf32-gemm-operands` step of a pipeline, for this GPU's SM count."""
        return f"split-tf32-gemm-operands{{sms={self.sms}}}"

    def split_k_pass(self) -> str:
        """The `split-k` step of a pipeline, for this GPU's SM count."""
        return f"split-k{{sms={self.sms}}}"

    def retile(self, module: ModuleOp) -> None:
        """After the `tile` pass: the interpreter's tilings, where this target is for it."""
        if self.interpreted:
            retile_for_interpreter(module)


def dram_gbps(props: Mapping[str, int]) -> float:
    """Peak DRAM bandwidth from Triton's device properties (kHz, bits; double data rate)."""
    return props["mem_clock_rate"] * 1e3 * 2 * props["mem_bus_width"] / 8 / 1e9


def target_for(props: Mapping[str, int]) -> Target:
    """The target for a GPU described by Triton's `get_device_properties` (its
    `max_shared_mem` is what one program may use: 232,448 bytes on an H100, 166,912
    on an A100, 101,376 on consumer Ada and Ampere GPUs)."""
    sms = props["multiprocessor_count"]
    shared = props.get("max_shared_mem", SHARED_BYTES)
    per_sm = dram_gbps(props) / sms
    if per_sm < SMALL_TILES_BELOW_GBPS_PER_SM:
        return Target(
            512,
            2,
            16,
            f"{per_sm:.0f} GB/s an SM: 512-element programs, 2 a thread; up to 16 warps a row",
            sms,
            shared_bytes=shared,
        )
    return Target(reason=f"{per_sm:.0f} GB/s an SM: default tiling", sms=sms, shared_bytes=shared)


def cuda_target() -> Target:
    """The target for the current CUDA device (the default where it cannot tell)."""
    try:
        import torch
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(torch.cuda.current_device())
        return target_for(props)
    except Exception as e:  # noqa: BLE001 (another Triton or driver: fall back, say why)
        return Target(reason=f"default tiling (device properties unavailable: {e})")


# --- Triton's interpreter ----------------------------------------------------------

INTERPRETER_STEP_ELEMENTS = 65536
"""Block elements whose NumPy work costs as much as the Python overhead of one
step. Measured on a 512 x 8192 f32 softmax (16 ops a step): 7 ms a step and
85 ns an element a step, so 1 row a program took 3.8 s of CPU, 16 rows 0.53 s,
128 rows 0.38 s. Blocks much smaller than this spend their time in Python."""

INTERPRETER_MAX_ELEMENTS = 2**20
"""The largest block: Triton's largest tensor (`TRITON_MAX_TENSOR_NUMEL`)."""

INTERPRETER_MAX_DOT = 256
"""The largest side of a contraction's tile (NumPy's matmul of 256 x 256 blocks)."""

CPU_TILING_ENV = "IRC_CPU_TILING"
"""`gpu` keeps the GPU's tilings on the interpreter (the test suite does, to test
the kernels a GPU runs); unset or `interpreter`, `device="cpu"` re-tiles."""


def interpreter_target() -> Target:
    """The target for Triton's interpreter: one core, re-tiled kernels, and full
    reductions split into 16 chunks at most (each chunk a program)."""
    if os.environ.get(CPU_TILING_ENV, "interpreter") == "gpu":
        return Target(reason=f"GPU tilings on Triton's interpreter ({CPU_TILING_ENV}=gpu)")
    return Target(
        reason="Triton's interpreter: few programs, large blocks (irc.target.interpreter_tiling)",
        sms=1,
        splits=16,
        interpreted=True,
    )


def retile_for_interpreter(module: ModuleOp) -> None:
    """Writes `interpreter_tiling` on every loop.kernel (after the `tile` pass)."""
    for kernel in module.walk():
        if isinstance(kernel, loop.KernelOp):
            set_tiling(kernel, interpreter_tiling(kernel_shape(kernel), tiling_of(kernel)))


def interpreter_cost(steps: int, elements: int) -> float:
    """The interpreter's time for a kernel, in steps' Python overheads."""
    return steps + elements / INTERPRETER_STEP_ELEMENTS


def _powers(most: int) -> Iterator[int]:
    p = 1
    while p <= most:
        yield p
        p *= 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def interpreter_tiling(shape: KernelShape, default: Tiling) -> Tiling:
    """The tiling of least `interpreter_cost` among the blocks of the kernel's kind.

    Element-wise kernels over one axis, row and column reductions and
    contractions are re-tiled; other layouts (attention, 2-d element-wise
    tiles) keep the `tile` pass's choice. Warps and stages mean nothing to the
    interpreter and stay as chosen.
    """
    options: list[tuple[float, int, Tiling]] = []

    def offer(block: tuple[int, ...], steps: int, elements: int) -> None:
        t = replace(default, block=block, persistent=False, unrolled=False, tail=None)
        options.append((interpreter_cost(steps, elements), numel(block), t))

    if shape.kind is KernelKind.POINTWISE and len(default.block) == 1:
        n = numel(shape.parallel)
        for x in _powers(min(INTERPRETER_MAX_ELEMENTS, next_pow2(n))):
            offer((x,), _cdiv(n, x), _cdiv(n, x) * x)
    elif shape.kind is KernelKind.REDUCTION and len(default.block) == 2:
        r = numel(shape.reduction)
        passes = 2 if shape.epilogue else 1  # a looped row is read again by the epilogue
        if shape.columns:
            outer, inner = numel(shape.parallel) // shape.columns, shape.columns
        else:
            outer, inner = 1, numel(shape.parallel)
        for x in _powers(min(INTERPRETER_MAX_ELEMENTS, next_pow2(inner))):
            for rb in _powers(min(INTERPRETER_MAX_ELEMENTS // x, next_pow2(r))):
                programs = outer * _cdiv(inner, x)
                steps = programs * (1 if rb >= r else _cdiv(r, rb) * passes)
                offer((x, rb), steps, steps * x * rb)
    elif shape.kind is KernelKind.CONTRACTION and len(default.block) == 3:
        *batch, m, n = shape.parallel
        (k,) = shape.reduction
        side = INTERPRETER_MAX_DOT
        for bm in _powers(min(side, max(16, next_pow2(m)))):
            for bn in _powers(min(side, max(16, next_pow2(n)))):
                for bk in _powers(min(side, max(16, next_pow2(k)))):
                    if min(bm, bn, bk) < 16:
                        continue  # tl.dot's smallest tile
                    steps = numel(batch) * _cdiv(m, bm) * _cdiv(n, bn) * _cdiv(k, bk)
                    offer((bm, bn, bk), steps, steps * (bm * bk + bk * bn + bm * bn))
    if not options:
        return default
    return min(options, key=lambda o: (o[0], o[1]))[2]
