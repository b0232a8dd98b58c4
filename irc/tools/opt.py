"""`irc-opt`: parse, verify, run passes, print. The mlir-opt of irc.

    irc-opt FILE.ir --decompose              # one flag per registered pass
    irc-opt FILE.ir -p 'decompose,fuse'      # or a pipeline string,
    irc-opt FILE.ir --pass-pipeline='builtin.module(decompose,fuse)'  # MLIR's too
    irc-opt FILE.ir --emit mlir | xdsl-opt   # MLIR generic syntax

Debugging a run as in mlir-opt: --print-ir-before-all / --print-ir-after-all
(every pass the run goes through, the lowering `--emit triton` adds included),
--dump-pass-pipeline, --timing.

Exit status: 0 success, 1 the input or the command line has errors (printed as
diagnostics), 2 an internal error in irc (the failing pass is named; --debug
shows the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from irc.analysis.verifier import verify
from irc.gcpause import paused_gc
from irc.passes import PASSES
from irc.pipeline import (
    PassFailure,
    PassInstrumentation,
    build_pipeline,
    instrumented,
    pipeline_text,
    run_pipeline,
)
from irc.syntax.diagnostics import Diagnostic, IrcError, Location, SourceManager
from irc.syntax.mlir_input import INPUT_FORMATS, parse_input, quote_sources
from irc.syntax.mlir_input import emit_mlir as emit_mlir_with
from irc.syntax.parser import decode_source
from irc.syntax.printer import print_module
from irc.tools.cli import ArgumentParser, add_version

SPLIT_MARKER = re.compile(r"^// -----", re.MULTILINE)


def emit_mlir(module: ModuleOp) -> str:
    """MLIR generic syntax with locations, for xdsl-opt and mlir-opt (irc.syntax.mlir_input)."""
    return emit_mlir_with(module)


def emit_triton(module: ModuleOp) -> str:
    """The Triton Python module; lowers graph or loop IR down to tile first."""
    from irc.compiler import triton_source

    return triton_source(module)


def emit_dot(module: ModuleOp) -> str:
    """Graphviz, one cluster per fusion group."""
    from irc.tools.dot import emit_dot as draw

    return draw(module)


EMITTERS: dict[str, Callable[[ModuleOp], str]] = {
    "ir": print_module,
    "mlir": emit_mlir,
    "triton": emit_triton,
    "dot": emit_dot,
}
"""`--emit` targets; later levels register theirs here."""


class _AppendPass(argparse.Action):
    """Keeps pass flags and -p pipelines in command-line order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        ns: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items: list[str] = list(getattr(ns, "pipeline_items", None) or [])
        items.append(values if isinstance(values, str) else self.const)
        ns.pipeline_items = items


@dataclass(frozen=True)
class ReportSpec:
    """`--fusion-report[=text|json][=FILE]`: the form, and the file it goes to."""

    mode: str
    path: str | None = None


@dataclass(frozen=True)
class NotAReportForm:
    """What followed `--fusion-report` when it is no form: the input file, when no
    other was given (`irc-opt --fuse --fusion-report f.ir`), else a usage error."""

    value: str


def report_spec(value: str) -> ReportSpec | NotAReportForm:
    mode, eq, path = value.partition("=")
    if mode not in ("text", "json") or (eq and not path):
        return NotAReportForm(value)
    return ReportSpec(mode, path or None)


