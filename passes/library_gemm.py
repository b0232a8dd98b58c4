"""`library-gemm`: a GEMM kernel handed to the vendor's GEMM library.

irc's GEMM kernels keep their epilogue (bias, GELU) in registers, which saves a
write and a read of the product. On a Hopper GPU, cuBLAS's own kernels also run
clusters of programs that share operand tiles by TMA multicast, which Triton 3.6
does not offer: at some shapes (few output tiles over a long K; some large odd
ones) its GEMM is faster by more than the product's extra trip through memory
costs; and an f32 GEMM of a few thousand a side can run faster as cuBLAS's SGEMM
than as irc's three TF32 products of split operands. No model of cuBLAS's kernel
choice predicts where, so `irc.library_choice` measures both on the GPU and names
the kernels that go to the library.

A kernel this pass takes (`plain_gemm`) sums the product of two loads of bf16,
f16 or f32 buffers (`loop.LIBRARY_TYPES`), each indexed only by the kernel's own
indices and K. It becomes a `loop.library_matmul` into a new buffer, and the kernel, the GEMM's
loop replaced by a load of that buffer, keeps the rest: its epilogue, now an
element-wise kernel. A kernel that only stores the product in its own order is
replaced whole: the library writes its output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, StringAttr, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from irc.dialects import loop
from irc.ir.kernel_kind import KernelKind
from irc.ir.names import quoted
from irc.ir.types import int_array
from irc.passes.gemm_operand_copies import copy_before
from irc.passes.kernel_names import kernel_names, unique_name
from irc.syntax.diagnostics import Diagnostic, IrcError, op_location


@dataclass(frozen=True)
class PlainGemm:
    """A kernel's contraction the library can run: `a_dims` and `b_dims` as
    `loop.library_matmul` takes them, read from the loads' indices."""

    kernel: loop.KernelOp
    contraction: loop.ReduceOp
    a: loop.LoadOp
    b: loop.LoadOp
    a_dims: tuple[int, ...]
    b_dims: tuple[int, ...]

    @property
    def k(self) -> int:
        return loop.int_list(self.contraction.bounds)[0]

    @property
    def out_shape(self) -> list[int]:
        return loop.int_list(self.kernel.bounds)

    @property
    def flops(self) -> int:
        return 2 * self.k * math.prod(self.out_shape)

    @property
    def direct_store(self) -> loop.StoreOp | None:
        """The kernel's only other op, storing the product at its own indices into a
        buffer of its bounds: then the library writes that buffer itself."""
        ops = list(self.kernel.body.block.ops)
        if len(ops) != 2 or ops[0] is not self.contraction:
            return None
        store = ops[1]
        args = tuple(self.kernel.body.block.args)
        if (
            isinstance(store, loop.StoreOp)
            and store.value == self.contraction.result
            and tuple(store.indices) == args
            and isinstance(store.buffer.type, MemRefType)
            and list(store.buffer.type.get_shape()) == self.out_shape
            and self.out_shape[-1] == self.padded_columns
        ):
            return store
        return None

    @property
    def padded_columns(self) -> int:
        """The product's row length in whole granules (`loop.library_granule`): cuBLAS's
        half-precision kernels want the columns so (4286x5029 @ 5029x4953 f16 with K
        padded but 4953 columns: 1931 us, against 326 with 4960)."""
        return loop.library_extent(self.out_shape[-1], self.contraction.result.type)


