"""`fn` of loop.apply and tile.apply: a checked enum attribute whose members are the op facts.

irc text keeps writing it as a string (`{fn = "exp"}`); MLIR's syntax writes the
attribute (`#loop<fn exp>`). A name that is no member is a located error at
every entry: irc text, MLIR text, and IR built by hand.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from xdsl.dialects.builtin import IntegerAttr, StringAttr, f32, i32
from xdsl.ir import Block

import irc.tools.opt
from irc.dialects import graph, loop, tile
from irc.syntax.parser import parse
from irc.syntax.printer import print_module

LOOP = """\
func @f(%x: memref<8xf32>) -> memref<8xf32> {
  %y = loop.alloc : memref<8xf32>
  loop.kernel {name = "poi_0", bounds = [8]} (%i: index) {
    %a = loop.load %x, %i : f32
    %e = loop.apply %a {fn = "exp"} : f32
    %m = loop.apply %e, %a {fn = "maximum"} : f32
    loop.store %m, %y, %i
  }
  return %y : memref<8xf32>
}
"""


def opt(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stderr
    sys.stderr = err
    try:
        status = irc.tools.opt.run(args, stdout=out)
    finally:
        sys.stderr = saved
    return status, out.getvalue(), err.getvalue()


def test_the_members_are_the_op_facts_and_the_lowerings_functions() -> None:
    members = {m.value for m in loop.ApplyFn}
    facts = {fn for op in graph.ELEMENTWISE_OPS for fn in (op.FN, *op.EXTRA_FNS)}
    assert members == facts | set(loop.INDEX_FNS) | set(loop.LOWERING_FNS)
    assert all(loop.APPLY_FNS[m] for m in members)


def test_a_member_is_its_string() -> None:
    """Passes compare `op.fn.data` with strings and key tables by it."""
    fn = loop.apply_fn("exp").data
    assert fn == "exp" and f"{fn}" == "exp" and {"exp": 1}[fn] == 1 and hash(fn) == hash("exp")


def test_irc_text_keeps_the_string_and_holds_the_enum() -> None:
    module = parse(LOOP, "f.ir")
    applies = [op for op in module.walk() if isinstance(op, loop.ApplyOp)]
    assert [type(op.fn) for op in applies] == [loop.ApplyFnAttr] * 2
    assert [op.fn.data for op in applies] == ["exp", "maximum"]
    text = print_module(module)
    assert '{fn = "exp"}' in text and text == LOOP
    assert print_module(parse(text, "f.ir")) == text


def test_every_level_prints_to_a_fixed_point_with_enum_fns(tmp_path: Path) -> None:
    src = tmp_path / "f.ir"
    src.write_text(
        "func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
        "  %e = graph.exp %x\n  %m = graph.reduce_max %e {dims = [1], keepdim = true}\n"
        "  %d = graph.sub %e, %m\n  return %d : tensor<4x8xf32>\n}\n"
    )
    for pipeline in ("graph-to-loop", "graph-to-loop,tile,loop-to-tile"):
        status, text, err = opt([str(src), "-p", pipeline])
        assert status == 0, err
        assert 'fn = "exp"' in text
        again = tmp_path / "again.ir"
        again.write_text(text)
        status, twice, err = opt([str(again)])
        assert (status, err) == (0, "") and twice == text
        status, mlir, err = opt([str(src), "-p", pipeline, "--emit", "mlir"])
        assert status == 0 and "#loop<fn exp>" in mlir, err


def test_an_unknown_fn_in_mlir_is_a_located_error(tmp_path: Path) -> None:
    src = tmp_path / "f.ir"
    src.write_text(LOOP)
    status, mlir, _ = opt([str(src), "--emit", "mlir", "--no-mlir-print-debuginfo"])
    assert status == 0 and mlir.count("#loop<fn exp>") == 1
    bad = tmp_path / "bad.mlir"
    bad.write_text(mlir.replace("#loop<fn exp>", "#loop<fn expp>"))
    status, out, err = opt(["--input", "mlir", str(bad)])
    line = next(i for i, t in enumerate(mlir.splitlines(), 1) if "#loop<fn exp>" in t)
    assert (status, out) == (1, "")
    assert err.startswith(f"{bad}:{line}:"), err
    assert "Expected `neg`" in err.splitlines()[0] and "Traceback" not in err  # the members


@pytest.mark.parametrize("level", ["loop", "tile"])
def test_an_unknown_fn_in_irc_text_is_a_located_verifier_error(tmp_path: Path, level: str) -> None:
    text = LOOP if level == "loop" else LOOP.replace("loop.apply", "tile.apply")
    if level == "tile":
        text = (
            'tile.kernel {name = "k", grid = [1], warps = 4, stages = 1} (%p: ptr<f32>) {\n'
            "  %r = tile.arange {size = 8} : tensor<8xi32>\n"
            '  %s = tile.apply %r, %r {fn = "addd"} : tensor<8xi32>\n'
            "}\n"
        )
        where, message = "3:3", "tile.apply: unknown function 'addd' (did you mean 'add'?)"
    else:
        text = text.replace('{fn = "maximum"}', '{fn = "maximun"}')
        where, message = "6:5", "loop.apply: unknown function 'maximun' (did you mean 'maximum'?)"
    src = tmp_path / "bad.ir"
    src.write_text(text)
    status, out, err = opt([str(src)])
    assert (status, out) == (1, "")
    assert err.startswith(f"{src}:{where}: error: {message}"), err
    assert "Traceback" not in err


def _apply(fn: object) -> loop.ApplyOp:
    block = Block(arg_types=[f32, f32])
    return loop.ApplyOp.create(operands=list(block.args), result_types=[f32], properties={"fn": fn})


def test_ir_built_with_a_string_or_a_number_fails_the_verifier() -> None:
    from irc.analysis.verifier import verify_op

    for fn, message in (
        (StringAttr("mull"), "loop.apply: unknown function 'mull' (did you mean 'mul'?)"),
        (StringAttr("mul"), "loop.apply: 'fn' is the string \"mul\", not the function"),
        (IntegerAttr(3, i32), "loop.apply: 'fn' must name a function"),
    ):
        out: list = []
        verify_op(_apply(fn), out)
        assert out and message in out[0].message, (fn, out)


def test_apply_fn_refuses_what_is_no_function() -> None:
    with pytest.raises(KeyError):
        loop.apply_fn("expp")
    assert tile.ApplyOp.get_irdl_definition().properties["fn"].constr.attr is loop.ApplyFnAttr
