"""irc.runtime: what generated modules import, tested on its own.

The @triton.jit helpers run in tiny kernels (on the interpreter here, compiled
with IRC_TEST_DEVICE=cuda) against torch; the host functions are called with
tensors and stand-in kernels; a generated module runs on its own, as
`irc-opt --emit triton` prints it.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from triton.runtime.jit import JITFunction

import irc
from irc.compiler import triton_source
from irc.runtime import helpers, interpreter
from irc.runtime.launch import INTERPRETED_SMS, host_functions, persistent_grid
from irc.runtime.loader import load_source

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

# One kernel a helper, and host functions that launch them on one block.
HELPER_KERNELS = """
import torch
import triton
import triton.language as tl

from irc.runtime.helpers import (
    _irc_dot_bf16, _irc_dot_split_tf32, _irc_exp, _irc_from_bf16, _irc_gelu_half, _irc_max,
    _irc_min, _irc_pow, _irc_tanh, _irc_tf32_parts, _irc_to_bf16, _irc_wait_for_previous_kernel,
)


@triton.jit
def maximum(x, y, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_max(tl.load(x + i), tl.load(y + i)))


@triton.jit
def minimum(x, y, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_min(tl.load(x + i), tl.load(y + i)))


@triton.jit
def row_max_min(x, out, N: tl.constexpr):
    row = tl.load(x + tl.program_id(0) * N + tl.arange(0, N))
    tl.store(out + 2 * tl.program_id(0), tl.reduce(row, 0, _irc_max))
    tl.store(out + 2 * tl.program_id(0) + 1, tl.reduce(row, 0, _irc_min))


@triton.jit
def exp(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_exp(tl.load(x + i)))


@triton.jit
def tanh(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_tanh(tl.load(x + i)))


@triton.jit
def gelu_half(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_gelu_half(tl.load(x + i)))


@triton.jit
def power(x, y, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_pow(tl.load(x + i), tl.load(y + i)))


@triton.jit
def to_bf16(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_to_bf16(tl.load(x + i)))


@triton.jit
def from_bf16(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, _irc_from_bf16(tl.load(x + i)))


@triton.jit
def dot_bf16(a, b, c, out, N: tl.constexpr):
    i = tl.arange(0, N)
    at = tl.load(a + i[:, None] * N + i[None, :])
    bt = tl.load(b + i[:, None] * N + i[None, :])
    ct = tl.load(c + i[:, None] * N + i[None, :])
    tl.store(out + i[:, None] * N + i[None, :], _irc_dot_bf16(at, bt, ct))


@triton.jit
def tf32_parts(x, out, N: tl.constexpr):
    i = tl.arange(0, N)
    head, tail = _irc_tf32_parts(tl.load(x + i))
    tl.store(out + i, head)
    tl.store(out + N + i, tail)


@triton.jit
def dot_split_tf32(a, b, c, out, N: tl.constexpr):
    i = tl.arange(0, N)
    at = tl.load(a + i[:, None] * N + i[None, :])
    bt = tl.load(b + i[:, None] * N + i[None, :])
    ct = tl.load(c + i[:, None] * N + i[None, :])
    tl.store(out + i[:, None] * N + i[None, :], _irc_dot_split_tf32(at, bt, ct))


@triton.jit
def copy_after_wait(x, out, N: tl.constexpr):
    _irc_wait_for_previous_kernel()
    i = tl.arange(0, N)
    tl.store(out + i, tl.load(x + i))


def one_block(kernel, inputs, dtype=None, rows=1):
    out = torch.empty(inputs[0].shape if rows == 1 else (rows, 2), dtype=dtype or inputs[0].dtype,
                      device=inputs[0].device)
    kernel[(rows,)](*inputs, out, inputs[0].shape[-1])
    return out


def both_parts(x):
    out = torch.empty(2 * x.shape[0], dtype=x.dtype, device=x.device)
    tf32_parts[(1,)](x, out, x.shape[0])
    return out


