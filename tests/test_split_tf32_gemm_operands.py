"""`split-tf32-gemm-operands`: an f32 GEMM's operands are stored once as TF32 parts
(heads and tails), K-major in rows padded to
128 bytes, and the contraction sums three TF32 dots of them. Checked: the IR it
makes and when it makes none, the tiling of four tiles a K step, the precision the
lowering gives each dot (and refuses to give where a buffer is not all parts),
the verifier's view of sums of products, and results against torch and against
the in-loop split (bit for bit) on the CPU interpreter, inf and NaN included.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import irc
from irc.analysis.dot_operands import tf32_buffers
from irc.compiler import lower_to_tile
from irc.dialects import loop, tile
from irc.passes import split_k
from irc.passes.split_tf32_gemm_operands import (
    KERNEL_PREFIX,
    PARTS_MIN_FLOPS,
    WHY,
    SplitTf32GemmOperandsPass,
)
from irc.passes.tile import SHARED_BYTES, Tiling, gemm_fits, kernel_shape, tiling_of
from irc.pipeline import LOWERING, run_pipeline
from irc.syntax.diagnostics import IrcError
from irc.syntax.printer import print_module
from irc.testing.cli import run_opt
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text
from irc.tools.opt import run as irc_opt

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
SPLIT_ALL = "split-tf32-gemm-operands{min_flops=0 rereads=1}"
UP_TO = "fuse,decompose,graph-to-loop,split-reduction"


def loop_module(
    text: str, passes: str = f"{SPLIT_ALL},k-major-gemm-operands{{min_flops=0}}"
) -> object:
    module = irc.parse(text, "gemm.ir")
    run_pipeline(module, f"{UP_TO},{passes}")
    irc.verify(module)
    return module


def kernels(module: object) -> list[loop.KernelOp]:
    return [k for k in module.walk() if isinstance(k, loop.KernelOp)]  # type: ignore[attr-defined]


def contraction(kernel: loop.KernelOp) -> loop.ReduceOp:
    (red,) = [op for op in kernel.walk() if loop.is_contraction(op)]
    assert isinstance(red, loop.ReduceOp)
    return red


def test_the_pass_runs_after_padding_and_before_k_major_copies() -> None:
    # Its copies are K-major already: k-major-gemm-operands then finds nothing to copy.
    assert LOWERING.index("pad-gemm-operands") < LOWERING.index("split-tf32-gemm-operands")
    assert LOWERING.index("split-tf32-gemm-operands") < LOWERING.index("k-major-gemm-operands")


@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, True), (False, True)])
def test_operands_become_parts_and_the_contraction_three_products(a_t: bool, b_t: bool) -> None:
    """x [200, 257] (or stored [257, 200]) and w [257, 300] (or [300, 257]): x's
    and w's heads and tails, each [rows, 288] (257 padded to 128 bytes); K runs to
    288 over the zero pads; the GEMM sums three products of its four loads, the
    finite heads selected from the heads."""
    module = loop_module(gemm_text(200, 300, 257, a_t=a_t, b_t=b_t))
    left, right, gemm = kernels(module)
    assert left.kernel_name.data == f"{KERNEL_PREFIX}0"
    assert right.kernel_name.data == f"{KERNEL_PREFIX}1"
    assert left.parallel_bounds() == [200, 288] and right.parallel_bounds() == [300, 288]
    for copy in (left, right):
        stores = [op for op in copy.walk() if isinstance(op, loop.StoreOp)]
        assert len(stores) == 2
        fns = {op.fn.data for op in copy.walk() if isinstance(op, loop.ApplyOp)}
        assert {"tf32_head", "tf32_tail"} <= fns
    red = contraction(gemm)
    assert loop.int_list(red.bounds) == [288]
    products = loop.contraction_products(red.body.block.last_op.values[0])  # type: ignore[union-attr]
    assert len(products) == 3
    loads = [op for op in red.walk() if isinstance(op, loop.LoadOp)]
    assert len({ld.buffer for ld in loads}) == 4
    assert all(tuple(ld.buffer.type.get_shape())[1] == 288 for ld in loads)  # type: ignore[attr-defined]
    # the part buffers hold values TF32 holds exactly; the inputs and output not
    assert tf32_buffers(module.walk()) == {ld.buffer for ld in loads}  # type: ignore[attr-defined]


def test_half_f64_small_and_once_read_gemms_are_left() -> None:
    only = SPLIT_ALL
    assert len(kernels(loop_module(gemm_text(200, 300, 256, "bf16"), only))) == 1
    assert len(kernels(loop_module(gemm_text(200, 300, 256, "f64"), only))) == 1
    # Below the default product size the copies' launches would outweigh it.
    assert 2 * 200 * 300 * 256 < PARTS_MIN_FLOPS < 2 * 400 * 300 * 1200
    assert len(kernels(loop_module(gemm_text(200, 300, 256), "split-tf32-gemm-operands"))) == 1
    assert len(kernels(loop_module(gemm_text(400, 300, 1200), "split-tf32-gemm-operands"))) == 3
    # M = 100 is one row tile: w would be read once, so neither operand is split.
    rereads = "split-tf32-gemm-operands{min_flops=0}"
    assert len(kernels(loop_module(gemm_text(100, 300, 256), rereads))) == 1
    # By default a large f32 GEMM's operands are split.
    big = loop_module(gemm_text(1024, 1024, 1024), "split-tf32-gemm-operands")
    names = [k.kernel_name.data for k in kernels(big)]
    assert names[:2] == [f"{KERNEL_PREFIX}0", f"{KERNEL_PREFIX}1"]


def test_pass_options_are_checked() -> None:
    with pytest.raises(Exception, match="rereads"):
        SplitTf32GemmOperandsPass(rereads=0)
    with pytest.raises(Exception, match="min-flops"):
        SplitTf32GemmOperandsPass(min_flops=-1)
    with pytest.raises(Exception, match="sms"):
        SplitTf32GemmOperandsPass(sms=0)


def test_bad_pass_options_are_located_errors(tmp_path: Path) -> None:
    status, _, err = run_opt(
        tmp_path, gemm_text(64, 64, 64), "-p", "split-tf32-gemm-operands{sms=0}"
    )
    assert status == 1 and "Traceback" not in err and "sms" in err, err


def test_tf32_mode_splits_nothing() -> None:
    """`irc.compile(tf32=True)` makes f32 GEMMs one TF32 product: no parts."""
    for tf32, parts in ((False, 2), (True, 0)):
        module = irc.parse(gemm_text(1024, 1024, 1024), "gemm.ir")
        lower_to_tile(module, tf32=tf32)
        names = [k.sym_name.data for k in module.walk() if isinstance(k, tile.KernelOp)]  # type: ignore[attr-defined]
        assert sum(KERNEL_PREFIX in n for n in names) == parts


def test_four_tiles_a_step_are_counted_in_shared_memory() -> None:
    """4096^3: 128x128x32 tiles of four f32 operand tiles fit 3 stages (196,608
    bytes of 232,448 and the epilogue's), 4 do not."""
    module = loop_module(gemm_text(4096, 4096, 4096), f"{SPLIT_ALL},tile")
    gemm = kernels(module)[-1]
    shape = kernel_shape(gemm)
    assert shape.operand_tiles == (2, 2)
    assert tiling_of(gemm) == Tiling((128, 128, 32), 8, 3)
    assert not gemm_fits(Tiling((128, 128, 32), 8, 4), shape, SHARED_BYTES)


@pytest.mark.parametrize(
    ("m", "n", "k", "block"),
    [
        (1162, 440, 1051, (64, 128, 32)),  # 40 tiles of 128x128 leave 92 SMs idle
        (440, 1162, 1051, (64, 128, 32)),  # transposed: 1 round either way, 64x128's rate
        (5343, 540, 312, (128, 128, 32)),  # 210 tiles: 2 rounds; 64x128's take 4
        (60, 4000, 512, (64, 128, 32)),  # rows of one tile: 128x128 is 64x128
    ],
)
def test_parts_gemms_take_narrow_tiles_where_they_fill_the_rounds(
    m: int, n: int, k: int, block: tuple[int, int, int]
) -> None:
    """The tile pass weighs 128x128x32 (8 warps) against 64x128 and 128x64 (4 warps,
    `TF32_PARTS_NARROW_TILES`) by rounds of tiles over the SMs; all 3 stages."""
    module = loop_module(gemm_text(m, n, k), f"{SPLIT_ALL},tile")
    tiling = tiling_of(kernels(module)[-1])
    assert tiling is not None and tiling.block == block and tiling.stages == 3


@pytest.mark.parametrize(
    ("m", "n", "k", "a_t", "b_t"),
    [(130, 257, 96, True, True), (67, 45, 131, False, False), (100, 70, 33, False, True)],
)
def test_parts_match_torch_and_the_in_loop_split(
    m: int, n: int, k: int, a_t: bool, b_t: bool
) -> None:
    """The same products in the same order as `_irc_dot_split_tf32`: equal results (up
    to the CPU's BLAS), inf and NaN where the f64 product has them (an inf head's tail
    is 0, its finite head 0)."""
    text = gemm_text(m, n, k, a_t=a_t, b_t=b_t)
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn((k, m) if a_t else (m, k), generator=g)
    b = torch.randn((n, k) if b_t else (k, n), generator=g) / k**0.5
    c = torch.randn(n, generator=g)
    a[0, 3], a[4, 0] = float("inf"), -float("inf")
    b[5, 2], b[2, 7] = float("nan"), float("inf")
    got = []
    for passes in ("k-major-gemm-operands{min_flops=0}", f"{SPLIT_ALL}"):
        compiled, module = compile_with_tiling(text, None, DEVICE, f"{UP_TO},{passes},tile")
        launched = [op.sym_name.data for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
        assert (sum(KERNEL_PREFIX in n for n in launched) == 2) == (passes == SPLIT_ALL)
        got.append(compiled["f"](a.to(DEVICE), b.to(DEVICE), c.to(DEVICE)).cpu())
    in_loop, parts = got
    # (in f64: torch's f32 CPU GEMM makes NaN of some sums of one inf term)
    aa, bb = (a.T if a_t else a).double(), (b.T if b_t else b).double()
    want = F.gelu(aa @ bb + c.double()).float()
    assert torch.equal(parts.isnan(), want.isnan()) and torch.equal(parts.isinf(), want.isinf())
    finite = want.isfinite()
    assert_close(parts[finite], want[finite])
    if DEVICE == "cpu":  # the GPU's dots may sum in another order in each kernel
        # The same products: equal up to the order numpy's BLAS sums them in, which
        # on some CPUs depends on the operands' layout (an AMD EPYC host's OpenBLAS:
        # up to 7e-7 apart at these sizes). A product left out would be 1e-4 off.
        assert_close(parts, in_loop, rtol=0, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize(("splits", "chunk"), [(3, 96), (2, 112), (4, 64)])
def test_split_k_chunks_a_sum_of_parts_products(
    splits: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """split-k after the parts: K = 224 (200 padded to 128 bytes) in ragged chunks
    of 96 or 64 (the last one overlaps the chunk before it, every factor of the three
    products 0 there) or exact ones of 112; inf and NaN where the f64 product has them."""
    monkeypatch.setattr(split_k, "split_choice", lambda *_: (splits, chunk))
    m, n, k = 70, 90, 200
    text = gemm_text(m, n, k)
    compiled, module = compile_with_tiling(text, None, DEVICE, f"{UP_TO},{SPLIT_ALL},split-k,tile")
    launched = [op.sym_name.data for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert sum(n.endswith("_split") for n in launched) == 1
    g = torch.Generator().manual_seed(splits)
    a, b, c = (
        torch.randn(m, k, generator=g),
        torch.randn(k, n, generator=g),
        torch.randn(n, generator=g),
    )
    a[3, 150], b[199, 5] = float("inf"), float("nan")
    got = compiled["f"](a.to(DEVICE), b.to(DEVICE), c.to(DEVICE)).cpu()
    want = F.gelu(a.double() @ b.double() + c.double()).float()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert_close(got[want.isfinite()], want[want.isfinite()])


def test_a_dot_of_parts_is_one_tf32_product_others_split(tmp_path: Path) -> None:
    """The lowering gives a dot `tf32` precision only where both factors are loads of
    buffers every store of which writes a TF32 part: here `%h` is, `%y` also gets
    the raw input stored, so its dot keeps `split-tf32`."""
    text = """func @f(%x: memref<64x64xf32>, %w: memref<64x64xf32>) -> (memref<64x64xf32>, memref<64x64xf32>) {
  %h = loop.alloc : memref<64x64xf32>
  %y = loop.alloc : memref<64x64xf32>
  loop.kernel {name = "parts", bounds = [64, 64]} (%i: index, %j: index) {
    %v = loop.load %x, %i, %j : f32
    %p = loop.apply %v {fn = "tf32_head"} : f32
    loop.store %p, %h, %i, %j
    loop.store %p, %y, %i, %j
  }
  loop.kernel {name = "raw", bounds = [64, 64]} (%i: index, %j: index) {
    %v = loop.load %x, %i, %j : f32
    loop.store %v, %y, %i, %j
  }
  %o1 = loop.alloc : memref<64x64xf32>
  %o2 = loop.alloc : memref<64x64xf32>
  loop.kernel {name = "mm1", bounds = [64, 64]} (%i: index, %j: index) {
    %s = loop.reduce {kind = "sum", bounds = [64], contract = true} (%k: index) {
      %a = loop.load %h, %i, %k : f32
      %b = loop.load %h, %j, %k : f32
      %t = loop.apply %a, %b {fn = "mul"} : f32
      loop.yield %t
    } : f32
    loop.store %s, %o1, %i, %j
  }
  loop.kernel {name = "mm2", bounds = [64, 64]} (%i: index, %j: index) {
    %s = loop.reduce {kind = "sum", bounds = [64], contract = true} (%k: index) {
      %a = loop.load %y, %i, %k : f32
      %b = loop.load %h, %j, %k : f32
      %t = loop.apply %a, %b {fn = "mul"} : f32
      loop.yield %t
    } : f32
    loop.store %s, %o2, %i, %j
  }
  return %o1, %o2 : memref<64x64xf32>, memref<64x64xf32>
}
"""
    module = irc.parse(text, "parts.ir")
    lower_to_tile(module)
    precisions = {
        k.sym_name.data: [d.precision.data for d in k.walk() if isinstance(d, tile.DotOp)]  # type: ignore[union-attr]
        for k in module.walk()  # type: ignore[attr-defined]
        if isinstance(k, tile.KernelOp)
    }
    assert precisions["triton_mm1"] == ["tf32"]
    assert precisions["triton_mm2"] == ["split-tf32"]
    compiled = irc.compile(irc.parse(text, "parts.ir"), device=DEVICE)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    o1, o2 = compiled(x.to(DEVICE), x.to(DEVICE))
    heads = ((x.view(torch.int32) + 4096) & -8192).view(torch.float32)
    assert_close(o1.cpu(), heads @ heads.T)
    assert_close(o2.cpu(), x @ heads.T)


def test_the_verifier_takes_sums_of_products_and_refuses_other_sums() -> None:
    body = """func @f(%x: memref<8x16xf32>) -> memref<8x8xf32> {{
  %o = loop.alloc : memref<8x8xf32>
  loop.kernel {{name = "mm", bounds = [8, 8]}} (%i: index, %j: index) {{
    %s = loop.reduce {{kind = "sum", bounds = [16], contract = true}} (%k: index) {{
      %a = loop.load %x, %i, %k : f32
      %b = loop.load %x, %j, %k : f32
      %p = loop.apply %a, %b {{fn = "mul"}} : f32
      %q = loop.apply %b, %a {{fn = "mul"}} : f32
      %t = loop.apply {sum} {{fn = "add"}} : f32
      loop.yield %t
    }} : f32
    loop.store %s, %o, %i, %j
  }}
  return %o : memref<8x8xf32>
}}
"""
    irc.verify(irc.parse(body.format(sum="%p, %p"), "ok.ir"))
    # a product whose first factor reads the columns is refused as before
    with pytest.raises(IrcError, match="its first factor reads"):
        irc.verify(irc.parse(body.format(sum="%p, %q"), "bad.ir"))
    with pytest.raises(IrcError, match="contract = true is a matrix product"):
        irc.verify(irc.parse(body.format(sum="%p, %a"), "bad.ir"))


@pytest.mark.parametrize("summed", ["%p, %p0", "%p0, %p0"])
def test_a_contraction_product_outside_its_body_is_refused(summed: str, tmp_path: Path) -> None:
    """A product made before the K loop would be added once a K step, and split-k's
    ragged chunk could not zero its factors: the verifier refuses it, located."""
    text = f"""func @f(%x: memref<8x16xf32>) -> memref<8x8xf32> {{
  %o = loop.alloc : memref<8x8xf32>
  loop.kernel {{name = "mm", bounds = [8, 8]}} (%i: index, %j: index) {{
    %c0 = loop.constant {{value = 0}} : index
    %a0 = loop.load %x, %i, %c0 : f32
    %b0 = loop.load %x, %j, %c0 : f32
    %p0 = loop.apply %a0, %b0 {{fn = "mul"}} : f32
    %s = loop.reduce {{kind = "sum", bounds = [16], contract = true}} (%k: index) {{
      %a = loop.load %x, %i, %k : f32
      %b = loop.load %x, %j, %k : f32
      %p = loop.apply %a, %b {{fn = "mul"}} : f32
      %t = loop.apply {summed} {{fn = "add"}} : f32
      loop.yield %t
    }} : f32
    loop.store %s, %o, %i, %j
  }}
  return %o : memref<8x8xf32>
}}
"""
    status, _, err = run_opt(tmp_path, text)
    assert status == 1 and "Traceback" not in err
    assert re.match(r".*input\.ir:8:\d+: error: .*products are ops of its own body", err), err


def test_tf32_parts_take_f32_only() -> None:
    text = """func @f(%x: memref<8xf64>) -> memref<8xf64> {
  %o = loop.alloc : memref<8xf64>
  loop.kernel {name = "k", bounds = [8]} (%i: index) {
    %v = loop.load %x, %i : f64
    %h = loop.apply %v {fn = "tf32_head"} : f64
    loop.store %h, %o, %i
  }
  return %o : memref<8xf64>
}
"""
    with pytest.raises(IrcError, match="'tf32_head' takes f32 operands"):
        irc.verify(irc.parse(text, "f64.ir"))


def test_parts_print_and_parse_back() -> None:
    module = loop_module(gemm_text(200, 300, 257))
    printed = print_module(module)  # type: ignore[arg-type]
    assert '{fn = "tf32_head"}' in printed and '{fn = "tf32_tail"}' in printed
    again = irc.parse(printed, "again.ir")
    irc.verify(again)
    assert print_module(again) == printed


def test_the_fusion_report_says_why_the_parts_are_launched(tmp_path: Path) -> None:
    path = tmp_path / "gemm.ir"
    path.write_text(gemm_text(2048, 2048, 1024))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        status = irc_opt(
            [str(path), "--fuse", "--fusion-report", "-o", str(tmp_path / "o")], stdout=out
        )
    assert status == 0
    lines = err.getvalue().splitlines()
    assert lines[0] == "fusion report for @f: 3 kernels launched"
    copies = [ln for ln in lines if f"triton_{KERNEL_PREFIX}" in ln and "(copy)" in ln]
    assert len(copies) == 2 and all(ln.endswith(WHY) for ln in copies)


@pytest.mark.parametrize(
    ("m", "k", "n", "parts", "splits"),
    [
        (5343, 312, 540, True, 1),  # short K: parts, whole
        (2243, 758, 514, True, 1),  # 90 tiles of 128x128 in one round; split: three
        (1162, 1051, 440, True, 3),  # 40 tiles: split in 3 fills the SMs
        (300, 9000, 700, False, 9),  # parts of 72 MB, split: the in-loop split
        (4096, 4096, 4096, True, 1),  # parts of 256 MB, but not split
    ],
)
def test_parts_and_split_k_follow_the_model(
    m: int, k: int, n: int, parts: bool, splits: int
) -> None:
    """The default pipeline (`x @ w` + bias + GELU): the parts where they fit L2 or
    split-k leaves the GEMM whole (`copies_for`), and split-k's choice for them at
    the parts' tiles (`split_cost(parts=True)`)."""
    module = loop_module(
        gemm_text(m, n, k), "split-tf32-gemm-operands,k-major-gemm-operands,split-k"
    )
    names = [kk.kernel_name.data for kk in kernels(module)]
    assert sum(KERNEL_PREFIX in name for name in names) == (2 if parts else 0)
    stages = [kk for kk in kernels(module) if kk.kernel_name.data.endswith("_split")]
    assert (stages[0].parallel_bounds()[0] if stages else 1) == splits


@pytest.mark.parametrize(
    ("text", "shapes", "parts", "reference"),
    [
        (
            """func @f(%x: tensor<70x45xf32>) -> tensor<70x70xf32> {
  %t = graph.transpose %x {perm = [1, 0]}
  %m = graph.matmul %x, %t
  return %m : tensor<70x70xf32>
}""",
            [(70, 45)],
            1,  # x @ x.T: both factors read x K-major, split once
            lambda x: x @ x.T,
        ),
        (
            """func @f(%x: tensor<37x37xf32>) -> tensor<37x37xf32> {
  %m = graph.matmul %x, %x
  return %m : tensor<37x37xf32>
}""",
            [(37, 37)],
            2,  # x @ x: the right factor reads x along its rows: a transposed copy
            lambda x: x @ x,
        ),
        (
            """func @f(%x: tensor<50x33xf32>, %w: tensor<33x33xf32>) -> tensor<50x33xf32> {
  %a = graph.matmul %x, %w
  %r = graph.relu %a
  %b = graph.matmul %r, %w
  return %b : tensor<50x33xf32>
}""",
            [(50, 33), (33, 33)],
            3,  # x, w (once for both GEMMs), relu(x @ w)
            lambda x, w: torch.relu(x @ w) @ w,
        ),
        (
            """func @f(%x: tensor<20x1xf32>, %w: tensor<1x30xf32>) -> tensor<20x30xf32> {
  %a = graph.matmul %x, %w
  return %a : tensor<20x30xf32>
}""",
            [(20, 1), (1, 30)],
            2,  # K = 1, padded to 32
            lambda x, w: x @ w,
        ),
    ],
)
def test_shared_and_degenerate_operands(
    text: str, shapes: list[tuple[int, int]], parts: int, reference: object
) -> None:
    """An operand used twice is split once per layout it is read in; K = 1 runs over
    its pad. Results within assert_close of torch's f64 product, or no further from
    it than 4x torch's f32 error."""
    compiled, module = compile_with_tiling(text, None, DEVICE, f"{UP_TO},{SPLIT_ALL},tile")
    launched = [op.sym_name.data for op in module.body.ops if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert sum(KERNEL_PREFIX in n for n in launched) == parts, launched
    g = torch.Generator().manual_seed(len(launched))
    args = [torch.randn(s, generator=g) for s in shapes]
    got = compiled["f"](*(a.to(DEVICE) for a in args)).cpu()
    assert callable(reference)
    want = reference(*(a.double() for a in args))
    torch_error = (reference(*args).double() - want).abs().max().item()
    error = (got.double() - want).abs().max().item()
    assert torch.allclose(got, want.float(), rtol=1.3e-6, atol=1e-5) or error <= 4 * torch_error


def test_hand_written_kernel_names_are_not_reused_or_trusted(tmp_path: Path) -> None:
    """Loop IR written by hand whose GEMM kernel is itself named `tf32_parts_0`: the
    parts' copies take the next free numbers. A kernel named like code is refused,
    located, before any pass or code generation."""
    gemm = """  %s = loop.reduce {kind = "sum", bounds = [64], contract = true} (%k: index) {
      %a = loop.load %x, %i, %k : f32
      %b = loop.load %w, %j, %k : f32
      %t = loop.apply %a, %b {fn = "mul"} : f32
      loop.yield %t
    } : f32"""
    text = f"""func @f(%x: memref<64x64xf32>, %w: memref<64x64xf32>) -> memref<64x64xf32> {{
  %o = loop.alloc : memref<64x64xf32>
  loop.kernel {{name = "tf32_parts_0", bounds = [64, 64]}} (%i: index, %j: index) {{
  {gemm}
    loop.store %s, %o, %i, %j
  }}
  return %o : memref<64x64xf32>
}}
"""
    status, out, err = run_opt(tmp_path, text, "-p", SPLIT_ALL)
    assert status == 0, err
    names = re.findall(r'loop.kernel \{name = "(\w+)"', out)
    assert names == ["tf32_parts_1", "tf32_parts_2", "tf32_parts_0"], names
    status, source, err = run_opt(tmp_path, text, "--emit", "triton")
    assert status == 0, err
    compile(source, "generated.py", "exec")  # one valid module
    hostile = text.replace('"tf32_parts_0"', '"k\\"); import os; os.system(\\"x"')
    status, source, err = run_opt(tmp_path, hostile, "--emit", "triton")
    assert status == 1 and "Traceback" not in err and not source
    assert re.match(
        r".*input\.ir:3:3: error: loop.kernel: kernel name .* is not an identifier", err
    )
