"""Random valid graph programs for differential testing of fusion and lowering.

`generate(seed)` returns the text of one `.ir` function, `@main`, the same for
a seed everywhere. Programs mix element-wise unary and binary ops,
broadcasting operands (size-1 dims, lower-rank operands, rank 0), casts
between float types (and from i1 and integers), comparisons and `where`,
constants, reductions (sum, max, min, mean over inner, outer, several or all
dims, with and without keepdim), matmul and batched matmul (f32, f16),
transpose, reshape, explicit broadcast, the softmax and layer_norm
composites, several outputs and values used several times. Shapes are small
and ragged (dims from `DIMS`) so that Triton's CPU interpreter runs them fast.

Numerics are kept well-conditioned, so that dtype-default tolerances hold:
every value carries a rough magnitude (`scale`) and ops that would amplify it
(exp, mul, pow, sums, matmul, half-precision casts) first squash their operand
(tanh, x/(|x|+1) or a clamp); divisors are `|b| + 1`; comparisons only read
values computed by exactly rounded ops, so that a rounding difference between
two correct implementations cannot flip a `where`.

`check_program(text, seed)` compiles a program fused and unfused (Triton on
the CPU interpreter) and compares both with the reference interpreter;
`shrink(text, seed, failure)` makes a failing program smaller while it keeps
failing the same way. The command line runs many seeds:

    python -m irc.testing.graphgen --count 5000 --seed 0      # progress, failures, exit 1 on any
    python -m irc.testing.graphgen --show 17                  # print the program of seed 17
    python -m irc.testing.graphgen --check FILE.ir --seed 3   # check (and shrink) one file
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from irc.dialects import graph
from irc.ir.types import ELEMENTS, HALF_NAMES, INT_NAMES, broadcast_shapes, numel
from irc.pipeline import AFTER_TILING

DIMS = (1, 3, 5, 17, 33, 64, 130)
MAX_NUMEL = 8192
"""Largest tensor a generated program makes (elements)."""
MAX_SUMMED = 512
"""Most elements one sum or mean adds up: two summation orders of thousands of
cancelling terms differ by more than f32's tolerance."""

FLOAT_WEIGHTS = {"f32": 10, "f16": 4, "bf16": 1, "f64": 1}
# The ops drawn come from the dialect, each with its own weight and operand domain
# (graph.ElementwiseOp.FUZZ): a new element-wise op is drawn without a change here.
UNARY_OPS = [op for op in graph.UNARY_OPS if op.FUZZ.recipe is None]
BINARY_OPS = [op for op in graph.BINARY_OPS if op.FUZZ.recipe in (None, "power")]
UNARY = tuple(op.FN for op in UNARY_OPS)
COMPARE = tuple(op.FN for op in graph.BINARY_OPS if op.FUZZ.recipe == "compare")
ACTIVATIONS = tuple(op.FN for op in graph.UNARY_OPS if op.FUZZ.activation)
REDUCE_OPS = {op.name.removeprefix("graph."): op for op in graph.REDUCE_OPS}
REDUCE = tuple(REDUCE_OPS)
NORMALIZERS = tuple(op for op in graph.BINARY_OPS if op.FUZZ.normalizer)
"""The binary ops `normalize` combines a value with a reduction of its rows by."""
HALF = HALF_NAMES
PRECISION = {n: e.mantissa for n, e in ELEMENTS.items() if e.kind == "float"}
INTS = tuple(sorted(INT_NAMES, key=lambda n: ELEMENTS[n].bits))


def _draw(
    rng: random.Random, ops: Sequence[type[graph.ElementwiseOp]]
) -> type[graph.ElementwiseOp]:
    """One of `ops`, each as often as its fuzz weight says."""
    return rng.choice([op for op in ops for _ in range(op.FUZZ.weight)])


def type_text(shape: Sequence[int], dtype: str) -> str:
    return f"tensor<{''.join(f'{d}x' for d in shape)}{dtype}>"


def _float_text(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "n" in text) else text + ".0"


@dataclass
class Val:
    """A value of the program being generated."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float
    """Rough bound of |x| for typical elements (inputs are standard normal: 1)."""
    exact: bool
    """Computed only by correctly rounded ops: safe to compare."""
    uses: int = 0

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_WEIGHTS

    @property
    def type(self) -> str:
        return type_text(self.shape, self.dtype)

    @property
    def noisy_half(self) -> bool:
        return self.dtype in HALF and not self.exact


class Skip(Exception):
    """The chosen op does not apply to the program so far; pick another."""


def action(weight: int) -> Callable[[Callable[[Generator], Val]], Callable[[Generator], Val]]:
    """Makes a method one of the generator's actions, drawn `weight` times in the sum of
    all actions' weights (`Generator.ACTIONS`, in the order the methods are defined)."""

    def mark(method: Callable[[Generator], Val]) -> Callable[[Generator], Val]:
        method.action_weight = weight  # type: ignore[attr-defined]
        return method

    return mark


