"""The indexing and generation ops (slice, concat, iota, index_select, gather),
compiled fused and unfused, against torch expressions written here (not the
reference interpreter's), on random inputs, on the CPU (Triton's interpreter).

Fusion is the point of these ops: a slice, concat or gather feeding element-wise
work must be an index map inside the consumer's kernel, so the tests pin the
kernel count of each fused program too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close

import irc
from irc.testing.reference import functions, random_inputs, run_function
from irc.tools.run import main as irc_run


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IRC_CACHE_DIR", str(tmp_path_factory.mktemp("irc-cache")))
        yield


def check(
    text: str,
    expected: Callable[..., Tensor | tuple[Tensor, ...]],
    *,
    kernels: int | None = None,
    prepare: Callable[..., list[Tensor]] | None = None,
    fuse: bool = True,
) -> None:
    """Compiles `text` (@f), runs it on random inputs and compares with `expected`,
    and the reference interpreter with it too; `kernels`: the fused kernel count."""
    module = irc.parse(text, "test.ir")
    irc.verify(module)
    fn = functions(module)["f"]
    xs = random_inputs(fn, seed=1)
    if prepare is not None:
        xs = prepare(*xs)
    want = expected(*xs)
    wants = list(want) if isinstance(want, tuple) else [want]
    for r, w in zip(run_function(fn, xs), wants, strict=True):
        assert_close(r, w, rtol=0, atol=0)
    compiled = irc.compile(module, device="cpu", fuse=fuse)
    got = compiled.run("f", xs)
    for g, w in zip(got, wants, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        assert_close(g, w)
    if kernels is not None:
        assert compiled.kernel_count == kernels


# --- slice ------------------------------------------------------------------------------


def test_slice_with_steps_feeds_elementwise_work_in_one_kernel() -> None:
    text = """
func @f(%x: tensor<5x9xf32>, %y: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %a = graph.slice %x {start = [1, 1], end = [5, 9], step = [2, 2]}
  %b = graph.add %a, %y
  %c = graph.exp %b
  return %c : tensor<2x4xf32>
}
"""
    check(text, lambda x, y: torch.exp(x[1:5:2, 1:9:2] + y), kernels=1)
    check(text, lambda x, y: torch.exp(x[1:5:2, 1:9:2] + y), fuse=False)


def test_slices_of_a_computed_value_fuse_with_its_producer() -> None:
    # q/k/v split of one projection: three slices of the same sum, one kernel.
    text = """
func @f(%x: tensor<4x12xf16>, %b: tensor<12xf16>) -> tensor<4x4xf16> {
  %s = graph.add %x, %b
  %q = graph.slice %s {start = [0, 0], end = [4, 4]}
  %k = graph.slice %s {start = [0, 4], end = [4, 8]}
  %v = graph.slice %s {start = [0, 8], end = [4, 12]}
  %qk = graph.mul %q, %k
  %o = graph.add %qk, %v
  return %o : tensor<4x4xf16>
}
"""

    def want(x: Tensor, b: Tensor) -> Tensor:
        s = x + b
        return s[:, 0:4] * s[:, 4:8] + s[:, 8:12]

    check(text, want, kernels=1)


def test_returned_slice_is_copied() -> None:
    text = """
func @f(%x: tensor<3x7x5xf32>) -> tensor<2x3x5xf32> {
  %a = graph.slice %x {start = [1, 0, 0], end = [3, 7, 5], step = [1, 3, 1]}
  return %a : tensor<2x3x5xf32>
}
"""
    check(text, lambda x: x[1:3, 0:7:3, :].contiguous(), kernels=1)


def test_slice_feeding_a_reduction() -> None:
    text = """
func @f(%x: tensor<6x33xf32>) -> tensor<6xf32> {
  %e = graph.exp %x
  %a = graph.slice %e {start = [0, 3], end = [6, 33], step = [1, 2]}
  %s = graph.reduce_sum %a {dims = [1]}
  return %s : tensor<6xf32>
}
"""
    check(text, lambda x: torch.exp(x)[:, 3:33:2].sum(1))


# --- concat -----------------------------------------------------------------------------


ROTATE_HALF = """
func @f(%x: tensor<2x3x8xf32>, %cos: tensor<3x8xf32>, %sin: tensor<3x8xf32>) -> tensor<2x3x8xf32> {
  %x1 = graph.slice %x {start = [0, 0, 0], end = [2, 3, 4]}
  %x2 = graph.slice %x {start = [0, 0, 4], end = [2, 3, 8]}
  %n2 = graph.neg %x2
  %r = graph.concat %n2, %x1 {dim = -1}
  %a = graph.mul %x, %cos
  %b = graph.mul %r, %sin
  %y = graph.add %a, %b
  return %y : tensor<2x3x8xf32>
}
"""


def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x[..., :4], x[..., 4:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def test_rotate_half_is_one_kernel() -> None:
    check(ROTATE_HALF, _rotary, kernels=1)


def test_rotate_half_unfused() -> None:
    check(ROTATE_HALF, _rotary, fuse=False)


def test_concat_of_three_along_the_first_dim_with_a_size_one_part() -> None:
    text = """
