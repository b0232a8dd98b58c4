"""Reference semantics of the graph level: each op evaluated by the PyTorch op of its name.

The spec says "numerics follow PyTorch's op of the same name", so this
interpreter *is* the definition that compiled kernels are checked against.
It is table-driven (`EVALUATORS`: op class -> function; an element-wise op's
function is the torch function its class names, `REFERENCE`), and it checks
every result's shape and dtype against the IR type, so a disagreement between
the dialect's type inference and PyTorch is caught here rather than blamed on
generated code.

    module = irc.parse(text)
    fn = functions(module)["softmax"]
    outputs = run_function(fn, random_inputs(fn, seed=0))
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, cast

import torch
import torch.nn.functional as F
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, IntegerAttr, ModuleOp, TensorType
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue

from irc.dialects import graph
from irc.ir.types import (
    ELEMENT_TYPES,
    ELEMENTS,
    I1,
    element_bytes,
    element_name,
    element_of,
    format_type,
    is_float,
    numel,
    shape_of,
)
from irc.syntax.diagnostics import op_location

# --- element types ----------------------------------------------------------------

_TORCH_DTYPES: dict[str, torch.dtype] = {n: getattr(torch, e.torch) for n, e in ELEMENTS.items()}
_ELEMENT_OF_DTYPE: dict[torch.dtype, str] = {v: k for k, v in _TORCH_DTYPES.items()}


def torch_dtype(element_type: Attribute) -> torch.dtype:
    """The torch dtype of an irc element type (`i1` is `torch.bool`)."""
    try:
        return _TORCH_DTYPES[element_name(element_type)]
    except (KeyError, ValueError):
        raise ValueError(f"no torch dtype for element type {element_type}") from None


def element_type_of(dtype: torch.dtype) -> Attribute:
    """The irc element type of a torch dtype: the inverse of `torch_dtype`."""
    name = _ELEMENT_OF_DTYPE.get(dtype)
    if name is None:
        raise ValueError(f"torch dtype {dtype} has no irc element type")
    return ELEMENT_TYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """`f32`, `i1`, ...: how irc spells a torch dtype in messages."""
    return element_name(element_type_of(dtype))


_WIDE: ContextVar[bool] = ContextVar("irc_reference_wide", default=False)
"""Set while `run_function_f64` runs: every float value is carried in f64."""

_WIDENS: frozenset[tuple[torch.dtype, torch.dtype]] = frozenset(
    {
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float64),
        (torch.bfloat16, torch.float64),
        (torch.float32, torch.float64),
    }
)
"""Float casts that represent every value of their source exactly (no rounding)."""


_ORDER: ContextVar[int] = ContextVar("irc_reference_order", default=0)
"""Nonzero while `run_function(..., order=k)` runs: sums take their terms in another order."""


def carried_dtype(element_type: Attribute) -> torch.dtype:
    """The dtype a value of this element type has in the interpreter now (f64 when wide)."""
    dtype = torch_dtype(element_type)
    return torch.float64 if dtype.is_floating_point and _WIDE.get() else dtype


def _tensor_type(t: Attribute) -> TensorType[Attribute]:
    if not isinstance(t, TensorType):
        raise ValueError(f"the reference works on tensors, got {t}")
    return cast(TensorType[Attribute], t)


# --- errors -------------------------------------------------------------------------


class ReferenceInterpreterError(RuntimeError):
    """Base of the interpreter's own errors."""


class UnsupportedOpError(ReferenceInterpreterError):
    """An op the reference has no evaluator for (e.g. a loop- or tile-level op)."""

    def __init__(self, op: Operation):
        self.op = op
        super().__init__(
            f"the reference interpreter cannot evaluate '{op.name}'{_where(op)}"
            " (it runs graph-level IR only)"
        )


class ResultMismatchError(AssertionError, ReferenceInterpreterError):
    """PyTorch produced a shape or dtype that differs from the op's IR type.

    This is a bug in irc (type inference or an evaluator), never in the input.
    """


