"""print -> parse -> print is a fixed point over every `.ir` file in the repository.

Lit files are split at `// -----` as `--split-input-file` does; chunks that are
meant to fail (they carry `expected-error` annotations, or their file's RUN
line expects irc-opt to fail) are left out. Every other chunk must parse,
verify and print to text that re-parses to the same text, both as written and
after the `decompose` pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from irc.analysis.verifier import verify
from irc.pipeline import run_pipeline
from irc.syntax.parser import parse
from irc.syntax.printer import print_module

ROOT = Path(__file__).resolve().parents[1]
SPLIT = re.compile(r"^// -----.*$", re.MULTILINE)


def ir_files() -> list[Path]:
    files = sorted(ROOT.glob("examples/**/*.ir")) + sorted(ROOT.glob("tests/**/*.ir"))
    # tests/hostile holds files that must be rejected (tests/test_hostile.py).
    return [f for f in files if "Output" not in f.parts and "hostile" not in f.parts]


def chunks() -> list[tuple[str, str, int]]:
    """(id, text, first line) for every chunk that is meant to be valid."""
    out: list[tuple[str, str, int]] = []
    for path in ir_files():
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        runs = re.findall(r"RUN:\s*(\S+)", text)
        if runs and all(r == "not" for r in runs):
            continue  # every RUN line expects irc-opt to fail on this file
        pieces = SPLIT.split(text) if "--split-input-file" in text else [text]
        line = 1
        for i, piece in enumerate(pieces):
            if "expected-error" not in piece and piece.strip():
                name = rel if len(pieces) == 1 else f"{rel}#{i}"
                out.append((name, piece, line))
            line += piece.count("\n")
    return out


CHUNKS = chunks()


def test_the_repository_has_ir_files_to_check() -> None:
    names = {name.split("#")[0] for name, _, _ in CHUNKS}
    assert "examples/softmax.ir" in names
    assert "examples/every_op.ir" in names
    assert any(n.startswith("tests/lit/") for n in names)
    assert len(CHUNKS) >= 15


def _fixed_point(text: str, name: str) -> str:
    """Prints `text`, re-parses the print, prints again; returns the (equal) prints."""
    module = parse(text, name)
    verify(module)
    first = print_module(module)
    again = parse(first, name + " (printed)")
    verify(again)
    second = print_module(again)
    assert second == first, f"{name}: printing is not a fixed point\n{first}\n---\n{second}"
    return first


@pytest.mark.parametrize(("name", "text", "first_line"), CHUNKS, ids=[c[0] for c in CHUNKS])
def test_print_parse_print_is_a_fixed_point(name: str, text: str, first_line: int) -> None:
    module = parse(text, name, first_line)
    verify(module)
    printed = print_module(module)
    assert _fixed_point(printed, name) == printed
    # Printing keeps every function, in order, with its name.
    written = re.findall(r"^\s*func\s+(@[\w.$-]+)", text, re.MULTILINE)
    assert re.findall(r"^func (@[\w.$-]+)", printed, re.MULTILINE) == written


@pytest.mark.parametrize(("name", "text", "first_line"), CHUNKS, ids=[c[0] for c in CHUNKS])
def test_fixed_point_after_decompose(name: str, text: str, first_line: int) -> None:
    module = parse(text, name, first_line)
    run_pipeline(module, "decompose")
    printed = print_module(module)
    assert "graph.softmax" not in printed and "graph.layer_norm" not in printed
    assert _fixed_point(printed, name) == printed


def test_the_printer_writes_every_result_type() -> None:
    text = (
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %c = graph.constant {value = 2.0} : tensor<f32>\n"
        "  %y = graph.mul %x, %c\n"
        "  return %y : tensor<4xf32>\n"
        "}\n"
    )
    printed = print_module(parse(text))
    assert "%y = graph.mul %x, %c : tensor<4xf32>" in printed


def test_module_wrapper_and_comments_print_as_plain_functions() -> None:
    text = (
        "// leading comment\n"
        "module {\n"
        "  // a comment on its own line\n"
        "  func @a(%x: tensor<f32>) -> tensor<f32> {  // after the brace\n"
        "\n"
        "    return %x : tensor<f32>  // trailing\n"
        "  }\n"
        "}\n"
    )
    assert print_module(parse(text)) == (
        "func @a(%x: tensor<f32>) -> tensor<f32> {\n  return %x : tensor<f32>\n}\n"
    )


def test_odd_names_survive_printing() -> None:
    text = (
        "func @import(%class: tensor<2xf32>, %x.y: tensor<2xf32>, %def-1: tensor<f32>, "
        "%$0: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {\n"
        "  %0 = graph.add %class, %x.y : tensor<2xf32>\n"
        "  %a_1 = graph.mul %0, %def-1 : tensor<2xf32>\n"
        "  return %a_1, %$0 : tensor<2xf32>, tensor<2xf32>\n"
        "}\n"
    )
    assert print_module(parse(text)) == text


def test_numbers_print_back_exactly() -> None:
    values = ["2.0", "-1.5", "1.0e-05", "inf", "-inf", "nan", "0.1", "1e+300", "5e-324"]
    for v in values:
        text = (
            "func @f() -> tensor<f64> {\n"
            f"  %c = graph.constant {{value = {v}}} : tensor<f64>\n"
            "  return %c : tensor<f64>\n"
            "}\n"
        )
        printed = _fixed_point(text, "numbers.ir")
        written = re.search(r"value = ([^}]+)\}", printed)
        assert written is not None
        assert float(written.group(1)) == float(v) or v == "nan"


def test_decompose_names_do_not_clash_with_user_names() -> None:
    # The user already uses %0 and %1; the values decompose creates must not
    # print with those names.
    text = (
        "func @f(%0: tensor<2x8xf32>) -> tensor<2x8xf32> {\n"
        "  %1 = graph.softmax %0 {dim = 1} : tensor<2x8xf32>\n"
        "  return %1 : tensor<2x8xf32>\n"
        "}\n"
    )
    module = parse(text)
    run_pipeline(module, "decompose")
    printed = print_module(module)
    defined = re.findall(r"^\s*(%[\w.$-]+) =", printed, re.MULTILINE)
    assert len(defined) == len(set(defined)), printed
    assert "return %1 : tensor<2x8xf32>" in printed
    assert _fixed_point(printed, "names.ir") == printed


EXAMPLES = sorted((ROOT / "examples").glob("*.ir"))
LOWERINGS = [
    "decompose,fuse",
    "decompose,graph-to-loop",
    "decompose,fuse,graph-to-loop,tile,loop-to-tile",
]


@pytest.mark.parametrize("pipeline", LOWERINGS)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_lower_levels_are_a_fixed_point_too(path: Path, pipeline: str) -> None:
    """The loop and tile levels print in the same language and re-parse."""
    module = parse(path.read_text(), str(path))
    run_pipeline(module, pipeline)
    printed = print_module(module)
    assert _fixed_point(printed, f"{path.name} after {pipeline}") == printed


@pytest.mark.parametrize(
    "literal",
    ['"plain"', '"é€😀"', r'"a\"b"', r'"back\\slash"', r'"nl\nx\ttab\rcr"', r'"\u00e9\x41"',
     r'"\x00\x7f\u2028"', '""'],
)  # fmt: skip
def test_string_attributes_round_trip(literal: str) -> None:
    text = (
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        f"  %y = graph.fused %x {{kernel = {literal}}} (%a: tensor<4xf32>) {{\n"
        "    graph.yield %a\n"
        "  } : tensor<4xf32>\n"
        "  return %y : tensor<4xf32>\n"
        "}\n"
    )
    module = parse(text)
    printed = print_module(module)
    again = parse(printed)
    assert print_module(again) == printed
    kernels = [
        next(op for op in m.walk() if op.name == "graph.fused").properties["kernel"]
        for m in (module, again)
    ]
    assert kernels[0] == kernels[1]
    if literal.isascii():  # Python reads these escapes the same way
        assert kernels[0].data == literal[1:-1].encode().decode("unicode_escape")  # type: ignore[attr-defined]
