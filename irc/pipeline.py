"""Pass pipelines: `decompose,NAME{opt=v}` strings to xDSL passes, run with checks.

The spec syntax and option conversion are xDSL's (`parse_pipeline`,
`ModulePass.from_pass_spec`); irc adds MLIR's anchored form
(`builtin.module(decompose,fuse)`), user-facing errors, the verifier after
every pass, and instrumentation (MLIR's PassInstrumentation): hooks before and
after every pass run on a module, whichever code runs the pipeline.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import ArgSpec, parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from irc.analysis.verifier import verify
from irc.gcpause import paused_gc
from irc.ir.value_names import names_xdsl_accepts
from irc.passes import LEVELS, PASSES
from irc.passes.kernel_names import lowering_for_names
from irc.syntax.diagnostics import Diagnostic, IrcError


class PassFailure(Exception):
    """An unexpected exception inside a pass: a bug in irc, not in the input."""

    def __init__(self, pass_name: str, error: BaseException):
        super().__init__(f"pass '{pass_name}' failed: {type(error).__name__}: {error}")
        self.pass_name = pass_name
        self.error = error


LOWERING = (
    "decompose",
    "graph-to-loop",
    "one-pass-variance",
    "split-reduction",
    "pad-gemm-operands",
    "split-tf32-gemm-operands",
    "k-major-gemm-operands",
    "split-k",
    "tile",
    "online-softmax",
    "loop-to-tile",
    "tile-cse",
    "dce",
    "contract-mul-add",
    "tile-sink",
)
"""Passes from the graph level down to tile kernels, in order. `loop-to-tile`
only translates: `tile-cse` shares the equal ops and loads it makes, `dce`
drops the index pieces no access needed, `contract-mul-add` makes a
single-use float product and its addition one FMA, `tile-sink` moves a persistent GEMM's
epilogue index math below its K loop. Autotuning goes right after `tile`, since
what follows reads the tiling."""

AFTER_TILING = LOWERING[LOWERING.index("tile") + 1 :]
"""The passes that take a tiled loop module (`tile{...}` chosen) to tile kernels."""


def context() -> Context:
    """An xDSL context that knows irc's dialects and the builtin/func ones."""
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func

    from irc.dialects import DIALECTS

    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(Func)
    for name, load in DIALECTS.items():
        ctx.register_dialect(name, load)
    return ctx


def build_pipeline(spec: str) -> list[ModulePass]:
    """`'decompose,tile{block=1024}'` (or MLIR's `'builtin.module(decompose,...)'`)
    -> pass instances; raises `IrcError`."""
    whole = spec
    spec, offset = _unanchored(spec)
    if not spec.strip():
        return []
    try:
        specs = list(parse_pipeline(spec))
    except (ArgSpecParseError, ValueError) as e:
        raise IrcError(Diagnostic(None, _malformed(whole, e, offset))) from None
    _check_duplicate_options(spec)
    passes: list[ModulePass] = []
    for s in specs:
        if s.name not in PASSES:
            known = ", ".join(sorted(PASSES))
            raise IrcError(Diagnostic(None, f"unknown pass '{s.name}' (available: {known})"))
        cls = PASSES[s.name]()
        s = _checked_spec(s, cls)
        try:
            passes.append(cls.from_pass_spec(s))
        except (ValueError, TypeError, ArgSpecParseError) as e:
            raise IrcError(Diagnostic(None, f"bad options for pass '{s.name}': {e}")) from None
    return passes


