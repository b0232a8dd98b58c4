"""Kernels on Triton's interpreter, in a process whose Triton also compiles for the GPU.

On a machine without a GPU, or with `device="cpu"`, irc runs its kernels on
Triton's interpreter without the user setting TRITON_INTERPRET, and the same
process may compile kernels for the GPU before and after. Triton is not made
for that mix; each patch below names the Triton behaviour it works around:

1. Triton reads TRITON_INTERPRET when a kernel is defined (`@triton.jit`
   makes an interpreted or a compiled function) and when it runs:
   `interpreting(True)` sets it while a module for the interpreter is loaded
   and while its functions run (`run_interpreted`), and puts it back after.
2. Triton's own `@jit` library (`tl.sum`, `tl.max`...) is built once, in the
   mode Triton is imported in. Imported without TRITON_INTERPRET, as irc
   leaves it so that the process can still compile, those are compiled-only
   `JITFunction`s, which the interpreter cannot call ("Cannot call
   @triton.jit'd outside of the scope of a kernel"): interpreted twins stand
   in while kernels are interpreted. irc's helpers get twins the same way.
3. The interpreter patches `tl`, `tl.core` and the rest for every
   device-function call (`_patch_lang`) and never undoes it, which breaks the
   next GPU compile in the process ("'ir.value' object has no attribute
   'dtype'"): those namespaces are put back as they were afterwards. The
   names it added stay with the run: its cached rewrites of functions read
   them, so they are put back in while kernels run again (`_ADDED`).
4. The interpreter computes some things differently from the compiled code
   and from torch: bf16 rounding and bf16 dots (`INTERPRETED_FORMS`).
5. The interpreter reduces with NumPy only for Triton's own combine functions;
   any other (irc's NaN-propagating `_irc_max`, `_irc_min`) it folds one element
   at a time in Python, about 0.1 ms an element: a softmax of 8192 x 8192 took
   45 minutes. Those two reduce with NumPy as well (`NUMPY_REDUCTIONS`).
6. The interpreter shows nothing while it runs a grid's programs one by one:
   each launch counts them for a progress bar (`irc.runtime.progress`).
7. The interpreter loads and stores element by element at each lane's address
   (an 8192 x 8192 softmax: 3.4 s of its 5.7 s), also where the lanes are
   consecutive elements, as most of a kernel's accesses are: those are one
   NumPy copy (`install_contiguous_access`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

import triton.language as tl
from triton.runtime.jit import JITFunction

from irc.runtime.progress import ProgressBar

if TYPE_CHECKING:
    from triton.runtime.interpreter import InterpretedFunction

# --- 4. Interpreted forms of irc's helpers (irc.runtime.helpers) -------------------


def _irc_to_bf16(x):
    # Triton's interpreter truncates f32 -> bf16 (and flushes subnormals); torch rounds
    # to nearest even. Here the rounding is done on the bits, as torch does it.
    f = x.to(tl.float32)
    bits = f.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    bits = tl.where(f != f, (bits >> 16) | 0x40, rounded)  # NaN stays a quiet NaN
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


def _irc_from_bf16(x):
    # Triton's interpreter flushes bf16 subnormals to zero when widening; widen the bits.
    bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    return bits.to(tl.float32, bitcast=True)


def _irc_dot_bf16(a, b, acc):
    # Triton's interpreter multiplies bf16 *bit patterns* in tl.dot; the dot runs on
    # f32 copies instead, which gives the same result (bf16 products are exact in f32).
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


def _irc_exp(x):
    # Triton's interpreter has no libdevice; its tl.exp is NumPy's, accurate.
    return tl.exp(x)


def _irc_tanh(x):
    # From 0.6 up: one exp and one division (tanh is hot in GELU-tanh epilogues), on
    # |x|: for x < 0, 1 - 2/(exp(2x)+1) subtracted a number near 2 and lost 2-3 ulp.
    # Below 0.6 that form cancels (1e-3 relative error at 1e-4, all of it at 1e-8):
    # x + x^3 P(x^2) there, P a minimax fit of the relative error on [0, 0.6] (0.08 ulp
    # in f32, 0.07 in f64). Measured on the interpreter: at most 1.7 ulp in f32, 1.4 in
    # f64, just above 0.6. +-inf give +-1, NaN NaN, and 0 is returned as is so that
    # tanh(-0.0) stays -0.0 (x + x^3 P would make it +0.0).
    a = tl.abs(x)
    t = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    s = x * x
    if x.dtype == tl.float64:  # decided when the kernel is compiled, as Triton's philox does
        p = -1.7178680991986946e-05 * s + 7.931385791171055e-05
        p = p * s - 0.0002303967258393963
        p = p * s + 0.0005871883604798521
        p = p * s - 0.0014552153478015592
        p = p * s + 0.0035920373759302368
        p = p * s - 0.008863226776971288
        p = p * s + 0.02186948800251958
        p = p * s - 0.05396825394929345
        p = p * s + 0.13333333333299657
        p = p * s - 0.33333333333333126
    else:
        p = -0.005895158275961876 * s + 0.020795971155166626
        p = p * s - 0.053783830255270004
        p = p * s + 0.13331924378871918
        p = p * s - 0.33333298563957214
    r = tl.where(a < 0.6, x + x * s * p, tl.where(x < 0, -t, t))
    return tl.where(x == 0.0, x, r)


def _irc_wait_for_previous_kernel():
    # Triton's interpreter has no programmatic dependent launch (and no gdc_wait):
    # its programs run one after another.
    pass


INTERPRETED_FORMS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        _irc_to_bf16, _irc_from_bf16, _irc_dot_bf16, _irc_exp, _irc_tanh,
        _irc_wait_for_previous_kernel,
    )
}
"""irc helper name -> the Python function the interpreter runs in its place."""


def interpreted_form(fn: Callable[..., Any]) -> InterpretedFunction[Any]:
    """The interpreted function of irc helper `fn` (its interpreted form, if it has one).

    Triton's interpreter module is imported only now: importing it adds
    `semantic` to `triton.language`, which a CPU run leaves as it found it (3).
    """
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(INTERPRETED_FORMS.get(fn.__name__, fn))


# --- 5. Reductions the interpreter would fold element by element ---------------------

NUMPY_REDUCTIONS: dict[str, Callable[..., Any]] = {}
"""irc combine function name -> the NumPy reduction that computes the same fold.

