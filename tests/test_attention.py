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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

import irc
from irc.analysis.bounds import check_bounds
from irc.compiler import triton_source
from irc.dialects import graph, loop, tile
from irc.ir.kernel_kind import KernelKind
from irc.lowering.tile_to_triton import emit_triton
from irc.passes.tile import (
    ATTENTION_FMA_LIVE_F32,
    ATTENTION_LIVE_F32,
    ATTENTION_SCORES,
    HALF_KEY_STEP,
    SHARED_BYTES,
    KernelShape,
    Tiling,
    attention_tiling,
    kernel_shape,
    set_tiling,
)


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
    source = kernels_of(attention_ir(4, 128, 128, 32, dtype="bf16", mask=True))
    assert source.count("def triton_") == 1
    assert source.count("for ") == 1  # one loop over key tiles
    dots = [m.start() for m in re.finditer(r"(tl\.dot|_irc_dot_\w+)\(", source)]
    assert len(dots) == 2  # Q K^T, then P V, once a tile
    assert source.count("tl.load(") == 4  # Q before the loop; K, mask, V in it
    before, loop_body = source.split("for ", 1)
    assert before.count("tl.load(") == 1  # the resident Q rows
    assert loop_body.count("tl.exp(") == 2  # the rescale and the probabilities
    assert source.rindex(" / ") > dots[-1]  # normalized once, at the end


def test_ragged_keys_mask_only_the_last_tile() -> None:
    # 40 keys in tiles of 16: the two whole tiles run without the key mask, then a
    # second loop from 32 takes the ragged tile with it.
    source = emit_triton(lowered_with_small_tiles(attention_ir(2, 40, 40, 16)))
    source = source[source.index("def triton_") : source.index("\ndef fn0")]
    first, second = source.split("for ")[1:]
    assert re.match(r"\w+ in range\(0, 32, 16\)", first)
    assert re.match(r"\w+ in range\(32, 40, 16\)", second)
    assert " < " not in first and "mask=" not in first
    assert "mask=" in second


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
    # The attention, and (f32: FMA dots) a row-major copy of K^T made under the
    # repeat, of the 2 KV heads: no copy of the repeated K and V.
    assert len(kernels) == 2
    copy, attention = (op for op in module.walk() if isinstance(op, tile.LaunchOp))
    assert [tuple(a.type.get_shape()) for a in copy.args] == [(2, 40, 16), (2, 16, 40)]
    shapes = [tuple(a.type.get_shape()) for a in attention.args]
    assert (8, 40, 16) in shapes and (2, 16, 40) in shapes and (2, 40, 16) in shapes
    assert not any(s[0] == 8 and s != (8, 40, 16) for s in shapes)


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
        (4, 100, 100, 32, 32, "bf16", {"causal": True, "softmax_op": True}),  # f32 softmax
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
    # f32 on the CPU: the attention kernel and the row-major copy of K^T its FMA
    # dots read (fuse's copy_swapped_operands); bf16 on a GPU is one kernel.
    assert all(r["correct"] and r["irc_kernels"] == 2 for r in results)


def causal_ir(
    t: int, d: int, row: str = "%ri", cmp: str = "ge %r, %ci", offset: int = 0, t_k: int | None = None
) -> str:
    """Attention under a mask made of two iotas compared (`cmp` of row and key)."""
    t_k = t_k or t
    text = attention_ir(2, t, t_k, d)
    mask = [
        f"  %ri = graph.iota {{dim = 0}} : tensor<{t}x{t_k}xi32>",
        f"  %ci = graph.iota {{dim = 1}} : tensor<{t}x{t_k}xi32>",
        f"  %off = graph.constant {{value = {offset}}} : tensor<i32>",
        f"  %r = graph.add {row}, %off : tensor<{t}x{t_k}xi32>",
        f"  %keep = graph.{cmp} : tensor<{t}x{t_k}xi1>",
        "  %ninf = graph.constant {value = -inf} : tensor<f32>",
        f"  %xm = graph.where %keep, %x0, %ninf : tensor<2x{t}x{t_k}xf32>",
    ]
    text = text.replace("  %m = graph.reduce_max %x0", "\n".join(mask) + "\n  %m = graph.reduce_max %xm")
    return text.replace("graph.sub %x0, %m", "graph.sub %xm, %m")


