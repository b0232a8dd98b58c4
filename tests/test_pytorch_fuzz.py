"""Random torch programs through irc.compile against eager (`irc.testing.torchgen`).

Each seed's program is a chain of torch calls over random inputs; its outputs
must pass the verdict `irc-run --check` gives. 40 of the 240 seeds run in the
fast group, the rest in the slow one; `python -m irc.testing.torchgen --count N --seed S` runs a
longer campaign. The generator itself is checked too: deterministic, covering
its op kinds, and able to catch a planted converter bug.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from irc.testing import torchgen
from irc.testing.torchgen import Generator, check

FIRST = int(os.environ.get("IRC_TORCHGEN_SEED", "0"))
COUNT = int(os.environ.get("IRC_TORCHGEN_COUNT", "240"))


@pytest.mark.parametrize("seed", range(FIRST, FIRST + COUNT))
def test_random_torch_program_matches_eager(seed: int) -> None:
    outcome = check(seed)
    assert outcome.ok, f"{outcome.line}\n{Generator(seed).program().text()}"


@pytest.mark.parametrize("seed", range(FIRST, FIRST + 12))
def test_random_torch_program_through_torch_compile(seed: int) -> None:
    outcome = check(seed, entry="dynamo")
    assert outcome.ok, f"{outcome.line}\n{Generator(seed).program().text()}"


def test_programs_are_deterministic() -> None:
    a, b = Generator(11).program(), Generator(11).program()
    assert a.text() == b.text()
    for x, y in zip(a.inputs, b.inputs, strict=True):
        assert torch.equal(x, y)


def test_the_programs_cover_every_kind_of_step() -> None:
    texts = "\n".join(Generator(seed).program().text() for seed in range(150))
    for piece in ["@", "softmax", "gather", "select", "permute", "cat(", "F.pad", "repeat",
                  "sum", "amax", "logsumexp", "floor", "where", "layer_norm", "cumsum",
                  "index_put", "scatter", "diagonal", "masked_fill", "] = -1", "[["]:  # fmt: skip
        assert piece in texts, piece
    assert "bfloat16" in str({x.dtype for s in range(40) for x in Generator(s).program().inputs})


@pytest.fixture
def sigmoid_as_tanh() -> Iterator[None]:
    """A planted converter bug: aten.sigmoid made graph.tanh."""
    from irc.dialects import graph
    from irc.pytorch import aten

    target = torch.ops.aten.sigmoid.default
    original = aten._UNARY[target]
    aten._UNARY[target] = graph.TanhOp
    try:
        yield
    finally:
        aten._UNARY[target] = original


def test_a_planted_converter_bug_is_caught(sigmoid_as_tanh: None) -> None:
    seeds = [s for s in range(200) if "= sigmoid(" in Generator(s).program().text()]
    assert seeds
    assert any(not check(s).ok for s in seeds[:4])


def test_the_command_line_reports_failures(capsys: pytest.CaptureFixture[str]) -> None:
    assert torchgen.main(["--count", "2", "--seed", "3"]) == 0
    assert "2 programs, 0 failing" in capsys.readouterr().out
    assert torchgen.main(["--show", "3"]) == 0
    assert capsys.readouterr().out.startswith("# seed 3: inputs")
