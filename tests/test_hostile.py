"""Hostile inputs at every level: only located diagnostics, exit 1, nothing run, nothing written.

Every file in tests/hostile/ attacks the compiler from a hand-written file:
code in names and attributes that reach the generated Python, kernels that
would read or write outside their buffers, attributes out of range, nesting
and ranks past the limits. Its header says what it attacks and, in
`// EXPECT: text` lines, what the error message must contain; its name starts
with its level (graph_, loop_, tile_).

Each file goes through `irc-opt FILE --emit triton` (with `--fuse` at the graph
level) as a real subprocess, and through `irc-run FILE --check` and
`irc.compile(FILE)` in forked children (irc already imported: no second of
torch import a case). Every process gets an empty working folder, and
$HOME, $IRC_CACHE_DIR, $TRITON_CACHE_DIR and $IRC_HOSTILE_DIR (where the
payloads write their markers) point at empty folders, which must stay empty.
Each must exit 1, without a traceback or an internal error, with an error
line `FILE:LINE:COL: error: ...` inside the file whose message contains the
expected text. A signal (a segfault) fails the test as such.

Generated inputs (thousands of nested regions, a 20,000-op index chain) and
hostile command lines go through the same checks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import irc.compiler
import irc.tools.run
from irc.testing.fuzz_lowlevel import LOCATED, run_isolated, sandbox_env

# Imported here once (torch and Triton with them), so that forked children start warm.
WARM = (irc.compiler, irc.tools.run)

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "hostile"
LEVELS = ("graph", "loop", "tile")
TOOLS = ("irc-opt", "irc-run", "irc.compile")
TIMEOUT = 120.0
LOWER_LEVEL_REFUSED = "irc-run runs graph-level functions only"
"""irc-run's located refusal of loop- and tile-level files: it runs nothing of them."""


@dataclass(frozen=True)
class Entry:
    path: Path
    level: str
    expects: tuple[str, ...]
    about: str


def read_entry(path: Path) -> Entry:
    header = []
    for line in path.read_text().split("\n"):
        if not line.startswith("//"):
            break
        header.append(line[2:].strip())
    expects = tuple(h.removeprefix("EXPECT:").strip() for h in header if h.startswith("EXPECT:"))
    about = " ".join(
        h.removeprefix("ATTACKS:").strip() for h in header if not h.startswith("EXPECT:")
    )
    return Entry(path, path.name.split("_")[0], expects, about)


ENTRIES = [read_entry(p) for p in sorted(CORPUS.glob("*.ir"))]

OPEN: dict[str, str] = {}
"""Corpus files whose defect is still open (the finding in /tmp/team/fuzz_findings.md)."""

CRASH_IN_VERIFIER: set[str] = set()
"""Open lower-level files whose defect breaks the verifier, which irc-run runs before it
refuses lower-level IR; the others reach only irc-opt's and irc.compile's lowering."""

KNOWN_FAILING: dict[tuple[str, str], str] = {
    (name, tool): why
    for name, why in OPEN.items()
    for tool in TOOLS
    if tool != "irc-run" or name.startswith("graph_") or name in CRASH_IN_VERIFIER
}
"""(file, tool) -> why it still fails; each is a strict xfail, so that the test fails once
the defect is fixed and its OPEN entry must go. irc-run refuses lower-level files by design."""


def params() -> list[object]:
    out: list[object] = []
    for entry in ENTRIES:
        for tool in TOOLS:
            reason = KNOWN_FAILING.get((entry.path.name, tool))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(entry, tool, id=f"{entry.path.stem}-{tool}", marks=marks))
    return out


# --- running one tool in a sandbox ------------------------------------------------------


