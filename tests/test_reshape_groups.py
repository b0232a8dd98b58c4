"""A reshape's index map divides only the dims it merges or splits.

`[B, H, T, D] -> [B * H, T, D]` (what SDPA's 4-d inputs become) used to unravel
the flat index into every source dim: a division and a remainder on each
address of an attention's inner loop, and offsets whose contiguity Triton could
not see. The map now goes group by group (MLIR's reassociation)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.compiler import lower_to_tile
from irc.dialects import loop, tile
from irc.lowering.graph_to_loop import reshape_groups
from irc.passes.tile import kernel_shape, tiling_of
from irc.pipeline import run_pipeline
from irc.testing.reference import functions, random_inputs
from irc.testing.reference import run as reference_run

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


@pytest.mark.parametrize(
    ("src", "dst", "groups"),
    [
        ((1, 32, 1024, 64), (32, 1024, 64), [([1], [0]), ([2], [1]), ([3], [2])]),
        ((8, 4, 16), (32, 16), [([0, 1], [0]), ([2], [1])]),
        ((32, 16), (8, 4, 16), [([0], [0, 1]), ([1], [2])]),
        ((6, 10), (4, 15), [([0, 1], [0, 1])]),
        ((2, 1, 3, 1), (6,), [([0, 2], [0])]),
        ((1,), (1, 1), []),
        ((30, 37), (10, 3, 37), [([0], [0, 1]), ([1], [2])]),
    ],
)
def test_reshape_groups_split_where_both_prefix_products_meet(
    src: tuple[int, ...], dst: tuple[int, ...], groups: list[tuple[list[int], list[int]]]
) -> None:
    assert reshape_groups(src, dst) == groups


def _chain(src: tuple[int, ...], dst: tuple[int, ...]) -> str:
    t = lambda s: f"tensor<{'x'.join(map(str, s))}xf32>"  # noqa: E731
    return f"""func @f(%x: {t(src)}) -> {t(dst)} {{
  %a = graph.exp %x : {t(src)}
  %r = graph.reshape %a : {t(dst)}
  %b = graph.neg %r : {t(dst)}
  %c = graph.add %b, %r : {t(dst)}
  return %c : {t(dst)}
}}
"""


def _index_fns(text: str) -> list[str]:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,graph-to-loop")
    return [
        op.fn.data
        for op in module.walk()
        if isinstance(op, loop.ApplyOp) and op.fn.data in ("floordiv", "mod")
    ]


def test_only_the_dims_a_reshape_regroups_are_divided() -> None:
    # Dropping a unit dim and splitting a result dim: each source index is a
    # result index or a sum of them.
    assert _index_fns(_chain((1, 32, 16, 8), (32, 16, 8))) == []
    assert _index_fns(_chain((32, 16, 8), (4, 8, 16, 8))) == []
    # Merging two source dims into one result dim splits that index only: one
    # division and one remainder (where the whole index was unravelled into
    # every dim before: 2 divisions, 2 remainders).
    assert sorted(_index_fns(_chain((4, 8, 16, 8), (32, 16, 8)))) == ["floordiv", "mod"]


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((1, 6, 5, 4), (6, 5, 4)),
        ((6, 5, 4), (2, 3, 20)),
        ((6, 10), (4, 15)),
        ((2, 1, 3, 1, 5), (1, 6, 5)),
        ((7, 9, 2), (3, 21, 2)),
        ((3, 4, 5), (5, 4, 3)),
    ],
)
def test_grouped_reshapes_match_torch(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    text = _chain(src, dst)
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=5, device=DEVICE)
    (want,) = reference_run(irc.parse(text, "t.ir"), "f", inputs, device=DEVICE)
    got = irc.compile(irc.parse(text, "t.ir"), device=DEVICE).f(*inputs)
    assert_close(got, want)
    assert_close(got, torch.exp(inputs[0]).reshape(dst).neg() + torch.exp(inputs[0]).reshape(dst))


def test_sdpa_shaped_attention_gets_tensor_core_tiles_and_no_division() -> None:
    """`graph.attention` on 4-d bf16 inputs widens Q and K to f32 for its scores;
    its dot still runs in bf16 (the products are exact), so it gets the same
    128-row tiles as attention written out in bf16 (64 keys a step:
    `ATTENTION_SCORES`)."""
    text = """func @attn(%q: tensor<1x8x256x64xbf16>, %k: tensor<1x8x256x64xbf16>, %v: tensor<1x8x256x64xbf16>) -> tensor<1x8x256x64xbf16> {
  %o = graph.attention %q, %k, %v : tensor<1x8x256x64xbf16>
  return %o : tensor<1x8x256x64xbf16>
}
"""
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,graph-to-loop")
    (kernel,) = loop.kernels(module)
    assert kernel_shape(kernel).half
    assert tiling_of(kernel).block == (128, 64)
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    lower_to_tile(module)
    fns = {op.fn.data for op in module.walk() if isinstance(op, tile.ApplyOp)}
    assert fns.isdisjoint({"floordiv", "mod"})
