"""irc's dialects and passes as an xDSL `Universe`.

Registered under the `xdsl.universe` entry point in pyproject.toml, so that
`xdsl-opt` can read irc's `--emit mlir` output and run irc passes by name.
"""

from __future__ import annotations

from xdsl.universe import Universe

from irc.dialects import DIALECTS
from irc.passes import PASSES

IRC_UNIVERSE = Universe(all_dialects=dict(DIALECTS), all_passes=dict(PASSES))