class EvaluationError(ReferenceInterpreterError):
    """PyTorch raised while evaluating an op; the message names the op."""

    def __init__(self, op: Operation, error: BaseException):
        self.op = op
        self.error = error
        super().__init__(f"{op.name}{_where(op)}: {type(error).__name__}: {error}")


def _where(op: Operation) -> str:
    loc = op_location(op)
    return "" if loc is None else f" at {loc.file}:{loc.line}:{loc.column}"


def is_out_of_memory(e: BaseException) -> bool:
    """Whether an exception from torch means an allocation failed (CPU or GPU)."""
    if isinstance(e, EvaluationError):
        e = e.error
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(e, RuntimeError) and (
        "not enough memory" in str(e) or "out of memory" in str(e).lower()
    )


# --- evaluators ---------------------------------------------------------------------

Tensor = torch.Tensor
Evaluator = Callable[[Any, list[Tensor]], Tensor | list[Tensor]]
"""`(op, operand tensors) -> result tensor(s)`; `op` is the concrete op class."""

EVALUATORS: dict[type[Operation], Evaluator] = {}
"""Op class -> evaluator. Later levels may register their ops here too."""


def evaluator(*classes: type[Operation]) -> Callable[[Evaluator], Evaluator]:
    """Registers one function as the evaluator of `classes`."""

    def register(fn: Evaluator) -> Evaluator:
        for cls in classes:
            EVALUATORS[cls] = fn
        return fn

    return register


def _elementwise(fn: Callable[..., Tensor]) -> Evaluator:
    return lambda op, args: fn(*args)


def torch_function(path: str) -> Callable[..., Tensor]:
    """The function a dotted name such as `torch.special.erf` names (an op's REFERENCE)."""
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        raise ValueError(f"no torch function {path}") from None


# Element-wise ops: the torch function their class names (graph.ElementwiseOp.REFERENCE).
for _cls in graph.ELEMENTWISE_OPS:
    if _cls.REFERENCE is not None:
        EVALUATORS[_cls] = _elementwise(torch_function(_cls.REFERENCE))


@evaluator(graph.GeluOp)
def _gelu(op: graph.GeluOp, args: list[Tensor]) -> Tensor:
    return torch.nn.functional.gelu(args[0], approximate=op.mode())


def _result_type(op: Operation, i: int = 0) -> TensorType[Attribute]:
    return _tensor_type(op.results[i].type)


def _result_shape(op: Operation) -> tuple[int, ...]:
    return shape_of(_result_type(op))


def _result_dtype(op: Operation) -> torch.dtype:
    return torch_dtype(element_of(_result_type(op)))


@evaluator(graph.CastOp)
def _cast(op: graph.CastOp, args: list[Tensor]) -> Tensor:
    (x,) = args
    dtype = _result_dtype(op)
    if not (_WIDE.get() and dtype.is_floating_point):
        return x.to(dtype)
    # In f64, a cast still rounds where the program asks it to (a narrowing
    # float cast, an integer to a float that cannot hold it): that rounding is
    # the op's meaning, not an error of the implementation.
    source = torch_dtype(element_of(_tensor_type(op.operands[0].type)))
    if dtype == torch.float64 or (source, dtype) in _WIDENS:
        return x.to(torch.float64)
    return x.to(dtype).to(torch.float64)


@evaluator(graph.ConstantOp)
def _constant(op: graph.ConstantOp, args: list[Tensor]) -> Tensor:
    dtype = _result_dtype(op)
    value = constant_value(op)
    # Through a 0-d tensor so that out-of-range floats round to inf as a cast
    # would, where torch.full(shape, 1e10, dtype=float16) raises instead.
    scalar = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
    scalar = scalar.to(dtype)
    if _WIDE.get() and dtype.is_floating_point:
        # The constant's value is the written number rounded to its type.
        scalar, dtype = scalar.to(torch.float64), torch.float64
    return torch.empty(_result_shape(op), dtype=dtype).fill_(scalar)