func @f(%a: tensor<2x5xf16>, %b: tensor<1x5xf16>, %c: tensor<3x5xf16>) -> tensor<6x5xf16> {
  %e = graph.abs %c
  %y = graph.concat %a, %b, %e {dim = 0}
  return %y : tensor<6x5xf16>
}
"""
    # Every part is evaluated at every element (then selected): a cheap producer fuses,
    # an expensive one (exp) would be computed twice over, and stays a kernel of its own.
    check(text, lambda a, b, c: torch.cat((a, b, torch.abs(c)), 0), kernels=1)
    expensive = text.replace("graph.abs", "graph.exp")
    check(expensive, lambda a, b, c: torch.cat((a, b, torch.exp(c)), 0), kernels=2)


def test_concat_of_one_and_of_ints() -> None:
    text = """
func @f(%a: tensor<4xi64>, %b: tensor<3xi64>) -> (tensor<4xi64>, tensor<7xi64>) {
  %y = graph.concat %a {dim = 0}
  %z = graph.concat %a, %b {dim = 0}
  return %y, %z : tensor<4xi64>, tensor<7xi64>
}
"""
    check(text, lambda a, b: (a.clone(), torch.cat((a, b))))


def test_concat_feeding_a_row_reduction() -> None:
    # KV concatenation then a row sum: the concat reads buffers, so it fuses into the rows.
    text = """
func @f(%k: tensor<3x5xf32>, %n: tensor<3x2xf32>) -> tensor<3xf32> {
  %c = graph.concat %k, %n {dim = 1}
  %s = graph.reduce_sum %c {dims = [1]}
  return %s : tensor<3xf32>
}
"""
    check(text, lambda k, n: torch.cat((k, n), 1).sum(1), kernels=1)


# --- iota -------------------------------------------------------------------------------


def test_causal_mask_from_two_iotas_is_computed_in_the_kernel() -> None:
    # full().triu() as models write it: where(col > row, -inf, scores), one kernel, no
    # buffer for the mask.
    text = """
func @f(%s: tensor<2x5x5xf32>) -> tensor<2x5x5xf32> {
  %r = graph.iota {dim = 0} : tensor<5x1xi64>
  %c = graph.iota {dim = 1} : tensor<1x5xi64>
  %above = graph.gt %c, %r
  %ninf = graph.constant {value = -inf} : tensor<f32>
  %m = graph.where %above, %ninf, %s
  %y = graph.exp %m
  return %y : tensor<2x5x5xf32>
}
"""

    def want(s: Tensor) -> Tensor:
        above = torch.ones(5, 5, dtype=torch.bool).triu(1)
        return torch.exp(torch.where(above, float("-inf"), s))

    check(text, want, kernels=1)


def test_returned_iotas_of_each_element_type() -> None:
    text = """
func @f(%x: tensor<3x4xf16>) -> (tensor<3x4xi32>, tensor<7xi64>, tensor<3x4xf16>) {
  %a = graph.iota {dim = -1} : tensor<3x4xi32>
  %b = graph.iota {dim = 0} : tensor<7xi64>
  %c = graph.iota {dim = 0} : tensor<3x4xf16>
  %d = graph.add %c, %x
  return %a, %b, %d : tensor<3x4xi32>, tensor<7xi64>, tensor<3x4xf16>
}
"""

    def want(x: Tensor) -> tuple[Tensor, ...]:
        a = torch.arange(4, dtype=torch.int32).expand(3, 4).contiguous()
        c = torch.arange(3, dtype=torch.float16)[:, None]
        return a, torch.arange(7), c + x

    check(text, want)


# --- index_select and gather ----------------------------------------------------------------


def test_embedding_lookup_feeds_its_consumer_in_one_kernel() -> None:
    text = """