FUNCTIONS = {
    "max": lambda x, y: one_block(maximum, (x, y)),
    "min": lambda x, y: one_block(minimum, (x, y)),
    "row_max_min": lambda x: one_block(row_max_min, (x,), rows=x.shape[0]),
    "exp": lambda x: one_block(exp, (x,)),
    "tanh": lambda x: one_block(tanh, (x,)),
    "gelu_half": lambda x: one_block(gelu_half, (x,)),
    "pow": lambda x, y: one_block(power, (x, y)),
    "to_bf16": lambda x: one_block(to_bf16, (x,), torch.bfloat16),
    "from_bf16": lambda x: one_block(from_bf16, (x,), torch.float32),
    "dot_bf16": lambda a, b, c: one_block(dot_bf16, (a, b, c), torch.float32),
    "tf32_parts": lambda x: both_parts(x),
    "dot_split_tf32": lambda a, b, c: one_block(dot_split_tf32, (a, b, c), torch.float32),
    "copy_after_wait": lambda x: one_block(copy_after_wait, (x,)),
}
"""

INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """The helper kernels, loaded as irc loads a generated module for DEVICE."""
    return load_source(HELPER_KERNELS, DEVICE)


def run(kernels: ModuleType, name: str, *inputs: torch.Tensor) -> torch.Tensor:
    return kernels.FUNCTIONS[name](*(t.to(DEVICE) for t in inputs)).cpu()


def padded(values: list[float], n: int = 32) -> torch.Tensor:
    """`values` and random numbers after them, n in all (tl.arange wants a power of 2)."""
    g = torch.Generator().manual_seed(len(values))
    return torch.cat([torch.tensor(values), torch.randn(n - len(values), generator=g) * 3])


# --- the @triton.jit helpers against torch ---------------------------------------------


def test_max_and_min_propagate_nan_as_torch_does(kernels: ModuleType) -> None:
    x = padded([NAN, 1.0, NAN, INF, -INF, 2.0, -0.0, 3.0])
    y = padded([1.0, NAN, NAN, 1.0, 5.0, -INF, -1.0, 3.0])
    torch.testing.assert_close(run(kernels, "max", x, y), torch.maximum(x, y), equal_nan=True)
    torch.testing.assert_close(run(kernels, "min", x, y), torch.minimum(x, y), equal_nan=True)


def test_max_and_min_as_reductions_propagate_nan(kernels: ModuleType) -> None:
    rows = torch.randn(3, 16)
    rows[1, 7] = NAN
    rows[2, 3] = -INF
    got = run(kernels, "row_max_min", rows)
    want = torch.stack([rows.amax(1), rows.amin(1)], 1)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_interpreted_max_and_min_reductions_do_not_fold_element_by_element(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton's interpreter folds a custom combine function one element at a time in
    Python (0.1 ms an element); irc's max and min must reduce with NumPy there."""
    from triton.runtime.interpreter import ReduceOps

    def fold(self: Any, input: Any) -> Any:
        raise AssertionError(f"element-by-element fold of {self.combine_fn}")

    cpu_kernels = load_source(HELPER_KERNELS, "cpu")
    monkeypatch.setattr(ReduceOps, "generic_reduce", fold)
    rows = torch.randn(4, 1024)
    rows[1, 700] = NAN
    rows[2, 3] = -INF
    rows[3, 5] = INF
    got = cpu_kernels.FUNCTIONS["row_max_min"](rows)
    want = torch.stack([rows.amax(1), rows.amin(1)], 1)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_exp_is_as_accurate_as_torchs_over_its_whole_range(kernels: ModuleType) -> None:
    """Triton's tl.exp on the GPU is ex2.approx of x * log2(e): 64 ulp at x = 88 (the
    rounding of that product), where torch's expf is within 2. _irc_exp is CUDA's expf."""
    x = torch.cat([torch.linspace(-103.9, 88.7, 4093), torch.tensor([INF, -INF, NAN])])
    got, exact = run(kernels, "exp", x), torch.exp(x.double())
    assert got[-3] == INF and got[-2] == 0 and got[-1].isnan()
    finite = exact[:-3] > 2.0**-126  # normal results
    relative = ((got[:-3].double() - exact[:-3]).abs() / exact[:-3])[finite]
    assert relative.max() <= 4 * 2.0**-24, relative.max()


