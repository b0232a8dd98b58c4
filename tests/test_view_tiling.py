"""Views, permutes and element-wise tiling (issue 16): a reshape's accesses are
the flat index Triton sees as contiguous, element-wise programs move the bytes
the GPU model asks for whatever the element size, and a reduction whose streamed
operand every row reads shares it between the rows of a program.

Structure is read from the tile IR at the sizes the layout suite measures (no
kernel runs); results are checked against torch in Triton's interpreter at
small, odd sizes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.testing import assert_close
from xdsl.ir import SSAValue

import irc
from irc.compiler import lower_to_tile, triton_source
from irc.dialects import loop, tile
from irc.passes.tile import Tiling, kernel_shape, tiling_of
from irc.pipeline import AFTER_TILING, run_pipeline
from irc.runtime.loader import load_source
from irc.target import Target
from irc.testing.programs import cos_reshape_cos
from irc.testing.programs import tensor_type as t
from irc.testing.verdict import judge

H100 = Target(512, 2, 16, "an H100's tiling (irc.target.target_for)", 132)


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IRC_CACHE_DIR", str(tmp_path_factory.mktemp("irc-cache")))
        yield


def reshape_output(b: int, n: int, m: int, el: str = "f32") -> str:
    full, out = t((b, n, m), el), t((b * n, m), el)
    return f"""func @f(%x: {full}, %w: {t((m,), el)}) -> {out} {{
  %a = graph.mul %x, %w : {full}
  %r = graph.relu %a : {full}
  %y = graph.reshape %r : {out}
  return %y : {out}
}}
"""


def split_heads(b: int, s: int, h: int, d: int, el: str = "f32") -> str:
    """[B, S, H*D] -> [B, S, H, D] -> [B, H, S, D]: a reshape, then a permute, plus a
    value in the permuted order (which keeps the permute in the kernel: `exp(p)` alone
    would move it to the return, `sink_transposes`)."""
    src, mid, dst = t((b, s, h * d), el), t((b, s, h, d), el), t((b, h, s, d), el)
    return f"""func @f(%x: {src}, %y: {dst}) -> {dst} {{
  %r = graph.reshape %x : {mid}
  %p = graph.transpose %r {{perm = [0, 2, 1, 3]}} : {dst}
  %e = graph.exp %p : {dst}
  %z = graph.add %e, %y : {dst}
  return %z : {dst}
}}
"""


def tiled(text: str, target: Target = H100) -> irc.ModuleOp:  # type: ignore[name-defined]
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    lower_to_tile(module, target=target)
    return module


def only_kernel(module: object) -> tile.KernelOp:
    (k,) = [k for k in module.walk() if isinstance(k, tile.KernelOp)]  # type: ignore[attr-defined]
    return k


def unit_stride(v: SSAValue) -> bool:
    """The offsets `v` step by one element along the block: an arange reaches them
    through adds only (no digit of a flat index, which Triton cannot see through)."""
    op = v.owner
    if isinstance(op, tile.ArangeOp):
        return True
    if isinstance(op, tile.ApplyOp) and op.fn.data in ("add", "cast"):
        return any(unit_stride(a) for a in op.args)
    return False


def run_against_torch(text: str, want: object, *shapes: tuple[int, ...], el: str = "f32") -> None:
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[el]
    torch.manual_seed(0)
    args = [torch.randn(*s).to(dtype) for s in shapes]
    (got,) = irc.compile(irc.parse(text, "t.ir"), device="cpu").run("f", args)
    expected = want(*args)  # type: ignore[operator]
    assert got.shape == expected.shape
    tol = 1e-5 if el == "f32" else 1e-2
    assert_close(got, expected, rtol=tol, atol=tol)


# --- a reshape's accesses are the flat index -------------------------------------------


@pytest.mark.parametrize("el", ["f32", "bf16"])
def test_a_reshaped_output_is_stored_at_the_flat_index(el: str) -> None:
    """[B,S,H] -> [B*S,H] at the suite's odd size: the store (and the load of the
    input) are at the program's flat index, not at `(x // S*H) * S*H + ...`, which
    Triton cannot prove contiguous and stores element by element."""
    k = only_kernel(tiled(reshape_output(3, 4099, 1001, el)))
    (store,) = [op for op in k.walk() if isinstance(op, tile.StoreOp)]
    assert unit_stride(store.offsets)
    loads = [op for op in k.walk() if isinstance(op, tile.LoadOp)]
    assert sorted(unit_stride(op.offsets) for op in loads) == [False, True]  # x, then w[x % m]
    assert next(op for op in loads if unit_stride(op.offsets)).offsets is store.offsets


def test_a_reshaped_input_is_loaded_at_the_flat_index() -> None:
    """cos -> reshape -> cos: the [N*M] input is read at `i * M + j` of the [N, M]
    loop, which is the flat index itself."""
    k = only_kernel(tiled(cos_reshape_cos(3001, 4097, "bf16")))
    (store,) = [op for op in k.walk() if isinstance(op, tile.StoreOp)]
    loads = [op for op in k.walk() if isinstance(op, tile.LoadOp)]
    assert [op.offsets is store.offsets for op in loads] == [True, False]


def test_a_permute_keeps_its_digits() -> None:
    """A reshape folded into a permute's read: the load is not at the flat index
    (the head and sequence digits swap places), the store is."""
    k = only_kernel(tiled(split_heads(2, 33, 3, 40)))
    (store,) = [op for op in k.walk() if isinstance(op, tile.StoreOp)]
    load, in_order = [op for op in k.walk() if isinstance(op, tile.LoadOp)]
    assert unit_stride(store.offsets) and unit_stride(in_order.offsets)
    assert not unit_stride(load.offsets)


@pytest.mark.parametrize("el", ["f32", "bf16"])
def test_reshapes_match_torch_at_odd_sizes(el: str) -> None:
    run_against_torch(
        reshape_output(3, 7, 33, el),
        lambda x, w: torch.relu(x * w).flatten(0, 1),
        (3, 7, 33), (33,), el=el,
    )  # fmt: skip
    run_against_torch(
        cos_reshape_cos(9, 31, el),
        lambda x, w: x.cos().reshape(9, 31).cos() * w,
        (9 * 31,), (31,), el=el,
    )  # fmt: skip


def test_split_heads_matches_torch() -> None:
    run_against_torch(
        split_heads(2, 33, 3, 40),
        lambda x, y: x.reshape(2, 33, 3, 40).permute(0, 2, 1, 3).exp() + y,
        (2, 33, 120), (2, 3, 33, 40),
    )  # fmt: skip


# --- element-wise programs: the target's bytes in flight --------------------------------

H200 = Target(reason="an H200's tiling (irc.target.target_for)")


def permute_scale(b: int, s: int, h: int, d: int, el: str) -> str:
    src, dst = t((b, s, h, d), el), t((b, h, s, d), el)
    return f"""func @f(%x: {src}) -> {dst} {{
  %p = graph.transpose %x {{perm = [0, 2, 1, 3]}} : {dst}
  %c = graph.constant {{value = 0.125}} : {t((), el)}
  %y = graph.mul %p, %c : {dst}
  return %y : {dst}
}}
"""


def add_relu(n: int, m: int, el: str) -> str:
    return f"""func @f(%x: {t((n, m), el)}, %y: {t((n, m), el)}) -> {t((n, m), el)} {{
  %a = graph.add %x, %y : {t((n, m), el)}
  %r = graph.relu %a : {t((n, m), el)}
  return %r : {t((n, m), el)}
}}
"""


def loop_tilings(text: str, target: Target) -> list[Tiling]:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop," + target.split_pass())
    run_pipeline(module, target.tile_pass())
    return [tiling_of(k) for k in loop.kernels(module)]


@pytest.mark.parametrize(
    ("text", "target", "tiling"),
    [
        # Two f32 operands: the target's own tiling (what it was measured on).
        (add_relu(8192, 8192, "f32"), H100, Tiling((512,), 8)),
        (add_relu(8192, 8192, "f32"), H200, Tiling((1024,), 4)),
        # One operand: twice the elements; bf16 twice again (16-byte vectors).
        (permute_scale(3, 1023, 17, 96, "f32"), H100, Tiling((1024,), 8)),
        (permute_scale(16, 1024, 32, 128, "bf16"), H100, Tiling((2048,), 8)),
        (permute_scale(16, 1024, 32, 128, "bf16"), H200, Tiling((2048,), 4)),
        (add_relu(8192, 8192, "bf16"), H100, Tiling((1024,), 8)),
        # Two cosines a 4-byte element: compute-bound, twice the elements.
        (cos_reshape_cos(8192, 8192), H100, Tiling((2048,), 8)),
        # A count no vector divides (odd; 2 mod 4 f32; 2 or 4 mod 8 bf16): the last
        # program is peeled (tests/test_partial_program.py), and the others make
        # 16-byte accesses, so the tiling is that of a whole count.
        (reshape_output(3, 4099, 1001, "bf16"), H100, Tiling((2048,), 8)),
        (cos_reshape_cos(3001, 4097, "bf16"), H100, Tiling((2048,), 8)),
        (cos_reshape_cos(3001, 4097, "f32"), H200, Tiling((1024,), 4)),
        (cos_reshape_cos(12217, 12746, "f32"), H200, Tiling((1024,), 4)),
        (cos_reshape_cos(12217, 12746, "f32"), H100, Tiling((2048,), 8)),
        (cos_reshape_cos(3001, 4098, "bf16"), H100, Tiling((2048,), 8)),
        (reshape_output(3, 4099, 1004, "bf16"), H100, Tiling((2048,), 8)),
    ],
    ids=[
        "two-f32-h100", "two-f32-h200", "permute-f32", "permute-bf16-h100", "permute-bf16-h200",
        "two-bf16", "cos-cos-f32", "odd-bf16", "odd-cos-bf16", "odd-cos-f32",
        "even-cos-f32-h200", "even-cos-f32-h100", "pairs-cos-bf16", "quads-bf16",
    ],
)  # fmt: skip
def test_element_wise_programs_keep_the_targets_bytes_in_flight(
    text: str, target: Target, tiling: Tiling
) -> None:
    assert loop_tilings(text, target) == [tiling]


# --- rows that share an operand share programs ------------------------------------------


def neighbor(n: int, k: int, el: str = "f32") -> str:
    """((a - b)**2).sum(-1).amax(1): every row i reads all of b."""
    return f"""func @f(%a: {t((n, 1, k), el)}, %b: {t((1, n, k), el)}) -> {t((n,), el)} {{
  %d = graph.sub %a, %b : {t((n, n, k), el)}
  %s = graph.mul %d, %d : {t((n, n, k), el)}
  %r = graph.reduce_sum %s {{dims = [2]}} : {t((n, n), el)}
  %m = graph.reduce_max %r {{dims = [1]}} : {t((n,), el)}
  return %m : {t((n,), el)}
}}
"""


@pytest.mark.parametrize(
    ("n", "k", "grid", "rows"), [(4096, 8, 256, 16), (1000, 4, 250, 4), (3001, 3, 188, 16)]
)
def test_rows_that_share_an_operand_share_programs_and_fill_the_gpu(
    n: int, k: int, grid: int, rows: int
) -> None:
    """Every row reads all of b: 16 rows a program read it from L2 once between them
    (0.024 ms against 0.143 at one row a program, 4096 x 8 f32 on an H100), as many
    as leave every SM a program, and the reduction is not split (one kernel)."""
    (tiling,) = loop_tilings(neighbor(n, k), H100)
    assert tiling.block[0] == rows
    assert rows * tiling.block[1] <= 4096
    k_op = only_kernel(tiled(neighbor(n, k)))
    assert [int(g.value.data) for g in k_op.grid.data] == [grid]
    assert grid >= H100.sms


def cos_outer_sums(n: int, m: int, el: str = "f32") -> str:
    """cos(a_i * b_j) summed over each dim: every row reads all of b (or of a), and
    each element computes a cosine."""
    return f"""func @f(%a: {t((n, 1), el)}, %b: {t((1, m), el)}) -> ({t((n,), el)}, {t((m,), el)}) {{
  %p = graph.mul %a, %b : {t((n, m), el)}
  %c = graph.cos %p : {t((n, m), el)}
  %r = graph.reduce_sum %c {{dims = [1]}} : {t((n,), el)}
  %s = graph.reduce_sum %c {{dims = [0]}} : {t((m,), el)}
  return %r, %s : {t((n,), el)}, {t((m,), el)}
}}
"""


@pytest.mark.parametrize(
    ("n", "m", "el"), [(3350, 2892, "bf16"), (6238, 8769, "f32"), (700, 5000, "f32")]
)
def test_rows_that_share_an_operand_and_compute_a_function_take_fewer_rows(
    n: int, m: int, el: str
) -> None:
    """A cosine an element hides the shared operand's L2 reads: 4 rows a program
    (`SHARED_ROWS_COMPUTING`), where the neighbor's cheap elements take 16, so that
    more programs balance the SMs; never fewer programs than SMs."""
    tilings = loop_tilings(cos_outer_sums(n, m, el), H100)
    assert len(tilings) == 2
    for tiling, rows in zip(tilings, (n, m), strict=True):
        x = tiling.block[0]
        assert x <= 4 and x * tiling.block[1] <= 4096
        assert x == 4 or -(-rows // (2 * x)) < H100.sms
        assert -(-rows // x) >= H100.sms
    module = irc.parse(cos_outer_sums(n, m, el), "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop")
    shapes = [kernel_shape(k) for k in loop.kernels(module)]
    assert [(s.transcendentals, s.shared_bytes > 0) for s in shapes] == [(1, True), (1, True)]


def test_shared_rows_computing_a_function_match_torch() -> None:
    """4 rows a program over rows 1500 long, looped in steps of 1024, the last row
    masked (37 rows); 16 rows over rows 37 long (a step of 64 each); sms=1 keeps them."""
    text = cos_outer_sums(37, 1500)
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    one_sm = Target(512, 2, 16, "one SM", sms=1)
    assert [t.block for t in loop_tilings(text, one_sm)] == [(4, 1024), (16, 64)]
    source = triton_source(module, target=one_sm)
    torch.manual_seed(0)
    a, b = torch.randn(37, 1), torch.randn(1, 1500)
    rows, cols = load_source(source, "cpu").FUNCTIONS["f"](a, b)
    c = torch.cos(a * b)
    assert judge(rows, c.sum(1)).ok and judge(cols, c.sum(0)).ok


@pytest.mark.parametrize(("n", "m", "rows"), [(100001, 7, 16), (3001, 300, 8), (50000, 130, 16)])
def test_short_rows_computing_a_function_still_fill_a_step(n: int, m: int, rows: int) -> None:
    """Rows shorter than a quarter step take as many as fill `SHARED_STEP_ELEMENTS`
    (up to 16): 7-long rows are programs of 16 x 8, not 4 x 8."""
    first = loop_tilings(cos_outer_sums(n, m), H100)[0]
    assert first.block == (rows, min(4096 // rows, 1 << (m - 1).bit_length()))


def test_one_row_is_no_shared_operand() -> None:
    """A full reduction's combining stage reads its partials once: not shared."""
    text = f"""func @f(%x: {t((8192, 8192))}) -> {t(())} {{
  %s = graph.reduce_sum %x {{dims = [0, 1]}} : {t(())}
  return %s : {t(())}
}}
"""
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop," + H100.split_pass())
    shapes = [kernel_shape(k) for k in loop.kernels(module)]
    assert len(shapes) == 2
    assert [s.shared_bytes for s in shapes] == [0, 0]


