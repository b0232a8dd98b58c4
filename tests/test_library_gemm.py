"""`library-gemm`: half-precision GEMMs on the vendor's library (`loop.library_matmul`,
`torch.matmul` on the host) and their epilogue as an irc kernel; the measured choice
(`irc.library_choice`) with a stand-in timer. On the CPU, torch's matmul stands in
for cuBLAS, and every result is checked against torch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import irc
from irc.analysis.verifier import verify
from irc.dialects import loop, tile
from irc.library_choice import MIN_FLOPS, choose_library_gemms, move_every_gemm
from irc.passes.library_gemm import LIBRARY_COPY_PREFIX, plain_gemm
from irc.pipeline import run_pipeline
from irc.syntax.diagnostics import IrcError
from irc.syntax.printer import print_module
from irc.target import Target
from irc.testing.programs import gemm_text

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}
UP_TO_CHOICE = "fuse,decompose,graph-to-loop,split-reduction"


def loop_module(text: str) -> object:
    module = irc.parse(text)
    run_pipeline(module, UP_TO_CHOICE)
    return module


def gemm_inputs(m: int, n: int, k: int, el: str, a_t: bool = False, b_t: bool = False):
    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    dt = TORCH[el]
    x = torch.randint(-3, 4, (k, m) if a_t else (m, k), generator=g).to(dt)
    w = torch.randint(-3, 4, (n, k) if b_t else (k, n), generator=g).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    mm = ((x.double().T if a_t else x.double()) @ (w.double().T if b_t else w.double())).to(dt)
    return x, w, b, mm


@pytest.mark.parametrize(
    ("m", "n", "k", "el", "a_t", "b_t"),
    [
        (37, 29, 45, "bf16", False, False),  # K and N odd: both operands copied, padded
        (40, 48, 64, "f16", False, False),  # aligned: no copy
        (33, 40, 24, "bf16", True, False),  # x stored [K, M], odd M: copied K-major
        (30, 21, 19, "f16", False, True),  # an nn.Linear weight [N, K]: copied transposed
        (24, 32, 40, "bf16", False, True),  # ... aligned: read transposed as it is
        (20, 24, 17, "bf16", True, False),  # odd K: both copied, zero past K
        (37, 29, 45, "f32", False, False),  # f32: cuBLAS's SGEMM, odd sizes read as they are
        (32, 40, 48, "f32", True, True),  # ... both stored transposed, read as they are
    ],
)
def test_library_gemms_with_epilogues_match_torch(
    m: int, n: int, k: int, el: str, a_t: bool, b_t: bool
) -> None:
    compiled = irc.compile(
        irc.parse(gemm_text(m, n, k, el, a_t=a_t, b_t=b_t)), device=DEVICE, library_gemm="always"
    )
    assert "_library_matmul(" in compiled.source
    x, w, b, mm = gemm_inputs(m, n, k, el, a_t, b_t)
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)).cpu()
    assert_close(got, F.gelu(mm + b))
    copies = compiled.source.count(f"_launch(triton_{LIBRARY_COPY_PREFIX}")
    per = 1 if el == "f32" else 8  # cuBLAS's SGEMM takes any alignment
    assert copies == (k % per != 0 or (a_t and m % per != 0)) + (k % per != 0 or n % per != 0)


@pytest.mark.parametrize("k", [40, 37])
def test_a_bare_product_is_written_by_the_library_alone(k: int) -> None:
    """Stored as it is, with rows 16 bytes apart: no epilogue kernel (K = 37: the
    operands' zero-padded copies alone)."""
    text = f"""func @f(%x: tensor<24x{k}xf16>, %w: tensor<{k}x32xf16>) -> tensor<24x32xf16> {{
  %y = graph.matmul %x, %w
  return %y : tensor<24x32xf16>
}}
"""
    module = loop_module(text)
    move_every_gemm(module)  # type: ignore[arg-type]
    names = [kernel.kernel_name.data for kernel in loop.kernels(module)]  # type: ignore[arg-type]
    assert names == ([] if k % 8 == 0 else ["library_pad_0", "library_pad_1"])
    compiled = irc.compile(irc.parse(text), device=DEVICE, library_gemm="always")
    assert "_launch(triton_poi" not in compiled.source
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, (24, k), generator=g).half()
    w = torch.randint(-3, 4, (k, 32), generator=g).half()
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu()
    assert_close(got, (x.double() @ w.double()).half())


