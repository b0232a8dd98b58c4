"""A column reduction's tiles run along one flat index of its kept dims
(`irc.passes.tile.column_lanes`): kept dims that every streamed load reads as
adjacent dims fold in for free (the index stays contiguous), and an odd kept dim
that would leave more than a quarter of a line's lanes idle folds in the dim
before it. A column program whose epilogue reads its rows again takes the warps
(`reread_warps`) with which its resident programs' rows fit in L2. Structure is
read from the tile IR at sizes measured on an H200; values are checked against
torch (Triton's interpreter on the CPU)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

import irc
from irc.compiler import lower_to_tile
from irc.dialects import loop, tile
from irc.ir.types import numel
from irc.passes.split_reduction import rereads_from_dram, unsplit_rereads_from_l2
from irc.passes.tile import (
    HELD_MOST_WARPS,
    HELD_THREAD_BYTES,
    L2_BYTES,
    LINE_BYTES,
    SM_WARPS,
    Tiling,
    held_column_lanes,
    held_warps,
    kernel_shape,
    next_pow2,
    resident_bytes,
    tiling_of,
)
from irc.pipeline import run_pipeline
from irc.testing.programs import tensor_type as t
from irc.testing.reference import functions, random_inputs
from irc.testing.tile_ir import unit_stride_axes
from irc.testing.verdict import judge_outputs

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
SMS = 132


def permute_reduce(a: int, b: int, c: int, dtype: str) -> str:
    """`z - z.sum(1, keepdim=True)` of `z = x.permute(2, 0, 1) + w`: after the
    transpose sinks, a sum over x's leading dim whose kept `(b, c)` are adjacent."""
    src, dst = t([a, b, c], dtype), t([c, a, b], dtype)
    return f"""func @f(%x: {src}, %w: {t([b], dtype)}) -> {dst} {{
  %t = graph.transpose %x {{perm = [2, 0, 1]}} : {dst}
  %z = graph.add %t, %w : {dst}
  %y = graph.reduce_sum %z {{dims = [1], keepdim = true}} : {t([c, 1, b], dtype)}
  %o = graph.sub %z, %y : {dst}
  return %o : {dst}
}}
"""


def middle_max(a: int, b: int, c: int, dtype: str) -> str:
    return f"""func @f(%x: {t([a, b, c], dtype)}) -> {t([a, c], dtype)} {{
  %s = graph.reduce_max %x {{dims = [1]}} : {t([a, c], dtype)}
  return %s : {t([a, c], dtype)}
}}
"""


def loop_kernels(text: str) -> list[loop.KernelOp]:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,graph-to-loop")
    return loop.kernels(module)


def tile_kernels(text: str) -> list[tile.KernelOp]:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    lower_to_tile(module)
    return [k for k in module.walk() if isinstance(k, tile.KernelOp)]


def programs(k: tile.KernelOp) -> int:
    return numel([int(g.value.data) for g in k.grid.data])


def lanes(k: tile.KernelOp) -> int:
    """The width of the kernel's 2-d tiles (block axis 0)."""
    shapes = [
        op.result.type.get_shape()  # type: ignore[attr-defined]
        for op in k.walk()
        if isinstance(op, tile.LoadOp) and len(op.result.type.get_shape()) == 2  # type: ignore[attr-defined]
    ]
    return shapes[0][0]


def divisions(k: tile.KernelOp) -> set[int]:
    """The constants the kernel's index blocks are divided by (`floordiv`, `mod`)."""
    out = set()
    for op in k.walk():
        if isinstance(op, tile.ApplyOp) and op.fn.data in ("floordiv", "mod"):
            for a in op.args:
                if isinstance(a.owner, tile.ConstantOp):
                    out.add(int(a.owner.value.value.data))  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize(
    ("a", "b", "c", "dtype"), [(301, 777, 129, "bf16"), (471, 1220, 37, "f32"), (5, 7, 3, "f32")]
)
def test_adjacent_kept_dims_are_one_flat_extent(a: int, b: int, c: int, dtype: str) -> None:
    """`(b, c)` of x read as adjacent dims: the tiles run along b * c, not along c
    alone padded to the tile (an odd c: every tile of c partly idle)."""
    (kernel,) = loop_kernels(permute_reduce(a, b, c, dtype))
    assert kernel_shape(kernel).columns == b * c


