"""f32 kernels: attention on FMA units (`ieee` products), GEMMs on tensor cores
(`split-tf32`), f64 GEMMs on FMA units: the tiles they get."""

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


def test_f32_gemms_take_tensor_core_tiles_and_f64_ones_keep_64x64() -> None:
    """split-tf32 at 128x128x32 took 0.80-0.94 of cuBLAS's FFMA SGEMM on GPT-2's
    and larger GEMMs on an H200; 64x64x32 (rate 0.71 of it) only where the larger
    tiles leave most of a round idle. f64 (FMA units) keeps 64x64x32."""
    gpt2 = KernelShape("contraction", (8192, 768), (3072,), False)
    assert choose_tiling(gpt2, sms=132) == Tiling((128, 128, 32), 8, 3)
    # 4 tiles of 128x128 on 132 SMs against 16 of 64x64: one round either way.
    assert choose_tiling(KernelShape("contraction", (256, 256), (64,), False)).block == (64, 64, 32)
    # 3000x2049: 408 tiles of 128x128 (4 rounds) against 1551 of 64x64 (12 rounds,
    # at 0.71 of the rate): the large ones, 377 us against 415 on an H200. 1536x1536
    # at K = 4096: 144 large tiles leave most of a second round idle, small ones won
    # (488 us against 554).
    odd = KernelShape("contraction", (3000, 2049), (1023,), False)
    assert choose_tiling(odd, sms=132).block == (128, 128, 32)
    square = KernelShape("contraction", (1536, 1536), (4096,), False)
    assert choose_tiling(square, sms=132).block == (64, 64, 32)
    # Small matrices: the next powers of two (16 at least), a K step of K.
    small = choose_tiling(KernelShape("contraction", (8, 40, 24), (16,), False))
    assert small.block == (64, 32, 16)
    for sms in (132, 16):
        f64 = KernelShape("contraction", (8192, 768), (3072,), False, element_bytes=8)
        assert choose_tiling(f64, sms=sms) == Tiling((64, 64, 32), 4, 2)
