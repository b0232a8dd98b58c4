"""The `graph` dialect: whole-tensor ops, the level users write.

Every op knows how to infer its result type from its operands and attributes
(`infer_type`); the front end uses that where a `.ir` file leaves the type out,
and the verifier checks a written type against it. Numerics follow the PyTorch
op of the same name (see `irc.testing.reference`).

    %y = graph.add %x, %b : tensor<8x4xf32>
    %m = graph.reduce_max %x {dims = [1], keepdim = true} : tensor<8x1xf32>
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from irc.ir.kernel_kind import KINDS, GeometryMismatch, KernelKind, RowGeometry, parse_kind
from irc.ir.names import kernel_name_problem
from irc.ir.types import (
    ELEMENT_TYPES,
    FLOAT_TYPES,
    I1,
    MAX_ELEMENTS,
    broadcast_shapes,
    format_type,
    int_array,
    numel,
    shape_of,
    tensor,
)


class GraphVerifyError(VerifyException):
    """A verifier error that can point at the definition of one operand too."""

    def __init__(self, message: str, operand: int | None = None):
        super().__init__(message)
        self.operand = operand


Props = dict[str, Attribute]


# --- attribute readers: one clear message per malformed attribute -------------


def _int_list(op_name: str, props: Props, key: str) -> list[int]:
    attr = props.get(key)
    if attr is None:
        raise GraphVerifyError(f"{op_name} needs the attribute '{key}', like {{{key} = [0]}}")
    if not isinstance(attr, ArrayAttr) or not all(
        isinstance(a, IntegerAttr) and not _is_bool(a) for a in attr.data
    ):
        raise GraphVerifyError(f"{op_name}: '{key}' must be a list of integers like [0, 1]")
    return [a.value.data for a in attr.data]  # type: ignore[union-attr]


def _is_bool(a: Attribute) -> bool:
    return isinstance(a, IntegerAttr) and a.type == I1


def _bool(op_name: str, props: Props, key: str, default: bool) -> bool:
    attr = props.get(key)
    if attr is None:
        return default
    if not _is_bool(attr):
        raise GraphVerifyError(f"{op_name}: '{key}' must be true or false")
    return bool(attr.value.data)  # type: ignore[union-attr]


def _int(op_name: str, props: Props, key: str) -> int:
    attr = props.get(key)
    if attr is None:
        raise GraphVerifyError(f"{op_name} needs the attribute '{key}', like {{{key} = 0}}")
    if not isinstance(attr, IntegerAttr) or _is_bool(attr):
        raise GraphVerifyError(f"{op_name}: '{key}' must be an integer")
    return attr.value.data


def _float(op_name: str, props: Props, key: str, default: float | None = None) -> float:
    attr = props.get(key)
    if attr is None:
        if default is None:
            raise GraphVerifyError(f"{op_name} needs the attribute '{key}', like {{{key} = 1.0}}")
        return default
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, IntegerAttr) and not _is_bool(attr):
        return float(attr.value.data)
    raise GraphVerifyError(f"{op_name}: '{key}' must be a number")


def normalize_dims(op_name: str, dims: Sequence[int], rank: int, key: str = "dims") -> list[int]:
    """Negative dims count from the end, as in PyTorch; each must be in range, once."""
    out: list[int] = []
    for d in dims:
        if not -rank <= d < rank:
            raise GraphVerifyError(
                f"{op_name}: {key} entry {d} is out of range for a rank-{rank} operand"
                + (f" (valid: {-rank}..{rank - 1})" if rank else "")
            )
        d = d % rank
        if d in out:
            raise GraphVerifyError(f"{op_name}: dimension {d} appears twice in '{key}'")
        out.append(d)
    return out


def _tensor_operand(op_name: str, t: Attribute, i: int) -> TensorType[Attribute]:
    if not isinstance(t, TensorType):
        raise GraphVerifyError(f"{op_name}: operand {i} must be a tensor, got {t}", i)
    if any(d < 1 for d in t.get_shape()):  # a module built in Python, not parsed
        raise GraphVerifyError(f"{op_name}: operand {i} is {format_type(t)}: dimensions must be positive", i)
    return t


def _require_float(op_name: str, t: TensorType[Attribute], i: int = 0) -> None:
    if t.element_type not in FLOAT_TYPES:
        raise GraphVerifyError(
            f"{op_name} needs a floating-point operand, got {format_type(t)}"
            " (use graph.cast to convert)",
            i,
        )


def _require_arith(op_name: str, t: TensorType[Attribute], i: int = 0) -> None:
    if t.element_type == I1:
        raise GraphVerifyError(
            f"{op_name} is not defined on i1 tensors, got {format_type(t)}"
            " (use graph.cast to convert)",
            i,
        )


def _same_element(op_name: str, types: Sequence[TensorType[Attribute]], first: int = 0) -> None:
    base = types[0].element_type
    for i, t in enumerate(types[1:], 1):
        if t.element_type != base:
            raise GraphVerifyError(
                f"{op_name}: operands must share one element type, got "
                f"{format_type(types[0])} and {format_type(t)} (use graph.cast to convert)",
                i + first,
            )


def _broadcast(op_name: str, types: Sequence[TensorType[Attribute]]) -> tuple[int, ...]:
    shapes = [tuple(t.get_shape()) for t in types]
    out = broadcast_shapes(*shapes)
    if out is None:
        listed = ", ".join(format_type(t) for t in types)
        raise GraphVerifyError(f"{op_name}: operand shapes do not broadcast: {listed}", 1)
    return out


class GraphOp(IRDLOperation):
    """Base of graph ops: type inference plus the check of the written type."""

    REQUIRED_RESULT_TYPE: ClassVar[bool] = False
    """Ops such as cast and reshape cannot infer their type: it must be written."""
    SHORT_NAME: ClassVar[str | None] = None
    """The op's word in the kernel names `fuse` makes (`red_amax_0`); None: its
    name without `graph.`."""
    VIEW: ClassVar[bool] = False
    """The op moves or repeats elements and computes nothing: `fuse` sees through
    it (a view of its operand) rather than counting it as work."""
    SUBSET: ClassVar[bool] = False
    """A view that keeps only some of its operand's elements (a slice): matchers that
    need every element (passes/fuse_attention.py) do not look through it."""
    GENERATOR: ClassVar[bool] = False
    """The op reads no operand (a splat, an index): every kernel that reads it
    computes it itself, so `fuse` counts it as free."""
    REINDEXING: ClassVar[bool] = False
    """The op computes, reading its operands at other indices than its own (a concat,
    a gather): `fuse` keeps it out of row and contraction kernels, which compute a
    member only at its own row or tile."""
    REFERENCE_TEMPORARIES: ClassVar[int] = 0
    """How many temporaries as large as its largest operand or result the reference
    evaluator (irc.testing.reference) holds while computing it: its peak-memory estimate."""

    @classmethod
    def short_name(cls) -> str:
        """The op's word in kernel names (`SHORT_NAME`, else its name without `graph.`)."""
        return cls.SHORT_NAME or cls.name.removeprefix("graph.")

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        raise NotImplementedError

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        """Checks a type the user wrote (or a pass built) against the inferred one."""
        inferred = cls.infer_type(operands, props)
        if inferred != t:
            raise GraphVerifyError(
                f"{cls.name}: result type {format_type(t)} does not match the "
                f"inferred type {format_type(inferred)}"
            )

    @classmethod
    def make(
        cls,
        *operands: SSAValue | Operation,
        result_type: Attribute | None = None,
        **props: Attribute,
    ) -> GraphOp:
        """Builds the op, inferring its result type unless one is given."""
        values = [SSAValue.get(o) for o in operands]
        if result_type is None:
            result_type = cls.infer_type([v.type for v in values], props)
        return cls.create(operands=values, result_types=[result_type], properties=props)

    def verify_(self) -> None:
        operand_types = [o.type for o in self.operands]
        for i, t in enumerate(operand_types):
            _tensor_operand(self.name, t, i)
        self.check_written_type(operand_types, dict(self.properties), self.results[0].type)


# --- element-wise --------------------------------------------------------------


class Cost(Enum):
    """What recomputing an op per element costs: fusion recomputes only cheap ops
    (passes/fuse.py), for instance when a small operand broadcasts into a kernel."""

    CHEAP = "cheap"
    """An ALU instruction or two: comparisons, selects, add, mul, floor."""
    TRANSCENDENTAL = "transcendental"
    """A special-function unit or a multi-instruction sequence: exp, sqrt, division."""


