"""Checks that only a GPU can make (IRC_TEST_DEVICE=cuda; see conftest.py)."""

from __future__ import annotations

import pytest
import torch

import irc

pytestmark = pytest.mark.gpu


def test_indices_past_2_31_elements_are_64_bit() -> None:
    n = 2**31 + 4099  # past int32, and ragged
    program = f"""
func @big(%x: tensor<{n}xf16>) -> tensor<{n}xf16> {{
  %y = graph.neg %x
  return %y : tensor<{n}xf16>
}}
"""
    compiled = irc.compile(irc.parse(program), device="cuda")
    assert "tl.int64" in compiled.source
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = compiled.big(x)
    assert torch.equal(y, -x)
    del x, y
    torch.cuda.empty_cache()


def test_second_calls_take_the_fast_launch_path() -> None:
    program = """
func @f(%x: tensor<37x300xf32>, %b: tensor<300xf32>) -> tensor<37x300xf32> {
  %s = graph.softmax %x {dim = 1}
  %y = graph.add %s, %b
  return %y : tensor<37x300xf32>
}
"""
    compiled = irc.compile(irc.parse(program), device="cuda")
    for _ in range(3):
        x = torch.randn(37, 300, device="cuda")
        b = torch.randn(300, device="cuda")
        torch.testing.assert_close(compiled.f(x, b), torch.softmax(x, 1) + b)
    kernels = [v for k, v in vars(compiled._py).items() if k.startswith("triton_")]
    assert kernels and all(getattr(k, "_irc_fast", None) is not None for k in kernels)
    # A misaligned view is copied to an aligned buffer (the fast path assumes one).
    base = torch.randn(37 * 300 + 1, device="cuda")
    x = base[1:].view(37, 300)
    torch.testing.assert_close(compiled.f(x, b), torch.softmax(x, 1) + b)


def test_f32_matmul_is_full_precision_unless_tf32_is_asked() -> None:
    program = """
func @mm(%a: tensor<512x512xf32>, %b: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %c = graph.matmul %a, %b
  return %c : tensor<512x512xf32>
}
"""
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    exact = (a.double() @ b.double()).float()
    full = irc.compile(irc.parse(program), device="cuda").mm(a, b)
    tf32 = irc.compile(irc.parse(program), device="cuda", tf32=True).mm(a, b)
    full_err = (full - exact).abs().max().item()
    tf32_err = (tf32 - exact).abs().max().item()
    assert full_err < 1e-3 < tf32_err


def test_autotune_caches_its_choice(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("IRC_CACHE_DIR", str(tmp_path))
    program = """
func @f(%x: tensor<4096x4096xf32>) -> tensor<4096x4096xf32> {
  %y = graph.exp %x
  return %y : tensor<4096x4096xf32>
}
"""
    t0 = time.perf_counter()
    first = irc.compile(irc.parse(program), device="cuda", autotune=True)
    t1 = time.perf_counter()
    second = irc.compile(irc.parse(program), device="cuda", autotune=True)
    t2 = time.perf_counter()
    assert first.source == second.source
    assert t2 - t1 < t1 - t0
    x = torch.randn(4096, 4096, device="cuda")
    torch.testing.assert_close(second.f(x), torch.exp(x))


def test_cuda_graph_replay_follows_its_inputs() -> None:
    program = """
func @f(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %k = graph.constant {value = 1.5} : tensor<f32>
  %y = graph.mul %x, %k
  %r = graph.relu %y
  return %r : tensor<64x64xf32>
}
"""
    compiled = irc.compile(irc.parse(program), device="cuda", cuda_graphs=True)
    x = torch.randn(64, 64, device="cuda")
    torch.testing.assert_close(compiled.f(x), torch.relu(x * 1.5))
    x.copy_(torch.randn(64, 64, device="cuda"))  # same tensor, new values: a replay
    torch.testing.assert_close(compiled.f(x), torch.relu(x * 1.5))
    other = torch.randn(64, 64, device="cuda")  # another tensor: a second graph
    torch.testing.assert_close(compiled.f(other), torch.relu(other * 1.5))
    assert len(compiled.functions["f"].graphs) == 2
