"""irc's kernels built for an H100 (sm_90) on a machine without a GPU.

Triton's NVIDIA pipeline (TTIR, TTGIR, LLVM, PTX) and the ptxas and cuobjdump
its wheel bundles need no device. Tests use this to catch what the interpreter
accepts and the GPU compiler rejects (`tests/test_gpu_compile.py`), and to read
the machine code ptxas makes of a kernel (`tests/test_load_order.py`).

    python -m irc.testing.sm90 FILE.ir

prints each kernel's registers, its spill stores and how many of its global
loads ptxas issues together (a run of loads with no add between them): a reduction whose loads
come one at a time, each after the add before, holds one load in flight a
thread (docs/benchmarks.md, session 18), which shows here without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from xdsl.dialects.builtin import ModuleOp

from irc.dialects import tile
from irc.ir.types import format_type
from irc.lowering.tile_to_triton import emit_triton, kernel_identifiers
from irc.runtime.launch import FP_FUSION

H100 = GPUTarget("cuda", 90, 32)
POINTEE = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64",
           "i32": "i32", "i64": "i64", "i1": "i1"}  # fmt: skip


def gpu_kernels(
    module: ModuleOp, tmp_path: Path
) -> list[tuple[tile.KernelOp, JITFunction[Any], dict[str, str]]]:
    """(tile kernel, @triton.jit function, signature) of each kernel of a tile-level
    `module`, its source written under `tmp_path` and imported compiled."""
    names = kernel_identifiers([k for k in module.walk() if isinstance(k, tile.KernelOp)])
    path = tmp_path / "generated.py"
    path.write_text(emit_triton(module))
    spec = importlib.util.spec_from_file_location(f"generated_{id(module)}", path)
    assert spec is not None and spec.loader is not None
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    out = []
    for kernel, name in names.items():
        fn = getattr(generated, name)
        assert isinstance(fn, JITFunction), f"{name} is not compiled for the GPU"
        pointees = [format_type(a.type.pointee) for a in kernel.body.block.args]  # type: ignore[attr-defined]
        sig = {p: "*" + POINTEE[t] for p, t in zip(fn.arg_names, pointees, strict=True)}
        out.append((kernel, fn, sig))
    return out


def build(kernel: tile.KernelOp, fn: JITFunction[Any], sig: dict[str, str]) -> Any:
    """The kernel through Triton's sm_90 pipeline and ptxas, at its own warps and
    stages, its pointers 16-byte aligned as irc launches them (`runtime.launch`): a
    GPU's JIT specializes on that, and without it loads of 2-byte elements stay
    scalar where the GPU's are 16 bytes wide."""
    warps = kernel.warps.value.data if kernel.warps is not None else 4
    options = {"num_warps": warps, "enable_fp_fusion": FP_FUSION}
    if kernel.stages is not None:
        options["num_stages"] = kernel.stages.value.data
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(sig))}
    return triton.compile(ASTSource(fn, sig, attrs=aligned), target=H100, options=options)


def _cuobjdump(compiled: Any, tmp_path: Path, flag: str) -> str:
    # A fixed name: nothing of the program (its kernels' names) makes the path.
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run(
        [str(tool), flag, str(cubin)], capture_output=True, text=True, check=True
    ).stdout


def sass(compiled: Any, tmp_path: Path) -> str:
    """The kernel's machine code as cuobjdump prints it."""
    return _cuobjdump(compiled, tmp_path, "-sass")


def registers(compiled: Any, tmp_path: Path) -> int:
    """Registers a thread of the kernel takes (ptxas's choice)."""
    found = re.search(r"REG:(\d+)", _cuobjdump(compiled, tmp_path, "-res-usage"))
    assert found is not None, "cuobjdump printed no register count"
    return int(found.group(1))


def loads_and_adds(code: str) -> str:
    """Global loads (L) and float adds (F) of SASS `code`, in issue order."""
    return "".join(
        "L" if "LDG" in line else "F"
        for line in code.splitlines()
        if "LDG" in line or re.search(r"\bFADD\b", line)
    )


def load_runs(order: str) -> list[int]:
    """Lengths of the runs of loads with no add between them, in `loads_and_adds` order."""
    return [len(run) for run in re.findall("L+", order)]


def spills(code: str) -> int:
    """Stores to local memory (STL) in SASS `code`: registers spilled."""
    return len(re.findall(r"\bSTL\b", code))


def report(module: ModuleOp, tmp_path: Path) -> list[str]:
    """One line a kernel of a tile-level `module`: warps, registers, spill stores,
    loads and the loads ptxas issues together, on average."""
    head = f"{'kernel':<48} {'warps':>5} {'regs':>4} {'spills':>6} {'loads':>5} {'together':>8}"
    lines = [head]
    for kernel, fn, sig in gpu_kernels(module, tmp_path):
        compiled = build(kernel, fn, sig)
        code = sass(compiled, tmp_path)
        runs = load_runs(loads_and_adds(code))
        together = sum(runs) / len(runs) if runs else 0.0
        warps = compiled.metadata.num_warps
        lines.append(
            f"{fn.__name__:<48} {warps:>5} {registers(compiled, tmp_path):>4} "
            f"{spills(code):>6} {sum(runs):>5} {together:>8.1f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m irc.testing.sm90",
        description="Registers and load order of a program's kernels built for sm_90.",
    )
    parser.add_argument("file", help="a .ir file (graph level)")
    args = parser.parse_args(argv)
    import irc
    from irc.compiler import lower_to_tile
    from irc.syntax.diagnostics import IrcError, SourceManager

    try:
        text = Path(args.file).read_text()
    except (OSError, UnicodeDecodeError) as e:
        sys.stderr.write(f"{parser.prog}: error: cannot read {args.file}: {e}\n")
        return 1
    sources = SourceManager()
    sources.add(args.file, text)
    try:
        module = irc.parse(text, args.file)
        irc.run_pipeline(module, "fuse")
        lower_to_tile(module)
    except IrcError as e:
        for d in e.diagnostics:
            text = sources.format(d)
            sys.stderr.write((f"{parser.prog}: {text}" if d.location is None else text) + "\n")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        print("\n".join(report(module, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
