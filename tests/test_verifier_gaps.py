"""Bad attributes of loop and tile ops, illegal fusion groups, nesting and rank limits,
and passes run at the wrong level: each is a located error (exit 1), never a crash.

Every case writes a file, runs `irc-opt FILE` in-process and checks the
`FILE:LINE:COL: error:` line, the quoted source line and its caret, as
tests/test_diagnostics.py does for the graph level.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import re
import textwrap
from pathlib import Path

import pytest
from xdsl.dialects.builtin import f32, i32
from xdsl.ir import Block

import irc.tools.opt
from irc.dialects import loop, tile
from irc.dialects.attrs import check_int
from irc.lowering import tile_to_triton

LOOP = """\
func @f(%x: memref<4x8xf32>, %w: memref<8x16xf32>) -> (memref<4x16xf32>, memref<4x8xf32>) {
  %0 = loop.alloc : memref<4x16xf32>
  loop.kernel {name = "mm", bounds = [4, 16], block = [16, 16, 16], warps = 4, stages = 2} (%i: index, %j: index) {
    %s = loop.reduce {kind = "sum", bounds = [8], contract = true} (%k: index) {
      %a = loop.load %x, %i, %k : f32
      %b = loop.load %w, %k, %j : f32
      %p = loop.apply %a, %b {fn = "mul"} : f32
      loop.yield %p
    } : f32
    loop.store %s, %0, %i, %j
  }
  %1 = loop.alloc : memref<4x8xf32>
  loop.kernel {name = "poi", bounds = [4, 8], block = [32], persistent = true} (%i: index, %j: index) {
    %c = loop.constant {value = 2.0} : f32
    %n = loop.constant {value = 8} : index
    %a = loop.load %x, %i, %j : f32
    %p = loop.apply %a, %c {fn = "mul"} : f32
    loop.store %p, %1, %i, %j
  }
  return %0, %1 : memref<4x16xf32>, memref<4x8xf32>
}
"""

TILE = """\
tile.kernel {name = "k", grid = [2], warps = 4, stages = 1} (%p0: ptr<f32>, %p1: ptr<f32>) {
  %n = tile.constant {value = 8} : i32
  %pid = tile.program_id {axis = 0} : i32
  %base = tile.apply %pid, %n {fn = "mul"} : i32
  %r = tile.arange {size = 8} : tensor<8xi32>
  %off = tile.apply %base, %r {fn = "add"} : tensor<8xi32>
  %m = tile.apply %off, %n {fn = "lt"} : tensor<8xi1>
  %v = tile.load %p0, %off, %m {other = 0.0} : tensor<8xf32>
  %row = tile.expand_dims %v {axis = 0} : tensor<1x8xf32>
  %s = tile.reduce %row {kind = "sum", axis = 1} : tensor<1xf32>
  %z = tile.constant {value = 0.0} : tensor<16x16xf32>
  %d = tile.dot %z, %z, %z {precision = "ieee"} : tensor<16x16xf32>
  %e = tile.for %z {lb = 0, ub = 8, step = 4} (%it: i32, %acc: tensor<16x16xf32>) {
    tile.yield %acc
  } : tensor<16x16xf32>
  tile.store %p1, %off, %v, %m
}