def lowered_with_small_tiles(text: str, block: tuple[int, int] = (16, 16)) -> ModuleOp:
    """Lowered to tile kernels with small attention tiles (16x16): several row and key tiles."""
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose,fuse,graph-to-loop,tile")
    for kernel in module.walk():
        if isinstance(kernel, loop.KernelOp):
            set_tiling(kernel, Tiling(block, 4, 2))
    irc.run_pipeline(module, "online-softmax,loop-to-tile,tile-cse,dce")
    return module


def scalar(v: SSAValue, program: tuple[int, int]) -> int:
    """A kernel's scalar index value in the program `program` (its two program ids)."""
    op = v.owner
    if isinstance(op, tile.ProgramIdOp):
        return program[op.axis.value.data]
    if isinstance(op, tile.ConstantOp):
        return int(op.value.value.data)
    assert isinstance(op, tile.ApplyOp), op
    args = [scalar(a, program) for a in op.args]
    fns = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "maximum": max, "minimum": min, "cast": lambda a: a,
    }  # fmt: skip
    return fns[op.fn.data](*args)


def band_ir(t_q: int, t_k: int, d: int, lo: int, hi: int, conjunction: bool = False) -> str:
    """Attention under a sliding window of iotas: row i keeps keys i + lo <= j <= i + hi,
    as two nested `where`s or (`conjunction`) one `where` of both comparisons."""
    text = attention_ir(2, t_q, t_k, d)
    idx = f"tensor<{t_q}x{t_k}xi32>"
    cond = f"tensor<{t_q}x{t_k}xi1>"
    scores = f"tensor<2x{t_q}x{t_k}xf32>"
    mask = [
        f"  %ri = graph.iota {{dim = 0}} : {idx}",
        f"  %ci = graph.iota {{dim = 1}} : {idx}",
        f"  %hi = graph.constant {{value = {hi}}} : tensor<i32>",
        f"  %lo = graph.constant {{value = {lo}}} : tensor<i32>",
        f"  %rh = graph.add %ri, %hi : {idx}",
        f"  %rl = graph.add %ri, %lo : {idx}",
        f"  %below = graph.ge %rh, %ci : {cond}",
        f"  %above = graph.le %rl, %ci : {cond}",
        "  %ninf = graph.constant {value = -inf} : tensor<f32>",
    ]
    if conjunction:
        mask += [
            f"  %keep = graph.where %below, %above, %below : {cond}",
            f"  %xm = graph.where %keep, %x0, %ninf : {scores}",
        ]
    else:
        mask += [
            f"  %x1 = graph.where %below, %x0, %ninf : {scores}",
            f"  %xm = graph.where %above, %x1, %ninf : {scores}",
        ]
    text = text.replace("  %m = graph.reduce_max %x0", "\n".join(mask) + "\n  %m = graph.reduce_max %xm")
    return text.replace("graph.sub %x0, %m", "graph.sub %xm, %m")


def masks_scores(for_op: tile.ForOp, bm: int, bn: int) -> bool:
    """Whether a key loop compares or selects over its [BM, BN] scores."""
    return any(
        isinstance(op, tile.ApplyOp)
        and op.fn.data in ("ge", "gt", "le", "lt", "where")
        and tuple(op.result.type.get_shape()) == (bm, bn)
        for op in for_op.body.walk()
    )


def key_tiles_visited(
    module: ModuleOp, bm: int, bn: int
) -> list[tuple[int, list[tuple[bool, list[int]]]]]:
    """For each program: its first row, and for each key loop in order whether it
    masks the scores and the key tiles it visits (from the loop's bounds)."""
    # The attention kernel (an f32 one reads K^T from a copy kernel of its own).
    (kernel,) = [
        op
        for op in module.walk()
        if isinstance(op, tile.KernelOp) and not op.kernel_name.data.startswith("triton_poi_")
    ]
    loops = [op for op in kernel.body.block.ops if isinstance(op, tile.ForOp)]
    masked = [masks_scores(op, bm, bn) for op in loops]
    # The program's rows: its first row plus an arange, the Q rows' index.
    (row_start,) = {
        op.args[0]
        for op in kernel.body.walk()
        if isinstance(op, tile.ApplyOp) and op.fn.data == "add"
        and isinstance(op.args[1].owner, tile.ArangeOp) and op.args[0].type == op.args[1].type.element_type
        and op.parent_op() is kernel
    }  # fmt: skip
    grid = [a.value.data for a in kernel.grid.data]
    out = []
    for p0 in range(grid[0]):
        for p1 in range(grid[1]):
            visited = []
            for for_op, mask in zip(loops, masked, strict=True):
                lb, ub, step = (getattr(for_op, n).value.data for n in ("lb", "ub", "step"))
                for op in for_op.body.block.ops:
                    if isinstance(op, tile.ForStartOp):
                        lb = max(lb, scalar(op.start, (p0, p1)))
                    elif isinstance(op, tile.ForStopOp):
                        ub = min(ub, scalar(op.stop, (p0, p1)))
                visited.append((mask, list(range(lb, ub, step))))
            out.append((scalar(row_start, (p0, p1)), visited))
    return out


