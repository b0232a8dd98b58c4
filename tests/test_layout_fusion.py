"""Structure the layout suite relies on (issue 16): views are free, and the fusion
Inductor's byte-count tests (test/inductor/test_perf.py) expect.

Each case is pinned by its kernel count and by the elements its kernels move,
counted as Inductor's `count_numel` does: every buffer a kernel loads from or
stores to, once per kernel, at its size. Results are checked against torch on
random inputs in Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from xdsl.dialects import func

import irc
from irc.dialects import graph, loop
from irc.ir.types import numel
from irc.testing.verdict import judge


def _compile(text: str) -> Any:
    return irc.compile(irc.parse(text, "<test>"), device="cpu")


def moved_elements(text: str) -> tuple[int, int]:
    """(kernels, elements moved): each buffer a loop.kernel loads or stores counts
    once per kernel, at its number of elements (Inductor's count_numel)."""
    module = irc.parse(text, "<test>")
    irc.run_pipeline(module, "fuse,graph-to-loop")
    kernels = moved = 0
    for fn in module.body.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        for k in fn.body.block.ops:
            if not isinstance(k, loop.KernelOp):
                continue
            kernels += 1
            buffers = {o.buffer for o in k.walk() if isinstance(o, loop.LoadOp | loop.StoreOp)}
            moved += sum(numel(tuple(b.type.get_shape())) for b in buffers)  # type: ignore[attr-defined]
    return kernels, moved


def run_against_torch(
    text: str,
    name: str,
    torch_fn: Callable[..., Any],
    *shapes: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
) -> None:
    torch.manual_seed(0)
    args = [torch.randn(*s, dtype=dtype) for s in shapes]
    got = _compile(text).run(name, args)
    want = torch_fn(*args)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == torch.float32:
            assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert_close(g, w)


# --- views are free -------------------------------------------------------------------

LOGSUMEXP = """func @lse(%x: tensor<9x40xf32>) -> tensor<9xf32> {
  %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<9x1xf32>
  %s = graph.sub %x, %m
  %e = graph.exp %s
  %d = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<9x1xf32>
  %l = graph.log %d
  %y = graph.add %l, %m
  %r = graph.reshape %y : tensor<9xf32>
  return %r : tensor<9xf32>
}
"""


def test_logsumexp_reshaped_to_rows_launches_no_copy() -> None:
    assert moved_elements(LOGSUMEXP) == (1, 9 * 40 + 9)
    run_against_torch(LOGSUMEXP, "lse", lambda x: torch.logsumexp(x, 1), (9, 40))


RESHAPED_OUTPUT = """func @f(%x: tensor<3x5x33xf32>, %w: tensor<33xf32>) -> tensor<15x33xf32> {
  %a = graph.mul %x, %w
  %r = graph.relu %a
  %y = graph.reshape %r : tensor<15x33xf32>
  return %y : tensor<15x33xf32>
}
"""


def test_a_returned_reshape_of_a_computed_value_is_a_view() -> None:
    assert moved_elements(RESHAPED_OUTPUT) == (1, 2 * 3 * 5 * 33 + 33)
    run_against_torch(
        RESHAPED_OUTPUT, "f", lambda x, w: torch.relu(x * w).flatten(0, 1), (3, 5, 33), (33,)
    )


SHARED_RESHAPE = """func @f(%x: tensor<6x10xf32>, %w: tensor<10xf32>) -> (tensor<60xf32>, tensor<6xf32>, tensor<2x3xf32>) {
  %a = graph.mul %x, %w
  %e = graph.exp %a
  %r = graph.reshape %e : tensor<60xf32>
  %s = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<6x1xf32>
  %s2 = graph.reshape %s : tensor<6xf32>
  %t = graph.reshape %s2 : tensor<2x3xf32>
  %u = graph.mul %s, %s
  %ur = graph.reshape %u : tensor<3x2xf32>
  %ut = graph.transpose %ur {perm = [1, 0]} : tensor<2x3xf32>
  %v = graph.add %t, %ut
  return %r, %s2, %v : tensor<60xf32>, tensor<6xf32>, tensor<2x3xf32>
}
"""


def test_reshaped_outputs_read_again_by_a_later_kernel() -> None:
    """Two outputs of one kernel stored as their returned reshapes, one of them also
    read (through reshapes and a transpose) by the next kernel: no copy."""

    def want(x: Any, w: Any) -> Any:
        e = torch.exp(x * w)
        s = e.sum(1, keepdim=True)
        u = (s * s).reshape(3, 2).t()
        return e.reshape(60), s.reshape(6), s.reshape(2, 3) + u

    assert moved_elements(SHARED_RESHAPE)[0] == 2
    run_against_torch(SHARED_RESHAPE, "f", want, (6, 10), (10,))


TWO_SHAPES = """func @f(%x: tensor<6x10xf32>) -> (tensor<60xf32>, tensor<6x10xf32>, tensor<10x6xf32>, tensor<60xf32>) {
  %a = graph.exp %x
  %r = graph.reshape %a : tensor<60xf32>
  %r2 = graph.reshape %a : tensor<10x6xf32>
  %xr = graph.reshape %x : tensor<60xf32>
  return %r, %a, %r2, %xr : tensor<60xf32>, tensor<6x10xf32>, tensor<10x6xf32>, tensor<60xf32>
}
"""


def test_one_buffer_returned_in_two_shapes_still_gets_copies() -> None:
    """A value returned as itself and reshaped (or a function argument reshaped)
    needs buffers of its own: the outputs do not alias one another or the inputs."""
    assert moved_elements(TWO_SHAPES)[0] == 4
    run_against_torch(
        TWO_SHAPES, "f", lambda x: (x.exp().reshape(60), x.exp(), x.exp().reshape(10, 6),
                                    x.reshape(60)), (6, 10)
    )  # fmt: skip


COS_RESHAPE_COS = """func @f(%x: tensor<100xf32>) -> tensor<10x10xf32> {
  %a = graph.cos %x
  %r = graph.reshape %a : tensor<10x10xf32>
  %b = graph.cos %r
  return %b : tensor<10x10xf32>
}
"""


def test_cos_reshape_cos_is_one_kernel() -> None:
    """Inductor's view test: a row-major reshape changes no element order."""
    assert moved_elements(COS_RESHAPE_COS) == (1, 200)
    run_against_torch(COS_RESHAPE_COS, "f", lambda x: x.cos().reshape(10, 10).cos(), (100,))


@pytest.mark.parametrize("shape", [(10, 10), (7, 13)])
def test_transposed_operand_is_an_index_map(shape: tuple[int, int]) -> None:
    """Inductor's test_tiling_simple: a + b.t() moves 300 elements at 10x10."""
    n, m = shape
    text = f"""func @f(%a: tensor<{n}x{m}xf32>, %b: tensor<{m}x{n}xf32>) -> tensor<{n}x{m}xf32> {{
  %t = graph.transpose %b {{perm = [1, 0]}} : tensor<{n}x{m}xf32>
  %y = graph.add %a, %t
  return %y : tensor<{n}x{m}xf32>
}}
"""
    assert moved_elements(text) == (1, 3 * n * m)
    run_against_torch(text, "f", lambda a, b: a + b.t(), (n, m), (m, n))


# --- recomputing a cheap shared producer -----------------------------------------------

KEOPS = """func @f(%a: tensor<20x1xf32>, %b: tensor<1x20xf32>) -> (tensor<20xf32>, tensor<20xf32>) {
  %p = graph.mul %a, %b : tensor<20x20xf32>
  %c = graph.cos %p
  %s0 = graph.reduce_sum %c {dims = [1]} : tensor<20xf32>
  %s1 = graph.reduce_sum %c {dims = [0]} : tensor<20xf32>
  return %s0, %s1 : tensor<20xf32>, tensor<20xf32>
}
"""


def _report(text: str) -> Any:
    from irc.passes.fuse import fuse_module

    (report,) = fuse_module(irc.parse(text, "<test>"))
    return report


def test_a_cheap_producer_of_two_reductions_is_recomputed_not_written() -> None:
    """Inductor's test_partitioning_keops: cos(a * b) feeds sums over both dims. Written
    once and read back it moves 880 elements; recomputed in the second kernel 120."""
    assert moved_elements(KEOPS) == (2, 4 * 20 + 2 * 20)
    (record,) = _report(KEOPS).recomputed
    assert record.done and record.value == "%c" and record.ops == ["mul %p", "cos %c"]
    assert record.saved == 2 * 400 * 4 - 40 * 4 and record.work == 400 * (1 + 8)
    assert "within 4 an HBM byte" in record.reason
    run_against_torch(
        KEOPS, "f", lambda a, b: ((a * b).cos().sum(1), (a * b).cos().sum(0)), (20, 1), (1, 20)
    )


def test_recomputation_is_in_the_fusion_report(tmp_path: Any) -> None:
    from irc.tools.opt import run as irc_opt

    path = tmp_path / "keops.ir"
    path.write_text(KEOPS)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert irc_opt([str(path), "--fuse", "--fusion-report"]) == 0
    text = err.getvalue()
    assert "2 kernels launched" in text
    line = next(x for x in text.splitlines() if x.startswith("  recomputed: %c"))
    assert "[mul %p, cos %c] of triton_per_fused_mul_cos_sum_0 in triton_per_fused_mul_cos_sum_1" in line
    assert "mul %p (copy), cos %c (copy), reduce_sum %s1" in text


COSTLY = """func @f(%x: tensor<16x24xbf16>) -> (tensor<16xbf16>, tensor<24xbf16>) {
  %a = graph.sigmoid %x
  %b = graph.tanh %a
  %c = graph.cos %b
  %d = graph.sin %c
  %p = graph.exp %d
  %s0 = graph.reduce_sum %p {dims = [1]} : tensor<16xbf16>
  %s1 = graph.reduce_sum %p {dims = [0]} : tensor<24xbf16>
  return %s0, %s1 : tensor<16xbf16>, tensor<24xbf16>
}
"""


def test_a_costly_producer_is_written_once_and_the_report_says_why() -> None:
    """Five transcendental ops an element for 2 bytes saved: over the work budget."""
    (record,) = _report(COSTLY).recomputed
    assert not record.done and record.work == 5 * 8 * 16 * 24
    assert record.reason == "over 4 element ops an HBM byte saved"
    assert moved_elements(COSTLY) == (2, 2 * 16 * 24 + 16 + 16 * 24 + 24)


LAYERNORM_AMAX = """func @f(%x: tensor<12x40xf32>, %w: tensor<40xf32>, %b: tensor<40xf32>) -> (tensor<12x40xf32>, tensor<f32>) {
  %mean = graph.reduce_mean %x {dims = [1], keepdim = true} : tensor<12x1xf32>
  %c = graph.sub %x, %mean
  %sq = graph.mul %c, %c
  %var = graph.reduce_mean %sq {dims = [1], keepdim = true} : tensor<12x1xf32>
  %eps = graph.constant {value = 1.0e-5} : tensor<f32>
  %ve = graph.add %var, %eps
  %inv = graph.rsqrt %ve
  %n = graph.mul %c, %inv
  %s = graph.mul %n, %w
  %y = graph.add %s, %b
  %ab = graph.abs %y
  %amax = graph.reduce_max %ab {dims = [0, 1]} : tensor<f32>
  %sg = graph.sigmoid %y
  return %sg, %amax : tensor<12x40xf32>, tensor<f32>
}
"""


def test_layer_norm_then_a_full_reduction_does_not_write_x_minus_mean() -> None:
    """Inductor's test_reduction_pointwise_multi_level_reduction: `x - mean` is never
    written full-size, and x is read once: the amax of each row is taken in the layer
    norm's kernel (passes/nest_reductions.py), then the amax of those."""
    kernels, moved = moved_elements(LAYERNORM_AMAX)
    n, h = 12, 40
    assert kernels == 2
    # rows: x, w, b in, y and each row's amax out; then the row amaxes in, amax out
    assert moved == (n * h + 2 * h + n * h + n) + (n + 1)
    report = _report(LAYERNORM_AMAX)
    assert not report.recomputed
    (note,) = report.nested
    assert note.startswith("reduce_max %amax over dims [0, 1] nested: dims [1] first")

    def want(x: Any, w: Any, b: Any) -> Any:
        y = torch.nn.functional.layer_norm(x, (h,), w, b, 1e-5)
        return torch.sigmoid(y), y.abs().amax()

    run_against_torch(LAYERNORM_AMAX, "f", want, (n, h), (h,), (h,))


# --- two reductions over different dims, the first small -------------------------------


def _neighbor(k: int) -> str:
    return f"""func @f(%a: tensor<10x1x{k}xf32>, %b: tensor<1x10x{k}xf32>) -> tensor<10xf32> {{
  %d = graph.sub %a, %b : tensor<10x10x{k}xf32>
  %s = graph.mul %d, %d
  %r = graph.reduce_sum %s {{dims = [2]}} : tensor<10x10xf32>
  %m = graph.reduce_max %r {{dims = [1]}} : tensor<10xf32>
  return %m : tensor<10xf32>
}}
"""


@pytest.mark.parametrize(("k", "elements"), [(4, 90), (8, 170)])
def test_neighbor_is_one_kernel(k: int, elements: int) -> None:
    """Inductor's test_neighbor: 90 elements at k=4 (170 at k=8, its would-be-nice case)
    where two kernels write and read the 10x10 sums (290)."""
    assert moved_elements(_neighbor(k)) == (1, elements)
    report = _report(_neighbor(k))
    assert report.unrolled == [
        f"reduce_sum %r over {k} elements unrolled into element-wise ops: it feeds "
        "reduce_max %m, over other dims, and one kernel computes both"
    ]
    run_against_torch(
        _neighbor(k), "f", lambda a, b: ((a - b) ** 2).sum(-1).amax(1), (10, 1, k), (1, 10, k)
    )


def _neighbor_of(k: int, el: str) -> str:
    return _neighbor(k).replace("f32", el)


@pytest.mark.parametrize(("k", "el"), [(16, "f32"), (11, "bf16"), (9, "f32")])
def test_a_reduction_whose_terms_fit_a_kernel_is_unrolled_past_eight(k: int, el: str) -> None:
    """3 ops a term in f32 (sub, mul, add), 4 in bf16 (and the widening cast): 16 and
    11 terms fit `UNROLLED_SHARE` of 64 ops, and one kernel computes both reductions."""
    text = _neighbor_of(k, el)
    assert moved_elements(text)[0] == 1 and len(_report(text).unrolled) == 1
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[el]
    torch.manual_seed(0)
    a, b = torch.randn(10, 1, k).to(dtype), torch.randn(1, 10, k).to(dtype)
    got = _compile(text).run("f", [a, b])[0]
    want = ((a.float() - b.float()) ** 2).sum(-1).amax(1)
    assert judge(got, ((a - b) ** 2).sum(-1).amax(1)).ok
    assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("k", "el"), [(17, "f32"), (12, "bf16"), (24, "f32")])