def _check_duplicate_options(spec: str) -> None:
    """An option given twice to one pass (`tile{block=512 block=1024}`); xDSL's parser
    keeps the last silently. The spec is known to parse: its tokens are walked again."""
    from xdsl.utils.arg_spec import PipelineLexer, SpecTokenKind

    lexer = PipelineLexer(spec)
    pass_name, in_options, at_key = "", False, False
    seen: set[str] = set()
    while (tok := lexer.lex()).kind is not SpecTokenKind.EOF:
        text = tok.span.text
        if not in_options:
            if tok.kind is SpecTokenKind.IDENT:
                pass_name = text
            elif tok.kind is SpecTokenKind.L_BRACE:
                in_options, at_key, seen = True, True, set()
        elif tok.kind is SpecTokenKind.R_BRACE:
            in_options = False
        elif tok.kind is SpecTokenKind.SPACE:
            at_key = True
        elif at_key and tok.kind is SpecTokenKind.IDENT:
            key = text.replace("-", "_")
            if key in seen:
                raise IrcError(
                    Diagnostic(
                        None,
                        f"pass '{pass_name}': option '{text}' is given twice "
                        f"(at column {tok.span.start + 1} of '{spec}')",
                    )
                )
            seen.add(key)
            at_key = False
        else:
            at_key = False


def _checked_spec(spec: ArgSpec, cls: type[ModulePass]) -> ArgSpec:
    """The spec with its option names checked and whole numbers given to float options
    made floats (xDSL takes `2` for a float option as a type error)."""
    spec = spec.normalize_parameter_names()
    _check_options(spec.name, cls, spec.parameters)
    hints = typing.get_type_hints(cls)
    parameters = dict(spec.parameters)
    for key, values in parameters.items():
        if hints.get(key) is float:
            parameters[key] = tuple(
                float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                for v in (values if isinstance(values, tuple) else (values,))
            )
    return ArgSpec(spec.name, parameters)


