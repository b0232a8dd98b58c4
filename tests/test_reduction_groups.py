"""Reductions over one space that do not read each other share one pass over it
(`irc.analysis.reduction_groups`): batch-norm statistics of an NCHW tensor (the mean
and the mean of squares of each channel) read every element once, not once a
statistic. A reduction that reads another, or a buffer the kernel stores, keeps its
own loop. Loads of one element in one group's bodies are one read (`read_once`), which
loop-to-tile streams (evict_first). Results are checked against torch in Triton's
interpreter."""

from __future__ import annotations

import os

import torch
from torch.testing import assert_close

import irc
from irc.analysis.reduction_groups import read_once, reduction_groups, same_value
from irc.dialects import loop, tile
from irc.passes.tile import Tiling, kernel_shape, set_tiling
from irc.pipeline import LOWERING

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"

STATISTICS = """func @f(%x: tensor<4x3x2500xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
  %m = graph.reduce_mean %x {dims = [0, 2]} : tensor<3xf32>
  %sq = graph.mul %x, %x : tensor<4x3x2500xf32>
  %q = graph.reduce_mean %sq {dims = [0, 2]} : tensor<3xf32>
  %a = graph.abs %x : tensor<4x3x2500xf32>
  %mx = graph.reduce_max %a {dims = [0, 2]} : tensor<3xf32>
  return %m, %q, %mx : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
}
"""

CENTERED = """func @f(%x: tensor<4x3x2500xf32>) -> (tensor<3xf32>, tensor<3xf32>) {
  %m = graph.reduce_mean %x {dims = [0, 2], keepdim = true} : tensor<1x3x1xf32>
  %c = graph.sub %x, %m : tensor<4x3x2500xf32>
  %sq = graph.mul %c, %c : tensor<4x3x2500xf32>
  %v = graph.reduce_sum %sq {dims = [0, 2]} : tensor<3xf32>
  %s = graph.reduce_sum %x {dims = [0, 2]} : tensor<3xf32>
  return %v, %s : tensor<3xf32>, tensor<3xf32>
}
"""


def _loop_kernels(text: str) -> list[loop.KernelOp]:
    module = irc.parse(text, "<test>")
    irc.run_pipeline(module, "fuse,graph-to-loop")
    return [op for op in module.walk() if isinstance(op, loop.KernelOp)]


def _tile_loops(text: str) -> list[tile.ForOp]:
    """The loops of the tile kernel, its one kernel tiled in chunks of 1024 of each
    channel's 10,000 elements (as autotuning may choose: no split), so that a pass over
    them is a loop."""
    module = irc.parse(text, "<test>")
    tile_at = LOWERING.index("tile") + 1
    irc.run_pipeline(module, ",".join(["fuse", *LOWERING[:tile_at]]))
    (kernel,) = loop.kernels(module)
    set_tiling(kernel, Tiling((1, 1024), 4))
    irc.run_pipeline(module, ",".join(LOWERING[tile_at:]))
    return [op for op in module.walk() if isinstance(op, tile.ForOp)]


def test_independent_statistics_are_one_group() -> None:
    (kernel,) = _loop_kernels(STATISTICS)
    (group,) = reduction_groups(kernel)
    assert [r.kind.data for r in group] == ["sum", "sum", "max"]
    assert kernel_shape(kernel).row_reads == 1


def test_one_loop_reads_the_row_for_every_statistic() -> None:
    loops = _tile_loops(STATISTICS)
    assert len(loops) == 1
    (for_op,) = loops
    assert len(for_op.results) == 3  # an accumulator each
    loads = [op for op in for_op.walk() if isinstance(op, tile.LoadOp)]
    assert len(loads) == 1  # tile-cse shared the three bodies' loads


def test_a_reduction_that_reads_another_keeps_its_own_pass() -> None:
    """The variance reads the mean: it waits for it. The plain sum joins the mean."""
    (kernel,) = _loop_kernels(CENTERED)
    groups = reduction_groups(kernel)
    assert sorted(len(g) for g in groups) == [1, 2]
    (pair,) = [g for g in groups if len(g) == 2]
    assert [loop.int_list(r.bounds) for r in pair] == [[4, 2500]] * 2
    assert kernel_shape(kernel).row_reads == 2