def test_tanh_matches_torch_and_keeps_the_sign_of_zero(kernels: ModuleType) -> None:
    x = padded([0.0, -0.0, INF, -INF, NAN, 1e-30, -1e-8, 44.0, -100.0, 3e38, 0.5], 64)
    got = run(kernels, "tanh", x)
    torch.testing.assert_close(got, torch.tanh(x), equal_nan=True)
    assert torch.signbit(got[1]) and not torch.signbit(got[0])


def test_tf32_parts_are_exact_in_tf32_and_sum_to_the_value(kernels: ModuleType) -> None:
    """head + tail is x to 2**-22 (the tail rounded to TF32's 11 bits); the head is
    never rounded past the largest f32; an infinity's tail is 0, a NaN's head NaN."""
    big = 3.4028234663852886e38
    x = padded([INF, -INF, NAN, big, -big, 1e-40, -0.0, 1.0 + 2**-20, 3.0000002], 64)
    out = run(kernels, "tf32_parts", x)
    head, tail = out[: x.shape[0]], out[x.shape[0] :]
    for part in (head, tail):
        finite = part[part.isfinite()]
        assert torch.all(finite.view(torch.int32) & 0x1FFF == 0)  # 10 mantissa bits
    assert head[0] == INF and head[1] == -INF and head[2].isnan()
    assert tail[0] == 0 and tail[1] == 0
    assert head[3].isfinite() and head[4].isfinite() and tail[3] != 0
    # Normal values: to 2**-22. A subnormal's parts keep its bits down to 2**-136,
    # no more (docs/lowering.md).
    values, summed = x.double(), head.double() + tail.double()
    normal = values.isfinite() & (values.abs() >= 2.0**-126)
    assert torch.all((summed - values)[normal].abs() <= values[normal].abs() * 2.0**-22)
    assert abs(summed[5] - values[5]) <= 2.0**-137


def test_split_tf32_dot_keeps_infinities_of_operands_exact_in_tf32(kernels: ModuleType) -> None:
    """inf times a weight whose tail is 0 (0.5, exact in TF32) is inf, as torch's."""
    a = torch.randn(16, 16)
    a[0, 0], a[1, 1], a[2, 2] = INF, -INF, NAN
    b = torch.full((16, 16), 0.5)
    b[:, 3] = 1.0 + 2**-20
    c = torch.zeros(16, 16)
    got = run(kernels, "dot_split_tf32", a, b, c)
    want = a @ b
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite])


def test_pow_of_special_values_matches_torch(kernels: ModuleType) -> None:
    bases = [-INF, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, INF, NAN]
    exponents = [-INF, -3.0, -2.0, -0.5, 0.0, 0.5, 2.0, 3.0, INF, NAN, 1.5]
    pairs = [(b, e) for b in bases for e in exponents]  # 121
    x = padded([b for b, _ in pairs], 128)
    y = padded([e for _, e in pairs], 128)
    got = run(kernels, "pow", x, y)
    want = torch.pow(x, y)
    torch.testing.assert_close(got, want, equal_nan=True)
    numbers = ~want.isnan()
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers]))


EPS32 = torch.finfo(torch.float32).eps


def test_tanh_is_accurate_to_a_few_ulp_near_zero(kernels: ModuleType) -> None:
    # 1 - 2/(exp(2x)+1) cancelled near 0: 1e-3 relative error at 1e-4, 0 at 1e-8 (and
    # 2-3 ulp for every x < 0); the polynomial below 0.6 and the form above it are
    # within 2 ulp (measured on the interpreter, 3 estimated for the GPU's exp).
    small = torch.logspace(-8, math.log10(0.5), 96, dtype=torch.float64)
    near_cutoff = torch.linspace(0.55, 0.7, 16, dtype=torch.float64)
    large = torch.logspace(0, 1, 12, dtype=torch.float64)
    x = torch.cat([small, near_cutoff, large]).float()
    x = torch.cat([torch.tensor([0.0, -0.0, INF, -INF, NAN, 0.3, 0.4, 0.5]), x, -x])  # 256
    got = run(kernels, "tanh", x)
    want = torch.tanh(x.double())  # correctly rounded to f32 but for ~1e-16
    torch.testing.assert_close(got.double(), want, rtol=4 * EPS32, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[:2]), torch.tensor([False, True]))


