"""`one-pass-variance`: a mean and the variance about it read their input once
(`loop.welford_reduce`), split, looped, unrolled or held, and stay as accurate
as the two passes they replace."""

from __future__ import annotations

import os

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.dialects import loop
from irc.passes.tile import Tiling, set_tiling
from irc.pipeline import LOWERING
from irc.testing.reference import functions
from irc.testing.verdict import judge_outputs

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
UP_TO_SPLIT = "fuse,decompose,graph-to-loop,one-pass-variance,split-reduction"

BATCH_NORM = """
func @f(%x: tensor<NxCxDT>) -> (tensor<NxCxDT>, tensor<1xCxDT>, tensor<1xCxDT>) {
  %mean = graph.reduce_mean %x {dims = [0], keepdim = true} : tensor<1xCxDT>
  %c = graph.sub %x, %mean : tensor<NxCxDT>
  %sq = graph.mul %c, %c : tensor<NxCxDT>
  %var = graph.reduce_mean %sq {dims = [0], keepdim = true} : tensor<1xCxDT>
  %eps = graph.constant {value = 1.0e-5} : tensor<DT>
  %ve = graph.add %var, %eps : tensor<1xCxDT>
  %inv = graph.rsqrt %ve : tensor<1xCxDT>
  %y = graph.mul %c, %inv : tensor<NxCxDT>
  return %y, %mean, %var : tensor<NxCxDT>, tensor<1xCxDT>, tensor<1xCxDT>
}
"""

LAYER_NORM = """
func @f(%x: tensor<NxCxDT>, %w: tensor<CxDT>, %b: tensor<CxDT>) -> tensor<NxCxDT> {
  %y = graph.layer_norm %x, %w, %b {dims = [1]} : tensor<NxCxDT>
  return %y : tensor<NxCxDT>
}
"""

FULL_VARIANCE = """
func @f(%x: tensor<NxCxDT>) -> tensor<DT> {
  %mean = graph.reduce_mean %x {dims = [0, 1]} : tensor<DT>
  %c = graph.sub %x, %mean : tensor<NxCxDT>
  %sq = graph.mul %c, %c : tensor<NxCxDT>
  %var = graph.reduce_mean %sq {dims = [0, 1]} : tensor<DT>
  return %var : tensor<DT>
}
"""


def text(program: str, n: int, c: int, dtype: str = "f32") -> str:
    return program.replace("N", str(n)).replace("C", str(c)).replace("DT", dtype)


def loop_kernels(source: str, pipeline: str = UP_TO_SPLIT) -> list[loop.KernelOp]:
    module = irc.parse(source, "t.ir")
    irc.run_pipeline(module, pipeline)
    return loop.kernels(module)


def ops(kernel: loop.KernelOp, kind: type) -> list[object]:
    return [op for op in kernel.walk() if isinstance(op, kind)]


def loads_of_x(kernel: loop.KernelOp) -> int:
    return sum(
        1 for op in kernel.walk() if isinstance(op, loop.LoadOp) and op.buffer.name_hint == "x"
    )


def test_the_pass_sits_between_graph_to_loop_and_split_reduction() -> None:
    at = LOWERING.index("one-pass-variance")
    assert LOWERING[at - 1] == "graph-to-loop" and LOWERING[at + 1] == "split-reduction"


def test_batch_norm_statistics_read_the_input_once_for_both_in_one_split_stage() -> None:
    """A column's mean and variance over 48,374 rows: split across programs, the
    two statistics were two stages, each reading x; now one stage of Welford parts
    (mean, M2, count per chunk), combined once a column by a small kernel, whose
    statistics the normalizing kernel loads."""
    source = text(BATCH_NORM, 48374, 338)
    before = loop_kernels(source, UP_TO_SPLIT.replace("one-pass-variance,", ""))
    assert [loads_of_x(k) for k in before] == [1, 0, 1, 0, 1]  # stage, combine, twice; output
    stage, combine, final = loop_kernels(source)
    assert [loads_of_x(k) for k in (stage, combine, final)] == [1, 0, 1]
    assert len(ops(stage, loop.WelfordReduceOp)) == 1 and not ops(stage, loop.ReduceOp)
    (parts,) = ops(combine, loop.WelfordReduceOp)
    assert loop.int_list(parts.bounds) == loop.int_list(stage.bounds)[:1]  # one part a chunk
    assert not ops(final, loop.ReduceOp) and not ops(final, loop.WelfordReduceOp)


def test_layer_norm_rows_become_one_welford_reduce() -> None:
    (kernel,) = loop_kernels(text(LAYER_NORM, 4, 3001))
    assert len(ops(kernel, loop.WelfordReduceOp)) == 1 and not ops(kernel, loop.ReduceOp)


