"""Small programs that once broke a lowering, compiled and checked against torch."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.reference import functions, random_inputs, run_function

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

PROGRAMS = {
    "rank0_transpose": """
func @t(%s: tensor<f32>) -> tensor<f32> {
  %t = graph.transpose %s {perm = []}
  %e = graph.exp %t
  return %e : tensor<f32>
}
""",
}


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_reference(name: str, fuse: bool) -> None:
    module = irc.parse(PROGRAMS[name])
    compiled = irc.compile(module, device=DEVICE, fuse=fuse)
    for fname, fn in functions(module).items():
        inputs = random_inputs(fn, seed=1, device=DEVICE)
        for got, want in zip(compiled.run(fname, inputs), run_function(fn, inputs), strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)
