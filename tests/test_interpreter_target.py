"""irc.target's interpreter target: on Triton's interpreter (`device="cpu"`), kernels
get few programs with large blocks (a model of the interpreter's cost), results stay
torch's, and GPU targets keep their tilings."""

from __future__ import annotations

import pytest
import torch

import irc
from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.passes.tile import KernelShape, Tiling, choose_tiling, tiling_of
from irc.pipeline import LOWERING, run_pipeline
from irc.target import (
    CPU_TILING_ENV,
    INTERPRETER_MAX_ELEMENTS,
    Target,
    interpreter_cost,
    interpreter_target,
    interpreter_tiling,
    target_for,
)


@pytest.fixture
def interpreter_tilings(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user's `device="cpu"` run (the suite otherwise keeps the GPU's tilings)."""
    monkeypatch.setenv(CPU_TILING_ENV, "interpreter")


def retiled(shape: KernelShape) -> Tiling:
    return interpreter_tiling(shape, choose_tiling(shape))


def test_element_wise_kernels_get_blocks_of_up_to_a_million_elements() -> None:
    big = retiled(KernelShape(KernelKind.POINTWISE, (8192, 8192), ()))
    assert big.block == (INTERPRETER_MAX_ELEMENTS,)
    assert retiled(KernelShape(KernelKind.POINTWISE, (1000,), ())).block == (1024,)


def test_rows_stay_whole_and_many_share_a_program() -> None:
    # 8192 softmax rows of 8192: one row a program on a GPU, 128 on the interpreter.
    shape = KernelShape(KernelKind.REDUCTION, (8192,), (8192,), epilogue=True)
    assert choose_tiling(shape).block == (1, 8192)
    x, r = retiled(shape).block
    assert r == 8192 and x * r == INTERPRETER_MAX_ELEMENTS


def test_long_rows_are_looped_in_large_chunks() -> None:
    shape = KernelShape(KernelKind.REDUCTION, (4,), (3_000_000,))
    x, r = retiled(shape).block
    assert x * r <= INTERPRETER_MAX_ELEMENTS and r > 1024


def test_contractions_get_larger_tiles_of_at_least_16() -> None:
    t = retiled(KernelShape(KernelKind.CONTRACTION, (512, 1024), (1024,)))
    assert min(t.block) >= 64 and t.block[0] * t.block[1] > 64 * 64 and not t.persistent
    small = retiled(KernelShape(KernelKind.CONTRACTION, (3, 5, 7), (9,)))
    assert small.block == (16, 16, 16)


def test_the_choice_is_the_cheapest_by_the_model() -> None:
    shape = KernelShape(KernelKind.REDUCTION, (512,), (8192,), epilogue=True)
    chosen = retiled(shape)
    programs = 512 // chosen.block[0]
    one_row = interpreter_cost(512, 512 * 8192)
    assert interpreter_cost(programs, 512 * 8192) < one_row / 4


def test_gpu_targets_never_retile() -> None:
    gpu = target_for(
        {"mem_clock_rate": 2_619_000, "mem_bus_width": 5120, "multiprocessor_count": 132}
    )
    assert not gpu.interpreted and not Target().interpreted
    assert gpu.split_pass() == "split-reduction{sms=132}"
    assert gpu.split_k_pass() == "split-k{sms=132}"


def test_the_suite_keeps_the_gpu_tilings_on_the_interpreter() -> None:
    assert not interpreter_target().interpreted  # conftest sets IRC_CPU_TILING=gpu


def test_a_cpu_compile_uses_the_interpreter_target(interpreter_tilings: None) -> None:
    target = interpreter_target()
    assert target.interpreted and target.split_pass() == "split-reduction{sms=1 splits=16}"
    assert target.split_k_pass() == "split-k{sms=1}"  # one SM: no GEMM is split
    compiled = irc.compile("examples/softmax.ir", device="cpu")
    assert compiled.target == target


SOFTMAX = """
func @f(%x: tensor<64x512xf32>) -> tensor<64x512xf32> {
  %y = graph.softmax %x {dim = 1} : tensor<64x512xf32>
  return %y : tensor<64x512xf32>
}
"""


def loop_tilings(text: str, target: Target) -> list[Tiling]:
    module = irc.parse(text)
    passes = list(LOWERING)
    passes[passes.index("split-reduction")] = target.split_pass()
    run_pipeline(module, ",".join(["fuse", *passes[: passes.index("tile") + 1]]))
    target.retile(module)
    return [tiling_of(k) for k in loop.kernels(module)]


def test_the_retiling_is_written_on_the_kernels(interpreter_tilings: None) -> None:
    (gpu,) = loop_tilings(SOFTMAX, Target())
    (cpu,) = loop_tilings(SOFTMAX, interpreter_target())
    assert gpu.block == (8, 512) and cpu.block == (64, 512)


PROGRAMS = {
    "rows": SOFTMAX,
    "columns": """
func @f(%x: tensor<300x130xf32>) -> tensor<130xf32> {
  %y = graph.reduce_sum %x {dims = [0]} : tensor<130xf32>
  return %y : tensor<130xf32>
}
""",
    "max_and_element_wise": """
func @f(%x: tensor<37x1000xf32>, %b: tensor<1000xf32>) -> tensor<37x1xf32> {
  %e = graph.exp %x : tensor<37x1000xf32>
  %a = graph.add %e, %b : tensor<37x1000xf32>
  %m = graph.reduce_max %a {dims = [1], keepdim = true} : tensor<37x1xf32>
  return %m : tensor<37x1xf32>
}
""",
    "full_sum_split": """
func @f(%x: tensor<262144xf32>) -> tensor<f32> {
  %y = graph.reduce_sum %x {dims = [0]} : tensor<f32>
  return %y : tensor<f32>
}
""",
    "batched_matmul": """
func @f(%a: tensor<3x40x70xf32>, %b: tensor<3x70x50xf32>) -> tensor<3x40x50xf32> {
  %y = graph.matmul %a, %b : tensor<3x40x50xf32>
  return %y : tensor<3x40x50xf32>
}
""",
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_interpreter_tilings_compute_what_torch_does(interpreter_tilings: None, name: str) -> None:
    from irc.testing.reference import random_inputs, run_function

    module = irc.parse(PROGRAMS[name])
    compiled = irc.compile(module, device="cpu")
    assert compiled.target.interpreted
    (fn,) = [op for op in module.body.ops if getattr(op, "sym_name", None) is not None]
    inputs = random_inputs(fn, seed=1, device=torch.device("cpu"))
    (want,) = run_function(fn, inputs, torch.device("cpu"))
    torch.testing.assert_close(compiled.f(*inputs), want, rtol=1e-4, atol=1e-4)