def test_gelu_half_is_within_3e_6_of_the_exact_gelu(kernels: ModuleType) -> None:
    # Its result is only rounded to f16 or bf16 (graph.gelu's HALF_RESULT form): 3e-6
    # relative is under a hundredth of an f16 half ulp (2**-12), everywhere, tails
    # included (x * Phi(x) for x = -5 is -1.4e-6, which f16 and bf16 both hold).
    x = torch.cat([torch.linspace(-5.5, 5.5, 4094), torch.linspace(-0.001, 0.001, 2)]).float()
    # torch's f64 GELU, the reference's: within 1e-8 relative of x * Phi(x) up to |x| = 5.6
    got, want = run(kernels, "gelu_half", x).double(), F.gelu(x.double())
    nonzero = want != 0
    relative = ((got - want).abs() / want.abs())[nonzero]
    assert relative.max() <= 3e-6, relative.max()
    assert (got[~nonzero] == 0).all()


def test_gelu_half_beyond_its_range_and_at_special_values(kernels: ModuleType) -> None:
    # Beyond |x| = 5.5 the tail (under 2e-8 of x) is dropped, as torch's f32 1 + erf
    # drops it; gelu(inf) is inf and gelu(-inf) NaN ((-inf) * 0), as the f32 form's.
    x = padded([0.0, -0.0, INF, -INF, NAN, 5.6, -5.6, 1e4, -1e4, 3e38, -3e38, 1e-30], 32)
    got = run(kernels, "gelu_half", x)
    assert got[2] == INF and got[3].isnan() and got[4].isnan()
    assert torch.signbit(got[1]) and not torch.signbit(got[0])
    finite = torch.ones(32, dtype=torch.bool)
    finite[2:5] = False
    want = F.gelu(x[finite].double())
    torch.testing.assert_close(got[finite].double(), want, rtol=3e-6, atol=1e-7)
    assert (got[[6, 8, 10]] == 0).all()


def test_f32_pow_is_accurate_where_b_log2_a_is_large(kernels: ModuleType) -> None:
    # exp2(b * log2|a|) in f32 was off by about |b log2 a| ulp: 70-120 ulp for results
    # near 1e+-36. Computed in f64 and rounded once, it is within half an ulp.
    g = torch.Generator().manual_seed(5)
    bases = torch.logspace(0, 4, 128, dtype=torch.float64)
    exponents = torch.rand(128, generator=g, dtype=torch.float64) * 18 - 9
    exponents[:4] = torch.tensor([9.0, -9.0, 8.5, -8.5])
    neg_bases = -torch.logspace(0, 4, 128, dtype=torch.float64)  # integer exponents: signs
    int_exponents = torch.randint(-9, 10, (128,), generator=g).double()
    a = torch.cat([bases.flip(0), neg_bases]).float()
    b = torch.cat([exponents, int_exponents]).float()
    got = run(kernels, "pow", a, b)
    want = torch.pow(a.double(), b.double())  # exact enough for f32
    torch.testing.assert_close(got.double(), want, rtol=2 * EPS32, atol=0)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_to_bf16_rounds_to_nearest_even_as_torch_does(kernels: ModuleType) -> None:
    # Ties both ways, a subnormal, the largest value that rounds to inf, NaN, infinities.
    x = padded([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-39, -1e-40, 3.4e38, NAN, INF, -INF])
    got = run(kernels, "to_bf16", x)
    want = x.to(torch.bfloat16)
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(bits(got[keep]), bits(want[keep])), (got, want)


def test_from_bf16_keeps_subnormals(kernels: ModuleType) -> None:
    raw = torch.tensor(
        [0x0001, -0x7FFF, 0x007F, 0x3F80, 0x7F80, -0x0080, 0x7FC0], dtype=torch.int16
    )
    x = torch.cat([raw.view(torch.bfloat16), torch.randn(25).to(torch.bfloat16)])
    got = run(kernels, "from_bf16", x)
    want = x.float()
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(bits(got[keep]), bits(want[keep])), (got, want)
    assert got[0] != 0  # the smallest subnormal is not flushed


