"""Fuzzing the front door: only irc's own diagnostics may ever escape.

Inputs are mutations of the valid `.ir` files in the repository (lines deleted,
duplicated and swapped; characters and tokens inserted, deleted and replaced),
random bytes, random printable text and token soups. Each goes through
decode -> parse -> verify -> decompose -> print -> parse -> print, and must
either succeed, with printing a fixed point, or raise `IrcError` whose
diagnostics point at real places of the input and format cleanly. A slice of
the inputs also runs through `irc-opt` itself, which must exit 0 or 1.

Everything is seeded: a failure prints the seed, the case number and the input.
Set IRC_FUZZ_SEED to explore other inputs and IRC_FUZZ_SCALE to run more.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import string
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from irc.analysis.verifier import verify
from irc.pipeline import build_pipeline, run_pipeline
from irc.syntax.diagnostics import IrcError, SourceManager
from irc.syntax.parser import decode_source, parse
from irc.syntax.printer import print_module
from irc.tools.opt import run as irc_opt

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("IRC_FUZZ_SEED", "20261121"))
SCALE = float(os.environ.get("IRC_FUZZ_SCALE", "1"))
LARK_NAMES = re.compile(
    r"\b(RSQB|LSQB|RPAR|LPAR|RBRACE|LBRACE|MORETHAN|LESSTHAN|COMMA|COLON|_NL|"
    r"TYPE_NAME|OPNAME|\$END|__ANON_\d+)\b"
)

OPS = (
    "neg abs exp log sqrt rsqrt sin cos tanh sigmoid relu gelu silu reciprocal erf floor ceil "
    "round add sub mul div "
    "maximum minimum pow eq ne lt le gt ge where cast constant reduce_sum reduce_max reduce_min "
    "reduce_mean matmul transpose reshape broadcast softmax layer_norm fused yield"
).split()
VOCAB = [
    "%x", "%y", "%0", "%class", "%x.y", "%def-1", "@f", "@import", "graph.add", "graph.exp",
    "graph.nope", "func.call", "tensor<", ">", "<", "{", "}", "[", "]", "(", ")", ":", ",", "=",
    "->", "func", "module", "return", "// c", "// -----", "\n", "\t", " ", "\r\n", '"', "\\",
    "99999999999999999999", "-1", "0", "1", "2.5", "1.0e-5", "1e400", "inf", "-inf", "nan",
    "true", "false", "f32", "f16", "bf16", "f64", "i64", "i32", "i1", "index", "x",
    "tensor<f32>", "tensor<0xf32>", "tensor<4xf32>", "tensor<4x8xf32>", "tensor<8x1xf32>",
    "tensor<4xi1>", "tensor<4xf16>", "tensor<99999999999x99999999999xf32>", "memref<4xf32>",
    "tensor<4xindex>", "ptr<f32>", "{dims = [1]}", "{dims = [0], keepdim = true}",
    "{dims = [-1]}", "{dims = [5]}", "{dims = [0, 0]}", "{dims = []}", "{dims = true}",
    "{dims = [[1]]}", "{perm = [1, 0]}", "{perm = [0]}", "{dim = 1}", "{dim = 1.5}",
    "{dim = -9}", "{keepdim = 3}", "{eps = true}", "{eps = [1]}", "{value = 2.0}",
    "{value = true}", "{value = \"s\"}", "{value = @f}", "{value = nan}",
    "{value = 3000000000}", "{x = 1}", "{dims = [1], dims = [0]}", "%x, %x", "%x, %x, %x",
    "(%a: tensor<4xf32>) {", "graph.yield %x",
] + [f"graph.{op}" for op in OPS]  # fmt: skip

SPLIT = re.compile(r"^// -----.*$", re.MULTILINE)


def seed_texts() -> list[str]:
    """The valid inputs to mutate: examples and the valid chunks of lit tests."""
    texts = [p.read_text() for p in sorted(ROOT.glob("examples/*.ir"))]
    for path in sorted(ROOT.glob("tests/lit/**/*.ir")):
        text = path.read_text()
        runs = re.findall(r"RUN:\s*(\S+)", text)
        if "Output" in path.parts or (runs and all(r == "not" for r in runs)):
            continue
        for chunk in SPLIT.split(text):
            if chunk.strip() and "expected-error" not in chunk:
                texts.append(chunk)
    return texts


TEXTS = seed_texts()


# --- the oracle ----------------------------------------------------------------------


def check_diagnostics(error: IrcError, text: str, name: str) -> None:
    lines = text.split("\n")
    sources = SourceManager()
    sources.add(name, text)
    assert error.diagnostics, "an IrcError without diagnostics"
    for d in error.diagnostics:
        assert d.location is not None, f"no location for: {d.message}"
        assert d.location.file == name
        assert 1 <= d.location.line <= len(lines), f"line {d.location.line} of {len(lines)}"
        src = lines[d.location.line - 1].removesuffix("\r")
        assert 1 <= d.location.column <= len(src) + 1, f"column {d.location.column}: {src!r}"
        assert d.message and "\n" not in d.message, repr(d.message)
        assert not LARK_NAMES.search(d.message), d.message
        formatted = sources.format(d).split("\n")
        assert formatted[0].startswith(f"{name}:{d.location.line}:{d.location.column}: error: ")
        assert len(formatted) == 3 * (1 + len(d.notes)) or d.notes, formatted
        assert formatted[2].endswith("^"), formatted
        for note in d.notes:
            if note.location is not None:
                assert 1 <= note.location.line <= len(lines)


def check_text(text: str, name: str = "fuzz.ir") -> bool:
    """True when `text` compiled; raises AssertionError (or anything else) on a bug."""
    try:
        module = parse(text, name)
        verify(module)
        run_pipeline(module, "decompose")
    except IrcError as e:
        check_diagnostics(e, text, name)
        return False
    printed = print_module(module)
    again = parse(printed, "printed.ir")
    verify(again)
    assert print_module(again) == printed, "print -> parse -> print is not a fixed point"
    return True


def check_bytes(data: bytes) -> bool:
    try:
        text = decode_source(data, "fuzz.ir")
    except IrcError as e:
        d = e.diagnostics[0]
        assert d.location is not None and d.location.line >= 1 and d.location.column >= 1
        assert d.message.startswith("the file is not UTF-8 text")
        return False
    return check_text(text)


def run_cases(
    category: str, seed: int, count: int, make: Callable[[random.Random], bytes | str]
) -> list[bool]:
    """Runs `count` generated cases; fails with the seed and input of the first bug."""
    rng = random.Random(f"{category}:{seed}")
    results: list[bool] = []
    for i in range(count):
        case = make(rng)
        try:
            results.append(check_bytes(case) if isinstance(case, bytes) else check_text(case))
        except Exception as e:  # noqa: BLE001 - any escape is the bug being reported
            raise AssertionError(
                f"fuzz {category} seed={seed} case={i}: {type(e).__name__}: {e}\n"
                f"input ({len(case)} chars):\n{case[:3000]!r}"
            ) from e
    return results


def n(count: int) -> int:
    return max(1, int(count * SCALE))


# --- generators ------------------------------------------------------------------------


def tokens_of(text: str) -> list[re.Match[str]]:
    return list(
        re.finditer(r"%[\w.$-]+|@[\w.$-]+|graph\.\w+|tensor<[^>\n]*>|-?\d[\w.+-]*|\{[^{}\n]*\}|\w+",
                    text)
    )  # fmt: skip


def mutate(rng: random.Random, text: str) -> str:
    kind = rng.randrange(10)
    lines = text.split("\n")
    if kind == 0 and len(lines) > 1:
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    if kind == 1:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines)
    if kind == 2 and len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    pos = rng.randrange(len(text) + 1)
    if kind == 3:
        return text[:pos] + text[pos + rng.randint(1, 4) :]
    if kind == 4:
        return text[:pos] + rng.choice(string.printable) + text[pos:]
    if kind == 5:
        return text[:pos] + rng.choice(VOCAB) + text[pos:]
    if kind == 6:
        return text[:pos] + " " + rng.choice(VOCAB) + " " + text[pos:]
    toks = tokens_of(text)
    if not toks:
        return text
    m = rng.choice(toks)
    if kind == 7:  # replace a token by another of the file (a well-formed mix-up)
        other = rng.choice(toks).group()
        return text[: m.start()] + other + text[m.end() :]
    if kind == 8:  # replace a token by one from the vocabulary
        return text[: m.start()] + rng.choice(VOCAB) + text[m.end() :]
    return text[: m.start()] + text[m.end() :]  # delete a token


def mutated(rng: random.Random) -> str:
    text = rng.choice(TEXTS)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        text = mutate(rng, text)
    return text


def random_bytes(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 2, 10, 100, 1000])
    if rng.random() < 0.5:
        return bytes(rng.randrange(256) for _ in range(size))
    # Mostly ASCII with a few high bytes: gets past UTF-8 decoding more often.
    raw = bytearray(rng.choice(string.printable.encode()) for _ in range(size))
    for _ in range(rng.randrange(3)):
        if raw:
            raw[rng.randrange(len(raw))] = rng.randrange(128, 256)
    return bytes(raw)


def printable(rng: random.Random) -> str:
    alphabet = string.printable + "%@<>{}[]()=,:x" * 3 + "éλ€\u00a0\u2028\x0b\x0c\x00"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(300)))


def token_soup(rng: random.Random) -> str:
    words = [rng.choice(VOCAB) for _ in range(rng.randrange(1, 60))]
    return " ".join(words)


ARITY = {
    **{op: 1 for op in "neg abs exp log sqrt rsqrt sin cos tanh sigmoid relu gelu silu "
       "reciprocal cast reshape broadcast transpose softmax".split()},
    **{op: 2 for op in "add sub mul div maximum minimum pow eq ne lt le gt ge matmul".split()},
    "where": 3, "layer_norm": 3, "constant": 0,
    "reduce_sum": 1, "reduce_max": 1, "reduce_min": 1, "reduce_mean": 1,
}  # fmt: skip
ATTRS = {
    "reduce_sum": ["{dims = [1]}", "{dims = [0], keepdim = true}", "{dims = [-1]}", "{dims = [2]}"],
    "reduce_max": ["{dims = [1], keepdim = true}", "{dims = [0, 1]}"],
    "reduce_min": ["{dims = [0]}"],
    "reduce_mean": ["{dims = [1]}", "{dims = [0, 1], keepdim = false}"],
    "transpose": ["{perm = [1, 0]}", "{perm = [0, 1]}", "{perm = [0]}"],
    "softmax": ["{dim = 1}", "{dim = -1}", "{dim = 0}", "{dim = 3}"],
    "layer_norm": ["{dims = [1]}", "{dims = [1], eps = 0.001}", "{dims = [0]}"],
    "constant": ["{value = 1.0}", "{value = 2}", "{value = true}"],
}
TYPED = {"cast", "reshape", "broadcast", "constant"}


def structured(rng: random.Random) -> str:
    """A function of random ops with the right operand counts on random operands:
    well-formed text, often ill-typed, sometimes valid."""
    shapes = ["4x8x", "4x8x", "8x", "4x1x", "1x8x", "", "8x4x", "32x"]
    elements = ["f32", "f32", "f32", "f16", "i32", "i1"]
    values: list[str] = []
    args = []
    for i in range(rng.randint(1, 4)):
        args.append(f"%a{i}: tensor<{rng.choice(shapes)}{rng.choice(elements)}>")
        values.append(f"%a{i}")
    body = []
    for k in range(rng.randint(1, 6)):
        op = rng.choice(sorted(ARITY))
        operands = ", ".join(rng.choice(values) for _ in range(ARITY[op]))
        attrs = " " + rng.choice(ATTRS[op]) if op in ATTRS else ""
        written = ""
        if op in TYPED or rng.random() < 0.2:
            written = f" : tensor<{rng.choice(shapes)}{rng.choice(elements)}>"
        body.append(f"  %v{k} = graph.{op} {operands}{attrs}{written}".replace("  ", " ", 0))
        values.append(f"%v{k}")
    result = rng.choice(values[len(args) :] or values)
    return (
        f"func @f({', '.join(args)}) -> tensor<4x8xf32> {{\n"
        + "\n".join(body)
        + f"\n  return {result} : tensor<4x8xf32>\n}}\n"
    )


# --- the tests ---------------------------------------------------------------------------


def test_the_fuzzer_has_valid_seeds() -> None:
    assert len(TEXTS) >= 15
    for text in TEXTS:
        assert check_text(text), text


# Campaigns: a sample in the fast run, the whole campaign in the slow group.
CAMPAIGN = ["sample", pytest.param("campaign", marks=pytest.mark.slow)]


@pytest.mark.parametrize("size", CAMPAIGN)
def test_mutated_files(size: str) -> None:
    results = run_cases("mutated", SEED, n(500 if size == "sample" else 5000), mutated)
    # Some mutations keep the file valid (and then it must round-trip).
    assert 0 < sum(results) < len(results)


@pytest.mark.parametrize("size", CAMPAIGN)
def test_random_ops(size: str) -> None:
    results = run_cases("structured", SEED, n(300 if size == "sample" else 1500), structured)
    assert sum(results) > 0


def test_random_bytes() -> None:
    run_cases("bytes", SEED, n(1000), random_bytes)


def test_random_printable_text() -> None:
    run_cases("printable", SEED, n(1000), printable)


def test_token_soup() -> None:
    run_cases("soup", SEED, n(1000), token_soup)


def test_edge_inputs() -> None:
    edge_cases = [
        b"", b"\n", b"\xef\xbb\xbf", b"\x00", b"// only a comment", b"module {\n}\n",
        b"module {}", b"}", b"{", b"func", b"func @f", b"func @f(", b"func @f() {",
        b"func @f() {\n", b"func @f() {\n}", b"func @f() {\n  return\n}", b"\r\n\r\n",
        b"func @f() {\r\n  return\r\n}\r\n", b"\t\t\t", b"%", b"@", b"%%%%", "λ".encode(),
        b"func @f(%x: tensor<" + b"9" * 5000 + b"xf32>) {\n}\n",
        b"func @f() {\n" + b"  %x = graph.constant {value = 1.0} : tensor<f32>\n" * 2000
        + b"  return\n}\n",
        b"func @f() {\n  %c = graph.constant {value = " + b"[" * 5000 + b"]" * 5000
        + b"} : tensor<f32>\n  return\n}\n",
    ]  # fmt: skip
    for data in edge_cases:
        try:
            check_bytes(data)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"edge input {data[:200]!r}: {type(e).__name__}: {e}") from e


def _cli_cases(rng: random.Random) -> Iterator[str]:
    for _ in range(n(80)):
        text = mutated(rng)
        if rng.random() < 0.3:  # sometimes several chunks
            text = text + "\n// -----\n" + mutated(rng)
        yield text


def test_irc_opt_exits_0_or_1(tmp_path: Path) -> None:
    rng = random.Random(f"cli:{SEED}")
    path = tmp_path / "fuzz.ir"
    for i, text in enumerate(_cli_cases(rng)):
        path.write_text(text)
        for args in ([], ["--split-input-file", "--decompose"], ["--emit", "mlir"]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = irc_opt([str(path), *args])
            assert status in (0, 1), (
                f"fuzz cli seed={SEED} case={i} args={args}: exit {status}\n{err.getvalue()}\n"
                f"input:\n{text!r}"
            )
            assert "Traceback" not in err.getvalue()
            if status == 1:
                assert err.getvalue().startswith(str(path)), err.getvalue()


def test_random_pipelines() -> None:
    rng = random.Random(f"pipelines:{SEED}")
    words = ["decompose", "fuse", "tile", "nope", "{", "}", "=", ",", " ", "block", "1", "x",
             "-", "'", '"', "1.5", "true", "[", "]"]  # fmt: skip
    for i in range(n(500)):
        spec = "".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
        try:
            build_pipeline(spec)
        except IrcError as e:
            d = e.diagnostics[0]
            assert d.location is None and "\n" not in d.message, (spec, d.message)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(
                f"fuzz pipelines seed={SEED} case={i}: {spec!r}: {type(e).__name__}: {e}"
            ) from e
