"""f32 matmuls compute to f32's accuracy by default (three TF32 tensor-core products
of split operands, `split-tf32`); one TF32 product only when asked; f64 in full."""

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


def test_default_is_three_tf32_products_of_split_operands() -> None:
    source = triton_source(irc.parse(PROGRAM))
    assert "_irc_dot_split_tf32(" in source
    assert "input_precision" not in source.split("def fn0")[0]  # no single TF32 dot
    f64 = triton_source(irc.parse(PROGRAM.replace("f32", "f64")))
    assert "input_precision='ieee'" in f64 and "split_tf32(" not in f64


def _relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got.double() - exact).abs().max() / exact.abs().max()).item()


def test_split_operands_keep_f32_accuracy() -> None:
    """Operands with all 24 bits of mantissa, K = 300: a single TF32 product (11
    bits) errs by about 1e-4 of the result; the split by about f32's own error.
    The parts are exact in TF32, so the interpreter's f32 dots give what the GPU's
    TF32 ones do, but for the order of the sums."""
    torch.manual_seed(0)
    a = torch.randn(33, 300, device=DEVICE) * 1.2345678
    b = torch.randn(300, 17, device=DEVICE) * 0.9876543
    text = PROGRAM.replace("33x20", "33x300").replace("20x17", "300x17")
    got = irc.compile(irc.parse(text), device=DEVICE).mm(a, b)
    exact = a.double() @ b.double()
    assert _relative_error(got, exact) <= 4 * max(_relative_error(a @ b, exact), 1e-7)


def test_split_operands_keep_torchs_infinities_and_the_largest_floats() -> None:
    """An inf times a weight exact in TF32 (tail 0) is inf, not inf * 0 = NaN; a
    NaN stays NaN; an operand within an ulp of the largest f32 is split (its head
    truncated, not rounded up to inf), so a product that fits stays finite."""
    a = torch.ones(33, 20, device=DEVICE)
    a[0, 0] = float("inf")
    a[1, 1] = -float("inf")
    a[2, 2] = float("nan")
    a[3, :] = 0.0
    a[3, 0] = 3.4028234e38
    b = torch.full((20, 17), 0.5, device=DEVICE)
    b[:, 1] = 1.0 + 2**-20  # a tail in every row
    b[:, 2] = -0.25
    got = irc.compile(irc.parse(PROGRAM), device=DEVICE).mm(a, b)
    want = a @ b
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite])


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
