"""A reduction's loads of one step are issued together, before the adds that use them.

A column sum of a 16-bit input loads 16 values a thread a step (its rows are not
16-byte aligned, so its loads are of 2 or 4 bytes). With a `where` on each loaded
value that only repeated the load's own mask, ptxas issued those loads one at a
time, each after the add of the one before: one load in flight a thread, and the
split stage of a 4679x8066 bf16 column sum took 53 us on an H200 where it takes 25
without (docs/lowering.md, "masked lanes"). The first test pins the IR (no such
`where`); the second builds the kernel for sm_90 with the ptxas that Triton ships
(no GPU needed, `irc.testing.sm90`) and reads the order of its loads and adds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

import irc
from irc.compiler import lower_to_tile
from irc.dialects import tile
from irc.testing.sm90 import build, gpu_kernels, load_runs, loads_and_adds, sass

CASES = [((4679, 8066), [0], "bf16"), ((17, 3001, 777), [1], "bf16"), ((2048, 3001), [0], "f16")]


def column_sum(shape: tuple[int, ...], dims: list[int], el: str) -> ModuleOp:
    def t(s: tuple[int, ...]) -> str:
        return "tensor<" + "".join(f"{d}x" for d in s) + el + ">"

    out = tuple(d for i, d in enumerate(shape) if i not in dims)
    module = irc.parse(
        f"func @f(%x: {t(shape)}) -> {t(out)} {{\n"
        f"  %s = graph.reduce_sum %x {{dims = {dims}}} : {t(out)}\n"
        f"  return %s : {t(out)}\n}}\n",
        "t.ir",
    )
    irc.run_pipeline(module, "fuse")
    lower_to_tile(module)
    return module


def split_stage(module: ModuleOp) -> tile.KernelOp:
    (stage,) = [
        k
        for k in module.walk()
        if isinstance(k, tile.KernelOp) and k.kernel_name.data.endswith("_split")
    ]
    return stage


def conjuncts(mask: SSAValue) -> set[SSAValue]:
    if isinstance(mask.owner, tile.ApplyOp) and mask.owner.fn.data == "and":
        return set().union(*(conjuncts(a) for a in mask.owner.args))
    return {mask}


def loaded(v: SSAValue) -> SSAValue:
    """The value `v` selects or casts from (a load's result, where it is one)."""
    while isinstance(v.owner, tile.ApplyOp) and v.owner.fn.data in ("cast", "where"):
        v = v.owner.args[0 if v.owner.fn.data == "cast" else 1]
    return v


@pytest.mark.parametrize(("shape", "dims", "el"), CASES, ids=str)
def test_no_select_repeats_a_loads_mask(shape: tuple[int, ...], dims: list[int], el: str) -> None:
    stage = split_stage(column_sum(shape, dims, el))
    loads = [op for op in stage.walk() if isinstance(op, tile.LoadOp) and op.mask]
    assert loads, "the split stage loads its input under a mask"
    for op in stage.walk():
        if isinstance(op, tile.ApplyOp) and op.fn.data == "where":
            load = loaded(op.args[1]).owner
            if isinstance(load, tile.LoadOp) and load.mask:
                repeats = conjuncts(op.args[0]) <= conjuncts(load.mask[0])
                assert not repeats, "a where that repeats the load's mask"


RAGGED = [((10100, 10503), [0], "bf16"), ((5003, 4099), [0], "bf16"), ((4679, 8066), [0], "bf16")]
"""Column sums whose split chunks run past the last row (10100 rows in 27 chunks of
375, 5003 in 18 of 278, 4679 in 19 of 247)."""


@pytest.mark.parametrize(("shape", "dims", "el"), RAGGED, ids=str)
def test_a_ragged_chunk_is_a_shorter_chunk_not_a_select(
    shape: tuple[int, ...], dims: list[int], el: str
) -> None:
    """The split stage bounds the chunk's rows by `min(chunk, n - start)` in the mask
    of its loads (`loop-to-tile`'s `ragged_chunk`): no `where` on the loaded values."""
    stage = split_stage(column_sum(shape, dims, el))
    (load,) = [op for op in stage.walk() if isinstance(op, tile.LoadOp)]
    assert load.mask
    selects = [op for op in stage.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "where"]
    assert not selects
    bounds = [op for op in stage.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "minimum"]
    assert any(not isinstance(b.args[1].owner, tile.ConstantOp) for b in bounds), "no chunk limit"


def test_rows_of_whole_vectors_keep_the_select() -> None:
    """8192 bf16 rows are whole 16-byte vectors: two loads a thread a step, which the
    bound made 7% slower on an H200 (`ragged_chunk`). 8192 rows in 35 chunks of 235:
    ragged, and still a `where` on the rows past the end, no chunk limit."""
    stage = split_stage(column_sum((8192, 8192), [0], "bf16"))
    assert [op for op in stage.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "where"]
    bounds = [op for op in stage.walk() if isinstance(op, tile.ApplyOp) and op.fn.data == "minimum"]
    assert all(isinstance(b.args[1].owner, tile.ConstantOp) for b in bounds)


@pytest.mark.parametrize(("shape", "dims", "el"), CASES[:2] + RAGGED, ids=str)
def test_a_steps_loads_are_issued_before_its_adds(
    shape: tuple[int, ...], dims: list[int], el: str, tmp_path: Path
) -> None:
    module = column_sum(shape, dims, el)
    stage = split_stage(module)
    (built,) = [build(k, fn, sig) for k, fn, sig in gpu_kernels(module, tmp_path) if k is stage]
    order = loads_and_adds(sass(built, tmp_path))
    loads = order.count("L")
    assert loads >= 8, order
    # All of them before the first add; ptxas may keep the last one back an add.
    assert load_runs(order)[0] >= loads - 1, f"loads wait on adds: {order}"


def test_the_report_shows_each_kernels_registers_and_loads_issued_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m irc.testing.sm90 FILE.ir`: a line a kernel, the split stage's 8
    loads a thread (4 bytes each: rows of 8066 bf16 are 4-byte aligned) in two runs
    at most, no spill; a bad file is a located error, status 1."""
    from irc.testing.sm90 import main

    program = tmp_path / "sum.ir"
    program.write_text(
        "func @f(%x: tensor<4679x8066xbf16>) -> tensor<8066xbf16> {\n"
        "  %s = graph.reduce_sum %x {dims = [0]} : tensor<8066xbf16>\n"
        "  return %s : tensor<8066xbf16>\n}\n"
    )
    assert main([str(program)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert set(rows) == {"triton_red_sum_0_split", "triton_per_sum_0"}
    warps, regs, spills, loads, together = rows["triton_red_sum_0_split"]
    assert (warps, spills, loads) == ("4", "0", "8") and float(together) >= 4.0
    assert 16 <= int(regs) <= 255

    bad = tmp_path / "bad.ir"
    bad.write_text(
        "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.bogus %x\n"
        "  return %y : tensor<4xf32>\n}\n"
    )
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:2:8: error: unknown op 'graph.bogus'")
    assert main([str(tmp_path / "missing.ir")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_the_report_takes_graph_level_programs_only_and_names_no_path_after_a_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop-level file names its kernels itself (here `../../evil`): the command
    refuses it before any kernel is built (status 1, one line saying why), and the
    files it writes while building have fixed names in its own temporary folder."""
    from irc.testing import sm90

    hostile = tmp_path / "work" / "loop.ir"
    hostile.parent.mkdir()
    hostile.write_text(
        "func @f(%x: memref<64x8xf32>) -> memref<8xf32> {\n"
        "  %0 = loop.alloc : memref<8xf32>\n"
        '  loop.kernel {name = "../../evil", bounds = [8]} (%1: index) {\n'
        '    %2 = loop.reduce {kind = "sum", bounds = [64]} (%3: index) {\n'
        "      %4 = loop.load %x, %3, %1 : f32\n"
        "      loop.yield %4\n"
        "    } : f32\n"
        "    loop.store %2, %0, %1\n"
        "  }\n"
        "  return %0 : memref<8xf32>\n}\n"
    )
    monkeypatch.chdir(hostile.parent)
    assert sm90.main([str(hostile)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "python -m irc.testing.sm90: error: pass 'fuse' runs on graph-level IR, but this "
        "module is at the loop level (it runs before graph-to-loop)\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["loop.ir", "work"]

    written: list[Path] = []
    real = Path.write_bytes

    def spy(path: Path, data: bytes) -> int:
        written.append(path)
        return real(path, data)

    monkeypatch.setattr(Path, "write_bytes", spy)
    program = tmp_path / "sum.ir"
    program.write_text(
        "func @f(%x: tensor<300x8xf32>) -> tensor<8xf32> {\n"
        "  %s = graph.reduce_sum %x {dims = [0]} : tensor<8xf32>\n"
        "  return %s : tensor<8xf32>\n}\n"
    )
    assert sm90.main([str(program)]) == 0
    assert written and {p.name for p in written} == {"kernel.cubin"}
    assert all(tmp_path not in p.parents for p in written)