`np.max` and `np.min` are `np.maximum.reduce` and `np.minimum.reduce`: NaN
propagates, as `tl.maximum(..., propagate_nan=ALL)` does (which the
interpreter runs as `np.maximum`), and max and min are exact in any order."""


def _install_numpy_reductions() -> None:
    """Makes the interpreter's `tl.reduce` use `NUMPY_REDUCTIONS` (once; the
    interpreter's reduce is used by nothing else, so this is never undone)."""
    import numpy as np
    from triton.runtime.interpreter import ReduceOps

    if getattr(ReduceOps.apply_impl, "_irc_numpy", False):
        return
    NUMPY_REDUCTIONS.update(_irc_max=np.max, _irc_min=np.min)
    generic = ReduceOps.apply_impl

    def apply_impl(self: ReduceOps, input: Any) -> Any:
        fn = getattr(self.combine_fn, "fn", None)
        reduction = NUMPY_REDUCTIONS.get(getattr(fn, "__name__", ""))
        if reduction is None or getattr(fn, "__module__", "") != "irc.runtime.helpers":
            return generic(self, input)
        return self.min_max(input[0], val_reduce_op=reduction)

    apply_impl._irc_numpy = True  # type: ignore[attr-defined]
    ReduceOps.apply_impl = apply_impl  # type: ignore[method-assign]


# --- 6. Progress of a launch's programs -----------------------------------------------

_BAR: list[ProgressBar] = []  # the launch running now, once its grid is known
_LABEL = ["kernel"]  # the kernel it runs


