"""contract-mul-add: which float products become one FMA with their addition, and
which stay rounded as torch rounds them (a second use, half precision, a
broadcast, an enclosing block); results against torch on fresh inputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import irc
from irc.dialects import tile
from irc.pipeline import AFTER_TILING
from irc.testing.verdict import judge

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
ROOT = Path(__file__).resolve().parents[1]

MIXED = """func @f(%x: tensor<64x64xf32>, %y: tensor<64x64xf32>, %s: tensor<64xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>) {
  %k = graph.constant {value = 1.5} : tensor<f32>
  %p = graph.mul %x, %k
  %a = graph.sub %y, %p
  %q = graph.mul %y, %k
  %b = graph.sub %q, %x
  %t = graph.mul %x, %y
  %m = graph.minimum %t, %y
  %d = graph.sub %m, %t
  %r = graph.mul %s, %k
  %e = graph.add %r, %x
  return %a, %b, %d, %e : tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>
}
"""

TWINS = """func @f(%x: tensor<37x300xf32>, %y: tensor<37x300xf32>) -> tensor<37x300xf32> {
  %c = graph.constant {value = 1.1} : tensor<f32>
  %p = graph.mul %x, %c
  %m = graph.minimum %p, %y
  %q = graph.mul %x, %c
  %d = graph.sub %m, %q
  %n = graph.neg %d
  %r = graph.sqrt %n
  return %r : tensor<37x300xf32>
}
"""


def tile_module(text: str) -> object:
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(
        module, "fuse,decompose,graph-to-loop,split-reduction,tile," + ",".join(AFTER_TILING)
    )
    return module


def applies(module: object, fn: str) -> list[tile.ApplyOp]:
    return [op for op in module.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == fn]  # type: ignore[attr-defined]


def fresh(*shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(s, dtype=dtype, device=DEVICE) for s in shapes]


def test_single_use_products_contract_into_add_and_both_orders_of_sub() -> None:
    module = tile_module(MIXED)
    fused = applies(module, "mul_add")
    # y - x*k, y*k - x and s*k + x; x*y is read twice (by the min and the sub).
    assert len(fused) == 3
    products = [m for m in applies(module, "mul") if "f32" in str(m.result.type)]
    assert len(products) == 1 and products[0].result.uses.get_length() == 2
    # c - a*b negates a factor, a*b - c the addend: two negations.
    assert len(applies(module, "neg")) == 2
    x, y, s = fresh((64, 64), (64, 64), (64,))
    got = irc.compile(irc.parse(MIXED, "t.ir"), device=DEVICE)["f"](x, y, s)
    want = (y - x * 1.5, y * 1.5 - x, torch.minimum(x * y, y) - x * y, s * 1.5 + x)
    for g, w in zip(got, want, strict=True):
        assert judge(g, w).ok


def test_a_product_written_twice_is_one_value_and_stays_rounded() -> None:
    """min(x*c, y) - x*c is 0 where x*c is the min: contracting the second product
    would give its rounding error instead, and a NaN under the square root."""
    module = tile_module(TWINS)
    assert applies(module, "mul_add") == []
    x, y = fresh((37, 300), (37, 300))
    got = irc.compile(irc.parse(TWINS, "t.ir"), device=DEVICE)["f"](x, y)
    want = torch.sqrt(-(torch.minimum(x * 1.1, y) - x * 1.1))
    assert not got.isnan().any() and torch.equal(got == 0, want == 0)
    assert judge(got, want).ok


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_products_round_to_their_type_first(dtype: str) -> None:
    text = f"""func @f(%x: tensor<64x64x{dtype}>, %y: tensor<64x64x{dtype}>) -> tensor<64x64x{dtype}> {{
  %p = graph.mul %x, %y
  %a = graph.add %p, %y
  return %a : tensor<64x64x{dtype}>
}}
"""
    assert applies(tile_module(text), "mul_add") == []


def test_index_arithmetic_never_contracts_and_chain20_fuses_ten() -> None:
    module = tile_module((ROOT / "benchmarks/workloads/chain20.ir").read_text())
    assert len(applies(module, "mul_add")) == 10
    ints = [op for op in applies(module, "mul") if "i32" in str(op.result.type)]
    assert ints, "the program index times the block size is i32 arithmetic"
    x = fresh((256, 300))[0]
    text = (ROOT / "benchmarks/workloads/chain20.ir").read_text().replace("8192x8192", "256x300")
    got = irc.compile(irc.parse(text, "t.ir"), device=DEVICE)["chain20"](x)
    want = x
    for _ in range(10):
        want = torch.tanh(want * 1.01 + 0.5)
    assert judge(got, want).ok


KERNEL = """tile.kernel {{name = "triton_red_k_0", grid = [4], warps = 4}} (%x: ptr<f32>, %y: ptr<f32>) {{
  %r = tile.arange {{size = 64}} : tensor<64xi32>
  %v = tile.load %x, %r : tensor<64xf32>
  %s = tile.load %x, %r {{evict = "first"}} : tensor<64xf32>
  %z = tile.constant {{value = 0.0}} : tensor<64xf32>
{body}
  tile.store %y, %r, %out
}}
"""


def contracted(body: str) -> str:
    module = irc.parse(KERNEL.format(body=body), "k.ir")
    irc.run_pipeline(module, "contract-mul-add")
    return irc.print_module(module)


def test_a_product_above_a_loop_is_not_moved_into_it() -> None:
    text = contracted("""  %p = tile.apply %v, %s {fn = "mul"} : tensor<64xf32>
  %out = tile.for %z {lb = 0, ub = 8, step = 1} (%k: i32, %c: tensor<64xf32>) {
    %n = tile.apply %c, %p {fn = "add"} : tensor<64xf32>
    tile.yield %n
  } : tensor<64xf32>""")
    assert "mul_add" not in text and '{fn = "mul"}' in text


def test_a_product_broadcast_into_a_larger_addition_is_not_repeated() -> None:
    text = contracted("""  %p = tile.apply %v, %s {fn = "mul"} : tensor<64xf32>
  %w = tile.constant {value = 1.0} : tensor<8x64xf32>
  %b = tile.apply %w, %p {fn = "add"} : tensor<8x64xf32>
  %out = tile.reduce %b {kind = "sum", axis = 0} : tensor<64xf32>""")
    assert "mul_add" not in text


def test_sub_of_a_product_negates_the_right_operand() -> None:
    text = contracted("""  %p = tile.apply %v, %s {fn = "mul"} : tensor<64xf32>
  %out = tile.apply %z, %p {fn = "sub"} : tensor<64xf32>""")
    # 0 - v*s = fma(-v, s, 0)
    assert '%0 = tile.apply %v {fn = "neg"}' in text
    assert 'tile.apply %0, %s, %z {fn = "mul_add"}' in text
    text = contracted("""  %p = tile.apply %v, %s {fn = "mul"} : tensor<64xf32>
  %out = tile.apply %p, %z {fn = "sub"} : tensor<64xf32>""")
    assert (
        'tile.apply %v, %s, %0 {fn = "mul_add"}' in text
        and '%0 = tile.apply %z {fn = "neg"}' in text
    )
