"""Names in IR never become code.

Kernel names are the one kind of IR name that becomes a Python identifier (the
name of a `@triton.jit` function): the verifier holds them to ASCII identifiers
that are not keywords, and the emitter renames those that would shadow a name
of the generated module. Every other name (functions, arguments) reaches the
generated Python only through `repr`. Each hostile input here would once have
run code, or failed with an internal error; now it is a located error (exit 1)
and nothing runs.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import keyword
import os
import re
from pathlib import Path

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr

import irc
import irc.tools.opt
from irc.dialects import graph, tile
from irc.ir.value_names import set_value_name
from irc.lowering.tile_to_triton import (
    GENERATED,
    emit_triton,
    kernel_identifiers,
    reserved_identifiers,
)
from irc.syntax.diagnostics import IrcError
from irc.syntax.printer import format_string
from irc.tools import run as run_cli

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


def payload(marker: Path) -> str:
    """Python that, spliced into a module where a kernel's name goes (after `def `
    and inside a launch call alike), creates `marker` while the module is imported."""
    return f"k(a=open({json.dumps(str(marker))}, 'w')):\n    X = ('''"


def test_the_payload_runs_when_spliced_into_python(tmp_path: Path) -> None:
    """The hostile name below is live: written into Python as the emitter once wrote
    kernel names, importing the module runs it (so its absence later means something)."""
    marker = tmp_path / "ran"
    name = "triton_" + payload(marker)
    source = (
        f"def {name}(ptr0, ptr1):\n    v0 = 1\n\n\n"
        f"def fn0(arg0):\n    _launch({name}, (1,), (arg0, ), 1)\n    return arg0\n"
    )
    exec(compile(source, "old_emitter.py", "exec"), {})  # noqa: S102 - the point of the test
    assert marker.exists()


# --- the same payload at every level -------------------------------------------------------


def graph_program(name: str) -> str:
    return (
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        f'  %y = graph.fused %x {{kernel = {name}, kind = "pointwise"}} (%a: tensor<4xf32>) {{\n'
        "    %e = graph.exp %a : tensor<4xf32>\n"
        "    graph.yield %e\n"
        "  } : tensor<4xf32>\n"
        "  return %y : tensor<4xf32>\n"
        "}\n"
    )


def loop_program(name: str) -> str:
    return (
        "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
        "  %0 = loop.alloc : memref<4xf32>\n"
        f"  loop.kernel {{name = {name}, bounds = [4]}} (%1: index) {{\n"
        "    %2 = loop.load %x, %1 : f32\n"
        '    %3 = loop.apply %2 {fn = "exp"} : f32\n'
        "    loop.store %3, %0, %1\n"
        "  }\n"
        "  return %0 : memref<4xf32>\n"
        "}\n"
    )


def tile_kernel(name: str, fn: str = "exp") -> str:
    """A kernel of 4 elements: `ptr1[i] = exp(ptr0[i])`, or `ptr0[i] + 1.0` for "add"."""
    lines = [
        f"tile.kernel {{name = {name}, grid = [1], warps = 1}} (%0: ptr<f32>, %1: ptr<f32>) {{",
        "  %2 = tile.arange {size = 4} : tensor<4xi32>",
        "  %3 = tile.load %0, %2 : tensor<4xf32>",
    ]
    if fn == "add":
        lines += [
            "  %4 = tile.constant {value = 1.0} : f32",
            '  %5 = tile.apply %3, %4 {fn = "add"} : tensor<4xf32>',
        ]
    else:
        lines += [f'  %5 = tile.apply %3 {{fn = "{fn}"}} : tensor<4xf32>']
    lines += ["  tile.store %1, %2, %5", "}", ""]
    return "\n".join(lines)


def tile_program(hostile: str) -> str:
    """A hostile kernel that nothing launches (its name cannot be written as a symbol),
    then a good one that @f launches."""
    return (
        tile_kernel(hostile)
        + "\n"
        + tile_kernel('"good"')
        + "\n"
        + "func @f(%x: memref<4xf32>) -> memref<4xf32> {\n"
        + "  %0 = loop.alloc : memref<4xf32>\n"
        + "  tile.launch %x, %0 {kernel = @good}\n"
        + "  return %0 : memref<4xf32>\n"
        + "}\n"
    )


LEVELS = {
    # level: (program, line:column of the error, op in the message)
    "graph": (graph_program, (2, 3), "graph.fused"),
    "loop": (loop_program, (3, 3), "loop.kernel"),
    "tile": (tile_program, (1, 1), "tile.kernel"),
}


def first_error(err: str, path: Path, where: tuple[int, int], message: str, text: str) -> None:
    """`FILE:LINE:COL: error: MESSAGE`, the source line, a caret under the column."""
    lines = err.split("\n")
    line, col = where
    assert lines[0].startswith(f"{path}:{line}:{col}: error: {message}"), err
    assert text.split("\n")[line - 1].startswith(lines[1].removesuffix("...")), err  # long: cut
    assert lines[2] == " " * (col - 1) + "^", err
    assert "Traceback" not in err


def run_quietly(main: object, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)  # type: ignore[operator]
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("level", list(LEVELS))
def test_hostile_kernel_name_is_a_located_error_and_runs_nothing(
    level: str, tmp_path: Path
) -> None:
    program, where, op = LEVELS[level]
    marker = tmp_path / "ran"
    text = program(format_string(payload(marker)))
    path = tmp_path / f"{level}.ir"
    path.write_text(text)
    message = f"{op}: kernel name "

    status, out, err = run_quietly(irc.tools.opt.run, [str(path), "--emit", "triton"])
    assert status == 1 and out == ""
    first_error(err, path, where, message, text)
    assert "is not an identifier (ASCII letters, digits and _" in err.split("\n")[0]

    with pytest.raises(IrcError) as info:
        irc.compile(path, device=DEVICE)
    d = info.value.diagnostics[0]
    assert d.location is not None and (d.location.line, d.location.column) == where
    assert d.message.startswith(message)

    status, _, err = run_quietly(run_cli.main, [str(path), "--check", "--device", DEVICE])
    assert status == 1
    first_error(err, path, where, message, text)

    assert not marker.exists()


def test_a_kernel_name_set_in_python_is_checked_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    module = irc.parse(graph_program('"poi_exp_0"'), "api.ir")
    fused = next(op for op in module.walk() if isinstance(op, graph.FusedOp))
    fused.kernel = StringAttr(payload(marker))
    with pytest.raises(IrcError, match="graph.fused: kernel name .* is not an identifier"):
        irc.compile(module, device=DEVICE)
    # The emitter checks on its own too: tile IR that skipped the verifier.
    tile_module = irc.parse(tile_program('"good2"'), "api.ir")
    kernel = next(op for op in tile_module.walk() if isinstance(op, tile.KernelOp))
    kernel.kernel_name = StringAttr(payload(marker))
    with pytest.raises(IrcError, match="tile.kernel: kernel name .* is not an identifier"):
        emit_triton(tile_module)
    assert not marker.exists()


# --- the verifier's checks of kernel names, through irc-opt ----------------------------------

VERIFIER_CASES = [
    # (id, program text, line:col, message)
    ("graph-dash", graph_program('"my-kernel"'), (2, 3),
     'graph.fused: kernel name "my-kernel" is not an identifier'),
    ("graph-keyword", graph_program('"class"'), (2, 3),
     'graph.fused: kernel name "class" is a Python keyword'),
    ("graph-digit", graph_program('"1k"'), (2, 3), 'graph.fused: kernel name "1k" is not an'),
    ("graph-empty", graph_program('""'), (2, 3), 'graph.fused: kernel name "" is not an'),
    # Python folds non-ASCII letters onto ASCII names (NFKC): fullwidth 'torch' is torch.
    ("graph-fullwidth", graph_program('"\uff54\uff4f\uff52\uff43\uff48"'), (2, 3),
     "graph.fused: kernel name \"\uff54\uff4f\uff52\uff43\uff48\" is not an identifier"),
    ("graph-not-string", graph_program("3"), (2, 3),
     'graph.fused: kernel must be a string, like "poi_exp_0"'),
    ("loop-dash", loop_program('"my-kernel"'), (3, 3),
     'loop.kernel: kernel name "my-kernel" is not an identifier'),
    ("loop-keyword", loop_program('"def"'), (3, 3),
     'loop.kernel: kernel name "def" is a Python keyword'),
    ("tile-dash", tile_program('"my-kernel"').replace("@good", "@my-kernel"), (1, 1),
     'tile.kernel: kernel name "my-kernel" is not an identifier'),
    ("tile-keyword", tile_program('"import"').replace("@good", "@import"), (1, 1),
     'tile.kernel: kernel name "import" is a Python keyword'),
    ("tile-newline", tile_program('"a\\nb"'), (1, 1),
     'tile.kernel: kernel name "a\\nb" is not an identifier'),
    ("launch-unknown", tile_program('"other"').replace("@good", "@nope"), (17, 3),
     'tile.launch: no tile.kernel is named "nope"'),
    ("launch-arity", tile_program('"other"').replace("%x, %0 {", "%x {"), (17, 3),
     'tile.launch: kernel "good" takes 2 buffers, got 1'),
    ("kernel-twice", tile_program('"good"'), (8, 1),
     'tile.kernel: a kernel above is named "good" too (names are unique)'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [c[1:] for c in VERIFIER_CASES],
    ids=[c[0] for c in VERIFIER_CASES],
)
def test_bad_kernel_names_are_located_errors(
    text: str, where: tuple[int, int], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.ir"
    path.write_text(text)
    status, out, err = run_quietly(irc.tools.opt.run, [str(path), "--emit", "triton"])
    assert status == 1 and out == "", err
    first_error(err, path, where, message, text)


def test_good_kernel_names_pass_at_every_level(tmp_path: Path) -> None:
    for text in (graph_program('"_a1"'), loop_program('"match"'), tile_program('"Z_9"')):
        path = tmp_path / "ok.ir"
        path.write_text(text)
        status, out, err = run_quietly(irc.tools.opt.run, [str(path), "--emit", "triton"])
        assert status == 0, err
        compile(out, "generated.py", "exec")  # syntax check of the generated code


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ('{kind = "max, 0)\\nimport os #"}', "tile.reduce: 'kind' must be one of"),
        ("{evict = \"last'); import os; ('\"}", 'tile.load: evict is "first" or "last"'),
    ],
    ids=["reduce-kind", "load-evict"],
)
def test_enum_like_strings_are_checked_before_the_emitter(
    attr: str, message: str, tmp_path: Path
) -> None:
    kernel = (
        'tile.kernel {name = "k", grid = [1], warps = 1} (%0: ptr<f32>, %1: ptr<f32>) {\n'
        "  %2 = tile.arange {size = 4} : tensor<4xi32>\n"
        + (
            f"  %3 = tile.load %0, %2 {attr} : tensor<4xf32>\n  %5 = tile.apply %3 "
            '{fn = "exp"} : tensor<4xf32>\n'
            if "evict" in attr
            else "  %3 = tile.load %0, %2 : tensor<4xf32>\n"
            f"  %5 = tile.reduce %3 {attr[:-1]}, axis = 0}} : f32\n"
        )
        + "  tile.store %1, %2, %5\n}\n"
    )
    path = tmp_path / "t.ir"
    path.write_text(kernel)
    status, _, err = run_quietly(irc.tools.opt.run, [str(path), "--emit", "triton"])
    assert status == 1
    assert message in err.split("\n")[0] and "Traceback" not in err


# --- names that are legal but would collide: renamed by the emitter ---------------------------

COLLIDING = [
    "torch", "tl", "triton", "range", "float", "len", "DEVICE", "FUNCTIONS", "fn0", "arg0",
    "buf0", "v0", "ptr0", "d0", "_check", "_launch", "_irc_max", "_irc_bind", "_IRC_UNSET",
    "host_functions", "__builtins__", "__name__", "k_torch",
]  # fmt: skip


def chain_program(names: list[str]) -> str:
    """Kernel i adds 1; @f launches them in order, so it returns x + len(names) only if
    every launch starts its own kernel."""
    kernels = "".join(tile_kernel(format_string(n), "add") + "\n" for n in names)
    body = ["func @f(%x: memref<4xf32>) -> memref<4xf32> {"]
    prev = "%x"
    for i, n in enumerate(names):
        body.append(f"  %b{i} = loop.alloc : memref<4xf32>")
        body.append(f"  tile.launch {prev}, %b{i} {{kernel = @{n}}}")
        prev = f"%b{i}"
    body += [f"  return {prev} : memref<4xf32>", "}", ""]
    return kernels + "\n".join(body)


def test_kernel_names_that_would_shadow_module_names_are_renamed() -> None:
    text = chain_program(COLLIDING)
    module = irc.parse(text, "chain.ir")
    irc.verify(module)
    compiled = irc.compile(module, device=DEVICE, fuse=False)
    x = torch.randn(4, device=DEVICE)
    torch.testing.assert_close(compiled.f(x), x + len(COLLIDING))

    tree = ast.parse(compiled.source)
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    kernels = [d for d in defs if d != "fn0" and not d.startswith("_")]  # not the helpers
    assert len(kernels) == len(COLLIDING) == len(set(kernels))
    reserved = reserved_identifiers()
    for name in kernels:
        assert name not in reserved and not GENERATED.fullmatch(name), name
        assert not name.startswith(("__", "_irc", "_IRC")), name
    assert "k_torch" in kernels and "k_k_torch" in kernels  # torch -> k_k_torch: k_torch is taken
    assert '# tile.kernel "torch"\n@triton.jit\ndef k_k_torch(' in compiled.source
    # A name that shadows nothing keeps its spelling (profilers show it).
    names = kernel_identifiers(
        [tile.KernelOp.create(properties={"sym_name": StringAttr("triton_x")})]
    )
    assert list(names.values()) == ["triton_x"]


def test_reserved_names_are_what_the_module_binds() -> None:
    reserved = reserved_identifiers()
    assert {"torch", "triton", "tl", "DEVICE", "_check", "_launch", "FUNCTIONS"} <= reserved
    assert {"range", "float", "print"} <= reserved and set(keyword.kwlist) <= reserved
    assert "triton_poi_exp_0" not in reserved


# --- function and argument names: strings only -----------------------------------------------

WEIRD_FUNCTION = "f'\"\\\n)import os#"
WEIRD_ARGUMENT = "x'\n\"\\y"


def weird_module() -> ModuleOp:
    """A module whose names the parser would never give: quotes, newlines, backslashes."""
    module = irc.parse(
        "func @f(%x: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = graph.add %x, %w : tensor<4xf32>\n"
        "  return %y : tensor<4xf32>\n"
        "}\n"
    )
    f = next(op for op in module.body.ops if isinstance(op, func.FuncOp))
    f.sym_name = StringAttr(WEIRD_FUNCTION)
    set_value_name(f.body.block.args[0], WEIRD_ARGUMENT)
    return module


def test_function_and_argument_names_reach_python_as_strings_only() -> None:
    compiled = irc.compile(weird_module(), device=DEVICE)
    tree = ast.parse(compiled.source)
    # Only imports, assignments and definitions at the top: nothing runs on import but
    # the header's own setup.
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Import", "ImportFrom", "Assign", "FunctionDef"}, kinds
    identifiers = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    identifiers |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    assert not any("import" in i or "\n" in i or "'" in i for i in identifiers)
    # The names come back as they were.
    assert list(compiled.functions) == [WEIRD_FUNCTION]
    x, w = torch.randn(4, device=DEVICE), torch.randn(4, device=DEVICE)
    f = compiled[WEIRD_FUNCTION]
    torch.testing.assert_close(f(x, w), x + w)
    torch.testing.assert_close(f(w=w, **{WEIRD_ARGUMENT: x}), x + w)
    with pytest.raises(ValueError) as info:
        f(x[:2], w)
    assert str(info.value).startswith(f"@{WEIRD_FUNCTION}: argument %{WEIRD_ARGUMENT} must be")
    # Comments stay comments: the header line and the signature line have no line breaks.
    assert f"# @{WEIRD_FUNCTION}" not in compiled.source
    assert "# @f'\"\\?)import os#(" in compiled.source


def test_odd_but_legal_names_run_and_are_keywords() -> None:
    """`@import(%class, %x.y, %def-1)`: the spec allows them; none is an identifier."""
    text = (
        "func @import(%class: tensor<3xf32>, %x.y: tensor<3xf32>, %def-1: tensor<3xf32>)"
        " -> tensor<3xf32> {\n"
        "  %a = graph.add %class, %x.y : tensor<3xf32>\n"
        "  %b = graph.mul %a, %def-1 : tensor<3xf32>\n"
        "  return %b : tensor<3xf32>\n"
        "}\n"
    )
    compiled = irc.compile(irc.parse(text), device=DEVICE)
    c, xy, d = (torch.randn(3, device=DEVICE) for _ in range(3))
    f = getattr(compiled, "import")
    torch.testing.assert_close(f(c, xy, d), (c + xy) * d)
    torch.testing.assert_close(f(**{"x.y": xy, "def-1": d, "class": c}), (c + xy) * d)
    torch.testing.assert_close(f(c, **{"%def-1": d, "x.y": xy}), (c + xy) * d)
    tree = ast.parse(compiled.source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"import", "class", "x.y", "def-1"}
    assert "FUNCTIONS = {'import': fn0}" in compiled.source


def test_a_check_message_reaches_the_kernel_only_as_a_string(tmp_path: Path) -> None:
    """`tile.check`'s words go into `tl.device_assert(cond, "...")`: a hand-written
    message of quotes, newlines and Python is one string constant of the kernel, and
    the module imports and runs without running it."""
    marker = tmp_path / "ran"
    words = 'x\'"""\n' + payload(marker) + "\\'\n)\nopen('x', 'w')#"
    text = """func @f(%w: tensor<20x16xf32>, %ids: tensor<7xi64>) -> tensor<7x16xf32> {
  %e = graph.index_select %w, %ids {dim = 0}
  %s = graph.exp %e
  return %s : tensor<7x16xf32>
}"""
    module = irc.parse(text, "check.ir")
    irc.run_pipeline(module, "decompose,fuse,graph-to-loop,split-reduction,tile,loop-to-tile")
    (check,) = [op for op in module.walk() if isinstance(op, tile.CheckOp)]
    check.what = StringAttr(words)
    hostile = irc.parse(irc.print_module(module), "check_tile.ir")
    source = emit_triton(hostile, "check_tile.ir")
    messages = [
        node.args[1].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "tl.device_assert"
        and isinstance(node.args[1], ast.Constant)
    ]
    assert messages == [words]
    compiled = irc.compile(hostile, device=DEVICE)
    w = torch.randn(20, 16, device=DEVICE)
    ids = torch.randint(0, 20, (7,), device=DEVICE)
    torch.testing.assert_close(compiled["f"](w, ids), torch.exp(w[ids]))
    assert not marker.exists()