@pytest.mark.parametrize(("n", "k", "el", "kind"), [(301, 5, "f32", "red"), (77, 3, "bf16", "per")])
def test_shared_rows_match_torch(n: int, k: int, el: str, kind: str) -> None:
    """16 rows a program with the last one masked, the reduction looped in chunks of
    256 (`red`) or whole (`per`); sms=1 keeps 16 rows at these sizes."""
    text = neighbor(n, k, el)
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    one_sm = Target(512, 2, 16, "one SM", sms=1)
    source = triton_source(module, target=one_sm)
    assert f"_launch(triton_{kind}_" in source
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[el]
    torch.manual_seed(0)
    a, b = torch.randn(n, 1, k).to(dtype), torch.randn(1, n, k).to(dtype)
    got = load_source(source, "cpu").FUNCTIONS["f"](a, b)
    want = ((a.float() - b.float()) ** 2).sum(-1).amax(1)
    tol = 1e-5 if el == "f32" else 2e-2
    assert_close(got.float(), want, rtol=tol, atol=tol)


def test_autotune_tries_shared_rows_and_each_candidate_matches_torch() -> None:
    """The autotuner's candidates for rows sharing an operand include several rows a
    program in chunks; two of them, forced on the kernel, compute the right result."""
    from irc.autotune import candidates
    from irc.passes.tile import set_tiling

    text = neighbor(300, 5)
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse,decompose,graph-to-loop,split-reduction,tile")
    (k,) = loop.kernels(module)
    shared = [o for o in candidates(kernel_shape(k), tiling_of(k)) if o.block[0] > 1]
    assert {o.block for o in shared} >= {(8, 256), (16, 256), (32, 128)}
    torch.manual_seed(0)
    a, b = torch.randn(300, 1, 5), torch.randn(1, 300, 5)
    want = ((a - b) ** 2).sum(-1).amax(1)
    for option in (Tiling((8, 256), 4), Tiling((32, 128), 8)):
        copy = module.clone()
        (kc,) = loop.kernels(copy)
        set_tiling(kc, option)
        run_pipeline(copy, ",".join(AFTER_TILING))  # irc.compile would tile it again
        source = triton_source(copy)
        assert f"tl.arange(0, {option.block[0]})" in source
        assert_close(load_source(source, "cpu").FUNCTIONS["f"](a, b), want)
