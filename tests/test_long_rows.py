"""Rows too long for one block: one program a row in chunks (tile's
`long_row_tiling`), held in registers as unrolled chunks (`unrolled_row_tiling`),
and persistent row programs (an autotuning candidate) compute what torch does."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.autotune import candidates
from irc.compiler import triton_source
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.types import numel
from irc.passes.tile import KernelShape, Tiling, choose_tiling, kernel_shape, set_tiling, tiling_of
from irc.pipeline import LOWERING
from irc.testing.reference import functions, random_inputs
from irc.testing.verdict import judge_outputs

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def vocab_softmax(
    rows: int, vocab: int, element_bytes: int, reads: int = 2, aligned: bool = False, exp: int = 1
) -> KernelShape:
    """A softmax's rows (`reads` 1: only reduced, a logsumexp's), whose sum computes
    `exp` transcendental functions an element; `aligned`: rows 16 bytes apart."""
    return KernelShape(
        KernelKind.REDUCTION,
        (rows,),
        (vocab,),
        epilogue=reads > 1,
        element_bytes=element_bytes,
        row_reads=reads,
        row_vector_bytes=16 if aligned else 2,
        transcendentals=exp,
    )


def test_vocabulary_rows_too_long_for_registers_stream_in_chunks_of_32_warps() -> None:
    # 4 elements a thread of bf16, 8 of f32 (long_row_tiling's measurements), for
    # a vocabulary of 128,256 (Llama 3) that no program's registers hold.
    t = choose_tiling(vocab_softmax(4096, 128256, 2))
    assert t.block == (1, 4096) and t.warps == 32 and not t.persistent and not t.unrolled
    t = choose_tiling(vocab_softmax(4096, 128256, 4))
    assert t.block == (1, 8192) and t.warps == 32 and not t.persistent and not t.unrolled


def test_half_rows_16_bytes_apart_read_again_take_32_bytes_a_thread() -> None:
    """`READ_AGAIN_ROW_VECTORS`: every chunk loads 16-byte vectors, so 16 bf16 a
    thread of 16 warps; f32 rows already take 32 bytes a thread; rows read once,
    and rows of 2-byte vectors not peeled, keep 4 a thread of 32 warps (rows 8
    bytes apart and peeled rows: the tests below)."""
    for vocab in (65600, 80000, 128256):
        for element_bytes in (2, 4):
            t = choose_tiling(vocab_softmax(4096, vocab, element_bytes, aligned=True))
            want = (1, 8192), (16 if element_bytes == 2 else 32)
            assert (t.block, t.warps) == want and not t.unrolled, (vocab, element_bytes)
    assert choose_tiling(vocab_softmax(4096, 75945, 2)).block == (1, 4096)
    once = choose_tiling(vocab_softmax(4096, 128256, 2, reads=1, aligned=True))
    assert (once.block, once.warps) == ((1, 4096), 32)


@pytest.mark.parametrize(("element_bytes", "want"), [(2, ((1, 4096), 16)), (4, ((1, 4096), 32))])
def test_rows_read_again_8_bytes_apart_take_two_8_byte_vectors_a_thread(
    element_bytes: int, want: tuple[tuple[int, int], int]
) -> None:
    """`READ_AGAIN_ROW_VECTORS`: a step spans as many vectors as one of 16-byte rows,
    so chunks of 4096 (8 half elements a thread of 16 warps, 4 f32 of 32); rows only
    reduced are peeled instead (`row_granule`)."""
    shape = replace(vocab_softmax(2000, 100002, element_bytes), row_vector_bytes=8)
    t = choose_tiling(shape)
    assert (t.block, t.warps) == want and not t.unrolled


@pytest.mark.parametrize(
    ("cols", "dtype", "epilogue", "granule"),
    [
        (100004, "bf16", True, 0),  # 8 bytes apart, read again: as they start
        (100004, "bf16", False, 8),  # only reduced: peeled
        (100002, "f32", False, 4),
        (100003, "bf16", True, 8),  # 2 bytes apart: peeled either way
        (100000, "bf16", False, 1),  # 16 bytes apart, only reduced: in place
        (100000, "bf16", True, 0),  # 16 bytes apart, read again: as they start
    ],
)
def test_rows_only_reduced_are_peeled_from_their_aligned_starts_or_in_place(
    cols: int, dtype: str, epilogue: bool, granule: int
) -> None:
    program = "softmax" if epilogue else "logsumexp"
    text = PROGRAMS[program].replace("ROWS", "3").replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", dtype))
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    shape = kernel_shape(kernel)
    assert shape.epilogue == epilogue and shape.row_granule == granule


@pytest.mark.parametrize("reads", [1, 2])
@pytest.mark.parametrize(("vocab", "element_bytes"), [(75945, 2), (100003, 4), (70001, 4)])
def test_peeled_looped_rows_take_4_elements_a_thread(
    vocab: int, element_bytes: int, reads: int
) -> None:
    """`PEELED_ROW_THREAD_ELEMENTS`: rows read from their aligned starts (`row_granule`)
    take 4 elements a thread of 32 warps, f32 as well as half precision."""
    shape = replace(
        vocab_softmax(2000, vocab, element_bytes, reads=reads), row_granule=16 // element_bytes
    )
    t = choose_tiling(shape)
    assert (t.block, t.warps) == ((1, 4096), 32) and not t.unrolled
    assert choose_tiling(vocab_softmax(2000, vocab, element_bytes, reads=reads)).block[
        1
    ] == 4096 * (element_bytes // 2)


@pytest.mark.parametrize(
    ("cols", "dtype", "vector"),
    [
        (80000, "f16", 16),
        (75945, "bf16", 2),
        (80004, "bf16", 8),
        (65601, "f32", 4),
        (65602, "f32", 8),
    ],
)
def test_row_vector_bytes_is_read_from_the_row_bytes(cols: int, dtype: str, vector: int) -> None:
    """`KernelShape.row_vector_bytes` of a softmax's kernel: the largest power of two
    up to 16 dividing its rows' bytes (80,004 bf16 rows are 8 bytes apart); a layer
    norm's weight and bias are not whole rows, so its rows have none."""
    text = PROGRAMS["softmax"].replace("ROWS", "3").replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", dtype))
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    assert kernel_shape(kernel).row_vector_bytes == vector
    text = PROGRAMS["layer_norm"].replace("ROWS", "3").replace("COLS", "80000")
    module = irc.parse(text.replace("DT", "f16"))
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop")
    (kernel,) = loop.kernels(module)
    assert kernel_shape(kernel).row_vector_bytes == 0


