"""Rows in chunks whose starts are not 8 bytes apart are read from the
16-byte-aligned address before each start (`loop-to-tile`'s `RowPeel`), the lanes
before the start and past the end masked: the rule (`row_granule`), the addresses
it emits, and results against torch on the interpreter with the GPU's chunking
forced on small rows. Held rows mask their first and last chunks; looped rows
(`peeled_loop`) too, and load the chunks between them in a loop with no mask.
Rows only reduced that start 16 bytes apart are peeled in place (granule 1): only
the chunk past the last whole one is masked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.dialects import loop
from irc.lowering.tile_to_triton import emit_triton
from irc.passes.tile import Tiling, kernel_shape
from irc.pipeline import run_pipeline
from irc.syntax.diagnostics import IrcError
from irc.testing.forced_tiling import compile_with_tiling

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
UNROLLED = Tiling((1, 512), 4, unrolled=True)
LOOPED = Tiling((1, 512), 4)


def softmax(rows: int, n: int, el: str) -> str:
    t = f"tensor<{rows}x{n}x{el}>"
    return f"""func @f(%x: {t}) -> {t} {{
  %y = graph.softmax %x {{dim = 1}}
  return %y : {t}
}}
"""


def softmax_of_sum(rows: int, n: int, el: str) -> str:
    """Two full-size rows read, one f32 row written: each is peeled alike."""
    t = f"tensor<{rows}x{n}x{el}>"
    return f"""func @f(%x: {t}, %y: {t}) -> tensor<{rows}x{n}xf32> {{
  %s = graph.add %x, %y
  %c = graph.cast %s : tensor<{rows}x{n}xf32>
  %p = graph.softmax %c {{dim = 1}}
  return %p : tensor<{rows}x{n}xf32>
}}
"""


def shape_of(text: str) -> object:
    module = irc.parse(text)
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction")
    (kernel,) = loop.kernels(module)
    return kernel_shape(kernel)


def test_granule_is_the_narrowest_rows_elements_in_16_bytes() -> None:
    assert shape_of(softmax(64, 50257, "bf16")).row_granule == 8  # type: ignore[attr-defined]
    assert shape_of(softmax(64, 50257, "f32")).row_granule == 4  # type: ignore[attr-defined]
    assert shape_of(softmax(64, 51938, "bf16")).row_granule == 8  # type: ignore[attr-defined]
    # Rows 8 bytes apart already load 8-byte vectors: left (the extra chunk lost).
    assert shape_of(softmax(64, 59372, "bf16")).row_granule == 0  # type: ignore[attr-defined]
    assert shape_of(softmax(64, 50264, "bf16")).row_granule == 0  # type: ignore[attr-defined]
    assert shape_of(softmax(64, 50258, "f32")).row_granule == 0  # type: ignore[attr-defined]


def test_a_weight_read_along_the_row_keeps_the_rows_as_they_are() -> None:
    """A layer norm's weight is indexed by the row's index alone: read from a shifted
    start its loads would lose their own alignment."""
    t = "tensor<64x5001xbf16>"
    text = f"""func @f(%x: {t}, %w: tensor<5001xbf16>, %b: tensor<5001xbf16>) -> {t} {{
  %y = graph.layer_norm %x, %w, %b {{dims = [1], eps = 1.0e-05}}
  return %y : {t}
}}
"""
    assert shape_of(text).row_granule == 0  # type: ignore[attr-defined]


def test_chunks_load_from_the_aligned_row_start() -> None:
    """4096 x 50,257 bf16 in 25 chunks of 2048 (the GPU's tiling): the row's start
    `i * 50257` rounded down to 8 elements, `(i * 50257 // 8) * 8`, is the base of
    every access; the first chunk masks the lanes before the start."""
    _, module = compile_with_tiling(
        softmax(4096, 50257, "bf16"), Tiling((1, 2048), 16, unrolled=True), DEVICE
    )
    kernel = emit_triton(module, "peel.ir").split("def fn0")[0]
    assert "tl.full([], 8, tl.int32)" in kernel
    (row,) = re.findall(
        r"(v\d+) = v\d+ \* v\d+\n    (v\d+) = \1 // v\d+\n    (v\d+) = \2 \* v", kernel
    )
    aligned = row[2]
    accesses = re.findall(r"tl\.(load|store)\(ptr\d \+ (v\d+) \+", kernel)
    assert len(accesses) == 50 and all(base == aligned for _, base in accesses)
    assert kernel.count(f">= {row[0]}") == 1  # the first chunk's lower mask


def loops_and_the_rest(kernel: str) -> tuple[list[str], list[str]]:
    """The lines of a kernel inside its `for` loops, and those outside."""
    inside, outside, looping = [], [], False
    for line in kernel.splitlines():
        if line.startswith("    for "):
            looping = True
        elif not line.startswith("        "):
            looping = False
        (inside if looping else outside).append(line)
    return inside, outside


@pytest.mark.parametrize(
    ("n", "el", "tail"),
    [(2001, "bf16", 1), (1535, "bf16", 2), (1531, "f32", 1)],
)
def test_looped_rows_load_the_chunks_inside_every_row_unmasked(n: int, el: str, tail: int) -> None:
    """Chunks of 512 from the aligned start: the first masked before the row's start,
    the `n // 512 - 1` after it in a loop with neither mask nor bounds, the rest (one,
    or two where the granule's extra lanes pass a chunk) masked past the end; the
    store pass (walked backwards) reuses the first and last chunks' loads."""
    _, module = compile_with_tiling(softmax(7, n, el), LOOPED, DEVICE)
    kernel = emit_triton(module, "looped.ir").split("def fn0")[0]
    assert " // " in kernel  # the aligned start
    inside, outside = loops_and_the_rest(kernel)
    assert sum(line.startswith("    for ") for line in inside) == 2  # reductions, stores
    assert f"range(512, {n // 512 * 512}, 512)" in kernel  # from past the first chunk
    loads = [line for line in inside if "tl.load(" in line or "tl.store(" in line]
    assert len(loads) == 3 and not any("mask=" in line for line in loads)
    edge_loads = [line for line in outside if "tl.load(" in line]
    assert len(edge_loads) == 1 + tail and all("mask=" in line for line in edge_loads)
    edge_stores = [line for line in outside if "tl.store(" in line]
    assert len(edge_stores) == 1 + tail and all("mask=" in line for line in edge_stores)


def test_a_row_of_fewer_than_two_chunks_has_no_loop() -> None:
    _, module = compile_with_tiling(softmax(3, 1001, "bf16"), LOOPED, DEVICE)
    kernel = emit_triton(module, "short.ir").split("def fn0")[0]
    assert " // " in kernel and "    for " not in kernel


@pytest.mark.parametrize(
    ("rows", "n", "el"),
    [(7, 2001, "bf16"), (5, 1535, "bf16"), (6, 1531, "f32"), (4, 1001, "f16"), (3, 2563, "f16")],
)
def test_looped_peeled_rows_match_torch(rows: int, n: int, el: str) -> None:
    compiled, _ = compile_with_tiling(softmax(rows, n, el), LOOPED, DEVICE)
    g = torch.Generator().manual_seed(rows * n + 1)
    x = (torch.randn(rows, n, generator=g) * 4).to(TORCH[el])
    x[1, n - 1] = 30.0  # the max in the last lane
    x[2, 0] = 25.0  # and in the first
    want = torch.softmax(x.float(), dim=1).to(TORCH[el])
    assert_close(compiled["f"](x.to(DEVICE)).cpu(), want)


def test_looped_peeled_rows_of_two_inputs_match_torch() -> None:
    compiled, _ = compile_with_tiling(softmax_of_sum(5, 1537, "bf16"), LOOPED, DEVICE)
    g = torch.Generator().manual_seed(11)
    x, y = ((torch.randn(5, 1537, generator=g) * 3).to(torch.bfloat16) for _ in range(2))
    want = torch.softmax((x + y).float(), dim=1)
    assert_close(compiled["f"](x.to(DEVICE), y.to(DEVICE)).cpu(), want)


def test_looped_peeled_variance_matches_torch() -> None:
    """A normalization by the row's mean and variance: one Welford pass over the
    peeled chunks (`one-pass-variance`), its parts weighing 0 where masked."""
    t, col = "tensor<5x2047xf32>", "tensor<5x1xf32>"
    text = f"""func @f(%x: {t}) -> {t} {{
  %m = graph.reduce_mean %x {{dims = [1], keepdim = true}} : {col}
  %d = graph.sub %x, %m : {t}
  %s = graph.mul %d, %d : {t}
  %v = graph.reduce_mean %s {{dims = [1], keepdim = true}} : {col}
  %e = graph.constant {{value = 1.0e-05}} : tensor<f32>
  %a = graph.add %v, %e : {col}
  %r = graph.rsqrt %a : {col}
  %y = graph.mul %d, %r : {t}
  return %y : {t}
}}
"""
    assert shape_of(text).row_granule == 4  # type: ignore[attr-defined]
    compiled, module = compile_with_tiling(text, LOOPED, DEVICE)
    kernel = emit_triton(module, "v.ir").split("def fn0")[0]
    assert " // " in kernel and kernel.count("    for ") == 2  # one Welford pass, one store pass
    x = torch.randn(5, 2047, generator=torch.Generator().manual_seed(2)) * 3 + 100
    x64 = x.double()
    want = (x64 - x64.mean(1, keepdim=True)) / (
        x64.var(1, unbiased=False, keepdim=True) + 1e-5
    ).sqrt()
    assert_close(compiled["f"](x.to(DEVICE)).cpu().double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("rows", "n", "el"),
    [
        (7, 2001, "bf16"),
        (5, 1539, "f32"),  # 4-byte rows of f32
        (6, 1533, "f16"),
        (9, 1025, "bf16"),  # a lane past two chunks: a chunk more
    ],
)
def test_peeled_rows_match_torch(rows: int, n: int, el: str) -> None:
    compiled, _ = compile_with_tiling(softmax(rows, n, el), UNROLLED, DEVICE)
    g = torch.Generator().manual_seed(rows * n)
    x = (torch.randn(rows, n, generator=g) * 4).to(TORCH[el])
    want = torch.softmax(x.float(), dim=1).to(TORCH[el])
    assert_close(compiled["f"](x.to(DEVICE)).cpu(), want)


def test_rows_of_two_inputs_and_a_wider_output_match_torch() -> None:
    text = softmax_of_sum(5, 1001, "bf16")
    assert shape_of(text).row_granule == 8  # type: ignore[attr-defined]
    compiled, _ = compile_with_tiling(text, UNROLLED, DEVICE)
    g = torch.Generator().manual_seed(7)
    x, y = ((torch.randn(5, 1001, generator=g) * 3).to(torch.bfloat16) for _ in range(2))
    want = torch.softmax((x + y).float(), dim=1)
    assert_close(compiled["f"](x.to(DEVICE), y.to(DEVICE)).cpu(), want)


def logsumexp(rows: int, n: int, el: str) -> str:
    t, col = f"tensor<{rows}x{n}x{el}>", f"tensor<{rows}x1x{el}>"
    return f"""func @f(%x: {t}) -> {col} {{
  %m = graph.reduce_max %x {{dims = [1], keepdim = true}} : {col}
  %s = graph.sub %x, %m : {t}
  %e = graph.exp %s : {t}
  %z = graph.reduce_sum %e {{dims = [1], keepdim = true}} : {col}
  %l = graph.log %z : {col}
  %y = graph.add %l, %m : {col}
  return %y : {col}
}}
"""


@pytest.mark.parametrize("tiling", [UNROLLED, LOOPED], ids=["held", "looped"])
def test_peeled_row_reductions_only_match_torch(tiling: Tiling) -> None:
    """A logsumexp in chunks: its max and sum read the peeled chunks."""
    text = logsumexp(6, 3001, "bf16")
    assert shape_of(text).row_granule == 8  # type: ignore[attr-defined]
    compiled, module = compile_with_tiling(text, tiling, DEVICE)
    assert " // " in emit_triton(module, "lse.ir")  # the aligned start
    x = (torch.randn(6, 3001, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16)
    want = torch.logsumexp(x.float(), 1, keepdim=True).to(torch.bfloat16)
    assert_close(compiled["f"](x.to(DEVICE)).cpu(), want)


@pytest.mark.parametrize(
    ("n", "el", "tail"), [(2000, "bf16", 1), (1540, "f32", 1), (2048, "f16", 0)]
)
def test_rows_only_reduced_16_bytes_apart_are_peeled_in_place(n: int, el: str, tail: int) -> None:
    """Granule 1: no aligned start to compute and no lanes before the row to mask;
    the chunks inside every row load in a loop with no mask, and only the chunk past
    the last whole one (none where chunks divide the row) is masked."""
    text = logsumexp(7, n, el)
    assert shape_of(text).row_granule == 1  # type: ignore[attr-defined]
    compiled, module = compile_with_tiling(text, LOOPED, DEVICE)
    kernel = emit_triton(module, "lse.ir").split("def fn0")[0]
    assert " // " not in kernel and ">= " not in kernel
    inside, outside = loops_and_the_rest(kernel)
    loads = [line for line in inside if "tl.load(" in line]
    passes = 1 if el == "f32" else 2  # online (`online-softmax`), or max then sum
    assert len(loads) == passes and not any("mask=" in line for line in loads)
    edge = [line for line in outside if "tl.load(" in line]
    assert sum("mask=" in line for line in edge) == tail and len(edge) == 1 + tail
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(7, n, generator=g) * 4).to(TORCH[el])
    x[1, n - 1] = 30.0  # the max in the last lane
    x[2, 0] = 25.0  # and in the first
    x[3, 5] = float("nan")
    want = torch.logsumexp(x.float(), 1, keepdim=True).to(TORCH[el])
    got = compiled["f"](x.to(DEVICE)).cpu()
    assert torch.equal(got.isnan(), want.isnan())
    assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize(
    ("tiling", "n"), [(UNROLLED, 1003), (LOOPED, 1539)], ids=["held", "looped"]
)
def test_edge_values_in_the_masked_lanes_stay_out(tiling: Tiling, n: int) -> None:
    """The lanes before a row's start are the previous row's last elements: a +inf
    or NaN there must not reach this row's max or sum."""
    x = torch.randn(4, n)
    x[0, -3:] = float("inf")
    x[1, -1] = float("nan")
    x[2, :2] = float("-inf")
    compiled, _ = compile_with_tiling(softmax(4, n, "f32"), tiling, DEVICE)
    got = compiled["f"](x.to(DEVICE)).cpu()
    want = torch.softmax(x, 1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got[3], want[3])
    assert_close(got[2], want[2])


@pytest.mark.parametrize("unrolled", [True, False], ids=["held", "looped"])
@pytest.mark.parametrize("shape", ["3x5x17", "1x5x17", "3x1x17", "2x3x35"])
def test_rows_of_several_or_unit_kept_dims_match_torch(shape: str, unrolled: bool) -> None:
    """The kept indices' terms cancel against the peeled index's whatever the kept
    dims (a unit dim leaves `x % 17`, which `refold` does not fold); the bounds
    analysis proves the accesses."""
    text = f"""func @f(%x: tensor<{shape}xf32>) -> tensor<{shape}xf32> {{
  %y = graph.softmax %x {{dim = 2}}
  return %y : tensor<{shape}xf32>
}}
"""
    assert shape_of(text).row_granule == 4  # type: ignore[attr-defined]
    compiled, module = compile_with_tiling(text, Tiling((1, 8), 1, unrolled=unrolled), DEVICE)
    assert " // " in emit_triton(module, "kept.ir")  # the aligned start
    x = torch.randn(*[int(d) for d in shape.split("x")], generator=torch.Generator().manual_seed(5))
    assert_close(compiled["f"](x.to(DEVICE)).cpu(), torch.softmax(x, 2))


@pytest.mark.parametrize("chunk", [1, 2, 4, 8, 16])
def test_chunks_narrower_than_a_granule_are_not_peeled(chunk: int) -> None:
    """A hand-set tiling may hold rows in chunks narrower than 16 bytes: the lanes
    before a row's start would spill into a second chunk (and a chunk of 1 lane
    drops its mask), so such rows stay as they are; from 8 bf16 lanes, peeled."""
    text = softmax(5, 37, "bf16")
    compiled, module = compile_with_tiling(text, Tiling((1, chunk), 1, unrolled=True), DEVICE)
    kernel = emit_triton(module, "narrow.ir").split("def fn0")[0]
    assert (" // " in kernel) == (chunk >= 8)  # the aligned start, (i * 37 // 8) * 8
    x = (torch.randn(5, 37, generator=torch.Generator().manual_seed(chunk)) * 4).to(torch.bfloat16)
    want = torch.softmax(x.float(), 1).to(torch.bfloat16)
    assert_close(compiled["f"](x.to(DEVICE)).cpu(), want)


def test_the_bounds_proof_follows_a_peeled_loop_to_the_last_whole_chunk() -> None:
    """tests/hostile/tile_oob_peeled_loop_past_row.ir loops its unmasked chunks one
    past the last that lies inside every row, and is refused; stopped at that last
    one (`peeled_loop`'s bound, 32 of 37), the same kernel is proven."""
    hostile = Path(__file__).parent / "hostile" / "tile_oob_peeled_loop_past_row.ir"
    text = hostile.read_text()
    with pytest.raises(IrcError, match="may reach"):
        irc.verify(irc.parse(text, "past.ir"))
    irc.verify(irc.parse(text.replace("ub = 40", "ub = 32"), "inside.ir"))