func @f(%x: memref<16xf32>) -> memref<16xf32> {
  %y = loop.alloc : memref<16xf32>
  tile.launch %x, %y {kernel = @k}
  return %y : memref<16xf32>
}
"""


def run_opt(tmp_path: Path, source: str, *args: str) -> tuple[int, str, str, Path]:
    path = tmp_path / "t.ir"
    path.write_text(source)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(path), *args])
    return status, out.getvalue(), err.getvalue(), path


def assert_located(tmp_path: Path, source: str, where: str, message: str, *args: str) -> None:
    """`irc-opt FILE` exits 1 with `FILE:WHERE: error: ...MESSAGE...`, the line and a caret."""
    status, out, err, path = run_opt(tmp_path, source, *args)
    assert status == 1, err
    assert out == ""
    lines = err.split("\n")
    head = f"{path}:{where}: error: "
    assert lines[0].startswith(head), f"expected {head!r}\n{err}"
    assert message in lines[0], err
    line_no, col = (int(n) for n in where.split(":"))
    src = source.split("\n")[line_no - 1]
    if len(src) <= 160:
        assert lines[1] == src
        assert lines[2] == " " * (col - 1) + "^"
    assert "Traceback" not in err


def mutate(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    base: str
    old: str
    new: str
    where: str
    message: str


LOOP_CASES = [
    Case("apply-unknown-fn", LOOP, '{fn = "mul"} : f32\n      loop.yield', '{fn = "mull"} : f32\n      loop.yield',
         "7:7", "loop.apply: unknown function 'mull' (did you mean 'mul'?)"),
    Case("apply-arity", LOOP, "%a, %b {fn", "%a {fn", "7:7", "loop.apply: 'mul' takes 2 arguments, got 1"),
    Case("apply-arity-unary", LOOP, '%a, %c {fn = "mul"}', '%a, %c {fn = "exp"}', "17:5",
         "loop.apply: 'exp' takes 1 argument, got 2"),
    Case("reduce-kind", LOOP, 'kind = "sum"', 'kind = "prod"', "4:5", "loop.reduce: kind must be one of"),
    Case("reduce-contract", LOOP, "contract = true", "contract = 0", "4:5",
         "loop.reduce: 'contract' is 1 (or true) where given"),
    Case("kernel-block-pow2", LOOP, "block = [16, 16, 16]", "block = [16, 24, 16]", "3:3",
         "loop.kernel: 'block[1]' must be a power of two from 1 to 1048576, got 24"),
    Case("kernel-block-kind", LOOP, "block = [16, 16, 16]", "block = [16, 16]", "3:3",
         "loop.kernel: 'block' must be a list of 3 integers"),
    Case("kernel-block-zero", LOOP, "block = [32]", "block = [0]", "13:3",
         "loop.kernel: 'block[0]' must be a power of two from 1 to 1048576, got 0"),
    Case("kernel-block-huge", LOOP, "block = [32]", "block = [2097152]", "13:3",
         "'block[0]' must be a power of two from 1 to 1048576, got 2097152"),
    Case("kernel-warps", LOOP, "warps = 4", "warps = 64", "3:3",
         "loop.kernel: 'warps' must be a power of two from 1 to 32, got 64"),
    Case("kernel-warps-3", LOOP, "warps = 4", "warps = 3", "3:3",
         "loop.kernel: 'warps' must be a power of two from 1 to 32, got 3"),
    Case("kernel-stages", LOOP, "stages = 2", "stages = 0", "3:3",
         "loop.kernel: 'stages' must be an integer from 1 to 16, got 0"),
    # IRDL's own constraint (an IntegerAttr property) answers first.
    Case("kernel-stages-float", LOOP, "stages = 2", "stages = 2.5", "3:3",
         "should be of base attribute integer"),
    Case("kernel-persistent", LOOP, "persistent = true", "persistent = 2", "13:3",
         "loop.kernel: 'persistent' is 1 (or true) where given"),
    Case("constant-fraction-index", LOOP, "{value = 8} : index", "{value = 8.5} : index", "15:5",
         "loop.constant: 'value' is 8.5, not an integer as index needs"),
    Case("constant-string", LOOP, "{value = 2.0} : f32", '{value = "two"} : f32', "14:5",
         "loop.constant: 'value' must be a number"),
    Case("constant-bool-float", LOOP, "{value = 2.0} : f32", "{value = true} : f32", "14:5",
         "loop.constant: a true/false 'value' needs the i1 type, got f32"),
    Case("constant-tensor", LOOP, "{value = 2.0} : f32", "{value = 2.0} : tensor<4xf32>", "14:5",
         "loop.constant: the type must be a scalar, got a tensor"),
    # The operand types of loop.apply (fuzz findings F3, F10, F16, F17).
    Case("apply-memref-operand", LOOP, '%a, %c {fn = "mul"}', '%a, %x {fn = "mul"}', "17:5",
         "loop.apply: operands are scalars, got memref<4x8xf32>"),
    Case("apply-float-and-index", LOOP, '%a, %c {fn = "mul"}', '%a, %n {fn = "mul"}', "17:5",
         "loop.apply: 'mul' mixes float and index operands"),
    Case("apply-floordiv-float", LOOP, '%a, %c {fn = "mul"}', '%a, %c {fn = "floordiv"}', "17:5",
         "loop.apply: 'floordiv' takes integer, index or i1 operands, not floats"),
    Case("apply-where-float-condition", LOOP, '%a, %c {fn = "mul"}', '%a, %c, %c {fn = "where"}',
         "17:5", "loop.apply: the condition of 'where' must be i1, got f32"),
    # F18: loop-to-tile lowers a contraction as dots and a store, nothing more.
    Case("contraction-foreach", LOOP, "    loop.store %s, %0, %i, %j\n",
         "    loop.store %s, %0, %i, %j\n    loop.foreach {bounds = [2]} (%q: index) {\n    }\n",
         "3:3", "loop.kernel: a contraction kernel has no loop.foreach"),
]

TILE_CASES = [
    Case("apply-unknown-fn", TILE, '{fn = "lt"}', '{fn = "less"}', "7:3", "tile.apply: unknown function 'less'"),
    Case("apply-arity-where", TILE, '%off, %n {fn = "lt"}', '%off, %n {fn = "where"}', "7:3",
         "tile.apply: 'where' takes 3 arguments, got 2"),
    Case("program-id-axis", TILE, "{axis = 0} : i32", "{axis = 3} : i32", "3:3",
         "tile.program_id: 'axis' must be an integer from 0 to 2, got 3"),
    Case("program-id-grid", TILE, "{axis = 0} : i32", "{axis = 1} : i32", "3:3",
         "tile.program_id: axis 1, but the kernel's grid has 1 axis"),
    Case("arange-pow2", TILE, "{size = 8} : tensor<8xi32>", "{size = 6} : tensor<6xi32>", "5:3",
         "tile.arange: 'size' must be a power of two from 1 to 1048576, got 6"),
    Case("arange-huge", TILE, "{size = 8} : tensor<8xi32>", "{size = 4194304} : tensor<4194304xi32>",
         "5:3", "tile.arange: 'size' must be a power of two from 1 to 1048576, got 4194304"),
    Case("arange-shape", TILE, "{size = 8} : tensor<8xi32>", "{size = 8} : tensor<4xi32>", "5:3",
         "tile.arange: size 8 makes a block of shape [8], not tensor<4xi32>"),
    Case("expand-dims-axis", TILE, "%v {axis = 0}", "%v {axis = 2}", "9:3",
         "tile.expand_dims: 'axis' must be an integer from 0 to 1, got 2"),
    Case("expand-dims-negative", TILE, "%v {axis = 0}", "%v {axis = -1}", "9:3",
         "tile.expand_dims: 'axis' must be an integer from 0 to 1, got -1"),
    Case("reduce-kind", TILE, 'kind = "sum", axis = 1', 'kind = "mean", axis = 1', "10:3",
         'tile.reduce: \'kind\' must be one of "sum", "max", "min", got "mean"'),
    Case("reduce-axis", TILE, 'kind = "sum", axis = 1', 'kind = "sum", axis = 2', "10:3",
         "tile.reduce: 'axis' must be an integer from 0 to 1, got 2"),
    Case("reduce-scalar", TILE, "%s = tile.reduce %row", "%s = tile.reduce %n", "10:3",
         "tile.reduce: the input must be a block, not a scalar"),
    Case("expand-dims-result", TILE, "{axis = 0} : tensor<1x8xf32>", "{axis = 0} : tensor<8x1xf32>",
         "9:3", "tile.expand_dims: the result must be [1, 8] of f32, got tensor<8x1xf32>"),
    Case("reduce-result", TILE, "axis = 1} : tensor<1xf32>", "axis = 1} : tensor<8xf32>", "10:3",
         "tile.reduce: the result must be [1] of f32, got tensor<8xf32>"),
    Case("dot-shapes", TILE, "tile.dot %z, %z, %z", "tile.dot %z, %row, %z", "12:3",
         "tile.dot: shapes [16, 16] @ [1, 8] + [16, 16] do not make a product"),
    Case("for-step", TILE, "step = 4", "step = 0", "13:3",
         "tile.for: 'step' must be an integer of at least 1, got 0"),
    Case("dot-precision", TILE, 'precision = "ieee"', 'precision = "fast"', "12:3",
         "tile.dot: 'precision' must be one of \"ieee\", \"tf32\", \"tf32x3\", \"split-tf32\", "
         "got \"fast\""),
    Case("kernel-grid-zero", TILE, "grid = [2]", "grid = [0]", "1:1",
         "tile.kernel: 'grid[0]' must be an integer from 1 to 2147483647, got 0"),
    Case("kernel-grid-4d", TILE, "grid = [2]", "grid = [1, 1, 1, 1]", "1:1",
         "tile.kernel: 'grid' must be a list of 1 or 2 or 3 integers"),
    Case("kernel-grid-float", TILE, "grid = [2]", "grid = [2.0]", "1:1",
         "tile.kernel: 'grid[0]' must be an integer"),
    Case("kernel-warps", TILE, "warps = 4", "warps = 48", "1:1",
         "tile.kernel: 'warps' must be a power of two from 1 to 32, got 48"),
    Case("kernel-stages", TILE, "stages = 1", "stages = -1", "1:1",
         "tile.kernel: 'stages' must be an integer from 1 to 16, got -1"),
    Case("kernel-pdl", TILE, "stages = 1}", "stages = 1, pdl = 0}", "1:1",
         "tile.kernel: 'pdl' is 1 (or true) where given"),
    Case("kernel-persistent-grid", TILE, "grid = [2]", "grid = [2, 2], persistent = 1", "1:1",
         "tile.kernel: a persistent kernel has a one-axis grid"),
    Case("load-other-string", TILE, "{other = 0.0}", '{other = "zero"}', "8:3",
         "tile.load: 'other' must be a number"),
    Case("load-other-fraction", TILE, "%p0, %off, %m {other = 0.0} : tensor<8xf32>",
         "%p0, %off, %m {other = 0.5} : tensor<8xi32>", "8:3",
         "tile.load: 'other' is 0.5, not an integer as tensor<8xi32> needs"),
    Case("constant-i32-range", TILE, "{value = 8} : i32", "{value = 4294967296} : i32", "2:3",
         "tile.constant: 'value' 4294967296 does not fit in i32"),
    Case("constant-i1", TILE, "{value = 0.0} : tensor<16x16xf32>", "{value = 2} : tensor<16x16xi1>",
         "11:3", "tile.constant: 'value' of an i1 must be 0 or 1, got 2"),
    Case("constant-ptr", TILE, "{value = 8} : i32", "{value = 8} : ptr<f32>", "2:3",
         "tile.constant: the type must be a scalar or a block of scalars, got ptr<f32>"),
    # Fuzz findings F4b, F5, F11-F16: types Triton would refuse, or read differently.
    Case("index-in-kernel", TILE, "{value = 8} : i32", "{value = 8} : index", "2:3",
         "tile.constant: a tile kernel has no index values"),
    Case("for-ub-beyond-i32", TILE, "ub = 8", "ub = 4294967296", "13:3",
         "tile.for: 'ub' must be an integer from -2147483648 to 2147483647, got 4294967296"),
    Case("program-id-on-host", TILE, "  tile.launch %x",
         "  %q = tile.program_id {axis = 0} : i32\n  tile.launch %x", "21:3",
         "tile.program_id is outside any tile.kernel"),
    Case("apply-ptr-operand", TILE, "tile.apply %pid, %n", "tile.apply %p0, %n", "4:3",
         "tile.apply: operands are blocks or scalars, not pointers (ptr<f32>)"),
    Case("apply-shape-lie", TILE, '{fn = "add"} : tensor<8xi32>', '{fn = "add"} : tensor<8x8xi32>',
         "6:3", "tile.apply: the operands broadcast to shape [8], but the result is tensor<8x8xi32>"),
    Case("apply-or-float", TILE, "tile.expand_dims %v {axis = 0}", 'tile.apply %v, %v {fn = "or"}',
         "9:3", "tile.apply: 'or' takes integer, index or i1 operands, not floats"),
    Case("mul-add-int", TILE, "tile.expand_dims %v {axis = 0}", 'tile.apply %off, %off, %off {fn = "mul_add"}',
         "9:3", "tile.apply: 'mul_add' takes float operands, not integers or indices"),
    Case("mul-add-arity", TILE, "tile.expand_dims %v {axis = 0}", 'tile.apply %v, %v {fn = "mul_add"}',
         "9:3", "tile.apply: 'mul_add' takes 3 arguments, got 2"),
    Case("load-shape-lie", TILE, "tile.load %p0, %off, %m {other", "tile.load %p0, %n {other", "8:3",
         "tile.load: the offsets (and mask) have shape [], but the result is tensor<8xf32>"),
    Case("where-i32-condition", TILE, '%off, %n {fn = "lt"}', '%n, %off, %off {fn = "where"}',
         "7:3", "tile.apply: the condition of 'where' must be i1, got i32"),
]


def test_the_templates_verify(tmp_path: Path) -> None:
    for source in (LOOP, TILE):
        status, _, err, _ = run_opt(tmp_path, source)
        assert status == 0, err


@pytest.mark.parametrize("case", LOOP_CASES + TILE_CASES,
                         ids=[f"{c.base is LOOP and 'loop' or 'tile'}-{c.id}" for c in LOOP_CASES + TILE_CASES])  # fmt: skip
def test_bad_attribute_is_located(case: Case, tmp_path: Path) -> None:
    assert_located(tmp_path, mutate(case.base, case.old, case.new), case.where, case.message)


def test_unknown_fn_no_longer_reaches_the_printer(tmp_path: Path) -> None:
    # Before the check, `--emit triton` crashed in the printer (exit 2).
    source = mutate(TILE, '{fn = "lt"}', '{fn = "bogus"}')
    assert_located(tmp_path, source, "7:3", "unknown function 'bogus'", "--emit", "triton")


# --- one table of scalar functions -------------------------------------------------------


def _triton_form(fn: str, arity: int) -> str:
    """What the Triton printer makes of `fn` on arguments named v0, v1, ..."""
    args = Block(arg_types=[f32] * arity).args
    op = tile.ApplyOp.create(
        operands=list(args),
        result_types=[i32 if fn == "cast" else f32],
        properties={"fn": loop.apply_fn(fn)},
    )
    # Only `apply` is wanted: a printer whose values are already named.
    printer = tile_to_triton.KernelPrinter.__new__(tile_to_triton.KernelPrinter)
    printer.names = {a: f"v{i}" for i, a in enumerate(args)}
    return printer.apply(op)


@pytest.mark.parametrize("fn", sorted(loop.APPLY_FNS))
def test_every_checked_fn_has_a_triton_form(fn: str) -> None:
    arity = loop.APPLY_FNS[fn]
    text = _triton_form(fn, arity)
    # Every argument appears in the expression.
    assert all(f"v{i}" in text for i in range(arity)), text


def _printer_fn_names() -> set[str]:
    """The fn names `KernelPrinter.apply` branches on, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(tile_to_triton.KernelPrinter.apply)))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "fn":
            for right in node.comparators:
                if isinstance(right, ast.Constant) and isinstance(right.value, str):
                    names.add(right.value)
                if isinstance(right, ast.Tuple):
                    names |= {e.value for e in right.elts if isinstance(e, ast.Constant)}
    return names


