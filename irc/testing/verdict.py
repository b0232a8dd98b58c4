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

from collections.abc import Callable, Sequence
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
    if not eager.is_floating_point():
        wrong = int((got != eager).sum().item())
        word = "ok" if wrong == 0 else "MISMATCH"
        return Verdict(wrong == 0, f"{word}: {wrong} of {eager.numel()} elements differ")
    try:
        torch.testing.assert_close(got, eager, equal_nan=True)
        close = True
    except AssertionError:
        close = False
    versus = _versus_torch(got, eager)
    if close and not isinstance(measure, Yardstick):
        return Verdict(True, f"ok: {versus}")
    stick = measure() if callable(measure) else measure
    if stick is None:
        if close:
            return Verdict(True, f"ok: {versus}")
        return Verdict(False, f"MISMATCH: {versus}; no f64 value to weigh it against")
    if not _same_non_finite(got, eager):
        where = "NaN/inf where torch has none, or the other way round"
        return Verdict(close, f"{'ok' if close else 'MISMATCH'}: {versus}; {where}")
    exact = stick.exact.cpu().double()
    mine = distance(got, exact, eager.dtype)
    theirs = distance(eager, exact, eager.dtype)
    for other in stick.orders:
        theirs = theirs.max(distance(other.cpu(), exact, eager.dtype))
    ok = close or (mine.abs <= FACTOR * theirs.abs and mine.tol <= FACTOR * theirs.tol)
    word = "ok" if ok else "MISMATCH"
    return Verdict(ok, f"{word}: {versus}; {_against_f64(mine, theirs)}", mine, theirs)


def distance(x: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> Distance:
    """`x`'s max abs error from `exact` and its largest in `dtype`'s tolerance units.

    Elements where either is not finite are left out.
    """
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    xd = x.double()
    both = torch.isfinite(xd) & torch.isfinite(exact)
    err = (xd - exact).abs()[both]
    if err.numel() == 0:
        return Distance(0.0, 0.0)
    scale = atol + rtol * exact.abs()[both]
    return Distance(err.max().item(), (err / scale).max().item())


def yardsticks(
    fn: func.FuncOp, inputs: Sequence[torch.Tensor], device: str | torch.device | None = None
) -> list[Yardstick]:
    """One yardstick per output of `fn` on `inputs`: f64, and torch in `ORDERS` other orders."""
    from irc.testing.reference import run_function, run_function_f64

    exact = run_function_f64(fn, inputs, device)
    others = [run_function(fn, inputs, device, order=k) for k in range(1, ORDERS + 1)]
    return [Yardstick(e, [o[i] for o in others]) for i, e in enumerate(exact)]


def _same_non_finite(a: torch.Tensor, b: torch.Tensor) -> bool:
    """NaN where NaN, +inf where +inf, -inf where -inf."""
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~fa & ~na], b[~fb & ~nb])


def _versus_torch(got: torch.Tensor, eager: torch.Tensor) -> str:
    """`max abs err .., max rel err ..`: irc against torch eager, finite elements only."""
    g, w = got.double(), eager.double()
    both = torch.isfinite(g) & torch.isfinite(w)
    diff = (g - w).abs()[both]
    if diff.numel() == 0:
        return "no finite values to compare"
    rel = diff / w.abs()[both].clamp_min(torch.finfo(eager.dtype).tiny)
    return f"max abs err {diff.max().item():.3g}, max rel err {rel.max().item():.3g}"


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
    "FACTOR",
    "ORDERS",
    "TOLERANCES",
    "Distance",
    "Measure",
    "Verdict",
    "Yardstick",
    "distance",
    "judge",
    "yardsticks",
]
