"""Compile time at scale: `irc-opt --fuse --emit triton` on generated graphs.

    python benchmarks/compile_speed.py [--sizes 1000 10000] [--seed 0] [--shape local] [--repeat 3]

Each graph is a random DAG of element-wise ops (with broadcast operands),
row reductions and their epilogues, casts and matmuls, over 256x256 tensors.
The script prints the time of each stage per size (of the fastest of
`--repeat` compiles: a single one moved by up to 50% on a shared host) and
the growth ratio of the largest size to the smallest; a fusion search or
lowering that is quadratic shows up as a ratio near the square of the size
ratio.

--shape picks how ops choose their operands:
  local       one operand among the last 8 values, the other from anywhere (default)
  long-edges  every operand uniformly among all earlier values (edges span the graph)
  fan-out     as local, but half of the other operands are one of 2 hub values
              (each read by a tenth of all ops: hundreds, then thousands)
  reductions  as local, with 3 times as many reductions and their epilogues
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

SHAPES = ("local", "long-edges", "fan-out", "reductions")


def generate(n_ops: int, seed: int = 0, shape: str = "local") -> str:
    """A valid graph-level function with about `n_ops` ops (`shape`: see the module doc)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
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
    # Probabilities of unary, binary, reduction and cast steps (the rest: matmuls).
    steps = (0.25, 0.45, 0.9, 0.95) if shape == "reductions" else (0.4, 0.75, 0.9, 0.95)
    hubs: list[str] = []
    while count < n_ops:
        pick = rng.random()
        recent = full if shape == "long-edges" else full[-8:]
        if shape == "fan-out" and len(hubs) < 2 and len(full) >= 8 * (len(hubs) + 1):
            hubs.append(full[-1])
        if pick < steps[0]:
            v = fresh()
            lines.append(f"  {v} = graph.{rng.choice(unary)} {rng.choice(recent)}")
            full.append(v)
        elif pick < steps[1]:
            v = fresh()
            if rng.random() < 0.2:
                other = "%b"
            elif hubs and rng.random() < 0.5:
                other = rng.choice(hubs)
            else:
                other = rng.choice(full)
            lines.append(f"  {v} = graph.{rng.choice(binary)} {rng.choice(recent)}, {other}")
            full.append(v)
        elif pick < steps[2]:
            src = rng.choice(recent)
            r, e, d = fresh(), fresh(), fresh()
            kind = rng.choice(["reduce_sum", "reduce_max", "reduce_mean"])
            lines.append(f"  {r} = graph.{kind} {src} {{dims = [1], keepdim = true}}")
            lines.append(f"  {e} = graph.sub {src}, {r}")
            lines.append(f"  {d} = graph.mul {e}, {rng.choice(recent)}")
            full.append(d)
        elif pick < steps[3]:
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


def measure(n_ops: int, seed: int, shape: str = "local") -> dict[str, float]:
    """Seconds of each stage of `irc-opt --fuse --emit triton`."""
    import irc
    from irc.compiler import triton_source
    from irc.gcpause import paused_gc

    text = generate(n_ops, seed, shape)
    times: dict[str, float] = {}
    gc.collect()  # the garbage of an earlier compile is not this one's to pay for
    with paused_gc():  # as irc-opt runs
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
    times["kernels"] = source.count("@triton.jit")  # helpers live in irc.runtime
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=SHAPES, default="local", help="how operands are chosen")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per size; the fastest counts")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    rows = []
    print(
        f"{'ops':>7} {'parse+verify s':>15} {'fuse s':>9} {'lower+emit s':>13} {'total s':>9} {'kernels':>8}"
    )
    for n in args.sizes:
        t = min((measure(n, args.seed, args.shape) for _ in range(args.repeat)), key=lambda m: m["total"])
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