def test_aligned_half_rows_in_chunks_of_8192_match_torch() -> None:
    """A softmax of 65,600 f16 a row, 16 bytes apart: chunks of 8192 at 16 warps,
    the last one ragged, online max and sum then the output pass."""
    text = PROGRAMS["softmax"].replace("ROWS", "3").replace("COLS", "65600")
    module = irc.parse(text.replace("DT", "f16"))
    irc.run_pipeline(module, "fuse")
    kernel = kernel_text(module)
    assert "range(0, 65600, 8192)" in kernel and kernel.count("tl.load(") == 2
    compiled = irc.compile(irc.parse(text.replace("DT", "f16")), device=DEVICE)
    x = (torch.randn(3, 65600, device=DEVICE) * 8).to(torch.float16)
    x[1, 65599] = 60.0  # the max in the ragged last chunk
    assert_matches_torch("softmax", compiled.f(x), x, "f16")


def test_rows_read_once_stream_one_program_a_row() -> None:
    t = choose_tiling(vocab_softmax(4096, 50257, 2, reads=1))
    assert t.block == (1, 4096) and not t.persistent and not t.unrolled


def test_rows_read_twice_up_to_59392_stay_in_registers_as_unrolled_chunks() -> None:
    """`unrolled_row_tiling`: chunks of 2048 at 16 warps, 116 f32 a thread at most,
    whatever the element type (f32 is computed either way)."""
    for vocab in (32769, 40000, 50257, 51200, 51938, 59372, 59392):
        for element_bytes in (2, 4):
            t = choose_tiling(vocab_softmax(4096, vocab, element_bytes))
            assert t == Tiling((1, 2048), 16, unrolled=True), (vocab, element_bytes)
    # One chunk more (59,393: 30 chunks, 120 a thread) spills 16-43 registers: streamed.
    assert not choose_tiling(vocab_softmax(4096, 59393, 2)).unrolled