def _install_progress() -> None:
    """Counts each launch's programs for `ProgressBar` (once; interpreter-only classes)."""
    from triton.runtime.interpreter import GridExecutor, interpreter_builder

    if getattr(GridExecutor.__call__, "_irc_progress", False):
        return
    run, set_dim, set_idx = (
        GridExecutor.__call__,
        interpreter_builder.set_grid_dim,
        interpreter_builder.set_grid_idx,
    )

    def launch(self: GridExecutor, *args: Any, **kwargs: Any) -> Any:
        _BAR.clear()
        _LABEL[0] = getattr(self.fn, "__name__", "kernel")
        try:
            return run(self, *args, **kwargs)
        finally:
            for bar in _BAR:
                bar.step()
                bar.close()
            _BAR.clear()

    def grid_dim(nx: int, ny: int, nz: int) -> None:
        _BAR[:] = [ProgressBar(nx * ny * nz, _LABEL[0])]
        set_dim(nx, ny, nz)

    def grid_idx(x: int, y: int, z: int) -> None:
        for bar in _BAR:
            if x or y or z:
                bar.step()  # the program before this one has finished
        set_idx(x, y, z)

    launch._irc_progress = True  # type: ignore[attr-defined]
    GridExecutor.__call__ = launch  # type: ignore[method-assign]
    interpreter_builder.set_grid_dim = grid_dim  # type: ignore[method-assign]
    interpreter_builder.set_grid_idx = grid_idx  # type: ignore[method-assign]


# --- 7. Contiguous loads and stores ----------------------------------------------------

CONTIGUOUS_MIN = 1024
"""Lanes from which an unmasked load or store of consecutive addresses is one copy:
below, the check costs what it saves (measured: even at 256 lanes, 2x ahead at
1024, 6x at 4096, 15x at 65536)."""


def _span(ptrs: Any, itemsize: int) -> int | None:
    """The first address of `ptrs` if they are consecutive elements in order, else None."""
    import numpy as np

    if not isinstance(ptrs, np.ndarray):
        return None
    flat = ptrs.reshape(-1)
    if flat.size < CONTIGUOUS_MIN:
        return None
    first = int(flat[0])
    if int(flat[-1]) - first != (flat.size - 1) * itemsize:
        return None
    return first if bool((np.diff(flat) == itemsize).all()) else None


def _all_true(mask: Any, shape: tuple[int, ...]) -> bool:
    """Whether a load's or store's mask (a TensorHandle of a NumPy array; a tensor
    descriptor's is a bare array, whose `.data` is a memoryview) is `shape`, all true."""
    import numpy as np

    data = getattr(mask, "data", None)
    return isinstance(data, np.ndarray) and data.shape == shape and bool(data.all())


def _memory(address: int, dtype: Any, count: int) -> Any:
    """`count` elements of `dtype` at `address`, as a NumPy array over that memory."""
    import ctypes

    import numpy as np

    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count)


def install_contiguous_access() -> None:
    """Makes the interpreter's unmasked loads and stores of consecutive addresses one
    NumPy copy (once; wrapping whatever the builder has, so a checker installed
    later still sees every access)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_masked_load, "_irc_contiguous", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def contiguous_load(self: Any, ptrs: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        dtype_tt = ptrs.get_element_ty()
        dtype = np.dtype(interpreter._get_np_dtype(dtype_tt))  # pyright: ignore[reportPrivateUsage]
        first = _span(ptrs.data, dtype.itemsize) if _all_true(mask, ptrs.data.shape) else None
        if first is None:
            return load(self, ptrs, mask, *args, **kwargs)
        data = _memory(first, dtype, ptrs.data.size).reshape(ptrs.data.shape).copy()
        return interpreter.TensorHandle(data, dtype_tt)

    def contiguous_store(
        self: Any, ptrs: Any, value: Any, mask: Any, *args: Any, **kwargs: Any
    ) -> Any:
        data = value.data
        plain = isinstance(data, np.ndarray) and data.shape == getattr(ptrs.data, "shape", ())
        plain = plain and _all_true(mask, data.shape)
        first = _span(ptrs.data, data.dtype.itemsize) if plain else None
        if first is None:
            return store(self, ptrs, value, mask, *args, **kwargs)
        _memory(first, data.dtype, data.size)[:] = data.reshape(-1)
        return None

    contiguous_load._irc_contiguous = True  # type: ignore[attr-defined]
    builder.create_masked_load = contiguous_load  # type: ignore[method-assign]
    builder.create_masked_store = contiguous_store  # type: ignore[method-assign]


# --- 2. Twins of compiled @jit functions -------------------------------------------


def triton_is_interpreted() -> bool:
    """Whether Triton was imported under TRITON_INTERPRET=1: then its library, and
    so the process, can only interpret (irc's twins, in place while a module runs on
    the interpreter, do not count)."""
    held = tl.standard.sum
    return not isinstance(held, JITFunction) and not hasattr(held, "_irc_twin_of")


_TWINS: dict[int, InterpretedFunction[Any]] = {}


def _twin(value: JITFunction[Any]) -> InterpretedFunction[Any]:
    twin = _TWINS.get(id(value))
    if twin is None:
        twin = _TWINS[id(value)] = interpreted_form(value.fn)
        twin._irc_twin_of = value  # type: ignore[attr-defined]  # keeps id(value) unused
    return twin


_JIT_MODULES: list[ModuleType] = []
"""irc's modules of @triton.jit helpers (`irc.runtime.helpers` registers itself):
their functions get interpreted twins while kernels run, as Triton's own do."""


