"""What irc's command-line tools share: usage errors exit 1, and `--version`.

argparse ends a bad command line with exit status 2, which irc's tools keep
for internal errors (a bug in irc). A usage error is the user's, like bad
input: one line, `PROG: error: MESSAGE`, and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_ERROR = 1
"""The exit status of a bad command line (the same as bad input)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with irc's usage errors: `PROG: error: ...`, exit 1."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(USAGE_ERROR)


def version() -> str:
    """irc's version, from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("irc")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def add_version(ap: argparse.ArgumentParser) -> None:
    """`--version`: `PROG VERSION` on stdout, exit 0."""
    ap.add_argument("--version", action="version", version=f"{ap.prog} {version()}")