def constant_value(op: graph.ConstantOp) -> bool | int | float:
    """The Python value of a `graph.constant`, converted to its element type's kind."""
    attr = op.value
    element = element_of(_result_type(op))
    if isinstance(attr, IntegerAttr):
        raw: float | int = attr.value.data
    elif isinstance(attr, FloatAttr):
        raw = attr.value.data
    else:
        raise ValueError(f"graph.constant: unsupported value attribute {attr}")
    if element == I1:
        return bool(raw)
    if is_float(element):
        return float(raw)
    return int(raw)


@evaluator(graph.ReshapeOp)
def _reshape(op: graph.ReshapeOp, args: list[Tensor]) -> Tensor:
    return args[0].reshape(_result_shape(op))


@evaluator(graph.BroadcastOp)
def _broadcast(op: graph.BroadcastOp, args: list[Tensor]) -> Tensor:
    # expand() prepends missing leading dimensions, as broadcasting does.
    return args[0].expand(_result_shape(op))


@evaluator(graph.TransposeOp)
def _transpose(op: graph.TransposeOp, args: list[Tensor]) -> Tensor:
    (x,) = args
    perm = graph.normalize_dims(op.name, _int_list(op.perm), x.dim(), "perm")
    return x.permute(perm)


@evaluator(graph.SliceOp)
def _slice(op: graph.SliceOp, args: list[Tensor]) -> Tensor:
    start, end, step = op.slice_bounds()
    return args[0][tuple(slice(s, e, k) for s, e, k in zip(start, end, step, strict=True))]


@evaluator(graph.ConcatOp)
def _concat(op: graph.ConcatOp, args: list[Tensor]) -> Tensor:
    return torch.cat(args, dim=op.axis())


@evaluator(graph.IotaOp)
def _iota(op: graph.IotaOp, args: list[Tensor]) -> Tensor:
    shape = _result_shape(op)
    d = op.axis()
    line = torch.arange(shape[d], dtype=_result_dtype(op))
    along = [shape[d] if i == d else 1 for i in range(len(shape))]
    return line.reshape(along).expand(shape).contiguous()


@evaluator(graph.IndexSelectOp)
def _index_select(op: graph.IndexSelectOp, args: list[Tensor]) -> Tensor:
    x, idx = args
    _check_indices(op, idx, x.shape[op.axis()])
    return x.index_select(op.axis(), idx.reshape(-1)).reshape(_result_shape(op))


@evaluator(graph.GatherOp)
def _gather(op: graph.GatherOp, args: list[Tensor]) -> Tensor:
    x, idx = args
    _check_indices(op, idx, x.shape[op.axis()])
    return torch.gather(x, op.axis(), idx.to(torch.int64))


class IndexOutOfRangeError(ReferenceInterpreterError):
    """An index tensor holds an index outside its dimension: the program's error
    (torch would refuse it too, or read past the end on a GPU)."""

    def __init__(self, op: Operation, index: int, size: int):
        self.op = op
        super().__init__(
            f"{op.name}: index {index} is out of range for dimension {op.axis()} "  # type: ignore[attr-defined]
            f"of size {size}"
        )


def _check_indices(op: graph.IndexingOp, idx: Tensor, size: int) -> None:
    bad = (idx < 0) | (idx >= size)
    if bool(bad.any()):
        raise IndexOutOfRangeError(op, int(idx[bad].reshape(-1)[0]), size)


def _int_list(attr: Attribute | None) -> list[int]:
    assert isinstance(attr, ArrayAttr), attr
    return [a.value.data for a in attr.data]  # type: ignore[union-attr]


@evaluator(graph.ReduceSumOp)
def _reduce_sum(op: graph.ReduceSumOp, args: list[Tensor]) -> Tensor:
    x = _reordered(args[0], op.reduced_dims())
    # dtype= keeps i32 sums in i32 (torch.sum widens integers to i64 by default).
    return torch.sum(x, dim=op.reduced_dims(), keepdim=op.keeps_dims(), dtype=x.dtype)


@evaluator(graph.ReduceMaxOp)
def _reduce_max(op: graph.ReduceMaxOp, args: list[Tensor]) -> Tensor:
    return torch.amax(args[0], dim=op.reduced_dims(), keepdim=op.keeps_dims())