def test_every_triton_form_is_a_checked_fn() -> None:
    templates = tile_to_triton.TEMPLATES
    forms = {fn for table in templates.values() for fn in table} | _printer_fn_names()
    assert forms - set(loop.APPLY_FNS) == set()
    assert set(loop.APPLY_FNS) - forms == set()
    # The templates (each per-type form) take as many arguments as the table says.
    for table in templates.values():
        for fn, template in table.items():
            for text in [template] if isinstance(template, str) else template.values():
                used = {int(i) for i in re.findall(r"\{(\d)\}", text)}
                assert max(used) + 1 == loop.APPLY_FNS[fn], fn


def test_check_int_names_the_range() -> None:
    from xdsl.dialects.builtin import IntegerAttr, i64
    from xdsl.utils.exceptions import VerifyException

    op = tile.ArangeOp.create(properties={"size": IntegerAttr(3, i64)}, result_types=[i32])
    with pytest.raises(VerifyException, match="of at least 4, got 3"):
        check_int(op, "size", op.size, 4)
    assert check_int(op, "size", op.size, 1, 4) == 3


# --- graph.fused: the fusion pass's legality, said in terms of the user's ops --------------


def _fused(inputs: str, body: list[str], results: str, args: str, rets: str) -> str:
    return (
        f"func @f({args}) -> ({rets}) {{\n"
        f"  %y = graph.fused {inputs} {{\n"
        + "".join(f"    {line}\n" for line in body)
        + f"  }} : {results}\n"
        f"  return %y : {rets}\n}}\n"
    )


