"""One home for each fact: no source file outside the graph dialect lists graph ops.

A table of its own (a dict, set, list or tuple literal naming two or more graph
ops, by name or by class) is a second home for a fact about those ops: a new op
would have to be added there too, and nothing would say so. Facts live on the
op classes in dialects/graph.py (tests/test_op_facts.py walks them); other
files derive their tables from them (`graph.VIEW_OPS`, `op.short_name()`, ...).

`KNOWN` would list a table that remains, with why; it is empty, and an entry that
no longer occurs fails too, so that a new table cannot slip in.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from irc.dialects import graph

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("irc", "dialects", "passes", "lowering")
HOME = ROOT / "dialects" / "graph.py"

OPS = [op for op in graph.Graph.operations]
FULL_NAMES = {op.name for op in OPS}
BARE_NAMES = {op.name.removeprefix("graph.") for op in OPS}
CLASS_NAMES = {op.__name__ for op in OPS}

KNOWN: Counter[tuple[str, tuple[str, ...]]] = Counter()
"""None remain: comparisons, index arithmetic, reductions' combining ops, whole views
and the fuzzer's recipes all read facts of the op classes now."""

TORCH_MENUS = {
    ROOT / "irc" / "testing" / "torchgen.py": "its menus name torch calls (torch.tanh, "
    "x.softmax, x.gather), which share names with graph ops; a new graph op joins none",
}
"""Files whose op names are torch's, not the graph dialect's (not scanned)."""


def _graph_names(tree: ast.Module) -> dict[str, str]:
    """Names a module binds to graph op classes by `from irc.dialects.graph import ...`."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("irc.dialects.graph", "graph"):
            out.update({a.asname or a.name: a.name for a in node.names if a.name in CLASS_NAMES})
    return out


def _op_named(node: ast.expr, imported: dict[str, str]) -> str | None:
    """The graph op an expression names: `"graph.exp"`, `"exp"`, `graph.ExpOp`, `ExpOp`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = node.value.removeprefix("graph.")
        if node.value in FULL_NAMES or node.value in BARE_NAMES:
            return name
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "graph"
        and node.attr in CLASS_NAMES
    ):
        return getattr(graph, node.attr).name.removeprefix("graph.")
    if isinstance(node, ast.Name) and node.id in imported:
        return getattr(graph, imported[node.id]).name.removeprefix("graph.")
    return None


def tables(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """Each literal collection in `path` naming two or more graph ops: (line, ops)."""
    tree = ast.parse(path.read_text())
    imported = _graph_names(tree)
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        named = sorted({n for e in items if (n := _op_named(e, imported)) is not None})
        if len(named) >= 2:
            found.append((node.lineno, tuple(named)))
    return found


def _sources() -> list[Path]:
    return sorted(
        p for f in FOLDERS for p in (ROOT / f).rglob("*.py") if p != HOME and p not in TORCH_MENUS
    )


def test_no_source_file_lists_graph_ops_in_a_table_of_its_own() -> None:
    found: Counter[tuple[str, tuple[str, ...]]] = Counter()
    where: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for line, ops in tables(path):
            found[(rel, ops)] += 1
            where.setdefault((rel, ops), []).append(f"{rel}:{line}")
    new = found - KNOWN
    assert not new, "graph ops listed outside dialects/graph.py (make them op facts): " + "; ".join(
        f"{', '.join(where[k])} {list(k[1])}" for k in new
    )
    gone = KNOWN - found
    assert not gone, f"KNOWN lists tables that are gone (remove them from KNOWN): {dict(gone)}"
    assert all(path.is_file() for path in TORCH_MENUS), "TORCH_MENUS names a file that is gone"


def test_the_scan_finds_tables_by_name_and_by_class(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from irc.dialects import graph\n"
        "from irc.dialects.graph import ExpOp as E, LogOp\n"
        'A = {"reduce_sum": "sum", "reduce_max": "amax"}\n'
        "B = (graph.TransposeOp, graph.ReshapeOp)\n"
        "C = [E, LogOp]\n"
        'D = ("graph.add", "graph.mul")\n'
        'E2 = ("sum", "max", "graph.add")\n'
        "F = (graph.Cost, graph.AddOp)\n"
    )
    assert tables(sample) == [
        (3, ("reduce_max", "reduce_sum")),
        (4, ("reshape", "transpose")),
        (5, ("exp", "log")),
        (6, ("add", "mul")),
    ]