def settle_report_form(
    ap: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """`--fusion-report` takes an optional form, so argparse gives it the input file
    that follows it; that file is the input, and the report the default text."""
    stray = getattr(args, "fusion_report", None)
    if not isinstance(stray, NotAReportForm):
        return
    written_as_form = any(a.startswith("--fusion-report=") for a in argv)
    if written_as_form or args.input != "-" or stray.value.startswith("-"):
        ap.error(
            "argument --fusion-report: expected text, json, text=FILE or json=FILE, "
            f"got '{stray.value}'"
        )
    args.input, args.fusion_report = stray.value, ReportSpec("text")


def make_arg_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="irc-opt",
        description="Parse, verify, transform and print irc IR.",
    )
    add_version(ap)
    ap.add_argument("input", nargs="?", default="-", help="input .ir file ('-' for stdin)")
    ap.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    ap.add_argument(
        "-p",
        "--pass-pipeline",
        "--pipeline",
        action=_AppendPass,
        dest="pipeline_items",
        metavar="PIPELINE",
        help="passes with options, 'decompose,tile{block=512}', or as in mlir-opt "
        "'builtin.module(decompose,tile{block=512})'",
    )
    for name in PASSES:
        ap.add_argument(
            f"--{name}",
            action=_AppendPass,
            nargs=0,
            const=name,
            dest="pipeline_items",
            help=f"run the '{name}' pass",
        )
    ap.add_argument(
        "--emit", default="ir", choices=sorted(EMITTERS), help="output form (default: ir)"
    )
    ap.add_argument(
        "--input",
        dest="input_format",
        default="auto",
        choices=INPUT_FORMATS,
        help="input form: irc text or MLIR as xdsl-opt/mlir-opt print it (default: told apart)",
    )
    ap.add_argument(
        "--mlir-print-debuginfo",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='--emit mlir: write loc("FILE":LINE:COL) on every op and argument (default: on)',
    )
    ap.add_argument(
        "--split-input-file", action="store_true", help="treat '// -----' lines as separate inputs"
    )
    ap.add_argument(
        "--verify-diagnostics",
        action="store_true",
        help="check diagnostics against '// expected-error@+N {{...}}' annotations",
    )
    ap.add_argument(
        "--print-ir-before-all",
        "--mlir-print-ir-before-all",
        action="store_true",
        help="print the IR to stderr before each pass the run goes through",
    )
    ap.add_argument(
        "--print-ir-after-all",
        "--mlir-print-ir-after-all",
        action="store_true",
        help="print the IR to stderr after each pass the run goes through",
    )
    ap.add_argument(
        "--dump-pass-pipeline",
        action="store_true",
        help="print the passes the run went through, with every option, to stderr "
        "(in a form -p takes back)",
    )
    ap.add_argument(
        "--timing",
        "--mlir-timing",
        action="store_true",
        help="print the wall time of parsing, verifying, each pass and the output to stderr",
    )
    ap.add_argument(
        "--fusion-report",
        nargs="?",
        const=ReportSpec("text"),
        type=report_spec,
        metavar="{text,json}[=FILE]",
        help="with --fuse: every kernel the module launches (named as in the emitted "
        "code) and every pair of kernels not fused, with the reason; text goes to "
        "stderr, json alone to stdout (the IR then only to -o), =FILE to a file",
    )
    ap.add_argument(
        "--autotune",
        action="store_true",
        help="with --emit triton: time block sizes, warps and stages per kernel on the GPU (cached)",
    )
    ap.add_argument("--no-verify", action="store_true", help="skip the verifier between passes")
    ap.add_argument(
        "--debug", action="store_true", help="show Python tracebacks of internal errors"
    )
    return ap


@dataclass
class Chunk:
    text: str
    first_line: int


def split_chunks(text: str, split: bool) -> list[Chunk]:
    if not split:
        return [Chunk(text, 1)]
    chunks: list[Chunk] = []
    line = 1
    start = 0
    for m in SPLIT_MARKER.finditer(text):
        piece = text[start : m.start()]
        chunks.append(Chunk(piece, line))
        line += piece.count("\n")
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end + 1
        line += text[m.start() : end].count("\n")
        start = end
    chunks.append(Chunk(text[start:], line))
    return chunks