def check_tiles_visited(
    module: ModuleOp, t_q: int, t_k: int, block: tuple[int, int], keep: Callable[[int, int], bool]
) -> None:
    """Every key tile a program's rows see is visited once, in order; no tile that all
    its rows mask is visited; the unmasked loops visit only tiles every row sees whole."""
    assert check_bounds(module) == []
    bm, bn = block
    firsts = []
    for r0, loops in key_tiles_visited(module, bm, bn):
        firsts.append(r0)
        rows = range(r0, min(r0 + bm, t_q))
        order = [j0 for _, tiles in loops for j0 in tiles]
        assert order == sorted(set(order))  # each once, in key order
        for masked, tiles in loops:
            for j0 in tiles if not masked else ():
                keys = range(j0, j0 + bn)
                assert j0 + bn <= t_k and all(keep(i, j) for i in range(r0, r0 + bm) for j in keys)
        wanted = {
            j0
            for j0 in range(0, t_k, bn)
            if any(keep(i, j) for i in rows for j in range(j0, min(j0 + bn, t_k)))
        }
        # Every needed tile is visited; a visited tile past them is needed by the
        # program's rows past the end only.
        assert wanted <= set(order)
        for j0 in set(order) - wanted:
            assert any(keep(i, j) for i in range(r0, r0 + bm) for j in range(j0, min(j0 + bn, t_k)))
    # Each row block once for each of the 2 heads.
    assert sorted(firsts) == sorted(list(range(0, t_q, bm)) * 2)


@pytest.mark.parametrize(
    ("t_q", "t_k", "cmp", "offset", "block"),
    [
        (40, 40, "ge %r, %ci", 0, (16, 16)),  # i >= j, ragged
        (64, 64, "ge %r, %ci", 0, (16, 16)),
        (40, 40, "le %ci, %r", 8, (16, 16)),  # j <= i + 8
        (40, 40, "gt %r, %ci", 0, (16, 16)),  # i > j
        (40, 72, "ge %r, %ci", 32, (16, 16)),  # more keys than rows, aligned at the end
        (72, 40, "ge %r, %ci", -32, (16, 16)),  # fewer: the first rows see no key
        (64, 64, "ge %r, %ci", 3, (32, 16)),  # tall row blocks, several diagonal tiles
        (64, 64, "ge %r, %ci", 0, (16, 32)),  # wide key tiles
        (50, 50, "gt %r, %ci", -5, (16, 32)),
        (40, 40, "le %r, %ci", 0, (16, 16)),  # i <= j: the keys from the diagonal on
        (50, 40, "lt %r, %ci", 3, (32, 16)),
    ],
)
def test_causal_tiles_split_into_unmasked_and_diagonal_stages(
    t_q: int, t_k: int, cmp: str, offset: int, block: tuple[int, int]
) -> None:
    module = lowered_with_small_tiles(causal_ir(t_q, 16, cmp=cmp, offset=offset, t_k=t_k), block)
    keep = {
        "ge %r, %ci": lambda i, j: i + offset >= j, "le %ci, %r": lambda i, j: j <= i + offset,
        "gt %r, %ci": lambda i, j: i + offset > j, "le %r, %ci": lambda i, j: i + offset <= j,
        "lt %r, %ci": lambda i, j: i + offset < j,
    }[cmp]  # fmt: skip
    check_tiles_visited(module, t_q, t_k, block, keep)
    if cmp.startswith(("ge", "gt")) or cmp == "le %ci, %r":
        unmasked, masked = [op for op in module.walk() if isinstance(op, tile.ForOp)]
        assert not masks_scores(unmasked, *block) and masks_scores(masked, *block)


