"""The verifier's memory-safety proof (irc/analysis/bounds.py).

Hostile loop- and tile-level files (tests/hostile/*_oob_*, the TMA and launch
cases) must be rejected with a located message and exit 1, never run; every
kernel irc itself generates (examples, benchmark workloads, random graphs,
large and 64-bit-indexed shapes, grouped and persistent GEMMs) must be proven.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import irc
from irc.analysis.bounds import TileIntervals, _arith, _trunc_div, check_bounds
from irc.dialects import tile
from irc.pipeline import run_pipeline
from irc.syntax.diagnostics import IrcError
from irc.testing.graphgen import SMALL_TILES, generate

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "hostile"
FULL = "decompose,fuse,graph-to-loop,split-reduction,tile,loop-to-tile"
PIPELINES = {
    "fused": FULL,
    "unfused": "decompose,graph-to-loop,split-reduction,tile,loop-to-tile",
    "small-tiles": "decompose," + SMALL_TILES,
}


def errors(text: str) -> list[tuple[int, str]]:
    """(line, message) of each verifier error of `text`; [] when it verifies."""
    try:
        irc.verify(irc.parse(text, "t.ir"))
    except IrcError as e:
        return [(d.location.line if d.location else 0, d.message) for d in e.diagnostics]
    return []


def lowered(text: str, pipeline: str = FULL) -> str:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, pipeline)
    return irc.print_module(module)


def line_of(text: str, needle: str) -> int:
    """The first line (1-based) with `needle` outside comments."""
    lines = enumerate(text.split("\n"), 1)
    return next(i for i, line in lines if needle in line and not line.lstrip().startswith("//"))


# --- the loop-level cases, end to end ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "reach"), [("loop_oob_bounds.ir", 3999999), ("loop_oob_100.ir", 99)]
)
def test_loop_bounds_past_the_buffer_are_rejected_by_irc_opt(name: str, reach: int) -> None:
    path = HOSTILE / name
    done = subprocess.run(
        [sys.executable, "-m", "irc.tools.opt", str(path), "--emit", "triton"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # not 0, not a signal (the segfault was 139)
    assert "Traceback" not in done.stderr
    load = line_of(path.read_text(), "loop.load")
    assert (
        f"{path}:{load}:5: error: loop.load index 0 (%i) may reach {reach} but dimension 0 "
        "of %x (memref<4xf32>) has size 4"
    ) in done.stderr
    assert f"{path}:{load + 1}:5: error: loop.store index 0 (%i) may reach {reach}" in done.stderr
    assert "triton.jit" not in done.stdout


def test_irc_run_refuses_the_out_of_bounds_kernel_before_running_it() -> None:
    path = HOSTILE / "loop_oob_bounds.ir"
    done = subprocess.run(
        [sys.executable, "-m", "irc.tools.run", str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    assert "may reach 3999999" in done.stderr and "Traceback" not in done.stderr


def test_index_arithmetic_past_the_end_is_located_at_the_load() -> None:
    text = (HOSTILE / "loop_oob_shift.ir").read_text()
    assert errors(text) == [
        (
            line_of(text, "loop.load"),
            "loop.load index 0 (%i1) may reach 4 but dimension 0 of %x (memref<4x8xf32>) "
            "has size 4",
        )
    ]


LOOP = """
func @f(%x: memref<6x8xf32>) -> memref<8x6xf32> {{
  %y = loop.alloc : memref<8x6xf32>
  loop.kernel {{name = "k", bounds = [48]}} (%i: index) {{
    %c8 = loop.constant {{value = 8}} : index
    %c6 = loop.constant {{value = 6}} : index
    %r = loop.apply %i, %c8 {{fn = "floordiv"}} : index
    %c = loop.apply %i, %c8 {{fn = "mod"}} : index
    %v = loop.load %x, %r, %c : f32
    %t = loop.apply %i, %c6 {{fn = "{fn}"}} : index
    %u = loop.apply %i, %c6 {{fn = "mod"}} : index
    loop.store %v, %y, %t, %u
  }}
  return %y : memref<8x6xf32>
}}
"""


def test_index_arithmetic_is_bounded_and_an_unbounded_index_is_rejected() -> None:
    # A reshape-like flat index split into digits: proven.
    assert errors(LOOP.format(fn="floordiv")) == []
    # i * 6 is not a row of 8: rejected with the range proven.
    text = LOOP.format(fn="mul")
    assert errors(text) == [
        (
            line_of(text, "loop.store"),
            "loop.store index 0 (%t) may reach 282 but dimension 0 of %y (memref<8x6xf32>) "
            "has size 8",
        )
    ]
    # An index loaded from memory is not bounded at all.
    data = """
