"""`irc-run`: run graph-level functions on random inputs with the PyTorch reference.

    irc-run FILE.ir                           # every function, seed 0, on the CPU
    irc-run FILE.ir --fn softmax --seed 3     # one function, other inputs
    irc-run FILE.ir --device cuda

For each function and each of its outputs it prints the shape, the dtype and
summary statistics, so that two runs (or a run and a compiled kernel) can be
compared at a glance.

Exit status: 0 success, 1 the input, the command line or the request has errors (printed as
diagnostics: a bad file, an unknown --fn, no CUDA, not enough memory), 2 an
internal error in irc (one line; --debug shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import SSAValue

from irc.analysis.verifier import verify
from irc.compiler import CompiledModule
from irc.compiler import compile as compile_module
from irc.ir.types import format_type, numel, shape_of
from irc.runtime.progress import PROGRESS_ENV
from irc.syntax.diagnostics import Diagnostic, IrcError, SourceManager, op_location
from irc.syntax.parser import parse, read_source
from irc.testing.reference import (
    IndexOutOfRangeError,
    UnsupportedOpError,
    dtype_name,
    estimate_peak_bytes,
    functions,
    is_out_of_memory,
    random_inputs,
    run_function,
    value_bytes,
)
from irc.testing.verdict import ORDERS, Yardstick, judge, one_torch_thread, yardsticks
from irc.tools.cli import ArgumentParser, add_version

PROG = "irc-run"

MAX_SEED = 2**64 - 1
"""The largest seed torch's random generators take."""

MEMORY_HEADROOM = 0.9
"""Use at most this share of the free memory: the estimate is not exact and
the OOM killer gives no second chance."""


def make_arg_parser() -> argparse.ArgumentParser:
    """The command line; later flags (`--check`, `--no-fuse`) are added here."""
    ap = ArgumentParser(
        prog=PROG,
        description="Run the functions of an .ir file on random inputs with the "
        "PyTorch reference semantics and summarize their outputs.",
    )
    add_version(ap)
    ap.add_argument("input", help="input .ir file ('-' for stdin)")
    ap.add_argument("--fn", metavar="NAME", help="run only this function (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    ap.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="where to run (default: cpu)"
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="also compile with irc and compare against the reference (exit 1 on a mismatch)",
    )
    ap.add_argument(
        "--no-fuse", action="store_true", help="with --check: compile without fusion, to compare"
    )
    ap.add_argument(
        "--progress",
        action="store_true",
        help="a progress bar on stderr for kernels on Triton's interpreter even when "
        "stderr is not a terminal (IRC_PROGRESS=1; on a terminal it is shown anyway)",
    )
    ap.add_argument(
        "--debug", action="store_true", help="show Python tracebacks of internal errors"
    )
    return ap


# --- one function -----------------------------------------------------------------


@dataclass
class FunctionRun:
    """What running one function produced; later steps (e.g. --check) read it."""

    fn: func.FuncOp
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    notes: list[str] = field(default_factory=list[str])

    @property
    def name(self) -> str:
        return self.fn.sym_name.data