@pytest.mark.parametrize(
    ("t_q", "t_k", "lo", "hi", "block", "conjunction"),
    [
        (64, 64, -20, 0, (16, 16), False),  # a sliding window of 21 keys
        (64, 64, -40, 0, (16, 16), True),
        (72, 80, -5, 5, (32, 16), False),  # narrower than a row block: no tile is whole
        (64, 64, -64, -16, (16, 32), True),
        (40, 40, -100, 100, (16, 16), False),  # wider than the keys: every tile, the last ragged
    ],
)
def test_sliding_windows_skip_tiles_outside_every_rows_band(
    t_q: int, t_k: int, lo: int, hi: int, block: tuple[int, int], conjunction: bool
) -> None:
    module = lowered_with_small_tiles(band_ir(t_q, t_k, 16, lo, hi, conjunction), block)
    check_tiles_visited(module, t_q, t_k, block, lambda i, j: i + lo <= j <= i + hi)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("t_q", "t_k", "lo", "hi", "block", "conjunction"),
    [
        (64, 64, -20, 0, (16, 16), False),
        (72, 80, -5, 5, (32, 16), True),
        (40, 40, -30, 100, (16, 32), False),
    ],
)
def test_sliding_window_attention_matches_torch(
    t_q: int, t_k: int, lo: int, hi: int, block: tuple[int, int], conjunction: bool
) -> None:
    module = lowered_with_small_tiles(band_ir(t_q, t_k, 16, lo, hi, conjunction), block)
    compiled = irc.compile(module, device=DEVICE)
    torch.manual_seed(t_q + lo)
    q = torch.randn(2, t_q, 16, device=DEVICE)
    k, v = (torch.randn(2, t_k, 16, device=DEVICE) for _ in range(2))
    i = torch.arange(t_q, device=DEVICE)[:, None]
    j = torch.arange(t_k, device=DEVICE)[None, :]
    want = attention_reference(q, k, v, (i + lo <= j) & (j <= i + hi))
    got = compiled.attn(q, k, v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_the_unmasked_stage_does_not_compare_indices() -> None:
    module = lowered_with_small_tiles(causal_ir(64, 16))
    unmasked, masked = [op for op in module.walk() if isinstance(op, tile.ForOp)]
    compares = {"ge", "gt", "le", "lt", "where"}
    # No comparison or select over the [16, 16] scores (the running max's check for
    # rows that have seen only -inf is a column).
    assert not [
        op
        for op in unmasked.body.walk()
        if isinstance(op, tile.ApplyOp) and op.fn.data in compares and op.result.type.get_shape() == (16, 16)
    ]
    assert [op for op in masked.body.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "ge"]
    assert isinstance(masked.body.block.first_op, tile.ForStartOp)
    source = emit_triton(module)
    assert "in range(tl.maximum(" in source and source.count("tl.minimum(") >= 2


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
    _, for_op = [op for op in module.walk() if isinstance(op, tile.ForOp)]
    first = for_op.body.block.first_op.next_op
    assert isinstance(first, tile.ForStopOp)
    # stop = program id * 16 + stop
    assert "tl.minimum(" in emit_triton(module)
    add = first.stop.owner
    assert isinstance(add, tile.ApplyOp) and add.fn.data == "add"
    constant = add.args[1].owner
    assert isinstance(constant, tile.ConstantOp) and constant.value.value.data == stop


def test_a_mask_tensor_skips_nothing() -> None:
    module = lowered_with_small_tiles(attention_ir(2, 40, 40, 16, mask=True))
    assert not any(isinstance(op, tile.ForStopOp | tile.ForStartOp) for op in module.walk())


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


SDPA = """\
func @sdpa(%q: tensor<2x4x40x16x{t}>, %k: tensor<2x{kv}x40x16x{t}>, %v: tensor<2x{kv}x40x{dv}x{t}>{margs}) -> tensor<2x4x40x{dv}x{t}> {{
  %o = graph.attention %q, %k, %v{mask} {{{props}}} : tensor<2x4x40x{dv}x{t}>
  return %o : tensor<2x4x40x{dv}x{t}>
}}
"""


def sdpa_ir(t: str = "f32", kv: int = 4, dv: int = 16, mask: str = "", props: str = "") -> str:
    margs = f", %m: {mask}" if mask else ""
    return SDPA.format(t=t, kv=kv, dv=dv, margs=margs, mask=", %m" if mask else "", props=props)


def test_graph_attention_decomposes_and_fuses_back_into_one_kernel() -> None:
    text = sdpa_ir("bf16", kv=2, props="is_causal = true")
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose")
    names = [op.name for op in module.walk() if op.name.startswith("graph.")]
    assert "graph.attention" not in names and names.count("graph.matmul") == 2
    assert names.count("graph.iota") == 2  # is_causal: a mask of two iotas
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose,fuse")
    (fused,) = [op for op in module.walk() if isinstance(op, graph.FusedOp)]
    assert fused.kernel_kind() == "attention"
    irc.run_pipeline(
        module, "graph-to-loop,tile,online-softmax,loop-to-tile,tile-cse,dce"
    )
    assert check_bounds(module) == []
    assert any(isinstance(op, tile.ForStopOp) for op in module.walk())
    launch = next(op for op in module.walk() if isinstance(op, tile.LaunchOp))
    assert [tuple(a.type.get_shape()) for a in launch.args][1] == (2, 2, 40, 16)  # K as it is


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (sdpa_ir(kv=3), "the key's leading dims [2, 3] must be the query's [2, 4]"),
        (sdpa_ir(mask="tensor<40x41xi1>"), "does not broadcast to the scores' shape"),
        (sdpa_ir(mask="tensor<40x40xi32>"), "the mask is i1 or the query's type"),
        (sdpa_ir(props="is_causal = 2"), "'is_causal' must be true or false"),
    ],
)
def test_graph_attention_errors_are_located(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.ir"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "irc.tools.opt", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert f"{path}:2:" in done.stderr and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "kv", "dv", "mask", "props"),
    [
        ("f32", 4, 16, "", ""),
        ("f32", 2, 32, "tensor<40x40xf32>", "scale = 0.5"),  # additive mask, grouped heads
        ("f32", 4, 16, "tensor<2x1x40x40xi1>", "is_causal = true"),  # both, per batch
        ("bf16", 2, 16, "", "is_causal = true"),
        ("f16", 1, 16, "tensor<40x40xi1>", ""),
    ],
)
def test_graph_attention_matches_scaled_dot_product_attention(
    dtype: str, kv: int, dv: int, mask: str, props: str
) -> None:
    compiled = irc.compile(irc.parse(sdpa_ir(dtype, kv, dv, mask, props)), device=DEVICE)
    # One attention kernel; f32 adds the copy of K^T (its KV heads) its FMA dots read.
    assert compiled.kernel_count == (2 if dtype == "f32" else 1)
    dt = DTYPES[dtype]
    torch.manual_seed(kv * 7 + dv)
    q = torch.randn(2, 4, 40, 16, device=DEVICE).to(dt)
    k = torch.randn(2, kv, 40, 16, device=DEVICE).to(dt)
    v = torch.randn(2, kv, 40, dv, device=DEVICE).to(dt)
    args = [q, k, v]
    bias = None
    if "i1" in mask:
        shape = (2, 1, 40, 40) if "2x1" in mask else (40, 40)
        bias = torch.rand(shape, device=DEVICE) > 0.3
        bias[..., 0] = True  # every row sees a key
    elif mask:
        bias = torch.randn(40, 40, device=DEVICE).to(dt)
    if bias is not None:
        args.append(bias)
    scale = 0.5 if "scale" in props else None
    causal = "is_causal" in props
    attn_mask = bias
    if causal and bias is not None:
        attn_mask = bias & torch.ones(40, 40, dtype=torch.bool, device=DEVICE).tril()
        causal = False
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=None if attn_mask is None else (
            attn_mask if attn_mask.dtype == torch.bool else attn_mask.float()
        ), is_causal=causal, scale=scale, enable_gqa=kv != 4,
    )  # fmt: skip
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(compiled.sdpa(*args).float(), want, atol=tol, rtol=tol)