def test_a_reduction_reading_a_stored_buffer_is_left_alone() -> None:
    """Moved ahead of the store, it would read what was there before."""
    text = """func @f(%x: memref<8x64xf32>, %y: memref<8x64xf32>) -> (memref<8xf32>, memref<8xf32>) {
  %0 = loop.alloc : memref<8xf32>
  %1 = loop.alloc : memref<8xf32>
  loop.kernel {name = "red_0", bounds = [8]} (%i: index) {
    %a = loop.reduce {kind = "sum", bounds = [64]} (%j: index) {
      %v = loop.load %x, %i, %j : f32
      loop.yield %v
    } : f32
    loop.foreach {bounds = [64]} (%k: index) {
      %w = loop.load %x, %i, %k : f32
      loop.store %w, %y, %i, %k
    }
    %b = loop.reduce {kind = "sum", bounds = [64]} (%j2: index) {
      %u = loop.load %y, %i, %j2 : f32
      loop.yield %u
    } : f32
    loop.store %a, %0, %i
    loop.store %b, %1, %i
  }
  return %0, %1 : memref<8xf32>, memref<8xf32>
}
"""
    module = irc.parse(text, "<test>")
    (kernel,) = [op for op in module.walk() if isinstance(op, loop.KernelOp)]
    assert [len(g) for g in reduction_groups(kernel)] == [1, 1]


def test_grouped_statistics_compute_what_torch_does() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 2500, device=DEVICE)
    m, q, mx = irc.compile(irc.parse(STATISTICS, "<test>"), device=DEVICE).run("f", [x])
    assert_close(m, x.mean((0, 2)))
    assert_close(q, (x * x).mean((0, 2)))
    assert_close(mx, x.abs().amax((0, 2)))
    v, s = irc.compile(irc.parse(CENTERED, "<test>"), device=DEVICE).run("f", [x])
    assert_close(v, ((x - x.mean((0, 2), keepdim=True)) ** 2).sum((0, 2)), rtol=1e-4, atol=1e-3)
    assert_close(s, x.sum((0, 2)), rtol=1e-4, atol=1e-3)


NESTED = """func @f(%a1: tensor<1x130xf16>, %a6: tensor<1x130xf16>, %a7: tensor<1x130xf16>) -> (tensor<1x130xf16>, tensor<f16>) {
  %v8 = graph.layer_norm %a1, %a6, %a7 {dims = [0, 1], eps = 1.0e-05} : tensor<1x130xf16>
  %v9 = graph.reduce_sum %a7 {dims = [0, 1]} : tensor<f16>
  return %v8, %v9 : tensor<1x130xf16>, tensor<f16>
}
"""


def test_a_member_that_nests_a_reduction_leaves_the_group_its_indices() -> None:
    """A layer norm beside a full sum, split with tiny tiles (graphgen seed 39271):
    the split stage's chunk sums are one group, and one member's body nests the
    layer norm's own reduction, whose loop sets the reduced indices of its own.
    The members after it still bind the group's (a crash of loop-to-tile before)."""
    from irc.testing.graphgen import compile_variant
    from irc.testing.reference import functions, random_inputs
    from irc.testing.verdict import judge_outputs

    module = irc.parse(NESTED, "<test>")
    (fn,) = functions(module).values()
    inputs = random_inputs(fn, seed=39271, device=DEVICE)
    got = compile_variant(module, "small-tiles", DEVICE).run("f", inputs)  # type: ignore[attr-defined]
    for verdict in judge_outputs(fn, inputs, got):
        assert verdict.ok, verdict


def _loads(kernel: loop.KernelOp) -> list[loop.LoadOp]:
    """The kernel's loads of the buffer it loads first."""
    loads = [op for op in kernel.body.walk() if isinstance(op, loop.LoadOp)]
    return [op for op in loads if op.buffer is loads[0].buffer]


def test_statistics_load_x_once() -> None:
    """Three bodies load x at one element: one read, which tile-cse makes one load."""
    (kernel,) = _loop_kernels(STATISTICS)
    loads = _loads(kernel)
    assert len(loads) == 3
    assert read_once(loads, kernel)


def test_loads_of_dependent_passes_are_read_again() -> None:
    """The centred sum waits for the mean: a second pass over x, read again."""
    (kernel,) = _loop_kernels(CENTERED)
    loads = _loads(kernel)
    assert len(loads) == 3
    assert not read_once(loads, kernel)


