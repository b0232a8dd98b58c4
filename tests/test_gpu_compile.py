"""Every kind of kernel irc generates builds for the GPU, checked without one.

Triton's interpreter (what the CPU tests run) accepts programs the GPU
compiler rejects: an op on a type the NVIDIA backend has no lowering for, a
block shape a layout cannot take, shared memory past the limit. Here the
generated kernels go through Triton's real pipeline for an H100 (sm_90:
TTIR, TTGIR, LLVM, PTX and the ptxas bundled with Triton), which needs no
device, with the pointer types of their tile.kernel signatures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton
from triton.compiler import ASTSource

import irc
from irc.compiler import lower_to_tile
from irc.testing.sm90 import H100, gpu_kernels


def softmax(rows: int, cols: int, dim: int, el: str = "f32") -> str:
    x = f"tensor<{rows}x{cols}x{el}>"
    return f"""func @f(%x: {x}) -> {x} {{
  %y = graph.softmax %x {{dim = {dim}}} : {x}
  return %y : {x}
}}"""


def layer_norm(rows: int, cols: int) -> str:
    x, v = f"tensor<{rows}x{cols}xf32>", f"tensor<{cols}xf32>"
    return f"""func @f(%x: {x}, %w: {v}, %b: {v}) -> {x} {{
  %y = graph.layer_norm %x, %w, %b {{dims = [1]}} : {x}
  return %y : {x}
}}"""


PROGRAMS = {
    # one-pass-variance: Welford parts in a split stage, combined where x is normalized
    "batch_norm_split": """func @f(%x: tensor<48374x338xf32>) -> tensor<48374x338xf32> {
  %mean = graph.reduce_mean %x {dims = [0], keepdim = true} : tensor<1x338xf32>
  %c = graph.sub %x, %mean : tensor<48374x338xf32>
  %sq = graph.mul %c, %c : tensor<48374x338xf32>
  %var = graph.reduce_mean %sq {dims = [0], keepdim = true} : tensor<1x338xf32>
  %eps = graph.constant {value = 1.0e-5} : tensor<f32>
  %ve = graph.add %var, %eps : tensor<1x338xf32>
  %inv = graph.rsqrt %ve : tensor<1x338xf32>
  %y = graph.mul %c, %inv : tensor<48374x338xf32>
  return %y : tensor<48374x338xf32>
}""",
    # split-reduction: a softmax's chunk maxima and sums of exps in one stage
    "softmax_columns_split": softmax(12554, 1422, 0),
    # Welford rows unrolled in registers, looped, and held in one block
    "layer_norm_unrolled_rows": layer_norm(2048, 40000),
    "layer_norm_long_rows": layer_norm(64, 262144),
    "layer_norm_rows": layer_norm(4096, 768),
    "softmax_vocab_bf16": softmax(64, 50257, 1, "bf16"),
    "gemm_bias_gelu_bf16": """func @f(%a: tensor<512x256xbf16>, %b: tensor<256x384xbf16>, %c: tensor<384xbf16>) -> tensor<512x384xbf16> {
  %m = graph.matmul %a, %b : tensor<512x384xbf16>
  %s = graph.add %m, %c : tensor<512x384xbf16>
  %y = graph.gelu %s {approximate = "tanh"} : tensor<512x384xbf16>
  return %y : tensor<512x384xbf16>
}""",
    # irc's helpers: _irc_pow (all of its special cases), _irc_tanh, erf
    "pow_tanh_erf": """func @f(%a: tensor<1000x3xf32>, %b: tensor<1000x3xf32>) -> tensor<1000x3xf32> {
  %p = graph.pow %a, %b : tensor<1000x3xf32>
  %t = graph.tanh %p : tensor<1000x3xf32>
  %y = graph.erf %t : tensor<1000x3xf32>
  return %y : tensor<1000x3xf32>
}""",
    "pow_tanh_f64": """func @f(%a: tensor<1000x3xf64>, %b: tensor<1000x3xf64>) -> tensor<1000x3xf64> {
  %p = graph.pow %a, %b : tensor<1000x3xf64>
  %y = graph.tanh %p : tensor<1000x3xf64>
  return %y : tensor<1000x3xf64>
}""",
    "causal_attention_bf16": """func @f(%q: tensor<8x256x64xbf16>, %k: tensor<8x256x64xbf16>, %v: tensor<8x256x64xbf16>) -> tensor<8x256x64xbf16> {
  %kt = graph.transpose %k {perm = [0, 2, 1]} : tensor<8x64x256xbf16>
  %s = graph.matmul %q, %kt : tensor<8x256x256xbf16>
  %c = graph.constant {value = 0.125} : tensor<bf16>
  %z = graph.mul %s, %c : tensor<8x256x256xbf16>
  %i = graph.iota {dim = 1} : tensor<256x256xi32>
  %j = graph.iota {dim = 0} : tensor<256x256xi32>
  %m = graph.le %i, %j : tensor<256x256xi1>
  %ninf = graph.constant {value = -1.0e30} : tensor<bf16>
  %w = graph.where %m, %z, %ninf : tensor<8x256x256xbf16>
  %p = graph.softmax %w {dim = 2} : tensor<8x256x256xbf16>
  %o = graph.matmul %p, %v : tensor<8x256x64xbf16>
  return %o : tensor<8x256x64xbf16>
}""",
    # loops past i32: a K of 2**40 and rows of 2**40 (tile.for counts in i64 there)
    "matmul_k_past_i32": """func @f(%x: tensor<4x1099511627776xf32>, %w: tensor<1099511627776x4xf32>) -> tensor<4x4xf32> {
  %s = graph.matmul %x, %w : tensor<4x4xf32>
  return %s : tensor<4x4xf32>
}""",
    "softmax_rows_past_i32": softmax(2, 1099511627776, 1),
    # 70,000 batches: past CUDA's 65,535 on axis 1, folded into axis 0
    "bmm_many_batches": """func @f(%a: tensor<70000x2x16xf32>, %b: tensor<70000x16x3xf32>) -> tensor<70000x2x3xf32> {
  %c = graph.matmul %a, %b : tensor<70000x2x3xf32>
  return %c : tensor<70000x2x3xf32>
}""",
    "column_sum_and_transpose": """func @f(%x: tensor<3001x257xf32>, %z: tensor<257x3001xf32>) -> (tensor<257xf32>, tensor<3001x257xf32>) {
  %s = graph.reduce_sum %x {dims = [0]} : tensor<257xf32>
  %t = graph.transpose %z {perm = [1, 0]} : tensor<3001x257xf32>
  %y = graph.add %x, %t : tensor<3001x257xf32>
  return %s, %y : tensor<257xf32>, tensor<3001x257xf32>
}""",
}


def assert_kernels_build(text: str, tmp_path: Path) -> None:
    """Every kernel of `text` goes through Triton's sm_90 pipeline and ptxas."""
    module = irc.parse(text, "t.ir")
    irc.run_pipeline(module, "fuse")
    lower_to_tile(module)
    kernels = gpu_kernels(module, tmp_path)
    assert kernels
    for _, fn, sig in kernels:
        compiled = triton.compile(ASTSource(fn, sig), target=H100)
        assert ".entry " + fn.__name__ in compiled.asm["ptx"]
        assert compiled.asm["cubin"]  # ptxas accepted it


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_generated_kernels_build_for_an_h100(name: str, tmp_path: Path) -> None:
    assert_kernels_build(PROGRAMS[name], tmp_path)


class SmallCNN(torch.nn.Module):
    """The PyTorch formulas' kernels: a patch embedding (a matmul over a view), a
    depthwise 3x3 (shifted strided views of a padded input), an overlapping max
    pool, a 2x nearest upsample, an adaptive average pool and a running sum."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 16, 2, stride=2)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.depthwise(self.patch(x)))
        y = torch.nn.functional.max_pool2d(y, 3, 2, 1)
        y = torch.nn.functional.interpolate(y, scale_factor=2)
        return torch.nn.functional.adaptive_avg_pool2d(y, 2).cumsum(1)


def test_the_pytorch_formulas_kernels_build_for_an_h100(tmp_path: Path) -> None:
    from irc.pytorch.export import export_text

    text = export_text(SmallCNN(), (torch.randn(2, 3, 32, 32),))
    assert text.count("func @") == 1  # one irc island: nothing left to eager
    assert_kernels_build(text, tmp_path)