func @f(%x: memref<4xf32>, %idx: memref<4xi32>) -> memref<4xf32> {
  %y = loop.alloc : memref<4xf32>
  loop.kernel {name = "k", bounds = [4]} (%i: index) {
    %j = loop.load %idx, %i : i32
    %k = loop.apply %j {fn = "cast"} : index
    %v = loop.load %x, %k : f32
    loop.store %v, %y, %i
  }
  return %y : memref<4xf32>
}
"""
    ((line, message),) = errors(data)
    assert line == line_of(data, "loop.load %x")
    assert message.startswith("cannot prove loop.load index 0 (%k) in bounds")


def test_a_deep_index_chain_is_checked_without_recursion() -> None:
    n = 3000  # past Python's recursion limit of 1000
    body = "\n".join(
        f'    %a{k + 1} = loop.apply %a{k}, %zero {{fn = "add"}} : index' for k in range(n)
    )
    text = f"""
func @f(%x: memref<4xf32>) -> memref<4xf32> {{
  %y = loop.alloc : memref<4xf32>
  loop.kernel {{name = "k", bounds = [4]}} (%a0: index) {{
    %zero = loop.constant {{value = 0}} : index
{body}
    %v = loop.load %x, %a{n} : f32
    loop.store %v, %y, %a0
  }}
  return %y : memref<4xf32>
}}
"""
    assert errors(text) == []
    assert errors(text.replace("{value = 0}", "{value = 1}"))[0][1].startswith(
        f"loop.load index 0 (%a{n}) may reach {n + 3}"
    )


# --- tile level: hostile files -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle", "message"),
    [
        (
            "tile_oob_nomask.ir",
            "tile.load",
            "tile.load offsets may reach [0, 16383] but the buffer launched as %x "
            "(memref<4096xf32>) holds 4096 elements; add a mask",
        ),
        (
            "tile_oob_wrong_mask.ir",
            "tile.load",
            "tile.load offsets may reach [0, 1023] in lanes where the mask holds, but the "
            "buffer launched as %x (memref<1000xf32>) holds 1000 elements",
        ),
        (
            "tile_oob_off_by_one.ir",
            "tile.load",
            "tile.load offsets may reach [0, 1000] in lanes where the mask holds",
        ),
        (
            "tile_oob_crossed_mask.ir",
            "tile.load",
            "tile.load offsets may reach [0, 15] in lanes where the mask holds",
        ),
        ("tile_oob_wrap.ir", "tile.load", "tile.load offsets may reach [-2, 1]"),
        (
            "tile_tma_shape.ir",
            "tile.block_load",
            "tile.block_load declares shape [64, 64] but the buffer launched as %x is "
            "memref<32x64xf32>",
        ),
        (
            "tile_launch_type.ir",
            "tile.launch",
            "tile.launch argument 0 (%x) is memref<64xf16> but @k takes ptr<f32> there",
        ),
        ("tile_launch_arity.ir", "tile.launch", "tile.launch"),
    ],
)
def test_hostile_tile_file_is_rejected_at_the_access(name: str, needle: str, message: str) -> None:
    text = (HOSTILE / name).read_text()
    found = errors(text)
    assert found, f"{name} verified"
    line, got = found[0]
    assert line == line_of(text, needle) and message in got, found


def test_hostile_tile_files_exit_1_from_irc_opt() -> None:
    names = sorted(p for p in HOSTILE.glob("tile_*.ir") if "_oob_" in p.name or "tma" in p.name)
    assert len(names) >= 5
    for path in names:
        done = subprocess.run(
            [sys.executable, "-m", "irc.tools.opt", str(path), "--emit", "triton"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 1 and "Traceback" not in done.stderr, (path, done.stderr)
        assert re.search(rf"^{re.escape(str(path))}:\d+:\d+: error: ", done.stderr, re.M)


# --- tile level: masks, launches, pointers -------------------------------------------------

ROWS = """
tile.kernel {{name = "k", grid = [4], warps = 4}} (%p0: ptr<f32>, %p1: ptr<f32>) {{
  %n = tile.constant {{value = {rows}}} : i32
  %c = tile.constant {{value = {cols}}} : i32
  %b = tile.constant {{value = 8}} : i32
  %pid = tile.program_id {{axis = 0}} : i32
  %base = tile.apply %pid, %b {{fn = "mul"}} : i32
  %r = tile.arange {{size = 8}} : tensor<8xi32>
  %row = tile.apply %base, %r {{fn = "add"}} : tensor<8xi32>
  %rows = tile.expand_dims %row {{axis = 1}} : tensor<8x1xi32>
  %k = tile.arange {{size = 16}} : tensor<16xi32>
  %cols = tile.expand_dims %k {{axis = 0}} : tensor<1x16xi32>
  %rm = tile.apply %rows, %n {{fn = "lt"}} : tensor<8x1xi1>
  %cm = tile.apply %cols, %c {{fn = "lt"}} : tensor<1x16xi1>
  %m = tile.apply %rm, %cm {{fn = "and"}} : tensor<8x16xi1>
  %start = tile.apply %rows, %c {{fn = "mul"}} : tensor<8x1xi32>
  %off = tile.apply %start, %cols {{fn = "add"}} : tensor<8x16xi32>
  %v = tile.load %p0, %off, {mask} {{other = 0.0}} : tensor<8x16xf32>
  tile.store %p1, %off, %v, %m
}}

