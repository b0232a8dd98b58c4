"""`sink_transposes` through reductions that keep their dims, on random programs:
a permute of random rank and order, an element-wise op with a broadcast operand, a
reduction of a random kind over random dims (negative ones too), and an op reading
the permuted value and the reduction. The move must happen (the report says so, the
kernel loads `x` in its own order) and the result must be torch's, values and
strides, on random inputs in Triton's interpreter."""

from __future__ import annotations

import os
import random

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.dialects import loop
from irc.passes.fuse import fuse_module

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"

REDUCTIONS = {
    "reduce_sum": lambda z, dims: z.sum(dims, keepdim=True),
    "reduce_max": lambda z, dims: z.amax(dims, keepdim=True),
    "reduce_min": lambda z, dims: z.amin(dims, keepdim=True),
    "reduce_mean": lambda z, dims: z.mean(dims, keepdim=True),
}
COMBINE = {"sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum}


def _t(shape: list[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>" if shape else "tensor<f32>"


def _program(seed: int) -> tuple[str, object, list[list[int]]]:
    rng = random.Random(seed)
    rank = rng.randint(2, 4)
    shape = [rng.randint(2, 7) for _ in range(rank)]
    perm = list(range(rank))
    while perm == sorted(perm):
        rng.shuffle(perm)
    out = [shape[p] for p in perm]
    dims = sorted(rng.sample(range(rank), rng.randint(1, rank - 1)))
    written = [d - rank if rng.random() < 0.5 else d for d in dims]
    kept = [1 if i in dims else n for i, n in enumerate(out)]
    bias = out[-1:]  # broadcast along the trailing dim of the permuted value
    kind = rng.choice(list(REDUCTIONS))
    combine = rng.choice(list(COMBINE))
    text = f"""func @f(%x: {_t(shape)}, %w: {_t(bias)}) -> {_t(out)} {{
  %t = graph.transpose %x {{perm = {perm}}} : {_t(out)}
  %z = graph.add %t, %w : {_t(out)}
  %s = graph.{kind} %z {{dims = {written}, keepdim = true}} : {_t(kept)}
  %y = graph.{combine} %z, %s : {_t(out)}
  return %y : {_t(out)}
}}
"""

    def want(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        z = x.permute(*perm) + w
        return COMBINE[combine](z, REDUCTIONS[kind](z, written))

    return text, want, [shape, bias]


@pytest.mark.parametrize("seed", range(16))
def test_random_permutes_read_by_reductions_move_to_the_return(seed: int) -> None:
    text, want, shapes = _program(seed)
    (report,) = fuse_module(irc.parse(text, "<test>"))
    (note,) = report.moved_transposes
    assert "1 reduction" in note
    module = irc.parse(text, "<test>")
    irc.run_pipeline(module, "fuse,graph-to-loop")
    assert len(loop.kernels(module)) == 1
    (view,) = [op for op in module.walk() if isinstance(op, loop.ViewOp)]
    # The kernel writes the value in x's order; the permute is the returned view.
    assert view.input.type.get_shape() == tuple(shapes[0])  # type: ignore[attr-defined]
    torch.manual_seed(seed)
    args = [torch.randn(*s, device=DEVICE) for s in shapes]
    (got,) = irc.compile(irc.parse(text, "<test>"), device=DEVICE).run("f", args)
    expected = want(*args)  # type: ignore[operator]
    assert got.shape == expected.shape
    assert got.stride() == expected.stride()
    assert_close(got, expected, rtol=1e-5, atol=1e-5)


HOSTILE_NAMES = """func @f(%x: tensor<6x5x4xf32>, %w: tensor<5xf32>) -> tensor<4x6x5xf32> {
  %t = graph.transpose %x {perm = [2, 0, 1]} : tensor<4x6x5xf32>
  %z.$-1 = graph.add %t, %w : tensor<4x6x5xf32>
  %s$ = graph.reduce_sum %z.$-1 {dims = [1], keepdim = true} : tensor<4x1x5xf32>
  %__import__-os.system$ = graph.sub %z.$-1, %s$ : tensor<4x6x5xf32>
  return %__import__-os.system$ : tensor<4x6x5xf32>
}
"""


def test_value_names_of_a_move_stay_out_of_the_generated_code() -> None:
    """Names the lexer allows (`[A-Za-z0-9_.$-]+`) become the moved value's
    `NAME_unpermuted`, in the IR and the report only: the IR prints and parses back,
    and no name reaches the Triton module."""
    module = irc.parse(HOSTILE_NAMES, "<test>")
    (report,) = fuse_module(module)
    (note,) = report.moved_transposes
    assert note.startswith("%__import__-os.system$: transpose [2, 0, 1] moved past")
    text = irc.print_module(module)
    assert "%__import__-os.system$_unpermuted = graph.fused" in text
    assert irc.print_module(irc.parse(text, "<fused>")) == text
    compiled = irc.compile(irc.parse(HOSTILE_NAMES, "<test>"), device=DEVICE)
    for name in ("__import__", "system", "z.$", "s$"):
        assert name not in compiled.source
    torch.manual_seed(0)
    x, w = torch.randn(6, 5, 4, device=DEVICE), torch.randn(5, device=DEVICE)
    (got,) = compiled.run("f", [x, w])
    z = x.permute(2, 0, 1) + w
    assert_close(got, z - z.sum(1, keepdim=True), rtol=1e-5, atol=1e-5)
