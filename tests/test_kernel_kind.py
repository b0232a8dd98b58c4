"""The kernel's kind and rows are decided once (irc/ir/kernel_kind.py) and read after.

`fuse` writes them on graph.fused; graph-to-loop lowers a reduction by the rows
written there and carries the kind onto loop.kernel; the passes after read it.
IR written without them gets the kind its ops make; a kind or rows written by
hand that are not the group's (or the body's) are located verifier errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdsl.dialects.builtin import ModuleOp, StringAttr

import irc
from irc.dialects import graph, loop
from irc.dialects.graph import kind_of_ops, row_geometry
from irc.ir.kernel_kind import NAME_PREFIX, GeometryMismatch, KernelKind, RowGeometry
from irc.passes.fuse import FusionGraph, kernel_schema
from irc.passes.tile import kernel_shape
from irc.syntax.printer import format_attr
from irc.testing.cli import run_opt

SOFTMAX_LN = """\
func @f(%x: tensor<6x4x10xf32>, %a: tensor<4x10xf32>, %w: tensor<10x3xf32>) -> (tensor<6x4x10xf32>, tensor<4x3xf32>, tensor<4xf32>) {
  %m = graph.reduce_max %x {dims = [2], keepdim = true} : tensor<6x4x1xf32>
  %s = graph.sub %x, %m : tensor<6x4x10xf32>
  %e = graph.exp %s : tensor<6x4x10xf32>
  %d = graph.reduce_sum %e {dims = [2], keepdim = true} : tensor<6x4x1xf32>
  %y = graph.div %e, %d : tensor<6x4x10xf32>
  %t = graph.tanh %a : tensor<4x10xf32>
  %p = graph.matmul %t, %w : tensor<4x3xf32>
  %r = graph.relu %p : tensor<4x3xf32>
  %c = graph.reduce_sum %x {dims = [0, 2]} : tensor<4xf32>
  %q = graph.sqrt %c : tensor<4xf32>
  return %y, %r, %q : tensor<6x4x10xf32>, tensor<4x3xf32>, tensor<4xf32>
}

