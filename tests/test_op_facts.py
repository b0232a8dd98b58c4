"""Op facts live on the op: every element-wise graph op has each one, and every level uses them.

An element-wise op's class (`graph.ElementwiseOp`) says what each level needs:
its `loop.apply` function and arity, the torch function that defines it, its
Triton expression, its cost, whether it commutes with rounding, whether it is
exact, and how the fuzzer draws it. These tests walk every such op and fail
when a level lacks an entry for it, then compile each one (alone and fused,
at every element type it takes) against torch. docs/architecture.md walks
through adding an op; the last tests keep that page true.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close
from xdsl.ir import Block

import irc
from irc.analysis import bounds, key_band
from irc.dialects import graph, loop, tile
from irc.ir.types import ELEMENT_TYPES, FLOAT_NAMES, INT_NAMES
from irc.lowering import graph_to_loop, loop_to_tile, tile_to_triton
from irc.passes import fuse, fuse_attention
from irc.testing import graphgen, reference

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")
OPS = graph.ELEMENTWISE_OPS
FACTS = (
    "FN", "ARITY", "REFERENCE", "TRITON", "COST", "ROUNDING_COMMUTES", "EXACT", "EXTRA_FNS", "FUZZ",
    "NUMPY", "COMPARISON", "LINEAR", "RIGHT_IDENTITY",
)  # fmt: skip
"""The facts of graph.ElementwiseOp (test_the_facts_are_these_ones keeps the list whole)."""


def ids(op: type[graph.ElementwiseOp]) -> str:
    return op.FN


def element_types(op: type[graph.ElementwiseOp]) -> list[str]:
    """The element types the op's operands (the values, not a where's condition) take."""
    floats, ints = list(FLOAT_NAMES), list(INT_NAMES)
    if issubclass(op, graph.UnaryOp):
        return floats if op.FLOAT_ONLY else floats + ints
    if issubclass(op, graph.BinaryOp):
        return {"float": floats, "arith": floats + ints, "compare": floats + ints + ["i1"]}[op.KIND]
    return floats + ints + ["i1"]


def test_the_facts_are_these_ones() -> None:
    declared = {k for k in graph.ElementwiseOp.__annotations__ if k.isupper()}
    assert declared == set(FACTS)


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_every_op_has_every_fact(op: type[graph.ElementwiseOp]) -> None:
    for fact in FACTS:
        assert hasattr(op, fact), f"{op.name} lacks {fact}"
    assert op.name == f"graph.{op.FN}"
    assert op.ARITY == len(op.get_irdl_definition().operands)
    assert isinstance(op.COST, graph.Cost)
    assert isinstance(op.FUZZ, graph.Fuzz)
    assert op.FUZZ.domain in ("real", "bounded", "positive", "exact")
    assert op.FUZZ.scale in ("same", "unit", "exp", "sqrt", "sum", "product", "max")
    assert op.FUZZ.weight >= 0
    if op.FUZZ.recipe is not None:
        assert callable(getattr(graphgen.Generator, op.FUZZ.recipe)), op.FUZZ.recipe
    if op.ROUNDING_COMMUTES:
        # Rounding commutes with what picks or flips an operand, not with what computes.
        assert op.EXACT
    assert (op.COMPARISON is not None) == (issubclass(op, graph.BinaryOp) and op.KIND == "compare")
    if op.LINEAR is not None:
        assert len(op.LINEAR) == op.ARITY and set(op.LINEAR) <= {1, -1}
    if op.FUZZ.normalizer:
        assert issubclass(op, graph.BinaryOp) and op.FUZZ.recipe is None


def _ints(n: int, seed: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-50, 50, (n,), generator=gen) for _ in range(2)] + [
        torch.arange(n) % 3 - 1  # equal operands too: eq, le, ge
    ]


@pytest.mark.parametrize("op", [op for op in OPS if op.FN in loop.APPLY_FNS], ids=ids)
def test_the_meaning_facts_agree_with_the_reference(op: type[graph.ElementwiseOp]) -> None:
    """COMPARISON, NUMPY, LINEAR and RIGHT_IDENTITY restate the op's meaning for the
    analyses that read them: each says what the op's torch function computes."""
    import numpy as np

    fn = reference.torch_function(op.REFERENCE) if op.REFERENCE is not None else None
    a, b, c = _ints(64, len(op.FN))
    if op.COMPARISON is not None:
        assert fn is not None
        for x, y, holds in ((0, 1, op.COMPARISON.less), (1, 1, op.COMPARISON.equal),
                            (1, 0, op.COMPARISON.greater)):  # fmt: skip
            assert bool(fn(torch.tensor(x), torch.tensor(y))) == holds, (x, y)
        mirrored = op.COMPARISON.mirrored()
        (twin,) = [o for o in OPS if o.COMPARISON == mirrored]
        assert twin.REFERENCE is not None
        assert torch.equal(fn(a, b), reference.torch_function(twin.REFERENCE)(b, a))
    if op.NUMPY is not None:
        assert op.NUMPY.startswith("numpy.")
        numpy_fn = getattr(np, op.NUMPY.removeprefix("numpy."))
        args = [(c % 2 == 0), a, b] if op.ARITY == 3 else [a, b][: op.ARITY]
        assert fn is not None
        want = fn(*args)
        got = numpy_fn(*(x.numpy() for x in args))
        assert np.array_equal(np.asarray(got), want.numpy()), op.NUMPY
    if op.LINEAR is not None:
        assert fn is not None
        assert torch.equal(fn(a, b), op.LINEAR[0] * a + op.LINEAR[1] * b)
    if op.RIGHT_IDENTITY is not None:
        assert fn is not None
        assert torch.equal(fn(a, torch.tensor(op.RIGHT_IDENTITY)), a)


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_every_level_has_an_entry(op: type[graph.ElementwiseOp]) -> None:
    # graph -> loop: the loop.apply that computes it, a function the verifier knows.
    assert graph_to_loop.ELEMENTWISE_FN[op] == op.FN
    assert loop.APPLY_FNS[op.FN] == op.ARITY
    # loop -> tile: rounding facts, and the predicates that give i1.
    assert (op.FN in loop_to_tile.ROUNDING_COMMUTES) == op.ROUNDING_COMMUTES
    assert (op.FN in loop_to_tile.EXACT) == op.EXACT
    is_compare = issubclass(op, graph.BinaryOp) and op.KIND == "compare"
    assert (op.FN in loop_to_tile.PREDICATES) == is_compare
    # index arithmetic with a constant folds by the right identity.
    assert (op.FN in loop_to_tile.INDEX_FOLDS) == (op.RIGHT_IDENTITY is not None)
    # the bounds analysis: what a comparison says of its operands.
    assert bounds.COMPARE.get(op.FN) == op.COMPARISON
    # attention's causal mask: an order between row and key index.
    order = op.COMPARISON is not None and op.COMPARISON.order
    assert (op.FN in key_band.COMPARISONS) == order
    # fusion's cost model.
    assert (op in fuse.CHEAP_OPS) == (op.COST is graph.Cost.CHEAP)
    # the reference interpreter.
    assert op in reference.EVALUATORS
    # the fuzzer draws it.
    drawn = [*graphgen.UNARY, *graphgen.COMPARE, *(o.FN for o in graphgen.BINARY_OPS)]
    assert op.FN in drawn or op.FUZZ.recipe in ("where", "cast")
    if op.FUZZ.activation:
        assert op.FN in graphgen.ACTIVATIONS
    assert (op in graphgen.NORMALIZERS) == op.FUZZ.normalizer


