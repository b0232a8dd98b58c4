"""f32 kernels on FMA units (`ieee` products, torch's default): the tiles they get."""

from __future__ import annotations

from irc.passes.tile import KernelShape, Tiling, choose_tiling


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


def test_f32_gemms_keep_64x64_tiles_whatever_the_sms() -> None:
    """64x64x32 `ieee` runs at 1.01-1.07x cuBLAS's FFMA kernels on the GPT-2 block's
    GEMMs on an H100; wave quantization is for the tensor-core tiles."""
    for sms in (132, 16):
        t = choose_tiling(KernelShape("contraction", (8192, 768), (3072,), False), sms=sms)
        assert t == Tiling((64, 64, 32), 4, 2)
