"""Grammar-aware fuzzing of the loop and tile levels, where IR can be written by hand.

The graph level is fuzzed by tests/test_fuzz.py; below it a file describes
kernels, so a mistake the verifier lets through is a wrong memory access or
generated Python that does something else. This module:

1. makes valid loop- and tile-level programs by lowering random graphs
   (`irc.testing.graphgen`) and the examples through real pipelines and printing them,
   and graph-level ones in `graph.fused` groups, as a user could write them;
2. mutates them token by token, knowing the grammar: op names swapped, numbers
   made 0, -1, 2**31, 2**63..., lists (`bounds`, `grid`, `block`, `shape`)
   grown, shrunk and emptied, values and symbols renamed, operands dropped and
   repeated (a mask removed), strings replaced by quotes, newlines and
   `__import__`, regions nested deeper, types, ranks and element types changed,
   attributes dropped, added and repeated;
3. runs each mutant through `irc-opt FILE --emit triton` (and `irc-opt FILE`,
   whose output must print back identically) in a forked child whose cwd is an
   empty folder, and asserts: exit status 0 or 1, no traceback, no internal
   error, every error at `FILE:LINE:COL` inside the file, no file written;
4. compiles and runs some mutants that verify, on Triton's interpreter with a
   guard on every load and store: an access outside the buffers a launch
   passed is reported (the verifier's bounds proof missed it), as is any
   exception while running.

Children are forked from a process that has already imported irc, so a case
costs milliseconds; a crash (a signal) or a hang ends only its child, and is
reported for the case it was running. Everything is seeded:

    python -m irc.testing.fuzz_lowlevel --count 3000 --seed 1          # a campaign
    python -m irc.testing.fuzz_lowlevel --count 500 --execute 1.0      # run every verified mutant
    python -m irc.testing.fuzz_lowlevel --show 1:17                    # print case 17 of seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import os
import random
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: irc/testing/ -> irc/ -> root

# --- running cases in forked children -------------------------------------------------


@dataclass
class Outcome:
    """What one case did: `status` is the exit status, negative for a signal."""

    status: int
    problem: str | None = None
    """Why the case is a bug (None: it behaved)."""
    stderr: str = ""
    info: dict[str, Any] = field(default_factory=dict[str, Any])


CASE_FAILED = 3
"""Exit status of a child whose case function raised (a traceback follows on stderr)."""


def _child_streams(out_dir: Path) -> None:
    """Points fds 1 and 2 (C code's output too) at files, and Python's streams at them."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(out_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    if faulthandler.is_enabled():  # pytest's handler writes to the parent's stderr: use ours
        faulthandler.enable(file=sys.stderr)


def run_isolated(
    fn: Callable[[], int],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, str, str, bool]:
    """Runs `fn()` in a forked child with `cwd` as its working folder and `env` added.

    Returns (exit status, stdout, stderr, timed out). The status is what `fn`
    returned, CASE_FAILED if it raised (the traceback is on stderr), minus the
    signal number if a signal ended the child (-11: a segfault).
    """
    out_dir = Path(tempfile.mkdtemp(prefix="irc-fuzz-out-"))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = CASE_FAILED
        try:
            _child_streams(out_dir)
            os.chdir(cwd)
            os.environ.update(env or {})
            result = fn()
            status = result if isinstance(result, int) else 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - the parent reads the traceback
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    status, timed_out = _wait(pid, timeout)
    out = (out_dir / "stdout").read_text(errors="replace") if (out_dir / "stdout").exists() else ""
    err = (out_dir / "stderr").read_text(errors="replace") if (out_dir / "stderr").exists() else ""
    shutil.rmtree(out_dir, ignore_errors=True)
    return status, out, err, timed_out


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(raw), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, raw = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(raw), True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def run_many(
    cases: Sequence[Any],
    check: Callable[[Any], Outcome],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> list[Outcome]:
    """`check(case)` for every case, in forked children that each run many cases.

    A child reports one JSON line a case through a pipe; when it dies (a
    signal) or stops answering (`timeout` seconds for one case), the case it
    was on is reported as such and a new child goes on with the next one.
    """
    results: list[Outcome] = []
    while len(results) < len(cases):
        start = len(results)
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read_fd)
            _serve(cases, start, check, cwd, env, write_fd)
        os.close(write_fd)
        results.extend(_collect(pid, read_fd, len(cases) - start, timeout))
    return results


def _serve(
    cases: Sequence[Any],
    start: int,
    check: Callable[[Any], Outcome],
    cwd: Path,
    env: dict[str, str] | None,
    write_fd: int,
) -> None:  # pragma: no cover - runs in the child
    status = 0
    try:
        out_dir = Path(tempfile.mkdtemp(prefix="irc-fuzz-out-"))
        _child_streams(out_dir)
        shutil.rmtree(out_dir)  # the streams stay open; the results go through the pipe
        os.chdir(cwd)
        os.environ.update(env or {})
        for case in cases[start:]:
            try:
                outcome = check(case)
            except Exception:  # noqa: BLE001 - the oracle's own failure, reported as the case's
                outcome = Outcome(CASE_FAILED, "the check raised:\n" + traceback.format_exc())
            line = json.dumps(
                [outcome.status, outcome.problem, outcome.stderr[-4000:], outcome.info]
            )
            os.write(write_fd, line.encode() + b"\n")
    except BaseException:  # noqa: BLE001 - reported by the parent as the case's failure
        traceback.print_exc()
        status = CASE_FAILED
    finally:
        os._exit(status)


def _collect(pid: int, read_fd: int, expected: int, timeout: float) -> list[Outcome]:
    """Outcomes the child at `pid` reports; the last one says how it ended if it broke off."""
    results: list[Outcome] = []
    buffer = b""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while len(results) < expected:
            ready, _, _ = select.select([pipe], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results.append(Outcome(-9, f"hang: no result within {timeout:.0f} s"))
                return results
            chunk = pipe.read(1 << 16)
            if not chunk:
                _, raw = os.waitpid(pid, 0)
                status = os.waitstatus_to_exitcode(raw)
                why = f"crash: killed by signal {-status}" if status < 0 else f"child exit {status}"
                results.append(Outcome(status, why))
                return results
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                status, problem, stderr, info = json.loads(line)
                results.append(Outcome(status, problem, stderr, info))
    os.waitpid(pid, 0)
    return results


# --- valid seed programs ----------------------------------------------------------------

SMALL_TILING = "tile{block=32 rblock=16 persistent-rblock=16}"
SMALL_SPLIT = "split-reduction{threshold=64 splits=16 min_chunk=4}"
SMALL_GEMM_COPIES = (
    "pad-gemm-operands{min_flops=0 rereads=1},"
    "split-tf32-gemm-operands{min_flops=0 rereads=1},k-major-gemm-operands{min_flops=0 rereads=1}"
)
"""The GEMM operand passes at any size: the seeds' small f32 matmuls get TF32 parts
(sums of products in their contractions), the half ones padded copies."""
PIPELINES: dict[str, str] = {
    "graph-fused": "decompose,fuse",
    "loop": "decompose,fuse,graph-to-loop",
    "loop-unfused": "decompose,graph-to-loop",
    "loop-tiled": (
        f"decompose,fuse,graph-to-loop,one-pass-variance,{SMALL_SPLIT},{SMALL_GEMM_COPIES},"
        f"{SMALL_TILING}"
    ),
    "tile": "decompose,fuse,graph-to-loop,one-pass-variance,split-reduction,tile,loop-to-tile",
    "tile-small": (
        f"decompose,fuse,graph-to-loop,one-pass-variance,{SMALL_SPLIT},{SMALL_GEMM_COPIES},"
        f"{SMALL_TILING},loop-to-tile"
    ),
}
"""How seeds are lowered: the name says the level of the printed result (graph-fused: graph
ops in hand-editable graph.fused groups, which lower as written)."""

MAX_SEED_CHARS = 20_000


@dataclass(frozen=True)
class Program:
    text: str
    origin: str
    """Where it came from: `graphgen:SEED:PIPELINE` or `example:NAME:PIPELINE`."""
    small: bool
    """Small enough (buffers, grids) to run on the interpreter."""


def lowered(text: str, pipeline: str) -> str:
    """`text` (graph level) through `pipeline`, printed."""
    from irc.analysis.verifier import verify
    from irc.pipeline import run_pipeline
    from irc.syntax.parser import parse
    from irc.syntax.printer import print_module

    module = parse(text, "seed.ir")
    verify(module)
    run_pipeline(module, pipeline)
    return print_module(module)


def seed_programs(seed: int, graphs: int, examples: bool = True) -> list[Program]:
    """Valid loop- and tile-level programs: random graphs and the examples, lowered."""
    from irc.testing.graphgen import generate

    sources: list[tuple[str, str, bool]] = []
    for k in range(graphs):
        s = seed * 100_003 + k
        sources.append((f"graphgen:{s}", generate(s, max_ops=6), True))
    if examples:
        for path in sorted((ROOT / "examples").glob("*.ir")):
            sources.append((f"example:{path.stem}", path.read_text(), False))
    programs: list[Program] = []
    rng = random.Random(f"seeds:{seed}")
    for origin, text, small in sources:
        names = sorted(PIPELINES)
        for name in rng.sample(names, 2) if small else ["graph-fused", "loop", "tile"]:
            out = lowered(text, PIPELINES[name])
            if len(out) <= MAX_SEED_CHARS:
                programs.append(Program(out, f"{origin}:{name}", small))
    return programs


# --- grammar-aware mutations ----------------------------------------------------------

TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\\n]|\\.)*")
      | (?P<type>\b(?:memref|tensor|ptr)<[^<>\n]*>)
      | (?P<op>\b(?:loop|tile|graph|func)\.[A-Za-z_]\w*)
      | (?P<value>%[A-Za-z0-9_.$-]+)
      | (?P<symbol>@[A-Za-z0-9_.$-]+)
      | (?P<list>\[[^\[\]\n]*\])
      | (?P<number>(?<![\w.%@])[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?![\w.]))
      | (?P<key>\b[A-Za-z_]\w*(?=\ =\ ))
      | (?P<scalar>\b(?:f32|f16|bf16|f64|i64|i32|i1|index)\b)
    """,
    re.VERBOSE,
)

NUMBERS = [
    "0", "-1", "1", "2", "3", "7", "31", "32", "33", "63", "64", "65", "1023", "1024", "4097",
    "65536", "1048576", "1048577", str(2**31 - 1), str(2**31), str(2**32), str(2**32 + 1),
    str(2**53 + 1), str(2**62), str(2**63 - 1), str(2**63), str(2**64), str(-(2**31) - 1),
    str(-(2**63)), "1" + "0" * 30, "1.5", "-0.0", "0.5", "nan", "inf", "-inf", "1e308", "1e400",
    "true", "false",
]  # fmt: skip

PAYLOAD = (
    "__import__('os').makedirs(__import__('os').environ.get('IRC_HOSTILE_DIR', '.') + "
    "'/pwned', exist_ok=True)"
)
STRINGS = [
    '""', '"my-kernel"', '"def"', '"None"', '"torch"', '"tl"', '"triton"', '"fn0"', '"range"',
    '"_irc_bind"', '"DEVICE"', '"FUNCTIONS"', '"buf0"', '"arg0"', '"ptr0"', '"v0"', '"os"',
    '"k\\nx"', '"k\\"x"', "\"k'x\"", '"k\\\\"', '"k\\tx"', '"k\\0"', '"k\\x01"', '"\\u2028"',
    '"ｋ"', '"é"', '"9k"', '"k" ', '"a.b"', '"a b"', '"k; ' + PAYLOAD + '"',
    '"k\\n' + PAYLOAD + '\\ndef z"', "\"'); " + PAYLOAD + "; ('\"",
    '"\\"); ' + PAYLOAD + '; (\\""', '"{0}{1}"', '"%s"', '"sum"', '"max"', '"min"', '"prod"',
    '"first"', '"last"', '"ieee"', '"tf32"', '"exp"', '"add"', '"where"', '"cast"', '"floordiv"',
    '"mod"', '"and"', '"or"', '"nope"', '"__class__"', '"x" * 300', '"tf32_head"', '"tf32_tail"',
    '"split-tf32"', '"mul"', '"sub"', '"eq"',
]  # fmt: skip

ELEMENTS = ["f32", "f16", "bf16", "f64", "i64", "i32", "i1", "index"]
KEYS = [
    "name", "bounds", "block", "warps", "stages", "persistent", "unrolled", "nested", "tail",
    "pdl",
    "kind", "contract", "fn",
    "value", "axis", "size", "other", "evict", "precision", "lb", "ub", "step", "count", "shape",
    "grid", "kernel", "dims", "x",
]  # fmt: skip


def _ops() -> list[str]:
    from irc.syntax.parser import op_classes

    return sorted(op_classes())


def tokens(text: str) -> list[re.Match[str]]:
    return list(TOKEN.finditer(text))


def _pick(rng: random.Random, text: str, kind: str) -> re.Match[str] | None:
    found = [m for m in tokens(text) if m.lastgroup == kind]
    return rng.choice(found) if found else None


def _replace(text: str, m: re.Match[str], new: str) -> str:
    return text[: m.start()] + new + text[m.end() :]


def _number(rng: random.Random, old: str) -> str:
    if rng.random() < 0.3:
        try:
            n = int(old)
        except ValueError:
            return rng.choice(NUMBERS)
        return str(rng.choice([n + 1, n - 1, n * 2, n // 2, -n, n * 1024, n + 2**32]))
    return rng.choice(NUMBERS)


def m_number(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "number")
    return text if m is None else _replace(text, m, _number(rng, m.group()))


def m_list(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "list")
    if m is None:
        return text
    items = [s.strip() for s in m.group()[1:-1].split(",") if s.strip()]
    choice = rng.randrange(6)
    if choice == 0:
        items = []
    elif choice == 1:
        items.insert(rng.randrange(len(items) + 1), _number(rng, "1"))
    elif choice == 2 and items:
        del items[rng.randrange(len(items))]
    elif choice == 3 and items:
        items.append(rng.choice(items))
    elif choice == 4:
        items = [rng.choice(['"4"', "[4]", "1.5", "true", "f32", "@k"])]
    elif items:
        k = rng.randrange(len(items))
        items[k] = _number(rng, items[k])
    return _replace(text, m, "[" + ", ".join(items) + "]")


def m_op(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "op")
    if m is None:
        return text
    ops = _ops()
    same = [o for o in ops if o.split(".")[0] == m.group().split(".")[0]]
    return _replace(text, m, rng.choice(same if same and rng.random() < 0.7 else ops))


def m_value(rng: random.Random, text: str) -> str:
    found = [m for m in tokens(text) if m.lastgroup == "value"]
    if not found:
        return text
    m = rng.choice(found)
    other = rng.choice([*(f.group() for f in found), "%nope", "%0", "%x"])
    return _replace(text, m, other)


def m_symbol(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "symbol")
    if m is None:
        return text
    found = [t.group() for t in tokens(text) if t.lastgroup == "symbol"]
    return _replace(text, m, rng.choice([*found, "@nope", "@f", "@torch", "@def", "@k.k"]))


def m_string(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "string")
    if m is None:
        return text
    new = rng.choice(STRINGS)
    if new == '"x" * 300':
        new = '"' + "x" * 300 + '"'
    if rng.random() < 0.15:
        new = rng.choice(["1", "[1]", "f32", "@k", "true"])
    return _replace(text, m, new)


def m_type(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "type")
    if m is None:
        return text
    kind, inner = m.group()[:-1].split("<", 1)
    dims = inner.split("x")
    element, shape = dims[-1], dims[:-1]
    choice = rng.randrange(7)
    if choice == 0:
        element = rng.choice(ELEMENTS)
    elif choice == 1 and shape:
        k = rng.randrange(len(shape))
        shape[k] = rng.choice(["0", "1", "2", "3", "64", str(2**31), str(2**40), "?"])
    elif choice == 2:
        shape.insert(rng.randrange(len(shape) + 1), rng.choice(["1", "2", "4"]))
    elif choice == 3 and shape:
        del shape[rng.randrange(len(shape))]
    elif choice == 4:
        kind = rng.choice(["memref", "tensor", "ptr"])
    elif choice == 5:
        shape = ["1"] * rng.choice([64, 65, 200])
    else:
        shape = shape[::-1]
    return _replace(text, m, f"{kind}<{''.join(d + 'x' for d in shape)}{element}>")


def m_scalar(rng: random.Random, text: str) -> str:
    m = _pick(rng, text, "scalar")
    return text if m is None else _replace(text, m, rng.choice(ELEMENTS))


OPERANDS = re.compile(
    r"^(\s*(?:%[\w.$-]+(?:, %[\w.$-]+)* = )?[a-z]+\.\w+ )(%[^{(:\n]*?)(?=\s*[{(:]|$)", re.M
)


def m_operands(rng: random.Random, text: str) -> str:
    """Drops, repeats or reorders one operand of one op (a mask removed, an index added)."""
    found = list(OPERANDS.finditer(text))
    if not found:
        return text
    m = rng.choice(found)
    values = [v.strip() for v in m.group(2).split(",")]
    choice = rng.randrange(4)
    if choice == 0 or (choice == 1 and len(values) > 1):
        del values[-1 if choice == 1 else rng.randrange(len(values))]
    elif choice == 2:
        values.insert(rng.randrange(len(values) + 1), rng.choice(values))
    else:
        rng.shuffle(values)
    return text[: m.start(2)] + ", ".join(values) + text[m.end(2) :]


ATTRS = re.compile(r"\{([^{}\n]*=[^{}\n]*)\}")


def m_attrs(rng: random.Random, text: str) -> str:
    """Drops, adds or repeats one attribute entry."""
    found = list(ATTRS.finditer(text))
    if not found:
        return text
    m = rng.choice(found)
    entries = [e.strip() for e in re.split(r",(?![^\[]*\])", m.group(1)) if e.strip()]
    choice = rng.randrange(3)
    if choice == 0 and entries:
        del entries[rng.randrange(len(entries))]
    elif choice == 1 and entries:
        entries.append(rng.choice(entries))
    else:
        value = rng.choice([*NUMBERS[:12], '"x"', "[1]", "[0, 0]", "f32", "@k", "[]"])
        entries.insert(rng.randrange(len(entries) + 1), f"{rng.choice(KEYS)} = {value}")
    return text[: m.start()] + "{" + ", ".join(entries) + "}" + text[m.end() :]


def m_lines(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    choice = rng.randrange(3)
    if choice == 0:
        del lines[i]
    elif choice == 1:
        lines.insert(j, lines[i])
    else:
        lines.insert(j, lines.pop(i))
    return "\n".join(lines)


def m_nest(rng: random.Random, text: str) -> str:
    """Wraps a store inside a kernel in new loop regions, one or many deep (a value-defining
    op would hide its result from the ops after it)."""
    lines = text.split("\n")
    body = [k for k, line in enumerate(lines) if re.match(r"\s+(loop|tile)\.store ", line)]
    if not body:
        return text
    k = rng.choice(body)
    depth = rng.choice([1, 1, 1, 2, 5, 70])
    if "tile." in lines[k]:
        head = [
            f"tile.for {{lb = 0, ub = {rng.choice([1, 2, 5])}, step = 1}} (%nest{d}: i32) {{"
            for d in range(depth)
        ]
        tail = ["tile.yield", "}"] * depth
    else:
        head = [
            f"loop.foreach {{bounds = [{rng.choice([1, 2, 4])}]}} (%nest{d}: index) {{"
            for d in range(depth)
        ]
        tail = ["}"] * depth
    lines[k : k + 1] = [*head, lines[k], *tail]
    return "\n".join(lines)


def m_region_args(rng: random.Random, text: str) -> str:
    """Changes a region's arguments: their type, their number."""
    found = list(re.finditer(r"\) \(([^()\n]*)\) \{|\} \(([^()\n]*)\) \{", text))
    if not found:
        return text
    m = rng.choice(found)
    group = 1 if m.group(1) is not None else 2
    args = [a.strip() for a in m.group(group).split(",") if a.strip()]
    choice = rng.randrange(3)
    if choice == 0 and args:
        del args[rng.randrange(len(args))]
    elif choice == 1:
        args.append(f"%extra: {rng.choice(['index', 'i32', 'f32', 'ptr<f32>'])}")
    elif args:
        k = rng.randrange(len(args))
        args[k] = (
            args[k].split(":")[0] + ": " + rng.choice(["index", "i32", "i64", "f32", "ptr<f16>"])
        )
    return text[: m.start(group)] + ", ".join(args) + text[m.end(group) :]