def _check_options(name: str, cls: type[ModulePass], given: Mapping[str, object]) -> None:
    """Unknown option names and ill-typed numbers, in words (xDSL's checks are terse)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name" and f.init}
    hints = typing.get_type_hints(cls)
    for key, value in given.items():
        spelled = key.replace("_", "-")
        if key not in fields:
            listed = ", ".join(k.replace("_", "-") for k in fields)
            why = f"its options: {listed}" if fields else "it takes no options"
            raise IrcError(Diagnostic(None, f"pass '{name}' has no option '{spelled}' ({why})"))
        values = value if isinstance(value, tuple) else (value,)
        want = hints.get(key)
        kinds = {int: "an integer", float: "a number", bool: "true or false"}
        if want in kinds and not (values and all(_is_kind(v, want) for v in values)):
            shown = ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)
            shown = shown or "nothing"
            raise IrcError(
                Diagnostic(
                    None, f"pass '{name}': option '{spelled}' must be {kinds[want]}, got {shown}"
                )
            )


def _is_kind(value: object, kind: object) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _malformed(spec: str, e: BaseException, offset: int = 0) -> str:
    """xDSL's multi-line pipeline syntax error as one line with the column (in
    `spec`: `offset` is where the part xDSL parsed starts)."""
    text = str(e)
    where = re.search(r"pass-pipeline:\d+:(\d+)", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[-1] if lines else type(e).__name__
    reason = reason[:1].lower() + reason[1:]
    column = f" at column {int(where.group(1)) + offset}" if where else ""
    return f"malformed pass pipeline '{spec}'{column}: {reason}"


_ANCHOR = re.compile(r"\s*([A-Za-z_][\w.$-]*)\s*\(")
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def _unanchored(spec: str) -> tuple[str, int]:
    """The pass list of MLIR's textual form `builtin.module(a,b{x=1})` and where it
    starts in `spec`; any other spec is returned as it is. irc's passes all run on
    the whole module, so a nested pass manager (`func.func(...)`) is refused."""
    m = _ANCHOR.match(spec)
    if m is None:
        return spec, 0
    if m.group(1) != "builtin.module":
        raise IrcError(
            Diagnostic(
                None,
                f"pass pipeline '{spec}' is anchored on '{m.group(1)}': irc's passes run on "
                "the whole module, write builtin.module(PASS,...)",
            )
        )
    end = len(spec.rstrip())
    if not spec[:end].endswith(")"):
        raise IrcError(
            Diagnostic(
                None,
                f"malformed pass pipeline '{spec}': expected ')' at its end, closing "
                "'builtin.module('",
            )
        )
    inner = spec[m.end() : end - 1]
    blanked = _STRING.sub(lambda s: " " * len(s.group(0)), inner)  # '(' in an option string
    nested = re.search(r"([A-Za-z_][\w.$-]*)?\s*\(", blanked)
    if nested is not None:
        name = nested.group(1) or ""
        raise IrcError(
            Diagnostic(
                None,
                f"pass pipeline '{spec}' nests a pass manager '{name}(...)' at column "
                f"{m.end() + nested.start() + 1}: irc's passes run on the whole module, "
                "list them directly in builtin.module(...)",
            )
        )
    start = m.end() + len(inner) - len(inner.lstrip())
    return inner.strip(), start


def pipeline_text(passes: Sequence[ModulePass]) -> str:
    """`builtin.module(decompose,tile{block=1024 ...})`: the passes with every option's
    value, in a form `build_pipeline` takes back (MLIR's --dump-pass-pipeline)."""
    parts: list[str] = []
    for p in passes:
        spec = p.pipeline_pass_spec(include_default=True)
        named = {k.replace("_", "-"): v for k, v in spec.parameters.items()}
        parts.append(str(ArgSpec(spec.name, named)))
    return f"builtin.module({','.join(parts)})"


AfterPass = Callable[[ModulePass, ModuleOp], None]


class PassInstrumentation:
    """Hooks around each pass that `run_pipeline` runs on one module (MLIR's
    PassInstrumentation). Installed with `instrumented(module, ...)`, they see every
    pass run on that module, also those a caller's own pipeline adds (the lowering
    of `--emit triton`), and none run on copies of it (autotuning's)."""

    def before_pass(self, p: ModulePass, module: ModuleOp) -> None:
        """Before `p` runs."""

    def after_apply(self, p: ModulePass, module: ModuleOp) -> None:
        """After `p` has run, before the verifier checks its output."""

    def after_pass(self, p: ModulePass, module: ModuleOp) -> None:
        """After `p` has run and its output is verified."""


_INSTRUMENTS: ContextVar[tuple[tuple[ModuleOp, PassInstrumentation], ...]] = ContextVar(
    "irc_pass_instruments", default=()
)


@contextmanager
def instrumented(module: ModuleOp, *instruments: PassInstrumentation) -> Iterator[None]:
    """Runs `instruments` around every pass run on `module` inside the block."""
    token = _INSTRUMENTS.set((*_INSTRUMENTS.get(), *((module, i) for i in instruments)))
    try:
        yield
    finally:
        _INSTRUMENTS.reset(token)


@paused_gc()
def run_pipeline(
    module: ModuleOp,
    pipeline: str | Sequence[ModulePass],
    *,
    verify_each: bool = True,
    after_pass: AfterPass | None = None,
) -> ModuleOp:
    """Runs passes in order on `module` (in place) and returns it.

    The verifier runs after each pass unless `verify_each` is false; an
    exception inside a pass becomes `PassFailure` naming the pass.
    """
    passes = build_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
    with lowering_for_names(lowered_for_names):
        _run(module, passes, verify_each, after_pass)
    return module


def lowered_for_names(module: ModuleOp) -> ModuleOp:
    """A copy of `module` taken down to tile kernels by `LOWERING` up to loop-to-tile,
    which names the kernels as `irc-opt --emit triton` does (the passes after it
    rename none). The passes run directly: `module` is mid-run, its names encoded."""
    copy = module.clone()
    ctx = context()
    for name in LOWERING[: LOWERING.index("loop-to-tile") + 1]:
        PASSES[name]()().apply(ctx, copy)
    return copy


def _run(
    module: ModuleOp,
    passes: Sequence[ModulePass],
    verify_each: bool,
    after_pass: AfterPass | None,
) -> None:
    ctx = context()
    hooks = [i for m, i in _INSTRUMENTS.get() if m is module]
    for p in passes:
        check_level(p, module)
        for hook in hooks:
            hook.before_pass(p, module)
        with names_xdsl_accepts(module):
            try:
                p.apply(ctx, module)
            except IrcError:
                raise
            except Exception as e:
                raise PassFailure(p.name, e) from e
        for hook in hooks:
            hook.after_apply(p, module)
        if verify_each:
            verify(module, context=p.name)
        for hook in hooks:
            hook.after_pass(p, module)
        if after_pass is not None:
            after_pass(p, module)


# --- levels -----------------------------------------------------------------------


def function_level(op: Operation) -> str | None:
    """`graph`, `loop` or `tile` for a top-level op (a function: the lowest level it
    uses), or None for an empty function that shows none."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import MemRefType, TensorType

    from irc.dialects import graph, loop, tile

    if isinstance(op, tile.KernelOp):
        return "tile"
    if not isinstance(op, func.FuncOp):
        return None
    body = list(op.body.block.ops)
    if any(isinstance(o, tile.LaunchOp) for o in body):
        return "tile"
    types = [*op.function_type.inputs.data, *op.function_type.outputs.data]
    if any(isinstance(o, loop.KernelOp | loop.AllocOp) for o in body) or any(
        isinstance(t, MemRefType) for t in types
    ):
        return "loop"
    if any(isinstance(o, graph.GraphOp | graph.FusedOp) for o in body) or any(
        isinstance(t, TensorType) for t in types
    ):
        return "graph"
    return None


def _nothing_to_lower(op: Operation) -> bool:
    """A loop-level function without kernels (its return alone, or buffers and
    library GEMMs): loop-to-tile leaves it as it is, so it is tile-level IR too."""
    from xdsl.dialects import func

    from irc.dialects import loop

    return (
        isinstance(op, func.FuncOp)
        and function_level(op) == "loop"
        and not any(isinstance(o, loop.KernelOp) for o in op.body.block.ops)
    )


def module_levels(module: ModuleOp) -> list[str]:
    """The levels of the module's functions and kernels, highest first."""
    found = {function_level(op) for op in module.body.ops}
    return [level for level in LEVELS if level in found]


def lowest_level(module: ModuleOp) -> str:
    """`graph`, `loop` or `tile`: the lowest level present (`graph` for an empty module)."""
    levels = module_levels(module)
    return levels[-1] if levels else "graph"


_LOWERING_TO = {"loop": "graph-to-loop", "tile": "loop-to-tile"}
_LOWERING_FROM = {"graph": "graph-to-loop", "loop": "loop-to-tile"}


def check_level(p: ModulePass, module: ModuleOp) -> None:
    """Refuses a pass whose `levels` the module has no part at (a pass run on IR of
    another level would find nothing to do and silently do nothing). Passes that
    declare no levels run on anything."""
    wanted: tuple[str, ...] | None = getattr(p, "levels", None)
    if not wanted:
        return
    have = module_levels(module)
    if not have or any(level in wanted for level in have):
        return
    if "tile" in wanted and all(
        function_level(op) is None or _nothing_to_lower(op) for op in module.body.ops
    ):
        # Buffer functions with nothing to launch (a graph function that returns
        # its arguments, lowered) read the same at the loop and tile levels.
        return
    want_words = " or ".join(wanted)
    have_words = " and ".join(have)
    plural = "s" if len(have) > 1 else ""
    first = LEVELS.index(wanted[0])
    if LEVELS.index(have[0]) < first:
        hint = f"run {_LOWERING_TO[wanted[0]]} first"
    else:
        hint = f"it runs before {_LOWERING_FROM[wanted[-1]]}"
    raise IrcError(
        Diagnostic(
            None,
            f"pass '{p.name}' runs on {want_words}-level IR, but this module is at the "
            f"{have_words} level{plural} ({hint})",
        )
    )

