"""The layout suite (benchmarks/layouts.py): its programs, and its smoke run on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import irc

ROOT = Path(__file__).resolve().parent.parent


def _layouts() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "irc_layouts", ROOT / "benchmarks" / "layouts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["irc_layouts"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


layouts = _layouts()
WORKLOADS = layouts._workloads()

# The rows of issue 16's table and the peer byte-count tests: each must be covered.
ROWS = [
    "full reduction beside a full-size output",
    "column reduction",
    "batch-norm statistics",
    "transposed operand",
    "long rows",
    "reshape of a kernel's output",
    "GEMM + bias + exact GELU",
    "causal attention written out",
    "test_neighbor",
    "keops",
    "two reductions over different dims of one input",
    "layer norm then a multi-level reduction",
]


def test_the_suite_covers_every_row_with_several_shapes() -> None:
    assert len(WORKLOADS) >= 14
    assert len({w.name for w in WORKLOADS}) == len(WORKLOADS)
    for row in ROWS:
        assert any(row in w.row for w in WORKLOADS), row
    for w in WORKLOADS:
        assert len(w.shapes) >= 2, w.name
    shapes = [s for w in WORKLOADS for s in w.shapes]
    assert {s.dtype for s in shapes} >= {"f32", "bf16", "f16"}
    assert any(v % 2 for s in shapes for v in s.dims.values())  # odd sizes
    vocab = [s for w in WORKLOADS if w.name == "softmax_vocab" for s in w.shapes]
    assert _has(vocab, rows=4096, vocab=50257)


def _has(shapes: list[Any], **dims: int) -> bool:
    return any(all(s.dims.get(k) == v for k, v in dims.items()) for s in shapes)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_gpu_shape_compiles(workload: Any, tmp_path: Path) -> None:
    """The GPU sizes are not run here, but their programs compile to Triton."""
    for shape in workload.shapes:
        path = tmp_path / f"{workload.name}.ir"
        path.write_text(workload.ir(shape))
        assert irc.compile(path, device="cpu").kernel_count >= 1


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_expected_gemm_kernels_follow_the_library_choice(dtype: str) -> None:
    """With the GEMM on the library, irc launches its operand copies and epilogue."""
    (w,) = [w for w in WORKLOADS if w.name == "gemm_bias_gelu"]
    shape = layouts._S(dtype, m=37, k=45, n=29)
    for library in (False, True):
        choice = "always" if library else "never"
        compiled = irc.compile(irc.parse(w.ir(shape)), device="cpu", library_gemm=choice)
        assert layouts._uses_library(compiled.module) == library
        assert compiled.kernel_count == w.irc_kernels(shape, library)


SLOW = {"softmax_vocab", "logsumexp_reshape", "softmax_columns"}  # over ~5 s in the interpreter


@pytest.mark.parametrize(
    "workload",
    [pytest.param(w, marks=pytest.mark.slow) if w.name in SLOW else w for w in WORKLOADS],
    ids=lambda w: w.name,
)
def test_smoke_row_is_correct_on_the_cpu(workload: Any, tmp_path: Path) -> None:
    row = layouts.measure(workload, workload.smoke, "cpu", None, tmp_path, with_compile=False)
    assert row["correct"], row["verdicts"]
    assert row["kernels_irc"] == row["kernels_irc_static"] >= 1
    if row["kernels_irc_expected"] is not None:  # views and peer patterns: pinned
        assert row["kernels_irc_static"] == row["kernels_irc_expected"]
    assert row["irc_ms"] > 0 and row["compile_ms"] is None


def test_smoke_command_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, js, ir = tmp_path / "t.md", tmp_path / "t.json", tmp_path / "ir"
    argv = ["--smoke", "--only", "column_sum", "cos_reshape_cos", "gemm_bias_gelu"]
    rc = layouts.main([*argv, "--markdown", str(md), "--json", str(js), "--write-ir", str(ir)])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("workload") and len(out) == 4
    assert all(line.rstrip().endswith(("ok", "floor is torch.mm")) for line in out[1:])
    table = md.read_text().splitlines()
    assert table[2].startswith("| workload | shape |") and len(table) == 4 + 3
    assert "| gemm_bias_gelu |" in table[6] and "floor is torch.mm" in table[6]
    rows = json.loads(js.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["column_sum", "cos_reshape_cos", "gemm_bias_gelu"]
    assert all(r["correct"] for r in rows)
    assert len(list(ir.glob("*.ir"))) == 3


def test_unknown_workload_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert layouts.main(["--smoke", "--only", "nope"]) == 1
    assert "unknown workloads ['nope']" in capsys.readouterr().err


def test_unseen_shapes_are_seeded_perturbations(tmp_path: Path) -> None:
    """--unseen SEED: the same sizes for the same seed, other ones for another; every
    dim positive, f16 kept, the rest f32 or bf16; a smoke row at such a shape runs."""
    import random

    base = [s for w in WORKLOADS for s in w.shapes]

    def draw(seed: int) -> list[Any]:
        rng = random.Random(seed)
        return [layouts.perturbed(s, rng) for s in base]

    assert draw(8) == draw(8) and draw(8) != draw(9)
    rng = random.Random(9)
    shapes = [layouts.perturbed(s, rng) for s in base]
    assert shapes != base
    for old, new in zip(base, shapes, strict=True):
        assert set(new.dims) == set(old.dims) and all(v >= 1 for v in new.dims.values())
        assert all(int(0.25 * o) <= v <= max(1, int(1.6 * o)) for o, v in
                   zip(old.dims.values(), new.dims.values(), strict=True))  # fmt: skip
        assert new.dtype == "f16" if old.dtype == "f16" else new.dtype in ("f32", "bf16")
    js = tmp_path / "t.json"
    assert layouts.main(["--smoke", "--only", "column_sum", "--unseen", "3", "--json", str(js)]) == 0
    (row,) = json.loads(js.read_text())["rows"]
    smoke = next(w.smoke for w in WORKLOADS if w.name == "column_sum")
    assert row["correct"] and row["shape"] != smoke.label