def test_illegal_group_is_reported_at_the_fused_op_in_graph_terms(tmp_path: Path) -> None:
    source = (
        "func @f(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<8xf32>) {\n"
        "  %a, %b = graph.fused %x (%x0: tensor<4x8xf32>) {\n"
        "    %s = graph.reduce_sum %x0 {dims = [1]}\n"
        "    %t = graph.reduce_sum %x0 {dims = [0]}\n"
        "    graph.yield %s, %t\n"
        "  } : tensor<4xf32>, tensor<8xf32>\n"
        "  return %a, %b : tensor<4xf32>, tensor<8xf32>\n"
        "}\n"
    )
    for args in ((), ("-p", "graph-to-loop"), ("--emit", "triton")):
        assert_located(tmp_path, source, "2:3", "reductions over different shapes or dims", *args)
        err = run_opt(tmp_path, source, *args)[2]
        assert "loop." not in err


def test_outputs_of_two_shapes_are_refused(tmp_path: Path) -> None:
    source = (
        "func @f(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {\n"
        "  %y, %z = graph.fused %x, %b (%x0: tensor<4x8xf32>, %b0: tensor<8xf32>) {\n"
        "    %e = graph.exp %b0\n"
        "    %s = graph.add %x0, %e\n"
        "    graph.yield %s, %e\n"
        "  } : tensor<4x8xf32>, tensor<8xf32>\n"
        "  return %y, %z : tensor<4x8xf32>, tensor<8xf32>\n"
        "}\n"
    )
    assert_located(tmp_path, source, "2:3", "outputs of different shapes")


