"""Attention: irc's fused kernel against torch.compile and scaled_dot_product_attention.

    python benchmarks/attention.py [--markdown FILE] [--json FILE]   # on a GPU
    python benchmarks/attention.py --smoke                           # CPU, tiny, checks only

Each row is one attention written out in `.ir` (matmul, scale, where-mask,
graph.softmax, matmul: `attention_ir`), compiled by irc, the same ops in torch run
through torch.compile, and `F.scaled_dot_product_attention` on 4-D inputs with
its flash and cuDNN backends (each where it runs). bf16, head dims 64 and 128,
T = 512 ... 16384 with batch x heads chosen so that every row holds 32K query
tokens (64 heads at 512, 2 at 16384), causal and not; then the variants SDPA
cannot express (tanh soft-capping, an additive bias tensor), against
torch.compile only, grouped-query attention (4 query heads a K/V head), and
rows of the `graph.attention` op on 4-d inputs (`sdpa_ir`, variant "op": what
the PyTorch importer makes of SDPA; its scores stay in f32).
Causal masks are written as two iotas compared, which irc recognizes: the key
tiles above the diagonal are not visited. Times are `triton.testing.do_bench` medians, the
variants of a row timed in turns (benchmarks/bench.py's interleaved_medians);
each output is checked against the f32 reference first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
TOKENS = 32768
"""Query tokens a row (batch x heads x T): the same work per row of the table."""


def attention_ir(
    batch: int,
    t_q: int,
    t_k: int,
    d: int,
    dv: int | None = None,
    dtype: str = "f32",
    *,
    mask: bool = False,
    causal: bool = False,
    bias: bool = False,
    softcap: float | None = None,
    epilogue: bool = False,
    kv_heads: int | None = None,
    softmax_op: bool = False,
    name: str = "attn",
) -> str:
    """softmax(Q K^T * scale [+ bias] [softcap] [masked]) V over `batch` (batch x
    heads), one op a line, as a user writes it. `mask` is an i1 [t_q, t_k] input
    (true where a key is seen); `causal` a mask of two iotas compared (row + t_k -
    t_q >= key); `bias` an additive [t_q, t_k] input of `dtype`; `kv_heads` K and V
    of that many heads, each shared by batch / kv_heads query heads in turn (grouped
    query attention: a reshape, broadcast and reshape, no copy); `softmax_op` the
    softmax as `graph.softmax` (computed in f32 for half types) rather than its five
    ops in the element type."""
    dv = dv or d
    ty = dtype
    kvb = kv_heads or batch
    q = f"tensor<{batch}x{t_q}x{d}x{ty}>"
    k = f"tensor<{kvb}x{t_k}x{d}x{ty}>"
    kt = f"tensor<{batch}x{d}x{t_k}x{ty}>"
    v = f"tensor<{kvb}x{t_k}x{dv}x{ty}>"
    s = f"tensor<{batch}x{t_q}x{t_k}x{ty}>"
    row = f"tensor<{batch}x{t_q}x1x{ty}>"
    o = f"tensor<{batch}x{t_q}x{dv}x{ty}>"
    idx = f"tensor<{t_q}x{t_k}xi32>"
    args = [f"%q: {q}", f"%k: {k}", f"%v: {v}"]
    if mask:
        args.append(f"%mask: tensor<{t_q}x{t_k}xi1>")
    if bias:
        args.append(f"%bias: tensor<{t_q}x{t_k}x{ty}>")
    lines = [f"func @{name}({', '.join(args)}) -> {o} {{"]
    kk, vv = "%k", "%v"
    if kv_heads is not None:
        group = batch // kv_heads
        for x, width in (("k", d), ("v", dv)):
            lines += [
                f"  %{x}1 = graph.reshape %{x} : tensor<{kv_heads}x1x{t_k}x{width}x{ty}>",
                f"  %{x}2 = graph.broadcast %{x}1 : tensor<{kv_heads}x{group}x{t_k}x{width}x{ty}>",
                f"  %{x}3 = graph.reshape %{x}2 : tensor<{batch}x{t_k}x{width}x{ty}>",
            ]
        kk, vv = "%k3", "%v3"
    lines += [
        f"  %kt = graph.transpose {kk} {{perm = [0, 2, 1]}} : {kt}",
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
    if causal:
        lines += [
            f"  %ri = graph.iota {{dim = 0}} : {idx}",
            f"  %ci = graph.iota {{dim = 1}} : {idx}",
            f"  %shift = graph.constant {{value = {t_k - t_q}}} : tensor<i32>",
            f"  %rs = graph.add %ri, %shift : {idx}",
            f"  %seen = graph.ge %rs, %ci : tensor<{t_q}x{t_k}xi1>",
        ]
    if mask or causal:
        cond = "%mask" if mask else "%seen"
        if mask and causal:
            lines.append(f"  %both = graph.where %mask, %seen, %mask : tensor<{t_q}x{t_k}xi1>")
            cond = "%both"
        lines += [
            f"  %ninf = graph.constant {{value = -inf}} : tensor<{ty}>",
            f"  %x5 = graph.where {cond}, {x}, %ninf : {s}",
        ]
        x = "%x5"
    if softmax_op:
        lines.append(f"  %p = graph.softmax {x} {{dim = 2}} : {s}")
    else:
        lines += [
            f"  %m = graph.reduce_max {x} {{dims = [2], keepdim = true}} : {row}",
            f"  %c = graph.sub {x}, %m : {s}",
            f"  %e = graph.exp %c : {s}",
            f"  %l = graph.reduce_sum %e {{dims = [2], keepdim = true}} : {row}",
            f"  %p = graph.div %e, %l : {s}",
        ]
    lines.append(f"  %o = graph.matmul %p, {vv} : {o}")
    out = "%o"
    if epilogue:
        lines.append(f"  %y = graph.relu %o : {o}")
        out = "%y"
    lines += [f"  return {out} : {o}", "}"]
    return "\n".join(lines) + "\n"


def sdpa_ir(batch: int, heads: int, t: int, d: int, dtype: str, causal: bool, name: str = "attn") -> str:
    """`graph.attention` on 4-d inputs: what the PyTorch importer makes of
    `F.scaled_dot_product_attention`."""
    ty = f"tensor<{batch}x{heads}x{t}x{d}x{dtype}>"
    props = " {is_causal = true}" if causal else ""
    return (
        f"func @{name}(%q: {ty}, %k: {ty}, %v: {ty}) -> {ty} {{\n"
        f"  %o = graph.attention %q, %k, %v{props} : {ty}\n"
        f"  return %o : {ty}\n}}\n"
    )


def causal_mask(t_q: int, t_k: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """What `attention_ir(causal=True)` keeps: row + t_k - t_q >= key."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    epilogue: bool = False,
) -> torch.Tensor:
    """The same attention in f32 torch ops (the exact answer the kernel approximates);
    K and V of fewer heads than Q are shared by consecutive query heads."""
    q, k, v = q.float(), k.float(), v.float()
    if k.shape[0] != q.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], 0)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias.float()
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    out = torch.softmax(s, -1) @ v
    return torch.relu(out) if epilogue else out


