"""Attention written out (matmul, element-wise work, softmax, matmul) fuses into one
FlashAttention-2 kernel (passes/fuse_attention.py, lowering/attention_to_*.py),
checked against torch in Triton's interpreter at small sizes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.analysis.bounds import check_bounds
from irc.compiler import triton_source
from irc.dialects import graph, loop, tile
from irc.lowering.tile_to_triton import emit_triton
from irc.passes.tile import Tiling, set_tiling


def _benchmark() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention.py"
    spec = importlib.util.spec_from_file_location("irc_attention_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["irc_attention_bench"] = module
    spec.loader.exec_module(module)
    return module


benchmark = _benchmark()
attention_ir = benchmark.attention_ir
attention_reference = benchmark.attention_reference

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOLERANCE = {"f32": 1e-5, "bf16": 2e-2, "f16": 4e-3}


def kernels_of(text: str) -> str:
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    source = triton_source(module)
    return source[source.index("def triton_") : source.index("\ndef fn0")]


def run_case(
    batch: int, t_q: int, t_k: int, d: int, dv: int, dtype: str, **variant: object
) -> None:
    text = attention_ir(batch, t_q, t_k, d, dv, dtype, **variant)  # type: ignore[arg-type]
    compiled = irc.compile(irc.parse(text), device=DEVICE)
    torch.manual_seed(t_q * 31 + d)
    dt = DTYPES[dtype]
    q = torch.randn(batch, t_q, d, device=DEVICE).to(dt)
    kv = variant.get("kv_heads") or batch
    k = torch.randn(kv, t_k, d, device=DEVICE).to(dt)  # type: ignore[call-overload]
    v = torch.randn(kv, t_k, dv, device=DEVICE).to(dt)  # type: ignore[call-overload]
    args = [q, k, v]
    mask = bias = None
    if variant.get("mask"):
        # Causal, aligned to the end when there are more keys than queries; every row
        # sees at least one key.
        mask = torch.ones(t_q, t_k, dtype=torch.bool, device=DEVICE).tril(t_k - t_q)
        args.append(mask)
    if variant.get("causal"):
        mask = benchmark.causal_mask(t_q, t_k, DEVICE)
    if variant.get("bias"):
        bias = torch.randn(t_q, t_k, device=DEVICE).to(dt)
        args.append(bias)
    out = compiled.attn(*args)
    ref = attention_reference(
        q, k, v, mask, bias, variant.get("softcap"), bool(variant.get("epilogue"))  # type: ignore[arg-type]
    )
    tol = TOLERANCE[dtype]
    assert out.dtype == dt
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_written_out_attention_is_one_kernel_in_the_report(tmp_path: Path) -> None:
    path = tmp_path / "attn.ir"
    path.write_text(attention_ir(4, 40, 40, 16, dtype="bf16", mask=True, epilogue=True))
    done = subprocess.run(
        [sys.executable, "-m", "irc.tools.opt", str(path), "--fuse", "--fusion-report=json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (report,) = json.loads(done.stdout)
    (group,) = report["groups"]
    assert group["kind"] == "attention"
    assert group["kernel"].startswith("triton_attn_fused_matmul")
    # Unfused, the 4x40x40 scores go through HBM several times; fused, Q, K, V, the
    # mask and the output are all that move.
    want = 2 * (3 * 4 * 40 * 16 + 4 * 40 * 16) + 40 * 40
    assert group["bytes_after"] == want
    assert group["bytes_before"] > 5 * want
    assert sum("matmul" in op for op in group["ops"]) == 2 and "relu %y" in group["ops"]


def test_the_kernel_reads_as_flash_attention() -> None:
    source = kernels_of(attention_ir(4, 100, 100, 32, dtype="bf16", mask=True))
    assert source.count("def triton_") == 1
    assert source.count("for ") == 1  # one loop over key tiles
    dots = [m.start() for m in re.finditer(r"(tl\.dot|_irc_dot_\w+)\(", source)]
    assert len(dots) == 2  # Q K^T, then P V, once a tile
    assert source.count("tl.load(") == 4  # Q before the loop; K, mask, V in it
    before, loop_body = source.split("for ", 1)
    assert before.count("tl.load(") == 1  # the resident Q rows
    assert loop_body.count("tl.exp(") == 2  # the rescale and the probabilities
    assert source.rindex(" / ") > dots[-1]  # normalized once, at the end


def test_bounds_are_proved_for_every_access() -> None:
    text = attention_ir(4, 100, 72, 24, 40, "f16", mask=True, bias=True, softcap=30.0)
    module = irc.parse(text)
    irc.run_pipeline(
        module, "decompose,fuse,graph-to-loop,tile,online-softmax,loop-to-tile,tile-cse,dce"
    )
    assert sum(1 for op in module.walk() if op.name == "tile.kernel") == 1
    assert check_bounds(module) == []


def test_grouped_query_attention_reads_shared_heads_in_place() -> None:
    text = attention_ir(8, 40, 40, 16, kv_heads=2, causal=True)
    module = irc.parse(text)
    irc.run_pipeline(
        module, "decompose,fuse,graph-to-loop,tile,online-softmax,loop-to-tile,tile-cse,dce"
    )
    assert check_bounds(module) == []
    kernels = [op for op in module.walk() if isinstance(op, tile.KernelOp)]
    assert len(kernels) == 1  # no copy of the repeated K and V
    launch = next(op for op in module.walk() if isinstance(op, tile.LaunchOp))
    shapes = [tuple(a.type.get_shape()) for a in launch.args]
    assert shapes.count((2, 40, 16)) == 2 and (8, 40, 16) in shapes


def test_a_score_needed_elsewhere_keeps_the_kernels_apart() -> None:
    text = attention_ir(2, 16, 16, 8).replace(
        "-> tensor<2x16x8xf32> {", "-> (tensor<2x16x8xf32>, tensor<2x16x16xf32>) {"
    ).replace("return %o : tensor<2x16x8xf32>", "return %o, %p : tensor<2x16x8xf32>, tensor<2x16x16xf32>")
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    kinds = [op.kernel_kind() for op in module.walk() if isinstance(op, graph.FusedOp)]
    assert "attention" not in kinds and len(kinds) >= 2


def test_hand_written_attention_group_verifies() -> None:
    module = irc.parse(attention_ir(2, 16, 16, 8))
    irc.run_pipeline(module, "fuse")
    text = irc.print_module(module)
    assert 'kind = "attention"' in text
    assert irc.print_module(irc.parse(text)) == text  # the verifier accepts it as written


@pytest.mark.slow
def test_small_f32_with_a_causal_mask_matches_torch() -> None:
    run_case(4, 40, 40, 16, 16, "f32", mask=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch", "t_q", "t_k", "d", "dv", "dtype", "variant"),
    [
        (4, 64, 64, 32, 32, "f32", {}),
        (3, 24, 24, 8, 8, "f32", {}),  # a head narrower than a tensor-core dot: padded to 16
        (4, 100, 100, 16, 16, "f32", {"mask": True}),  # two key tiles, the last ragged
        (4, 40, 72, 32, 16, "f32", {"bias": True, "epilogue": True}),
        (4, 64, 64, 16, 16, "bf16", {}),
        (4, 100, 100, 32, 32, "bf16", {"mask": True}),
        (4, 40, 40, 16, 16, "bf16", {"softcap": 5.0, "mask": True}),
        (4, 64, 64, 32, 32, "f16", {"bias": True, "softcap": 30.0}),
        (4, 40, 40, 16, 16, "f16", {"mask": True, "epilogue": True}),
        (8, 40, 40, 16, 16, "f32", {"kv_heads": 2, "causal": True}),  # grouped-query
        (6, 64, 64, 32, 32, "bf16", {"kv_heads": 3}),
        (4, 40, 72, 16, 16, "bf16", {"causal": True, "softcap": 30.0}),  # more keys than rows
    ],
)
def test_attention_matches_torch(
    batch: int, t_q: int, t_k: int, d: int, dv: int, dtype: str, variant: dict[str, object]
) -> None:
    run_case(batch, t_q, t_k, d, dv, dtype, **variant)


def test_benchmark_rows_cover_the_issue_and_format() -> None:
    rows = benchmark.rows(smoke=False)
    plain = [r for r in rows if r["variant"] is None]
    assert {(r["causal"], r["d"], r["t"]) for r in plain} == {
        (c, d, t) for c in (False, True) for d in (64, 128) for t in (512, 1024, 4096, 16384)
    }
    assert all(r["bh"] * r["t"] == benchmark.TOKENS for r in rows)
    row = {**plain[0], "irc_kernels": 1, "correct": True, "ms": {"irc": 0.5, "torch.compile": 1.0}}
    row |= {"irc_over_sdpa": None, "irc_over_compile": 0.5}
    line = benchmark.format_row(row)
    assert line.count("|") == benchmark.HEADER.splitlines()[0].count("|")
    assert "0.500" in line and "0.50" in line and "—" in line


@pytest.mark.slow
def test_benchmark_smoke_mode_checks_every_row_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert benchmark.main(["--smoke", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert len(results) == len(benchmark.rows(smoke=True))
    assert all(r["correct"] and r["irc_kernels"] == 1 for r in results)


def causal_ir(t: int, d: int, row: str = "%ri", cmp: str = "ge %r, %ci", offset: int = 0) -> str:
    """Attention under a mask made of two iotas compared (`cmp` of row and key)."""
    text = attention_ir(2, t, t, d)
    mask = [
        f"  %ri = graph.iota {{dim = 0}} : tensor<{t}x{t}xi32>",
        f"  %ci = graph.iota {{dim = 1}} : tensor<{t}x{t}xi32>",
        f"  %off = graph.constant {{value = {offset}}} : tensor<i32>",
        f"  %r = graph.add {row}, %off : tensor<{t}x{t}xi32>",
        f"  %keep = graph.{cmp} : tensor<{t}x{t}xi1>",
        "  %ninf = graph.constant {value = -inf} : tensor<f32>",
        f"  %xm = graph.where %keep, %x0, %ninf : tensor<2x{t}x{t}xf32>",
    ]
    text = text.replace("  %m = graph.reduce_max %x0", "\n".join(mask) + "\n  %m = graph.reduce_max %xm")
    return text.replace("graph.sub %x0, %m", "graph.sub %xm, %m")


def lowered_with_small_tiles(text: str) -> ModuleOp:
    """Lowered to tile kernels with 16x16 attention tiles: several row and key tiles."""
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose,fuse,graph-to-loop,tile")
    for kernel in module.walk():
        if isinstance(kernel, loop.KernelOp):
            set_tiling(kernel, Tiling((16, 16), 4, 2))
    irc.run_pipeline(module, "online-softmax,loop-to-tile,tile-cse,dce")
    return module


@pytest.mark.parametrize(
    ("cmp", "offset", "stop"),
    [
        ("ge %r, %ci", 0, 16),  # i >= j: the keys up to the program's last row
        ("le %ci, %r", 8, 24),  # j <= i + 8
        ("gt %r, %ci", 0, 15),  # i > j
    ],
)
def test_iota_causal_masks_stop_the_key_loop_at_the_diagonal(cmp: str, offset: int, stop: int) -> None:
    module = lowered_with_small_tiles(causal_ir(40, 16, cmp=cmp, offset=offset))
    assert check_bounds(module) == []
    (for_op,) = [op for op in module.walk() if isinstance(op, tile.ForOp)]
    first = for_op.body.block.first_op
    assert isinstance(first, tile.ForStopOp)
    # stop = program id * 16 + stop
    assert "tl.minimum(" in emit_triton(module)
    add = first.stop.owner
    assert isinstance(add, tile.ApplyOp) and add.fn.data == "add"
    constant = add.args[1].owner
    assert isinstance(constant, tile.ConstantOp) and constant.value.value.data == stop


def test_a_mask_tensor_or_a_lower_bound_skips_nothing() -> None:
    for text in (attention_ir(2, 40, 40, 16, mask=True), causal_ir(40, 16, cmp="le %r, %ci")):
        module = lowered_with_small_tiles(text)
        assert not any(isinstance(op, tile.ForStopOp) for op in module.walk())


@pytest.mark.slow
@pytest.mark.parametrize(("cmp", "offset"), [("ge %r, %ci", 0), ("le %ci, %r", 8), ("gt %r, %ci", 0), ("le %r, %ci", 0)])
def test_iota_masked_attention_matches_torch(cmp: str, offset: int) -> None:
    module = lowered_with_small_tiles(causal_ir(40, 16, cmp=cmp, offset=offset))
    compiled = irc.compile(module, device=DEVICE)
    torch.manual_seed(offset)
    q, k, v = (torch.randn(2, 40, 16, device=DEVICE) for _ in range(3))
    i = torch.arange(40, device=DEVICE)[:, None]
    j = torch.arange(40, device=DEVICE)[None, :]
    keep = {"ge": i + offset >= j, "le": j <= i + offset, "gt": i + offset > j}[cmp[:2]]
    if cmp == "le %r, %ci":
        keep = i + offset <= j
    want = attention_reference(q, k, v, keep)
    torch.testing.assert_close(compiled.attn(q, k, v), want, atol=1e-5, rtol=1e-5, equal_nan=True)