func @f(%x: memref<{rows}x{cols}xf32>) -> memref<{rows}x{cols}xf32> {{
  %y = loop.alloc : memref<{rows}x{cols}xf32>
  tile.launch %x, %y {{kernel = @k}}
  return %y : memref<{rows}x{cols}xf32>
}}
"""


def test_a_row_and_column_mask_covers_a_ragged_two_dimensional_access() -> None:
    assert errors(ROWS.format(rows=30, cols=10, mask="%m")) == []
    # The row mask alone lets columns 10-15 through: row 29 reaches 29 * 10 + 15.
    text = ROWS.format(rows=30, cols=10, mask="%rm")
    assert errors(text) == [
        (
            line_of(text, "tile.load"),
            "tile.load offsets may reach [0, 305] in lanes where the mask holds, but the "
            "buffer launched as %x (memref<30x10xf32>) holds 300 elements",
        )
    ]


def test_each_launch_is_checked_with_its_own_buffers() -> None:
    good = ROWS.format(rows=30, cols=10, mask="%m")
    small = """
func @g(%x: memref<10x10xf32>) -> memref<10x10xf32> {
  %y = loop.alloc : memref<10x10xf32>
  tile.launch %x, %y {kernel = @k}
  return %y : memref<10x10xf32>
}
"""
    text = good.replace("{value = 30}", "{value = 10}") + small
    assert errors(text) == []  # the mask says 10 rows: both launches fit
    text = good + small
    found = errors(text)
    # The mask lets 30 rows through; the second launch passes 10.
    assert [line for line, _ in found] == [line_of(text, "tile.load"), line_of(text, "tile.store")]
    assert "the buffer launched as %x (memref<10x10xf32>) holds 100 elements" in found[0][1]
    assert "the buffer launched as %y (memref<10x10xf32>) holds 100 elements" in found[1][1]
    launches = [i for i, t in enumerate(text.split("\n"), 1) if "tile.launch" in t]
    for diagnostic in check_bounds(irc.parse(text, "t.ir")):
        assert [n.location.line for n in diagnostic.notes if n.location] == launches[1:]


def test_a_pointer_that_is_not_a_kernel_argument_is_rejected() -> None:
    text = """