def test_rblock_caps_the_chunk_and_the_warps_follow_it() -> None:
    t = choose_tiling(vocab_softmax(4096, 128256, 4), rblock=2048)
    assert t.block == (1, 2048) and t.warps == 8
    shape = vocab_softmax(4096, 9000, 4)
    t = choose_tiling(shape, persistent_rblock=4096, rblock=1 << 16, unrolled_rblock=0)
    assert t.block == (1, 8192) and t.warps == 32
    # Unless its chunks stay in registers (5 of 2048).
    t = choose_tiling(shape, persistent_rblock=4096, rblock=1 << 16)
    assert t == Tiling((1, 2048), 16, unrolled=True)


@pytest.mark.parametrize("cols", [10, 12, 13])
def test_the_smallest_rblock_streams_rows_of_any_spacing_and_matches_torch(cols: int) -> None:
    """`tile{rblock=1 persistent-rblock=1}`: chunks of one element, whatever the rows'
    vectors (8-byte rows halve the chunk, never to 0; a chunk under a granule is not
    peeled)."""
    text = PROGRAMS["softmax"].replace("ROWS", "3").replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", "f32"))
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop,tile{rblock=1 persistent-rblock=1}")
    (kernel,) = loop.kernels(module)
    assert tiling_of(kernel).block == (1, 1)
    compiled = irc.compile(module, device=DEVICE)
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(cols)).to(DEVICE)
    assert_matches_torch("softmax", compiled.f(x), x, "f32")


def test_persistent_rows_are_an_autotuning_candidate_of_rows_read_twice() -> None:
    twice = candidates(vocab_softmax(4096, 50257, 2))
    assert any(t.persistent and t.block[0] == 1 for t in twice)
    once = candidates(vocab_softmax(4096, 50257, 2, reads=1))
    assert not any(t.persistent for t in once)


