"""`irc.compile(module, example_inputs)` and `irc.export_ir`: capture with torch.export.

The module is captured by `torch.export.export(...).run_decompositions(table)`.
Parameters, buffers and constants stay arguments of the compiled graph, read
from the module at each call, so a weight update needs no recompile. The
returned callable takes the module's own arguments and returns what it
returns; inputs are checked against the example's shapes, dtypes and device
(irc compiles static shapes), and made contiguous at the islands' boundary.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from irc.pytorch.decompositions import irc_decompositions
from irc.pytorch.emitter import Unsupported
from irc.pytorch.importer import IGNORED, import_graph, op_name
from irc.pytorch.islands import (
    CompileModule,
    EagerReport,
    log_report,
    partition_and_compile,
)
from irc.pytorch.types import fake_of


class _FunctionModule(torch.nn.Module):
    """A plain callable as a module, which torch.export needs."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def as_module(module_or_fn: Any) -> torch.nn.Module:
    if isinstance(module_or_fn, torch.nn.Module):
        return module_or_fn
    if callable(module_or_fn):
        return _FunctionModule(module_or_fn)
    raise TypeError(
        f"irc.compile takes a .ir path, a parsed module, an nn.Module or a function; "
        f"got {type(module_or_fn).__name__}"
    )


def capture(
    module: torch.nn.Module, example_inputs: Sequence[Any], example_kwargs: dict[str, Any] | None
) -> torch.export.ExportedProgram:
    """The module as a core-ATen graph with irc's decomposition table."""
    if not isinstance(example_inputs, tuple | list):
        example_inputs = (example_inputs,)
    ep = torch.export.export(module, tuple(example_inputs), kwargs=example_kwargs or None)
    return ep.run_decompositions(irc_decompositions())


def _state(
    module: torch.nn.Module, ep: torch.export.ExportedProgram, device: str
) -> list[Callable[[], Any]]:
    """Readers of the graph's non-user inputs, by their place in the signature: the live
    parameters and buffers (a weight updated in place or reassigned is seen at once),
    and the lifted constants, a 0-dim one moved to `device` once (`x[:, 0] = 0.5`
    exports 0.5 as a CPU tensor, which eager takes beside CUDA tensors as a scalar)."""
    from torch.export.graph_signature import InputKind

    readers: list[Callable[[], Any]] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        target = spec.target
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            readers.append(lambda t=target: _live_tensor(module, t))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            constant = ep.constants[target]
            if isinstance(constant, torch.Tensor) and constant.dim() == 0:
                constant = constant.to(device)
            readers.append(lambda c=constant: c)
        else:
            raise Unsupported(f"input {spec.arg.name} of kind {spec.kind.name}")
    return readers


def _live_tensor(module: torch.nn.Module, target: str) -> torch.Tensor:
    """The module's parameter or buffer `target` as it is now."""
    owner, _, leaf = target.rpartition(".")
    sub = module.get_submodule(owner) if owner else module
    found = sub._parameters.get(leaf)
    return found if found is not None else sub._buffers[leaf]  # type: ignore[return-value]


