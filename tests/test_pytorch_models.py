"""Models other than the benchmark's two blocks, written as their authors write them,
through both entry points against eager (CPU, Triton's interpreter): a BERT layer
with an additive padding mask and a [CLS] pooler, a T5 layer with bucketed
relative-position biases, and a Mistral-style block (sliding-window mask from
`arange` comparisons, a KV cache, `repeat_interleave` for grouped-query
attention, rotary embeddings indexed by position), a Swin window attention (views
and six-dimensional permutes around it) and an MLP-Mixer block in bf16 (token
mixing through transposes). None leaves an op to eager."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import irc

torch.manual_seed(0)


class Bert(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.pool = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias, -1) @ v
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
        x = self.ln2(x + self.down(F.gelu(self.up(x))))
        return x, torch.tanh(self.pool(x[:, 0]))


def relative_bucket(rel: torch.Tensor, buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bidirectional relative-position buckets, as Hugging Face writes them."""
    buckets //= 2
    out = (rel > 0).to(torch.long) * buckets
    n = torch.abs(rel)
    exact = buckets // 2
    large = exact + (
        torch.log(n.float() / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(n < exact, n, large)


class T5(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.rel = nn.Embedding(32, heads)
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.wi, self.wo = nn.Linear(d, 64, bias=False), nn.Linear(64, d, bias=False)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        rel = torch.arange(t)[None, :] - torch.arange(t)[:, None]
        bias = self.rel(relative_bucket(rel)).permute(2, 0, 1)[None]
        a = torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.wo(F.relu(self.wi(self.norm(x))))


class Mistral(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, kv_heads: int = 2, window: int = 3) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.window = heads, kv_heads, window
        hd = d // heads
        self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.k, self.v = nn.Linear(d, kv_heads * hd, bias=False), nn.Linear(d, kv_heads * hd, bias=False)
        self.w = nn.Parameter(torch.ones(d))
        self.gate_up, self.down = nn.Linear(d, 128, bias=False), nn.Linear(64, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(64).float(), inv)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.w

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, -1)
        return torch.cat((-x2, x1), -1)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> Any:
        b, t, d = x.shape
        hd, past = d // self.heads, past_k.shape[2]
        h = self.norm(x)
        q = self.q(h).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        pos = torch.arange(past, past + t).unsqueeze(0)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        q, k = q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        groups = self.heads // self.kv_heads
        keys, values = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        i = torch.arange(t)[:, None] + past
        j = torch.arange(keys.shape[2])[None, :]
        allowed = (j <= i) & (j > i - self.window)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        a = F.softmax(scores.float(), -1).type_as(q) @ values
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.norm(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up), k, v


class Swin(nn.Module):
    def __init__(self, c: int = 16, window: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.window, self.heads = window, heads
        self.qkv, self.proj, self.norm = nn.Linear(c, 3 * c), nn.Linear(c, c), nn.LayerNorm(c)
        self.bias = nn.Parameter(torch.randn(heads, window**2, window**2) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # B, H, W, C
        b, h, w, c = x.shape
        s = self.window
        win = self.norm(x).view(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        qkv = self.qkv(win).reshape(win.shape[0], s * s, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = ((q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1) + self.bias.unsqueeze(0)).softmax(-1)
        o = self.proj((a @ v).transpose(1, 2).reshape(-1, s * s, c))
        return x + o.view(b, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


class Mixer(nn.Module):
    def __init__(self, tokens: int = 12, c: int = 16) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.tokens = nn.Sequential(nn.Linear(tokens, 24), nn.GELU(), nn.Linear(24, tokens))
        self.channels = nn.Sequential(nn.Linear(c, 32), nn.GELU(approximate="tanh"), nn.Linear(32, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return (x + self.channels(self.n2(x))).mean(1)


MODELS = {
    "bert": lambda: (Bert(), (torch.randn(2, 8, 32), torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))),
    "t5": lambda: (T5(), (torch.randn(2, 40, 32),)),
    "mistral": lambda: (Mistral(), (torch.randn(2, 5, 32), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8))),
    "swin": lambda: (Swin(), (torch.randn(2, 8, 8, 16),)),
    "mixer_bf16": lambda: (Mixer().bfloat16(), (torch.randn(3, 12, 16).bfloat16(),)),
}


def _close(got: Any, want: Any, exact: Any = None) -> None:
    """f32 within 1e-4 of eager; bf16 within assert_close's bf16 defaults of eager,
    or no further from the f64 model (`exact`) than 4 times eager's own distance."""
    if isinstance(want, tuple | list):
        assert isinstance(got, tuple | list) and len(got) == len(want)
        exacts = exact if exact is not None else [None] * len(want)
        for g, w, x in zip(got, want, exacts, strict=True):
            _close(g, w, x)
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype != torch.bfloat16:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        return
    try:
        torch.testing.assert_close(got, want)
    except AssertionError:
        assert exact is not None
        mine = (got.double() - exact).abs().max().item()
        eagers = (want.double() - exact).abs().max().item()
        assert mine <= 4 * eagers, (mine, eagers)


def _in_f64(model: nn.Module, args: tuple[Any, ...]) -> Any:
    """The model's outputs computed in f64 (for bf16 models), else None."""
    if not any(a.dtype == torch.bfloat16 for a in args):
        return None
    wide = copy.deepcopy(model).double()
    return wide(*(a.double() if a.is_floating_point() else a for a in args))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_through_irc_compile_leaves_nothing_to_eager(name: str) -> None:
    model, args = MODELS[name]()
    model = model.eval()
    with torch.no_grad():
        compiled = irc.compile(model, args)
        assert compiled.report.eager_ops == {}, compiled.report
        _close(compiled(*args), model(*args), _in_f64(model, args))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_through_torch_compile(name: str) -> None:
    model, args = MODELS[name]()
    model = model.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        _close(torch.compile(model, backend="irc")(*args), model(*args), _in_f64(model, args))


def test_an_empty_kv_cache_is_taken_and_an_empty_input_is_not_exported(tmp_path: Any) -> None:
    """The first step of generation: the cache is empty and `cat` drops it; a .ir
    file cannot hold an empty dimension, so export says which input is empty."""
    model = Mistral().eval()
    args = (torch.randn(2, 5, 32), torch.randn(2, 2, 0, 8), torch.randn(2, 2, 0, 8))
    with torch.no_grad():
        compiled = irc.compile(model, args)
        assert compiled.report.eager_ops == {}, compiled.report
        _close(compiled(*args), model(*args))
    with pytest.raises(ValueError, match="input past_k is empty"):
        irc.export_ir(model, args, tmp_path / "block.ir")
