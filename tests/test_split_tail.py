"""A persistent GEMM's last, partial round of tiles split into K chunks
(`tile.tail_split`): the model's choices, the loop IR's `tail = [T, S]` and what its
verifier refuses, the three tile kernels loop-to-tile makes of it (their grids, the
workspace, the launch order), the fusion report, and results against torch on the
CPU interpreter (a small `sms` makes small GEMMs split).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import irc
from irc.dialects import loop, tile
from irc.ir.kernel_kind import KernelKind
from irc.lowering.loop_to_tile import TAIL_FIXUP_ROWS
from irc.passes.tile import (
    TAIL_GAIN,
    TAIL_MIN_STEPS,
    KernelShape,
    Tiling,
    gemm_tiling,
    tail_split,
)
from irc.pipeline import run_pipeline
from irc.testing.cli import run_opt
from irc.testing.forced_tiling import UP_TO_TILE, compile_with_tiling
from irc.testing.programs import gemm_text
from irc.testing.verdict import judge_outputs

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"


def half_gemm(m: int, n: int, k: int, **kw: object) -> KernelShape:
    """A bf16 GEMM + bias + erf GELU as the tile pass sees it."""
    return KernelShape(
        KernelKind.CONTRACTION, (m, n), (k,), True, element_bytes=2, transcendentals=1,
        split_epilogue=True, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def up_to_tile(sms: int, pads: bool = True) -> str:
    """The passes before loop-to-tile for a GPU of `sms` SMs; `pads`: every half GEMM's
    unaligned operands padded (so that they move by TMA), else none."""
    pad = "pad-gemm-operands{persistent_only=false min_flops=0}" if pads else ""
    spec = UP_TO_TILE.replace("split-k,tile", f"split-k,tile{{sms={sms}}}")
    return spec.replace("pad-gemm-operands", pad).replace(",,", ",")


def loop_gemm(text: str, sms: int) -> loop.KernelOp:
    module = irc.parse(text, "gemm.ir")
    run_pipeline(module, up_to_tile(sms))
    (kernel,) = [k for k in loop.kernels(module) if any(map(loop.is_contraction, k.walk()))]
    return kernel


# --- the model ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("m", "k", "n", "tail"),
    [
        # measured on an H200 (whole program, tail off / on): 342.5 / 325.8 us
        (3002, 5014, 5714, (24, 5)),
        # 140 tiles of 128x256: one round and 8 tiles, which 16 chunks of 9 K steps
        # take (231.6 / 176.0 us; a second round of 128x128 tiles took 211.8)
        (1711, 8899, 2446, (8, 16)),
        # full rounds, or a last round nearly full: nothing to split
        (4096, 4096, 4096, None),
        (8192, 4096, 4096, None),
        # short K: a chunk would be under TAIL_MIN_STEPS steps
        (2339, 1097, 6257, None),
    ],
)
def test_the_model_splits_the_measured_tails(
    m: int, k: int, n: int, tail: tuple[int, int] | None
) -> None:
    t = gemm_tiling(half_gemm(m, n, k), 132)
    assert t.persistent and t.block[:2] == (128, 256)
    assert t.tail == tail


def test_a_tail_is_one_round_of_chunks_that_cover_k() -> None:
    for m, n, k in [(3002, 5714, 5014), (1711, 2446, 8899), (777, 3001, 9001), (5000, 300, 4000)]:
        for sms in (8, 78, 132):
            shape = half_gemm(m, n, k)
            t = gemm_tiling(shape, sms)
            if t.tail is None:
                continue
            tiles, splits = t.tail
            bm, bn, bk = t.block
            assert tiles == -(-m // bm) * -(-n // bn) % sms
            assert 2 <= splits and tiles * splits <= sms
            steps = -(-k // bk)
            chunk = -(-steps // splits)
            assert chunk >= TAIL_MIN_STEPS and (splits - 1) * chunk < steps <= splits * chunk
            found = tail_split(shape, t, sms)
            assert found is not None and found[:2] == t.tail and found[2] <= TAIL_GAIN


def test_smaller_tiles_are_not_split() -> None:
    """A last round of few 128x128 tiles ran twice as fast as a full round (L2 is
    shared by fewer of them): splitting it saved nothing (2339x6257 @ 6257x1097)."""
    shape = half_gemm(2339, 1097, 6257)
    assert tail_split(shape, Tiling((128, 128, 64), 8, 4, persistent=True), 132) is None
    assert tail_split(shape, Tiling((128, 256, 64), 8, 4, persistent=True), 80) is not None


def test_f32_batched_and_program_a_tile_gemms_keep_their_tiles() -> None:
    f32 = KernelShape(KernelKind.CONTRACTION, (3002, 5714), (5014,), False, element_bytes=4)
    assert gemm_tiling(f32, 132).tail is None
    batched = KernelShape(KernelKind.CONTRACTION, (3, 3002, 5714), (5014,), True, element_bytes=2)
    assert gemm_tiling(batched, 132).tail is None
    whole = Tiling((128, 256, 64), 8, 3)  # a program a tile: its rounds are the GPU's to fill
    assert tail_split(half_gemm(3002, 5714, 5014), whole, 132) is None
    two = half_gemm(3002, 5714, 5014, contractions=2)  # partials are one contraction's
    assert gemm_tiling(half_gemm(3002, 5714, 5014), 132).tail is not None
    assert gemm_tiling(two, 132).tail is None


# --- loop IR -------------------------------------------------------------------------


def test_the_tile_pass_writes_the_tail_and_it_reads_back() -> None:
    kernel = loop_gemm(gemm_text(3002, 5714, 5014, "f16"), 132)
    assert loop.int_list(kernel.tail) == [24, 5]  # type: ignore[arg-type]
    module = kernel.parent_op().parent_op()  # type: ignore[union-attr]
    printed = irc.print_module(module)  # type: ignore[arg-type]
    assert "persistent = 1, tail = [24, 5]" in printed
    assert irc.print_module(irc.parse(printed, "again.ir")) == printed


LOOP_GEMM = """func @f(%x: memref<300x999xf16>, %w: memref<999x700xf16>) -> memref<300x700xf16> {
  %0 = loop.alloc : memref<300x700xf16>
  loop.kernel {name = "mm", bounds = [300, 700], block = [128, 128, 64], warps = 8, stages = 4, PROPS} (%i: index, %j: index) {
    %1 = loop.reduce {kind = "sum", bounds = [999], contract = true} (%k: index) {
      %2 = loop.load %x, %i, %k : f16
      %3 = loop.load %w, %k, %j : f16
      %4 = loop.apply %2, %3 {fn = "mul"} : f16
      loop.yield %4
    } : f16
    loop.store %1, %0, %i, %j
  }
  return %0 : memref<300x700xf16>
}
"""


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ("tail = [2, 4]", "splits a persistent contraction's last tiles"),
        ("persistent = 1, tail = [19, 4]", "splits 19 tiles; the kernel has 18 of 128x128"),
        ("persistent = 1, tail = [2, 1]", "into 1 chunks of whole steps of 64; from 2 to 16"),
        ("persistent = 1, tail = [2, 17]", "into 17 chunks of whole steps of 64; from 2 to 16"),
        ("persistent = 1, tail = [2]", "'tail' must be a list of 2 integers"),
        ("persistent = 1, tail = [0, 2]", "'tail[0]' must be an integer"),
    ],
)
def test_the_verifier_refuses_a_tail_the_kernel_cannot_have(props: str, message: str) -> None:
    bad = LOOP_GEMM.replace("PROPS", props)
    with pytest.raises(irc.IrcError, match=re.escape(message)):
        irc.verify(irc.parse(bad, "bad.ir"))


def test_a_written_tail_round_trips_and_lowers() -> None:
    text = LOOP_GEMM.replace("PROPS", "persistent = 1, tail = [2, 4]")
    module = irc.parse(text, "tail.ir")
    irc.verify(module)
    printed = irc.print_module(module)
    assert "tail = [2, 4]" in printed
    assert irc.print_module(irc.parse(printed, "again.ir")) == printed


@pytest.mark.parametrize("element", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("tail", [(5, 3), (18, 16)])
def test_written_tails_of_every_float_type_match_torch(element: str, tail: tuple[int, int]) -> None:
    """A hand-written tail, at any float type (the workspace holds the accumulator's:
    f64 for f64), of some tiles or all of them, against torch in f64."""
    text = LOOP_GEMM.replace("PROPS", f"persistent = 1, tail = [{tail[0]}, {tail[1]}]")
    text = text.replace("f16", element)
    compiled = irc.compile(irc.parse(text, "tail.ir"), device=DEVICE)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}.get(
        element, torch.float64
    )
    x, w = torch.randn(300, 999, dtype=dtype), torch.randn(999, 700, dtype=dtype)
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu().double()
    want = x.double() @ w.double()
    ulp = {"f16": 2**-10, "bf16": 2**-7, "f32": 2**-20, "f64": 2**-50}[element]
    assert (got - want).abs().max() <= 4 * ulp * want.abs().max()


MANY_OUTPUTS = """func @f(%x: memref<300x999xf16>, %w: memref<999x699xf16>) -> (memref<300x699xf32>, memref<300x699xf32>, memref<300x699xf32>, memref<300x699xf32>) {
  %0 = loop.alloc : memref<300x699xf32>
  %1 = loop.alloc : memref<300x699xf32>
  %2 = loop.alloc : memref<300x699xf32>
  %3 = loop.alloc : memref<300x699xf32>
  loop.kernel {name = "mm", bounds = [300, 699], block = [128, 256, 64], warps = 8, stages = 4, persistent = 1, tail = [3, 4]} (%i: index, %j: index) {
    %4 = loop.reduce {kind = "sum", bounds = [999], contract = true} (%k: index) {
      %5 = loop.load %x, %i, %k : f16
      %6 = loop.load %w, %k, %j : f16
      %7 = loop.apply %5, %6 {fn = "mul"} : f16
      loop.yield %7
    } : f16
    %8 = loop.apply %4 {fn = "cast"} : f32
    loop.store %8, %0, %i, %j
    loop.store %8, %1, %i, %j
    loop.store %8, %2, %i, %j
    loop.store %8, %3, %i, %j
  }
  return %0, %1, %2, %3 : memref<300x699xf32>, memref<300x699xf32>, memref<300x699xf32>, memref<300x699xf32>
}
"""


def test_a_fixup_runs_its_epilogue_whole() -> None:
    """Four f32 outputs of 699 columns (rows 4 bytes aligned) take the persistent
    epilogue in parts (`tile.epilogue_parts`); the fixup's 16-row tiles run it whole
    on the partials' sum, which no K loop recomputes."""
    module = irc.parse(MANY_OUTPUTS, "many.ir")
    run_pipeline(module, "loop-to-tile,tile-cse,dce")
    irc.verify(module)
    (fixup,) = [k for k in tile.kernels(module) if k.kernel_name.data.endswith("_fixup")]
    assert not any(isinstance(op, tile.DotOp) for op in fixup.walk())
    assert not any(isinstance(op, tile.ColumnPartOp) for op in fixup.walk())
    compiled = irc.compile(irc.parse(MANY_OUTPUTS, "many.ir"), device=DEVICE)
    x, w = torch.randn(300, 999, dtype=torch.float16), torch.randn(999, 699, dtype=torch.float16)
    want = (x.double() @ w.double()).half().double()
    for got in compiled["f"](x.to(DEVICE), w.to(DEVICE)):
        assert (got.cpu().double() - want).abs().max() <= 2**-9 * want.abs().max()


