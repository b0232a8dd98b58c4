"""Runs the lit/FileCheck suite (tests/lit) so that plain `pytest` runs every test.

Also holds lit's configuration (tests/lit.cfg.py) to its promises: it runs
from any directory without the venv on PATH, and writes nothing into the
source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The venv's `lit` script: its shebang is the venv's Python, so it needs no
# activated environment.
LIT = Path(sys.executable).parent / "lit"


def _lit_env(out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["IRC_LIT_OUTPUT"] = str(out)
    return env


def _run_lit(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LIT), "-v", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_tools_are_installed() -> None:
    for tool in ("irc-opt", "filecheck", "lit"):
        assert (Path(sys.executable).parent / tool).exists(), f"{tool} is not in the venv"


def test_lit_suite_passes(tmp_path: Path) -> None:
    lit_tests = [p for p in (HERE / "lit").rglob("*.ir") if "Output" not in p.parts]
    assert len(lit_tests) >= 8
    proc = _run_lit([str(HERE / "lit")], _lit_env(tmp_path / "out"), cwd=tmp_path)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    # Every test file ran and passed (none unsupported or skipped).
    assert f"Passed: {len(lit_tests)}" in report, report
    assert "Failed" not in report and "Unsupported" not in report, report


def test_lit_runs_standalone_and_writes_outside_the_source_tree(tmp_path: Path) -> None:
    """From a foreign cwd, with PATH holding only the system's folders.

    parse_print.ir writes `%t`; it must land under $IRC_LIT_OUTPUT, and
    nothing under tests/ may be created or touched by the run.
    """
    target = HERE / "lit" / "parse_print.ir"
    assert "%t" in target.read_text()
    scrubbed_path = os.pathsep.join(
        d for d in ("/usr/bin", "/bin") if not (Path(d) / "irc-opt").exists()
    )
    assert shutil.which("irc-opt", path=scrubbed_path) is None
    env = {"PATH": scrubbed_path, "HOME": str(tmp_path), "IRC_LIT_OUTPUT": str(tmp_path / "out")}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()

    def tree() -> dict[Path, float]:
        return {
            p: p.stat().st_mtime
            for p in HERE.rglob("*")
            if "__pycache__" not in p.parts and p.exists()
        }

    before = tree()
    started = time.time()
    proc = _run_lit([str(target)], env, cwd=cwd)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "Passed: 1" in report, report
    # The venv's irc-opt was found without PATH, and lit says where from.
    assert f"irc-opt from {Path(sys.executable).parent}" in report, report

    written = list((tmp_path / "out").rglob("parse_print.ir.tmp"))
    assert written and written[0].stat().st_mtime >= started - 1, report
    assert list(cwd.iterdir()) == []
    after = tree()
    new = [p for p in after if p not in before]
    touched = [p for p in after if p in before and after[p] > before[p] and after[p] >= started]
    # Only lit's own outputs would appear here; other tests running in
    # parallel do not write under tests/.
    assert not [p for p in new + touched if "Output" in p.parts or p.name.startswith(".lit")], (
        new,
        touched,
    )
