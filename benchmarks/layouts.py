"""The layout suite: irc against torch eager and torch.compile on the access patterns of issue 16.

    python benchmarks/layouts.py [--only NAME ...] [--markdown FILE] [--json FILE]   # GPU
    python benchmarks/layouts.py --smoke                                           # CPU, tiny

Each workload is a family of `.ir` programs generated here for several shapes
and element types (odd sizes, f32 and bf16/f16), beside the same function in
torch: full reductions beside full-size outputs, column and middle reductions,
batch-norm statistics, transposed operands, vocabulary-sized softmax rows,
reshapes of a kernel's output, a GEMM with a bias and exact GELU, causal
attention written out, and the byte-count cases of Inductor's
test/inductor/test_perf.py (test_neighbor, test_partitioning_keops,
test_reduction_pointwise_multi_level_reduction, cos -> reshape -> cos).
`--write-ir DIR` writes the programs out (one file a row). `--unseen SEED`
perturbs every shape at random (each dim by 0.25-1.6, f32 or bf16): the
families at sizes the suite never had.

A row is one shape: eager, torch.compile and irc times (medians of
`triton.testing.do_bench` taken in turns, as benchmarks/bench.py does), the
floor, kernel counts and the ratios. The floor of a memory-bound row is its
fewest bytes (inputs read once, outputs written once) over the measured copy
bandwidth; of the GEMM row the bare `torch.mm`; of attention torch's fused
causal `scaled_dot_product_attention`. Outputs are judged by
`irc.testing.verdict` (the rule of `irc-run --check`).

`--smoke` runs every workload at a tiny shape on the CPU (kernels in Triton's
interpreter): it checks that each program compiles, runs and agrees with torch,
and prints the table with wall-clock times that mean nothing; torch.compile is
left out unless `--compile` is given (Inductor's C++ compile takes minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (benchmarks/ is not a package: the harness beside this file)


@dataclass(frozen=True)
class Shape:
    """One size of a workload: its dimensions by name and its element type."""

    dims: dict[str, int]
    dtype: str  # "f32", "bf16" or "f16"

    @property
    def label(self) -> str:
        return "x".join(str(v) for v in self.dims.values()) + " " + self.dtype


@dataclass
class Workload:
    """A family of programs: `ir(shape)` is the `.ir` text of function `name`, `torch_fn`
    the same function in torch, `inputs(shape, device)` its arguments."""

    name: str
    row: str  # the row of issue 16's table (or the peer test) it covers
    ir: Callable[[Shape], str]
    torch_fn: Callable[..., Any]
    inputs: Callable[[Shape, str], list[Any]]
    shapes: list[Shape]
    smoke: Shape
    floor: str = "bytes"  # "bytes", "torch.mm" or "sdpa"
    # What irc should launch, when pinned: from the shape, and whether the compile put
    # a GEMM on the library (`library-gemm`, measured on the GPU).
    irc_kernels: Callable[[Shape, bool], int] | None = None
    notes: list[str] = field(default_factory=list)


def _t(dims: list[int], dtype: str) -> str:
    return f"tensor<{'x'.join(map(str, dims))}x{dtype}>" if dims else f"tensor<{dtype}>"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def _randn(dims: list[int], dtype: str, device: str) -> Any:
    import torch

    return torch.randn(*dims, device=device, dtype=_torch_dtype(dtype))


def _args(*specs: list[int]) -> Callable[[Shape, str], list[Any]]:
    """Inputs of the given dims (filled from the shape's dims by name), random normal."""

    def make(shape: Shape, device: str) -> list[Any]:
        return [_randn(dims, shape.dtype, device) for dims in specs]

    return make


def _dims(*names: str) -> Callable[[Shape], list[int]]:
    return lambda s: [s.dims[n] for n in names]


def _inputs(*dim_fns: Callable[[Shape], list[int]]) -> Callable[[Shape, str], list[Any]]:
    return lambda s, dev: [_randn(f(s), s.dtype, dev) for f in dim_fns]


def _S(dtype: str, **dims: int) -> Shape:
    return Shape(dict(dims), dtype)


# ---- the workloads -------------------------------------------------------------------------


def _full_reduce_beside(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// sigmoid(x) and max(x): a full reduction beside a full-size output.
func @full_reduce_beside(%x: {_t([n, m], d)}) -> ({_t([n, m], d)}, {_t([], d)}) {{
  %y = graph.sigmoid %x : {_t([n, m], d)}
  %mx = graph.reduce_max %x {{dims = [0, 1]}} : {_t([], d)}
  return %y, %mx : {_t([n, m], d)}, {_t([], d)}
}}
"""


def _column_sum(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// Sum over dim 0: the reduced dimension is the strided one.
func @column_sum(%x: {_t([n, m], d)}) -> {_t([m], d)} {{
  %s = graph.reduce_sum %x {{dims = [0]}} : {_t([m], d)}
  return %s : {_t([m], d)}
}}
"""


def _leading_sum(s: Shape) -> str:
    b, n, m, d = s.dims["b"], s.dims["n"], s.dims["m"], s.dtype
    return f"""// Sum over the two leading dims of [B,S,H] (a bias gradient).
func @leading_sum(%x: {_t([b, n, m], d)}) -> {_t([m], d)} {{
  %s = graph.reduce_sum %x {{dims = [0, 1]}} : {_t([m], d)}
  return %s : {_t([m], d)}
}}
"""


def _middle_mean(s: Shape) -> str:
    b, n, m, d = s.dims["b"], s.dims["n"], s.dims["m"], s.dtype
    return f"""// Mean over the middle dim of [B,S,H] (pooling over a sequence).
func @middle_mean(%x: {_t([b, n, m], d)}) -> {_t([b, m], d)} {{
  %s = graph.reduce_mean %x {{dims = [1]}} : {_t([b, m], d)}
  return %s : {_t([b, m], d)}
}}
"""


def _batchnorm_stats(s: Shape) -> str:
    n, c, d = s.dims["n"], s.dims["c"], s.dtype
    x, row = _t([n, c], d), _t([1, c], d)
    return f"""// Batch norm (training statistics): normalize each column over the rows.
func @batchnorm_stats(%x: {x}) -> {x} {{
  %mean = graph.reduce_mean %x {{dims = [0], keepdim = true}} : {row}
  %c = graph.sub %x, %mean : {x}
  %sq = graph.mul %c, %c : {x}
  %var = graph.reduce_mean %sq {{dims = [0], keepdim = true}} : {row}
  %eps = graph.constant {{value = 1.0e-5}} : {_t([], d)}
  %ve = graph.add %var, %eps : {row}
  %inv = graph.rsqrt %ve : {row}
  %y = graph.mul %c, %inv : {x}
  return %y : {x}
}}
"""


def _transpose_add(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// x.T + y: one operand read across rows.
func @transpose_add(%x: {_t([m, n], d)}, %y: {_t([n, m], d)}) -> {_t([n, m], d)} {{
  %xt = graph.transpose %x {{perm = [1, 0]}} : {_t([n, m], d)}
  %z = graph.add %xt, %y : {_t([n, m], d)}
  return %z : {_t([n, m], d)}
}}
"""


def _permute_heads(s: Shape) -> str:
    b, h, n, k, d = s.dims["b"], s.dims["h"], s.dims["n"], s.dims["k"], s.dtype
    src, dst = _t([b, n, h, k], d), _t([b, h, n, k], d)
    return f"""// [B,S,H,D] -> [B,H,S,D] times a scale (splitting attention heads).
func @permute_heads(%x: {src}) -> {dst} {{
  %p = graph.transpose %x {{perm = [0, 2, 1, 3]}} : {dst}
  %c = graph.constant {{value = 0.125}} : {_t([], d)}
  %y = graph.mul %p, %c : {dst}
  return %y : {dst}
}}
"""


def _softmax_vocab(s: Shape) -> str:
    n, v, d = s.dims["rows"], s.dims["vocab"], s.dtype
    return f"""// Softmax over vocabulary-sized rows.
func @softmax_vocab(%x: {_t([n, v], d)}) -> {_t([n, v], d)} {{
  %y = graph.softmax %x {{dim = 1}} : {_t([n, v], d)}
  return %y : {_t([n, v], d)}
}}
"""


def _softmax_columns(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// Softmax over dim 0 (Inductor's test_softmax_outer).
func @softmax_columns(%x: {_t([n, m], d)}) -> {_t([n, m], d)} {{
  %y = graph.softmax %x {{dim = 0}} : {_t([n, m], d)}
  return %y : {_t([n, m], d)}
}}
"""


def _logsumexp_reshape(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    col = _t([n, 1], d)
    return f"""// logsumexp over rows, computed on [N,1] and returned as [N]: the reshape is a view.
func @logsumexp_reshape(%x: {_t([n, m], d)}) -> {_t([n], d)} {{
  %m = graph.reduce_max %x {{dims = [1], keepdim = true}} : {col}
  %s = graph.sub %x, %m : {_t([n, m], d)}
  %e = graph.exp %s : {_t([n, m], d)}
  %z = graph.reduce_sum %e {{dims = [1], keepdim = true}} : {col}
  %l = graph.log %z : {col}
  %y = graph.add %l, %m : {col}
  %r = graph.reshape %y : {_t([n], d)}
  return %r : {_t([n], d)}
}}
"""


def _reshape_output(s: Shape) -> str:
    b, n, m, d = s.dims["b"], s.dims["n"], s.dims["m"], s.dtype
    full, out = _t([b, n, m], d), _t([b * n, m], d)
    return f"""// A computed value returned reshaped ([B,S,H] -> [B*S,H]): the reshape is a view.
func @reshape_output(%x: {full}, %w: {_t([m], d)}) -> {out} {{
  %a = graph.mul %x, %w : {full}
  %r = graph.relu %a : {full}
  %y = graph.reshape %r : {out}
  return %y : {out}
}}
"""


def _transpose_output(s: Shape) -> str:
    b, n, m, d = s.dims["b"], s.dims["n"], s.dims["m"], s.dtype
    full, out = _t([b, n, m], d), _t([b, m, n], d)
    return f"""// A computed value returned transposed ([B,S,C] -> [B,C,S]): the transpose is a view.
func @transpose_output(%x: {full}) -> {out} {{
  %a = graph.silu %x : {full}
  %y = graph.transpose %a {{perm = [0, 2, 1]}} : {out}
  return %y : {out}
}}
"""


def _cos_reshape_cos(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// cos -> reshape -> cos: a row-major reshape changes no element order (one kernel).
func @cos_reshape_cos(%x: {_t([n * m], d)}, %w: {_t([m], d)}) -> {_t([n, m], d)} {{
  %a = graph.cos %x : {_t([n * m], d)}
  %r = graph.reshape %a : {_t([n, m], d)}
  %b = graph.cos %r : {_t([n, m], d)}
  %y = graph.mul %b, %w : {_t([n, m], d)}
  return %y : {_t([n, m], d)}
}}
"""


def _batchnorm_nchw(s: Shape) -> str:
    n, c, h, d = s.dims["n"], s.dims["c"], s.dims["h"], s.dtype
    x, col = _t([n, c, h], d), _t([c], d)
    return f"""// Batch-norm statistics of an NCHW batch (H*W flattened): each channel's mean and
// mean of squares, over the batch and the pixels (one pass over x reads it once).
func @batchnorm_nchw(%x: {x}) -> ({col}, {col}) {{
  %m = graph.reduce_mean %x {{dims = [0, 2]}} : {col}
  %sq = graph.mul %x, %x : {x}
  %q = graph.reduce_mean %sq {{dims = [0, 2]}} : {col}
  return %m, %q : {col}, {col}
}}
"""


def _permute_reduce(s: Shape) -> str:
    a, b, c, d = s.dims["a"], s.dims["b"], s.dims["c"], s.dtype
    src, dst = _t([a, b, c], d), _t([c, a, b], d)
    return f"""// A permute plus a bias, centered over its middle dim: the sum and the output
// computed in x's order, the permute returned as a view (eager's layout).
func @permute_reduce(%x: {src}, %w: {_t([b], d)}) -> {dst} {{
  %t = graph.transpose %x {{perm = [2, 0, 1]}} : {dst}
  %z = graph.add %t, %w : {dst}
  %y = graph.reduce_sum %z {{dims = [1], keepdim = true}} : {_t([c, 1, b], d)}
  %o = graph.sub %z, %y : {dst}
  return %o : {dst}
}}
"""


def _softmax_middle(s: Shape) -> str:
    b, n, m, d = s.dims["b"], s.dims["n"], s.dims["m"], s.dtype
    x = _t([b, n, m], d)
    return f"""// Softmax over the middle dim of [B,S,H]: a column softmax of each batch.
func @softmax_middle(%x: {x}) -> {x} {{
  %y = graph.softmax %x {{dim = 1}} : {x}
  return %y : {x}
}}
"""


def _middle_max(s: Shape) -> str:
    a, b, c, d = s.dims["a"], s.dims["b"], s.dims["c"], s.dtype
    return f"""// Max over the middle dim of [A,B,C] with a narrow inner dim C.
func @middle_max(%x: {_t([a, b, c], d)}) -> {_t([a, c], d)} {{
  %s = graph.reduce_max %x {{dims = [1]}} : {_t([a, c], d)}
  return %s : {_t([a, c], d)}
}}
"""


def _transpose_tanh(s: Shape) -> str:
    a, b, c, d = s.dims["a"], s.dims["b"], s.dims["c"], s.dtype
    out = _t([a, c, b], d)
    return f"""// tanh(x.transpose(1, 2) * y): one operand of a batched product read across rows.
func @transpose_tanh(%x: {_t([a, b, c], d)}, %y: {out}) -> {out} {{
  %t = graph.transpose %x {{perm = [0, 2, 1]}} : {out}
  %z = graph.mul %t, %y : {out}
  %r = graph.tanh %z : {out}
  return %r : {out}
}}
"""


def _gemm_bias_gelu(s: Shape) -> str:
    m, k, n, d = s.dims["m"], s.dims["k"], s.dims["n"], s.dtype
    return f"""// GEMM with a bias and the exact (erf) GELU epilogue.
func @gemm_bias_gelu(%x: {_t([m, k], d)}, %w: {_t([k, n], d)}, %b: {_t([n], d)}) -> {_t([m, n], d)} {{
  %mm = graph.matmul %x, %w : {_t([m, n], d)}
  %a = graph.add %mm, %b : {_t([m, n], d)}
  %y = graph.gelu %a : {_t([m, n], d)}
  return %y : {_t([m, n], d)}
}}
"""


def _gemm_kernels(s: Shape, library: bool = False) -> int:
    """The GEMM's kernel, and the copy of each operand `pad-gemm-operands` pads (half
    precision, rows not 16-byte aligned or, for the right operand stored [K, N] read
    by 32 row tiles, not 128, a persistent GEMM), `split-tf32-gemm-operands` stores
    as TF32 parts or `k-major-gemm-operands` makes K-major (f32), and the partial
    products' stage where `split-k` splits an f32 GEMM's K, and the two kernels of a
    split tail (`tile.tail_split`, an H200's 132 SMs): the passes up to `tile` are
    asked, on the row's program. Where the compile moved the GEMM to the library,
    `library-gemm` runs first: its operand copies and the epilogue remain."""
    import irc
    from irc.dialects import loop
    from irc.pipeline import LOWERING, run_pipeline

    module = irc.parse(_gemm_bias_gelu(s), "gemm_bias_gelu.ir")
    passes = ["fuse", *LOWERING[: LOWERING.index("tile") + 1]]
    if library:
        passes.insert(passes.index("pad-gemm-operands"), "library-gemm")
    run_pipeline(module, ",".join(passes))
    return sum(_launches(k) for k in loop.kernels(module))


def _uses_library(module: Any) -> bool:
    """Whether a compiled module runs a GEMM on the library (`loop.library_matmul`)."""
    from irc.dialects import loop

    return any(isinstance(op, loop.LibraryMatmulOp) for op in module.walk())


def _launches(kernel: Any) -> int:
    """Kernels a tiled loop.kernel launches: 1, or a split tail's partials and fixup and
    the persistent kernel of the tiles before them (none where the tail is all)."""
    from irc.lowering.loop_to_tile import tiles_before_tail
    from irc.passes.tile import kernel_shape, tiling_of

    if kernel.tail is None:
        return 1
    return 2 + (tiles_before_tail(kernel_shape(kernel), tiling_of(kernel)) > 0)


def _causal_attention(s: Shape) -> str:
    b, n, k, d = s.dims["b"], s.dims["s"], s.dims["d"], s.dtype
    qkv, scores = _t([b, n, k], d), _t([b, n, n], d)
    scale = 1.0 / math.sqrt(k)
    return f"""// Causal attention written out: matmul, scale, where-mask, softmax, matmul.
func @causal_attention(%q: {qkv}, %k: {qkv}, %v: {qkv}, %mask: {_t([n, n], "i1")}) -> {qkv} {{
  %kt = graph.transpose %k {{perm = [0, 2, 1]}} : {_t([b, k, n], d)}
  %s = graph.matmul %q, %kt : {scores}
  %c = graph.constant {{value = {scale!r}}} : {_t([], d)}
  %ss = graph.mul %s, %c : {scores}
  %ninf = graph.constant {{value = -inf}} : {_t([], d)}
  %w = graph.where %mask, %ss, %ninf : {scores}
  %p = graph.softmax %w {{dim = 2}} : {scores}
  %o = graph.matmul %p, %v : {qkv}
  return %o : {qkv}
}}
"""


def _neighbor(s: Shape) -> str:
    n, k, d = s.dims["n"], s.dims["k"], s.dtype
    return f"""// ((a - b)**2).sum(-1).amax(1): Inductor's test_neighbor (a small inner reduction).
func @neighbor(%a: {_t([n, 1, k], d)}, %b: {_t([1, n, k], d)}) -> {_t([n], d)} {{
  %df = graph.sub %a, %b : {_t([n, n, k], d)}
  %sq = graph.mul %df, %df : {_t([n, n, k], d)}
  %s = graph.reduce_sum %sq {{dims = [2]}} : {_t([n, n], d)}
  %m = graph.reduce_max %s {{dims = [1]}} : {_t([n], d)}
  return %m : {_t([n], d)}
}}
"""


def _neighbor_kernels(s: Shape, library: bool = False) -> int:
    """1 where the sum over k unrolls into the max's kernel (`decompose.unrolled_fits`),
    else 2."""
    import irc
    from irc.dialects import graph
    from irc.passes.decompose import unrolled_fits
    from irc.passes.fuse import MAX_OPS

    (sums,) = [
        o for o in irc.parse(_neighbor(s), "neighbor.ir").walk() if isinstance(o, graph.ReduceSumOp)
    ]
    return 1 if unrolled_fits(sums, s.dims["k"], MAX_OPS) else 2


def _shared_producer(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// cos(a * b) of an outer product, summed over each dim: a cheap shared producer of two
// reductions (Inductor's test_partitioning_keops), recomputed rather than written.
func @shared_producer(%a: {_t([n, 1], d)}, %b: {_t([1, m], d)}) -> ({_t([n], d)}, {_t([m], d)}) {{
  %p = graph.mul %a, %b : {_t([n, m], d)}
  %c = graph.cos %p : {_t([n, m], d)}
  %rows = graph.reduce_sum %c {{dims = [1]}} : {_t([n], d)}
  %cols = graph.reduce_sum %c {{dims = [0]}} : {_t([m], d)}
  return %rows, %cols : {_t([n], d)}, {_t([m], d)}
}}
"""


def _row_and_column_sum(s: Shape) -> str:
    n, m, d = s.dims["n"], s.dims["m"], s.dtype
    return f"""// sum(x, 1) and sum(x, 0) of one input (two reductions over different dims).
func @row_and_column_sum(%x: {_t([n, m], d)}) -> ({_t([n], d)}, {_t([m], d)}) {{
  %rows = graph.reduce_sum %x {{dims = [1]}} : {_t([n], d)}
  %cols = graph.reduce_sum %x {{dims = [0]}} : {_t([m], d)}
  return %rows, %cols : {_t([n], d)}, {_t([m], d)}
}}
"""


def _layernorm_amax(s: Shape) -> str:
    n, h, d = s.dims["n"], s.dims["h"], s.dtype
    x, col = _t([n, h], d), _t([n, 1], d)
    return f"""// Layer norm, then amax(abs(y)) over everything and sigmoid(y * scale): Inductor's
// test_reduction_pointwise_multi_level_reduction. `x - mean` need not be written full-size.
func @layernorm_amax(%x: {x}, %w: {_t([h], d)}, %b: {_t([h], d)}, %scale: {_t([1], d)}) -> ({x}, {_t([], d)}) {{
  %mean = graph.reduce_mean %x {{dims = [1], keepdim = true}} : {col}
  %c = graph.sub %x, %mean : {x}
  %sq = graph.mul %c, %c : {x}
  %var = graph.reduce_mean %sq {{dims = [1], keepdim = true}} : {col}
  %eps = graph.constant {{value = 1.0e-5}} : {_t([], d)}
  %ve = graph.add %var, %eps : {col}
  %inv = graph.rsqrt %ve : {col}
  %nrm = graph.mul %c, %inv : {x}
  %sw = graph.mul %nrm, %w : {x}
  %y = graph.add %sw, %b : {x}
  %ab = graph.abs %y : {x}
  %amax = graph.reduce_max %ab {{dims = [0, 1]}} : {_t([], d)}
  %ys = graph.mul %y, %scale : {x}
  %sg = graph.sigmoid %ys : {x}
  return %sg, %amax : {x}, {_t([], d)}
}}
"""


def _workloads() -> list[Workload]:
    import torch
    import torch.nn.functional as F

    def full_reduce_beside(x: Any) -> Any:
        return torch.sigmoid(x), x.amax()

    def column_sum(x: Any) -> Any:
        return x.sum(0)

    def leading_sum(x: Any) -> Any:
        return x.sum((0, 1))

    def middle_mean(x: Any) -> Any:
        return x.mean(1)

    def batchnorm_stats(x: Any) -> Any:
        mean = x.mean(0, keepdim=True)
        c = x - mean
        var = (c * c).mean(0, keepdim=True)
        return c * torch.rsqrt(var + 1e-5)

    def transpose_add(x: Any, y: Any) -> Any:
        return x.t() + y

    def permute_heads(x: Any) -> Any:
        return x.permute(0, 2, 1, 3) * 0.125

    def softmax_vocab(x: Any) -> Any:
        return torch.softmax(x, 1)

    def softmax_columns(x: Any) -> Any:
        return torch.softmax(x, 0)

    def logsumexp_reshape(x: Any) -> Any:
        return torch.logsumexp(x, 1)

    def reshape_output(x: Any, w: Any) -> Any:
        return torch.relu(x * w).flatten(0, 1)

    def transpose_output(x: Any) -> Any:
        return F.silu(x).transpose(1, 2)

    def cos_reshape_cos(x: Any, w: Any) -> Any:
        return x.cos().view(-1, w.shape[0]).cos() * w

    def batchnorm_nchw(x: Any) -> Any:
        return x.mean((0, 2)), (x * x).mean((0, 2))

    def permute_reduce(x: Any, w: Any) -> Any:
        z = x.permute(2, 0, 1) + w
        return z - z.sum(1, keepdim=True)

    def softmax_middle(x: Any) -> Any:
        return torch.softmax(x, 1)

    def middle_max(x: Any) -> Any:
        return x.amax(1)

    def transpose_tanh(x: Any, y: Any) -> Any:
        return torch.tanh(x.transpose(1, 2) * y)

    def gemm_bias_gelu(x: Any, w: Any, b: Any) -> Any:
        return F.gelu(x @ w + b)

    def causal_attention(q: Any, k: Any, v: Any, mask: Any) -> Any:
        s = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1]))
        s = torch.where(mask, s, float("-inf"))
        return torch.softmax(s, -1) @ v

    def neighbor(a: Any, b: Any) -> Any:
        return ((a - b) ** 2).sum(dim=-1).amax(dim=1)

    def shared_producer(a: Any, b: Any) -> Any:
        c = (a * b).cos()
        return c.sum(1), c.sum(0)

    def row_and_column_sum(x: Any) -> Any:
        return x.sum(1), x.sum(0)

    def layernorm_amax(x: Any, w: Any, b: Any, scale: Any) -> Any:
        y = F.layer_norm(x, (x.shape[1],), w, b, 1e-5)
        return torch.sigmoid(y * scale), y.abs().amax()

    def attention_inputs(s: Shape, dev: str) -> list[Any]:
        qkv = [_randn([s.dims["b"], s.dims["s"], s.dims["d"]], s.dtype, dev) for _ in range(3)]
        mask = torch.ones(s.dims["s"], s.dims["s"], dtype=torch.bool, device=dev).tril()
        return [*qkv, mask]

    def layernorm_inputs(s: Shape, dev: str) -> list[Any]:
        n, h = s.dims["n"], s.dims["h"]
        return [_randn([n, h], s.dtype, dev), _randn([h], s.dtype, dev),
                _randn([h], s.dtype, dev), _randn([1], s.dtype, dev)]  # fmt: skip

    return [
        Workload("full_reduce_beside", "full reduction beside a full-size output",
                 _full_reduce_beside, full_reduce_beside, _inputs(_dims("n", "m")),
                 [_S("f32", n=8192, m=8192), _S("bf16", n=6007, m=4099)],
                 _S("f32", n=67, m=130)),
        Workload("column_sum", "column reduction", _column_sum, column_sum,
                 _inputs(_dims("n", "m")),
                 [_S("f32", n=8192, m=8192), _S("f32", n=50000, m=129), _S("bf16", n=3001, m=5003)],
                 _S("f32", n=130, m=67)),
        Workload("leading_sum", "column reduction (two leading dims)", _leading_sum, leading_sum,
                 _inputs(_dims("b", "n", "m")),
                 [_S("bf16", b=32, n=2048, m=768), _S("f32", b=17, n=999, m=1024)],
                 _S("f32", b=3, n=33, m=40)),
        Workload("middle_mean", "column reduction (middle dim)", _middle_mean, middle_mean,
                 _inputs(_dims("b", "n", "m")),
                 [_S("f32", b=32, n=2048, m=256), _S("f16", b=7, n=4099, m=129)],
                 _S("f32", b=3, n=45, m=20)),
        Workload("batchnorm_stats", "batch-norm statistics", _batchnorm_stats, batchnorm_stats,
                 _inputs(_dims("n", "c")),
                 [_S("f32", n=65536, c=256), _S("f32", n=30011, c=96), _S("bf16", n=16384, c=1000)],
                 _S("f32", n=150, c=24)),
        Workload("transpose_add", "transposed operand", _transpose_add, transpose_add,
                 _inputs(_dims("m", "n"), _dims("n", "m")),
                 [_S("f32", n=8192, m=8192), _S("bf16", n=4097, m=2049)],
                 _S("f32", n=40, m=70)),
        Workload("permute_heads", "transposed operand (4-D permute)", _permute_heads, permute_heads,
                 _inputs(_dims("b", "n", "h", "k")),
                 [_S("bf16", b=16, h=32, n=1024, k=128), _S("f32", b=3, h=17, n=1023, k=96)],
                 _S("f32", b=2, h=3, n=17, k=8)),
        Workload("softmax_vocab", "long rows", _softmax_vocab, softmax_vocab,
                 _inputs(_dims("rows", "vocab")),
                 [_S("bf16", rows=4096, vocab=50257), _S("f32", rows=4096, vocab=50257),
                  _S("f16", rows=1000, vocab=32003), _S("bf16", rows=1094, vocab=59372)],
                 _S("f32", rows=3, vocab=2053)),
        Workload("softmax_columns", "column reduction (softmax over dim 0)", _softmax_columns,
                 softmax_columns, _inputs(_dims("n", "m")),
                 [_S("f32", n=8192, m=1024), _S("bf16", n=2049, m=4097)],
                 _S("f32", n=70, m=33)),
        Workload("logsumexp_reshape", "reshape of a kernel's output", _logsumexp_reshape,
                 logsumexp_reshape, _inputs(_dims("n", "m")),
                 [_S("f32", n=8192, m=8192), _S("bf16", n=4096, m=32000), _S("f32", n=8191, m=3001)],
                 _S("f32", n=33, m=70), irc_kernels=lambda s, library: 1),
        Workload("reshape_output", "reshape of a kernel's output", _reshape_output, reshape_output,
                 _inputs(_dims("b", "n", "m"), _dims("m")),
                 [_S("f32", b=64, n=128, m=8192), _S("bf16", b=3, n=4099, m=1001)],
                 _S("f32", b=3, n=5, m=33), irc_kernels=lambda s, library: 1),
        Workload("transpose_output", "transpose of a kernel's output", _transpose_output,
                 transpose_output, _inputs(_dims("b", "n", "m")),
                 [_S("bf16", b=8, n=4096, m=1024), _S("f32", b=3, n=2049, m=1001)],
                 _S("f32", b=2, n=17, m=9), irc_kernels=lambda s, library: 1),
        Workload("cos_reshape_cos", "reshape of a kernel's output (fusion across it)",
                 _cos_reshape_cos, cos_reshape_cos, _inputs(lambda s: [s.dims["n"] * s.dims["m"]],
                                                            _dims("m")),
                 [_S("f32", n=8192, m=8192), _S("bf16", n=3001, m=4097)],
                 _S("f32", n=9, m=31), irc_kernels=lambda s, library: 1),
        Workload("batchnorm_nchw", "batch-norm statistics (NCHW: two statistics in one pass)",
                 _batchnorm_nchw, batchnorm_nchw, _inputs(_dims("n", "c", "h")),
                 [_S("bf16", n=64, c=256, h=3136), _S("f32", n=32, c=512, h=785),
                  _S("f32", n=128, c=64, h=2401)],
                 _S("f32", n=2, c=3, h=40)),
        Workload("permute_reduce", "transposed operand (a permute read by a reduction)",
                 _permute_reduce, permute_reduce, _inputs(_dims("a", "b", "c"), _dims("b")),
                 [_S("f32", a=512, b=1024, c=96), _S("bf16", a=301, b=777, c=129)],
                 _S("f32", a=5, b=3, c=4)),
        Workload("softmax_middle", "column reduction (softmax over a middle dim)", _softmax_middle,
                 softmax_middle, _inputs(_dims("b", "n", "m")),
                 [_S("f32", b=64, n=1024, m=129), _S("bf16", b=16, n=333, m=4096)],
                 _S("f32", b=2, n=9, m=5)),
        Workload("middle_max", "column reduction (max over a middle dim, narrow inner dim)",
                 _middle_max, middle_max, _inputs(_dims("a", "b", "c")),
                 [_S("f32", a=4096, b=517, c=7), _S("bf16", a=999, b=2001, c=33)],
                 _S("f32", a=3, b=20, c=3)),
        Workload("transpose_tanh", "transposed operand (3-d, with tanh)", _transpose_tanh,
                 transpose_tanh, _inputs(_dims("a", "b", "c"), _dims("a", "c", "b")),
                 [_S("bf16", a=64, b=1111, c=777), _S("f32", a=5, b=3001, c=2999)],
                 _S("f32", a=2, b=9, c=5)),
        Workload("gemm_bias_gelu", "GEMM + bias + exact GELU", _gemm_bias_gelu, gemm_bias_gelu,
                 _inputs(_dims("m", "k"), _dims("k", "n"), _dims("n")),
                 [_S("bf16", m=8192, k=4096, n=4096), _S("bf16", m=3000, k=1023, n=2049),
                  _S("f16", m=4096, k=4096, n=4096), _S("f32", m=4429, k=820, n=1208)],
                 _S("f32", m=33, k=20, n=17), floor="torch.mm", irc_kernels=_gemm_kernels),
        Workload("causal_attention", "causal attention written out", _causal_attention,
                 causal_attention, attention_inputs,
                 [_S("bf16", b=32, s=1024, d=64), _S("bf16", b=12, s=1000, d=64),
                  _S("f16", b=8, s=2048, d=128)],
                 _S("f32", b=2, s=17, d=8), floor="sdpa"),
        Workload("neighbor", "peer: two reductions, a small inner one (test_neighbor)", _neighbor,
                 neighbor, _inputs(lambda s: [s.dims["n"], 1, s.dims["k"]],
                                   lambda s: [1, s.dims["n"], s.dims["k"]]),
                 [_S("f32", n=4096, k=8), _S("f32", n=1000, k=4), _S("bf16", n=3001, k=3)],
                 _S("f32", n=10, k=4), irc_kernels=_neighbor_kernels),
        Workload("shared_producer", "peer: cheap shared producer of two reductions (keops)",
                 _shared_producer, shared_producer,
                 _inputs(lambda s: [s.dims["n"], 1], lambda s: [1, s.dims["m"]]),
                 [_S("f32", n=8192, m=8192), _S("bf16", n=4099, m=3001)],
                 _S("f32", n=20, m=20)),
        Workload("row_and_column_sum", "peer: two reductions over different dims of one input",
                 _row_and_column_sum, row_and_column_sum, _inputs(_dims("n", "m")),
                 [_S("f32", n=8192, m=8192), _S("f32", n=4099, m=3001)],
                 _S("f32", n=10, m=10)),
        Workload("layernorm_amax", "peer: layer norm then a multi-level reduction",
                 _layernorm_amax, layernorm_amax, layernorm_inputs,
                 [_S("f32", n=8192, h=4096), _S("bf16", n=3001, h=1023)],
                 _S("f32", n=12, h=40)),
    ]  # fmt: skip


# ---- measuring -----------------------------------------------------------------------------


def _cpu_timer(fn: Callable[[], Any], reps: int = 1) -> float:
    """Wall-clock ms of a call on the CPU (the smoke run's times: they mean nothing)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def _floor_fn(w: Workload, args: list[Any]) -> Callable[[], Any] | None:
    import torch.nn.functional as F

    if w.floor == "torch.mm":
        return lambda: args[0] @ args[1]
    if w.floor == "sdpa":
        q, k, v = args[:3]
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return None


def measure(
    w: Workload, shape: Shape, device: str, bw: float | None, ir_dir: Path, with_compile: bool
) -> dict[str, Any]:
    """One row: one workload at one shape."""
    import torch

    import irc

    gpu = device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    path = ir_dir / f"{w.name}-{shape.label.replace(' ', '-')}.ir"
    path.write_text(w.ir(shape))
    torch.manual_seed(0)
    args = w.inputs(shape, device)
    sync()
    t0 = time.perf_counter()
    compiled = irc.compile(path, device=device)
    irc_fn = compiled[w.name]
    got = bench._outputs(irc_fn(*args))
    sync()
    irc_cold = time.perf_counter() - t0

    tc_fn: Callable[..., Any] | None = None
    tc_cold: float | None = None
    if with_compile:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        tc_fn = torch.compile(w.torch_fn)
        tc_fn(*args)
        sync()
        tc_cold = time.perf_counter() - t0

    want = bench._outputs(w.torch_fn(*args))
    verdict = bench.correctness(path, w.name, args, got, want)

    timed: dict[str, Callable[[], Any]] = {
        "eager": lambda: w.torch_fn(*args),
        "irc": lambda: irc_fn(*args),
    }
    if tc_fn is not None:
        compiled_fn = tc_fn
        timed["compile"] = lambda: compiled_fn(*args)
    floor_fn = _floor_fn(w, args)
    if floor_fn is not None:
        timed["floor"] = floor_fn
    ms = bench.interleaved_medians(timed) if gpu else {k: _cpu_timer(f) for k, f in timed.items()}
    floor_bytes = bench._bytes(args) + bench._bytes(want)
    if floor_fn is not None:
        floor_ms: float | None = ms["floor"]
    elif bw:
        floor_ms = floor_bytes / bw * 1e3
    else:
        floor_ms = None
    compile_ms = ms.get("compile")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    row: dict[str, Any] = {
        "workload": w.name,
        "shape": shape.label,
        "covers": w.row,
        "floor_kind": w.floor,
        "floor_bytes": floor_bytes,
        "eager_ms": ms["eager"],
        "compile_ms": compile_ms,
        "irc_ms": ms["irc"],
        "floor_ms": floor_ms,
        "irc_over_eager": ratio(ms["irc"], ms["eager"]),
        "irc_over_compile": ratio(ms["irc"], compile_ms),
        "irc_over_floor": ratio(ms["irc"], floor_ms),
        "compile_over_floor": ratio(compile_ms, floor_ms),
        "kernels_irc_static": compiled.kernel_count,
        "kernels_irc_expected": w.irc_kernels(shape, _uses_library(compiled.module))
        if w.irc_kernels
        else None,
        "kernels_eager": bench.kernel_count(lambda: w.torch_fn(*args)) if gpu else None,
        "kernels_compile": (
            bench.kernel_count(lambda: tc_fn(*args)) if gpu and tc_fn is not None else None
        ),
        "kernels_irc": bench.kernel_count(lambda: irc_fn(*args)) if gpu else compiled.kernel_count,
        "cold_compile_s": tc_cold,
        "cold_irc_s": irc_cold,
        **verdict,
    }
    return row


def _fmt(value: Any, spec: str) -> str:
    """`value` formatted by `spec`; a missing value is a dash of the same width."""
    if value is None:
        width = spec.split(".")[0].rstrip("df")
        return format("—", f">{width}") if width else "—"
    return format(value, spec)


HEADER = (
    f"{'workload':<20} {'shape':<22} {'eager ms':>9} {'tc ms':>9} {'irc ms':>9} {'floor ms':>9} "
    f"{'irc/eag':>7} {'irc/tc':>7} {'irc/flr':>7} {'tc/flr':>7} {'k e/tc/irc':>11}  ok"
)


def format_row(r: dict[str, Any]) -> str:
    kernels = "/".join(
        _fmt(r[k], "d") for k in ("kernels_eager", "kernels_compile", "kernels_irc")
    )
    text = (
        f"{r['workload']:<20} {r['shape']:<22} {_fmt(r['eager_ms'], '9.3f')} "
        f"{_fmt(r['compile_ms'], '9.3f')} {_fmt(r['irc_ms'], '9.3f')} {_fmt(r['floor_ms'], '9.3f')} "
        f"{_fmt(r['irc_over_eager'], '7.3f')} {_fmt(r['irc_over_compile'], '7.3f')} "
        f"{_fmt(r['irc_over_floor'], '7.3f')} {_fmt(r['compile_over_floor'], '7.3f')} "
        f"{kernels:>11}  {'ok' if r['correct'] else 'MISMATCH'}"
    )
    return text + ("  " + "; ".join(row_notes(r)) if row_notes(r) else "")


def row_notes(r: dict[str, Any]) -> list[str]:
    notes = []
    if r["floor_kind"] != "bytes":
        notes.append(f"floor is {r['floor_kind']}")
    expected = r.get("kernels_irc_expected")
    if expected is not None and r["kernels_irc_static"] != expected:
        notes.append(f"irc emits {r['kernels_irc_static']} kernels, {expected} expected")
    if not r["correct"]:
        notes.append(
            f"MISMATCH max abs err {r['max_abs_err']:.3g} (eager {r['eager_max_abs_err']:.3g})"
        )
    return notes


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Device: {result['device']}; torch {result['torch']}, triton {result['triton']}, "
        f"Python {result['python']}; {result['date']}. Copy bandwidth "
        f"{_fmt(result['copy_bandwidth_GBps'], '.0f')} GB/s.",
        "",
        "| workload | shape | eager ms | torch.compile ms | irc ms | floor ms | irc/eager "
        "| irc/compile | irc/floor | compile/floor | kernels eager/compile/irc | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        kernels = "/".join(
            _fmt(r[k], "d") for k in ("kernels_eager", "kernels_compile", "kernels_irc")
        )
        lines.append(
            f"| {r['workload']} | {r['shape']} | {_fmt(r['eager_ms'], '.3f')} "
            f"| {_fmt(r['compile_ms'], '.3f')} | {_fmt(r['irc_ms'], '.3f')} "
            f"| {_fmt(r['floor_ms'], '.3f')} | {_fmt(r['irc_over_eager'], '.3f')} "
            f"| {_fmt(r['irc_over_compile'], '.3f')} | {_fmt(r['irc_over_floor'], '.3f')} "
            f"| {_fmt(r['compile_over_floor'], '.3f')} | {kernels} | {'; '.join(row_notes(r))} |"
        )
    return "\n".join(lines) + "\n"


def perturbed(shape: Shape, rng: random.Random) -> Shape:
    """`shape` at a size the suite never had: each dim times a random factor of
    0.25-1.6 (odd sizes included), f32 or bf16 at random (f16 kept), so that a rule
    tuned to the suite's own shapes shows (issue 16's acceptance is measured so)."""
    dims = {k: max(1, int(v * rng.uniform(0.25, 1.6))) for k, v in shape.dims.items()}
    dtype = shape.dtype if shape.dtype == "f16" else rng.choice(["f32", "bf16"])
    return Shape(dims, dtype)


def run(
    only: list[str] | None,
    smoke: bool,
    with_compile: bool,
    ir_dir: Path,
    unseen: int | None = None,
) -> dict[str, Any]:
    import torch
    import triton

    device = "cpu" if smoke else "cuda"
    bw = None if smoke else bench.copy_bandwidth()
    rows: list[dict[str, Any]] = []
    rng = random.Random(unseen)
    for w in _workloads():
        if only and w.name not in only:
            continue
        shapes = [w.smoke] if smoke else w.shapes
        if unseen is not None:
            shapes = [perturbed(s, rng) for s in shapes]
        for shape in shapes:
            try:
                row = measure(w, shape, device, bw, ir_dir, with_compile)
            except Exception as e:  # one failing row must not hide the others
                print(f"{w.name:<20} {shape.label:<22} FAILED: {type(e).__name__}: {e}", flush=True)
                rows.append({"workload": w.name, "shape": shape.label, "failed": repr(e)})
                continue
            rows.append(row)
            print(format_row(row), flush=True)
            if not smoke:
                torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name() if not smoke else "CPU (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "copy_bandwidth_GBps": bw / 1e9 if bw else None,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--compile", action="store_true", help="time torch.compile in --smoke too")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    ap.add_argument("--json", help="also write the raw results as JSON here")
    ap.add_argument("--write-ir", help="keep the generated .ir programs in this folder")
    ap.add_argument(
        "--unseen", type=int, metavar="SEED",
        help="every shape perturbed at random (seeded): sizes and types the suite never had",
    )
    args = ap.parse_args(argv)
    import torch

    names = {w.name for w in _workloads()}
    unknown = sorted(set(args.only or []) - names)
    if unknown:
        print(f"layouts: unknown workloads {unknown}; known: {sorted(names)}", file=sys.stderr)
        return 1
    if not args.smoke and not torch.cuda.is_available():
        print("layouts: needs a CUDA GPU (or --smoke for the CPU)", file=sys.stderr)
        return 1
    ir_dir = Path(args.write_ir) if args.write_ir else Path(tempfile.mkdtemp(prefix="irc-layouts-"))
    ir_dir.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    result = run(args.only, args.smoke, args.compile or not args.smoke, ir_dir, args.unseen)
    ok_rows = [r for r in result["rows"] if "failed" not in r]
    if args.markdown:
        body = {**result, "rows": ok_rows}
        failed = [r for r in result["rows"] if "failed" in r]
        text = markdown(body) + "".join(
            f"\nFAILED {r['workload']} {r['shape']}: {r['failed']}" for r in failed
        )
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    good = len(ok_rows) == len(result["rows"]) and all(r["correct"] for r in ok_rows)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