def plain_gemm(kernel: loop.KernelOp) -> PlainGemm | None:
    """The kernel's contraction where the library can run it, else None."""
    if loop.body_kind(kernel) != KernelKind.CONTRACTION:
        return None
    contractions = [op for op in kernel.body.ops if loop.is_contraction(op)]
    if len(contractions) != 1 or any(
        loop.is_contraction(op) for op in kernel.body.walk() if op not in contractions
    ):
        return None
    (red,) = contractions
    element = red.result.type
    ops = list(red.body.block.ops)
    if element not in loop.LIBRARY_TYPES or len(ops) != 4:
        return None
    product = ops[2]
    if not (
        isinstance(product, loop.ApplyOp)
        and product.fn.data == "mul"
        and isinstance(ops[3], loop.YieldOp)
        and ops[3].values[0] == product.result
        and len(product.args) == 2
    ):
        return None
    loads = [a.owner for a in product.args]
    if not all(isinstance(op, loop.LoadOp) and op in ops[:2] for op in loads):
        return None
    if loads[0] is loads[1]:
        return None
    parallel = list(kernel.body.block.args)
    (k,) = red.body.block.args
    rank = len(parallel)
    bounds = loop.int_list(kernel.bounds)
    k_extent = loop.int_list(red.bounds)[0]
    dims: list[tuple[int, ...]] = []
    for load, own, other in ((loads[0], rank - 2, rank - 1), (loads[1], rank - 1, rank - 2)):
        assert isinstance(load, loop.LoadOp)
        if load.result.type != element or load.buffer.type.element_type != element:  # type: ignore[attr-defined]
            return None
        labels = []
        for index in load.indices:
            if index == k:
                labels.append(loop.LIBRARY_K)
            elif index in parallel:
                labels.append(parallel.index(index))
            else:
                return None  # a computed index (a gather, a shifted window)
        if (
            labels.count(loop.LIBRARY_K) != 1
            or labels.count(own) != 1
            or other in labels
            or len(set(labels)) != len(labels)
        ):
            return None
        extents = [k_extent if d == loop.LIBRARY_K else bounds[d] for d in labels]
        if list(load.buffer.type.get_shape()) != extents:  # type: ignore[attr-defined]
            return None  # a padded copy's pad (`pad-gemm-operands`) is not zero
        dims.append(tuple(labels))
    a, b = loads
    assert isinstance(a, loop.LoadOp) and isinstance(b, loop.LoadOp)
    return PlainGemm(kernel, red, a, b, dims[0], dims[1])


LIBRARY_COPY_PREFIX = "library_pad_"
"""The names of the copies `aligned_operands` makes: `library_pad_0`..."""


def aligned_operands(
    gemm: PlainGemm,
) -> tuple[list[SSAValue], list[tuple[int, ...]], int, list[int]]:
    """The operands as cuBLAS runs fast: K, the columns and the spacing of every
    operand's rows whole granules (`loop.library_granule`: 16 bytes of half precision);
    only the rows M may be any number. An operand that is not so is copied, once, by
    an irc kernel into [M, K'] or [K', N'] rows that are, zero past the source (the
    extra K add nothing, the extra columns land in the product's pad); one that is,
    stored either way round, is read as it is (cuBLAS transposes). Returns the
    operands, their dims, K' and the sizes [M, N']. 2-d GEMMs only."""
    element = gemm.contraction.result.type
    per = loop.library_granule(element)
    m, n = gemm.out_shape
    k = loop.library_extent(gemm.k, element)
    n_padded = gemm.padded_columns
    taken = kernel_names(gemm.kernel.get_toplevel_object())  # type: ignore[arg-type]
    operands: list[SSAValue] = []
    dims: list[tuple[int, ...]] = []
    for load, labels, want in (
        (gemm.a, gemm.a_dims, (0, loop.LIBRARY_K)),
        (gemm.b, gemm.b_dims, (loop.LIBRARY_K, 1)),
    ):
        contiguous = labels[-1]  # the output dimension (or K) its rows run along
        extents = {loop.LIBRARY_K: gemm.k, 0: m, 1: n}
        fast = gemm.k % per == 0 and extents[contiguous] % per == 0
        if want[1] == 1:  # b: its columns are the product's, which cuBLAS wants whole
            fast = fast and n % per == 0
        if fast:
            operands.append(load.buffer)
            dims.append(tuple(labels))
            continue
        shape = (m, k) if want[0] == 0 else (k, n_padded)
        order = (0, 1) if tuple(labels) == want else (1, 0)
        target = MemRefType(element, shape)
        operands.append(
            copy_before(
                gemm.kernel, load.buffer, target, LIBRARY_COPY_PREFIX, taken, order, zero_pad=True
            )
        )
        dims.append(want)
    return operands, dims, k, [m, n_padded]  # (n_padded is n where b is read as it is)