@dataclass
class Sandbox:
    cwd: Path
    env: dict[str, str]

    @staticmethod
    def make(root: Path) -> Sandbox:
        cwd = root / "cwd"
        cwd.mkdir(parents=True)
        return Sandbox(cwd, sandbox_env(root))

    def written(self, keep_cache: bool = False) -> list[str]:
        """Every file in the folders that must stay empty."""
        folders = [self.cwd, *(Path(v) for k, v in self.env.items())]
        if keep_cache:
            folders = [f for f in folders if f.name not in ("cache", "triton")]
        return [str(p) for f in folders for p in sorted(f.rglob("*"))]


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run_opt(args: list[str], box: Sandbox) -> Result:
    """`irc-opt ARGS` as a real process."""
    env = {**os.environ, **box.env}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "irc.tools.opt", *args],
            cwd=box.cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        return Result(-int(signal.SIGKILL), str(e.stdout or ""), str(e.stderr or ""), True)
    return Result(done.returncode, done.stdout, done.stderr)


def run_forked(fn: Callable[[], int], box: Sandbox) -> Result:
    status, out, err, timed_out = run_isolated(fn, box.cwd, box.env, TIMEOUT)
    return Result(status, out, err, timed_out)


def irc_run(args: list[str]) -> Callable[[], int]:
    def fn() -> int:
        from irc.tools.run import main

        return main(args)

    return fn


def irc_compile(path: str) -> Callable[[], int]:
    """irc.compile as an embedding program would call it, its diagnostics printed."""

    def fn() -> int:
        import irc
        from irc.syntax.diagnostics import SourceManager

        try:
            irc.compile(path, device="cpu")
        except irc.IrcError as e:
            sources = SourceManager()
            sources.add(path, Path(path).read_bytes().decode("utf-8", "replace"))
            for d in e.diagnostics:
                print(sources.format(d), file=sys.stderr)
            return 1
        return 0

    return fn


def run_tool(tool: str, path: Path, level: str, box: Sandbox) -> Result:
    if tool == "irc-opt":
        return run_opt(
            [str(path), "--emit", "triton", *(["--fuse"] if level == "graph" else [])], box
        )
    if tool == "irc-run":
        return run_forked(irc_run([str(path), "--check"]), box)
    return run_forked(irc_compile(str(path)), box)


def assert_rejected(result: Result, path: Path, expects: tuple[str, ...], box: Sandbox) -> None:
    """Exit 1, located errors with the expected text, no traceback, nothing written."""
    err = result.stderr
    assert not result.timed_out, f"no answer within {TIMEOUT:.0f} s\n{err[-3000:]}"
    assert result.status >= 0, f"killed by signal {-result.status} (a crash)\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert "internal error" not in err, err[-3000:]
    assert result.status == 1, f"exit {result.status}, want 1\n{err[-3000:]}"
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert errors, err[-3000:]
    lines = path.read_bytes().decode("utf-8", "replace").split("\n")
    messages = []  # what follows "FILE:LINE:COL: error: " (the path may hold any word)
    for line in errors:
        m = LOCATED.match(line)
        assert m is not None and m.group("file") == str(path), f"not located in the file: {line}"
        row, col = int(m.group("line")), int(m.group("col"))
        assert 1 <= row <= len(lines) and 1 <= col <= len(lines[row - 1]) + 1, line
        messages.append(line[m.end() :])
    for expect in expects:
        assert any(expect in message for message in messages), (
            f"no error says {expect!r}:\n{err[-3000:]}"
        )
    assert "triton.jit" not in result.stdout, "generated code was printed"
    assert box.written() == [], f"files written: {box.written()}"


# --- the corpus ---------------------------------------------------------------------------


def test_the_corpus_is_well_formed() -> None:
    """Every file names its level and its expected error; every level is attacked
    with injections, out-of-bounds kernels and bad attributes."""
    assert len(ENTRIES) >= 60
    for entry in ENTRIES:
        assert entry.level in LEVELS, (
            f"{entry.path.name}: the name starts with graph_, loop_ or tile_"
        )
        assert entry.expects and all(entry.expects), f"{entry.path.name}: no // EXPECT: line"
        assert entry.about, f"{entry.path.name}: the header says what it attacks"
    for level in LEVELS:
        texts = [e.path.read_text() for e in ENTRIES if e.level == level]
        assert len(texts) >= 10, level
        assert any("IRC_HOSTILE_DIR" in t for t in texts), f"no injection at the {level} level"
    oob = [e for e in ENTRIES if "_oob_" in e.path.name]
    assert {e.level for e in oob} == {"loop", "tile"}


