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
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from xdsl.utils.exceptions import VerifyException

import irc
from irc.compiler import CompiledModule
from irc.dialects import loop, tile
from irc.passes.tile import (
    EPILOGUE_PART_F32,
    SHARED_BYTES,
    Tiling,
    epilogue_parts,
    gemm_fits,
    kernel_shape,
    tiling_of,
)
from irc.pipeline import run_pipeline
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


@pytest.mark.parametrize("k", [3072, 256])
def test_wide_gemm_tiles_compute_their_epilogue_in_halves(k: int) -> None:
    """8192x2304 outputs take 128x256 tiles: one K loop, two parts of 128 columns,
    each with its own bias load, GELU and stores (TMA where persistent, K = 3072;
    pointers where the GELU outweighs K = 256 and a program takes a tile)."""
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


def gemm_kernel(m: int, n: int, k: int, el: str = "bf16", **kw: object) -> loop.KernelOp:
    """The tiled loop-level GEMM kernel of `gemm_text`."""
    module = irc.parse(gemm_text(m, n, k, el, **kw), "gemm.ir")  # type: ignore[arg-type]
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    (kernel,) = loop.kernels(module)
    return kernel


def test_outputs_whose_rows_miss_16_bytes_are_narrow_stores() -> None:
    """Odd N: bf16 rows 2-byte aligned; N = 2 mod 4: 4-byte; N = 8k: none (TMA or
    16-byte vectors); an f32 output of odd N: 4-byte stores."""
    assert kernel_shape(gemm_kernel(4096, 6257, 1097)).narrow_stores == ((2, 2),)
    assert kernel_shape(gemm_kernel(4096, 5714, 1097)).narrow_stores == ((2, 4),)
    assert kernel_shape(gemm_kernel(4096, 6256, 1097)).narrow_stores == ()
    assert kernel_shape(gemm_kernel(1000, 1001, 700, "f32")).narrow_stores == ((4, 4),)
    both = kernel_shape(gemm_kernel(4096, 6257, 1097, returns_product=True))
    assert both.narrow_stores == ((2, 2), (2, 2)) and both.split_epilogue


def test_store_addresses_split_the_epilogue_further() -> None:
    """`EPILOGUE_REGISTERS`: 128 accumulators a thread and 64 two-byte stores of a
    half, each with its own 2-register address, spilled; quarters did not. Four-byte
    stores (two elements an address) keep halves, and a 128x128 tile (64 a thread)
    stays whole even with 2-byte stores."""
    wide = Tiling((128, 256, 64), 8, 4, persistent=True)
    odd, even = (kernel_shape(gemm_kernel(4096, n, 1097)) for n in (6257, 5714))
    assert epilogue_parts(wide, odd) == 4
    assert epilogue_parts(wide, even) == 2
    assert epilogue_parts(Tiling((128, 128, 64), 8, 4, persistent=True), odd) == 1
    # Two narrow outputs: twice the addresses an element, eighths.
    two = kernel_shape(gemm_kernel(4096, 6257, 1097, returns_product=True))
    assert epilogue_parts(wide, two) == 8


def test_narrow_outputs_stage_one_part_so_four_stages_fit() -> None:
    """A persistent 128x256 GEMM of odd N: the K loop's four stages (196,608 bytes)
    and one quarter's staged output (16,384; Triton allocated 213,024) fit; staged
    whole (65,536) they would not. The tile pass takes the four stages."""
    kernel = gemm_kernel(2339, 6257, 1097)
    shape, t = kernel_shape(kernel), tiling_of(kernel)
    assert t.block == (128, 256, 64) and t.stages == 4 and t.persistent
    assert gemm_fits(t, shape, SHARED_BYTES)
    assert not gemm_fits(t, replace(shape, narrow_stores=()), SHARED_BYTES)  # staged whole


def test_an_epilogue_that_cannot_split_keeps_one_part() -> None:
    """A kernel whose epilogue is not element-wise on the product with stores that
    move with the output column (`column_split_epilogue`) keeps one part, however
    many addresses its outputs take."""
    shape = kernel_shape(gemm_kernel(2339, 6257, 1097))
    wide = Tiling((128, 256, 64), 8, 4, persistent=True)
    assert epilogue_parts(wide, replace(shape, split_epilogue=False)) == 1
    assert epilogue_parts(wide, shape) == 4


@pytest.mark.parametrize(("n", "parts"), [(301, 4), (300, 2)])
def test_narrow_store_parts_match_torch(n: int, parts: int) -> None:
    """A 64x64 tile of one warp holds 128 a thread, like 128x256 of 8: quarters for
    2-byte stores, halves for 4-byte ones; results against torch on the interpreter."""
    text = gemm_text(70, n, 40, "bf16", act="gelu")
    tiling = Tiling((64, 64, 16), 1, 2, persistent=True)
    compiled, module = lower(text, tiling)
    assert sorted(parts_of(module)) == [(i, parts) for i in range(parts)]
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-3, 4, (70, 40), generator=g).to(torch.bfloat16)
    w = torch.randint(-3, 4, (40, n), generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    want = F.gelu((x.double() @ w.double()).to(torch.bfloat16) + b)
    assert_close(compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)).cpu(), want)


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
