"""The cyclic collector is paused while irc works on IR, and put back as it was."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import irc.tools.opt
from irc.gcpause import paused_gc

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "softmax.ir"


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_back_on_after() -> None:
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: still off, and the outer one turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_exception() -> None:
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_caller_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_decorator_form() -> None:
    @paused_gc()
    def state() -> bool:
        return gc.isenabled()

    assert state() is False and gc.isenabled()


def test_irc_opt_runs_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[bool] = []
    real = irc.tools.opt._run

    def spy(args: argparse.Namespace, out: object) -> int:
        seen.append(gc.isenabled())
        return real(args, out)

    monkeypatch.setattr(irc.tools.opt, "_run", spy)
    assert irc.tools.opt.run(["--fuse", "--emit", "triton", str(EXAMPLE)]) == 0
    assert seen == [False] and gc.isenabled()
    assert "@triton.jit" in capsys.readouterr().out