def attention_kernel_source(text: str) -> str:
    source = triton_source(_fused(text))
    return source[source.index("def triton_attn") : source.index("def fn0")]


def _fused(text: str) -> ModuleOp:
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    return module


def test_half_attention_computes_its_probabilities_in_log2_units() -> None:
    """bf16 SDPA (f32 scores, probabilities rounded for the second dot): exp2 of one
    multiply-add a score, an FMA (`mul_add`: the max subtracted in the same
    rounding). In the unmasked stage of a causal attention the 1/sqrt(d) scale
    folds into log2(e) (0.125 * 1.4427) and the running max is of the raw scores,
    scaled once a row; the diagonal stage scales its masked scores by log2(e)."""
    text = benchmark.sdpa_ir(1, 2, 256, 64, "bf16", True)
    kernel = attention_kernel_source(text)
    assert kernel.count("for ") == 2  # the unmasked and the diagonal stage
    assert "tl.exp(" not in kernel and kernel.count("tl.math.exp2(") == 4
    constants = dict(re.findall(r"(v\d+) = tl.full\(\[\], ([-0-9.e]+), tl.float32\)", kernel))
    folded = [v for v, c in constants.items() if abs(float(c) - 0.125 * 1.4426950408889634) < 1e-7]
    assert len(folded) == 1
    (c,) = folded
    # The unmasked stage: the row max of the raw dot times c, and the dot times c
    # minus the max in one rounding; exp2 of that FMA in both stages.
    assert len(re.findall(rf"= v\d+ \* {c}\n", kernel)) == 1
    fmas = re.findall(r"(v\d+) = tl\.fma\(v\d+, (v\d+), v\d+\)\n", kernel)
    exponents = [(v, f) for v, f in fmas if f"tl.math.exp2({v})" in kernel]
    assert [f for _, f in exponents].count(c) == 1 and len(exponents) == 2
    # The other FMAs (contract-mul-add) rescale the running sum: l * alpha + sum(p).
    alphas = {v for v, _ in re.findall(r"(v\d+) = (tl\.math\.exp2\(v\d+\))\n", kernel)}
    assert len(fmas) == 4 and all(f in alphas for v, f in fmas if (v, f) not in exponents)