func @f(%w: tensor<10x6xf32>, %ids: tensor<2x3xi64>, %b: tensor<6xf32>) -> tensor<2x3x6xf32> {
  %e = graph.index_select %w, %ids {dim = 0}
  %y = graph.add %e, %b
  return %y : tensor<2x3x6xf32>
}
"""
    check(text, lambda w, ids, b: w[ids] + b, kernels=1)
    check(text, lambda w, ids, b: w[ids] + b, fuse=False)


def test_index_select_along_a_middle_dim_with_i32_indices() -> None:
    text = """
func @f(%x: tensor<3x7x4xf16>, %i: tensor<5xi32>) -> tensor<3x5x4xf16> {
  %s = graph.index_select %x, %i {dim = 1}
  %y = graph.abs %s
  return %y : tensor<3x5x4xf16>
}
"""
    check(text, lambda x, i: torch.abs(x.index_select(1, i)), kernels=1)


def test_cos_at_position_ids_times_x() -> None:
    # Rotary tables indexed by position ids: cos[position_ids] * x, one kernel.
    text = """
func @f(%cos: tensor<16x8xf32>, %pos: tensor<2x5xi64>, %x: tensor<2x5x8xf32>) -> tensor<2x5x8xf32> {
  %c = graph.index_select %cos, %pos {dim = 0}
  %y = graph.mul %c, %x
  return %y : tensor<2x5x8xf32>
}
"""
    check(text, lambda cos, pos, x: cos[pos] * x, kernels=1)


def test_gather_of_targets_for_a_cross_entropy_loss() -> None:
    # -log_softmax(x)[target]: the gather reads the log-probabilities through the
    # targets; its reduction over the batch follows.
    text = """
func @f(%logp: tensor<4x9xf32>, %t: tensor<4x1xi64>) -> tensor<f32> {
  %g = graph.gather %logp, %t {dim = 1}
  %n = graph.neg %g
  %l = graph.reduce_mean %n {dims = [0, 1]}
  return %l : tensor<f32>
}
"""
    check(text, lambda logp, t: (-torch.gather(logp, 1, t)).mean())


def test_gather_with_indices_smaller_than_the_input() -> None:
    text = """
func @f(%x: tensor<5x6xf32>, %i: tensor<3x4xi32>) -> tensor<3x4xf32> {
  %g = graph.gather %x, %i {dim = 0}
  %y = graph.exp %g
  return %y : tensor<3x4xf32>
}
"""
    check(text, lambda x, i: torch.exp(torch.gather(x, 0, i.long())), kernels=1)


def test_random_indices_reaching_the_op_through_views_are_in_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """irc-run draws an argument's indices inside the dimension they index also when
    they get there through a view (a transposed target, flattened token ids): they
    were drawn as other integers were (-8..8), and --check stopped at the gather."""
    path = tmp_path / "views.ir"
    path.write_text("""
func @f(%x: tensor<4x10xf32>, %t: tensor<3x4xi32>, %w: tensor<20x5xf32>, %ids: tensor<2x3xi64>) -> (tensor<4x3xf32>, tensor<6x5xf32>) {
  %it = graph.transpose %t {perm = [1, 0]}
  %g = graph.gather %x, %it {dim = 1}
  %flat = graph.reshape %ids : tensor<6xi64>
  %e = graph.index_select %w, %flat {dim = 0}
  return %g, %e : tensor<4x3xf32>, tensor<6x5xf32>
}
""")
    fn = functions(irc.parse(path.read_text()))["f"]
    for seed in range(4):
        _, t, _, ids = random_inputs(fn, seed=seed)
        assert 0 <= int(t.min()) and int(t.max()) < 10
        assert 0 <= int(ids.min()) and int(ids.max()) < 20
    assert irc_run([str(path), "--check"]) == 0, capsys.readouterr().err


OUT_OF_RANGE = """
func @f(%w: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %i = graph.iota {dim = 0} : tensor<4xi64>
  %c = graph.constant {value = 1} : tensor<i64>
  %j = graph.add %i, %c
  %e = graph.index_select %w, %j {dim = 0}
  return %e : tensor<4x3xf32>
}
"""


def test_out_of_range_index_is_a_located_error_of_irc_run_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "oob.ir"
    path.write_text(OUT_OF_RANGE)
    status = irc_run([str(path), "--check"])
    err = capsys.readouterr().err
    assert status == 1
    assert f"{path}:6:3: error: graph.index_select: index 4 is out of range for dimension 0 " \
        "of size 4" in err, err
    assert "Traceback" not in err


def test_kernels_clamp_a_bad_index_and_assert_it_in_debug_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No wild read without debug (the index is clamped into the table); with Triton's
    debug mode on, the kernel's device_assert reports it (here in the interpreter)."""
    text = """
func @f(%w: tensor<10x6xf32>, %ids: tensor<2x3xi64>, %b: tensor<6xf32>) -> tensor<2x3x6xf32> {
  %e = graph.index_select %w, %ids {dim = 0}
  %y = graph.add %e, %b
  return %y : tensor<2x3x6xf32>
}
"""
    compiled = irc.compile(irc.parse(text, "t.ir"), device="cpu")
    assert "tl.device_assert(" in compiled.source
    w, b = torch.randn(10, 6), torch.randn(6)
    ids = torch.tensor([[0, 1, 12], [-3, 9, 2**40]])
    (got,) = compiled.run("f", [w, ids, b])
    assert_close(got, w[ids.clamp(0, 9)] + b)
    import triton.runtime.interpreter as interpreter

    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    with pytest.raises(Exception, match=r"index out of range \[0, 10\)"):
        compiled.run("f", [w, ids, b])
    (good,) = compiled.run("f", [w, ids.clamp(0, 9), b])
    assert_close(good, w[ids.clamp(0, 9)] + b)


