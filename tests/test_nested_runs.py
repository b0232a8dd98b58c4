"""Reductions over several dims whose loads read runs of the last ones (a batch
norm's N and H*W of NCHW): the leading dims looped an index at a time
around chunks of the run (`tile.nested_run_tiling`, loop.kernel's `nested = 1`), and
a split's chunks made of whole runs, compute what torch does with no division of a
flat index."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.autotune import candidates
from irc.compiler import triton_source
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.passes.tile import (
    KernelShape,
    Tiling,
    choose_tiling,
    kernel_shape,
    nested_run_tiling,
    tiling_of,
)
from irc.testing.reference import functions, random_inputs
from irc.testing.verdict import judge_outputs

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


def ty(dims: list[int], dtype: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in dims) + f"{dtype}>"


def statistics(dims: list[int], reduced: list[int], dtype: str) -> str:
    """A batch norm's mean and mean of squares over `reduced`."""
    x = ty(dims, dtype)
    col = ty([s for i, s in enumerate(dims) if i not in reduced], dtype)
    return f"""func @f(%x: {x}) -> ({col}, {col}) {{
  %m = graph.reduce_mean %x {{dims = {reduced}}} : {col}
  %sq = graph.mul %x, %x : {x}
  %q = graph.reduce_mean %sq {{dims = {reduced}}} : {col}
  return %m, %q : {col}, {col}
}}
"""


def one_reduction(op: str, dims: list[int], reduced: list[int], dtype: str) -> str:
    x = ty(dims, dtype)
    col = ty([s for i, s in enumerate(dims) if i not in reduced], dtype)
    return f"""func @f(%x: {x}) -> {col} {{
  %m = graph.{op} %x {{dims = {reduced}}} : {col}
  return %m : {col}
}}
"""


def tiled_module(text: str, sms: int) -> ModuleOp:
    """`text` through the tile pass, for a GPU of `sms` SMs."""
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(
        module, f"fuse,decompose,graph-to-loop,one-pass-variance,split-reduction{{sms={sms}}},"
        f"tile{{sms={sms}}}",
    )  # fmt: skip
    return module


def tiled(text: str, sms: int) -> list[loop.KernelOp]:
    return list(loop.kernels(tiled_module(text, sms)))


def run_shape(run: int, vector: int = 4, element_bytes: int = 2) -> KernelShape:
    return KernelShape(
        KernelKind.REDUCTION, (267,), (55, run), element_bytes=element_bytes,
        run=run, run_vector_bytes=vector,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("run", "chunk", "warps"),
    [
        (2171, 4096, 8),
        (2898, 4096, 8),
        (4020, 4096, 8),
        (4097, 2048, 16),
        (4449, 2048, 16),
        (4891, 2048, 16),
        (6001, 2048, 16),
        (8001, 2048, 16),
        (10001, 2048, 16),
    ],
)
def test_half_runs_not_16_bytes_apart_nest_in_one_step_or_steps_of_2048(
    run: int, chunk: int, warps: int
) -> None:
    """`NESTED_RUN_CHUNK`: one step of 4096 at 8 warps holds a run of 2171 to 4096
    (53% busy at least); `NESTED_LONG_RUN_CHUNK`: longer runs, however much of their
    last step is idle (a third at most), take steps of 2048 at 16 warps."""
    t = choose_tiling(run_shape(run, vector=2 if run % 2 else 4))
    assert t == Tiling((1, chunk), warps, nested=True), run


@pytest.mark.parametrize("run", [2171, 2271, 2898, 3822, 6001, 10001])
def test_f32_runs_nest_in_steps_of_2048(run: int) -> None:
    """`NESTED_RUN_F32_CHUNK`: 8 KB steps, at 8 warps, wherever the steps keep 53% of
    their lanes busy (2271: two steps, 55%)."""
    t = choose_tiling(run_shape(run, vector=4 if run % 2 else 8, element_bytes=4))
    assert t == Tiling((1, 2048), 8, nested=True), run


@pytest.mark.parametrize(
    ("run", "element_bytes"), [(1086, 2), (1147, 2), (1554, 2), (2047, 2), (1763, 4), (2046, 4)]
)
def test_runs_of_one_step_nest_at_4_warps(run: int, element_bytes: int) -> None:
    """`NESTED_SHORT_RUN_CHUNK`: a run of 1086 to 2048 elements, of either width, is
    one step of 2048 at 4 warps (53% of its lanes busy at least)."""
    row = run * element_bytes
    shape = run_shape(run, vector=min(16, row & -row), element_bytes=element_bytes)
    assert choose_tiling(shape) == Tiling((1, 2048), 4, nested=True), run


