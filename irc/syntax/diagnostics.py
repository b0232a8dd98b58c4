"""Compiler diagnostics: `FILE:LINE:COL: error: message`, the line, a caret.

Every error a user can cause is an `IrcError` carrying one or more
`Diagnostic`s; the command-line tools print them and exit 1. Anything else that
escapes is a bug in irc and is reported as such (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, StringAttr
from xdsl.ir import Attribute, Operation


@dataclass(frozen=True)
class Location:
    file: str
    line: int  # 1-based
    column: int  # 1-based

    def to_attr(self) -> FileLineColLoc:
        return FileLineColLoc(StringAttr(self.file), IntAttr(self.line), IntAttr(self.column))

    @staticmethod
    def from_attr(attr: Attribute) -> Location | None:
        if isinstance(attr, FileLineColLoc):
            return Location(attr.filename.data, attr.line.data, attr.column.data)
        return None


@dataclass
class Note:
    location: Location | None
    message: str


@dataclass
class Diagnostic:
    location: Location | None
    message: str
    severity: str = "error"
    notes: list[Note] = field(default_factory=list[Note])


class IrcError(Exception):
    """One or more user-facing diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = diagnostics
        super().__init__(diagnostics[0].message if diagnostics else "error")

    @staticmethod
    def at(location: Location | None, message: str) -> IrcError:
        return IrcError(Diagnostic(location, message))


def op_location(op: Operation) -> Location | None:
    """The source location of an op, or of the nearest enclosing op that has one."""
    current: Operation | None = op
    while current is not None:
        loc = Location.from_attr(current.location)
        if loc is not None:
            return loc
        current = current.parent_op()
    return None


class SourceManager:
    """Remembers source texts so that diagnostics can quote the offending line."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, text: str, first_line: int = 1) -> None:
        lines = self._lines.setdefault(name, [])
        # Lines end at '\n' only, as the lexer counts them ('\r', form feeds and
        # other characters splitlines() breaks at are ordinary whitespace).
        new = [line.removesuffix("\r") for line in text.split("\n")]
        if len(new) > 1 and new[-1] == "":
            new.pop()  # the text's final newline ends its last line
        need = first_line - 1 + len(new)
        if len(lines) < need:
            lines.extend([""] * (need - len(lines)))
        lines[first_line - 1 : need] = new

    def line(self, loc: Location) -> str | None:
        lines = self._lines.get(loc.file)
        if lines is None or not 1 <= loc.line <= len(lines):
            return None
        return lines[loc.line - 1]

    def format(self, diag: Diagnostic) -> str:
        out = [self._one(diag.location, diag.severity, diag.message)]
        out += [self._one(n.location, "note", n.message) for n in diag.notes]
        return "\n".join(out)

    def _one(self, loc: Location | None, severity: str, message: str) -> str:
        if loc is None:
            return f"{severity}: {message}"
        head = f"{loc.file}:{loc.line}:{loc.column}: {severity}: {message}"
        src = self.line(loc)
        if src is None:
            return head
        src = src.replace("\t", " ")
        printable = "".join(c if c.isprintable() else "?" for c in src)
        column = max(loc.column, 1)
        if len(printable) > _MAX_SHOWN:
            # Show a window of a very long line around the column.
            start = max(0, min(column - 1 - _MAX_SHOWN // 2, len(printable) - _MAX_SHOWN))
            end = start + _MAX_SHOWN
            shown = printable[start:end]
            prefix = "..." if start > 0 else ""
            suffix = "..." if end < len(printable) else ""
            printable = prefix + shown + suffix
            column = column - start + len(prefix)
        caret = " " * (column - 1) + "^"
        return f"{head}\n{printable}\n{caret}"


_MAX_SHOWN = 160
"""Source lines longer than this are shown as a window around the column."""