def test_a_reduction_whose_terms_do_not_fit_a_kernel_is_not_unrolled(k: int, el: str) -> None:
    """Unrolled, fusion would write some terms out full-size (slower than two kernels)."""
    from irc.passes.decompose import UNROLLED_SHARE, unrolled_ops
    from irc.passes.fuse import MAX_OPS

    text = _neighbor_of(k, el)
    assert moved_elements(text)[0] == 2 and _report(text).unrolled == []
    module = irc.parse(text, "<test>")
    (sums,) = [o for o in module.walk() if isinstance(o, graph.ReduceSumOp)]
    ops = unrolled_ops(sums, k)
    assert ops > UNROLLED_SHARE * MAX_OPS
    # The report says why, with the numbers.
    assert _report(text).not_unrolled == [
        f"reduce_sum %r over {k} elements stays a reduction: unrolled, it would be {ops} "
        "ops, more than 48 of the 64 a kernel takes, beside reduce_max %m"
    ]
    assert f"  not unrolled: reduce_sum %r over {k} elements" in _report(text).text()


def test_the_unrolling_budget_follows_fuses_max_ops() -> None:
    """16 bf16 terms (65 ops) do not fit 48 of 64 ops, but fit 96 of `max-ops=128`;
    `max-ops=16` leaves even 4 f32 terms (12 ops, beside 12 allowed) unrolled and 5 not."""
    from irc.passes.fuse import fuse_module

    def unrolled(text: str, max_ops: int) -> int:
        (report,) = fuse_module(irc.parse(text, "<test>"), max_ops)
        return len(report.unrolled)

    assert unrolled(_neighbor_of(16, "bf16"), 64) == 0
    assert unrolled(_neighbor_of(16, "bf16"), 128) == 1
    assert unrolled(_neighbor_of(4, "f32"), 16) == 1
    assert unrolled(_neighbor_of(5, "f32"), 16) == 0


