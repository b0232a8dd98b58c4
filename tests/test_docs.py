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


# --- the README's and docs' irc-opt and irc-run commands run on the CPU set-up ----------

TOOLS = ("irc-opt", "irc-run")
CPU_BENCHMARK = re.compile(r"python benchmarks/\w+\.py .*--smoke")
"""A benchmark's line for the CPU set-up (the rest need a GPU, and say so)."""
PLACEHOLDERS = {
    "FILE.ir": "examples/softmax.ir",  # the README's example, and the largest one
    "OUT.ir": "out.ir",
    "NAME": "softmax",  # FILE.ir's function
    "N": "1",
}
"""What a command's placeholders stand for; `block.ir` is the small block of
tests/pytorch_small_block.py, written by irc-import as docs/pytorch.md does."""
BLOCK_IMPORT = "irc-import {root}/tests/pytorch_small_block.py:SmallBlock --input 2x16x8xf32 -o %s"
BLOCK_IMPORT %= "block.ir"


def documented_commands() -> dict[str, tuple[str, str]]:
    """{command: (where, comment)}: every irc-opt / irc-run line of a code block of the
    README and docs/ (the `&&`-joined parts of a line too) and every benchmark's
    `--smoke` line, each `[optional]` group
    left out and, in a second command, put in (`a|b` as `a`), placeholders filled."""
    import shlex

    found: dict[str, tuple[str, str]] = {}
    for doc in DOCUMENTS:
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), re.DOTALL):
            for line in block.splitlines() if lang in ("", "sh", "bash") else ():
                code, _, comment = line.partition(" #")
                for part in code.split("&&"):
                    tool = part.split()[:1] in ([t] for t in TOOLS)
                    if not (tool or CPU_BENCHMARK.match(part.strip())):
                        continue
                    where = f"{doc.relative_to(ROOT)}: {line.strip()}"
                    without = re.sub(r"\s*\[[^\]]*\]", "", part)
                    within = re.sub(r"\[([^\]]*)\]", r"\1", part)
                    within = re.sub(r"(\S+)\|\S+", r"\1", within.replace(" | ", " ! "))
                    for variant in (without, within.replace(" ! ", " | ")):
                        filled = [PLACEHOLDERS.get(w, w) for w in shlex.split(variant)]
                        found.setdefault(shlex.join(filled), (where, comment))
    return found


COMMANDS = documented_commands()


def test_every_documented_command_is_found_and_filled_in() -> None:
    commands = list(COMMANDS)
    assert "irc-run examples/softmax.ir --check --progress" in commands
    assert "irc-run examples/softmax.ir --fn softmax --seed 1 --device cpu" in commands
    assert "irc-run examples/softmax.ir --check --no-fuse" in commands
    assert "irc-opt examples/softmax.ir --fuse --fusion-report=json '|' jq ." in commands
    assert {where.split(":")[0] for where, _ in COMMANDS.values()} == {
        "README.md", "docs/benchmarks.md", "docs/language.md", "docs/pytorch.md"
    }  # fmt: skip
    assert "python benchmarks/attention.py --smoke" in commands
    # A new placeholder (an all-capitals word) needs a value in PLACEHOLDERS.
    for command in commands:
        left = [w for w in command.split() if re.fullmatch(r"[A-Z][A-Z0-9_]*(\.\w+)?", w)]
        assert not left, f"{COMMANDS[command][0]}: fill in {left} (PLACEHOLDERS)"


