"""irc's passes, one a file, each an xDSL `ModulePass`.

`PASSES` maps each pass name to a loader of its class (the shape xDSL's
`Universe` and `PassPipeline.parse_spec` expect), so importing this package
stays cheap and an xDSL-based compiler can pick passes by name.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _decompose() -> type[ModulePass]:
    from irc.passes.decompose import DecomposePass

    return DecomposePass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "decompose": _decompose,
}
