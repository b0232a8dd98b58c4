"""irc-run --check: compiled kernels against the reference, fused and unfused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from irc import run as run_cli

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

PROGRAM = """
func @f(%x: tensor<37x300xf32>, %b: tensor<300xf32>) -> (tensor<37x300xf32>, tensor<37x1xf32>) {
  %s = graph.softmax %x {dim = 1}
  %y = graph.add %s, %b
  %m = graph.reduce_max %y {dims = [1], keepdim = true}
  return %y, %m : tensor<37x300xf32>, tensor<37x1xf32>
}
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "p.ir"
    path.write_text(PROGRAM)
    return path


@pytest.mark.parametrize("flags", [[], ["--no-fuse"]])
def test_check_passes_and_reports_errors(
    program: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli.main([str(program), "--device", DEVICE, "--check", *flags]) == 0
    out = capsys.readouterr().out
    mode = "unfused" if flags else "fused"
    assert f"check ({mode}," in out
    assert out.count("ok: max abs err") == 2


def test_fusion_changes_the_kernel_count(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_cli.main([str(program), "--device", DEVICE, "--check"])
    fused = capsys.readouterr().out
    run_cli.main([str(program), "--device", DEVICE, "--check", "--no-fuse"])
    unfused = capsys.readouterr().out

    def kernels(text: str) -> int:
        return int(text.split(" kernels in the file")[0].rsplit(", ", 1)[1])

    assert kernels(fused) < kernels(unfused)


def test_a_wrong_result_fails_the_check(
    program: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_cli.compile_module

    def corrupted(*args: object, **kwargs: object) -> object:
        compiled = real(*args, **kwargs)  # type: ignore[arg-type]
        original = compiled.run

        def run(name: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            outs = original(name, inputs)
            outs[0] = outs[0] + 1e-3
            return outs

        compiled.run = run  # type: ignore[method-assign]
        return compiled

    monkeypatch.setattr(run_cli, "compile_module", corrupted)
    assert run_cli.main([str(program), "--device", DEVICE, "--check"]) == 1
    out = capsys.readouterr().out
    assert "out 0: MISMATCH: max abs err 0.001" in out
    assert "out 1: ok" in out


def test_compare_reports_nan_placement_and_integers() -> None:
    a = torch.tensor([1.0, float("nan")])
    assert run_cli.compare(a, a.clone()).startswith("ok")
    assert run_cli.compare(torch.tensor([1.0, 2.0]), a).startswith("MISMATCH")
    assert run_cli.compare(torch.tensor([1, 2]), torch.tensor([1, 3])) == (
        "MISMATCH: 1 of 2 elements differ"
    )