@pytest.fixture(scope="module")
def block_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's working folder: the examples, and block.ir made by irc-import."""
    import shlex
    import subprocess

    where = tmp_path_factory.mktemp("commands")
    (where / "examples").symlink_to(ROOT / "examples")
    command = shlex.split(BLOCK_IMPORT.format(root=ROOT))
    done = subprocess.run(command, cwd=where, env=_user_env(where), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def _user_env(cache: Path) -> dict[str, str]:
    """The environment of a user of the CPU set-up: the venv's tools first on PATH, no GPU,
    the interpreter's tilings (not the suite's IRC_CPU_TILING=gpu), a cold cache."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "IRC_CPU_TILING"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["IRC_CACHE_DIR"] = str(cache / "irc-cache")
    return env


@pytest.mark.slow  # irc-run examples/softmax.ir --check: 8192 x 8192, 8 s; blocks.py --smoke 25 s
@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_documented_commands_run_on_the_cpu(command: str, block_dir: Path, tmp_path: Path) -> None:
    """Each runs in a fresh working folder with a cold cache; one whose comment says it
    needs a GPU must say so and exit 1. `| jq .`: the output must be JSON alone."""
    import json
    import resource
    import shlex
    import shutil
    import subprocess

    where, comment = COMMANDS[command]
    words = shlex.split(command)
    piped_to = words[words.index("|") + 1 :] if "|" in words else []
    words = words[: words.index("|")] if piped_to else words
    for folder in ("examples", "benchmarks"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    shutil.copy(block_dir / "block.ir", tmp_path / "block.ir")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        words, cwd=tmp_path, env=_user_env(tmp_path), capture_output=True, text=True,
        timeout=20 * EXAMPLE_SECONDS,  # wall time on a loaded machine; CPU time is checked below
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if "GPU" in comment:
        assert done.returncode == 1 and "error:" in done.stderr and "GPU" in done.stderr, where
    else:
        assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"
        if "-o" in words:
            assert (tmp_path / words[words.index("-o") + 1]).stat().st_size > 0, where
        else:
            assert done.stdout, where
        if piped_to[:1] == ["jq"]:
            json.loads(done.stdout)  # what jq needs: JSON alone on stdout
    assert cpu < 2 * EXAMPLE_SECONDS, f"{where} took {cpu:.0f} s of CPU"


# --- docs/architecture.md: "Adding a pass", run as written ------------------------------

ARCHITECTURE = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
ADD_A_PASS = ARCHITECTURE[ARCHITECTURE.index("## Adding a pass") :].split("\n## ")[0]
SOFTMAXISH = """\
func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = graph.exp %x
  %s = graph.exp %e
  return %s : tensor<4x8xf32>
}
"""


def test_the_add_a_pass_walk_through_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io
    import sys
    import types

    import irc.passes
    import irc.tools.opt

    pass_file, registration = re.findall(r"```python\n(.*?)```", ADD_A_PASS, re.DOTALL)
    module = types.ModuleType("irc.passes.count_exp")
    monkeypatch.setitem(sys.modules, "irc.passes.count_exp", module)
    exec(compile(pass_file, "passes/count_exp.py", "exec"), module.__dict__)
    namespace = {"PASSES": dict(irc.passes.PASSES), "ModulePass": irc.passes.ModulePass}
    exec(compile(registration, "passes/__init__.py", "exec"), namespace)
    added = set(namespace["PASSES"]) - set(irc.passes.PASSES)
    assert added == {"count-exp"}
    monkeypatch.setitem(irc.passes.PASSES, "count-exp", namespace["PASSES"]["count-exp"])
    counts = module.CountExpPass.counts

    irc.run_pipeline(irc.parse(SOFTMAXISH, "f.ir"), "graph-to-loop,count-exp")
    assert counts == [2]  # one kernel per exp, unfused
    path = tmp_path / "f.ir"
    path.write_text(SOFTMAXISH)
    out = io.StringIO()
    assert irc.tools.opt.run([str(path), "-p", "fuse,graph-to-loop,count-exp"], stdout=out) == 0
    assert counts == [2, 2] and 'fn = "exp"' in out.getvalue()
    # The level check applies to it: a graph module is refused, as a located usage error.
    err = io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        status = irc.tools.opt.run([str(path), "-p", "count-exp"], stdout=io.StringIO())
    finally:
        sys.stderr = saved
    assert status == 1 and "count-exp" in err.getvalue() and counts == [2, 2]


# --- README.md and docs/*.md name modules that exist ----------------------------------

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_PATH = re.compile(
    r"\b((?:irc|dialects|passes|lowering|tests|benchmarks|examples)/[\w/.-]*\.(?:py|lark|ir|sh|md|toml))\b"
)
MODULE_NAME = re.compile(r"`(irc(?:\.[a-z_][a-z_0-9]*)+)")


def _doc_text(path: Path) -> str:
    """The page, less the add-a-pass walk-through (it names the files it has you create)."""
    text = path.read_text()
    if path.name == "architecture.md":
        text = text.replace(ADD_A_PASS, "")
    return text


def _names_something(dotted: str) -> bool:
    """`irc.a.b.c` is a module, or an attribute of one (a function, a class, a constant)."""
    import importlib

    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_docs_name_only_paths_and_modules_that_exist(doc: Path) -> None:
    text = _doc_text(doc)
    missing = sorted({p for p in SOURCE_PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"
    unknown = sorted({m for m in MODULE_NAME.findall(text) if not _names_something(m)})
    assert not unknown, f"{doc.name} names modules or attributes that do not exist: {unknown}"
