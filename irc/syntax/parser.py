"""Text to xDSL IR: the lark grammar in `grammar.lark`, then a tree walk.

The walk owns everything lark cannot know: which ops exist, SSA scoping
(use before definition, redefinition), attribute conversion and result-type
inference. Every problem becomes an `IrcError` located at the offending token.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, OpResult, Region, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.utils.exceptions import VerifyException

from irc.dialects.attrs import NamedEnum
from irc.gcpause import paused_gc
from irc.ir.types import MAX_ELEMENTS, SCALAR_TYPES, numel
from irc.ir.value_names import set_value_name
from irc.syntax.diagnostics import Diagnostic, IrcError, Location, Note

_SHAPE_RE = re.compile(r"(\d+)x")


@cache
def _lark() -> Lark:
    grammar = resources.files("irc.syntax").joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True)


@cache
def op_classes() -> dict[str, type[Operation]]:
    """Every op irc can parse, by its full name (`graph.add`)."""
    from irc.dialects import all_dialects

    return {op.name: op for d in all_dialects() for op in d.operations}


@paused_gc()
def parse(text: str, filename: str = "<input>", first_line: int = 1) -> ModuleOp:
    """Parses `.ir` text at any level into a module; raises `IrcError`."""
    return _Builder(filename, text, first_line).build()


def parse_file(path: str) -> tuple[ModuleOp, str]:
    """Reads and parses a file; returns the module and the decoded text."""
    text = read_source(path)
    return parse(text, path), text


def read_source(path: str) -> str:
    try:
        data = open(path, "rb").read() if path != "-" else _stdin_bytes()
    except OSError as e:
        raise IrcError(Diagnostic(None, f"cannot read {path}: {e.strerror}")) from None
    return decode_source(data, path)


def _stdin_bytes() -> bytes:
    import sys

    return sys.stdin.buffer.read()


def decode_source(data: bytes, filename: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        start = data.rfind(b"\n", 0, e.start) + 1
        # The column counts characters, as in every other diagnostic.
        col = len(data[start : e.start].decode("utf-8", "replace")) + 1
        raise IrcError.at(
            Location(filename, line, col),
            f"the file is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
        ) from None


# --- syntax errors in plain words ----------------------------------------------
#
# lark reports a syntax error as the token it found and the terminals its LALR
# table could shift there. The table's sets are merged across contexts (a ']'
# may be "expected" after a result type), so the messages use the terminals
# the parser really accepts at that point (`InteractiveParser.accepts`) and the
# brackets still open on its stack to say what was being written.

_TOKEN_WORDS = {
    "VALUE": "a value name like %x",
    "SYMBOL": "a function name like @f",
    "OPNAME": "an op name like graph.add",
    "NAME": "an attribute name",
    "TYPE_NAME": "a type like tensor<4xf32>",
    "SHAPE": "a shape like 4x8xf32",
    "NUMBER": "a number",
    "STRING": "a string",
    "_NL": "the end of the line",
    "$END": "the end of the file",
    "FUNC": "'func'",
    "MODULE": "'module'",
    "RETURN": "'return'",
    "ARROW": "'->'",
    "EQUAL": "'='",
    "TRUE": "'true'",
    "FALSE": "'false'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LESSTHAN": "'<'",
    "MORETHAN": "'>'",
    "COMMA": "','",
    "COLON": "':'",
}

_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE", "LESSTHAN": "MORETHAN"}
_CLOSERS = set(_OPENERS.values())
_MAX_LIST_DEPTH = 16
MAX_REGION_DEPTH = 64
"""Regions inside regions at most. irc's own IR nests four deep; every stage that
walks the IR (this builder, the verifier, xDSL's walks, the printer) recurses
once or more a level, and Python's stack holds about 1000 frames."""
MAX_RANK = 64
"""Dimensions of a tensor or memref at most: PyTorch's limit for a tensor."""
_TYPE_WORDS = {"tensor", "memref", "ptr", *SCALAR_TYPES}


def _statement_kind(ftype: str, ftext: str) -> str:
    """RETURN for the word `return` however the lexer took it in a context without it."""
    return "RETURN" if ftext == "return" else ftype


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "the end of the file"
    if tok.type == "_NL":
        return "the end of the line"
    return _quote(str(tok))


def _quote(text: str) -> str:
    if len(text) > 30:
        text = text[:27] + "..."
    if not text.isprintable() or "'" in text:
        return repr(text)
    return f"'{text}'"


def _expected_words(expected: Iterable[str]) -> str:
    words = sorted({_TOKEN_WORDS.get(e, e.lower()) for e in expected if e not in ("WS", "COMMENT")})
    # Keep the message short: list the most useful few.
    if len(words) > 4:
        words = words[:4] + ["..."]
    if not words:
        return "nothing more"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _kind(item: object) -> str:
    """A parser stack entry's terminal name, or `rule:NAME` for a finished rule."""
    if isinstance(item, Token):
        return f"rule:{item}" if item.type == "RULE" else item.type
    if isinstance(item, Tree):
        return f"rule:{item.data}"
    return "rule:?"


class _SyntaxContext:
    """What the parser was in the middle of when it met the bad token."""

    def __init__(self, e: UnexpectedInput):
        ip = getattr(e, "interactive_parser", None)
        self.stack: list[object] = list(ip.parser_state.value_stack) if ip is not None else []
        accepts: set[str] = set()
        if ip is not None:
            try:
                accepts = set(ip.accepts())
            except LarkError:  # pragma: no cover - accepts() only replays the parser
                accepts = set()
        if not accepts:
            accepts = set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())
        self.accepts = accepts - {"WS", "COMMENT"}
        # The brackets still open, innermost last, each with its stack index.
        self.open: list[tuple[int, Token]] = []
        for i, item in enumerate(self.stack):
            kind = _kind(item)
            if kind in _OPENERS:
                self.open.append((i, item))  # type: ignore[arg-type]
            elif kind in _CLOSERS and self.open and _OPENERS[self.open[-1][1].type] == kind:
                self.open.pop()

    def stack_has(self, kind: str, start: int) -> bool:
        return any(_kind(item) == kind for item in self.stack[start + 1 :])

    def last(self) -> str:
        return _kind(self.stack[-1]) if self.stack else ""

    def before(self, index: int) -> str:
        return _kind(self.stack[index - 1]) if index > 0 else ""

    def innermost(self) -> tuple[str, int]:
        """('type' | 'list' | 'attrs' | 'args' | 'results' | 'body' | 'module' | 'top', index)."""
        if not self.open:
            return "top", -1
        i, tok = self.open[-1]
        prev = self.before(i)
        if tok.type == "LESSTHAN":
            return "type", i
        if tok.type == "LSQB":
            return "list", i
        if tok.type == "LPAR":
            return ("results" if prev == "ARROW" else "args"), i
        # '{': a module, a body (function or region), or an attribute dictionary.
        if prev == "MODULE":
            return "module", i
        if prev in ("OPNAME", "rule:value_list"):
            return "attrs", i
        return "body", i

    def function_opened(self) -> tuple[Token, Token] | None:
        """The 'func' and '@name' tokens of the function being parsed, if any."""
        for i, item in enumerate(self.stack):
            if _kind(item) == "FUNC" and i + 1 < len(self.stack):
                sym = self.stack[i + 1]
                if isinstance(sym, Token) and sym.type == "SYMBOL":
                    return item, sym  # type: ignore[return-value]
        return None

    def type_name(self, index: int) -> str:
        prev = self.stack[index - 1] if index > 0 else None
        return str(prev) if isinstance(prev, Token) and prev.type == "TYPE_NAME" else "tensor"

    def statement_tail(self, body_index: int) -> list[str]:
        """The kinds of the current statement's entries so far (empty at a line start)."""
        tail = [_kind(item) for item in self.stack[body_index + 1 :]]
        breaks = [i for i, k in enumerate(tail) if k == "_NL"]
        if breaks:
            tail = tail[breaks[-1] + 1 :]
        done = ("rule:op", "rule:ret", "rule:body", "rule:func", "rule:module", "rule:__")
        return [k for k in tail if not k.startswith(done)]

    def statement_started(self, body_index: int) -> bool:
        return bool(self.statement_tail(body_index))


