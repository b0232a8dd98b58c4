"""Whole transformer blocks: a GPT-2 (nanoGPT) block and a Llama block, forward.

Rows: eager, torch.compile (Inductor), torch.compile(backend="irc") and
irc.compile, with time, kernel launches (torch.profiler), cold compile time
and the largest difference from eager.

    python benchmarks/blocks.py                  # on a GPU: B=8 T=1024 d=768, bf16 and f32
    python benchmarks/blocks.py --smoke          # tiny sizes, CPU (Triton's interpreter)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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