class Driver:
    """Runs one irc-opt invocation; kept separate from argv handling for tests."""

    def __init__(self, args: argparse.Namespace, filename: str):
        from irc.passes.fuse import FusePass

        self.args = args
        self.filename = filename
        self.sources = SourceManager()
        self.passes: list[ModulePass] = [
            p for item in args.pipeline_items or [] for p in build_pipeline(item)
        ]
        report: ReportSpec | None = getattr(args, "fusion_report", None)
        fuses = [p for p in self.passes if isinstance(p, FusePass)]
        if report is not None and not fuses:
            raise IrcError(Diagnostic(None, "--fusion-report describes the fuse pass: add --fuse"))
        if report is None and any(p.report for p in fuses):
            report = ReportSpec(next(p.report for p in fuses if p.report))  # fuse{report=...}
        self.report = report
        self.reports: list[Any] = []  # FusionReport, named after each chunk's run
        self.timing = Timing(verify=not args.no_verify) if getattr(args, "timing", False) else None
        self.dumped: str | None = None

    def instruments(self) -> list[PassInstrumentation]:
        out: list[PassInstrumentation] = []
        if getattr(self.args, "print_ir_before_all", False) or self.args.print_ir_after_all:
            out.append(
                PrintIR(
                    getattr(self.args, "print_ir_before_all", False), self.args.print_ir_after_all
                )
            )
        if self.timing is not None:
            out.append(self.timing)
        return out

    def phase(self, label: str) -> contextlib.AbstractContextManager[None]:
        return self.timing.phase(label) if self.timing is not None else contextlib.nullcontext()

    def process(self, chunk: Chunk) -> str:
        """Text for one chunk; raises IrcError on bad input."""
        from irc.passes.fuse import collecting_reports

        self.sources.add(self.filename, chunk.text, chunk.first_line)
        if self.timing is not None:
            self.timing.start_chunk()
        with self.phase("Parser"):
            module = parse_input(
                chunk.text, self.filename, chunk.first_line, self.args.input_format
            )
            quote_sources(module, self.sources)
        with self.phase("Verifier"):
            verify(module)
        record = Record()
        reports = contextlib.nullcontext([]) if self.report is None else collecting_reports()
        try:
            with instrumented(module, record, *self.instruments()), reports as made:
                run_pipeline(module, self.passes, verify_each=not self.args.no_verify)
                if self.args.emit == "triton":
                    text = self.triton(module)
                else:
                    if getattr(self.args, "autotune", False):
                        raise IrcError(
                            Diagnostic(
                                None, "--autotune chooses kernel tilings: use it with --emit triton"
                            )
                        )
                    with self.phase("Output"):
                        if self.args.emit == "mlir":
                            text = emit_mlir_with(module, self.args.mlir_print_debuginfo)
                        else:
                            text = EMITTERS[self.args.emit](module)
        finally:
            if getattr(self.args, "dump_pass_pipeline", False):
                self.dump_pipeline(record.passes)
        if self.report is not None:
            with self.phase("Fusion report"):
                self.name_kernels(made, module)
        return text

    def triton(self, module: ModuleOp) -> str:
        """The Triton module, its header naming the input file; with --autotune the
        kernels' tilings are measured on the GPU first, from the GPU's own defaults.
        The lowering runs here, inside the run's instrumentation."""
        from irc.compiler import lower_to_tile, triton_source
        from irc.target import cuda_target

        autotune, target = None, None
        if getattr(self.args, "autotune", False):
            import torch

            if not torch.cuda.is_available():
                raise IrcError(
                    Diagnostic(None, "--autotune measures kernels on a CUDA GPU; none is available")
                )
            autotune, target = "cuda", cuda_target()
        lower_to_tile(module, verify_each=not self.args.no_verify, autotune=autotune, target=target)
        with self.phase("Output"):
            return triton_source(module, self.filename)

    def name_kernels(self, reports: list[Any], module: ModuleOp) -> None:
        """Names the reported kernels as the emitted Triton does: from the module
        itself when the run lowered it to tile kernels, else from a lowered copy."""
        from irc.compiler import lower_to_tile
        from irc.ir.value_names import clone_keeping_names
        from irc.passes.fuse import resolve_reports
        from irc.pipeline import lowest_level

        lowered = (
            module if lowest_level(module) == "tile" else lower_to_tile(clone_keeping_names(module))
        )
        resolve_reports(reports, lowered)
        self.reports += reports
        if self.report is not None and self.report.mode == "text" and self.report.path is None:
            sys.stderr.write("".join(r.text() + "\n" for r in reports))

    def report_text(self) -> str:
        """The whole run's report, for a file or stdout (text goes to stderr by chunk)."""
        assert self.report is not None
        if self.report.mode == "json":
            return json.dumps([r.as_dict() for r in self.reports], indent=2) + "\n"
        return "".join(r.text() + "\n" for r in self.reports)

    def dump_pipeline(self, passes: Sequence[ModulePass]) -> None:
        """MLIR's --dump-pass-pipeline: the passes this chunk went through (once per
        run unless a later chunk goes through other ones)."""
        text = f"Pass Manager with {len(passes)} passes:\n{pipeline_text(passes)}\n\n"
        if text != self.dumped:
            sys.stderr.write(text)
            self.dumped = text

    def format(self, diag: Diagnostic) -> str:
        return format_diagnostic(self.sources, diag)


