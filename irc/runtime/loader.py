"""Generated modules in, kernels out: the cache folder, and the import that
builds a module's kernels for the GPU or for Triton's interpreter."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType


def cache_dir() -> Path:
    """Where generated modules go: $IRC_CACHE_DIR, else ~/.cache/irc, else a temp dir."""
    for candidate in (os.environ.get("IRC_CACHE_DIR"), Path.home() / ".cache" / "irc"):
        if candidate is None:
            continue
        path = Path(candidate)
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            continue
    return Path(tempfile.mkdtemp(prefix="irc-"))


def interpreted_triton_error(device: str) -> RuntimeError:
    return RuntimeError(
        f"irc: cannot compile for {device}: Triton was imported with TRITON_INTERPRET=1, "
        "so in this process its kernels can only be interpreted; compile with "
        'device="cpu", or unset TRITON_INTERPRET before triton is imported'
    )


def load_source(text: str, device: str) -> ModuleType:
    """Imports generated source; on CPU its kernels are built for the interpreter."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    path = cache_dir() / f"irc_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    name = f"irc_generated_{digest}_{device}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    mod.DEVICE = device  # the header derives the rest from it (a CPU module on a GPU machine)
    if device != "cpu" and library_is_interpreted():
        raise interpreted_triton_error(device)
    import irc.runtime.helpers  # noqa: F401  (imported compiled, before `interpreting`)
    from irc.runtime import interpreter

    with interpreter.interpreting(device == "cpu"):
        spec.loader.exec_module(mod)
    if device == "cpu":
        mod.FUNCTIONS = {k: interpreter.run_interpreted(f) for k, f in mod.FUNCTIONS.items()}
    return mod


def library_is_interpreted() -> bool:
    from irc.runtime.interpreter import triton_is_interpreted

    return triton_is_interpreted()