Template = str | Mapping[str, str]
"""A scalar Triton expression over `{0}`, `{1}`, ...; a mapping picks one by the
first operand's element type: its name (`"f64"`) first, then `"float"` or `"int"`,
and may give a `HALF_RESULT` form."""

HALF_RESULT = "half_result"
"""The key of a template's form for f32 arithmetic whose result is only rounded to
f16 or bf16 (`tile_to_triton.rounded_to_half`). Its exp is Triton's `ex2.approx` of
`x * log2(e)` rather than CUDA's `expf`: |x| 2**-24 of relative error (5e-6 at x =
88), under a hundredth of an f16 half ulp and a thousandth of a bf16 one, for
half the instructions. In a GEMM's epilogue, which no load overlaps, that is
time: 8192x768 @ 768x3072 bf16 + bias + tanh GELU took 95 us with expf and 84
with this form on an H200 (the bare GEMM 67, cuBLAS's 58)."""

FAST_EXP = "tl.exp({0})"
"""Triton's `ex2.approx` of `x * log2(e)`: the exp where its error vanishes (a
`HALF_RESULT` form, `fast_exp`)."""


def _exp_forms(template: str) -> dict[str, str]:
    """A template written with CUDA's expf (`_irc_exp`), and its `HALF_RESULT` form:
    the same with `FAST_EXP`."""
    fast = template.replace("_irc_exp(", FAST_EXP.removesuffix("{0})"))
    return {"float": template, HALF_RESULT: fast}


@dataclass(frozen=True)
class Fuzz:
    """How `irc.testing.graphgen` draws an element-wise op in random programs.

    Values carry a rough magnitude (`scale`) and whether two correct
    implementations agree on them bit for bit (`exact`); these facts keep the
    op's operands well-conditioned and say what its result is.
    """

    weight: int = 1
    """Relative frequency among the ops of its builder (0: never drawn)."""
    domain: str = "real"
    """Operands: "real" (any float), "bounded" (squashed to |x| <= `bound`),
    "positive" (|x| + `bound`; for a binary op, its right operand), or "exact"
    (exact values only: a jump such as floor's turns an ulp into 1)."""
    bound: float = 3.0
    raw: float = 0.0
    """With "positive": how often an exact operand goes in as it is (NaN where
    the op is undefined, in the reference and the kernels alike)."""
    scale: str = "same"
    """The result's magnitude: "same" as the (first) operand, "unit" (<= 1),
    "exp" (e**(3 scale)), "sqrt", or for binary ops "sum", "product", "max"."""
    exact: bool | None = None
    """Whether an exact result comes of exact operands; None: the op's EXACT."""
    recipe: str | None = None
    """A graphgen method that builds the op itself ("compare", "power", ...);
    None: the generic unary or binary builder."""
    activation: bool = False
    """Drawn as the activation of a GEMM epilogue."""
    normalizer: bool = False
    """Drawn as the binary op that combines a value with a reduction of its rows
    (`x - max`, `x / sum`: graphgen's `normalize`), its operand kept as `domain` says."""


@dataclass(frozen=True)
class Comparison:
    """A comparison op's meaning: which orderings of its operands `a`, `b` make it
    true. Analyses read it instead of its name: the bounds a comparison puts on
    each operand (irc.analysis.bounds), a causal mask's diagonal
    (lowering/attention_to_tile.py)."""

    less: bool
    equal: bool
    greater: bool

    def mirrored(self) -> Comparison:
        """The comparison of the swapped operands: `b OP' a` is `a OP b`."""
        return Comparison(self.greater, self.equal, self.less)

    @property
    def order(self) -> bool:
        """An order (<, <=, >, >=): true on one side of the diagonal, not on the other."""
        return self.less != self.greater


class ElementwiseOp(GraphOp):
    """A graph op computed element by element, as one `loop.apply` and `tile.apply`.

    Its facts live here, on the op class, and every level reads them from here
    (docs/architecture.md, "Adding an op"); tests/test_op_facts.py checks that
    every element-wise op has each one.
    """

    FN: ClassVar[str]
    """The `fn` of the loop.apply and tile.apply that compute the op."""
    ARITY: ClassVar[int]
    REFERENCE: ClassVar[str | None]
    """The torch function that defines the op's numerics (irc.testing.reference imports it
    lazily, so the dialect loads without torch); None: a custom evaluator there."""
    TRITON: ClassVar[Template | None]
    """The scalar Triton expression; None: tile_to_triton builds it (cast)."""
    COST: ClassVar[Cost]
    ROUNDING_COMMUTES: ClassVar[bool] = False
    """op(round(x)) == round(op(x)) for rounding to half precision (monotone or
    sign-symmetric ops, selections): lowered, the operands' rounding goes."""
    EXACT: ClassVar[bool] = False
    """The result is exactly representable: the op never rounds."""
    FUZZ: ClassVar[Fuzz] = Fuzz()
    EXTRA_FNS: ClassVar[Mapping[str, Template]] = {}
    """Other scalar functions the op lowers to, with their Triton forms: a variant an
    attribute picks (gelu's tanh form), which `scalar_fn` names."""
    NUMPY: ClassVar[str | None] = None
    """The numpy function that computes it on integer arrays as Triton does (the
    bounds analysis evaluates index arithmetic with it); None: not evaluated there."""
    COMPARISON: ClassVar[Comparison | None] = None
    """A comparison's meaning (`Comparison`); None: not a comparison."""
    LINEAR: ClassVar[tuple[int, ...] | None] = None
    """The op is the sum of its operands times these signs (`a + b`: (1, 1), `a - b`:
    (1, -1)): analyses read an index plus a constant through it."""
    RIGHT_IDENTITY: ClassVar[int | None] = None
    """A right operand that gives the left one back (`x + 0`, `x * 1`): index
    arithmetic with that constant folds away (lowering/loop_to_tile.py)."""

    def scalar_fn(self) -> str:
        """The `fn` of the loop.apply that computes this op (its FN, or a variant)."""
        return self.FN


