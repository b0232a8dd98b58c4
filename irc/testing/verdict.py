"""Whether irc's result of a program is right: one rule for `irc-run --check` and the benchmark.

A result passes when it is within `torch.testing.assert_close` of torch eager
(the dtype's default tolerances, NaN equal to NaN), or, failing that, when it is
no further from the program computed in f64 than `FACTOR` times torch's own
distance from it. Two correct implementations round differently (summation
order, an f16 product rounded once or twice): where torch itself strays that
far from the exact value, irc may too. The second leg can only turn a
MISMATCH into ok; it never fails a result that assert_close accepts.

Distance is measured two ways, and irc must be within `FACTOR` of torch in
both: the max abs error, and the largest error in assert_close's own unit,
`atol + rtol * |exact|` (the output dtype's default tolerances). The first
alone would let a wrong small element hide behind torch's error on a large
one; the second alone would let a wrong large element hide behind torch's
error on an element near zero (where the unit is tiny).

Torch's distance is the largest over its own result and the same program
with its sums taken in `ORDERS` other orders (`run_function(order=k)`): on an
output of a few elements (a full sum, a row of dot products) one eager result
is one draw of rounding noise, and a lucky draw, even exactly 0, says nothing
about how far a correct result may be. A fixed absolute floor would not do: the
noise scales with the size of the summed terms, which a near-zero result does
not show. No other floor is added: where torch is exact in every order, the
f64 value is torch's value, and assert_close already accepts anything within
tolerance of it.

Integer and boolean outputs must equal torch's exactly. Non-finite values
(NaN, +inf, -inf) must sit where torch's do; finite elements whose f64 value
is not finite are left out of the distances.

docs/testing.md ("How `irc-run --check` reaches a verdict") says the same for users.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from xdsl.dialects import func

FACTOR = 4.0
"""How many times torch's distance from f64 irc's may be: the project's standard
(honest differences measured up to 3.4x; docs/testing.md)."""

ORDERS = 3
"""Other summation orders in which torch's error is also measured."""

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
"""(rtol, atol) by dtype: `torch.testing.assert_close`'s documented defaults."""

CHUNK = 1 << 18
"""Elements compared at a time. Every comparison is element by element, so
chunks give the same verdict as whole tensors; their f64 temporaries (2 MiB)
stay in cache, where whole-tensor ones (512 MiB each for an 8192 x 8192
output) cost more in page faults than in arithmetic. The chunks are compared
on one thread (`one_torch_thread`)."""


@dataclass(frozen=True)
class Yardstick:
    """What an output is weighed against when assert_close rejects it."""

    exact: torch.Tensor
    """The output of the program computed in f64 (`run_function_f64`)."""
    orders: Sequence[torch.Tensor] = ()
    """Torch's output at the program's dtypes with its reductions in other orders."""


@dataclass(frozen=True)
class Distance:
    """How far a result is from the f64 value: as a max abs error and in tolerance units."""

    abs: float
    tol: float

    def max(self, other: Distance) -> Distance:
        return Distance(max(self.abs, other.abs), max(self.tol, other.tol))


@dataclass(frozen=True)
class Verdict:
    """One output's verdict; `line` is what `irc-run --check` prints after `out N: `."""

    ok: bool
    line: str
    irc: Distance | None = None
    """irc's distance from f64, where it was measured (else None)."""
    torch: Distance | None = None
    """torch's distance from f64 (the largest over eager and its other orders), likewise."""


Measure = Yardstick | Callable[[], Yardstick | None] | None
"""A yardstick, a function that makes it only when needed (None if it cannot,
e.g. for lack of memory), or None when there is none."""