class _SyntaxErrors:
    """Turns a lark error into one located diagnostic in plain words (a mixin of _Builder)."""

    text: str

    def loc(self, line: int, column: int) -> Location:  # pragma: no cover - see _Builder
        raise NotImplementedError

    def tok_loc(self, tok: Token) -> Location:  # pragma: no cover - see _Builder
        raise NotImplementedError

    def _syntax_error(self, e: UnexpectedInput) -> IrcError:
        ctx = _SyntaxContext(e)
        if isinstance(e, UnexpectedCharacters):
            pos = e.pos_in_stream or 0
            ch = self.text[pos] if pos < len(self.text) else ""
            loc = self.loc(e.line, e.column)
            if ch in ("%", "@"):
                what = "value" if ch == "%" else "function"
                return IrcError.at(
                    loc, f"expected a {what} name after '{ch}' (letters, digits, _ . $ -)"
                )
            word = re.match(r"[A-Za-z0-9_.$-]+", self.text[pos:])
            if word is not None:
                found, found_type, found_text = _quote(word.group()), "WORD", word.group()
            else:
                found, found_type, found_text = f"character {_quote(ch)}", "?", ch
        else:
            tok: Token = e.token if isinstance(e, UnexpectedToken) else Token("$END", "")
            found_type = tok.type
            found_text = str(tok)
            found = _describe_token(tok)
            if tok.type == "$END" or isinstance(e, UnexpectedEOF):
                return self._eof_error(ctx)
            loc = self.tok_loc(tok)
            if tok.type == "_NL":
                loc = self._end_of_code(tok)
        if ctx.last() == "TYPE_NAME" and "LESSTHAN" in ctx.accepts:
            name_tok = ctx.stack[-1]
            assert isinstance(name_tok, Token)
            if str(name_tok) not in _TYPE_WORDS:
                return IrcError.at(
                    self.tok_loc(name_tok),
                    f"unknown type {_quote(str(name_tok))}: a type is written like "
                    "tensor<4x8xf32> (or f32 for a scalar)",
                )
        return IrcError.at(loc, self._explain(ctx, found, found_type, found_text))

    def _end_of_code(self, tok: Token) -> Location:
        """Just after the last character of code on the line that ended too early."""
        line = tok.line or 1
        lines = self.text.split("\n")
        src = lines[line - 1] if 0 < line <= len(lines) else ""
        head = src[: (tok.column or 1) - 1]
        return self.loc(line, len(head.rstrip()) + 1)

    def _explain(self, ctx: _SyntaxContext, found: str, ftype: str, ftext: str) -> str:
        acc = ctx.accepts
        where, index = ctx.innermost()
        last = ctx.last()
        if last == "TYPE_NAME" and "LESSTHAN" in acc:
            name = str(ctx.stack[-1])
            return (
                f"unexpected {found} after the type name '{name}': "
                "a type is written like tensor<4x8xf32> (or f32 for a scalar)"
            )
        if where == "type":
            what = ctx.type_name(index)
            if last == "LESSTHAN":
                return f"expected a shape like 4x8xf32 or f32 after '{what}<', found {found}"
            if ftype in ("NAME", "TYPE_NAME", "NUMBER", "SHAPE"):
                return (
                    f"unexpected {found} in the {what} type: write it without spaces, "
                    f"like {what}<4x8xf32>"
                )
            return f"expected '>' to close the {what} type, found {found}"
        if where == "list":
            if acc <= {"COMMA", "RSQB"}:
                return f"expected ',' or ']' in the list, found {found}"
            return f"expected a list element (a number, true, false or a type), found {found}"
        if where == "attrs":
            if last in ("LBRACE", "COMMA"):
                return f"expected an attribute name like dims, found {found}"
            if last == "NAME":
                return f"expected '=' after the attribute name, found {found}"
            if last == "EQUAL":
                return (
                    "expected an attribute value (a number, true, false, a list like [0, 1] "
                    f"or a type), found {found}"
                )
            return f"expected ',' or '}}' in the attribute dictionary, found {found}"
        if where in ("args", "results"):
            if where == "results":
                if last in ("LPAR", "COMMA") and "TYPE_NAME" in acc:
                    return f"expected a result type like tensor<4xf32>, found {found}"
                return f"expected ',' or ')' in the list of result types, found {found}"
            if last == "VALUE":
                return f"expected ':' and a type after the argument name, found {found}"
            if last == "COLON":
                return f"expected the argument's type, like tensor<4xf32>, found {found}"
            if acc <= {"COMMA", "RPAR"}:
                return f"expected ',' or ')' in the argument list, found {found}"
            if "VALUE" in acc:
                return f"expected an argument like %x: tensor<4xf32>, found {found}"
        if where in ("body", "module"):
            return self._explain_line(ctx, where, index, found, ftype, ftext)
        if where == "top":
            tail = ctx.statement_tail(-1)
            if tail and tail[0] in ("VALUE", "rule:value_list", "OPNAME"):
                return self._explain_line(ctx, "top", -1, found, ftype, ftext)
            return self._explain_top(ctx, found, _statement_kind(ftype, ftext))
        return f"expected {_expected_words(acc)}, found {found}"

    def _explain_line(
        self, ctx: _SyntaxContext, where: str, index: int, found: str, ftype: str, ftext: str
    ) -> str:
        acc = ctx.accepts
        last = ctx.last()
        if last == "LBRACE" and acc == {"_NL"}:
            return (
                f"expected the end of the line after '{{', found {found} "
                "(the body starts on the next line)"
            )
        if where == "module" and ctx.statement_started(index):
            header = self._explain_header(ctx, found)
            if header is not None:
                return header
        if where == "module" and not ctx.statement_started(index):
            if _statement_kind(ftype, ftext) in ("VALUE", "OPNAME", "RETURN"):
                return f"expected 'func' or '}}' in the module, found {found} outside any function"
            return f"expected 'func' or '}}' in the module, found {found}"
        if not ctx.statement_started(index):
            if ftype in ("NAME", "TYPE_NAME") and "OPNAME" in acc:
                return (
                    f"expected an op name like graph.{ftext} (ops are written DIALECT.OP), "
                    f"found {found}"
                )
            return f"expected an op like '%y = graph.add %a, %b', 'return' or '}}', found {found}"
        if "_NL" in acc:
            if last == "RETURN" or ctx.stack_has("RETURN", index):
                return f"unexpected {found} after the return; expected the end of the line"
            return f"unexpected {found} after the op; expected the end of the line (one op a line)"
        if last == "EQUAL":
            if ftype in ("NAME", "TYPE_NAME"):
                return (
                    f"expected an op name like graph.{ftext} (ops are written DIALECT.OP), "
                    f"found {found}"
                )
            return f"expected an op name like graph.add after '=', found {found}"
        if last == "COLON":
            return f"expected a type like tensor<4xf32> after ':', found {found}"
        if last == "COMMA":
            if "VALUE" in acc:
                return f"expected a value name like %x after ',', found {found}"
            return f"expected a type like tensor<4xf32> after ',', found {found}"
        if acc == {"EQUAL"} or acc == {"COMMA", "EQUAL"}:
            return f"expected '=' after the result names, found {found}"
        return f"expected {_expected_words(acc)}, found {found}"

    def _explain_top(self, ctx: _SyntaxContext, found: str, ftype: str) -> str:
        header = self._explain_header(ctx, found)
        if header is not None:
            return header
        if ftype == "RBRACE":
            return f"unmatched {found}: no function or module is open here"
        if ftype in ("VALUE", "OPNAME", "RETURN"):
            # A finished function is on the stack as a tree, or as its tokens while
            # the parser still waits to see whether a line break follows it.
            done = any(
                (isinstance(item, Token) and item.type in ("FUNC", "MODULE"))
                or (
                    isinstance(item, Tree)
                    and any(t.data in ("func", "module") for t in item.iter_subtrees())
                )
                for item in ctx.stack
            )
            hint = (
                "does a '}' above close the function too early?"
                if done
                else "is the 'func' line missing?"
            )
            return f"found {found} outside any function; expected 'func' or 'module' ({hint})"
        return f"expected 'func' or 'module', found {found}"

    def _explain_header(self, ctx: _SyntaxContext, found: str) -> str | None:
        """Errors in `func @name(...) -> ... {` and `module {`, or None elsewhere."""
        last = ctx.last()
        tail = ctx.statement_tail(ctx.open[-1][0] if ctx.open else -1)
        if last == "FUNC":
            return f"expected a function name like @f after 'func', found {found}"
        if last == "SYMBOL":
            return f"expected '(' and the arguments after the function name, found {found}"
        if "FUNC" in tail and "LBRACE" in ctx.accepts:
            if "ARROW" in ctx.accepts:
                return f"expected '->' and the result types, or '{{', found {found}"
            return f"expected '{{' to open the function body, found {found}"
        if last == "ARROW":
            return f"expected the result type(s) after '->', found {found}"
        if last == "MODULE":
            return f"expected '{{' after 'module', found {found}"
        return None

    def _eof_error(self, ctx: _SyntaxContext) -> IrcError:
        opened = ctx.function_opened()
        if opened is not None and ctx.open:
            func_tok, sym = opened
            return IrcError.at(
                self.tok_loc(func_tok),
                f"function {sym} is not closed: expected '}}' before the end of the file",
            )
        for i, tok in ctx.open:
            if tok.type == "LBRACE":
                keyword = ctx.stack[i - 1] if i > 0 else tok
                if isinstance(keyword, Token) and keyword.type == "MODULE":
                    return IrcError.at(
                        self.tok_loc(keyword),
                        "module is not closed: expected '}' before the end of the file",
                    )
                return IrcError.at(
                    self.tok_loc(tok), "'{' is not closed: expected '}' before the end of the file"
                )
        # Unreachable while the text ends in a line break (build() sees to it):
        # the line break is met first. Said as any other token would be.
        line = max(self.text.count("\n"), 1)
        return IrcError.at(self.loc(line, 1), self._explain(ctx, "the end of the file", "$END", ""))


