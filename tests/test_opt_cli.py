"""irc-opt's mlir-opt habits: `--pass-pipeline='builtin.module(...)'`, `--version`,
`--timing`, `--print-ir-before-all` / `--print-ir-after-all` over every pass a run
goes through, `--dump-pass-pipeline` (and its round trip through `-p`), usage
errors (exit 1, `irc-opt: error: ...`; 2 stays an internal error).

The fusion report's names and counts are tested in test_fusion.py, malformed
`expected-*` annotations in test_diagnostics.py (with every other message).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import irc.tools.opt
import irc.tools.run

SOFTMAX = """func @softmax(%x: tensor<37x300xf32>) -> tensor<37x300xf32> {
  %y = graph.softmax %x {dim = 1} : tensor<37x300xf32>
  return %y : tensor<37x300xf32>
}
"""

DUMP = re.compile(r"^// -----// IR Dump (Before|After) ([\w-]+) //----- //$", re.MULTILINE)


def opt(tmp_path: Path, *args: str, source: str = SOFTMAX) -> tuple[int, str, str]:
    """irc-opt in-process on `source`: (exit status, stdout, stderr)."""
    path = tmp_path / "in.ir"
    path.write_text(source)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(path), *args])
    return status, out.getvalue(), err.getvalue()


def dumps(err: str) -> list[tuple[str, str]]:
    return DUMP.findall(err)


def dumped_ir(err: str, when: str, name: str) -> str:
    """The IR printed under one `IR Dump {when} {name}` header."""
    parts = re.split(r"^// -----// IR Dump .*$\n", err, flags=re.MULTILINE)
    headers = dumps(err)
    return parts[1 + headers.index((when, name))]


# --- --pass-pipeline ----------------------------------------------------------------


def test_pass_pipeline_in_mlir_form_is_the_same_run(tmp_path: Path) -> None:
    plain = opt(tmp_path, "-p", "decompose,fuse,graph-to-loop,tile{block=512}")
    for args in (
        ["--pass-pipeline=builtin.module(decompose,fuse,graph-to-loop,tile{block=512})"],
        ["--pass-pipeline", " builtin.module( decompose,fuse,graph-to-loop,tile{block=512} ) "],
        ["-p", "builtin.module(decompose,fuse)", "-p", "graph-to-loop,tile{block=512}"],
    ):
        status, out, err = opt(tmp_path, *args)
        assert (status, err) == (0, ""), args
        assert out == plain[1], args
    assert plain[0] == 0 and "loop.kernel" in plain[1]


def test_pass_pipeline_in_mlir_form_keeps_command_line_order(tmp_path: Path) -> None:
    """`-p` and the per-pass flags run in the order they are written."""
    status, _, err = opt(
        tmp_path,
        "--decompose",
        "--pass-pipeline=builtin.module(fuse)",
        "--graph-to-loop",
        "--print-ir-after-all",
    )
    assert status == 0
    assert [name for _, name in dumps(err)] == ["decompose", "fuse", "graph-to-loop"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "builtin.module(func.func(fuse))",
            "nests a pass manager 'func.func(...)' at column 16: irc's passes run on the "
            "whole module, list them directly in builtin.module(...)",
        ),
        ("func.func(fuse)", "is anchored on 'func.func'"),
        ("builtin.module(fuse", "expected ')' at its end, closing 'builtin.module('"),
        ("builtin.module(fuse,nope)", "unknown pass 'nope'"),
    ],
)
def test_pass_pipeline_errors(tmp_path: Path, spec: str, message: str) -> None:
    status, out, err = opt(tmp_path, f"--pass-pipeline={spec}")
    assert status == 1 and out == ""
    assert err.startswith("irc-opt: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_a_parenthesis_inside_an_option_string_is_no_nesting() -> None:
    from irc.pipeline import build_pipeline
    from irc.syntax.diagnostics import IrcError

    # The value reaches the pass, which judges it: no "nests a pass manager" error.
    with pytest.raises(IrcError) as e:
        build_pipeline('builtin.module(fuse{report="("})')
    assert e.value.diagnostics[0].message == "fuse: 'report' must be text or json, got '('"


# --- --version and usage errors ---------------------------------------------------------


def test_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert irc.tools.opt.run(["--version"]) == 0
    assert capsys.readouterr().out == f"irc-opt {version('irc')}\n"
    with pytest.raises(SystemExit) as e:
        irc.tools.run.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"irc-run {version('irc')}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag"], "irc-opt: error: unrecognized arguments: --no-such-flag"),
        (["--emit", "llvm"], "irc-opt: error: argument --emit: invalid choice: 'llvm'"),
        (["-p"], "irc-opt: error: argument -p/--pass-pipeline/--pipeline: expected one argument"),
        (
            ["--fusion-report"],
            "irc-opt: error: --fusion-report describes the fuse pass: add --fuse",
        ),
        (["--autotune"], "irc-opt: error: --autotune chooses kernel tilings"),
    ],
)
def test_usage_errors_exit_1(tmp_path: Path, args: list[str], message: str) -> None:
    status, out, err = opt(tmp_path, *args)
    assert status == 1 and out == ""
    assert err.startswith(message), err
    assert len(err.splitlines()) == 1 and "usage:" not in err


def test_missing_input_file_exits_1(tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(tmp_path / "nope.ir")])
    assert status == 1
    assert err.getvalue().startswith("irc-opt: error: cannot read ")


def test_console_scripts_exit_1_on_usage_errors(tmp_path: Path) -> None:
    """The installed commands: 1 for a bad command line, 0 for --version; 2 is left to
    internal errors (argparse's own default would have been 2)."""
    bindir = Path(sys.executable).parent
    for tool in ("irc-opt", "irc-run"):
        proc = subprocess.run(
            [str(bindir / tool), "--bogus"], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 1, (tool, proc.stderr)
        assert proc.stderr.startswith(f"{tool}: error: "), proc.stderr
        assert "Traceback" not in proc.stderr
        proc = subprocess.run(
            [str(bindir / tool), "--version"], capture_output=True, text=True, timeout=120
        )
        assert (proc.returncode, proc.stdout) == (0, f"{tool} {version('irc')}\n")


# --- --print-ir-before-all / --print-ir-after-all ----------------------------------------


def test_print_ir_after_all_shows_every_level_of_emit_triton(tmp_path: Path) -> None:
    """`--fuse --emit triton` lowers after the pipeline; every pass of that lowering
    is dumped too, in order, at its level: graph, loop, tiled loop, tile."""
    from irc.pipeline import LOWERING

    status, out, err = opt(tmp_path, "--fuse", "--emit", "triton", "--print-ir-after-all")
    assert status == 0 and out.startswith("#") and "IR Dump" not in out
    names = [name for when, name in dumps(err) if when == "After"]
    assert names == ["fuse", *LOWERING]
    assert "graph.fused" in dumped_ir(err, "After", "decompose")
    assert "loop.kernel" in dumped_ir(err, "After", "graph-to-loop")
    assert re.search(r"loop\.kernel \{.*block = ", dumped_ir(err, "After", "tile"))
    tile_ir = dumped_ir(err, "After", "loop-to-tile")
    assert "tile.kernel" in tile_ir and "loop.kernel" not in tile_ir
    # Without the flag nothing goes to stderr, and the output is the same.
    plain = opt(tmp_path, "--fuse", "--emit", "triton")
    assert plain == (0, out, "")


def test_print_ir_before_all(tmp_path: Path) -> None:
    status, _, err = opt(tmp_path, "--fuse", "--emit", "triton", "--print-ir-before-all")
    assert status == 0
    assert all(when == "Before" for when, _ in dumps(err))
    names = [name for _, name in dumps(err)]
    assert names[0] == "fuse" and "loop-to-tile" in names
    assert "graph.softmax" in dumped_ir(err, "Before", "fuse")  # the input, untouched
    assert "loop.kernel" in dumped_ir(err, "Before", "loop-to-tile")
    both = opt(tmp_path, "-p", "decompose", "--print-ir-before-all", "--print-ir-after-all")[2]
    assert dumps(both) == [("Before", "decompose"), ("After", "decompose")]


# --- --dump-pass-pipeline -------------------------------------------------------------


def _pipeline(err: str) -> tuple[int, str]:
    m = re.search(r"^Pass Manager with (\d+) passes:\n(builtin\.module\(.*\))\n", err, re.MULTILINE)
    assert m, err
    return int(m.group(1)), m.group(2)


def test_dump_pass_pipeline_round_trips_through_p(tmp_path: Path) -> None:
    """The dump lists every pass the run went through, with every option's value;
    given back to -p (or --pass-pipeline) it is the same run, byte for byte."""
    status, out, err = opt(tmp_path, "--fuse", "--emit", "triton", "--dump-pass-pipeline")
    assert status == 0 and "Pass Manager" not in out
    count, pipeline = _pipeline(err)
    assert pipeline.startswith("builtin.module(fuse{max-ops=64 ") and "tile{block=" in pipeline
    assert count == pipeline.count(",") + 1  # no option holds a comma here
    for flag in ("-p", "--pass-pipeline"):
        again = opt(tmp_path, flag, pipeline, "--emit", "triton", "--dump-pass-pipeline")
        assert again[0] == 0 and again[1] == out
        assert _pipeline(again[2]) == (count, pipeline)
    # Options other than the defaults come back too.
    status, _, err = opt(
        tmp_path, "-p", "decompose,graph-to-loop,tile{block=256}", "--dump-pass-pipeline"
    )
    assert "tile{block=256 rblock=8192 " in _pipeline(err)[1]


def test_dump_pass_pipeline_once_for_split_input(tmp_path: Path) -> None:
    source = SOFTMAX + "// -----\n" + SOFTMAX
    status, _, err = opt(
        tmp_path, "--split-input-file", "--decompose", "--dump-pass-pipeline", source=source
    )
    assert status == 0 and err == "Pass Manager with 1 passes:\nbuiltin.module(decompose)\n\n"


# --- --timing -------------------------------------------------------------------------------


def test_timing_report(tmp_path: Path) -> None:
    from irc.pipeline import LOWERING

    status, out, err = opt(tmp_path, "--fuse", "--emit", "triton", "--timing")
    assert status == 0 and out == opt(tmp_path, "--fuse", "--emit", "triton")[1]
    assert "... Execution time report ..." in err
    total = re.search(r"Total Execution Time: ([0-9.]+) seconds", err)
    assert total
    rows = re.findall(r"^  +([0-9.]+) \( *([0-9.]+)%\)  (.+)$", err, re.MULTILINE)
    labels = [label for _, _, label in rows]
    top = [label for label in labels if not label.startswith(" ")]
    assert top == ["Parser", "Verifier", "fuse", *LOWERING, "Output", "Rest", "Total"]
    assert labels.count("  verifier") == 1 + len(LOWERING)  # one under each pass
    seconds = {label: float(t) for t, _, label in rows if not label.startswith(" ")}
    assert seconds["Total"] == pytest.approx(float(total.group(1)), abs=1e-4)
    # The top-level rows add up to the total.
    parts = sum(t for label, t in seconds.items() if label != "Total")
    assert parts == pytest.approx(seconds["Total"], abs=5e-4 * len(seconds))


def test_timing_without_verifier(tmp_path: Path) -> None:
    status, _, err = opt(tmp_path, "--decompose", "--timing", "--no-verify")
    assert status == 0
    labels = re.findall(r"^  +[0-9.]+ \( *[0-9.]+%\)  (.+)$", err, re.MULTILINE)
    assert labels == ["Parser", "Verifier", "decompose", "Output", "Rest", "Total"]


def test_autotune_runs_inside_the_instrumented_lowering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--autotune measures the tilings between `tile` and `loop-to-tile` on the module
    the run dumps and times (the GPU parts stubbed: this runs on a CPU)."""
    import torch

    import irc.autotune
    import irc.target

    seen: list[str] = []

    def fake_autotune(module: object, device: str) -> None:
        seen.append(device)
        print("// autotuned here", file=sys.stderr)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(irc.target, "cuda_target", lambda: irc.target.Target(block=512))
    monkeypatch.setattr(irc.autotune, "autotune_module", fake_autotune)
    status, out, err = opt(
        tmp_path, "--fuse", "--emit", "triton", "--autotune", "--print-ir-after-all"
    )
    assert status == 0 and seen == ["cuda"] and out.startswith("#")
    order = [line for line in err.splitlines() if "IR Dump" in line or "autotuned" in line]
    at = order.index("// autotuned here")
    assert order[at - 1].endswith("IR Dump After tile //----- //")
    assert order[at + 1].startswith("// -----// IR Dump After ")
    assert "loop-to-tile" in " ".join(order[at + 1 :])
