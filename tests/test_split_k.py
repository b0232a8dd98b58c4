"""`split-k`: an f32 GEMM whose output tiles leave SMs idle runs its K loop in
chunks (a batched GEMM storing partials) and sums them in its epilogue kernel.
Checked: the split the model picks for measured and unmeasured shapes, the loop IR
of both stages (ragged last chunks included), which GEMMs stay whole, and results
against torch on the CPU interpreter (a small `sms` makes small GEMMs split).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import irc
from irc.dialects import loop, tile
from irc.ir.kernel_kind import KernelKind
from irc.passes.split_k import (
    ALIGN_ELEMENTS,
    K_STEP,
    MIN_CHUNK,
    SPLIT_GAIN,
    SplitKPass,
    split_choice,
    split_cost,
)
from irc.pipeline import LOWERING, run_pipeline
from irc.testing.cli import run_opt
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text, loop_level
from irc.testing.verdict import judge_outputs

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
UP_TO = "fuse,decompose,graph-to-loop,split-reduction,pad-gemm-operands,k-major-gemm-operands"
SPLIT = "pad-gemm-operands,k-major-gemm-operands,split-k{sms=132}"
"""The loop passes a split sees before it, and split-k for an H200 (`loop_level`)."""


def test_the_pass_runs_after_the_operand_copies_and_before_tile() -> None:
    assert LOWERING.index("k-major-gemm-operands") < LOWERING.index("split-k")
    assert LOWERING.index("split-k") < LOWERING.index("tile")


@pytest.mark.parametrize(
    ("m", "k", "n", "splits"),
    [
        # measured on an H200 (the pass's table): the fastest split of each
        (1000, 3072, 1500, 4),
        (1536, 4096, 1536, 4),
        (2048, 8192, 1024, 1),  # 128 tiles fill the SMs once already
        # many tiles, or short K: whole
        (4096, 4096, 4096, 1),
        (8192, 768, 2304, 1),
        (1024, 1024, 1024, 1),
    ],
)
def test_the_model_picks_the_measured_split(m: int, k: int, n: int, splits: int) -> None:
    assert split_choice(m, n, k, 132)[0] == splits


def test_chunks_are_whole_k_steps_or_exact_aligned_runs_long_enough_and_cover_k() -> None:
    for m, k, n in [(300, 9000, 700), (777, 5000, 1333), (64, 65536, 64), (40, 1000, 24)]:
        for sms in (1, 8, 132):
            splits, chunk = split_choice(m, n, k, sms)
            if splits == 1:
                continue
            exact = splits * chunk == k and chunk % ALIGN_ELEMENTS == 0
            assert (chunk % K_STEP == 0 or exact) and chunk >= MIN_CHUNK
            assert (splits - 1) * chunk < k <= splits * chunk
            assert split_cost(m, n, k, chunk, splits, sms) < SPLIT_GAIN * split_cost(
                m, n, k, k, 1, sms
            )


def test_a_split_gemm_is_a_batched_gemm_and_a_reduction() -> None:
    """300x9000 @ 9000x700: 9 exact chunks of 1000 (31.25 K steps: no chunk
    overlaps another, nothing masked in the loop IR); stage 1 stores [9, 300, 700]
    partials, the GEMM's own kernel sums them and adds the bias."""
    module = loop_level(gemm_text(300, 700, 9000), SPLIT)
    copy, stage, final = loop.kernels(module)
    assert copy.kernel_name.data == "k_major_0"
    assert stage.kernel_name.data == final.kernel_name.data + "_split"
    assert stage.parallel_bounds() == [9, 300, 700]
    assert loop.kernel_kind(stage) is KernelKind.CONTRACTION
    (dot,) = [op for op in stage.walk() if loop.is_contraction(op)]
    assert loop.int_list(dot.bounds) == [1000]  # type: ignore[attr-defined]
    fns = [op.fn.data for op in dot.walk() if isinstance(op, loop.ApplyOp)]  # type: ignore[attr-defined]
    assert "minimum" not in fns and "where" not in fns and fns[-1] == "mul"
    (partials,) = [op for op in stage.walk() if isinstance(op, loop.StoreOp)]
    assert partials.buffer.type.get_shape() == (9, 300, 700)  # type: ignore[attr-defined]
    assert loop.kernel_kind(final) is KernelKind.REDUCTION
    (sums,) = [op for op in final.walk() if isinstance(op, loop.ReduceOp)]
    assert loop.int_list(sums.bounds) == [9] and sums.contract is None
    assert not any(loop.is_contraction(op) for op in final.walk())