class Generator:
    """Builds one random program; `text()` prints it."""

    ACTIONS: ClassVar[dict[str, int]]
    """Each action (a method that adds ops) with its weight, from `@action`."""

    def __init__(self, seed: int, max_ops: int = 10):
        self.rng = random.Random(seed)
        self.args: list[Val] = []
        self.values: list[Val] = []
        self.lines: list[str] = []
        self.max_ops = max_ops
        self.count = 0
        self.constants: set[str] = set()

    # -- building blocks --

    def fresh(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def arg(self, shape: Sequence[int], dtype: str) -> Val:
        v = Val(self.fresh("a"), tuple(shape), dtype, 8.0 if dtype in INTS else 1.0, True)
        self.args.append(v)
        self.values.append(v)
        return v

    def op(
        self,
        name: str,
        operands: Sequence[Val],
        shape: Sequence[int],
        dtype: str,
        scale: float,
        exact: bool,
        attrs: str = "",
    ) -> Val:
        for o in operands:
            o.uses += 1
        v = Val(self.fresh(), tuple(shape), dtype, scale, exact)
        ops = ", ".join("%" + o.name for o in operands)
        sep = " " if ops else ""
        attr_text = " " + attrs if attrs else ""
        self.lines.append(f"  %{v.name} = graph.{name}{sep}{ops}{attr_text} : {v.type}")
        self.values.append(v)
        return v

    def const(self, value: float, dtype: str, shape: Sequence[int] = ()) -> Val:
        text = str(int(value)) if dtype in INTS else _float_text(value)
        v = self.op("constant", [], shape, dtype, abs(value), True, f"{{value = {text}}}")
        self.constants.add(v.name)
        return v

    def pick(self, pred: Callable[[Val], bool], rounding: bool = True) -> Val:
        """An existing value satisfying `pred`, recent ones more likely.

        For an op that rounds (`rounding`), half-precision values that may already
        differ by an ulp between two correct implementations are left out: a
        second rounding would pass half precision's tolerance (about an ulp).
        """
        cands = [v for v in self.values if pred(v) and not (rounding and v.noisy_half)]
        if not cands:
            raise Skip
        if self.rng.random() < 0.3:
            return cands[-1]
        return self.rng.choices(cands, weights=[1 + i for i in range(len(cands))])[0]

    def float_dtype(self) -> str:
        return self.rng.choices(list(FLOAT_WEIGHTS), weights=list(FLOAT_WEIGHTS.values()))[0]

    def random_shape(self, rank: int, limit: int = MAX_NUMEL) -> tuple[int, ...]:
        for _ in range(100):
            shape = tuple(self.rng.choice(DIMS) for _ in range(rank))
            if numel(shape) <= limit:
                return shape
        return (1,) * rank

    def compatible_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with `shape` (the result may be larger)."""
        rank = len(shape)
        r = self.rng.random()
        if r < 0.35 or rank == 0:
            out = shape
        elif r < 0.5:
            out = shape[self.rng.randint(1, rank) :]
        elif r < 0.7:
            out = tuple(1 if self.rng.random() < 0.5 else d for d in shape)
        elif r < 0.8:
            out = ()
        elif r < 0.9:
            out = tuple(
                1 if self.rng.random() < 0.5 else d for d in shape[self.rng.randint(0, rank) :]
            )
        else:
            # Grows where `shape` has size-1 dims, or gains a leading dim.
            out = tuple(self.rng.choice(DIMS) if d == 1 else self.rng.choice((1, d)) for d in shape)
            if self.rng.random() < 0.3 and rank < 3:
                out = (self.rng.choice(DIMS), *out)
        full = broadcast_shapes(shape, out)
        if full is None or numel(full) > MAX_NUMEL:
            return shape
        return out

    # -- guards that keep values well-conditioned --

    def squash(self, v: Val, limit: float = 1.0) -> Val:
        """`v` itself if its scale is within `limit`, else a bounded function of it."""
        if v.scale <= limit:
            return v
        r = self.rng.random()
        if v.dtype in INTS:
            lo, hi = self.const(-3, v.dtype), self.const(3, v.dtype)
            c = self.op("maximum", [v, lo], v.shape, v.dtype, 3, v.exact)
            return self.op("minimum", [c, hi], v.shape, v.dtype, 3, v.exact)
        if r < 0.4:
            return self.op("tanh", [v], v.shape, v.dtype, 1.0, False)
        if r < 0.7:
            a = self.op("abs", [v], v.shape, v.dtype, v.scale, v.exact)
            d = self.op(
                "add", [a, self.const(1.0, v.dtype)], v.shape, v.dtype, v.scale + 1, v.exact
            )
            return self.op("div", [v, d], v.shape, v.dtype, 1.0, False)
        bound = max(1.0, min(limit, 2.0))
        lo, hi = self.const(-bound, v.dtype), self.const(bound, v.dtype)
        c = self.op("maximum", [v, lo], v.shape, v.dtype, bound, v.exact)
        return self.op("minimum", [c, hi], v.shape, v.dtype, bound, v.exact)

    def positive(self, v: Val, offset: float = 1.0) -> Val:
        """|v| + offset: a safe divisor or log/rsqrt argument."""
        a = self.op("abs", [v], v.shape, v.dtype, v.scale, v.exact)
        c = self.const(offset, v.dtype)
        return self.op("add", [a, c], v.shape, v.dtype, v.scale + offset, v.exact)

    def cast_to(self, v: Val, dtype: str) -> Val:
        if v.dtype == dtype:
            return v
        if not v.exact and PRECISION.get(dtype, 0) > PRECISION.get(v.dtype, 0):
            # A rounding difference of the narrow type would fail the wide type's tolerance.
            raise Skip
        if dtype in HALF:
            v = self.squash(v, 1000.0)
        exact = v.exact and v.dtype != "i1"
        return self.op("cast", [v], v.shape, dtype, v.scale, exact)

    # -- ops --

    @action(20)
    def unary(self) -> Val:
        op = _draw(self.rng, UNARY_OPS)
        name, fuzz = op.FN, op.FUZZ
        exact_only = fuzz.domain == "exact"
        v = self.pick(lambda v: v.is_float and (v.exact or not exact_only), rounding=not op.EXACT)
        if fuzz.domain == "bounded":
            v = self.squash(v, fuzz.bound)
        elif fuzz.domain == "positive":
            if fuzz.raw and v.exact and self.rng.random() < fuzz.raw:
                # Raw: NaN for negative inputs, in the reference and the kernels alike.
                return self.op(name, [v], v.shape, v.dtype, self.scaled(fuzz, v, 3.0), False)
            v = self.positive(v, fuzz.bound)
        exact = v.exact and (op.EXACT if fuzz.exact is None else fuzz.exact)
        return self.op(name, [v], v.shape, v.dtype, self.scaled(fuzz, v), exact)

    @staticmethod
    def scaled(fuzz: graph.Fuzz, v: Val, least: float = 1.0) -> float:
        """The rough magnitude of a unary op's result on `v` (see Fuzz.scale)."""
        if fuzz.scale == "unit":
            return 1.0
        if fuzz.scale == "exp":
            # Standard normal tails reach 4 sigma: exp's scale counts them.
            return math.exp(3 * v.scale)
        if fuzz.scale == "sqrt":
            return max(least, math.sqrt(v.scale))
        return v.scale

    def partner(self, a: Val, exact: bool = False, rounding: bool = True) -> Val:
        """A second operand of `a`'s element type whose shape broadcasts with it."""
        r = self.rng.random()

        def fits(v: Val) -> bool:
            full = broadcast_shapes(a.shape, v.shape)
            return (
                v.dtype == a.dtype
                and full is not None
                and numel(full) <= MAX_NUMEL
                and (v.exact or not exact)
            )

        if r < 0.55:
            try:
                return self.pick(fits, rounding)
            except Skip:
                pass
        if r < 0.75:
            values = [0.0, 1.0, -1.5, 0.5, 2.0, 3.0] if a.is_float else [0, 1, -2, 3]
            shape = () if self.rng.random() < 0.8 else self.compatible_shape(a.shape)
            return self.const(self.rng.choice(values), a.dtype, shape)
        return self.arg(self.compatible_shape(a.shape), a.dtype)

    @action(25)
    def binary(self) -> Val:
        a = self.pick(lambda v: v.is_float or v.dtype in INTS)
        ops = [op for op in BINARY_OPS if a.is_float or op.KIND == "arith"]
        op = _draw(self.rng, sorted(ops, key=lambda op: op.KIND == "float"))
        name, fuzz = op.FN, op.FUZZ
        if fuzz.recipe == "power":
            return self.power(a)
        b = self.partner(a)
        if fuzz.domain == "bounded":
            a, b = self.squash(a, fuzz.bound), self.squash(b, fuzz.bound)
        if self.rng.random() < 0.5:
            a, b = b, a
        shape = broadcast_shapes(a.shape, b.shape)
        assert shape is not None
        if fuzz.domain == "positive":
            b = self.positive(b, fuzz.bound)
        exact = a.exact and b.exact and (op.EXACT if fuzz.exact is None else fuzz.exact)
        return self.op(name, [a, b], shape, a.dtype, self.combined_scale(fuzz, a, b), exact)

    @staticmethod
    def combined_scale(fuzz: graph.Fuzz, a: Val, b: Val) -> float:
        """The rough magnitude of a binary op's result on `a` and `b` (see Fuzz.scale)."""
        return {
            "sum": a.scale + b.scale,
            "product": a.scale * b.scale,
            "max": max(a.scale, b.scale),
        }.get(fuzz.scale, a.scale)

    def clamp(self, v: Val, bound: float) -> Val:
        """min(max(v, -bound), bound): a hard bound, whatever the scale estimate says
        (tails of products of normals pass any estimate)."""
        lo, hi = self.const(-bound, v.dtype), self.const(bound, v.dtype)
        c = self.op("maximum", [v, lo], v.shape, v.dtype, bound, v.exact)
        return self.op("minimum", [c, hi], v.shape, v.dtype, bound, v.exact)

    def power(self, a: Val) -> Val:
        # pow amplifies its base's error by the exponent and its exponent's by
        # |b log a|: the base is clamped to 2 (for a constant exponent up to 3) or
        # to [1, 4] (|a| + 1), and a tensor exponent to [-1, 1].
        r = self.rng.random()
        if r < 0.5:
            base = self.clamp(a, 2.0)
            e = self.rng.choice([2.0, 3.0, 0.5, 1.0, 0.0])
            c = self.const(e, a.dtype)
            return self.op("pow", [base, c], a.shape, a.dtype, 2.0**e, False)
        base = self.positive(self.clamp(a, 3.0))
        ex = self.clamp(self.partner(a), 1.0)
        shape = broadcast_shapes(base.shape, ex.shape)
        assert shape is not None
        return self.op("pow", [base, ex], shape, a.dtype, 4.0, False)

    def weight(self, shape: tuple[int, ...], dtype: str) -> Val:
        """A new [.., K, N] matmul operand scaled by 1/sqrt(K), as layers are initialized:
        products stay near 1, so two summation orders agree within f32's tolerance."""
        w = self.arg(shape, dtype)
        c = self.const(round(1.0 / math.sqrt(shape[-2]), 4), dtype)
        return self.op("mul", [w, c], shape, dtype, 1.0, False)

    @action(4)
    def compare(self) -> Val:
        a = self.pick(lambda v: v.exact and v.dtype != "i1")
        b = self.partner(a, exact=True)
        if not b.exact:
            raise Skip
        shape = broadcast_shapes(a.shape, b.shape)
        assert shape is not None
        return self.op(self.rng.choice(COMPARE), [a, b], shape, "i1", 1.0, True)

    @action(6)
    def where(self) -> Val:
        try:
            cond = self.pick(lambda v: v.dtype == "i1", rounding=False)
        except Skip:
            cond = self.compare()
        x = self.pick(
            lambda v: (
                v.dtype != "i1"
                and (s := broadcast_shapes(cond.shape, v.shape)) is not None
                and numel(s) <= MAX_NUMEL
            ),
            rounding=False,
        )
        y = self.partner(x, rounding=False)
        shape = broadcast_shapes(cond.shape, x.shape, y.shape)
        if shape is None or numel(shape) > MAX_NUMEL:
            raise Skip
        ops = [cond, x, y] if self.rng.random() < 0.5 else [cond, y, x]
        exact = x.exact and y.exact
        return self.op("where", ops, shape, x.dtype, max(x.scale, y.scale), exact)

    @action(6)
    def cast(self) -> Val:
        v = self.pick(lambda v: True, rounding=False)
        if v.is_float:
            choices = [d for d in FLOAT_WEIGHTS if d != v.dtype]
            return self.cast_to(v, self.rng.choice(choices))
        target = self.float_dtype() if self.rng.random() < 0.8 else self.rng.choice(INTS)
        if target == v.dtype:
            raise Skip
        return self.cast_to(v, target)

    @action(12)
    def reduce(self) -> Val:
        op = REDUCE_OPS[self.rng.choice(REDUCE)]
        rounds = not op.COMBINER.EXACT  # a sum rounds; a max picks an element
        v = self.pick(lambda v: len(v.shape) >= 1 and v.dtype != "i1", rounding=rounds)
        if op.FLOAT_ONLY and not v.is_float:
            op = graph.ReduceSumOp  # a mean's sum, on integers
        name = op.name.removeprefix("graph.")
        rank = len(v.shape)
        r = self.rng.random()
        if r < 0.35:
            dims = [rank - 1]
        elif r < 0.55:
            dims = [0]
        elif r < 0.7:
            dims = list(range(rank))
        else:
            dims = sorted(self.rng.sample(range(rank), self.rng.randint(1, rank)))
        n = numel([v.shape[d] for d in dims])
        if rounds and n > MAX_SUMMED:
            raise Skip
        if op is graph.ReduceSumOp:
            v = self.squash(v, 4.0 if v.dtype not in HALF else 2.0)
            scale = v.scale * max(1.0, float(n))
        else:
            scale = v.scale
        if v.dtype in HALF and rounds:
            # Keep sums far from half precision's overflow.
            v = self.squash(v, 2.0)
        keep = self.rng.random() < 0.5
        shape = [1 if d in dims else s for d, s in enumerate(v.shape) if keep or d not in dims]
        text_dims = [d - rank if self.rng.random() < 0.2 else d for d in dims]
        attrs = "{dims = [" + ", ".join(map(str, text_dims)) + "]"
        if keep or self.rng.random() < 0.3:
            attrs += f", keepdim = {'true' if keep else 'false'}"
        attrs += "}"
        exact = v.exact and op.COMBINER.EXACT
        return self.op(name, [v], shape, v.dtype, scale, exact, attrs)

    @action(6)
    def matmul(self) -> Val:
        dtype = "f16" if self.rng.random() < 0.3 else "f32"
        batched = self.rng.random() < 0.3
        rank = 3 if batched else 2
        try:
            a = self.pick(lambda v: len(v.shape) == rank and v.is_float)
        except Skip:
            a = self.arg(self.random_shape(rank, 4096), dtype)
        a = self.cast_to(self.squash(a, 3.0), dtype if a.dtype not in ("f32", "f16") else a.dtype)
        k = a.shape[-1]
        for _ in range(20):
            n = self.rng.choice(DIMS)
            if numel([*a.shape[:-1], n]) <= MAX_NUMEL and numel([*a.shape[:-2], k, n]) <= MAX_NUMEL:
                break
        else:
            raise Skip
        bshape = (*a.shape[:-2], k, n)

        def fits(v: Val) -> bool:
            return v.shape == bshape and v.dtype == a.dtype

        r = self.rng.random()
        if r < 0.3 and any(fits(v) for v in self.values):
            b = self.pick(fits)
        elif r < 0.5 and any(
            v.shape == (*bshape[:-2], n, k) and v.dtype == a.dtype for v in self.values
        ):
            bt = self.pick(lambda v: v.shape == (*bshape[:-2], n, k) and v.dtype == a.dtype)
            perm = "[0, 2, 1]" if batched else "[1, 0]"
            b = self.op(
                "transpose", [bt], bshape, bt.dtype, bt.scale, bt.exact, f"{{perm = {perm}}}"
            )
        else:
            b = self.weight(bshape, a.dtype)
        b = self.squash(b, 3.0)
        out = (*a.shape[:-1], n)
        scale = a.scale * b.scale * math.sqrt(k) * 2
        return self.op("matmul", [a, b], out, a.dtype, scale, False)

    @action(5)
    def transpose(self) -> Val:
        v = self.pick(lambda v: len(v.shape) >= 2, rounding=False)
        rank = len(v.shape)
        perm = list(range(rank))
        while perm == list(range(rank)):
            self.rng.shuffle(perm)
        text = [p - rank if self.rng.random() < 0.15 else p for p in perm]
        shape = [v.shape[p] for p in perm]
        attrs = "{perm = [" + ", ".join(map(str, text)) + "]}"
        return self.op("transpose", [v], shape, v.dtype, v.scale, v.exact, attrs)

    @action(5)
    def reshape(self) -> Val:
        v = self.pick(lambda v: len(v.shape) >= 1, rounding=False)
        shape = list(v.shape)
        r = self.rng.random()
        if r < 0.25:
            new = [numel(shape)]
        elif r < 0.5 and len(shape) >= 2:
            i = self.rng.randrange(len(shape) - 1)
            new = shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2 :]
        elif r < 0.75:
            splits = {64: [(8, 8), (4, 16), (2, 32)], 130: [(10, 13), (2, 65)], 33: [(3, 11)]}
            idx = [i for i, d in enumerate(shape) if d in splits]
            if not idx or len(shape) >= 3:
                raise Skip
            i = self.rng.choice(idx)
            new = shape[:i] + list(self.rng.choice(splits[shape[i]])) + shape[i + 1 :]
        elif len(shape) < 3:
            i = self.rng.randint(0, len(shape))
            new = shape[:i] + [1] + shape[i:]
        else:
            new = [d for d in shape if d != 1] or [1]
        if new == shape:
            raise Skip
        return self.op("reshape", [v], new, v.dtype, v.scale, v.exact)

    @action(3)
    def broadcast(self) -> Val:
        v = self.pick(lambda v: len(v.shape) < 3 or 1 in v.shape, rounding=False)
        new = [self.rng.choice(DIMS) if d == 1 and self.rng.random() < 0.7 else d for d in v.shape]
        if len(new) < 3 and self.rng.random() < 0.5:
            new = [self.rng.choice(DIMS), *new]
        if numel(new) > MAX_NUMEL or tuple(new) == v.shape:
            raise Skip
        return self.op("broadcast", [v], new, v.dtype, v.scale, v.exact)

    @action(2)
    def softmax(self) -> Val:
        v = self.pick(lambda v: v.is_float and len(v.shape) >= 1)
        v = self.squash(v, 4.0)  # exp(x - max) keeps x's absolute error: |x| stays small
        dim = self.rng.randrange(len(v.shape))
        return self.op("softmax", [v], v.shape, v.dtype, 1.0, False, f"{{dim = {dim}}}")

    @action(2)
    def layer_norm(self) -> Val:
        # Normalizing near-equal values is ill-conditioned (x - mean is all rounding,
        # times rsqrt(eps)): rows of at least 17 exact values, plus fresh standard
        # normal noise, so the variance is never small. An inexact input with a
        # large mean next to its spread (softmax + 1) would lose digits in x - mean.
        v = self.pick(lambda v: v.is_float and v.exact and len(v.shape) >= 1 and v.shape[-1] >= 17)
        v = self.squash(v, 4.0)
        noise = self.arg(v.shape, v.dtype)
        v = self.op("add", [v, noise], v.shape, v.dtype, v.scale + 1.0, v.exact and noise.exact)
        k = self.rng.randint(1, min(2, len(v.shape)))
        rank = len(v.shape)
        dims = list(range(rank - k, rank))
        norm = v.shape[rank - k :]
        w = self.arg(norm, v.dtype)
        b = self.arg(norm, v.dtype)
        attrs = "{dims = [" + ", ".join(map(str, dims)) + "], eps = 1.0e-5}"
        return self.op("layer_norm", [v, w, b], v.shape, v.dtype, 4.0, False, attrs)

    @action(4)
    def normalize(self) -> Val:
        """`x (op) reduce(x)` broadcast back over the rows: a reduction epilogue."""
        rng = self.rng
        v = self.pick(lambda v: v.dtype in ("f32", "f64", *HALF) and len(v.shape) >= 1)
        v = self.squash(v, 4.0)
        rank = len(v.shape)
        r = rng.random()
        if r < 0.4:
            dims = [rank - 1]
        elif r < 0.6:
            dims = [0]
        else:
            dims = sorted(rng.sample(range(rank), rng.randint(1, rank)))
        # Half-precision sums round twice here (sum, then the combination): max and min only.
        # (Sorted by name: a seed's program does not depend on the dialect's order.)
        names = sorted(n for n, op in REDUCE_OPS.items() if op.COMBINER.EXACT)
        if v.dtype not in HALF and numel([v.shape[d] for d in dims]) <= MAX_SUMMED:
            names += sorted(n for n, op in REDUCE_OPS.items() if not op.COMBINER.EXACT)
        name = rng.choice(names)
        op = REDUCE_OPS[name]
        # Without keepdim the reduced value broadcasts back only when the reduced dims lead.
        keep = dims != list(range(len(dims))) or rng.random() < 0.5
        shape = [1 if d in dims else s for d, s in enumerate(v.shape) if keep or d not in dims]
        n = numel([v.shape[d] for d in dims])
        scale = v.scale * n if op is graph.ReduceSumOp else v.scale
        attrs = "{dims = [" + ", ".join(map(str, dims)) + f"], keepdim = {str(keep).lower()}}}"
        red = self.op(name, [v], shape, v.dtype, scale, v.exact and op.COMBINER.EXACT, attrs)
        combine = rng.choice(NORMALIZERS)
        fuzz = combine.FUZZ
        if fuzz.domain == "positive":
            red = self.positive(red, fuzz.bound)
        elif fuzz.domain == "bounded":
            red = self.squash(red, 4.0)  # as v is
        exact = v.exact and red.exact and (combine.EXACT if fuzz.exact is None else fuzz.exact)
        scale = self.combined_scale(fuzz, v, red)
        return self.op(combine.FN, [v, red], v.shape, v.dtype, scale, exact)

    @action(3)
    def gemm_block(self) -> Val:
        """A matmul with a prologue on an operand and an epilogue (bias, activation,
        scale, residual), in f32: the GEMM fusions of a linear layer."""
        rng = self.rng
        batch = (rng.choice((2, 3, 5)),) if rng.random() < 0.25 else ()
        for _ in range(50):
            m, k, n = (rng.choice(DIMS) for _ in range(3))
            if max(numel((*batch, m, k)), numel((*batch, k, n)), numel((*batch, m, n))) <= 4096:
                break
        else:
            raise Skip
        try:
            a = self.pick(lambda v: v.shape == (*batch, m, k) and v.dtype == "f32" and v.exact)
        except Skip:
            a = self.arg((*batch, m, k), "f32")
        r = rng.random()
        if r < 0.2:
            a = self.op("relu", [a], a.shape, "f32", a.scale, a.exact)
        elif r < 0.3:
            a = self.op("neg", [a], a.shape, "f32", a.scale, a.exact)
        elif r < 0.4:
            h = self.op("cast", [a], a.shape, "f16", a.scale, a.exact)
            a = self.op("cast", [h], a.shape, "f32", a.scale, a.exact)
        a = self.squash(a, 3.0)
        b = self.weight((*batch, k, n), "f32")
        y = self.op("matmul", [a, b], (*batch, m, n), "f32", a.scale * math.sqrt(k) * 2, False)
        if rng.random() < 0.7:
            bias = self.arg((n,) if rng.random() < 0.8 else (m, 1), "f32")
            y = self.op("add", [y, bias], y.shape, "f32", y.scale + 1, False)
        if rng.random() < 0.3:
            c = self.const(rng.choice([0.5, 2.0, -1.5]), "f32")
            y = self.op("mul", [y, c], y.shape, "f32", y.scale * 2, False)
        if rng.random() < 0.6:
            act = rng.choice(ACTIVATIONS)
            y = self.op(act, [y], y.shape, "f32", y.scale, False)
        if rng.random() < 0.3:
            res = self.arg(y.shape, "f32")
            y = self.op("add", [y, res], y.shape, "f32", y.scale + 1, False)
        return y

    # -- indexing and generation (ops of models imported from PyTorch) --

    @action(3)
    def slice(self) -> Val:
        v = self.pick(lambda v: any(d > 1 for d in v.shape), rounding=False)
        start, end, step = [], [], []
        for d in v.shape:
            s = self.rng.randrange(d) if self.rng.random() < 0.5 else 0
            e = self.rng.randint(s + 1, d) if self.rng.random() < 0.5 else d
            start.append(s)
            end.append(e)
            step.append(self.rng.choice((1, 1, 2, 3)))
        shape = [-(-(e - s) // k) for s, e, k in zip(start, end, step, strict=True)]
        if tuple(shape) == v.shape:
            raise Skip
        attrs = f"{{start = {start}, end = {end}"
        attrs += "}" if step == [1] * len(step) and self.rng.random() < 0.5 else f", step = {step}}}"
        return self.op("slice", [v], shape, v.dtype, v.scale, v.exact, attrs)

    @action(2)
    def concat(self) -> Val:
        v = self.pick(lambda v: len(v.shape) >= 1, rounding=False)
        dim = self.rng.randrange(len(v.shape))
        parts = [v]
        for _ in range(self.rng.randint(1, 2)):
            size = self.rng.choice((1, 2, 5, v.shape[dim]))
            shape = v.shape[:dim] + (size,) + v.shape[dim + 1 :]
            same = [w for w in self.values if w.shape == shape and w.dtype == v.dtype]
            w = self.rng.choice(same) if same and self.rng.random() < 0.6 else None
            parts.append(w if w is not None and not w.noisy_half else self.arg(shape, v.dtype))
        self.rng.shuffle(parts)
        shape = list(v.shape)
        shape[dim] = sum(p.shape[dim] for p in parts)
        if numel(shape) > MAX_NUMEL:
            raise Skip
        text = dim - len(shape) if self.rng.random() < 0.2 else dim
        scale = max(p.scale for p in parts)
        exact = all(p.exact for p in parts)
        return self.op("concat", parts, shape, v.dtype, scale, exact, f"{{dim = {text}}}")

    @action(1)
    def iota(self) -> Val:
        """Each element its index: a column or row (a causal mask's halves) or a tensor."""
        rank = self.rng.choice((1, 2, 2))
        shape = list(self.random_shape(rank))
        dim = self.rng.randrange(rank)
        if rank == 2 and self.rng.random() < 0.5:
            shape[1 - dim] = 1
        dtype = self.rng.choice((*INTS, self.float_dtype()))
        if dtype in HALF and shape[dim] > 256:
            raise Skip  # f16 and bf16 hold every integer up to 2048 and 256 only
        v = self.op("iota", [], shape, dtype, float(shape[dim]), True, f"{{dim = {dim}}}")
        self.constants.add(v.name)
        return v

    @action(2)
    def index_select(self) -> Val:
        x = self.pick(lambda v: len(v.shape) >= 1, rounding=False)
        dim = self.rng.randrange(len(x.shape))
        ishape = self.random_shape(self.rng.choice((0, 1, 1, 2)), limit=64)
        shape = (*x.shape[:dim], *ishape, *x.shape[dim + 1 :])
        if numel(shape) > MAX_NUMEL or len(shape) > 4:
            raise Skip
        idx = self.arg(ishape, self.rng.choice(INTS))  # drawn inside x's dim by random_inputs
        return self.op("index_select", [x, idx], shape, x.dtype, x.scale, x.exact,
                       f"{{dim = {dim}}}")  # fmt: skip

    @action(1)
    def gather(self) -> Val:
        x = self.pick(lambda v: len(v.shape) >= 1, rounding=False)
        dim = self.rng.randrange(len(x.shape))
        shape = tuple(
            self.rng.choice(DIMS[:4]) if k == dim else self.rng.randint(1, d)
            for k, d in enumerate(x.shape)
        )
        if numel(shape) > MAX_NUMEL:
            raise Skip
        idx = self.arg(shape, self.rng.choice(INTS))
        return self.op("gather", [x, idx], shape, x.dtype, x.scale, x.exact, f"{{dim = {dim}}}")

    @action(1)
    def gelu_tanh(self) -> Val:
        v = self.pick(lambda v: v.is_float)
        return self.op("gelu", [v], v.shape, v.dtype, v.scale, False, '{approximate = "tanh"}')


    # -- the program --

    def build(self) -> str:
        rng = self.rng
        rank = rng.choices([0, 1, 2, 3], weights=[3, 25, 45, 27])[0]
        base = self.random_shape(rank)
        dtype = self.float_dtype() if rng.random() < 0.9 else rng.choice(INTS)
        self.arg(base, dtype)
        if rng.random() < 0.5:
            self.arg(self.compatible_shape(base), dtype)
        n_ops = rng.randint(1, self.max_ops)
        made = 0
        tries = 0
        names, weights = list(self.ACTIONS), list(self.ACTIONS.values())
        while made < n_ops and tries < 20 * self.max_ops:
            tries += 1
            action = rng.choices(names, weights=weights)[0]
            mark = (len(self.lines), len(self.values), len(self.args))
            uses = [v.uses for v in self.values]
            try:
                getattr(self, action)()
                made += 1
            except Skip:
                # Undo whatever the failed attempt emitted.
                del self.lines[mark[0] :]
                del self.values[mark[1] :]
                del self.args[mark[2] :]
                for v, u in zip(self.values, uses, strict=False):
                    v.uses = u
        return self.text(self.outputs())

    def outputs(self) -> list[Val]:
        rng = self.rng
        computed = [
            v for v in self.values if v not in self.args and v.name not in self.constants
        ] or self.values
        outs = [computed[-1]]
        for v in computed[:-1]:
            if v.uses == 0 and rng.random() < 0.8 or rng.random() < 0.08:
                outs.append(v)
        if rng.random() < 0.03:
            outs.append(rng.choice(self.args))
        if rng.random() < 0.03:
            outs.append(outs[0])
        return outs[:5]

    def text(self, outs: list[Val]) -> str:
        args = ", ".join(f"%{a.name}: {a.type}" for a in self.args)
        types = ", ".join(o.type for o in outs)
        result = types if len(outs) == 1 else f"({types})"
        names = ", ".join("%" + o.name for o in outs)
        return (
            f"func @main({args}) -> {result} {{\n"
            + "".join(line + "\n" for line in self.lines)
            + f"  return {names} : {types}\n}}\n"
        )


Generator.ACTIONS = {
    name: method.action_weight
    for name, method in vars(Generator).items()
    if hasattr(method, "action_weight")
}


def generate(seed: int, max_ops: int = 10) -> str:
    """The program of `seed`: the text of one function, `@main`."""
    return Generator(seed, max_ops).build()


# --- differential checking ---------------------------------------------------------


@dataclass
class Failure:
    """How a program failed: `kind` names the stage, `message` the details."""

    kind: str  # invalid | reference | crash-fused | crash-unfused | mismatch-fused | ...
    message: str
    detail: str = ""
    """What must stay the same while shrinking (an exception type, an output index)."""

    @property
    def signature(self) -> tuple[str, str]:
        return (self.kind, self.detail)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


SMALL_TILES = (
    "fuse,graph-to-loop,one-pass-variance,split-reduction{threshold=64 splits=16 min_chunk=4},"
    "tile{block=32 rblock=16 persistent-rblock=16}," + ",".join(AFTER_TILING)
)
"""The third way a program is compiled: fused, with tiny blocks, so that small
programs still take the paths of large ones (reductions looped over chunks,
online softmax, split full reductions, many programs and masked tails)."""

VARIANTS = ("fused", "unfused", "small-tiles")


def compile_variant(module: object, variant: str, device: str = "cpu") -> object:
    """`module` compiled as `variant` (one of `VARIANTS`); the module is not changed."""
    import irc

    if variant == "small-tiles":
        lowered = irc.parse(irc.print_module(module), "<graphgen>")  # type: ignore[arg-type]
        irc.run_pipeline(lowered, SMALL_TILES)
        return irc.compile(lowered, device=device)
    return irc.compile(module, device=device, fuse=variant == "fused")  # type: ignore[arg-type]


def check_program(text: str, seed: int, device: str = "cpu") -> Failure | None:
    """Compiles `text` in every variant (fused, unfused, fused with tiny blocks), runs
    each on the inputs of `seed` and compares with the reference interpreter."""
    import torch

    import irc
    from irc.testing.reference import functions, random_inputs, run_function

    try:
        module = irc.parse(text, "<graphgen>")
        irc.verify(module)
    except irc.IrcError as e:
        return Failure("invalid", str(e).splitlines()[0] if str(e) else repr(e), "")
    fns = functions(module)
    name, fn = next(iter(fns.items()))
    inputs = random_inputs(fn, seed, device)
    try:
        expected = run_function(fn, inputs)
    except Exception as e:
        return Failure("reference", f"{type(e).__name__}: {e}", type(e).__name__)
    for mode in VARIANTS:
        args = [x.clone() for x in inputs]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled = compile_variant(module, mode, device)
                outputs = compiled.run(name, args)  # type: ignore[attr-defined]
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            # Shrinking keeps the message, less the names and numbers in it.
            detail = re.sub(r"%[\w.$-]+|\d+", "#", f"{type(e).__name__}: {first}")
            return Failure(f"crash-{mode}", f"{type(e).__name__}: {first}", detail)
        for i, (a, x) in enumerate(zip(args, inputs, strict=True)):
            if not torch.equal(a, x):  # random inputs hold no NaN
                return Failure(f"input-modified-{mode}", f"input {i} was written", str(i))
        if len(outputs) != len(expected):
            return Failure(
                f"mismatch-{mode}", f"{len(outputs)} outputs, expected {len(expected)}", "count"
            )
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            try:
                torch.testing.assert_close(got.cpu(), want.cpu(), equal_nan=True)
            except AssertionError as e:
                msg = " ".join(str(e).split())
                return Failure(f"mismatch-{mode}", f"output {i}: {msg}", "")
    return None


# --- shrinking ----------------------------------------------------------------------


def _candidates(text: str) -> Iterator[str]:
    """Smaller variants of a one-function program, biggest cuts first."""
    import irc

    def variants() -> Iterator[Callable[[object], bool]]:
        module = irc.parse(text, "<shrink>")
        fn = _main(module)
        ops = list(fn.body.block.ops)
        ret = ops[-1]
        n_out = len(ret.operands)
        if n_out > 1:
            for j in range(n_out):
                yield lambda f, j=j: _drop_output(f, j)
        for i in reversed(range(len(ops) - 1)):
            op = ops[i]
            if not op.results:
                continue
            for k, o in enumerate(op.operands):
                if o.type == op.results[0].type:
                    yield lambda f, i=i, k=k: _bypass(f, i, k)
            yield lambda f, i=i: _to_argument(f, i)

    for mutate in variants():
        module = irc.parse(text, "<shrink>")
        fn = _main(module)
        if not mutate(fn):
            continue
        _clean(fn)
        try:
            irc.verify(module)
        except Exception:
            continue
        new = irc.print_module(module)
        if new != text:
            yield new


def _main(module: object) -> object:
    from xdsl.dialects import func

    return next(op for op in module.body.ops if isinstance(op, func.FuncOp))  # type: ignore[attr-defined]


def _drop_output(fn: object, j: int) -> bool:
    ret = fn.body.block.last_op  # type: ignore[attr-defined]
    operands = list(ret.operands)
    del operands[j]
    ret.operands = operands
    return True


def _bypass(fn: object, i: int, k: int) -> bool:
    op = list(fn.body.block.ops)[i]  # type: ignore[attr-defined]
    op.results[0].replace_all_uses_with(op.operands[k])
    op.detach()
    op.erase()
    return True


def _to_argument(fn: object, i: int) -> bool:
    """Replaces an op's result with a new function argument (cuts its producers off)."""
    block = fn.body.block  # type: ignore[attr-defined]
    op = list(block.ops)[i]
    if op.name == "graph.constant":
        return False
    r = op.results[0]
    arg = block.insert_arg(r.type, len(block.args))
    if r.name_hint:
        from irc.ir.value_names import set_value_name

        set_value_name(arg, r.name_hint)
    r.replace_all_uses_with(arg)
    op.detach()
    op.erase()
    return True


def _clean(fn: object) -> None:
    """Drops ops whose results are unused and arguments nothing reads."""
    block = fn.body.block  # type: ignore[attr-defined]
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.ops)[:-1]):
            if all(not r.uses for r in op.results):
                op.detach()
                op.erase()
                changed = True
    for arg in reversed(list(block.args)):
        if not arg.uses and len(block.args) > 1:
            block.erase_arg(arg)
    fn.update_function_type()  # type: ignore[attr-defined]