class _Builder(_SyntaxErrors):
    def __init__(self, filename: str, text: str, first_line: int):
        self.filename = filename
        self.text = text
        self.first_line = first_line
        self.op_classes = op_classes()
        self.depth = 0  # regions open around the op being built

    def loc(self, line: int, column: int) -> Location:
        return Location(self.filename, line + self.first_line - 1, column)

    def tok_loc(self, tok: Token) -> Location:
        return self.loc(tok.line or 1, tok.column or 1)

    def error(
        self, where: Token | Tree | Location, message: str, notes: Sequence[Note] = ()
    ) -> IrcError:
        if isinstance(where, Token):
            loc = self.tok_loc(where)
        elif isinstance(where, Tree):
            loc = self.loc(where.meta.line, where.meta.column)
        else:
            loc = where
        return IrcError(Diagnostic(loc, message, notes=list(notes)))

    # -- parsing --

    def build(self) -> ModuleOp:
        text = self.text if self.text.endswith("\n") else self.text + "\n"
        try:
            tree = _lark().parse(text)
        except UnexpectedInput as e:
            raise self._syntax_error(e) from None
        except LarkError as e:  # pragma: no cover - lark's other errors are grammar bugs
            raise IrcError.at(self.loc(1, 1), f"cannot parse: {e}") from None
        except RecursionError:  # pragma: no cover - the grammar nests only by brackets
            raise IrcError.at(self.loc(1, 1), "the input is nested too deeply") from None
        return self._module(tree)

    # -- tree walk --

    def _module(self, tree: Tree) -> ModuleOp:
        funcs: list[Operation] = []
        seen: dict[str, Location] = {}
        for node in tree.children:
            if not isinstance(node, Tree):
                continue
            fnodes = (
                [c for c in node.children if isinstance(c, Tree)]
                if node.data == "module"
                else [node]
            )
            for fnode in fnodes:
                if fnode.data == "op":
                    # Top-level ops (tile.kernel) live beside the functions.
                    op_name = str(fnode.children[2])
                    if op_name.startswith(("graph.", "func.")) or op_name not in self.op_classes:
                        hint = ""
                        if any(isinstance(f, func.FuncOp) for f in funcs):
                            hint = " (does a '}' above close the function too early?)"
                        raise self.error(
                            fnode.children[2],
                            f"'{op_name}' outside any function: ops are written inside "
                            f"'func @name(...) {{ ... }}'{hint}",
                        )
                    self.scope, self.pending = {}, {}
                    funcs.append(self._op(fnode))
                    continue
                f = self._func(fnode)
                name = f.sym_name.data
                loc = self.tok_loc(fnode.children[1])
                if name in seen:
                    raise self.error(
                        loc,
                        f"function @{name} is defined twice",
                        [Note(seen[name], "first defined here")],
                    )
                seen[name] = loc
                funcs.append(f)
        return ModuleOp(funcs)

    def _func(self, node: Tree) -> func.FuncOp:
        _, sym, args, _, sig, body = node.children
        name = str(sym)[1:]
        self.func_start = node.meta.start_pos
        self.scope: dict[str, tuple[SSAValue, Location]] = {}
        self.pending = self._all_defs(body)
        arg_types: list[Attribute] = []
        arg_names: list[tuple[Token, Location]] = []
        if args is not None:
            for a in args.children:
                vtok, tnode = a.children
                arg_types.append(self._type(tnode))
                arg_names.append((vtok, self.tok_loc(vtok)))
        result_types: list[Attribute] = []
        if sig is not None:
            result_types = [self._type(t) for t in sig.children if t is not None]
        block = Block(arg_types=arg_types)
        for arg, (vtok, loc) in zip(block.args, arg_names, strict=True):
            self._define(vtok, arg)
            arg.location = loc.to_attr()
        f = func.FuncOp(name, FunctionType.from_lists(arg_types, result_types), Region(block))
        f.location = self.tok_loc(node.children[0]).to_attr()
        self._body(body, block, is_func=True, fname=name, result_types=result_types)
        return f

    def _all_defs(self, body: Tree) -> dict[str, Location]:
        """Names defined anywhere in a function, to tell 'used too early' from 'unknown'."""
        defs: dict[str, Location] = {}
        for t in body.iter_subtrees():
            if t.data == "op" and t.children[0] is not None:
                for v in t.children[0].children:
                    defs.setdefault(str(v), self.tok_loc(v))
            if t.data == "arg":
                defs.setdefault(str(t.children[0]), self.tok_loc(t.children[0]))
        return defs

    def _define(self, tok: Token, value: SSAValue) -> None:
        name = str(tok)
        if name in self.scope:
            raise self.error(
                tok,
                f"{name} is already defined",
                [Note(self.scope[name][1], "previous definition here")],
            )
        self.scope[name] = (value, self.tok_loc(tok))
        set_value_name(value, name[1:])

    def _use(self, tok: Token) -> SSAValue:
        name = str(tok)
        if name in self.scope:
            return self.scope[name][0]
        if name in self.pending:
            raise self.error(
                tok,
                f"{name} is used before it is defined",
                [Note(self.pending[name], "defined here")],
            )
        known = difflib.get_close_matches(name, list(self.scope), n=1)
        hint = f" (did you mean {known[0]}?)" if known else ""
        raise self.error(tok, f"use of undefined value {name}{hint}")

    def _body(
        self,
        body: Tree,
        block: Block,
        *,
        is_func: bool,
        fname: str = "",
        result_types: Sequence[Attribute] = (),
    ) -> None:
        saw_return = False
        for stmt in body.children:
            if saw_return:
                raise self.error(stmt, "nothing may follow 'return' in a function")
            if stmt.data == "ret":
                if not is_func:
                    raise self.error(stmt, "'return' ends a function; this region is not one")
                block.add_op(self._return(stmt, fname, result_types))
                saw_return = True
            else:
                block.add_op(self._op(stmt))
        if is_func and not saw_return:
            raise self.error(self._closing_brace(body), f"function @{fname} must end with 'return'")

    def _closing_brace(self, body: Tree) -> Location:
        """Where the '}' closing a function body stands."""
        if body.meta.empty:
            start = self.text.find("{", self.func_start) + 1
        else:
            start = body.meta.end_pos
        pos = self.text.find("}", start)
        pos = pos if pos >= 0 else max(len(self.text) - 1, 0)
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return self.loc(line, column)

    def _return(self, stmt: Tree, fname: str, result_types: Sequence[Attribute]) -> Operation:
        _, values, types = stmt.children
        operands = [self._use(v) for v in values.children] if values is not None else []
        if types is not None:
            written = [self._type(t) for t in types.children]
            if len(written) != len(operands):
                raise self.error(
                    stmt, f"return lists {len(operands)} values but {len(written)} types"
                )
            for i, (v, t) in enumerate(zip(operands, written, strict=True)):
                if v.type != t:
                    from irc.analysis.verifier import verify_op
                    from irc.ir.types import format_type

                    if isinstance(v, OpResult):
                        # The value's own op may have been written with a wrong type:
                        # that is the error, at that op, not this return's echo of it.
                        at_op: list[Diagnostic] = []
                        verify_op(v.owner, at_op)
                        if at_op:
                            raise IrcError(at_op)
                    raise self.error(
                        values.children[i],
                        f"return: {values.children[i]} has type {format_type(v.type)}, "
                        f"written as {format_type(t)}",
                    )
        op = func.ReturnOp(*operands)
        op.location = self.loc(stmt.meta.line, stmt.meta.column).to_attr()
        return op

    def _op(self, stmt: Tree) -> Operation:
        results, _, name_tok, operands, attrs, region, types = stmt.children
        op_name = str(name_tok)
        cls = self.op_classes.get(op_name)
        if cls is None:
            if op_name.startswith(("func.", "builtin.")):
                raise self.error(name_tok, f"'{op_name}' is not an op of irc's text format")
            close = difflib.get_close_matches(op_name, list(self.op_classes), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise self.error(name_tok, f"unknown op '{op_name}'{hint}")
        loc = self.loc(stmt.meta.line, stmt.meta.column)
        operand_vals = [self._use(v) for v in operands.children] if operands is not None else []
        self._check_counts(cls, name_tok, operands, region)
        props = self._attrs(cls, attrs) if attrs is not None else {}
        written = [self._type(t) for t in types.children] if types is not None else None
        if written is not None and _is_graph_op(cls):
            for tnode, t in zip(types.children, written, strict=True):  # type: ignore[union-attr]
                if not isinstance(t, TensorType):
                    from irc.ir.types import format_type

                    raise self.error(
                        tnode,
                        f"{cls.name} produces a tensor: write its type like tensor<4x8xf32>, "
                        f"not {format_type(t)}",
                    )
        result_toks = list(results.children) if results is not None else []
        regions: list[Region] = []
        if region is not None:
            regions.append(self._region(region))
        result_types = self._result_types(
            cls, name_tok, loc, operand_vals, props, written, result_toks
        )
        op = cls.create(
            operands=operand_vals, result_types=result_types, properties=props, regions=regions
        )
        op.location = loc.to_attr()
        for tok, res in zip(result_toks, op.results, strict=True):
            self._define(tok, res)
        return op

    def _check_counts(
        self, cls: type[Operation], name_tok: Token, operands: Tree | None, region: Tree | None
    ) -> None:
        """The operand and region counts of ops whose counts are fixed."""
        given = len(operands.children) if operands is not None else 0
        want = _fixed_count(cls, "operands")
        if want is not None and given != want:
            where: Token | Tree = name_tok
            if operands is not None and given > want:
                where = operands.children[want]
            raise self.error(
                where, f"{cls.name} takes {_count(want, 'operand')}, got {given or 'none'}"
            )
        regions = _fixed_count(cls, "regions")
        if regions == 0 and region is not None:
            raise self.error(region, f"{cls.name} takes no region")
        if regions and region is None:
            raise self.error(name_tok, f"{cls.name} needs a region: '(%arg: type) {{ ... }}'")

    def _region(self, node: Tree) -> Region:
        if self.depth >= MAX_REGION_DEPTH:
            raise self.error(node, f"regions nest more than {MAX_REGION_DEPTH} deep")
        self.depth += 1
        try:
            return self._region_body(node)
        finally:
            self.depth -= 1

    def _region_body(self, node: Tree) -> Region:
        args, body = node.children
        types: list[Attribute] = []
        toks: list[Token] = []
        if args is not None:
            for a in args.children:
                toks.append(a.children[0])
                types.append(self._type(a.children[1]))
        block = Block(arg_types=types)
        outer = dict(self.scope)
        for tok, arg in zip(toks, block.args, strict=True):
            self._define(tok, arg)
            arg.location = self.tok_loc(tok).to_attr()
        self._body(body, block, is_func=False)
        # Values of a region are visible only inside it.
        self.scope = outer
        return Region(block)

    def _result_types(
        self,
        cls: type[Operation],
        name_tok: Token,
        loc: Location,
        operands: list[SSAValue],
        props: dict[str, Attribute],
        written: list[Attribute] | None,
        result_toks: list[Token],
    ) -> list[Attribute]:
        from irc.dialects.graph import GraphOp

        n_results = _fixed_result_count(cls)
        if n_results is not None and len(result_toks) != n_results:
            if n_results == 0:
                raise self.error(result_toks[0], f"{cls.name} produces no value")
            if not result_toks:
                raise self.error(
                    name_tok, f"{cls.name} produces a value: write '%name = {cls.name} ...'"
                )
            raise self.error(
                result_toks[0],
                f"{cls.name} produces {_count(n_results, 'value')}, "
                f"but {_count(len(result_toks), 'name')} are written before '='",
            )
        if written is not None:
            if len(written) != len(result_toks):
                if not result_toks:
                    raise self.error(loc, f"{cls.name} produces no value: nothing may follow ':'")
                raise self.error(
                    loc,
                    f"{cls.name}: {_count(len(result_toks), 'result')} but "
                    f"{_count(len(written), 'type')} after ':'",
                )
            return written
        if not result_toks:
            return []
        if isinstance(cls, type) and issubclass(cls, GraphOp):
            if cls.REQUIRED_RESULT_TYPE:
                raise self.error(name_tok, f"{cls.name} needs its result type written after ':'")
            try:
                return [cls.infer_type([o.type for o in operands], props)]
            except VerifyException as e:
                raise self.error(loc, str(e), self._operand_note(e, operands)) from None
        raise self.error(name_tok, f"{cls.name} needs its result types written after ':'")

    def _operand_note(self, e: VerifyException, operands: list[SSAValue]) -> list[Note]:
        """A note at the definition of the operand a verifier error is about."""
        from irc.ir.types import format_type

        index = getattr(e, "operand", None)
        if index is None or not 0 <= index < len(operands):
            return []
        v = operands[index]
        name = "%" + v.name_hint if v.name_hint else "the operand"
        where = Location.from_attr(v.owner.location) if isinstance(v.owner, Operation) else None
        if isinstance(v, BlockArgument):
            where = Location.from_attr(v.location)
        return [Note(where, f"{name} defined here as {format_type(v.type)}")] if where else []

    # -- attributes and types --

    def _attrs(self, cls: type[Operation], node: Tree) -> dict[str, Attribute]:
        text_keys: dict[str, str] = getattr(cls, "TEXT_KEYS", {})
        spelled = {v: k for k, v in text_keys.items()}
        known = {spelled.get(k, k) for k in _property_names(cls)}
        props: dict[str, Attribute] = {}
        for entry in node.children:
            if entry is None:
                continue
            key_tok, value = entry.children
            key = str(key_tok)
            if key not in known:
                allowed = ", ".join(sorted(known)) or "none"
                raise self.error(
                    key_tok, f"{cls.name} has no attribute '{key}' (its attributes: {allowed})"
                )
            if text_keys.get(key, key) in props:
                raise self.error(key_tok, f"attribute '{key}' is given twice")
            prop = text_keys.get(key, key)
            props[prop] = _from_text(cls, prop, self._attr_value(value, 0))
        return props

    def _attr_value(self, node: Tree | Token, depth: int) -> Attribute:
        kind = node.data if isinstance(node, Tree) else "type"
        if kind == "number":
            tok = node.children[0]
            return _number_attr(str(tok), lambda m: self.error(tok, m))
        if kind == "true":
            return IntegerAttr(1, IntegerType(1))
        if kind == "false":
            return IntegerAttr(0, IntegerType(1))
        if kind == "string":
            raw = str(node.children[0])[1:-1]
            return StringAttr(unescape_string(raw))
        if kind == "symbol":
            return SymbolRefAttr(str(node.children[0])[1:])
        if kind == "array":
            if depth >= _MAX_LIST_DEPTH:
                raise self.error(node, f"lists nest more than {_MAX_LIST_DEPTH} deep")
            return ArrayAttr(
                [self._attr_value(c, depth + 1) for c in node.children if c is not None]
            )
        return self._type(node)

    def _type(self, node: Tree) -> Attribute:
        name_tok, shape_tok = node.children
        name = str(name_tok)
        if shape_tok is None:
            if name in SCALAR_TYPES:
                return SCALAR_TYPES[name]
            if name in ("tensor", "memref"):
                raise self.error(
                    name_tok,
                    f"{name} type needs a shape: {name}<4x8xf32>, or {name}<f32> for rank 0",
                )
            raise self.error(
                name_tok,
                f"unknown type '{name}' (expected tensor<...> or one of {', '.join(SCALAR_TYPES)})",
            )
        text = str(shape_tok)
        if name == "ptr" and text in SCALAR_TYPES:
            from irc.dialects.tile import PtrType

            return PtrType(SCALAR_TYPES[text])
        if name not in ("tensor", "memref"):
            raise self.error(name_tok, f"unknown type '{name}<{text}>' (expected tensor<...>)")
        dims: list[int] = []
        pos = 0
        while (m := _SHAPE_RE.match(text, pos)) is not None:
            digits = m.group(1).lstrip("0")
            if len(digits) > 15:
                where = self.loc(shape_tok.line or 1, (shape_tok.column or 1) + pos)
                raise self.error(
                    where, f"dimension {_quote(m.group(1))} in '{name}<...>' is too large"
                )
            dims.append(int(m.group(1)))
            pos = m.end()
        element = text[pos:]
        col = (shape_tok.column or 1) + pos
        if element not in SCALAR_TYPES or (name == "tensor" and element == "index"):
            where = self.loc(shape_tok.line or 1, col)
            if re.fullmatch(r"[\d?*-]+.*", element):
                raise self.error(
                    where,
                    f"malformed dimension in '{name}<{text}>': dimensions are positive "
                    "integers separated by 'x'",
                )
            allowed = "f32 f16 bf16 f64 i64 i32 i1"
            raise self.error(where, f"unknown element type '{element}' (expected one of {allowed})")
        for d in dims:
            if d < 1:
                raise self.error(shape_tok, f"dimension {d} in '{name}<{text}>' must be positive")
        if len(dims) > MAX_RANK:
            raise self.error(
                shape_tok,
                f"'{name}<...>' has {len(dims)} dimensions, more than irc supports ({MAX_RANK})",
            )
        if numel(dims) > MAX_ELEMENTS:
            raise self.error(
                shape_tok,
                f"'{name}<{text}>' has {numel(dims):.3g} elements, more than irc supports (2**48)",
            )
        element_type = SCALAR_TYPES[element]
        if name == "tensor":
            return TensorType(element_type, dims)
        return MemRefType(element_type, dims)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"'}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)")


