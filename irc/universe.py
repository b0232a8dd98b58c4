"""irc's dialects and passes as an xDSL `Universe`.

Registered under the `xdsl.universe` entry point in pyproject.toml, so that
`xdsl-opt` can read irc's `--emit mlir` output and run irc passes by name.
"""

from __future__ import annotations

from xdsl.universe import Universe

from irc.dialects import DIALECTS
from irc.passes import PASSES, XDSL_PASSES

IRC_UNIVERSE = Universe(
    all_dialects=dict(DIALECTS),
    all_passes={name: load for name, load in PASSES.items() if name not in XDSL_PASSES},
)
"""irc's own passes: the xDSL ones irc's pipeline runs (`dce`) xdsl-opt has already."""
