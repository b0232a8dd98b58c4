"""Small programs that once broke a lowering, compiled and checked against torch."""

from __future__ import annotations

import os

import pytest
import torch

import irc
from irc.testing.reference import functions, random_inputs, run_function

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

PROGRAMS = {
    # A view pulled into a kernel was also read outside: the kernel yielded the
    # view (another shape than its schema's) instead of its real output.
    "view_read_inside_and_outside": """
func @main(%a4: tensor<f32>, %v3: tensor<17x1xi1>) -> (tensor<17x1xf32>, tensor<1x17xf32>) {
  %v2 = graph.constant {value = -1.5} : tensor<f32>
  %v5 = graph.where %v3, %v2, %a4 : tensor<17x1xf32>
  %v6 = graph.transpose %v5 {perm = [1, 0]} : tensor<1x17xf32>
  %v7 = graph.transpose %v6 {perm = [1, 0]} : tensor<17x1xf32>
  %v8 = graph.transpose %v7 {perm = [1, 0]} : tensor<1x17xf32>
  %v15 = graph.constant {value = 0.5} : tensor<f32>
  %v16 = graph.pow %v7, %v15 : tensor<17x1xf32>
  return %v16, %v8 : tensor<17x1xf32>, tensor<1x17xf32>
}
""",
    # A square transpose after a layer norm passed the rows kernel's shape check,
    # but each element reads another row.
    "transpose_after_rows": """
func @main(%a2: tensor<33x33xf32>, %a11: tensor<33xf32>, %a12: tensor<33xf32>) -> tensor<33x33xf32> {
  %v13 = graph.layer_norm %a2, %a11, %a12 {dims = [1], eps = 1.0e-05} : tensor<33x33xf32>
  %v14 = graph.transpose %v13 {perm = [1, 0]} : tensor<33x33xf32>
  %v15 = graph.abs %v14 : tensor<33x33xf32>
  return %v15 : tensor<33x33xf32>
}
""",
    # On the GPU, LLVM contracted `min(x*c, y) - x*c` into one FMA: the product was
    # not rounded before the subtraction, so the difference was a rounding error
    # instead of 0, and its square root a NaN or 4e-5 (random seed 200002).
    "no_fma_contraction": """
func @main(%x: tensor<130x5xf32>, %y: tensor<130x5xf32>) -> (tensor<130x5xf32>, tensor<130x5xf32>) {
  %c = graph.constant {value = 0.0877} : tensor<f32>
  %p = graph.mul %x, %c
  %m = graph.minimum %p, %y
  %d = graph.sub %m, %p
  %half = graph.constant {value = 0.5} : tensor<f32>
  %r = graph.pow %d, %half
  %s = graph.sqrt %d
  return %r, %s : tensor<130x5xf32>, tensor<130x5xf32>
}
""",
    # Triton's tl.full makes any constant equal to 0 a +0.0, so x / -0.0 had the
    # wrong sign of infinity.
    "negative_zero_constant": """
func @main(%x: tensor<37xf32>, %h: tensor<37xf16>) -> (tensor<37xf32>, tensor<37xf16>, tensor<37xf32>) {
  %z = graph.constant {value = -0.0} : tensor<f32>
  %q = graph.div %x, %z
  %zh = graph.constant {value = -0.0} : tensor<f16>
  %qh = graph.div %h, %zh
  %zs = graph.constant {value = -0.0} : tensor<37xf32>
  %r = graph.reciprocal %zs
  return %q, %qh, %r : tensor<37xf32>, tensor<37xf16>, tensor<37xf32>
}
""",
    # Triton's unary minus is 0 - x: neg(+0.0) was +0.0, not torch's -0.0.
    "neg_of_zero": """
func @main(%x: tensor<37xf32>, %d: tensor<37xf64>) -> (tensor<37xf32>, tensor<37xf64>) {
  %r = graph.relu %x
  %n = graph.neg %r
  %y = graph.reciprocal %n
  %rd = graph.relu %d
  %nd = graph.neg %rd
  %yd = graph.reciprocal %nd
  return %y, %yd : tensor<37xf32>, tensor<37xf64>
}
""",
    # Masked lanes of an i1 max were filled with true: an all-false row gave true.
    "i1_max_of_false_rows": """
func @main(%x: tensor<3x97xf32>) -> (tensor<3xi1>, tensor<97xi1>, tensor<3xi1>) {
  %big = graph.constant {value = 10.0} : tensor<f32>
  %f = graph.gt %x, %big
  %m = graph.reduce_max %f {dims = [1]}
  %m0 = graph.reduce_max %f {dims = [0]}
  %t = graph.le %x, %big
  %n = graph.reduce_min %t {dims = [1]}
  return %m, %m0, %n : tensor<3xi1>, tensor<97xi1>, tensor<3xi1>
}
""",
    "rank0_transpose": """
func @t(%s: tensor<f32>) -> tensor<f32> {
  %t = graph.transpose %s {perm = []}
  %e = graph.exp %t
  return %e : tensor<f32>
}
""",
    # A 1x1 product reduced to a scalar is one contraction kernel storing a rank-0
    # buffer, whose last dim `tile`'s check of narrow epilogue rows read (IndexError;
    # graphgen seed 45075).
    "one_element_product_reduced": """
func @main(%a1: tensor<1x17xf32>, %v10: tensor<17x1xf32>) -> tensor<f32> {
  %v12 = graph.matmul %a1, %v10 : tensor<1x1xf32>
  %v14 = graph.reduce_min %v12 {dims = [0, 1]} : tensor<f32>
  return %v14 : tensor<f32>
}
""",
    "one_element_bf16_product_summed": """
func @main(%a: tensor<1x40xbf16>, %b: tensor<40x1xbf16>) -> tensor<bf16> {
  %p = graph.matmul %a, %b : tensor<1x1xbf16>
  %s = graph.reduce_sum %p {dims = [0, 1]} : tensor<bf16>
  return %s : tensor<bf16>
}
""",
    # A function with no op, returning its argument (twice), lowers to a buffer
    # function with nothing to launch; it counted as loop-level after loop-to-tile,
    # and tile-cse refused the module ("this module is at the loop level").
    "returns_its_argument_twice": """
func @same(%x: tensor<17x33xf32>) -> (tensor<17x33xf32>, tensor<17x33xf32>) {
  return %x, %x : tensor<17x33xf32>, tensor<17x33xf32>
}
""",
}


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_reference(name: str, fuse: bool) -> None:
    module = irc.parse(PROGRAMS[name])
    compiled = irc.compile(module, device=DEVICE, fuse=fuse)
    for fname, fn in functions(module).items():
        inputs = random_inputs(fn, seed=1, device=DEVICE)
        for got, want in zip(compiled.run(fname, inputs), run_function(fn, inputs), strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)


