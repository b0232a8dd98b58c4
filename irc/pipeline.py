"""Pass pipelines: `decompose,NAME{opt=v}` strings to xDSL passes, run with checks.

The spec syntax and option conversion are xDSL's (`parse_pipeline`,
`ModulePass.from_pass_spec`); irc adds user-facing errors, the verifier after
every pass, and a hook to print the IR after each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from irc.diagnostics import Diagnostic, IrcError
from irc.passes import PASSES
from irc.verifier import verify


class PassFailure(Exception):
    """An unexpected exception inside a pass: a bug in irc, not in the input."""

    def __init__(self, pass_name: str, error: BaseException):
        super().__init__(f"pass '{pass_name}' failed: {type(error).__name__}: {error}")
        self.pass_name = pass_name
        self.error = error


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
    """`'decompose,tile{block=1024}'` -> pass instances; raises `IrcError`."""
    if not spec.strip():
        return []
    try:
        specs = list(parse_pipeline(spec))
    except (ArgSpecParseError, ValueError) as e:
        raise IrcError(Diagnostic(None, f"malformed pass pipeline '{spec}': {e}")) from None
    passes: list[ModulePass] = []
    for s in specs:
        if s.name not in PASSES:
            known = ", ".join(sorted(PASSES))
            raise IrcError(Diagnostic(None, f"unknown pass '{s.name}' (available: {known})"))
        cls = PASSES[s.name]()
        try:
            passes.append(cls.from_pass_spec(s))
        except (ValueError, TypeError, ArgSpecParseError) as e:
            raise IrcError(Diagnostic(None, f"bad options for pass '{s.name}': {e}")) from None
    return passes


AfterPass = Callable[[ModulePass, ModuleOp], None]


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
    ctx = context()
    for p in passes:
        try:
            p.apply(ctx, module)
        except IrcError:
            raise
        except Exception as e:
            raise PassFailure(p.name, e) from e
        if verify_each:
            verify(module, context=p.name)
        if after_pass is not None:
            after_pass(p, module)
    return module
