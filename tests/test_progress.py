"""The progress bar of kernels on Triton's interpreter (irc.runtime.progress): shown
only when wanted and only for long launches, with an estimate of the time left."""

from __future__ import annotations

import io

import pytest
import torch

from irc.runtime import progress
from irc.runtime.progress import PROGRESS_ENV, ProgressBar, wanted


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_shown_on_a_terminal_or_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert wanted(Terminal()) and not wanted(io.StringIO())
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert wanted(io.StringIO())
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not wanted(Terminal())


def test_a_long_launch_shows_the_programs_done_and_the_time_left() -> None:
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(100, "k", out, clock, enabled=True)
    clock.now += 2.0
    bar.step(10)  # 0.2 s a program: 18 s left
    assert out.getvalue() == "\rk [###...........................] 10/100 programs, 18 s left"
    clock.now += 2.0
    bar.step(10)
    assert out.getvalue().endswith("20/100 programs, 16 s left")
    bar.close()
    assert out.getvalue().endswith("\rk: 100 programs in 4.0 s\n")


def test_a_short_launch_shows_nothing() -> None:
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(100, "k", out, clock, enabled=True)
    clock.now += 0.5  # not yet SHOW_AFTER_S
    bar.step(50)
    clock.now += 0.6  # past it, but 2.2 s in all: under SHOW_IF_TOTAL_S
    bar.step(1)
    bar.close()
    assert out.getvalue() == ""


def test_nothing_when_not_wanted() -> None:
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(10, "k", out, clock, enabled=False)
    clock.now += 60
    bar.step(1)
    bar.close()
    assert out.getvalue() == ""


def test_interpreted_launches_count_their_programs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import irc

    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "SHOW_IF_TOTAL_S", 0.0)
    text = """
func @f(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %y = graph.exp %x : tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}
"""
    compiled = irc.compile(irc.parse(text), device="cpu", fuse=False)
    x = torch.randn(4, 32)
    capsys.readouterr()
    torch.testing.assert_close(compiled.f(x), x.exp())
    err = capsys.readouterr().err
    launches = compiled.source.count("_launch(")
    assert err.count(" programs in ") == launches >= 1, err


def test_quiet_in_tests(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wanted(__import__("sys").stderr)