# --- tile kernels --------------------------------------------------------------------


def lowered(text: str, sms: int) -> tuple[tile.KernelOp, ...]:
    module = irc.parse(text, "gemm.ir")
    run_pipeline(module, up_to_tile(sms) + ",loop-to-tile,tile-cse,dce")
    irc.verify(module)
    return tuple(tile.kernels(module)), module  # type: ignore[return-value]


def test_a_split_tail_makes_partials_a_fixup_and_the_persistent_rest() -> None:
    kernels, module = lowered(gemm_text(3002, 5714, 5014, "f16"), 132)
    by_name = {k.kernel_name.data: k for k in kernels}
    base = "triton_mm_fused_matmul_add_gelu_0"
    partial, fixup, main = by_name[base + "_tail"], by_name[base + "_fixup"], by_name[base]
    assert [int(g.value.data) for g in partial.grid.data] == [24 * 5]
    assert [int(g.value.data) for g in fixup.grid.data] == [24 * 128 // TAIL_FIXUP_ROWS]
    assert main.persistent is not None and partial.persistent is None
    (tiles,) = [op for op in main.walk() if isinstance(op, tile.TilesOp)]
    assert tiles.count.value.data == 24 * 23 - 24
    # partials come by TMA (zero past K), their tiles go to an f32 workspace
    assert any(isinstance(op, tile.BlockLoadOp) for op in partial.walk())
    workspaces = [
        op for op in module.walk()
        if isinstance(op, loop.AllocOp) and op.result.type.element_type == irc.ir.types.F32  # type: ignore[attr-defined]
    ]  # fmt: skip
    assert [w.result.type.get_shape() for w in workspaces] == [(24 * 5 * 128, 256)]  # type: ignore[attr-defined]
    launches = [
        op.kernel.root_reference.data for op in module.walk() if isinstance(op, tile.LaunchOp)
    ]
    assert launches[-3:] == [base + "_tail", base + "_fixup", base]


def test_a_tail_of_every_tile_launches_no_persistent_kernel() -> None:
    text = LOOP_GEMM.replace("PROPS", "persistent = 1, tail = [18, 4]")
    module = irc.parse(text, "all.ir")
    run_pipeline(module, "loop-to-tile,tile-cse,dce")
    irc.verify(module)
    names = [k.kernel_name.data for k in tile.kernels(module)]
    assert names == ["triton_mm_tail", "triton_mm_fixup"]


def test_kernel_names_the_tail_would_take_stay_the_inputs() -> None:
    """Hand-written kernels already named `mm_tail` and `mm_fixup` beside `mm`: the
    split's kernels take the next free names, and each kernel computes its own."""
    text = LOOP_GEMM.replace("PROPS", "persistent = 1, tail = [5, 3]")
    copy = """  %9 = loop.alloc : memref<300x700xf16>
  loop.kernel {name = "NAME", bounds = [300, 700]} (%a: index, %b: index) {
    %c = loop.load %0, %a, %b : f16
    loop.store %c, %9, %a, %b
  }
"""
    body = copy.replace("NAME", "mm_tail") + copy.replace("NAME", "mm_fixup").replace("%9", "%8")
    text = text.replace(
        "  return %0 : memref<300x700xf16>", body + "  return %9 : memref<300x700xf16>"
    )
    module = irc.parse(text, "names.ir")
    run_pipeline(module, "loop-to-tile,tile-cse,dce")  # the written tilings, tail and all
    irc.verify(module)
    names = sorted(k.kernel_name.data for k in tile.kernels(module))
    assert names == sorted(
        ["triton_mm", "triton_mm_tail", "triton_mm_fixup", "triton_mm_tail_", "triton_mm_fixup_"]
    )
    compiled = irc.compile(irc.parse(text, "names.ir"), device=DEVICE)
    x, w = torch.randn(300, 999, dtype=torch.float16), torch.randn(999, 700, dtype=torch.float16)
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu().double()
    want = x.double() @ w.double()
    assert (got - want).abs().max() <= 4 * 2**-10 * want.abs().max()


def test_the_fusion_report_names_the_three_kernels(tmp_path: Path) -> None:
    text = gemm_text(3002, 5714, 5014, "f16")
    status, _, err = run_opt(tmp_path, text, "--fuse", "--fusion-report", "-o", os.devnull)
    assert status == 0
    line = next(x for x in err.splitlines() if "(contraction" in x)
    assert (
        "_tail + triton_mm_fused_matmul_add_gelu_0_fixup + triton_mm_fused_matmul_add_gelu_0 "
        in line
    )
    assert "last round of tiles in chunks of K" in line
    assert "(copy)" not in "".join(x for x in err.splitlines() if "_tail" in x or "_fixup" in x)


# --- results -------------------------------------------------------------------------


def _check(
    m: int, n: int, k: int, dtype: str, sms: int, *, pads: bool = True, **kw: bool
) -> list[tile.KernelOp]:
    """Compiles `act(x @ w + b)` for `sms` SMs and judges it against torch; returns the
    tile kernels."""
    text = gemm_text(m, n, k, dtype, **kw)
    compiled, module = compile_with_tiling(text, None, DEVICE, up_to_tile(sms, pads))
    (fn,) = [op for op in irc.parse(text, "gemm.ir").walk() if op.name == "func.func"]  # type: ignore[attr-defined]
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = torch.randn((k, m) if kw.get("a_t") else (m, k), dtype=torch_dtype)
    w = torch.randn((n, k) if kw.get("b_t") else (k, n), dtype=torch_dtype)
    b = torch.randn(n, dtype=torch_dtype)
    inputs = [t.to(DEVICE) for t in (x, w, b)]
    got = compiled["f"](*inputs)
    for verdict in judge_outputs(fn, inputs, got):  # type: ignore[arg-type]
        assert verdict.ok, verdict.line
    kernels = list(tile.kernels(module))
    names = [kk.kernel_name.data for kk in kernels]
    assert any(n.endswith("_tail") for n in names), names  # the split was taken
    return kernels


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "sms", "kw"),
    [
        (300, 700, 1501, "bf16", 8, {}),  # odd K: the last chunk masked past K
        (777, 700, 2001, "f16", 4, {"b_t": True}),  # an nn.Linear weight, read as w.T
        (517, 1001, 2501, "bf16", 6, {"returns_product": True}),  # two outputs
        (300, 700, 2001, "f16", 4, {"a_t": True}),
    ],
)
def test_split_tails_match_torch(m: int, n: int, k: int, dtype: str, sms: int, kw: dict) -> None:  # type: ignore[type-arg]
    _check(m, n, k, dtype, sms, **kw)


def test_unpadded_operands_are_read_by_masked_pointer_loads_in_chunks() -> None:
    kernels = _check(300, 700, 1501, "bf16", 8, pads=False)
    (partial,) = [k for k in kernels if k.kernel_name.data.endswith("_tail")]
    assert not any(isinstance(op, tile.BlockLoadOp) for op in partial.walk())


def _split_shapes() -> list[tuple[int, int, int, str, int]]:
    """Random small GEMMs (seeded) the model splits at a few SMs."""
    import random

    rng, out = random.Random(33), []
    while len(out) < 4:
        m, n, k = rng.randint(130, 520), rng.randint(130, 700), rng.randint(600, 2100)
        sms, dtype = rng.choice([4, 6, 8]), rng.choice(["bf16", "f16"])
        if gemm_tiling(half_gemm(m, n, k), sms).tail is not None:
            out.append((m, n, k, dtype, sms))
    return out


@pytest.mark.parametrize(("m", "n", "k", "dtype", "sms"), _split_shapes())
def test_random_tails_the_model_picks_match_torch(
    m: int, n: int, k: int, dtype: str, sms: int
) -> None:
    _check(m, n, k, dtype, sms)