@pytest.mark.parametrize(
    ("why", "shape"),
    [
        ("f32 runs of two steps about half idle", run_shape(2170, vector=8, element_bytes=4)),
        ("f32 runs 16 bytes apart", run_shape(3136, vector=16, element_bytes=4)),
        ("f32 runs of 16 bytes apart, one step", run_shape(1728, vector=16, element_bytes=4)),
        ("f64 runs", run_shape(2899, vector=8, element_bytes=8)),
        ("runs 16 bytes apart", run_shape(3136, vector=16)),
        ("a step of 2048 about half idle", run_shape(1085, vector=2)),
        ("f32 steps of 2048 about half idle", run_shape(1085, vector=4, element_bytes=4)),
        ("a step of 4096 about half idle", run_shape(2170, vector=4)),
        ("an epilogue", replace(run_shape(2898), epilogue=True)),
        ("no runs", replace(run_shape(2898), run=0, run_vector_bytes=0)),
    ],
)
def test_other_reductions_keep_a_flat_index(why: str, shape: KernelShape) -> None:
    assert nested_run_tiling(shape) is None, why
    assert not choose_tiling(shape).nested, why


@pytest.mark.parametrize(
    ("dims", "reduced", "run", "vector"),
    [
        ([55, 267, 2898], [0, 2], 2898, 4),
        ([16, 64, 53, 55], [0, 2, 3], 53 * 55, 2),  # H and W together: one run
        ([4, 3, 56, 56], [0, 2, 3], 3136, 16),
        ([5, 7, 9, 3001], [0, 3], 3001, 2),  # N and W: runs of W alone
        ([6, 5, 2898], [0, 1, 2], 5 * 2898, 4),  # a full reduction: runs of C and H*W
    ],
)
def test_the_run_is_the_last_dims_every_load_reads_contiguously(
    dims: list[int], reduced: list[int], run: int, vector: int
) -> None:
    module = irc.parse(statistics(dims, reduced, "bf16"), "t.ir")
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    shape = kernel_shape(kernel)
    assert (shape.run, shape.run_vector_bytes) == (run, vector)


def test_no_run_where_a_load_reads_the_reduced_dims_across() -> None:
    """`x.T` summed over both of its dims of three: the load's last index is not the
    last reduced one, so a flat index it is."""
    text = """func @f(%x: tensor<3x2900x7xbf16>) -> tensor<7xbf16> {
  %t = graph.transpose %x {perm = [1, 0, 2]} : tensor<2900x3x7xbf16>
  %p = graph.transpose %t {perm = [2, 0, 1]} : tensor<7x2900x3xbf16>
  %s = graph.reduce_sum %p {dims = [1, 2]} : tensor<7xbf16>
  return %s : tensor<7xbf16>
}
"""
    for kernel in tiled(text, sms=1):
        assert kernel_shape(kernel).run == 0, kernel_shape(kernel)
        assert not tiling_of(kernel).nested


def exp_sum_of_rows(dims: list[int], dtype: str) -> str:
    """`x.exp().sum((1, 2))`: every load reads both reduced dims as one span."""
    x = ty(dims, dtype)
    return f"""func @f(%x: {x}) -> {ty(dims[:1], dtype)} {{
  %e = graph.exp %x : {x}
  %s = graph.reduce_sum %e {{dims = [1, 2]}} : {ty(dims[:1], dtype)}
  return %s : {ty(dims[:1], dtype)}
}}
"""


@pytest.mark.parametrize(("dtype", "nested"), [("f32", False), ("bf16", True)])
def test_f32_runs_whose_reduced_dims_are_one_span_keep_their_flat_index(
    dtype: str, nested: bool
) -> None:
    """The flat index over n and m of `x.exp().sum((1, 2))` is an offset, with no
    division for a nested loop to save: f32 keeps it (40 x 500 x 2501 took 86.8 us
    nested, 71.1 flat); half precision nests (19 x 700 x 3001 bf16 44.4 nested, 58.0
    flat)."""
    module = irc.parse(exp_sum_of_rows([40, 500, 2501], dtype), "t.ir")
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    shape = kernel_shape(kernel)
    assert (shape.run, shape.run_contiguous) == (2501, True)
    assert bool(nested_run_tiling(shape)) == nested


def test_a_batch_norms_runs_are_not_one_span() -> None:
    module = irc.parse(statistics([55, 267, 2898], [0, 2], "f32"), "t.ir")
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    assert not kernel_shape(kernel).run_contiguous


@pytest.mark.parametrize(
    ("dims", "dtype", "kernels"),
    [([19, 400, 1374], "bf16", 1), ([24, 160, 1138], "f32", 1), ([85, 385, 1147], "bf16", 2)],
)
def test_a_nested_reduction_a_program_could_hold_whole_stays_one_kernel(
    dims: list[int], dtype: str, kernels: int
) -> None:
    """`PERSISTENT_ROW_ELEMENTS`: 19 x 1374 elements a channel fit one program, so
    they are not split into two kernels (9.2 us split against 7.5 unsplit on an
    H200); 85 x 1147 do not, and split."""
    tiled_kernels = tiled(statistics(dims, [0, 2], dtype), sms=132)
    assert len(tiled_kernels) == kernels
    assert tiling_of(tiled_kernels[0]) == Tiling((1, 2048), 4, nested=True)


