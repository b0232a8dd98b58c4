"""irc: a multi-level IR compiler for tensor programs (graph -> loop -> tile -> Triton).

The embedding API:

    import irc
    module = irc.parse(text)                      # or irc.parse_file(path)
    irc.run_pipeline(module, "decompose")         # xDSL ModulePasses by name
    print(irc.print_module(module))
"""

from __future__ import annotations

from irc.compiler import CompiledModule, compile
from irc.diagnostics import Diagnostic, IrcError, Location
from irc.frontend import parse, parse_file
from irc.pipeline import build_pipeline, run_pipeline
from irc.printer import print_module
from irc.verifier import verify

__all__ = [
    "compile",
    "CompiledModule",
    "Diagnostic",
    "IrcError",
    "Location",
    "parse",
    "parse_file",
    "print_module",
    "verify",
    "build_pipeline",
    "run_pipeline",
]
