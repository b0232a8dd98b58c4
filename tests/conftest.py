"""Shared test settings.

`IRC_TEST_DEVICE=cuda` runs the compiling tests on a GPU (default: cpu, where
Triton's interpreter runs the kernels). Tests marked `gpu` need a GPU and
are collected only then: they are not skipped on a CPU run, they are not part
of it (see docs/testing.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")

# The interpreter runs the tilings a GPU would (irc.target.CPU_TILING_ENV): the
# suite tests the GPU's kernels, looped and online reductions included. Tests
# of the interpreter's own tilings set it back themselves.
os.environ.setdefault("IRC_CPU_TILING", "gpu")


@dataclass(frozen=True)
class Thin:
    """Which items of a parametrized test stay in the fast run.

    An item stays if it is the first to bring some parameter value (per
    argument name, when `cover`), or if its index in collection order is a
    multiple of `every`; the rest are marked `slow`. Collection order is
    deterministic, so every xdist worker makes the same split.
    """

    every: int = 0
    cover: bool = True


# "file.py::function" (or "file.py::*" for every parametrized test of the file)
# -> the fast subset. Seeds and corpus entries are sampled; op x dtype grids are
# covered (every op and every dtype at least once); Thin(cover=False) with no
# `every` makes the whole family slow.
THINNED: dict[str, Thin] = {
    # 20 of the 300 seeds (a seed took up to 37 s under load; the slow group runs all).
    "test_differential.py::test_random_graph_matches_reference_fused_and_unfused": Thin(
        every=15, cover=False
    ),
    "test_lowering_ops.py::*": Thin(),
    # Two 2**24-element full reductions, each about a minute in the
    # interpreter; tests/test_split_reduction.py covers the split in the fast run.
    "test_lowering_ops.py::test_large_full_reduction": Thin(cover=False),
    "test_reference.py::*": Thin(),
    # One file in twelve: a file is two or three subprocesses (irc-opt, irc-run, irc.compile).
    "test_hostile.py::test_hostile_file": Thin(every=12, cover=False),
    "test_hostile.py::test_generated_hostile_input": Thin(),
    # One op in three of each family (about a second each in the interpreter).
    "test_pytorch_formulas.py::*": Thin(every=3, cover=False),
    # 40 of the 240 random torch programs (a fraction of a second to a few seconds each).
    "test_pytorch_fuzz.py::test_random_torch_program_matches_eager": Thin(every=6, cover=False),
}


SLOW_ITEMS = {
    # The whole lit suite is one test of about 110 s (one xdist worker for half the
    # fast run); `lit tests/lit` runs it on its own, and the slow group in CI.
    "test_lit.py::test_lit_suite_passes",
    # The 20,000-op index chain (15 s); the 3,000-deep inputs stay in the fast run.
    "test_hostile.py::test_generated_hostile_input[loop_index_chain_20000-irc-opt]",
}
"""Single tests in the slow group, by `file::name` as pytest ids them."""


def _policy(item: pytest.Item) -> Thin | None:
    file = item.path.name
    name = getattr(item, "originalname", item.name)
    return THINNED.get(f"{file}::{name}") or THINNED.get(f"{file}::*")


def _mark_slow_families(items: list[pytest.Item]) -> None:
    seen: dict[tuple[str, str], set[tuple[str, str]]] = {}
    counts: dict[tuple[str, str], int] = {}
    for item in items:
        if f"{item.path.name}::{item.name}" in SLOW_ITEMS:
            item.add_marker(pytest.mark.slow)
            continue
        callspec = getattr(item, "callspec", None)
        policy = _policy(item)
        if callspec is None or policy is None or item.get_closest_marker("slow"):
            continue
        family = (str(item.path), getattr(item, "originalname", item.name))
        index = counts.get(family, 0)
        counts[family] = index + 1
        values = {(arg, repr(value)) for arg, value in callspec.params.items()}
        known = seen.setdefault(family, set())
        fresh = policy.cover and not values <= known
        sampled = policy.every > 0 and index % policy.every == 0
        if fresh or sampled:
            known |= values
        else:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (IRC_TEST_DEVICE=cuda)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_slow_families(items)
    if DEVICE == "cuda":
        return
    kept = [item for item in items if item.get_closest_marker("gpu") is None]
    dropped = [item for item in items if item.get_closest_marker("gpu") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