def test_batched_products_read_their_operands_as_views() -> None:
    """[B, M, K] @ [K, N]: the weight broadcast over the batch, no copy."""
    text = """func @f(%x: tensor<3x20x16xbf16>, %w: tensor<16x24xbf16>) -> tensor<3x20x24xbf16> {
  %wb = graph.broadcast %w : tensor<3x16x24xbf16>
  %y = graph.matmul %x, %wb
  %r = graph.relu %y
  return %r : tensor<3x20x24xbf16>
}
"""
    module = loop_module(text)
    gemm = plain_gemm(loop.kernels(module)[0])  # type: ignore[arg-type]
    assert gemm is not None and gemm.a_dims == (0, 1, -1) and gemm.b_dims == (-1, 2)
    compiled = irc.compile(irc.parse(text), device=DEVICE, library_gemm="always")
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-3, 4, (3, 20, 16), generator=g).bfloat16()
    w = torch.randint(-3, 4, (16, 24), generator=g).bfloat16()
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu()
    assert_close(got, torch.relu((x.double() @ w.double()).bfloat16()))


@pytest.mark.parametrize(("k", "n"), [(16, 29), (13, 24)])
def test_batched_products_of_odd_sizes_are_padded_on_the_host(k: int, n: int) -> None:
    """[B, M, K] @ [B, K, N], K or N not whole granules: no copy kernel (batched
    operands keep their layout); `_library_operand` pads them with zeros."""
    text = f"""func @f(%x: tensor<3x20x{k}xf16>, %w: tensor<3x{k}x{n}xf16>) -> tensor<3x20x{n}xf16> {{
  %y = graph.matmul %x, %w
  %r = graph.relu %y
  return %r : tensor<3x20x{n}xf16>
}}
"""
    compiled = irc.compile(irc.parse(text), device=DEVICE, library_gemm="always")
    assert LIBRARY_COPY_PREFIX not in compiled.source
    g = torch.Generator().manual_seed(k + n)
    x = torch.randint(-3, 4, (3, 20, k), generator=g).half()
    w = torch.randint(-3, 4, (3, k, n), generator=g).half()
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE)).cpu()
    assert_close(got, torch.relu((x.double() @ w.double()).half()))


def test_what_the_library_does_not_take() -> None:
    """f64 GEMMs, operands read at computed indices, and operands a
    `pad-gemm-operands` copy has padded (its pad is not zero)."""
    f64 = loop_module(gemm_text(40, 48, 64, "f64"))
    assert plain_gemm(loop.kernels(f64)[0]) is None  # type: ignore[arg-type]
    f32 = loop_module(gemm_text(40, 48, 64, "f32"))
    assert plain_gemm(loop.kernels(f32)[0]) is not None  # type: ignore[arg-type]
    assert move_every_gemm(f32, f32=False) == []  # tf32=True
    window = """func @f(%x: tensor<32x80xbf16>, %w: tensor<64x32xbf16>) -> tensor<32x32xbf16> {
  %s = graph.slice %x {start = [0, 16], end = [32, 80]}
  %y = graph.matmul %s, %w
  return %y : tensor<32x32xbf16>
}
"""
    shifted = loop_module(window)  # x read at [i, k + 16]: a computed index
    assert [plain_gemm(k) for k in loop.kernels(shifted)] == [None]  # type: ignore[arg-type]
    padded = irc.parse(gemm_text(300, 301, 257, "bf16"))
    run_pipeline(
        padded,
        f"{UP_TO_CHOICE},pad-gemm-operands{{min_flops=0 persistent_only=false rereads=1}}",
    )
    gemms = [k for k in loop.kernels(padded) if k.kernel_name.data.startswith("mm")]
    assert len(loop.kernels(padded)) == 3 and plain_gemm(gemms[0]) is None


