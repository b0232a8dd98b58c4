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


# --- the README's and docs' Python examples run as written on the CPU set-up ------

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS_GPU = "# needs a GPU"
EXAMPLE_SECONDS = 30  # the README's promise for each example on the CPU set-up


def python_examples() -> list[tuple[str, str]]:
    """(where, code) of every ```python block of the README and docs/."""
    found = []
    for doc in DOCUMENTS:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.DOTALL)):
            found.append((f"{doc.relative_to(ROOT)}#{i}", code))
    return found


def free_names(code: str) -> set[str]:
    """Names a block reads but never defines or imports (a fragment's context)."""
    import builtins
    import symtable

    table = symtable.symtable(code, "<example>", "exec")
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    used = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    for child in table.get_children():
        used |= {s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()}
    return used - defined - set(dir(builtins))


def runnable(code: str) -> bool:
    """A whole program: it starts with an import, needs no GPU and no undefined name
    (fragments such as `compiled = irc.compile(model.eval(), (x,))` show a call)."""
    return code.lstrip().startswith("import") and NEEDS_GPU not in code and not free_names(code)


EXAMPLES = [(where, code) for where, code in python_examples() if runnable(code)]


def test_the_readme_has_a_runnable_python_example() -> None:
    assert any(where.startswith("README.md") for where, _ in EXAMPLES)


@pytest.mark.slow  # the README's 8192 x 8192 softmax: about 30 s of CPU
@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_python_examples_run_as_written_on_the_cpu(where: str, code: str, tmp_path: Path) -> None:
    import os
    import resource
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "IRC_CPU_TILING"}  # as a user runs it
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["IRC_CACHE_DIR"] = str(tmp_path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=20 * EXAMPLE_SECONDS,  # wall time on a loaded machine; CPU time is checked below
    )  # fmt: skip
    assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # CPU time, which other jobs on the machine inflate far less than wall time;
    # torch may use both cores of the 2-core set-up, hence twice the wall budget.
    assert cpu < 2 * EXAMPLE_SECONDS, f"{where} took {cpu:.0f} s of CPU"