def _triton_form(op: type[graph.ElementwiseOp], operand: str, result: str) -> str:
    """What tile_to_triton prints for the op on `operand`-typed values (computed types)."""
    cond = [ELEMENT_TYPES["i1"]] if op.ARITY == 3 else []
    values = [ELEMENT_TYPES[operand]] * (op.ARITY - len(cond))
    block = Block(arg_types=[*cond, *values])
    apply = tile.ApplyOp.create(
        operands=list(block.args),
        result_types=[ELEMENT_TYPES[result]],
        properties={"fn": loop.apply_fn(op.FN)},
    )
    printer = tile_to_triton.KernelPrinter.__new__(tile_to_triton.KernelPrinter)
    printer.names = {a: f"v{i}" for i, a in enumerate(block.args)}
    return printer.apply(apply)


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_every_op_has_a_triton_form_at_every_type(op: type[graph.ElementwiseOp]) -> None:
    for el in element_types(op):
        computed = "f32" if el in ("f16", "bf16") else el  # tile computes halves in f32
        result = "i1" if op.FN in loop_to_tile.PREDICATES else computed
        if op is graph.CastOp:
            result = "f32" if el != "f32" else "i32"
        text = _triton_form(op, computed, result)
        assert all(f"v{i}" in text for i in range(op.ARITY)), (el, text)
        compile(text, "template", "eval")  # a Python expression