def test_the_kernel_after_a_library_gemm_is_not_launched_early() -> None:
    """PDL: cuBLAS lets dependents start early; their waiting programs hold SMs."""
    compiled = irc.compile(irc.parse(gemm_text(37, 29, 45, "bf16")), device="cpu",
                           library_gemm="always")  # fmt: skip
    kernels = {k.kernel_name.data: k for k in tile.kernels(compiled.module)}
    assert kernels["triton_poi_fused_matmul_add_gelu_0"].pdl is None
    assert kernels["triton_library_pad_1"].pdl is not None  # after the first copy


def NO_LOWER(module: object, target: Target) -> None:  # noqa: N802 (a constant's spelling)
    """The stand-in timer lowers nothing."""


def fake_measure(irc_us: float, library_us: float, calls: list[str]):
    def measure(gemm, target, device, lower):  # type: ignore[no-untyped-def]
        calls.append(gemm.kernel.kernel_name.data)
        return [irc_us / 1e3] * 4, [library_us / 1e3] * 4

    return measure


def test_the_measured_choice_moves_only_faster_gemms_and_caches_it(tmp_path: Path) -> None:
    big = gemm_text(1024, 1024, 2048, "bf16")  # 2^32 flops
    cache = tmp_path / "autotune.json"
    calls: list[str] = []
    slower = loop_module(big)
    kept = choose_library_gemms(
        slower, Target(), "cpu", cache, fake_measure(100, 99, calls), lower=NO_LOWER
    )
    assert kept == {} and len(loop.kernels(slower)) == 1  # type: ignore[arg-type]
    faster = loop_module(big)
    cache.unlink()
    moved = choose_library_gemms(
        faster, Target(), "cpu", cache, fake_measure(100, 80, calls), lower=NO_LOWER
    )
    assert list(moved) == ["mm_fused_matmul_add_gelu_0"]
    (op,) = [o for o in faster.walk() if isinstance(o, loop.LibraryMatmulOp)]  # type: ignore[attr-defined]
    assert op.reason is not None and "80.0 us" in op.reason.data and "100.0 us" in op.reason.data
    assert "loop.library_matmul" in print_module(faster)  # type: ignore[arg-type]
    again = loop_module(big)
    choose_library_gemms(
        again, Target(), "cpu", cache, fake_measure(100, 200, calls), lower=NO_LOWER
    )
    assert len(calls) == 2  # the second decision came from the cache
    assert any(v.get("library") for v in json.loads(cache.read_text()).values())
    small = loop_module(gemm_text(64, 64, 64, "bf16"))
    assert 2 * 64**3 < MIN_FLOPS
    assert (
        choose_library_gemms(
            small, Target(), "cpu", cache, fake_measure(100, 1, calls), lower=NO_LOWER
        )
        == {}
    )
    assert len(calls) == 2
    # f32's SGEMM is slower: smaller products are worth measuring (2^29 flops here)
    f32 = loop_module(gemm_text(512, 512, 1024, "f32"))
    choose_library_gemms(f32, Target(), "cpu", cache, fake_measure(100, 90, calls), lower=NO_LOWER)
    assert len(calls) == 3
    assert [k.kernel_name.data for k in loop.kernels(f32)] == ["poi_fused_matmul_add_gelu_0"]  # type: ignore[arg-type]


def test_a_measurement_that_fails_keeps_irc_and_is_not_cached(tmp_path: Path) -> None:
    def broken(gemm, target, device, lower):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDA out of memory")

    cache = tmp_path / "autotune.json"
    module = loop_module(gemm_text(1024, 1024, 2048, "bf16"))
    assert choose_library_gemms(module, Target(), "cpu", cache, broken, lower=NO_LOWER) == {}
    assert len(loop.kernels(module)) == 1  # type: ignore[arg-type]
    assert json.loads(cache.read_text()) == {}


def test_the_op_prints_parses_and_verifies() -> None:
    text = """func @g(%x: memref<30x20xbf16>, %w: memref<24x24xbf16>) -> memref<30x24xbf16> {
  %0 = loop.alloc : memref<30x24xbf16>
  loop.library_matmul %x, %w, %0 {a_dims = [0, -1], b_dims = [1, -1], sizes = [30, 21], k = 20, reason = "by hand"}
  return %0 : memref<30x24xbf16>
}
"""
    printed = print_module(irc.parse(text))
    assert print_module(irc.parse(printed)) == printed
    compiled = irc.compile(irc.parse(text), device=DEVICE)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-3, 4, (30, 20), generator=g).bfloat16()
    w = torch.randint(-3, 4, (24, 24), generator=g).bfloat16()
    got = compiled["g"](x.to(DEVICE), w.to(DEVICE)).cpu()
    assert_close(got[:, :21], (x.double() @ w[:21, :20].double().T).bfloat16())
    assert "# by hand" in compiled.source