class Runner:
    """One irc-run invocation; kept apart from argv handling for tests and reuse."""

    def __init__(self, args: argparse.Namespace, out: TextIO):
        self.args = args
        self.out = out
        self.sources = SourceManager()
        self.filename = args.input if args.input != "-" else "<stdin>"
        self._compiled: CompiledModule | None = None

    def load(self) -> ModuleOp:
        text = read_source(self.args.input)
        self.sources.add(self.filename, text)
        module = parse(text, self.filename)
        verify(module)
        return module

    def select(self, module: ModuleOp) -> list[func.FuncOp]:
        fns = functions(module)
        if self.args.fn is None:
            return list(fns.values())
        name = self.args.fn.removeprefix("@")
        if name not in fns:
            known = ", ".join("@" + n for n in fns) or "none"
            raise IrcError(
                Diagnostic(None, f"no function @{name} in {self.filename} (available: {known})")
            )
        return [fns[name]]

    def check_graph_level(self, fn: func.FuncOp) -> None:
        """The reference runs the graph level only: tensors in, tensors out."""
        types = [*fn.function_type.inputs.data, *fn.function_type.outputs.data]
        other = next((t for t in types if not isinstance(t, TensorType)), None)
        if other is not None:
            raise IrcError(
                Diagnostic(
                    op_location(fn),
                    f"irc-run runs graph-level functions only; @{fn.sym_name.data} "
                    f"takes or returns {format_type(other)} (lower-level IR?)",
                )
            )

    def device(self) -> torch.device:
        if self.args.device == "cuda" and not torch.cuda.is_available():
            why = (
                "this PyTorch build has no CUDA support"
                if torch.version.cuda is None
                else "no CUDA device is visible"
            )
            raise IrcError(Diagnostic(None, f"--device cuda: {why}; use --device cpu"))
        return torch.device(self.args.device)

    def check_memory(self, fn: func.FuncOp, device: torch.device) -> None:
        """Refuses, located at the function, a function whose tensors cannot fit.

        Allocating them anyway would end in a MemoryError at best and, on Linux,
        in the OOM killer at worst (no message at all).
        """
        need = estimate_peak_bytes(fn) + _stats_bytes(fn)
        free = available_bytes(device)
        if need > free * MEMORY_HEADROOM:
            inputs = sum(value_bytes(a) for a in fn.body.block.args)
            raise IrcError(
                Diagnostic(
                    op_location(fn),
                    f"@{fn.sym_name.data} needs about {format_bytes(need)} of memory on "
                    f"{device.type} (inputs {format_bytes(inputs)}), but only "
                    f"{format_bytes(free)} is available",
                )
            )
        if device.type != "cpu":
            # Inputs are drawn on the host one at a time, then moved.
            largest = max((value_bytes(a) for a in fn.body.block.args), default=0)
            host = available_bytes(torch.device("cpu"))
            if largest > host * MEMORY_HEADROOM:
                raise IrcError(
                    Diagnostic(
                        op_location(fn),
                        f"@{fn.sym_name.data}: an input of {format_bytes(largest)} does not fit "
                        f"in the {format_bytes(host)} of free host memory",
                    )
                )

    def run_reference(self, fn: func.FuncOp, device: torch.device) -> FunctionRun:
        inputs = random_inputs(fn, seed=self.args.seed, device=device)
        try:
            outputs = run_function(fn, inputs, device)
        except IndexOutOfRangeError as e:
            raise IrcError(Diagnostic(op_location(e.op), str(e))) from None
        except UnsupportedOpError as e:
            raise IrcError(
                Diagnostic(
                    op_location(e.op),
                    f"irc-run evaluates graph-level IR only; '{e.op.name}' is not a graph op",
                )
            ) from None
        return FunctionRun(fn, inputs, outputs)

    def report(self, result: FunctionRun, device: torch.device) -> None:
        ret = result.fn.body.block.last_op
        values = list(ret.operands) if ret is not None else []
        self.out.write(f"@{result.name} (seed {self.args.seed}, {device.type})\n")
        if not result.outputs:
            self.out.write("  no outputs\n")
        for i, x in enumerate(result.outputs):
            hint = values[i].name_hint if i < len(values) else None
            label = f"out {i}" + (f" %{hint}" if hint else "")
            self.out.write(f"  {label}: {summarize(x)}\n")
        for note in result.notes:
            self.out.write(f"  {note}\n")

    def process(self, fn: func.FuncOp, device: torch.device) -> int:
        """Runs one function and prints its report; returns its exit status."""
        result = self.run_reference(fn, device)
        self.report(result, device)
        if self.args.check:
            return self.check(result, device)
        return 0

    def compiled(self, device: torch.device) -> CompiledModule:
        """The whole file compiled once (fused unless --no-fuse) for `device`."""
        if self._compiled is None:
            self._compiled = compile_module(
                self.module, device=device.type, fuse=not self.args.no_fuse
            )
        return self._compiled

    def check(self, result: FunctionRun, device: torch.device) -> int:
        """--check: irc's kernels against the reference on the same inputs.

        The verdict is `irc.testing.verdict.judge`'s: within assert_close of torch, or no
        further from the program computed in f64 than 4x torch's own distance
        from it (over a few summation orders). Those extra runs happen only
        when some output needs them.
        """
        compiled = self.compiled(device)
        got = compiled.run(result.name, result.inputs)
        mode = "unfused" if self.args.no_fuse else "fused"
        self.out.write(f"  check ({mode}, {compiled.kernel_count} kernels in the file):\n")
        sticks = _Yardsticks(result, device)
        status = 0
        for i, (g, want) in enumerate(zip(got, result.outputs, strict=True)):
            verdict = judge(g, want, lambda i=i: sticks.get(i))
            if not verdict.ok:
                status = 1
            self.out.write(f"    out {i}: {verdict.line}\n")
        if sticks.skipped:
            self.out.write(f"    {sticks.skipped}\n")
        return status

    def main(self) -> int:
        module = self.load()
        self.module = module
        fns = self.select(module)
        device = self.device()
        for fn in fns:
            self.check_graph_level(fn)
            self.check_memory(fn, device)
        status = 0
        for fn in fns:
            try:
                status = max(status, self.process(fn, device))
            except Exception as e:
                if is_out_of_memory(e):
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise IrcError(
                        Diagnostic(
                            op_location(fn),
                            f"ran out of memory on {device.type} while running "
                            f"@{fn.sym_name.data}: {first}",
                        )
                    ) from None
                raise
            finally:
                self.out.flush()
        return status