class CompiledTorchModule:
    """The compiled module: call it as the module; `.report` lists what ran in eager."""

    def __init__(
        self,
        module: torch.nn.Module,
        ep: torch.export.ExportedProgram,
        graph_module: fx.GraphModule,
        report: EagerReport,
        device: str,
    ):
        from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

        self.module = module
        self.exported = ep
        self.graph_module = graph_module
        self.report = report
        self._state = _state(module, ep, device)
        self._in_spec = ep.call_spec.in_spec
        self._out_spec = ep.call_spec.out_spec
        placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
        user = [
            (spec, p)
            for spec, p in zip(ep.graph_signature.input_specs, placeholders, strict=True)
            if spec.kind == InputKind.USER_INPUT
        ]
        names = _argument_names(module, [spec.arg.name for spec, _ in user])
        self._expected = [(name, fake_of(p)) for name, (_, p) in zip(names, user, strict=True)]
        self._constants = {
            i: spec.arg.value
            for i, (spec, _) in enumerate(user)
            if isinstance(spec.arg, ConstantArgument)
        }
        """Python numbers (and None) among the inputs: torch.export bakes them in."""
        self._warned_no_grad = False
        user_inputs = [spec.arg.name for spec, _ in user]
        self._mutations: list[tuple[int, str, int | None]] = []
        for i, out in enumerate(ep.graph_signature.output_specs):
            if out.kind == OutputKind.BUFFER_MUTATION:
                self._mutations.append((i, out.target, None))
            elif out.kind == OutputKind.USER_INPUT_MUTATION:
                self._mutations.append((i, out.target, user_inputs.index(out.target)))
            elif out.kind != OutputKind.USER_OUTPUT:
                raise Unsupported(f"output {out.arg} of kind {out.kind.name}")
        self._written_back = {i for i, _, _ in self._mutations}
        """Outputs that are in-place writes, not the user's results."""

    def _wants_grad(self, flat: list[Any]) -> bool:
        """Whether eager would have recorded a gradient for this call."""
        return _requires_grad(flat) or _requires_grad(read() for read in self._state)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            names = ", ".join(name for name, _ in self._expected)
            given = ", ".join(type(a).__name__ for a in args)
            given += "".join(f", {k}={type(v).__name__}" for k, v in kwargs.items())
            raise TypeError(
                f"irc.compile: the module was compiled for the arguments ({names}) as the "
                f"example gave them; got ({given})"
            )
        if not self._warned_no_grad and torch.is_grad_enabled() and self._wants_grad(flat):
            self._warned_no_grad = True
            warnings.warn(
                "irc.compile compiles the inference graph: its outputs carry no gradient. "
                "Call it under torch.no_grad() (or torch.inference_mode()), or train with "
                'torch.compile(model, backend="irc")',
                stacklevel=2,
            )
        for i, ((name, want), got) in enumerate(zip(self._expected, flat, strict=True)):
            if i in self._constants:
                check_constant(name, self._constants[i], got)
            else:
                check_input(name, want, got)
        outputs = self.graph_module(*(read() for read in self._state), *flat)
        outputs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
        for i, target, user_input in self._mutations:  # what eager writes in place
            written = self.module.get_buffer(target) if user_input is None else flat[user_input]
            written.copy_(outputs[i])
        user = [o for i, o in enumerate(outputs) if i not in self._written_back]
        return pytree.tree_unflatten(user, self._out_spec)


