"""`irc-opt`: parse, verify, run passes, print. The mlir-opt of irc.

    irc-opt FILE.ir --decompose              # one flag per registered pass
    irc-opt FILE.ir -p 'decompose'           # or a pipeline string
    irc-opt FILE.ir --emit mlir | xdsl-opt   # MLIR generic syntax

Exit status: 0 success, 1 the input has errors (printed as diagnostics),
2 an internal error in irc (the failing pass is named; --debug shows the
traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from irc.diagnostics import Diagnostic, IrcError, Location, SourceManager
from irc.frontend import decode_source
from irc.gcpause import paused_gc
from irc.mlir_input import INPUT_FORMATS, parse_input, quote_sources
from irc.mlir_input import emit_mlir as emit_mlir_with
from irc.passes import PASSES
from irc.pipeline import PassFailure, build_pipeline, run_pipeline
from irc.printer import print_module
from irc.verifier import verify

SPLIT_MARKER = re.compile(r"^// -----", re.MULTILINE)


def emit_mlir(module: ModuleOp) -> str:
    """MLIR generic syntax with locations, for xdsl-opt and mlir-opt (irc.mlir_input)."""
    return emit_mlir_with(module)


def emit_triton(module: ModuleOp) -> str:
    """The Triton Python module; lowers graph or loop IR down to tile first."""
    from irc.compiler import triton_source

    return triton_source(module)


def emit_dot(module: ModuleOp) -> str:
    """Graphviz, one cluster per fusion group."""
    from irc.dot import emit_dot as draw

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


def make_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="irc-opt",
        description="Parse, verify, transform and print irc IR.",
    )
    ap.add_argument("input", nargs="?", default="-", help="input .ir file ('-' for stdin)")
    ap.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    ap.add_argument(
        "-p",
        "--pipeline",
        action=_AppendPass,
        dest="pipeline_items",
        metavar="PIPELINE",
        help="comma-separated passes with options, e.g. 'decompose'",
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
        help="--emit mlir: write loc(\"FILE\":LINE:COL) on every op and argument (default: on)",
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
        "--print-ir-after-all", action="store_true", help="print the IR to stderr after each pass"
    )
    ap.add_argument(
        "--fusion-report",
        nargs="?",
        const="text",
        choices=["text", "json"],
        help="print every fusion group and rejected candidate to stderr (with --fuse)",
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
        self.args = args
        self.filename = filename
        self.sources = SourceManager()
        self.passes: list[ModulePass] = build_pipeline(",".join(args.pipeline_items or []))
        if getattr(args, "fusion_report", None):
            self.passes = self._with_fusion_report(args.fusion_report)

    def _with_fusion_report(self, mode: str) -> list[ModulePass]:
        from irc.passes.fuse import FusePass

        if not any(isinstance(p, FusePass) for p in self.passes):
            raise IrcError(Diagnostic(None, "--fusion-report describes the fuse pass: add --fuse"))
        return [
            dataclasses.replace(p, report=mode) if isinstance(p, FusePass) else p
            for p in self.passes
        ]

    def process(self, chunk: Chunk) -> str:
        """Text for one chunk; raises IrcError on bad input."""
        self.sources.add(self.filename, chunk.text, chunk.first_line)
        module = parse_input(chunk.text, self.filename, chunk.first_line, self.args.input_format)
        quote_sources(module, self.sources)
        verify(module)
        run_pipeline(
            module,
            self.passes,
            verify_each=not self.args.no_verify,
            after_pass=self._dump if self.args.print_ir_after_all else None,
        )
        if self.args.emit == "triton":
            return self.triton(module)
        if getattr(self.args, "autotune", False):
            raise IrcError(
                Diagnostic(None, "--autotune chooses kernel tilings: use it with --emit triton")
            )
        if self.args.emit == "mlir":
            return emit_mlir_with(module, self.args.mlir_print_debuginfo)
        return EMITTERS[self.args.emit](module)

    def triton(self, module: ModuleOp) -> str:
        """The Triton module, its header naming the input file; with --autotune the
        kernels' tilings are measured on the GPU first, from the GPU's own defaults."""
        from irc.compiler import triton_source
        from irc.target import cuda_target

        autotune, target = None, None
        if getattr(self.args, "autotune", False):
            import torch

            if not torch.cuda.is_available():
                raise IrcError(
                    Diagnostic(None, "--autotune measures kernels on a CUDA GPU; none is available")
                )
            autotune, target = "cuda", cuda_target()
        return triton_source(module, self.filename, autotune=autotune, target=target)

    def _dump(self, p: ModulePass, module: ModuleOp) -> None:
        sys.stderr.write(f"// -----// IR Dump After {p.name} //----- //\n")
        sys.stderr.write(print_module(module))

    def format(self, diag: Diagnostic) -> str:
        return format_diagnostic(self.sources, diag)


# --- --verify-diagnostics ---------------------------------------------------

_EXPECT = re.compile(
    r"//\s*expected-(error|note|warning)\s*(?:@([+-]\d+|above|below))?\s*\{\{(.*?)\}\}"
)


@dataclass
class Expectation:
    severity: str
    line: int
    text: str
    where: Location
    matched: bool = False


def expectations(chunk: Chunk, filename: str) -> list[Expectation]:
    out: list[Expectation] = []
    for i, line in enumerate(chunk.text.split("\n")):
        for m in _EXPECT.finditer(line):
            lineno = chunk.first_line + i
            offset = m.group(2)
            if offset in (None, ""):
                target = lineno
            elif offset == "above":
                target = lineno - 1
            elif offset == "below":
                target = lineno + 1
            else:
                target = lineno + int(offset)
            where = Location(filename, lineno, m.start() + 1)
            out.append(Expectation(m.group(1), target, m.group(3), where))
    return out


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
    ap = make_arg_parser()
    args = ap.parse_args(argv)
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
    outputs: list[str] = []
    status = 0
    for chunk in split_chunks(text, args.split_input_file):
        expected = expectations(chunk, filename) if args.verify_diagnostics else []
        try:
            outputs.append(driver.process(chunk))
            diags: list[Diagnostic] = []
        except IrcError as e:
            diags = e.diagnostics
            driver.sources.add(filename, chunk.text, chunk.first_line)
        if args.verify_diagnostics:
            for problem in check_diagnostics(diags, expected, filename):
                sys.stderr.write(driver.format(problem) + "\n")
                status = 1
        elif diags:
            for d in diags:
                sys.stderr.write(driver.format(d) + "\n")
            status = 1
    if status == 0 or not args.verify_diagnostics:
        _write_output(args.output, "// -----\n".join(outputs), out_stream)
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