class _Yardsticks:
    """The function's f64 outputs and torch's in other summation orders, made at most
    once and only if some output's verdict needs them.

    Runs that would not fit in memory are skipped (`skipped` says why): the
    verdicts then rest on assert_close alone.
    """

    def __init__(self, result: FunctionRun, device: torch.device):
        self.result = result
        self.device = device
        self.sticks: list[Yardstick] | None = None
        self.skipped = ""

    def get(self, i: int) -> Yardstick | None:
        if self.sticks is None and not self.skipped:
            fn = self.result.fn
            outputs = sum(value_bytes(v) for v in _returned(fn))
            need = estimate_peak_bytes(fn, wide=True) + estimate_peak_bytes(fn)
            need += ORDERS * outputs
            free = available_bytes(self.device)
            if need > free * MEMORY_HEADROOM:
                self.skipped = (
                    f"no f64 reference: it needs about {format_bytes(need)} on "
                    f"{self.device.type}, {format_bytes(free)} is free"
                )
                return None
            self.sticks = yardsticks(fn, self.result.inputs, self.device)
        return None if self.sticks is None else self.sticks[i]


def _returned(fn: func.FuncOp) -> list[SSAValue]:
    ret = fn.body.block.last_op
    return list(ret.operands) if ret is not None else []


# --- statistics -------------------------------------------------------------------


STATS_CHUNK = 1 << 18
"""Elements summarized at a time, on one thread: statistics of a huge output need
little memory, and the chunk's f64 copy (2 MiB) stays in cache (a 16M-element
chunk's 128 MiB copies cost more in page faults than in arithmetic)."""


