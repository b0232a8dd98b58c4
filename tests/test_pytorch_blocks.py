"""A GPT-2 (nanoGPT) block and a Llama block (RMSNorm, rotary embeddings with cached
cos/sin, GQA via repeat_kv, SwiGLU) through irc.compile and torch.compile(backend="irc"),
against eager at small sizes; and what of them is left to eager."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import irc
from irc.pytorch.backend import REPORTS
from irc.pytorch.export import capture
from irc.pytorch.importer import Support, op_name

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("irc_blocks", ROOT / "benchmarks" / "blocks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["irc_blocks"] = module
    spec.loader.exec_module(module)
    return module


blocks = _blocks()
CONFIG = blocks.BlockConfig(d_model=32, n_head=4, n_kv_head=2, seq_len=8, hidden=48)
NAMES = sorted(blocks.BLOCKS)


def _model(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    return blocks.BLOCKS[name](CONFIG).eval(), torch.randn(2, CONFIG.seq_len, CONFIG.d_model)


def _eager_ops(name: str) -> dict[str, str]:
    model, x = _model(name)
    ep = capture(model, (x,), None)
    support = Support()
    return {
        op_name(n): why
        for n in ep.graph.nodes
        if n.op == "call_function"
        and n.target is not torch.ops.aten._assert_tensor_metadata.default
        and (why := support.why_not(n)) is not None
    }


@pytest.mark.parametrize("name", NAMES)
def test_block_leaves_nothing_to_eager(name: str) -> None:
    assert _eager_ops(name) == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_block_through_irc_compile(name: str) -> None:
    model, x = _model(name)
    compiled = irc.compile(model, (x,))
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert compiled.report.eager_ops == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_block_through_torch_compile(name: str) -> None:
    model, x = _model(name)
    torch._dynamo.reset()
    before = len(REPORTS)
    with torch.no_grad():
        got: Any = torch.compile(model, backend="irc")(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(REPORTS) == before + 1
    assert REPORTS[-1].eager_ops == {}


@pytest.mark.slow
def test_llama_block_bf16() -> None:
    model, x = _model("llama")
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    got = irc.compile(model, (x,))(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, model(x), rtol=5e-2, atol=5e-2)


def test_llama_bf16_gemms_store_no_f32_value() -> None:
    """The residual sum before the second RMSNorm is stored in bf16 by the o_proj
    GEMM's epilogue; its f32 cast and square are computed by the norm's row kernel
    (irc/pytorch/sink_views.py), not stored in f32 by the GEMM."""
    from irc.pytorch.export import export_text

    model, x = _model("llama")
    text = export_text(model.to(torch.bfloat16), (x.to(torch.bfloat16),))
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    fused = [op for op in module.walk() if op.name == "graph.fused"]
    gemms = [op for op in fused if op.properties["kind"].data == "contraction"]  # type: ignore[attr-defined]
    assert gemms and all("f32" not in str(r.type) for op in gemms for r in op.results), (
        "a GEMM stores an f32 value"
    )
    norms = [
        op for op in fused
        if op.properties["kind"].data == "reduction"  # type: ignore[attr-defined]
        and any(inner.name == "graph.pow" for inner in op.walk())
    ]  # fmt: skip
    assert len(norms) == 2  # both RMSNorms square their input themselves


@pytest.mark.parametrize("name", NAMES)
def test_block_attention_is_one_fused_kernel(name: str) -> None:
    """SDPA is one graph.attention, and fused as one attention kernel."""
    from irc.pytorch.export import export_text

    model, x = _model(name)
    text = export_text(model, (x,))
    assert text.count("graph.attention") == 1
    module = irc.parse(text)
    irc.run_pipeline(module, "fuse")
    assert irc.print_module(module).count('kind = "attention"') == 1


@pytest.mark.parametrize("kind", ["float", "bool"])
def test_sdpa_with_a_mask_and_a_scale(kind: str) -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)

    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.randn(4, 4) if kind == "float" else (torch.rand(4, 4) < 0.5) | torch.eye(4, dtype=torch.bool)
    compiled = irc.compile(f, (q, k, v, mask))
    torch.testing.assert_close(compiled(q, k, v, mask), f(q, k, v, mask), rtol=1e-4, atol=1e-4)
    assert compiled.report.eager_ops == {}


@pytest.mark.parametrize("name", NAMES)
def test_dynamo_path_gets_the_same_attention_decomposition(name: str) -> None:
    """aot_autograd's ATen graph holds the fusable flow too: two bmm around a softmax,
    no row guard (torch's own decomposition adds an aten.any; on CUDA SDPA has none)."""
    from functorch.compile import make_boxed_func

    from irc.pytorch.backend import aot_backend

    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    model, x = _model(name)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=aot_backend(record))(x)
    (gm,) = graphs
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.bmm.default") == 2 and "aten._softmax.default" in targets
    assert not any("any" in t or "scaled_dot_product" in t for t in targets), targets


@pytest.mark.slow
def test_benchmark_smoke_run(tmp_path: Path) -> None:
    """benchmarks/blocks.py --smoke: every row runs and agrees with eager (tiny, CPU)."""
    table = tmp_path / "blocks.md"
    code = blocks.main([
        "--smoke", "--blocks", "gpt2", "--dtypes", "f32", "--rows", "eager", "irc-dynamo",
        "irc-compile", "--warm-caches", "--markdown", str(table),
    ])  # fmt: skip
    assert code == 0
    lines = table.read_text().splitlines()
    assert len(lines) == 2 + 3 and all("| gpt2 | float32 |" in line for line in lines[2:])
    assert all(line.endswith("| 0 |") for line in lines[3:])  # no op left to eager
    # GPU time by CUDA-graph replay: a column of its own, empty without a GPU.
    assert "| ms | graph ms | kernel ms |" in lines[0]
    assert all(line.split("|")[5].strip() == "-" for line in lines[2:])
