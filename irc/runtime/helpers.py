"""The `@triton.jit` functions that generated kernels call.

A generated module imports them by name (`from irc.runtime.helpers import
_irc_max, ...`), so its kernels read `_irc_max(a, b)` or `tl.reduce(x, 1,
_irc_max)` as they would a helper written beside them; the `_irc_` prefix
keeps them apart from the kernels' own names.

These are the forms the GPU compiles. Where Triton's interpreter computes
differently, `irc.runtime.interpreter` holds the form that runs there
instead (`INTERPRETED_FORMS`), and a module loaded for the interpreter is
given those (see `interpreter.interpreting`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import triton.language as tl
from triton.language.extra.cuda import gdc_wait, libdevice
from triton.language.target_info import cuda_capability_geq
from triton.runtime.jit import JITFunction

from irc.runtime.interpreter import interpreted_form, register_jit_module, triton_is_interpreted

__all__ = [
    "_irc_dot_bf16",
    "_irc_dot_split_tf32",
    "_irc_exp",
    "_irc_from_bf16",
    "_irc_gelu_half",
    "_irc_max",
    "_irc_min",
    "_irc_pow",
    "_irc_tanh",
    "_irc_tf32_head",
    "_irc_tf32_parts",
    "_irc_tf32_tail",
    "_irc_to_bf16",
    "_irc_wait_for_previous_kernel",
]


def _helper(fn: Callable[..., Any]) -> Any:
    """`triton.jit`, but decided by how Triton was imported, not by TRITON_INTERPRET now.

    irc sets TRITON_INTERPRET only while it loads or runs a module for the
    interpreter, which may be when this module is first imported; the GPU
    needs compiled helpers all the same. Only a Triton imported under
    TRITON_INTERPRET=1, which can do nothing but interpret, gets interpreted ones.
    """
    return interpreted_form(fn) if triton_is_interpreted() else JITFunction(fn)


@_helper
def _irc_wait_for_previous_kernel():
    # Programmatic dependent launch (Hopper and later): the kernel was started while
    # the one before it finished, hiding its launch, and waits for its results here.
    if cuda_capability_geq(9):
        gdc_wait()


@_helper
def _irc_exp(x):
    # CUDA's expf (2 ulp: its argument reduced by ln 2 in two parts first), as
    # torch's. tl.exp is ex2.approx of x * log2(e), whose rounding costs |x| 2**-24
    # of relative error: 64 ulp at x = 88 on an H200.
    return libdevice.exp(x)


@_helper
def _irc_dot_bf16(a, b, acc):
    return tl.dot(a, b, acc)


@_helper
def _irc_tf32_parts(x):
    # x as head + tail, each exact in TF32 (10 explicit mantissa bits), each
    # rounded to nearest (ties away from zero) on its bits: |tail| is at most half
    # an ulp of the head, 2**-11 of x. A head that would round past the largest f32
    # is truncated instead; the tail of an infinity is 0, not inf - inf; a NaN stays
    # in the head (truncated, a payload only in its low bits would read as inf).
    bits = x.to(tl.int32, bitcast=True)
    head = ((bits + 4096) & -8192).to(tl.float32, bitcast=True)
    head = tl.where(tl.abs(head) > 3.4028234663852886e38, (bits & -8192).to(tl.float32, bitcast=True), head)
    head = tl.where(x != x, x, head)
    tail = x - head
    tail = tl.where(tail != tail, 0.0, tail)
    tail = ((tail.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
    return head, tail


@_helper
def _irc_tf32_head(x):
    head, _ = _irc_tf32_parts(x)
    return head


@_helper
def _irc_tf32_tail(x):
    _, tail = _irc_tf32_parts(x)
    return tail


@_helper
def _irc_dot_split_tf32(a, b, acc):
    # acc + a @ b from three TF32 tensor-core products of the parts (the tails'
    # product, at most 2**-22 of the whole, dropped; a tail's own rounding costs at
    # most 2**-23 of its operand). The heads in the products with tails are finite
    # (0 for an inf or NaN, which the heads' product carries): inf * 0, for a tail
    # that is 0, would be NaN where torch's product is inf. A tensor core sums
    # into its accumulator without rounding to nearest (it truncates), an error
    # that grows with K; each step's products are summed from zero and added to
    # `acc` in f32 here, as an FMA GEMM adds them.
    a_head, a_tail = _irc_tf32_parts(a)
    b_head, b_tail = _irc_tf32_parts(b)
    a_finite = tl.where(a_head - a_head == 0.0, a_head, 0.0)
    b_finite = tl.where(b_head - b_head == 0.0, b_head, 0.0)
    small = tl.dot(a_tail, b_finite, input_precision="tf32")
    small = tl.dot(a_finite, b_tail, small, input_precision="tf32")
    big = tl.dot(a_head, b_head, input_precision="tf32")
    return acc + (big + small)


@_helper
def _irc_to_bf16(x):
    # Through f32, as torch converts (round to nearest even).
    return x.to(tl.float32).to(tl.bfloat16)


@_helper
def _irc_from_bf16(x):
    return x.to(tl.float32)


@_helper
def _irc_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_helper
def _irc_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_helper
def _irc_tanh(x):
    # CUDA's tanhf (tanh for f64): 3.1 ulp at most on an H200, as torch's. Ten an
    # element (chain20) took 0.524 ms there, against 0.747 for the formula the
    # interpreter keeps (irc.runtime.interpreter: no libdevice there) and 0.427 for
    # torch.compile's kernel.
    return libdevice.tanh(x)


@_helper
def _irc_gelu_half(x):
    # The exact GELU, x * Phi(x), of an f32 x whose result is only rounded to f16 or
    # bf16 (graph.gelu's HALF_RESULT form). Phi(x) is 1 - q or q by the sign of x, q
    # the normal tail P(N > |x|) = erfc(|x| / sqrt(2)) / 2, as 2**p(|x|): p is a
    # degree-9 Chebyshev least-squares fit of log2 q on [0, 5.5]. Measured against
    # math.erfc (tests/test_runtime.py): q within 3e-6 relative, 1e-6 below |x| = 2,
    # so x * Phi(x) is within 3e-6 relative everywhere, under a hundredth of an f16
    # half ulp; beyond |x| = 5.5, q < 2e-8 is 0, as torch's 1 + erf(x / sqrt(2)) is
    # there. 16 instructions an element on sm_90 against libdevice erff's 32 (its two
    # polynomials picked by predicated moves), which a GEMM's epilogue, overlapping
    # no load, pays in full. No cancellation for negative x: q is computed, not
    # 1 + erf, so it is nearer f64 there than torch's f32 result.
    a = tl.abs(x)
    t = tl.minimum(a, 5.5)
    p = 7.329675e-08 * t - 1.9130587e-06
    p = p * t + 1.8963829e-05
    p = p * t - 6.0206774e-05
    p = p * t - 5.156729e-04
    p = p * t + 7.6808445e-03
    p = p * t - 5.3038888e-02
    p = p * t - 4.589743e-01
    p = p * t - 1.1511437
    p = p * t - 9.99999e-01
    q = tl.where(a > 5.5, 0.0, tl.exp2(p))
    return x * tl.where(x >= 0, 1.0 - q, q)


@_helper
def _irc_pow(a, b):
    a, b = tl.broadcast(a, b)  # Triton's interpreter cannot splat a scalar i1 (b_odd)
    # exp2(b log2|a|) is off by about |b log2|a|| ulp of its input type (120 ulp in f32
    # for results near 1e36), so f32 (and f16/bf16, computed in f32) takes the log, the
    # product and exp2 in f64: 0.5 ulp in f32 over normal and subnormal results, as
    # measured. f64 has nothing wider: its pow keeps that error (~1000 ulp near 1e-300).
    r = tl.exp2(b.to(tl.float64) * tl.log2(tl.abs(a).to(tl.float64))).to(a.dtype)
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    neg = (a < 0) | ((a == 0) & (1.0 / a < 0))  # -0.0 too: pow(-0.0, -3) is -inf
    r = tl.where(neg & b_odd, r * -1.0, r)  # Triton's -r is 0 - r: -(+0.0) would be +0.0
    # A negative finite base to a non-integer power is NaN; -inf's powers are not.
    r = tl.where((a < 0) & (a > float("-inf")) & (b_int == 0), float("nan"), r)
    # IEEE (and torch): pow(1, y) and pow(-1, +-inf) are 1, NaN exponents included.
    r = tl.where((a == 1.0) | ((a == -1.0) & (tl.abs(b) == float("inf"))), 1.0, r)
    return tl.where(b == 0, 1.0, r)


register_jit_module(sys.modules[__name__])
