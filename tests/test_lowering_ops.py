"""Every spec op, compiled without fusion (one kernel per op), against torch on the CPU.

Each test writes a small `.ir` function, compiles it with `irc.compile(...,
fuse=False)` (the Triton interpreter runs it on the CPU) and compares the
result with the torch expression of the same meaning through
`torch.testing.assert_close` and its default tolerances for the dtype.
Inputs are fresh random tensors from `irc.testing.reference.random_inputs` (never all
zeros), shapes are ragged (not multiples of any block size) and cover ranks
0 to 4. Large-tensor behaviour (int64 indices) is checked on the emitted source
only, without running it.

The same suite runs on a GPU with `IRC_TEST_DEVICE=cuda` (default: cpu).
"""

from __future__ import annotations

import io
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close
from xdsl.dialects.builtin import ModuleOp

import irc
from irc.compiler import CompiledModule
from irc.testing.reference import functions, random_inputs
from irc.tools.opt import run as irc_opt

DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i64": torch.int64,
    "i32": torch.int32,
    "i1": torch.bool,
}
FLOATS = ("f32", "f16", "bf16", "f64")
DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

Shape = tuple[int, ...]


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Generated modules go to a temporary folder, not the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IRC_CACHE_DIR", str(tmp_path_factory.mktemp("irc-cache")))
        yield


# --- helpers ---------------------------------------------------------------------