def summarize(x: torch.Tensor) -> str:
    """`shape=[4, 8] dtype=f32 min=.. max=.. mean=.. std=..` (NaN/inf counted apart).

    One pass over the chunks: each chunk's sum of squared deviations from its
    own mean, combined as Chan et al. do (stabler than E[x^2] - mean^2).
    """
    head = f"shape={list(x.shape)} dtype={dtype_name(x.dtype)}"
    flat = x.reshape(-1)
    if x.dtype == torch.bool:
        return f"{head} true={int(flat.sum().item())}/{x.numel()}"
    count, total = 0, 0.0
    mean, squares = 0.0, 0.0  # running mean and sum of squared deviations
    lo: float | int | None = None
    hi: float | int | None = None
    nan = pos = neg = 0
    with one_torch_thread():  # chunks too small to share among threads
        for i in range(0, flat.numel(), STATS_CHUNK):
            c = flat[i : i + STATS_CHUNK]
            if x.dtype.is_floating_point:
                finite = torch.isfinite(c)
                if not bool(finite.all()):
                    nan += int(torch.isnan(c).sum().item())
                    pos += int((c == float("inf")).sum().item())
                    neg += int((c == float("-inf")).sum().item())
                    c = c[finite]
            if c.numel() == 0:
                continue
            # min/max in the tensor's own dtype: exact for i64 beyond 2**53.
            c_lo, c_hi = c.min().item(), c.max().item()
            lo = c_lo if lo is None else min(lo, c_lo)
            hi = c_hi if hi is None else max(hi, c_hi)
            d = c.double()
            n = d.numel()
            c_total = d.sum().item()
            c_mean = c_total / n
            c_squares = (d - c_mean).square_().sum().item()
            delta = c_mean - mean
            mean += delta * n / (count + n)
            squares += c_squares + delta * delta * count * n / (count + n)
            count += n
            total += c_total
    extra = [f"{k}={v}" for k, v in (("nan", nan), ("+inf", pos), ("-inf", neg)) if v]
    if lo is None or hi is None:
        return " ".join([head, "no finite values", *extra])
    if x.numel() == 1:
        return f"{head} value={_num(lo)}"
    std = (squares / count) ** 0.5
    stats = f"min={_num(lo)} max={_num(hi)} mean={_num(total / count)} std={_num(std)}"
    return " ".join([head, stats, *extra])


def _num(v: float | int) -> str:
    """Integers exactly, floats to 6 significant digits."""
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def _stats_bytes(fn: func.FuncOp) -> int:
    """Temporaries of `summarize`: a few f64 copies of one chunk."""
    outputs = fn.function_type.outputs.data
    largest = max((numel(shape_of(t)) for t in outputs), default=0)
    return min(largest, STATS_CHUNK) * 32


# --- memory -----------------------------------------------------------------------


def available_bytes(device: torch.device) -> int:
    """Free memory on `device`: the GPU's free memory, or the host's within its cgroup."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_host_bytes()


def available_host_bytes() -> int:
    """MemAvailable from /proc/meminfo, lowered to the cgroup limit in a container."""
    import os

    candidates: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    limit = _cgroup_room()
    if limit is not None:
        candidates.append(limit)
    return min(candidates) if candidates else 1 << 62


def _cgroup_room() -> int | None:
    """Bytes left under the cgroup memory limit (v2, then v1), or None if unlimited."""
    pairs = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_path, usage_path in pairs:
        try:
            with open(limit_path) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            limit = int(raw)
            if limit >= 1 << 60:  # v1 spells "unlimited" as a huge number
                return None
            with open(usage_path) as f:
                usage = int(f.read().strip())
            return max(limit - usage, 0)
        except (OSError, ValueError):
            continue
    return None


def format_bytes(n: int | float) -> str:
    """`3.6 TiB`: sizes for people."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# --- main -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """The console script; returns the exit status (0, 1 or 2)."""
    args = make_arg_parser().parse_args(argv)
    if not 0 <= args.seed <= MAX_SEED:
        # torch's generators take 0..2**64-1 (a negative seed would alias a large one).
        sys.stderr.write(f"{PROG}: error: --seed must be from 0 to 2**64-1, got {args.seed}\n")
        return 1
    if args.progress:
        os.environ[PROGRESS_ENV] = "1"
    runner: Runner | None = None
    try:
        runner = Runner(args, stdout or sys.stdout)
        return runner.main()
    except IrcError as e:
        sources = runner.sources if runner is not None else SourceManager()
        for d in e.diagnostics:
            text = sources.format(d)
            sys.stderr.write((f"{PROG}: {text}" if d.location is None else text) + "\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        return _internal_error(e, args.debug)


def _internal_error(e: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    sys.stderr.write(
        f"{PROG}: internal error: {type(e).__name__}: {first}"
        + ("" if debug else " (run with --debug for the traceback)")
        + "\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
