"""Differential testing of the PyTorch frontend: random torch programs, irc.compile
against eager.

A program is a seeded chain of torch calls (element-wise, reductions, views and
indexing, matmuls) over 1-3 random inputs whose shapes share dims, written as a
model author would (`x.softmax(-1)`, `t[i, j]`, `F.pad`), so that the ATen
graphs torch.export makes of them go through the importer's converters in
combinations no hand-written test lists. Each output is judged as `irc-run
--check` judges (`irc.testing.verdict.judge`): within assert_close of eager, or
no further from the program run in f64 than 4x eager's own distance.

Ops that jump (floor, round, sign, comparisons) read inputs only: after an
inexact op, an ulp of honest difference could move them by a whole step (a
select between two values by a comparison of them is continuous, and free).

    python -m irc.testing.torchgen --count 200 --seed 1000   # a longer campaign
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

Fn = Callable[..., torch.Tensor]


@dataclass
class Program:
    """Steps over a list of values: the inputs first, then each step's result."""

    seed: int
    inputs: list[torch.Tensor]
    steps: list[tuple[str, Callable[[list[torch.Tensor]], torch.Tensor]]] = field(
        default_factory=list
    )
    outputs: list[int] = field(default_factory=list)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(inputs)
        for _, step in self.steps:
            values.append(step(values))
        return tuple(values[i] for i in self.outputs)

    def text(self) -> str:
        names = [f"x{i}" for i in range(len(self.inputs))]
        lines = [f"# seed {self.seed}: inputs {[tuple(x.shape) for x in self.inputs]}"]
        lines += [f"v{len(names) + k} = {what}" for k, (what, _) in enumerate(self.steps)]
        lines.append(f"return {', '.join(f'v{i}' for i in self.outputs)}")
        return "\n".join(lines)


SMOOTH: dict[str, Fn] = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "cos": torch.cos,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": torch.relu,
    "softplus": F.softplus,
    "elu": F.elu,
    "erf": torch.erf,
    "mish": F.mish,
    "hardswish": F.hardswish,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "exp_clamped": lambda x: torch.exp(x.clamp(-8, 8)),
    "log_abs": lambda x: torch.log(x.abs() + 1),
    "sqrt_abs": lambda x: torch.sqrt(x.abs() + 1),
    "rsqrt_abs": lambda x: torch.rsqrt(x.abs() + 1),
    "log1p_abs": lambda x: torch.log1p(x.abs()),
    "expm1": lambda x: torch.expm1(x.clamp(-4, 4)),
    "affine": lambda x: x * 1.5 - 0.25,
    "square": lambda x: x * x,
    "neg_abs": lambda x: -x.abs(),
    "reciprocal": lambda x: 1.0 / (x.abs() + 1),
    "pow": lambda x: (x.abs() + 0.5) ** 1.5,
    "clamp": lambda x: x.clamp(-0.5, 0.75),
}

JUMPY: dict[str, Fn] = {
    "floor": torch.floor,
    "round": torch.round,
    "sign": torch.sign,
    "positive": lambda x: (x > 0).to(x.dtype),
    "trunc": torch.trunc,
}

BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b),  # continuous: equal where a == b
    "lerp": lambda a, b: a + 0.25 * (b - a),
}


def _written(x: torch.Tensor, dim: int, index: torch.Tensor, value: float) -> torch.Tensor:
    """`y[..., index, ...] = value` along `dim` of a copy (index_put)."""
    y = x.clone()
    y[(slice(None),) * (dim % x.dim()) + (index,)] = value
    return y


def _masked_write(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    """`y[mask] = value` of a copy, the mask broadcast to y's shape first."""
    y = x.clone()
    y[mask.expand_as(y)] = value
    return y


class _Reads(list[torch.Tensor]):
    """The values, noting which a step reads."""

    def __init__(self, values: list[torch.Tensor]):
        super().__init__(values)
        self.seen: set[int] = set()

    def __getitem__(self, k: Any) -> Any:
        self.seen.add(k)
        return super().__getitem__(k)


def _broadcasts(a: Sequence[int], b: Sequence[int]) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b), strict=False))