@pytest.mark.parametrize(
    "body",
    [
        # An expensive op recomputed per element: slow, so `fuse` would not make it, but legal.
        ["%e = graph.exp %b0", "%s = graph.add %x0, %e", "graph.yield %s"],
        # The same next to a reduction (a rows kernel).
        ["%e = graph.exp %b0", "%r = graph.reduce_sum %x0 {dims = [1], keepdim = true}",
         "%t = graph.add %x0, %e", "%s = graph.div %t, %r", "graph.yield %s"],
        # More ops than fuse's default max-ops (64).
        ["%c0 = graph.add %x0, %b0"]
        + [f"%c{i} = graph.add %c{i - 1}, %x0" for i in range(1, 80)]
        + ["graph.yield %c79"],
    ],
    ids=["recompute", "rows-recompute", "many-ops"],
)
def test_costly_but_legal_groups_are_accepted_and_lowered(body: list[str], tmp_path: Path) -> None:
    source = _fused(
        "%x, %b (%x0: tensor<4x8xf32>, %b0: tensor<8xf32>)",
        body,
        "tensor<4x8xf32>",
        "%x: tensor<4x8xf32>, %b: tensor<8xf32>",
        "tensor<4x8xf32>",
    )
    status, out, err, _ = run_opt(tmp_path, source, "-p", "graph-to-loop,tile,loop-to-tile")
    assert status == 0, err
    assert out.count("tile.kernel") == 1


def test_many_tensors_in_one_hand_written_group_are_accepted(tmp_path: Path) -> None:
    # 20 inputs: over fuse's register-pressure estimate (16), which is a cost, not legality.
    n = 20
    args = ", ".join(f"%a{i}: tensor<64xf32>" for i in range(n))
    inner = ", ".join(f"%b{i}: tensor<64xf32>" for i in range(n))
    names = ", ".join(f"%a{i}" for i in range(n))
    body = ["%s0 = graph.add %b0, %b1"] + [f"%s{i} = graph.add %s{i - 1}, %b{i + 1}" for i in range(1, n - 1)]
    source = _fused(f"{names} ({inner})", [*body, f"graph.yield %s{n - 2}"], "tensor<64xf32>", args, "tensor<64xf32>")
    status, _, err, _ = run_opt(tmp_path, source, "-p", "graph-to-loop")
    assert status == 0, err


def test_fusion_output_verifies_with_any_max_ops(tmp_path: Path) -> None:
    body = "".join(f"  %c{i} = graph.exp %c{i - 1}\n" for i in range(1, 100))
    source = (
        "func @f(%x: tensor<64xf32>) -> tensor<64xf32> {\n  %c0 = graph.exp %x\n"
        + body + "  return %c99 : tensor<64xf32>\n}\n"
    )  # fmt: skip
    status, out, err, _ = run_opt(tmp_path, source, "-p", "fuse{max-ops=200},graph-to-loop")
    assert status == 0, err
    assert out.count("loop.kernel") == 1


def test_deeply_nested_fused_is_a_located_error(tmp_path: Path) -> None:
    n = 3000
    text = "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n%y = graph.fused %x (%a0: tensor<4xf32>) {\n"
    for i in range(1, n):
        text += f"%b{i} = graph.fused %a{i - 1} (%a{i}: tensor<4xf32>) {{\n"
    text += f"graph.yield %a{n - 1}\n"
    for i in range(n - 1, 0, -1):
        text += f"}} : tensor<4xf32>\ngraph.yield %b{i}\n"
    text += "} : tensor<4xf32>\nreturn %y : tensor<4xf32>\n}\n"
    status, out, err, path = run_opt(tmp_path, text)
    assert status == 1 and out == ""
    assert err.startswith(f"{path}:"), err
    assert "nest" in err.split("\n")[0]
    assert "RecursionError" not in err and "internal error" not in err


