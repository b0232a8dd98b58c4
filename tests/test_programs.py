"""`irc.testing.programs`: the shared `.ir` builders parse, verify and mean what
their docstrings say (checked against torch on the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import irc
from irc.testing.programs import cos_reshape_cos, gemm_text, tensor_type


def test_tensor_types() -> None:
    assert tensor_type((4, 5)) == "tensor<4x5xf32>"
    assert tensor_type((7,), "bf16") == "tensor<7xbf16>"
    assert tensor_type(()) == "tensor<f32>"


@pytest.mark.parametrize(
    ("a_t", "b_t", "act", "both"),
    [(False, False, "gelu", False), (True, True, "relu", True), (False, True, "silu", False)],
)
def test_gemm_text_is_act_of_x_at_w_plus_b(a_t: bool, b_t: bool, act: str, both: bool) -> None:
    m, n, k = 9, 7, 5
    compiled = irc.compile(
        irc.parse(gemm_text(m, n, k, act=act, a_t=a_t, b_t=b_t, returns_product=both), "g.ir"),
        device="cpu",
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn((k, m) if a_t else (m, k), generator=g)
    w = torch.randn((n, k) if b_t else (k, n), generator=g)
    b = torch.randn(n, generator=g)
    mm = (x.T if a_t else x) @ (w.T if b_t else w)
    want = {"gelu": F.gelu, "relu": torch.relu, "silu": F.silu}[act](mm + b)
    got = compiled(x, w, b)
    if both:
        assert_close(got[0], mm)
        assert_close(got[1], want)
    else:
        assert_close(got, want)


def test_cos_reshape_cos() -> None:
    compiled = irc.compile(irc.parse(cos_reshape_cos(6, 10), "c.ir"), device="cpu")
    x, w = torch.randn(60), torch.randn(10)
    assert_close(compiled(x, w), torch.cos(torch.cos(x).reshape(6, 10)) * w)
