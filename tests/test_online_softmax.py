"""Softmax rows too long for registers (more than 59,392 elements: see tile's
`unrolled_row_tiling`): max and sum share one pass (online softmax)."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.compiler import triton_source

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

LONG = """
func @softmax(%x: tensor<5x60000xf32>) -> tensor<5x60000xf32> {
  %y = graph.softmax %x {dim = 1}
  return %y : tensor<5x60000xf32>
}
"""
SHORT = LONG.replace("60000", "300")


def kernel_source(program: str) -> str:
    module = irc.parse(program)
    irc.run_pipeline(module, "fuse")
    source = triton_source(module)
    assert source.count("def triton_") == 1
    return source[source.index("def triton_") :]


def test_long_rows_are_read_twice_not_three_times() -> None:
    source = kernel_source(LONG)
    assert source.count("for ") == 2  # max+sum together, then the output
    assert source.count("tl.load(") == 2


def test_short_rows_stay_in_registers() -> None:
    source = kernel_source(SHORT)
    assert "for " not in source
    assert source.count("tl.load(") == 1


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_online_softmax_matches_torch(scale: float) -> None:
    compiled = irc.compile(irc.parse(LONG), device=DEVICE)
    x = torch.randn(5, 60000, device=DEVICE) * scale
    x[1] = -float("inf")
    x[1, 4321] = 2.0  # one finite value, late in the row
    x[2, 7] = float("nan")
    x[3, 59999] = 80.0  # the max in the last, ragged chunk
    torch.testing.assert_close(compiled.softmax(x), torch.softmax(x, 1), equal_nan=True)


def test_the_online_pass_takes_one_exp_an_element() -> None:
    """A new value rescales the lane's sum or adds to it, both by exp(-|x - m|)."""
    source = kernel_source(LONG)
    online = source[source.index("for ") : source.index("tl.reduce(")]  # the first loop
    assert online.count("tl.exp(") == 1 and "tl.abs(" in online and "tl.fma(" in online


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_online_softmax_in_gpu_chunks_matches_torch(
    scale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interpreter's own tiling holds these rows whole; the GPU's loops over them
    in chunks (the online pass), which this runs on the CPU too."""
    from irc.target import CPU_TILING_ENV

    monkeypatch.setenv(CPU_TILING_ENV, "gpu")
    compiled = irc.compile(irc.parse(LONG), device=DEVICE)
    assert "tl.abs(" in compiled.source
    x = torch.randn(5, 60000, device=DEVICE) * scale
    x[0, :30000] = -float("inf")  # lanes that see only -inf for a while
    x[1] = -float("inf")  # a row of -inf: NaN, as torch
    x[2, 7] = float("nan")
    x[3, 59999] = 80.0  # the max in the last, ragged chunk
    x[4, 123] = float("inf")
    torch.testing.assert_close(compiled.softmax(x), torch.softmax(x, 1), equal_nan=True)
    want = torch.softmax(x[0].double(), 0)
    got, theirs = compiled.softmax(x)[0].double(), torch.softmax(x, 1)[0].double()
    assert (got - want).abs().max() <= 4 * (theirs - want).abs().max()


def test_the_pass_runs_in_the_default_pipeline_and_alone() -> None:
    from irc.pipeline import LOWERING

    assert (
        LOWERING.index("tile") < LOWERING.index("online-softmax") < LOWERING.index("loop-to-tile")
    )
    module = irc.parse(LONG)
    irc.run_pipeline(module, "decompose,fuse,graph-to-loop,tile,online-softmax")
    text = irc.print_module(module)
    assert text.count("loop.softmax_reduce") == 1 and "loop.reduce" not in text
    # Without it (a pipeline written by hand), the row is read three times, still right.
    module = irc.parse(LONG)
    irc.run_pipeline(module, "decompose,fuse,graph-to-loop,tile,loop-to-tile,tile-cse,dce")
    assert sum(1 for op in module.walk() if op.name == "tile.for") == 3


def test_a_softmax_reduce_on_rows_in_registers_is_right() -> None:
    # Rewritten while rows are looped, then re-tiled so that they fit in registers:
    # loop-to-tile lowers the op in one chunk.
    module = irc.parse(LONG.replace("60000", "3000"))
    irc.run_pipeline(
        module,
        "decompose,fuse,graph-to-loop,tile{persistent-rblock=2048 rblock=1024 unrolled-rblock=0},online-softmax",
    )
    irc.run_pipeline(module, "tile")
    assert "loop.softmax_reduce" in irc.print_module(module)
    irc.run_pipeline(module, "loop-to-tile,tile-cse,dce")
    assert not any(op.name == "tile.for" for op in module.walk())
    compiled = irc.compile(module, device=DEVICE)
    x = torch.randn(5, 3000, device=DEVICE) * 20.0
    x[1] = -float("inf")
    x[1, 17] = 1.0
    torch.testing.assert_close(compiled.softmax(x), torch.softmax(x, 1))
