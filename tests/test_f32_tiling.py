"""f32 kernels: attention on FMA units (`ieee` products), GEMMs on tensor cores
(`split-tf32`), f64 GEMMs on FMA units: the tiles they get."""

from __future__ import annotations

import os

import irc
from irc.dialects import loop
from irc.passes.tile import KernelShape, Tiling, choose_tiling
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text
from irc.testing.reference import functions, random_inputs
from irc.testing.verdict import judge_outputs

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


def test_f32_attention_takes_32_query_rows_a_program() -> None:
    """FMA operands live in registers beside the scores and the accumulator: 128
    query rows spilled (27.7 ms against 1.26 ms with 32 on an H100); half types keep
    128 (64 under a causal band)."""
    for banded in (False, True):
        f32 = KernelShape("attention", (96, 1024, 64), (1024, 64), False, banded=banded)
        assert choose_tiling(f32) == Tiling((32, 64), 4, 2)
    half = choose_tiling(KernelShape("attention", (96, 1024, 64), (1024, 64), True))
    assert half.block[0] == 128
    # Fewer rows than that: the next power of two, 16 at least.
    assert choose_tiling(KernelShape("attention", (4, 8, 16), (8, 16), False)).block == (16, 16)


def test_f32_gemms_take_tensor_core_tiles_and_f64_ones_keep_64x64() -> None:
    """split-tf32 at 128x128x32 took 0.80-0.94 of cuBLAS's FFMA SGEMM on GPT-2's
    and larger GEMMs on an H200; 64x64x32 at 3 stages (rate 0.80 of it) where the
    larger tiles leave enough of a round idle. f64 (FMA units) keeps 64x64x32 at 2."""
    gpt2 = KernelShape("contraction", (8192, 768), (3072,), False)
    assert choose_tiling(gpt2, sms=132) == Tiling((128, 128, 32), 8, 3)
    # 4 tiles of 128x128 on 132 SMs against 16 of 64x64: one round either way.
    assert choose_tiling(KernelShape("contraction", (256, 256), (64,), False)).block == (64, 64, 32)
    # 2565x939: 168 tiles of 128x128 (2 rounds) against 615 of 64x64 (5 rounds, at
    # 0.80 of the rate): the small ones, 134 us against 173 on an H200. 4429x1208 (3
    # against 11): the large ones, 208 against 229. 3000x2049: 792 tiles of 128x64
    # (6 rounds at 0.85) against 4 rounds of 128x128 and 12 of 64x64: 294 us against
    # 334 and 304; 5343x540 (K = 312): 80.6 against 114.1 and 89.0.
    for m, n, k, block in (
        (3000, 2049, 1023, (128, 64)),
        (5343, 540, 312, (128, 64)),
        (2565, 939, 974, (64, 64)),
        (1536, 1536, 4096, (64, 64)),
        (4429, 1208, 820, (128, 128)),
        (3333, 3333, 333, (128, 128)),
    ):
        tiling = choose_tiling(KernelShape("contraction", (m, n), (k,), False), sms=132)
        assert tiling.block == (*block, 32), (m, n, k)
        assert (tiling.warps, tiling.stages) == ((8, 3) if block == (128, 128) else (4, 3))
    # Batched (split-k's stages): no 128x64 (not measured there).
    batched = choose_tiling(KernelShape("contraction", (2, 3000, 2049), (1023,), False))
    assert batched.block[:2] != (128, 64)
    # Small matrices: the next powers of two (16 at least), a K step of K.
    small = choose_tiling(KernelShape("contraction", (8, 40, 24), (16,), False))
    assert small.block == (64, 32, 16)
    for sms in (132, 16):
        f64 = KernelShape("contraction", (8192, 768), (3072,), False, element_bytes=8)
        assert choose_tiling(f64, sms=sms) == Tiling((64, 64, 32), 4, 2)


def test_f32_gemms_in_128x64_tiles_match_torch() -> None:
    """The tiling `gemm_tiling` now picks for 3000x1023 @ 1023x2049, forced on a
    GEMM small enough for the interpreter (ragged tiles on both axes): bias and erf
    GELU on three TF32 products of split operands, judged against torch."""
    text = gemm_text(200, 150, 70)
    compiled, _ = compile_with_tiling(
        text,
        Tiling((128, 64, 32), 4, 3),
        DEVICE,
        chosen=lambda kernel: any(loop.is_contraction(op) for op in kernel.walk()),
    )
    (fn,) = functions(irc.parse(text, "gemm.ir")).values()
    inputs = random_inputs(fn, seed=3, device=DEVICE)
    (verdict,) = judge_outputs(fn, inputs, (compiled.f(*inputs),))
    assert verdict.ok, verdict.line
