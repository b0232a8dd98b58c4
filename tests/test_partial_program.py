"""Element-wise programs over a count that no 16-byte vector divides: the last
program is peeled (`tile_to_triton.partial_last_program`).

Triton splits a masked access into the widths over which its mask `i < n` is
constant: element by element for an odd `n`. Every program but the last sees
that mask all true, so the kernel branches on its program id and gives those
programs a constant mask, over which Triton keeps 16-byte accesses. These tests
pin where the peel applies and where not, that the two branches differ only in
the mask, the 16-byte accesses in sm_90 machine code (no GPU needed), and the
results against torch's with the GPU's tiling run in the interpreter.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import irc
from irc.compiler import lower_to_tile, triton_source
from irc.lowering import tile_to_triton
from irc.pipeline import run_pipeline
from irc.runtime.loader import load_source
from irc.target import Target
from irc.testing.programs import cos_reshape_cos
from irc.testing.programs import tensor_type as t
from irc.testing.reference import functions, random_inputs
from irc.testing.sm90 import build, gpu_kernels, sass
from irc.testing.verdict import judge_outputs

DEVICE = "cuda" if os.environ.get("IRC_TEST_DEVICE") == "cuda" else "cpu"
H100 = Target(512, 2, 16, "an H100's tiling (irc.target.target_for)", 132)
PEEL = re.compile(r"^    if tl\.program_id\(0\) < (\d+):$", re.M)


def add(n: int, el: str) -> str:
    return f"""func @f(%x: {t((n,), el)}, %y: {t((n,), el)}) -> {t((n,), el)} {{
  %z = graph.add %x, %y : {t((n,), el)}
  return %z : {t((n,), el)}
}}
"""


def source(text: str) -> str:
    module = irc.parse(text, "t.ir")
    run_pipeline(module, "fuse")
    return triton_source(module, target=H100)


def kernel_body(src: str) -> list[str]:
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def triton_"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    return lines[start + 1 : end]


@pytest.mark.parametrize(
    ("text", "n"),
    [
        (cos_reshape_cos(3, 1001), 3003),  # odd f32
        (add(4098, "f32"), 4098),  # 2 mod 4: 8-byte pairs
        (add(5003, "bf16"), 5003),  # odd bf16
        (add(3006, "bf16"), 3006),  # 6 mod 8: 4-byte pairs
    ],
    ids=["odd-f32", "pairs-f32", "odd-bf16", "pairs-bf16"],
)
def test_full_programs_get_a_constant_mask(text: str, n: int) -> None:
    """The programs before the last take the first branch, whose mask is a constant;
    the second branch is the kernel as it was, and nothing else differs."""
    src = source(text)
    body = kernel_body(src)
    (block,) = {int(b) for b in re.findall(r"tl\.arange\(0, (\d+)\)", "\n".join(body))}
    (grid,) = re.findall(r"_launch\(\w+, \((\d+),\)", src)
    assert int(grid) == -(-n // block) >= 2
    assert PEEL.findall("\n".join(body)) == [str(n // block)]
    cut = body.index("    else:")
    first, second = body[1:cut], body[cut + 1 :]
    assert len(first) == len(second)
    differ = [(a, b) for a, b in zip(first, second, strict=True) if a != b]
    assert len(differ) == 1, differ
    constant, bounds = differ[0]
    assert re.fullmatch(r"\s+(v\d+) = tl\.full\(\[\d+\], 1, tl\.int1\)", constant)
    assert re.fullmatch(r"\s+(v\d+) = v\d+ < v\d+", bounds)
    assert constant.split("=")[0] == bounds.split("=")[0]


@pytest.mark.parametrize(
    "text",
    [
        cos_reshape_cos(64, 64),  # 4096 f32: whole 16-byte vectors
        add(3000, "bf16"),  # a multiple of 8 bf16
        add(93, "f32"),  # one program
        add(4096 * 3 + 4, "f32"),  # 4 mod 16: the mask is constant over 4 f32
    ],
    ids=["whole-f32", "whole-bf16", "one-program", "quads-f32"],
)
def test_no_peel_where_the_mask_keeps_16_bytes_or_one_program_runs(text: str) -> None:
    assert not PEEL.search(source(text))


def test_full_programs_load_and_store_16_bytes_on_sm90(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built for sm_90 by Triton's own ptxas: the peeled kernel of an odd f32 count
    has 16-byte loads and stores; without the peel, none."""

    def widths(text: str) -> set[str]:
        module = irc.parse(text, "t.ir")
        irc.run_pipeline(module, "fuse")
        lower_to_tile(module)
        ((kernel, fn, sig),) = gpu_kernels(module, tmp_path)
        return set(
            re.findall(r"\b(?:LDG|STG)\.E[.A-Z]*?\.128\b", sass(build(kernel, fn, sig), tmp_path))
        )

    text = add(1_000_001, "f32")
    peeled = widths(text)
    assert {w[:3] for w in peeled} == {"LDG", "STG"}, peeled
    monkeypatch.setattr(tile_to_triton, "partial_last_program", lambda kernel: None)
    assert widths(text) == set()


@pytest.mark.parametrize(
    "text",
    [
        cos_reshape_cos(3, 1001),
        cos_reshape_cos(5, 1001, "bf16"),
        add(4098, "f32"),
        add(3006, "bf16"),
        add(5003, "f16"),
    ],
    ids=["odd-f32", "odd-bf16", "pairs-f32", "pairs-bf16", "odd-f16"],
)
def test_peeled_kernels_match_torch(text: str) -> None:
    """The GPU's tiling (several programs, the last partial) run in the interpreter,
    judged as `irc-run --check` judges."""
    src = source(text)
    assert PEEL.search(src)
    (fn,) = functions(irc.parse(text, "t.ir")).values()
    args = random_inputs(fn, seed=3, device=DEVICE)
    got = load_source(src, DEVICE).FUNCTIONS["f"](*args)
    (verdict,) = judge_outputs(fn, args, got)
    assert verdict.ok, verdict.line
    assert got.float().abs().min() > 0 or got.float().abs().max() > 0.1  # not all zeros
