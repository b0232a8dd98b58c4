"""A reduction over several dims whose input is made from a row reduction over some
of them is nested in that row reduction's kernel (passes/nest_reductions.py):
layer norm then `amax` over everything reads its input once, in 2 kernels."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.dialects import graph
from irc.passes.fuse import fuse_module
from irc.testing.programs import tensor_type as t
from irc.testing.reference import functions, random_inputs
from irc.testing.reference import run as reference_run

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


def layer_norm_then(kind: str, n: int, h: int, el: str) -> str:
    """Layer norm of [n, h], then `kind` over both dims and sigmoid(y) beside it."""
    x, col, s = t((n, h), el), t((n, 1), el), t((), el)
    return f"""func @f(%x: {x}) -> ({x}, {s}) {{
  %mean = graph.reduce_mean %x {{dims = [1], keepdim = true}} : {col}
  %c = graph.sub %x, %mean : {x}
  %sq = graph.mul %c, %c : {x}
  %var = graph.reduce_mean %sq {{dims = [1], keepdim = true}} : {col}
  %eps = graph.constant {{value = 1.0e-5}} : {t((), el)}
  %ve = graph.add %var, %eps : {col}
  %inv = graph.rsqrt %ve : {col}
  %y = graph.mul %c, %inv : {x}
  %ab = graph.abs %y : {x}
  %r = graph.reduce_{kind} %ab {{dims = [0, 1]}} : {s}
  %sg = graph.sigmoid %y : {x}
  return %sg, %r : {x}, {s}
}}
"""


def reductions(text: str) -> list[tuple[str, list[int]]]:
    module = irc.parse(text, "t.ir")
    reports = fuse_module(module)
    ops = [op for op in module.walk() if isinstance(op, graph.ReduceOp)]
    assert reports
    return [(op.name, sorted(op.reduced_dims())) for op in ops]


@pytest.mark.parametrize(("kind", "el"), [("max", "f32"), ("max", "bf16"), ("sum", "f32")])
def test_layer_norm_then_a_full_reduction_is_two_kernels(kind: str, el: str) -> None:
    text = layer_norm_then(kind, 8192, 4096, el)
    compiled = irc.compile(irc.parse(text, "t.ir"), device="cpu")
    assert compiled.kernel_count == 2  # rows (x read once), then one value a row
    found = reductions(text)
    assert (f"graph.reduce_{kind}", [1]) in found and (f"graph.reduce_{kind}", [0, 1]) in found


def test_half_precision_sums_are_not_nested() -> None:
    """A bf16 inner sum would round to bf16 before the outer one: left whole."""
    found = reductions(layer_norm_then("sum", 64, 32, "bf16"))
    assert ("graph.reduce_sum", [0, 1]) in found and ("graph.reduce_sum", [1]) not in found


def test_a_reduction_not_made_from_a_row_reduction_is_left_whole() -> None:
    x = t((64, 32), "f32")
    text = f"""func @f(%x: {x}) -> ({x}, {t((), "f32")}) {{
  %y = graph.sigmoid %x : {x}
  %m = graph.reduce_max %x {{dims = [0, 1]}} : {t((), "f32")}
  return %y, %m : {x}, {t((), "f32")}
}}
"""
    assert reductions(text) == [("graph.reduce_max", [0, 1])]


def test_report_says_what_was_nested() -> None:
    module = irc.parse(layer_norm_then("max", 64, 32, "f32"), "t.ir")
    (report,) = fuse_module(module)
    (note,) = report.nested
    assert "reduce_max %r over dims [0, 1] nested: dims [1] first" in note
    assert report.as_dict()["nested"] == [note]
    assert "  nested: " in report.text()


@pytest.mark.parametrize(
    ("kind", "el", "n", "h"),
    [("max", "f32", 37, 129), ("max", "bf16", 33, 70), ("min", "f16", 9, 300), ("sum", "f32", 50, 61),
     ("mean", "f32", 17, 1023)],
    ids=str,
)  # fmt: skip
def test_nested_reductions_match_torch(kind: str, el: str, n: int, h: int) -> None:
    text = layer_norm_then(kind, n, h, el)
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=5, device=DEVICE)
    want = reference_run(irc.parse(text, "t.ir"), "f", inputs, device=DEVICE)
    compiled = irc.compile(irc.parse(text, "t.ir"), device=DEVICE)
    assert compiled.kernel_count == 2
    got = compiled.f(*inputs)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w.to(g.dtype), rtol=2e-2 if el != "f32" else 1e-4, atol=1e-3)
    assert torch.is_tensor(got[1])
