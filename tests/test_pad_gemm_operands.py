"""`pad-gemm-operands`: GEMM operands with rows not 16-byte aligned are copied once
into row-padded buffers, which the GEMM reads by TMA (`tile.block_load {pitch}`) or
by aligned pointer loads. Checked: which operands the rule pads and why not others,
the loop and tile IR it leads to, and results against torch on the CPU interpreter
(thresholds lowered so that small shapes are padded), TMA and pointers, a weight
stored [N, K], both operands odd.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from irc.compiler import CompiledModule
from irc.dialects import loop, tile
from irc.passes.gemm_operand_copies import MIN_FLOPS, padded_columns
from irc.passes.pad_gemm_operands import (
    WHY,
    PadGemmOperandsPass,
    unaligned_operands,
)
from irc.passes.tile import Tiling
from irc.testing.cli import run_opt
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text, loop_level

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}
PAD_ALL = "pad-gemm-operands{min_flops=0 persistent_only=false}"


def test_padded_columns_are_whole_granules() -> None:
    assert padded_columns(257, 2) == 264
    assert padded_columns(1140, 2) == 1144
    assert padded_columns(1024, 2) == 1024
    assert padded_columns(3, 4) == 4
    assert padded_columns(4084, 2, 128) == 4096
    assert padded_columns(4096, 2, 128) == 4096
    assert padded_columns(3, 4, 128) == 32


def test_both_odd_operands_are_copied_before_the_gemm() -> None:
    module = loop_level(gemm_text(300, 301, 257, "bf16"), PAD_ALL)
    pads, gemm = loop.kernels(module)[:2], loop.kernels(module)[2]
    assert [k.kernel_name.data for k in pads] == ["pad_rows_0", "pad_rows_1"]
    loads = [op for op in gemm.walk() if isinstance(op, loop.LoadOp)]
    shapes = [tuple(ld.buffer.type.get_shape()) for ld in loads]  # type: ignore[attr-defined]
    # x [300, 257] -> [300, 264] (16-byte rows: K-major), w [257, 301] -> [257, 320]
    # (128-byte rows: its rows run along N); the bias stays.
    assert shapes == [(300, 264), (257, 320), (301,)]
    for pad in pads:
        assert pad.parallel_bounds() in ([300, 257], [257, 301])


def test_aligned_small_or_once_read_operands_are_left() -> None:
    # K and N whole granules: nothing to pad.
    assert len(loop.kernels(loop_level(gemm_text(300, 304, 256, "bf16"), PAD_ALL))) == 1
    # Below the default product size: a copy's launch would outweigh it.
    assert 2 * 300 * 301 * 257 < MIN_FLOPS
    assert len(loop.kernels(loop_level(gemm_text(300, 301, 257, "bf16"), "pad-gemm-operands"))) == 1
    # N = 100 is one tile: x is read once by the GEMM and stays; w (read by 3 row
    # tiles) is padded.
    module = loop_level(gemm_text(300, 100, 257, "bf16"), PAD_ALL)
    (pad, gemm) = loop.kernels(module)
    assert pad.parallel_bounds() == [257, 100]
    assert [u.load.buffer.type.get_shape() for u in unaligned_operands(gemm)] == [(300, 257)]  # type: ignore[attr-defined]


def test_only_gemms_the_tile_pass_makes_persistent_are_padded_by_default() -> None:
    """2000x1025 @ 1025x1000 + GELU: K outweighs the GELU, persistent, x padded (w's
    2000-byte rows miss the line, but only 16 row tiles read it); 2048x517 @ 517x2048
    too (`EPILOGUE_K`). 4096x250 @ 250x4096: the GELU outweighs K = 250, a program
    a tile, left (its pointer loads ran as fast unaligned on an H100; the copy
    only added)."""
    (pad, _) = loop.kernels(loop_level(gemm_text(2000, 1000, 1025, "bf16"), "pad-gemm-operands"))
    assert pad.kernel_name.data == "pad_rows_0" and pad.parallel_bounds() == [2000, 1025]
    (pad, _) = loop.kernels(loop_level(gemm_text(2048, 2048, 517, "bf16"), "pad-gemm-operands"))
    assert pad.parallel_bounds() == [2048, 517]
    assert (
        len(loop.kernels(loop_level(gemm_text(4096, 4096, 250, "bf16"), "pad-gemm-operands"))) == 1
    )


def gemm_of_transposed_x(m: int, n: int, k: int) -> str:
    """x stored [K, M] and read transposed: its rows run along M."""
    return f"""func @f(%x: tensor<{k}x{m}xbf16>, %w: tensor<{k}x{n}xbf16>) -> tensor<{m}x{n}xbf16> {{
  %xt = graph.transpose %x {{perm = [1, 0]}}
  %mm = graph.matmul %xt, %w
  return %mm : tensor<{m}x{n}xbf16>
}}
"""


def copied_shapes(module: object) -> list[tuple[list[int], tuple[int, ...]]]:
    """(source shape, padded shape) of each copy kernel."""
    out = []
    for k in loop.kernels(module):
        if k.kernel_name.data.startswith("pad_rows_"):
            (store,) = [op for op in k.walk() if isinstance(op, loop.StoreOp)]
            out.append((k.parallel_bounds(), tuple(store.buffer.type.get_shape())))  # type: ignore[attr-defined]
    return out


def test_n_major_right_operands_are_padded_to_lines_where_m_is_long() -> None:
    """w [64, 200] bf16 has 400-byte rows: 16-byte aligned, not a 128-byte line. It is
    copied to 256 columns where 32 row tiles read it (M = 4096), not at 31 (M = 3968:
    the copy would cost more than the GEMM is likely to save). x [M, 64], K-major, is
    left; so are a K-major x of 400-byte rows and an x stored [K, M] (the left
    operand ran as fast either way)."""
    assert copied_shapes(loop_level(gemm_text(4096, 200, 64, "bf16"), PAD_ALL)) == [
        ([64, 200], (64, 256))
    ]
    assert copied_shapes(loop_level(gemm_text(3968, 200, 64, "bf16"), PAD_ALL)) == []
    assert copied_shapes(loop_level(gemm_text(4096, 4096, 200, "bf16"), PAD_ALL)) == []
    assert copied_shapes(loop_level(gemm_of_transposed_x(200, 4096, 64), PAD_ALL)) == []
    # x stored [K, M] with M odd: copied for that, to 16-byte rows.
    assert copied_shapes(loop_level(gemm_of_transposed_x(201, 256, 64), PAD_ALL)) == [
        ([64, 201], (64, 208))
    ]
    # line_rereads lowers the bar; rows 2 bytes apart still pad at `rereads`.
    lowered = "pad-gemm-operands{min_flops=0 persistent_only=false line_rereads=1}"
    assert copied_shapes(loop_level(gemm_text(300, 200, 64, "bf16"), lowered)) == [
        ([64, 200], (64, 256))
    ]


def test_gemms_of_line_padded_operands_match_torch() -> None:
    """w [40, 200] copied to 256 columns, x stored [K, M] of odd M to 208: read by TMA
    at pitches of 256 and 208, and a program a tile by pointers, against torch."""
    lowered = "pad-gemm-operands{min_flops=0 persistent_only=false line_rereads=1}"
    up_to_tile = f"fuse,decompose,graph-to-loop,split-reduction,{lowered},tile"
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-3, 4, (40, 201), generator=g).to(torch.bfloat16)
    w = torch.randint(-3, 4, (40, 200), generator=g).to(torch.bfloat16)
    want = (x.double().T @ w.double()).to(torch.bfloat16)
    for tiling, pitches in [
        (Tiling((64, 64, 16), 4, 2, persistent=True), {208, 256}),
        (Tiling((64, 64, 16), 4, 2), set()),
    ]:
        compiled, module = compile_with_tiling(
            gemm_of_transposed_x(201, 200, 40),
            tiling,
            DEVICE,
            up_to_tile,
            lambda k: k.kernel_name.data.startswith("mm"),
        )
        loads = [op for op in module.walk() if isinstance(op, tile.BlockLoadOp)]  # type: ignore[attr-defined]
        assert {op.pitch.value.data for op in loads if op.pitch is not None} == pitches
        assert len(tile_copy_kernels(module)) == 2
        assert_close(compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu(), want)


def tile_copy_kernels(module: object) -> list[str]:
    return [
        op.kernel_name.data  # type: ignore[attr-defined]
        for op in module.walk()  # type: ignore[attr-defined]
        if isinstance(op, tile.KernelOp) and "pad_rows_" in op.kernel_name.data
    ]


def test_pass_options_are_checked() -> None:
    with pytest.raises(Exception, match="rereads"):
        PadGemmOperandsPass(rereads=0)


def lower(text: str, tiling: Tiling | None) -> tuple[CompiledModule, object]:
    """Padded (PAD_ALL), then `tiling` forced on the GEMM, not on the copies."""
    up_to_tile = f"fuse,decompose,graph-to-loop,split-reduction,{PAD_ALL},tile"
    return compile_with_tiling(
        text, tiling, DEVICE, up_to_tile, lambda k: k.kernel_name.data.startswith("mm")
    )


@pytest.mark.parametrize(
    ("m", "n", "k", "el", "linear", "tiling", "pitches"),
    [
        # persistent: the padded x by TMA at a pitch of 264, w (N = 304 aligned) exact
        (300, 304, 257, "bf16", False, Tiling((64, 64, 16), 4, 2, persistent=True), {264}),
        # both odd: x at 264, w [257, 301] at 320; the output keeps pointer stores
        (300, 301, 257, "f16", False, Tiling((64, 64, 16), 4, 2, persistent=True), {264, 320}),
        # a weight stored [N, K] with K odd: read transposed from its padded copy
        (200, 296, 131, "bf16", True, Tiling((64, 64, 16), 4, 2, persistent=True), {136}),
        # a program a tile: pointer loads of the padded buffers
        (300, 301, 257, "bf16", False, Tiling((64, 64, 16), 4, 2), set()),
    ],
)
def test_padded_gemms_match_torch(
    m: int, n: int, k: int, el: str, linear: bool, tiling: Tiling, pitches: set[int]
) -> None:
    compiled, module = lower(gemm_text(m, n, k, el, b_t=linear), tiling)
    loads = [op for op in module.walk() if isinstance(op, tile.BlockLoadOp)]  # type: ignore[attr-defined]
    assert {op.pitch.value.data for op in loads if op.pitch is not None} == pitches
    assert any(op.transposed is not None and op.pitch is not None for op in loads) == linear
    g = torch.Generator().manual_seed(m + n + k)
    dt = TORCH[el]
    x = torch.randint(-3, 4, (m, k), generator=g).to(dt)
    w = torch.randint(-3, 4, (n, k) if linear else (k, n), generator=g).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    mm = (x.double() @ (w.double().T if linear else w.double())).to(dt)
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))
    assert_close(got.cpu(), F.gelu(mm + b))


def test_an_operand_of_two_gemms_is_copied_once() -> None:
    text = """func @f(%x: tensor<300x257xbf16>, %w: tensor<257x304xbf16>, %v: tensor<257x304xbf16>) -> (tensor<300x304xbf16>, tensor<300x304xbf16>) {
  %a = graph.matmul %x, %w
  %b = graph.matmul %x, %v
  %c = graph.relu %b
  return %a, %c : tensor<300x304xbf16>, tensor<300x304xbf16>
}
"""
    module = loop_level(text, PAD_ALL)
    names = [k.kernel_name.data for k in loop.kernels(module)]
    assert names.count("pad_rows_0") == 1 and not any(n == "pad_rows_1" for n in names)
    gemms = [k for k in loop.kernels(module) if not k.kernel_name.data.startswith("pad")]
    assert len(gemms) == 2
    for gemm in gemms:
        (xload,) = [
            op
            for op in gemm.walk()
            if isinstance(op, loop.LoadOp) and op.buffer.type.get_shape() == (300, 264)
        ]  # type: ignore[attr-defined]
        assert xload is not None


def test_the_fusion_report_says_why_a_copy_is_launched(tmp_path: Path) -> None:
    status, _, err = run_opt(
        tmp_path, gemm_text(2000, 1000, 1025, "bf16"), "--fuse", "--fusion-report", "-o", str(tmp_path / "o")
    )
    assert status == 0
    lines = err.splitlines()
    assert lines[0] == "fusion report for @f: 2 kernels launched"
    (copy,) = [ln for ln in lines if "triton_pad_rows_0 (copy)" in ln]
    assert copy.endswith(WHY)