HEAD = "func @g(%x: memref<30x20xbf16>, %w: memref<20x24xbf16>) -> memref<30x24xbf16> {\n"
HEAD += "  %0 = loop.alloc : memref<30x24xbf16>\n"
TAIL = "  return %0 : memref<30x24xbf16>\n}\n"


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("%x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 0], sizes = [30, 24], k = 20}",
         "b_dims names K (-1) once and the output's dimension 1 once"),
        ("%x, %w, %0 {a_dims = [0, 1], b_dims = [-1, 1], sizes = [30, 24], k = 20}",
         "a_dims names K (-1) once"),
        ("%x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 24], k = 21}",
         "a runs 20 along K, which needs 21"),
        ("%x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 25], k = 20}",
         "do not fit the output"),
        ("%x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30], k = 20}",
         "'sizes' must be a list of 2 integers"),
        ("%x, %w, %0 {a_dims = [0, -1, 1], b_dims = [-1, 1], sizes = [30, 24], k = 20}",
         "'a_dims' must be a list of 2 integers"),
        ("%x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 7], sizes = [30, 24], k = 20}",
         "'b_dims[1]' must be an integer from -1 to 1"),
        ("%x, %w, %x {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 20], k = 20}",
         "the output is not one of its operands"),
    ],
)  # fmt: skip
def test_malformed_library_matmuls_are_located_errors(op: str, message: str) -> None:
    with pytest.raises(IrcError, match="loop.library_matmul") as e:
        verify(irc.parse(HEAD + f"  loop.library_matmul {op}\n" + TAIL))
    assert message in str(e.value)
    (d,) = e.value.diagnostics
    assert d.location is not None and (d.location.line, d.location.column) == (3, 3)


def test_f64_and_kernel_nested_library_matmuls_are_refused() -> None:
    f64 = (
        HEAD.replace("bf16", "f64")
        + (
            "  loop.library_matmul %x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 24],"
            " k = 20}\n"
        )
        + TAIL.replace("bf16", "f64")
    )
    with pytest.raises(IrcError, match="operands and output are bf16, f16 or f32"):
        verify(irc.parse(f64))
    nested = (
        HEAD
        + """  loop.kernel {name = "k_0", bounds = [2]} (%i: index) {
    loop.library_matmul %x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 24], k = 20}
  }
"""
        + TAIL
    )
    with pytest.raises(IrcError, match="runs on the host"):
        verify(irc.parse(nested))


def test_library_gemm_pass_names_kernels_it_cannot_take(tmp_path: Path) -> None:
    from irc.testing.cli import run_opt

    pipeline = f"{UP_TO_CHOICE},library-gemm{{kernels=mm_fused_matmul_add_gelu_0}}"
    status, _, err = run_opt(tmp_path, gemm_text(40, 48, 64, "f64"), "-p", pipeline)
    assert status == 1 and "is not a GEMM the library runs" in err
    pipeline = f"{UP_TO_CHOICE},library-gemm{{kernels=nothing_0}}"
    status, _, err = run_opt(tmp_path, gemm_text(40, 48, 64, "f32"), "-p", pipeline)
    assert status == 1 and "no kernel is named" in err and "Traceback" not in err
    status, out, _ = run_opt(tmp_path, gemm_text(40, 48, 64, "bf16"), "-p",
                             f"{UP_TO_CHOICE},library-gemm")  # fmt: skip
    assert status == 0 and "loop.library_matmul" in out


def test_compile_checks_its_library_option() -> None:
    with pytest.raises(ValueError, match="library_gemm is one of"):
        irc.compile(irc.parse(gemm_text(8, 8, 8, "bf16")), device="cpu", library_gemm="yes")


