"""The code in docs/language.md is real: its programs parse, verify and round-trip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import irc

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "language.md").read_text()
BLOCKS = re.findall(r"```[a-z]*\n(.*?)```", DOC, re.DOTALL)
PROGRAMS = [b for b in BLOCKS if re.search(r"^\s*func @", b, re.MULTILINE)]
SNIPPETS = [b for b in BLOCKS if b.lstrip().startswith("%") and "graph." in b]


def test_the_document_has_programs() -> None:
    assert len(PROGRAMS) >= 2 and SNIPPETS


@pytest.mark.parametrize("text", PROGRAMS)
def test_programs_parse_verify_and_round_trip(text: str) -> None:
    module = irc.parse(text, "language.md")
    irc.verify(module)
    irc.run_pipeline(module, "decompose")
    printed = irc.print_module(module)
    assert irc.print_module(irc.parse(printed)) == printed


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_op_snippets_parse_inside_a_function(snippet: str) -> None:
    # A snippet uses %x: tensor<4xf32> and defines %y.
    text = (
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        + "".join(f"  {line}\n" for line in snippet.strip().split("\n"))
        + "  return %y : tensor<4xf32>\n}\n"
    )
    module = irc.parse(text, "language.md")
    irc.verify(module)
    printed = irc.print_module(module)
    assert irc.print_module(irc.parse(printed)) == printed


def test_every_graph_op_is_documented() -> None:
    from irc.dialects.graph import Graph

    for op in Graph.operations:
        short = op.name.removeprefix("graph.")
        assert re.search(rf"`(graph\.)?{short}`|\b{short}\b", DOC), op.name