def ty(shape: Shape, el: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + el + ">"


def func_text(
    name: str,
    args: Sequence[tuple[str, Shape, str]],
    body: Sequence[str],
    results: Sequence[tuple[str, Shape, str]],
) -> str:
    sig = ", ".join(f"%{n}: {ty(s, e)}" for n, s, e in args)
    rtypes = [ty(s, e) for _, s, e in results]
    ret = rtypes[0] if len(rtypes) == 1 else "(" + ", ".join(rtypes) + ")"
    lines = [f"func @{name}({sig}) -> {ret} {{"]
    lines += [f"  {line}" for line in body]
    lines.append(f"  return {', '.join('%' + n for n, _, _ in results)} : {', '.join(rtypes)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def one_op(
    op: str,
    operands: Sequence[tuple[Shape, str]],
    result: tuple[Shape, str],
    attrs: str = "",
) -> str:
    """`func @f(%a0, ...) { %r = graph.OP %a0, ... {attrs} : T; return %r }`."""
    args = [(f"a{i}", s, e) for i, (s, e) in enumerate(operands)]
    names = ", ".join(f"%a{i}" for i in range(len(operands)))
    body = f"%r = graph.{op} {names}".rstrip() + (f" {{{attrs}}}" if attrs else "")
    body += f" : {ty(*result)}"
    return func_text("f", args, [body], [("r", *result)])


def compile_text(text: str) -> tuple[ModuleOp, CompiledModule]:
    module = irc.parse(text, "test.ir")
    irc.verify(module)
    return module, irc.compile(module, device=DEVICE, fuse=False)


def inputs_for(module: ModuleOp, name: str = "f", seed: int = 0) -> list[Tensor]:
    return random_inputs(functions(module)[name], seed, DEVICE)


def check(
    text: str,
    expected: Callable[..., Tensor | tuple[Tensor, ...]],
    prepare: Callable[..., list[Tensor]] | None = None,
    *,
    name: str = "f",
    seed: int = 0,
    equal_nan: bool = False,
    kernels: int | None = None,
) -> list[Tensor]:
    """Compiles `text`, runs @name on random inputs and compares with `expected(*inputs)`."""
    module, compiled = compile_text(text)
    xs = inputs_for(module, name, seed)
    if prepare is not None:
        xs = prepare(*xs)
    before = [x.clone() for x in xs]
    got = compiled.run(name, xs)
    want = expected(*xs)
    want_list = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want_list)
    for g, w in zip(got, want_list, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        assert_close(g, w, equal_nan=equal_nan)
    for x, b in zip(xs, before, strict=True):
        assert_close(x, b, equal_nan=True, rtol=0, atol=0)  # inputs are never written
    if kernels is not None:
        assert compiled.kernel_count == kernels
    return got


def emit_triton(text: str, *pipeline: str) -> str:
    """`irc-opt --emit triton` on `text` (in process)."""
    return opt(text, "--emit", "triton", *pipeline)


def opt(text: str, *args: str) -> str:
    """`irc-opt FILE ARGS...` in process, `text` written to a temporary FILE."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.ir"
        path.write_text(text)
        out = io.StringIO()
        rc = irc_opt([str(path), *args], stdout=out)
        assert rc == 0
        return out.getvalue()


def positive(x: Tensor) -> Tensor:
    return x.abs() + 0.25


# --- unary ---------------------------------------------------------------------------

UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "silu": F.silu,
    "reciprocal": torch.reciprocal,
    "erf": torch.erf,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
}
NEEDS_POSITIVE = {"log", "sqrt", "rsqrt"}
# Ragged shapes of every rank; a unary test cycles through them.
SHAPES: list[Shape] = [(37, 300), (1001,), (5, 7, 130), (), (2, 3, 5, 7), (1,), (3,)]


@pytest.mark.parametrize("el", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str, el: str) -> None:
    shape = SHAPES[(sorted(UNARY).index(op) + FLOATS.index(el)) % len(SHAPES)]
    prepare = (lambda x: [positive(x)]) if op in NEEDS_POSITIVE else None
    check(one_op(op, [(shape, el)], (shape, el)), UNARY[op], prepare, kernels=1)


@pytest.mark.parametrize("el", ["i32", "i64"])
@pytest.mark.parametrize("op", ["neg", "abs", "relu"])
def test_unary_integer(op: str, el: str) -> None:
    check(one_op(op, [((37, 30), el)], ((37, 30), el)), UNARY[op])


def test_unary_on_scalar_and_size_one() -> None:
    text = func_text(
        "f",
        [("s", (), "f32"), ("o", (1, 1, 1, 1), "f32")],
        ["%a = graph.exp %s : tensor<f32>", "%b = graph.tanh %o : tensor<1x1x1x1xf32>"],
        [("a", (), "f32"), ("b", (1, 1, 1, 1), "f32")],
    )
    check(text, lambda s, o: (torch.exp(s), torch.tanh(o)))


# --- floor, ceil, round: exact, ties and signed zeros -----------------------------------

INTEGER_ROUNDING = {"floor": torch.floor, "ceil": torch.ceil, "round": torch.round}
# Ties of both signs (round takes them to even), values just off a tie, zeros and
# values that round to a zero of either sign, the last fractions below 2**23 (from
# there on every f32 is an integer), a tie past f16's 1024, NaN and inf.
ROUNDING_VALUES = [
    0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 4.5, 0.49999997, 0.50000006, -0.3, 0.3,
    -0.0, 0.0, 7.7, -7.7, 1023.5, 1024.5, 2047.0, 8388607.5, -8388607.5, 8388609.0,
    1e30, float("nan"), float("inf"), float("-inf"), 255.5, 127.5,
]  # fmt: skip


def assert_same_bits(got: Tensor, want: Tensor) -> None:
    """Equal values, NaN where NaN, and the same sign of every zero."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), (got, want)
    assert torch.equal(got.signbit() & ~got.isnan(), want.signbit() & ~want.isnan()), (got, want)


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("el", FLOATS)
@pytest.mark.parametrize("op", sorted(INTEGER_ROUNDING))
def test_integer_rounding_is_exact(op: str, el: str, fuse: bool) -> None:
    """Bit for bit as torch, alone and fused with an add that reads the result."""
    n = len(ROUNDING_VALUES)
    text = func_text(
        "f",
        [("x", (n,), el), ("z", (n,), el)],
        [f"%r = graph.{op} %x : {ty((n,), el)}", f"%s = graph.add %r, %z : {ty((n,), el)}"],
        [("r", (n,), el), ("s", (n,), el)],
    )
    module = irc.parse(text, "test.ir")
    irc.verify(module)
    compiled = irc.compile(module, device=DEVICE, fuse=fuse)
    assert compiled.kernel_count == (1 if fuse else 2)
    x = torch.tensor(ROUNDING_VALUES, dtype=torch.float64).to(DTYPES[el]).to(DEVICE)
    z = torch.zeros_like(x)
    r, s = compiled.run("f", [x, z])
    want = INTEGER_ROUNDING[op](x)
    assert_same_bits(r, want)
    assert_same_bits(s, want + z)


@pytest.mark.parametrize("op", sorted(INTEGER_ROUNDING))
def test_integer_rounding_of_subnormals(op: str) -> None:
    """ceil(1e-40) is 1 and floor(-1e-40) is -1: on the GPU tl.floor and tl.ceil see
    0.0 there (libdevice, which Triton builds flushing subnormals; seen on an H100),
    so f32 floor and ceil are made of adds, compares and selects."""
    text = one_op(op, [((4,), "f32")], ((4,), "f32"))
    module, compiled = compile_text(text)
    x = torch.tensor([1e-40, -1e-40, 1e-44, -1e-44], device=DEVICE)
    (got,) = compiled.run("f", [x])
    assert_same_bits(got, INTEGER_ROUNDING[op](x))


@pytest.mark.parametrize("el", FLOATS)
def test_round_takes_halves_to_even_in_a_fused_chain(el: str) -> None:
    """round(x * 0.5) for whole x: every odd x makes a tie, computed in the kernel."""
    t = ty((17,), el)
    text = func_text(
        "f",
        [("x", (17,), el)],
        [
            f"%h = graph.constant {{value = 0.5}} : {ty((), el)}",
            f"%m = graph.mul %x, %h : {t}",
            f"%r = graph.round %m : {t}",
            f"%f = graph.floor %m : {t}",
            f"%c = graph.ceil %m : {t}",
            f"%e = graph.erf %m : {t}",
        ],
        [("r", (17,), el), ("f", (17,), el), ("c", (17,), el), ("e", (17,), el)],
    )
    module = irc.parse(text, "test.ir")
    irc.verify(module)
    compiled = irc.compile(module, device=DEVICE, fuse=True)
    assert compiled.kernel_count == 1
    x = torch.arange(-8, 9, dtype=DTYPES[el], device=DEVICE)
    r, f, c, e = compiled.run("f", [x])
    m = x * 0.5
    assert_same_bits(r, torch.round(m))
    assert r.tolist()[5:12] == [-2.0, -1.0, -0.0, 0.0, 0.0, 1.0, 2.0]  # -1.5 .. 1.5, ties to even
    assert_same_bits(f, torch.floor(m))
    assert_same_bits(c, torch.ceil(m))
    assert_close(e, torch.erf(m))


# --- binary, with broadcasting ------------------------------------------------------------

BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
}
BROADCASTS: list[tuple[Shape, Shape]] = [
    ((37, 300), (37, 300)),
    ((37, 300), (300,)),
    ((37, 1), (1, 300)),
    ((5, 1, 130), (7, 1)),
    ((2, 3, 5, 7), ()),
    ((), (3, 1, 4, 1)),
    ((3, 1, 4, 1), (1, 5, 1, 6)),
    ((), ()),
    ((1001,), (1,)),
]