# --- limits: nesting depth and rank ---------------------------------------------------------


def test_deeply_nested_regions_stop_at_the_limit(tmp_path: Path) -> None:
    # 3000 loop.reduce regions inside one another: the 65th is reported where it opens.
    n = 3000
    text = "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
    text += 'loop.kernel {name = "k", bounds = [4]} (%i: index) {\n'
    for d in range(n):
        text += f'%s{d} = loop.reduce {{kind = "sum", bounds = [2]}} (%j{d}: index) {{\n'
    text += "}\n" * n + "}\nreturn %x : memref<4xf32>\n}\n"
    status, out, err, path = run_opt(tmp_path, text)
    assert status == 1 and out == ""
    line = 2 + 64  # the kernel's region is the first level
    assert err.startswith(f"{path}:{line}:"), err[:300]
    assert "regions nest more than 64 deep" in err.split("\n")[0]


def test_deeply_nested_attribute_lists_are_located(tmp_path: Path) -> None:
    source = (
        "func @f(%x: tensor<4xf32>) -> tensor<f32> {\n"
        "  %y = graph.reduce_sum %x {dims = " + "[" * 3000 + "0" + "]" * 3000 + "}\n"
        "  return %y : tensor<f32>\n}\n"
    )
    status, _, err, path = run_opt(tmp_path, source)
    assert status == 1
    assert err.startswith(f"{path}:2:"), err[:300]
    assert "lists nest more than 16 deep" in err.split("\n")[0]


RANK_100 = "x".join(["1"] * 100)


def test_rank_above_the_limit_is_located_in_irc_opt(tmp_path: Path) -> None:
    source = (
        f"func @f(%x: tensor<4xf32>) -> tensor<4xf32> {{\n"
        f"  %y = graph.reshape %x : tensor<4x{RANK_100}xf32>\n"
        f"  return %x : tensor<4xf32>\n}}\n"
    )
    status, _, err, path = run_opt(tmp_path, source)
    assert status == 1
    first = err.split("\n")[0]
    assert first == (
        f"{path}:2:34: error: 'tensor<...>' has 101 dimensions, more than irc supports (64)"
    )