def split_stage(kernels: list[loop.KernelOp]) -> loop.KernelOp:
    (stage,) = [k for k in kernels if k.kernel_name.data.endswith("_split")]
    return stage


def test_a_split_of_runs_chunks_whole_runs_and_nests_them() -> None:
    """55 x 267 x 2898 bf16 on 132 SMs: two chunks of 28 runs (the last one 27, the
    28th clamped and masked), each nested; no division of a flat index is left in
    the stage's loops."""
    module = tiled_module(statistics([55, 267, 2898], [0, 2], "bf16"), sms=132)
    stage = split_stage(list(loop.kernels(module)))
    assert loop.int_list(stage.bounds) == [2, 267]
    assert tiling_of(stage) == Tiling((1, 4096), 8, nested=True)
    reds = [op for op in stage.body.walk() if isinstance(op, loop.ReduceOp)]
    assert reds and all(loop.int_list(r.bounds) == [28, 2898] for r in reds)
    source = triton_source(module)
    kernel = source[source.index("def triton_red_fused_mean_mul_0_split") :]
    kernel = kernel[: kernel.index("\n\n\n")]
    loops = kernel[kernel.index("    for ") :]
    assert re.search(
        r"for \w+ in range\(0, 28, 1\):\n\s+.*\n\s+.*\n\s+for \w+ in range\(0, 2898, 4096\)", loops
    )
    assert "//" not in loops and "%" not in loops


def test_a_split_keeps_its_chunks_long_enough_to_nest() -> None:
    """Two channels of 40 runs on 64 SMs: chunks of 3 runs (8694 elements), not the 2
    (5796) that a flat chunk's count would allow, which a program would hold whole
    and divide a flat index of."""
    stage = split_stage(tiled(statistics([40, 2, 2898], [0, 2], "bf16"), sms=64))
    assert tiling_of(stage).nested
    reds = [op for op in stage.body.walk() if isinstance(op, loop.ReduceOp)]
    assert all(loop.int_list(r.bounds) == [3, 2898] for r in reds)


def run_against_torch(text: str, sms: int, seed: int) -> list[loop.KernelOp]:
    """Compiles `text` tiled for `sms` SMs (the tilings written, so that the
    interpreter keeps them) and judges its outputs against torch's."""
    module = tiled_module(text, sms)
    kernels = list(loop.kernels(module))
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=seed, device=DEVICE)
    got = irc.compile(irc.parse(irc.print_module(module), "t.loop.ir"), device=DEVICE).run(
        "f", inputs
    )
    for verdict in judge_outputs(fn, inputs, got):
        assert verdict.ok, verdict
    return kernels


@pytest.mark.parametrize(
    ("text", "sms"),
    [
        (statistics([3, 5, 2899], [0, 2], "bf16"), 1),
        (statistics([40, 2, 2898], [0, 2], "bf16"), 64),  # 14 chunks, the last of 1 run
        (statistics([7, 3, 2, 3001], [0, 2, 3], "f16"), 64),  # runs of H*W = 6002
        (statistics([3, 3, 45, 67], [0, 2, 3], "bf16"), 1),
        (one_reduction("reduce_max", [4, 3, 5001], [0, 2], "f16"), 1),  # 3 steps a run
        (one_reduction("reduce_min", [23, 3, 3001], [0, 2], "bf16"), 16),
        (one_reduction("reduce_sum", [5, 4, 2, 2300], [0, 1, 3], "bf16"), 1),
        (statistics([7, 6, 47, 61], [0, 2, 3], "bf16"), 8),  # a split of runs over H and W
        (statistics([9, 2, 1, 2300], [0, 2, 3], "bf16"), 4),  # H = 1 inside the run
        (statistics([12, 3, 1147], [0, 2], "bf16"), 4),  # one step of 2048 a run
        (statistics([13, 5, 1087], [0, 2], "f16"), 8),  # just above half a step busy
        (statistics([29, 2, 1300], [0, 2], "bf16"), 64),  # a ragged split of short runs
        (statistics([1, 3, 40001], [0, 2], "f32"), 4),  # one image, 20 steps of 2048
        (statistics([9, 4, 37, 41], [0, 2, 3], "f16"), 1),  # a short run over H and W
        (one_reduction("reduce_min", [11, 3, 7, 1601], [0, 3], "f32"), 8),  # runs of W, H kept
        (one_reduction("reduce_sum", [6, 2, 1555], [0, 2], "f32"), 1),
    ],
)
def test_nested_runs_match_torch(text: str, sms: int) -> None:
    kernels = run_against_torch(text, sms, seed=42)
    assert any(tiling_of(k).nested for k in kernels), [tiling_of(k) for k in kernels]