def test_a_ragged_split_masks_the_overlap_of_its_last_chunk() -> None:
    """1000x3001 @ 3001x1500 (K prime: no exact chunks): 4 chunks of 768, the last
    one K's last 768 elements, both factors 0 where chunk 2 had them."""
    module = loop_level(gemm_text(1000, 1500, 3001), SPLIT)
    (stage,) = [k for k in loop.kernels(module) if k.kernel_name.data.endswith("_split")]
    assert stage.parallel_bounds() == [4, 1000, 1500]
    (dot,) = [op for op in stage.walk() if loop.is_contraction(op)]
    assert loop.int_list(dot.bounds) == [768]  # type: ignore[attr-defined]
    fns = [op.fn.data for op in dot.walk() if isinstance(op, loop.ApplyOp)]  # type: ignore[attr-defined]
    assert "minimum" in fns and "ge" in fns and fns[-1] == "mul"


def test_half_batched_tiled_and_well_filled_gemms_stay_whole() -> None:
    def split(text: str) -> bool:
        return any(
            k.kernel_name.data.endswith("_split") for k in loop.kernels(loop_level(text, SPLIT))
        )

    assert split(gemm_text(300, 700, 9000))
    assert not split(gemm_text(300, 700, 9000, "bf16"))
    assert not split(gemm_text(300, 700, 9000, "f64"))
    assert not split(gemm_text(2048, 1024, 8192))
    batched = """func @f(%a: tensor<2x300x9000xf32>, %b: tensor<2x9000x700xf32>) -> tensor<2x300x700xf32> {
  %c = graph.matmul %a, %b
  return %c : tensor<2x300x700xf32>
}
"""
    assert not split(batched)
    tiled = """func @f(%a: memref<64x4096xf32>, %b: memref<64x4096xf32>) -> memref<64x64xf32> {
  %o = loop.alloc : memref<64x64xf32>
  loop.kernel {name = "mm", bounds = [64, 64], block = [64, 64, 32], warps = 4, stages = 3} (%i: index, %j: index) {
    %s = loop.reduce {kind = "sum", bounds = [4096], contract = true} (%k: index) {
      %x = loop.load %a, %i, %k : f32
      %y = loop.load %b, %j, %k : f32
      %p = loop.apply %x, %y {fn = "mul"} : f32
      loop.yield %p
    } : f32
    loop.store %s, %o, %i, %j
  }
  return %o : memref<64x64xf32>
}
"""
    module = irc.parse(tiled, "tiled.ir")
    run_pipeline(module, "split-k")
    assert len(loop.kernels(module)) == 1  # the user's tiling is kept, and so is the kernel
    untiled = irc.parse(tiled.replace(", block = [64, 64, 32], warps = 4, stages = 3", ""), "u.ir")
    run_pipeline(untiled, "split-k")
    assert len(loop.kernels(untiled)) == 2


def test_pass_options_are_checked() -> None:
    with pytest.raises(Exception, match="sms"):
        SplitKPass(sms=0)