# --- gelu, tanh form ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gelu_tanh_fused_with_a_bias(dtype: str) -> None:
    text = f"""
func @f(%x: tensor<5x33x{dtype}>, %b: tensor<33x{dtype}>) -> (tensor<5x33x{dtype}>, tensor<5x33x{dtype}>) {{
  %s = graph.add %x, %b
  %t = graph.gelu %s {{approximate = "tanh"}}
  %e = graph.gelu %s
  return %t, %e : tensor<5x33x{dtype}>, tensor<5x33x{dtype}>
}}
"""

    def want(x: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        s = x + b
        return F.gelu(s, approximate="tanh"), F.gelu(s)

    check(text, want, kernels=1)


# --- pow by a scalar constant ---------------------------------------------------------------


def test_pow_by_small_integer_constants_is_multiplies() -> None:
    """x**2 is x*x (and so on) as torch computes it, not exp2(c * log2|x|), which is a
    few ulps off; the emitted kernel calls no pow at all."""
    exponents = {"sq": 2.0, "cu": 3.0, "inv": -1.0, "inv2": -2.0, "one": 1.0, "zero": 0.0,
                 "rt": 0.5, "rrt": -0.5}
    body = "\n".join(
        f"  %c{n} = graph.constant {{value = {e}}} : tensor<f32>\n"
        f"  %{n} = graph.pow %x, %c{n}"
        for n, e in exponents.items()
    )
    types = ", ".join(["tensor<6x7xf32>"] * len(exponents))
    text = (
        f"func @f(%x: tensor<6x7xf32>) -> ({types}) {{\n{body}\n"
        f"  return {', '.join('%' + n for n in exponents)} : {types}\n}}\n"
    )
    compiled = irc.compile(irc.parse(text, "t.ir"), device="cpu")
    assert "_irc_pow(" not in compiled.source  # (the prologue imports it: "_irc_pow,")
    x = torch.randn(6, 7).abs() + 0.1
    x[0, 0] = float("nan")
    got = compiled.run("f", [x])
    for g, e in zip(got, exponents.values(), strict=True):
        want = torch.pow(x, e)
        # Multiplies and a division are bit for bit; sqrt is tl.sqrt_rn, which Triton's
        # CPU interpreter rounds an ulp off at times (graph.sqrt alike), rsqrt approximate.
        if e in (0.0, 1.0, 2.0, 3.0, -1.0, -2.0):
            assert_close(g, want, rtol=0, atol=0, equal_nan=True, msg=f"x**{e}")  # bit for bit
        else:
            assert_close(g, want, equal_nan=True)


def test_a_check_message_from_the_input_stays_a_string_literal() -> None:
    """tile.check's text is irc's own, but a tile-level file may carry any: it is
    printed as a Python literal, never pasted as code."""
    import ast

    from irc.syntax.printer import print_module

    text = OUT_OF_RANGE
    module = irc.parse(text, "t.ir")
    from irc.pipeline import run_pipeline

    run_pipeline(module, "fuse,graph-to-loop,loop-to-tile")
    tile_text = print_module(module)
    assert 'tile.check' in tile_text
    hostile = "x'); import os; os.system('boom'); ('\\n"
    tile_text = re.sub(r'what = "[^"]*"', lambda _: f'what = "{hostile}"', tile_text)
    source = irc.compile(irc.parse(tile_text, "t.ir"), device="cpu").source
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "device_assert"]
    assert calls and all(isinstance(c.args[1], ast.Constant) for c in calls)
    assert "os.system" not in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
