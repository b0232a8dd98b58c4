"""Compile time at scale: `irc-opt --fuse --emit triton` on generated graphs.

    python benchmarks/compile_speed.py [--sizes 1000 10000] [--seed 0]

Each graph is a random DAG of element-wise ops (with broadcast operands),
row reductions and their epilogues, casts and matmuls, over 256x256 tensors.
The script prints the time of each stage per size and the growth ratio of the
largest size to the smallest; a fusion search or lowering that is quadratic
shows up as a ratio near the square of the size ratio.
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def generate(n_ops: int, seed: int = 0) -> str:
    """A valid graph-level function with about `n_ops` ops."""
    rng = random.Random(seed)
    lines = [
        "func @big(%x: tensor<256x256xf32>, %y: tensor<256x256xf32>, %b: tensor<256xf32>) -> tensor<256x256xf32> {"
    ]
    full = ["%x", "%y"]
    count = 0

    def fresh() -> str:
        nonlocal count
        count += 1
        return f"%v{count}"

    unary = ["exp", "tanh", "sigmoid", "relu", "neg", "abs", "sin", "silu"]
    binary = ["add", "sub", "mul", "maximum", "minimum"]
    while count < n_ops:
        pick = rng.random()
        recent = full[-8:]
        if pick < 0.4:
            v = fresh()
            lines.append(f"  {v} = graph.{rng.choice(unary)} {rng.choice(recent)}")
            full.append(v)
        elif pick < 0.75:
            v = fresh()
            other = "%b" if rng.random() < 0.2 else rng.choice(full)
            lines.append(f"  {v} = graph.{rng.choice(binary)} {rng.choice(recent)}, {other}")
            full.append(v)
        elif pick < 0.9:
            src = rng.choice(recent)
            r, e, d = fresh(), fresh(), fresh()
            kind = rng.choice(["reduce_sum", "reduce_max", "reduce_mean"])
            lines.append(f"  {r} = graph.{kind} {src} {{dims = [1], keepdim = true}}")
            lines.append(f"  {e} = graph.sub {src}, {r}")
            lines.append(f"  {d} = graph.mul {e}, {rng.choice(recent)}")
            full.append(d)
        elif pick < 0.95:
            src = rng.choice(recent)
            h, f = fresh(), fresh()
            lines.append(f"  {h} = graph.cast {src} : tensor<256x256xf16>")
            lines.append(f"  {f} = graph.cast {h} : tensor<256x256xf32>")
            full.append(f)
        else:
            v = fresh()
            lines.append(f"  {v} = graph.matmul {rng.choice(recent)}, {rng.choice(full)}")
            full.append(v)
    lines.append(f"  return {full[-1]} : tensor<256x256xf32>")
    lines.append("}")
    return "\n".join(lines) + "\n"


def measure(n_ops: int, seed: int) -> dict[str, float]:
    """Seconds of each stage of `irc-opt --fuse --emit triton`."""
    import irc
    from irc.compiler import triton_source

    text = generate(n_ops, seed)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    module = irc.parse(text, f"<generated {n_ops}>")
    irc.verify(module)
    times["parse+verify"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    irc.run_pipeline(module, "fuse")
    times["fuse"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    source = triton_source(module)
    times["lower+emit"] = time.perf_counter() - t2
    times["total"] = time.perf_counter() - t0
    times["kernels"] = source.count("@triton.jit") - 5  # less the shared helpers
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = []
    print(
        f"{'ops':>7} {'parse+verify s':>15} {'fuse s':>9} {'lower+emit s':>13} {'total s':>9} {'kernels':>8}"
    )
    for n in args.sizes:
        t = measure(n, args.seed)
        rows.append((n, t))
        print(
            f"{n:>7} {t['parse+verify']:>15.2f} {t['fuse']:>9.2f} {t['lower+emit']:>13.2f} "
            f"{t['total']:>9.2f} {int(t['kernels']):>8}",
            flush=True,
        )
    (n0, t0), (n1, t1) = rows[0], rows[-1]
    print(f"time({n1}) / time({n0}) = {t1['total'] / t0['total']:.2f} (sizes x{n1 / n0:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