def to_library(gemm: PlainGemm, reason: str | None = None) -> loop.LibraryMatmulOp:
    """Rewrites the kernel as a `loop.library_matmul` and, where it does more than
    store the product, the element-wise rest (same name, same place). Outside a pass,
    run it under `names_xdsl_accepts`: xDSL copies names as it replaces values."""
    kernel = gemm.kernel
    element = gemm.contraction.result.type
    block = kernel.parent_block()
    assert block is not None
    store = gemm.direct_store
    before: list[Operation] = []
    if store is not None:
        out = store.buffer
    else:
        shape = [*gemm.out_shape[:-1], gemm.padded_columns]
        alloc = loop.AllocOp.create(result_types=[MemRefType(element, shape)])
        before.append(alloc)
        out = alloc.result
    a, b, k, sizes = gemm.a.buffer, gemm.b.buffer, gemm.k, gemm.out_shape
    a_dims, b_dims = gemm.a_dims, gemm.b_dims
    if len(sizes) == 2:
        (a, b), (a_dims, b_dims), k, sizes = aligned_operands(gemm)
    properties = {
        "a_dims": int_array(a_dims),
        "b_dims": int_array(b_dims),
        "sizes": int_array(sizes),
        "k": IntegerAttr(k, i64),
    }
    if reason:
        properties["reason"] = StringAttr(reason)
    matmul = loop.LibraryMatmulOp.create(operands=[a, b, out], properties=properties)
    matmul.location = kernel.location
    before.append(matmul)
    block.insert_ops_before(before, kernel)
    if store is not None:
        kernel.detach()
        kernel.erase()
        return matmul
    red = gemm.contraction
    load = loop.LoadOp.create(operands=[out, *kernel.body.block.args], result_types=[element])
    kernel.body.block.insert_op_before(load, red)
    red.result.replace_all_uses_with(load.result)
    red.detach()
    red.erase()
    kernel.properties.pop("kind", None)  # an element-wise kernel now
    taken = kernel_names(kernel.get_toplevel_object())  # type: ignore[arg-type]
    name = unique_name("poi_" + kernel.kernel_name.data.removeprefix("mm_"), taken)
    kernel.kernel_name = StringAttr(name)
    return matmul


@dataclass(frozen=True)
class LibraryGemmPass(ModulePass):
    """`library-gemm`: the named GEMM kernels (`*`: every one it can take) run as
    the vendor library's GEMM and an element-wise epilogue kernel."""

    name = "library-gemm"
    levels = ("loop",)

    kernels: str = "*"
    """Comma-separated kernel names, or `*` for every kernel `plain_gemm` takes."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        names = {n.strip() for n in self.kernels.split(",") if n.strip()}
        every = "*" in names
        for kernel in loop.kernels(op):
            name = kernel.kernel_name.data
            if not every and name not in names:
                continue
            names.discard(name)
            gemm = plain_gemm(kernel)
            if gemm is not None:
                to_library(gemm)
            elif not every:
                raise IrcError.at(
                    op_location(kernel),
                    f"library-gemm: kernel {quoted(name)} is not a GEMM the library runs (the "
                    "sum over K of a product of two bf16, f16 or f32 loads indexed by the "
                    "kernel's indices and K)",
                )
        names.discard("*")
        if names:
            raise IrcError(
                Diagnostic(None, f"library-gemm: no kernel is named {quoted(min(names))}")
            )