@pytest.mark.parametrize(
    ("m", "n", "k", "b_t", "sms"),
    [
        (40, 24, 1000, False, 8),  # 4 chunks of 256, the last one ragged
        (40, 24, 1200, False, 1),  # 2 exact chunks of 600: 18.75 K steps each
        (5, 3, 2000, True, 1),  # 2 exact chunks of 1000
        (33, 70, 1280, True, 8),  # chunks that divide K
        (20, 9, 2049, False, 4),  # K odd: the copies pad it to 2052, then chunks
        (70, 50, 777, True, 16),
    ],
)
def test_split_gemms_match_torch(m: int, n: int, k: int, b_t: bool, sms: int) -> None:
    text = gemm_text(m, n, k, b_t=b_t)
    up_to_tile = f"{UP_TO.replace('k-major-gemm-operands', 'k-major-gemm-operands{min_flops=0}')},split-k{{sms={sms}}},tile"
    compiled, module = compile_with_tiling(text, None, DEVICE, up_to_tile)
    launched = [op.sym_name.data for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert any(name.endswith("_split") for name in launched), launched
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=g)
    b = torch.randn((n, k) if b_t else (k, n), generator=g) / k**0.5
    c = torch.randn(n, generator=g)
    inputs = [t.to(DEVICE) for t in (a, b, c)]
    got = compiled["f"](*inputs)
    (fn,) = [op for op in irc.parse(text, "gemm.ir").walk() if op.name == "func.func"]  # type: ignore[attr-defined]
    (verdict,) = judge_outputs(fn, inputs, got)
    assert verdict.ok, verdict.line
    assert_close(got.cpu(), F.gelu(a @ (b.T if b_t else b) + c), rtol=1e-4, atol=1e-4)


def test_infinities_and_nans_land_where_the_f64_product_has_them() -> None:
    """A chunk's partial carries its inf or NaN to the sum; one in the elements
    that the ragged last chunk overlaps with the chunk before it counts once (both
    factors are 0 there in the last chunk: an inf times a zeroed factor would be NaN)."""
    m, n, k = 40, 24, 1000
    text = gemm_text(m, n, k)
    compiled, _ = compile_with_tiling(text, None, DEVICE, f"{UP_TO},split-k{{sms=8}},tile")
    g = torch.Generator().manual_seed(5)
    a, b, c = (
        torch.randn(m, k, generator=g),
        torch.randn(k, n, generator=g),
        torch.randn(n, generator=g),
    )
    a[0, 10] = float("inf")  # chunk 0
    a[1, 750] = float("inf")  # chunk 2, inside the last chunk's window (744..)
    a[2, 999] = -float("inf")  # the last chunk
    b[500, 3] = float("nan")
    b[760, 5] = float("inf")  # in the overlap, in the second factor
    got = compiled["f"](a.to(DEVICE), b.to(DEVICE), c.to(DEVICE)).cpu()
    want = F.gelu(a.double() @ b.double() + c.double()).float()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_chunks_that_divide_k_beat_ragged_ones() -> None:
    """4992 = 3 x 1664: three exact chunks, not four or eight of which the last
    overruns K (`RAGGED_RATE`); 9000 = 9 x 1000, exact though not whole K steps
    (on an H200 118 us against 146 for 9 x 1024, ragged); 3001 is prime, so ragged
    it is; 9002 = 2 x 4501 has no divisor into 16-byte runs but 2, too few."""
    assert split_choice(777, 1333, 4992, 132) == (3, 1664)
    assert split_choice(300, 700, 9000, 132) == (9, 1000)
    splits, chunk = split_choice(1000, 1500, 3001, 132)
    assert splits * chunk > 3001 and chunk % K_STEP == 0
    splits, chunk = split_choice(300, 700, 9002, 132)
    assert splits * chunk > 9002 and chunk % K_STEP == 0


def test_the_fusion_report_names_both_stages_and_the_pass(tmp_path: Path) -> None:
    status, _, err = run_opt(
        tmp_path, gemm_text(300, 700, 9000), "--fuse", "--fusion-report", "-o", str(tmp_path / "o")
    )
    assert status == 0
    lines = err.splitlines()
    assert lines[0] == "fusion report for @f: 3 kernels launched"
    (gemm,) = [ln for ln in lines if "(contraction" in ln]
    assert "triton_mm_fused_matmul_add_gelu_0_split + triton_mm_fused_matmul_add_gelu_0" in gemm
    assert "(contraction, split by split-k)" in gemm