def test_a_flat_extent_keeps_its_loads_contiguous() -> None:
    """The flat index's digits refold (`(k // c) * c + k % c` is `k`): x's tiles
    step by one element along the lanes, so Triton still sees a contiguous run,
    and the programs are whole tiles of b * c."""
    first, *_ = tile_kernels(permute_reduce(301, 777, 129, "bf16"))
    x_loads = [  # w's is a column of the lanes ([X, 1]): gathered at k // c
        op
        for op in first.walk()
        if isinstance(op, tile.LoadOp)
        and len(shape := op.result.type.get_shape()) == 2  # type: ignore[attr-defined]
        and shape[1] > 1
    ]
    assert x_loads
    for load in x_loads:
        assert unit_stride_axes(load.offsets) == {0}
    assert programs(first) % -(-(777 * 129) // lanes(first)) == 0


def test_an_odd_narrow_kept_dim_folds_in_the_dim_before_it() -> None:
    """`x.amax(1)` of 999 x 2001 x 33 bf16: a 64-lane line of 33 columns leaves 31
    lanes idle; the tiles run along the 999 * 33 `(a, c)` pairs instead (measured
    1.5x as fast on an H200), one division by 33 a program."""
    (kernel,) = loop_kernels(middle_max(999, 2001, 33, "bf16"))
    assert kernel_shape(kernel).columns == 999 * 33
    first, *_ = tile_kernels(middle_max(999, 2001, 33, "bf16"))
    assert 33 in divisions(first)
    assert programs(first) % -(-(999 * 33) // lanes(first)) == 0


@pytest.mark.parametrize(("c", "dtype"), [(8, "bf16"), (6, "bf16"), (28, "bf16"), (129, "f32")])
def test_even_or_snug_kept_dims_stay_unfolded(c: int, dtype: str) -> None:
    """An even dim's rows load in vectors unfolded (4-28 bf16 columns ran 1.25-2x
    slower folded); 129 f32 columns leave under a quarter of the lanes idle."""
    (kernel,) = loop_kernels(middle_max(640, 500, c, dtype))
    assert kernel_shape(kernel).columns == c


def test_the_fold_rule_reads_lanes_not_shapes() -> None:
    """Every odd extent that would leave more than a quarter of a line's lanes idle
    folds; every other stays (the rule, over a range of sizes)."""
    for dtype, size in (("f32", 4), ("bf16", 2)):
        line = LINE_BYTES // size
        for c in range(3, 200, 2):
            (kernel,) = loop_kernels(middle_max(40, 300, c, dtype))
            idle = 3 * -(-c // line) * line > 4 * c
            assert kernel_shape(kernel).columns == (40 * c if idle else c), (dtype, c)


def softmax_middle(b: int, n: int, m: int, dtype: str) -> str:
    ty = t([b, n, m], dtype)
    return f"""func @f(%x: {ty}) -> {ty} {{
  %y = graph.softmax %x {{dim = 1}} : {ty}
  return %y : {ty}
}}
"""


def test_a_reread_column_program_takes_the_warps_its_rows_fit_l2_with() -> None:
    """A softmax over the middle dim of 3000 x 600 x 32 bf16: 600 rows (1024 padded,
    more than a program holds with their exponentials), 38 KB of them a 32-lane
    program; at 8 warps (8 programs an SM) the resident programs read 40 MB,
    which fit in L2, at 4 they would not. One kernel still."""
    text = softmax_middle(3000, 600, 32, "bf16")
    (kernel,) = tile_kernels(text)
    assert kernel.warps.value.data == 8  # type: ignore[union-attr]
    (shape,) = [kernel_shape(k) for k in loop_kernels(text)]
    assert held_column_lanes(shape, SMS) == 0
    x = lanes(kernel)
    assert resident_bytes(shape, x, programs(kernel), 8, SMS) <= L2_BYTES
    assert resident_bytes(shape, x, programs(kernel), 4, SMS) > L2_BYTES
    assert SM_WARPS // 8 * SMS < programs(kernel)


@pytest.mark.parametrize(
    ("text", "tile_shape", "warps"),
    [
        # A centered sum holds its rows alone: 16384 f32, a 128-byte line over 512 rows.
        (permute_reduce(512, 1024, 96, "f32"), (32, 512), 16),
        (permute_reduce(365, 559, 168, "f32"), (32, 512), 16),
        # A softmax holds its rows and their exponentials: 8192 elements; bf16 at
        # 8 warps, 64 bytes a thread.
        (softmax_middle(16, 333, 4096, "bf16"), (16, 512), 8),
        (softmax_middle(45, 721, 199, "f32"), (8, 1024), 16),
    ],
)
def test_a_kernel_left_whole_holds_rows_that_fit_a_program(
    text: str, tile_shape: tuple[int, int], warps: int
) -> None:
    """Rows that fit `HELD_VALUES` (over the values each keeps) are loaded once, in
    one step, and the epilogue stores from registers: one load of the input, no
    loop; `HELD_THREAD_BYTES` a thread."""
    (kernel,) = tile_kernels(text)
    assert not any(isinstance(op, tile.ForOp) for op in kernel.walk())
    x_loads = [
        op
        for op in kernel.walk()
        if isinstance(op, tile.LoadOp)
        and len(shape := op.result.type.get_shape()) == 2  # type: ignore[attr-defined]
        and shape[1] > 1
    ]
    assert len(x_loads) == 1
    assert x_loads[0].result.type.get_shape() == tile_shape  # type: ignore[attr-defined]
    assert kernel.warps.value.data == warps  # type: ignore[union-attr]
    element = 2 if "bf16" in text else 4
    assert warps == min(HELD_MOST_WARPS, numel(tile_shape) * element // (32 * HELD_THREAD_BYTES))


@pytest.mark.parametrize(
    ("text", "kernels"),
    [
        (permute_reduce(813, 1206, 148, "bf16"), 3),  # split: 1.27x faster than held
        (permute_reduce(600, 1024, 160, "bf16"), 1),  # read again in steps: 1.17x
    ],
)
def test_one_sector_a_row_of_a_tensor_past_l2_is_not_held(text: str, kernels: int) -> None:
    """16 bf16 lanes of 1024 rows fit a program, but each row's run is one 32-byte
    sector of a tensor past L2 (196-290 MB): not held, on an H200 slower so."""
    assert len(tile_kernels(text)) == kernels
    (shape,) = [kernel_shape(k) for k in loop_kernels(text)]
    assert held_column_lanes(shape, SMS) == 0
    assert held_column_lanes(replace(shape, element_bytes=4), SMS) == 16  # f32: 2 sectors


@pytest.mark.parametrize(
    "text",
    [
        permute_reduce(413, 520, 145, "bf16"),  # 32 lanes, two sectors a row (84.6 -> 52.8 us)
        permute_reduce(301, 777, 129, "bf16"),
    ],
)
def test_held_rows_of_two_sectors_displace_a_split(text: str) -> None:
    """Read again in steps, the rows would pass L2 (`unsplit_rereads_from_l2` does
    not keep them whole): held two sectors a row, one kernel, no split."""
    (shape,) = [kernel_shape(k) for k in loop_kernels(text)]
    assert not unsplit_rereads_from_l2(shape, SMS) and held_column_lanes(shape, SMS) == 32
    (kernel,) = tile_kernels(text)
    assert lanes(kernel) == 32


def test_a_row_reduction_holds_no_column_lanes() -> None:
    """`held_column_lanes` of a row softmax (no column extent) is 0, not a division by
    zero: callers outside the tile pass may ask it of any reduction."""
    text = f"""func @f(%x: {t([64, 300], "f32")}) -> {t([64, 300], "f32")} {{
  %y = graph.softmax %x {{dim = 1}} : {t([64, 300], "f32")}
  return %y : {t([64, 300], "f32")}
}}
"""
    (kernel,) = loop_kernels(text)
    shape = kernel_shape(kernel)
    assert shape.columns == 0 and shape.epilogue
    assert held_column_lanes(shape, SMS) == 0


def test_a_split_final_kernel_holds_nothing() -> None:
    """A column softmax of 2049 x 4097 bf16 splits in 17 chunks; its final kernel
    reduces the 17 partials and loops over a chunk's 121 rows, which it did not
    reduce: one pass over them (`row_reads`), nothing to hold."""
    text = f"""func @f(%x: {t([2049, 4097], "bf16")}) -> {t([2049, 4097], "bf16")} {{
  %y = graph.softmax %x {{dim = 0}} : {t([2049, 4097], "bf16")}
  return %y : {t([2049, 4097], "bf16")}
}}
"""
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,graph-to-loop,one-pass-variance,split-reduction")
    split, final = loop.kernels(module)
    shape = kernel_shape(final)
    assert shape.epilogue and shape.row_reads == 1
    assert held_column_lanes(shape, SMS) == 0


def test_rows_read_again_from_dram_are_split_so_the_epilogue_runs_flat() -> None:
    """813 x 1206 x 148 bf16: the kept tiles fill the GPU, but the rows the resident
    programs read pass L2 at any warps, so a second pass would read them from
    DRAM in column order. Split in two chunks, the partials combined once, the
    epilogue is an element-wise kernel over the whole tensor (353.2 -> 255.0 us
    on an H200; torch.compile 287.8)."""
    text = permute_reduce(813, 1206, 148, "bf16")
    (shape,) = [kernel_shape(k) for k in loop_kernels(text)]
    assert rereads_from_dram(shape, SMS)
    first, combine, final = tile_kernels(text)
    assert first.sym_name.data.endswith("_split")
    assert combine.sym_name.data.endswith("_combine")
    assert programs(final) * 2048 >= 813 * 1206 * 148  # flat over every element


@pytest.mark.parametrize(
    "text",
    [
        permute_reduce(9, 7, 5, "f32"),
        permute_reduce(33, 5, 3, "bf16"),
        middle_max(7, 40, 33, "bf16"),
        middle_max(3, 9, 7, "f32"),
        middle_max(5, 6, 8, "bf16"),
        # (b, c, d) adjacent, summed over a; and a middle sum whose odd last dim
        # folds in the dims before it.
        f"""func @f(%x: {t([6, 3, 5, 7], "f32")}) -> {t([3, 5, 7], "f32")} {{
  %s = graph.reduce_sum %x {{dims = [0]}} : {t([3, 5, 7], "f32")}
  return %s : {t([3, 5, 7], "f32")}
}}
""",
        f"""func @f(%x: {t([3, 4, 50, 3], "bf16")}) -> {t([3, 4, 3], "bf16")} {{
  %s = graph.reduce_sum %x {{dims = [2]}} : {t([3, 4, 3], "bf16")}
  return %s : {t([3, 4, 3], "bf16")}
}}
""",
    ],
)
def test_folded_column_reductions_compute_what_torch_does(text: str) -> None:
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=3, device=DEVICE)
    got = irc.compile(irc.parse(text, "t.ir"), device=DEVICE).run("f", inputs)
    for verdict in judge_outputs(fn, inputs, got):
        assert verdict.ok, verdict


@pytest.mark.parametrize(
    ("text", "held", "warps"),
    [
        (permute_reduce(37, 40, 33, "f32"), (32, 64), 4),  # rows 37 of 64, odd lanes
        (permute_reduce(37, 48, 31, "bf16"), (64, 64), 4),
        (softmax_middle(3, 300, 70, "f32"), (16, 512), 16),  # rows and exponentials
        (softmax_middle(3, 300, 70, "bf16"), (16, 512), 8),
    ],
)
def test_held_programs_compute_what_torch_does(
    text: str, held: tuple[int, int], warps: int
) -> None:
    """Held tiles at a GPU of 2 SMs, so that small programs hold their rows: the
    padded rows and lanes of one held load, the epilogue from registers. Run as a
    loop-level module, which keeps the tiling it is given."""
    module = irc.parse(text, "t.ir")
    run_pipeline(
        module, "fuse,decompose,graph-to-loop,one-pass-variance,split-reduction{sms=2},tile{sms=2}"
    )
    (kernel,) = loop.kernels(module)
    shape = kernel_shape(kernel)
    assert tiling_of(kernel) == Tiling(held, warps)
    assert held_column_lanes(shape, 2) == held[0]
    assert warps == held_warps(numel(held) * shape.element_bytes)
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=4, device=DEVICE)
    lowered = irc.parse(irc.print_module(module), "t.loop.ir")
    got = irc.compile(lowered, device=DEVICE).run("f", inputs)
    for verdict in judge_outputs(fn, inputs, got):
        assert verdict.ok, verdict


def test_small_shapes_fold_as_the_large_ones() -> None:
    """The correctness cases above do fold (the rule reads no size threshold)."""
    (k,) = loop_kernels(middle_max(7, 40, 33, "bf16"))
    assert kernel_shape(k).columns == 7 * 33
    (k,) = loop_kernels(permute_reduce(9, 7, 5, "f32"))
    assert kernel_shape(k).columns == 35
    assert next_pow2(35) == 64


PADDED_ROWS = """func @f(%x: memref<7x40x34xf32>) -> memref<7x33xf32> {
  %0 = loop.alloc : memref<7x33xf32>
  loop.kernel {name = "red_0", bounds = [7, 33]} (%i: index, %j: index) {
    %a = loop.reduce {kind = "max", bounds = [40]} (%r: index) {
      %v = loop.load %x, IDX : f32
      loop.yield %v
    } : f32
    loop.store %a, %0, %i, %j
  }
  return %0 : memref<7x33xf32>
}
"""


def test_hand_written_kernels_fold_only_what_their_loads_index() -> None:
    """Loop-level input written by hand: a buffer wider than the kept dim (34
    columns, 33 read) is not adjacent, but 33 is odd and idle, so the (i, j) pairs
    fold and each lane's address still uses the buffer's own strides; loads that
    index the kept dims out of order or one twice are row reductions, not folded."""
    import torch

    module = irc.parse(PADDED_ROWS.replace("IDX", "%i, %r, %j"), "t.ir")
    (kernel,) = loop.kernels(module)
    assert kernel_shape(kernel).columns == 7 * 33
    x = torch.randn(7, 40, 34, device=DEVICE)
    (got,) = irc.compile(module, device=DEVICE).run("f", [x])
    torch.testing.assert_close(got, x[:, :, :33].amax(1))
    for idx in ("%j, %r, %i", "%i, %r, %i"):
        text = PADDED_ROWS.replace("IDX", idx).replace("7x40x34", "33x40x34")
        (kernel,) = loop.kernels(irc.parse(text, "t.ir"))
        assert kernel_shape(kernel).columns == 0
