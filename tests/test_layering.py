"""The package's layering: no import circle among irc's modules (imports inside
functions included), and `import irc` or a dialect loads no compiler driver."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"irc": "irc", "irc.dialects": "dialects", "irc.passes": "passes", "irc.lowering": "lowering"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if package == "irc" and parts and parts[0] in ("dialects", "passes", "lowering"):
                continue
            found[".".join([package, *parts])] = path
    return found


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Every irc module `path` imports, at any depth of the file (TYPE_CHECKING excepted)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parent, node.module])
            subs = [f"{base}.{a.name}" for a in node.names]
            names = [s for s in subs if s in known]
            if len(names) < len(subs):
                names.append(base)  # a name defined in the module itself
        for name in names:
            if name in known and name != module:
                out.add(name)
    return out


def test_no_import_circle() -> None:
    modules = _modules()
    graph = {m: _imports(p, m, set(modules)) for m, p in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    assert len(modules) > 40
    for m in sorted(modules):
        if m not in state:
            visit(m)


def test_importing_a_dialect_loads_no_driver() -> None:
    code = (
        "import sys, irc.dialects.graph, irc\n"
        "bad = [m for m in ('irc.compiler', 'irc.pipeline', 'irc.autotune', 'torch', 'triton')"
        " if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_facade_names_resolve() -> None:
    import irc

    for name in irc.__all__:
        assert getattr(irc, name) is not None