@pytest.mark.gpu
def test_the_measured_choice_on_a_gpu_is_recorded_and_right(tmp_path: Path) -> None:
    """A GEMM the library ran faster on an H200 (2048x8192 @ 8192x1536 f16 + GELU:
    78 us against irc's 92): whichever it picks, the decision is cached, a library
    GEMM says why, and the result matches torch."""
    os.environ["IRC_CACHE_DIR"] = str(tmp_path)
    try:
        compiled = irc.compile(irc.parse(gemm_text(2048, 1536, 8192, "f16")), device="cuda")
    finally:
        del os.environ["IRC_CACHE_DIR"]
    decisions = [v for v in json.loads((tmp_path / "autotune.json").read_text()).values()]
    assert [d["library"] for d in decisions if "library_ms" in d] in ([True], [False])
    assert ("_library_matmul(" in compiled.source) == ("# measured:" in compiled.source)
    x, w, b, mm = gemm_inputs(2048, 1536, 8192, "f16")
    got = compiled["f"](x.cuda(), w.cuda(), b.cuda()).cpu()
    assert_close(got, F.gelu(mm + b))


@pytest.mark.gpu
def test_f32_library_gemms_stay_f32_where_the_process_allows_tf32() -> None:
    compiled = irc.compile(
        irc.parse(gemm_text(256, 256, 1024, "f32", act="relu")),
        device="cuda",
        library_gemm="always",
    )
    g = torch.Generator().manual_seed(11)
    x, w, b = (torch.randn(s, generator=g) for s in ((256, 1024), (1024, 256), (256,)))
    want = torch.relu(x.double() @ w.double() + b.double())
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        got = compiled["f"](x.cuda(), w.cuda(), b.cuda()).cpu().double()
        assert torch.backends.cuda.matmul.allow_tf32  # put back
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    # TF32 (10 bits of mantissa) would be ~1e-2 off at K = 1024; f32 is ~1e-5.
    assert (got - want).abs().max().item() < 1e-3


def test_a_reason_cannot_inject_code_into_the_generated_module() -> None:
    """`reason` is the IR's string: a newline in it must not end the comment."""
    text = """func @g(%x: memref<30x24xbf16>, %w: memref<24x24xbf16>) -> memref<30x24xbf16> {
  %0 = loop.alloc : memref<30x24xbf16>
  loop.library_matmul %x, %w, %0 {a_dims = [0, -1], b_dims = [-1, 1], sizes = [30, 24], k = 24, reason = "x\\nraise SystemExit(3)"}
  return %0 : memref<30x24xbf16>
}
"""
    compiled = irc.compile(irc.parse(text), device="cpu")
    assert "\nraise SystemExit" not in compiled.source
    x = torch.ones(30, 24, dtype=torch.bfloat16)
    assert_close(compiled["g"](x, torch.eye(24, dtype=torch.bfloat16)), x)


def test_the_epilogue_takes_a_name_no_kernel_has() -> None:
    """`mm_a`'s epilogue would be `poi_a`; hand-written IR has a `poi_a` already. The
    parsed values are named `%3` as printed, which xDSL's name setter refuses: the
    move runs with names it accepts (`names_xdsl_accepts`), also in `irc.compile`."""
    text = print_module(loop_module(gemm_text(16, 16, 16, "bf16")))  # type: ignore[arg-type]
    text = (
        text.replace('"mm_fused_matmul_add_gelu_0"', '"mm_a"')
        + """
func @h(%x: memref<8xf32>) -> memref<8xf32> {
  %y = loop.alloc : memref<8xf32>
  loop.kernel {name = "poi_a", bounds = [8]} (%i: index) {
    %v = loop.load %x, %i : f32
    loop.store %v, %y, %i
  }
  return %y : memref<8xf32>
}
"""
    )
    module = irc.parse(text)
    move_every_gemm(module)  # type: ignore[arg-type]
    verify(module)  # type: ignore[arg-type]
    assert [k.kernel_name.data for k in loop.kernels(module)] == ["poi_a_", "poi_a"]  # type: ignore[arg-type]
    compiled = irc.compile(irc.parse(text), device="cpu", library_gemm="always")
    x, w, b, mm = gemm_inputs(16, 16, 16, "bf16")
    assert_close(compiled["f"](x, w, b), F.gelu(mm + b))