@settings(max_examples=12, deadline=None)
@given(
    m=st.integers(1, 80),
    n=st.integers(1, 80),
    k=st.integers(256, 3000),
    sms=st.sampled_from([2, 4, 8, 16]),
    b_t=st.booleans(),
)
def test_any_split_the_model_picks_matches_torch(
    m: int, n: int, k: int, sms: int, b_t: bool
) -> None:
    """Whatever S and chunk the model picks for a small GPU (ragged or not, K odd
    or not), the split GEMM is torch's to f32 accuracy."""
    text = gemm_text(m, n, k, b_t=b_t)
    up_to_tile = f"{UP_TO},split-k{{sms={sms}}},tile"
    compiled, _ = compile_with_tiling(text, None, DEVICE, up_to_tile)
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g)
    w = torch.randn((n, k) if b_t else (k, n), generator=g) / k**0.5
    b = torch.randn(n, generator=g)
    inputs = [t.to(DEVICE) for t in (x, w, b)]
    (fn,) = [op for op in irc.parse(text, "gemm.ir").walk() if op.name == "func.func"]  # type: ignore[attr-defined]
    (verdict,) = judge_outputs(fn, inputs, compiled["f"](*inputs))
    assert verdict.ok, verdict.line


def test_one_sm_splits_only_to_fill_its_program_slots() -> None:
    """The interpreter's target has one SM (`split-k{sms=1}`): a GEMM of many tiles
    stays whole; one of a single 64x64 tile splits in two, the two programs an SM
    holds at once by the model."""
    assert split_choice(300, 700, 9000, 1) == (1, 9000)
    assert split_choice(64, 64, 65536, 1) == (2, 32768)


def test_a_split_gemm_that_also_returns_its_product_stores_both() -> None:
    """The summing kernel stores the product (the sum of the partials) and the
    epilogue's result, as the whole GEMM's kernel did."""
    text = gemm_text(40, 24, 1000, returns_product=True)
    compiled, module = compile_with_tiling(text, None, DEVICE, f"{UP_TO},split-k{{sms=8}},tile")
    launched = [op.sym_name.data for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert launched == [
        "triton_mm_fused_matmul_add_gelu_0_split",
        "triton_mm_fused_matmul_add_gelu_0",
    ]
    g = torch.Generator().manual_seed(9)
    x, w, b = (
        torch.randn(40, 1000, generator=g),
        torch.randn(1000, 24, generator=g),
        torch.randn(24, generator=g),
    )
    mm, r = compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))
    assert_close(mm.cpu(), x @ w, rtol=1e-4, atol=1e-4)
    assert_close(r.cpu(), F.gelu(x @ w + b), rtol=1e-4, atol=1e-4)


def test_a_stage_name_the_input_already_uses_is_not_taken_again() -> None:
    """Hand-written loop IR may name a kernel `mm_split` beside the GEMM `mm`: the
    stage takes another name (`mm_split_`), and the module still verifies, lowers
    and computes x @ y.T and x + 1."""
    text = """func @f(%a: memref<8x4096xf32>, %b: memref<8x4096xf32>) -> (memref<8x8xf32>, memref<8x4096xf32>) {
  %o = loop.alloc : memref<8x8xf32>
  %p = loop.alloc : memref<8x4096xf32>
  loop.kernel {name = "mm_split", bounds = [8, 4096]} (%i: index, %j: index) {
    %x = loop.load %a, %i, %j : f32
    %c = loop.constant {value = 1.0} : f32
    %s = loop.apply %x, %c {fn = "add"} : f32
    loop.store %s, %p, %i, %j
  }
  loop.kernel {name = "mm", bounds = [8, 8]} (%i: index, %j: index) {
    %s = loop.reduce {kind = "sum", bounds = [4096], contract = true} (%k: index) {
      %x = loop.load %a, %i, %k : f32
      %y = loop.load %b, %j, %k : f32
      %t = loop.apply %x, %y {fn = "mul"} : f32
      loop.yield %t
    } : f32
    loop.store %s, %o, %i, %j
  }
  return %o, %p : memref<8x8xf32>, memref<8x4096xf32>
}
"""
    module = irc.parse(text, "names.ir")
    run_pipeline(module, "split-k")
    irc.verify(module)
    names = [k.kernel_name.data for k in loop.kernels(module)]
    assert names == ["mm_split", "mm_split_", "mm"]
    compiled = irc.compile(irc.parse(text, "names.ir"), device=DEVICE)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, 4096, generator=g), torch.randn(8, 4096, generator=g)
    product, plus_one = compiled(x.to(DEVICE), y.to(DEVICE))
    assert_close(product.cpu(), x @ y.T, rtol=1e-4, atol=1e-4)
    assert_close(plus_one.cpu(), x + 1)
