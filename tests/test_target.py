"""irc.target: element-wise tiling and epilogue reductions follow the GPU's bandwidth an SM."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.autotune import candidates
from irc.compiler import triton_source
from irc.dialects import loop
from irc.passes.tile import (
    LONG_CHAIN,
    REDUCED_ROW_THREAD_ELEMENTS,
    SEVERAL_FUNCTIONS_THREAD_ELEMENTS,
    KernelShape,
    TilePass,
    Tiling,
    choose_tiling,
    kernel_shape,
    next_pow2,
    reduced_row_elements,
    tiling_of,
)
from irc.pipeline import build_pipeline, run_pipeline
from irc.runtime.loader import load_source
from irc.target import Target, cuda_target, dram_gbps, target_for

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

# What Triton's get_device_properties read on the two GPUs the rule was measured on.
H100 = {"mem_clock_rate": 2_619_000, "mem_bus_width": 5120, "multiprocessor_count": 132}
H200 = {"mem_clock_rate": 3_201_000, "mem_bus_width": 6016, "multiprocessor_count": 132}

PROGRAM = """
func @f(%x: tensor<1000x3xf32>, %y: tensor<1000x3xf32>, %w: tensor<1000x64xf32>) -> (tensor<1000x3xf32>, tensor<1000x1xf32>) {
  %s = graph.add %x, %y
  %t = graph.mul %s, %s
  %u = graph.sigmoid %t
  %r = graph.reduce_sum %w {dims = [1], keepdim = true} : tensor<1000x1xf32>
  return %u, %r : tensor<1000x3xf32>, tensor<1000x1xf32>
}
"""


def test_bandwidth_from_device_properties() -> None:
    assert dram_gbps(H100) == pytest.approx(3352, abs=1)
    assert dram_gbps(H200) == pytest.approx(4815, abs=1)


def test_h100_class_gpus_get_small_element_wise_programs() -> None:
    t = target_for(H100)
    assert (t.block, t.thread_elements, t.epilogue_warps) == (512, 2, 16)
    assert "25 GB/s an SM" in t.reason
    t = target_for(H200)
    assert (t.block, t.thread_elements, t.epilogue_warps) == (1024, 8, 8)
    assert t == Target(reason=t.reason)


def test_tile_pass_spec_round_trips_the_options() -> None:
    (p,) = build_pipeline(target_for(H100).tile_pass())
    assert isinstance(p, TilePass)
    assert (p.block, p.thread_elements, p.epilogue_warps) == (512, 2, 16)
    (p,) = build_pipeline(Target().tile_pass())
    assert p == TilePass()


def _kernels(target: Target | None, program: str = PROGRAM) -> dict[str, Tiling]:
    module = irc.parse(program)
    run_pipeline(module, "fuse")
    run_pipeline(
        module, "decompose,graph-to-loop,split-reduction," + (target or Target()).tile_pass()
    )
    return {k.kernel_name.data: tiling_of(k) for k in loop.kernels(module)}


def test_target_changes_element_wise_kernels_only() -> None:
    portable, thin = _kernels(None), _kernels(target_for(H100))
    (poi,) = [n for n in portable if n.startswith("poi")]
    (red,) = [n for n in portable if n.startswith("per") or n.startswith("red")]
    assert portable[poi] == Tiling((1024,), 4)
    assert thin[poi] == Tiling((512,), 8)
    assert thin[red] == portable[red]


def test_a_long_chain_of_functions_takes_twice_the_warps() -> None:
    """Four tanh an element (`LONG_CHAIN`): the same 1024 elements a program in 8
    warps, where one tanh an element keeps 4 (more warps hide the chain's latency)."""

    def chain(n: int) -> str:
        body = "".join(f"  %t{i + 1} = graph.tanh %t{i}\n" for i in range(n))
        return (
            "func @f(%t0: tensor<4096x1024xf32>) -> tensor<4096x1024xf32> {\n"
            + body
            + f"  return %t{n} : tensor<4096x1024xf32>\n}}\n"
        )

    (short,) = _kernels(None, chain(1)).values()
    (long,) = _kernels(None, chain(LONG_CHAIN)).values()
    assert short.block == long.block == (1024,)
    assert long.warps == 2 * short.warps == 8


def test_two_functions_of_each_streamed_element_take_8_half_elements_a_thread() -> None:
    """sin(x) * cos(x) in bf16: 8 elements a thread (`SEVERAL_FUNCTIONS_THREAD_ELEMENTS`)
    rather than the 16 one function (GELU) takes; three functions take 8 too, as four
    (`LONG_CHAIN`, twice the warps) do. Functions of broadcast operands alone do not
    count: batch norm's normalization computes two divisions and an rsqrt of column
    statistics an element, and keeps 16."""
    x = "%x: tensor<4096x1024xbf16>"
    out = "tensor<4096x1024xbf16>"
    sincos = f"""func @f({x}) -> {out} {{
  %s = graph.sin %x
  %c = graph.cos %x
  %y = graph.mul %s, %c
  return %y : {out}
}}
"""
    gelu = f"func @f({x}) -> {out} {{\n  %y = graph.gelu %x\n  return %y : {out}\n}}\n"
    norm = """func @f(%x: tensor<16384x1000xbf16>) -> tensor<16384x1000xbf16> {
  %mean = graph.reduce_mean %x {dims = [0], keepdim = true} : tensor<1x1000xbf16>
  %c = graph.sub %x, %mean
  %sq = graph.mul %c, %c
  %var = graph.reduce_mean %sq {dims = [0], keepdim = true} : tensor<1x1000xbf16>
  %inv = graph.rsqrt %var
  %y = graph.mul %c, %inv
  return %y : tensor<16384x1000xbf16>
}
"""

    def elementwise(program: str, target: Target | None) -> tuple[int, int]:
        """(functions an element, elements a thread) of the program's element-wise kernel."""
        module = irc.parse(program)
        run_pipeline(module, "fuse")
        run_pipeline(
            module, "decompose,graph-to-loop,split-reduction," + (target or Target()).tile_pass()
        )
        (kernel,) = [
            k
            for k in module.walk()
            if isinstance(k, loop.KernelOp) and kernel_shape(k).reduction == ()
        ]
        tiling = tiling_of(kernel)
        return kernel_shape(kernel).transcendentals, tiling.block[0] // (32 * tiling.warps)

    three = f"""func @f({x}) -> {out} {{
  %t = graph.tanh %x
  %e = graph.erf %t
  %s = graph.sigmoid %e
  %y = graph.mul %s, %x
  return %y : {out}
}}
"""
    four = three.replace("%y = graph.mul %s, %x", "%c = graph.cos %s\n  %y = graph.mul %c, %x")
    for target in (None, target_for(H100)):
        assert elementwise(sincos, target) == (2, SEVERAL_FUNCTIONS_THREAD_ELEMENTS)
        assert elementwise(three, target) == (3, 8)
        assert elementwise(four, target) == (4, 8)
        assert elementwise(gelu, target) == (1, 16)
        functions, per_thread = elementwise(norm, target)
        assert functions >= 2 and per_thread == 16


ROWS = """
func @sumsq(%x: tensor<5x8192xf32>) -> tensor<5xf32> {
  %sq = graph.mul %x, %x
  %s = graph.reduce_sum %sq {dims = [1]} : tensor<5xf32>
  return %s : tensor<5xf32>
}
func @softmax(%x: tensor<5x8192xf32>) -> tensor<5x8192xf32> {
  %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<5x1xf32>
  %d = graph.sub %x, %m
  %e = graph.exp %d
  %z = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<5x1xf32>
  %y = graph.div %e, %z
  return %y : tensor<5x8192xf32>
}
"""


XYZ_ROWS = """
func @xyz(%x: tensor<5x8192xf32>, %y: tensor<5x8192xf32>, %z: tensor<5x8192xf32>) -> tensor<5xf32> {
  %m = graph.mul %x, %y
  %a = graph.add %m, %z
  %s = graph.reduce_sum %a {dims = [1]} : tensor<5xf32>
  return %s : tensor<5xf32>
}
"""


def test_rows_only_reduced_take_128_loaded_bytes_a_thread_and_epilogue_rows_follow_the_target() -> (
    None
):
    """A row only reduced: 128 bytes of its loads a thread (8 to 64 elements), so
    that more programs share an SM (logsumexp of 5874 x 4258 bf16 on an H200: 22.1
    us at 4 warps against 58.6 at 32); epilogue rows follow the target."""
    portable, thin = _kernels(None, ROWS), _kernels(target_for(H100), ROWS)
    (sumsq,) = [n for n in portable if "amax" not in n]
    (softmax,) = [n for n in portable if "amax" in n]
    assert portable[sumsq] == thin[sumsq] == Tiling((1, 8192), 8)  # 32 f32 a thread
    assert portable[softmax] == Tiling((1, 8192), 8)
    assert thin[softmax] == Tiling((1, 8192), 16)
    # 4096 elements a program: 8 warps on either GPU (16 a thread)
    short = _kernels(target_for(H100), ROWS.replace("5x8192", "5x4096"))
    assert short[softmax] == Tiling((1, 4096), 8)
    # bf16: 64 elements a thread; three f32 operands (12 bytes an element): 8.
    (half,) = _kernels(None, ROWS.split("func @softmax")[0].replace("f32", "bf16")).values()
    assert half == Tiling((1, 8192), 4)
    (xyz,) = _kernels(None, XYZ_ROWS).values()
    assert xyz == Tiling((1, 8192), 32)
    # A row read twice (max, then the sum of exp) counts its buffer once; shared rows
    # (4 of 1024 a program) take the same bytes a thread.
    lse = ROWS.split("func @softmax")[1].replace("%y = graph.div %e, %z", "%y = graph.log %z")
    lse = "func @softmax" + lse.replace("-> tensor<5x8192xf32>", "-> tensor<5x1xf32>")
    lse = lse.replace("return %y : tensor<5x8192xf32>", "return %y : tensor<5x1xf32>")
    (row,) = _kernels(None, lse.replace("f32", "bf16")).values()
    assert row == Tiling((1, 8192), 4)
    (rows,) = _kernels(None, lse.replace("5x8192", "5x1024").replace("f32", "bf16")).values()
    assert rows == Tiling((4, 1024), 2)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 1 << 20),
    length=st.integers(1, 8192),
    loaded=st.integers(0, 400),
    element=st.sampled_from([1, 2, 4, 8]),
)
def test_rows_only_reduced_hold_whole_rows_at_their_bytes_a_thread(
    rows: int, length: int, loaded: int, element: int
) -> None:
    """Any row of up to 8192 elements only reduced: whole (padded) rows a program,
    a power-of-two count of 1 to 32 warps, and the rule's elements a thread (8 to
    64) wherever the program holds that many a lane."""
    shape = KernelShape(
        "reduction", (rows,), (length,), False, element_bytes=element, loaded_bytes=loaded
    )
    tiling = choose_tiling(shape)
    x, full = tiling.block
    assert full == next_pow2(length) and 1 <= x <= next_pow2(rows)
    assert tiling.warps in (1, 2, 4, 8, 16, 32)
    per_thread = x * full // (32 * tiling.warps)
    least, most = REDUCED_ROW_THREAD_ELEMENTS
    assert least <= reduced_row_elements(shape) <= most
    if x * full >= 32 * reduced_row_elements(shape):
        assert per_thread == reduced_row_elements(shape)
    else:  # a program smaller than one warp's share: one warp
        assert tiling.warps == 1


