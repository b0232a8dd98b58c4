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
from irc.compiler import lower_to_tile
from irc.dialects import tile
from irc.pipeline import run_pipeline
from irc.target import Target

H100 = Target(512, 2, 16, "an H100's tiling (irc.target.target_for)", 132)


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IRC_CACHE_DIR", str(tmp_path_factory.mktemp("irc-cache")))
        yield


def t(shape: tuple[int, ...], el: str = "f32") -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + el + ">"


def reshape_output(b: int, n: int, m: int, el: str = "f32") -> str:
    full, out = t((b, n, m), el), t((b * n, m), el)
    return f"""func @f(%x: {full}, %w: {t((m,), el)}) -> {out} {{
  %a = graph.mul %x, %w : {full}
  %r = graph.relu %a : {full}
  %y = graph.reshape %r : {out}
  return %y : {out}
}}
"""


def cos_reshape_cos(n: int, m: int, el: str = "f32") -> str:
    return f"""func @f(%x: {t((n * m,), el)}, %w: {t((m,), el)}) -> {t((n, m), el)} {{
  %a = graph.cos %x : {t((n * m,), el)}
  %r = graph.reshape %a : {t((n, m), el)}
  %b = graph.cos %r : {t((n, m), el)}
  %y = graph.mul %b, %w : {t((n, m), el)}
  return %y : {t((n, m), el)}
}}
"""


def split_heads(b: int, s: int, h: int, d: int, el: str = "f32") -> str:
    """[B, S, H*D] -> [B, S, H, D] -> [B, H, S, D]: a reshape, then a permute."""
    src, mid, dst = t((b, s, h * d), el), t((b, s, h, d), el), t((b, h, s, d), el)
    return f"""func @f(%x: {src}) -> {dst} {{
  %r = graph.reshape %x : {mid}
  %p = graph.transpose %r {{perm = [0, 2, 1, 3]}} : {dst}
  %e = graph.exp %p : {dst}
  return %e : {dst}
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
    (load,) = [op for op in k.walk() if isinstance(op, tile.LoadOp)]
    assert unit_stride(store.offsets)
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
        lambda x: x.reshape(2, 33, 3, 40).permute(0, 2, 1, 3).exp(),
        (2, 33, 120),
    )