def judge(got: torch.Tensor, eager: torch.Tensor, measure: Measure = None) -> Verdict:
    """irc's output `got` against torch's `eager` and, where needed, against f64.

    A `Yardstick` is always measured (the benchmark reports both distances);
    a callable is called only when assert_close rejects `got`.
    """
    if got.shape != eager.shape or got.dtype != eager.dtype:
        want = f"want {eager.dtype} {list(eager.shape)}"
        return Verdict(False, f"MISMATCH: got {got.dtype} {list(got.shape)}, {want}")
    got, eager = got.cpu(), eager.cpu()
    with one_torch_thread():
        if not eager.is_floating_point():
            wrong = sum(int((g != w).sum().item()) for g, w in _chunks(got, eager))
            word = "ok" if wrong == 0 else "MISMATCH"
            return Verdict(wrong == 0, f"{word}: {wrong} of {eager.numel()} elements differ")
        close = _assert_close(got, eager)
        versus = _versus_torch(got, eager)
    if close and not isinstance(measure, Yardstick):
        return Verdict(True, f"ok: {versus}")
    stick = measure() if callable(measure) else measure  # whole-program runs: all threads
    if stick is None:
        if close:
            return Verdict(True, f"ok: {versus}")
        return Verdict(False, f"MISMATCH: {versus}; no f64 value to weigh it against")
    with one_torch_thread():
        if not _same_non_finite(got, eager):
            where = "NaN/inf where torch has none, or the other way round"
            return Verdict(close, f"{'ok' if close else 'MISMATCH'}: {versus}; {where}")
        exact = stick.exact.cpu()
        mine = distance(got, exact, eager.dtype)
        theirs = distance(eager, exact, eager.dtype)
        for other in stick.orders:
            theirs = theirs.max(distance(other.cpu(), exact, eager.dtype))
    ok = close or (mine.abs <= FACTOR * theirs.abs and mine.tol <= FACTOR * theirs.tol)
    word = "ok" if ok else "MISMATCH"
    return Verdict(ok, f"{word}: {versus}; {_against_f64(mine, theirs)}", mine, theirs)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread meanwhile: each op on a chunk is a parallel
    region to start and join, and on a loaded machine a thread that waits for a
    busy core made the comparisons of an 8192 x 8192 output take 18 s of CPU
    time on two threads against 0.9 s on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def distance(x: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> Distance:
    """`x`'s max abs error from `exact` and its largest in `dtype`'s tolerance units.

    Elements where either is not finite are left out.
    """
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    worst_abs: list[float] = []
    worst_tol: list[float] = []
    for xc, ec in _chunks(x, exact):
        xd, ed = xc.double(), ec.double()
        err = (xd - ed).abs_()
        scale = ed.abs().mul_(rtol).add_(atol)  # not abs_: .double() of f64 is no copy
        both = torch.isfinite(xd) & torch.isfinite(ed)
        if not bool(both.all()):
            err, scale = err[both], scale[both]
        if err.numel():
            worst_abs.append(err.max().item())
            worst_tol.append(err.div_(scale).max().item())
    if not worst_abs:
        return Distance(0.0, 0.0)
    # torch's max, like the whole tensor's: NaN (0 / 0 without tolerances) wins.
    return Distance(torch.tensor(worst_abs).max().item(), torch.tensor(worst_tol).max().item())


def yardsticks(
    fn: func.FuncOp, inputs: Sequence[torch.Tensor], device: str | torch.device | None = None
) -> list[Yardstick]:
    """One yardstick per output of `fn` on `inputs`: f64, and torch in `ORDERS` other orders."""
    from irc.testing.reference import run_function, run_function_f64

    exact = run_function_f64(fn, inputs, device)
    others = [run_function(fn, inputs, device, order=k) for k in range(1, ORDERS + 1)]
    return [Yardstick(e, [o[i] for o in others]) for i, e in enumerate(exact)]


def judge_outputs(
    fn: func.FuncOp, inputs: Sequence[torch.Tensor], got: torch.Tensor | Sequence[torch.Tensor]
) -> list[Verdict]:
    """irc's outputs `got` of `fn` on `inputs`, each judged against torch's run of
    `fn` and its yardstick (f64, torch's other orders), as `irc-run --check` judges
    them: the tests' one way to judge a compiled function."""
    from irc.testing.reference import run_function

    outputs = [got] if isinstance(got, torch.Tensor) else list(got)
    eager = run_function(fn, inputs)
    sticks = yardsticks(fn, inputs)
    return [judge(g, e, s) for g, e, s in zip(outputs, eager, sticks, strict=True)]


def _chunks(*xs: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """The tensors (of one shape) flattened, `CHUNK` elements of each at a time."""
    flat = [x.reshape(-1) for x in xs]
    n = flat[0].numel() if flat else 0
    for i in range(0, n, CHUNK):
        yield tuple(f[i : i + CHUNK] for f in flat)


def _assert_close(got: torch.Tensor, eager: torch.Tensor) -> bool:
    """Whether `torch.testing.assert_close(got, eager, equal_nan=True)` passes.

    Called chunk by chunk: its test is element-wise (shape and dtype are checked
    before), and a whole-tensor call on a large output costs its temporaries'
    page faults (4 s of an 8192 x 8192 softmax's check).
    """
    try:
        for g, w in _chunks(got, eager):
            torch.testing.assert_close(g, w, equal_nan=True)
    except AssertionError:
        return False
    return True


def _same_non_finite(a: torch.Tensor, b: torch.Tensor) -> bool:
    """NaN where NaN, +inf where +inf, -inf where -inf."""
    for ac, bc in _chunks(a, b):
        fa, fb = torch.isfinite(ac), torch.isfinite(bc)
        if not torch.equal(fa, fb):
            return False
        na, nb = torch.isnan(ac), torch.isnan(bc)
        if not (torch.equal(na, nb) and torch.equal(ac[~fa & ~na], bc[~fb & ~nb])):
            return False
    return True


def _versus_torch(got: torch.Tensor, eager: torch.Tensor) -> str:
    """`max abs err .., max rel err ..`: irc against torch eager, finite elements only."""
    tiny = torch.finfo(eager.dtype).tiny
    worst_abs: list[float] = []
    worst_rel: list[float] = []
    for gc, wc in _chunks(got, eager):
        g, w = gc.double(), wc.double()
        diff = (g - w).abs_()
        size = w.abs().clamp_min_(tiny)  # not abs_: .double() of f64 is no copy
        both = torch.isfinite(g) & torch.isfinite(w)
        if not bool(both.all()):
            diff, size = diff[both], size[both]
        if diff.numel():
            worst_abs.append(diff.max().item())
            worst_rel.append(diff.div_(size).max().item())
    if not worst_abs:
        return "no finite values to compare"
    return f"max abs err {max(worst_abs):.3g}, max rel err {max(worst_rel):.3g}"


def _against_f64(mine: Distance, theirs: Distance) -> str:
    """`from f64, irc vs torch: max abs 0.286 vs 0.286 (1x), in tolerances 1.2e+03 vs
    1.2e+03 (1x); limit 4x`."""

    def pair(a: float, b: float) -> str:
        ratio = f"{a / b:.2g}x" if b > 0 else ("torch exact" if a > 0 else "both exact")
        return f"{a:.3g} vs {b:.3g} ({ratio})"

    return (
        f"from f64, irc vs torch: max abs {pair(mine.abs, theirs.abs)}, "
        f"in tolerances {pair(mine.tol, theirs.tol)}; limit {FACTOR:g}x"
    )


__all__ = [
    "CHUNK",
    "FACTOR",
    "ORDERS",
    "TOLERANCES",
    "Distance",
    "Measure",
    "Verdict",
    "Yardstick",
    "distance",
    "judge",
    "one_torch_thread",
    "yardsticks",
]
