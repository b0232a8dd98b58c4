# lit configuration for irc's FileCheck tests (tests/lit/*.ir).
#
#     .venv/bin/lit -v tests/lit     # from any directory, venv active or not
#     pytest tests/test_lit.py       # the same suite, as one pytest test
#
# Each test's `// RUN:` lines run through lit's internal shell with `%s` (the
# test file) substituted. `irc-opt` and `filecheck` are found without the
# caller's PATH (see `_tool_dir`), and lit's outputs (`Output/` folders, `%t`
# files, `.lit_test_times.txt`) go outside the source tree (see `_exec_root`).

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import sys
import tempfile

import lit.formats

config.name = "irc"  # noqa: F821 - `config` is provided by lit
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".ir"]  # noqa: F821
# The suite is tests/lit: everything else under tests/ (pytest files, any .ir
# fixtures of other tests) is not a lit test.
here = os.path.dirname(os.path.abspath(__file__))
config.test_source_root = here  # noqa: F821
config.excludes = [n for n in os.listdir(here) if n != "lit"]  # noqa: F821


def _exec_root() -> str:
    """$IRC_LIT_OUTPUT, else a per-user, per-checkout folder under the temp dir.

    lit writes its `Output/` folders and timing file under the exec root; the
    default is the source folder, which would litter the checkout.
    """
    explicit = os.environ.get("IRC_LIT_OUTPUT")
    if explicit:
        return os.path.abspath(explicit)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    checkout = hashlib.sha256(here.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"irc-lit-{user}", checkout)


def _tool_dir(tool: str) -> str:
    """The folder holding `tool`, found without relying on the caller's PATH.

    In order: $IRC_BIN_DIR; the bin folder of the Python running lit (the
    venv's, for `.venv/bin/lit`); the checkout's own `.venv/bin`; then PATH.
    """
    candidates = [
        os.environ.get("IRC_BIN_DIR", ""),
        os.path.dirname(sys.executable),
        os.path.join(os.path.dirname(here), ".venv", "bin"),
    ]
    for folder in candidates:
        if folder and os.access(os.path.join(folder, tool), os.X_OK):
            return os.path.abspath(folder)
    found = shutil.which(tool)
    if found:
        return os.path.dirname(found)
    lit_config.fatal(  # noqa: F821 - `lit_config` is provided by lit
        f"cannot find {tool}: install irc with `pip install -e '.[test]'` into "
        f"{os.path.join(os.path.dirname(here), '.venv')}, run the venv's lit, or set IRC_BIN_DIR"
    )
    raise AssertionError("unreachable")


config.test_exec_root = _exec_root()  # noqa: F821
os.makedirs(config.test_exec_root, exist_ok=True)  # noqa: F821

tool_dirs = list(dict.fromkeys(_tool_dir(t) for t in ("irc-opt", "filecheck")))
config.environment["PATH"] = os.pathsep.join(  # noqa: F821
    [*tool_dirs, os.environ.get("PATH", "")]
)
lit_config.note(f"irc-opt from {_tool_dir('irc-opt')}; outputs in {config.test_exec_root}")  # noqa: F821
# Diagnostics and tool output are plain; keep Python quiet and unbuffered.
config.environment["PYTHONUNBUFFERED"] = "1"  # noqa: F821
config.environment["PYTHONDONTWRITEBYTECODE"] = "1"  # noqa: F821