def test_bf16_dot_is_the_product_of_the_values(kernels: ModuleType) -> None:
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(16, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    c = torch.randn(16, 16, generator=g)
    got = run(kernels, "dot_bf16", a, b, c)
    torch.testing.assert_close(got, a.float() @ b.float() + c)


def test_the_wait_for_the_previous_kernel_lets_the_kernel_run(kernels: ModuleType) -> None:
    x = torch.randn(32)
    assert torch.equal(run(kernels, "copy_after_wait", x), x)


@pytest.mark.gpu
def test_the_wait_is_griddepcontrol_from_hopper_on(kernels: ModuleType) -> None:
    x = torch.randn(32, device="cuda")
    compiled = kernels.copy_after_wait[(1,)](x, torch.empty_like(x), 32)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert ("griddepcontrol.wait" in compiled.asm["ptx"]) == hopper


def test_a_module_for_the_interpreter_gets_interpreted_helpers(kernels: ModuleType) -> None:
    if DEVICE != "cpu":
        assert kernels._irc_to_bf16 is helpers._irc_to_bf16
        return
    # The module bound the interpreted forms while it was loaded...
    assert kernels._irc_to_bf16.fn is interpreter.INTERPRETED_FORMS["_irc_to_bf16"]
    assert kernels._irc_max.fn is helpers._irc_max.fn
    assert not isinstance(kernels._irc_max, JITFunction)
    # ...and the helpers module holds the compiled ones again, for the GPU.
    for name in helpers.__all__:
        assert isinstance(getattr(helpers, name), JITFunction), name


def test_the_prologue_imports_every_helper() -> None:
    """A helper added to irc.runtime.helpers is one the generated modules can call."""
    from irc.lowering.tile_to_triton import HEADER

    imported = {
        alias.name
        for node in ast.parse(HEADER).body
        if isinstance(node, ast.ImportFrom) and node.module == "irc.runtime.helpers"
        for alias in node.names
    }
    jitted = {name for name, value in vars(helpers).items() if isinstance(value, JITFunction)}
    assert imported == set(helpers.__all__) == jitted


# --- host functions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tiles", "sms", "programs"),
    [(512, 132, 128), (133, 132, 67), (100, 132, 100), (7, 3, 3), (1, 132, 1)],
)
def test_persistent_grid_takes_the_fewest_programs_for_the_fewest_rounds(
    tiles: int, sms: int, programs: int
) -> None:
    assert persistent_grid(tiles, sms) == (programs,)


def test_a_persistent_grid_on_the_interpreter_assumes_a_few_sms() -> None:
    host = host_functions("cpu")
    assert host.persistent_grid(7) == persistent_grid(7, INTERPRETED_SMS) == (3,)


def test_check_names_the_function_and_argument_in_its_errors() -> None:
    check = host_functions("cpu").check
    with pytest.raises(TypeError, match=r"^softmax: argument 1 must be a torch.Tensor, got list$"):
        check([1.0], (3,), torch.float32, "softmax", 1)
    with pytest.raises(
        ValueError,
        match=r"^softmax: argument 0 must be a torch.float32 tensor of shape \[2, 3\], "
        r"got torch.float64 of shape \[2, 3\]$",
    ):
        check(torch.zeros(2, 3, dtype=torch.float64), (2, 3), torch.float32, "softmax", 0)
    with pytest.raises(ValueError, match=r"shape \[2, 3\], got torch.float32 of shape \[3, 2\]"):
        check(torch.zeros(3, 2), (2, 3), torch.float32, "softmax", 0)


def test_check_refuses_a_tensor_on_another_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a module for cuda, interpreted: no GPU needed
    check = host_functions("cuda").check
    with pytest.raises(ValueError, match=r"^f: argument 2 is on cpu; this module runs on cuda$"):
        check(torch.zeros(4), (4,), torch.float32, "f", 2)


def test_check_passes_aligned_contiguous_tensors_and_copies_the_rest() -> None:
    check = host_functions("cpu").check
    x = torch.randn(4, 8)
    assert check(x, (4, 8), torch.float32, "f", 0) is x
    t = torch.randn(8, 4).t()
    got = check(t, (4, 8), torch.float32, "f", 0)
    assert got.is_contiguous() and torch.equal(got, t)
    view = torch.randn(33)[1:].view(4, 8)  # 4 bytes into its storage
    got = check(view, (4, 8), torch.float32, "f", 0)
    assert got.data_ptr() % 16 == 0 and torch.equal(got, view)


