"""Written-out attention programs (`.ir` text) and their torch reference, shared by
the attention tests and benchmarks/attention.py."""

from __future__ import annotations

import math

import torch


def attention_ir(
    batch: int,
    t_q: int,
    t_k: int,
    d: int,
    dv: int | None = None,
    dtype: str = "f32",
    *,
    mask: bool = False,
    bias: bool = False,
    softcap: float | None = None,
    epilogue: bool = False,
    name: str = "attn",
) -> str:
    """softmax(Q K^T * scale [+ bias] [softcap] [masked]) V over `batch` (batch x
    heads), one op a line, as a user writes it. `mask` is an i1 [t_q, t_k] input
    (true where a key is seen), `bias` an additive [t_q, t_k] input of `dtype`."""
    dv = dv or d
    ty = dtype
    q = f"tensor<{batch}x{t_q}x{d}x{ty}>"
    k = f"tensor<{batch}x{t_k}x{d}x{ty}>"
    kt = f"tensor<{batch}x{d}x{t_k}x{ty}>"
    v = f"tensor<{batch}x{t_k}x{dv}x{ty}>"
    s = f"tensor<{batch}x{t_q}x{t_k}x{ty}>"
    row = f"tensor<{batch}x{t_q}x1x{ty}>"
    o = f"tensor<{batch}x{t_q}x{dv}x{ty}>"
    args = [f"%q: {q}", f"%k: {k}", f"%v: {v}"]
    if mask:
        args.append(f"%mask: tensor<{t_q}x{t_k}xi1>")
    if bias:
        args.append(f"%bias: tensor<{t_q}x{t_k}x{ty}>")
    lines = [
        f"func @{name}({', '.join(args)}) -> {o} {{",
        f"  %kt = graph.transpose %k {{perm = [0, 2, 1]}} : {kt}",
        f"  %s = graph.matmul %q, %kt : {s}",
        f"  %scale = graph.constant {{value = {1 / math.sqrt(d)!r}}} : tensor<{ty}>",
        f"  %x0 = graph.mul %s, %scale : {s}",
    ]
    x = "%x0"
    if bias:
        lines.append(f"  %x1 = graph.add {x}, %bias : {s}")
        x = "%x1"
    if softcap is not None:
        lines += [
            f"  %cap = graph.constant {{value = {softcap!r}}} : tensor<{ty}>",
            f"  %x2 = graph.div {x}, %cap : {s}",
            f"  %x3 = graph.tanh %x2 : {s}",
            f"  %x4 = graph.mul %x3, %cap : {s}",
        ]
        x = "%x4"
    if mask:
        lines += [
            f"  %ninf = graph.constant {{value = -inf}} : tensor<{ty}>",
            f"  %x5 = graph.where %mask, {x}, %ninf : {s}",
        ]
        x = "%x5"
    lines += [
        f"  %m = graph.reduce_max {x} {{dims = [2], keepdim = true}} : {row}",
        f"  %c = graph.sub {x}, %m : {s}",
        f"  %e = graph.exp %c : {s}",
        f"  %l = graph.reduce_sum %e {{dims = [2], keepdim = true}} : {row}",
        f"  %p = graph.div %e, %l : {s}",
        f"  %o = graph.matmul %p, %v : {o}",
    ]
    out = "%o"
    if epilogue:
        lines.append(f"  %y = graph.relu %o : {o}")
        out = "%y"
    lines += [f"  return {out} : {o}", "}"]
    return "\n".join(lines) + "\n"


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    epilogue: bool = False,
) -> torch.Tensor:
    """The same attention in f32 torch ops (the exact answer the kernel approximates)."""
    q, k, v = q.float(), k.float(), v.float()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias.float()
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    out = torch.softmax(s, -1) @ v
    return torch.relu(out) if epilogue else out
