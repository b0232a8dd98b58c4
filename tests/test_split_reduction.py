"""How `split-reduction` chooses its chunks, and that the split result is right."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.dialects import loop
from irc.passes.split_reduction import split_count
from irc.pipeline import run_pipeline

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
# On a GPU also the benchmark's size: 8192 programs of 8K elements.
SHAPES = [[512, 512], [64, 2048, 3]] + ([[8192, 8192]] if DEVICE == "cuda" else [])


def full_sum(shape: list[int]) -> str:
    t = f"tensor<{'x'.join(map(str, shape))}xf32>"
    dims = list(range(len(shape)))
    return f"""func @f(%x: {t}) -> tensor<f32> {{
  %s = graph.reduce_sum %x {{dims = {dims}}} : tensor<f32>
  return %s : tensor<f32>
}}
"""


def chunks(text: str, pipeline: str = "split-reduction") -> tuple[int, int] | None:
    """(programs, elements each) of the split's first stage, or None when not split."""
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop," + pipeline)
    kernels = loop.kernels(module)
    if len(kernels) == 1:
        return None
    (g,) = loop.int_list(kernels[0].bounds)
    (red,) = [op for op in kernels[0].body.walk() if isinstance(op, loop.ReduceOp)]
    (chunk,) = loop.int_list(red.bounds)
    return g, chunk


def test_split_count_is_the_largest_power_of_two_divisor_up_to_the_cap() -> None:
    assert split_count(1 << 26, 4096) == 4096
    assert split_count(3 * 1024, 4096) == 1024
    assert split_count(4096 + 2, 4096) == 2


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # 8192x8192: 8192 chunks of 8K elements, not 1024 of 64K (placement-robust, see
        # the module docstring), and more chunks only where each stays >= min_chunk.
        ([8192, 8192], (8192, 8192)),
        ([16384, 16384], (8192, 32768)),  # capped at `splits`
        ([1024, 1024], (1024, 1024)),
        ([256, 256], (64, 1024)),
        ([3, 65536], (128, 1536)),  # 3 * 2^16: the largest power of two up to 192
        # 2^4 * 5625: 16 even chunks would leave SMs idle; the most up to N / min_chunk
        # (87: 64), ragged as below
        ([300, 300], (64, 1407)),
        # 90,300 = 2^2 * ...: no power-of-two divisor of 16 or more, so ragged chunks:
        # the most up to N / min_chunk (64), each ceil(N / 64) long, the last one short
        ([300, 301], (64, 1411)),
        ([255, 255], None),  # odd: no power-of-two chunks
        ([100, 100], None),  # below the threshold
    ],
)
def test_default_chunks(shape: list[int], expected: tuple[int, int] | None) -> None:
    assert chunks(full_sum(shape)) == expected


def test_options_override_the_rule() -> None:
    text = full_sum([8192, 8192])
    assert chunks(text, "split-reduction{splits=1024}") == (1024, 65536)
    assert chunks(text, "split-reduction{min_chunk=1048576}") == (64, 1048576)
    assert chunks(full_sum([8, 8]), "split-reduction{threshold=64 splits=16 min_chunk=4}") == (16, 4)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_split_sum_matches_torch(shape: list[int]) -> None:
    compiled = irc.compile(irc.parse(full_sum(shape)), device=DEVICE)
    assert compiled.kernel_count == 2
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    torch.testing.assert_close(compiled.f(x), x.double().sum().float())


def test_a_stage_takes_a_name_no_hand_written_kernel_has() -> None:
    """Hand-written loop IR may name a kernel `r_split` beside the `r` the pass
    splits: the stage becomes `r_split_` (two kernels of one name read as one in
    the loop IR and the fusion report), and the module still verifies and
    computes sum(x) and x + 1."""
    text = """func @f(%a: memref<1000x1001xf32>) -> (memref<f32>, memref<1000x1001xf32>) {
  %o = loop.alloc : memref<f32>
  %p = loop.alloc : memref<1000x1001xf32>
  loop.kernel {name = "r_split", bounds = [1000, 1001]} (%i: index, %j: index) {
    %x = loop.load %a, %i, %j : f32
    %c = loop.constant {value = 1.0} : f32
    %s = loop.apply %x, %c {fn = "add"} : f32
    loop.store %s, %p, %i, %j
  }
  loop.kernel {name = "r", bounds = []} () {
    %s = loop.reduce {kind = "sum", bounds = [1000, 1001]} (%i: index, %j: index) {
      %x = loop.load %a, %i, %j : f32
      loop.yield %x
    } : f32
    loop.store %s, %o
  }
  return %o, %p : memref<f32>, memref<1000x1001xf32>
}
"""
    module = irc.parse(text, "names.ir")
    run_pipeline(module, "split-reduction")
    irc.verify(module)
    assert [k.kernel_name.data for k in loop.kernels(module)] == ["r_split", "r_split_", "r"]
    compiled = irc.compile(irc.parse(text, "names.ir"), device=DEVICE)
    x = torch.randn(1000, 1001, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    total, plus_one = compiled(x)
    torch.testing.assert_close(total, x.double().sum().float())
    torch.testing.assert_close(plus_one, x + 1)