@pytest.mark.parametrize("op", [op for op in OPS if op.TRITON is not None], ids=ids)
def test_templates_use_each_operand(op: type[graph.ElementwiseOp]) -> None:
    template = op.TRITON
    forms = [template] if isinstance(template, str) else list(template.values())  # type: ignore[union-attr]
    if not isinstance(template, str):
        allowed = {*FLOAT_NAMES, *INT_NAMES, "i1", "float", "int", graph.HALF_RESULT}
        assert set(template) <= allowed  # type: ignore[arg-type]
    for form in forms:
        used = {int(i) for i in re.findall(r"\{(\d+)\}", form)}
        assert used == set(range(op.ARITY)), (op.name, form)


@pytest.mark.parametrize("op", [op for op in OPS if op.REFERENCE is not None], ids=ids)
def test_reference_names_a_torch_function(op: type[graph.ElementwiseOp]) -> None:
    assert op.REFERENCE is not None and op.REFERENCE.startswith("torch.")
    assert callable(reference.torch_function(op.REFERENCE))


def test_an_unknown_reference_is_an_error() -> None:
    with pytest.raises(ValueError, match="no torch function torch.nope"):
        reference.torch_function("torch.nope")


def test_the_dialects_load_without_torch_or_triton() -> None:
    """irc-opt starts fast: op facts are names and text, resolved where they are used."""
    code = (
        "import sys, irc.dialects.graph, irc.dialects.loop, irc.dialects.tile\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- every op, compiled: alone and fused, at each element type, against torch ----------


def _inputs(op: type[graph.ElementwiseOp], el: str, n: int) -> list[Tensor]:
    """Operands in the op's domain (its fuzz facts say which), all exact in `el`."""
    gen = torch.Generator().manual_seed(len(op.FN) * 7 + len(el))
    dtype = reference.torch_dtype(ELEMENT_TYPES[el])
    values = [reference.random_tensor((n,), dtype, gen) for _ in range(op.ARITY)]
    if op.ARITY == 3:  # where: an i1 condition
        values[0] = reference.random_tensor((n,), torch.bool, gen)
    if not dtype.is_floating_point:
        return values
    fuzz = op.FUZZ
    if fuzz.domain == "positive":
        values[-1] = values[-1].abs() + fuzz.bound
    elif fuzz.domain == "bounded":
        values = [v.clamp(-fuzz.bound, fuzz.bound) for v in values]
    elif fuzz.recipe == "power":
        values = [values[0].abs() + 0.5, values[1].clamp(-2.0, 2.0)]
    return values


def _program(op: type[graph.ElementwiseOp], el: str, n: int, fused: bool) -> str:
    """`%r = graph.OP ...` on the arguments; fused, each value operand goes through an
    identity first (maximum(x, x)), so the op is computed inside a two-op kernel."""
    cond = ["i1"] if op.ARITY == 3 else []
    types = [*cond, *[el] * (op.ARITY - len(cond))]
    t = {e: f"tensor<{n}x{e}>" for e in {*types, "i1"}}
    out = t["i1"] if op.FN in loop_to_tile.PREDICATES else t[el]
    if op is graph.CastOp:
        out = f"tensor<{n}x{'f32' if el != 'f32' else 'i32'}>"
    args = ", ".join(f"%a{i}: {t[e]}" for i, e in enumerate(types))
    body, names = [], []
    for i, e in enumerate(types):
        if fused and e != "i1":
            body.append(f"  %m{i} = graph.maximum %a{i}, %a{i} : {t[e]}")
            names.append(f"%m{i}")
        else:
            names.append(f"%a{i}")
    body.append(f"  %r = graph.{op.FN} {', '.join(names)} : {out}")
    return f"func @f({args}) -> {out} {{\n" + "\n".join(body) + f"\n  return %r : {out}\n}}\n"


CASES = [
    (op, el, fused)
    for op in OPS
    for el in element_types(op)
    for fused in (False, True)
    if not (fused and el == "i1")
]


@pytest.mark.parametrize(
    ("op", "el", "fused"),
    CASES,
    ids=[f"{o.FN}-{e}-{'fused' if f else 'alone'}" for o, e, f in CASES],
)
def test_every_op_compiles_and_matches_torch(
    op: type[graph.ElementwiseOp], el: str, fused: bool
) -> None:
    n = 37
    module = irc.parse(_program(op, el, n, fused), f"{op.FN}.ir")
    irc.verify(module)
    compiled = irc.compile(module, device=DEVICE, fuse=fused)
    assert compiled.kernel_count == 1
    xs = [x.to(DEVICE) for x in _inputs(op, el, n)]
    (got,) = compiled.run("f", xs)
    (want,) = reference.run_function(reference.functions(module)["f"], xs)
    if op.EXACT:
        # No rounding anywhere: the same values as torch, bit for bit.
        if got.is_floating_point():
            assert torch.equal(got.isnan(), want.isnan())
            got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
        assert torch.equal(got, want), (got, want)
    else:
        assert_close(got, want, equal_nan=True)


# --- docs/architecture.md: "Adding an element-wise op" ------------------------------------

DOC = (ROOT / "docs" / "architecture.md").read_text()
SECTION = DOC[DOC.index("## Adding an element-wise op") :].split("\n## ")[0]


def test_the_walk_through_names_every_fact() -> None:
    for fact in FACTS:
        assert f"`{fact}`" in SECTION, fact


def test_the_walk_through_quotes_the_dialect() -> None:
    """Its example is graph.erf as dialects/graph.py defines it, word for word."""
    source = (ROOT / "dialects" / "graph.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", SECTION, re.DOTALL)
    assert blocks
    for block in blocks:
        assert block in source, block


def test_the_walk_through_names_the_readers_of_each_fact() -> None:
    """Each `FILE` the page says reads a fact does read it (by name)."""
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*?) \|$", SECTION, re.MULTILINE)
    assert {fact for fact, _ in rows} == set(FACTS)
    for fact, readers in rows:
        files = re.findall(r"`([a-z_/]+\.py)`", readers)
        assert files, fact
        for name in files:
            text = (ROOT / name).read_text()
            assert re.search(rf"\b{fact}\b", text), (fact, name)


