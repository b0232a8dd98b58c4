"""Persistent GEMMs: one program an SM walks the output tiles; TMA for row-major operands.

The tile heuristic picks this layout for large unbatched half-precision
matmuls; here it is also forced on small shapes (with small blocks, so that
every program walks several tiles and edge tiles are partial) and checked
against torch on the CPU interpreter, which runs TMA descriptors too.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

import irc
from irc.autotune import candidates
from irc.compiler import CompiledModule
from irc.dialects import loop, tile
from irc.passes.tile import (
    SHARED_BYTES,
    KernelShape,
    Tiling,
    choose_tiling,
    gemm_fits,
    kernel_shape,
    tiling_of,
)
from irc.pipeline import run_pipeline
from irc.runtime.launch import persistent_grid
from irc.syntax.printer import print_module
from irc.testing.forced_tiling import compile_with_tiling
from irc.testing.programs import gemm_text

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def relu_gemm(m: int, n: int, k: int, el: str, both: bool = False) -> str:
    """matmul + bias + relu (no transcendental: persistent where it fits); `both`
    also returns the matmul (a second epilogue store)."""
    return gemm_text(m, n, k, el, act="relu", returns_product=both)


def lower(text: str, tiling: Tiling | None) -> tuple[CompiledModule, object]:
    """Fuses and lowers `text`, with `tiling` forced on every kernel when given."""
    return compile_with_tiling(text, tiling, DEVICE)


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """torch's semantics: the product accumulates in f32 and rounds once to the dtype."""
    mm = (x.float() @ w.float()).to(x.dtype)
    return mm, torch.relu(mm + b)


