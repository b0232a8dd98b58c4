"""The fusion heuristic's documented limits, each with its reason in the report."""

from __future__ import annotations

import irc
from irc.passes.fuse import MAX_TENSORS, fuse_module


def add_chain(n: int) -> str:
    args = ", ".join(f"%a{i}: tensor<64xf32>" for i in range(n))
    lines = [f"func @f({args}) -> tensor<64xf32> {{"]
    prev = "%a0"
    for i in range(1, n):
        lines.append(f"  %s{i} = graph.add {prev}, %a{i}")
        prev = f"%s{i}"
    lines += [f"  return {prev} : tensor<64xf32>", "}"]
    return "\n".join(lines)


def test_register_pressure_limit_splits_a_wide_kernel() -> None:
    (report,) = fuse_module(irc.parse(add_chain(MAX_TENSORS + 4)))
    assert len(report.groups) == 2
    assert any("estimated register pressure" in r.reason for r in report.rejected)


def test_narrow_chain_is_one_kernel() -> None:
    (report,) = fuse_module(irc.parse(add_chain(MAX_TENSORS - 2)))
    assert len(report.groups) == 1
    assert not report.rejected


def test_max_ops_option() -> None:
    module = irc.parse(add_chain(6))
    reports = fuse_module(module, max_ops=2)
    assert all(len(g.ops) <= 2 for g in reports[0].groups)
    assert any("more than 2 ops" in r.reason for r in reports[0].rejected)
