"""The `loop` dialect: loop nests over buffers, one `loop.kernel` per future kernel.

A kernel's region arguments are its parallel loop indices (`bounds` gives the
trip counts); `loop.reduce` is a reduction loop yielding one scalar, and
`loop.foreach` an inner parallel loop over the same space as the reductions
(a softmax writes its output that way). Scalars are computed by `loop.apply`,
whose `fn` names the graph op it mirrors, so one op serves every element-wise
graph op and the index arithmetic (`add`, `mul`, `floordiv`, `mod` on `index`):

    %y = loop.alloc : memref<64xf32>
    loop.kernel {name = "red_sum_0", bounds = [64]} (%i: index) {
      %s = loop.reduce {kind = "sum", bounds = [128]} (%j: index) {
        %v = loop.load %x, %i, %j : f32
        loop.yield %v
      } : f32
      loop.store %s, %y, %i
    }
"""

from __future__ import annotations

import math
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    StringAttr,
    TensorType,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import Attribute, Dialect, Operation, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import IsTerminator, NoTerminator, Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from irc.dialects.attrs import (
    MAX_BLOCK,
    MAX_STAGES,
    MAX_UNROLLED_CHUNKS,
    MAX_WARPS,
    NamedEnum,
    check_flag,
    check_int,
    check_int_list,
    check_number,
)
from irc.ir.kernel_kind import KINDS, KernelKind, parse_kind
from irc.ir.names import check_kernel_name
from irc.ir.types import (
    ELEMENT_TYPES,
    F32,
    FLOAT_TYPES,
    HALF_TYPES,
    I1,
    INT_NAMES,
    MAX_ELEMENTS,
    SCALAR_TYPES,
    format_type,
)

REDUCE_KINDS = ("sum", "max", "min")
INT_TYPES = frozenset(ELEMENT_TYPES[n] for n in INT_NAMES)


def _apply_fns() -> dict[str, int]:
    """Every scalar function of `loop.apply` and `tile.apply`, with its arity.

    Every element-wise graph op gives its own (`FN` and `ARITY`, facts of the op
    class: a new graph op is a new function here); the rest are the functions the
    lowerings add, index arithmetic and mask logic.
    """
    from irc.dialects import graph

    return {**graph.SCALAR_FUNCTIONS, **INDEX_FNS, **LOWERING_FNS}


def _float_fns() -> frozenset[str]:
    """The functions of element-wise graph ops that take floats only (exp, tanh,
    floor...), with their variants (exp2, gelu's tanh form)."""
    from irc.dialects import graph

    return frozenset(
        fn
        for op in graph.UNARY_OPS
        if getattr(op, "FLOAT_ONLY", False)
        for fn in (op.FN, *op.EXTRA_FNS)
    ) | frozenset(LOWERING_FNS)


LOWERING_FNS: dict[str, int] = {"mul_add": 3, "tf32_head": 1, "tf32_tail": 1}
"""Float functions no graph op has, which a lowering adds: `mul_add(a, b, c)` is
`a * b + c` rounded once (an FMA). Kernels launch without FMA contraction, as
torch rounds each op; attention's lowering computes its probabilities' exponent
`s * c - m` with it, as FlashAttention does (lowering/attention_to_tile.py).
`tf32_head(x)` and `tf32_tail(x)` (f32 only) split x into two values TF32 holds
exactly, `x ~ head + tail` within 2**-22 of x: x rounded to TF32, and the rest so
rounded (0 for inf and NaN, whose head is x). `split-tf32-gemm-operands` stores an
f32 GEMM's operands so, once, for tensor cores to multiply them three times."""

TF32_FNS = frozenset({"tf32_head", "tf32_tail"})
"""The functions whose value TF32 holds exactly (`LOWERING_FNS`); they take f32."""

INDEX_FNS: dict[str, int] = {"floordiv": 2, "mod": 2, "and": 2, "or": 2, "checked_index": 2}
"""The functions of loop.apply that are no graph op: index arithmetic, mask logic, and
`checked_index(i, n)`: an index loaded from a tensor (i32 or i64) as an `index` in
`[0, n)`, clamped into it; outside it is the program's error, which the kernel
checks at run time (index_select, gather; loop-to-tile adds that check as a
`tile.check`, and a `tile.apply` of it is the clamp alone)."""


