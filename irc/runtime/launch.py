"""What the host functions of a generated module call: checks, launches, grids.

A generated module calls `host_functions(DEVICE)` once, when it is imported,
and binds what it returns to `_check`, `_launch`, `_persistent_grid` and
`_ensure_allocator`. The device, and whether kernels are compiled or
interpreted, are fixed for a module then, so those functions close over them:
a call looks up nothing more than when they were written in the module
itself (a 64x64 call is a few microseconds, most of it in `_launch`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import triton

_RUNTIME = triton.knobs.runtime


class HostFunctions(NamedTuple):
    """The functions a generated module's host functions call, for one device."""

    check: Callable[[Any, tuple[int, ...], torch.dtype, str, int], torch.Tensor]
    launch: Callable[..., None]
    persistent_grid: Callable[[int], tuple[int]]
    ensure_allocator: Callable[[], None]


def persistent_grid(tiles: int, sms: int) -> tuple[int]:
    """The grid of a persistent kernel over `tiles` tiles on `sms` SMs.

    At most one program an SM, and the fewest that take as few rounds, so that
    no SM idles through the last round while the rest, held back by the power
    limit, finish it: 512 GEMM tiles on 132 SMs run 3.6% faster as 128
    programs of 4 tiles than as 132 programs of which 16 walk only 3.
    """
    rounds = -(-tiles // sms)
    return (-(-tiles // rounds),)


FP_FUSION = False
"""Triton's `enable_fp_fusion` at every launch: no FMA contraction. torch rounds every
op's result, and a contracted `x*c - min(x*c, y)` is a rounding error instead of 0
(whose sqrt is NaN). A lowering that wants an FMA says so (`mul_add`), as
`contract-mul-add` does for a product whose only use is an addition."""

def library_operand(t: torch.Tensor, rows: int, cols: int, per: int) -> torch.Tensor:
    """A `loop.library_matmul` operand (its last two sizes `rows` x `cols` or fewer)
    as cuBLAS runs fast (rows or columns `per` elements apart: `loop.library_granule`):
    itself where it already is, else a copy padded with zeros, whose extra K and
    columns add nothing to the product."""
    r, c = t.shape[-2:]
    s0, s1 = t.stride()[-2:]
    aligned = (s1 == 1 and s0 % per == 0) or (s0 == 1 and s1 % per == 0)
    if (r, c) == (rows, cols) and aligned and t.data_ptr() % (per * t.element_size()) == 0:
        return t
    # One copy and zeros for the pad alone (`F.pad` writes every element twice).
    padded = t.new_empty((*t.shape[:-2], rows, cols))
    padded[..., :r, :c].copy_(t)
    if cols > c:
        padded[..., :, c:].zero_()
    if rows > r:
        padded[..., r:, :c].zero_()
    return padded


def library_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """`loop.library_matmul`: `torch.matmul` into `out`, f32 products in f32 even where
    the process allows TF32 (`torch.backends.cuda.matmul.allow_tf32`, which
    `torch.set_float32_matmul_precision("high")` sets): irc's f32 GEMMs keep f32's
    accuracy, and a library GEMM must not change that behind the user's back."""
    flags = torch.backends.cuda.matmul
    if out.dtype == torch.float32 and out.is_cuda and flags.allow_tf32:
        flags.allow_tf32 = False
        try:
            torch.matmul(a, b, out=out)
        finally:
            flags.allow_tf32 = True
    else:
        torch.matmul(a, b, out=out)


INTERPRETED_SMS = 3
"""SMs a persistent grid assumes on the interpreter: a few programs, which still walk
several tiles each, as on a GPU."""


def host_functions(device: str) -> HostFunctions:
    """`check`, `launch`, `persistent_grid`, `ensure_allocator` for a module on `device`.

    Kernels are interpreted when TRITON_INTERPRET is set now, as the module's
    own `@triton.jit` kernels are (irc sets it while it loads a module for the CPU).
    """
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    on_gpu = device == "cuda"
    compiled = on_gpu and not interpreted  # real kernels, not Triton's interpreter
    # Programmatic dependent launch (Hopper and later): a kernel that reads the one
    # before it starts while that one finishes, hiding its launch, and waits for it
    # (helpers._irc_wait_for_previous_kernel).
    pdl_capable = compiled and torch.cuda.get_device_capability()[0] >= 9
    sm_count: list[int] = []

    def check(x: Any, shape: tuple[int, ...], dtype: torch.dtype, fn: str, i: int) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{fn}: argument {i} must be a torch.Tensor, got {type(x).__name__}")
        if x.shape != shape or x.dtype != dtype:
            raise ValueError(
                f"{fn}: argument {i} must be a {dtype} tensor of shape {list(shape)}, "
                f"got {x.dtype} of shape {list(x.shape)}"
            )
        if not (x.is_cuda if on_gpu else x.is_cpu):
            raise ValueError(
                f"{fn}: argument {i} is on {x.device.type}; this module runs on {device}"
            )
        x = x if x.is_contiguous() else x.contiguous()
        # Kernels assume 16-byte aligned bases (vector loads, TMA); a view may start anywhere.
        return x.clone() if x.data_ptr() % 16 else x

    def grid(tiles: int) -> tuple[int]:
        if not sm_count:
            props = torch.cuda.get_device_properties(0) if compiled else None
            sm_count.append(props.multi_processor_count if props else INTERPRETED_SMS)
        return persistent_grid(tiles, sm_count[0])

    def scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
        return torch.empty(size, device=device, dtype=torch.int8)

    def ensure_allocator() -> None:
        # TMA descriptors made in a kernel live in scratch memory that Triton asks its
        # allocator for at launch; install one unless the program has its own.
        try:
            from triton.runtime import _allocation

            unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
        except (ImportError, AttributeError):  # another Triton: cannot tell, so install ours
            unset = True
        if unset:
            triton.set_allocator(scratch)

    def launch(
        kernel: Any,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        num_warps: int,
        num_stages: int | None = None,
        pdl: bool = False,
    ) -> None:
        # After its first launch a kernel goes straight to Triton's compiled launcher
        # with the handles cached on the kernel object (a dict keyed by the kernel would
        # hash it, which costs microseconds), skipping the argument binding and lookups
        # that cost most of a small call.
        # Every argument is 16-byte aligned: check copies inputs that are not, and
        # buffers come from torch's allocator; the cached variant assumes it.
        fast = getattr(kernel, "_irc_fast", None)
        if fast is not None:
            launcher, head, grid3, get_stream, cuda_device, binary = fast
            stream = get_stream(cuda_device)
            enter, leave = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook
            if getattr(enter, "calls", True) or getattr(leave, "calls", True):
                meta = binary.launch_metadata(grid3, stream, *args)
            else:  # no launch hooks installed (profilers install them)
                meta = enter = leave = None
            launcher(*grid3, stream, *head, meta, enter, leave, *args)
            return
        options: dict[str, Any] = {"num_warps": num_warps, "enable_fp_fusion": FP_FUSION}
        if num_stages is not None:
            options["num_stages"] = num_stages
        if pdl and pdl_capable:
            options["launch_pdl"] = True
        binary = kernel[grid](*args, **options)
        # Triton specializes pointers on 16-byte alignment: cache only that variant.
        if not interpreted and all(a.data_ptr() % 16 == 0 for a in args):
            _cache_launcher(kernel, binary, grid)

    return HostFunctions(check, launch, grid, ensure_allocator)


def _cache_launcher(kernel: Any, binary: Any, grid: tuple[int, ...]) -> None:
    """Keeps on `kernel` what its next launches need: `_irc_fast`, read by `launch`."""
    from triton.runtime.driver import driver

    binary._init_handles()
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    active = driver.active
    run = binary.run
    launcher, head = run, (binary.function, binary.packed_metadata)
    if (
        getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and hasattr(run, "launch")
    ):
        # No scratch to allocate: call the C launcher itself (Triton 3.6's CudaLauncher).
        launcher = run.launch
        head = (
            binary.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
            binary.packed_metadata,
        )  # fmt: skip
    kernel._irc_fast = (
        launcher,
        head,
        grid3,
        active.get_current_stream,
        active.get_current_device(),
        binary,
    )