def unescape_string(raw: str) -> str:
    """The text of a string literal between its quotes: `\\n \\t \\r \\0 \\\\ \\" \\xHH
    \\uHHHH` are escapes, anything else (any Unicode character) stands for itself."""

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if len(e) > 1:
            return chr(int(e[1:], 16))
        return _ESCAPES.get(e, e)

    return _ESCAPE.sub(one, raw)


def _number_attr(text: str, error: object) -> Attribute:
    body = text.lstrip("+-")
    if re.fullmatch(r"\d+", body):
        if len(body.lstrip("0")) > 19:
            raise error(f"integer {_quote(text)} does not fit in 64 bits")  # type: ignore[operator]
        value = int(text)
        if not -(2**63) <= value < 2**63:
            raise error(f"integer {_quote(text)} does not fit in 64 bits")  # type: ignore[operator]
        return IntegerAttr(value, i64)
    value_f = float(text)
    if math.isinf(value_f) and body not in ("inf",):
        raise error(f"number {_quote(text)} is too large for f64")  # type: ignore[operator]
    return FloatAttr(value_f, f64)


def _from_text(cls: type[Operation], prop: str, value: Attribute) -> Attribute:
    """A property as the op holds it: an enum property (`loop.apply`'s `fn`) is
    written as a string, which names one member (a string naming none stays a
    string, for the verifier to report at the op)."""
    if not issubclass(cls, IRDLOperation):
        return value
    definition = cls.get_irdl_definition().properties.get(prop)
    if definition is not None and isinstance(definition.constr, NamedEnum):
        return definition.constr.from_text(value)
    return value