@pytest.mark.parametrize(("entry", "tool"), params())
def test_hostile_file(entry: Entry, tool: str, tmp_path: Path) -> None:
    box = Sandbox.make(tmp_path)
    result = run_tool(tool, entry.path, entry.level, box)
    expects = entry.expects
    if tool == "irc-run" and entry.level != "graph" and LOWER_LEVEL_REFUSED in result.stderr:
        expects = (LOWER_LEVEL_REFUSED,)  # by design, whether or not the verifier saw the attack
    assert_rejected(result, entry.path, expects, box)


def test_known_failures_name_corpus_files() -> None:
    names = {e.path.name for e in ENTRIES}
    for name, tool in KNOWN_FAILING:
        assert name in names and tool in TOOLS, (name, tool)
    assert CRASH_IN_VERIFIER <= set(OPEN)


# --- generated inputs: deep nesting, long chains ---------------------------------------------

DEPTH = 3000


def deep_graph() -> str:
    lines = ["func @f(%x: tensor<4xf32>) -> tensor<4xf32> {"]
    for k in range(DEPTH):
        src = "%x" if k == 0 else f"%a{k - 1}"
        lines.append(
            f'%r{k} = graph.fused {src} {{kernel = "k{k}", kind = "pointwise"}} (%a{k}: tensor<4xf32>) {{'
        )
    lines.append(f"graph.yield %a{DEPTH - 1}")
    for k in reversed(range(DEPTH)):
        lines.append("} : tensor<4xf32>")
        if k > 0:
            lines.append(f"graph.yield %r{k}")
    lines += ["return %r0 : tensor<4xf32>", "}", ""]
    return "\n".join(lines)