def _long_chain(k: int) -> str:
    return f"""func @f(%a: tensor<10x1x{k}xf32>, %b: tensor<1x10x{k}xf32>) -> tensor<10xf32> {{
  %d = graph.sub %a, %b : tensor<10x10x{k}xf32>
  %e = graph.exp %d
  %s = graph.sin %e
  %c = graph.cos %s
  %t = graph.tanh %c
  %n = graph.neg %t
  %r = graph.reduce_sum %n {{dims = [2]}} : tensor<10x10xf32>
  %m = graph.reduce_max %r {{dims = [1]}} : tensor<10xf32>
  return %m : tensor<10xf32>
}}
"""


def test_eight_terms_of_a_long_chain_are_not_unrolled() -> None:
    """7 ops a term: 8 terms (56 ops) do not fit beside the max, 6 (42) do."""
    assert _report(_long_chain(8)).unrolled == [] and moved_elements(_long_chain(8))[0] == 2
    assert len(_report(_long_chain(6)).unrolled) == 1 and moved_elements(_long_chain(6))[0] == 1


MEAN_KEEPDIM = """func @f(%x: tensor<6x5x3xbf16>) -> tensor<6x1x1xbf16> {
  %e = graph.exp %x
  %r = graph.reduce_mean %e {dims = [2], keepdim = true} : tensor<6x5x1xbf16>
  %m = graph.reduce_min %r {dims = [1], keepdim = true} : tensor<6x1x1xbf16>
  return %m : tensor<6x1x1xbf16>
}
"""