def m_buffer(rng: random.Random, text: str) -> str:
    """Changes one buffer type everywhere it is written (a dimension one smaller, one larger,
    halved): the program stays well formed, and every kernel over it must be proven again."""
    found = sorted({m.group() for m in re.finditer(r"memref<(\d+x)+[a-z0-9]+>", text)})
    if not found:
        return text
    old = rng.choice(found)
    dims = old[len("memref<") : -1].split("x")
    k = rng.randrange(len(dims) - 1)
    n = int(dims[k])
    dims[k] = str(max(1, rng.choice([n - 1, n + 1, n // 2, n * 2])))
    return text.replace(old, "memref<" + "x".join(dims) + ">")


def m_bound(rng: random.Random, text: str) -> str:
    """Moves one number that bounds accesses by a little: an i32 constant (a mask's limit, a
    stride), a loop or kernel bound, a grid size, a loop's upper bound."""
    found = [
        m
        for m in re.finditer(
            r"(?:tile\.constant \{value = |bounds = \[|grid = \[|ub = |, )(\d+)(?=\}? : i32|[\],])",
            text,
        )
    ]  # fmt: skip
    if not found:
        return text
    m = rng.choice(found)
    n = int(m.group(1))
    new = str(max(0, rng.choice([n - 1, n + 1, n + 1, n * 2, n + 16])))
    return text[: m.start(1)] + new + text[m.end(1) :]


MUTATORS: dict[str, Callable[[random.Random, str], str]] = {
    "buffer": m_buffer, "bound": m_bound,
    "number": m_number, "list": m_list, "op": m_op, "value": m_value, "symbol": m_symbol,
    "string": m_string, "type": m_type, "scalar": m_scalar, "operands": m_operands,
    "attrs": m_attrs, "lines": m_lines, "nest": m_nest, "region-args": m_region_args,
}  # fmt: skip
WEIGHTS = {"buffer": 3, "bound": 4, "number": 5, "list": 4, "string": 3, "operands": 3, "type": 3, "attrs": 3, "op": 2,
           "value": 2, "symbol": 1, "scalar": 2, "lines": 2, "nest": 1, "region-args": 1}  # fmt: skip


def mutate(rng: random.Random, text: str) -> tuple[str, list[str]]:
    """`text` with 1 to 3 mutations; returns the names of the mutations too."""
    names = list(WEIGHTS)
    applied: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        name = rng.choices(names, [WEIGHTS[n] for n in names])[0]
        text = MUTATORS[name](rng, text)
        applied.append(name)
    return text, applied


@dataclass(frozen=True)
class Case:
    index: int
    text: str
    origin: str
    mutations: tuple[str, ...]
    execute: bool
    path: str = ""


def make_cases(
    programs: Sequence[Program], seed: int, count: int, execute: float, folder: Path
) -> list[Case]:
    """`count` mutants of `programs`, written to `folder` (case_N.ir), `execute` the share run."""
    rng = random.Random(f"cases:{seed}")
    cases = []
    for i in range(count):
        program = programs[rng.randrange(len(programs))]
        text, applied = mutate(rng, program.text)
        path = folder / f"case_{i}.ir"
        path.write_text(text)
        run = program.small and rng.random() < execute
        cases.append(Case(i, text, program.origin, tuple(applied), run, str(path)))
    return cases


# --- the oracle ---------------------------------------------------------------------------

LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error: ")


def check_diagnostics(stderr: str, path: str, text: str) -> str | None:
    """Why the error output of a failed run is wrong, or None."""
    if "Traceback" in stderr:
        return "traceback on stderr"
    if "internal error" in stderr:
        return "internal error: " + _first_line(stderr, "internal error")
    lines = text.split("\n")
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    if not errors:
        return "exit 1 without an error line: " + stderr[:200]
    for line in errors:
        m = LOCATED.match(line)
        if m is None or m.group("file") != path:
            return "error without a location in the file: " + line[:300]
        row, col = int(m.group("line")), int(m.group("col"))
        if not 1 <= row <= len(lines) or not 1 <= col <= len(lines[row - 1]) + 1:
            return f"error located outside the file ({row}:{col}): " + line[:300]
    return None


FORBIDDEN_NAMES = frozenset(
    "__import__ eval exec open compile os sys subprocess builtins __builtins__ breakpoint".split()
)
"""Names generated code never uses: one of them in it means something came in from the input."""


def check_generated(source: str) -> str | None:
    """Why the Triton module `source` is not what irc writes: it must parse, hold only
    imports of torch, triton and irc.runtime, assignments and functions at the top, and
    call nothing that reaches the system."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"the generated Python does not parse: {e}"
    if not any(isinstance(node, ast.FunctionDef) for node in tree.body):
        return "the generated Python defines no function"
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            if not all(m and m.split(".")[0] in ("torch", "triton", "irc") for m in modules):
                return f"the generated Python imports {modules}"
        elif not isinstance(node, ast.Assign | ast.FunctionDef):
            return f"the generated Python has a top-level {type(node).__name__}: {ast.unparse(node)[:200]}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"the generated Python uses {node.id}"
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            return "the generated Python imports from os"
    return None


def _first_line(text: str, containing: str) -> str:
    return next((line for line in text.splitlines() if containing in line), "")[:300]


def _opt(argv: list[str]) -> tuple[int, str, str]:
    from irc.tools.opt import run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run(argv, stdout=out)
    return status, out.getvalue(), err.getvalue()


def _files_left() -> list[str]:
    """Files anywhere a payload could write: the cwd and $IRC_HOSTILE_DIR (emptied after)."""
    left: list[str] = []
    for folder in (Path.cwd(), Path(os.environ.get("IRC_HOSTILE_DIR", "."))):
        for entry in folder.iterdir():
            left.append(str(entry))
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
    return left


def check_case(case: Case) -> Outcome:
    """The static oracle, then (for `case.execute`) the run under the memory guard."""
    outcome = _check_static(case)
    left = _files_left()
    if left and outcome.problem is None:
        outcome.problem = f"wrote files: {left}"
    if outcome.problem is None and outcome.status == 0 and case.execute:
        outcome.problem = execute_guarded(case.path)
        outcome.info["executed"] = True
        left = _files_left()
        if left and outcome.problem is None:
            outcome.problem = f"wrote files while running: {left}"
    return outcome


EXTRA_RUNS: list[list[str]] = [
    ["--emit", "mlir"],
    ["--emit", "dot"],
    ["-p", f"{SMALL_SPLIT},{SMALL_TILING}", "--print-ir-after-all"],
    ["--split-input-file", "--emit", "triton", "--no-verify"],
]
"""One more command line a case (by its index), which must also exit 0 or 1 and say
nothing internal; `--no-verify` checks that the lowering's own checks hold without the
verifier's help."""


def _check_static(case: Case) -> Outcome:
    extra = EXTRA_RUNS[case.index % len(EXTRA_RUNS)]
    status, _, err = _opt([case.path, *extra])
    if status not in (0, 1) or "Traceback" in err or "internal error" in err:
        return Outcome(status, f"irc-opt {' '.join(extra)}: exit {status}: " + err[:300], err)
    status, out, err = _opt([case.path, "--emit", "triton"])
    if status not in (0, 1):
        return Outcome(status, f"irc-opt --emit triton: exit {status}: " + err[:300], err)
    if status == 1:
        return Outcome(1, check_diagnostics(err, case.path, case.text), err)
    if err.strip():
        return Outcome(0, "exit 0 with output on stderr: " + err[:300], err)
    if (why := check_generated(out)) is not None:
        return Outcome(0, why, out[-4000:])
    # Accepted: it prints as IR that parses back to the same text.
    status, printed, err = _opt([case.path])
    if status != 0:
        return Outcome(
            status, f"irc-opt FILE: exit {status} where --emit triton passed: {err[:300]}", err
        )
    from irc.analysis.verifier import verify
    from irc.syntax.diagnostics import IrcError
    from irc.syntax.parser import parse
    from irc.syntax.printer import print_module

    try:
        again = parse(printed, "printed.ir")
        verify(again)
        if print_module(again) != printed:
            return Outcome(0, "print -> parse -> print is not a fixed point", printed[:2000])
    except IrcError as e:
        return Outcome(0, f"printed IR does not parse back: {e}", printed[:2000])
    return Outcome(0)


# --- running verified programs under a memory guard ----------------------------------------


class OutOfBounds(Exception):
    """A load or store outside every buffer the running launch passed."""


def out_of_bounds(error: BaseException) -> OutOfBounds | None:
    """The guard's error behind `error` (Triton's interpreter wraps what a kernel raises)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OutOfBounds):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


MAX_RUN_BYTES = 1 << 24
MAX_RUN_PROGRAMS = 4096


_guarded = False


def install_memory_guard() -> None:
    """Makes Triton's interpreter check every unmasked lane's address against the buffers
    of the launch in progress (call it in a forked child: it patches the interpreter)."""
    global _guarded
    if _guarded:
        return
    _guarded = True
    import numpy as np
    from triton.runtime import interpreter

    from irc.runtime.interpreter import install_contiguous_access

    install_contiguous_access()  # beneath the guard, so that it sees those accesses too

    ranges: list[tuple[int, int]] = []
    builder = interpreter.InterpreterBuilder
    executor = interpreter.GridExecutor
    original_args = executor._init_args_hst  # pyright: ignore[reportPrivateUsage]
    original_load = builder.create_masked_load
    original_store = builder.create_masked_store

    def init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = original_args(self, args_dev, kwargs)
        ranges.clear()
        for arg in [*args_hst, *kwargs_hst.values()]:
            base = getattr(arg, "base", arg)  # a TensorDescriptor's tensor
            if hasattr(base, "data_ptr"):
                start = base.data_ptr()
                ranges.append((start, start + base.numel() * base.element_size()))
        return args_hst, kwargs_hst

    def check(ptrs: Any, mask: Any, what: str) -> None:
        size = interpreter._get_np_dtype(ptrs.get_element_ty()).itemsize  # pyright: ignore[reportPrivateUsage]
        addresses = np.broadcast_to(
            ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape)
        )
        live = addresses[np.broadcast_to(mask.data, addresses.shape).astype(bool)].astype(np.uint64)
        inside = np.zeros(live.shape, dtype=bool)
        for start, end in ranges:
            inside |= (live >= start) & (live + size <= end)
        if not inside.all():
            bad = int(live[~inside][0])
            near = min(ranges, key=lambda r: min(abs(bad - r[0]), abs(bad - r[1])), default=(0, 0))
            raise OutOfBounds(
                f"{what} of {int((~inside).sum())} lane(s) outside the launch's buffers: address "
                f"{bad - near[0]:+d} bytes from a buffer of {near[1] - near[0]} bytes"
            )

    def load(self: Any, ptrs: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        check(ptrs, mask, "load")
        return original_load(self, ptrs, mask, *args, **kwargs)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        check(ptrs, mask, "store")
        return original_store(self, ptrs, value, mask, *args, **kwargs)

    executor._init_args_hst = init_args  # pyright: ignore[reportPrivateUsage]
    builder.create_masked_load = load
    builder.create_masked_store = store


def _too_big(module: Any) -> str | None:
    """Why running `module` on the interpreter would take too long or too much memory."""
    from xdsl.dialects.builtin import IntegerAttr, MemRefType

    from irc.dialects import tile
    from irc.ir.types import numel

    total = 0
    for op in module.walk():
        for value in [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]:
            if isinstance(value.type, MemRefType):
                total += numel(value.type.get_shape()) * 8
        if isinstance(op, tile.KernelOp):
            programs = 1
            for g in op.grid.data:
                programs *= g.value.data if isinstance(g, IntegerAttr) else 1
            if programs > MAX_RUN_PROGRAMS:
                return f"{programs} programs"
    return f"{total} bytes" if total > MAX_RUN_BYTES else None


def execute_guarded(path: str) -> str | None:
    """Compiles `path` for the CPU, runs each function once on random inputs under the
    memory guard; returns the problem, or None. A program too big to run is skipped."""
    import torch
    from xdsl.dialects import func
    from xdsl.dialects.builtin import MemRefType

    from irc.compiler import compile as compile_ir
    from irc.ir.types import element_name
    from irc.syntax.diagnostics import IrcError

    install_memory_guard()
    try:
        compiled = compile_ir(path, device="cpu", fuse=False)
    except IrcError as e:
        return f"irc.compile rejected what irc-opt --emit triton accepted: {e}"
    except Exception as e:  # noqa: BLE001 - the finding
        return f"irc.compile raised {type(e).__name__}: {str(e)[:300]}"
    if _too_big(compiled.module) is not None:
        return None
    generator = torch.Generator().manual_seed(0)
    for op in compiled.module.body.ops:
        if not isinstance(op, func.FuncOp):
            continue
        inputs = []
        for t in op.function_type.inputs.data:
            if not isinstance(t, MemRefType):
                return None
            inputs.append(_random_tensor(t.get_shape(), element_name(t.element_type), generator))
        try:
            compiled.run(op.sym_name.data, inputs)
        except Exception as e:  # noqa: BLE001 - the finding
            if (oob := out_of_bounds(e)) is not None:
                return f"out-of-bounds access at run time: {oob}"
            return f"running @{op.sym_name.data} raised {type(e).__name__}: {str(e)[:300]}"
    return None


def _random_tensor(shape: Sequence[int], element: str, generator: Any) -> Any:
    import torch

    dtype = getattr(torch, {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                            "f64": "float64", "i64": "int64", "i32": "int32", "i1": "bool"}[element])  # fmt: skip
    if element == "i1":
        return torch.rand(tuple(shape), generator=generator) < 0.5
    if element in ("i32", "i64"):
        return torch.randint(-5, 6, tuple(shape), generator=generator, dtype=dtype)
    return torch.randn(tuple(shape), generator=generator).to(dtype)


# --- campaigns --------------------------------------------------------------------------------


def sandbox_env(root: Path) -> dict[str, str]:
    """Where a case may look for places to write: all of them empty folders under `root`."""
    env = {}
    for name, var in (("hostile", "IRC_HOSTILE_DIR"), ("cache", "IRC_CACHE_DIR"),
                      ("triton", "TRITON_CACHE_DIR"), ("home", "HOME")):  # fmt: skip
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        env[var] = str(folder)
    return env


def problem_class(problem: str) -> str:
    """`problem` with names, strings and numbers blanked out: one key a kind of failure."""
    blank = re.sub(r"'[^']*'|\"[^\"]*\"|%[\w.$-]+|@[\w.$-]+", "_", problem)
    return re.sub(r"\d+", "N", blank)[:160]


def shrink(text: str, budget: int = 400, execute: bool = True) -> tuple[str, str | None]:
    """The smallest variant of `text` (whole lines removed) that fails the oracle the same
    way, and its problem; run in a scratch folder (it writes the candidates there). With
    `execute`, accepted variants are run too (the memory guard patches this process)."""
    folder = Path(tempfile.mkdtemp(prefix="irc-shrink-"))
    path = folder / "case.ir"

    def problem(candidate: str) -> str | None:
        path.write_text(candidate)
        return check_case(Case(0, candidate, "shrink", (), execute, str(path))).problem

    try:
        want = problem(text)
        if want is None:
            return text, None
        key = problem_class(want)
        lines = text.split("\n")
        chunk = max(1, len(lines) // 2)
        while chunk >= 1 and budget > 0:
            i, progress = 0, False
            while i < len(lines) and budget > 0:
                candidate = lines[:i] + lines[i + chunk :]
                budget -= 1
                got = problem("\n".join(candidate))
                if got is not None and problem_class(got) == key:
                    lines, want, progress = candidate, got, True
                else:
                    i += chunk
            if not progress:
                chunk //= 2
        return "\n".join(lines), want
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Report:
    cases: list[Case]
    outcomes: list[Outcome]

    def failures(self) -> list[tuple[Case, Outcome]]:
        return [(c, o) for c, o in zip(self.cases, self.outcomes, strict=True) if o.problem]

    def classes(self) -> dict[str, list[tuple[Case, Outcome]]]:
        """Failures grouped by their problem with names and numbers blanked out."""
        groups: dict[str, list[tuple[Case, Outcome]]] = {}
        for case, outcome in self.failures():
            assert outcome.problem is not None
            groups.setdefault(problem_class(outcome.problem), []).append((case, outcome))
        return groups

    def summary(self) -> str:
        accepted = sum(1 for o in self.outcomes if o.status == 0)
        executed = sum(1 for o in self.outcomes if o.info.get("executed"))
        lines = [
            f"{len(self.cases)} cases: {accepted} accepted ({executed} run), "
            f"{len(self.cases) - accepted} rejected, {len(self.failures())} failures"
        ]
        for key, group in sorted(self.classes().items(), key=lambda kv: -len(kv[1])):
            case, outcome = min(group, key=lambda co: len(co[0].text))
            lines.append(f"\n== {len(group)}x {key}")
            lines.append(f"   e.g. case {case.index} ({case.origin}, {'+'.join(case.mutations)}):")
            lines.append(f"   {outcome.problem}")
        return "\n".join(lines)


def campaign(
    seed: int,
    count: int,
    graphs: int = 12,
    execute: float = 0.1,
    examples: bool = True,
    timeout: float = 120.0,
) -> Report:
    """Generates, mutates and checks `count` cases in forked children; the report lists failures."""
    programs = seed_programs(seed, graphs, examples)
    root = Path(tempfile.mkdtemp(prefix="irc-fuzz-"))
    try:
        inputs = root / "inputs"
        inputs.mkdir()
        cwd = root / "cwd"
        cwd.mkdir()
        env = sandbox_env(root)
        cases = make_cases(programs, seed, count, execute, inputs)
        return Report(cases, run_many(cases, check_case, cwd, env, timeout))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _show(spec: str, graphs: int, examples: bool) -> str:
    seed, index = (int(p) for p in spec.split(":"))
    programs = seed_programs(seed, graphs, examples)
    with tempfile.TemporaryDirectory() as folder:
        cases = make_cases(programs, seed, index + 1, 0.0, Path(folder))
    case = cases[index]
    return f"// case {seed}:{index} from {case.origin}, mutations {'+'.join(case.mutations)}\n{case.text}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m irc.testing.fuzz_lowlevel", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--graphs", type=int, default=12, help="random graphs lowered as seeds")
    ap.add_argument("--execute", type=float, default=0.1, help="share of small mutants run")
    ap.add_argument("--no-examples", action="store_true", help="seed from random graphs only")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one case may take")
    ap.add_argument("--show", metavar="SEED:CASE", help="print one case and exit")
    ap.add_argument(
        "--shrink", action="store_true", help="with --show: the smallest failing variant"
    )
    ap.add_argument("--save", metavar="DIR", help="write one input of each failure class here")
    args = ap.parse_args(argv)
    if args.show:
        text = _show(args.show, args.graphs, not args.no_examples)
        if args.shrink:
            with tempfile.TemporaryDirectory() as root:
                cwd = Path(root, "cwd")
                cwd.mkdir()
                os.environ.update(sandbox_env(Path(root)))
                with contextlib.chdir(cwd):
                    text, problem = shrink(text)
            text = f"// {problem}\n{text}"
        print(text)
        return 0
    report = campaign(
        args.seed, args.count, args.graphs, args.execute, not args.no_examples, args.timeout
    )
    print(report.summary())
    if args.save:
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        for n, group in enumerate(report.classes().values()):
            case, outcome = min(group, key=lambda co: len(co[0].text))
            (folder / f"class_{n}.ir").write_text(f"// {outcome.problem}\n" + case.text)
    return 1 if report.failures() else 0


def iter_problems(report: Report) -> Iterator[str]:
    """One line a failure: seed-independent enough to assert on in a test."""
    for case, outcome in report.failures():
        yield f"case {case.index} ({case.origin}, {'+'.join(case.mutations)}): {outcome.problem}"


if __name__ == "__main__":
    sys.exit(main())