# --- every graph op, not only the element-wise ones ---------------------------------------

GRAPH_OPS = [op for op in graph.Graph.operations if issubclass(op, graph.GraphOp)]
"""Every op a graph program is written in (graph.fused and graph.yield are fusion's)."""
GRAPH_FACTS = (
    "REQUIRED_RESULT_TYPE",
    "SHORT_NAME",
    "VIEW",
    "SUBSET",
    "GENERATOR",
    "REINDEXING",
    "REFERENCE_TEMPORARIES",
)


def op_name(op: type[graph.GraphOp]) -> str:
    return op.name.removeprefix("graph.")


def test_the_graph_op_facts_are_these_ones() -> None:
    declared = {k for k in graph.GraphOp.__annotations__ if k.isupper()}
    assert declared == set(GRAPH_FACTS)


@pytest.mark.parametrize("op", GRAPH_OPS, ids=op_name)
def test_every_graph_op_has_its_facts_at_every_level(op: type[graph.GraphOp]) -> None:
    assert op.short_name().isidentifier()  # a word of a kernel name
    assert isinstance(op.VIEW, bool) and isinstance(op.REQUIRED_RESULT_TYPE, bool)
    assert isinstance(op.GENERATOR, bool) and not (op.VIEW and op.GENERATOR)
    # fusion counts views and generators as free.
    assert (op in fuse.FREE_OPS) == (op.VIEW or op.GENERATOR)
    assert (op in fuse.REINDEXING_OPS) == op.REINDEXING
    assert isinstance(op.REINDEXING, bool) and not (op.REINDEXING and (op.VIEW or op.GENERATOR))
    if op.GENERATOR:
        assert not op.get_irdl_definition().operands
    assert isinstance(op.REFERENCE_TEMPORARIES, int) and op.REFERENCE_TEMPORARIES >= 0
    # the reference interpreter evaluates it.
    assert op in reference.EVALUATORS
    # fusion sees through views and counts the rest as work.
    assert (op in fuse.VIEW_OPS) == op.VIEW
    # decompose rewrites composites; graph-to-loop refuses them.
    assert (op in graph.COMPOSITE_OPS) == (op in graph_to_loop.COMPOSITE_OPS)
    if issubclass(op, graph.ReduceOp):
        assert op in graph.REDUCE_OPS and op.COMBINE in loop.REDUCE_KINDS
        # loop-to-tile accumulates, and decompose splits, by the combining op.
        assert loop_to_tile.COMBINE[op.COMBINE] == op.COMBINER.FN
        assert issubclass(op.COMBINER, graph.BinaryOp) and op.COMBINER.KIND == "arith"
        # graphgen: a reduction is exact (safe to compare) where its combining op is.
        assert op.name.removeprefix("graph.") in graphgen.REDUCE
    if op.VIEW:
        assert not issubclass(op, graph.ElementwiseOp)
        # attention's matcher looks through the views that keep every element.
        assert (op in fuse_attention.VIEWS) == (not op.SUBSET)
    else:
        assert not op.SUBSET