@evaluator(graph.ReduceMinOp)
def _reduce_min(op: graph.ReduceMinOp, args: list[Tensor]) -> Tensor:
    return torch.amin(args[0], dim=op.reduced_dims(), keepdim=op.keeps_dims())


@evaluator(graph.ReduceMeanOp)
def _reduce_mean(op: graph.ReduceMeanOp, args: list[Tensor]) -> Tensor:
    x = _reordered(args[0], op.reduced_dims())
    return torch.mean(x, dim=op.reduced_dims(), keepdim=op.keeps_dims())


@evaluator(graph.MatmulOp)
def _matmul(op: graph.MatmulOp, args: list[Tensor]) -> Tensor:
    a, b = args
    p = _permutation(a.shape[-1], a.device)
    if p is not None:  # the same order of the contracted dim on both sides
        a, b = a.index_select(a.dim() - 1, p), b.index_select(b.dim() - 2, p)
    return torch.matmul(a, b)


@evaluator(graph.AttentionOp)
def _attention(op: graph.AttentionOp, args: list[Tensor]) -> Tensor:
    """scaled_dot_product_attention as its flash kernels compute it: scores and softmax
    in f32, the probabilities rounded to the inputs' type for the second product
    (which sums in f32), the result rounded once."""
    q, k, v = (a.float() for a in args[:3])
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:  # grouped-query: K/V heads shared
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    s = torch.matmul(q, k.transpose(-1, -2)) * op.softmax_scale()
    if len(args) == 4:
        mask = args[3]
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.float()
    if op.causal():
        t_q, t_k = s.shape[-2:]
        seen = torch.ones(t_q, t_k, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~seen, -math.inf)
    p = torch.softmax(s, -1).to(args[0].dtype).float()
    return torch.matmul(p, v).to(args[0].dtype)


@evaluator(graph.SoftmaxOp)
def _softmax(op: graph.SoftmaxOp, args: list[Tensor]) -> Tensor:
    (x,) = args
    dim = op.axis()
    p = _permutation(x.shape[dim], x.device)
    if p is None:
        return torch.softmax(x, dim=dim)
    y = torch.softmax(x.index_select(dim, p), dim=dim)
    return y.index_select(dim, torch.argsort(p))


@evaluator(graph.LayerNormOp)
def _layer_norm(op: graph.LayerNormOp, args: list[Tensor]) -> Tensor:
    x, w, b = args
    dims = op.normalized_dims()
    normalized = [x.shape[d] for d in dims]
    perms = [(d, _permutation(x.shape[d], x.device)) for d in dims]
    shift = x.dim() - len(dims)  # weight and bias have the normalized dims only
    for d, p in perms:
        if p is not None:
            x = x.index_select(d, p)
            w, b = w.index_select(d - shift, p), b.index_select(d - shift, p)
    y = F.layer_norm(x, normalized, w, b, op.epsilon())
    for d, p in perms:
        if p is not None:
            y = y.index_select(d, torch.argsort(p))
    return y


def _permutation(n: int, device: torch.device) -> Tensor | None:
    """The order in which a reduction of `n` terms takes them under `order=k`
    (None: as they come). Order 1 reverses; others are seeded shuffles."""
    k = _ORDER.get()
    if k == 0 or n < 2:
        return None
    if k == 1:
        return torch.arange(n - 1, -1, -1, device=device)
    # Drawn on the CPU (the generator's device), the same on every device.
    shuffle = torch.randperm(n, generator=torch.Generator().manual_seed(k), device="cpu")
    return shuffle.to(device)


def _reordered(x: Tensor, dims: Sequence[int]) -> Tensor:
    """`x` with its elements along `dims` in the order of `_permutation` (a sum is the same)."""
    for d in dims:
        p = _permutation(x.shape[d], x.device)
        if p is not None:
            x = x.index_select(d, p)
    return x


@evaluator(graph.FusedOp)
def _fused(op: graph.FusedOp, args: list[Tensor]) -> list[Tensor]:
    # The region is isolated from above: its block arguments are the operands.
    return _run_block(op.body.block, args)


# --- the interpreter ------------------------------------------------------------------


