"""`.ir` programs built from shapes, which the tests and benchmarks share.

A program several test files need (a GEMM with an epilogue, `cos -> reshape ->
cos`) is written here once, so that a change to the language or to a workload
changes one builder, and the files that test one pass each do not keep a copy
that drifts from the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ModuleOp


def tensor_type(shape: Sequence[int], el: str = "f32") -> str:
    """`tensor<4x5xf32>`; `tensor<f32>` for rank 0."""
    return "tensor<" + "".join(f"{d}x" for d in shape) + el + ">"


def gemm_text(
    m: int,
    n: int,
    k: int,
    el: str = "f32",
    *,
    act: str = "gelu",
    a_t: bool = False,
    b_t: bool = False,
    returns_product: bool = False,
) -> str:
    """`act(x @ w + b)` as `@f(%x, %w, %b)`: x [M, K] (stored [K, M] where `a_t`), w
    [K, N] (stored [N, K], an `nn.Linear` weight, where `b_t`), b [N]; with
    `returns_product` the product too (a second full-size store), first."""
    x_type = tensor_type((k, m) if a_t else (m, k), el)
    w_type = tensor_type((n, k) if b_t else (k, n), el)
    out = tensor_type((m, n), el)
    views = ""
    if a_t:
        views += "  %xt = graph.transpose %x {perm = [1, 0]}\n"
    if b_t:
        views += "  %wt = graph.transpose %w {perm = [1, 0]}\n"
    x, w = ("%xt" if a_t else "%x"), ("%wt" if b_t else "%w")
    results, types = ("%mm, %r", f"{out}, {out}") if returns_product else ("%r", out)
    signature = f"({types})" if returns_product else types
    return f"""func @f(%x: {x_type}, %w: {w_type}, %b: {tensor_type((n,), el)}) -> {signature} {{
{views}  %mm = graph.matmul {x}, {w}
  %a = graph.add %mm, %b
  %r = graph.{act} %a
  return {results} : {types}
}}
"""


def cos_reshape_cos(n: int, m: int, el: str = "f32") -> str:
    """`cos(reshape(cos(x))) * w`: x [N*M] viewed as [N, M] between two element-wise
    ops (a row-major reshape, which fuses), w [M] broadcast over the rows."""
    flat, rows, row = tensor_type((n * m,), el), tensor_type((n, m), el), tensor_type((m,), el)
    return f"""func @f(%x: {flat}, %w: {row}) -> {rows} {{
  %a = graph.cos %x : {flat}
  %r = graph.reshape %a : {rows}
  %b = graph.cos %r : {rows}
  %y = graph.mul %b, %w : {rows}
  return %y : {rows}
}}
"""


def loop_level(text: str, passes: str) -> ModuleOp:
    """`text` parsed, fused and lowered to the loop level (graph-to-loop,
    split-reduction), then through `passes` (the loop passes a test is about),
    and verified."""
    import irc
    from irc.pipeline import run_pipeline

    module = irc.parse(text, "program.ir")
    run_pipeline(module, f"fuse,decompose,graph-to-loop,split-reduction,{passes}")
    irc.verify(module)
    return module