def broadcast_shape(a: Shape, b: Shape) -> Shape:
    return tuple(torch.broadcast_shapes(a, b))


@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcasting(op: str, shapes: tuple[Shape, Shape]) -> None:
    a, b = shapes
    out = broadcast_shape(a, b)
    prepare = (lambda x, y: [positive(x), y]) if op == "pow" else None
    check(one_op(op, [(a, "f32"), (b, "f32")], (out, "f32")), BINARY[op], prepare, kernels=1)


@pytest.mark.parametrize("el", ["f16", "bf16", "f64", "i32", "i64"])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_dtypes(op: str, el: str) -> None:
    if el.startswith("i") and op in ("div", "pow"):
        # Float-only ops: the verifier rejects them on integers.
        with pytest.raises(irc.IrcError):
            compile_text(one_op(op, [((4,), el), ((4,), el)], ((4,), el)))
        return
    prepare = (lambda x, y: [positive(x), y]) if op == "pow" else None
    check(one_op(op, [((5, 37), el), ((37,), el)], ((5, 37), el)), BINARY[op], prepare)


def test_pow_integer_exponents_of_negative_bases() -> None:
    # x ** 2 and x ** 3 for negative x: the sign rule of the pow helper.
    text = func_text(
        "f",
        [("x", (37, 3), "f32")],
        [
            "%two = graph.constant {value = 2.0} : tensor<f32>",
            "%three = graph.constant {value = 3.0} : tensor<3xf32>",
            "%half = graph.constant {value = 0.5} : tensor<f32>",
            "%sq = graph.pow %x, %two : tensor<37x3xf32>",
            "%cu = graph.pow %x, %three : tensor<37x3xf32>",
            "%rt = graph.pow %x, %half : tensor<37x3xf32>",
        ],
        [("sq", (37, 3), "f32"), ("cu", (37, 3), "f32"), ("rt", (37, 3), "f32")],
    )
    check(text, lambda x: (x**2, x**3, x**0.5), equal_nan=True)


# --- comparisons and where ------------------------------------------------------------------

COMPARE: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
}


def share_values(x: Tensor, y: Tensor) -> list[Tensor]:
    """Makes about half of `x` equal to `y` (broadcast), so eq/le/ge see ties."""
    yb = y.expand_as(x) if y.dim() <= x.dim() else y
    if yb.shape != x.shape:
        return [x, y]
    pick = torch.arange(x.numel(), device=x.device).reshape(x.shape) % 2 == 0
    return [torch.where(pick, yb, x), y]


@pytest.mark.parametrize("el", ["f32", "f16", "bf16", "f64", "i32", "i64"])
@pytest.mark.parametrize("op", sorted(COMPARE))
def test_compare(op: str, el: str) -> None:
    a, b = ((5, 37, 3), (37, 1)) if el != "i64" else ((1001,), ())
    out = broadcast_shape(a, b)
    check(one_op(op, [(a, el), (b, el)], (out, "i1")), COMPARE[op], share_values, kernels=1)


def test_compare_booleans() -> None:
    check(one_op("eq", [((37, 3), "i1"), ((3,), "i1")], ((37, 3), "i1")), torch.eq)


@pytest.mark.parametrize(
    "shapes",
    [
        ((37, 300), (37, 300), (37, 300)),
        ((37, 1), (37, 300), ()),
        ((), (5, 7, 13), (7, 1)),
        ((2, 1, 5, 1), (3, 1, 4), (1, 1, 1, 4)),
    ],
    ids=str,
)
@pytest.mark.parametrize("el", ["f32", "f16", "i32", "i1"])
def test_where(el: str, shapes: tuple[Shape, Shape, Shape]) -> None:
    c, a, b = shapes
    out = tuple(torch.broadcast_shapes(c, a, b))
    check(one_op("where", [(c, "i1"), (a, el), (b, el)], (out, el)), torch.where, kernels=1)


# --- cast -------------------------------------------------------------------------------

CAST_TYPES = ("f32", "f16", "bf16", "f64", "i64", "i32", "i1")


@pytest.mark.parametrize("dst", CAST_TYPES)
@pytest.mark.parametrize("src", CAST_TYPES)
def test_cast(src: str, dst: str) -> None:
    shape = (5, 7, 13)

    def prepare(x: Tensor) -> list[Tensor]:
        # Floats spread over several integers (and keep a fraction); some exact zeros
        # so that a cast to i1 sees both values.
        if x.dtype.is_floating_point:
            x = x * 4
            x.view(-1)[::5] = 0
        return [x]

    check(one_op("cast", [(shape, src)], (shape, dst)), lambda x: x.to(DTYPES[dst]), prepare)


def test_cast_rounds_to_half_between_ops() -> None:
    # f32 -> f16 -> f32 must round to half precision, even though irc computes in f32.
    text = func_text(
        "f",
        [("x", (37, 30), "f32")],
        [
            "%h = graph.cast %x : tensor<37x30xf16>",
            "%y = graph.cast %h : tensor<37x30xf32>",
            "%d = graph.sub %x, %y : tensor<37x30xf32>",
        ],
        [("d", (37, 30), "f32")],
    )
    (d,) = check(text, lambda x: x - x.half().float())
    assert bool((d != 0).any())