# --- instrumentation ----------------------------------------------------------------


class Record(PassInstrumentation):
    """The passes a run goes through, in order (for --dump-pass-pipeline)."""

    def __init__(self) -> None:
        self.passes: list[ModulePass] = []

    def before_pass(self, p: ModulePass, module: ModuleOp) -> None:
        self.passes.append(p)


class PrintIR(PassInstrumentation):
    """--print-ir-before-all and --print-ir-after-all, in MLIR's format, on stderr."""

    def __init__(self, before: bool, after: bool) -> None:
        self.before, self.after = before, after

    def before_pass(self, p: ModulePass, module: ModuleOp) -> None:
        if self.before:
            sys.stderr.write(f"// -----// IR Dump Before {p.name} //----- //\n")
            sys.stderr.write(print_module(module))

    def after_pass(self, p: ModulePass, module: ModuleOp) -> None:
        if self.after:
            sys.stderr.write(f"// -----// IR Dump After {p.name} //----- //\n")
            sys.stderr.write(print_module(module))


class Timing(PassInstrumentation):
    """--timing: wall time by step, as mlir-opt's -mlir-timing reports it.

    A step is parsing, verifying, each pass (with the verifier after it), the
    output; the steps of every `// -----` chunk add up, position by position.
    """

    def __init__(self, verify: bool = True) -> None:
        self.verify = verify
        self.rows: dict[tuple[int, str], float] = {}
        self.step = 0
        self.started = time.perf_counter()
        self.mark = self.started
        self.applied = 0.0

    def start_chunk(self) -> None:
        self.step = 0

    def add(self, label: str, seconds: float) -> None:
        key = (self.step, label)
        self.step += 1
        self.rows[key] = self.rows.get(key, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(label, time.perf_counter() - start)

    def before_pass(self, p: ModulePass, module: ModuleOp) -> None:
        self.mark = time.perf_counter()

    def after_apply(self, p: ModulePass, module: ModuleOp) -> None:
        now = time.perf_counter()
        self.applied = now - self.mark
        self.mark = now

    def after_pass(self, p: ModulePass, module: ModuleOp) -> None:
        checked = time.perf_counter() - self.mark
        self.add(p.name, self.applied + checked)  # a pass's row holds its verifier's
        if self.verify:
            self.add("  verifier", checked)

    def report(self) -> str:
        total = time.perf_counter() - self.started
        rows = [(label, t) for (_, label), t in self.rows.items()]
        rest = total - sum(t for label, t in rows if not label.startswith(" "))
        rows += [("Rest", max(rest, 0.0)), ("Total", total)]
        bar = "===" + "-" * 73 + "==="
        lines = [
            bar,
            "... Execution time report ...".center(79).rstrip(),
            bar,
            f"  Total Execution Time: {total:.4f} seconds",
            "",
            "  ----Wall Time----  ----Name----",
        ]
        for label, t in rows:
            share = 100.0 * t / total if total > 0 else 0.0
            lines.append(f"  {t:8.4f} ({share:5.1f}%)  {label}")
        return "\n".join(lines) + "\n"


# --- --verify-diagnostics ---------------------------------------------------

_ANNOTATION = re.compile(r"//\s*(expected-[\w-]*)")
"""A comment that starts with `expected-`: an annotation, to be well formed."""
_OFFSET = re.compile(r"\s*@(\S*?)(?=\s|\{\{|$)")
_MESSAGE = re.compile(r"\s*\{\{(.*?)\}\}")
KINDS = {"expected-error": "error", "expected-note": "note", "expected-warning": "warning"}


@dataclass
class Expectation:
    severity: str
    line: int
    text: str
    where: Location
    matched: bool = False


def expectations(chunk: Chunk, filename: str) -> tuple[list[Expectation], list[Diagnostic]]:
    """The `// expected-error@+N {{...}}` annotations of a chunk, and an error at each
    malformed one (an annotation silently ignored would let a test pass unchecked)."""
    out: list[Expectation] = []
    problems: list[Diagnostic] = []
    lines = chunk.text.split("\n")
    count = len(lines) - (len(lines) > 1 and lines[-1] == "")  # the last line's newline
    span = (chunk.first_line, chunk.first_line + count - 1)
    for i, line in enumerate(lines):
        for m in _ANNOTATION.finditer(line):
            found = _annotation(line, m, chunk.first_line + i, span, filename)
            if isinstance(found, Expectation):
                out.append(found)
            else:
                problems.append(found)
    return out, problems


def _annotation(
    line: str, m: re.Match[str], lineno: int, span: tuple[int, int], filename: str
) -> Expectation | Diagnostic:
    """The annotation `m` found on `line`, or the error that says what is wrong with it."""
    kind = m.group(1)
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1)
        hint = f"did you mean {close[0]}?" if close else "write " + ", ".join(KINDS)
        where = Location(filename, lineno, m.start(1) + 1)
        return Diagnostic(where, f"unknown annotation '{kind}' ({hint})")
    at, target = m.end(), lineno
    offset = _OFFSET.match(line, at)
    if offset is not None:
        word = offset.group(1)
        if word in ("above", "below") or re.fullmatch(r"[+-]\d+", word):
            target += {"above": -1, "below": 1}.get(word) or int(word)
        else:
            where = Location(filename, lineno, line.index("@", at) + 1)
            return Diagnostic(
                where, f"bad line offset '@{word}' in {kind} (write @+N, @-N, @above or @below)"
            )
        at = offset.end()
    message = _MESSAGE.match(line, at)
    where = Location(filename, lineno, m.start(1) + 1)
    if message is None:
        why = "is not closed by }}" if "{{" in line[at:] else "is missing"
        return Diagnostic(where, f"{kind}: its message in {{{{...}}}} {why}")
    if not span[0] <= target <= span[1]:
        return Diagnostic(
            where,
            f"{kind} points at line {target}, outside this input (lines {span[0]}-{span[1]})",
        )
    return Expectation(
        KINDS[kind], target, message.group(1), Location(filename, lineno, m.start() + 1)
    )