@pytest.mark.parametrize("op", graph.REDUCE_OPS, ids=op_name)
def test_a_reduction_is_its_combining_op_over_partial_results(op: type[graph.ReduceOp]) -> None:
    """Decompose splits a reduction into parts and combines them by COMBINER: the
    reference of the parts, so combined, is the whole's (a mean's sum, then divided)."""
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    whole = {"sum": x.sum(1), "max": x.amax(1), "min": x.amin(1)}[op.COMBINE]
    parts = [{"sum": p.sum(1), "max": p.amax(1), "min": p.amin(1)}[op.COMBINE]
             for p in x.split(5, dim=1)]  # fmt: skip
    combine = reference.torch_function(op.COMBINER.REFERENCE)  # type: ignore[arg-type]
    total = parts[0]
    for p in parts[1:]:
        total = combine(total, p)
    assert_close(total, whole)
    assert op.COMBINER.EXACT == (op.COMBINE != "sum")  # max and min pick an element


NOT_DRAWN_YET = {"graph.attention"}
"""Ops the fuzzer has no recipe for yet (added after it): exact, so that it shrinks."""


def _first_programs(seeds: int = 400) -> dict[str, str]:
    """The first generated program that holds each graph op, by the op's name."""
    first: dict[str, str] = {}
    for seed in range(seeds):
        text = graphgen.generate(seed)
        for name in re.findall(r"= (graph\.[a-z_]+)", text):
            first.setdefault(name, text)
        if len(first) == len(GRAPH_OPS):
            break
    return first


def test_every_graph_op_is_drawn_by_the_fuzzer_and_lowers_to_triton() -> None:
    """Each op goes through every level: the fuzzer draws it, and a program holding it
    (the first one drawn) verifies and lowers to a Triton module; graph-to-loop lowers
    it as a view exactly where its VIEW fact says so."""
    first = _first_programs()
    assert set(first) == {op.name for op in GRAPH_OPS} - NOT_DRAWN_YET
    for name, text in first.items():
        module = irc.parse(text, f"{name}.ir")
        irc.verify(module)
        for op in module.walk():
            if isinstance(op, graph.GraphOp):
                assert (graph_to_loop.view_map(op) is not None) == op.VIEW, op.name
        source = irc.compile(module, device="cpu", fuse=True).source
        assert "@triton.jit" in source, name
