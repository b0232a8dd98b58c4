"""irc-opt in process, on a program written to a test's temporary folder."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def run_opt(tmp_path: Path, text: str, *args: str) -> tuple[int, str, str]:
    """`irc-opt input.ir ARGS` on `text` (written to `tmp_path`): its exit status,
    stdout and stderr, as a user would see them (the fusion report, diagnostics)."""
    from irc.tools.opt import run

    path = tmp_path / "input.ir"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run([str(path), *args], stdout=out)
    return status, out.getvalue(), err.getvalue()