def test_code_with_8_16_and_32_warps_a_row_matches_torch() -> None:
    x = torch.randn(5, 8192, device=DEVICE)
    y, z = torch.randn_like(x), torch.randn_like(x)
    module = irc.parse(ROWS + XYZ_ROWS)
    run_pipeline(module, "fuse")
    source = triton_source(module, target=target_for(H100))
    assert source.count(", 32)") == 1 and source.count(", 16)") == 1
    assert source.count(", 8)") == 1
    functions = load_source(source, DEVICE).FUNCTIONS
    assert_close(functions["sumsq"](x), (x * x).sum(1))
    assert_close(functions["softmax"](x), torch.softmax(x, 1))
    # A sum of 8192 terms near 0: judged against f64 where its order shows.
    from irc.testing.reference import functions as irc_functions
    from irc.testing.verdict import judge_outputs

    (xyz,) = irc_functions(irc.parse(XYZ_ROWS, "<test>")).values()
    (verdict,) = judge_outputs(xyz, [x, y, z], functions["xyz"](x, y, z))
    assert verdict.ok, verdict.line


def test_code_for_either_target_matches_torch() -> None:
    x, y, w = (torch.randn(1000, s, device=DEVICE) for s in (3, 3, 64))
    want = (torch.sigmoid((x + y) * (x + y)), w.sum(1, keepdim=True))
    for target in (None, target_for(H100)):
        module = irc.parse(PROGRAM)
        run_pipeline(module, "fuse")
        source = triton_source(module, target=target)
        assert ("tl.arange(0, 512)" in source) == (target is not None)
        got = load_source(source, DEVICE).FUNCTIONS["f"](x, y, w)
        assert_close(got, want)