def check_diagnostics(
    diags: Sequence[Diagnostic], expected: list[Expectation], filename: str
) -> list[Diagnostic]:
    """Problems with the match between produced and expected diagnostics."""
    problems: list[Diagnostic] = []
    produced: list[tuple[str, Location | None, str]] = []
    for d in diags:
        produced.append((d.severity, d.location, d.message))
        produced += [("note", n.location, n.message) for n in d.notes]
    check_notes = any(e.severity == "note" for e in expected)
    for severity, loc, message in produced:
        if severity == "note" and not check_notes:
            continue
        for e in expected:
            if (
                not e.matched
                and e.severity == severity
                and loc is not None
                and e.line == loc.line
                and e.text in message
            ):
                e.matched = True
                break
        else:
            problems.append(Diagnostic(loc, f"unexpected {severity}: {message}"))
    for e in expected:
        if not e.matched:
            problems.append(
                Diagnostic(e.where, f'expected {e.severity} "{e.text}" was not produced')
            )
    return problems


# --- main ------------------------------------------------------------------


def run(argv: Sequence[str] | None = None, stdout: Any = None) -> int:
    """The console script's work; returns the exit status (0, 1 or 2)."""
    ap = make_arg_parser()
    try:
        args = ap.parse_args(argv)
        settle_report_form(ap, args, sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, --version, or a usage error (exit 1)
        return e.code if isinstance(e.code, int) else 1
    out_stream = stdout or sys.stdout
    try:
        # One pause for the whole run: between stages the collector would otherwise
        # walk every object the stage before it made (`irc-opt --fuse --emit triton`
        # on a 10,000-op graph took 4% less time with it).
        with paused_gc():
            return _run(args, out_stream)
    except IrcError as e:
        sources = SourceManager()
        for d in e.diagnostics:
            sys.stderr.write(format_diagnostic(sources, d) + "\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        return _internal_error(e, args.debug)


def format_diagnostic(sources: SourceManager, d: Diagnostic) -> str:
    """A diagnostic as printed; one without a place in a file names the tool."""
    text = sources.format(d)
    return f"irc-opt: {text}" if d.location is None else text


def _internal_error(e: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(e)
    where = f"in pass '{e.pass_name}'" if isinstance(e, PassFailure) else "outside any pass"
    cause = e.error if isinstance(e, PassFailure) else e
    sys.stderr.write(
        f"irc-opt: internal error {where}: {type(cause).__name__}: {cause}"
        + ("" if debug else " (run with --debug for the traceback)")
        + "\n"
    )
    return 2


def _run(args: argparse.Namespace, out_stream: Any) -> int:
    started = time.perf_counter()
    filename = args.input
    if filename == "-":
        data, filename = sys.stdin.buffer.read(), "<stdin>"
    else:
        try:
            with open(filename, "rb") as f:
                data = f.read()
        except OSError as e:
            raise IrcError(Diagnostic(None, f"cannot read '{filename}': {e.strerror}")) from None
    try:
        text = decode_source(data, filename)
    except IrcError as e:
        # Quote the line with the bad byte shown as a replacement character.
        sources = SourceManager()
        sources.add(filename, data.decode("utf-8", "replace"))
        for d in e.diagnostics:
            sys.stderr.write(format_diagnostic(sources, d) + "\n")
        return 1
    driver = Driver(args, filename)
    if driver.timing is not None:
        driver.timing.started = started
    try:
        return _run_chunks(driver, text, out_stream)
    finally:
        if driver.timing is not None:
            sys.stderr.write(driver.timing.report())


def _run_chunks(driver: Driver, text: str, out_stream: Any) -> int:
    args, filename = driver.args, driver.filename
    outputs: list[str] = []
    status = 0
    for chunk in split_chunks(text, args.split_input_file):
        expected, malformed = expectations(chunk, filename) if args.verify_diagnostics else ([], [])
        try:
            outputs.append(driver.process(chunk))
            diags: list[Diagnostic] = []
        except IrcError as e:
            diags = e.diagnostics
            driver.sources.add(filename, chunk.text, chunk.first_line)
        if args.verify_diagnostics:
            for problem in malformed + check_diagnostics(diags, expected, filename):
                sys.stderr.write(driver.format(problem) + "\n")
                status = 1
        elif diags:
            for d in diags:
                sys.stderr.write(driver.format(d) + "\n")
            status = 1
    report = driver.report
    # `--fusion-report=json` alone: stdout holds the JSON document and nothing else.
    json_to_stdout = report is not None and report.mode == "json" and report.path is None
    if status == 0 or not args.verify_diagnostics:
        if not (json_to_stdout and args.output == "-"):
            _write_output(args.output, "// -----\n".join(outputs), out_stream)
    if report is not None and (report.path is not None or json_to_stdout):
        _write_output(report.path or "-", driver.report_text(), out_stream)
    return status


def _write_output(path: str, text: str, out_stream: Any) -> None:
    if path == "-":
        out_stream.write(text)
        return
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise IrcError(Diagnostic(None, f"cannot write '{path}': {e.strerror}")) from None


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
