"""f32 matmuls compute in full f32 by default; TF32 only when asked."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.compiler import triton_source

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

PROGRAM = """
func @mm(%a: tensor<33x20xf32>, %b: tensor<20x17xf32>) -> tensor<33x17xf32> {
  %c = graph.matmul %a, %b
  return %c : tensor<33x17xf32>
}
"""


def test_default_is_full_precision() -> None:
    source = triton_source(irc.parse(PROGRAM))
    assert "input_precision='ieee'" in source
    assert "tf32" not in source


def test_tf32_when_asked() -> None:
    source = triton_source(irc.parse(PROGRAM), tf32=True)
    assert "input_precision='tf32'" in source


def test_tf32_pass_option_and_compile() -> None:
    module = irc.parse(PROGRAM)
    irc.run_pipeline(module, "graph-to-loop,tile,loop-to-tile{tf32=true}")
    assert "tf32" in triton_source(module)
    compiled = irc.compile(irc.parse(PROGRAM), device=DEVICE, tf32=True)
    a, b = torch.randn(33, 20, device=DEVICE), torch.randn(20, 17, device=DEVICE)
    # The interpreter computes in f32 whatever the precision; on a GPU TF32 keeps
    # 10 bits of mantissa: with K = 20, errors reach a few 1e-3.
    torch.testing.assert_close(compiled.mm(a, b), a @ b, rtol=2e-2, atol=2e-2)


def test_cuda_graphs_need_a_gpu() -> None:
    if DEVICE == "cuda":
        return  # covered by tests/test_gpu.py there
    with pytest.raises(irc.IrcError, match="CUDA graphs need a CUDA GPU"):
        irc.compile(irc.parse(PROGRAM), device="cpu", cuda_graphs=True)