def test_autotune_starts_from_the_kernels_own_tiling() -> None:
    module = irc.parse(PROGRAM)
    run_pipeline(module, "fuse")
    run_pipeline(module, "decompose,graph-to-loop,split-reduction," + target_for(H100).tile_pass())
    poi = loop.kernels(module)[0]
    tried = candidates(kernel_shape(poi), tiling_of(poi))
    assert tried[0] == Tiling((512,), 8)
    assert Tiling((1024,), 4) in tried and len(set(tried)) == len(tried)


def test_without_device_properties_the_default_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton.runtime import driver

    class NoGPU:
        @property
        def utils(self) -> object:
            raise RuntimeError("0 active drivers")

    monkeypatch.setattr(type(driver), "active", property(lambda self: NoGPU()))
    t = cuda_target()
    assert (t.block, t.thread_elements) == (1024, 8)
    assert "device properties unavailable: 0 active drivers" in t.reason


@pytest.mark.gpu
def test_compile_on_the_gpu_uses_its_target() -> None:
    compiled = irc.compile(irc.parse(PROGRAM), device="cuda")
    assert compiled.target == cuda_target()
    assert "GB/s an SM" in compiled.target.reason


def test_irc_opt_autotune_starts_from_the_gpus_tiling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import irc.autotune
    import irc.target
    from irc.tools.opt import run

    seen: list[Tiling] = []

    def fake_autotune(module: ModuleOp, device: str = "cuda") -> dict[str, object]:
        seen.extend(tiling_of(k) for k in loop.kernels(module))
        return {}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(irc.target, "cuda_target", lambda: target_for(H100))
    monkeypatch.setattr(irc.autotune, "autotune_module", fake_autotune)
    path = tmp_path / "f.ir"
    path.write_text(PROGRAM)
    out = io.StringIO()
    assert run([str(path), "--fuse", "--autotune", "--emit", "triton"], stdout=out) == 0
    assert Tiling((512,), 8) in seen
    assert "tl.arange(0, 512)" in out.getvalue()


