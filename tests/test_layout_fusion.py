"""Structure the layout suite relies on (issue 16): views are free, and the fusion
Inductor's byte-count tests (test/inductor/test_perf.py) expect.

Each case is pinned by its kernel count and by the elements its kernels move,
counted as Inductor's `count_numel` does: every buffer a kernel loads from or
stores to, once per kernel, at its size. Results are checked against torch on
random inputs in Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from xdsl.dialects import func

import irc
from irc.dialects import loop
from irc.ir.types import numel


def _compile(text: str) -> Any:
    return irc.compile(irc.parse(text, "<test>"), device="cpu")


def moved_elements(text: str) -> tuple[int, int]:
    """(kernels, elements moved): each buffer a loop.kernel loads or stores counts
    once per kernel, at its number of elements (Inductor's count_numel)."""
    module = irc.parse(text, "<test>")
    irc.run_pipeline(module, "fuse,graph-to-loop")
    kernels = moved = 0
    for fn in module.body.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        for k in fn.body.block.ops:
            if not isinstance(k, loop.KernelOp):
                continue
            kernels += 1
            buffers = {o.buffer for o in k.walk() if isinstance(o, loop.LoadOp | loop.StoreOp)}
            moved += sum(numel(tuple(b.type.get_shape())) for b in buffers)  # type: ignore[attr-defined]
    return kernels, moved


def run_against_torch(
    text: str, name: str, torch_fn: Callable[..., Any], *shapes: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    args = [torch.randn(*s) for s in shapes]
    got = _compile(text).run(name, args)
    want = torch_fn(*args)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close(g, w, rtol=1e-5, atol=1e-5)


# --- views are free -------------------------------------------------------------------

LOGSUMEXP = """func @lse(%x: tensor<9x40xf32>) -> tensor<9xf32> {
  %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<9x1xf32>
  %s = graph.sub %x, %m
  %e = graph.exp %s
  %d = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<9x1xf32>
  %l = graph.log %d
  %y = graph.add %l, %m
  %r = graph.reshape %y : tensor<9xf32>
  return %r : tensor<9xf32>
}
"""


def test_logsumexp_reshaped_to_rows_launches_no_copy() -> None:
    assert moved_elements(LOGSUMEXP) == (1, 9 * 40 + 9)
    run_against_torch(LOGSUMEXP, "lse", lambda x: torch.logsumexp(x, 1), (9, 40))


RESHAPED_OUTPUT = """func @f(%x: tensor<3x5x33xf32>, %w: tensor<33xf32>) -> tensor<15x33xf32> {
  %a = graph.mul %x, %w
  %r = graph.relu %a
  %y = graph.reshape %r : tensor<15x33xf32>
  return %y : tensor<15x33xf32>
}
"""


def test_a_returned_reshape_of_a_computed_value_is_a_view() -> None:
    assert moved_elements(RESHAPED_OUTPUT) == (1, 2 * 3 * 5 * 33 + 33)
    run_against_torch(
        RESHAPED_OUTPUT, "f", lambda x, w: torch.relu(x * w).flatten(0, 1), (3, 5, 33), (33,)
    )


SHARED_RESHAPE = """func @f(%x: tensor<6x10xf32>, %w: tensor<10xf32>) -> (tensor<60xf32>, tensor<6xf32>, tensor<2x3xf32>) {
  %a = graph.mul %x, %w
  %e = graph.exp %a
  %r = graph.reshape %e : tensor<60xf32>
  %s = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<6x1xf32>
  %s2 = graph.reshape %s : tensor<6xf32>
  %t = graph.reshape %s2 : tensor<2x3xf32>
  %u = graph.mul %s, %s
  %ur = graph.reshape %u : tensor<3x2xf32>
  %ut = graph.transpose %ur {perm = [1, 0]} : tensor<2x3xf32>
  %v = graph.add %t, %ut
  return %r, %s2, %v : tensor<60xf32>, tensor<6xf32>, tensor<2x3xf32>
}
"""


def test_reshaped_outputs_read_again_by_a_later_kernel() -> None:
    """Two outputs of one kernel stored as their returned reshapes, one of them also
    read (through reshapes and a transpose) by the next kernel: no copy."""

    def want(x: Any, w: Any) -> Any:
        e = torch.exp(x * w)
        s = e.sum(1, keepdim=True)
        u = (s * s).reshape(3, 2).t()
        return e.reshape(60), s.reshape(6), s.reshape(2, 3) + u

    assert moved_elements(SHARED_RESHAPE)[0] == 2
    run_against_torch(SHARED_RESHAPE, "f", want, (6, 10), (10,))


TWO_SHAPES = """func @f(%x: tensor<6x10xf32>) -> (tensor<60xf32>, tensor<6x10xf32>, tensor<10x6xf32>, tensor<60xf32>) {
  %a = graph.exp %x
  %r = graph.reshape %a : tensor<60xf32>
  %r2 = graph.reshape %a : tensor<10x6xf32>
  %xr = graph.reshape %x : tensor<60xf32>
  return %r, %a, %r2, %xr : tensor<60xf32>, tensor<6x10xf32>, tensor<10x6xf32>, tensor<60xf32>
}
"""


def test_one_buffer_returned_in_two_shapes_still_gets_copies() -> None:
    """A value returned as itself and reshaped (or a function argument reshaped)
    needs buffers of its own: the outputs do not alias one another or the inputs."""
    assert moved_elements(TWO_SHAPES)[0] == 4
    run_against_torch(
        TWO_SHAPES, "f", lambda x: (x.exp().reshape(60), x.exp(), x.exp().reshape(10, 6),
                                    x.reshape(60)), (6, 10)
    )  # fmt: skip


COS_RESHAPE_COS = """func @f(%x: tensor<100xf32>) -> tensor<10x10xf32> {
  %a = graph.cos %x
  %r = graph.reshape %a : tensor<10x10xf32>
  %b = graph.cos %r
  return %b : tensor<10x10xf32>
}
"""


def test_cos_reshape_cos_is_one_kernel() -> None:
    """Inductor's view test: a row-major reshape changes no element order."""
    assert moved_elements(COS_RESHAPE_COS) == (1, 200)
    run_against_torch(COS_RESHAPE_COS, "f", lambda x: x.cos().reshape(10, 10).cos(), (100,))


@pytest.mark.parametrize("shape", [(10, 10), (7, 13)])
def test_transposed_operand_is_an_index_map(shape: tuple[int, int]) -> None:
    """Inductor's test_tiling_simple: a + b.t() moves 300 elements at 10x10."""
    n, m = shape
    text = f"""func @f(%a: tensor<{n}x{m}xf32>, %b: tensor<{m}x{n}xf32>) -> tensor<{n}x{m}xf32> {{
  %t = graph.transpose %b {{perm = [1, 0]}} : tensor<{n}x{m}xf32>
  %y = graph.add %a, %t
  return %y : tensor<{n}x{m}xf32>
}}
"""
    assert moved_elements(text) == (1, 3 * n * m)
    run_against_torch(text, "f", lambda a, b: a + b.t(), (n, m), (m, n))
