"""Half-precision ops that commute with rounding skip the rounding of their operands.

relu(round(s)) rounds to the same half value as relu(s) (max, min, neg, abs and
where alike), so loop-to-tile rounds once, after the op. The results must stay
those of torch computing in the half type, edge values included.
"""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.dialects import tile
from irc.pipeline import AFTER_TILING, run_pipeline
from irc.testing.reference import functions, run_function

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
N = 64

# op name -> the body after `%s = graph.add %x, %y` (result %r), every op in the half type.
BODIES = {
    "relu": "%r = graph.relu %s",
    "maximum": "%c = graph.constant {value = 0.3} : tensor<T>\n  %r = graph.maximum %s, %c",
    "minimum": "%r = graph.minimum %s, %x",
    "neg": "%r = graph.neg %s",
    "abs": "%r = graph.abs %s",
    "where": "%k = graph.gt %s, %y\n  %r = graph.where %k, %s, %y",
}


def program(op: str, el: str) -> str:
    t = f"tensor<{N}x{el}>"
    body = BODIES[op].replace("tensor<T>", f"tensor<{el}>")
    return f"""func @f(%x: {t}, %y: {t}) -> ({t}, {t}) {{
  %s = graph.add %x, %y
  {body}
  %e = graph.exp %r
  return %r, %e : {t}, {t}
}}
"""


def edge_inputs(el: str) -> list[torch.Tensor]:
    """Sums that round (ties too), overflow to +-inf, are NaN or cancel to +-0."""
    dt = TYPES[el]
    big = 60000.0 if el == "f16" else 3.0e38
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, generator=g) * 3
    y = torch.randn(N, generator=g) * 3
    edges_x = [big, -big, float("nan"), 1.0, -1.0, 0.0, -0.0, 1.0, 2.0**-14, -(2.0**-14)]
    edges_y = [big, -big, 1.0, 2.0**-9, -(2.0**-9), -0.0, -0.0, -1.0, -(2.0**-15), 2.0**-15]
    x[: len(edges_x)] = torch.tensor(edges_x)
    y[: len(edges_y)] = torch.tensor(edges_y)
    return [x.to(dt).to(DEVICE), y.to(dt).to(DEVICE)]


@pytest.mark.parametrize("el", sorted(TYPES))
@pytest.mark.parametrize("op", sorted(BODIES))
def test_commuting_op_matches_torch_exactly(op: str, el: str) -> None:
    module = irc.parse(program(op, el), "t.ir")
    inputs = edge_inputs(el)
    want = run_function(functions(module)["f"], [i.cpu() for i in inputs])
    got = irc.compile(module, device=DEVICE)["f"](*inputs)
    for g, w in zip(got, want, strict=True):
        # Exact: one rounding of the same f32 value, as torch's half op does.
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


def narrowing_casts(text: str) -> int:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile," + ",".join(AFTER_TILING))
    return sum(
        1
        for op in module.walk()
        if isinstance(op, tile.ApplyOp)
        and op.fn.data == "cast"
        and "bf16" in str(op.result.type)
    )


def test_the_operand_round_trip_is_gone_only_before_commuting_ops() -> None:
    t = "tensor<8x16xbf16>"
    relu = f"""func @f(%x: {t}, %y: {t}) -> {t} {{
  %s = graph.add %x, %y
  %r = graph.relu %s
  return %r : {t}
}}
"""
    # relu(x + y): one rounding, at the store; exp(x + y): the sum is rounded first.
    assert narrowing_casts(relu) == 1
    assert narrowing_casts(relu.replace("graph.relu", "graph.exp")) == 2