def deep_loop(region: str) -> str:
    lines = [
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {",
        "%y = loop.alloc : memref<4xf32>",
        'loop.kernel {name = "k", bounds = [4]} (%i: index) {',
    ]
    if region == "foreach":
        lines += [f"loop.foreach {{bounds = [1]}} (%j{k}: index) {{" for k in range(DEPTH)]
        lines += ["%v = loop.load %x, %i : f32", "loop.store %v, %y, %i"]
        lines += ["}"] * DEPTH
    else:
        lines += [
            f'%s{k} = loop.reduce {{kind = "sum", bounds = [1]}} (%j{k}: index) {{'
            for k in range(DEPTH)
        ]
        lines += ["%v = loop.load %x, %i : f32", "loop.yield %v"]
        for k in reversed(range(1, DEPTH)):
            lines += ["} : f32", f"loop.yield %s{k}"]
        lines += ["} : f32", "loop.store %s0, %y, %i"]
    lines += ["}", "return %y : memref<4xf32>", "}", ""]
    return "\n".join(lines)


def deep_tile() -> str:
    lines = [
        'tile.kernel {name = "k", grid = [1], warps = 4} (%p0: ptr<f32>, %p1: ptr<f32>) {',
        "%r = tile.arange {size = 64} : tensor<64xi32>",
    ]
    lines += [f"tile.for {{lb = 0, ub = 1, step = 1}} (%t{k}: i32) {{" for k in range(DEPTH)]
    lines += ["%v = tile.load %p0, %r : tensor<64xf32>", "tile.store %p1, %r, %v"]
    lines += ["tile.yield", "}"] * DEPTH
    lines += [
        "}", "", "func @f(%x: memref<64xf32>) -> memref<64xf32> {",
        "%y = loop.alloc : memref<64xf32>", "tile.launch %x, %y {kernel = @k}",
        "return %y : memref<64xf32>", "}", "",
    ]  # fmt: skip
    return "\n".join(lines)


def long_index_chain() -> str:
    """20,000 dependent index additions, then a load one past the end: the bounds proof
    must walk the chain without recursing (and find the access out of bounds)."""
    n = 20_000
    lines = [
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {",
        "  %y = loop.alloc : memref<4xf32>",
        '  loop.kernel {name = "k", bounds = [4]} (%i: index) {',
        "    %z = loop.constant {value = 0} : index",
        "    %one = loop.constant {value = 1} : index",
        '    %c0 = loop.apply %i, %z {fn = "add"} : index',
    ]
    lines += [f'    %c{k + 1} = loop.apply %c{k}, %z {{fn = "add"}} : index' for k in range(n)]
    lines += [
        f'    %last = loop.apply %c{n}, %one {{fn = "add"}} : index',
        "    %v = loop.load %x, %last : f32",
        "    loop.store %v, %y, %i",
        "  }",
        "  return %y : memref<4xf32>",
        "}",
        "",
    ]
    return "\n".join(lines)


def deep_brackets() -> str:
    return (
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
        '  loop.kernel {name = "k", bounds = ' + "[" * 5000 + "4" + "]" * 5000 + "} (%i: index) {\n"
        "  }\n  return %x : memref<4xf32>\n}\n"
    )


GENERATED: dict[str, tuple[str, Callable[[], str], tuple[str, ...]]] = {
    "graph_fused_3000_deep": ("graph", deep_graph, ("nest",)),
    "loop_foreach_3000_deep": ("loop", lambda: deep_loop("foreach"), ("nest",)),
    "loop_reduce_3000_deep": ("loop", lambda: deep_loop("reduce"), ("nest",)),
    "tile_for_3000_deep": ("tile", deep_tile, ("nest",)),
    "loop_index_chain_20000": ("loop", long_index_chain, ("may reach 4",)),
    "loop_brackets_5000_deep": ("loop", deep_brackets, ("nest",)),
}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_hostile_input(name: str, tool: str, tmp_path: Path) -> None:
    level, make, expects = GENERATED[name]
    path = tmp_path / "in" / f"{name}.ir"
    path.parent.mkdir()
    path.write_text(make())
    box = Sandbox.make(tmp_path / "box")
    result = run_tool(tool, path, level, box)
    assert_rejected(result, path, expects, box)


# --- hostile command lines -----------------------------------------------------------------

GRAPH = """func @f(%x: tensor<4x8xf32>) -> tensor<4xf32> {
  %s = graph.reduce_sum %x {dims = [1]} : tensor<4xf32>
  return %s : tensor<4xf32>
}
"""

OPT_ARGS: dict[str, tuple[list[str], str]] = {
    "min-chunk-zero": (["-p", "decompose,graph-to-loop,split-reduction{min_chunk=0}"], "min-chunk"),
    "negative-block": (["-p", "decompose,graph-to-loop,tile{block=-1}"], "block"),
    "duplicate-option": (["-p", "decompose,graph-to-loop,tile{block=64 block=128}"], "twice"),
    "huge-block": (["-p", "decompose,graph-to-loop,tile{block=" + str(2**70) + "}"], "block"),
    "loop-to-tile-on-graph": (["-p", "loop-to-tile"], "graph level"),
    "tile-on-graph": (["-p", "tile"], "graph level"),
    "graph-to-loop-twice": (["-p", "graph-to-loop,graph-to-loop"], "loop level"),
    "fuse-on-loop": (["-p", "graph-to-loop,fuse"], "loop level"),
    "pad-min-flops-negative": (
        ["-p", "graph-to-loop,pad-gemm-operands{min_flops=-1}"],
        "min-flops",
    ),
    "pad-rereads-zero": (["-p", "graph-to-loop,pad-gemm-operands{rereads=0}"], "rereads"),
    "pad-line-rereads-zero": (
        ["-p", "graph-to-loop,pad-gemm-operands{line_rereads=0}"],
        "line-rereads",
    ),
    "pad-line-rereads-code": (
        ["-p", 'graph-to-loop,pad-gemm-operands{line_rereads="1\');import os#"}'],
        "must be an integer",
    ),
    "pad-line-rereads-float": (
        ["-p", "graph-to-loop,pad-gemm-operands{line_rereads=1.5}"],
        "must be an integer",
    ),
    "pad-persistent-code": (
        ["-p", 'graph-to-loop,pad-gemm-operands{persistent_only="x\');import os#"}'],
        "true or false",
    ),
    "pad-on-graph": (["-p", "pad-gemm-operands"], "graph level"),
    "k-major-min-flops-code": (
        ["-p", 'graph-to-loop,k-major-gemm-operands{min_flops="1);import os#"}'],
        "min-flops",
    ),
    "k-major-rereads-zero": (
        ["-p", "graph-to-loop,k-major-gemm-operands{rereads=0}"],
        "rereads",
    ),
    "k-major-on-graph": (["-p", "k-major-gemm-operands"], "graph level"),
    "split-k-sms-code": (["-p", 'graph-to-loop,split-k{sms="1);import os#"}'], "sms"),
    # The SM count steers held column programs and column splits (tile, split-reduction).
    "tile-sms-code": (["-p", 'graph-to-loop,tile{sms="1);import os#"}'], "sms"),
    "tile-sms-zero": (["-p", "graph-to-loop,tile{sms=0}"], "sms"),
    "split-reduction-sms-code": (
        ["-p", 'graph-to-loop,split-reduction{sms="x\');import os#"}'],
        "sms",
    ),
    "split-reduction-sms-zero": (["-p", "graph-to-loop,split-reduction{sms=0}"], "sms"),
    "split-k-sms-zero": (["-p", "graph-to-loop,split-k{sms=0}"], "sms"),
    "split-k-on-graph": (["-p", "split-k"], "graph level"),
}


@pytest.mark.parametrize("name", sorted(OPT_ARGS))
def test_hostile_pass_options(name: str, tmp_path: Path) -> None:
    """Pass options and pass orders no pipeline can run: an error naming the problem."""
    args, expect = OPT_ARGS[name]
    path = tmp_path / "in.ir"
    path.write_text(GRAPH)
    box = Sandbox.make(tmp_path / "box")
    result = run_opt([str(path), *args], box)
    err = result.stderr
    assert result.status == 1, f"exit {result.status}\n{err[-3000:]}"
    assert "Traceback" not in err and "internal error" not in err, err
    errors = [line for line in err.splitlines() if "error: " in line]
    assert errors and any(expect in line for line in errors), err
    assert box.written() == []


@pytest.mark.parametrize(
    "seed", [str(2**64), str(-(2**64)), "1" + "0" * 40], ids=["2**64", "-2**64", "1e40"]
)
def test_huge_seed(seed: str, tmp_path: Path) -> None:
    """irc-run --seed past 64 bits: a usage error, not an internal one."""
    path = tmp_path / "in.ir"
    path.write_text(GRAPH)
    box = Sandbox.make(tmp_path / "box")
    result = run_forked(irc_run([str(path), "--seed", seed]), box)
    # 1: irc's diagnostic; 2 only as argparse's usage error, never an internal error.
    assert result.status == 1 or (result.status == 2 and "usage:" in result.stderr), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert "seed" in result.stderr, result.stderr


def test_hostile_file_name_runs_nothing(tmp_path: Path) -> None:
    """A valid program at a path that holds a newline and Python: the generated module
    names its source in a comment, and compiling and running it writes no marker."""
    folder = tmp_path / "in"
    folder.mkdir()
    # No "/" in it (a file name cannot hold one): chr(47) makes it.
    name = "x\n__import__('os').mkdir(__import__('os').environ['IRC_HOSTILE_DIR'] + chr(47) + 'p')\n#.ir"
    path = folder / name
    path.write_text(GRAPH)
    box = Sandbox.make(tmp_path / "box")
    result = run_opt([str(path), "--emit", "triton"], box)
    assert result.status == 0, result.stderr
    assert "\n__import__" not in result.stdout

    def compile_and_run() -> int:
        import torch

        import irc

        compiled = irc.compile(str(path), device="cpu")
        compiled.f(torch.ones(4, 8))
        return 0

    ran = run_forked(compile_and_run, box)
    assert ran.status == 0, ran.stderr
    assert box.written(keep_cache=True) == []


# --- the harness itself --------------------------------------------------------------------


def test_the_sandbox_sees_crashes_hangs_and_writes(tmp_path: Path) -> None:
    """The checks above can fail: a segfault, a hang and a written file are all seen."""
    box = Sandbox.make(tmp_path)

    def segfault() -> int:
        os.kill(os.getpid(), signal.SIGSEGV)
        return 0

    def write() -> int:
        Path("pwned_cwd").write_text("x")
        Path(os.environ["IRC_HOSTILE_DIR"], "pwned").mkdir()
        print("error", file=sys.stderr)
        return 1

    def hang() -> int:
        signal.pause()
        return 0

    status, _, _, timed_out = run_isolated(segfault, box.cwd, box.env, 30)
    assert status == -signal.SIGSEGV and not timed_out
    status, _, _, timed_out = run_isolated(hang, box.cwd, box.env, 0.5)
    assert timed_out
    status, _, err, _ = run_isolated(write, box.cwd, box.env, 30)
    assert status == 1 and err == "error\n"
    assert sorted(Path(p).name for p in box.written()) == ["pwned", "pwned_cwd"]
    path = tmp_path / "x.ir"
    path.write_text("x\n")
    with pytest.raises(AssertionError, match="files written"):
        assert_rejected(Result(1, "", f"{path}:1:1: error: e\n"), path, (), box)


def test_the_oracle_wants_located_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.ir"
    path.write_text("a\nb\n")
    box = Sandbox.make(tmp_path / "box")
    assert_rejected(Result(1, "", f"{path}:2:1: error: bad b\n"), path, ("bad",), box)
    for stderr, why in [
        ("irc-opt: error: bad\n", "not located"),
        (f"{path}:9:1: error: bad\n", ":9:1: error"),
        (f"{path}:1:1: error: good\n", "no error says"),
        ("irc-opt: internal error: KeyError\n", "internal error"),
        (f"Traceback (most recent call last):\n{path}:1:1: error: bad\n", "Traceback"),
    ]:
        with pytest.raises(AssertionError, match=re.escape(why)):
            assert_rejected(Result(1, "", stderr), path, ("bad",), box)
    with pytest.raises(AssertionError, match="signal 11"):
        assert_rejected(Result(-11, "", ""), path, ("bad",), box)
    named = tmp_path / "where_index.ir"  # the file's name holds the expected words
    named.write_text("a\n")
    with pytest.raises(AssertionError, match="no error says"):
        assert_rejected(Result(1, "", f"{named}:1:1: error: other\n"), named, ("where",), box)


# --- names as the printer writes them (%0, %1), through every output --------------------------

NUMBERED = """func @f(%0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %1 = graph.exp %0 : tensor<4x8xf32>
  %2 = graph.neg %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--fuse", "--emit", "dot"],
        ["--fuse", "--fusion-report"],
        ["--fuse", "--fusion-report=json"],
        ["--fuse", "--emit", "triton", "--fusion-report"],
    ],
    ids=["dot", "report", "report-json", "triton-report"],
)
def test_numbered_names_in_every_output(args: list[str], tmp_path: Path) -> None:
    """`%0` is the spec's own spelling: the outputs that copy the module (DOT, the fusion
    report) once failed on it with xDSL's ValueError (exit 2), and the report showed the
    names as encoded while passes run (`%$irc$1`)."""
    import contextlib
    import io

    from irc.tools.opt import run

    path = tmp_path / "numbered.ir"
    path.write_text(NUMBERED)
    for text in (NUMBERED, run_to_text([str(path), "-p", "decompose,fuse"])):
        path.write_text(text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            status = run([str(path), *args], stdout=out)
        assert status == 0, err.getvalue()
        assert "$irc$" not in out.getvalue() + err.getvalue()
        if "report" in args[-1] and text == NUMBERED:  # (a fused module has nothing to report)
            assert "%1" in out.getvalue() + err.getvalue()


NOTED = """func @f(%0: tensor<10x1x{k}xf32>, %1: tensor<1x10x{k}xf32>, %2: tensor<6x8xf32>) -> (tensor<10xf32>, tensor<f32>) {{
  %3 = graph.sub %0, %1 : tensor<10x10x{k}xf32>
  %4 = graph.mul %3, %3 : tensor<10x10x{k}xf32>
  %s.u$m-1 = graph.reduce_sum %4 {{dims = [2]}} : tensor<10x10xf32>
  %5 = graph.reduce_max %s.u$m-1 {{dims = [1]}} : tensor<10xf32>
  %6 = graph.reduce_max %2 {{dims = [1], keepdim = true}} : tensor<6x1xf32>
  %7 = graph.sub %2, %6 : tensor<6x8xf32>
  %8 = graph.reduce_max %7 {{dims = [0, 1]}} : tensor<f32>
  return %5, %8 : tensor<10xf32>, tensor<f32>
}}
"""


@pytest.mark.parametrize("k", [4, 17], ids=["unrolled", "not-unrolled"])
def test_numbered_and_odd_names_in_the_reports_notes(k: int, tmp_path: Path) -> None:
    """The notes of rewrites before fusion (unrolled, not unrolled, nested) name values
    as written, `%5` and `%s.u$m-1`, in text and in JSON: they once showed `%$irc$5`,
    the spelling names take while a pass runs."""
    import contextlib
    import io
    import json

    from irc.tools.opt import run

    path = tmp_path / "noted.ir"
    path.write_text(NOTED.format(k=k))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run([str(path), "--fuse", "--fusion-report"], stdout=io.StringIO()) == 0
    text = err.getvalue()
    note = "  unrolled: " if k == 4 else "  not unrolled: "
    (line,) = [ln for ln in text.splitlines() if ln.startswith(note)]
    assert line.startswith(f"{note}reduce_sum %s.u$m-1 over {k} elements")
    assert line.endswith("reduce_max %5" if k == 17 else "one kernel computes both")
    assert "  nested: reduce_max %8 over dims [0, 1] nested" in text
    out = io.StringIO()
    assert run([str(path), "--fuse", "--fusion-report=json"], stdout=out) == 0
    (report,) = json.loads(out.getvalue())
    notes = report["unrolled"] + report["not_unrolled"] + report["nested"]
    assert len(notes) == 2 and "$irc$" not in text + out.getvalue()


def run_to_text(argv: list[str]) -> str:
    import io

    from irc.tools.opt import run

    out = io.StringIO()
    assert run(argv, stdout=out) == 0
    return out.getvalue()


def test_autotune_keys_a_printed_loop_kernel(tmp_path: Path) -> None:
    """The autotuner copies kernels; printed loop IR names its indices %2, %3."""
    from irc.autotune import kernel_key
    from irc.dialects import loop
    from irc.syntax.parser import parse
    from irc.syntax.printer import print_module

    path = tmp_path / "numbered.ir"
    path.write_text(NUMBERED)
    module = parse(run_to_text([str(path), "-p", "decompose,fuse,graph-to-loop"]), "l.ir")
    before = print_module(module)
    kernel = loop.kernels(module)[0]
    assert len(kernel_key(kernel, "gpu", "3.6")) == 32
    assert print_module(module) == before


# --- valid edge programs: accepted, and compiled into a module that imports ------------------

EDGE_PROGRAMS: dict[str, str] = {
    "graph-identity": "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n}\n",
    "graph-nothing": "func @f() {\n  return\n}\n",
    "loop-identity": "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n  return %x : memref<4xf32>\n}\n",
    "loop-empty-kernel": (
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
        '  loop.kernel {name = "k", bounds = [4]} (%i: index) {\n  }\n'
        "  return %x : memref<4xf32>\n}\n"
    ),
    "tile-empty-kernel": (
        'tile.kernel {name = "k", grid = [1], warps = 1} (%p0: ptr<f32>) {\n}\n\n'
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
        "  tile.launch %x {kernel = @k}\n  return %x : memref<4xf32>\n}\n"
    ),
    "reserved-kernel-names": (
        'tile.kernel {name = "torch", grid = [1], warps = 1} (%p0: ptr<f32>, %p1: ptr<f32>) {\n'
        "  %r = tile.arange {size = 4} : tensor<4xi32>\n"
        "  %v = tile.load %p0, %r : tensor<4xf32>\n  tile.store %p1, %r, %v\n}\n\n"
        'tile.kernel {name = "fn0", grid = [1], warps = 1} (%p0: ptr<f32>, %p1: ptr<f32>) {\n'
        "  %r = tile.arange {size = 4} : tensor<4xi32>\n"
        "  %v = tile.load %p0, %r : tensor<4xf32>\n  tile.store %p1, %r, %v\n}\n\n"
        "func @tl(%x: memref<4xf32>) -> memref<4xf32> {\n  %y = loop.alloc : memref<4xf32>\n"
        "  tile.launch %x, %y {kernel = @torch}\n  tile.launch %y, %x {kernel = @fn0}\n"
        "  return %y : memref<4xf32>\n}\n"
    ),
}
EDGE_OPEN: dict[str, str] = {}
"""Edge programs that still fail, with their finding (F22, an empty kernel as a Python
def without a body, was fixed in session 16: the body is `pass`)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=[pytest.mark.xfail(strict=True, reason=EDGE_OPEN[n])] if n in EDGE_OPEN else []
        )
        for n in EDGE_PROGRAMS
    ],
)
def test_edge_programs_compile(name: str, tmp_path: Path) -> None:
    """Programs at the edges of the language (no kernel, an empty kernel, kernels named
    after what the generated module imports) are accepted, give a module of irc's own
    shape, and load: irc.compile imports it."""
    from irc.testing.fuzz_lowlevel import check_generated

    path = tmp_path / "in" / f"{name}.ir"
    path.parent.mkdir()
    path.write_text(EDGE_PROGRAMS[name])
    box = Sandbox.make(tmp_path / "box")
    result = run_opt([str(path), "--emit", "triton"], box)
    assert result.status == 0, result.stderr
    assert check_generated(result.stdout) is None, check_generated(result.stdout)
    compiled = run_forked(irc_compile(str(path)), box)
    assert compiled.status == 0, compiled.stderr
    assert box.written(keep_cache=True) == []


