"""The decomposition table both entry points capture with.

It starts from `core_aten_decompositions()`, keeps whole the ops irc has a
graph op or composite for (softmax, layer norm, GELU, SiLU: one op each, so
the compiler sees and fuses them as such), and lets everything else
decompose. Scaled dot-product attention decomposes to matmuls and a softmax:
irc has no attention op yet.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

KEPT_WHOLE = (
    aten._softmax.default,
    aten.native_layer_norm.default,
    aten.gelu.default,
    aten.silu.default,
    aten._log_softmax.default,
    aten.var_mean.correction,
    aten.addmm.default,
)
"""Core ATen ops irc converts itself (irc/pytorch/aten.py): addmm as matmul + add,
var_mean and _log_softmax as short formulas over graph ops."""


def irc_decompositions() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table
