"""GEMM epilogues on column parts of a wide accumulator (`tile.column_part`).

A 128x256 tile of 8 warps holds 128 f32 a thread; an erf GELU on all of them at
once spilled registers. The K loop runs once on the whole tile, then the epilogue
and its stores run on each column part in turn. Checked here: the rule, the tile
IR it makes, the Triton it emits, and results against torch on the CPU
interpreter, with tilings forced small so that parts are partial or wholly past
the last column, persistent and not, through TMA and through pointers.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from xdsl.utils.exceptions import VerifyException

import irc
from irc.compiler import CompiledModule
from irc.dialects import tile
from irc.passes.tile import EPILOGUE_PART_F32, Tiling, epilogue_parts
from irc.syntax.printer import print_module
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def lower(text: str, tiling: Tiling | None) -> tuple[CompiledModule, object]:
    return compile_with_tiling(text, tiling, DEVICE)


def parts_of(module: object) -> list[tuple[int, int]]:
    return [
        (op.part.value.data, op.parts.value.data)
        for op in module.walk()  # type: ignore[attr-defined]
        if isinstance(op, tile.ColumnPartOp)
    ]


def test_rule_follows_the_accumulator_a_thread_holds() -> None:
    assert EPILOGUE_PART_F32 == 64
    assert epilogue_parts(Tiling((128, 256, 64), 8, 3, persistent=True)) == 2
    assert epilogue_parts(Tiling((128, 128, 64), 8, 4)) == 1  # 64 a thread
    assert epilogue_parts(Tiling((64, 64, 32), 4, 2)) == 1
    assert epilogue_parts(Tiling((128, 256, 64), 4, 3)) == 4
    # Parts keep 16 columns at least.
    assert epilogue_parts(Tiling((256, 32, 16), 1, 2)) == 2


@pytest.mark.parametrize("k", [3072, 768])
def test_wide_gemm_tiles_compute_their_epilogue_in_halves(k: int) -> None:
    """8192x2304 outputs take 128x256 tiles: one K loop, two parts of 128 columns,
    each with its own bias load, GELU and stores (TMA where persistent, K = 3072;
    pointers where the GELU outweighs K = 768 and a program takes a tile)."""
    text = gemm_text(8192, 2304, k, "bf16", act="gelu", returns_product=True)
    compiled, module = lower(text, None)
    (kernel,) = [op for op in module.walk() if isinstance(op, tile.KernelOp)]  # type: ignore[attr-defined]
    assert (kernel.persistent is not None) == (k == 3072)
    assert sum(isinstance(op, tile.DotOp) for op in kernel.walk()) == 1
    assert sorted(parts_of(module)) == [(0, 2), (1, 2)]
    gelus = [op for op in kernel.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "gelu"]
    assert len(gelus) == 2
    assert all(tuple(g.result.type.get_shape()) == (128, 128) for g in gelus)
    source = compiled.source
    assert source.count("_irc_gelu_half(") == 2  # results rounded to bf16: the half form
    splits = re.findall(r"tl\.split\(tl\.permute\(tl\.reshape\(v\d+, \(128, 2, 128\)\)", source)
    assert len(splits) == 2
    # Each part stores both outputs: one TMA store of the whole part (`whole = 1`),
    # or one masked store.
    stores = source.count(".store([") if k == 3072 else source.count("tl.store(")
    assert stores == 4
    blocks = [op for op in kernel.walk() if isinstance(op, tile.BlockStoreOp)]
    assert len(blocks) == (4 if k == 3072 else 0)
    assert all(b.whole is not None and b.box() == (128, 128) for b in blocks)


def test_narrow_tiles_keep_one_epilogue() -> None:
    _, module = lower(gemm_text(8192, 768, 3072, "bf16", act="gelu", returns_product=True), None)
    assert parts_of(module) == []


def test_tile_ir_with_parts_round_trips() -> None:
    text = gemm_text(70, 80, 24, "bf16", act="gelu", returns_product=True)
    _, module = lower(text, Tiling((64, 64, 16), 1, 2))
    assert sorted(parts_of(module)) == [(0, 2), (1, 2)]
    text = print_module(module)
    assert "tile.column_part" in text
    again = irc.parse(text, "tile.ir")
    irc.verify(again)
    assert print_module(again) == text


@pytest.mark.parametrize(
    ("m", "n", "k", "el", "act", "tiling"),
    [
        # n = 80: the second tile's parts hold columns 64..95 (16 valid) and 96..127 (none)
        (70, 80, 24, "bf16", "gelu", Tiling((64, 64, 16), 1, 2)),
        (70, 80, 24, "bf16", "gelu", Tiling((64, 64, 16), 1, 2, persistent=True)),
        # four parts of 16 columns (two halvings); the last part of the second tile is empty
        (40, 112, 40, "f16", "silu", Tiling((128, 64, 16), 1, 2, persistent=True)),
        (96, 128, 48, "bf16", "relu", Tiling((64, 64, 16), 1, 2, persistent=True)),  # all TMA
        (33, 72, 20, "f32", "gelu", Tiling((64, 64, 16), 1, 2)),
    ],
)
def test_parts_match_torch(m: int, n: int, k: int, el: str, act: str, tiling: Tiling) -> None:
    text = gemm_text(m, n, k, el, act=act, returns_product=True)
    compiled, module = lower(text, tiling)
    assert len(parts_of(module)) == epilogue_parts(tiling) > 1
    g = torch.Generator().manual_seed(m * n + k)
    dt = TORCH[el]
    # Integer-valued operands: exact products, whatever the accumulation order.
    x = torch.randint(-3, 4, (m, k), generator=g).to(dt)
    w = torch.randint(-3, 4, (k, n), generator=g).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    fn = getattr(F, act) if act != "relu" else torch.relu
    mm = (x.double() @ w.double()).to(dt)
    want = (mm, fn(mm + b))
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))
    for g_, w_ in zip(got, want, strict=True):
        assert_close(g_.cpu(), w_)


@pytest.mark.parametrize(
    ("props", "result", "message"),
    [
        ("{part = 0, parts = 3}", "16x10", "'parts' must be a power of two"),
        ("{part = 2, parts = 2}", "16x16", "'part' must be an integer from 0 to 1"),
        ("{part = 0, parts = 2}", "16x32", "the result must be [16, 16] of f32"),
        ("{part = 0, parts = 64}", "16x1", "'parts' must be a power of two from 2 to 32, got 64"),
    ],
)
def test_verifier_refuses_malformed_parts(props: str, result: str, message: str) -> None:
    text = f"""tile.kernel {{name = "k", grid = [1], warps = 4}} (%p0: ptr<f32>) {{
  %v = tile.constant {{value = 1.0}} : tensor<16x32xf32>
  %h = tile.column_part %v {props} : tensor<{result}xf32>
}}
"""
    with pytest.raises((VerifyException, irc.IrcError)) as err:
        irc.verify(irc.parse(text, "t.ir"))
    assert message in str(err.value)


def test_verifier_refuses_a_part_of_a_1d_block() -> None:
    text = """tile.kernel {name = "k", grid = [1], warps = 4} (%p0: ptr<f32>) {
  %v = tile.constant {value = 1.0} : tensor<32xf32>
  %h = tile.column_part %v {part = 0, parts = 2} : tensor<16xf32>
}
"""
    with pytest.raises((VerifyException, irc.IrcError)) as err:
        irc.verify(irc.parse(text, "t.ir"))
    assert "2-d block" in str(err.value)
