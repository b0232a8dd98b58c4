"""Rows too long for registers: chunks and persistence follow the GPU's L2 (tile's
`long_row_tiling`), and persistent row programs compute what torch does."""

from __future__ import annotations

import os

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.compiler import triton_source
from irc.ir.kernel_kind import KernelKind
from irc.passes.tile import L2_BYTES, KernelShape, choose_tiling
from irc.pipeline import LOWERING

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def vocab_softmax(rows: int, vocab: int, element_bytes: int, reads: int = 2) -> KernelShape:
    return KernelShape(
        KernelKind.REDUCTION,
        (rows,),
        (vocab,),
        epilogue=reads > 1,
        element_bytes=element_bytes,
        row_reads=reads,
    )


def test_vocabulary_rows_read_twice_walk_persistently_one_program_an_sm() -> None:
    # 4096 rows of 50,257 bf16 (100 KB): one program a row would keep 4 programs
    # of 16 warps an SM, 53 MB in flight on 132 SMs, more than half a 50 MB L2.
    t = choose_tiling(vocab_softmax(4096, 50257, 2))
    assert t.block == (1, 4096) and t.warps == 16 and t.persistent
    assert choose_tiling(vocab_softmax(4096, 50257, 4)).persistent


def test_the_choice_follows_the_gpu_model_not_the_shape() -> None:
    shape = vocab_softmax(4096, 50257, 2)
    # An L2 that holds every row in flight, or few rows: one program a row.
    assert not choose_tiling(shape, l2_bytes=1 << 30).persistent
    assert not choose_tiling(vocab_softmax(100, 50257, 2)).persistent
    # Fewer SMs: fewer rows in flight, which fit.
    assert not choose_tiling(shape, sms=16).persistent
    assert choose_tiling(shape, sms=132, l2_bytes=L2_BYTES).persistent


def test_rows_read_once_stream_one_program_a_row() -> None:
    t = choose_tiling(vocab_softmax(4096, 50257, 2, reads=1))
    assert t.block == (1, 4096) and not t.persistent


def test_short_looped_rows_get_a_chunk_of_their_own_size() -> None:
    t = choose_tiling(vocab_softmax(4096, 9000, 4), persistent_rblock=4096, rblock=8192)
    assert t.block == (1, 8192) and t.warps == 16


PROGRAMS = {
    "softmax": """
func @f(%x: tensor<ROWSxCOLSxDT>) -> tensor<ROWSxCOLSxDT> {
  %y = graph.softmax %x {dim = 1} : tensor<ROWSxCOLSxDT>
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


def persistent_module(program: str, rows: int, cols: int, dtype: str) -> ModuleOp:
    """`program` lowered to tile kernels for a GPU of 2 SMs and 64 KB of L2: rows in
    flight one program a row would not fit, so the kernel is persistent."""
    text = PROGRAMS[program].replace("ROWS", str(rows)).replace("COLS", str(cols))
    module = irc.parse(text.replace("DT", dtype))
    passes = ["fuse", *LOWERING]
    passes[passes.index("tile")] = "tile{sms=2 l2-bytes=65536 rblock=1024 persistent-rblock=1024}"
    irc.run_pipeline(module, ",".join(passes))
    return module


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
    got = compiled.f(x)
    if program == "softmax":
        want = torch.softmax(x.float(), 1).to(x.dtype)
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    else:
        want = torch.logsumexp(x.float(), 1).to(x.dtype)
        torch.testing.assert_close(got, want, atol=1e-1 if dtype != "f32" else 1e-4, rtol=2e-2)