tile.kernel {name = "k", grid = [1], warps = 4} (%p0: ptr<f32>, %p1: ptr<f32>) {
  %r = tile.arange {size = 4} : tensor<4xi32>
  %q = tile.for %p0 {lb = 0, ub = 1, step = 1} (%i: i32, %c: ptr<f32>) {
    %v = tile.load %c, %r : tensor<4xf32>
    tile.store %p1, %r, %v
    tile.yield %c
  } : ptr<f32>
}

func @f(%x: memref<4xf32>) -> memref<4xf32> {
  %y = loop.alloc : memref<4xf32>
  tile.launch %x, %y {kernel = @k}
  return %y : memref<4xf32>
}
"""
    found = errors(text)
    assert found and found[0][0] == line_of(text, "tile.load %c")
    assert "its pointer is not an argument of its kernel" in found[0][1]


def test_element_types_must_match_the_pointer() -> None:
    text = ROWS.format(rows=32, cols=16, mask="%m").replace(
        "tile.store %p1, %off, %v, %m", "%w = tile.apply %v {fn = \"cast\"} : tensor<8x16xf16>\n"
        "  tile.store %p1, %off, %w, %m"
    )  # fmt: skip
    found = errors(text)
    assert (
        found and "tile.store: element type f16 differs from the pointer's ptr<f32>" in found[0][1]
    )


# --- generated kernels are all proven ------------------------------------------------------

SOURCES = sorted(ROOT.glob("examples/*.ir")) + sorted(ROOT.glob("benchmarks/workloads/*.ir"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_and_workload_verifies_through_the_full_pipeline(path: Path) -> None:
    for pipeline in PIPELINES.values():
        lowered(path.read_text(), pipeline)  # the verifier runs after every pass


def test_random_graphs_verify_through_every_pipeline() -> None:
    for seed in range(40):
        text = generate(seed)
        for name, pipeline in PIPELINES.items():
            try:
                lowered(text, pipeline)
            except IrcError as e:
                raise AssertionError(f"seed {seed} ({name}): {e.diagnostics[0].message}") from e


BIG = """
func @add(%x: tensor<65536x32769xf32>, %b: tensor<32769xf32>) -> tensor<65536x32769xf32> {
  %y = graph.add %x, %b : tensor<65536x32769xf32>
  return %y : tensor<65536x32769xf32>
}
func @rows(%x: tensor<65536x32769xf32>) -> tensor<65536x1xf32> {
  %m = graph.reduce_sum %x {dims = [1], keepdim = true} : tensor<65536x1xf32>
  return %m : tensor<65536x1xf32>
}
func @mm(%a: tensor<65536x32768xbf16>, %w: tensor<32768x1024xbf16>) -> tensor<65536x1024xbf16> {
  %c = graph.matmul %a, %w : tensor<65536x1024xbf16>
  return %c : tensor<65536x1024xbf16>
}
"""


def test_kernels_with_64_bit_indices_are_proven() -> None:
    out = lowered(BIG)
    assert ": i64" in out and "tile.load" in out


GROUPED = """
func @mm(%a: tensor<576x64xf32>, %b: tensor<64x128xf32>) -> tensor<576x128xf32> {
  %c = graph.matmul %a, %b : tensor<576x128xf32>
  return %c : tensor<576x128xf32>
}
"""


def test_grouped_tile_order_needs_and_gets_the_exact_scalar_mode() -> None:
    # 9 row tiles in groups of 8 with unmasked rows (576 = 9 * 64): the last group's
    # row tile is first_m + local % min(9 - first_m, 8), at most 8, which intervals
    # alone cannot see.
    module = irc.parse(GROUPED, "t.ir")
    run_pipeline(module, FULL)
    kernel = next(op for op in module.body.ops if isinstance(op, tile.KernelOp))
    store = next(op for op in kernel.walk() if isinstance(op, tile.StoreOp))
    offsets = store.offsets
    shape = tuple(offsets.type.get_shape())  # type: ignore[attr-defined]
    assert not store.mask
    plain = TileIntervals(kernel).access(offsets, None, shape)
    exact = TileIntervals(kernel, exact=True).access(offsets, None, shape)
    assert plain is not None and exact is not None
    assert plain.hi > 576 * 128 - 1
    assert (exact.lo, exact.hi) == (0, 576 * 128 - 1)


PERSISTENT = """
func @mm(%x: tensor<2048x64xbf16>, %w: tensor<64x2048xbf16>, %b: tensor<2048xbf16>) -> tensor<2048x2048xbf16> {
  %mm = graph.matmul %x, %w
  %a = graph.add %mm, %b
  return %a : tensor<2048x2048xbf16>
}
"""


def test_tma_block_accesses_must_declare_the_launched_shape() -> None:
    out = lowered(PERSISTENT)
    assert "tile.block_load" in out and "tile.tiles" in out
    assert errors(out) == []
    bad = out.replace("{shape = [2048, 64]}", "{shape = [4096, 64]}", 1)
    assert bad != out
    found = errors(bad)
    assert found and "declares shape [4096, 64] but the buffer launched as %x is" in found[0][1]


# --- the interval arithmetic ---------------------------------------------------------------


small = st.integers(-40, 40)


@given(small, small, small, small)
def test_division_and_remainder_cover_floor_and_truncation(
    a0: int, a1: int, b0: int, b1: int
) -> None:
    a0, a1 = sorted((a0, a1))
    b0, b1 = sorted((b0, b1))
    for fn in ("add", "sub", "mul", "floordiv", "mod", "minimum", "maximum"):
        r = _arith(fn, [(a0, a1), (b0, b1)])
        if r is None:
            assert fn in ("floordiv", "mod") and b0 <= 0 <= b1
            continue
        for a, b in itertools.product(range(a0, a1 + 1), range(b0, b1 + 1)):
            if fn == "floordiv":
                values = [a // b, _trunc_div(a, b)]
            elif fn == "mod":
                values = [a % b, a - _trunc_div(a, b) * b]
            else:
                values = [{"add": a + b, "sub": a - b, "mul": a * b,
                           "minimum": min(a, b), "maximum": max(a, b)}[fn]]  # fmt: skip
            assert all(r[0] <= v <= r[1] for v in values), (fn, (a0, a1), (b0, b1), a, b, r)


SHIFTED = """
tile.kernel {{name = "k", grid = [2], warps = 4}} (%p0: ptr<f32>, %p1: ptr<f32>) {{
  %b = tile.constant {{value = 64}} : i32
  %eight = tile.constant {{value = 8}} : i32
  %zero = tile.constant {{value = 0}} : i32
  %n = tile.constant {{value = 100}} : i32
  %pid = tile.program_id {{axis = 0}} : i32
  %base = tile.apply %pid, %b {{fn = "mul"}} : i32
  %r = tile.arange {{size = 64}} : tensor<64xi32>
  %x = tile.apply %base, %r {{fn = "add"}} : tensor<64xi32>
  %s = tile.apply %x, %eight {{fn = "sub"}} : tensor<64xi32>
  %wide = tile.apply %s {{fn = "cast"}} : tensor<64xi64>
  %lo = tile.apply %s, %zero {{fn = "ge"}} : tensor<64xi1>
  %hi = tile.apply %x, %n {{fn = "lt"}} : tensor<64xi1>
  %m = tile.apply {mask} {{fn = "and"}} : tensor<64xi1>
  %v = tile.load %p0, %wide, %m {{other = 0.0}} : tensor<64xf32>
  tile.store %p1, %x, %v, %hi
}}

