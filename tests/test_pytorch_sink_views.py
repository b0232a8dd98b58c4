"""irc/pytorch/sink_views.py: element-wise work on a split 2-D value moves above the
reshape, only where the 2-D form computes the same elements."""

from __future__ import annotations

import irc
from irc.pytorch.sink_views import sink_views

HEADER = "func @f(%m: tensor<8x16xf32>, %b: tensor<16xf32>, %r: tensor<2x4x16xf32>, %c: tensor<2x1x16xf32>) -> tensor<2x4x16xf32> {\n"


def _sunk(body: str) -> str:
    module = irc.parse(HEADER + body + "}\n")
    sink_views(module.ops.first)  # type: ignore[arg-type]
    irc.verify(module)
    return irc.print_module(module)


def test_bias_gelu_and_residual_stay_2d() -> None:
    text = _sunk(
        "  %v = graph.reshape %m : tensor<2x4x16xf32>\n"
        "  %a = graph.add %v, %b\n"
        "  %g = graph.gelu %a\n"
        "  %y = graph.add %r, %g\n"
        "  return %y : tensor<2x4x16xf32>\n"
    )
    assert "%a = graph.add %m, %b : tensor<8x16xf32>" in text
    assert "%g = graph.gelu %a : tensor<8x16xf32>" in text
    assert "%y.in = graph.reshape %r : tensor<8x16xf32>" in text
    assert "%y = graph.add %y.in, %g : tensor<8x16xf32>" in text
    assert "return %y.view : tensor<2x4x16xf32>" in text
    assert text.count("graph.reshape") == 2  # %r in, the result out


def test_a_broadcast_along_a_leading_dim_keeps_the_view() -> None:
    body = (
        "  %v = graph.reshape %m : tensor<2x4x16xf32>\n"
        "  %y = graph.mul %v, %c : tensor<2x4x16xf32>\n"
        "  return %y : tensor<2x4x16xf32>\n"
    )
    text = _sunk(body)
    assert "%y = graph.mul %v, %c : tensor<2x4x16xf32>" in text


def test_a_widening_cast_for_a_reduction_keeps_the_view() -> None:
    """A residual sum stays 2-D (the GEMM's epilogue), its f32 cast and square, which
    an RMSNorm's mean reads, do not: sunk, the GEMM would store `float(h)` and its
    square in f32, where the norm's row kernel can load `h` in bf16 and widen it."""
    header = "func @f(%m: tensor<8x16xbf16>, %r: tensor<2x4x16xbf16>) -> (tensor<2x4x16xbf16>, tensor<2x4x1xf32>) {\n"
    module = irc.parse(
        header + "  %v = graph.reshape %m : tensor<2x4x16xbf16>\n"
        "  %h = graph.add %r, %v\n"
        "  %f = graph.cast %h : tensor<2x4x16xf32>\n"
        "  %s = graph.mul %f, %f\n"
        "  %n = graph.reduce_mean %s {dims = [2], keepdim = true} : tensor<2x4x1xf32>\n"
        "  return %h, %n : tensor<2x4x16xbf16>, tensor<2x4x1xf32>\n}\n"
    )
    sink_views(module.ops.first)  # type: ignore[arg-type]
    irc.verify(module)
    text = irc.print_module(module)
    assert "%h = graph.add %h.in, %m : tensor<8x16xbf16>" in text
    assert "%f = graph.cast %h.view : tensor<2x4x16xf32>" in text
    assert "%s = graph.mul %f, %f : tensor<2x4x16xf32>" in text


def test_a_widening_cast_for_element_wise_work_sinks() -> None:
    """`linear(x).float()` (a head's logits): the GEMM stores the f32 value itself,
    rather than a bf16 one that another kernel widens. Narrowing casts sink too."""
    for src, dst in (("bf16", "f32"), ("f32", "bf16")):
        module = irc.parse(
            f"func @f(%m: tensor<8x16x{src}>) -> tensor<2x4x16x{dst}> {{\n"
            f"  %v = graph.reshape %m : tensor<2x4x16x{src}>\n"
            f"  %c = graph.cast %v : tensor<2x4x16x{dst}>\n"
            f"  return %c : tensor<2x4x16x{dst}>\n}}\n"
        )
        sink_views(module.ops.first)  # type: ignore[arg-type]
        assert f"%c = graph.cast %m : tensor<8x16x{dst}>" in irc.print_module(module)