def test_an_unrolled_half_precision_mean_is_summed_in_f32() -> None:
    """keepdim, a mean and bf16: the terms are added in f32 and rounded once, as torch's
    mean is; the result is judged by irc-run --check's rule against the f64 program."""
    from irc.testing.reference import functions
    from irc.testing.verdict import judge, yardsticks

    assert moved_elements(MEAN_KEEPDIM) == (1, 90 + 6)
    torch.manual_seed(0)
    x = torch.randn(6, 5, 3, dtype=torch.bfloat16)
    (got,) = _compile(MEAN_KEEPDIM).run("f", [x])
    want = x.exp().mean(2, keepdim=True).amin(1, keepdim=True)
    (stick,) = yardsticks(functions(irc.parse(MEAN_KEEPDIM, "<test>"))["f"], [x])
    assert judge(got, want, stick).ok


BOOL_ANY_ALL = """func @f(%x: tensor<6x5x40xf32>) -> (tensor<40xi1>, tensor<6xi1>) {
  %z = graph.constant {value = 0.0} : tensor<f32>
  %p = graph.gt %x, %z
  %any = graph.reduce_max %p {dims = [0]} : tensor<5x40xi1>
  %all = graph.reduce_min %any {dims = [0]} : tensor<40xi1>
  %every = graph.reduce_min %p {dims = [1], keepdim = true} : tensor<6x1x40xi1>
  %some = graph.reduce_max %every {dims = [1, 2]} : tensor<6xi1>
  return %all, %some : tensor<40xi1>, tensor<6xi1>
}
"""