def functions(module: ModuleOp) -> dict[str, func.FuncOp]:
    """The module's functions by name, in file order."""
    return {op.sym_name.data: op for op in module.body.ops if isinstance(op, func.FuncOp)}


def run(
    module: ModuleOp,
    name: str,
    inputs: Sequence[Tensor],
    device: str | torch.device | None = None,
) -> list[Tensor]:
    """Runs the function `name` (with or without a leading '@') of `module`."""
    fns = functions(module)
    fn = fns.get(name.removeprefix("@"))
    if fn is None:
        known = ", ".join("@" + n for n in fns) or "none"
        raise KeyError(f"no function @{name.removeprefix('@')} (available: {known})")
    return run_function(fn, inputs, device)


def run_function(
    fn: func.FuncOp,
    inputs: Sequence[Tensor],
    device: str | torch.device | None = None,
    *,
    order: int = 0,
) -> list[Tensor]:
    """Evaluates `fn` on `inputs` and returns its outputs (contiguous tensors).

    The inputs must match the signature exactly (shape and dtype): the graph
    level has no implicit conversions, so a mismatch is the caller's mistake.
    Constants are made on `device`, by default the inputs' device (else CPU).
    A nonzero `order` makes every reduction (reduce_sum and mean, matmul,
    softmax, layer_norm) take its terms in another order, the same for an
    order on every run: an equally correct result that rounds differently.
    Eager torch's distance from the exact value is one draw of rounding
    noise; other orders show how far that noise reaches.
    """
    block = fn.body.block
    name = fn.sym_name.data
    if len(inputs) != len(block.args):
        raise ValueError(f"@{name} takes {len(block.args)} input(s), got {len(inputs)}")
    for i, (arg, x) in enumerate(zip(block.args, inputs, strict=True)):
        _check_tensor(x, arg.type, lambda i=i: f"input {i} of @{name}", ValueError)
    if device is None:
        device = inputs[0].device if inputs else torch.device("cpu")
    token = _ORDER.set(order)
    try:
        with torch.no_grad(), torch.device(device):
            outputs = _run_block(block, list(inputs))
    finally:
        _ORDER.reset(token)
    return [o.contiguous() for o in outputs]


def run_function_f64(
    fn: func.FuncOp,
    inputs: Sequence[Tensor],
    device: str | torch.device | None = None,
) -> list[Tensor]:
    """`fn` computed in f64: the yardstick against which verdicts weigh rounding.

    The inputs are those of `run_function` (the program's dtypes); float inputs
    are widened to f64 exactly, every float op runs in f64, and float outputs
    come back as f64. Only what the program spells as rounding still rounds:
    a cast to a narrower float type (or of an integer to a float too small
    for it) and a constant, which is its written value in its type. So the
    result is the program's mathematical value, and the distance of torch's
    own result from it is torch's rounding error at the program's dtypes.
    """
    block = fn.body.block
    name = fn.sym_name.data
    if len(inputs) != len(block.args):
        raise ValueError(f"@{name} takes {len(block.args)} input(s), got {len(inputs)}")
    for i, (arg, x) in enumerate(zip(block.args, inputs, strict=True)):
        _check_tensor(x, arg.type, lambda i=i: f"input {i} of @{name}", ValueError)
    wide = [x.to(torch.float64) if x.is_floating_point() else x for x in inputs]
    token = _WIDE.set(True)
    try:
        return run_function(fn, wide, device)
    finally:
        _WIDE.reset(token)


def _run_block(block: Block, args: list[Tensor]) -> list[Tensor]:
    """Evaluates a block's ops and returns its terminator's operands.

    Values are dropped after their last use so that peak memory stays near what
    the program needs (`estimate_peak_bytes` mirrors this).
    """
    env: dict[SSAValue, Tensor] = dict(zip(block.args, args, strict=True))
    ops = list(block.ops)
    frees = _frees_after(block)
    for i, op in enumerate(ops[:-1] if _has_terminator(block) else ops):
        operands = [_lookup(env, v, op) for v in op.operands]
        for j, r in enumerate(_evaluate(op, operands)):
            env[op.results[j]] = r
        for v in frees.get(i, ()):
            env.pop(v, None)
    if not _has_terminator(block):
        return []
    return [_lookup(env, v, ops[-1]) for v in ops[-1].operands]


