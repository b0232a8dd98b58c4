"""`torch.compile(model, backend="irc")`: a dynamo backend on aot_autograd.

Dynamo hands each captured graph to aot_autograd, which traces it to ATen with
irc's decomposition table and gives the inference graph (or, in training,
the forward and backward graphs) to irc's compiler: islands compiled by irc,
the rest eager (irc/pytorch/islands.py), as a boxed callable. Shapes are
static: a graph with a symbolic size runs in eager, with a one-line warning.

The backend is registered under "irc" by the `torch_dynamo_backends` entry
point (pyproject.toml); `register()` does it by hand for an uninstalled tree.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from irc.pytorch.decompositions import SDPA_CALLS, attention_or_sdpa, irc_decompositions
from irc.pytorch.islands import EagerReport, log_report, partition_and_compile, symbolic_reason

REPORTS: list[EagerReport] = []
"""One report per graph irc compiled, newest last (see `last_report`)."""


def last_report() -> EagerReport | None:
    return REPORTS[-1] if REPORTS else None


def _compile_module(module: Any, device: str) -> Any:
    from irc.compiler import compile

    return compile(module, device=device)


def _device(example_inputs: list[Any]) -> str:
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    return "cuda" if cuda else "cpu"


def irc_graph_compiler(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """aot_autograd's compiler: a boxed callable running `gm` with irc islands."""
    from functorch.compile import make_boxed_func

    reason = symbolic_reason(gm) or next(
        (f"input {i} is {a}" for i, a in enumerate(example_inputs)
         if isinstance(a, torch.SymInt | torch.SymFloat)),
        None,
    )  # fmt: skip
    if reason is not None:
        report = EagerReport(fallback=f"symbolic size: {reason}; irc compiles static shapes")
        REPORTS.append(report)
        warnings.warn(f"irc: this graph runs in eager: symbolic size ({reason}); "
                      "irc compiles static shapes", stacklevel=2)  # fmt: skip
        return make_boxed_func(gm.forward)
    fused, report = partition_and_compile(gm, _compile_module, _device(example_inputs), "graph")
    REPORTS.append(report)
    log_report(report)
    return make_boxed_func(fused.forward)


def aot_backend(graph_compiler: Callable[[fx.GraphModule, list[Any]], Any]) -> Any:
    """A dynamo backend: aot_autograd with irc's decompositions and `graph_compiler`.

    SDPA calls in dynamo's graph become irc's attention decomposition first
    (irc/pytorch/decompositions.py), as torch.export's capture gets it."""
    from torch._dynamo.backends.common import aot_autograd

    def backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in SDPA_CALLS:
                node.target = attention_or_sdpa
        gm.recompile()
        aot = aot_autograd(
            fw_compiler=graph_compiler,
            inference_compiler=graph_compiler,
            bw_compiler=graph_compiler,
            decompositions=irc_decompositions(),
        )
        return aot(gm, example_inputs, **kwargs)

    return backend


def irc_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The dynamo backend "irc": ATen graphs compiled by `irc_graph_compiler`."""
    return aot_backend(irc_graph_compiler)(gm, example_inputs, **kwargs)


def register() -> None:
    """Registers the backend as "irc" (once; the entry point does it when installed)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "irc" not in _COMPILER_FNS:
        register_backend(compiler_fn=irc_backend, name="irc")
