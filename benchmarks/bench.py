"""irc against torch eager and torch.compile on the fusion workloads (GPU).

    python benchmarks/bench.py [--only NAME ...] [--markdown FILE] [--json FILE]

Each workload is an `.ir` file in benchmarks/workloads and the same function
written in torch. Times are `triton.testing.do_bench` medians (GPU time), each
the median of four, with eager, torch.compile and irc timed in turns; the
64x64 row also reports wall-clock time a call, which is what launch overhead
costs. The floor of a memory-bound row is its fewest bytes (inputs read once,
outputs written once) over the measured device-to-device copy bandwidth; the
floor of the matmul row is the bare bf16 torch.mm of its operands, timed in
turns with the others.
Kernel counts come from the profiler (CUDA kernels launched by one call).
Cold compile is parse (or trace) to first result, Triton's JIT included, in a
process whose caches were emptied first (see --fresh-caches).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS_DIR = HERE / "workloads"


@dataclass
class Workload:
    name: str
    inputs: Callable[[Any], list[Any]]
    torch_fn: Callable[..., Any]
    kind: str = "memory"  # "memory", "matmul" or "launch"


def _workloads() -> list[Workload]:
    import torch

    big = (8192, 8192)

    def randn(*shape: int, dtype: Any = torch.float32) -> Callable[[Any], Any]:
        return lambda dev: torch.randn(*shape, device=dev, dtype=dtype)

    def make(*makers: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
        return lambda dev: [m(dev) for m in makers]

    def pw5(x: Any, y: Any) -> Any:
        return torch.sigmoid(torch.relu((x + y) * 2.0) - 1.0)

    def mul_add_relu(x: Any, y: Any, b: Any) -> Any:
        return torch.relu(x * y + b)

    def sincos(x: Any) -> Any:
        return torch.sin(x), torch.cos(x)

    def chain20(x: Any) -> Any:
        for _ in range(10):
            x = torch.tanh(x * 1.01 + 0.5)
        return x

    def softmax(x: Any) -> Any:
        m = x.amax(1, keepdim=True)
        e = torch.exp(x - m)
        return e / e.sum(1, keepdim=True)

    def layernorm(x: Any, w: Any, b: Any) -> Any:
        mean = x.mean(1, keepdim=True)
        c = x - mean
        var = (c * c).mean(1, keepdim=True)
        return c * torch.rsqrt(var + 1e-5) * w + b

    def mse(x: Any, y: Any) -> Any:
        d = x - y
        return (d * d).mean()

    def xyz_sum(x: Any, y: Any, z: Any) -> Any:
        return (x * y + z).sum(1)

    def mm_bias_relu(x: Any, w: Any, b: Any) -> Any:
        return torch.relu(x @ w + b)

    def small_chain(x: Any) -> Any:
        return torch.relu(x * 1.5 - 0.25)

    bf16 = torch.bfloat16
    return [
        Workload("pw5", make(randn(*big), randn(*big)), pw5),
        Workload("mul_add_relu", make(randn(*big), randn(*big), randn(8192)), mul_add_relu),
        Workload("sincos", make(randn(*big)), sincos),
        Workload("chain20", make(randn(*big)), chain20),
        Workload("softmax", make(randn(*big)), softmax),
        Workload("layernorm", make(randn(*big), randn(8192), randn(8192)), layernorm),
        Workload("mse", make(randn(*big), randn(*big)), mse),
        Workload("xyz_sum", make(randn(*big), randn(*big), randn(*big)), xyz_sum),
        Workload(
            "mm_bias_relu",
            make(
                randn(4096, 4096, dtype=bf16),
                randn(4096, 4096, dtype=bf16),
                randn(4096, dtype=bf16),
            ),
            mm_bias_relu,
            "matmul",
        ),
        Workload("small_chain", make(randn(64, 64)), small_chain, "launch"),
    ]


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, tuple) else [result]


def _bytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def kernel_count(fn: Callable[[], Any]) -> int:
    """CUDA kernels one call launches (from the profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def wall_per_call(fn: Callable[[], Any], n: int = 2000) -> float:
    """Wall-clock microseconds a call, back to back (launch overhead included)."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def interleaved_medians(
    fns: dict[str, Callable[[], Any]], rounds: int = 4, timer: Callable[..., float] | None = None
) -> dict[str, float]:
    """Median of `rounds` timings of each function, taken in turns.

    A GPU's clock drifts with its temperature and power draw (a bf16 GEMM holds
    an H200 at its 700 W limit): timing one function after another would credit
    the first with a cooler GPU. Taken in turns, every other round reversed,
    each function sees the same conditions (the autotuner does the same).
    """
    from irc.autotune import time_in_turns

    if timer is None:
        from triton.testing import do_bench as timer
    return time_in_turns(list(fns), lambda name: timer(fns[name]), rounds)


def copy_bandwidth() -> float:
    """Bytes a second of a large device-to-device copy (read + write)."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300)
    return 2 * src.numel() * 4 / (ms * 1e-3)


