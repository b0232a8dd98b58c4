"""`irc-run --check` end to end: the command line, every kind of output, a planted codegen bug.

tests/test_run_check.py covers the report format and a corrupted result; here
the real executable runs (exit status, one verdict line per output, integer,
boolean, half, rank-0 and NaN-holding outputs), and a bug planted in the
Triton emitter (not in the results) must be caught.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from irc.lowering import tile_to_triton
from irc.tools import run as run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

PROGRAM = """\
// log of normal inputs: NaN wherever x < 0, in the reference and in irc alike.
func @ops(%x: tensor<37x30xf32>, %b: tensor<30xf16>, %i: tensor<5x7xi32>, %s: tensor<f32>) \
-> (tensor<37x30xf32>, tensor<30xf16>, tensor<7xi32>, tensor<37x30xi1>, tensor<f32>) {
  %l = graph.log %x : tensor<37x30xf32>
  %h = graph.exp %b : tensor<30xf16>
  %r = graph.reduce_max %i {dims = [0]} : tensor<7xi32>
  %c = graph.gt %x, %s : tensor<37x30xi1>
  %m = graph.reduce_mean %x {dims = [0, 1]} : tensor<f32>
  return %l, %h, %r, %c, %m : tensor<37x30xf32>, tensor<30xf16>, tensor<7xi32>, \
tensor<37x30xi1>, tensor<f32>
}

func @mm(%a: tensor<5x130xf32>, %w: tensor<130x3xf32>) -> tensor<5x3xf32> {
  %y = graph.matmul %a, %w : tensor<5x3xf32>
  return %y : tensor<5x3xf32>
}
"""

FLOAT_OK = re.compile(r"^    out \d: ok: max abs err \S+, max rel err \S+(; from f64, irc vs torch: .*)?$")
AGAINST_F64 = re.compile(
    r"from f64, irc vs torch: max abs (\S+) vs (\S+) \(.*\), in tolerances (\S+) vs (\S+) "
    r"\(.*\); limit 4x$"
)
EXACT_OK = re.compile(r"^    out \d: ok: 0 of \d+ elements differ$")


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IRC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "ops.ir"
    path.write_text(PROGRAM)
    return path


def irc_run(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("irc-run", path=os.path.dirname(sys.executable))
    assert exe is not None, "irc-run is not installed next to this Python"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("    out ")]


@pytest.mark.parametrize("flags", [[], ["--no-fuse"]], ids=["fused", "unfused"])
def test_the_command_checks_every_output(program: Path, flags: list[str]) -> None:
    proc = irc_run(str(program), "--check", "--seed", "3", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    mode = "unfused" if flags else "fused"
    assert out.count(f"check ({mode}, ") == 2  # one block per function
    lines = verdicts(out)
    assert len(lines) == 6  # five outputs of @ops, one of @mm
    ops = lines[:5]
    # f32 with NaNs in the same places, f16, i32, i1, a rank-0 f32, then the matmul.
    assert FLOAT_OK.match(ops[0]) and FLOAT_OK.match(ops[1]) and FLOAT_OK.match(ops[4])
    assert EXACT_OK.match(ops[2]) and EXACT_OK.match(ops[3])
    assert FLOAT_OK.match(lines[5])
    assert "nan=" in out  # the NaN-holding output was really there


def test_one_function_and_another_seed(program: Path) -> None:
    proc = irc_run(str(program), "--check", "--fn", "@mm", "--seed", "11")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("@mm (seed 11, cpu)\n")
    assert "@ops" not in proc.stdout
    assert len(verdicts(proc.stdout)) == 1


@pytest.mark.parametrize("flags", [[], ["--no-fuse"]], ids=["fused", "unfused"])
def test_a_planted_codegen_bug_is_caught(
    program: Path,
    flags: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """exp emitted 0.2% too large (two f16 ulps): only the f16 output built on it fails,
    with its error against torch and both errors against f64 (irc's beyond 4x torch's)."""
    monkeypatch.setitem(tile_to_triton.UNARY, "exp", "tl.exp({0}) * 1.002")
    assert run_cli.main([str(program), "--check", *flags]) == 1
    lines = verdicts(capsys.readouterr().out)
    assert len(lines) == 6
    bad = re.match(r"^    out 1: MISMATCH: max abs err (\S+), max rel err (\S+); (.*)$", lines[1])
    assert bad, lines[1]
    assert 1e-3 < float(bad.group(2)) < 4e-3
    f64 = AGAINST_F64.match(bad.group(3))
    assert f64, bad.group(3)
    irc_abs, torch_abs, irc_tol, torch_tol = map(float, f64.groups())
    assert irc_abs > 4 * torch_abs or irc_tol > 4 * torch_tol
    others = [line for i, line in enumerate(lines) if i != 1]
    assert all(" ok: " in line for line in others), others


@pytest.mark.parametrize("example", ["mlp.ir", "mlp2.ir"])
def test_the_bundled_mlps_pass(example: str) -> None:
    """Their f16 and f32 matmuls round otherwise than torch's (assert_close rejects
    them), but irc is no further from f64 than torch is: both errors are printed."""
    proc = irc_run(str(EXAMPLES / example), "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = verdicts(proc.stdout)
    assert lines and all(FLOAT_OK.match(line) for line in lines), lines
    weighed = [AGAINST_F64.search(line) for line in lines if "from f64" in line]
    assert weighed, lines  # the f64 leg was needed (the old check said MISMATCH)
    for m in weighed:
        assert m is not None
        irc_abs, torch_abs, irc_tol, torch_tol = map(float, m.groups())
        assert irc_abs <= 4 * torch_abs and irc_tol <= 4 * torch_tol


def test_the_unplanted_emitter_passes_again(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # With the emitter as it is, the same program checks clean in process too.
    assert run_cli.main([str(program), "--check"]) == 0
    assert all(" ok: " in line for line in verdicts(capsys.readouterr().out))
