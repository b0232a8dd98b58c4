"""irc: a multi-level IR compiler for tensor programs (graph -> loop -> tile -> Triton).

The embedding API:

    import irc
    module = irc.parse(text)                      # or irc.parse_file(path)
    irc.run_pipeline(module, "decompose")         # xDSL ModulePasses by name
    print(irc.print_module(module))

A thin facade: each name is imported from its home on first use, so that
`import irc.dialects.graph` does not load the compiler driver, torch or Triton.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from irc.analysis.verifier import verify
    from irc.compiler import CompiledModule, compile
    from irc.pipeline import build_pipeline, run_pipeline
    from irc.pytorch.export import export_ir
    from irc.syntax.diagnostics import Diagnostic, IrcError, Location
    from irc.syntax.parser import parse, parse_file
    from irc.syntax.printer import print_module

_HOMES = {
    "compile": "irc.compiler",
    "CompiledModule": "irc.compiler",
    "export_ir": "irc.pytorch.export",
    "Diagnostic": "irc.syntax.diagnostics",
    "IrcError": "irc.syntax.diagnostics",
    "Location": "irc.syntax.diagnostics",
    "parse": "irc.syntax.parser",
    "parse_file": "irc.syntax.parser",
    "print_module": "irc.syntax.printer",
    "verify": "irc.analysis.verifier",
    "build_pipeline": "irc.pipeline",
    "run_pipeline": "irc.pipeline",
}

__all__ = [
    "compile",
    "CompiledModule",
    "export_ir",
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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'irc' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