def _property_names(cls: type[Operation]) -> set[str]:
    if isinstance(cls, type) and issubclass(cls, IRDLOperation):
        return set(cls.get_irdl_definition().properties)
    return set()


def _is_graph_op(cls: type[Operation]) -> bool:
    from irc.dialects.graph import GraphOp

    return isinstance(cls, type) and issubclass(cls, GraphOp)


def _count(n: int, what: str) -> str:
    if n == 0:
        return f"no {what}s"
    return f"{n} {what}" + ("" if n == 1 else "s")


def _fixed_count(cls: type[Operation], construct: str) -> int | None:
    """How many operands (or regions) an op always takes, or None when variadic."""
    if not (isinstance(cls, type) and issubclass(cls, IRDLOperation)):
        return None
    from xdsl.irdl import VariadicDef

    defs = getattr(cls.get_irdl_definition(), construct)
    if any(isinstance(d, VariadicDef) for _, d in defs):
        return None
    return len(defs)


def _fixed_result_count(cls: type[Operation]) -> int | None:
    """The number of results an op always has, or None when it is variadic."""
    if not (isinstance(cls, type) and issubclass(cls, IRDLOperation)):
        return None
    from xdsl.irdl import VarResultDef

    defs = cls.get_irdl_definition().results
    if any(isinstance(d, VarResultDef) for _, d in defs):
        return None
    return len(defs)


__all__ = ["parse", "parse_file", "read_source", "op_classes", "set_value_name", "IntegerType"]