def matmul_rate() -> tuple[float, float]:
    """bf16 FLOP/s of torch.mm at 4096^3, and its time in ms."""
    import torch
    from triton.testing import do_bench

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=50, rep=300)
    return 2 * 4096**3 / (ms * 1e-3), ms


def correctness(
    path: Path, name: str, args: list[Any], got: list[Any], want: list[Any]
) -> dict[str, Any]:
    """irc's outputs against torch eager's by `irc.testing.verdict.judge`, the rule of `irc-run
    --check`: within assert_close, or no further from the program computed in f64 than
    4x torch's own distance from it (over a few summation orders; docs/testing.md).

    `correct`, the largest max abs errors from f64 of irc and of torch, and the
    verdict line of each output.
    """
    import irc
    from irc.testing.reference import functions
    from irc.testing.verdict import judge, yardsticks

    fn = functions(irc.parse(path.read_text(), str(path)))[name]
    sticks = yardsticks(fn, args)
    verdicts = [judge(g, e, s) for g, e, s in zip(got, want, sticks, strict=True)]
    return {
        "correct": all(v.ok for v in verdicts),
        "max_abs_err": max((v.irc.abs for v in verdicts if v.irc), default=0.0),
        "eager_max_abs_err": max((v.torch.abs for v in verdicts if v.torch), default=0.0),
        "verdicts": [v.line for v in verdicts],
    }


def measure(w: Workload, bw: float, autotune: bool = False) -> dict[str, Any]:
    """One row of the table."""
    import torch

    import irc

    args = w.inputs("cuda")
    path = WORKLOADS_DIR / f"{w.name}.ir"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    compiled = irc.compile(path, device="cuda", autotune=autotune)
    irc_fn = compiled[w.name]
    got = _outputs(irc_fn(*args))
    torch.cuda.synchronize()
    irc_cold = time.perf_counter() - t0

    torch._dynamo.reset()
    t0 = time.perf_counter()
    tc_fn = torch.compile(w.torch_fn)
    tc_out = _outputs(tc_fn(*args))
    torch.cuda.synchronize()
    tc_cold = time.perf_counter() - t0

    want = _outputs(w.torch_fn(*args))
    verdict = correctness(path, w.name, args, got, want)
    del tc_out

    timed = {
        "eager": lambda: w.torch_fn(*args),
        "compile": lambda: tc_fn(*args),
        "irc": lambda: irc_fn(*args),
    }
    if w.kind == "matmul":
        timed["torch.mm"] = lambda: args[0] @ args[1]
    ms = interleaved_medians(timed)
    eager_ms, tc_ms, irc_ms = ms["eager"], ms["compile"], ms["irc"]
    floor_ms: float | None = None  # a 64x64 call is all launch: a byte floor says nothing
    if w.kind == "matmul":
        floor_ms = ms["torch.mm"]  # its FLOPs at the bare matmul's rate, timed in turns with irc
    elif w.kind == "memory":
        floor_ms = (_bytes(args) + _bytes(want)) / bw * 1e3
    row: dict[str, Any] = {
        "workload": w.name,
        "eager_ms": eager_ms,
        "compile_ms": tc_ms,
        "irc_ms": irc_ms,
        "irc_over_compile": irc_ms / tc_ms,
        "irc_over_floor": irc_ms / floor_ms if floor_ms else None,
        "kernels_eager": kernel_count(lambda: w.torch_fn(*args)),
        "kernels_compile": kernel_count(lambda: tc_fn(*args)),
        "kernels_irc": kernel_count(lambda: irc_fn(*args)),
        "cold_compile_s": tc_cold,
        "cold_irc_s": irc_cold,
        **verdict,
    }
    if w.kind == "matmul":
        row["irc_over_torch_mm"] = irc_ms / floor_ms
        row["torch_mm_ms"] = floor_ms
    if w.kind == "launch":
        row["wall_us_eager"] = wall_per_call(lambda: w.torch_fn(*args))
        row["wall_us_compile"] = wall_per_call(lambda: tc_fn(*args))
        row["wall_us_irc"] = wall_per_call(lambda: irc_fn(*args))
        graphed = irc.compile(path, device="cuda", cuda_graphs=True)[w.name]
        row["wall_us_irc_graph"] = wall_per_call(lambda: graphed(*args))
    return row