func @attn(%q: tensor<2x8x4xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x8x4xf32>) -> tensor<2x8x4xf32> {
  %s = graph.matmul %q, %k : tensor<2x8x8xf32>
  %m = graph.reduce_max %s {dims = [2], keepdim = true} : tensor<2x8x1xf32>
  %c = graph.sub %s, %m : tensor<2x8x8xf32>
  %e = graph.exp %c : tensor<2x8x8xf32>
  %l = graph.reduce_sum %e {dims = [2], keepdim = true} : tensor<2x8x1xf32>
  %p = graph.div %e, %l : tensor<2x8x8xf32>
  %o = graph.matmul %p, %v : tensor<2x8x4xf32>
  return %o : tensor<2x8x4xf32>
}
"""


def _fused(text: str) -> tuple[ModuleOp, list[graph.FusedOp]]:
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    return module, [op for op in module.walk() if isinstance(op, graph.FusedOp)]


def test_fuse_records_kind_and_rows() -> None:
    module, fused = _fused(SOFTMAX_LN)
    by_kind = {op.kind: op for op in fused}
    assert set(by_kind) == {StringAttr(k) for k in KernelKind}
    softmax = by_kind[StringAttr("reduction")]
    assert isinstance(softmax, graph.FusedOp)
    # Two reduction kernels: the softmax rows (dims [2]) and the column sum (dims [0, 2]).
    rows = sorted(
        (loop.int_list(op.space), loop.int_list(op.dims))
        for op in fused
        if op.kind == StringAttr("reduction")
    )
    assert rows == [([6, 4, 10], [0, 2]), ([6, 4, 10], [2])]
    for op in fused:
        schema = kernel_schema(FusionGraph(op.body.block), FusionGraph(op.body.block).compute, None)
        assert op.kernel_kind() == schema.kind == kind_of_ops(op.body.block.ops)
        if schema.kind is KernelKind.REDUCTION:
            assert op.row_geometry() == schema.geometry
        else:
            assert op.space is None and op.dims is None
        # The name's prefix is the kind's, from the one table.
        assert isinstance(op.kernel, StringAttr)
        assert op.kernel.data.startswith(NAME_PREFIX[schema.kind] + "_")


def test_recorded_kind_prints_and_reads_back() -> None:
    module, _ = _fused(SOFTMAX_LN)
    text = irc.print_module(module)
    assert 'kind = "reduction", space = [6, 4, 10], dims = [2]' in text
    assert irc.print_module(irc.parse(text)) == text


def test_row_geometry_is_the_lowering_rows() -> None:
    """graph-to-loop lowers a reduction kernel over the rows fusion judged it on."""
    module, fused = _fused(SOFTMAX_LN)
    want = {
        op.kernel.data: op.row_geometry()  # type: ignore[union-attr]
        for op in fused
        if op.kernel_kind() is KernelKind.REDUCTION
    }
    irc.run_pipeline(module, "graph-to-loop")
    kernels = {k.kernel_name.data: k for k in loop.kernels(module)}
    for name, geometry in want.items():
        kernel = kernels[name]
        assert tuple(kernel.parallel_bounds()) == geometry.row
        shape = kernel_shape(kernel)
        assert shape.kind is KernelKind.REDUCTION and shape.reduction == geometry.reduced


def test_row_geometry() -> None:
    g = RowGeometry((6, 4, 10), (0, 2))
    assert (g.row, g.row_keep, g.reduced) == ((4,), (1, 4, 1), (6, 10))
    module = irc.parse(SOFTMAX_LN)
    reductions = [op for op in module.walk() if isinstance(op, graph.ReduceOp)]
    assert row_geometry(reductions[:2]) == RowGeometry((6, 4, 10), (2,))
    with pytest.raises(GeometryMismatch, match="different shapes or dims"):
        row_geometry(reductions)


def test_graph_to_loop_carries_the_kind() -> None:
    module, fused = _fused(SOFTMAX_LN)
    kinds = {op.kernel.data: op.kernel_kind() for op in fused}  # type: ignore[union-attr]
    irc.run_pipeline(module, "graph-to-loop")
    kernels = loop.kernels(module)
    assert {k.kernel_name.data for k in kernels} == set(kinds)
    for k in kernels:
        assert k.kind == StringAttr(kinds[k.kernel_name.data])
        assert loop.kernel_kind(k) == loop.body_kind(k) == kernel_shape(k).kind
    # The printer leaves out what the body shows: loop IR reads as it did.
    text = irc.print_module(module)
    assert "kind = \"reduction\"" not in text and "kind = \"pointwise\"" not in text
    assert irc.print_module(irc.parse(text)) == text


def test_unfused_kernels_are_named_by_the_same_kinds() -> None:
    module = irc.parse(SOFTMAX_LN)
    irc.run_pipeline(module, "decompose,graph-to-loop")
    for k in module.walk():
        if isinstance(k, loop.KernelOp):
            kind = loop.kernel_kind(k)
            assert k.kernel_name.data.startswith(NAME_PREFIX[kind] + "_"), k.kernel_name.data
            assert k.kind == StringAttr(kind) and kind == loop.body_kind(k)


def test_split_reduction_reads_and_keeps_the_kind() -> None:
    module = irc.parse(
        "func @f(%x: tensor<512x512xf32>) -> tensor<f32> {\n"
        "  %s = graph.reduce_sum %x {dims = [0, 1]} : tensor<f32>\n"
        "  return %s : tensor<f32>\n}\n"
    )
    irc.run_pipeline(module, "fuse,graph-to-loop,split-reduction")
    kernels = loop.kernels(module)
    assert len(kernels) == 2
    assert all(loop.kernel_kind(k) is KernelKind.REDUCTION for k in kernels)
    assert all(k.kind == StringAttr("reduction") for k in kernels)


def test_hand_written_group_without_kind_lowers_the_same() -> None:
    module, _ = _fused(SOFTMAX_LN)
    text = irc.print_module(module)
    bare = text
    for op in module.walk():
        if isinstance(op, graph.FusedOp) and op.kind is not None:
            extra = f", kind = {format_attr(op.kind)}"
            if op.space is not None and op.dims is not None:
                extra += f", space = {format_attr(op.space)}, dims = {format_attr(op.dims)}"
            bare = bare.replace(extra, "")
    assert "kind =" not in bare
    lowered = []
    for source in (text, bare):
        m = irc.parse(source)
        irc.run_pipeline(m, "graph-to-loop")
        lowered.append(irc.print_module(m))
    assert lowered[0] == lowered[1]


GROUP = """\
func @f(%x: tensor<4x8xf32>) -> tensor<4x1xf32> {{
  %y = graph.fused %x {{{props}}} (%a: tensor<4x8xf32>) {{
    %e = graph.exp %a : tensor<4x8xf32>
    %s = graph.reduce_sum %e {{dims = [1], keepdim = true}} : tensor<4x1xf32>
    graph.yield %s
  }} : tensor<4x1xf32>
  return %y : tensor<4x1xf32>
}}
"""


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ('kind = "rows"', 'graph.fused: kind must be one of "pointwise", "reduction", "contraction", "attention"'),
        ("kind = 3", 'graph.fused: kind must be one of "pointwise", "reduction", "contraction", "attention"'),
        ('kind = "pointwise"', 'graph.fused: kind "pointwise", but the group is a "reduction" kernel'),
        (
            'kind = "reduction", space = [4, 8], dims = [0]',
            "graph.fused: space = [4, 8], dims = [0], but its reductions have space = [4, 8], "
            "dims = [1]",
        ),
        (
            'kind = "reduction", space = [4, 8]',
            "graph.fused: 'space' and 'dims' (a reduction kernel's rows) go together",
        ),
        (
            'kind = "reduction", space = [4, 8], dims = [2]',
            "graph.fused: 'space' must be positive sizes and 'dims' increasing dims of it",
        ),
    ],
)
def test_wrong_written_kind_is_located(tmp_path: Path, props: str, message: str) -> None:
    status, out, err = run_opt(tmp_path, GROUP.format(props=props))
    assert status == 1 and out == "", err
    first, source, caret = err.splitlines()[:3]
    assert first == f"{tmp_path / 'input.ir'}:2:3: error: {message}"
    assert source.strip().startswith("%y = graph.fused") and caret.strip() == "^"


def test_rows_on_a_pointwise_group_is_an_error(tmp_path: Path) -> None:
    text = (
        "func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
        '  %y = graph.fused %x {space = [4, 8], dims = [1]} (%a: tensor<4x8xf32>) {\n'
        "    %e = graph.exp %a : tensor<4x8xf32>\n"
        "    graph.yield %e\n"
        "  } : tensor<4x8xf32>\n"
        "  return %y : tensor<4x8xf32>\n}\n"
    )
    status, _, err = run_opt(tmp_path, text)
    assert status == 1
    assert err.splitlines()[0].endswith(
        'error: graph.fused: space = [4, 8], dims = [1], but a "pointwise" kernel has no rows'
    )


def test_right_written_kind_is_accepted(tmp_path: Path) -> None:
    props = 'kernel = "red_k", kind = "reduction", space = [4, 8], dims = [1]'
    status, out, err = run_opt(tmp_path, GROUP.format(props=props))
    assert (status, err) == (0, "")
    assert props in out


LOOP_REDUCTION = """\
func @f(%x: memref<4x8xf32>) -> memref<4xf32> {{
  %0 = loop.alloc : memref<4xf32>
  loop.kernel {{name = "k", bounds = [4]{props}}} (%i: index) {{
    %s = loop.reduce {{kind = "sum", bounds = [8]}} (%j: index) {{
      %v = loop.load %x, %i, %j : f32
      loop.yield %v
    }} : f32
    loop.store %s, %0, %i
  }}
  return %0 : memref<4xf32>
}}
"""


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (', kind = "pointwise"', 'loop.kernel: kind "pointwise", but the body is a "reduction" kernel'),
        (', kind = "contraction"', 'loop.kernel: kind "contraction", but the body is a "reduction" kernel'),
        (', kind = "red"', 'loop.kernel: kind must be one of "pointwise", "reduction", "contraction", "attention"'),
    ],
)
def test_wrong_loop_kernel_kind_is_located(tmp_path: Path, props: str, message: str) -> None:
    status, out, err = run_opt(tmp_path, LOOP_REDUCTION.format(props=props))
    assert status == 1 and out == "", err
    first, source, caret = err.splitlines()[:3]
    assert first == f"{tmp_path / 'input.ir'}:3:3: error: {message}"
    assert source.strip().startswith("loop.kernel") and caret.strip() == "^"


def test_loop_kernel_kind_written_or_not(tmp_path: Path) -> None:
    """Loop IR may say the kind or not; either way it is the body's, and prints as before."""
    plain = LOOP_REDUCTION.format(props="")
    status, out, err = run_opt(tmp_path, LOOP_REDUCTION.format(props=', kind = "reduction"'))
    assert (status, err) == (0, "")
    assert out == run_opt(tmp_path, plain)[1] == plain
    kernel = loop.kernels(irc.parse(plain))[0]
    assert kernel.kind is None and loop.kernel_kind(kernel) is KernelKind.REDUCTION
    assert kernel_shape(kernel).reduction == (8,)