class UnaryOp(ElementwiseOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    ARITY: ClassVar[int] = 1
    FLOAT_ONLY: ClassVar[bool] = True

    def __init__(self, x: SSAValue | Operation):
        x = SSAValue.get(x)
        super().__init__(operands=[x], result_types=[self.infer_type([x.type], {})])

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        (t,) = operands
        t = _tensor_operand(cls.name, t, 0)
        if cls.FLOAT_ONLY:
            _require_float(cls.name, t)
        else:
            _require_arith(cls.name, t)
        return t


def _facts(op_name: str, doc: str, **facts: object) -> dict[str, object]:
    """The class namespace of a factory-made op: its name, doc and UPPER_CASE facts."""
    namespace: dict[str, object] = {
        "name": f"graph.{op_name}",
        "__doc__": doc,
        "FN": op_name,
        "__annotations__": {"FN": "ClassVar[str]"},
    }
    for key, value in facts.items():
        namespace[key.upper()] = value
        namespace["__annotations__"][key.upper()] = "ClassVar[object]"  # type: ignore[index]
    return namespace


def _unary(
    op_name: str,
    doc: str,
    *,
    reference: str,
    triton: Template,
    cost: Cost,
    float_only: bool = True,
    **facts: object,
) -> type[UnaryOp]:
    namespace = _facts(
        op_name, doc, reference=reference, triton=triton, cost=cost, float_only=float_only, **facts
    )
    return irdl_op_definition(type(_class_name(op_name), (UnaryOp,), namespace))


def _class_name(op_name: str) -> str:
    return "".join(p.capitalize() for p in op_name.split("_")) + "Op"


CHEAP, TRANSCENDENTAL = Cost.CHEAP, Cost.TRANSCENDENTAL
_MAX_NAN = "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"
_MIN_NAN = "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"


def _round_half_even(c: str) -> str:
    """rint without libdevice, which Triton's interpreter lacks: below `c` (2**23 for
    f32, 2**52 for f64) adding and subtracting `c` rounds a magnitude to an integer,
    halves to even, as the FPU rounds; from `c` on every float is an integer. Zeros,
    NaN and inf pass as they are, and -0.3 becomes -0.0, as in torch."""
    magnitude = f"((tl.abs({{0}}) + {c}) - {c})"
    sign = "tl.where({0} < 0, -1.0, 1.0)"
    return f"tl.where((tl.abs({{0}}) < {c}) & ({{0}} != 0), {sign} * {magnitude}, {{0}})"


_RINT_F32 = _round_half_even("8388608.0")


def _floor_f32(x: str = "{0}") -> str:
    """floor as rint, minus 1 where that rounded up: tl.floor goes through libdevice,
    which Triton builds flushing f32 subnormals to zero (floor(-1e-40) would be -0.0;
    torch gives -1.0). Adds, compares and selects keep subnormals."""
    r = _RINT_F32.replace("{0}", x)
    return f"tl.where({r} > {x}, {r} - 1.0, {r})"


NegOp = _unary(
    "neg", "-x", reference="torch.neg", float_only=False, cost=CHEAP, numpy="numpy.negative",
    # Triton's unary minus is `0 - x`, which makes +0.0 of +0.0; torch gives -0.0.
    triton={"float": "{0} * -1.0", "int": "-{0}"},
    exact=True, rounding_commutes=True,
)
AbsOp = _unary(
    "abs", "|x|", reference="torch.abs", triton="tl.abs({0})", float_only=False, cost=CHEAP,
    exact=True, rounding_commutes=True, numpy="numpy.abs",
)
ExpOp = _unary(
    "exp", "e**x", reference="torch.exp", triton=_exp_forms("_irc_exp({0})"),
    cost=TRANSCENDENTAL,
    fuzz=Fuzz(domain="bounded", bound=3.0, scale="exp"),
    # 2**x: an attention's probabilities in log2 units (lowering/attention_to_tile.py).
    # fast_exp: ex2.approx of x * log2(e), |x| 2**-24 off, where only sums of the
    # values are kept (a softmax's statistics, an attention's probabilities).
    extra_fns={"exp2": "tl.math.exp2({0})", "fast_exp": FAST_EXP},
)
LogOp = _unary(
    "log", "natural logarithm", reference="torch.log", triton="tl.log({0})",
    cost=TRANSCENDENTAL,
    # log is ill-conditioned near 1: its argument is kept at 3 or more.
    fuzz=Fuzz(domain="positive", bound=3.0, raw=0.3, scale="sqrt"),
)
SqrtOp = _unary(
    "sqrt", "square root", reference="torch.sqrt", cost=TRANSCENDENTAL,
    # tl.sqrt_rn takes f32 only; f64 sqrt is IEEE.
    triton={"f64": "tl.sqrt({0})", "float": "tl.sqrt_rn({0})"},
    fuzz=Fuzz(domain="positive", bound=1.0, raw=0.3, scale="sqrt"),
)
RsqrtOp = _unary(
    "rsqrt", "1 / sqrt(x)", reference="torch.rsqrt", triton="tl.rsqrt({0})",
    cost=TRANSCENDENTAL, fuzz=Fuzz(domain="positive", bound=1.0, scale="unit"),
)
# sin keeps its argument's absolute error: a large argument (a sum of squares, say)
# would turn its rounding into a visible difference, so the fuzzer bounds it.
SinOp = _unary(
    "sin", "sine", reference="torch.sin", triton="tl.sin({0})", cost=TRANSCENDENTAL,
    fuzz=Fuzz(domain="bounded", bound=3.0, scale="unit"),
)
CosOp = _unary(
    "cos", "cosine", reference="torch.cos", triton="tl.cos({0})", cost=TRANSCENDENTAL,
    fuzz=Fuzz(domain="bounded", bound=3.0, scale="unit"),
)
TanhOp = _unary(
    "tanh", "hyperbolic tangent", reference="torch.tanh", triton="_irc_tanh({0})",
    cost=TRANSCENDENTAL, fuzz=Fuzz(scale="unit", activation=True),
)
SigmoidOp = _unary(
    "sigmoid", "1 / (1 + e**-x)", reference="torch.sigmoid",
    triton=_exp_forms("1.0 / (1.0 + _irc_exp(-{0}))"),
    cost=TRANSCENDENTAL, fuzz=Fuzz(scale="unit", activation=True),
)
ReluOp = _unary(
    "relu", "max(x, 0), NaN propagating", reference="torch.relu", float_only=False, cost=CHEAP,
    triton={"float": "tl.maximum({0}, 0.0, propagate_nan=tl.PropagateNan.ALL)",
            "int": "tl.maximum({0}, 0)"},
    exact=True, rounding_commutes=True, fuzz=Fuzz(activation=True),
)  # fmt: skip
GELU_MODES = ("none", "tanh")
"""`approximate` of graph.gelu, as F.gelu's: the exact erf form, or the tanh one."""


@irdl_op_definition
class GeluOp(UnaryOp):
    """GELU: `x * (1 + erf(x / sqrt(2))) / 2`, or with `{approximate = "tanh"}`
    `x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))) / 2` (F.gelu's forms).

    The tanh form is computed as `x * sigmoid(2u)`, `x / (1 + exp(-2u))`, which
    equals `x * (1 + tanh(u)) / 2`: no branch and no spill where CUDA's tanhf had
    one per element (a GEMM's epilogue of 128 elements a thread spilled registers:
    8192x768 @ 768x3072 bf16 + bias + GELU took 140 us on an H200, 84 with this
    form), and no cancellation in `1 + tanh(u)` for negative x, so it is nearer
    f64 than torch's own f32 result there."""

    name = "graph.gelu"
    approximate = opt_prop_def(Attribute)
    FN: ClassVar[str] = "gelu"
    REFERENCE: ClassVar[str | None] = "torch.nn.functional.gelu"  # with approximate=
    TRITON: ClassVar[Template | None] = {
        "float": "0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476))",
        # x * Phi(x) through 2**p(|x|), half libdevice erff's instructions (helpers.py)
        HALF_RESULT: "_irc_gelu_half({0})",
    }
    EXTRA_FNS: ClassVar[Mapping[str, Template]] = {
        "gelu_tanh": {
            # exp(-2u) with 2u = 2 sqrt(2 / pi) (x + 0.044715 x**3); in log2 units for halves
            "float": "{0} / (1.0 + _irc_exp(-1.5957691216057308 * "
            "({0} + 0.044715 * {0} * {0} * {0})))",
            HALF_RESULT: "{0} / (1.0 + tl.exp2(-2.302208198144325 * "
            "({0} + 0.044715 * {0} * {0} * {0})))",
        },
    }
    COST: ClassVar[Cost] = Cost.TRANSCENDENTAL
    FUZZ: ClassVar[Fuzz] = Fuzz(activation=True)

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        cls.mode_of(props)
        return super().infer_type(operands, props)

    @staticmethod
    def mode_of(props: Props) -> str:
        attr = props.get("approximate")
        if attr is None:
            return "none"
        if not isinstance(attr, StringAttr) or attr.data not in GELU_MODES:
            raise GraphVerifyError('graph.gelu: approximate is "none" or "tanh"')
        return attr.data

    def mode(self) -> str:
        return self.mode_of(dict(self.properties))

    def scalar_fn(self) -> str:
        return "gelu_tanh" if self.mode() == "tanh" else "gelu"
SiluOp = _unary(
    "silu", "x * sigmoid(x)", reference="torch.nn.functional.silu",
    triton=_exp_forms("{0} / (1.0 + _irc_exp(-{0}))"),
    cost=TRANSCENDENTAL, fuzz=Fuzz(activation=True),
)
ReciprocalOp = _unary(
    "reciprocal", "1 / x", reference="torch.reciprocal", triton="1.0 / {0}",
    cost=TRANSCENDENTAL, fuzz=Fuzz(domain="positive", bound=1.0, scale="unit"),
)

ErfOp = _unary(
    "erf", "error function", reference="torch.special.erf", triton="tl.erf({0})",
    cost=TRANSCENDENTAL, fuzz=Fuzz(scale="unit"),
)
# floor, ceil and round give integers: exact, and cheap (one instruction), but they
# jump, so an ulp of difference in their operand can change the result by 1.
FloorOp = _unary(
    "floor", "largest integer <= x", reference="torch.floor", cost=CHEAP,
    triton={"f64": "tl.floor({0})", "float": _floor_f32()},
    exact=True, fuzz=Fuzz(domain="exact"),
)
CeilOp = _unary(
    "ceil", "smallest integer >= x", reference="torch.ceil", cost=CHEAP,
    # -floor(-x); `* -1.0` keeps the sign of a zero (ceil(-0.5) is -0.0).
    triton={"f64": "tl.ceil({0})", "float": f"{_floor_f32('({0} * -1.0)')} * -1.0"},
    exact=True, fuzz=Fuzz(domain="exact"),
)
RoundOp = _unary(
    "round", "nearest integer, halves to even (torch.round)", reference="torch.round",
    triton={"f64": _round_half_even("4503599627370496.0"), "float": _RINT_F32},
    cost=CHEAP, exact=True, fuzz=Fuzz(domain="exact"),
)


class BinaryOp(ElementwiseOp):
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    ARITY: ClassVar[int] = 2
    KIND: ClassVar[str] = "arith"  # "arith", "float", "compare"

    def __init__(self, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        super().__init__(
            operands=[lhs, rhs], result_types=[self.infer_type([lhs.type, rhs.type], {})]
        )

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        types = [_tensor_operand(cls.name, t, i) for i, t in enumerate(operands)]
        _same_element(cls.name, types)
        if cls.KIND == "float":
            _require_float(cls.name, types[0])
        elif cls.KIND == "arith":
            _require_arith(cls.name, types[0])
        shape = _broadcast(cls.name, types)
        element = I1 if cls.KIND == "compare" else types[0].element_type
        return tensor(shape, element)


def _binary(
    op_name: str,
    doc: str,
    kind: str,
    *,
    reference: str,
    triton: Template,
    cost: Cost,
    **facts: object,
) -> type[BinaryOp]:
    if kind == "compare":
        assert isinstance(facts.get("comparison"), Comparison), f"{op_name}: its Comparison"
        facts = {"exact": True, "fuzz": Fuzz(recipe="compare"), **facts}
    namespace = _facts(op_name, doc, kind=kind, reference=reference, triton=triton, cost=cost,
                       **facts)  # fmt: skip
    return irdl_op_definition(type(_class_name(op_name), (BinaryOp,), namespace))


AddOp = _binary(
    "add", "a + b", "arith", reference="torch.add", triton="{0} + {1}", cost=CHEAP,
    fuzz=Fuzz(scale="sum", exact=True, normalizer=True),  # one correctly rounded IEEE add
    numpy="numpy.add", linear=(1, 1), right_identity=0,
)
SubOp = _binary(
    "sub", "a - b", "arith", reference="torch.sub", triton="{0} - {1}", cost=CHEAP,
    fuzz=Fuzz(scale="sum", exact=True, normalizer=True),
    numpy="numpy.subtract", linear=(1, -1), right_identity=0,
)
MulOp = _binary(
    "mul", "a * b", "arith", reference="torch.mul", triton="{0} * {1}", cost=CHEAP,
    fuzz=Fuzz(domain="bounded", bound=10.0, scale="product", normalizer=True),
    numpy="numpy.multiply", right_identity=1,
)
DivOp = _binary(
    "div", "a / b (true division)", "float", reference="torch.true_divide",
    # Triton's f32 `/` is div.full.f32 (2 ulp); torch divides correctly rounded, and
    # round(x, decimals=3)'s r / 1000 must give its bits. A result only rounded to a
    # half type keeps the fast form.
    triton={"f32": "tl.div_rn({0}, {1})", "float": "{0} / {1}", HALF_RESULT: "{0} / {1}"},
    cost=TRANSCENDENTAL,
    fuzz=Fuzz(domain="positive", bound=1.0, scale="same", normalizer=True),  # |b| + 1
)
MaximumOp = _binary(
    "maximum", "element-wise max, NaN propagating", "arith",
    reference="torch.maximum",  # NaN-propagating, unlike torch.fmax
    triton={"float": _MAX_NAN, "int": "tl.maximum({0}, {1})"}, cost=CHEAP,
    exact=True, rounding_commutes=True, fuzz=Fuzz(scale="max"), numpy="numpy.maximum",
)
MinimumOp = _binary(
    "minimum", "element-wise min, NaN propagating", "arith", reference="torch.minimum",
    triton={"float": _MIN_NAN, "int": "tl.minimum({0}, {1})"}, cost=CHEAP,
    exact=True, rounding_commutes=True, fuzz=Fuzz(scale="max"), numpy="numpy.minimum",
)
PowOp = _binary(
    "pow", "a ** b", "float", reference="torch.pow", triton="_irc_pow({0}, {1})",
    cost=TRANSCENDENTAL, fuzz=Fuzz(recipe="power"),
)
# Each comparison says which orderings of a and b make it true (less, equal, greater).
EqOp = _binary("eq", "a == b", "compare", reference="torch.eq", triton="{0} == {1}", cost=CHEAP,
               comparison=Comparison(False, True, False), numpy="numpy.equal")
NeOp = _binary("ne", "a != b", "compare", reference="torch.ne", triton="{0} != {1}", cost=CHEAP,
               comparison=Comparison(True, False, True), numpy="numpy.not_equal")
LtOp = _binary("lt", "a < b", "compare", reference="torch.lt", triton="{0} < {1}", cost=CHEAP,
               comparison=Comparison(True, False, False), numpy="numpy.less")
LeOp = _binary("le", "a <= b", "compare", reference="torch.le", triton="{0} <= {1}", cost=CHEAP,
               comparison=Comparison(True, True, False), numpy="numpy.less_equal")
GtOp = _binary("gt", "a > b", "compare", reference="torch.gt", triton="{0} > {1}", cost=CHEAP,
               comparison=Comparison(False, False, True), numpy="numpy.greater")
GeOp = _binary("ge", "a >= b", "compare", reference="torch.ge", triton="{0} >= {1}", cost=CHEAP,
               comparison=Comparison(False, True, True), numpy="numpy.greater_equal")


@irdl_op_definition
class WhereOp(ElementwiseOp):
    """`cond ? a : b`, all three broadcasting."""

    name = "graph.where"
    cond = operand_def(TensorType)
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    FN: ClassVar[str] = "where"
    ARITY: ClassVar[int] = 3
    REFERENCE: ClassVar[str | None] = "torch.where"
    TRITON: ClassVar[Template | None] = "tl.where({0}, {1}, {2})"
    COST: ClassVar[Cost] = Cost.CHEAP
    ROUNDING_COMMUTES: ClassVar[bool] = True
    EXACT: ClassVar[bool] = True
    FUZZ: ClassVar[Fuzz] = Fuzz(recipe="where")
    NUMPY: ClassVar[str | None] = "numpy.where"

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        types = [_tensor_operand(cls.name, t, i) for i, t in enumerate(operands)]
        if types[0].element_type != I1:
            raise GraphVerifyError(
                f"graph.where: the condition must be an i1 tensor, got {format_type(types[0])}",
                0,
            )
        _same_element(cls.name, types[1:], first=1)
        return tensor(_broadcast(cls.name, types), types[1].element_type)


# --- type and layout changes ---------------------------------------------------


@irdl_op_definition
class CastOp(ElementwiseOp):
    """Element-type conversion with PyTorch's `Tensor.to` semantics."""

    name = "graph.cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REQUIRED_RESULT_TYPE: ClassVar[bool] = True
    FN: ClassVar[str] = "cast"
    ARITY: ClassVar[int] = 1
    REFERENCE: ClassVar[str | None] = None  # irc.testing.reference: `Tensor.to` the result's dtype
    TRITON: ClassVar[Template | None] = None  # tile_to_triton: by source and target type
    COST: ClassVar[Cost] = Cost.CHEAP
    FUZZ: ClassVar[Fuzz] = Fuzz(recipe="cast")

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        (x,) = operands
        if not isinstance(t, TensorType) or tuple(t.get_shape()) != tuple(x.get_shape()):  # type: ignore[attr-defined]
            raise GraphVerifyError(
                f"graph.cast changes only the element type: {format_type(x)} cannot "
                f"become {format_type(t)}"
            )


@irdl_op_definition
class ConstantOp(GraphOp):
    """A splat constant: every element equals `value`."""

    name = "graph.constant"
    value = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    GENERATOR: ClassVar[bool] = True
    REQUIRED_RESULT_TYPE: ClassVar[bool] = True

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        if not isinstance(t, TensorType):
            raise GraphVerifyError(f"graph.constant must produce a tensor, got {t}")
        _check_size(t)
        v = props.get("value")
        if v is None:
            raise GraphVerifyError("graph.constant needs the attribute 'value', like {value = 1.0}")
        if _is_bool(v):
            if t.element_type != I1:
                raise GraphVerifyError(
                    f"graph.constant: a true/false value needs an i1 tensor, got {format_type(t)}"
                )
            return
        number = _float("graph.constant", props, "value")
        if t.element_type == I1:
            if number not in (0.0, 1.0):
                raise GraphVerifyError("graph.constant: an i1 value must be true, false, 0 or 1")
        elif t.element_type not in FLOAT_TYPES:
            if isinstance(v, FloatAttr) and not float(number).is_integer():
                raise GraphVerifyError(
                    f"graph.constant: {number} is not an integer, as {format_type(t)} needs"
                )
            bits = 64 if "i64" in format_type(t) else 32
            # An integer is checked as written; `1e19` is checked as the whole number it is.
            written = v.value.data if isinstance(v, IntegerAttr) else number
            if not -(2 ** (bits - 1)) <= int(written) < 2 ** (bits - 1):
                raise GraphVerifyError(f"graph.constant: {written} does not fit in i{bits}")

    def verify_(self) -> None:
        self.check_written_type([], dict(self.properties), self.result.type)


@irdl_op_definition
class ReshapeOp(GraphOp):
    """Same elements, new shape (row-major order, as `torch.reshape`)."""

    name = "graph.reshape"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    VIEW: ClassVar[bool] = True
    REQUIRED_RESULT_TYPE: ClassVar[bool] = True

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        (x,) = operands
        if not isinstance(t, TensorType):
            raise GraphVerifyError(f"graph.reshape must produce a tensor, got {t}")
        if t.element_type != x.element_type:  # type: ignore[attr-defined]
            raise GraphVerifyError(
                f"graph.reshape keeps the element type: {format_type(x)} cannot "
                f"become {format_type(t)}"
            )
        if numel(t.get_shape()) != numel(x.get_shape()):  # type: ignore[attr-defined]
            raise GraphVerifyError(
                f"graph.reshape must keep the element count: {format_type(x)} has "
                f"{numel(x.get_shape())}, {format_type(t)} has {numel(t.get_shape())}"  # type: ignore[attr-defined]
            )


@irdl_op_definition
class BroadcastOp(GraphOp):
    """Explicit broadcast to the written result type (as `Tensor.expand`)."""

    name = "graph.broadcast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    VIEW: ClassVar[bool] = True
    REQUIRED_RESULT_TYPE: ClassVar[bool] = True

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        (x,) = operands
        if not isinstance(t, TensorType) or t.element_type != x.element_type:  # type: ignore[attr-defined]
            raise GraphVerifyError(
                f"graph.broadcast keeps the element type: {format_type(x)} cannot "
                f"become {format_type(t)}"
            )
        src, dst = tuple(x.get_shape()), tuple(t.get_shape())  # type: ignore[attr-defined]
        if len(src) > len(dst) or broadcast_shapes(src, dst) != dst:
            raise GraphVerifyError(
                f"graph.broadcast: {format_type(x)} does not broadcast to {format_type(t)}"
            )


@irdl_op_definition
class TransposeOp(GraphOp):
    """Permutes dimensions: result dim i is input dim perm[i] (`Tensor.permute`)."""

    name = "graph.transpose"
    input = operand_def(TensorType)
    perm = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    VIEW: ClassVar[bool] = True

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x = _tensor_operand(cls.name, operands[0], 0)
        shape = x.get_shape()
        perm = _int_list(cls.name, props, "perm")
        if len(perm) != len(shape):
            raise GraphVerifyError(
                f"graph.transpose: perm has {_count(len(perm), 'entry', 'entries')} for a "
                f"rank-{len(shape)} operand"
            )
        perm = normalize_dims(cls.name, perm, len(shape), "perm")
        return tensor([shape[p] for p in perm], x.element_type)

    def permutation(self) -> list[int]:
        """`perm` with negative entries counted from the end (as written, they may be)."""
        rank = len(self.input.type.get_shape())  # type: ignore[attr-defined]
        return [p % rank for p in _int_list(self.name, dict(self.properties), "perm")]


def under_transposes(v: SSAValue) -> tuple[SSAValue, list[int]]:
    """The value under the transposes (none or several in a row) that make `v`, and the
    one permutation they make of it: `v == transpose(base, perm)`."""
    perm = list(range(len(shape_of(v.type))))
    while isinstance(v.owner, TransposeOp):
        inner = v.owner.permutation()
        perm = [inner[p] for p in perm]
        v = v.owner.input
    return v, perm


# --- indexing and generation (models imported from PyTorch) --------------------


INDEX_ELEMENTS = frozenset(ELEMENT_TYPES[n] for n in ("i32", "i64"))
"""Element types of index tensors (index_select, gather) and of iota's integers."""


@irdl_op_definition
class SliceOp(GraphOp):
    """`x[start:end:step]` in every dimension: a view, an index map in its readers'
    kernels (`start + i * step`), never a copy of its own."""

    name = "graph.slice"
    input = operand_def(TensorType)
    start = opt_prop_def(Attribute)
    end = opt_prop_def(Attribute)
    step = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    VIEW: ClassVar[bool] = True
    SUBSET: ClassVar[bool] = True

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x = _tensor_operand(cls.name, operands[0], 0)
        shape = x.get_shape()
        start, end, step = cls.bounds(props, len(shape))
        out: list[int] = []
        for d, (size, s, e, k) in enumerate(zip(shape, start, end, step, strict=True)):
            if k < 1:
                raise GraphVerifyError(f"graph.slice: step {k} of dimension {d} must be 1 or more")
            if not 0 <= s <= e <= size:
                raise GraphVerifyError(
                    f"graph.slice: dimension {d} of size {size} cannot be sliced {s}:{e} "
                    f"(needs 0 <= start <= end <= {size})"
                )
            if s == e:
                raise GraphVerifyError(f"graph.slice: dimension {d} is sliced empty ({s}:{e})")
            out.append(-(-(e - s) // k))
        return tensor(out, x.element_type)

    @classmethod
    def bounds(cls, props: Props, rank: int) -> tuple[list[int], list[int], list[int]]:
        """start, end and step (default all 1), one entry per dimension each."""
        lists = []
        for key in ("start", "end", "step"):
            values = (
                [1] * rank
                if key == "step" and key not in props
                else _int_list(cls.name, props, key)
            )
            if len(values) != rank:
                raise GraphVerifyError(
                    f"graph.slice: '{key}' has {_count(len(values), 'entry', 'entries')} for a "
                    f"rank-{rank} operand (one per dimension)"
                )
            lists.append(values)
        return lists[0], lists[1], lists[2]

    def slice_bounds(self) -> tuple[list[int], list[int], list[int]]:
        """start, end and step as the kernels and the reference use them: a dimension
        that keeps one element is `start:start + 1:1`, whatever step was written (a step
        past the dimension, up to 2**63 - 1, would overflow their index arithmetic)."""
        start, end, step = self.bounds(dict(self.properties), len(self.input.type.get_shape()))  # type: ignore[attr-defined]
        one = [e - s <= k for s, e, k in zip(start, end, step, strict=True)]
        end = [s + 1 if o else e for s, e, o in zip(start, end, one, strict=True)]
        step = [1 if o else k for k, o in zip(step, one, strict=True)]
        return start, end, step


@irdl_op_definition
class ConcatOp(GraphOp):
    """Operands joined along `dim` (as `torch.cat`). Computed where it is read: each
    element selects the operand its index falls in, so a concat feeding element-wise
    work is a select between loads inside that kernel (`rotate_half` is one kernel)."""

    name = "graph.concat"
    inputs = var_operand_def(TensorType)
    dim = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REINDEXING: ClassVar[bool] = True
    COST: ClassVar[Cost] = Cost.CHEAP
    """A compare and a select per operand: cheap enough to recompute (passes/fuse.py)."""

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        if not operands:
            raise GraphVerifyError("graph.concat needs at least one operand")
        types = [_tensor_operand(cls.name, t, i) for i, t in enumerate(operands)]
        _same_element(cls.name, types)
        first = types[0].get_shape()
        if not first:
            raise GraphVerifyError("graph.concat needs operands of rank 1 or more", 0)
        (d,) = normalize_dims(cls.name, [_int(cls.name, props, "dim")], len(first), "dim")
        total = 0
        for i, t in enumerate(types):
            shape = t.get_shape()
            if len(shape) != len(first) or any(
                a != b for k, (a, b) in enumerate(zip(shape, first, strict=True)) if k != d
            ):
                raise GraphVerifyError(
                    f"graph.concat: operand {i}, {format_type(t)}, does not fit operand 0, "
                    f"{format_type(types[0])}: operands have one rank and equal sizes in "
                    f"every dimension but {d}",
                    i,
                )
            total += shape[d]
        return tensor([total if k == d else s for k, s in enumerate(first)], types[0].element_type)

    def axis(self) -> int:
        rank = len(self.inputs[0].type.get_shape())  # type: ignore[attr-defined]
        return _int(self.name, dict(self.properties), "dim") % rank


@irdl_op_definition
class IotaOp(GraphOp):
    """Each element is its index along `dim` (`torch.arange` broadcast to the type).

    Like a constant it is never a kernel: its readers compute it from their own
    loop indices (graph-to-loop casts the index to the element type)."""

    name = "graph.iota"
    dim = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    GENERATOR: ClassVar[bool] = True
    REQUIRED_RESULT_TYPE: ClassVar[bool] = True

    @classmethod
    def check_written_type(cls, operands: Sequence[Attribute], props: Props, t: Attribute) -> None:
        if not isinstance(t, TensorType):
            raise GraphVerifyError(f"graph.iota must produce a tensor, got {t}")
        _check_size(t)
        if t.element_type not in INDEX_ELEMENTS | FLOAT_TYPES:
            raise GraphVerifyError(
                f"graph.iota makes i32, i64 or floating-point tensors, not {format_type(t)}"
            )
        shape = t.get_shape()
        if not shape:
            raise GraphVerifyError("graph.iota needs a result of rank 1 or more")
        (d,) = normalize_dims(cls.name, [_int(cls.name, props, "dim")], len(shape), "dim")
        if t.element_type == ELEMENT_TYPES["i32"] and shape[d] > 2**31:
            raise GraphVerifyError(f"graph.iota: indices up to {shape[d] - 1} do not fit in i32")

    def verify_(self) -> None:
        self.check_written_type([], dict(self.properties), self.result.type)

    def axis(self) -> int:
        rank = len(self.result.type.get_shape())  # type: ignore[attr-defined]
        return _int(self.name, dict(self.properties), "dim") % rank


def _index_operand(op_name: str, t: TensorType[Attribute]) -> None:
    if t.element_type not in INDEX_ELEMENTS:
        raise GraphVerifyError(
            f"{op_name}: indices must be an i32 or i64 tensor, got {format_type(t)}"
            " (use graph.cast to convert)",
            1,
        )


class IndexingOp(GraphOp):
    """Reads `input` at positions loaded from `indices` along `dim`. Computed where it is
    read: the consumer's kernel loads the index, checks it (an index outside
    `[0, size)` is an error at run time: `irc-run --check` reports it, and the kernel
    asserts it when Triton's debug mode is on) and clamps it, so no load is ever wild."""

    input = operand_def(TensorType)
    indices = operand_def(TensorType)
    dim = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REINDEXING: ClassVar[bool] = True
    COST: ClassVar[Cost] = Cost.CHEAP
    """Two loads and a clamp: cheap enough to recompute (passes/fuse.py)."""

    def axis(self) -> int:
        rank = len(self.input.type.get_shape())  # type: ignore[attr-defined]
        return _int(self.name, dict(self.properties), "dim") % rank


@irdl_op_definition
class IndexSelectOp(IndexingOp):
    """`x` indexed along `dim` by every index (`torch.index_select`, any index shape):
    the result's shape is `x.shape[:d] + indices.shape + x.shape[d+1:]`."""

    name = "graph.index_select"

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x, idx = (_tensor_operand(cls.name, t, i) for i, t in enumerate(operands))
        _index_operand(cls.name, idx)
        shape = x.get_shape()
        if not shape:
            raise GraphVerifyError(f"{cls.name} needs an input of rank 1 or more", 0)
        (d,) = normalize_dims(cls.name, [_int(cls.name, props, "dim")], len(shape), "dim")
        return tensor([*shape[:d], *idx.get_shape(), *shape[d + 1 :]], x.element_type)


@irdl_op_definition
class GatherOp(IndexingOp):
    """`out[i][j][k] = x[index[i][j][k]][j][k]` for dim 0 (`torch.gather`): indices of
    x's rank, no larger than x in the other dimensions; the result has their shape."""

    name = "graph.gather"

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x, idx = (_tensor_operand(cls.name, t, i) for i, t in enumerate(operands))
        _index_operand(cls.name, idx)
        shape, ishape = x.get_shape(), idx.get_shape()
        if not shape:
            raise GraphVerifyError(f"{cls.name} needs an input of rank 1 or more", 0)
        (d,) = normalize_dims(cls.name, [_int(cls.name, props, "dim")], len(shape), "dim")
        if len(ishape) != len(shape) or any(
            i > s for k, (i, s) in enumerate(zip(ishape, shape, strict=True)) if k != d
        ):
            raise GraphVerifyError(
                f"{cls.name}: indices {format_type(idx)} must have the rank of the input "
                f"{format_type(x)} and no larger sizes in every dimension but {d}",
                1,
            )
        return tensor(ishape, x.element_type)


# --- reductions and contractions ---------------------------------------------


class ReduceOp(GraphOp):
    input = operand_def(TensorType)
    dims = opt_prop_def(Attribute)
    keepdim = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    FLOAT_ONLY: ClassVar[bool] = False
    COMBINE: ClassVar[str]
    """The `loop.reduce` kind that accumulates it: "sum", "max" or "min"."""
    COMBINER: ClassVar[type[BinaryOp]]
    """The element-wise op that combines two partial results (decompose's split of a
    reduction, loop-to-tile's accumulation); the reduction is exact where it is."""

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x = _tensor_operand(cls.name, operands[0], 0)
        if cls.FLOAT_ONLY:
            _require_float(cls.name, x)
        elif cls.name == "graph.reduce_sum":
            _require_arith(cls.name, x)
        shape = x.get_shape()
        dims = normalize_dims(cls.name, _int_list(cls.name, props, "dims"), len(shape))
        if not dims:
            raise GraphVerifyError(f"{cls.name}: 'dims' must name at least one dimension")
        keep = _bool(cls.name, props, "keepdim", False)
        out = [1 if i in dims else d for i, d in enumerate(shape) if keep or i not in dims]
        return tensor(out, x.element_type)

    def reduced_dims(self) -> list[int]:
        props = dict(self.properties)
        return normalize_dims(
            self.name, _int_list(self.name, props, "dims"), len(self.input.type.get_shape())
        )  # type: ignore[attr-defined]

    def keeps_dims(self) -> bool:
        return _bool(self.name, dict(self.properties), "keepdim", False)


@irdl_op_definition
class ReduceSumOp(ReduceOp):
    name = "graph.reduce_sum"
    SHORT_NAME: ClassVar[str | None] = "sum"
    COMBINE: ClassVar[str] = "sum"
    COMBINER: ClassVar[type[BinaryOp]] = AddOp


@irdl_op_definition
class ReduceMaxOp(ReduceOp):
    name = "graph.reduce_max"
    SHORT_NAME: ClassVar[str | None] = "amax"
    COMBINE: ClassVar[str] = "max"
    COMBINER: ClassVar[type[BinaryOp]] = MaximumOp


@irdl_op_definition
class ReduceMinOp(ReduceOp):
    name = "graph.reduce_min"
    SHORT_NAME: ClassVar[str | None] = "amin"
    COMBINE: ClassVar[str] = "min"
    COMBINER: ClassVar[type[BinaryOp]] = MinimumOp


@irdl_op_definition
class ReduceMeanOp(ReduceOp):
    name = "graph.reduce_mean"
    SHORT_NAME: ClassVar[str | None] = "mean"
    REFERENCE_TEMPORARIES: ClassVar[int] = 2
    FLOAT_ONLY: ClassVar[bool] = True
    COMBINE: ClassVar[str] = "sum"  # then divided by the count
    COMBINER: ClassVar[type[BinaryOp]] = AddOp


@irdl_op_definition
class MatmulOp(GraphOp):
    """`[M,K] x [K,N] -> [M,N]`, or batched `[B,M,K] x [B,K,N] -> [B,M,N]`."""

    name = "graph.matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REFERENCE_TEMPORARIES: ClassVar[int] = 2

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        a, b = (_tensor_operand(cls.name, t, i) for i, t in enumerate(operands))
        _same_element(cls.name, [a, b])
        _require_float(cls.name, a)
        sa, sb = a.get_shape(), b.get_shape()
        if len(sa) not in (2, 3) or len(sb) != len(sa):
            raise GraphVerifyError(
                f"graph.matmul takes [M,K]x[K,N] or [B,M,K]x[B,K,N], got "
                f"{format_type(a)} and {format_type(b)}"
            )
        if sa[-1] != sb[-2]:
            raise GraphVerifyError(
                f"graph.matmul: inner dimensions differ: {format_type(a)} has K={sa[-1]}, "
                f"{format_type(b)} has K={sb[-2]}",
                1,
            )
        if len(sa) == 3 and sa[0] != sb[0]:
            raise GraphVerifyError(f"graph.matmul: batch dimensions differ: {sa[0]} and {sb[0]}", 1)
        return tensor([*sa[:-1], sb[-1]], a.element_type)


# --- composites (decomposed before fusion) ---------------------------------


@irdl_op_definition
class SoftmaxOp(GraphOp):
    """`exp(x - max) / sum(exp(x - max))` along `dim`."""

    name = "graph.softmax"
    input = operand_def(TensorType)
    dim = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REFERENCE_TEMPORARIES: ClassVar[int] = 2

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x = _tensor_operand(cls.name, operands[0], 0)
        _require_float(cls.name, x)
        normalize_dims(cls.name, [_int(cls.name, props, "dim")], len(x.get_shape()), "dim")
        return x

    def axis(self) -> int:
        rank = len(self.input.type.get_shape())  # type: ignore[attr-defined]
        return _int(self.name, dict(self.properties), "dim") % rank


@irdl_op_definition
class LayerNormOp(GraphOp):
    """Normalizes over the trailing `dims`, then scales by weight and adds bias."""

    name = "graph.layer_norm"
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = operand_def(TensorType)
    dims = opt_prop_def(Attribute)
    eps = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REFERENCE_TEMPORARIES: ClassVar[int] = 2

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        x, w, b = (_tensor_operand(cls.name, t, i) for i, t in enumerate(operands))
        _same_element(cls.name, [x, w, b])
        _require_float(cls.name, x)
        shape = x.get_shape()
        if not shape:
            raise GraphVerifyError("graph.layer_norm needs an input of rank 1 or more", 0)
        dims = sorted(normalize_dims(cls.name, _int_list(cls.name, props, "dims"), len(shape)))
        if not dims or dims != list(range(len(shape) - len(dims), len(shape))):
            raise GraphVerifyError(
                f"graph.layer_norm normalizes trailing dimensions: dims must be the last "
                f"ones of a rank-{len(shape)} input, like [{len(shape) - 1}]"
            )
        _float(cls.name, props, "eps", 1e-5)
        normalized = tuple(shape[d] for d in dims)
        for i, t in ((1, w), (2, b)):
            if tuple(t.get_shape()) != normalized:
                what = "weight" if i == 1 else "bias"
                raise GraphVerifyError(
                    f"graph.layer_norm: {what} must have the normalized shape "
                    f"{list(normalized)}, got {format_type(t)}",
                    i,
                )
        return x

    def normalized_dims(self) -> list[int]:
        rank = len(self.input.type.get_shape())  # type: ignore[attr-defined]
        return sorted(
            normalize_dims(self.name, _int_list(self.name, dict(self.properties), "dims"), rank)
        )

    def epsilon(self) -> float:
        return _float(self.name, dict(self.properties), "eps", 1e-5)


@irdl_op_definition
class AttentionOp(GraphOp):
    """softmax(q k^T * scale + mask) v over the last two dims, as torch's
    `scaled_dot_product_attention`: q `[..., Tq, D]`, k `[..., Tk, D]`, v `[..., Tk, Dv]`
    give `[..., Tq, Dv]`. The leading dims (batch, heads) agree, except that q may
    have a whole multiple of k's and v's heads (dim -3, grouped-query attention:
    each K/V head serves that many consecutive query heads). `mask` (optional)
    broadcasts to `[..., Tq, Tk]`: `i1` keeps the keys where it is true, a float
    mask is added to the scores. `scale` defaults to 1/sqrt(D); `is_causal`
    keeps key j of row i where j <= i. `decompose` writes it out
    (passes/decompose.py) and `fuse` makes one attention kernel of it again."""

    name = "graph.attention"
    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    mask = opt_operand_def(TensorType)
    scale = opt_prop_def(Attribute)
    is_causal = opt_prop_def(Attribute)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    REFERENCE_TEMPORARIES: ClassVar[int] = 4
    """The f32 copies of q, k, v and the result (an under-estimate where the
    [Tq, Tk] scores of a head are larger than those)."""

    @classmethod
    def infer_type(cls, operands: Sequence[Attribute], props: Props) -> Attribute:
        if len(operands) not in (3, 4):
            raise GraphVerifyError(
                f"{cls.name} takes query, key, value and an optional mask, got "
                f"{len(operands)} operands"
            )
        q, k, v = (_tensor_operand(cls.name, t, i) for i, t in enumerate(operands[:3]))
        _same_element(cls.name, [q, k, v])
        _require_float(cls.name, q)
        sq, sk, sv = q.get_shape(), k.get_shape(), v.get_shape()
        if not 2 <= len(sq) <= 4 or len(sk) != len(sq) or len(sv) != len(sq):
            raise GraphVerifyError(
                f"{cls.name}: query, key and value have one rank, 2 to 4, got "
                f"{format_type(q)}, {format_type(k)}, {format_type(v)}"
            )
        if sk[-1] != sq[-1]:
            raise GraphVerifyError(
                f"{cls.name}: key's last dim ({sk[-1]}) must be the query's ({sq[-1]})", 1
            )
        if sv[-2] != sk[-2] or tuple(sv[:-2]) != tuple(sk[:-2]):
            raise GraphVerifyError(
                f"{cls.name}: value {format_type(v)} must have the key's leading dims and "
                f"length ({format_type(k)})",
                2,
            )
        for d in range(len(sq) - 2):
            heads = d == len(sq) - 3
            if sq[d] != sk[d] and not (heads and sq[d] % sk[d] == 0):
                raise GraphVerifyError(
                    f"{cls.name}: the key's leading dims {list(sk[:-2])} must be the query's "
                    f"{list(sq[:-2])} (or divide its heads, dim -3)",
                    1,
                )
        scores = (*sq[:-1], sk[-2])
        if len(operands) == 4:
            m = _tensor_operand(cls.name, operands[3], 3)
            if m.element_type not in (I1, q.element_type):
                raise GraphVerifyError(
                    f"{cls.name}: the mask is i1 or the query's type, got {format_type(m)}", 3
                )
            if broadcast_shapes(m.get_shape(), scores) != scores:
                raise GraphVerifyError(
                    f"{cls.name}: mask {format_type(m)} does not broadcast to the scores' "
                    f"shape {list(scores)}",
                    3,
                )
        _float(cls.name, props, "scale", 1.0)
        _bool(cls.name, props, "is_causal", False)
        return tensor([*sq[:-1], sv[-1]], q.element_type)

    def softmax_scale(self) -> float:
        d = self.query.type.get_shape()[-1]  # type: ignore[attr-defined]
        return _float(self.name, dict(self.properties), "scale", 1 / math.sqrt(d))

    def causal(self) -> bool:
        return _bool(self.name, dict(self.properties), "is_causal", False)


# --- fusion groups -------------------------------------------------------------


@irdl_op_definition
class FusedOp(IRDLOperation):
    """A group of graph ops that lowers to one kernel.

    Its region's block arguments stand for the operands (isolated from above),
    and `graph.yield` lists the values the group produces.
    """

    name = "graph.fused"
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    kernel = opt_prop_def(Attribute)
    kind = opt_prop_def(Attribute)
    """The kernel's kind (irc.ir.kernel_kind), as `fuse` decided it."""
    space = opt_prop_def(Attribute)
    """A reduction kernel's row space: its reductions' input shape..."""
    dims = opt_prop_def(Attribute)
    """...and the dims they reduce (`irc.ir.kernel_kind.RowGeometry`)."""
    body = region_def("single_block")

    def verify_(self) -> None:
        if self.kernel is not None:
            # The name of the kernel it becomes: it names a Python function (irc.ir.names).
            if not isinstance(self.kernel, StringAttr):
                raise GraphVerifyError('graph.fused: kernel must be a string, like "poi_exp_0"')
            problem = kernel_name_problem(self.kernel.data)
            if problem is not None:
                raise GraphVerifyError(f"graph.fused: {problem}")
        block = self.body.block
        if len(block.args) != len(self.inputs):
            raise GraphVerifyError(
                f"graph.fused has {_count(len(self.inputs), 'operand')} but its region takes "
                f"{_count(len(block.args), 'argument')}"
            )
        for arg, operand in zip(block.args, self.inputs, strict=True):
            if arg.type != operand.type:
                raise GraphVerifyError(
                    f"graph.fused: region argument type {format_type(arg.type)} differs "
                    f"from operand type {format_type(operand.type)}"
                )
        inside: set[SSAValue] = set(block.args)
        for op in self.body.walk():
            for operand in op.operands:
                if operand not in inside:
                    name = "%" + operand.name_hint if operand.name_hint else "a value"
                    raise GraphVerifyError(
                        f"graph.fused: {op.name} in the region uses {name}, defined outside "
                        "it (the region sees only its arguments)"
                    )
            for region in op.regions:
                for b in region.blocks:
                    inside.update(b.args)
            inside.update(op.results)
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise GraphVerifyError("graph.fused: the region must end in graph.yield")
        got = [v.type for v in last.values]
        want = [r.type for r in self.outputs]
        if got != want:
            raise GraphVerifyError(
                "graph.fused: graph.yield types ("
                + ", ".join(format_type(t) for t in got)
                + ") differ from the results ("
                + ", ".join(format_type(t) for t in want)
                + ")"
            )
        self._check_group()

    def _check_group(self) -> None:
        """The group is one kernel: no group inside it, only graph ops."""
        outer = self.parent_op()
        while outer is not None:
            if isinstance(outer, FusedOp):
                raise GraphVerifyError(
                    "graph.fused inside another graph.fused: a group is one kernel and "
                    "does not nest"
                )
            outer = outer.parent_op()
        for op in self.body.block.ops:
            if isinstance(op, FusedOp):
                return  # reported at the inner group
            if not isinstance(op, GraphOp | YieldOp):
                raise GraphVerifyError(f"graph.fused: {op.name} in the region is not a graph op")
        # Whether one kernel computes it is fusion's rule, checked by the module
        # verifier (irc/analysis/fused_groups.py), which sits above the passes.

    def written_kind(self) -> KernelKind | None:
        """The `kind` written on the op (by `fuse` or by hand), checked to be one."""
        if self.kind is None:
            return None
        kind = parse_kind(self.kind.data) if isinstance(self.kind, StringAttr) else None
        if kind is None:
            raise GraphVerifyError(f"graph.fused: kind must be one of {KINDS}")
        return kind

    def written_geometry(self) -> RowGeometry | None:
        """The rows written on the op: `space` and `dims` go together, on a reduction."""
        props = dict(self.properties)
        if self.space is None and self.dims is None:
            return None
        if self.space is None or self.dims is None:
            raise GraphVerifyError(
                "graph.fused: 'space' and 'dims' (a reduction kernel's rows) go together"
            )
        space = _int_list(self.name, props, "space")
        dims = _int_list(self.name, props, "dims")
        if any(s < 1 for s in space) or sorted(set(dims)) != dims or any(
            not 0 <= d < len(space) for d in dims
        ):
            raise GraphVerifyError(
                "graph.fused: 'space' must be positive sizes and 'dims' increasing dims of it"
            )
        return RowGeometry(tuple(space), tuple(dims))

    def kernel_kind(self) -> KernelKind:
        """The kernel's kind: as written, else what `fuse` would decide for the group."""
        written = self.written_kind()
        return written if written is not None else kind_of_ops(self.body.block.ops)

    def row_geometry(self) -> RowGeometry:
        """A reduction kernel's rows: as written, else from its reductions (the one
        helper fusion legality used). The verifier has checked the two agree."""
        written = self.written_geometry()
        if written is not None:
            return written
        return row_geometry([op for op in self.body.block.ops if isinstance(op, ReduceOp)])


def kind_properties(kind: KernelKind, geometry: RowGeometry | None) -> dict[str, Attribute]:
    """The properties that record a kernel's kind (and rows) on graph.fused."""
    props: dict[str, Attribute] = {"kind": StringAttr(kind)}
    if geometry is not None:
        props["space"] = int_array(geometry.space)
        props["dims"] = int_array(geometry.dims)
    return props


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a `graph.fused` region with the values it produces."""

    name = "graph.yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator())

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), FusedOp):
            raise GraphVerifyError("graph.yield may only end the region of a graph.fused op")


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _check_size(t: TensorType[Attribute]) -> None:
    shape = t.get_shape()
    if any(d < 1 for d in shape):
        raise GraphVerifyError(f"{format_type(t)}: dimensions must be positive")
    if numel(shape) > MAX_ELEMENTS:
        raise GraphVerifyError(f"{format_type(t)} has more than 2**48 elements")


Graph = Dialect(
    "graph",
    [
        NegOp, AbsOp, ExpOp, LogOp, SqrtOp, RsqrtOp, SinOp, CosOp, TanhOp, SigmoidOp,
        ReluOp, GeluOp, SiluOp, ReciprocalOp, ErfOp, FloorOp, CeilOp, RoundOp,
        AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp, PowOp,
        EqOp, NeOp, LtOp, LeOp, GtOp, GeOp,
        WhereOp, CastOp, ConstantOp, ReshapeOp, BroadcastOp, TransposeOp,
        SliceOp, ConcatOp, IotaOp, IndexSelectOp, GatherOp,
        ReduceSumOp, ReduceMaxOp, ReduceMinOp, ReduceMeanOp, MatmulOp,
        SoftmaxOp, LayerNormOp, AttentionOp, FusedOp, YieldOp,
    ],
    [],
)  # fmt: skip
"""Every op of the spec's table, plus the fusion group ops."""

ELEMENTWISE_OPS = tuple(op for op in Graph.operations if issubclass(op, ElementwiseOp))
"""Every element-wise op (unary, binary, where, cast), in the dialect's order."""
UNARY_OPS = tuple(op for op in Graph.operations if issubclass(op, UnaryOp))
BINARY_OPS = tuple(op for op in Graph.operations if issubclass(op, BinaryOp))
SCALAR_FUNCTIONS: dict[str, int] = {
    **{op.FN: op.ARITY for op in ELEMENTWISE_OPS},
    **{fn: op.ARITY for op in ELEMENTWISE_OPS for fn in op.EXTRA_FNS},
}
"""The `fn` of every element-wise op's loop.apply / tile.apply, with its arity."""
PREDICATE_FUNCTIONS = frozenset(op.FN for op in BINARY_OPS if op.KIND == "compare")
"""The functions whose result is `i1`."""
COMPARISONS: dict[str, Comparison] = {
    op.FN: op.COMPARISON for op in ELEMENTWISE_OPS if op.COMPARISON is not None
}
"""The comparison functions of loop.apply / tile.apply, with their meaning."""
FUNCTION_OPS: dict[str, type[ElementwiseOp]] = {op.FN: op for op in ELEMENTWISE_OPS}
"""The element-wise op of each `fn` (a loop.apply's or tile.apply's), for its facts."""
REDUCE_OPS = tuple(op for op in Graph.operations if issubclass(op, ReduceOp))
COMPOSITE_OPS = (SoftmaxOp, LayerNormOp, AttentionOp)
"""Graph ops that `decompose` rewrites into primitives; they have no loop form."""
VIEW_OPS = tuple(op for op in Graph.operations if issubclass(op, GraphOp) and op.VIEW)
"""Ops that compute nothing (their `VIEW` fact): fusion sees through them."""
WHOLE_VIEW_OPS = tuple(op for op in VIEW_OPS if not op.SUBSET)
"""Views that keep every element of their operand (no `SUBSET` fact)."""
GENERATOR_OPS = tuple(op for op in Graph.operations if issubclass(op, GraphOp) and op.GENERATOR)
"""Ops of no operand (their `GENERATOR` fact) that every reader computes itself."""
REINDEXING_OPS = tuple(op for op in Graph.operations if issubclass(op, GraphOp) and op.REINDEXING)
"""Ops that read their operands at other indices than their own (their `REINDEXING` fact)."""


# --- the kernel a group of graph ops makes (irc.ir.kernel_kind's vocabulary) ----


def kind_of_ops(ops: Iterable[Operation]) -> KernelKind:
    """The kind of a kernel computing the graph ops `ops` (whether one loop nest
    can is `fuse.kernel_schema`'s question; this is only which nest it would be)."""
    kind = KernelKind.POINTWISE
    matmuls = 0
    for op in ops:
        if isinstance(op, MatmulOp):
            matmuls += 1
        elif isinstance(op, ReduceOp):
            kind = KernelKind.REDUCTION
    if matmuls:
        # Two matmuls in one kernel: only attention (passes/fuse_attention.py) fuses them.
        return KernelKind.ATTENTION if matmuls > 1 else KernelKind.CONTRACTION
    return kind


def row_geometry(reductions: Sequence[Operation]) -> RowGeometry:
    """The one row space of `reductions` (graph.reduce_* ops), or `GeometryMismatch`.

    Fusion legality asks it of a group and graph-to-loop lowers by it, so the
    rows a kernel is judged on are the rows it is lowered to.
    """
    geometries: list[RowGeometry] = []
    for r in reductions:
        assert isinstance(r, ReduceOp)
        geometries.append(RowGeometry(shape_of(r.input.type), tuple(sorted(r.reduced_dims()))))
    if not geometries:
        raise GeometryMismatch("no reduction")
    if any(g != geometries[0] for g in geometries[1:]):
        raise GeometryMismatch("reductions over different shapes or dims")
    return geometries[0]