def _element(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def check_apply_types(
    op: IRDLOperation, fn: str, types: list[Attribute], result: Attribute
) -> None:
    """The operands suit `fn`: no float mixed with an `index`, integer-only
    functions on integers, float-only ones on floats, and a `where` on an i1
    condition (Triton refuses the rest); and the written result is the element
    type `fn` computes (`apply_element`)."""
    elements = [_element(t) for t in types]
    values = elements[1:] if fn == "where" else elements
    if fn == "where" and elements[0] != I1:
        raise VerifyException(
            f"{op.name}: the condition of 'where' must be i1, got {format_type(types[0])}"
        )
    if any(e in FLOAT_TYPES for e in values) and any(e == IndexType() for e in values):
        raise VerifyException(f"{op.name}: '{fn}' mixes float and index operands")
    if fn in INDEX_FNS and any(e in FLOAT_TYPES for e in elements):
        raise VerifyException(f"{op.name}: '{fn}' takes integer, index or i1 operands, not floats")
    if fn in FLOAT_FNS and any(e not in FLOAT_TYPES for e in elements):
        raise VerifyException(f"{op.name}: '{fn}' takes float operands, not integers or indices")
    if fn in TF32_FNS and any(e != F32 for e in elements):
        raise VerifyException(f"{op.name}: '{fn}' takes f32 operands")
    want = apply_element(op, fn, elements)
    if want is not None and _element(result) != want:
        raise VerifyException(
            f"{op.name}: '{fn}' of {', '.join(format_type(e) for e in elements)} computes "
            f"{format_type(want)}, but the result is {format_type(result)}"
        )


def apply_element(op: IRDLOperation, fn: str, elements: list[Attribute]) -> Attribute | None:
    """The element type an apply of `fn` computes, as graph ops infer it (None for a
    cast: the written type). The lowerings take the written type for the computed
    one: loop-to-tile computes and rounds in it, and Triton's promotion of mixed
    operands (f32 * f64 is f64) would make a value of another type than the IR says."""
    if fn == "cast":
        return None
    if fn == "checked_index" and op.name == "loop.apply":
        # A loaded integer as an index below the bound (an index): loop-to-tile
        # expands it into comparisons against that bound.
        if elements[0] not in (*INT_TYPES, IndexType()) or elements[1] != IndexType():
            raise VerifyException(
                f"{op.name}: 'checked_index' takes an integer and an index bound, got "
                f"{', '.join(format_type(e) for e in elements)}"
            )
        return IndexType()
    values = elements[1:] if fn == "where" else elements
    if any(e != values[0] for e in values[1:]):
        raise VerifyException(
            f"{op.name}: '{fn}' takes operands of one element type, got "
            f"{', '.join(format_type(e) for e in values)} (cast first)"
        )
    return I1 if fn in _predicate_fns() else values[0]


def _predicate_fns() -> frozenset[str]:
    from irc.dialects import graph

    return graph.PREDICATE_FUNCTIONS


APPLY_FNS: dict[str, int] = _apply_fns()
FLOAT_FNS: frozenset[str] = _float_fns()
"""fn name -> number of arguments; tile_to_triton has a Triton form for each."""


class _Fn(StrEnum):
    """A member hashes as its name, which is its value: it is its `fn` string
    anywhere a string is (a dict key, `==`, an f-string)."""


ApplyFn: type[StrEnum] = _Fn("ApplyFn", [(fn, fn) for fn in APPLY_FNS])  # type: ignore[call-overload]
"""The scalar functions of loop.apply and tile.apply, as an enum (members from APPLY_FNS)."""


@irdl_attr_definition
class ApplyFnAttr(EnumAttribute[ApplyFn], SpacedOpaqueSyntaxAttribute):  # type: ignore[valid-type]
    """The `fn` of loop.apply and tile.apply: written `{fn = "exp"}` in irc text,
    `#loop<fn exp>` in MLIR's."""

    name = "loop.fn"


def apply_fn(fn: str) -> ApplyFnAttr:
    """The `fn` property of an apply op computing `fn` (a KeyError if none is)."""
    return ApplyFnAttr(ApplyFn[fn])


def fn_property(op_name: str) -> Any:
    """The IRDL definition of an apply op's `fn`: one member of ApplyFn."""
    return prop_def(NamedEnum(ApplyFnAttr, op_name, "fn", "function"))


def check_apply(op: IRDLOperation, fn: ApplyFnAttr, n_args: int) -> None:
    """`fn` (a member, checked by its IRDL constraint) gets as many arguments as it takes."""
    arity = APPLY_FNS[fn.data]
    if n_args != arity:
        raise VerifyException(
            f"{op.name}: '{fn.data}' takes {arity} argument{'s' if arity > 1 else ''}, got {n_args}"
        )


def check_sum_element(op: IRDLOperation, kind: str, t: Attribute) -> None:
    """A sum counts in its element type: i1 cannot hold a count (Triton's sum of i1
    gives an i32 one, which the IR would call i1)."""
    if kind == "sum" and _element(t) == I1:
        raise VerifyException(f"{op.name}: a sum of i1 values is a count, not an i1 (cast first)")


def int_list(attr: Attribute | None) -> list[int]:
    if attr is None:
        return []
    assert isinstance(attr, ArrayAttr)
    return [a.value.data for a in attr.data]  # type: ignore[attr-defined]


def _valid_bounds(bounds: Attribute | None) -> bool:
    return isinstance(bounds, ArrayAttr) and all(
        isinstance(b, IntegerAttr) and b.value.data >= 1 for b in bounds.data
    )


def _check_bounds(op: IRDLOperation, bounds: Attribute | None) -> None:
    if not _valid_bounds(bounds):
        raise VerifyException(f"{op.name}: 'bounds' must be a list of positive integers")
    assert isinstance(bounds, ArrayAttr)
    # A loop walks the elements of a tensor: no more than one holds (products of bounds
    # that each fit in 64 bits overflowed the grid arithmetic of loop-to-tile).
    if math.prod(int_list(bounds)) > MAX_ELEMENTS:
        raise VerifyException(
            f"{op.name}: bounds {int_list(bounds)} make {math.prod(int_list(bounds))} "
            "iterations, more than irc supports (2**48)"
        )
    block = op.regions[0].block
    if len(block.args) != len(bounds.data) or any(
        not isinstance(a.type, IndexType) for a in block.args
    ):
        raise VerifyException(
            f"{op.name}: the region takes one index argument per bound ({len(bounds.data)})"
        )


@irdl_op_definition
class AllocOp(IRDLOperation):
    """A fresh buffer: a function result or a temporary between kernels."""

    name = "loop.alloc"
    result = result_def(MemRefType)

    def verify_(self) -> None:
        _check_buffer_element(self, self.result.type)
        parent = self.parent_op()
        if parent is not None and parent.name != "func.func":
            raise VerifyException(
                f"loop.alloc allocates on the host: it stands in a function's body, not in "
                f"{parent.name}"
            )


@irdl_op_definition
class ViewOp(IRDLOperation):
    """A returned buffer seen through other strides: a view, no copy. Element `i` of
    the result is element `offset + sum(i[d] * strides[d])` of the buffer's row-major
    elements (`Tensor.as_strided`). A kernel computing `exp(x)` returned as
    `exp(x).T`, or a row sum returned broadcast to the full shape, stores only what it
    computes, and the caller gets the view torch would give. Kernels index buffers
    row-major, so the view may only be returned, never read or written by a kernel."""

    name = "loop.view"
    input = operand_def(MemRefType)
    strides = prop_def(ArrayAttr)
    offset = opt_prop_def(IntegerAttr)
    result = result_def(MemRefType)

    def verify_(self) -> None:
        parent = self.parent_op()
        if parent is not None and parent.name != "func.func":
            raise VerifyException(
                f"loop.view is made on the host: it stands in a function's body, "
                f"not in {parent.name}"
            )
        source, result = self.input.type, self.result.type
        assert isinstance(source, MemRefType) and isinstance(result, MemRefType)
        if source.element_type != result.element_type:
            raise VerifyException(
                f"loop.view: a view of {format_type(source)} has its element type, "
                f"not {format_type(result.element_type)}"
            )
        shape = result.get_shape()
        strides = check_int_list(self, "strides", self.strides, 0, MAX_ELEMENTS,
                                 lengths=(len(shape),))  # fmt: skip
        offset = 0 if self.offset is None else check_int(self, "offset", self.offset, 0, MAX_ELEMENTS)
        last = offset + sum((n - 1) * k for n, k in zip(shape, strides, strict=True))
        size = math.prod(source.get_shape())
        if last >= size:
            raise VerifyException(
                f"loop.view: {format_type(result)} at strides {strides} from offset {offset} "
                f"reaches element {last} of a buffer of {size}"
            )
        for use in self.result.uses:
            if use.operation.name != "func.return":
                raise VerifyException(
                    f"loop.view: its view is returned only ({use.operation.name} uses it): "
                    f"kernels read and write buffers row-major"
                )

    def sizes_and_strides(self) -> tuple[list[int], list[int], int]:
        """The view's sizes, strides and offset, in elements."""
        shape = self.result.type.get_shape()  # type: ignore[attr-defined]
        offset = 0 if self.offset is None else self.offset.value.data
        return list(shape), int_list(self.strides), offset


LIBRARY_TYPES = HALF_TYPES | {F32}
"""The element types `loop.library_matmul` multiplies."""


def library_granule(element: Attribute) -> int:
    """Elements whose multiples cuBLAS's fast kernels want K, the columns and every
    operand's row spacing in: 16 bytes for half precision (its tensor-core kernels:
    5701x4543 @ 4543x1196 bf16 took 541 us as it is and 93 padded, on an H200), any
    for f32, whose SGEMM ran as fast on odd sizes (1293x1310x1545: 137 us)."""
    return 1 if element == F32 else 8


def library_extent(n: int, element: Attribute) -> int:
    """`n` rounded up to whole `library_granule`s of `element`."""
    granule = library_granule(element)
    return -(-n // granule) * granule


LIBRARY_K = -1
"""In `loop.library_matmul`'s `a_dims` and `b_dims`: the operand dimension that
runs along K, the summed one (the others name the output dimension they run along)."""


@irdl_op_definition
class LibraryMatmulOp(IRDLOperation):
    """`out = a @ b` by the vendor's GEMM library (cuBLAS through `torch.matmul`), on
    the host: `library-gemm` puts a contraction there where that was measured faster.

    `a_dims` and `b_dims` say, for each dimension of the operand's buffer, which
    output dimension it runs along, or K (`LIBRARY_K`, -1): `a` holds the rows (the
    output's next-to-last dimension) and K, `b` K and the columns, each any of the
    leading (batch) dimensions it does not broadcast over. A buffer may be longer
    than what is read or written (rows padded to 16 bytes, which cuBLAS's fast
    kernels need of the output too): the first `k` along K, the first `sizes`
    ([batch..., M, N]) of each output dimension. bf16, f16 or f32 operands
    (`LIBRARY_TYPES`), summed in f32 and rounded once, as irc's own GEMM kernels do
    (f32 products in f32, never TF32: `irc.runtime.launch.library_matmul`); `reason`
    keeps the measurement that chose it."""

    name = "loop.library_matmul"
    a = operand_def(MemRefType)
    b = operand_def(MemRefType)
    out = operand_def(MemRefType)
    a_dims = prop_def(ArrayAttr)
    b_dims = prop_def(ArrayAttr)
    sizes = prop_def(ArrayAttr)
    k = prop_def(IntegerAttr)
    reason = opt_prop_def(StringAttr)

    def verify_(self) -> None:
        parent = self.parent_op()
        if parent is not None and parent.name != "func.func":
            raise VerifyException(
                f"loop.library_matmul runs on the host: it stands in a function's body, "
                f"not in {parent.name}"
            )
        out = self.out.type
        assert isinstance(out, MemRefType)
        types = [v.type for v in (self.a, self.b, self.out)]
        if any(t.element_type not in LIBRARY_TYPES for t in types):  # type: ignore[attr-defined]
            raise VerifyException(
                "loop.library_matmul: operands and output are bf16, f16 or f32, got "
                + ", ".join(format_type(t.element_type) for t in types)  # type: ignore[attr-defined]
            )
        if len({t.element_type for t in types}) != 1:  # type: ignore[attr-defined]
            raise VerifyException("loop.library_matmul: operands and output share one element type")
        rank = out.get_num_dims()
        if rank < 2:
            raise VerifyException(
                "loop.library_matmul: the output has rows and columns (2-d or more)"
            )
        if self.out in (self.a, self.b):
            raise VerifyException("loop.library_matmul: the output is not one of its operands")
        sizes = check_int_list(self, "sizes", self.sizes, 1, MAX_ELEMENTS, lengths=(rank,))
        if any(s > o for s, o in zip(sizes, out.get_shape(), strict=True)):
            raise VerifyException(
                f"loop.library_matmul: sizes {sizes} do not fit the output's {format_type(out)}"
            )
        k = check_int(self, "k", self.k, 1, MAX_ELEMENTS)
        for name, value, dims, own, other in (
            ("a", self.a, self.a_dims, rank - 2, rank - 1),
            ("b", self.b, self.b_dims, rank - 1, rank - 2),
        ):
            t = value.type
            assert isinstance(t, MemRefType)
            shape = t.get_shape()
            labels = check_int_list(
                self, f"{name}_dims", dims, LIBRARY_K, rank - 1, lengths=(len(shape),)
            )
            if labels.count(LIBRARY_K) != 1 or labels.count(own) != 1:
                raise VerifyException(
                    f"loop.library_matmul: {name}_dims names K ({LIBRARY_K}) once and the "
                    f"output's dimension {own} once"
                )
            if other in labels or len(set(labels)) != len(labels):
                raise VerifyException(
                    f"loop.library_matmul: {name}_dims may not name the output's dimension "
                    f"{other} or any dimension twice"
                )
            for size, label in zip(shape, labels, strict=True):
                want = k if label == LIBRARY_K else sizes[label]
                if size < want:
                    along = "K" if label == LIBRARY_K else f"output dimension {label}"
                    raise VerifyException(
                        f"loop.library_matmul: {name} runs {size} along {along}, which needs {want}"
                    )


MAX_TAIL_PROGRAMS = 1 << 16
"""The most programs of a split tail's partial products (`loop.kernel`'s `tail`): the
tile pass makes one round of them, at most one an SM."""


@irdl_op_definition
class KernelOp(IRDLOperation):
    """A parallel loop nest that becomes one GPU kernel."""

    name = "loop.kernel"
    kernel_name = prop_def(StringAttr, prop_name="name")
    bounds = prop_def(ArrayAttr)
    block = opt_prop_def(ArrayAttr)
    """Block sizes chosen by the `tile` pass: [X] or [X, R] or [M, N, K]."""
    warps = opt_prop_def(IntegerAttr)
    stages = opt_prop_def(IntegerAttr)
    persistent = opt_prop_def(IntegerAttr)
    """Contractions: 1 when one program an SM walks the output tiles (set by `tile`)."""
    unrolled = opt_prop_def(IntegerAttr)
    """Reductions: 1 when the loop over a row's chunks of `block[1]` is unrolled, so
    that the row stays in registers between the passes that read it."""
    nested = opt_prop_def(IntegerAttr)
    """Reductions: 1 when a loop over several reduced dims runs over the leading ones
    an index at a time, around chunks of `block[1]` of the last, rather than over a
    flat index divided back into them (`tile.nested_run_tiling`)."""
    tail = opt_prop_def(ArrayAttr)
    """Persistent contractions: [T, S] where the last T output tiles (a last round
    that would leave SMs idle) are not the persistent programs' but split into S
    chunks of K, in a kernel of partial products and one that sums them and runs the
    epilogue (set by `tile`: `tile.tail_split`)."""
    kind = opt_prop_def(Attribute)
    """The kernel's kind (irc.ir.kernel_kind) as fusion decided it, carried by
    graph-to-loop; read through `kernel_kind`. The printer leaves it out where
    the body shows it (always, once verified), so hand-written IR need not say it."""
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        if _enclosing_kernel(self) is not None:
            raise VerifyException("loop.kernel: a loop.kernel cannot be inside another loop.kernel")
        check_kernel_name(self.name, self.kernel_name.data)
        _check_bounds(self, self.bounds)
        self._check_contraction_loops()
        self._check_kind()
        self._check_tiling()

    def _check_contraction_loops(self) -> None:
        """A kernel with a contraction (loop-to-tile lowers it as dots and a store) has
        no other loop: no loop.foreach, no loop.reduce but contractions, and a
        loop.softmax_reduce only in an attention. A contraction kernel's contractions
        are its body's own ops, not nested in one another."""
        kind = body_kind(self)
        if kind not in (KernelKind.CONTRACTION, KernelKind.ATTENTION):
            return
        for op in self.body.walk():
            if isinstance(op, ForeachOp):
                raise VerifyException(
                    f"loop.kernel: a {kind} kernel has no loop.foreach (loop-to-tile lowers "
                    "a contraction as dots and a store)"
                )
            if isinstance(op, ReduceOp) and op.contract is None or isinstance(op, WelfordReduceOp):
                raise VerifyException(
                    f"loop.kernel: a {kind} kernel has no {op.name} but its contractions"
                )
            if (
                kind == KernelKind.CONTRACTION
                and isinstance(op, ReduceOp)
                and op.parent_op() is not self
            ):
                raise VerifyException(
                    "loop.kernel: a contraction kernel's contractions are ops of its body, "
                    "not nested in one another"
                )
            if isinstance(op, SoftmaxReduceOp) and kind == KernelKind.CONTRACTION:
                raise VerifyException(
                    "loop.kernel: a loop.softmax_reduce in a kernel with a contraction makes "
                    "an attention, whose values loop is a second contraction"
                )

    def _check_kind(self) -> None:
        """A written kind is a kind, and the one the body computes."""
        if self.kind is None:
            return
        kind = parse_kind(self.kind.data) if isinstance(self.kind, StringAttr) else None
        if kind is None:
            raise VerifyException(f"loop.kernel: kind must be one of {KINDS}")
        body = body_kind(self)
        if kind != body:
            raise VerifyException(f'loop.kernel: kind "{kind}", but the body is a "{body}" kernel')

    def _check_tiling(self) -> None:
        """The `tile` pass's choice, or a hand-written one, must be one Triton takes."""
        if self.block is not None:
            # An element-wise kernel takes [X], or [A, B] when it transposes.
            lengths = {"pointwise": (1, 2), "reduction": (2,), "contraction": (3,)}
            lengths["attention"] = (2,)
            check_int_list(
                self,
                "block",
                self.block,
                1,
                MAX_BLOCK,
                lengths=lengths[kernel_kind(self)],
                power_of_two=True,
            )
            self._check_block_elements()
            pointwise = kernel_kind(self) == KernelKind.POINTWISE
            if pointwise and len(self.block) == 2 and len(self.parallel_bounds()) < 2:
                raise VerifyException(
                    "loop.kernel: block = [A, B] tiles two parallel dims; this kernel has "
                    f"{len(self.parallel_bounds())}"
                )
        if self.warps is not None:
            check_int(self, "warps", self.warps, 1, MAX_WARPS, power_of_two=True)
        if self.stages is not None:
            check_int(self, "stages", self.stages, 1, MAX_STAGES)
        check_flag(self, "persistent", self.persistent)
        check_flag(self, "unrolled", self.unrolled)
        if self.unrolled is not None:  # a flag: `unrolled = 1` or `unrolled = true`
            self._check_unrolled()
        check_flag(self, "nested", self.nested)
        if self.nested is not None:
            self._check_nested()
        if self.tail is not None:
            self._check_tail()

    def _check_tail(self) -> None:
        """A tail is a persistent contraction's last tiles, split into 2 or more K chunks."""
        tiles, splits = check_int_list(self, "tail", self.tail, 1, MAX_TAIL_PROGRAMS, lengths=(2,))
        if tiles * splits > MAX_TAIL_PROGRAMS:
            raise VerifyException(
                f"loop.kernel: tail = [{tiles}, {splits}] makes {tiles * splits} programs of "
                f"partial tiles; at most {MAX_TAIL_PROGRAMS} (a round of them fills a GPU)"
            )
        if kernel_kind(self) != KernelKind.CONTRACTION or self.persistent is None:
            raise VerifyException(
                "loop.kernel: tail = [T, S] splits a persistent contraction's last tiles; "
                "this kernel is not one"
            )
        if len(self.parallel_bounds()) != 2 or self.block is None:
            raise VerifyException("loop.kernel: tail = [T, S] needs an unbatched, tiled GEMM")
        if sum(map(is_contraction, self.body.walk())) != 1:
            raise VerifyException("loop.kernel: tail = [T, S] splits one contraction's K loop")
        (bm, bn, bk), (m, n) = int_list(self.block), self.parallel_bounds()
        count = -(-m // bm) * -(-n // bn)
        if tiles > count:
            raise VerifyException(
                f"loop.kernel: tail = [{tiles}, {splits}] splits {tiles} tiles; the kernel "
                f"has {count} of {bm}x{bn}"
            )
        k = max(
            (math.prod(int_list(op.bounds)) for op in self.body.walk() if isinstance(op, ReduceOp)),
            default=1,
        )
        if splits < 2 or splits > -(-k // bk):
            raise VerifyException(
                f"loop.kernel: tail = [{tiles}, {splits}] splits K = {k} into {splits} chunks "
                f"of whole steps of {bk}; from 2 to {-(-k // bk)}"
            )

    def _check_reduction_flag(self, flag: str, does: str) -> None:
        """A flag that `does` something to a reduction's loops, which says their
        chunk in `block`."""
        if kernel_kind(self) != KernelKind.REDUCTION:
            raise VerifyException(
                f'loop.kernel: {flag} = 1 {does}; this is a "{kernel_kind(self)}" kernel'
            )
        if self.block is None:
            raise VerifyException(f"loop.kernel: {flag} = 1 needs a block = [X, R]")

    def _check_nested(self) -> None:
        """Nested loops are a reduction's streamed chunks: not unrolled ones."""
        self._check_reduction_flag("nested", "nests a reduction's loops")
        if self.unrolled is not None:
            raise VerifyException(
                "loop.kernel: nested = 1 streams the chunks that unrolled = 1 holds; not both"
            )

    def _check_unrolled(self) -> None:
        """Unrolled chunks are a reduction's, and few enough to write out."""
        self._check_reduction_flag("unrolled", "unrolls a reduction's chunks")
        chunk = int_list(self.block)[1]
        longest = max(
            (
                math.prod(b.value.data for b in op.bounds.data)  # type: ignore[attr-defined]
                for op in self.body.walk()
                if isinstance(op, LOOPS)
                and _valid_bounds(op.bounds)
            ),
            default=1,
        )
        chunks = -(-longest // chunk)
        if chunks > MAX_UNROLLED_CHUNKS:
            raise VerifyException(
                f"loop.kernel: unrolled = 1 with block = {int_list(self.block)} writes out "
                f"{chunks} chunks of a row of {longest}; at most {MAX_UNROLLED_CHUNKS}"
            )

    def _check_block_elements(self) -> None:
        """Each tile a program holds is one Triton block of at most MAX_BLOCK elements:
        the whole block of an element-wise kernel or a reduction, a scores tile
        [BM, BN] of an attention, each of a GEMM's [BM, BK], [BK, BN] and [BM, BN]."""
        block = int_list(self.block)  # type: ignore[arg-type]
        if len(block) == 3:
            bm, bn, bk = block
            tiles = {"[BM, BK]": bm * bk, "[BK, BN]": bk * bn, "[BM, BN]": bm * bn}
        else:
            tiles = {"program's": math.prod(block)}
        for what, elements in tiles.items():
            if elements > MAX_BLOCK:
                raise VerifyException(
                    f"loop.kernel: block = {block} makes a {what} tile of {elements} "
                    f"elements; a Triton block holds at most {MAX_BLOCK}"
                )

    def parallel_bounds(self) -> list[int]:
        return int_list(self.bounds)

    def elided_properties(self) -> tuple[str, ...]:
        """irc's printer leaves out a kind that the body shows (as MLIR leaves out
        default-valued attributes): loop IR reads as before, and reads back the same."""
        if self.kind is not None and kernel_kind(self) == body_kind(self):
            return ("kind",)
        return ()


def _enclosing_kernel(op: IRDLOperation) -> KernelOp | None:
    p = op.parent_op()
    while p is not None and not isinstance(p, KernelOp):
        p = p.parent_op()
    return p


def _check_in_kernel(op: IRDLOperation) -> None:
    """Scalar code belongs in kernels: a host function only allocates and launches."""
    if op.parent_op() is not None and _enclosing_kernel(op) is None:
        raise VerifyException(
            f"{op.name} is outside any loop.kernel: scalar code belongs in kernels"
        )


def kernel_kind(kernel: KernelOp) -> KernelKind:
    """The kernel's kind: the one recorded on it (by graph-to-loop, from fusion),
    else, for loop IR written by hand, the one its body computes."""
    if kernel.kind is not None:
        kind = parse_kind(kernel.kind.data) if isinstance(kernel.kind, StringAttr) else None
        if kind is not None:
            return kind
    return body_kind(kernel)


def body_kind(kernel: KernelOp) -> KernelKind:
    """The kind a kernel's body computes: a contracting `loop.reduce` makes a
    contraction, any other reduction loop (or an epilogue over one) a reduction."""
    kind = KernelKind.POINTWISE
    contractions = 0
    for op in kernel.body.walk():
        if isinstance(op, ReduceOp) and op.contract is not None:
            contractions += 1
        elif isinstance(op, LOOPS):
            kind = KernelKind.REDUCTION
    if contractions:
        # Attention: a contraction over the rows of a softmax of another's scores.
        softmax = any(isinstance(op, SoftmaxReduceOp) for op in kernel.body.walk())
        return KernelKind.ATTENTION if softmax and contractions > 1 else KernelKind.CONTRACTION
    return kind


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """Reduces the value its region yields over `bounds` with `kind`.

    `contract = true` marks a matrix contraction (the body yields a product of
    one operand indexed by the rows and one by the columns), lowered to dots.
    """

    name = "loop.reduce"
    kind = prop_def(StringAttr)
    bounds = prop_def(ArrayAttr)
    contract = opt_prop_def(IntegerAttr)
    result = result_def()
    body = region_def("single_block")

    def verify_(self) -> None:
        _check_bounds(self, self.bounds)
        if self.kind.data not in REDUCE_KINDS:
            raise VerifyException(f"loop.reduce: kind must be one of {', '.join(REDUCE_KINDS)}")
        check_sum_element(self, self.kind.data, self.result.type)
        check_flag(self, "contract", self.contract)
        last = self.body.block.last_op
        if not isinstance(last, YieldOp) or len(last.values) != 1:
            raise VerifyException("loop.reduce: the region must end in loop.yield of one value")
        if last.values[0].type != self.result.type:
            raise VerifyException(
                f"loop.reduce yields {format_type(last.values[0].type)} but produces "
                f"{format_type(self.result.type)}"
            )
        if self.contract is not None:
            self._check_contraction(last.values[0])

    def _check_contraction(self, value: SSAValue) -> None:
        """`contract = true` is a dot: the sum over one K loop of a float product (or
        of a sum of products, one dot each: `split-tf32-gemm-operands`'s three
        products of TF32 parts), in a kernel whose last two parallel dims are the
        output's rows and columns."""
        products = contraction_products(value)
        kernel = _enclosing_kernel(self)
        if (
            self.kind.data != "sum"
            or len(self.bounds.data) != 1
            or self.result.type not in FLOAT_TYPES
            or not products
            or kernel is None
            # (a kernel without bounds is the kernel's own error)
            or not isinstance(bounds := kernel.properties.get("bounds"), ArrayAttr)
            or len(bounds.data) < 2
        ):
            raise VerifyException(
                'loop.reduce: contract = true is a matrix product: kind "sum" over one '
                'bound of a float loop.apply "mul" (or a sum of such products), in a '
                "loop.kernel of at least two parallel dims (rows and columns)"
            )
        if any(p.parent_block() is not self.body.block for p in products):
            # (lowered, and chunked by split-k, as dots of each K step's tiles)
            raise VerifyException("loop.reduce: a contraction's products are ops of its own body")
        kind = body_kind(kernel)
        if kind == KernelKind.ATTENTION and len(products) > 1:
            raise VerifyException(
                "loop.reduce: an attention's contractions are one product each, not sums"
            )
        for product in products:
            if len(product.args) != 2 or not isinstance(product.properties.get("fn"), ApplyFnAttr):
                continue  # (the apply's own error)
            if kind == KernelKind.CONTRACTION:
                self._check_factors(kernel, product.args[0], product.args[1])
            elif kind == KernelKind.ATTENTION:
                self._check_attention_factors(kernel, product.args[0], product.args[1])

    def _check_attention_factors(self, kernel: KernelOp, a: SSAValue, b: SSAValue) -> None:
        """An attention's dots, as loop-to-tile lays them out: a scores dot (inside the
        softmax's loop or the values loop, over the head dim) multiplies the rows' query
        [rows, d] by the keys' [d, keys]; the values dot multiplies the probabilities
        [rows, keys] by the values [keys, columns]. A factor reading the other side's
        index made tiles of other shapes (an internal error of loop-to-tile); and the
        softmax's sum is the divisor after the values loop, not an input of it."""
        *_, rows, cols = kernel.body.block.args
        parent = self.parent_op()
        if isinstance(parent, SoftmaxReduceOp | ReduceOp):  # a scores dot, keys `key`
            key = parent.body.block.args[0]
            checks = (("first", a, (key, cols)), ("second", b, (rows, cols)))
        else:
            checks = (("first", a, (cols,)), ("second", b, (rows,)))
            for softmax in kernel.body.walk():
                if isinstance(softmax, SoftmaxReduceOp) and any(
                    self.is_ancestor(use.operation) for use in softmax.sum_exp.uses
                ):
                    raise VerifyException(
                        "loop.reduce: an attention's values loop reads the softmax's sum, "
                        "which is only whole after it (divide by it after the loop)"
                    )
        for which, factor, others in checks:
            read = indices_read(factor, kernel, set(others), through_loops=False)
            if read:
                raise VerifyException(
                    f"loop.reduce: an attention's dot multiplies [rows, K] by [K, columns] "
                    f"(rows {_name(rows)}); its {which} factor reads "
                    f"{', '.join(_name(v) for v in read)}"
                )

    def _check_factors(self, kernel: KernelOp, a: SSAValue, b: SSAValue) -> None:
        """loop-to-tile computes the first factor as a [rows, K] tile and the second as a
        [K, columns] one: a first factor that reads the column index (or the second the
        row index) would make a tile of another shape, which fails to broadcast or, when
        the block sizes agree, is silently multiplied as the wrong tile."""
        *_, rows, cols = kernel.body.block.args
        for which, factor, other in (("first", a, cols), ("second", b, rows)):
            if other in indices_read(factor, kernel):
                raise VerifyException(
                    f"loop.reduce: contract = true multiplies a factor of the rows "
                    f"({_name(rows)}) and K by one of K and the columns ({_name(cols)}), in "
                    f"that order; its {which} factor reads {_name(other)}"
                )


def _name(v: SSAValue) -> str:
    return "%" + v.name_hint if v.name_hint else "its index"


def indices_read(
    value: SSAValue,
    kernel: KernelOp,
    indices: set[SSAValue] | None = None,
    through_loops: bool = True,
) -> set[SSAValue]:
    """Which of `indices` (the kernel's parallel ones by default) `value` is computed
    from. The result of a loop (a contraction) counts as reading them all, a whole
    output tile, unless not `through_loops` (an attention's nested dots are checked
    on their own)."""
    ivs = set(kernel.body.block.args) if indices is None else indices
    found: set[SSAValue] = set()
    seen: set[SSAValue] = set()
    stack = [value]
    while stack:  # not recursive: an index chain may be thousands of ops long
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in ivs:
            found.add(v)
        elif isinstance(v.owner, Operation):
            if v.owner.regions:
                if through_loops:
                    return ivs
                continue
            stack.extend(v.owner.operands)
    return found


@irdl_op_definition
class SoftmaxReduceOp(IRDLOperation):
    """The two reductions of a softmax row in one loop: `maximum` is the max of the
    values its region yields over `bounds`, `sum_exp` the sum of exp(value - maximum).

    Made by the `online-softmax` pass from a max `loop.reduce` and the sum of
    exps that reads it, so that a row too long for registers is read once for
    both (each lane keeps a running max and a sum rescaled to it). f32 and f64
    only: a half-precision exp is rounded before the sum, which this op does not do.

        %m, %s = loop.softmax_reduce {bounds = [20000]} (%j: index) {
          %v = loop.load %x, %i, %j : f32
          loop.yield %v
        } : f32, f32
    """

    name = "loop.softmax_reduce"
    bounds = prop_def(ArrayAttr)
    maximum = result_def()
    sum_exp = result_def()
    body = region_def("single_block")

    def verify_(self) -> None:
        _check_one_pass_reduction(self, 1, "one value")


def _check_one_pass_reduction(op: IRDLOperation, count: int, yields: str) -> None:
    """A reduction that makes several results in one pass (softmax_reduce,
    welford_reduce): its region ends in loop.yield of `count` values (`yields`), all
    f32 or all f64 (its combining arithmetic is float and unrounded), and so are its
    results."""
    _check_bounds(op, op.properties["bounds"])
    last = op.regions[0].block.last_op
    if not isinstance(last, YieldOp) or len(last.values) != count:
        raise VerifyException(f"{op.name}: the region must end in loop.yield of {yields}")
    t = last.values[0].type
    if t not in (F32, ELEMENT_TYPES["f64"]):
        noun = "value" if count == 1 else "values"
        raise VerifyException(
            f"{op.name}: the yielded {noun} must be f32 or f64, got {format_type(t)}"
        )
    for v in [*last.values, *op.results]:
        if v.type != t:
            raise VerifyException(
                f"{op.name} yields {format_type(t)} but produces {format_type(v.type)}"
            )


@irdl_op_definition
class WelfordReduceOp(IRDLOperation):
    """The mean and the sum of squared deviations (M2) of the values its region
    yields over `bounds`, in one pass (Welford; Chan et al. to combine parts).

    The region yields a *part* `(mean, m2, weight)`: an element is `(x, 0, 1)`
    (weight 0 leaves it out), a partial result of an earlier pass is its own
    triple. Made by the `one-pass-variance` pass from `sum(x) / n` and the
    `sum((x - mean)**2)` that reads it, so that a variance streamed from memory
    (a column's batch-norm statistics, a long layer-norm row) reads its input
    once, not twice; `split-reduction` then combines the parts of its chunks.
    Results: the mean, M2 and the total weight. f32 and f64 only (a half
    type's two-pass variance rounds in between, which this op does not do).

        %mean, %m2, %n = loop.welford_reduce {bounds = [4096]} (%j: index) {
          %v = loop.load %x, %j, %i : f32
          loop.yield %v, %zero, %one
        } : f32, f32, f32
    """

    name = "loop.welford_reduce"
    bounds = prop_def(ArrayAttr)
    mean = result_def()
    m2 = result_def()
    weight = result_def()
    body = region_def("single_block")

    def verify_(self) -> None:
        _check_one_pass_reduction(self, 3, "three values (mean, m2, weight)")


@irdl_op_definition
class ForeachOp(IRDLOperation):
    """An inner parallel loop over the reduction space of its kernel."""

    name = "loop.foreach"
    bounds = prop_def(ArrayAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        _check_bounds(self, self.bounds)


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "loop.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator())

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), REDUCING_LOOPS | None):
            raise VerifyException(
                "loop.yield ends the region of a loop.reduce, loop.softmax_reduce or "
                "loop.welford_reduce only"
            )


@irdl_op_definition
class LoadOp(IRDLOperation):
    """`buffer[indices]`, one index per buffer dimension."""

    name = "loop.load"
    buffer = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    result = result_def()

    def verify_(self) -> None:
        _check_access(self, self.buffer.type, len(self.indices), self.result.type)


@irdl_op_definition
class StoreOp(IRDLOperation):
    """`buffer[indices] = value`."""

    name = "loop.store"
    value = operand_def()
    buffer = operand_def(MemRefType)
    indices = var_operand_def(IndexType)

    def verify_(self) -> None:
        _check_access(self, self.buffer.type, len(self.indices), self.value.type)
        parent = self.parent_op()
        while parent is not None and not isinstance(parent, KernelOp):
            if isinstance(parent, REDUCING_LOOPS):
                raise VerifyException(
                    f"loop.store inside a {parent.name}: a reduction's region yields a value "
                    "and stores nothing (loop-to-tile would drop the store)"
                )
            parent = parent.parent_op()


def _check_buffer_element(op: IRDLOperation, buffer: Attribute) -> None:
    """Buffers hold the spec's element types: torch and Triton have no `index` dtype."""
    assert isinstance(buffer, MemRefType)
    if buffer.element_type not in ELEMENT_TYPES.values():
        raise VerifyException(
            f"{op.name}: buffers hold {' '.join(ELEMENT_TYPES)}, not "
            f"{format_type(buffer.element_type)}"
        )


def _check_access(op: IRDLOperation, buffer: Attribute, n: int, element: Attribute) -> None:
    assert isinstance(buffer, MemRefType)
    _check_buffer_element(op, buffer)
    rank = len(buffer.get_shape())
    if n != rank:
        raise VerifyException(f"{op.name}: {n} indices for a rank-{rank} buffer")
    if buffer.element_type != element:
        raise VerifyException(
            f"{op.name}: element type {format_type(element)} differs from the buffer's "
            f"{format_type(buffer)}"
        )


@irdl_op_definition
class ApplyOp(IRDLOperation):
    """A scalar op; `fn` names the graph op it mirrors (or index arithmetic)."""

    name = "loop.apply"
    fn = fn_property("loop.apply")
    args = var_operand_def()
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        _check_in_kernel(self)
        check_apply(self, self.fn, len(self.args))
        for a in self.args:
            if a.type not in SCALAR_TYPES.values():
                raise VerifyException(
                    f"{self.name}: operands are scalars, got {format_type(a.type)}"
                )
        check_apply_types(self, self.fn.data, [a.type for a in self.args], self.result.type)


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A scalar constant (`value` as in graph.constant)."""

    name = "loop.constant"
    value = prop_def(Attribute)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        _check_in_kernel(self)
        if isinstance(self.result.type, TensorType):
            raise VerifyException("loop.constant: the type must be a scalar, got a tensor")
        check_number(self, "value", self.value, self.result.type)


def kernels(op: Operation) -> list[KernelOp]:
    """The loop kernels under `op` (a module or a function), in order: the loop
    level's `tile.kernels`, whose kernels sit in their functions' bodies."""
    return [k for k in op.walk() if isinstance(k, KernelOp)]


def contraction_products(value: SSAValue) -> list[ApplyOp]:
    """The products a contraction's yielded `value` sums, left to right: itself where
    it is a `mul`, those of both sides of an `add`; [] where it is neither. An apply
    of a missing or unknown fn counts as a product: it is that apply's own error."""
    op = value.owner
    if not isinstance(op, ApplyOp):
        return []
    fn = op.properties.get("fn")
    if not isinstance(fn, ApplyFnAttr) or fn.data == "mul":
        return [op]
    if fn.data != "add" or len(op.args) != 2:
        return []
    left, right = (contraction_products(a) for a in op.args)
    return [*left, *right] if left and right else []


def is_contraction(op: Operation) -> bool:
    """Whether `op` is a `loop.reduce {contract = true}`: a dot, not a loop of its kernel."""
    return isinstance(op, ReduceOp) and op.contract is not None


REDUCING_LOOPS = ReduceOp | SoftmaxReduceOp | WelfordReduceOp
"""The loops whose region yields what they reduce."""
LOOPS = REDUCING_LOOPS | ForeachOp
"""Every loop of a kernel's body: reductions (contractions too) and foreach."""


Loop = Dialect(
    "loop",
    [
        AllocOp, ViewOp, LibraryMatmulOp, KernelOp, ReduceOp, SoftmaxReduceOp, WelfordReduceOp,
        ForeachOp, YieldOp, LoadOp, StoreOp, ApplyOp, ConstantOp,
    ],
    [ApplyFnAttr],
)  # fmt: skip
