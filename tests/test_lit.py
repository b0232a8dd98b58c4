"""Runs the lit/FileCheck suite (tests/lit) so that plain `pytest` runs every test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _lit_env() -> dict[str, str]:
    # irc-opt and filecheck live next to the Python that runs the tests.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def test_tools_are_installed() -> None:
    env = _lit_env()
    for tool in ("irc-opt", "filecheck"):
        assert shutil.which(tool, path=env["PATH"]), f"{tool} is not on PATH"


def test_lit_suite_passes() -> None:
    lit_tests = [p for p in (HERE / "lit").rglob("*.ir") if "Output" not in p.parts]
    assert len(lit_tests) >= 8
    proc = subprocess.run(
        # `python -m lit` does not work with every lit release; its entry point does.
        [sys.executable, "-c", "import sys, lit.main; sys.exit(lit.main.main())", "-v", HERE / "lit"],
        capture_output=True,
        text=True,
        env=_lit_env(),
        timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    # Every test file ran and passed (none unsupported or skipped).
    assert f"Passed: {len(lit_tests)}" in report, report
    assert "Failed" not in report and "Unsupported" not in report, report
