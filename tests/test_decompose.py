"""decompose: softmax and layer_norm become primitives that compute what PyTorch does."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.dialects import graph
from irc.testing.reference import functions, random_inputs, run_function

CASES = [
    ("softmax", "tensor<4x8xf32>", "{dim = 1}", "f32"),
    ("softmax", "tensor<4x8xf32>", "{dim = 0}", "f32"),
    ("softmax", "tensor<2x3x5xf32>", "{dim = -2}", "f32"),
    ("softmax", "tensor<7xf64>", "{dim = 0}", "f64"),
    ("softmax", "tensor<4x33xf16>", "{dim = -1}", "f16"),
    ("softmax", "tensor<4x33xbf16>", "{dim = 1}", "bf16"),
    ("layer_norm", "tensor<4x8xf32>", "{dims = [1]}", "f32"),
    ("layer_norm", "tensor<2x3x8xf32>", "{dims = [1, 2], eps = 0.1}", "f32"),
    ("layer_norm", "tensor<2x3x8xf32>", "{dims = [-1], eps = 1}", "f32"),
    ("layer_norm", "tensor<6x16xf16>", "{dims = [1]}", "f16"),
    ("layer_norm", "tensor<6x16xbf16>", "{dims = [-1]}", "bf16"),
]


def program(op: str, ty: str, attrs: str) -> str:
    if op == "softmax":
        return (
            f"func @f(%x: {ty}) -> {ty} {{\n"
            f"  %y = graph.softmax %x {attrs} : {ty}\n"
            f"  return %y : {ty}\n}}\n"
        )
    shape = ty[len("tensor<") : -1].split("x")
    element = shape.pop()
    dims = [int(d) for d in attrs.split("[")[1].split("]")[0].split(",")]
    normalized = [shape[d] for d in sorted(d % len(shape) for d in dims)]
    wt = "tensor<" + "x".join([*normalized, element]) + ">"
    return (
        f"func @f(%x: {ty}, %w: {wt}, %b: {wt}) -> {ty} {{\n"
        f"  %y = graph.layer_norm %x, %w, %b {attrs} : {ty}\n"
        f"  return %y : {ty}\n}}\n"
    )


@pytest.mark.parametrize(("op", "ty", "attrs", "element"), CASES, ids=[str(c) for c in CASES])
def test_decomposed_program_computes_the_composite(
    op: str, ty: str, attrs: str, element: str
) -> None:
    text = program(op, ty, attrs)
    composite = irc.parse(text)
    decomposed = irc.parse(text)
    irc.run_pipeline(decomposed, "decompose")
    ops = {o.name for o in decomposed.walk()}
    assert f"graph.{op}" not in ops
    if element in ("f16", "bf16"):  # computed in f32, rounded once at the end
        casts = [o for o in decomposed.walk() if isinstance(o, graph.CastOp)]
        assert casts[-1].result.type == composite.body.block.first_op.function_type.outputs.data[0]  # type: ignore[union-attr]
    fn, dfn = functions(composite)["f"], functions(decomposed)["f"]
    for seed in range(3):
        inputs = random_inputs(fn, seed=seed)
        (want,) = run_function(fn, inputs)
        (got,) = run_function(dfn, inputs)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = {"f16": 2e-3, "bf16": 1.6e-2}.get(element)
        assert_close(got, want, atol=tol, rtol=tol)


def test_extreme_inputs_do_not_overflow() -> None:
    # softmax subtracts the row max first: large inputs stay finite.
    text = program("softmax", "tensor<2x4xf32>", "{dim = 1}")
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose")
    x = torch.tensor([[1000.0, 1001.0, 999.0, -1000.0], [-1e30, 0.0, 1e30, 3.0]])
    (y,) = run_function(functions(module)["f"], [x])
    assert torch.isfinite(y).all()
    assert_close(y, torch.softmax(x, 1))


def test_decompose_changes_nothing_else() -> None:
    text = (
        "func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
        "  %unused = graph.exp %x : tensor<4x8xf32>\n"
        "  %s = graph.softmax %x {dim = 1} : tensor<4x8xf32>\n"
        "  %also_unused = graph.reduce_sum %s {dims = [0]} : tensor<8xf32>\n"
        "  %y = graph.neg %s : tensor<4x8xf32>\n"
        "  return %y : tensor<4x8xf32>\n"
        "}\n"
    )
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose")
    printed = irc.print_module(module)
    # Unused ops are the program's business, not decompose's.
    assert "%unused = graph.exp %x" in printed
    assert "%also_unused = graph.reduce_sum %s {dims = [0]}" in printed
    assert "%s = graph.div" in printed and "%y = graph.neg %s" in printed
    # A program without composites is left exactly as it was.
    plain = irc.parse(text.replace("graph.softmax %x {dim = 1}", "graph.exp %x"))
    before = irc.print_module(plain)
    irc.run_pipeline(plain, "decompose")
    assert irc.print_module(plain) == before


def test_decomposed_ops_keep_the_composites_location() -> None:
    text = program("layer_norm", "tensor<4x8xf32>", "{dims = [1]}")
    module = irc.parse(text, "ln.ir")
    irc.run_pipeline(module, "decompose")
    fn = functions(module)["f"]
    locations = {str(op.location) for op in fn.body.block.ops if op.name.startswith("graph.")}
    assert locations == {'loc("ln.ir":2:3)'}
