"""irc-run --check: compiled kernels against the reference, fused and unfused, and
how a verdict is reached (irc.testing.verdict): assert_close, else no further from f64 than
4x torch's own distance, measured over torch's summation orders."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

import irc
from irc.lowering import tile_to_triton
from irc.testing import verdict
from irc.testing.reference import functions, random_inputs, run_function, run_function_f64
from irc.testing.verdict import FACTOR, Verdict, Yardstick, judge, yardsticks
from irc.tools import run as run_cli

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

PROGRAM = """
func @f(%x: tensor<37x300xf32>, %b: tensor<300xf32>) -> (tensor<37x300xf32>, tensor<37x1xf32>) {
  %s = graph.softmax %x {dim = 1}
  %y = graph.add %s, %b
  %m = graph.reduce_max %y {dims = [1], keepdim = true}
  return %y, %m : tensor<37x300xf32>, tensor<37x1xf32>
}
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "p.ir"
    path.write_text(PROGRAM)
    return path


@pytest.mark.parametrize("flags", [[], ["--no-fuse"]])
def test_check_passes_and_reports_errors(
    program: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli.main([str(program), "--device", DEVICE, "--check", *flags]) == 0
    out = capsys.readouterr().out
    mode = "unfused" if flags else "fused"
    assert f"check ({mode}," in out
    assert out.count("ok: max abs err") == 2


def test_fusion_changes_the_kernel_count(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_cli.main([str(program), "--device", DEVICE, "--check"])
    fused = capsys.readouterr().out
    run_cli.main([str(program), "--device", DEVICE, "--check", "--no-fuse"])
    unfused = capsys.readouterr().out

    def kernels(text: str) -> int:
        return int(text.split(" kernels in the file")[0].rsplit(", ", 1)[1])

    assert kernels(fused) < kernels(unfused)


def test_a_wrong_result_fails_the_check(
    program: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_cli.compile_module

    def corrupted(*args: object, **kwargs: object) -> object:
        compiled = real(*args, **kwargs)  # type: ignore[arg-type]
        original = compiled.run

        def run(name: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            outs = original(name, inputs)
            outs[0] = outs[0] + 1e-3
            return outs

        compiled.run = run  # type: ignore[method-assign]
        return compiled

    monkeypatch.setattr(run_cli, "compile_module", corrupted)
    assert run_cli.main([str(program), "--device", DEVICE, "--check"]) == 1
    out = capsys.readouterr().out
    assert "out 0: MISMATCH: max abs err 0.001" in out
    assert "out 1: ok" in out




# --- the verdict rule on made-up results ------------------------------------------------


def _exact(n: int = 64) -> torch.Tensor:
    return torch.linspace(-3.0, 3.0, n, dtype=torch.float64)


def test_within_assert_close_is_ok_without_f64() -> None:
    want = _exact().float()
    called: list[int] = []
    v = judge(want + 1e-7, want, lambda: called.append(1))  # type: ignore[arg-type, func-returns-value]
    assert v.ok and v.line.startswith("ok: max abs err") and not called  # f64 never computed


def test_as_far_from_f64_as_torch_is_ok_and_prints_both_errors() -> None:
    exact = _exact()
    eager = (exact + 1e-3).float()  # torch 1e-3 off
    got = (exact - 1e-3).float()  # irc 1e-3 off the other way: 2e-3 from torch
    v = judge(got, eager, Yardstick(exact))
    assert v.ok, v.line
    assert v.line.startswith("ok: max abs err 0.002")
    assert "from f64, irc vs torch: max abs 0.001 vs 0.001 (1x)" in v.line
    assert v.line.endswith(f"limit {FACTOR:g}x")


def test_further_than_the_factor_fails() -> None:
    exact = _exact()
    eager = (exact + 1e-3).float()
    v = judge((exact - 5e-3).float(), eager, Yardstick(exact))
    assert not v.ok and v.line.startswith("MISMATCH: max abs err 0.006")
    assert "max abs 0.005 vs 0.001 (5x)" in v.line
    assert v.irc is not None and v.torch is not None
    assert v.irc.abs == pytest.approx(5e-3, rel=1e-3) and v.torch.abs == pytest.approx(1e-3, rel=1e-3)


def test_an_exact_torch_admits_only_assert_close() -> None:
    eager = _exact().float()
    v = judge(eager + 1e-4, eager, Yardstick(eager.double()))
    assert not v.ok and "(torch exact)" in v.line


def test_a_wrong_small_element_cannot_hide_behind_a_large_error() -> None:
    """In max abs error irc is within 4x; in tolerance units (relative) it is not."""
    exact = torch.tensor([1000.0, 0.5], dtype=torch.float64)
    eager = torch.tensor([1000.004, 0.5], dtype=torch.float32)  # torch: 4e-3 on the large one
    got = torch.tensor([1000.0, 0.51], dtype=torch.float32)  # irc: 1e-2 on the small one
    v = judge(got, eager, Yardstick(exact))
    assert not v.ok and v.irc is not None and v.torch is not None
    assert v.irc.abs <= FACTOR * v.torch.abs and v.irc.tol > FACTOR * v.torch.tol


def test_a_wrong_large_element_cannot_hide_behind_a_near_zero_one() -> None:
    """In tolerance units irc is within 4x (torch's near-zero element dominates); in abs not."""
    exact = torch.tensor([100.0, 0.0], dtype=torch.float64)
    eager = torch.tensor([100.0, 0.1], dtype=torch.float32)  # 0.1 off at 0: 1e4 tolerances
    got = torch.tensor([101.0, 0.0], dtype=torch.float32)  # 1.0 off at 100: 7e3 tolerances
    v = judge(got, eager, Yardstick(exact))
    assert not v.ok and v.irc is not None and v.torch is not None
    assert v.irc.tol <= FACTOR * v.torch.tol and v.irc.abs > FACTOR * v.torch.abs


def test_torch_error_is_the_largest_over_its_orders() -> None:
    """A scalar sum: eager happens to land on the exact value; another order does not."""
    exact = torch.tensor([0.0], dtype=torch.float64)
    eager = torch.tensor([0.0])
    got = torch.tensor([3e-5])
    assert not judge(got, eager, Yardstick(exact)).ok
    other = torch.tensor([-2e-5])
    v = judge(got, eager, Yardstick(exact, [other]))
    assert v.ok and "max abs 3e-05 vs 2e-05 (1.5x)" in v.line


def test_integers_nan_placement_shapes_and_no_f64() -> None:
    a = torch.tensor([1.0, float("nan")])
    assert judge(a, a.clone()).ok
    assert not judge(torch.tensor([1.0, 2.0]), a).ok
    nan_moved = judge(torch.tensor([float("nan"), 1.0]), a, Yardstick(a.double()))
    assert not nan_moved.ok and "NaN/inf where torch has none" in nan_moved.line
    inf_sign = judge(torch.tensor([1.0, -float("inf")]), torch.tensor([1.0, float("inf")]))
    assert not inf_sign.ok
    assert judge(torch.tensor([1, 2]), torch.tensor([1, 3])) == Verdict(
        False, "MISMATCH: 1 of 2 elements differ"
    )
    assert judge(torch.tensor([True]), torch.tensor([True])).line == "ok: 0 of 1 elements differ"
    assert judge(torch.zeros(2), torch.zeros(3)).line.startswith("MISMATCH: got torch.float32 [2]")
    missing = judge(torch.tensor([1.0]), torch.tensor([2.0]), lambda: None)
    assert not missing.ok and missing.line.endswith("no f64 value to weigh it against")


def _chunked_cases() -> list[tuple[torch.Tensor, torch.Tensor, Yardstick | None]]:
    """(got, eager, yardstick) of every verdict kind, 1000 elements: 142 chunks of 7 and a tail."""
    exact = torch.linspace(-3.0, 3.0, 1000, dtype=torch.float64).reshape(10, 100)
    eager = (exact + 1e-3).float()
    other = (exact - 2e-3).float()
    stick = Yardstick(exact, [other])
    tail_wrong = eager.clone()
    tail_wrong[-1, -1] += 1.0  # only in the last, short chunk
    nan_late = eager.clone()
    nan_late[9, 50] = float("nan")
    inf_late = eager.clone()
    inf_late[8, 3] = float("inf")
    ints = torch.arange(1000).reshape(10, 100)
    ints_wrong = ints.clone()
    ints_wrong[-1, -1] = 0
    return [
        (eager + 1e-7, eager, None),  # close: step 1 alone
        (eager + 1e-7, eager, stick),  # close, both distances measured
        ((exact - 1e-3).float(), eager, stick),  # step 2 admits it
        ((exact - 9e-3).float(), eager, stick),  # step 2 rejects it (torch's worst: 2e-3)
        (tail_wrong, eager, None),
        (tail_wrong, eager, stick),
        (nan_late, nan_late.clone(), stick),
        (nan_late, eager, stick),  # a NaN where torch has none
        (inf_late, eager.masked_fill(eager.isinf(), 0.0), None),
        (ints_wrong, ints, None),
        (ints, ints.clone(), None),
    ]


def test_chunked_verdicts_are_the_whole_tensors_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """judge compares `verdict.CHUNK` elements at a time; chunks change no verdict, line
    or distance, and a wrong element in the last, short chunk still fails."""
    cases = _chunked_cases()
    monkeypatch.setattr(verdict, "CHUNK", 1 << 30)
    whole = [judge(g, w, s) for g, w, s in cases]
    monkeypatch.setattr(verdict, "CHUNK", 7)
    chunked = [judge(g, w, s) for g, w, s in cases]
    assert chunked == whole
    assert [v.ok for v in chunked] == [
        True, True, True, False, False, False, True, False, False, False, True
    ]  # fmt: skip
    assert "max abs err 1" in chunked[4].line and "NaN/inf where" in chunked[7].line
    assert chunked[9].line == "MISMATCH: 1 of 1000 elements differ"


# --- the f64 run and the other orders -----------------------------------------------------

ROUNDING = """
func @f(%x: tensor<64xf32>, %h: tensor<64xf16>, %i: tensor<64xi32>) -> (tensor<64xf32>, \
tensor<64xf32>, tensor<64xf32>, tensor<64xf16>, tensor<64xi32>) {
  %n = graph.cast %x : tensor<64xf16>
  %back = graph.cast %n : tensor<64xf32>
  %wide = graph.cast %h : tensor<64xf32>
  %c = graph.constant {value = 0.1} : tensor<f16>
  %hc = graph.mul %h, %c : tensor<64xf16>
  %third = graph.constant {value = 3.0} : tensor<f32>
  %q = graph.div %x, %third : tensor<64xf32>
  %k = graph.add %i, %i : tensor<64xi32>
  return %back, %wide, %q, %hc, %k : tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, \
tensor<64xf16>, tensor<64xi32>
}
"""


def test_the_f64_run_rounds_only_where_the_program_says() -> None:
    (fn,) = functions(irc.parse(ROUNDING)).values()
    x, h, i = random_inputs(fn, seed=1)
    back, wide, q, hc, k = run_function_f64(fn, [x, h, i])
    assert back.dtype == wide.dtype == q.dtype == hc.dtype == torch.float64
    assert k.dtype == torch.int32 and torch.equal(k, i + i)
    assert torch.equal(back, x.half().double())  # a narrowing cast still rounds
    assert torch.equal(wide, h.double())  # a widening one is exact
    assert torch.equal(q, x.double() / 3)  # arithmetic is f64's
    c = torch.tensor(0.1).half().double()  # a constant is its value in its type
    assert torch.equal(hc, h.double() * c)


SUMS = """
func @f(%x: tensor<3x4099xf32>, %w: tensor<4099xf32>, %b: tensor<4099xf32>, \
%m: tensor<4099x5xf32>) -> (tensor<3x4099xf32>, tensor<3x4099xf32>, tensor<3xf32>, \
tensor<3x5xf32>, tensor<1x1xf32>, tensor<3xf32>) {
  %s = graph.softmax %x {dim = 1} : tensor<3x4099xf32>
  %l = graph.layer_norm %x, %w, %b {dims = [1]} : tensor<3x4099xf32>
  %r = graph.reduce_sum %x {dims = [1]} : tensor<3xf32>
  %mm = graph.matmul %x, %m : tensor<3x5xf32>
  %mean = graph.reduce_mean %x {dims = [0, 1], keepdim = true} : tensor<1x1xf32>
  %top = graph.reduce_max %x {dims = [1]} : tensor<3xf32>
  return %s, %l, %r, %mm, %mean, %top : tensor<3x4099xf32>, tensor<3x4099xf32>, \
tensor<3xf32>, tensor<3x5xf32>, tensor<1x1xf32>, tensor<3xf32>
}
"""


@pytest.mark.parametrize("order", [1, 2, 3])
def test_other_orders_round_differently_but_compute_the_same(order: int) -> None:
    (fn,) = functions(irc.parse(SUMS)).values()
    inputs = random_inputs(fn, seed=2)
    base = run_function(fn, inputs)
    again = run_function(fn, inputs, order=order)
    assert run_function(fn, inputs, order=order)[2].equal(again[2])  # an order is one order
    for a, exact in zip(again, run_function_f64(fn, inputs), strict=True):
        # Rounding apart, the same values in the same places (softmax and layer_norm
        # put their elements back where they came from).
        torch.testing.assert_close(a.double(), exact, rtol=1e-4, atol=1e-3)
    assert not again[2].equal(base[2]) and not again[3].equal(base[3])  # other roundings
    assert again[5].equal(base[5])  # max does not round


# --- the issue's false alarms, and a wrong kernel ------------------------------------------


def _check(path: Path, *flags: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    status = run_cli.main([str(path), "--device", DEVICE, "--check", *flags], stdout=out)
    return status, [line.strip() for line in out.getvalue().splitlines() if "    out " in line]


def _mlp(kind: str, dt: str, m: int = 64, k: int = 256, h: int = 128, n: int = 64) -> str:
    t = lambda *s: f"tensor<{'x'.join(map(str, s))}x{dt}>"  # noqa: E731
    if kind == "gelu":
        args = f"%x: {t(m, k)}, %w1: {t(k, h)}, %b1: {t(h)}, %w2: {t(h, n)}, %b2: {t(n)}"
        body = f"""  %h = graph.matmul %x, %w1 : {t(m, h)}
  %hb = graph.add %h, %b1 : {t(m, h)}
  %a = graph.gelu %hb : {t(m, h)}
  %o = graph.matmul %a, %w2 : {t(m, n)}
  %y = graph.add %o, %b2 : {t(m, n)}"""
    else:  # SwiGLU: silu(x @ wg) * (x @ wu), then @ wd
        args = f"%x: {t(m, k)}, %wg: {t(k, h)}, %wu: {t(k, h)}, %wd: {t(h, n)}"
        body = f"""  %g = graph.matmul %x, %wg : {t(m, h)}
  %u = graph.matmul %x, %wu : {t(m, h)}
  %s = graph.silu %g : {t(m, h)}
  %p = graph.mul %s, %u : {t(m, h)}
  %y = graph.matmul %p, %wd : {t(m, n)}"""
    return f"func @{kind}({args}) -> {t(m, n)} {{\n{body}\n  return %y : {t(m, n)}\n}}\n"


@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_gelu_and_swiglu_mlps_pass(kind: str, dt: str, tmp_path: Path) -> None:
    """irc's error against f64 equals torch's; assert_close alone rejected some of these."""
    path = tmp_path / f"{kind}.ir"
    path.write_text(_mlp(kind, dt))
    weighed = 0
    for seed in range(3):
        status, lines = _check(path, "--seed", str(seed))
        assert status == 0 and len(lines) == 1 and lines[0].startswith("out 0: ok: "), lines
        weighed += "from f64" in lines[0]
    # torch 2.11's CPU bf16 matmuls (2.13's not) stay within assert_close of irc's.
    close_bf16 = dt == "bf16" and torch.torch_version.TorchVersion(torch.__version__) < "2.13"
    if DEVICE == "cpu" and not close_bf16:
        # On the CPU torch rounds f16/bf16 products and f32 sums otherwise than irc:
        # assert_close alone rejected at least one seed, so the test can fail. (On a
        # GPU cuBLAS and irc's tl.dot often agree within assert_close.)
        assert weighed >= 1


def long_sum_program(seed: int, ops: int = 25) -> str:
    """A random f32 graph of `ops` ops whose two outputs are sums of thousands of terms
    (a row of dot products, a full sum), often cancelling (values minus their mean).

    Every program starts with `exp(tanh(x))`, which the dot product reads, so that a
    wrong exp kernel shows in output 0.
    """
    rng = random.Random(seed)
    rows, n = rng.choice((2, 3, 4)), rng.choice((1024, 2048, 4096))
    full, row = f"tensor<{rows}x{n}xf32>", f"tensor<{rows}x1xf32>"
    lines: list[str] = []
    values = ["%x", "%y"]

    def emit(rhs: str, ty: str) -> str:
        name = f"%v{len(lines)}"
        lines.append(f"  {name} = {rhs} : {ty}")
        return name

    def pick() -> str:
        return rng.choice(values[-4:]) if rng.random() < 0.6 else rng.choice(values)

    e = emit(f"graph.exp {emit('graph.tanh %x', full)}", full)
    values.append(e)
    while len(lines) < ops:
        r = rng.random()
        if r < 0.3:
            op = rng.choice(("tanh", "sin", "sigmoid", "neg", "silu", "gelu"))
            values.append(emit(f"graph.{op} {pick()}", full))
        elif r < 0.6:
            op = rng.choice(("add", "sub", "mul"))
            values.append(emit(f"graph.{op} {pick()}, {pick()}", full))
        elif r < 0.85:
            v = pick()
            m = emit(f"graph.reduce_mean {v} {{dims = [1], keepdim = true}}", row)
            values.append(emit(f"graph.sub {v}, {m}", full))
        else:
            c = rng.choice((0.5, 1.7, -2.3, 3.1))
            k = emit(f"graph.constant {{value = {c}}}", "tensor<f32>")
            values.append(emit(f"graph.mul {pick()}, {k}", full))
    p = emit(f"graph.mul {values[-1]}, {e}", full)
    dot = emit(f"graph.reduce_sum {p} {{dims = [1], keepdim = true}}", row)
    total = emit(f"graph.reduce_sum {pick()} {{dims = [0, 1]}}", "tensor<f32>")
    return (
        f"func @main(%x: {full}, %y: {full}) -> ({row}, tensor<f32>) {{\n"
        + "\n".join(lines)
        + f"\n  return {dot}, {total} : {row}, tensor<f32>\n}}\n"
    )


def _long_sum_verdicts(seeds: Iterable[int]) -> list[list[tuple[Verdict, bool]]]:
    """Each program's verdicts, each with whether assert_close alone accepted the output."""
    results = []
    for seed in seeds:
        module = irc.parse(long_sum_program(seed))
        (fn,) = functions(module).values()
        inputs = random_inputs(fn, seed, DEVICE)
        want = run_function(fn, inputs)
        sticks = yardsticks(fn, inputs)
        got = irc.compile(module, device=DEVICE).run("main", inputs)
        triples = zip(got, want, sticks, strict=True)
        results.append([(judge(g, w, s), _close(g, w)) for g, w, s in triples])
    return results


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(got, want)
        return True
    except AssertionError:
        return False


LUCKY = (30, 130, 151)
"""Programs whose eager result of a short output (a scalar, a few dot products) lands
(nearly) on the f64 value by luck of its summation order."""


def test_random_long_sums_raise_no_false_alarm() -> None:
    """assert_close alone rejects two of these 40 outputs (four while irc's tanh lost
    up to 1e-3 relative near 0)."""
    results = [r for rs in _long_sum_verdicts(range(20)) for r in rs]
    bad = [v.line for v, _ in results if not v.ok]
    assert not bad, bad
    rescued = [v for v, close in results if not close]
    assert len(rescued) >= 2  # the f64 leg was needed: without it this test fails
    assert all("from f64, irc vs torch" in v.line for v in rescued)


def test_torch_error_needs_its_other_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    """With eager's one order as torch's error, about one program in thirty false-alarms."""
    assert all(v.ok for vs in _long_sum_verdicts(LUCKY) for v, _ in vs)
    monkeypatch.setattr(verdict, "ORDERS", 0)
    alarms = [v.line for vs in _long_sum_verdicts(LUCKY) for v, _ in vs if not v.ok]
    assert alarms, "no lucky eager result left: pick new LUCKY seeds"


def test_a_wrong_exp_still_fails_the_long_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """exp 1e-5 too large (about 80 ulps): each dot product must fail."""
    monkeypatch.setitem(tile_to_triton.UNARY, "exp", "tl.exp({0}) * 1.00001")
    for (dot, _), _total in _long_sum_verdicts(range(6)):
        assert not dot.ok, dot.line
