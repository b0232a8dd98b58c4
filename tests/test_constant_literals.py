"""A constant's literal says its type below the graph level: `8.0 : i32` is an error there
(Triton would make an fp32 of it), while graph.constant's `8.0` for an integer tensor is
the integer 8, which graph-to-loop writes as `8`."""

from __future__ import annotations

import torch
from xdsl.dialects.builtin import IntegerAttr

import irc
from irc.dialects import loop
from irc.testing import reference

PROGRAM = """\
func @f(%x: tensor<37xi32>) -> tensor<37xi32> {
  %c = graph.constant {value = 8.0} : tensor<37xi32>
  %y = graph.add %x, %c
  return %y : tensor<37xi32>
}
"""


def test_a_whole_float_for_an_integer_graph_constant_lowers_to_an_integer() -> None:
    module = irc.parse(PROGRAM, "f.ir")
    irc.verify(module)
    lowered = irc.run_pipeline(module, "graph-to-loop")
    (constant,) = [op for op in lowered.walk() if isinstance(op, loop.ConstantOp)]
    assert isinstance(constant.value, IntegerAttr) and constant.value.value.data == 8
    assert "{value = 8} : i32" in irc.print_module(lowered)
    compiled = irc.compile(irc.parse(PROGRAM, "f.ir"), device="cpu")
    x = torch.randint(-1000, 1000, (37,), dtype=torch.int32)
    (got,) = compiled.run("f", [x])
    (want,) = reference.run_function(reference.functions(irc.parse(PROGRAM, "f.ir"))["f"], [x])
    assert torch.equal(got, want) and torch.equal(got, x + 8)