def shrink(text: str, seed: int, failure: Failure, budget: int = 400, device: str = "cpu") -> str:
    """A smaller program that fails like `failure` (greedy, first improvement)."""
    current = text
    tried = 0
    progress = True
    while progress and tried < budget:
        progress = False
        for cand in _candidates(current):
            tried += 1
            f = check_program(cand, seed, device)
            if f is not None and f.signature == failure.signature:
                current = cand
                progress = True
                break
            if tried >= budget:
                break
    return current


# --- the command line ------------------------------------------------------------------


def _run_seed(job: tuple[int, int, str]) -> tuple[int, str, Failure | None]:
    seed, max_ops, device = job
    text = generate(seed, max_ops)
    try:
        failure = check_program(text, seed, device)
    except Exception as e:  # a bug in the checker itself: report, do not stop the batch
        failure = Failure("checker", f"{type(e).__name__}: {e}", type(e).__name__)
    return seed, text, failure


def _report(
    seed: int, text: str, failure: Failure, do_shrink: bool, out: object, device: str = "cpu"
) -> None:
    w = out.write  # type: ignore[attr-defined]
    w(f"\nFAIL seed {seed}: {failure}\n")
    if do_shrink and failure.kind != "checker":
        small = shrink(text, seed, failure, device=device)
        again = check_program(small, seed, device)
        w(f"// reproducer (shrunk; inputs: irc.testing.reference.random_inputs(fn, seed={seed}))\n")
        w(f"// {again if again is not None else failure}\n")
        w(small)
    else:
        w(text)
    w("\n")
    out.flush()  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m irc.testing.graphgen",
        description="Differential testing: random graphs, fused and unfused, against the reference.",
    )
    ap.add_argument("--count", type=int, default=200, help="number of graphs (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--max-ops", type=int, default=10, help="ops a program draws at most")
    ap.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (default: all cores)",
    )
    ap.add_argument("--no-shrink", action="store_true", help="print failing programs as generated")
    ap.add_argument("--show", type=int, metavar="SEED", help="print the program of SEED and exit")
    ap.add_argument("--check", metavar="FILE", help="check one .ir file with inputs of --seed")
    ap.add_argument("--device", default="cpu", help="cpu (Triton's interpreter, default) or cuda")
    ap.add_argument(
        "--max-seconds", type=float, default=None, help="stop starting graphs after this long"
    )
    args = ap.parse_args(argv)
    if args.show is not None:
        sys.stdout.write(generate(args.show, args.max_ops))
        return 0
    if args.check is not None:
        with open(args.check) as f:
            text = f.read()
        failure = check_program(text, args.seed, args.device)
        if failure is None:
            print("ok")
            return 0
        _report(args.seed, text, failure, not args.no_shrink, sys.stdout, args.device)
        return 1
    jobs = [(s, args.max_ops, args.device) for s in range(args.seed, args.seed + args.count)]
    failures: list[tuple[int, str, Failure]] = []
    start = time.time()
    step = max(1, min(100, args.count // 20))

    def results() -> Iterator[tuple[int, str, Failure | None]]:
        if args.jobs <= 1:
            yield from map(_run_seed, jobs)
            return
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            yield from pool.imap_unordered(_run_seed, jobs, chunksize=4)

    done = 0
    for done, (seed, text, failure) in enumerate(results(), 1):
        if failure is not None:
            failures.append((seed, text, failure))
            print(f"seed {seed}: {failure}", flush=True)
        if done % step == 0 or done == len(jobs):
            print(
                f"[{done}/{len(jobs)}] {len(failures)} failing, {time.time() - start:.0f} s",
                flush=True,
            )
        if args.max_seconds is not None and time.time() - start > args.max_seconds:
            print(f"stopping after {done} graphs: --max-seconds reached", flush=True)
            break
    for seed, text, failure in sorted(failures, key=lambda t: t[0]):
        _report(seed, text, failure, not args.no_shrink, sys.stdout, args.device)
    print(f"{done} graphs, {len(failures)} failing, {time.time() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
