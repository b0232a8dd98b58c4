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
import re
import sys
from pathlib import Path
from typing import Any

from irc.pytorch.types import TORCH_TO_IRC

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
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) < 0.5
    return torch.randint(0, 8, shape, dtype=dtype)


def build(target: str, inputs: list[str]) -> tuple[Any, tuple[Any, ...]]:
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
    ap = argparse.ArgumentParser(
        prog="irc-import", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("target", help="module:Name, file.py:Name or file.py")
    ap.add_argument("--input", action="append", default=[], metavar="TYPE",
                    help="an example input's type, as 2x16x64xf32 (once per argument)")  # fmt: skip
    ap.add_argument("-o", "--output", help="the .ir file to write (default: stdout)")
    ap.add_argument("--name", help="the function's name (default: the class name)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")
    ap.error = lambda message: _fail(message)  # type: ignore[method-assign]
    args = ap.parse_args(argv)
    try:
        import torch

        from irc.pytorch.export import export_text

        torch.manual_seed(args.seed)
        module, examples = build(args.target, args.input)
        text = export_text(module, examples, args.name)
    except (CliError, ValueError) as e:
        return _fail(str(e))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _fail(message: str) -> int:
    print(f"irc-import: error: {message}", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