func @f(%x: memref<100xf32>) -> memref<100xf32> {{
  %y = loop.alloc : memref<100xf32>
  tile.launch %x, %y {{kernel = @k}}
  return %y : memref<100xf32>
}}
"""


def test_masks_bound_from_below_and_through_casts() -> None:
    # x - 8 >= 0 and x < 100: the shifted, widened offsets lie in [0, 91].
    assert errors(SHIFTED.format(mask="%lo, %hi")) == []
    # Without the lower bound the first eight lanes read below the buffer.
    text = SHIFTED.format(mask="%hi, %hi")
    assert errors(text) == [
        (
            line_of(text, "tile.load"),
            "tile.load offsets may reach [-8, 91] in lanes where the mask holds, but the "
            "buffer launched as %x (memref<100xf32>) holds 100 elements",
        )
    ]


GATHER = """
tile.kernel {{name = "k", grid = [1], warps = 4}} (%p0: ptr<f32>, %p1: ptr<i32>, %p2: ptr<f32>) {{
  %r = tile.arange {{size = 64}} : tensor<64xi32>
  %i = tile.load %p1, %r : tensor<64xi32>
  %v = tile.load %p0, {offsets} : tensor<64xf32>
  tile.store %p2, %r, %v
}}

func @f(%x: memref<64xf32>, %idx: memref<64xi32>) -> memref<64xf32> {{
  %y = loop.alloc : memref<64xf32>
  tile.launch %x, %idx, %y {{kernel = @k}}
  return %y : memref<64xf32>
}}
"""


def test_offsets_read_from_memory_cannot_be_proven() -> None:
    assert errors(GATHER.format(offsets="%r")) == []
    text = GATHER.format(offsets="%i")
    ((line, message),) = errors(text)
    assert line == line_of(text, "tile.load %p0")
    assert message.startswith("cannot prove tile.load offsets in bounds")
    assert message.endswith("the buffer launched as %x (memref<64xf32>) holds 64 elements")


def test_masks_are_one_boolean_block() -> None:
    text = GATHER.format(offsets="%r, %ok, %ok {other = 0.0}").replace(
        "  %v = ", "  %ok = tile.apply %r, %r {fn = \"eq\"} : tensor<64xi1>\n  %v = "
    )  # fmt: skip
    assert errors(text) == [(line_of(text, "tile.load %p0"), "tile.load takes at most one mask")]
    text = GATHER.format(offsets="%r, %r {other = 0.0}")
    assert errors(text) == [
        (
            line_of(text, "tile.load %p0"),
            "tile.load: the mask must be booleans (i1), not tensor<64xi32>",
        )
    ]


def test_a_tile_access_outside_a_kernel_is_rejected() -> None:
    text = """
func @f(%p: ptr<f32>) -> ptr<f32> {
  %z = tile.constant {value = 0} : i32
  %v = tile.load %p, %z : f32
  return %p : ptr<f32>
}
"""
    found = errors(text)
    assert found, "verified"
    assert (
        line_of(text, "tile.load"),
        "tile.load is outside any tile.kernel: a host function only allocates and launches",
    ) in found


def test_a_loop_access_outside_a_kernel_is_rejected() -> None:
    text = """
func @f(%x: memref<4xf32>) -> memref<4xf32> {
  %y = loop.alloc : memref<4xf32>
  %c = loop.constant {value = 2} : index
  %v = loop.load %x, %c : f32
  loop.store %v, %y, %c
  return %y : memref<4xf32>
}
"""
    # The host-level constant is refused first, by loop.constant's own check.
    assert errors(text) == [
        (
            line_of(text, "loop.constant"),
            "loop.constant is outside any loop.kernel: scalar code belongs in kernels",
        ),
    ]