def register_jit_module(module: ModuleType) -> None:
    if module not in _JIT_MODULES:
        _JIT_MODULES.append(module)


def _install_twins() -> None:
    """Puts interpreted twins of the compiled @jit functions in Triton's library and
    in irc's helpers in place; the caller's snapshot puts the originals back."""
    for module in (tl.standard, tl, *_JIT_MODULES):
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, name, _twin(value))


# --- 3. Putting Triton's namespaces back ---------------------------------------------

# (namespace, what it held, whether names added since are removed)
Snapshot = list[tuple[Any, dict[str, Any], bool]]


def _snapshot() -> Snapshot:
    """The namespaces that the interpreter patches (whole), and irc's helpers (their
    @jit functions: names the interpreter adds to a module it rewrites a function of,
    such as `interpreter_semantic`, stay, since the rewritten function reads them)."""
    owners = (tl, tl.core, tl.math, tl.standard, tl.core.tensor, tl.core.dtype)
    owners += (tl.core.tensor_descriptor_base,)
    held = [(owner, dict(vars(owner)), True) for owner in owners]
    for module in _JIT_MODULES:
        jitted = {k: v for k, v in vars(module).items() if isinstance(v, JITFunction)}
        held.append((module, jitted, False))
    return held


def _restore(snapshot: Snapshot) -> None:
    for owner, held, whole in snapshot:
        now = dict(vars(owner))
        added = now.keys() - held.keys() if whole else set()
        if added and isinstance(owner, ModuleType):
            _ADDED[owner] = {name: now[name] for name in added}
        for name in added:
            delattr(owner, name)
        for name, value in held.items():
            if now.get(name, _MISSING) is not value:
                setattr(owner, name, value)


_ADDED: dict[ModuleType, dict[str, Any]] = {}
"""Names the interpreter added to Triton's modules in the last run, taken out after it.

The interpreter rewrites a function once (`InterpretedFunction.rewritten_fn`)
into one that may read names it adds to the function's module, such as
`interpreter_semantic`. Taken out, they would be missing in the next run
(`tl.sum` of an i1 block failed with a NameError): they are put back while
kernels run (`_put_back_added`) and taken out again after."""


def _put_back_added() -> None:
    for module, names in _ADDED.items():
        for name, value in names.items():
            if name not in vars(module):
                setattr(module, name, value)


_MISSING = object()


# --- 1. TRITON_INTERPRET around loading and running --------------------------------

_DEPTH = 0  # interpreting(True) blocks entered and not left


@contextmanager
def interpreting(on: bool) -> Iterator[None]:
    """Sets TRITON_INTERPRET to `on` for the block; with `on`, twins stand in (2) and
    Triton's namespaces are put back when the outermost such block ends (3).

    Triton and irc's helpers are imported first, outside (by `irc.runtime.loader`):
    the mode Triton is imported in is the mode of its own library for the whole
    process, and only a compiled one lets the same process compile for the GPU later.
    """
    global _DEPTH
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    snapshot = _snapshot() if on and _DEPTH == 0 else None
    _DEPTH += on
    if on:
        _install_numpy_reductions()
        _install_progress()
        install_contiguous_access()
        _put_back_added()
        _install_twins()
    try:
        yield
    finally:
        _DEPTH -= on
        if snapshot is not None:
            _restore(snapshot)
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def run_interpreted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, a host function of a module loaded for the interpreter, run under it."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        import numpy as np

        # Masked-off lanes may divide by zero in NumPy; their values are never stored.
        with interpreting(True), np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return call