def test_a_kernel_split_and_combined_once_checks_its_name_before_any_pass(
    tmp_path: Path,
) -> None:
    """Batch-norm statistics of 69190x149 f32 (41 MB) are split into three kernels
    whose names are derived from the user's (`_split`, `_combine`: partials combined
    once because every program would reread 2.7 times its chunk's bytes of them).
    A hostile name on that loop-level kernel is a located error before any pass
    derives a name from it, and nothing runs; a legal one gives three identifiers."""
    x, row = "tensor<69190x149xf32>", "tensor<1x149xf32>"
    graph_text = f"""func @f(%x: {x}) -> ({x}, {row}) {{
  %m = graph.reduce_mean %x {{dims = [0], keepdim = true}} : {row}
  %d = graph.sub %x, %m : {x}
  %q = graph.mul %d, %d : {x}
  %v = graph.reduce_mean %q {{dims = [0], keepdim = true}} : {row}
  %y = graph.mul %d, %v : {x}
  return %y, %v : {x}, {row}
}}
"""
    module = irc.parse(graph_text, "t.ir")
    irc.run_pipeline(module, "fuse,graph-to-loop")
    loop_text = irc.print_module(module)
    (name,) = set(re.findall(r'loop\.kernel \{name = ("[^"]*")', loop_text))
    marker = tmp_path / "ran"
    hostile = loop_text.replace(name, format_string(payload(marker)), 1)
    path = tmp_path / "stats.ir"
    path.write_text(hostile)
    status, out, err = run_quietly(
        irc.tools.opt.run,
        [str(path), "-p", "one-pass-variance,split-reduction", "--emit", "triton"],
    )
    assert status == 1 and out == ""
    line = next(i for i, ln in enumerate(hostile.split("\n"), 1) if "loop.kernel" in ln)
    first_error(err, path, (line, 3), "loop.kernel: kernel name ", hostile)
    assert not marker.exists()

    path.write_text(loop_text.replace(name, '"stats"', 1))
    status, out, err = run_quietly(
        irc.tools.opt.run,
        [str(path), "-p", "one-pass-variance,split-reduction", "--emit", "triton"],
    )
    assert status == 0, err
    defs = re.findall(r"^def (\w+)\(", out, re.M)
    assert {"triton_stats_split", "triton_stats_combine"} <= set(defs)
    assert len(defs) == len(set(defs)) and all(d.isidentifier() for d in defs)
