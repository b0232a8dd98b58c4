# lit configuration for irc's FileCheck tests (tests/lit/*.ir).
#
#     lit -v tests/lit        # or: pytest tests/test_lit.py
#
# Each test's `// RUN:` lines run through lit's internal shell with `%s` (the
# test file) substituted; `irc-opt` and `filecheck` come from the environment
# that runs lit (the virtual environment's bin directory is put first on PATH).

import os
import sys

import lit.formats

config.name = "irc"  # noqa: F821 - `config` is provided by lit
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".ir"]  # noqa: F821
# The suite is tests/lit: everything else under tests/ (pytest files, any .ir
# fixtures of other tests) is not a lit test.
here = os.path.dirname(os.path.abspath(__file__))
config.excludes = [n for n in os.listdir(here) if n != "lit"]  # noqa: F821

bindir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join(  # noqa: F821
    [bindir, os.environ.get("PATH", "")]
)
# Diagnostics and tool output are plain; keep Python quiet and unbuffered.
config.environment["PYTHONUNBUFFERED"] = "1"  # noqa: F821
config.environment["PYTHONDONTWRITEBYTECODE"] = "1"  # noqa: F821