def _two_reductions(index: str) -> loop.KernelOp:
    """A sum of x[i, j] and a max of x[i, k], k = `index` in the max's index j2."""
    text = f"""func @f(%x: memref<8x64xf32>) -> (memref<8xf32>, memref<8xf32>) {{
  %0 = loop.alloc : memref<8xf32>
  %1 = loop.alloc : memref<8xf32>
  loop.kernel {{name = "red_0", bounds = [8]}} (%i: index) {{
    %a = loop.reduce {{kind = "sum", bounds = [64]}} (%j: index) {{
      %v = loop.load %x, %i, %j : f32
      loop.yield %v
    }} : f32
    %b = loop.reduce {{kind = "max", bounds = [64]}} (%j2: index) {{
      %c = loop.constant {{value = 63}} : index
      %k = {index}
      %u = loop.load %x, %i, %k : f32
      loop.yield %u
    }} : f32
    loop.store %a, %0, %i
    loop.store %b, %1, %i
  }}
  return %0, %1 : memref<8xf32>, memref<8xf32>
}}
"""
    module = irc.parse(text, "<test>")
    (kernel,) = [op for op in module.walk() if isinstance(op, loop.KernelOp)]
    assert len(reduction_groups(kernel)) == 1
    return kernel


def test_loads_of_one_group_read_once_only_at_one_element() -> None:
    """x[i, min(j2, 63)] is x[i, j] once the bodies' indices pair up; x[i, 63 - j2]
    is another element (one the other body reads in another iteration)."""
    kernel = _two_reductions('loop.apply %j2, %c {fn = "minimum"} : index')
    assert not read_once(_loads(kernel), kernel)  # min(j2, 63) is j2 only by its bounds
    kernel = _two_reductions('loop.apply %c, %j2 {fn = "sub"} : index')
    assert not read_once(_loads(kernel), kernel)
    kernel = _two_reductions("loop.constant {value = 63} : index")
    assert not read_once(_loads(kernel), kernel)


def _chain(name: str, start: str, step: str, n: int) -> list[str]:
    return [
        f"    %{name}{k + 1} = loop.apply %{name if k else start}{k if k else ''}, %{step} "
        '{fn = "add"} : index'
        for k in range(n)
    ]


def test_same_value_follows_long_chains_without_recursing() -> None:
    """Two index chains of 5000 ops (a hand-written kernel may carry one) compare
    equal where they add the same constants to the same index, and not where one
    step differs; a recursive comparison ran out of stack."""
    n = 5000
    text = "\n".join(
        [
            "func @f(%x: memref<8xf32>) -> memref<8xf32> {",
            "  %0 = loop.alloc : memref<8xf32>",
            '  loop.kernel {name = "k_0", bounds = [8]} (%i: index) {',
            "    %c = loop.constant {value = 0} : index",
            "    %d = loop.constant {value = 0} : index",
            "    %e = loop.constant {value = 1} : index",
            *_chain("a", "i", "c", n),
            *_chain("b", "i", "d", n),
            *_chain("z", "i", "e", n),
            "    %v = loop.load %x, %i : f32",
            "    loop.store %v, %0, %i",
            "  }",
            "  return %0 : memref<8xf32>",
            "}",
        ]
    )
    module = irc.parse(text, "<test>")
    (kernel,) = [op for op in module.walk() if isinstance(op, loop.KernelOp)]
    values = {r.name_hint: r for op in kernel.body.walk() for r in op.results}
    assert same_value(values[f"a{n}"], values[f"b{n}"], {})
    assert not same_value(values[f"a{n}"], values[f"z{n}"], {})
    assert not same_value(values[f"a{n}"], values[f"b{n - 1}"], {})


def test_statistics_stream_x_in_their_split_stage() -> None:
    """Statistics of NCHW, split: the split stage's three bodies load x at one
    element, and its one load (tile-cse) asks L2 to evict x first."""
    from irc.compiler import triton_source

    text = STATISTICS.replace("4x3x2500", "64x3x2500")
    module = irc.parse(text, "<test>")
    irc.run_pipeline(module, "fuse")
    source = triton_source(module)
    kernels = source.split("@triton.jit")[1:]
    stage = next(k for k in kernels if "_split(" in k)
    loads = [line for line in stage.splitlines() if "tl.load(" in line]
    assert len(loads) == 1 and "evict_first" in loads[0], loads