def test_unrolled_rows_are_autotuning_candidates_of_rows_read_twice_that_fit() -> None:
    twice = [t for t in candidates(vocab_softmax(4096, 50257, 2)) if t.unrolled]
    assert Tiling((1, 2048), 16, unrolled=True) in twice
    for t in twice:  # whole chunks of at most 59,392 elements, 128 f32 a thread at most
        assert -(-50257 // t.block[1]) * t.block[1] <= 59392
        assert -(-50257 // t.block[1]) * t.block[1] // (32 * t.warps) <= 128
    assert not any(t.unrolled for t in candidates(vocab_softmax(4096, 50257, 2, reads=1)))
    assert not any(t.unrolled for t in candidates(vocab_softmax(4096, 128256, 2)))


PROGRAMS = {
    "softmax": """
func @f(%x: tensor<ROWSxCOLSxDT>) -> tensor<ROWSxCOLSxDT> {
  %y = graph.softmax %x {dim = 1} : tensor<ROWSxCOLSxDT>
  return %y : tensor<ROWSxCOLSxDT>
}
""",
    "layer_norm": """
func @f(%x: tensor<ROWSxCOLSxDT>, %w: tensor<COLSxDT>, %b: tensor<COLSxDT>) -> tensor<ROWSxCOLSxDT> {
  %y = graph.layer_norm %x, %w, %b {dims = [1]} : tensor<ROWSxCOLSxDT>
  return %y : tensor<ROWSxCOLSxDT>
}
""",
    "logsumexp": """
func @f(%x: tensor<ROWSxCOLSxDT>) -> tensor<ROWSxDT> {
  %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<ROWSx1xDT>
  %s = graph.sub %x, %m : tensor<ROWSxCOLSxDT>
  %e = graph.exp %s : tensor<ROWSxCOLSxDT>
  %z = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<ROWSx1xDT>
  %l = graph.log %z : tensor<ROWSx1xDT>
  %y = graph.add %l, %m : tensor<ROWSx1xDT>
  %r = graph.reshape %y : tensor<ROWSxDT>
  return %r : tensor<ROWSxDT>
}
""",
}


def assert_matches_torch(program: str, got: torch.Tensor, x: torch.Tensor, dtype: str) -> None:
    """A softmax within 2e-3 of torch's (2% relative), a logsumexp within 1e-4 in
    f32 and 0.1 in half precision, computed by torch in f32 and rounded to x's type."""
    if program == "softmax":
        want = torch.softmax(x.float(), 1).to(x.dtype)
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    else:
        want = torch.logsumexp(x.float(), 1).to(x.dtype)
        torch.testing.assert_close(got, want, atol=1e-1 if dtype != "f32" else 1e-4, rtol=2e-2)


def kernel_text(module: ModuleOp) -> str:
    """The Triton source of the module's one kernel."""
    source = triton_source(module)
    return source[source.index("def triton_") : source.index("def fn0")]


def tiled_module(program: str, rows: int, cols: int, dtype: str, tiling: Tiling) -> ModuleOp:
    """`program` lowered to tile kernels with its one kernel's tiling set to `tiling`,
    as autotuning may choose (tile.py's `set_tiling` past the tile pass)."""
    text = PROGRAMS[program].replace("ROWS", str(rows)).replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", dtype))
    tile_at = LOWERING.index("tile") + 1
    irc.run_pipeline(module, ",".join(["fuse", *LOWERING[:tile_at]]))
    kernels = loop.kernels(module)
    assert len(kernels) == 1
    set_tiling(kernels[0], tiling)
    irc.run_pipeline(module, ",".join(LOWERING[tile_at:]))
    return module


def persistent_module(program: str, rows: int, cols: int, dtype: str) -> ModuleOp:
    """Looped rows made persistent, in chunks of 1024."""
    return tiled_module(program, rows, cols, dtype, Tiling((1, 1024), 4, persistent=True))


def test_persistent_rows_launch_one_program_an_sm_walking_the_rows() -> None:
    source = triton_source(persistent_module("softmax", 7, 3001, "bf16"))
    assert "for v" in source and "in tl.range(tl.program_id(0), 7, tl.num_programs(0)):" in source
    assert "flatten" not in source  # the row's chunk loops stay loops
    assert "_persistent_grid(7)" in source
    assert source.count("tl.load(") == 2  # max+sum online, then the output


@pytest.mark.parametrize(
    ("program", "rows", "cols", "dtype"),
    [
        ("softmax", 7, 3001, "f32"),
        ("softmax", 5, 2049, "bf16"),
        ("softmax", 6, 1025, "f16"),
        ("logsumexp", 7, 3001, "bf16"),
        ("logsumexp", 5, 1111, "f32"),
    ],
)
def test_persistent_rows_match_torch(program: str, rows: int, cols: int, dtype: str) -> None:
    compiled = irc.compile(persistent_module(program, rows, cols, dtype), device=DEVICE)
    x = (torch.randn(rows, cols, device=DEVICE) * 8).to(DTYPES[dtype])
    x[1, cols - 1] = 60.0  # the max in the last, ragged chunk
    assert_matches_torch(program, compiled.f(x), x, dtype)


def test_the_output_pass_walks_the_chunks_backwards() -> None:
    """The pass that stores starts at the last chunk, which the pass before it read
    last (`FINAL_PASS_BACKWARDS`): offsets `last - iv` with last = 57344, the start
    of the ragged last chunk of 60,000 in chunks of 8192."""
    text = """func @f(%x: tensor<3x60000xf32>) -> tensor<3x60000xf32> {
  %y = graph.softmax %x {dim = 1}
  return %y : tensor<3x60000xf32>
}
"""
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    source = triton_source(module)
    loops = re.findall(
        r"for (v\d+) in range\(0, 60000, 8192\):\n\s+(v\d+) = (v\d+) - (v\d+)", source
    )
    constants = dict(re.findall(r"(v\d+) = tl.full\(\[\], (\d+), tl.int32\)", source))
    assert len(loops) == 1, source
    ((iv, _, last, subtracted),) = loops
    assert subtracted == iv and constants[last] == "57344"


def test_rows_up_to_32768_stay_whole_one_a_program_at_64_f32_a_thread() -> None:
    for vocab, element_bytes, warps in ((12000, 2, 8), (16384, 4, 8)):
        t = choose_tiling(vocab_softmax(4096, vocab, element_bytes))
        assert t.block == (1, 1 << (vocab - 1).bit_length()) and t.warps == warps
    # Past 16384 only where the reductions compute no transcendental function (a
    # layer norm's) or the row is read once (`UNROLLED_TRANSCENDENTAL_ROWS`).
    for vocab, element_bytes in ((20500, 4), (32000, 2), (16385, 2)):
        assert choose_tiling(vocab_softmax(4096, vocab, element_bytes)) == Tiling(
            (1, 2048), 16, unrolled=True
        )
        for shape in (
            vocab_softmax(4096, vocab, element_bytes, exp=0),
            vocab_softmax(4096, vocab, element_bytes, reads=1),
        ):
            t = choose_tiling(shape)
            assert t.block == (1, 32768) and t.warps == 16 and not t.unrolled
    # Past 32768 (padded) a whole row would spill: unrolled chunks, or streamed
    # where the row is read once.
    assert choose_tiling(vocab_softmax(4096, 32769, 2)).unrolled
    assert choose_tiling(vocab_softmax(4096, 32769, 2, reads=1)).block == (1, 4096)


@pytest.mark.parametrize(
    ("program", "rows", "cols", "dtype"),
    [
        ("softmax", 3, 9001, "f32"),  # 16384 padded: 8 warps
        ("logsumexp", 2, 20011, "bf16"),  # 32768 padded: 16 warps
        ("logsumexp", 3, 16385, "f16"),  # one past a power of two
    ],
)
def test_whole_rows_past_8192_match_torch(program: str, rows: int, cols: int, dtype: str) -> None:
    """The default tiling of rows of 8192 to 32768 elements (`whole_row_tiling`):
    one row a program, read once, with no loop, at odd lengths."""
    text = PROGRAMS[program].replace("ROWS", str(rows)).replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", dtype))
    irc.run_pipeline(module, "fuse")
    kernel = kernel_text(module)
    assert "for " not in kernel and kernel.count("tl.load(") == 1
    compiled = irc.compile(irc.parse(text.replace("DT", dtype)), device=DEVICE)
    x = (torch.randn(rows, cols, device=DEVICE) * 8).to(DTYPES[dtype])
    x[1, cols - 1] = 60.0  # the max in the padded row's last real element
    assert_matches_torch(program, compiled.f(x), x, dtype)


def test_softmax_rows_past_16384_are_held_as_unrolled_chunks_and_match_torch() -> None:
    """A softmax of 20,011 bf16 a row (`UNROLLED_TRANSCENDENTAL_ROWS`): ten chunks of
    2048, one load each, no loop, the last chunk masked."""
    text = PROGRAMS["softmax"].replace("ROWS", "2").replace("COLS", "20011")
    module = irc.parse(text.replace("DT", "bf16"))
    irc.run_pipeline(module, "fuse")
    kernel = kernel_text(module)
    assert "for " not in kernel and kernel.count("tl.load(") == 10
    compiled = irc.compile(irc.parse(text.replace("DT", "bf16")), device=DEVICE)
    x = (torch.randn(2, 20011, device=DEVICE) * 8).to(torch.bfloat16)
    x[1, 20010] = 60.0  # the max in the masked last chunk
    assert_matches_torch("softmax", compiled.f(x), x, "bf16")


UNROLLED_CASES = [
    ("softmax", 3, 5000, "f32", False),  # 5 chunks of 1024, the last one ragged
    ("softmax", 4, 4096, "bf16", False),  # 4 whole chunks: no mask at all
    ("softmax", 5, 3001, "f16", True),  # persistent programs walking unrolled rows
    ("logsumexp", 3, 4099, "bf16", False),
    ("logsumexp", 2, 2049, "f32", True),
]


@pytest.mark.parametrize(("program", "rows", "cols", "dtype", "persistent"), UNROLLED_CASES)
def test_unrolled_rows_are_read_once_and_match_torch(
    program: str, rows: int, cols: int, dtype: str, persistent: bool
) -> None:
    """`unrolled = 1` (`unrolled_row_tiling`, here in chunks of 1024): no loop, one
    load a chunk however many passes read the row, no online softmax."""
    tiling = Tiling((1, 1024), 8, persistent=persistent, unrolled=True)
    module = tiled_module(program, rows, cols, dtype, tiling)
    kernel = kernel_text(module)
    # A row a program whose rows are not 8 bytes apart is peeled (loop-to-tile's
    # RowPeel): read from its aligned start, its first and last chunks masked.
    width = 4 if dtype == "f32" else 2
    peeled = not persistent and cols * width % 8 != 0
    chunks = -(-(cols + (16 // width - 1 if peeled else 0)) // 1024)
    assert kernel.count("tl.load(") == chunks
    masked = 2 if peeled else (1 if cols % 1024 else 0)
    assert kernel.count("mask=") == masked * (2 if program == "softmax" else 1), kernel
    assert ("for " in kernel) == persistent  # only the persistent walk over rows loops
    assert "def triton_per_" in kernel
    compiled = irc.compile(module, device=DEVICE)
    x = (torch.randn(rows, cols, device=DEVICE) * 8).to(DTYPES[dtype])
    x[1, cols - 1] = 60.0  # the max in the last chunk
    x[0, 0] = 55.0  # a large value in the first
    assert_matches_torch(program, compiled.f(x), x, dtype)


def test_online_softmax_leaves_unrolled_rows_alone() -> None:
    text = PROGRAMS["softmax"].replace("ROWS", "4").replace("COLS", "40000")
    module = irc.parse(text.replace("DT", "bf16"))
    irc.run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile,online-softmax")
    (kernel,) = loop.kernels(module)
    assert kernel.unrolled is not None and kernel.unrolled.value.data == 1
    assert not any(isinstance(o, loop.SoftmaxReduceOp) for o in kernel.walk())
    assert [o.kind.data for o in kernel.walk() if isinstance(o, loop.ReduceOp)] == ["max", "sum"]


@pytest.mark.parametrize(("cols", "dtype"), [(3001, "f32"), (2500, "bf16")])
def test_unrolled_layer_norm_rows_match_torch(cols: int, dtype: str) -> None:
    """A layer norm's mean, variance and normalized output over unrolled chunks of
    1024 (the statistics combine across chunks; the epilogue reads the row from
    registers): one load a chunk of `x`."""
    tiling = Tiling((1, 1024), 8, unrolled=True)
    module = tiled_module("layer_norm", 5, cols, dtype, tiling)
    kernel = kernel_text(module)
    assert "for " not in kernel
    chunks = -(-cols // 1024)
    # x's chunks, then the weight's and the bias's, once each.
    assert kernel.count("tl.load(") == 3 * chunks
    compiled = irc.compile(module, device=DEVICE)
    dt = DTYPES[dtype]
    x = (torch.randn(5, cols, device=DEVICE) * 3 + 2).to(dt)
    w, b = torch.randn(cols, device=DEVICE).to(dt), torch.randn(cols, device=DEVICE).to(dt)
    got = compiled.f(x, w, b)
    want = torch.nn.functional.layer_norm(x.float(), (cols,), w.float(), b.float()).to(dt)
    tol = 1e-4 if dtype == "f32" else 3e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def batchnorm_nchw(n: int, c: int, hw: int, dtype: str) -> str:
    """Each channel's mean and mean of squares over N and H*W of an NCHW batch: a
    reduction over dims 0 and 2, whose flat index is divided back into them."""
    x, col = f"tensor<{n}x{c}x{hw}x{dtype}>", f"tensor<{c}x{dtype}>"
    return f"""func @f(%x: {x}) -> ({col}, {col}) {{
  %m = graph.reduce_mean %x {{dims = [0, 2]}} : {col}
  %sq = graph.mul %x, %x : {x}
  %q = graph.reduce_mean %sq {{dims = [0, 2]}} : {col}
  return %m, %q : {col}, {col}
}}
"""


def loop_kernels_of(text: str, pipeline: str) -> list[loop.KernelOp]:
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(module, pipeline)
    return list(loop.kernels(module))


@pytest.mark.parametrize(
    ("n", "c", "hw", "dtype"),
    [
        (89, 349, 1728, "f32"),
        (48, 300, 2304, "f32"),
        (16, 64, 50176, "f16"),
        (64, 256, 3136, "bf16"),
    ],
)
def test_rows_of_an_address_an_element_take_8_a_thread_of_16_warps(
    n: int, c: int, hw: int, dtype: str
) -> None:
    """`ADDRESSED_ROW_WARPS`: a looped row only reduced whose loads are no whole
    rows of a buffer (a batch norm's over dims 0 and 2, and its split chunks) takes
    chunks of 4096 at 16 warps, whatever the element type: 8 elements a thread."""
    pipeline = "fuse,decompose,graph-to-loop,one-pass-variance,split-reduction,tile"
    looped = [
        k for k in loop_kernels_of(batchnorm_nchw(n, c, hw, dtype), pipeline)
        if numel(kernel_shape(k).reduction) > 32768
    ]  # fmt: skip
    assert looped, "the statistics stream their rows"
    for kernel in looped:
        shape = kernel_shape(kernel)
        assert shape.row_vector_bytes == 0 and not shape.epilogue
        assert tiling_of(kernel) == Tiling((1, 4096), 16)


def test_rows_read_whole_in_vectors_keep_their_tiling() -> None:
    """Only rows without vectors change: a logsumexp's rows keep 32 warps."""
    for element_bytes, chunk in ((2, 4096), (4, 8192)):
        shape = vocab_softmax(4096, 50257, element_bytes, reads=1, aligned=True)
        assert choose_tiling(shape) == Tiling((1, chunk), 32)
    shape = replace(vocab_softmax(4096, 50257, 4, reads=1), row_vector_bytes=0)
    assert choose_tiling(shape) == Tiling((1, 4096), 16)
    assert choose_tiling(shape, rblock=1024) == Tiling((1, 1024), 4)  # rblock still caps


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rows_of_an_address_an_element_match_torch(dtype: str) -> None:
    """At a GPU of 1 SM (`sms=1`), so that a small batch streams its rows: 80,000
    elements a channel in two chunks of 40,000, each looped 4096 at a time, the
    last step ragged and the flat index crossing the batch dim inside a step."""
    text = batchnorm_nchw(2, 3, 40000, dtype)
    pipeline = "fuse,decompose,graph-to-loop,one-pass-variance,split-reduction{sms=1},tile{sms=1}"
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(module, pipeline)
    tilings = [tiling_of(k) for k in loop.kernels(module)]
    assert Tiling((1, 4096), 16) in tilings, tilings
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    inputs = random_inputs(fn, seed=41, device=DEVICE)
    got = irc.compile(irc.parse(irc.print_module(module), "t.loop.ir"), device=DEVICE).run(
        "f", inputs
    )
    for verdict in judge_outputs(fn, inputs, got):
        assert verdict.ok, verdict