def run(only: list[str] | None, autotune: bool = False) -> dict[str, Any]:
    import torch
    import triton

    from irc.target import cuda_target

    torch.manual_seed(0)
    target = cuda_target()
    print(f"irc target: {target.tile_pass()} ({target.reason})", flush=True)
    bw = copy_bandwidth()
    mm_rate, _ = matmul_rate()
    rows: list[dict[str, Any]] = []
    for w in _workloads():
        if only and w.name not in only:
            continue
        row = measure(w, bw, autotune)
        rows.append(row)
        print(format_row(row), flush=True)
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "copy_bandwidth_GBps": bw / 1e9,
        "bf16_mm_TFLOPs": mm_rate / 1e12,
        "autotune": autotune,
        "irc_target": f"{target.tile_pass()} ({target.reason})",
        "rows": rows,
    }


COLUMNS = [
    ("workload", "{:<13}"),
    ("eager_ms", "{:>9.3f}"),
    ("compile_ms", "{:>10.3f}"),
    ("irc_ms", "{:>9.3f}"),
    ("irc_over_compile", "{:>8.3f}"),
    ("irc_over_floor", "{:>8.3f}"),
    ("kernels_eager", "{:>4}"),
    ("kernels_compile", "{:>4}"),
    ("kernels_irc", "{:>4}"),
    ("cold_compile_s", "{:>8.2f}"),
    ("cold_irc_s", "{:>8.2f}"),
]
HEADER = (
    f"{'workload':<13} {'eager ms':>9} {'compile ms':>10} {'irc ms':>9} {'irc/tc':>8} "
    f"{'irc/flr':>8} {'k.e':>4} {'k.tc':>4} {'k.irc':>4} {'cold tc':>8} {'cold irc':>8}"
)


def row_notes(row: dict[str, Any]) -> list[str]:
    """What a row says beyond its columns (the table's and the terminal's notes)."""
    notes = []
    if "irc_over_torch_mm" in row:
        notes.append(f"irc/bare torch.mm {row['irc_over_torch_mm']:.3f}")
    if "wall_us_irc" in row:
        notes.append(
            f"wall µs/call: eager {row['wall_us_eager']:.1f}, compile {row['wall_us_compile']:.1f}, "
            f"irc {row['wall_us_irc']:.1f}, irc with CUDA graph {row['wall_us_irc_graph']:.1f}"
        )
    if not row["correct"]:
        notes.append(
            f"MISMATCH max abs err {row['max_abs_err']:.3g} (eager {row['eager_max_abs_err']:.3g})"
        )
    return notes


def _cell(value: Any, fmt: str) -> str:
    if value is None:  # no floor
        return fmt.replace(".3f", "").format("—")
    return fmt.format(value)


def format_row(row: dict[str, Any]) -> str:
    text = " ".join(_cell(row[key], fmt) for key, fmt in COLUMNS)
    notes = row_notes(row)
    return text + ("  " + "; ".join(notes) if notes else "")


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Device: {result['device']}; torch {result['torch']}, triton {result['triton']}, "
        f"Python {result['python']}; {result['date']}. Copy bandwidth "
        f"{result['copy_bandwidth_GBps']:.0f} GB/s, bf16 torch.mm {result['bf16_mm_TFLOPs']:.0f} TFLOP/s.",
        f"irc's tiling options: {result.get('irc_target', 'tile (default)')}.",
        "",
        "| workload | eager ms | torch.compile ms | irc ms | irc/compile | irc/floor | kernels eager/compile/irc | cold compile s (torch.compile / irc) | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        notes = row_notes(r)
        lines.append(
            f"| {r['workload']} | {r['eager_ms']:.3f} | {r['compile_ms']:.3f} | {r['irc_ms']:.3f} "
            f"| {r['irc_over_compile']:.3f} | {_cell(r['irc_over_floor'], '{:.3f}')} "
            f"| {r['kernels_eager']}/{r['kernels_compile']}/{r['kernels_irc']} "
            f"| {r['cold_compile_s']:.2f} / {r['cold_irc_s']:.2f} | {'; '.join(notes)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    ap.add_argument("--json", help="also write the raw results as JSON here")
    ap.add_argument("--autotune", action="store_true", help="compile irc's kernels with autotuning")
    ap.add_argument(
        "--fresh-caches",
        action="store_true",
        help="point Triton's, Inductor's and irc's caches at empty folders first (cold compiles)",
    )
    args = ap.parse_args(argv)
    if args.fresh_caches:  # before torch and triton read them
        root = tempfile.mkdtemp(prefix="irc-bench-")
        os.environ["TRITON_CACHE_DIR"] = f"{root}/triton"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
        os.environ["IRC_CACHE_DIR"] = f"{root}/irc"
    import torch

    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU", file=sys.stderr)
        return 1
    print(HEADER, flush=True)
    result = run(args.only, args.autotune)
    if args.markdown:
        Path(args.markdown).write_text(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if all(r["correct"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