@pytest.mark.parametrize(
    "source",
    [
        # A half-precision variance rounds x - mean and its square first.
        text(BATCH_NORM, 4001, 37, "bf16"),
        # The sum itself is returned: it is more than the mean's numerator.
        """func @f(%x: tensor<64x8xf32>) -> (tensor<1x8xf32>, tensor<1x8xf32>) {
  %s = graph.reduce_sum %x {dims = [0], keepdim = true} : tensor<1x8xf32>
  %n = graph.constant {value = 64.0} : tensor<f32>
  %mean = graph.div %s, %n : tensor<1x8xf32>
  %c = graph.sub %x, %mean : tensor<64x8xf32>
  %sq = graph.mul %c, %c : tensor<64x8xf32>
  %var = graph.reduce_sum %sq {dims = [0], keepdim = true} : tensor<1x8xf32>
  return %s, %var : tensor<1x8xf32>, tensor<1x8xf32>
}
""",
        # Squares about the mean of another tensor.
        """func @f(%x: tensor<64x8xf32>, %z: tensor<64x8xf32>) -> tensor<1x8xf32> {
  %mean = graph.reduce_mean %x {dims = [0], keepdim = true} : tensor<1x8xf32>
  %c = graph.sub %z, %mean : tensor<64x8xf32>
  %sq = graph.mul %c, %c : tensor<64x8xf32>
  %var = graph.reduce_mean %sq {dims = [0], keepdim = true} : tensor<1x8xf32>
  return %var : tensor<1x8xf32>
}
""",
        # A sum divided by something other than its count is no mean.
        """func @f(%x: tensor<64x8xf32>) -> tensor<1x8xf32> {
  %s = graph.reduce_sum %x {dims = [0], keepdim = true} : tensor<1x8xf32>
  %n = graph.constant {value = 63.0} : tensor<f32>
  %m = graph.div %s, %n : tensor<1x8xf32>
  %c = graph.sub %x, %m : tensor<64x8xf32>
  %sq = graph.mul %c, %c : tensor<64x8xf32>
  %var = graph.reduce_sum %sq {dims = [0], keepdim = true} : tensor<1x8xf32>
  return %var : tensor<1x8xf32>
}
""",
    ],
    ids=["bf16", "sum-returned", "other-tensor", "not-the-count"],
)
def test_what_is_not_a_mean_and_its_variance_is_left_alone(source: str) -> None:
    for kernel in loop_kernels(source):
        assert not ops(kernel, loop.WelfordReduceOp)


def test_welford_reduce_prints_and_parses_back() -> None:
    module = irc.parse(text(BATCH_NORM, 48374, 338), "t.ir")
    irc.run_pipeline(module, UP_TO_SPLIT)
    printed = irc.print_module(module)
    assert printed.count("loop.welford_reduce") == 2
    assert irc.print_module(irc.parse(printed, "again.ir")) == printed


# --- numerics: every way the op is lowered, on inputs far from zero -----------------------


def assert_right(source: str, module: ModuleOp, *args: torch.Tensor) -> None:
    """irc's outputs judged as `irc-run --check` does: within assert_close of torch, or
    no further from the f64 result than 4x torch's own distance from it (in its
    eager order of summation or in any of `ORDERS` others)."""
    (fn,) = functions(irc.parse(source, "t.ir")).values()
    got = irc.compile(module, device=DEVICE).f(*args)
    for i, verdict in enumerate(judge_outputs(fn, args, got)):
        assert verdict.ok, f"output {i}: {verdict.line}"