def inputs(m: int, n: int, k: int, el: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dt = TORCH[el]
    # Integer-valued operands: every product and partial sum is exact in f32, so the
    # result does not depend on the order in which tiles accumulate.
    x = torch.randint(-4, 5, (m, k), generator=g).to(dt)
    w = torch.randint(-4, 5, (k, n), generator=g).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    return [t.to(DEVICE) for t in (x, w, b)]


def test_heuristic_makes_large_half_gemms_persistent() -> None:
    assert choose_tiling(KernelShape("contraction", (4096, 4096), (4096,), True)).persistent
    # Batched, small or f32 GEMMs keep one program a tile.
    assert not choose_tiling(KernelShape("contraction", (4, 4096, 4096), (4096,), True)).persistent
    assert not choose_tiling(KernelShape("contraction", (64, 64), (64,), True)).persistent
    assert not choose_tiling(KernelShape("contraction", (4096, 4096), (4096,), False)).persistent


def test_gemm_tiles_follow_wave_quantization_over_the_sms() -> None:
    """8192x768 outputs: 192 tiles of 128x256 are 1.45 rounds on 132 SMs (half the
    second idle), 384 of 128x128 are 2.9: the smaller tile wins. With 192 SMs the
    big tiles are one round and win; 8192x2304 outputs take them on 132 SMs."""
    narrow = KernelShape("contraction", (8192, 768), (3072,), True, element_bytes=2)
    assert choose_tiling(narrow) == Tiling((128, 128, 64), 8, 4, persistent=True)
    assert choose_tiling(narrow, sms=192).block == (128, 256, 64)
    wide = KernelShape("contraction", (8192, 2304), (768,), True, element_bytes=2)
    assert choose_tiling(wide) == Tiling((128, 256, 64), 8, 3, persistent=True)
    # A tiny product: one 128x128 tile would be mostly padding; the small tiles win.
    assert choose_tiling(KernelShape("contraction", (48, 40), (24,), True)).block == (64, 64, 32)


def test_autotune_tries_both_layouts() -> None:
    found = candidates(KernelShape("contraction", (4096, 4096), (4096,), True))
    assert any(t.persistent for t in found) and any(not t.persistent for t in found)
    assert not any(
        t.persistent for t in candidates(KernelShape("contraction", (2, 4096, 4096), (4096,), True))
    )


def test_tile_ir_shape_and_round_trip() -> None:
    _, module = lower(relu_gemm(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    (kernel,) = [op for op in module.body.ops if isinstance(op, tile.KernelOp)]
    assert kernel.persistent is not None and kernel.persistent.value.data == 1
    (tiles,) = [op for op in kernel.walk() if isinstance(op, tile.TilesOp)]
    assert tiles.count.value.data == 3 * 2
    assert sum(isinstance(op, tile.BlockLoadOp) for op in kernel.walk()) == 2
    assert sum(isinstance(op, tile.BlockStoreOp) for op in kernel.walk()) == 1
    text = print_module(module)
    again = irc.parse(text, "tile.ir")
    irc.verify(again)
    assert print_module(again) == text


@pytest.mark.parametrize(
    ("m", "n", "k", "el"),
    [
        (96, 64, 48, "bf16"),  # whole tiles, TMA for A, B and the output
        (70, 56, 40, "bf16"),  # partial tiles along M and K (TMA pads with zeros, clips stores)
        (50, 36, 24, "f16"),  # N * 2 bytes is not a multiple of 16: B and C through pointers
        (40, 40, 20, "f16"),  # K * 2 bytes is not a multiple of 16: A through pointers
    ],
)
def test_persistent_gemm_matches_torch(m: int, n: int, k: int, el: str) -> None:
    compiled, _ = lower(relu_gemm(m, n, k, el, both=True), Tiling((32, 32, 16), 4, 2, True))
    x, w, b = inputs(m, n, k, el)
    mm, r = compiled["f"](x, w, b)
    want_mm, want_r = reference(x, w, b)
    assert_close(mm, want_mm)
    assert_close(r, want_r)


def linear_text(m: int, n: int, k: int, el: str, a_transposed: bool = False) -> str:
    """x @ w.T + b with w stored [N, K] (nn.Linear); `a_transposed`: x stored [K, M] too."""
    a_type = f"tensor<{k}x{m}x{el}>" if a_transposed else f"tensor<{m}x{k}x{el}>"
    a = "  %xa = graph.transpose %x {perm = [1, 0]}\n" if a_transposed else ""
    x = "%xa" if a_transposed else "%x"
    return f"""func @f(%x: {a_type}, %w: tensor<{n}x{k}x{el}>, %b: tensor<{n}x{el}>) -> tensor<{m}x{n}x{el}> {{
{a}  %wt = graph.transpose %w {{perm = [1, 0]}}
  %mm = graph.matmul {x}, %wt
  %r = graph.add %mm, %b
  return %r : tensor<{m}x{n}x{el}>
}}
"""


@pytest.mark.parametrize(
    ("m", "n", "k", "el", "a_transposed"),
    [
        (96, 64, 48, "bf16", False),  # nn.Linear: w is [N, K]
        (70, 56, 40, "f16", False),  # partial tiles along M, N and K
        (96, 64, 48, "bf16", True),  # both operands stored the other way round
        (64, 48, 32, "f32", False),  # split-TF32 products of the transposed operand
    ],
)
def test_an_operand_stored_transposed_is_a_transposed_tma_box(
    m: int, n: int, k: int, el: str, a_transposed: bool
) -> None:
    """A weight stored [N, K] is read by TMA in [BN, BK] boxes and transposed for the
    dot (tl.trans), not through pointer loads of each element."""
    compiled, module = lower(linear_text(m, n, k, el, a_transposed), Tiling((32, 32, 16), 4, 2, True))
    loads = [op for op in module.walk() if isinstance(op, tile.BlockLoadOp)]
    assert [op.transposed is not None for op in loads] == [a_transposed, True]
    weight = loads[1]
    assert weight.box() == (32, 16) and [d.value.data for d in weight.shape.data] == [n, k]
    assert compiled.source.count("tl.trans(d") == 1 + a_transposed
    assert re.search(rf"shape=\[{n}, {k}\], strides=\[{k}, 1\], block_shape=\[32, 16\]", compiled.source)
    text = print_module(module)
    assert "transposed = 1" in text and print_module(irc.parse(text, "tile.ir")) == text
    g = torch.Generator().manual_seed(4)
    dt = TORCH[el]
    x = torch.randint(-4, 5, (k, m) if a_transposed else (m, k), generator=g).to(dt)
    w = torch.randint(-4, 5, (n, k), generator=g).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    got = compiled["f"](x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))
    xm = x.T if a_transposed else x
    want = (xm.double() @ w.double().T).to(dt) + b
    assert_close(got.cpu(), want)


def test_a_transposed_flag_is_zero_or_one() -> None:
    _, module = lower(linear_text(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    text = print_module(module).replace("transposed = 1", "transposed = 2")
    with pytest.raises(Exception, match="transposed"):
        irc.verify(irc.parse(text, "tile.ir"))


def test_tma_use_follows_alignment() -> None:
    aligned, _ = lower(relu_gemm(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    assert aligned.source.count("tl.make_tensor_descriptor(") == 3
    assert "_persistent_grid(6)" in aligned.source and "_ensure_allocator()" in aligned.source
    odd, _ = lower(relu_gemm(50, 36, 24, "f16"), Tiling((32, 32, 16), 4, 2, True))
    assert odd.source.count("tl.make_tensor_descriptor(") == 1  # A only
    plain, _ = lower(relu_gemm(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, False))
    assert "make_tensor_descriptor" not in plain.source and "tl.range" not in plain.source


@pytest.mark.parametrize(
    ("tiles", "sms", "programs"),
    [
        (512, 132, 128),  # 4 rounds either way: 128 programs of 4 tiles, none idle in the last
        (288, 132, 96),  # 3 rounds: 96 programs of 3
        (1152, 132, 128),  # 9 rounds
        (264, 132, 132),  # already even
        (100, 132, 100),  # fewer tiles than SMs: one a program
        (133, 132, 67),  # 2 rounds: 66 programs of 2 and one of 1
        (7, 3, 3),
    ],
)
def test_persistent_grid_is_the_fewest_programs_for_the_fewest_rounds(
    tiles: int, sms: int, programs: int
) -> None:
    (got,) = persistent_grid(tiles, sms)
    assert got == programs
    assert -(-tiles // got) == -(-tiles // min(tiles, sms))  # no more rounds than one an SM


def test_misaligned_view_is_copied_to_an_aligned_buffer() -> None:
    m, n, k = 96, 64, 48
    compiled, _ = lower(relu_gemm(m, n, k, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    x, w, b = inputs(m, n, k, "bf16", seed=1)
    storage = torch.empty(m * k + 1, dtype=x.dtype, device=x.device)
    view = storage[1:].view(m, k)  # starts 2 bytes into its storage
    view.copy_(x)
    assert view.data_ptr() % 16
    (got,) = compiled.run("f", [view, w, b])
    assert_close(got, reference(x, w, b)[1])


def test_default_pipeline_on_a_large_bf16_gemm() -> None:
    """The heuristic's own choice (128x256x64, persistent) through irc.compile."""
    m, n, k = 2048, 2048, 64
    compiled = irc.compile(irc.parse(relu_gemm(m, n, k, "bf16"), "gemm.ir"), device=DEVICE)
    assert "_persistent_grid(128)" in compiled.source
    x, w, b = inputs(m, n, k, "bf16", seed=2)
    assert_close(compiled["f"](x, w, b), reference(x, w, b)[1])


def _tile_text() -> str:
    _, module = lower(relu_gemm(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    return print_module(module)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("{shape = [96, 48]}", "{shape = [96]}", "tile.block_load: 'shape' is the buffer's two sizes"),
        (
            "{shape = [96, 64]}",
            "{shape = [96, 64, 1]}",
            "tile.block_store: 'shape' is the buffer's two sizes",
        ),
    ],
)
def test_block_access_verifier(old: str, new: str, message: str) -> None:
    text = _tile_text()
    assert old in text
    with pytest.raises(irc.IrcError, match=re.escape(message)) as info:
        irc.verify(irc.parse(text.replace(old, new, 1), "bad.ir"))
    (diag,) = info.value.diagnostics
    assert diag.location is not None and diag.location.file == "bad.ir"
    line = text.replace(old, new, 1).splitlines()[diag.location.line - 1]
    assert new in line  # the error points at the broken op


def test_tiles_loop_verifier() -> None:
    text = _tile_text()
    header = re.search(r"tile\.tiles \{count = 6\} \((%\d+): i32, (%\d+): i32\)", text)
    assert header is not None
    one_arg = text.replace(header.group(0), f"tile.tiles {{count = 6}} ({header.group(1)}: i32)")
    one_arg = one_arg.replace(header.group(2), header.group(1))
    with pytest.raises(irc.IrcError, match="tile.tiles: the region takes the tile index, twice"):
        irc.verify(irc.parse(one_arg, "bad.ir"))


def test_load_eviction_hint_verifier() -> None:
    module = irc.parse(
        "func @f(%x: tensor<64xf32>) -> tensor<64xf32> {\n"
        "  %y = graph.exp %x\n"
        "  return %y : tensor<64xf32>\n}\n",
        "f.ir",
    )
    run_pipeline(module, "graph-to-loop,tile,loop-to-tile")
    text = print_module(module)
    assert '{evict = "last"}' in text  # element-wise loads ask L2 to keep their lines
    with pytest.raises(irc.IrcError, match='tile.load: evict is "first" or "last"'):
        irc.verify(irc.parse(text.replace('evict = "last"', 'evict = "sometimes"'), "bad.ir"))


def test_tma_scratch_allocator_is_installed_unless_the_program_has_one() -> None:
    import triton
    from triton.runtime import _allocation

    compiled, _ = lower(relu_gemm(96, 64, 48, "bf16"), Tiling((32, 32, 16), 4, 2, True))
    args = inputs(96, 64, 48, "bf16")
    before = _allocation._allocator.get()
    try:
        triton.set_allocator(_allocation._NULL_ALLOCATOR)
        compiled["f"](*args)
        installed = _allocation._allocator.get()
        assert installed is not _allocation._NULL_ALLOCATOR  # irc's scratch allocator
        scratch = installed(128, 16, None)
        assert scratch.numel() == 128 and scratch.device.type == DEVICE

        def mine(size: int, alignment: int, stream: object) -> torch.Tensor:
            return torch.empty(size, dtype=torch.int8, device=DEVICE)

        triton.set_allocator(mine)
        compiled["f"](*args)
        assert _allocation._allocator.get() is mine
    finally:
        triton.set_allocator(before)


def test_big_gemm_tiles_fit_shared_memory() -> None:
    """K steps shrink when the operands are loaded wider than they are multiplied
    (an f32 activation cast to bf16 inside the GEMM's kernel): three stages of
    128x256x64 f32 tiles and the output tile need 361 KB, over an H100's 227 KB."""
    from irc.passes.tile import SHARED_BYTES, gemm_shared_bytes

    half = choose_tiling(KernelShape("contraction", (4096, 4096), (4096,), True, element_bytes=2))
    wide = choose_tiling(KernelShape("contraction", (4096, 4096), (4096,), True, element_bytes=4))
    assert half.block == (128, 256, 64) and wide.block == (128, 256, 32)
    for t, size in ((half, 2), (wide, 4)):
        assert gemm_shared_bytes(*t.block, t.stages, size) <= SHARED_BYTES
    assert gemm_shared_bytes(128, 256, 64, 3, 4) > SHARED_BYTES


def test_gemm_of_a_cast_operand_reads_the_cast_values() -> None:
    """A cast operand is materialized by its own kernel (no computed GEMM prologue):
    the GEMM streams bf16 operands, 2 bytes an element, not the f32 it was cast from."""
    text = """func @f(%x: tensor<1024x256xf32>, %w: tensor<256x1024xbf16>) -> tensor<1024x1024xbf16> {
  %xb = graph.cast %x : tensor<1024x256xbf16>
  %y = graph.matmul %xb, %w : tensor<1024x1024xbf16>
  return %y : tensor<1024x1024xbf16>
}"""
    module = irc.parse(text, "cast_gemm.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    kernels = loop.kernels(module)
    assert [loop.kernel_kind(k) for k in kernels] == ["pointwise", "contraction"]
    assert kernel_shape(kernels[1]).element_bytes == 2


def test_gemm_with_a_full_size_epilogue_operand_runs_a_program_a_tile() -> None:
    """A SwiGLU's `gate * (x @ w)`: the epilogue's full-size operand is staged in
    shared memory too (245,760 bytes for 128x256 tiles at K steps of 64 in a
    persistent program on an H100, over its limit). A program a tile frees the
    K loop's buffers before its epilogue: 128x256 tiles at K steps of 64 fit
    there (61 us on the Llama block's SwiGLU, against 66 us for the persistent
    128x128 tiles that fit)."""
    text = """func @f(%x: tensor<4096x256xbf16>, %w: tensor<256x4096xbf16>, %g: tensor<4096x4096xbf16>, %b: tensor<4096xbf16>) -> tensor<4096x4096xbf16> {
  %y = graph.matmul %x, %w : tensor<4096x4096xbf16>
  %z = graph.mul %y, %g : tensor<4096x4096xbf16>
  %o = graph.add %z, %b : tensor<4096x4096xbf16>
  return %o : tensor<4096x4096xbf16>
}"""
    module = irc.parse(text, "swiglu.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    (kernel,) = loop.kernels(module)
    assert list(loop.int_list(kernel.block)) == [128, 256, 64]
    assert not tiling_of(kernel).persistent
    assert kernel_shape(kernel).epilogue_bytes == 4  # the bf16 output and the bf16 gate
    assert not gemm_fits(replace(tiling_of(kernel), persistent=True), kernel_shape(kernel), SHARED_BYTES)
    # A bias vector is no tile: mm_bias_relu keeps its K steps of 64.
    shape = KernelShape("contraction", (4096, 4096), (4096,), True, element_bytes=2)
    assert choose_tiling(shape).block == (128, 256, 64)


def test_gemm_whose_big_tiles_never_fit_takes_smaller_ones() -> None:
    """f32 operands and two full-size epilogue operands overflow shared memory at
    every K step of 128x256 tiles: the kernel gets a tiling that fits."""
    from irc.passes.tile import SHARED_BYTES, gemm_shared_bytes

    shape = KernelShape(
        "contraction", (2048, 1536), (1000,), True, element_bytes=4, epilogue_bytes=6
    )
    assert gemm_shared_bytes(128, 256, 16, 3, 4, 6) > SHARED_BYTES
    t = choose_tiling(shape)
    assert gemm_fits(t, shape, SHARED_BYTES)


RESIDUAL_TEXT = """func @f(%x: tensor<MxKxbf16>, %a: tensor<MxKxbf16>, %w: tensor<KxKxbf16>) -> (tensor<MxKxbf16>, tensor<MxKxf32>) {
  %y = graph.matmul %a, %w : tensor<MxKxbf16>
  %h = graph.add %x, %y : tensor<MxKxbf16>
  %f = graph.cast %h : tensor<MxKxf32>
  %q = graph.mul %f, %f : tensor<MxKxf32>
  return %h, %q : tensor<MxKxbf16>, tensor<MxKxf32>
}"""


def residual_kernel(m: int, k: int) -> loop.KernelOp:
    """A Llama block's `h = x + a @ wo` that also stores `float(h)**2` (the next RMS
    norm's input): bf16 and f32 outputs and a bf16 operand, 8 bytes an output element."""
    module = irc.parse(RESIDUAL_TEXT.replace("M", str(m)).replace("K", str(k)), "residual.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    (kernel,) = loop.kernels(module)
    return kernel


def test_gemm_storing_two_outputs_counts_both_in_shared_memory() -> None:
    """128x128 tiles of 4 stages at K steps of 64 with the whole epilogue staged
    needed 262,144 bytes on an H100 (Triton's OutOfResources, over 232,448). A
    persistent program's TMA stores stage half the tile at a time (`tile.block_store`):
    2 + (2 + 4) / 2 bytes an element, which fits at K = 2048."""
    from irc.passes.tile import SHARED_BYTES, gemm_shared_bytes

    kernel = residual_kernel(4096, 2048)
    shape = kernel_shape(kernel)
    assert shape.epilogue_bytes == 2 + 4 + 2 and shape.tma_stored_bytes == 2 + 4
    assert gemm_shared_bytes(128, 128, 64, 4, 2, shape.epilogue_bytes) == 262144
    t = tiling_of(kernel)
    assert t.block == (128, 128, 64) and t.stages == 4 and t.persistent
    assert gemm_fits(t, shape, SHARED_BYTES)
    # Were the stores staged whole, the persistent tiling would not fit.
    assert not gemm_fits(t, replace(shape, tma_stored_bytes=0), SHARED_BYTES)


def test_gemm_whose_epilogue_stages_many_bytes_at_short_k_runs_a_program_a_tile() -> None:
    """`EPILOGUE_BYTE_K`: the same residual GEMM (6 bytes an element past its output
    weigh 1200 of K) ran a program a tile faster at K = 768 and 1024 on an H100,
    persistent at K = 1536."""
    for m, k in ((8192, 768), (3000, 1024)):
        t = tiling_of(residual_kernel(m, k))
        assert t.block == (128, 128, 64) and not t.persistent, (m, k)
    assert tiling_of(residual_kernel(8192, 1536)).persistent


def test_a_block_store_is_written_in_two_column_halves() -> None:
    """A 128x128 bf16 output tile goes out as two TMA stores of 128x64 boxes; a
    128x256 one, whose epilogue runs on column halves (`tile.column_part`), as one
    TMA store of a 128x128 box a half."""
    compiled, _ = lower(relu_gemm(8192, 768, 3072, "bf16"), None)
    source = compiled.source
    stores = re.findall(r"(d\d+)\.store\(\[(v\d+), (v\d+)( \+ 64)?\], (v\d+)\)", source)
    assert len(stores) == 2 and stores[0][:3] == stores[1][:3] and stores[1][3] == " + 64"
    (descriptor,) = {s[0] for s in stores}
    assert re.search(descriptor + r" = tl.make_tensor_descriptor\(ptr\d, shape=\[8192, 768\], strides=\[768, 1\], block_shape=\[128, 64\]\)", source)
    assert "tl.split(" in source
    wide, _ = lower(relu_gemm(8192, 2304, 768, "bf16"), None)
    stores = re.findall(r"(d\d+)\.store\(\[(v\d+), (v\d+)\], (v\d+)\)", wide.source)
    assert len(stores) == 2 and stores[0][1] == stores[1][1] and stores[0][2] != stores[1][2]
    (descriptor,) = {s[0] for s in stores}
    assert re.search(descriptor + r" = tl.make_tensor_descriptor\(ptr\d, shape=\[8192, 2304\], strides=\[2304, 1\], block_shape=\[128, 128\]\)", wide.source)


def test_gemm_whose_epilogue_computes_transcendentals_runs_a_program_a_tile() -> None:
    """GEMM + GELU (or SiLU) at K = 256: a program a tile, persistent from above
    (`EPILOGUE_K`: on an H200 persistent was 10-14% faster at K = 256-768 with
    outputs stored by TMA, 1.4-2x with operands padded for it)."""
    text = """func @f(%x: tensor<4096x256xbf16>, %w: tensor<256x3072xbf16>) -> tensor<4096x3072xbf16> {
  %y = graph.matmul %x, %w : tensor<4096x3072xbf16>
  %g = graph.gelu %y {approximate = "tanh"} : tensor<4096x3072xbf16>
  return %g : tensor<4096x3072xbf16>
}"""
    module = irc.parse(text, "gelu.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    (kernel,) = loop.kernels(module)
    assert kernel_shape(kernel).transcendentals == 1
    assert tiling_of(kernel).block == (128, 256, 64) and not tiling_of(kernel).persistent
    plain = KernelShape("contraction", (4096, 3072), (256,), True, element_bytes=2)
    assert choose_tiling(plain).persistent
    # A longer K loop outweighs the epilogue: GEMM + GELU from K = 257 is persistent,
    # two transcendental functions an element from K = 513.
    for k, functions, persistent in ((257, 1, True), (768, 1, True), (512, 2, False), (513, 2, True)):
        shape = KernelShape(
            "contraction", (4096, 4096), (k,), True, element_bytes=2, transcendentals=functions
        )
        assert choose_tiling(shape).persistent == persistent, (k, functions)