# --- constants ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, shape, el",
    [
        ("2.5", (), "f32"),
        ("-1.5", (3, 5), "f32"),
        ("0.1", (37,), "f16"),
        ("0.1", (2, 3), "bf16"),
        ("1.0e-5", (4,), "f64"),
        ("-7", (4, 3), "i64"),
        ("2147483647", (3,), "i32"),
        ("true", (2, 3), "i1"),
        ("false", (), "i1"),
        ("-inf", (5,), "f32"),
    ],
    ids=str,
)
def test_constant_returned(value: str, shape: Shape, el: str) -> None:
    text = func_text(
        "f", [], [f"%c = graph.constant {{value = {value}}} : {ty(shape, el)}"], [("c", shape, el)]
    )
    number = {"true": True, "false": False}.get(value, None)
    if number is None:
        number = float(value) if el in FLOATS else int(value)
    check(text, lambda: torch.full(shape, number, dtype=DTYPES[el], device=DEVICE))


@pytest.mark.parametrize("el", ["f32", "f16", "i32", "i64"])
def test_constant_operand(el: str) -> None:
    value = "3" if el.startswith("i") else "0.7"
    text = func_text(
        "f",
        [("x", (37, 31), el)],
        [
            f"%c = graph.constant {{value = {value}}} : {ty((), el)}",
            f"%k = graph.constant {{value = {value}}} : {ty((31,), el)}",
            f"%y = graph.mul %x, %c : {ty((37, 31), el)}",
            f"%z = graph.add %y, %k : {ty((37, 31), el)}",
        ],
        [("z", (37, 31), el)],
    )
    c = (
        torch.tensor(float(value), dtype=DTYPES[el], device=DEVICE)
        if not el.startswith("i")
        else int(value)
    )
    # Constants are splats read in place: no kernel computes them.
    check(text, lambda x: x * c + c, kernels=2)


# --- reductions -----------------------------------------------------------------------------

REDUCE: dict[str, Callable[..., Tensor]] = {
    "reduce_sum": lambda x, dims, keep: torch.sum(x, dim=dims, keepdim=keep, dtype=x.dtype),
    "reduce_mean": lambda x, dims, keep: torch.mean(x, dim=dims, keepdim=keep),
    "reduce_max": lambda x, dims, keep: torch.amax(x, dim=dims, keepdim=keep),
    "reduce_min": lambda x, dims, keep: torch.amin(x, dim=dims, keepdim=keep),
}
REDUCTIONS: list[tuple[Shape, list[int]]] = [
    ((37, 300), [1]),  # inner dim, rows not a multiple of the row block
    ((37, 300), [0]),  # outer dim
    ((37, 300), [-1]),
    ((5, 7, 130), [0, 2]),  # several dims, not adjacent
    ((5, 7, 130), [1]),  # a middle dim
    ((5, 7, 130), [1, 2]),
    ((2, 3, 5, 7), [0, 1, 2, 3]),  # everything to a scalar
    ((2, 3, 5, 7), [3, 1]),
    ((1001,), [0]),
    ((3,), [0]),
    ((1,), [0]),
    ((1, 1), [1]),
    ((3, 5000), [1]),  # a long row, still held whole in registers
    ((3, 10000), [1]),  # rows longer than the persistent block: a looped reduction
    ((6001,), [0]),
    ((10001,), [0]),
    ((9000, 3), [0]),  # a looped reduction over the outer dim
]


def reduced_shape(shape: Shape, dims: list[int], keep: bool) -> Shape:
    norm = {d % len(shape) for d in dims}
    if keep:
        return tuple(1 if i in norm else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in norm)


def reduce_text(op: str, shape: Shape, dims: list[int], keep: bool, el: str) -> str:
    out = reduced_shape(shape, dims, keep)
    attrs = f"dims = {dims}, keepdim = {'true' if keep else 'false'}"
    return one_op(op, [(shape, el)], (out, el), attrs)


