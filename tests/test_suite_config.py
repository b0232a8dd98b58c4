"""The test suite's own setup: a fast default run, a `slow` group, and CI running both.

The fast run is what a contributor runs in the inner loop (the README's test
command); the `slow` group is the rest, and CI runs the two so that every test
still runs somewhere.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest_ini() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_slow_is_registered_and_left_out_by_default() -> None:
    ini = _pytest_ini()
    assert any(str(m).startswith("slow:") for m in ini["markers"])  # type: ignore[attr-defined]
    assert '-m "not slow"' in str(ini["addopts"])
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pytest-xdist") for d in extra["optional-dependencies"]["test"])


def _run(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _ran(output: str) -> set[tuple[str, str]]:
    # -q's progress dots share lines with the tests' prints.
    words = output.split()
    return {(words[i + 1], words[i + 2]) for i, w in enumerate(words) if w.endswith("RAN")}


def test_default_run_is_fast_and_slow_group_is_the_rest(tmp_path: Path) -> None:
    """The real pyproject and conftest on a small op x dtype grid named like a thinned file.

    The fast run keeps every op and every dtype at least once and marks the
    rest slow; `-m slow` runs exactly the rest; an explicit mark is honoured.
    """
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_lowering_ops.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('el', ['f32', 'f16', 'bf16'])\n"
        "@pytest.mark.parametrize('op', ['exp', 'log', 'neg', 'abs'])\n"
        "def test_grid(op, el):\n"
        "    print('RAN', op, el)\n"
        "@pytest.mark.slow\n"
        "def test_long():\n"
        "    pass\n"
        "def test_quick():\n"
        "    pass\n"
    )
    fast = _run(tmp_path, "-s")
    slow = _run(tmp_path, "-s", "-m", "slow")
    ran_fast, ran_slow = _ran(fast), _ran(slow)
    assert {op for op, _ in ran_fast} == {"exp", "log", "neg", "abs"}
    assert {el for _, el in ran_fast} == {"f32", "f16", "bf16"}
    assert ran_fast and ran_slow and not ran_fast & ran_slow
    assert len(ran_fast | ran_slow) == 12
    assert f"{len(ran_fast) + 1} passed" in fast  # the grid's subset and test_quick
    assert f"{len(ran_slow) + 1} passed" in slow  # the rest and test_long
    everything = _run(tmp_path, "-m", "")
    assert "14 passed" in everything


def test_readme_and_ci_run_the_fast_command_and_the_slow_group() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    fast = "ruff check . && pytest -q -n auto"
    assert fast in readme and fast in ci
    assert "pytest -q -n auto -m slow" in readme and "pytest -q -n auto -m slow" in ci