class FakeKernel:
    """Records the grid and options of its launches, as `kernel[grid](*args, **options)`."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **options: Any) -> None:
            self.launches.append((grid, args, options))

        return launch


def test_launch_passes_warps_and_stages_and_never_contracts_to_fma(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launch = host_functions("cpu").launch
    kernel = FakeKernel()
    x = torch.zeros(4)
    launch(kernel, (5,), (x,), 8)
    launch(kernel, (2, 3), (x, x), 4, 3, pdl=True)  # no dependent launch on the interpreter
    assert kernel.launches == [
        ((5,), (x,), {"num_warps": 8, "enable_fp_fusion": False}),
        ((2, 3), (x, x), {"num_warps": 4, "enable_fp_fusion": False, "num_stages": 3}),
    ]
    assert not hasattr(kernel, "_irc_fast")  # interpreted kernels keep the plain path


def test_a_kernel_with_a_cached_launcher_goes_straight_to_it() -> None:
    calls: list[tuple[Any, ...]] = []

    class Binary:
        def launch_metadata(self, *args: Any) -> str:
            return "meta"

    kernel = FakeKernel()
    kernel._irc_fast = (  # type: ignore[attr-defined]
        lambda *a: calls.append(a), ("function", "metadata"), (6, 1, 1),
        lambda device: f"stream of {device}", 0, Binary(),
    )  # fmt: skip
    x = torch.zeros(4)
    host_functions("cpu").launch(kernel, (6,), (x, 7), 4)
    assert kernel.launches == []
    (call,) = calls
    assert call[:6] == (6, 1, 1, "stream of 0", "function", "metadata")
    assert call[-2:] == (x, 7)


def test_ensure_allocator_installs_scratch_memory_on_the_device_only_when_unset() -> None:
    import triton
    from triton.runtime import _allocation

    before = _allocation._allocator.get()
    try:
        triton.set_allocator(_allocation._NULL_ALLOCATOR)
        host_functions("cpu").ensure_allocator()
        scratch = _allocation._allocator.get()(256, 16, None)
        assert scratch.numel() == 256 and scratch.dtype == torch.int8 and scratch.is_cpu

        def mine(size: int, alignment: int, stream: object) -> torch.Tensor:
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(mine)
        host_functions("cpu").ensure_allocator()
        assert _allocation._allocator.get() is mine
    finally:
        triton.set_allocator(before)


# --- a generated module on its own -------------------------------------------------------

PROGRAM = """func @f(%x: tensor<6x40xf32>) -> (tensor<6x40xbf16>, tensor<6xf32>) {
  %b = graph.cast %x : tensor<6x40xbf16>
  %t = graph.tanh %x
  %m = graph.reduce_max %t {dims = [1]} : tensor<6xf32>
  return %b, %m : tensor<6x40xbf16>, tensor<6xf32>
}
"""

STANDALONE = """
import torch
import torch.nn.functional as F
import k

x = torch.randn(6, 40, device=k.DEVICE)
x[0, 0] = float("nan")
x[1, 1] = 1 + 2**-8  # a tie: rounds to even, where the interpreter would truncate
x[2, 2] = 1 + 3 * 2**-8  # rounds up
b, m = k.FUNCTIONS["f"](x)
want = x.to(torch.bfloat16)
assert torch.equal(b.isnan(), want.isnan())
assert torch.equal(b[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))
torch.testing.assert_close(m, torch.tanh(x).amax(1), equal_nan=True)
print("ok")
"""


def run_standalone(
    tmp_path: Path, script: str, interpret: bool
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    # k.py from tmp_path, irc as installed
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_a_generated_module_runs_on_its_own_under_the_interpreter(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text(triton_source(irc.parse(PROGRAM), "f.ir"))
    proc = run_standalone(tmp_path, STANDALONE, True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_generated_module_imports_without_the_interpreter(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text(triton_source(irc.parse(PROGRAM), "f.ir"))
    script = """
import torch
import torch.nn.functional as F
import k
from triton.runtime.jit import JITFunction
assert k.DEVICE == ("cuda" if torch.cuda.is_available() else "cpu")
assert isinstance(k._irc_to_bf16, JITFunction) and "f" in k.FUNCTIONS
print("ok")
"""
    proc = run_standalone(tmp_path, script, False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# --- the interpreter patches ---------------------------------------------------------

COUNT_POSITIVE = """
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def count_positive(x, out, N: tl.constexpr):
    tl.store(out, tl.sum(tl.load(x + tl.arange(0, N)) > 0, 0))  # tl.sum of i1 widens to i32


