"""irc and MLIR tools: `--emit mlir` with locations, MLIR read back, kernels as symbols."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.traits import SymbolOpInterface, SymbolTable

import irc.tools.opt
from irc.dialects import tile
from irc.syntax.mlir_input import escape_name, looks_like_mlir, parse_mlir, unescape_name

GRAPH = """\
func @f(%x.y: tensor<64x32xf32>, %$b: tensor<64x32xf32>) -> (tensor<64x1xf32>, tensor<64x32xf32>) {
  %0 = graph.mul %x.y, %$b
  %a_1 = graph.exp %0
  %a = graph.reduce_sum %a_1 {dims = [1], keepdim = true}
  %1 = graph.div %a_1, %a
  return %a, %1 : tensor<64x1xf32>, tensor<64x32xf32>
}
"""

LEVELS = {
    "graph": [],
    "fused": ["-p", "fuse"],
    "loop": ["-p", "graph-to-loop"],
    "tile": ["-p", "graph-to-loop,tile,loop-to-tile"],
}


def opt(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stderr
    sys.stderr = err
    try:
        status = irc.tools.opt.run(args, stdout=out)
    finally:
        sys.stderr = saved
    return status, out.getvalue(), err.getvalue()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- detection and names -------------------------------------------------------------


def test_mlir_is_told_from_irc_text() -> None:
    assert looks_like_mlir('"builtin.module"() ({\n}) : () -> ()\n')
    assert looks_like_mlir("// a comment\n\nbuiltin.module {\n}\n")
    assert looks_like_mlir("module {\n  func.func @f() {\n  }\n}\n")
    assert looks_like_mlir('module {\n  "func.func"() ({\n  }) : () -> ()\n}\n')
    assert not looks_like_mlir(GRAPH)
    assert not looks_like_mlir("// c\nmodule {\nfunc @f() {\n  return\n}\n}\n")
    assert not looks_like_mlir('tile.kernel {name = "k", grid = [1]} () {\n}\n')


@given(st.from_regex(r"[A-Za-z0-9_.$-]+", fullmatch=True))
def test_names_survive_mlir_tools(name: str) -> None:
    """Every name irc's grammar takes is escaped into one xDSL keeps as written,
    also when its printer adds a `_N` to tell equal names apart."""
    escaped = escape_name(name)
    assert SSAValue.is_valid_name(escaped)
    assert SSAValue.extract_valid_name(escaped) == escaped
    assert SSAValue.extract_valid_name(escaped + "_3") == escaped
    assert unescape_name(escaped) == name


# --- round trips ---------------------------------------------------------------------


def test_mlir_round_trip_in_process_at_every_level(tmp_path: Path) -> None:
    src = write(tmp_path, "f.ir", GRAPH)
    for level, args in LEVELS.items():
        status, direct, err = opt([src, *args])
        assert status == 0, (level, err)
        status, mlir, err = opt([src, *args, "--emit", "mlir"])
        assert status == 0, (level, err)
        back = write(tmp_path, f"{level}.mlir", mlir)
        for form in (["--input", "mlir"], []):
            status, again, err = opt([*form, back])
            assert (status, err) == (0, ""), level
            assert again == direct, level


def test_round_trip_through_xdsl_opt(tmp_path: Path) -> None:
    """The real tool in between, as a pipeline would run it."""
    src = write(tmp_path, "f.ir", GRAPH)
    bin_dir = Path(sys.executable).parent
    for level, args in LEVELS.items():
        _, direct, _ = opt([src, *args])
        _, mlir, _ = opt([src, *args, "--emit", "mlir"])
        through = subprocess.run(
            [str(bin_dir / "xdsl-opt"), "--print-debuginfo"],
            input=mlir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert not through.startswith('"builtin.module"')  # xdsl-opt's own form
        status, again, err = opt(["--input", "mlir", write(tmp_path, "x.mlir", through)])
        assert (status, err) == (0, ""), level
        assert again == direct, level


# --- locations -----------------------------------------------------------------------


def test_emitted_mlir_is_located_in_the_ir_file(tmp_path: Path) -> None:
    src = write(tmp_path, "f.ir", GRAPH)
    _, mlir, _ = opt([src, "--emit", "mlir"])
    assert f'"graph.exp"(%$0) : (tensor<64x32xf32>) -> tensor<64x32xf32> loc("{src}":3:3)' in mlir
    assert f'%$$b: tensor<64x32xf32> loc("{src}":1:' in mlir
    _, tiled, _ = opt([src, *LEVELS["tile"], "--emit", "mlir"])
    # Ops the lowering made carry the place of the op they came from; only the
    # module itself, which nothing encloses, has none.
    assert tiled.count("loc(unknown)") == 1 and tiled.rstrip().endswith("loc(unknown)")
    assert re.search(rf'"tile.program_id".* loc\("{re.escape(src)}":\d+:\d+\)', tiled)
    _, bare, _ = opt([src, "--emit", "mlir", "--no-mlir-print-debuginfo"])
    assert "loc(" not in bare


def test_diagnostic_on_mlir_input_points_into_the_ir_file(tmp_path: Path) -> None:
    src = write(tmp_path, "f.ir", GRAPH)
    _, mlir, _ = opt([src, "--emit", "mlir"])
    bad = write(tmp_path, "bad.mlir", mlir.replace("dims = [1 : i64]", "dims = [5 : i64]"))
    status, out, err = opt([bad])
    assert (status, out) == (1, "")
    assert err.startswith(f"{src}:4:3: error: graph.reduce_sum: dims entry 5 is out of range")
    assert "\n  %a = graph.reduce_sum %a_1 {dims = [1], keepdim = true}\n  ^\n" in err


def test_diagnostic_on_unlocated_mlir_points_into_the_mlir_file(tmp_path: Path) -> None:
    src = write(tmp_path, "f.ir", GRAPH)
    _, mlir, _ = opt([src, "--emit", "mlir", "--no-mlir-print-debuginfo"])
    bad = write(tmp_path, "bad.mlir", mlir.replace("dims = [1 : i64]", "dims = [5 : i64]"))
    status, _, err = opt([bad])
    line = next(i for i, t in enumerate(mlir.splitlines(), 1) if "graph.reduce_sum" in t)
    assert status == 1
    assert err.startswith(f"{bad}:{line}:5: error: graph.reduce_sum: dims entry 5")
    assert '\n    %a = "graph.reduce_sum"' in err


def test_malformed_mlir_is_a_located_error(tmp_path: Path) -> None:
    bad = write(
        tmp_path,
        "bad.mlir",
        '"builtin.module"() ({\n  %0 = "arith.constant"() : () -> i32\n}) : () -> ()\n',
    )
    status, _, err = opt([bad])
    assert status == 1
    assert err.startswith(f"{bad}:2:") and "arith.constant is not registered" in err
    assert "Traceback" not in err
    cut = write(tmp_path, "cut.mlir", '"builtin.module"() ({\n  ^bb0(:\n')
    status, _, err = opt(["--input", "mlir", cut])
    assert status == 1 and err.startswith(f"{cut}:2:") and "Traceback" not in err


def test_forced_irc_input_reads_mlir_as_irc_text(tmp_path: Path) -> None:
    mlir = write(tmp_path, "m.mlir", '"builtin.module"() ({\n}) : () -> ()\n')
    status, _, err = opt(["--input", "ir", mlir])
    assert status == 1 and err.startswith(f"{mlir}:1:1: error:")


# --- symbols -------------------------------------------------------------------------


def tile_module(tmp_path: Path) -> tuple[ModuleOp, str]:
    src = write(tmp_path, "f.ir", GRAPH)
    _, mlir, _ = opt([src, *LEVELS["tile"], "--emit", "mlir"])
    return parse_mlir(mlir, "t.mlir"), mlir


def test_kernels_are_symbols_that_launches_resolve(tmp_path: Path) -> None:
    module, mlir = tile_module(tmp_path)
    module.verify()
    kernels = [op for op in module.body.ops if isinstance(op, tile.KernelOp)]
    launches = [op for op in module.walk() if isinstance(op, tile.LaunchOp)]
    assert kernels and len(launches) == len(kernels)
    for k in kernels:
        assert k.has_trait(SymbolOpInterface)
        assert k.properties["sym_name"] == k.kernel_name
    for launch in launches:
        assert SymbolTable.lookup_symbol(launch, launch.kernel) in kernels
    assert 'sym_name = "' in mlir and '<{name = "' not in mlir


def test_symbol_table_errors_on_mlir_input(tmp_path: Path) -> None:
    _, mlir = tile_module(tmp_path)
    first = re.search(r'sym_name = "(\w+)"', mlir)
    assert first is not None
    name = first.group(1)
    missing = write(tmp_path, "m.mlir", mlir.replace(f"kernel = @{name}", "kernel = @nope"))
    status, _, err = opt([missing])
    assert status == 1 and 'tile.launch: no tile.kernel is named "nope"' in err, err
    # A launch naming a symbol that is not a kernel (the host function).
    host = re.search(r'"func.func"\(\) <\{sym_name = "(\w+)"', mlir)
    assert host is not None
    wrong = write(
        tmp_path, "w.mlir", mlir.replace(f"kernel = @{name}", f"kernel = @{host.group(1)}")
    )
    status, _, err = opt([wrong])
    assert status == 1 and f'no tile.kernel is named "{host.group(1)}"' in err, err
    second = re.findall(r'sym_name = "(triton\w+)"', mlir)[1]
    twice = write(tmp_path, "t.mlir", mlir.replace(f'"{second}"', f'"{name}"'))
    status, _, err = opt([twice])
    assert status == 1 and f'a kernel above is named "{name}" too' in err, err