class Generator:
    """Draws one program from a seed; `Program` replays it."""

    def __init__(self, seed: int, dtype: torch.dtype | None = None, max_steps: int = 7):
        self.rng = random.Random(seed)
        self.seed = seed
        self.dtype = dtype or self.rng.choice([torch.float32] * 3 + [torch.bfloat16])
        self.max_steps = max_steps

    def program(self) -> Program:
        rng = self.rng
        torch.manual_seed(self.seed)
        rank = rng.randint(1, 4)
        base = [rng.randint(2, 9) for _ in range(rank)]
        inputs = [torch.randn(base, dtype=self.dtype)]
        for _ in range(rng.randint(0, 2)):
            shape = [d if rng.random() < 0.7 else 1 for d in base][rng.randint(0, rank - 1) :]
            inputs.append(torch.randn(shape or [1], dtype=self.dtype))
        program = Program(self.seed, inputs)
        values = list(inputs)
        used: set[int] = set()
        for _ in range(rng.randint(2, self.max_steps)):
            for _attempt in range(10):
                drawn = self._step(values, len(inputs))
                if drawn is None:
                    continue
                what, step = drawn
                reads = _Reads(values)
                try:
                    result = step(reads)
                except (RuntimeError, IndexError, ValueError):
                    continue
                if result.numel() == 0 or result.dim() > 6 or not result.is_floating_point():
                    continue
                program.steps.append((what, step))
                values.append(result)
                used.update(reads.seen)
                break
        # Every result no later step reads is an output (the last first), up to 3.
        unread = [k for k in range(len(values) - 1, len(inputs) - 1, -1) if k not in used]
        program.outputs = unread[:3] or [len(values) - 1]
        return program

    def _pick(self, values: list[torch.Tensor], lo: int = 0) -> int:
        return self.rng.randint(lo, len(values) - 1)

    def _step(
        self, values: list[torch.Tensor], n_inputs: int
    ) -> tuple[str, Callable[[list[torch.Tensor]], torch.Tensor]] | None:
        rng = self.rng
        kind = rng.choices(
            ["smooth", "jumpy", "binary", "reduce", "norm", "layout", "index", "matmul"],
            [6, 1, 5, 3, 2, 4, 3, 1],
        )[0]
        i = self._pick(values)
        x = values[i]
        rank = x.dim()
        dim = rng.randint(-rank, rank - 1) if rank else 0
        if kind == "smooth":
            name = rng.choice(sorted(SMOOTH))
            fn = SMOOTH[name]
            return f"{name}(v{i})", lambda v: fn(v[i])
        if kind == "jumpy":
            i = rng.randint(0, n_inputs - 1)
            name = rng.choice(sorted(JUMPY))
            fn = JUMPY[name]
            return f"{name}(v{i} * 3)", lambda v: fn(v[i] * 3)
        if kind == "binary":
            partners = [j for j, y in enumerate(values) if _broadcasts(x.shape, y.shape)]
            j = rng.choice(partners)
            name = rng.choice(sorted(BINARY))
            fn2 = BINARY[name]
            return f"{name}(v{i}, v{j})", lambda v: fn2(v[i], v[j])
        if kind == "reduce" and rank:
            dims = sorted({rng.randint(0, rank - 1) for _ in range(rng.randint(1, rank))})
            keep = rng.random() < 0.5
            how = rng.choice(["sum", "mean", "amax", "amin", "var", "std", "logsumexp", "norm"])
            if how == "logsumexp":
                what = f"logsumexp(v{i}, {dims}, {keep})"
                return what, lambda v: torch.logsumexp(v[i], dims, keep)
            if how == "norm":
                what = f"norm(v{i}, {dims}, {keep})"
                return what, lambda v: torch.linalg.vector_norm(v[i], 2, dims, keep)
            if how in ("var", "std") and all(x.shape[d] == 1 for d in dims):
                return None
            method = how
            return (
                f"v{i}.{method}({dims}, keepdim={keep})",
                lambda v: getattr(v[i], method)(dims, keepdim=keep),
            )
        if kind == "norm" and rank:
            how = rng.choice(["softmax", "log_softmax", "layer_norm", "cumsum"])
            if how == "layer_norm":
                size = list(x.shape[-1:])
                return f"layer_norm(v{i}, {size})", lambda v: F.layer_norm(v[i], size)
            if how == "cumsum":
                return f"v{i}.cumsum({dim})", lambda v: v[i].cumsum(dim)
            return f"v{i}.{how}({dim})", lambda v: getattr(v[i], how)(dim)
        if kind == "layout" and rank:
            return self._layout(i, x, dim, values)
        if kind == "index" and rank:
            size = x.shape[dim]
            count = rng.randint(1, 5)
            index = torch.tensor([rng.randint(-size, size - 1) for _ in range(count)])
            how = rng.choice(
                ["take", "select", "gather", "index_select", "pairs", "write", "write_masked",
                 "one_hot", "diagonal", "masked_fill"]
            )  # fmt: skip
            if how == "pairs" and rank >= 2:
                other = torch.tensor(
                    [rng.randint(-x.shape[1], x.shape[1] - 1) for _ in range(count)]
                )
                first = torch.tensor(
                    [rng.randint(-x.shape[0], x.shape[0] - 1) for _ in range(count)]
                )
                return f"v{i}[{first.tolist()}, {other.tolist()}]", lambda v: v[i][first, other]
            if how == "write":
                return (
                    f"v{i}.index_put(({dim} * [:], {index.tolist()}), 0.5)",
                    lambda v: _written(v[i], dim, index, 0.5),
                )
            if how == "write_masked":  # a mask from an input: exact
                j = rng.randint(0, n_inputs - 1)
                if not _broadcasts(x.shape, values[j].shape) or values[j].dim() > rank:
                    return None
                return (
                    f"v{i} with [v{j} > 0.3 (broadcast)] = -1",
                    lambda v: _masked_write(v[i], v[j] > 0.3, -1.0),
                )
            if how == "masked_fill":
                j = rng.randint(0, n_inputs - 1)
                if not _broadcasts(x.shape, values[j].shape):
                    return None
                return f"v{i}.masked_fill(v{j} < -0.2, 2.0)", lambda v: v[i].masked_fill(
                    v[j] < -0.2, 2.0
                )
            if how == "one_hot":
                positions = torch.randint(
                    0, size, [*x.shape[: dim % rank], 1, *x.shape[dim % rank + 1 :]]
                )
                d = dim % rank
                return (
                    f"v{i}.scatter({d}, idx{list(positions.shape)}, -1.0)",
                    lambda v: v[i].scatter(d, positions, -1.0),
                )
            if how == "diagonal" and rank >= 2:
                offset = rng.randint(-2, 2)
                a, b = rng.sample(range(rank), 2)
                return f"v{i}.diagonal({offset}, {a}, {b})", lambda v: v[i].diagonal(offset, a, b)
            if how == "take":
                what = f"v{i}.movedim({dim}, 0)[{index.tolist()}]"
                return what, lambda v: v[i].movedim(dim, 0)[index]
            if how == "select":
                k = int(index[0])
                return f"v{i}.select({dim}, {k})", lambda v: v[i].select(dim, k)
            positive = index % size
            if how == "index_select":
                what = f"v{i}.index_select({dim}, {positive.tolist()})"
                return what, lambda v: v[i].index_select(dim, positive)
            shape = list(x.shape)
            shape[dim] = count
            g = torch.randint(0, size, shape)
            return f"v{i}.gather({dim}, idx{list(g.shape)})", lambda v: v[i].gather(dim, g)
        if kind == "matmul" and rank >= 2:
            k = x.shape[-1]
            w = torch.randn(k, rng.randint(1, 9), dtype=self.dtype) / k**0.5
            if rng.random() < 0.5:
                return f"v{i} @ w{list(w.shape)}", lambda v: v[i] @ w.to(v[i].dtype)
            return f"v{i} @ v{i}.mT", lambda v: v[i] @ v[i].mT / k
        return None

    def _layout(
        self, i: int, x: torch.Tensor, dim: int, values: list[torch.Tensor]
    ) -> tuple[str, Callable[[list[torch.Tensor]], torch.Tensor]] | None:
        rng = self.rng
        rank = x.dim()
        how = rng.choice(
            ["permute", "flatten", "split_dim", "slice", "flip", "roll", "cat", "stack", "pad",
             "expand", "repeat", "unsqueeze", "contiguous_t"]
        )  # fmt: skip
        if how == "permute":
            perm = list(range(rank))
            rng.shuffle(perm)
            return f"v{i}.permute({perm})", lambda v: v[i].permute(perm)
        if how == "flatten" and rank >= 2:
            a = rng.randint(0, rank - 2)
            return f"v{i}.flatten({a}, {a + 1})", lambda v: v[i].flatten(a, a + 1)
        if how == "split_dim":
            d = dim % rank
            size = x.shape[d]
            factors = [f for f in range(2, size) if size % f == 0]
            if not factors:
                return None
            f = rng.choice(factors)
            shape = [*x.shape[:d], f, size // f, *x.shape[d + 1 :]]
            return f"v{i}.reshape({shape})", lambda v: v[i].reshape(shape)
        if how == "slice":
            size = x.shape[dim]
            start = rng.randint(0, size - 1)
            step = rng.randint(1, 3)
            what = f"v{i}.movedim({dim}, 0)[{start}::{step}].movedim(0, {dim})"
            return what, lambda v: v[i].movedim(dim, 0)[start::step].movedim(0, dim)
        if how == "flip":
            return f"v{i}.flip({dim})", lambda v: v[i].flip(dim)
        if how == "roll":
            shift = rng.randint(-5, 5)
            return f"v{i}.roll({shift}, {dim})", lambda v: v[i].roll(shift, dim)
        if how in ("cat", "stack"):
            same = [j for j, y in enumerate(values) if y.shape == x.shape]
            j = rng.choice(same)
            if how == "cat":
                return f"cat([v{i}, v{j}], {dim})", lambda v: torch.cat([v[i], v[j]], dim)
            d = rng.randint(0, rank)
            return f"stack([v{i}, v{j}], {d})", lambda v: torch.stack([v[i], v[j]], d)
        if how == "pad":
            pad = [rng.randint(-1, 2), rng.randint(0, 2)]
            if x.shape[-1] + sum(pad) <= 0:
                return None
            return f"F.pad(v{i}, {pad}, value=0.5)", lambda v: F.pad(v[i], pad, value=0.5)
        if how == "expand":
            n = rng.randint(2, 3)
            what = f"v{i}.unsqueeze(0).expand({n}, ...) * 1"
            return what, lambda v: v[i].unsqueeze(0).expand(n, *v[i].shape) * 1
        if how == "repeat":
            reps = [rng.randint(1, 2) for _ in range(rank)]
            return f"v{i}.repeat({reps})", lambda v: v[i].repeat(reps)
        if how == "unsqueeze":
            d = rng.randint(0, rank)
            return f"v{i}.unsqueeze({d})", lambda v: v[i].unsqueeze(d)
        if how == "contiguous_t" and rank >= 2:
            return f"v{i}.mT.contiguous() + 0", lambda v: v[i].mT.contiguous() + 0
        return None


@dataclass
class Outcome:
    ok: bool
    line: str
    eager_ops: dict[str, int]


def check(seed: int, device: str = "cpu", max_steps: int = 7, entry: str = "compile") -> Outcome:
    """Seed's program through irc.compile (or `entry` "dynamo":
    torch.compile(backend="irc")) against eager, judged as irc-run --check."""
    import irc
    from irc.pytorch.backend import REPORTS
    from irc.testing.verdict import Yardstick, judge

    program = Generator(seed, max_steps=max_steps).program()
    inputs = [x.to(device) for x in program.inputs]
    wide = [x.double() for x in inputs]

    class Model(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return program(*xs)

    with torch.no_grad():
        eager = program(*inputs)
        exact = program(*wide)
        if entry == "dynamo":
            torch._dynamo.reset()
            before = len(REPORTS)
            got = torch.compile(Model(), backend="irc")(*inputs)
            eager_ops: dict[str, int] = {}
            for report in REPORTS[before:]:
                for op, n in report.eager_ops.items():
                    eager_ops[op] = eager_ops.get(op, 0) + n
        else:
            compiled = irc.compile(Model(), tuple(inputs), device=device)
            got = compiled(*inputs)
            eager_ops = dict(compiled.report.eager_ops)
    lines = []
    ok = True
    for k, (g, e, x) in enumerate(zip(got, eager, exact, strict=True)):
        verdict = judge(g, e, Yardstick(x))
        ok = ok and verdict.ok
        lines.append(f"out {k}: {verdict.line}")
    return Outcome(ok, "; ".join(lines), eager_ops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m irc.testing.torchgen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-steps", type=int, default=7, help="torch calls a program draws at most")
    ap.add_argument("--entry", choices=["compile", "dynamo"], default="compile",
                    help='irc.compile, or torch.compile(backend="irc")')  # fmt: skip
    ap.add_argument("--show", type=int, metavar="SEED", help="print one program and exit")
    args = ap.parse_args(argv)
    if args.show is not None:
        print(Generator(args.show, max_steps=args.max_steps).program().text())
        return 0
    failing = 0
    eager: dict[str, int] = {}
    start = time.monotonic()
    for seed in range(args.seed, args.seed + args.count):
        try:
            outcome = check(seed, args.device, args.max_steps, args.entry)
        except Exception as e:  # a crash is a finding too
            outcome = Outcome(False, f"{type(e).__name__}: {e}", {})
        for op, n in outcome.eager_ops.items():
            eager[op] = eager.get(op, 0) + n
        if not outcome.ok:
            failing += 1
            text = Generator(seed, max_steps=args.max_steps).program().text()
            print(f"seed {seed}: {outcome.line}\n{text}\n", flush=True)
    print(f"{args.count} programs, {failing} failing, {time.monotonic() - start:.0f} s")
    if eager:
        print("left to eager:", ", ".join(f"{op} x{n}" for op, n in sorted(eager.items())))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