def count(x):
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    count_positive[(1,)](x, out, x.numel())
    return out


FUNCTIONS = {"count": count}
"""


def test_a_library_function_runs_again_after_the_namespaces_are_put_back() -> None:
    count = load_source(COUNT_POSITIVE, DEVICE).FUNCTIONS["count"]
    for seed in range(3):  # each call puts Triton's namespaces back when it ends
        x = torch.randn(16, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        assert count(x).item() == (x > 0).sum().item()


# --- 7. Contiguous loads and stores ----------------------------------------------------


def test_consecutive_unmasked_accesses_are_one_copy_and_the_rest_lane_by_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton's interpreter loads and stores lane by lane (an 8192 x 8192 softmax spent
    3.4 s of 5.7 s there); irc's unmasked accesses of consecutive elements are one
    NumPy copy, and masked, scattered and small ones still go lane by lane, with the
    same results (f32, bf16, i1, i64)."""
    from triton.runtime import interpreter

    from irc.runtime.interpreter import CONTIGUOUS_MIN

    lane_by_lane: list[int] = []
    native = interpreter._interpreter  # pyright: ignore[reportPrivateUsage]
    real_load, real_store = native.load, native.store

    def load(ptrs: Any, *args: Any) -> Any:
        lane_by_lane.append(ptrs.size)
        return real_load(ptrs, *args)

    def store(ptrs: Any, *args: Any) -> Any:
        lane_by_lane.append(ptrs.size)
        return real_store(ptrs, *args)

    monkeypatch.setattr(native, "load", load)
    monkeypatch.setattr(native, "store", store)
    monkeypatch.delenv("IRC_CPU_TILING", raising=False)  # the interpreter's large blocks
    text = """
func @f(%x: tensor<64x1024xf32>, %h: tensor<64x1024xbf16>, %i: tensor<64x1024xi64>) -> \
(tensor<64x1024xf32>, tensor<64x1024xbf16>, tensor<64x1024xi1>, tensor<64x1024xi64>) {
  %e = graph.exp %x : tensor<64x1024xf32>
  %n = graph.neg %h : tensor<64x1024xbf16>
  %z = graph.constant {value = 0.0} : tensor<f32>
  %g = graph.gt %x, %z : tensor<64x1024xi1>
  %j = graph.add %i, %i : tensor<64x1024xi64>
  return %e, %n, %g, %j : tensor<64x1024xf32>, tensor<64x1024xbf16>, tensor<64x1024xi1>, \
tensor<64x1024xi64>
}
"""
    compiled = irc.compile(irc.parse(text, "f.ir"), device="cpu")
    x, h = torch.randn(64, 1024), torch.randn(64, 1024).bfloat16()
    i = torch.randint(-(2**40), 2**40, (64, 1024))
    e, n, g, j = compiled.run("f", [x, h, i])
    torch.testing.assert_close(e, x.exp())
    assert torch.equal(n, -h) and torch.equal(g, x > 0) and torch.equal(j, i + i)
    assert lane_by_lane == []  # every access: one block of consecutive elements
    # A transpose reads scattered lanes; a tail is masked; a few lanes are not worth it.
    text = """
func @t(%x: tensor<33x1000xf32>, %s: tensor<7xf32>) -> (tensor<1000x33xf32>, tensor<7xf32>) {
  %t = graph.transpose %x {perm = [1, 0]} : tensor<1000x33xf32>
  %u = graph.exp %s : tensor<7xf32>
  return %t, %u : tensor<1000x33xf32>, tensor<7xf32>
}
"""
    compiled = irc.compile(irc.parse(text, "t.ir"), device="cpu")
    x, s = torch.randn(33, 1000), torch.randn(7)
    t, u = compiled.run("t", [x, s])
    assert torch.equal(t, x.t())
    torch.testing.assert_close(u, s.exp())
    assert lane_by_lane and min(lane_by_lane) < CONTIGUOUS_MIN