def written_out(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The `.ir` program's ops in torch, in its element type (for torch.compile)."""
    if k.shape[0] != q.shape[0]:  # grouped-query attention, as torch code writes it
        k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], 0)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        t_q, t_k = s.shape[-2:]
        rows = torch.arange(t_q, device=s.device)[:, None] + (t_k - t_q)
        keys = torch.arange(t_k, device=s.device)[None, :]
        s = torch.where(rows >= keys, s, torch.tensor(-math.inf, dtype=s.dtype, device=s.device))
    return torch.softmax(s.float(), -1).to(s.dtype) @ v  # graph.softmax: f32 inside


def rows(smoke: bool) -> list[dict[str, Any]]:
    """The table's rows: what each one computes."""
    if smoke:
        return [
            {"causal": c, "d": d, "t": t, "bh": 4, "variant": None}
            for c in (False, True)
            for d, t in ((16, 40), (32, 64))
        ] + [
            {"causal": True, "d": 16, "t": 40, "bh": 4, "variant": v}
            for v in ("softcap", "bias", "gqa", "op")
        ]
    out = [
        {"causal": c, "d": d, "t": t, "bh": TOKENS // t, "variant": None}
        for c in (False, True)
        for d in (64, 128)
        for t in (512, 1024, 4096, 16384)
    ]
    out += [
        {"causal": True, "d": d, "t": t, "bh": TOKENS // t, "variant": v}
        for v, d in (("softcap", 64), ("bias", 64), ("gqa", 128))
        for t in (1024, 4096)
    ]
    out += [
        {"causal": c, "d": d, "t": t, "bh": TOKENS // t, "variant": "op"}
        for c in (False, True)
        for d in (64, 128)
        for t in (1024, 4096, 16384)
    ]
    return out


GQA_GROUP = 4
"""Query heads a K/V head serves in the grouped-query rows."""


def _sdpa(backend_name: str) -> Callable[..., torch.Tensor] | None:
    """F.scaled_dot_product_attention restricted to one backend, or None without it."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    backend = getattr(SDPBackend, backend_name, None)
    if backend is None:
        return None

    def run(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, **kw: bool
    ) -> torch.Tensor:
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

    return run


def measure(row: dict[str, Any], device: str, timer: Callable[..., dict[str, float]] | None) -> dict[str, Any]:
    """Checks every implementation of one row against the f32 reference, then times them."""
    import irc

    t, d, bh, causal, variant = row["t"], row["d"], row["bh"], row["causal"], row["variant"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ty = "bf16" if device == "cuda" else "f32"
    softcap = 30.0 if variant == "softcap" else None
    bias_on = variant == "bias"
    kv = bh // GQA_GROUP if variant == "gqa" else bh
    if variant == "op":
        text = sdpa_ir(1, bh, t, d, ty, causal)
    else:
        text = attention_ir(
            bh, t, t, d, dtype=ty, causal=causal, bias=bias_on, softcap=softcap,
            kv_heads=kv if variant == "gqa" else None, softmax_op=True,
        )  # fmt: skip
    compiled = irc.compile(irc.parse(text), device=device)
    gen = torch.Generator(device=device).manual_seed(t + d)
    q = torch.randn(bh, t, d, device=device, generator=gen, dtype=dtype)
    k, v = (torch.randn(kv, t, d, device=device, generator=gen, dtype=dtype) for _ in range(2))
    mask = causal_mask(t, t, device) if causal else None
    bias = torch.randn(t, t, device=device, generator=gen, dtype=dtype) if bias_on else None
    args = [a for a in (q, k, v, bias) if a is not None]
    if variant == "op":
        args = [x.view(1, bh, t, d) for x in args]
    fns: dict[str, Callable[[], Any]] = {"irc": lambda: compiled.attn(*args).view(bh, t, d)}
    if device == "cuda":
        written = torch.compile(written_out)
        fns["torch.compile"] = lambda: written(q, k, v, causal, bias, softcap)
        if variant in (None, "gqa", "op"):
            q4, k4, v4 = (x.view(1, x.shape[0], t, d) for x in (q, k, v))
            gqa = {"enable_gqa": True} if variant == "gqa" else {}
            for name, backend in (("sdpa flash", "FLASH_ATTENTION"), ("sdpa cudnn", "CUDNN_ATTENTION")):
                sdpa = _sdpa(backend)
                if sdpa is None:
                    continue
                try:
                    sdpa(q4, k4, v4, causal, **gqa)
                except RuntimeError:
                    continue  # the backend does not take this shape or GPU
                fns[name] = (lambda f: lambda: f(q4, k4, v4, causal, **gqa).view(bh, t, d))(sdpa)
    # The check: an f32 reference in chunks of heads (16K x 16K f32 scores are 1 GiB a head).
    errors: dict[str, float] = {}
    outs = {name: fn().float() for name, fn in fns.items()}
    for h0 in range(0, bh, 4):
        sl = slice(h0, h0 + 4)
        ksl = slice(h0 * kv // bh, (h0 + 4) * kv // bh) if kv != bh else sl
        want = attention_reference(q[sl], k[ksl], v[ksl], mask, bias, softcap)
        for name, got in outs.items():
            errors[name] = max(errors.get(name, 0.0), (got[sl] - want).abs().max().item())
    del outs
    result: dict[str, Any] = {**row, "max_abs_err": errors}
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    result["correct"] = all(e <= tol for e in errors.values())
    result["irc_kernels"] = compiled.kernel_count
    if timer is not None:
        ms = timer(fns)
        result["ms"] = ms
        flops = 4 * bh * t * t * d / (2 if causal else 1)
        result["tflops"] = {k: flops / (m * 1e-3) / 1e12 for k, m in ms.items()}
        sdpa_best = min((m for k, m in ms.items() if k.startswith("sdpa")), default=None)
        result["irc_over_sdpa"] = ms["irc"] / sdpa_best if sdpa_best else None
        result["irc_over_compile"] = ms["irc"] / ms["torch.compile"]
    return result


def format_row(r: dict[str, Any]) -> str:
    name = f"{'causal' if r['causal'] else 'full'}{'+' + r['variant'] if r['variant'] else ''}"
    ms = r.get("ms", {})

    def cell(key: str) -> str:
        return f"{ms[key]:.3f}" if key in ms else "—"

    def ratio(x: float | None) -> str:
        return f"{x:.2f}" if x is not None else "—"

    return (
        f"| {name} | {r['d']} | {r['t']} | {r['bh']} | {cell('irc')} | {cell('torch.compile')} "
        f"| {cell('sdpa flash')} | {cell('sdpa cudnn')} | {ratio(r.get('irc_over_sdpa'))} "
        f"| {ratio(r.get('irc_over_compile'))} | {r['irc_kernels']} | {'yes' if r['correct'] else 'NO'} |"
    )


HEADER = (
    "| mask | d | T | batch x heads | irc ms | torch.compile ms | sdpa flash ms | sdpa cudnn ms "
    "| irc / best sdpa | irc / compile | irc kernels | correct |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, correctness only")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--only-t", type=int, action="append", help="only rows of these T")
    p.add_argument(
        "--only-variant", action="append",
        help="only rows of these variants (plain, softcap, bias, gqa, op)",
    )  # fmt: skip
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    timer = None
    if not args.smoke:
        spec = importlib.util.spec_from_file_location("irc_bench", HERE / "bench.py")
        assert spec is not None and spec.loader is not None
        bench = importlib.util.module_from_spec(spec)
        sys.modules["irc_bench"] = bench
        spec.loader.exec_module(bench)
        timer = bench.interleaved_medians
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    print(HEADER, flush=True)
    results = []
    for row in rows(args.smoke):
        if args.only_t and row["t"] not in args.only_t:
            continue
        if args.only_variant and (row["variant"] or "plain") not in args.only_variant:
            continue
        r = measure(row, device, timer)
        results.append(r)
        print(format_row(r), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.markdown:
        args.markdown.write_text(HEADER + "\n" + "\n".join(format_row(r) for r in results) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