# --- valid graph programs at the edges of an op's attributes: run and checked ------------

CHECKED_EDGES: dict[str, str] = {
    # A step past the dimension keeps the start alone: once an i32 constant of 2**63 - 1
    # in the kernel (an "after pass" error), and torch's slice in the reference overflowed
    # the step into an empty result (irc-run's internal error).
    "slice-step-2**63-1": (
        "func @f(%x: tensor<4x8xf32>) -> tensor<2x1xf32> {\n"
        "  %s = graph.slice %x {start = [0, 1], end = [4, 8], step = [2, 9223372036854775807]}\n"
        "  %e = graph.exp %s\n  return %e : tensor<2x1xf32>\n}\n"
    ),
}


@pytest.mark.parametrize("name", sorted(CHECKED_EDGES))
def test_checked_edge_programs(name: str, tmp_path: Path) -> None:
    """Valid programs that push an attribute to its edge: irc-opt lowers them to
    Triton, and `irc-run --check` runs them and agrees with the reference."""
    path = tmp_path / "in" / "edge.ir"
    path.parent.mkdir()
    path.write_text(CHECKED_EDGES[name])
    box = Sandbox.make(tmp_path / "box")
    result = run_opt([str(path), "--fuse", "--emit", "triton"], box)
    assert result.status == 0, result.stderr
    checked = run_forked(irc_run([str(path), "--check"]), box)
    assert checked.status == 0, checked.stderr
    assert box.written(keep_cache=True) == []