def _lookup(env: dict[SSAValue, Tensor], v: SSAValue, user: Operation) -> Tensor:
    try:
        return env[v]
    except KeyError:
        name = f"%{v.name_hint}" if v.name_hint else "a value"
        raise ReferenceInterpreterError(
            f"{user.name}{_where(user)} uses {name} from outside its region; "
            "graph.fused regions are isolated from above (pass values in as operands)"
        ) from None


def _has_terminator(block: Block) -> bool:
    return isinstance(block.last_op, func.ReturnOp | graph.YieldOp)


def _frees_after(block: Block) -> dict[int, list[SSAValue]]:
    """Op index -> values of this block that are dead once that op has run."""
    last_use: dict[SSAValue, int] = {}
    defined: list[tuple[int, SSAValue]] = [(-1, a) for a in block.args]
    for i, op in enumerate(block.ops):
        defined += [(i, r) for r in op.results]
        for inner in op.walk():
            for v in inner.operands:
                last_use[v] = i
    frees: dict[int, list[SSAValue]] = {}
    for i, v in defined:
        frees.setdefault(max(last_use.get(v, i), i), []).append(v)
    return frees


def _evaluate(op: Operation, operands: list[Tensor]) -> list[Tensor]:
    fn = EVALUATORS.get(type(op))
    if fn is None:
        raise UnsupportedOpError(op)
    try:
        out = fn(op, operands)
    except ReferenceInterpreterError:
        raise
    except Exception as e:
        if is_out_of_memory(e):
            raise
        raise EvaluationError(op, e) from e
    results = out if isinstance(out, list) else [out]
    if len(results) != len(op.results):
        raise ResultMismatchError(
            f"{op.name}{_where(op)}: the reference gave {len(results)} result(s) "
            f"but the op has {len(op.results)}"
        )
    for i, (r, v) in enumerate(zip(results, op.results, strict=True)):
        what = lambda i=i: f"result {i} of {op.name}{_where(op)}"  # noqa: E731
        _check_tensor(r, v.type, what, ResultMismatchError)
    return results


def _check_tensor(
    x: Tensor, t: Attribute, what: Callable[[], str], error: type[Exception]
) -> None:
    """The shape/dtype assertion; `what` is lazy so the hot path builds no strings."""
    tt = _tensor_type(t)
    if tuple(x.shape) != shape_of(tt) or x.dtype != carried_dtype(tt.element_type):
        got = f"shape {list(x.shape)} {_dtype_text(x.dtype)}"
        raise error(f"{what()} is {got}, but the IR type is {format_type(tt)}")


def _dtype_text(dtype: torch.dtype) -> str:
    try:
        return dtype_name(dtype)
    except ValueError:
        return str(dtype)


# --- inputs and memory ------------------------------------------------------------------


def random_inputs(
    fn: func.FuncOp, seed: int = 0, device: str | torch.device = "cpu"
) -> list[Tensor]:
    """One random tensor per argument of `fn`, the same for a seed on every device.

    Floats are standard normal (drawn in their own dtype), ints small
    (-8..8), bools fair coins; the indices of an index_select or gather are
    drawn inside the dimension they index. A tensor is never all zeros (or all false), so
    that a kernel that ignores an input cannot pass by luck. Values are drawn
    on the CPU with one generator, then moved, so CPU and CUDA runs agree.
    """
    gen = torch.Generator().manual_seed(seed)
    out: list[Tensor] = []
    for arg in fn.body.block.args:
        t = _tensor_type(arg.type)
        x = random_tensor(shape_of(t), torch_dtype(t.element_type), gen)
        size = index_bound(arg)
        if size is not None:
            x = torch.randint(0, size, shape_of(t), generator=gen, dtype=x.dtype)
        out.append(x.to(device))
    return out


