"""irc's kernels built for an H100 (sm_90) on a machine without a GPU.

Triton's NVIDIA pipeline (TTIR, TTGIR, LLVM, PTX) and the ptxas and cuobjdump
its wheel bundles need no device. Tests use this to catch what the interpreter
accepts and the GPU compiler rejects (`tests/test_gpu_compile.py`), and to read
the machine code ptxas makes of a kernel (`tests/test_load_order.py`).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
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
    """The kernel through Triton's sm_90 pipeline and ptxas, at its own warps."""
    warps = kernel.warps.value.data if kernel.warps is not None else 4
    return triton.compile(ASTSource(fn, sig), target=H100, options={"num_warps": warps})


def sass(compiled: Any, tmp_path: Path) -> str:
    """The kernel's machine code as cuobjdump prints it."""
    cubin = tmp_path / f"{compiled.metadata.name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run(
        [str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout


def loads_and_adds(code: str) -> str:
    """Global loads (L) and float adds (F) of SASS `code`, in issue order."""
    return "".join(
        "L" if "LDG" in line else "F"
        for line in code.splitlines()
        if "LDG" in line or re.search(r"\bFADD\b", line)
    )
