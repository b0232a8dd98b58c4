"""`irc.compile`: a graph program to callable Triton kernels.

The default pipeline runs every level (`LOWERING`: decompose, graph-to-loop,
split-reduction, tile, online-softmax, loop-to-tile and the clean-up of the
tile IR), then tile-to-triton prints a Python module, which is written to
the cache folder and imported (Triton needs its kernels' source in a file).
On a machine without CUDA, or with `device="cpu"`, the kernels run in Triton's
interpreter; irc arranges that itself, no environment variable needed. On CUDA
the `tile` pass takes its element-wise options from the GPU (`irc.target`); on
the interpreter, kernels are re-tiled for it after the `tile` pass (few
programs, large blocks: `irc.target.interpreter_tiling`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from irc.analysis.verifier import verify
from irc.dialects import loop, tile
from irc.gcpause import paused_gc
from irc.ir.value_names import set_value_name
from irc.passes.tile import set_tiling, tiling_of
from irc.pipeline import LOWERING, lowest_level, module_levels, run_pipeline
from irc.runtime.loader import (
    interpreted_triton_error,
    library_is_interpreted,
    load_source,
)
from irc.syntax.diagnostics import Diagnostic, IrcError
from irc.syntax.parser import parse_file
from irc.target import Target, cuda_target, interpreter_target

if TYPE_CHECKING:
    import torch

def lower_to_tile(
    module: ModuleOp,
    *,
    verify_each: bool = True,
    autotune: str | None = None,
    tf32: bool = False,
    target: Target | None = None,
    library_gemm: str = "never",
) -> ModuleOp:
    """Runs whatever part of the lowering the module still needs (in place).

    `target` sets the `tile` pass's options (the portable default without one).
    With `autotune` set to a device ("cuda"), every kernel's tiling is measured
    and chosen there before the loop-to-tile step. `library_gemm` says which
    GEMM kernels run on the vendor's library (`library-gemm`):
    "never", "always" (every one it can take) or "cuda" (those measured faster
    on the GPU, `irc.library_choice`).

    The passes after `tile` are verified once, after the last of them, not after
    each (`verify_each`): a verification of a 10,000-op graph's tile kernels
    costs 1-1.6 s on an H100 host's CPU, and four more of them would add a
    quarter to its compile time.
    """
    level = lowest_level(module)
    if level == "tile":
        return module
    passes = list(LOWERING[0 if level == "graph" else LOWERING.index("graph-to-loop") + 1 :])
    tiled = passes.index("tile") + 1
    if tf32:  # one TF32 product: no operand is split into parts for three
        passes.remove("split-tf32-gemm-operands")
        passes[passes.index("loop-to-tile")] += "{tf32=true}"
        tiled -= 1
    if target is not None:
        passes[tiled - 1] = target.tile_pass()
        passes[passes.index("split-reduction")] = target.split_pass()
        passes[passes.index("split-k")] = target.split_k_pass()
        if not tf32:
            passes[passes.index("split-tf32-gemm-operands")] = target.split_tf32_pass()
    # A loop-level input's tilings are the user's (the IR shows them so that they can
    # be written by hand): kept, where the tile pass and the interpreter's re-tiling
    # would choose their own. Kernels that come without one are tiled.
    written = {k: tiling_of(k) for k in loop.kernels(module) if k.block is not None}
    # The library's GEMMs are chosen before `pad-gemm-operands`: the library wants its
    # operands padded otherwise (zeros along K: `library-gemm`'s own copies), and irc's
    # kernel is timed with the copies it would read.
    chosen = passes.index("pad-gemm-operands") if "pad-gemm-operands" in passes else tiled - 1
    run_pipeline(module, ",".join(passes[:chosen]), verify_each=verify_each)
    # (a hand-written tiling is the user's choice of irc's kernel)
    if library_gemm == "always":
        from irc.library_choice import move_every_gemm

        move_every_gemm(module, skip=set(written), f32=not tf32)
    elif library_gemm == "cuda":
        from irc.library_choice import choose_library_gemms

        def lower(variant: ModuleOp, on: Target) -> None:
            lower_to_tile(variant, verify_each=False, tf32=tf32, target=on)

        choose_library_gemms(
            module, target or Target(), skip=set(written), lower=lower, f32=not tf32
        )
    run_pipeline(module, ",".join(passes[chosen:tiled]), verify_each=verify_each)
    if target is not None:
        target.retile(module)
    for kernel, tiling in written.items():
        if kernel.parent is not None:  # split-reduction may have replaced it
            set_tiling(kernel, tiling)
    if autotune is not None:
        from irc.autotune import autotune_module

        autotune_module(module, autotune)
    after_tiling = ",".join(passes[tiled:])
    run_pipeline(module, after_tiling, verify_each=False)
    if verify_each:
        verify(module, context=after_tiling)
    return module


def triton_source(
    module: ModuleOp,
    source: str = "irc",
    autotune: str | None = None,
    tf32: bool = False,
    target: Target | None = None,
    library_gemm: str = "never",
) -> str:
    """The Triton Python module for `module` (lowered first when needed)."""
    from irc.lowering.tile_to_triton import emit_triton

    lower_to_tile(module, autotune=autotune, tf32=tf32, target=target, library_gemm=library_gemm)
    with paused_gc():
        return emit_triton(module, "".join(c if c.isprintable() else "?" for c in source))


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: object) -> str:
    """`"cpu"` or `"cuda"` for `compile`'s `device`, checked before any work.

    Anything else would compile and fail only at the first call (Triton's "0
    active drivers"), or fail inside torch with a bare AssertionError.
    """
    import torch

    if device is None:
        return default_device()
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(
                f'irc.compile: unknown device {device!r}; irc runs on "cpu" or "cuda"'
            ) from None
    else:
        raise TypeError(
            'irc.compile: device is "cpu", "cuda" or a torch.device, '
            f"got {type(device).__name__}"
        )
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f'irc.compile: irc runs on "cpu" or "cuda", not {str(parsed)!r}')
    if parsed.index is not None:
        raise ValueError(
            f"irc.compile: irc runs on the current {parsed.type} device; pass "
            f'device="{parsed.type}", not {str(parsed)!r} (torch.cuda.set_device picks the GPU)'
        )
    if parsed.type == "cuda":
        if library_is_interpreted():
            raise interpreted_triton_error(parsed.type)
        if not torch.cuda.is_available():
            why = (
                "this PyTorch build has no CUDA support"
                if torch.version.cuda is None
                else "PyTorch finds no CUDA device"
            )
            raise IrcError(Diagnostic(None, f'device="cuda": {why}; use device="cpu"'))
    return parsed.type


LIBRARY_GEMM_CHOICES = ("measured", "never", "always")

_MISSING = object()


class GraphedFunction:
    """Replays a CUDA graph of a host function: one launch for all its kernels.

    A graph is captured the first time the function sees a set of input
    tensors (their addresses, shapes and dtypes) and replayed on later calls
    with the same inputs, which is what makes tiny functions cheap to call.
    As with `torch.compile(mode="reduce-overhead")`, the outputs live in the
    graph's memory: the next call with the same inputs overwrites them.
    At most `MAX_GRAPHS` input sets are kept (least recently used go).
    """

    MAX_GRAPHS = 8

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.graphs: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            key = tuple((a.data_ptr(), a.shape, a.dtype) for a in args)
            key += tuple((k, a.data_ptr(), a.shape, a.dtype) for k, a in kwargs.items())
        except AttributeError:  # not tensors: the function itself says what is wrong
            return self.fn(*args, **kwargs)
        entry = self.graphs.pop(key, None)
        if entry is None:
            entry = self._capture(args, kwargs)
        self.graphs[key] = entry  # most recently used last
        if len(self.graphs) > self.MAX_GRAPHS:
            del self.graphs[next(iter(self.graphs))]
        graph, outputs = entry
        graph.replay()
        return outputs

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(*args, **kwargs)  # compiles the kernels and warms the fast launch path
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.fn(*args, **kwargs)
        return graph, outputs


class CompiledModule:
    """The compiled functions of one IR module, callable on torch tensors.

    `compiled.softmax(x)` or `compiled["softmax"](x)` (for names that are not
    Python identifiers, like `@def-1`, or that `CompiledModule` itself uses,
    like `@run`). Arguments go by position or by their IR names, `f(x=t)` or
    `f(**{"x.y": t})`, and wrong calls are reported with the IR's names
    (`irc.runtime.binding`). Every function returns a tensor, or a tuple of
    tensors when it has several results.
    """

    def __init__(
        self,
        source: str,
        device: str,
        kernels: int,
        module: ModuleOp,
        cuda_graphs: bool = False,
        target: Target | None = None,
    ):
        self.source = source
        self.device = device
        self.target = target or Target()  # the tile pass's options, and why
        self.kernel_count = kernels
        self.module = module
        self._py = load_source(source, device)
        self.functions: dict[str, Callable[..., Any]] = dict(self._py.FUNCTIONS)
        if cuda_graphs:
            self.functions = {k: GraphedFunction(f) for k, f in self.functions.items()}
        self.path = self._py.__file__

    def __getitem__(self, name: str) -> Callable[..., Any]:
        name = name.removeprefix("@")
        try:
            return self.functions[name]
        except KeyError:
            raise KeyError(f"no function @{name} (functions: {self._known()})") from None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        functions = self.__dict__.get("functions")
        if functions is None or name.startswith("__"):
            raise AttributeError(name)  # not built yet (copy, pickle) or a protocol probe
        if name in functions:
            return functions[name]
        raise AttributeError(
            f"the compiled module has no function @{name} (its functions: {self._known()})",
            name=name,
            obj=self,
        )

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(n for n in self.functions if n.isidentifier())})

    def _known(self) -> str:
        return ", ".join(f"@{n}" for n in self.functions) or "none"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(self.functions) != 1:
            raise TypeError(
                f"the module has several functions ({self._known()}): call one by name"
            )
        return next(iter(self.functions.values()))(*args, **kwargs)

    def run(self, name: str, inputs: Sequence[Any]) -> list[Any]:
        """Calls `name` and always returns a list of outputs."""
        out = self[name](*inputs)
        return list(out) if isinstance(out, tuple) else [out]


def compile(
    program: str | os.PathLike[str] | ModuleOp | Any,
    example_inputs: Any = None,
    *,
    example_kwargs: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    fuse: bool = True,
    autotune: bool = False,
    tf32: bool = False,
    cuda_graphs: bool = False,
    library_gemm: str = "measured",
) -> CompiledModule:
    """Compiles a `.ir` file (path) or a parsed module (copied, not changed).

    `autotune` measures block sizes, warps and stages of every kernel on the GPU
    (cached on disk); it needs `device="cuda"`. `tf32` makes f32 GEMMs one TF32
    tensor-core product (10 bits of mantissa); by default they are three TF32
    products of split operands, to f32's accuracy as torch's are (docs/lowering.md).
    `cuda_graphs` replays each function as one CUDA graph (see `GraphedFunction`:
    outputs are reused by the next call with the same inputs).
    `device` is "cpu", "cuda" or a torch.device of either (default: CUDA when
    torch has it); it is checked before anything is compiled.
    `library_gemm` says which bf16, f16 and f32 GEMMs run on cuBLAS (through
    `torch.matmul`; f32 in f32, not TF32), their epilogue as an irc kernel:
    "measured" (on a CUDA GPU, those timed faster than irc's fused kernel:
    `irc.library_choice`), "never" or "always" (every one `library-gemm` can take,
    also on the CPU).

    An `nn.Module` or a function with `example_inputs` (a tuple of its
    arguments; keyword arguments in `example_kwargs`) is captured with
    torch.export and its ATen graph compiled
    (`irc.pytorch`, docs/pytorch.md): the result is called as the module is,
    and its `.report` lists the ops left to eager.
    """
    if not isinstance(program, str | os.PathLike | ModuleOp):
        from irc.pytorch.export import compile_torch

        def compile_graph(module: ModuleOp, on: str) -> CompiledModule:
            return compile(module, device=on, fuse=fuse, autotune=autotune, tf32=tf32,
                           cuda_graphs=cuda_graphs, library_gemm=library_gemm)  # fmt: skip

        return compile_torch(
            program, example_inputs, compile_graph,
            device=None if device is None else resolve_device(device),
            example_kwargs=example_kwargs,
        )  # type: ignore[return-value]  # fmt: skip
    if library_gemm not in LIBRARY_GEMM_CHOICES:
        raise ValueError(
            f"irc.compile: library_gemm is one of {', '.join(map(repr, LIBRARY_GEMM_CHOICES))}, "
            f"got {library_gemm!r}"
        )
    if example_inputs is not None or example_kwargs is not None:
        raise TypeError("irc.compile: example_inputs go with an nn.Module or a function, not .ir")
    device = resolve_device(device)
    if isinstance(program, ModuleOp):
        # xDSL's clone re-validates name hints and rejects the spec's `%0`: copy them as set.
        mapping: dict[SSAValue, SSAValue] = {}
        module = program.clone(value_mapper=mapping, clone_name_hints=False)
        for old, new in mapping.items():
            if old.name_hint is not None:
                set_value_name(new, old.name_hint)
        source = "a module"
        verify(module)
    else:
        module, _ = parse_file(os.fspath(program))
        source = os.fspath(program)
        verify(module)
    if fuse and "graph" in module_levels(module):  # lower levels are past fusion
        run_pipeline(module, "fuse")
    if autotune and device != "cuda":
        raise IrcError(
            Diagnostic(None, "autotuning measures kernels on a CUDA GPU; none is in use")
        )
    if cuda_graphs and device != "cuda":
        raise IrcError(Diagnostic(None, "CUDA graphs need a CUDA GPU; none is in use"))
    target = cuda_target() if device == "cuda" else interpreter_target()
    measured = "cuda" if device == "cuda" else "never"
    library = {"measured": measured, "never": "never", "always": "always"}[library_gemm]
    text = triton_source(
        module, source, autotune=device if autotune else None, tf32=tf32, target=target,
        library_gemm=library,
    )  # fmt: skip
    kernels = len(tile.kernels(module))
    return CompiledModule(text, device, kernels, module, cuda_graphs, target)