@pytest.mark.parametrize(
    ("text", "sms"),
    [
        (statistics([3, 5, 2899], [0, 2], "f32"), 1),
        (statistics([9, 3, 2271], [0, 2], "f32"), 16),  # two steps, the second 11% busy
        (one_reduction("reduce_max", [5, 2, 47, 61], [0, 2, 3], "f32"), 4),
    ],
)
def test_f32_runs_nest_and_match_torch(text: str, sms: int) -> None:
    kernels = run_against_torch(text, sms, seed=7)
    assert any(tiling_of(k) == Tiling((1, 2048), 8, nested=True) for k in kernels)


@pytest.mark.parametrize(
    ("text", "sms"),
    [
        (statistics([5, 3, 4449], [0, 2], "bf16"), 4),  # 3 steps, the last 17% busy
        (statistics([11, 2, 67, 73], [0, 2, 3], "f16"), 16),  # H*W = 4891, split
        (one_reduction("reduce_max", [3, 2, 4097], [0, 2], "bf16"), 1),  # a sliver step
    ],
)
def test_long_half_runs_nest_at_16_warps_and_match_torch(text: str, sms: int) -> None:
    kernels = run_against_torch(text, sms, seed=11)
    assert any(tiling_of(k) == Tiling((1, 2048), 16, nested=True) for k in kernels)


def test_a_hand_written_nested_flag_nests_any_reduction() -> None:
    """`nested = 1` written on a reduction with no runs (its loads read x across)
    and on a one-dim one: the loops nest over the leading dims (or stay one loop),
    and the values are torch's."""
    text = """func @f(%x: memref<6x5x37xf32>, %w: memref<37x6xf32>) -> memref<5xf32> {
  %y = loop.alloc : memref<5xf32>
  loop.kernel {name = "k", bounds = [5], block = [1, 16], warps = 1, nested = 1} (%i: index) {
    %s = loop.reduce {kind = "sum", bounds = [6, 37]} (%n: index, %j: index) {
      %v = loop.load %x, %n, %i, %j : f32
      %u = loop.load %w, %j, %n : f32
      %p = loop.apply %v, %u {fn = "mul"} : f32
      loop.yield %p
    } : f32
    loop.store %s, %y, %i
  }
  return %y : memref<5xf32>
}
"""
    module = irc.parse(text, "t.loop.ir")
    source = triton_source(module)
    assert re.search(r"for \w+ in range\(0, 6, 1\):", source)
    x = torch.randn(6, 5, 37, device=DEVICE)
    w = torch.randn(37, 6, device=DEVICE)
    got = irc.compile(irc.parse(text, "t.loop.ir"), device=DEVICE).f(x, w)
    want = torch.einsum("nij,jn->i", x.double(), w.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_the_flag_prints_and_parses_back() -> None:
    text = irc.print_module(tiled_module(statistics([3, 5, 2899], [0, 2], "bf16"), sms=1))
    assert "nested = 1" in text
    again = irc.print_module(irc.parse(text, "t.loop.ir"))
    assert again == text


def test_autotuning_tries_nested_and_flat_tilings() -> None:
    shape = run_shape(2898)
    options = candidates(shape)
    assert options[0] == choose_tiling(shape)
    nested = [t for t in options if t.nested]
    assert {t.block[1] for t in nested} == {1024, 2048, 4096}
    assert any(not t.nested and t.block[0] == 1 for t in options[1:])


def test_a_nested_loop_past_i32_counts_in_i64() -> None:
    """3e9 images a channel, written by hand: the loop over them starts at an i64 0,
    so that Triton counts it in i64 and it stops (an i32 one would wrap)."""
    text = """func @f(%x: memref<3000000000x2x3001xbf16>) -> memref<2xf32> {
  %y = loop.alloc : memref<2xf32>
  loop.kernel {name = "k", bounds = [2], block = [1, 4096], warps = 8, nested = 1} (%i: index) {
    %s = loop.reduce {kind = "sum", bounds = [3000000000, 3001]} (%n: index, %j: index) {
      %v = loop.load %x, %n, %i, %j : bf16
      %w = loop.apply %v {fn = "cast"} : f32
      loop.yield %w
    } : f32
    loop.store %s, %y, %i
  }
  return %y : memref<2xf32>
}
"""
    module = irc.parse(text, "t.loop.ir")
    irc.run_pipeline(module, "loop-to-tile,tile-cse,dce")
    source = triton_source(module)
    assert re.search(r"for \w+ in range\(tl\.full\(\[\], 0, tl\.int64\), 3000000000, 1\):", source)
    assert re.search(r"for \w+ in range\(0, 3001, 4096\):", source)