A100 = {"mem_clock_rate": 1_593_000, "mem_bus_width": 5120, "multiprocessor_count": 108,
        "max_shared_mem": 166_912}  # fmt: skip
ADA = {"mem_clock_rate": 10_501_000, "mem_bus_width": 384, "multiprocessor_count": 128,
       "max_shared_mem": 101_376}  # fmt: skip


def test_shared_memory_comes_from_the_gpu_and_reaches_the_tile_pass() -> None:
    t = target_for(A100)
    assert t.shared_bytes == 166_912 and "shared-bytes=166912" in t.tile_pass()
    (p,) = build_pipeline(t.tile_pass())
    assert isinstance(p, TilePass) and p.shared_bytes == 166_912
    assert "shared-bytes" not in target_for({**H100, "max_shared_mem": 232_448}).tile_pass()


@pytest.mark.parametrize("props", [A100, ADA], ids=["a100", "ada"])
def test_gemm_and_attention_tiles_fit_a_smaller_gpus_shared_memory(props: dict[str, int]) -> None:
    """The H100's big GEMM tiles (128x256x64, 3 stages: 192 KB of bf16 operands) and
    attention tiles do not fit an A100 (163 KB) or an Ada GPU (99 KB): what the tile
    pass picks there must."""
    from irc.passes.tile import KernelShape, choose_tiling, gemm_fits

    limit = props["max_shared_mem"]
    t = target_for(props)
    gemm = KernelShape("contraction", (4096, 4096), (4096,), True, element_bytes=2)
    big = choose_tiling(gemm, sms=t.sms)
    assert not gemm_fits(big, gemm, limit)  # the H100's choice
    fit = choose_tiling(gemm, sms=t.sms, shared_bytes=limit)
    assert gemm_fits(fit, gemm, limit)
    for half, head in ((True, 64), (True, 128), (False, 128)):
        shape = KernelShape("attention", (8, 4096, head), (4096, head), half)
        a = choose_tiling(shape, shared_bytes=limit)
        bm, bn = a.block
        operand = 2 if half else 4
        assert operand * (bm * head + a.stages * bn * 2 * head) <= limit, (half, head, a)


def test_a_smaller_gpus_gemm_compiles_within_its_shared_memory() -> None:
    text = """func @f(%a: tensor<1024x512xbf16>, %b: tensor<512x1024xbf16>) -> tensor<1024x1024xbf16> {
  %y = graph.matmul %a, %b : tensor<1024x1024xbf16>
  return %y : tensor<1024x1024xbf16>
}
"""
    from irc.passes.tile import gemm_shared_bytes

    module = irc.parse(text)
    run_pipeline(
        module, "fuse,decompose,graph-to-loop,split-reduction," + target_for(ADA).tile_pass()
    )
    (k,) = loop.kernels(module)
    t = tiling_of(k)
    assert gemm_shared_bytes(*t.block, t.stages, 2) <= ADA["max_shared_mem"]


def test_shared_bytes_below_any_gpus_is_a_clear_error() -> None:
    from irc.syntax.diagnostics import IrcError

    with pytest.raises(IrcError, match="shared-bytes"):
        build_pipeline("tile{shared-bytes=100}")
