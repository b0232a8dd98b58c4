"""Grids within CUDA's limits: 65,535 programs at most along axes 1 and 2 (a
batched matmul or an attention of more batches folds them into axis 0), 2**31 - 1
along axis 0 (more is a located refusal, not an error after a pass)."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.compiler import lower_to_tile
from irc.dialects import tile
from irc.lowering import attention_to_tile, loop_to_tile

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

BMM = """func @f(%a: tensor<70000x2x16xf32>, %b: tensor<70000x16x3xf32>) -> tensor<70000x2x3xf32> {
  %c = graph.matmul %a, %b : tensor<70000x2x3xf32>
  return %c : tensor<70000x2x3xf32>
}"""

ATTENTION = """func @f(%q: tensor<B x 40 x 16 x f32>, %k: tensor<B x 40 x 16 x f32>, %v: tensor<B x 40 x 16 x f32>) -> tensor<B x 40 x 16 x f32> {
  %kt = graph.transpose %k {perm = [0, 2, 1]} : tensor<B x 16 x 40 x f32>
  %s = graph.matmul %q, %kt : tensor<B x 40 x 40 x f32>
  %p = graph.softmax %s {dim = 2} : tensor<B x 40 x 40 x f32>
  %o = graph.matmul %p, %v : tensor<B x 40 x 16 x f32>
  return %o : tensor<B x 40 x 16 x f32>
}"""


def grids(text: str) -> list[list[int]]:
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(module, "fuse")
    lower_to_tile(module)
    return [
        [a.value.data for a in k.grid.data]  # type: ignore[attr-defined]
        for k in module.walk()
        if isinstance(k, tile.KernelOp)
    ]


def test_a_batched_matmul_of_70000_batches_folds_them_into_axis_0() -> None:
    assert grids(BMM) == [[70000]]


@pytest.mark.parametrize("program", ["bmm", "attention"])
def test_folded_batches_compute_what_torch_does(
    program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit lowered to 4, six batches take the folded path at a size
    the interpreter runs: each program finds its batch and tile from one id."""
    monkeypatch.setattr(loop_to_tile, "MAX_GRID_Y", 4)
    monkeypatch.setattr(attention_to_tile, "MAX_GRID_Y", 4)
    if program == "bmm":
        text = BMM.replace("70000", "6")
        args = [torch.randn(6, 2, 16, device=DEVICE), torch.randn(6, 16, 3, device=DEVICE)]
        want = torch.bmm(*args)
    else:
        text = ATTENTION.replace(" x ", "x").replace("B", "6")
        args = [torch.randn(6, 40, 16, device=DEVICE) for _ in range(3)]
        want = torch.softmax(args[0] @ args[1].transpose(1, 2), 2) @ args[2]
    grid = grids(text)[-1]  # the matmul's or the attention's (f32 K^T is copied first)
    assert len(grid) == 1 and grid[0] % 6 == 0
    got = irc.compile(irc.parse(text, "t.ir"), device=DEVICE).f(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_grid_past_cuda_s_first_axis_is_a_located_refusal() -> None:
    text = """func @f(%x: tensor<281474976710656xf32>) -> tensor<281474976710656xf32> {
  %y = graph.exp %x : tensor<281474976710656xf32>
  return %y : tensor<281474976710656xf32>
}"""
    with pytest.raises(irc.IrcError) as e:
        grids(text)
    (diagnostic,) = e.value.diagnostics
    assert diagnostic.location is not None and diagnostic.location.line == 2
    assert "a CUDA grid holds at most 2147483647" in diagnostic.message
    assert "after pass" not in diagnostic.message