def test_kernels_compile_without_fma_contraction() -> None:
    module = irc.parse(PROGRAMS["no_fma_contraction"])
    compiled = irc.compile(module, device=DEVICE)
    options: list[dict[str, object]] = []

    class Spy:
        """A kernel that records the options it is launched with."""

        def __init__(self, kernel: object):
            self.kernel = kernel

        def __getitem__(self, grid: object) -> object:
            def launch(*args: object, **kwargs: object) -> object:
                options.append(kwargs)
                return self.kernel[grid](*args, **kwargs)  # type: ignore[index]

            return launch

    for name, value in list(vars(compiled._py).items()):
        if name.startswith("triton_"):
            setattr(compiled._py, name, Spy(value))
    compiled.run("main", random_inputs(functions(module)["main"], seed=1, device=DEVICE))
    assert options and all(o["enable_fp_fusion"] is False for o in options)


def test_tanh_at_the_edges() -> None:
    """irc's tanh is exp-based: check where that formula could go wrong."""
    module = irc.parse(
        "func @f(%x: tensor<4096xf32>) -> tensor<4096xf32> {\n"
        "  %y = graph.tanh %x\n  return %y : tensor<4096xf32>\n}\n"
    )
    edges = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 1e-8, 1e-4]
    edges += [-1e-3, 44.0, 45.0, 89.0, 100.0, -100.0, 9.0, -9.0, 3e38, -3e38]
    torch.manual_seed(0)
    x = torch.cat([torch.tensor(edges), torch.randn(4096 - len(edges)) * 4]).to(DEVICE)
    (got,) = irc.compile(module, device=DEVICE).run("f", [x])
    torch.testing.assert_close(got, torch.tanh(x), equal_nan=True)
    assert torch.signbit(got[1]) and not torch.signbit(got[0])  # tanh(-0.0) is -0.0


# A tile.for counting in i64 (as loop-to-tile makes one past i32), its index cast
# for i32 arithmetic: the interpreter's index is a Python int, which has no .to().
I64_LOOP = """tile.kernel {name = "k", grid = [2], warps = 4} (%x: ptr<f32>, %y: ptr<f32>) {
  %n = tile.constant {value = 3000} : i32
  %pid = tile.program_id {axis = 0} : i32
  %r = tile.arange {size = 512} : tensor<512xi32>
  %row = tile.apply %pid, %n {fn = "mul"} : i32
  %zero = tile.constant {value = 0.0} : tensor<512xf32>
  %acc = tile.for %zero {lb = 0, ub = 3000, step = 512} (%i: i64, %a: tensor<512xf32>) {
    %i32 = tile.apply %i {fn = "cast"} : i32
    %j = tile.apply %r, %i32 {fn = "add"} : tensor<512xi32>
    %in = tile.apply %j, %n {fn = "lt"} : tensor<512xi1>
    %at = tile.apply %row, %j {fn = "add"} : tensor<512xi32>
    %v = tile.load %x, %at, %in {other = 0.0} : tensor<512xf32>
    %s = tile.apply %a, %v {fn = "add"} : tensor<512xf32>
    tile.yield %s
  } : tensor<512xf32>
  %t = tile.reduce %acc {kind = "sum", axis = 0} : f32
  tile.store %y, %pid, %t
}

func @f(%x: memref<2x3000xf32>) -> memref<2xf32> {
  %y = loop.alloc : memref<2xf32>
  tile.launch %x, %y {kernel = @k}
  return %y : memref<2xf32>
}
"""


def test_a_loop_counting_in_i64_runs() -> None:
    compiled = irc.compile(irc.parse(I64_LOOP, "i64.ir"), device=DEVICE)
    assert "range(tl.full([], 0, tl.int64), 3000, 512)" in compiled.source
    x = torch.randn(2, 3000, device=DEVICE)
    torch.testing.assert_close(compiled.f(x), x.sum(1), rtol=1e-5, atol=1e-4)
