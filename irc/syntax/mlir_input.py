"""MLIR in and out of irc: generic syntax with `loc(...)`, read back by xDSL's parser.

`irc-opt --emit mlir` writes what xdsl-opt and mlir-opt read; `irc-opt` reads
their output back (detected, or `--input mlir`), so that irc -> xdsl-opt -> irc
prints what irc alone prints. Two things have to survive the trip:

* Value names. irc keeps names as written (`%0`, `%x_1`, `%x.y`); MLIR tools
  treat `%0` as a number and fold `_N` suffixes, so names are escaped into ones
  they keep (`$` doubled, a `$` before a leading digit and after a `_N` end)
  and unescaped on the way back.
* Locations. Every op and argument carries `loc("file.ir":LINE:COL)`, so a
  diagnostic on MLIR input points into the `.ir` file it came from; an op
  without one is located in the `.mlir` text itself.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

from xdsl.dialects.builtin import FileLineColLoc, LocationAttr, ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from irc.ir.value_names import set_value_name
from irc.syntax.diagnostics import IrcError, Location, SourceManager, op_location

INPUT_FORMATS = ("auto", "ir", "mlir")
"""`irc-opt --input`: auto tells MLIR from irc text by how the file starts."""

_SKIP = re.compile(r"(\s|//[^\n]*)*")
_MLIR_START = re.compile(
    r'"|builtin\.module\b|func\.func\b|#|!|module\s*(attributes\b|@|\{\s*(//[^\n]*\s*)*("|func\.func\b|[a-z_]+\.[a-z_]))'
)


def looks_like_mlir(text: str) -> bool:
    """MLIR's first op is quoted (generic form) or a dialect-prefixed builtin/func
    op, or `module {` holding one; irc text starts with `func @`, `module {` then
    `func @`, or one of its own `dialect.op` lines."""
    start = _SKIP.match(text)
    rest = text[start.end() if start else 0 :]
    return _MLIR_START.match(rest) is not None


# --- value names -------------------------------------------------------------------

_SUFFIX = re.compile(r"_\d+$")


def escape_name(name: str) -> str:
    """An MLIR name that xDSL and MLIR keep as written and `unescape_name` undoes."""
    out = name.replace("$", "$$")
    if out[:1].isdigit():
        out = "$" + out
    if _SUFFIX.search(out):
        out += "$"
    return out


def unescape_name(name: str) -> str:
    """`$$` is `$`; a single `$` first (before a digit) or last is a marker."""
    out: list[str] = []
    i = 0
    while i < len(name):
        c = name[i]
        if c == "$" and name[i + 1 : i + 2] == "$":
            out.append("$")
            i += 2
            continue
        if c == "$" and (i == len(name) - 1 or (i == 0 and name[1:2].isdigit())):
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _values(op: Operation) -> Iterator[SSAValue]:
    for o in op.walk():
        yield from o.results
        for region in o.regions:
            for block in region.blocks:
                yield from block.args


# --- output ------------------------------------------------------------------------


def emit_mlir(module: ModuleOp, debuginfo: bool = True) -> str:
    """MLIR generic syntax through xDSL's printer, with `loc(...)` under `debuginfo`."""
    saved: list[tuple[SSAValue, str | None]] = []
    for value in _values(module):
        name = value.name_hint
        saved.append((value, name))
        if name is not None:
            set_value_name(value, escape_name(name))
    # An op a pass made has no place of its own: it gets its enclosing op's, as
    # irc's own diagnostics locate it (`op_location`); so do arguments.
    unplaced: list[tuple[Operation | BlockArgument, LocationAttr]] = []
    if debuginfo:
        for op in module.walk():
            if not isinstance(op.location, FileLineColLoc):
                if (loc := op_location(op)) is not None:
                    unplaced.append((op, op.location))
                    op.location = loc.to_attr()
            for arg in (a for r in op.regions for b in r.blocks for a in b.args):
                if not isinstance(arg.location, FileLineColLoc):
                    unplaced.append((arg, arg.location))
                    arg.location = op.location
    try:
        out = io.StringIO()
        Printer(stream=out, print_generic_format=True, print_debuginfo=debuginfo).print_op(module)
    finally:
        for value, name in saved:
            set_value_name(value, name)
        for thing, loc_attr in unplaced:
            thing.location = loc_attr
    return out.getvalue() + "\n"


# --- input -------------------------------------------------------------------------


class _LocatingParser(Parser):
    """xDSL's parser, giving an op written without `loc(...)` its place in the text."""

    def __init__(self, text: str, filename: str, first_line: int) -> None:
        from irc.pipeline import context

        super().__init__(context(), text, filename)
        self.filename = filename
        self.line_offset = first_line - 1

    def location_at(self, position: int) -> Location:
        text = self.lexer.input.content
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        return Location(self.filename, line + self.line_offset, column)

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        if not isinstance(op.location, FileLineColLoc):
            op.location = self.location_at(start).to_attr()
        return op


def parse_mlir(text: str, filename: str = "<input>", first_line: int = 1) -> ModuleOp:
    """Reads MLIR (generic or xDSL's custom forms) into irc's IR; raises `IrcError`."""
    parser = _LocatingParser(text, filename, first_line)
    try:
        module = parser.parse_module()
    except ParseError as e:
        raise IrcError.at(parser.location_at(e.span.start), _message(e)) from None
    except VerifyException as e:  # an op's constructor refused what it was given
        raise IrcError.at(parser.location_at(parser._current_token.span.start), str(e)) from None
    for value in _values(module):
        if value.name_hint is not None:
            set_value_name(value, unescape_name(value.name_hint))
    _unique_names(module)
    return module


def _message(e: ParseError) -> str:
    """The parser's message without the source excerpt it appends."""
    return e.msg.strip().splitlines()[0] if e.msg.strip() else "cannot parse MLIR"


def _unique_names(module: ModuleOp) -> None:
    """xDSL folds `%x_1` into `x`: a name met twice in one function (or kernel)
    is dropped on the later values, which irc's printer then numbers."""
    for top in module.body.ops:
        seen: set[str] = set()
        for value in _values(top):
            name = value.name_hint
            if name is None:
                continue
            if name in seen:
                set_value_name(value, None)
            seen.add(name)


def parse_input(text: str, filename: str, first_line: int = 1, form: str = "auto") -> ModuleOp:
    """irc text or MLIR, as `form` says (`auto`: as `looks_like_mlir` tells)."""
    if form == "mlir" or (form == "auto" and looks_like_mlir(text)):
        return parse_mlir(text, filename, first_line)
    from irc.syntax.parser import parse

    return parse(text, filename, first_line)


def quote_sources(module: ModuleOp, sources: SourceManager) -> None:
    """Lets diagnostics quote the `.ir` files an MLIR input's locations point into."""
    files = {
        loc.filename.data for op in module.walk() if isinstance(loc := op.location, FileLineColLoc)
    }
    for name in sorted(files):
        if sources.line(Location(name, 1, 1)) is not None:
            continue  # known already (the input itself)
        try:
            with open(name, "rb") as f:
                sources.add(name, f.read().decode("utf-8", "replace"))
        except OSError:
            continue  # not on this machine: diagnostics name the place without the line