def offset_input(n: int, c: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of spread 3 about 1000: sum(x**2) - n * mean**2 would keep no digit of it."""
    return (torch.randn(n, c, device=DEVICE, dtype=torch.float64) * 3 + 1000).to(dtype)


def tiled(source: str, tiling: Tiling) -> ModuleOp:
    """`source` lowered to tile kernels with its one kernel tiled as `tiling`."""
    module = irc.parse(source, "t.ir")
    tile_at = LOWERING.index("tile") + 1
    irc.run_pipeline(module, ",".join(["fuse", *LOWERING[:tile_at]]))
    (kernel,) = loop.kernels(module)
    assert ops(kernel, loop.WelfordReduceOp)
    set_tiling(kernel, tiling)
    irc.run_pipeline(module, ",".join(LOWERING[tile_at:]))
    return module


@pytest.mark.parametrize(
    ("n", "c", "dtype"),
    [(4001, 37, torch.float32), (20011, 5, torch.float64), (8, 33, torch.float32)],
    ids=["split-ragged", "split-f64", "held"],
)
def test_batch_norm_statistics_match_torch(n: int, c: int, dtype: torch.dtype) -> None:
    name = {torch.float32: "f32", torch.float64: "f64"}[dtype]
    source = text(BATCH_NORM, n, c, name)
    split = len(loop_kernels(source)) == 2  # below combine-once-bytes: no combining kernel
    assert split == (n > 1000)
    once = loop_kernels(source, UP_TO_SPLIT + "{combine-once-bytes=0}")
    assert len(once) == (3 if n > 1000 else 1)
    assert_right(source, irc.parse(source, "t.ir"), offset_input(n, c, dtype))


@pytest.mark.parametrize(
    "tiling",
    [Tiling((1, 256), 4), Tiling((2, 128), 4), Tiling((1, 1024), 8, unrolled=True), None],
    ids=["looped", "looped-2-rows", "unrolled", "default"],
)
def test_layer_norm_rows_match_torch(tiling: Tiling | None) -> None:
    source = text(LAYER_NORM, 5, 3001)
    module = irc.parse(source, "t.ir") if tiling is None else tiled(source, tiling)
    w = torch.randn(3001, device=DEVICE)
    b = torch.randn(3001, device=DEVICE)
    assert_right(source, module, offset_input(5, 3001), w, b)


def test_a_full_variance_split_in_ragged_chunks_matches_torch() -> None:
    source = text(FULL_VARIANCE, 301, 300)  # 90,300: no power-of-two divisor of 16
    stage, final = loop_kernels(source)
    assert ops(stage, loop.WelfordReduceOp) and ops(final, loop.WelfordReduceOp)
    assert_right(source, irc.parse(source, "t.ir"), offset_input(301, 300))


def test_non_finite_values_come_out_where_torch_puts_them() -> None:
    """An inf makes the mean inf and the variance NaN, a NaN both NaN, in the
    column it is in and no other."""
    source = text(BATCH_NORM, 4001, 37)
    x = offset_input(4001, 37)
    x[17, 3] = float("inf")
    x[3999, 5] = float("nan")
    assert_right(source, irc.parse(source, "t.ir"), x)


def split_stages_tiled(source: str, tiling: Tiling) -> ModuleOp:
    """`source` lowered to tile kernels, its split stage (the Welford kernel whose
    parts are not loaded) tiled as `tiling`."""
    module = irc.parse(source, "t.ir")
    tile_at = LOWERING.index("tile") + 1
    irc.run_pipeline(module, ",".join(["fuse", *LOWERING[:tile_at]]))
    stage = loop.kernels(module)[0]
    assert stage.kernel_name.data.endswith("_split") and ops(stage, loop.WelfordReduceOp)
    set_tiling(stage, tiling)
    irc.run_pipeline(module, ",".join(LOWERING[tile_at:]))
    return module


def test_a_looped_split_stage_divides_once_a_step_not_once_an_element() -> None:
    """Each row's weight is the same in every kept lane (1, or 0 past a ragged last
    chunk), so the running weights and Chan's ratio are `[1, R]`: one division a
    row of the step, where `[X, R]` made one an element and split ptxas's batches
    of loads (69190x149 f32 on an H200: the split stage 25.3 -> 20.1 us)."""
    from irc.dialects import tile

    module = split_stages_tiled(text(BATCH_NORM, 4001, 37), Tiling((32, 16), 4))
    stage = next(k for k in module.walk() if isinstance(k, tile.KernelOp))
    (step,) = [op for op in stage.walk() if isinstance(op, tile.ForOp)]
    shapes = [tuple(r.type.get_shape()) for r in step.results]  # type: ignore[attr-defined]
    assert shapes.count((1, 16)) == 1 and shapes.count((32, 16)) == 3  # weight; mean, M2, sum
    divisions = [op for op in step.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "div"]
    assert [tuple(d.result.type.get_shape()) for d in divisions] == [(1, 16)]  # type: ignore[attr-defined]


def test_a_looped_split_stage_with_ragged_rows_and_columns_matches_torch() -> None:
    """Chunks whose last one is ragged, columns past the last 32-wide tile, and a loop
    over each chunk's rows: the lanes past the columns' end are not masked in the
    reduction (no store keeps them), the rows past a chunk's end are."""
    source = text(BATCH_NORM, 4001, 37)
    assert_right(source, split_stages_tiled(source, Tiling((32, 16), 4)), offset_input(4001, 37))


@pytest.mark.parametrize(
    ("n", "c", "tiling"),
    [(999, 17, Tiling((16, 32), 2)), (1237, 4, Tiling((4, 32), 2)), (900, 33, Tiling((32, 16), 4))],
    ids=["999x17", "1237x4", "900x33"],
)
@pytest.mark.parametrize("first_row", ["plain", "outlier", "inf"])
def test_a_looped_welford_is_as_accurate_as_two_passes_far_from_zero(
    n: int, c: int, tiling: Tiling, first_row: str
) -> None:
    """Lanes that each merge 30-40 values of spread 3 about 1000: Welford's running mean
    rounds at 1000's scale, and M2 came out 17-30x further from f64 than torch's. The
    lanes now keep their means about each column's first value, whose distance from
    the mean is bounded by the data's own spread, even when it is an outlier (or inf:
    that column's statistics are then inf and NaN, as torch's)."""
    source = text(BATCH_NORM, n, c)
    x = offset_input(n, c)
    if first_row == "outlier":
        x[0] = 1.0e5
    elif first_row == "inf":
        x[0, 1] = float("inf")
    assert_right(source, tiled(source, tiling), x)