def test_rank_above_the_limit_is_located_in_irc_run(tmp_path: Path) -> None:
    import irc.tools.run

    path = tmp_path / "r.ir"
    path.write_text(
        f"func @f(%x: tensor<{RANK_100}xf32>) -> tensor<{RANK_100}xf32> {{\n"
        f"  %y = graph.exp %x\n  return %y : tensor<{RANK_100}xf32>\n}}\n"
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = irc.tools.run.main([str(path)])
    assert status == 1
    assert err.getvalue().startswith(f"{path}:1:20: error: 'tensor<...>' has 100 dimensions")


def test_rank_at_the_limit_still_works(tmp_path: Path) -> None:
    shape = "x".join(["1"] * 64)
    source = (
        f"func @f(%x: tensor<{shape}xf32>) -> tensor<{shape}xf32> {{\n"
        f"  %y = graph.exp %x\n  return %y : tensor<{shape}xf32>\n}}\n"
    )
    status, out, err, _ = run_opt(tmp_path, source, "--emit", "triton")
    assert status == 0, err
    assert "@triton.jit" in out


# --- irc-run --seed -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["-1", str(2**64), "9" * 30])
def test_seed_out_of_range_is_a_usage_error(seed: str, tmp_path: Path) -> None:
    import irc.tools.run

    path = tmp_path / "s.ir"
    path.write_text("func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n}\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = irc.tools.run.main([str(path), f"--seed={seed}"])
    assert status == 1
    assert err.getvalue() == f"irc-run: error: --seed must be from 0 to 2**64-1, got {seed}\n"


def test_largest_seed_runs(tmp_path: Path) -> None:
    import irc.tools.run

    path = tmp_path / "s.ir"
    path.write_text("func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = irc.tools.run.main([str(path), f"--seed={2**64 - 1}"])
    assert status == 0
    assert f"(seed {2**64 - 1}, cpu)" in out.getvalue()


# --- passes: their level and their options --------------------------------------------------

GRAPH = """\
func @f(%x: tensor<64x128xf32>, %w: tensor<128x32xf32>) -> (tensor<64x128xf32>, tensor<64x32xf32>) {
  %s = graph.softmax %x {dim = 1}
  %m = graph.matmul %x, %w
  return %s, %m : tensor<64x128xf32>, tensor<64x32xf32>
}
"""


def test_every_irc_pass_declares_its_levels() -> None:
    # xDSL's own passes (cse, dce) run on any level and declare none.
    from irc.passes import LEVELS, PASSES

    own = [(name, cls) for name, cls in ((n, load()) for n, load in PASSES.items())
           if cls.__module__.startswith("irc.")]  # fmt: skip
    assert len(own) >= 6
    for name, cls in own:
        levels = getattr(cls, "levels", None)
        assert levels and set(levels) <= set(LEVELS), name


@pytest.mark.parametrize(
    "pipeline",
    [
        "decompose,fuse,graph-to-loop,split-reduction,tile,loop-to-tile",
        "fuse,decompose,graph-to-loop,split-reduction,tile,loop-to-tile",
        "fuse,fuse,decompose,decompose,graph-to-loop,tile,tile,loop-to-tile",
        "decompose,graph-to-loop,tile{block=128},loop-to-tile{tf32=true}",
    ],
)
def test_legitimate_pipelines_still_run(pipeline: str, tmp_path: Path) -> None:
    status, out, err, _ = run_opt(tmp_path, GRAPH, "-p", pipeline)
    assert status == 0, err
    assert "tile.kernel" in out


def test_passes_run_on_printed_ir_of_their_level(tmp_path: Path) -> None:
    status, fused, err, _ = run_opt(tmp_path, GRAPH, "--fuse")
    assert status == 0, err
    status, again, err, _ = run_opt(tmp_path, fused, "--fuse", "--decompose")  # fuse on fused IR
    assert status == 0, err
    status, looped, err, _ = run_opt(tmp_path, again, "--graph-to-loop")
    assert status == 0, err
    status, tiled, err, _ = run_opt(tmp_path, looped, "-p", "split-reduction,tile")
    assert status == 0, err
    status, out, err, _ = run_opt(tmp_path, tiled, "--loop-to-tile", "--emit", "triton")
    assert status == 0, err
    assert "@triton.jit" in out


@pytest.mark.parametrize(
    ("pipeline", "level", "message"),
    [
        ("loop-to-tile", "graph",
         "pass 'loop-to-tile' runs on loop-level IR, but this module is at the graph level "
         "(run graph-to-loop first)"),
        ("tile", "graph", "pass 'tile' runs on loop-level IR, but this module is at the graph level"),
        ("split-reduction", "graph", "pass 'split-reduction' runs on loop-level IR"),
        ("decompose", "loop",
         "pass 'decompose' runs on graph-level IR, but this module is at the loop level "
         "(it runs before graph-to-loop)"),
        ("fuse", "loop", "pass 'fuse' runs on graph-level IR, but this module is at the loop level"),
        ("graph-to-loop", "tile",
         "pass 'graph-to-loop' runs on graph-level IR, but this module is at the tile level"),
        ("tile", "tile",
         "pass 'tile' runs on loop-level IR, but this module is at the tile level "
         "(it runs before loop-to-tile)"),
        ("loop-to-tile", "tile", "pass 'loop-to-tile' runs on loop-level IR"),
    ],
)  # fmt: skip
def test_a_pass_refuses_ir_of_another_level(
    pipeline: str, level: str, message: str, tmp_path: Path
) -> None:
    lower = {
        "graph": [],
        "loop": ["-p", "decompose,graph-to-loop"],
        "tile": ["-p", "decompose,graph-to-loop,tile,loop-to-tile"],
    }
    status, source, err, _ = run_opt(tmp_path, GRAPH, *lower[level])
    assert status == 0, err
    status, out, err, _ = run_opt(tmp_path, source, "-p", pipeline)
    assert status == 1 and out == ""
    assert err == f"irc-opt: error: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1 and "Traceback" not in err


def test_level_refusal_in_the_api() -> None:
    import irc
    from irc.syntax.diagnostics import IrcError

    module = irc.parse(GRAPH)
    with pytest.raises(IrcError, match="run graph-to-loop first"):
        irc.run_pipeline(module, "loop-to-tile")
    # Nothing ran: the module is still at the graph level.
    assert "graph.softmax" in irc.print_module(module)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tile{block=512 block=1024}", "pass 'tile': option 'block' is given twice"),
        ("fuse{max-ops=8 max_ops=9}", "pass 'fuse': option 'max_ops' is given twice"),
        ("tile{block=512,block=1024}", "malformed pass pipeline"),
        ("tile{block=24}", "tile: 'block' must be a power of two, got 24"),
        ("tile{rblock=0}", "tile: 'rblock' must be a power of two, got 0"),
        ("tile{persistent-rblock=4194304}", "tile: 'persistent-rblock' must be at most 1048576"),
        ("tile{epilogue-warps=-8}", "tile: 'epilogue-warps' must be a power of two, got -8"),
        ("split-reduction{splits=0}", "split-reduction: 'splits' must be at least 1, got 0"),
        ("split-reduction{min-chunk=-5}", "split-reduction: 'min-chunk' must be at least 1, got -5"),
        ("fuse{max-ops=0}", "fuse: 'max-ops' must be at least 1, got 0"),
        ("fuse{report=yaml}", "fuse: 'report' must be text or json, got 'yaml'"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(spec: str, message: str, tmp_path: Path) -> None:
    status, out, err, _ = run_opt(tmp_path, GRAPH, "-p", f"graph-to-loop,{spec}")
    assert status == 1 and out == ""
    assert err.startswith("irc-opt: error: ") and message in err, err


def test_split_reduction_min_chunk_zero_is_no_crash(tmp_path: Path) -> None:
    # Was a ZeroDivisionError (exit 2) on a module with a full reduction.
    source = (
        "func @f(%x: tensor<65536xf32>) -> tensor<f32> {\n"
        "  %s = graph.reduce_sum %x {dims = [0]}\n  return %s : tensor<f32>\n}\n"
    )
    status, _, err, _ = run_opt(tmp_path, source, "-p", "graph-to-loop,split-reduction{min_chunk=0}")
    assert status == 1
    assert err == "irc-opt: error: split-reduction: 'min-chunk' must be at least 1, got 0\n"
    status, out, err, _ = run_opt(tmp_path, source, "-p", "graph-to-loop,split-reduction{min_chunk=1}")
    assert status == 0, err
    assert out.count("loop.kernel") == 2


def test_pass_objects_check_their_options_too() -> None:
    from irc.passes.split_reduction import SplitReductionPass
    from irc.passes.tile import TilePass
    from irc.syntax.diagnostics import IrcError

    with pytest.raises(IrcError, match="'block' must be a power of two, got 3"):
        TilePass(block=3)
    with pytest.raises(IrcError, match="'min-chunk' must be at least 1, got 0"):
        SplitReductionPass(min_chunk=0)


@pytest.mark.parametrize("in_group", [False, True], ids=["plain", "in-a-group"])
def test_graph_to_loop_names_an_undecomposed_composite(in_group: bool, tmp_path: Path) -> None:
    if in_group:
        source = _fused(
            "%x (%a: tensor<4x8xf32>)", ["%s = graph.softmax %a {dim = 1}", "graph.yield %s"],
            "tensor<4x8xf32>", "%x: tensor<4x8xf32>", "tensor<4x8xf32>",
        )  # fmt: skip
        where = "3:5"
    else:
        source = (
            "func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
            "  %s = graph.softmax %x {dim = 1}\n  return %s : tensor<4x8xf32>\n}\n"
        )
        where = "2:3"
    message = "graph.softmax must be decomposed before graph-to-loop (run decompose first)"
    assert_located(tmp_path, source, where, message, "-p", "graph-to-loop")
    status, _, err, _ = run_opt(tmp_path, source, "-p", "decompose,graph-to-loop")
    assert status == 0, err


def test_compile_fuses_only_graph_level_modules() -> None:
    # irc.compile fuses by default; a module already lowered is past fusion, not refused.
    import irc

    module = irc.parse(GRAPH)
    irc.run_pipeline(module, "decompose,graph-to-loop")
    compiled = irc.compile(module, device="cpu")
    assert compiled.kernel_count >= 2


def test_nested_loop_kernel_is_located(tmp_path: Path) -> None:
    """F1: an inner loop.kernel once printed an empty Triton function."""
    source = textwrap.dedent("""\
        func @f(%x: memref<4xf32>) -> memref<4xf32> {
          %y = loop.alloc : memref<4xf32>
          loop.kernel {name = "k", bounds = [4]} (%i: index) {
            loop.kernel {name = "inner", bounds = [4]} (%j: index) {
              %v = loop.load %x, %j : f32
              loop.store %v, %y, %j
            }
          }
          return %y : memref<4xf32>
        }
        """)
    assert_located(tmp_path, source, "4:5", "loop.kernel cannot be inside another loop.kernel")


def test_buffer_of_index_is_located(tmp_path: Path) -> None:
    """F4: torch and Triton have no index dtype (once an internal KeyError)."""
    source = textwrap.dedent("""\
        func @f(%x: memref<4xf32>) -> memref<4xf32> {
          %y = loop.alloc : memref<4xindex>
          return %x : memref<4xf32>
        }
        """)
    assert_located(tmp_path, source, "2:3", "loop.alloc: buffers hold f32 f16 bf16 f64 i64 i32 i1, not index")


def test_integral_float_for_an_integer_type_is_a_located_error(tmp_path: Path) -> None:
    """F9: `3.0 : i32` below the graph level (once an internal TypeError, then taken as 3):
    the literal says float, so it is an error; graph.constant's 3.0 is lowered as 3
    (tests/test_constant_literals.py)."""
    source = mutate(TILE, "  %pid =", "  %q = tile.constant {value = 3.0} : i32\n  %pid =")
    assert_located(
        tmp_path, source, "3:3", "tile.constant: 'value' is the float 3.0, but i32 needs an integer"
    )



def test_an_empty_operand_built_in_python_is_refused_before_fuse() -> None:
    """The parser refuses a zero dimension; a module an embedder builds in Python
    meets the verifier instead: when built (the type is inferred from operands)
    and in irc.compile (it reached `fuse`, which failed on an IndexError)."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import FunctionType, ModuleOp
    from xdsl.ir import Region

    from irc.dialects import graph
    from irc.ir.types import tensor
    from irc.pytorch.emitter import boolean, int_list
    from irc.syntax.diagnostics import IrcError

    empty, props = tensor([3, 0], f32), {"dims": int_list([1]), "keepdim": boolean(False)}
    block = Block(arg_types=[empty])
    with pytest.raises(graph.GraphVerifyError, match=r"tensor<3x0xf32>: dimensions must be positive"):
        graph.ReduceSumOp.make(block.args[0], **props)
    total = graph.ReduceSumOp.create(
        operands=[block.args[0]], result_types=[tensor([3], f32)], properties=props
    )
    block.add_ops([total, func.ReturnOp(total.results[0])])
    fn = func.FuncOp("f", FunctionType.from_lists([empty], [tensor([3], f32)]), Region(block))
    with pytest.raises(IrcError, match="dimensions must be positive"):
        irc.compile(ModuleOp([fn]))