@pytest.mark.parametrize(
    "text",
    [
        sdpa_ir("f32", kv=2),  # f32 probabilities: exp as torch computes it
        attention_ir(2, 40, 40, 16, dtype="bf16", causal=True),  # x - max rounded to bf16
    ],
    ids=["f32", "written-out-bf16"],
)
def test_attention_whose_exp_torch_rounds_or_keeps_in_f32_keeps_exp(text: str) -> None:
    kernel = attention_kernel_source(text)
    assert "tl.exp(" in kernel and "exp2" not in kernel


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_log2_probabilities_match_torch_at_large_scores(dtype: str) -> None:
    """Scores up to hundreds, scaled by 3 (c * log2(e) folded), causal and ragged."""
    text = sdpa_ir(dtype, kv=4, props="is_causal = true, scale = 3.0")
    assert "exp2" in attention_kernel_source(text)
    compiled = irc.compile(irc.parse(text), device=DEVICE)
    torch.manual_seed(5)
    dt = DTYPES[dtype]
    q, k, v = (torch.randn(2, 4, 40, 16, device=DEVICE).mul(3).to(dt) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, scale=3.0
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(compiled.sdpa(q, k, v).float(), want, atol=tol, rtol=tol)


EPILOGUE_4D = """\
func @sdpa(%q: tensor<2x4x40x16xf32>, %k: tensor<2x2x40x16xf32>, %v: tensor<2x2x40x16xf32>, %r: tensor<2x4x40x16xf32>) -> tensor<2x4x40x16xf32> {
  %o = graph.attention %q, %k, %v {is_causal = true} : tensor<2x4x40x16xf32>
  %a = graph.relu %o : tensor<2x4x40x16xf32>
  %y = graph.add %a, %r : tensor<2x4x40x16xf32>
  return %y : tensor<2x4x40x16xf32>
}
"""


def test_an_epilogue_on_the_4d_output_joins_the_kernel() -> None:
    module = irc.parse(EPILOGUE_4D)
    irc.run_pipeline(
        module, "decompose,fuse,graph-to-loop,tile,online-softmax,loop-to-tile,tile-cse,dce"
    )
    # The attention with its epilogue, and the f32 K^T copy (of the 2 KV heads).
    names = sorted(op.kernel_name.data for op in module.walk() if isinstance(op, tile.KernelOp))
    assert len(names) == 2 and names[0].startswith("triton_attn_fused_")
    assert names[1].startswith("triton_poi_transpose_")
    assert check_bounds(module) == []


@pytest.mark.slow
def test_an_epilogue_on_the_4d_output_matches_torch() -> None:
    compiled = irc.compile(irc.parse(EPILOGUE_4D), device=DEVICE)
    torch.manual_seed(3)
    q, r = torch.randn(2, 4, 40, 16, device=DEVICE), torch.randn(2, 4, 40, 16, device=DEVICE)
    k, v = torch.randn(2, 2, 40, 16, device=DEVICE), torch.randn(2, 2, 40, 16, device=DEVICE)
    want = torch.relu(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ) + r
    torch.testing.assert_close(compiled.sdpa(q, k, v, r), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("banded", [False, True])
@pytest.mark.parametrize("half", [False, True])
def test_attention_tiles_fit_two_programs_an_sm(banded: bool, half: bool) -> None:
    """The accumulator and scores fit a thread's registers, and (where any tiling of
    64 keys can) two programs' Q rows and staged K and V tiles fit an SM's shared memory;
    under a band the rows are 64, one warp group's dot."""
    for d in (16, 40, 64, 96, 128):
        for t in (24, 100, 1024, 16384):
            tiling = attention_tiling(KernelShape(KernelKind.ATTENTION, (4, t, d), (t, d), half, banded=banded))
            (bm, bn), warps, stages = tiling.block, tiling.warps, tiling.stages
            width = max(16, 1 << (d - 1).bit_length())
            assert bm * (width + bn) <= ATTENTION_LIVE_F32 * 32 * warps
            if not half:  # FMA dots: the Q, K and V tiles are in registers too
                held = bm * (width + bn) + bm * width + 2 * bn * width
                assert held <= ATTENTION_FMA_LIVE_F32 * 32 * warps, (d, t, tiling)
                if t >= 1024:
                    assert warps == (4 if d <= 64 else 8), (d, tiling)
            shared = (2 if half else 4) * (bm * width + stages * bn * 2 * width)
            if half or d <= 64:
                assert 2 * shared <= SHARED_BYTES, (d, t, tiling)
            assert bn <= max(16, 1 << (t - 1).bit_length()) and bm <= max(16, 1 << (t - 1).bit_length())
            if banded and half and t >= 64:
                assert bm == 64
            if not half and t >= 32:
                assert bm == 32  # FMA operands in registers too (tests/test_f32_tiling.py)
            assert bm * bn <= ATTENTION_SCORES
            if half and not banded and t >= 1024 and d <= 64:
                assert (bm, bn) == (128, 64)  # at most ATTENTION_SCORES scores a key step
            if half and banded and t >= 1024 and d <= 64:
                assert (bm, bn) == (64, 64)  # 64 keys a step, 64 rows too (HALF_KEY_STEP)
            if half and t >= 64:
                assert bn <= HALF_KEY_STEP


def test_a_causal_mask_makes_a_banded_attention_shape() -> None:
    for text, banded in ((causal_ir(40, 16), True), (attention_ir(2, 40, 40, 16, mask=True), False)):
        module = irc.parse(text)
        irc.run_pipeline(module, "decompose,fuse,graph-to-loop")
        (kernel,) = [
            op
            for op in module.walk()
            if isinstance(op, loop.KernelOp) and loop.kernel_kind(op) == "attention"
        ]
        assert kernel_shape(kernel).banded is banded


def test_only_the_probabilities_take_the_fast_exp() -> None:
    """An attention's probabilities are only summed (into the row sum and P V): their
    exp, and the running max's rescale, are the fast `tl.exp` (ex2.approx). An exp of
    the output is an output element: it keeps `_irc_exp`, CUDA's accurate expf."""
    text = attention_ir(2, 40, 40, 16, dtype="f32").replace(
        "  return %o : tensor<2x40x16xf32>",
        "  %y = graph.exp %o : tensor<2x40x16xf32>\n  return %y : tensor<2x40x16xf32>",
    )
    kernel = attention_kernel_source(text)
    assert kernel.count("tl.exp(") == 2 and kernel.count("_irc_exp(") == 1
