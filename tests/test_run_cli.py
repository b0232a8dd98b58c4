"""`irc-run`: output, and every error path (exit 1 for the user's, 2 for irc's)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import irc.tools.run as run_cli
from irc.syntax.parser import op_classes
from irc.testing.reference import EVALUATORS
from irc.tools.run import main, make_arg_parser, summarize

PROGRAM = """\
// Two functions: every one runs unless --fn picks one.
func @softmax(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %y = graph.softmax %x {dim = 1}
  return %y : tensor<8x16xf32>
}

func @many(%a: tensor<4x3xi32>, %s: tensor<f16>, %m: tensor<5xi1>) \
-> (tensor<i32>, tensor<4x3xf16>, tensor<5xi1>) {
  %t = graph.reduce_sum %a {dims = [0, 1]}
  %c = graph.cast %a : tensor<4x3xf16>
  %p = graph.mul %c, %s
  %n = graph.eq %m, %m
  return %t, %p, %n : tensor<i32>, tensor<4x3xf16>, tensor<5xi1>
}
"""


@pytest.fixture
def program(tmp_path: Path) -> str:
    path = tmp_path / "prog.ir"
    path.write_text(PROGRAM)
    return str(path)


def write(tmp_path: Path, text: str, name: str = "t.ir") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_runs_every_function(capsys: pytest.CaptureFixture[str], program: str) -> None:
    rc, out, err = run_main(capsys, program)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "@softmax (seed 0, cpu)"
    assert re.fullmatch(
        r"  out 0 %y: shape=\[8, 16\] dtype=f32 min=\S+ max=\S+ mean=0\.0625 std=\S+", lines[1]
    )
    assert lines[2] == "@many (seed 0, cpu)"
    assert re.fullmatch(r"  out 0 %t: shape=\[\] dtype=i32 value=-?\d+", lines[3])
    assert lines[4].startswith("  out 1 %p: shape=[4, 3] dtype=f16 min=")
    assert lines[5] == "  out 2 %n: shape=[5] dtype=i1 true=5/5"
    assert len(lines) == 6


def test_fn_and_seed(capsys: pytest.CaptureFixture[str], program: str) -> None:
    rc, out, _ = run_main(capsys, program, "--fn", "many")
    assert rc == 0 and out.startswith("@many (seed 0, cpu)\n") and "@softmax" not in out
    rc, out_at, _ = run_main(capsys, program, "--fn", "@many")
    assert rc == 0 and out_at == out
    _, again, _ = run_main(capsys, program, "--fn", "many", "--seed", "0")
    assert again == out
    _, other, _ = run_main(capsys, program, "--fn", "many", "--seed", "1")
    assert other.startswith("@many (seed 1, cpu)\n")
    assert other.splitlines()[1:] != out.splitlines()[1:]


def test_nan_and_inf_are_counted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "func @f(%x: tensor<64xf32>) -> (tensor<64xf32>, tensor<3xf32>, tensor<2xf32>) {\n"
        "  %z = graph.constant {value = 0.0} : tensor<f32>\n"
        "  %i = graph.div %x, %z\n"
        "  %n = graph.constant {value = nan} : tensor<3xf32>\n"
        "  %o = graph.constant {value = 1.0} : tensor<2xf32>\n"
        "  return %i, %n, %o : tensor<64xf32>, tensor<3xf32>, tensor<2xf32>\n}\n",
    )
    rc, out, _ = run_main(capsys, path)
    assert rc == 0
    lines = out.splitlines()
    infs = r"  out 0 %i: shape=\[64\] dtype=f32 no finite values \+inf=(\d+) -inf=(\d+)"
    m = re.fullmatch(infs, lines[1])
    assert m and int(m[1]) + int(m[2]) == 64
    assert lines[2] == "  out 1 %n: shape=[3] dtype=f32 no finite values nan=3"
    assert lines[3] == "  out 2 %o: shape=[2] dtype=f32 min=1 max=1 mean=1 std=0"


def test_summary_of_mixed_values() -> None:
    x = torch.tensor([1.0, float("nan"), 3.0, float("inf")], dtype=torch.bfloat16)
    assert summarize(x) == "shape=[4] dtype=bf16 min=1 max=3 mean=2 std=1 nan=1 +inf=1"
    assert summarize(torch.tensor(2.5)) == "shape=[] dtype=f32 value=2.5"
    assert summarize(torch.tensor([[-3]], dtype=torch.int64)) == "shape=[1, 1] dtype=i64 value=-3"
    assert summarize(torch.tensor(float("-inf"))) == "shape=[] dtype=f32 no finite values -inf=1"
    assert summarize(torch.tensor([True, False])) == "shape=[2] dtype=i1 true=1/2"
    big = torch.tensor([2**62 + 1, -(2**62) - 1, 4])
    assert summarize(big).startswith(f"shape=[3] dtype=i64 min={-(2**62) - 1} max={2**62 + 1} ")
    assert summarize(torch.tensor([-3, 3], dtype=torch.int32)) == (
        "shape=[2] dtype=i32 min=-3 max=3 mean=0 std=3"
    )


def test_summary_is_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(1000, dtype=torch.float64)
    whole = summarize(x)
    monkeypatch.setattr(run_cli, "STATS_CHUNK", 7)
    assert summarize(x) == whole


def test_function_without_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "func @nothing(%x: tensor<2xf32>) {\n  return\n}\n")
    rc, out, _ = run_main(capsys, path)
    assert rc == 0 and out == "@nothing (seed 0, cpu)\n  no outputs\n"


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(PROGRAM.encode())))
    rc, out, _ = run_main(capsys, "-", "--fn", "softmax")
    assert rc == 0 and out.startswith("@softmax")


def test_parser_defaults_and_flags() -> None:
    ap = make_arg_parser()
    args = ap.parse_args(["f.ir"])
    assert (args.fn, args.seed, args.device, args.debug) == (None, 0, "cpu", False)
    assert (args.check, args.no_fuse) == (False, False)
    args = ap.parse_args(["f.ir", "--check", "--no-fuse"])
    assert (args.check, args.no_fuse) == (True, True)


# --- errors ---------------------------------------------------------------------------


def assert_one_line(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err


def test_parse_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = graph.fooo %x\n"
        "  return %y : tensor<4xf32>\n}\n",
    )
    rc, out, err = run_main(capsys, path)
    assert rc == 1 and out == ""
    first, source, caret = err.splitlines()
    assert first.startswith(f"{path}:2:8: error: unknown op 'graph.fooo'")
    assert (source, caret) == ("  %y = graph.fooo %x", "       ^")


def test_verify_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = graph.exp %x : tensor<5xf32>\n"
        "  return %x : tensor<4xf32>\n}\n",
    )
    rc, out, err = run_main(capsys, path)
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"{path}:2:") and ": error: " in err.splitlines()[0]
    assert err.splitlines()[1] == "  %y = graph.exp %x : tensor<5xf32>"


def test_unknown_function(capsys: pytest.CaptureFixture[str], program: str) -> None:
    rc, out, err = run_main(capsys, program, "--fn", "nope")
    assert rc == 1 and out == ""
    assert err == f"irc-run: error: no function @nope in {program} (available: @softmax, @many)\n"


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run_main(capsys, str(tmp_path / "absent.ir"))
    assert rc == 1 and "cannot read" in err
    assert_one_line(err)


def test_no_cuda(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run_main(capsys, program, "--device", "cuda")
    assert rc == 1 and out == ""
    assert err.startswith("irc-run: error: --device cuda: ") and "use --device cpu" in err
    assert_one_line(err)


def test_bad_device_name_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], program: str
) -> None:
    """A bad command line exits 1, as bad input does: 2 means a bug in irc."""
    with pytest.raises(SystemExit) as e:
        main([program, "--device", "tpu"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("irc-run: error: argument --device: invalid choice: 'tpu'")
    assert_one_line(err)


def test_too_large_to_allocate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    t = "tensor<100000x100000x100xf32>"
    text = f"func @big(%x: {t}) -> {t} {{\n  %y = graph.exp %x\n  return %y : {t}\n}}\n"
    path = write(tmp_path, text)
    rc, out, err = run_main(capsys, path)
    assert rc == 1 and out == ""
    # Located at the function, as every error of the user's input is.
    assert re.fullmatch(
        re.escape(path) + r":1:1: error: @big needs about \S+ TiB of memory on cpu "
        r"\(inputs 3\.6 TiB\), but only \S+ \S+ is available\nfunc @big.*\n\^\n",
        err,
    )


def test_memory_is_checked_before_anything_runs(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_cli, "available_host_bytes", lambda: 1000)
    rc, out, err = run_main(capsys, program)
    assert rc == 1 and out == ""
    assert err.startswith(f"{program}:2:1: error: @softmax needs about")
    assert "but only 1000 B is available\nfunc @softmax(" in err
    assert "Traceback" not in err


def test_input_too_large_for_the_host_is_located(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--device cuda draws inputs on the host first: one larger than its free memory
    is refused at the function, before anything runs (no GPU needed to get there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        run_cli, "available_bytes", lambda d: 2**50 if d.type == "cuda" else 100
    )
    rc, out, err = run_main(capsys, program, "--device", "cuda")
    assert rc == 1 and out == ""
    assert err.startswith(
        f"{program}:2:1: error: @softmax: an input of 512 B does not fit in the 100 B of "
        "free host memory\nfunc @softmax("
    )


def test_out_of_memory_while_running(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom(*args: object, **kwargs: object) -> list[torch.Tensor]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail")

    monkeypatch.setattr(run_cli, "run_function", oom)
    rc, _, err = run_main(capsys, program)
    assert rc == 1
    assert err.startswith(
        f"{program}:2:1: error: ran out of memory on cpu while running @softmax: "
        "CUDA out of memory. Tried to allocate 2 GiB\nfunc @softmax("
    )


def test_unsupported_op_is_a_located_error(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(EVALUATORS, op_classes()["graph.softmax"])
    rc, _, err = run_main(capsys, program, "--fn", "softmax")
    assert rc == 1
    assert err.startswith(f"{program}:3:3: error: irc-run evaluates graph-level IR only")


def test_lower_level_ir_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path, "func @m(%a: memref<4xf32>) -> memref<4xf32> {\n  return %a : memref<4xf32>\n}\n"
    )
    rc, out, err = run_main(capsys, path)
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.startswith(
        f"{path}:1:1: error: irc-run runs graph-level functions only; "
        "@m takes or returns memref<4xf32>"
    )


def test_internal_error(
    capsys: pytest.CaptureFixture[str], program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> list[torch.Tensor]:
        raise ZeroDivisionError("a bug\nsecond line")

    monkeypatch.setattr(run_cli, "run_function", broken)
    rc, _, err = run_main(capsys, program)
    assert rc == 2
    assert err == (
        "irc-run: internal error: ZeroDivisionError: a bug "
        "(run with --debug for the traceback)\n"
    )
    rc, _, err = run_main(capsys, program, "--debug")
    assert rc == 2
    assert "Traceback (most recent call last)" in err
    assert err.endswith("irc-run: internal error: ZeroDivisionError: a bug\n")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_matches_cpu_summary(capsys: pytest.CaptureFixture[str], program: str) -> None:
    rc, cpu, _ = run_main(capsys, program, "--fn", "many")
    assert rc == 0
    rc, cuda, _ = run_main(capsys, program, "--fn", "many", "--device", "cuda")
    assert rc == 0
    assert cuda.replace("cuda)", "cpu)") == cpu


def test_installed_script(program: str) -> None:
    exe = shutil.which("irc-run")
    if exe is None:
        pytest.skip("irc-run is not installed")
    ok = subprocess.run(
        [exe, program, "--fn", "softmax"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("@softmax (seed 0, cpu)\n  out 0 %y: shape=[8, 16] dtype=f32 ")
    bad = subprocess.run([exe, program, "--fn", "x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("irc-run: error: no function @x")