def test_unrolled_i1_max_and_min_are_or_and_and() -> None:
    """An i1 max (any) or min (all) over a few elements feeding another reduction:
    its terms were combined with graph.maximum / graph.minimum, which i1 does not
    have (an internal error of fuse); they are wheres now."""
    assert len(_report(BOOL_ANY_ALL).unrolled) == 2
    assert moved_elements(BOOL_ANY_ALL)[0] == 2

    def want(x: Any) -> Any:
        p = x > 0
        return p.amax(0).amin(0), p.amin(1, keepdim=True).amax((1, 2))

    run_against_torch(BOOL_ANY_ALL, "f", want, (6, 5, 40))


def test_a_small_reduction_read_by_no_other_reduction_stays_a_reduction() -> None:
    text = """func @f(%x: tensor<10x4xf32>) -> tensor<10xf32> {
  %r = graph.reduce_sum %x {dims = [1]} : tensor<10xf32>
  return %r : tensor<10xf32>
}
"""
    assert _report(text).unrolled == [] and moved_elements(text) == (1, 50)


OVER_SIZE_ONE = """func @f(%a: tensor<10x1x1xbf16>, %b: tensor<1x10x1xbf16>) -> (tensor<10xbf16>, tensor<10x1x1xf32>) {
  %d = graph.sub %a, %b : tensor<10x10x1xbf16>
  %s = graph.mul %d, %d
  %r = graph.reduce_sum %s {dims = [2]} : tensor<10x10xbf16>
  %m = graph.reduce_max %r {dims = [1]} : tensor<10xbf16>
  %f = graph.cast %a : tensor<10x1x1xf32>
  %e = graph.exp %f
  %n = graph.reduce_mean %e {dims = [1, 2], keepdim = true} : tensor<10x1x1xf32>
  return %m, %n : tensor<10xbf16>, tensor<10x1x1xf32>
}
"""


def test_a_reduction_over_dims_of_size_one_is_a_reshape() -> None:
    """test_neighbor at k = 1 (Inductor: one kernel): the sum over a dim of size 1 is
    its input, whether or not another reduction reads it; the mean divides by nothing."""
    report = _report(OVER_SIZE_ONE)
    assert report.unrolled == [
        "reduce_sum %r over 1 element unrolled into element-wise ops: it feeds "
        "reduce_max %m, over other dims, and one kernel computes both",
        "reduce_mean %n over dims of size 1 is its input reshaped: no reduction left",
    ]
    assert moved_elements(OVER_SIZE_ONE)[0] == 2  # the max's kernel and the exp's
    fused = irc.parse(OVER_SIZE_ONE, "<test>")
    irc.run_pipeline(fused, "fuse")
    assert "graph.div" not in str(fused) and "graph.reduce_mean" not in str(fused)

    def want(a: Any, b: Any) -> Any:
        return ((a - b) ** 2).sum(-1).amax(1), a.float().exp().mean((1, 2), keepdim=True)

    run_against_torch(OVER_SIZE_ONE, "f", want, (10, 1, 1), (1, 10, 1), dtype=torch.bfloat16)
