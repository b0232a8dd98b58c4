"""Whole transformer blocks: a GPT-2 (nanoGPT) block and a Llama block, forward.

Rows: eager, torch.compile (Inductor), torch.compile(backend="irc") and
irc.compile, with time (the rows of a block timed in turns), the GPU time of a
call as a CUDA graph replayed ("graph ms": no host, no launch counted twice),
the summed durations of a call's kernels and their launches (torch.profiler),
cold compile time and the largest difference from eager.

    python benchmarks/blocks.py                  # on a GPU: B=8 T=1024 d=768, bf16 and f32
    python benchmarks/blocks.py --smoke          # tiny sizes, CPU (Triton's interpreter)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (benchmarks/ is not a package: the harness beside this file)


@dataclass(frozen=True)
class BlockConfig:
    """The shape of one block (the GPU run: GPT-2 small's width, 12 heads)."""

    d_model: int = 768
    n_head: int = 12
    n_kv_head: int = 4
    seq_len: int = 1024
    hidden: int = 0
    """The Llama MLP's hidden width (0: 8/3 d rounded up to a multiple of 64)."""

    def mlp_hidden(self) -> int:
        if self.hidden:
            return self.hidden
        return (8 * self.d_model // 3 + 63) // 64 * 64


# --- GPT-2 (nanoGPT) ---------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPT2Block(nn.Module):
    """nanoGPT's Block: pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# --- Llama -------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv_heads, T, hd] -> [B, kv_heads * n_rep, T, hd], as Hugging Face's Llama."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.d_model // cfg.n_head
        d, hd = cfg.d_model, self.head_dim
        self.q_proj = nn.Linear(d, cfg.n_head * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * hd, d, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(cfg.seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # The rotary cache: computed once, a buffer (not a parameter).
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        cos = self.cos_cached[:T].to(x.dtype)
        sin = self.sin_cached[:T].to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.n_head // self.n_kv_head
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.head_dim)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        h = cfg.mlp_hidden()
        self.gate_proj = nn.Linear(cfg.d_model, h, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, h, bias=False)
        self.down_proj = nn.Linear(h, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """A Llama decoder layer: RMSNorm, rotary GQA attention, SwiGLU MLP."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


BLOCKS: dict[str, type[nn.Module]] = {"gpt2": GPT2Block, "llama": LlamaBlock}


# --- the benchmark -----------------------------------------------------------

ROWS = ("eager", "inductor", "irc-dynamo", "irc-compile")
"""eager; torch.compile (Inductor, default mode); torch.compile(backend="irc");
irc.compile(module, example_inputs)."""

TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 6e-2}
"""Largest difference from eager allowed, relative to eager's largest magnitude."""


def _make(row: str, model: nn.Module, x: torch.Tensor) -> Any:
    if row == "eager":
        return model
    if row == "inductor":
        return torch.compile(model)
    if row == "irc-dynamo":
        return torch.compile(model, backend="irc")
    import irc

    return irc.compile(model, (x,))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _times_ms(fns: dict[str, Callable[[], Any]], device: str, smoke: bool) -> dict[str, float]:
    """Wall time of a call of each, taken in turns on a GPU (bench.py's
    interleaved medians: one row timed after another saw a different clock, and
    single do_bench runs of these blocks differed by 2x between runs)."""
    if device == "cuda":
        for fn in fns.values():  # after other rows' dynamo resets: recompile now, untimed
            fn()
        torch.cuda.synchronize()
        return bench.interleaved_medians(fns, rounds=6)
    runs = 2 if smoke else 10
    out = {}
    for name, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        out[name] = (time.perf_counter() - t0) / runs * 1e3
    return out


def _kernel_ms(fn: Callable[[], Any], device: str) -> float | None:
    """GPU time of one call's kernels, summed (torch.profiler); None on the CPU. Not
    what a caller waits for (launch gaps and host work are left out): what the
    kernels themselves cost."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    calls = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / calls / 1e3


def _graph_ms(fns: dict[str, Callable[[], Any]], device: str) -> dict[str, float | None]:
    """GPU time of one call of each, as a CUDA graph of the call replayed back to back
    (do_bench medians, the rows in turns, the median of three rounds); None on the CPU
    or where the call cannot be captured. Unlike `_kernel_ms` it counts no launch
    twice: a kernel started early as a programmatic dependent of the one before it
    (irc's launches on Hopper) waits inside its own measured duration."""
    if device != "cuda":
        return dict.fromkeys(fns)
    from triton.testing import do_bench

    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    for name, fn in fns.items():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up off the default stream, as capture needs
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graphs[name] = graph
        except RuntimeError as e:  # a call that cannot be captured: no number, say why
            print(f"{name}: not timed as a CUDA graph ({str(e).splitlines()[0]})", flush=True)
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(3):
        for name, graph in graphs.items():
            times[name].append(do_bench(graph.replay, warmup=25, rep=100))
    return {name: sorted(times[name])[1] if name in times else None for name in fns}


def _launches(fn: Callable[[], Any], device: str) -> int | None:
    """CUDA kernels one call launches (torch.profiler); None on the CPU."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(
    block: str, dtype: torch.dtype, cfg: BlockConfig, batch: int, device: str,
    rows: Sequence[str], smoke: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """One table row per entry point for one block and dtype."""
    torch.manual_seed(0)
    model = BLOCKS[block](cfg).eval().to(device=device, dtype=dtype)
    x = torch.randn(batch, cfg.seq_len, cfg.d_model, device=device, dtype=dtype)
    out: list[dict[str, Any]] = []
    calls: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        want = model(x)
        scale = float(want.abs().max())
        for row in rows:
            torch._dynamo.reset()
            _sync(device)
            t0 = time.perf_counter()
            fn = _make(row, model, x)
            got = fn(x)  # the first call compiles (dynamo compiles lazily)
            _sync(device)
            cold = time.perf_counter() - t0
            err = float((got.float() - want.float()).abs().max()) / max(scale, 1e-6)
            report = getattr(fn, "report", None)
            if row == "irc-dynamo":
                from irc.pytorch.backend import last_report

                report = last_report()
            calls[row] = lambda fn=fn: fn(x)
            out.append({
                "block": block, "dtype": str(dtype).removeprefix("torch."), "row": row,
                "launches": _launches(calls[row], device),
                "kernel_ms": _kernel_ms(calls[row], device),
                "cold_s": cold if row != "eager" else None,
                "rel_err": err, "ok": err <= TOLERANCE[dtype],
                "eager_ops": sum(report.eager_ops.values()) if report is not None else None,
            })  # fmt: skip
        graph_ms = _graph_ms(calls, device)
        for r, ms in zip(out, _times_ms(calls, device, smoke).values(), strict=True):
            r["ms"] = ms
            r["graph_ms"] = graph_ms[r["row"]]
            print(format_row(r), flush=True)
    return out


HEADER = (
    f"{'block':<6} {'dtype':<9} {'row':<12} {'ms':>9} {'graph ms':>9} {'kernel ms':>9} "
    f"{'launches':>8} {'cold s':>7} {'rel err':>9} {'eager ops':>9}  ok"
)


def format_row(r: dict[str, Any]) -> str:
    def cell(v: Any, fmt: str, width: int) -> str:
        return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"

    return (
        f"{r['block']:<6} {r['dtype']:<9} {r['row']:<12} {cell(r['ms'], '.3f', 9)} "
        f"{cell(r['graph_ms'], '.3f', 9)} {cell(r['kernel_ms'], '.3f', 9)} {cell(r['launches'], 'd', 8)} {cell(r['cold_s'], '.1f', 7)} {r['rel_err']:>9.2e} "
        f"{cell(r['eager_ops'], 'd', 9)}  {'yes' if r['ok'] else 'NO'}"
    )


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| block | dtype | row | ms | graph ms | kernel ms | launches | cold compile s "
        "| rel. error | ops in eager |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cold = "-" if r["cold_s"] is None else f"{r['cold_s']:.1f}"
        kernel = "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.3f}"
        graph = "-" if r.get("graph_ms") is None else f"{r['graph_ms']:.3f}"
        lines.append(
            f"| {r['block']} | {r['dtype']} | {r['row']} | {r['ms']:.3f} | {graph} | {kernel} "
            f"| {r['launches'] or '-'} "
            f"| {cold} | {r['rel_err']:.1e} "
            f"| {'-' if r['eager_ops'] is None else r['eager_ops']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a test run)")
    ap.add_argument("--blocks", nargs="*", default=sorted(BLOCKS), choices=sorted(BLOCKS))
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "f32"], choices=["bf16", "f32"])
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=ROWS)
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--warm-caches", action="store_true",
                    help="keep Triton's, Inductor's and irc's caches (default: fresh, cold)")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.warm_caches:
        root = tempfile.mkdtemp(prefix="irc-blocks-")
        os.environ["TRITON_CACHE_DIR"] = f"{root}/triton"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
        os.environ["IRC_CACHE_DIR"] = f"{root}/irc"
    if args.smoke:
        cfg, batch, device = BlockConfig(d_model=32, n_head=4, n_kv_head=2, seq_len=8), 2, "cpu"
    else:
        if not torch.cuda.is_available():
            print("blocks: needs a CUDA GPU (or --smoke for a CPU run)", file=sys.stderr)
            return 1
        cfg, batch, device = BlockConfig(), 8, "cuda"
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    print(HEADER, flush=True)
    rows: list[dict[str, Any]] = []
    for block in args.blocks:
        for name in args.dtypes:
            rows += measure(block, dtypes[name], cfg, batch, device, args.rows, args.smoke)
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