def _requires_grad(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def _argument_names(module: torch.nn.Module, names: list[str]) -> list[str]:
    """The inputs' names for errors: a plain function's own parameter names where
    torch.export saw `*args` of its wrapper (`args_1`)."""
    if not isinstance(module, _FunctionModule):
        return names
    try:
        params = [
            p.name
            for p in inspect.signature(module.fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):  # a builtin or C function: no signature
        return names
    out = []
    for name in names:
        index = name.removeprefix("args_")
        out.append(params[int(index)] if index.isdigit() and int(index) < len(params) else name)
    return out


def check_constant(name: str, want: Any, got: Any) -> None:
    """A clear error for a Python number other than the example's: the graph holds
    the example's value (it would be silently used)."""
    if type(got) is not type(want) or not (got == want or got != got and want != want):
        raise ValueError(
            f"irc.compile: input {name} is {got!r}, compiled for {want!r} (Python numbers "
            "are constants of the compiled graph: compile again with this value)"
        )


def check_input(name: str, want: torch.Tensor | None, got: Any) -> None:
    """A clear error for an input the compiled graph was not made for."""
    if want is None:
        return
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"irc.compile: input {name} must be a tensor, got {type(got).__name__}")
    problems = []
    if tuple(got.shape) != tuple(want.shape):
        problems.append(f"shape {list(got.shape)}, compiled for {list(want.shape)}")
    if got.dtype != want.dtype:
        problems.append(f"dtype {got.dtype}, compiled for {want.dtype}")
    if got.device.type != want.device.type:
        problems.append(f"device {got.device}, compiled for {want.device}")
    if problems:
        raise ValueError(
            f"irc.compile: input {name} has " + "; ".join(problems)
            + " (shapes are static: compile again with an example of this input)"
        )


def compile_torch(
    module_or_fn: Any,
    example_inputs: Sequence[Any] | Any,
    compile_module: CompileModule,
    device: str | None = None,
    example_kwargs: dict[str, Any] | None = None,
) -> CompiledTorchModule:
    """Captures `module_or_fn` on `example_inputs` and compiles its irc islands."""
    module = as_module(module_or_fn)
    if example_inputs is None:
        raise TypeError("irc.compile of a module or function needs example_inputs")
    ep = capture(module, example_inputs, example_kwargs)
    device = device or _device_of(example_inputs)
    gm = fx.GraphModule(ep.graph_module, ep.graph_module.graph)
    fused, report = partition_and_compile(gm, compile_module, device, _stem(module_or_fn))
    log_report(report)
    return CompiledTorchModule(module, ep, fused, report, device)


def _device_of(example_inputs: Any) -> str:
    flat, _ = pytree.tree_flatten(example_inputs)
    return "cuda" if any(isinstance(t, torch.Tensor) and t.is_cuda for t in flat) else "cpu"


def _stem(module_or_fn: Any) -> str:
    if isinstance(module_or_fn, torch.nn.Module) and not isinstance(module_or_fn, _FunctionModule):
        return type(module_or_fn).__name__
    return getattr(module_or_fn, "__name__", "fn")


def export_text(
    module_or_fn: Any, example_inputs: Sequence[Any] | Any, name: str | None = None
) -> str:
    """The captured graph as `.ir` text: one function, or one an irc island when
    some ops have no graph op yet (a comment at the top lists them)."""
    module = as_module(module_or_fn)
    return exported_text(capture(module, example_inputs, None), name or _stem(module_or_fn))


def exported_text(ep: torch.export.ExportedProgram, name: str) -> str:
    """export_text of a captured program."""
    from irc.syntax.printer import print_module

    graph = ep.graph
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and 0 in val.shape:
            raise ValueError(
                f"input {node.name} is empty ({list(val.shape)}): a .ir file's dimensions "
                "are positive; export with a non-empty example (irc.compile takes it as is)"
            )
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in IGNORED and not node.users:
            graph.erase_node(node)
    try:
        return print_module(import_graph(graph, name))
    except Unsupported:
        pass
    gm = fx.GraphModule(ep.graph_module, graph)
    texts: list[str] = []
    report = EagerReport()

    def keep(ir_module: Any, device: str) -> Any:
        texts.append(print_module(ir_module))
        return _Printed()

    _, report = partition_and_compile(gm, keep, "cpu", name)
    header = [
        f"// {name}: {report.islands} irc islands; between them these ops run in eager",
        "// (no graph op for them yet):",
        *(f"//   {op} x{count}: {report.reasons.get(op, '')}" for op, count in
          sorted(report.eager_ops.items())),  # fmt: skip
    ]
    return "\n".join(header) + "\n\n" + "\n".join(texts)


class _Printed:
    """What export_text's stand-in compiler returns: nothing to run."""

    functions = {"printed": lambda *a: None}
    kernel_count = 0


def export_ir(
    module_or_fn: Any,
    example_inputs: Sequence[Any] | Any,
    path: str | os.PathLike[str],
    name: str | None = None,
) -> str:
    """Writes the captured module as a readable `.ir` file and returns its text."""
    text = export_text(module_or_fn, example_inputs, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


__all__ = ["CompiledTorchModule", "compile_torch", "export_ir", "export_text", "op_name"]
