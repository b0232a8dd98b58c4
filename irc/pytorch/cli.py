"""`irc-import`: a PyTorch module as a readable, editable `.ir` file.

    irc-import mypkg.blocks:Block --input 8x1024x768xbf16 -o block.ir
    irc-import model.py:Block --input 2x16x64xf32          # a file and a name in it
    irc-import model.py                                     # `model` and `example_inputs` in it
    irc-opt block.ir --fuse --fusion-report                 # then read, edit, compile it

The name is an nn.Module class (built with no arguments) or a function that
returns a module, or a (module, example_inputs) pair. Example inputs are
`--input` types (`2x16x64xf32`, `tensor<4xi64>`: random normal floats, integers
in [0, 8)), else the object's or the file's `example_inputs`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from irc.pytorch.types import TORCH_TO_IRC
from irc.tools.cli import ArgumentParser, add_version

_TYPE = re.compile(r"(?:tensor<)?((?:\d+x)*)(f32|f16|bf16|f64|i64|i32|i1)>?")


class CliError(Exception):
    pass


def _load(target: str) -> tuple[Any, Any]:
    """The object `target` names and the namespace it lives in."""
    where, _, name = target.partition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise CliError(f"no such file: {where}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        namespace = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = namespace
        spec.loader.exec_module(namespace)
    else:
        try:
            namespace = importlib.import_module(where)
        except ImportError as e:
            raise CliError(f"cannot import {where}: {e}") from None
    if not name:
        if not hasattr(namespace, "model"):
            raise CliError(f"{where} defines no `model`: name one, as {where}:Block")
        return namespace.model, namespace
    obj = namespace
    for part in name.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{where} has no {name}")
        obj = getattr(obj, part)
    return obj, namespace


def _example(spec: str) -> Any:
    import torch

    m = _TYPE.fullmatch(spec.strip())
    if m is None:
        raise CliError(f"cannot read the input type {spec!r}: write it as 2x16x64xf32")
    shape = [int(d) for d in m.group(1).split("x") if d]
    dtype = next(t for t, n in TORCH_TO_IRC.items() if n == m.group(2))
    size = math.prod(shape) * dtype.itemsize
    if size > _memory() // 2:
        raise CliError(
            f"the example input {spec} needs {size / 2**30:.3g} GiB, more than half this "
            "machine's memory: export with a smaller example"
        )
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) < 0.5
    return torch.randint(0, 8, shape, dtype=dtype)


def _memory() -> int:
    """This machine's memory in bytes (a large default where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


class UserCodeError(Exception):
    """The user's module (its import, constructor, example_inputs or torch.export
    of it) raised: their error, said in a line, not irc's."""


def _in_user_code(what: str, e: BaseException) -> UserCodeError:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _users(f.filename)]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return UserCodeError(f"{what}: {type(e).__name__}: {first}{where}")


def _users(filename: str) -> bool:
    """Whether a frame is the user's code: not a library's (torch's, irc's own) nor
    Python's frozen import machinery."""
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    return "site-packages" not in path.parts and Path(__file__).resolve().parents[1] not in path.parents


def build(target: str, inputs: list[str]) -> tuple[Any, tuple[Any, ...]]:
    """The module and its example inputs; what the user's code raises on the way
    is a UserCodeError."""
    try:
        return _build(target, inputs)
    except (CliError, UserCodeError):
        raise
    except Exception as e:
        raise _in_user_code(f"making {target} raised", e) from e


def _build(target: str, inputs: list[str]) -> tuple[Any, tuple[Any, ...]]:
    import torch

    obj, namespace = _load(target)
    examples: Any = None
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        obj = obj()
    elif not isinstance(obj, torch.nn.Module) and callable(obj):
        made = obj()
        obj, examples = made if isinstance(made, tuple) else (made, None)
    if not isinstance(obj, torch.nn.Module):
        raise CliError(f"{target} is not an nn.Module, nor makes one")
    if inputs:
        examples = tuple(_example(s) for s in inputs)
    if examples is None:
        examples = getattr(obj, "example_inputs", None) or getattr(namespace, "example_inputs", None)
        if callable(examples):
            examples = examples()
    if examples is None:
        raise CliError("no example inputs: give --input TYPE (as 2x16x64xf32) for each argument")
    return obj.eval(), tuple(examples) if isinstance(examples, list | tuple) else (examples,)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(
        prog="irc-import", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_version(ap)
    ap.add_argument("target", help="module:Name, file.py:Name or file.py")
    ap.add_argument("--input", action="append", default=[], metavar="TYPE",
                    help="an example input's type, as 2x16x64xf32 (once per argument)")  # fmt: skip
    ap.add_argument("-o", "--output", help="the .ir file to write (default: stdout)")
    ap.add_argument("--name", help="the function's name (default: the class name)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")
    ap.add_argument(
        "--debug", action="store_true", help="show Python tracebacks (of your code's errors too)"
    )
    args = ap.parse_args(argv)
    try:
        return _import(args)
    except (CliError, UserCodeError, ValueError) as e:
        if args.debug and e.__cause__ is not None:
            traceback.print_exception(e.__cause__)
        return _fail(str(e))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.debug:
            traceback.print_exception(e)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        sys.stderr.write(
            f"irc-import: internal error: {type(e).__name__}: {first}"
            + ("" if args.debug else " (run with --debug for the traceback)")
            + "\n"
        )
        return 2


def _import(args: argparse.Namespace) -> int:
    import torch

    from irc.pytorch.export import _stem, capture, exported_text

    torch.manual_seed(args.seed)
    module, examples = build(args.target, args.input)
    try:
        ep = capture(module, examples, None)
    except Exception as e:
        raise _in_user_code(f"torch.export cannot capture {args.target}", e) from e
    text = exported_text(ep, args.name or _stem(module))
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise CliError(f"cannot write '{args.output}': {e.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0


def _fail(message: str) -> int:
    print(f"irc-import: error: {message}", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