def index_bound(v: SSAValue) -> int | None:
    """The size of the dimension that `v` indexes (the smallest, if it indexes
    several) when it is the indices of an index_select or gather, directly or
    through views and concats: its random values are drawn inside it (an index
    outside is the program's error)."""
    sizes: list[int] = []
    for u in v.uses:
        op = u.operation
        if isinstance(op, graph.IndexingOp) and u.index == 1:
            sizes.append(shape_of(_tensor_type(op.input.type))[op.axis()])
        elif isinstance(op, graph.VIEW_OPS) or isinstance(op, graph.ConcatOp):
            # The result holds (some of) the operand's values as they are.
            size = index_bound(op.results[0])
            if size is not None:
                sizes.append(size)
    return min(sizes) if sizes else None


def random_tensor(shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator) -> Tensor:
    """A random tensor as `random_inputs` makes them."""
    size = tuple(shape)
    if dtype.is_floating_point:
        x = torch.randn(size, dtype=dtype, generator=gen)
    elif dtype == torch.bool:
        x = torch.randint(0, 2, size, generator=gen, dtype=torch.int8).bool()
    else:
        x = torch.randint(-8, 9, size, generator=gen, dtype=dtype)
    if not bool(x.any()):
        x.view(-1)[0] = True if dtype == torch.bool else 1
    return x


def value_bytes(v: SSAValue, wide: bool = False) -> int:
    """Bytes of a tensor value (an `i1` element takes one byte, as in torch);
    `wide`: as `run_function_f64` holds it (floats in f64)."""
    t = _tensor_type(v.type)
    size = 8 if wide and is_float(t.element_type) else element_bytes(t.element_type)
    return numel(shape_of(t)) * size


def estimate_peak_bytes(fn: func.FuncOp, wide: bool = False) -> int:
    """Peak memory of `run_function(fn, ...)`, inputs included, erring high.

    Follows the interpreter's order and frees; an op is charged its results
    plus, for ops whose torch kernels allocate temporaries (softmax,
    layer_norm, mean, matmul), twice its largest operand or result. `wide`:
    the peak of `run_function_f64`, whose f64 copies of the inputs count too.
    """
    block = fn.body.block
    inputs = sum(value_bytes(a) for a in block.args)
    if wide:
        inputs += sum(value_bytes(a, True) for a in block.args if is_float(_element(a)))
    return inputs + _block_extra_bytes(block, wide)


def _element(v: SSAValue) -> Attribute:
    return _tensor_type(v.type).element_type


def _block_extra_bytes(block: Block, wide: bool = False) -> int:
    """Peak bytes a block allocates on top of its arguments."""
    frees = _frees_after(block)
    live = peak = 0
    for i, op in enumerate(block.ops):
        if isinstance(op, func.ReturnOp | graph.YieldOp):
            break
        if isinstance(op, graph.FusedOp):
            now = _block_extra_bytes(op.body.block, wide)
        else:
            now = sum(value_bytes(r, wide) for r in op.results) + _workspace_bytes(op, wide)
        peak = max(peak, live + now)
        live += sum(value_bytes(r, wide) for r in op.results)
        live -= sum(
            value_bytes(v, wide) for v in frees.get(i, ()) if not isinstance(v, BlockArgument)
        )
    return peak


def _workspace_bytes(op: Operation, wide: bool = False) -> int:
    """The temporaries the evaluator holds for `op` (its `REFERENCE_TEMPORARIES` fact)."""
    temporaries = op.REFERENCE_TEMPORARIES if isinstance(op, graph.GraphOp) else 0
    if not temporaries:
        return 0
    biggest = max((value_bytes(v, wide) for v in _iter_values(op)), default=0)
    return temporaries * biggest


def _iter_values(op: Operation) -> Iterable[SSAValue]:
    yield from op.operands
    yield from op.results


__all__ = [
    "EVALUATORS",
    "EvaluationError",
    "ReferenceInterpreterError",
    "ResultMismatchError",
    "UnsupportedOpError",
    "constant_value",
    "dtype_name",
    "element_type_of",
    "estimate_peak_bytes",
    "evaluator",
    "functions",
    "is_out_of_memory",
    "random_inputs",
    "random_tensor",
    "run",
    "run_function",
    "run_function_f64",
    "torch_dtype",
    "value_bytes",
]
