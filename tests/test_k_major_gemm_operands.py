"""`k-major-gemm-operands`: f32 GEMM operands stored with K strided (`x @ w` with
`w` `[K, N]`, `x.T @ w`) or in rows not 16 bytes apart (K odd) are copied once
into K-major rows 16 bytes apart, the layout TF32 tensor cores read fast. Checked: which operands the rule copies and why not others,
the loop IR it leads to, the fusion report, and results against torch on the CPU
interpreter (thresholds lowered so that small shapes are copied).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from irc.dialects import loop, tile
from irc.passes.gemm_operand_copies import MIN_FLOPS
from irc.passes.k_major_gemm_operands import (
    KERNEL_PREFIX,
    WHY,
    KMajorGemmOperandsPass,
    slow_f32_operands,
)
from irc.pipeline import LOWERING
from irc.testing.cli import run_opt
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text, loop_level

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
COPY_ALL = "k-major-gemm-operands{min_flops=0}"


def buffer_shapes(kernel: loop.KernelOp) -> list[tuple[int, ...]]:
    loads = [op for op in kernel.walk() if isinstance(op, loop.LoadOp)]
    return [tuple(ld.buffer.type.get_shape()) for ld in loads]  # type: ignore[attr-defined]


def test_the_pass_is_in_the_lowering_before_tile() -> None:
    assert LOWERING.index("pad-gemm-operands") < LOWERING.index("k-major-gemm-operands")
    assert LOWERING.index("k-major-gemm-operands") < LOWERING.index("tile")


def copy_indices(copy: loop.KernelOp) -> tuple[list[object], list[object]]:
    """The copy kernel's load and store indices, as the copy's own indices where they
    are one (a clamped column shows as None)."""
    (load,) = [op for op in copy.walk() if isinstance(op, loop.LoadOp)]
    (store,) = [op for op in copy.walk() if isinstance(op, loop.StoreOp)]
    args = list(copy.body.block.args)

    def name(v: object) -> object:
        return args.index(v) if v in args else None

    return [name(i) for i in load.indices], [name(i) for i in store.indices]


def test_a_weight_stored_k_by_n_is_copied_k_major() -> None:
    """w [256, 300] (K strided) becomes [300, 256]: rows along K; the copy runs over
    the target and reads the source transposed ([k, n] for [n, k]); the GEMM reads it
    [n, k]. x [200, 256] is K-major in aligned rows and stays."""
    module = loop_level(gemm_text(200, 300, 256), COPY_ALL)
    copy, gemm = loop.kernels(module)
    assert copy.kernel_name.data == f"{KERNEL_PREFIX}0" and copy.parallel_bounds() == [300, 256]
    loads, stores = copy_indices(copy)
    assert stores == [0, 1] and loads[1] == 0  # the source's row index is the clamped k
    assert buffer_shapes(gemm) == [(200, 256), (300, 256), (300,)]
    (reduce,) = [op for op in gemm.walk() if isinstance(op, loop.ReduceOp) and op.contract]
    (kiv,) = reduce.body.block.args
    loads = [op for op in reduce.walk() if isinstance(op, loop.LoadOp)]
    assert all(op.indices[-1] is kiv for op in loads)  # both operands K-major now
    assert slow_f32_operands(gemm) == []
    # x is no copy: the K loop keeps its bound.
    assert loop.int_list(reduce.bounds) == [256]


def test_rows_of_odd_k_are_padded_with_zeros_and_k_runs_over_them() -> None:
    """K = 257: x [200, 257] is K-major but its rows are 1028 bytes apart; it is
    copied into [200, 260] (no transposition), w [257, 300] transposed into [300,
    260], their pads written 0. Both operands are copies: K runs to 260, unmasked
    by a ragged 257 (the products of the pads add 0)."""
    module = loop_level(gemm_text(200, 300, 257), COPY_ALL)
    x_copy, w_copy, gemm = loop.kernels(module)
    assert x_copy.parallel_bounds() == [200, 260] and w_copy.parallel_bounds() == [300, 260]
    assert copy_indices(x_copy) == ([0, None], [0, 1])
    assert copy_indices(w_copy) == ([None, 0], [0, 1])
    for copy in (x_copy, w_copy):
        fns = [op.fn.data for op in copy.walk() if isinstance(op, loop.ApplyOp)]
        assert fns == ["minimum", "lt", "where"]
    assert buffer_shapes(gemm) == [(200, 260), (300, 260), (300,)]
    (reduce,) = [op for op in gemm.walk() if isinstance(op, loop.ReduceOp) and op.contract]
    assert loop.int_list(reduce.bounds) == [260]


def test_an_lhs_stored_k_by_m_is_copied_too() -> None:
    module = loop_level(gemm_text(200, 300, 256, a_t=True, b_t=True), COPY_ALL)
    copy, gemm = loop.kernels(module)
    assert copy.parallel_bounds() == [200, 256]
    assert buffer_shapes(gemm) == [(200, 256), (300, 256), (300,)]


def test_k_major_half_precision_small_or_once_read_operands_are_left() -> None:
    # Both operands K-major already (w stored [N, K]), in rows 16 bytes apart.
    assert len(loop.kernels(loop_level(gemm_text(200, 300, 256, b_t=True), COPY_ALL))) == 1
    # 16-bit operands: wgmma reads them in either order.
    assert len(loop.kernels(loop_level(gemm_text(200, 300, 256, "bf16"), COPY_ALL))) == 1
    # Below the default product size: a copy's launch would outweigh it.
    assert 2 * 200 * 300 * 256 < MIN_FLOPS
    assert len(loop.kernels(loop_level(gemm_text(200, 300, 256), "k-major-gemm-operands"))) == 1
    # M = 100 is one row tile: w is read once by the GEMM and stays.
    assert len(loop.kernels(loop_level(gemm_text(100, 300, 256), COPY_ALL))) == 1
    # By default, a large f32 GEMM's [K, N] weight is copied.
    big = loop_level(gemm_text(1024, 1024, 1024), "k-major-gemm-operands")
    assert [k.kernel_name.data for k in loop.kernels(big)][0] == f"{KERNEL_PREFIX}0"


def test_pass_options_are_checked() -> None:
    with pytest.raises(Exception, match="rereads"):
        KMajorGemmOperandsPass(rereads=0)
    with pytest.raises(Exception, match="min-flops"):
        KMajorGemmOperandsPass(min_flops=-1)


def test_an_operand_of_two_gemms_is_copied_once() -> None:
    text = """func @f(%x: tensor<300x256xf32>, %w: tensor<256x304xf32>, %v: tensor<300x304xf32>) -> (tensor<300x304xf32>, tensor<300x256xf32>) {
  %a = graph.matmul %x, %w
  %wt = graph.transpose %w {perm = [1, 0]}
  %b = graph.matmul %v, %wt
  return %a, %b : tensor<300x304xf32>, tensor<300x256xf32>
}
"""
    names = [k.kernel_name.data for k in loop.kernels(loop_level(text, COPY_ALL))]
    # The first GEMM reads w [K, N], K strided: copied. The second reads w's transpose,
    # whose K (304) is w's contiguous dimension: left. One copy in all.
    assert sum(n.startswith(KERNEL_PREFIX) for n in names) == 1


@pytest.mark.parametrize(
    ("m", "n", "k", "a_t", "b_t", "copies"),
    [
        (200, 300, 257, False, False, 2),  # x padded, w transposed (and padded)
        (150, 260, 131, True, False, 2),  # both transposed
        (130, 257, 96, True, True, 1),  # a transposed; b K-major in aligned rows
        (140, 200, 64, False, True, 0),  # nothing to copy
    ],
)
def test_k_major_copies_match_torch(
    m: int, n: int, k: int, a_t: bool, b_t: bool, copies: int
) -> None:
    up_to_tile = f"fuse,decompose,graph-to-loop,split-reduction,{COPY_ALL},tile"
    compiled, module = compile_with_tiling(
        gemm_text(m, n, k, a_t=a_t, b_t=b_t), None, DEVICE, up_to_tile
    )
    launched = [op for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert len(launched) == 1 + copies
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn((k, m) if a_t else (m, k), generator=g)
    b = torch.randn((n, k) if b_t else (k, n), generator=g) / k**0.5
    c = torch.randn(n, generator=g)
    want = F.gelu((a.T if a_t else a) @ (b.T if b_t else b) + c)
    got = compiled["f"](a.to(DEVICE), b.to(DEVICE), c.to(DEVICE))
    assert_close(got.cpu(), want)


def test_the_fusion_report_says_why_a_copy_is_launched(tmp_path: Path) -> None:
    # (by default split-tf32-gemm-operands stores such operands as TF32 parts; this
    # pass copies f32 operands where it does not, as with irc.compile(tf32=True))
    passes = ",".join(["fuse", *(p for p in LOWERING if p != "split-tf32-gemm-operands")])
    status, _, err = run_opt(
        tmp_path, gemm_text(1024, 1024, 1024), "-p", passes, "--fusion-report", "-o", str(tmp_path / "o")
    )
    assert status == 0
    lines = err.splitlines()
    assert lines[0] == "fusion report for @f: 2 kernels launched"
    (copy,) = [ln for ln in lines if f"triton_{KERNEL_PREFIX}0 (copy)" in ln]
    assert copy.endswith(WHY)


def test_infinities_and_nans_survive_the_zero_pads() -> None:
    """K = 21 runs to 24 over both copies' zero pads: an inf or NaN operand stays
    what torch makes of it (the pads only ever multiply each other)."""
    text = """func @f(%a: tensor<130x21xf32>, %b: tensor<21x257xf32>) -> tensor<130x257xf32> {
  %c = graph.matmul %a, %b
  return %c : tensor<130x257xf32>
}
"""
    up_to_tile = f"fuse,decompose,graph-to-loop,split-reduction,{COPY_ALL},tile"
    compiled, _ = compile_with_tiling(text, None, DEVICE, up_to_tile)
    a = torch.randn(130, 21, generator=torch.Generator().manual_seed(1))
    b = torch.randn(21, 257, generator=torch.Generator().manual_seed(2))
    a[0, 20] = float("inf")
    a[1, 0] = float("nan")
    b[20, 3] = -float("inf")
    got = compiled["f"](a.to(DEVICE), b.to(DEVICE)).cpu()
    want = a @ b
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert_close(got[finite], want[finite])
