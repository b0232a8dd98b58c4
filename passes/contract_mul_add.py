"""`contract-mul-add`: a float product whose only use is an addition is one FMA.

Kernels launch without LLVM's contraction (`irc/runtime/launch.py`): it fuses a
product into every addition that reads it, even when the product is also read
elsewhere rounded, and a random program's `min(x*c, y) - x*c` then came out a
rounding error instead of 0 (NaN under a square root). This pass contracts
only where that cannot happen: the product has one use, after `tile-cse` has
made twin products one value with several. `a * b + c` is then rounded once,
nearer the exact result than torch's two roundings; on compute-bound chains it
is one instruction instead of two, as in Inductor's kernels (which contract
everywhere).

Only f32 and f64 values contract: a half-precision program rounds each
product to its type first (a cast between them), as torch does. A product
broadcast into a larger addition, or computed in an enclosing block (outside
a loop the addition is in), stays apart: contracting would multiply once for
every element or iteration instead of once.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Attribute, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from irc.dialects import loop, tile
from irc.ir.types import FLOAT_TYPES, HALF_TYPES


def _element(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def _product(addition: tile.ApplyOp, value: SSAValue) -> tile.ApplyOp | None:
    """The `mul` that computes `value`, if contracting it into `addition` rounds
    once where torch rounds twice and costs nothing more."""
    mul = value.owner
    if not isinstance(mul, tile.ApplyOp) or mul.fn.data != "mul":
        return None
    if not value.has_one_use() or mul.parent is not addition.parent:
        return None
    if value.type != addition.result.type:  # broadcast into a larger addition
        return None
    return mul


def contract(addition: tile.ApplyOp) -> bool:
    """Rewrites `addition` (`a*b + c`, `c + a*b`, `a*b - c` or `c - a*b`) as a
    `mul_add`; whether it did."""
    fn = addition.fn.data
    if fn != "add" and fn != "sub":
        return False
    element = _element(addition.result.type)
    if element not in FLOAT_TYPES or element in HALF_TYPES:
        return False
    left, right = addition.args
    for position, value in ((0, left), (1, right)):
        mul = _product(addition, value)
        if mul is None:
            continue
        a, b = mul.args
        c = right if position == 0 else left
        if fn == "sub" and position == 0:  # a*b - c
            c = _negated(addition, c)
        elif fn == "sub":  # c - a*b
            a = _negated(addition, a)
        fused = tile.ApplyOp.create(
            operands=[a, b, c],
            result_types=[addition.result.type],
            properties={"fn": loop.apply_fn("mul_add")},
        )
        Rewriter.replace_op(addition, fused)
        Rewriter.erase_op(mul)
        return True
    return False


def _negated(before: tile.ApplyOp, value: SSAValue) -> SSAValue:
    """`-value`, inserted before `before` (ptxas folds it into the FMA's operand)."""
    neg = tile.ApplyOp.create(
        operands=[value], result_types=[value.type], properties={"fn": loop.apply_fn("neg")}
    )
    Rewriter.insert_op(neg, InsertPoint.before(before))
    return neg.results[0]


@dataclass(frozen=True)
class ContractMulAddPass(ModulePass):
    """`contract-mul-add`: single-use f32/f64 products fuse into their addition."""

    name = "contract-mul-add"
    levels = ("tile",)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in tile.kernels(op):
            for addition in [o for o in kernel.walk() if isinstance(o, tile.ApplyOp)]:
                contract(addition)
