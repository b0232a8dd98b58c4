"""The Python embedding API: parse/print, pipelines, the pass registry, xDSL interop."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.passes import ModulePass
from xdsl.universe import Universe

import irc
from irc.dialects import DIALECTS, all_dialects, graph
from irc.passes import PASSES, XDSL_PASSES
from irc.passes.decompose import DecomposePass
from irc.pipeline import PassFailure, context
from irc.syntax.mlir_input import emit_mlir as mlir_text
from irc.syntax.mlir_input import parse_mlir
from irc.syntax.parser import op_classes
from irc.tools.opt import EMITTERS, emit_mlir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.ir"))

SOFTMAX = """\
func @softmax(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = graph.softmax %x {dim = 1} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
"""


def test_parse_and_print() -> None:
    module = irc.parse(SOFTMAX)
    assert isinstance(module, ModuleOp)
    (f,) = module.body.ops
    assert f.sym_name.data == "softmax"  # type: ignore[attr-defined]
    assert irc.print_module(module) == SOFTMAX
    # A single function prints on its own too.
    assert irc.print_module(f) == SOFTMAX


def test_parse_file_returns_the_module_and_its_text() -> None:
    module, text = irc.parse_file(str(ROOT / "examples" / "softmax.ir"))
    assert text == (ROOT / "examples" / "softmax.ir").read_text()
    assert [op.sym_name.data for op in module.body.ops] == ["softmax"]  # type: ignore[attr-defined]


def test_parse_errors_are_irc_errors_with_locations() -> None:
    with pytest.raises(irc.IrcError) as info:
        irc.parse("func @f() {\n  %y = graph.nope\n  return\n}\n", "api.ir")
    (d,) = info.value.diagnostics
    assert isinstance(d, irc.Diagnostic)
    assert d.location == irc.Location("api.ir", 2, 8)
    assert str(info.value) == d.message
    assert d.message.startswith("unknown op 'graph.nope' (did you mean graph.")


def test_first_line_shifts_locations() -> None:
    with pytest.raises(irc.IrcError) as info:
        irc.parse("func @f() {\n  return %q\n}\n", "chunk.ir", first_line=41)
    assert info.value.diagnostics[0].location == irc.Location("chunk.ir", 42, 10)


def test_verify_collects_every_problem() -> None:
    text = SOFTMAX.replace("{dim = 1} : tensor<4x8xf32>", "{dim = 1} : tensor<4x8xf16>")
    text = text.replace("return %y : tensor<4x8xf32>", "return %y : tensor<4x8xf16>")
    module = irc.parse(text)  # the written type is checked by the verifier
    with pytest.raises(irc.IrcError) as info:
        irc.verify(module)
    messages = [d.message for d in info.value.diagnostics]
    assert messages == [
        "graph.softmax: result type tensor<4x8xf16> does not match the inferred type "
        "tensor<4x8xf32>",
        "return value 0 (%y) has type tensor<4x8xf16> but @softmax declares tensor<4x8xf32>",
    ]


def test_run_pipeline_with_a_string() -> None:
    module = irc.parse(SOFTMAX)
    assert irc.run_pipeline(module, "decompose") is module
    printed = irc.print_module(module)
    assert "graph.softmax" not in printed
    assert [line.split("=")[1].split()[0] for line in printed.splitlines() if " = " in line] == [
        "graph.reduce_max", "graph.sub", "graph.exp", "graph.reduce_sum", "graph.div",
    ]  # fmt: skip


def test_run_pipeline_with_pass_instances_and_a_callback() -> None:
    module = irc.parse(SOFTMAX)
    seen: list[tuple[str, str]] = []
    irc.run_pipeline(
        module,
        [DecomposePass(), DecomposePass()],
        after_pass=lambda p, m: seen.append((p.name, irc.print_module(m))),
    )
    assert [name for name, _ in seen] == ["decompose", "decompose"]
    assert seen[0][1] == seen[1][1] == irc.print_module(module)


def test_empty_pipeline_does_nothing() -> None:
    module = irc.parse(SOFTMAX)
    assert irc.build_pipeline("") == [] and irc.build_pipeline("  ") == []
    irc.run_pipeline(module, "")
    assert irc.print_module(module) == SOFTMAX


def test_build_pipeline() -> None:
    passes = irc.build_pipeline("decompose,decompose")
    assert passes == [DecomposePass(), DecomposePass()]
    for spec, message in [
        ("decompose,,", "malformed pass pipeline"),
        ("no-such-pass", "unknown pass 'no-such-pass' (available: "),
        ("decompose{a=1}", "pass 'decompose' has no option 'a'"),
    ]:
        with pytest.raises(irc.IrcError) as info:
            irc.build_pipeline(spec)
        assert info.value.diagnostics[0].location is None
        assert message in info.value.diagnostics[0].message


def test_a_failing_pass_is_named_and_keeps_its_cause() -> None:
    @dataclasses.dataclass(frozen=True)
    class Failing(ModulePass):
        name = "failing"

        def apply(self, ctx: Context, op: ModuleOp) -> None:
            raise ZeroDivisionError("in the pass")

    with pytest.raises(PassFailure) as info:
        irc.run_pipeline(irc.parse(SOFTMAX), [Failing()])
    assert info.value.pass_name == "failing"
    assert isinstance(info.value.error, ZeroDivisionError)
    assert "pass 'failing' failed: ZeroDivisionError: in the pass" == str(info.value)


def test_verify_each_can_be_turned_off() -> None:
    @dataclasses.dataclass(frozen=True)
    class Breaker(ModulePass):
        name = "breaker"

        def apply(self, ctx: Context, op: ModuleOp) -> None:
            ret = op.body.block.first_op.body.block.last_op  # type: ignore[union-attr]
            ret.detach()
            ret.erase()

    irc.run_pipeline(irc.parse(SOFTMAX), [Breaker()], verify_each=False)
    with pytest.raises(irc.IrcError) as info:
        irc.run_pipeline(irc.parse(SOFTMAX), [Breaker()])
    assert info.value.diagnostics[0].message == (
        "after pass 'breaker': function @softmax must end with 'return'"
    )


# --- the registry and xDSL interop -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PASSES))
def test_each_registered_pass_is_named_by_its_key(name: str) -> None:
    cls = PASSES[name]()
    assert isinstance(cls, type) and issubclass(cls, ModulePass)
    assert cls.name == name
    # Each can be built from its own spec (all options have defaults).
    (p,) = irc.build_pipeline(name)
    assert isinstance(p, cls)


def test_registry_holds_decompose() -> None:
    assert PASSES["decompose"]() is DecomposePass


def test_dialects_hold_every_spec_op() -> None:
    spec_ops = (
        "neg abs exp log sqrt rsqrt sin cos tanh sigmoid relu gelu silu reciprocal "
        "add sub mul div maximum minimum pow eq ne lt le gt ge where cast constant "
        "reduce_sum reduce_max reduce_min reduce_mean matmul transpose reshape broadcast "
        "softmax layer_norm"
    ).split()
    names = {op.name for op in graph.Graph.operations}
    assert {f"graph.{op}" for op in spec_ops} <= names
    assert set(op_classes()) >= names
    assert [d.name for d in all_dialects()] == list(DIALECTS)


def test_universe_entry_point() -> None:
    (entry,) = [
        e for e in importlib.metadata.entry_points(group="xdsl.universe") if e.name == "irc"
    ]
    assert entry.value == "irc.universe:IRC_UNIVERSE"
    universe = entry.load()
    assert isinstance(universe, Universe)
    assert set(universe.all_dialects) == set(DIALECTS)
    # irc's own passes; the xDSL ones its pipeline also runs (dce) xdsl-opt has already.
    assert set(universe.all_passes) == set(PASSES) - XDSL_PASSES
    assert XDSL_PASSES and XDSL_PASSES <= set(PASSES)
    assert universe.all_dialects["graph"]() is graph.Graph
    # Joined with xDSL's own universe (as xdsl-opt does) without a name clash.
    multiverse = Universe.get_multiverse()
    assert "graph" in multiverse.all_dialects and "decompose" in multiverse.all_passes
    assert all(multiverse.all_passes[name]() is PASSES[name]() for name in XDSL_PASSES)
    assert "builtin" in multiverse.all_dialects


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_mlir_output_reparses_with_xdsl(path: Path) -> None:
    module = irc.parse(path.read_text(), str(path))
    irc.verify(module)
    text = emit_mlir(module)
    assert EMITTERS["mlir"] is emit_mlir
    reparsed = Parser(context(), text).parse_module()
    reparsed.verify()
    assert reparsed.is_structurally_equivalent(module)
    # Read back by irc (which undoes the name escaping xDSL keeps), it prints the same
    # (locations aside: the module op itself has none, and gets the MLIR text's).
    plain = mlir_text(module, debuginfo=False)
    assert mlir_text(parse_mlir(text, str(path)), debuginfo=False) == plain
    # The IR is still irc's: it verifies and prints as irc text that parses back.
    irc.verify(reparsed)
    assert irc.parse(irc.print_module(reparsed)).is_structurally_equivalent(module)


def test_mlir_output_with_numeric_names_defines_each_name_once() -> None:
    text = (
        "func @f(%0: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %1 = graph.softmax %0 {dim = 0}\n"
        "  return %1 : tensor<4xf32>\n"
        "}\n"
    )
    module = irc.parse(text)
    irc.run_pipeline(module, "decompose")
    mlir = emit_mlir(module)
    reparsed = Parser(context(), mlir).parse_module()  # fails on a name defined twice
    assert reparsed.is_structurally_equivalent(module)
    # The module itself keeps its names.
    assert irc.print_module(module).startswith("func @f(%0: tensor<4xf32>)")


def test_xdsl_opt_reads_irc_output(tmp_path: Path) -> None:
    # The xdsl-opt script where this Python has it (a venv); the same entry point
    # through the interpreter where scripts live elsewhere (a --target install).
    beside = Path(sys.executable).parent / "xdsl-opt"
    xdsl_opt = [str(beside)] if beside.exists() else [sys.executable, "-m", "xdsl.tools.xdsl_opt"]
    source = tmp_path / "in.mlir"
    source.write_text(emit_mlir(irc.parse(SOFTMAX)))
    proc = subprocess.run(
        [*xdsl_opt, str(source), "-p", "decompose", "--print-op-generic"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    reparsed = Parser(context(), proc.stdout).parse_module()
    expected = irc.parse(SOFTMAX)
    irc.run_pipeline(expected, "decompose")
    assert reparsed.is_structurally_equivalent(expected)


MIXED_PROGRAM = """func @f(%x: tensor<5x7xf32>) -> (tensor<5x7xf32>, tensor<f32>) {
  %s = graph.softmax %x {dim = 1} : tensor<5x7xf32>
  %t = graph.reduce_sum %x {dims = [0, 1]} : tensor<f32>
  return %s, %t : tensor<5x7xf32>, tensor<f32>
}"""

FRESH_PRELUDE = """
import os, sys, torch, irc
if IMPORT_TRITON_FIRST:
    import triton
os.environ.pop("TRITON_INTERPRET", None)


def compiled_library():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    return isinstance(tl.sum, JITFunction) and isinstance(tl.standard.max, JITFunction)

PROGRAM = os.environ["IRC_TEST_PROGRAM"]

def check(device):
    m = irc.compile(irc.parse(PROGRAM), device=device)
    x = torch.randn(5, 7, device=device)
    s, t = m.f(x)
    torch.testing.assert_close(s, torch.softmax(x, 1))
    torch.testing.assert_close(t, x.sum())
"""


def run_fresh(script: str, triton_first: bool = True, interpret_at_import: bool = False) -> None:
    """Runs `script` in a new Python, which may import triton before irc does, with
    or without TRITON_INTERPRET: Triton builds tl.sum, tl.max and the rest of its @jit
    library then, as compiled-only or as interpreted-only functions."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["IRC_TEST_PROGRAM"] = MIXED_PROGRAM
    if interpret_at_import:
        env["TRITON_INTERPRET"] = "1"
    prelude = f"IMPORT_TRITON_FIRST = {triton_first}\n" + FRESH_PRELUDE
    proc = subprocess.run(
        [sys.executable, "-c", prelude + script + '\nprint("ok")'],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_cpu_compile_works_after_the_program_imported_triton() -> None:
    run_fresh(
        """
check("cpu")
assert compiled_library(), "the caller's Triton is left as it was"
"""
    )


def test_the_cpu_path_imports_triton_compiled() -> None:
    # so that the same process can compile for a GPU afterwards
    run_fresh(
        """
assert "triton" not in sys.modules
check("cpu")
assert compiled_library()
""",
        triton_first=False,
    )


def test_a_cpu_run_leaves_tritons_language_as_it_found_it() -> None:
    # Triton's interpreter patches tl.core for every device-function call (tl.sum,
    # irc's helpers) and never undoes it; left so, the next GPU compile in the process
    # fails ("'ir.value' object has no attribute 'dtype'").
    run_fresh(
        """
import triton.language as tl
owners = (tl, tl.core, tl.math, tl.standard, tl.core.tensor, tl.core.dtype)
before = [dict(vars(o)) for o in owners]
check("cpu")
after = [dict(vars(o)) for o in owners]
for o, b, a in zip(owners, before, after):
    changed = sorted(k for k in b.keys() | a.keys() if b.get(k) is not a.get(k))
    assert not changed, (o, changed[:10])
"""
    )


def test_triton_imported_interpreted_runs_on_cpu_and_refuses_the_gpu_clearly() -> None:
    run_fresh(
        """
check("cpu")
assert not compiled_library()
try:
    irc.compile(irc.parse(PROGRAM), device="cuda")
except RuntimeError as e:
    assert "TRITON_INTERPRET" in str(e) and 'device="cpu"' in str(e), e
else:
    raise AssertionError("compiled for cuda with an interpreted Triton")
""",
        interpret_at_import=True,
    )


@pytest.mark.gpu
def test_cpu_then_gpu_then_cpu_in_one_process() -> None:
    run_fresh('check("cpu")\ncheck("cuda")\ncheck("cpu")', triton_first=False)
    run_fresh('check("cuda")\ncheck("cpu")\ncheck("cuda")')


def test_a_cpu_module_on_a_gpu_machine_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`device="cpu"` where CUDA is available: the generated header must not decide
    for itself that it runs on the GPU (it did: 'argument 0 is on cpu; this module
    runs on cpu')."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    m = irc.compile(irc.parse(MIXED_PROGRAM.replace("@f", "@on_cpu")), device="cpu")
    x = torch.randn(5, 7)
    s, t = m.on_cpu(x)
    torch.testing.assert_close(s, torch.softmax(x, 1))
    torch.testing.assert_close(t, x.sum())


# --- the Python API's edges: devices, arguments, names -------------------------------------------

TWO_ARGS = """\
func @softmax(%x: tensor<4x8xf32>, %x.y: tensor<8xf32>) -> tensor<4x8xf32> {
  %a = graph.add %x, %x.y : tensor<4x8xf32>
  %y = graph.softmax %a {dim = 1} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

func @other(%q: tensor<3xf32>) -> tensor<3xf32> {
  %y = graph.neg %q : tensor<3xf32>
  return %y : tensor<3xf32>
}
"""


@pytest.fixture(scope="module")
def two_args() -> irc.CompiledModule:
    return irc.compile(irc.parse(TWO_ARGS), device="cpu")


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        ("banana", ValueError, "irc.compile: unknown device 'banana'; irc runs on \"cpu\" or \"cuda\""),
        ("meta", ValueError, "irc.compile: irc runs on \"cpu\" or \"cuda\", not 'meta'"),
        ("cuda:1", ValueError, 'pass device="cuda", not \'cuda:1\''),
        (3, TypeError, 'irc.compile: device is "cpu", "cuda" or a torch.device, got int'),
    ],
)
def test_compile_checks_the_device_first(device: object, error: type, message: str) -> None:
    """Before this check "banana" compiled and failed at the first call ("0 active drivers")."""
    with pytest.raises(error) as info:
        irc.compile(ROOT / "examples" / "nope.ir", device=device)  # type: ignore[arg-type]
    assert message in str(info.value)  # and not a missing file: nothing else was looked at


def test_compile_on_cuda_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """It was a bare AssertionError from inside torch on a CPU-only build."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", torch.device("cuda")):
        with pytest.raises(irc.IrcError) as info:
            irc.compile(irc.parse(SOFTMAX), device=device)
        (d,) = info.value.diagnostics
        assert d.location is None
        assert d.message.startswith('device="cuda": ') and d.message.endswith('use device="cpu"')


def test_compile_takes_a_torch_device() -> None:
    import torch

    m = irc.compile(irc.parse(SOFTMAX), device=torch.device("cpu"))
    assert m.device == "cpu"
    x = torch.randn(4, 8)
    torch.testing.assert_close(m.softmax(x), torch.softmax(x, 1))


def test_arguments_by_position_and_by_ir_name(two_args: irc.CompiledModule) -> None:
    import torch

    x, b = torch.randn(4, 8), torch.randn(8)
    want = torch.softmax(x + b, 1)
    f = two_args.softmax
    torch.testing.assert_close(f(x, b), want)
    torch.testing.assert_close(f(x=x, **{"x.y": b}), want)
    torch.testing.assert_close(f(x, **{"%x.y": b}), want)
    torch.testing.assert_close(two_args["@softmax"](x, b), want)
    torch.testing.assert_close(two_args.run("softmax", [x, b])[0], want)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda f, x, b: f(x), TypeError, "@softmax takes 2 arguments (%x, %x.y); %x.y is missing"),
        (lambda f, x, b: f(), TypeError, "@softmax takes 2 arguments (%x, %x.y); %x, %x.y are missing"),
        (lambda f, x, b: f(x, b, b), TypeError, "@softmax takes 2 arguments (%x, %x.y), got 3"),
        (lambda f, x, b: f(x, b, y=b), TypeError, "@softmax has no argument %y (its arguments: %x, %x.y)"),
        (lambda f, x, b: f(b, x=x), TypeError, "@softmax got %x twice, by position and by name"),
        (lambda f, x, b: f(x, 1.0), TypeError, "@softmax: argument %x.y must be a torch.Tensor, got float"),
        (lambda f, x, b: f(x, x), ValueError,
         "@softmax: argument %x.y must be a torch.float32 tensor of shape [8], got torch.float32 of "
         "shape [4, 8]"),
        (lambda f, x, b: f(x.double(), b), ValueError,
         "@softmax: argument %x must be a torch.float32 tensor of shape [4, 8], got torch.float64"),
    ],
    ids=["missing", "none", "extra", "unknown-keyword", "twice", "not-a-tensor", "shape", "dtype"],
)  # fmt: skip
def test_wrong_calls_name_the_ir_function_and_arguments(
    two_args: irc.CompiledModule, call: object, error: type, message: str
) -> None:
    """Not `fn0() missing 1 required positional argument: 'arg1'`."""
    import torch

    x, b = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(error) as info:
        call(two_args.softmax, x, b)  # type: ignore[operator]
    assert str(info.value).startswith(message)
    assert "fn0" not in str(info.value) and "arg0" not in str(info.value)


def test_an_unknown_function_lists_the_known_ones(two_args: irc.CompiledModule) -> None:
    with pytest.raises(AttributeError) as info:
        two_args.nope  # noqa: B018
    assert str(info.value) == (
        "the compiled module has no function @nope (its functions: @softmax, @other)"
    )
    assert not hasattr(two_args, "nope") and hasattr(two_args, "other")
    with pytest.raises(KeyError, match="no function @nope"):
        two_args["nope"]
    with pytest.raises(TypeError, match=r"several functions \(@softmax, @other\)"):
        two_args()
    assert {"softmax", "other"} <= set(dir(two_args))


def test_a_module_of_one_function_is_callable_with_keywords() -> None:
    import torch

    m = irc.compile(irc.parse(SOFTMAX), device="cpu")
    x = torch.randn(4, 8)
    torch.testing.assert_close(m(x=x), torch.softmax(x, 1))
    with pytest.raises(TypeError, match=r"@softmax has no argument %y"):
        m(y=x)


def test_a_function_without_arguments_takes_none() -> None:
    import torch

    text = "func @c() -> tensor<2xf32> {\n  %c = graph.constant {value = 1.5} : tensor<2xf32>\n"
    m = irc.compile(irc.parse(text + "  return %c : tensor<2xf32>\n}\n"), device="cpu")
    torch.testing.assert_close(m.c(), torch.full((2,), 1.5))
    with pytest.raises(TypeError, match=r"^@c takes 0 arguments \(none\), got 1$"):
        m.c(torch.ones(2))
    with pytest.raises(TypeError, match=r"^@c has no argument %x \(its arguments: none\)$"):
        m.c(x=torch.ones(2))


@pytest.mark.gpu
def test_cuda_graphs_take_keywords_and_report_wrong_calls() -> None:
    import torch

    m = irc.compile(irc.parse(TWO_ARGS), device="cuda", cuda_graphs=True)
    x, b = torch.randn(4, 8, device="cuda"), torch.randn(8, device="cuda")
    want = torch.softmax(x + b, 1)
    torch.testing.assert_close(m.softmax(x, b).clone(), want)
    torch.testing.assert_close(m.softmax(x=x, **{"x.y": b}).clone(), want)
    assert len(m.functions["softmax"].graphs) == 2  # by position and by name: two captures
    with pytest.raises(TypeError, match=r"^@softmax takes 2 arguments \(%x, %x.y\); %x.y is"):
        m.softmax(x)
    with pytest.raises(TypeError, match=r"^@softmax: argument %x.y must be a torch.Tensor"):
        m.softmax(x, 2.0)
