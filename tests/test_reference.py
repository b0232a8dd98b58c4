"""The PyTorch reference interpreter: every spec op against a direct torch computation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from irc.analysis.verifier import verify
from irc.dialects import graph
from irc.ir.types import ELEMENT_TYPES, SCALAR_TYPES
from irc.syntax.parser import op_classes, parse
from irc.testing.reference import (
    EVALUATORS,
    EvaluationError,
    ReferenceInterpreterError,
    ResultMismatchError,
    UnsupportedOpError,
    element_type_of,
    estimate_peak_bytes,
    functions,
    random_inputs,
    random_tensor,
    run,
    run_function,
    torch_dtype,
    value_bytes,
)

DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i64": torch.int64,
    "i32": torch.int32,
    "i1": torch.bool,
}


def op_class(name: str) -> type[Operation]:
    """A graph op class by name (via the front end's table, like the parser)."""
    return op_classes()[f"graph.{name}"]


def module(text: str) -> ModuleOp:
    m = parse(text, "test.ir")
    verify(m)
    return m


def only_fn(text: str) -> func.FuncOp:
    (fn,) = functions(module(text)).values()
    return fn


def ty(shape: tuple[int, ...], el: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + el + ">"


def one_op(
    op: str,
    operands: list[tuple[tuple[int, ...], str]],
    result: tuple[tuple[int, ...], str],
    attrs: str = "",
) -> func.FuncOp:
    """`func @f(args) { %r = graph.OP args {attrs} : T; return %r }`."""
    args = ", ".join(f"%a{i}: {ty(s, e)}" for i, (s, e) in enumerate(operands))
    names = ", ".join(f"%a{i}" for i in range(len(operands)))
    rt = ty(*result)
    body = f"graph.{op} {names}".rstrip() + (f" {{{attrs}}}" if attrs else "")
    return only_fn(
        f"func @f({args}) -> {rt} {{\n  %r = {body} : {rt}\n  return %r : {rt}\n}}\n"
    )


def check(fn: func.FuncOp, expected: Callable[..., torch.Tensor], seed: int = 0) -> None:
    inputs = random_inputs(fn, seed)
    (got,) = run_function(fn, inputs)
    want = expected(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_close(got, want, equal_nan=True, rtol=0, atol=0)


# --- dtypes ---------------------------------------------------------------------------


def test_torch_dtype_round_trip() -> None:
    for name, dtype in DTYPES.items():
        assert torch_dtype(ELEMENT_TYPES[name]) == dtype
        assert element_type_of(dtype) == ELEMENT_TYPES[name]
    with pytest.raises(ValueError):
        torch_dtype(SCALAR_TYPES["index"])
    with pytest.raises(ValueError):
        element_type_of(torch.complex64)


# --- element-wise ---------------------------------------------------------------------

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
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


def test_every_unary_op_is_checked() -> None:
    assert set(UNARY) == {op.FN for op in graph.UNARY_OPS}


@pytest.mark.parametrize("el", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op: str, el: str) -> None:
    fn = one_op(op, [((3, 5), el)], ((3, 5), el))
    check(fn, UNARY[op])


@pytest.mark.parametrize("el", ["i32", "i64"])
@pytest.mark.parametrize("op", ["neg", "abs", "relu"])
def test_unary_int(op: str, el: str) -> None:
    check(one_op(op, [((7,), el)], ((7,), el)), UNARY[op])


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_rank0(op: str) -> None:
    check(one_op(op, [((), "f32")], ((), "f32")), UNARY[op])


def test_gelu_is_exact_not_tanh() -> None:
    fn = one_op("gelu", [((64,), "f32")], ((64,), "f32"))
    x = torch.linspace(-4, 4, 64)
    (got,) = run_function(fn, [x])
    assert_close(got, 0.5 * x * (1 + torch.erf(x / 2**0.5)))
    assert not torch.equal(got, F.gelu(x, approximate="tanh"))


BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
}
COMPARE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
}
SHAPE_PAIRS = [
    ((3, 4), (3, 4), (3, 4)),
    ((3, 4), (4,), (3, 4)),
    ((2, 1, 4), (3, 1), (2, 3, 4)),
    ((), (3, 4), (3, 4)),
    ((3, 4), (), (3, 4)),
    ((), (), ()),
]


@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcasting(op: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    a, b, r = shapes
    check(one_op(op, [(a, "f32"), (b, "f32")], (r, "f32")), BINARY[op])


@pytest.mark.parametrize("el", ["f16", "bf16", "f64"])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_other_floats(op: str, el: str) -> None:
    check(one_op(op, [((4, 3), el), ((3,), el)], ((4, 3), el)), BINARY[op])


@pytest.mark.parametrize("el", ["i32", "i64"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
def test_binary_int(op: str, el: str) -> None:
    check(one_op(op, [((4, 3), el), ((4, 1), el)], ((4, 3), el)), BINARY[op])


def test_div_is_true_division_and_maximum_propagates_nan() -> None:
    div = one_op("div", [((3,), "f32"), ((3,), "f32")], ((3,), "f32"))
    (q,) = run_function(div, [torch.tensor([7.0, -7.0, 1.0]), torch.tensor([2.0, 2.0, 0.0])])
    assert q.tolist() == [3.5, -3.5, float("inf")]
    mx = one_op("maximum", [((2,), "f32"), ((2,), "f32")], ((2,), "f32"))
    nan = float("nan")
    (m,) = run_function(mx, [torch.tensor([nan, 1.0]), torch.tensor([0.0, nan])])
    assert torch.isnan(m).all()


@pytest.mark.parametrize("el", ["f32", "i32", "i1", "bf16"])
@pytest.mark.parametrize("op", sorted(COMPARE))
def test_compare(op: str, el: str) -> None:
    fn = one_op(op, [((3, 4), el), ((4,), el)], ((3, 4), "i1"))
    check(fn, COMPARE[op])
    check(one_op(op, [((), el), ((2,), el)], ((2,), "i1")), COMPARE[op], seed=1)


@pytest.mark.parametrize(
    "shapes",
    [((3, 4), (3, 4), (3, 4), (3, 4)), ((3, 1), (4,), (), (3, 4)), ((), (), (), ())],
    ids=str,
)
@pytest.mark.parametrize("el", ["f32", "i32", "i1"])
def test_where(el: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    c, a, b, r = shapes
    fn = one_op("where", [(c, "i1"), (a, el), (b, el)], (r, el))
    check(fn, torch.where)


# --- type and layout changes ----------------------------------------------------------


@pytest.mark.parametrize(
    "src,dst",
    [("f32", "f16"), ("f32", "bf16"), ("f16", "f32"), ("f32", "i32"), ("i32", "f32"),
     ("f32", "i1"), ("i1", "f32"), ("i1", "i32"), ("i64", "i32"), ("f64", "f32")],
)  # fmt: skip
def test_cast(src: str, dst: str) -> None:
    fn = one_op("cast", [((2, 3), src)], ((2, 3), dst))
    check(fn, lambda x: x.to(DTYPES[dst]))
    check(one_op("cast", [((), src)], ((), dst)), lambda x: x.to(DTYPES[dst]))


@pytest.mark.parametrize(
    "value,el,expected",
    [
        ("2.0", "f32", 2.0),
        ("-1.5", "f16", -1.5),
        ("1.0e-5", "f64", 1.0e-5),
        ("3", "f32", 3.0),
        ("7", "i32", 7),
        ("-9223372036854775808", "i64", -(2**63)),
        ("4.0", "i64", 4),
        ("true", "i1", True),
        ("false", "i1", False),
        ("1", "i1", True),
        ("0", "i1", False),
        ("inf", "bf16", float("inf")),
        ("-inf", "f32", float("-inf")),
        ("1.0e10", "f16", float("inf")),  # rounds like a cast instead of raising
    ],
)
@pytest.mark.parametrize("shape", [(), (2, 3)], ids=str)
def test_constant(value: str, el: str, expected: object, shape: tuple[int, ...]) -> None:
    t = ty(shape, el)
    fn = only_fn(
        f"func @c() -> {t} {{\n  %c = graph.constant {{value = {value}}} : {t}\n"
        f"  return %c : {t}\n}}\n"
    )
    (got,) = run_function(fn, [])
    assert got.shape == shape and got.dtype == DTYPES[el]
    assert_close(got, torch.full(shape, expected, dtype=DTYPES[el]))  # type: ignore[arg-type]


def test_constant_nan() -> None:
    fn = only_fn(
        "func @c() -> tensor<2xf32> {\n  %c = graph.constant {value = nan} : tensor<2xf32>\n"
        "  return %c : tensor<2xf32>\n}\n"
    )
    (got,) = run_function(fn, [])
    assert torch.isnan(got).all()


def test_scalar_constant_broadcasts_into_mul() -> None:
    fn = only_fn(
        "func @scale(%x: tensor<4096xf32>) -> tensor<4096xf32> {\n"
        "  %c = graph.constant {value = 2.0} : tensor<f32>\n"
        "  %y = graph.mul %x, %c\n"
        "  return %y : tensor<4096xf32>\n}\n"
    )
    check(fn, lambda x: x * 2.0)


@pytest.mark.parametrize(
    "src,dst",
    [((3, 4), (12,)), ((3, 4), (2, 6)), ((2, 3, 4), (4, 6)), ((), (1, 1)), ((1,), ()), ((), ())],
    ids=str,
)
def test_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    check(one_op("reshape", [(src, "f32")], (dst, "f32")), lambda x: x.reshape(dst))


@pytest.mark.parametrize(
    "src,dst",
    [((4,), (3, 4)), ((3, 1), (3, 4)), ((), (2, 3)), ((1, 4), (2, 3, 4)), ((2, 3), (2, 3)),
     ((), ())],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("el", ["f32", "i1"])
def test_broadcast(src: tuple[int, ...], dst: tuple[int, ...], el: str) -> None:
    fn = one_op("broadcast", [(src, el)], (dst, el))
    check(fn, lambda x: torch.broadcast_to(x, dst))


@pytest.mark.parametrize(
    "shape,perm",
    [((3, 4), [1, 0]), ((2, 3, 4), [2, 0, 1]), ((2, 3, 4), [-1, 0, 1]), ((2, 3), [0, 1]),
     ((), [])],
    ids=str,
)  # fmt: skip
def test_transpose(shape: tuple[int, ...], perm: list[int]) -> None:
    rank = len(shape)
    norm = [p % rank for p in perm]
    out = tuple(shape[p] for p in norm)
    fn = one_op("transpose", [(shape, "f32")], (out, "f32"), f"perm = {perm}")
    check(fn, lambda x: x.permute(norm))


# --- reductions and matmul ------------------------------------------------------------

REDUCE: dict[str, Callable[..., torch.Tensor]] = {
    "reduce_sum": torch.sum,
    "reduce_max": torch.amax,
    "reduce_min": torch.amin,
    "reduce_mean": torch.mean,
}


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("dims", [[1], [-1], [0, 2], [-3, -2], [0, 1, 2]], ids=str)
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce(op: str, dims: list[int], keep: bool) -> None:
    shape = (2, 3, 4)
    norm = [d % 3 for d in dims]
    out = tuple(1 if i in norm else d for i, d in enumerate(shape) if keep or i not in norm)
    attrs = f"dims = {dims}, keepdim = {'true' if keep else 'false'}"
    fn = one_op(op, [(shape, "f32")], (out, "f32"), attrs)
    check(fn, lambda x: REDUCE[op](x, dim=dims, keepdim=keep))


def test_reduce_keepdim_defaults_to_false() -> None:
    fn = one_op("reduce_sum", [((4, 5), "f32")], ((4,), "f32"), "dims = [1]")
    check(fn, lambda x: x.sum(dim=1))


@pytest.mark.parametrize("el", ["f16", "bf16", "f64"])
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce_half_and_double(op: str, el: str) -> None:
    fn = one_op(op, [((8, 33), el)], ((8, 1), el), "dims = [1], keepdim = true")
    check(fn, lambda x: REDUCE[op](x, dim=[1], keepdim=True))


@pytest.mark.parametrize("el", ["i32", "i64"])
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_min"])
def test_reduce_int_keeps_dtype(op: str, el: str) -> None:
    """torch.sum widens i32 to i64; the IR says the result stays i32."""
    fn = one_op(op, [((5, 6), el)], ((6,), el), "dims = [0]")
    check(fn, lambda x: REDUCE[op](x, dim=[0]).to(DTYPES[el]))


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min"])
def test_reduce_bool(op: str) -> None:
    fn = one_op(op, [((5, 6), "i1")], ((5,), "i1"), "dims = [-1]")
    check(fn, lambda x: REDUCE[op](x, dim=[-1]))


def test_reduce_to_rank0() -> None:
    fn = one_op("reduce_mean", [((3, 4), "f32")], ((), "f32"), "dims = [0, 1]")
    check(fn, lambda x: x.mean())


@pytest.mark.parametrize("el", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize(
    "a,b,r",
    [((4, 3), (3, 5), (4, 5)), ((2, 4, 3), (2, 3, 5), (2, 4, 5)), ((1, 1), (1, 1), (1, 1))],
    ids=str,
)
def test_matmul(a: tuple[int, ...], b: tuple[int, ...], r: tuple[int, ...], el: str) -> None:
    check(one_op("matmul", [(a, el), (b, el)], (r, el)), torch.matmul)


# --- composites ------------------------------------------------------------------------


@pytest.mark.parametrize("el", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_softmax(dim: int, el: str) -> None:
    fn = one_op("softmax", [((3, 7), el)], ((3, 7), el), f"dim = {dim}")
    check(fn, lambda x: torch.softmax(x, dim=dim))


@pytest.mark.parametrize("el", ["f32", "f16", "bf16"])
@pytest.mark.parametrize(
    "shape,dims,eps",
    [((4, 8), [1], None), ((4, 8), [-1], "1.0e-3"), ((2, 3, 4), [1, 2], None),
     ((2, 3, 4), [-2, -1], "0.5"), ((2, 3, 4), [0, 1, 2], None)],
    ids=str,
)  # fmt: skip
def test_layer_norm(shape: tuple[int, ...], dims: list[int], eps: str | None, el: str) -> None:
    norm_shape = tuple(shape[d % len(shape)] for d in dims)
    attrs = f"dims = {dims}" + (f", eps = {eps}" if eps else "")
    fn = one_op("layer_norm", [(shape, el), (norm_shape, el), (norm_shape, el)], (shape, el), attrs)
    e = float(eps) if eps else 1e-5
    check(fn, lambda x, w, b: F.layer_norm(x, norm_shape, w, b, e))


# --- whole functions ---------------------------------------------------------------------

SOFTMAX = """
func @softmax(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<8x1xf32>
  %s = graph.sub %x, %m : tensor<8x16xf32>
  %e = graph.exp %s : tensor<8x16xf32>
  %d = graph.reduce_sum %e {dims = [1], keepdim = true} : tensor<8x1xf32>
  %y = graph.div %e, %d : tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

func @mlp(%x: tensor<16x32xf16>, %w: tensor<32x8xf16>, %b: tensor<8xf16>) -> tensor<16x8xf16> {
  %0 = graph.matmul %x, %w : tensor<16x8xf16>
  %1 = graph.add %0, %b : tensor<16x8xf16>
  %2 = graph.relu %1 : tensor<16x8xf16>
  return %2 : tensor<16x8xf16>
}

func @two(%x: tensor<4xf32>, %s: tensor<f32>) -> (tensor<4xf32>, tensor<f32>, tensor<4xf32>) {
  %y = graph.mul %x, %s
  %t = graph.reduce_sum %y {dims = [0]}
  return %y, %t, %x : tensor<4xf32>, tensor<f32>, tensor<4xf32>
}
"""


def test_softmax_by_hand_matches_torch() -> None:
    m = module(SOFTMAX)
    x = torch.randn(8, 16)
    (y,) = run(m, "softmax", [x])
    assert_close(y, torch.softmax(x, dim=1))
    (y2,) = run(m, "@softmax", [x])
    assert torch.equal(y, y2)


def test_mlp_and_multiple_results() -> None:
    m = module(SOFTMAX)
    fns = functions(m)
    x, w, b = random_inputs(fns["mlp"], seed=3)
    (y,) = run(m, "mlp", [x, w, b])
    assert_close(y, torch.relu(x @ w + b))
    x, s = random_inputs(fns["two"])
    y, t, x_again = run(m, "two", [x, s])
    assert_close(y, x * s)
    assert_close(t, (x * s).sum())
    assert t.shape == () and torch.equal(x_again, x)


def test_run_unknown_function() -> None:
    with pytest.raises(KeyError, match="available: @softmax, @mlp, @two"):
        run(module(SOFTMAX), "nope", [])


FUSED = """
func @f(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4xf32>) {
  %n = graph.neg %x : tensor<4x8xf32>
  %y, %s = graph.fused %n, %b {kernel = "k0"} (%p: tensor<4x8xf32>, %q: tensor<8xf32>) {
    %0 = graph.add %p, %q
    %1 = graph.relu %0
    %2 = graph.reduce_sum %1 {dims = [-1]}
    graph.yield %1, %2
  } : tensor<4x8xf32>, tensor<4xf32>
  %z = graph.fused %y (%a: tensor<4x8xf32>) {
    %c = graph.constant {value = 3.0} : tensor<f32>
    %m = graph.mul %a, %c
    graph.yield %m
  } : tensor<4x8xf32>
  return %z, %s : tensor<4x8xf32>, tensor<4xf32>
}
"""


def test_fused_groups_execute() -> None:
    fn = only_fn(FUSED)
    x, b = random_inputs(fn, seed=5)
    z, s = run_function(fn, [x, b])
    r = torch.relu(-x + b)
    assert_close(z, r * 3.0)
    assert_close(s, r.sum(dim=-1))


def test_fused_region_must_not_capture_outer_values() -> None:
    """The verifier rejects this; the interpreter still says so clearly if it slips by."""
    text = FUSED.replace("%m = graph.mul %a, %c", "%m = graph.mul %a, %n")
    (fn,) = functions(parse(text, "test.ir")).values()
    with pytest.raises(ReferenceInterpreterError, match="uses %n from outside its region"):
        run_function(fn, random_inputs(fn))


# --- the interpreter's own checks ------------------------------------------------------------


def test_every_graph_op_has_an_evaluator() -> None:
    ops = [cls for name, cls in op_classes().items() if name.startswith("graph.")]
    missing = [op.name for op in ops if op.name != "graph.yield" and op not in EVALUATORS]
    assert missing == []


def test_result_mismatch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    rsum = op_class("reduce_sum")
    fn = one_op("reduce_sum", [((3, 4), "f32")], ((3,), "f32"), "dims = [1]")
    monkeypatch.setitem(EVALUATORS, rsum, lambda op, args: args[0].sum(dim=0))
    wrong_shape = r"shape \[4\] f32, but the IR type is tensor<3xf32>"
    with pytest.raises(ResultMismatchError, match=wrong_shape):
        run_function(fn, random_inputs(fn))
    monkeypatch.setitem(EVALUATORS, rsum, lambda op, args: args[0].sum(dim=1).double())
    with pytest.raises(ResultMismatchError, match="f64, but the IR type is tensor<3xf32>"):
        run_function(fn, random_inputs(fn))
    monkeypatch.setitem(EVALUATORS, rsum, lambda op, args: [])
    with pytest.raises(ResultMismatchError, match="0 result"):
        run_function(fn, random_inputs(fn))


def test_unsupported_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(EVALUATORS, op_class("exp"))
    fn = one_op("exp", [((3,), "f32")], ((3,), "f32"))
    with pytest.raises(UnsupportedOpError, match="cannot evaluate 'graph.exp' at test.ir:2:"):
        run_function(fn, random_inputs(fn))


def test_torch_errors_name_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(op: object, args: list[torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("kaput")

    monkeypatch.setitem(EVALUATORS, op_class("exp"), boom)
    fn = one_op("exp", [((3,), "f32")], ((3,), "f32"))
    with pytest.raises(EvaluationError, match="graph.exp at test.ir:2:.*RuntimeError: kaput"):
        run_function(fn, random_inputs(fn))


def test_inputs_must_match_the_signature() -> None:
    fn = one_op("exp", [((3,), "f32")], ((3,), "f32"))
    with pytest.raises(ValueError, match="takes 1 input"):
        run_function(fn, [])
    with pytest.raises(ValueError, match=r"input 0 of @f is shape \[4\] f32"):
        run_function(fn, [torch.zeros(4)])
    with pytest.raises(ValueError, match="input 0 of @f is shape \\[3\\] f16"):
        run_function(fn, [torch.zeros(3, dtype=torch.float16)])


# --- random inputs -----------------------------------------------------------------------------

ALL_TYPES = """
func @g(%a: tensor<4x5xf32>, %b: tensor<3xf16>, %c: tensor<2x2xbf16>, %d: tensor<f64>,
        %e: tensor<6xi64>, %f: tensor<7xi32>, %h: tensor<9xi1>) -> tensor<4x5xf32> {
  return %a : tensor<4x5xf32>
}
"""


def test_random_inputs_types_and_determinism() -> None:
    fn = only_fn(ALL_TYPES.replace(",\n        ", ", "))
    xs = random_inputs(fn, seed=7)
    ys = random_inputs(fn, seed=7)
    zs = random_inputs(fn, seed=8)
    for x, arg in zip(xs, fn.body.block.args, strict=True):
        assert x.dtype == torch_dtype(arg.type.element_type)  # type: ignore[attr-defined]
        assert tuple(x.shape) == tuple(arg.type.get_shape())  # type: ignore[attr-defined]
        assert x.device.type == "cpu"
    for x, y in zip(xs, ys, strict=True):
        assert torch.equal(x, y)
    assert not all(torch.equal(x, z) for x, z in zip(xs, zs, strict=True))
    for x in xs[4:6]:
        assert int(x.min()) >= -8 and int(x.max()) <= 8
    # Floats are normal: unbounded sign, not uniform in [0, 1).
    big = random_tensor((10000,), torch.float32, torch.Generator().manual_seed(0))
    assert -0.1 < float(big.mean()) < 0.1 and 0.9 < float(big.std()) < 1.1


@pytest.mark.parametrize("el", ["i1", "i32", "i64", "f16"])
def test_random_inputs_never_all_zero(el: str) -> None:
    for shape in [(), (1,), (2,)]:
        fn = only_fn(f"func @z(%x: {ty(shape, el)}) {{\n  return\n}}\n")
        for seed in range(60):
            (x,) = random_inputs(fn, seed)
            assert bool(x.any()), (shape, seed)


def test_random_inputs_are_device_independent() -> None:
    fn = only_fn(ALL_TYPES.replace(",\n        ", ", "))
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    for x, y in zip(random_inputs(fn, 1), random_inputs(fn, 1, "cuda"), strict=True):
        assert y.device.type == "cuda" and torch.equal(x, y.cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_runs_on_cuda() -> None:
    fn = only_fn(FUSED)
    xs = random_inputs(fn, 2, "cuda")
    cuda = run_function(fn, xs)
    cpu = run_function(fn, [x.cpu() for x in xs])
    for a, b in zip(cuda, cpu, strict=True):
        assert a.device.type == "cuda"
        assert_close(a.cpu(), b)
    c = one_op("constant", [], ((2,), "f32"), "value = 1.5")
    (k,) = run_function(c, [], device="cuda")
    assert k.device.type == "cuda"


# --- memory estimate -----------------------------------------------------------------------------


def test_estimate_counts_inputs_outputs_and_frees_dead_values() -> None:
    n = 1000
    chain = "\n".join(f"  %v{i + 1} = graph.exp %v{i}" for i in range(20))
    fn = only_fn(
        f"func @c(%v0: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n{chain}\n"
        f"  return %v20 : tensor<{n}xf32>\n}}\n"
    )
    est = estimate_peak_bytes(fn)
    one = 4 * n
    # The input, the newest value and the one being made: never all 21 values.
    assert 2 * one <= est <= 4 * one
    assert value_bytes(fn.body.block.args[0]) == one
    fused = only_fn(FUSED)
    assert estimate_peak_bytes(fused) >= sum(value_bytes(a) for a in fused.body.block.args)


def test_estimate_for_huge_tensors_does_not_allocate() -> None:
    fn = one_op("exp", [((100000, 100000, 100), "f32")], ((100000, 100000, 100), "f32"))
    assert estimate_peak_bytes(fn) >= 2 * 4 * 10**12
