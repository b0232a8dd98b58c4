"""The benchmark's workloads and tables (the timing itself needs a GPU: see docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import irc

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("irc_bench", ROOT / "benchmarks" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["irc_bench"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


bench = _bench()
KERNELS = {"mse": 2}  # a full reduction is split in two; every other workload is one kernel


@pytest.mark.parametrize("workload", bench._workloads(), ids=lambda w: w.name)
def test_each_workload_is_an_ir_file_that_fuses(workload: Any) -> None:
    path = bench.WORKLOADS_DIR / f"{workload.name}.ir"
    compiled = irc.compile(path, device="cpu")
    assert workload.name in compiled.functions
    assert compiled.kernel_count == KERNELS.get(workload.name, 1)


def test_no_workload_file_is_left_out() -> None:
    names = {w.name for w in bench._workloads()}
    assert names == {p.stem for p in bench.WORKLOADS_DIR.glob("*.ir")}


def _row(**changes: Any) -> dict[str, Any]:
    row = {
        "workload": "softmax", "eager_ms": 0.7, "compile_ms": 0.15, "irc_ms": 0.13,
        "irc_over_compile": 0.85, "irc_over_floor": 1.02, "kernels_eager": 5,
        "kernels_compile": 1, "kernels_irc": 1, "cold_compile_s": 1.0, "cold_irc_s": 0.1,
        "correct": True, "max_abs_err": 0.0, "eager_max_abs_err": 0.0,
    }  # fmt: skip
    return row | changes


def test_rows_and_markdown() -> None:
    launch = _row(
        workload="small_chain", irc_over_floor=None, wall_us_eager=30.0,
        wall_us_compile=40.0, wall_us_irc=11.0, wall_us_irc_graph=7.0,
    )  # fmt: skip
    gemm = _row(workload="mm_bias_relu", irc_over_torch_mm=1.036)
    wrong = _row(workload="mse", correct=False, max_abs_err=0.5, eager_max_abs_err=0.001)
    assert "1.020" in bench.format_row(_row())
    assert "—" in bench.format_row(launch) and "irc with CUDA graph 7.0" in bench.format_row(launch)
    table = bench.markdown(
        {
            "device": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0", "python": "3.12",
            "date": "2026-11-22", "copy_bandwidth_GBps": 4248.0, "bf16_mm_TFLOPs": 708.0,
            "irc_target": "tile{block=512 thread-elements=2} (25 GB/s an SM)",
            "rows": [_row(), launch, gemm, wrong],
        }
    )  # fmt: skip
    lines = table.splitlines()
    assert lines[0].startswith("Device: NVIDIA H200") and "4248 GB/s" in lines[0]
    assert lines[1] == "irc's tiling options: tile{block=512 thread-elements=2} (25 GB/s an SM)."
    assert lines[3].startswith("| workload |") and len(lines) == 5 + 4
    assert "| 0.850 | — |" in lines[6]
    assert "irc/bare torch.mm 1.036" in lines[7]
    assert "MISMATCH max abs err 0.5" in lines[8]


def test_correctness_is_the_check_commands_verdict() -> None:
    """The benchmark judges by irc.testing.verdict, as `irc-run --check` does (on the CPU here)."""
    import torch

    path = bench.WORKLOADS_DIR / "small_chain.ir"
    (small,) = [w for w in bench._workloads() if w.name == "small_chain"]
    args = small.inputs("cpu")
    want = [small.torch_fn(*args)]
    got = irc.compile(path, device="cpu").run("small_chain", args)
    good = bench.correctness(path, "small_chain", args, got, want)
    assert good["correct"] and good["verdicts"][0].startswith("ok: ")
    bad = bench.correctness(path, "small_chain", args, [got[0] + 1e-3], want)
    assert not bad["correct"] and bad["verdicts"][0].startswith("MISMATCH: ")
    assert bad["max_abs_err"] == pytest.approx(1e-3, rel=1e-2)
    assert bad["eager_max_abs_err"] < 1e-6
    assert "from f64, irc vs torch" in bad["verdicts"][0] and torch.is_tensor(got[0])


def test_interleaved_medians_take_turns_and_the_median() -> None:
    calls: list[str] = []
    readings = {"a": iter([5.0, 1.0, 3.0, 2.0]), "b": iter([2.0, 9.0, 4.0, 4.0])}

    def timer(fn: Any) -> float:
        name = fn()
        calls.append(name)
        return next(readings[name])

    medians = bench.interleaved_medians({"a": lambda: "a", "b": lambda: "b"}, timer=timer)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert medians == {"a": 2.5, "b": 4.0}


def _compile_speed() -> ModuleType:
    path = ROOT / "benchmarks" / "compile_speed.py"
    spec = importlib.util.spec_from_file_location("irc_compile_speed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape", ["local", "long-edges", "fan-out", "reductions"])
def test_compile_speed_graphs_are_valid_and_sized(shape: str) -> None:
    speed = _compile_speed()
    text = speed.generate(300, seed=1, shape=shape)
    module = irc.parse(text, "<generated>")
    irc.verify(module)
    ops = sum(1 for line in text.splitlines() if " = graph." in line)
    assert 300 <= ops <= 303  # a reduction step adds three ops at once
    assert speed.generate(300, seed=1, shape=shape) == text  # a seed gives one graph


def test_compile_speed_prints_stages_and_the_growth_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    speed = _compile_speed()
    assert speed.main(["--sizes", "40", "120", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[1:3]]
    assert [int(r[0]) for r in rows] == [40, 120]
    for r in rows:
        parse, fuse, lower, total = map(float, r[1:5])
        assert abs(parse + fuse + lower - total) < 0.02 and int(r[5]) >= 1
    head, ratio = lines[3].split(" = ")
    assert head == "time(120) / time(40)" and ratio.endswith("(sizes x3)")
    assert float(ratio.split()[0]) > 0


def test_compile_speed_rejects_zero_repeats() -> None:
    with pytest.raises(SystemExit):
        _compile_speed().main(["--repeat", "0"])