@pytest.mark.parametrize("keep", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("case", REDUCTIONS, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce(op: str, case: tuple[Shape, list[int]], keep: bool) -> None:
    shape, dims = case
    check(
        reduce_text(op, shape, dims, keep, "f32"),
        lambda x: REDUCE[op](x, dims, keep),
        kernels=1,
    )


@pytest.mark.parametrize("el", ["f16", "bf16", "f64", "i32", "i64"])
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce_dtypes(op: str, el: str) -> None:
    if op == "reduce_mean" and el.startswith("i"):
        return  # float only (the verifier's rule, tested with the graph level)
    shape, dims = (37, 130), [1]
    check(reduce_text(op, shape, dims, False, el), lambda x: REDUCE[op](x, dims, False))
    check(reduce_text(op, (3, 10000), [1, 0], True, el), lambda x: REDUCE[op](x, [1, 0], True))


def test_reduce_keepdim_default_is_false() -> None:
    text = func_text(
        "f",
        [("x", (37, 300), "f32")],
        ["%s = graph.reduce_sum %x {dims = [1]} : tensor<37xf32>"],
        [("s", (37,), "f32")],
    )
    check(text, lambda x: x.sum(1))


@pytest.mark.parametrize("op", ["reduce_max", "reduce_sum"])
@pytest.mark.parametrize(
    "case",
    [
        ((37, 300), [1]),
        ((5, 7, 130), [0, 2]),
        ((3, 5000), [1]),
        ((3, 10000), [1]),
        ((9000, 3), [0]),
    ],
    ids=str,
)
def test_masked_reduction_identity(op: str, case: tuple[Shape, list[int]]) -> None:
    """All values negative: a masked lane that wrongly contributes 0 would show in max."""
    shape, dims = case

    def prepare(x: Tensor) -> list[Tensor]:
        return [-(x.abs() + 1.0)]

    check(reduce_text(op, shape, dims, False, "f32"), lambda x: REDUCE[op](x, dims, False), prepare)


def test_masked_min_of_positive_values() -> None:
    check(
        reduce_text("reduce_min", (37, 300), [1], True, "f32"),
        lambda x: x.amin(1, keepdim=True),
        lambda x: [x.abs() + 1.0],
    )
    check(
        reduce_text("reduce_min", (3, 10000), [1], True, "f32"),
        lambda x: x.amin(1, keepdim=True),
        lambda x: [x.abs() + 1.0],
    )


def test_integer_max_of_negative_values() -> None:
    check(
        reduce_text("reduce_max", (37, 300), [1], False, "i32"),
        lambda x: x.amax(1),
        lambda x: [-(x.abs() + 1)],
    )
    check(
        reduce_text("reduce_min", (3, 10000), [1], False, "i64"),
        lambda x: x.amin(1),
        lambda x: [x.abs() + 1],
    )


# --- numerics: NaN and half-precision accumulation ------------------------------------


def with_nans(*xs: Tensor) -> list[Tensor]:
    out = []
    for x in xs:
        x = x.clone()
        flat = x.view(-1)
        flat[:: max(1, flat.numel() // 7)] = math.nan
        out.append(x)
    return out


@pytest.mark.parametrize("el", ["f32", "f16"])
def test_nan_propagates_through_relu(el: str) -> None:
    (y,) = check(
        one_op("relu", [((37, 30), el)], ((37, 30), el)), torch.relu, with_nans, equal_nan=True
    )
    assert bool(y.isnan().any())


@pytest.mark.parametrize("el", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_nan_propagates_through_maximum_minimum(op: str, el: str) -> None:
    def prepare(x: Tensor, y: Tensor) -> list[Tensor]:
        # NaN in the first operand at some places, in the second at others.
        x, y = x.clone(), y.clone()
        x.view(-1)[::11] = math.nan
        y.view(-1)[5::13] = math.nan
        return [x, y]

    (r,) = check(
        one_op(op, [((37, 30), el), ((37, 30), el)], ((37, 30), el)),
        BINARY[op],
        prepare,
        equal_nan=True,
    )
    assert int(r.isnan().sum()) > 0


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize(
    "case", [((37, 300), [1]), ((3, 10000), [1]), ((9000, 3), [0]), ((1001,), [0])], ids=str
)
def test_nan_propagates_through_reductions(op: str, case: tuple[Shape, list[int]]) -> None:
    shape, dims = case

    def prepare(x: Tensor) -> list[Tensor]:
        x = x.clone()
        # One NaN in some rows only (and one at the very end of a ragged row).
        x.view(-1)[7] = math.nan
        x.view(-1)[-1] = math.nan
        return [x]

    (r,) = check(
        reduce_text(op, shape, dims, False, "f32"),
        lambda x: REDUCE[op](x, dims, False),
        prepare,
        equal_nan=True,
    )
    assert bool(r.isnan().any()) and (r.numel() == 1 or not bool(r.isnan().all()))


@pytest.mark.parametrize("el", ["f16", "bf16"])
def test_half_mean_accumulates_in_f32(el: str) -> None:
    """16384 values near 8.5 sum past the f16 maximum (65504): an f16 accumulator gives inf."""

    def prepare(x: Tensor) -> list[Tensor]:
        return [(8.5 + 0.01 * x.float()).to(x.dtype)]

    text = func_text(
        "f",
        [("x", (16384,), el), ("y", (2, 16384), el)],
        [
            f"%m = graph.reduce_mean %x {{dims = [0]}} : {ty((), el)}",
            f"%r = graph.reduce_mean %y {{dims = [1], keepdim = true}} : {ty((2, 1), el)}",
            f"%s = graph.reduce_sum %y {{dims = [1]}} : {ty((2,), el)}",
        ],
        [("m", (), el), ("r", (2, 1), el), ("s", (2,), el)],
    )

    def expected(x: Tensor, y: Tensor) -> tuple[Tensor, ...]:
        return (x.mean(), y.mean(1, keepdim=True), y.float().sum(1).to(y.dtype))

    m, r, s = check(text, expected, lambda x, y: prepare(x) + prepare(y))
    assert bool(m.isfinite()) and bool(r.isfinite().all())
    assert abs(float(m) - 8.5) < 0.05
    if el == "f16":
        assert bool(s.isinf().all())  # the true sum (~139264) is past f16's range


def test_half_sum_matches_f32_accumulation() -> None:
    # 4000 f16 values: summing in f16 would drift by many ulps.
    def prepare(x: Tensor) -> list[Tensor]:
        return [(1.0 + 0.01 * x.float()).half()]

    check(
        reduce_text("reduce_sum", (3, 4000), [1], False, "f16"),
        lambda x: x.float().sum(1).half(),
        prepare,
    )


@pytest.mark.parametrize(
    "op, el",
    [("reduce_sum", "f32"), ("reduce_max", "f32"), ("reduce_min", "i32"), ("reduce_mean", "f16"),
     ("reduce_sum", "bf16")],
)  # fmt: skip
def test_large_full_reduction(op: str, el: str) -> None:
    """73728 elements to a scalar: split into partial reductions and a final one."""
    shape = (2, 3, 128, 96)

    def prepare(x: Tensor) -> list[Tensor]:
        if op == "reduce_max":
            return [-(x.abs() + 1.0)]  # and the partials' masked identity must not be 0
        if el in ("f16", "bf16"):
            return [(8.5 + 0.01 * x.float()).to(x.dtype)]
        return [x]

    def expected(x: Tensor) -> Tensor:
        if el in ("f16", "bf16"):
            r = x.float().mean() if op == "reduce_mean" else x.float().sum()
            return r.to(x.dtype)
        return REDUCE[op](x, [0, 1, 2, 3], False)

    check(reduce_text(op, shape, [0, 1, 2, 3], False, el), expected)


# --- matmul -----------------------------------------------------------------------------

MATMULS: list[tuple[Shape, Shape]] = [
    ((37, 29), (29, 45)),
    ((1, 1), (1, 1)),
    ((37, 1), (1, 45)),  # K = 1: the operands are broadcast along K
    ((1, 29), (29, 1)),
    ((5, 130), (130, 3)),
    ((70, 33), (33, 65)),  # more than one 64x64 output tile, ragged
    ((3, 17, 33), (3, 33, 9)),
    ((1, 5, 7), (1, 7, 2)),
    ((4, 64, 32), (4, 32, 16)),  # block multiples: no masks at all
]


@pytest.mark.parametrize("el", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("shapes", MATMULS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul(shapes: tuple[Shape, Shape], el: str) -> None:
    a, b = shapes
    out = (*a[:-1], b[-1])
    check(one_op("matmul", [(a, el), (b, el)], (out, el)), torch.matmul, kernels=1)


def test_matmul_f32_is_to_f32_accuracy() -> None:
    """f32 dots are three TF32 products of split operands (`_irc_dot_split_tf32`: f32's
    accuracy, torch's default, on tensor cores), half ones plain dots."""

    def dots(el: str) -> list[str]:
        text = one_op("matmul", [((37, 29), el), ((29, 45), el)], ((37, 45), el))
        kernels = "\n".join(kernel_sources(emit_triton(text)).values())
        return re.findall(r"(?:tl\.dot|_irc_dot\w*)\(.*\)", kernels)

    f32 = dots("f32")
    assert f32 and all(d.startswith("_irc_dot_split_tf32(") for d in f32)
    f16 = dots("f16")
    assert f16 and not any("tf32" in d or "ieee" in d for d in f16)
    # Values whose low mantissa bits matter (tf32 keeps 10): on a GPU a single tf32 dot
    # fails this (the CPU interpreter computes f32 dots in full precision whatever is asked).
    text = one_op("matmul", [((16, 16), "f32"), ((16, 16), "f32")], ((16, 16), "f32"))

    def prepare(a: Tensor, b: Tensor) -> list[Tensor]:
        return [1.0 + a * 2.0**-12, 1.0 + b * 2.0**-12]

    check(text, torch.matmul, prepare)


def test_matmul_epilogue_unfused() -> None:
    text = func_text(
        "f",
        [("x", (37, 29), "f16"), ("w", (29, 45), "f16"), ("b", (45,), "f16")],
        [
            "%0 = graph.matmul %x, %w : tensor<37x45xf16>",
            "%1 = graph.add %0, %b : tensor<37x45xf16>",
            "%2 = graph.relu %1 : tensor<37x45xf16>",
        ],
        [("2", (37, 45), "f16")],
    )
    check(text, lambda x, w, b: torch.relu(x @ w + b), kernels=3)


# --- layout ops: transpose, reshape, broadcast --------------------------------------------


@pytest.mark.parametrize(
    "shape, perm",
    [
        ((37, 300), [1, 0]),
        ((5, 7, 130), [2, 0, 1]),
        ((5, 7, 130), [0, 2, 1]),
        ((2, 3, 5, 7), [3, 1, 0, 2]),
        ((1, 37), [1, 0]),
        ((3,), [0]),
    ],
    ids=str,
)
def test_transpose(shape: Shape, perm: list[int]) -> None:
    out = tuple(shape[p] for p in perm)
    # Returned as it is: one copy kernel.
    check(
        one_op("transpose", [(shape, "f32")], (out, "f32"), f"perm = {perm}"),
        lambda x: x.permute(perm),
        kernels=1,
    )


def test_transpose_is_a_view() -> None:
    text = func_text(
        "f",
        [("x", (37, 300), "f32"), ("y", (300, 37), "f32")],
        [
            "%t = graph.transpose %x {perm = [1, 0]} : tensor<300x37xf32>",
            "%s = graph.add %t, %y : tensor<300x37xf32>",
        ],
        [("s", (300, 37), "f32")],
    )
    check(text, lambda x, y: x.t() + y, kernels=1)  # no copy kernel for the transpose


@pytest.mark.parametrize(
    "src, dst",
    [
        ((37, 300), (300, 37)),
        ((37, 300), (11100,)),
        ((5, 7, 130), (35, 130)),
        ((5, 7, 130), (7, 5, 2, 65)),
        ((2, 3, 5, 7), (6, 35)),
        ((1,), ()),
        ((), (1, 1)),
        ((1001,), (7, 143)),
    ],
    ids=str,
)
def test_reshape(src: Shape, dst: Shape) -> None:
    check(one_op("reshape", [(src, "f32")], (dst, "f32")), lambda x: x.reshape(dst), kernels=1)


def test_reshape_of_transposed_value() -> None:
    text = func_text(
        "f",
        [("x", (37, 30), "f32"), ("y", (10, 3, 37), "f32")],
        [
            "%t = graph.transpose %x {perm = [1, 0]} : tensor<30x37xf32>",
            "%r = graph.reshape %t : tensor<10x3x37xf32>",
            "%s = graph.sub %r, %y : tensor<10x3x37xf32>",
            "%f = graph.reshape %t : tensor<1110xf32>",
        ],
        [("s", (10, 3, 37), "f32"), ("f", (1110,), "f32")],
    )
    check(text, lambda x, y: (x.t().reshape(10, 3, 37) - y, x.t().reshape(1110)))


def test_transpose_of_reshaped_value() -> None:
    text = func_text(
        "f",
        [("x", (1110,), "f32")],
        [
            "%r = graph.reshape %x : tensor<30x37xf32>",
            "%t = graph.transpose %r {perm = [1, 0]} : tensor<37x30xf32>",
            "%e = graph.exp %t : tensor<37x30xf32>",
        ],
        [("e", (37, 30), "f32")],
    )
    check(text, lambda x: x.reshape(30, 37).t().exp(), kernels=1)


@pytest.mark.parametrize(
    "src, dst",
    [
        ((300,), (37, 300)),
        ((5, 1, 130), (5, 7, 130)),
        ((), (2, 3)),
        ((1,), (1001,)),
        ((3, 1), (2, 3, 4)),
        ((1, 1), (1, 1)),
    ],
    ids=str,
)
def test_broadcast(src: Shape, dst: Shape) -> None:
    check(one_op("broadcast", [(src, "f32")], (dst, "f32")), lambda x: x.expand(dst), kernels=1)


def test_broadcast_then_compute_is_a_view() -> None:
    text = func_text(
        "f",
        [("x", (37, 1), "i32"), ("y", (37, 300), "i32")],
        [
            "%b = graph.broadcast %x : tensor<37x300xi32>",
            "%s = graph.mul %b, %y : tensor<37x300xi32>",
        ],
        [("s", (37, 300), "i32")],
    )
    check(text, lambda x, y: x * y, kernels=1)


# --- composites ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dim, el",
    [((37, 300), 1, "f32"), ((37, 300), 0, "f32"), ((5, 7, 130), -1, "f32"), ((3, 5000), 1, "f32"),
     ((5, 7, 130), 1, "f64"), ((37, 300), 1, "bf16"), ((3, 5000), 1, "f16")],
    ids=str,
)  # fmt: skip
def test_softmax(shape: Shape, dim: int, el: str) -> None:
    # Half precision: decomposed in f32 and rounded once, like torch's softmax.
    check(
        one_op("softmax", [(shape, el)], (shape, el), f"dim = {dim}"),
        lambda x: torch.softmax(x, dim),
    )


@pytest.mark.parametrize(
    "shape, dims, el",
    [((37, 300), [1], "f32"), ((5, 7, 130), [1, 2], "f32"), ((5, 7, 130), [2], "f32"),
     ((3, 5000), [1], "f32"), ((1001,), [0], "f32"), ((37, 300), [1], "f16"), ((5, 7, 130), [-1], "bf16")],
    ids=str,
)  # fmt: skip
def test_layer_norm(shape: Shape, dims: list[int], el: str) -> None:
    norm = tuple(shape[d] for d in dims)
    text = one_op(
        "layer_norm",
        [(shape, el), (norm, el), (norm, el)],
        (shape, el),
        f"dims = {dims}, eps = 1.0e-5",
    )
    check(text, lambda x, w, b: F.layer_norm(x, norm, w, b, eps=1e-5))


# --- non-contiguous inputs ------------------------------------------------------------------


def test_transposed_torch_input() -> None:
    # The function takes a 300x37 tensor; we pass x.t() of a 37x300 one (strides 1, 300).
    module, compiled = compile_text(one_op("exp", [((300, 37), "f32")], ((300, 37), "f32")))
    (x,) = inputs_for(module)
    base = x.reshape(37, 300).clone()
    xt = base.t()
    assert not xt.is_contiguous()
    (y,) = compiled.run("f", [xt])
    assert_close(y, xt.exp())


def test_non_contiguous_inputs_of_every_kind() -> None:
    text = func_text(
        "f",
        [
            ("a", (37, 30), "f32"),
            ("b", (37, 30), "f32"),
            ("c", (37, 30), "f32"),
            ("d", (5, 30, 37), "f32"),
        ],
        [
            "%ab = graph.add %a, %b : tensor<37x30xf32>",
            "%abc = graph.mul %ab, %c : tensor<37x30xf32>",
            "%t = graph.transpose %d {perm = [0, 2, 1]} : tensor<5x37x30xf32>",
            "%s = graph.reduce_sum %t {dims = [0]} : tensor<37x30xf32>",
            "%o = graph.sub %abc, %s : tensor<37x30xf32>",
        ],
        [("o", (37, 30), "f32")],
    )
    module, compiled = compile_text(text)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(30, 37, generator=g).to(DEVICE).t()  # transposed
    b = torch.randn(37, 60, generator=g).to(DEVICE)[:, ::2]  # strided columns
    c = torch.randn(1, 30, generator=g).to(DEVICE).expand(37, 30)  # stride 0
    d = torch.randn(37, 5, 30, generator=g).to(DEVICE).permute(1, 2, 0)  # rank 3, permuted
    assert not any(x.is_contiguous() for x in (a, b, c, d))
    (o,) = compiled.run("f", [a, b, c, d])
    assert_close(o, (a + b) * c - d.transpose(1, 2).sum(0))


def test_non_contiguous_matmul_operands() -> None:
    module, compiled = compile_text(
        one_op("matmul", [((37, 29), "f32"), ((29, 45), "f32")], ((37, 45), "f32"))
    )
    g = torch.Generator().manual_seed(2)
    a = torch.randn(29, 37, generator=g).to(DEVICE).t()
    b = torch.randn(45, 29, generator=g).to(DEVICE).t()
    (c,) = compiled.run("f", [a, b])
    assert_close(c, a @ b)


def test_wrong_argument_is_rejected() -> None:
    module, compiled = compile_text(one_op("exp", [((37, 30), "f32")], ((37, 30), "f32")))
    with pytest.raises(ValueError, match="shape"):
        compiled.run("f", [torch.randn(30, 37, device=DEVICE)])
    with pytest.raises(ValueError, match="float"):
        compiled.run("f", [torch.randn(37, 30, dtype=torch.float64, device=DEVICE)])


# --- several results, several functions, odd names ------------------------------------------


def test_several_results_and_functions() -> None:
    text = func_text(
        "f",
        [("x", (37, 30), "f32")],
        [
            "%m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<37x1xf32>",
            "%t = graph.transpose %x {perm = [1, 0]} : tensor<30x37xf32>",
            "%c = graph.constant {value = 4.0} : tensor<f32>",
        ],
        [("m", (37, 1), "f32"), ("t", (30, 37), "f32"), ("x", (37, 30), "f32"), ("c", (), "f32")],
    ) + func_text("g", [("s", (), "f32")], ["%n = graph.neg %s : tensor<f32>"], [("n", (), "f32")])
    module, compiled = compile_text(text)
    (x,) = inputs_for(module, "f")
    m, t, same, c = compiled["f"](x)
    assert_close(m, x.amax(1, keepdim=True))
    assert_close(t, x.t().contiguous())
    assert t.is_contiguous()
    assert_close(same, x)
    assert_close(c, torch.tensor(4.0, device=DEVICE))
    (s,) = inputs_for(module, "g")
    assert_close(compiled.g(s), -s)


ODD_NAMES = """\
module {
  func @import(%class: tensor<37x3xf32>, %x.y: tensor<3xf32>, %def-1: tensor<f32>) -> (tensor<37x3xf32>, tensor<f32>) {
    %lambda = graph.add %class, %x.y : tensor<37x3xf32>
    %None = graph.mul %lambda, %def-1 : tensor<37x3xf32>
    %for$ = graph.reduce_sum %None {dims = [0, 1]} : tensor<f32>
    %1 = graph.exp %for$ : tensor<f32>
    return %None, %1 : tensor<37x3xf32>, tensor<f32>
  }
  func @class(%return: tensor<5xf32>) -> tensor<5xf32> {
    %def = graph.neg %return : tensor<5xf32>
    return %def : tensor<5xf32>
  }
  func @def-1(%a.b.c: tensor<f32>) -> tensor<f32> {
    %x-y = graph.relu %a.b.c : tensor<f32>
    return %x-y : tensor<f32>
  }
}
"""


def test_odd_identifiers_compile_and_run() -> None:
    module, compiled = compile_text(ODD_NAMES)
    assert sorted(compiled.functions) == ["class", "def-1", "import"]
    x, xy, d = inputs_for(module, "import")
    out, total = compiled["import"](x, xy, d)
    assert_close(out, (x + xy) * d)
    assert_close(total, ((x + xy) * d).sum().exp())
    (r,) = inputs_for(module, "class")
    assert_close(compiled["class"](r), -r)
    (s,) = inputs_for(module, "def-1")
    assert_close(compiled["def-1"](s), torch.relu(s))
    # IR names never become Python identifiers: the module defines no `import`, `class`...
    source = compiled.source
    for bad in ("def import", "def class", "def def-1", "x.y =", "class =", "def-1 ="):
        assert bad not in source
    compile(source, "generated.py", "exec")  # noqa: S102 - syntax check of generated code


# --- large tensors: int64 indices (structural, not run) --------------------------------------


def kernel_sources(source: str) -> dict[str, str]:
    """Kernel name -> its source, for the `@triton.jit def triton_...` functions."""
    parts = re.split(r"@triton\.jit\n", source)
    out: dict[str, str] = {}
    for p in parts:
        m = re.match(r"def (triton_\w+)\(", p)
        if m:
            out[m.group(1)] = p.split("\n\n\n")[0]
    return out


BIG = 2**31 + 1


@pytest.mark.parametrize(
    "text",
    [
        one_op("exp", [((BIG,), "f32")], ((BIG,), "f32")),
        one_op("add", [((65536, 32769), "f16"), ((32769,), "f16")], ((65536, 32769), "f16")),
        reduce_text("reduce_sum", (32769, 65536), [1], False, "f32"),
        reduce_text("reduce_max", (65537, 32768), [0], False, "f32"),
        one_op("matmul", [((46341, 64), "f16"), ((64, 46341), "f16")], ((46341, 46341), "f16")),
        one_op("transpose", [((65536, 32769), "f32")], ((32769, 65536), "f32"), "perm = [1, 0]"),
    ],
    ids=["pointwise", "broadcast", "reduce-inner", "reduce-outer", "matmul", "transpose"],
)
def test_large_tensors_index_in_int64(text: str) -> None:
    kernels = kernel_sources(emit_triton(text))
    # A split reduction's second stage reads only the small partials buffer: a
    # kernel whose every buffer fits int32 indexes in int32 throughout.
    wide = {name: src for name, src in kernels.items() if "tl.int64" in src}
    assert wide
    for name, src in wide.items():
        # Program ids (or a persistent kernel's tile indices) and aranges are widened
        # before any offset arithmetic.
        pids = re.findall(r"(v\d+) = tl\.program_id\(\d\)", src)
        pids += re.findall(r"for (v\d+) in tl\.range\(tl\.program_id", src)
        pids += re.findall(r"(v\d+) = tl\.program_id\(0\) - tl\.num_programs", src)
        assert pids, name
        for pid in pids:
            if len(re.findall(rf"\b{pid}\b", src)) == 1:
                continue  # a tile index the kernel does not read (its twin places the tiles)
            assert re.search(rf"= {pid}\.to\(tl\.int64\)", src), (name, pid)
        for r in re.findall(r"(v\d+) = tl\.arange\(0, \d+\)", src):
            assert re.search(rf"= {r}\.to\(tl\.int64\)", src), (name, r)


def test_small_tensors_index_in_int32() -> None:
    (src,) = kernel_sources(
        emit_triton(one_op("exp", [((1001,), "f32")], ((1001,), "f32")))
    ).values()
    assert "int64" not in src
