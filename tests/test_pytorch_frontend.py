"""The PyTorch frontend on small modules: irc.compile(module, example_inputs) and
torch.compile(backend="irc") against eager, on random inputs (CPU, Triton's
interpreter)."""

from __future__ import annotations

import copy
import logging
import operator
import re
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import irc
from irc.pytorch.backend import REPORTS, register
from irc.pytorch.importer import Support, TypeMismatch, import_graph

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.proj = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class NormSoftmax(nn.Module):
    """LayerNorm, softmax and a second output (a dict), kwargs with a default."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(12)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> dict[str, torch.Tensor]:
        y = self.ln(x)
        return {"p": torch.softmax(y * scale, dim=-1), "s": y.sum(dim=0)}


class LossHead(nn.Module):
    """A language-model head and its cross-entropy loss."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = nn.Linear(16, 24)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.lm(x).view(-1, 24), targets.view(-1))


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_mlp_through_irc_compile_matches_eager() -> None:
    m = MLP().eval()
    x = torch.randn(4, 16)
    compiled = irc.compile(m, (x,))
    _close(compiled(x), m(x))
    assert compiled.report.eager_ops == {}
    assert compiled.report.islands == 1


def test_weight_update_needs_no_recompile() -> None:
    m = MLP().eval()
    x = torch.randn(4, 16)
    compiled = irc.compile(m, (x,))
    with torch.no_grad():
        m.fc.weight.mul_(-1.5)  # in place
    m.proj.bias = nn.Parameter(torch.randn(8))  # reassigned
    _close(compiled(x), m(x))


def test_dict_outputs_kwargs_and_non_contiguous_inputs() -> None:
    m = NormSoftmax().eval()
    x = torch.randn(12, 6).t()  # non-contiguous
    assert not x.is_contiguous()
    compiled = irc.compile(m, (x,))
    out, ref = compiled(x), m(x)
    assert set(out) == {"p", "s"}
    _close(out["p"], ref["p"])
    _close(out["s"], ref["s"])


def test_a_function_compiles_too() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (a * b).amax(dim=-1), torch.where(a > b, a, b - 1.0)

    a, b = torch.randn(3, 5), torch.randn(3, 5)
    compiled = irc.compile(f, (a, b))
    for got, want in zip(compiled(a, b), f(a, b), strict=True):
        _close(got, want)


def test_bf16_module() -> None:
    m = MLP().eval().to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    got = irc.compile(m, (x,))(x)
    assert got.dtype == torch.bfloat16
    _close(got, m(x), tol=3e-2)


def test_bad_inputs_get_a_clear_error() -> None:
    m = MLP().eval()
    compiled = irc.compile(m, (torch.randn(4, 16),))
    with pytest.raises(ValueError, match=r"input x has shape \[5, 16\], compiled for \[4, 16\]"):
        compiled(torch.randn(5, 16))
    with pytest.raises(ValueError, match="dtype torch.float64, compiled for torch.float32"):
        compiled(torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="device meta, compiled for cpu"):
        compiled(torch.randn(4, 16, device="meta"))
    with pytest.raises(TypeError, match="input x must be a tensor, got float"):
        compiled(3.0)
    with pytest.raises(TypeError, match=r"compiled for the arguments \(x\) .*; got \(list\)"):
        compiled([1.0] * 16)


def test_python_numbers_are_constants_checked_at_each_call() -> None:
    """torch.export bakes a number argument into the graph: another value is an
    error naming it (it was silently ignored), the example's value runs."""

    def f(x: torch.Tensor, n: int, scale: float, *, shift: torch.Tensor) -> torch.Tensor:
        return x[:, :n] * scale + shift[:n]

    x, shift = torch.randn(4, 16), torch.randn(16)
    compiled = irc.compile(f, (x, 5, 0.5), example_kwargs={"shift": shift})
    _close(compiled(x, 5, 0.5, shift=shift), f(x, 5, 0.5, shift=shift))
    with pytest.raises(ValueError, match=r"input scale is 3.0, compiled for 0.5 \(Python numbers"):
        compiled(x, 5, 3.0, shift=shift)
    with pytest.raises(ValueError, match="input n is 7, compiled for 5"):
        compiled(x, 7, 0.5, shift=shift)
    with pytest.raises(ValueError, match="input n is 5.0, compiled for 5"):
        compiled(x, 5.0, 0.5, shift=shift)


def test_unsupported_op_runs_in_eager_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.atan(x.exp()) * 2.0

    x = torch.randn(3, 7)
    with caplog.at_level(logging.INFO, logger="irc"):
        compiled = irc.compile(f, (x,))
    _close(compiled(x), f(x))
    assert dict(compiled.report.eager_ops) == {"aten.atan.default": 1}
    assert compiled.report.islands == 2  # exp before, mul after
    lines = [r.getMessage() for r in caplog.records if r.name == "irc"]
    assert lines == ["irc: 1 op ran in eager: aten.atan.default x1 (no graph op for it)"]


def test_loss_head_matches_eager() -> None:
    m = LossHead().eval()
    x, t = torch.randn(2, 4, 16), torch.randint(0, 24, (2, 4))
    compiled = irc.compile(m, (x, t))
    _close(compiled(x, t), m(x, t))
    assert compiled.report.eager_ops == {}  # the targets' log-probabilities: graph.gather


class Embed(nn.Module):
    """A token embedding plus a cached table read at position ids (as rotary's cos)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(16, 8)
        self.register_buffer("table", torch.randn(10, 8))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) * self.table[positions]


def test_embedding_and_index_by_position_ids() -> None:
    m = Embed().eval()
    ids, positions = torch.randint(0, 16, (2, 5)), torch.randint(0, 10, (5,))
    compiled = irc.compile(m, (ids, positions))
    _close(compiled(ids, positions), m(ids, positions))
    assert compiled.report.eager_ops == {}


def test_type_inference_is_checked_against_meta_val() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 8)
    y = g.call_function(torch.ops.aten.sum.dim_IntList, (x, [1], True))
    y.meta["val"] = torch.empty(4)  # torch would say [4, 1]: a wrong converter looks like this
    g.output((y,))
    with pytest.raises(TypeMismatch, match=r"irc infers tensor<4x1xf32>, torch says tensor<4xf32>"):
        import_graph(g)
    assert Support().why_not(y) is not None and "type mismatch" in str(Support().why_not(y))


def test_value_names_come_from_fx_node_names() -> None:
    from irc.pytorch.export import export_text

    text = export_text(MLP().eval(), (torch.randn(4, 16),))
    assert "func @MLP(%p_fc_weight: tensor<32x16xf32>" in text
    assert "%addmm = graph.add" in text and "%gelu = graph.gelu" in text
    module = irc.parse(text)  # re-reads
    assert irc.print_module(module).strip() == text.strip()


# --- torch.compile(backend="irc") -------------------------------------------


def test_backend_is_registered_and_matches_eager() -> None:
    register()
    register()  # idempotent
    m = MLP().eval()
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    before = len(REPORTS)
    with torch.no_grad():
        got = torch.compile(m, backend="irc")(x)
    _close(got, m(x))
    assert len(REPORTS) == before + 1 and REPORTS[-1].eager_ops == {}


def test_backend_training_forward_and_backward() -> None:
    m = NormSoftmax()
    x = torch.randn(5, 12, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(m, backend="irc")(x)["p"]
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref = m(x2)["p"]
    (ref * weights).sum().backward()
    _close(out.detach(), ref.detach())
    assert x.grad is not None and x2.grad is not None
    _close(x.grad, x2.grad)


def test_a_loss_heads_backward_leaves_nothing_to_eager() -> None:
    """Cross-entropy's backward writes its one-hot with `scatter`, a select of
    iota == target here, which fuses with the softmax's backward."""
    torch.manual_seed(4)
    head, reference = LossHead(), LossHead()
    reference.load_state_dict(head.state_dict())
    x, targets = torch.randn(3, 5, 16), torch.randint(0, 24, (3, 5))
    torch._dynamo.reset()
    before = len(REPORTS)
    torch.compile(head, backend="irc")(x, targets).backward()
    reference(x, targets).backward()
    assert len(REPORTS) == before + 2 and all(not r.eager_ops for r in REPORTS[before:])
    assert head.lm.weight.grad is not None and reference.lm.weight.grad is not None
    _close(head.lm.weight.grad, reference.lm.weight.grad)


def test_graph_break_compiles_both_graphs() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x) * 3.0
        torch._dynamo.graph_break()
        return torch.softmax(y, dim=-1)

    x = torch.randn(4, 9)
    torch._dynamo.reset()
    before = len(REPORTS)
    _close(torch.compile(f, backend="irc")(x), f(x))
    assert len(REPORTS) == before + 2
    assert all(r.islands == 1 and not r.eager_ops for r in REPORTS[before:])


def test_symbolic_shapes_fall_back_to_eager_with_a_warning() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="irc", dynamic=True)
    x = torch.randn(5, 3)
    with pytest.warns(UserWarning, match=r"^irc: this graph runs in eager: symbolic size"):
        got = compiled(x)
    _close(got, f(x))
    assert REPORTS[-1].fallback is not None


def test_getitem_is_not_an_op() -> None:
    support = Support()
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 6)
    parts = g.call_function(torch.ops.aten.split_with_sizes.default, (x, [2, 4], 1))
    parts.meta["val"] = [torch.empty(4, 2), torch.empty(4, 4)]
    first = g.call_function(operator.getitem, (parts, 1))
    first.meta["val"] = torch.empty(4, 4)
    assert support.why_not(first) is None


class Counter(nn.Module):
    """A buffer updated in place at each call (a running statistic)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sum(dim=0))
        return x * 2.0


def test_buffer_mutations_are_written_back() -> None:
    m = Counter()
    x = torch.randn(4, 3)
    compiled = irc.compile(m, (x,))
    m.total.zero_()  # export ran forward once on fake tensors only; start from zero
    compiled(x)
    compiled(x)
    _close(m.total, 2 * x.sum(dim=0))


class WritesItsInputs(nn.Module):
    """In-place ops on the caller's tensors: eager leaves them changed."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        x[0] = 5.0
        y.mul_(2.0)
        return x * y


def test_input_mutations_are_written_back() -> None:
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    compiled = irc.compile(WritesItsInputs(), (x.clone(), y.clone()))
    assert compiled.report.eager_ops == {}
    mine, eagers = (x.clone(), y.clone()), (x.clone(), y.clone())
    _close(compiled(*mine), WritesItsInputs()(*eagers))
    _close(mine[0], eagers[0])
    _close(mine[1], eagers[1])


def test_a_function_writing_its_inputs() -> None:
    def scale_in_place(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x + y

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    compiled = irc.compile(scale_in_place, (x.clone(), y))
    mine = x.clone()
    _close(compiled(mine, y), 2 * x + y)
    _close(mine, 2 * x)


def test_a_call_that_eager_would_differentiate_warns_once() -> None:
    """irc.compile's outputs carry no gradient: said once, where eager would have
    recorded one (grad mode on and a parameter or input that requires it)."""
    model = MLP()
    x = torch.randn(4, 16)
    compiled = irc.compile(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            compiled(x)
        model.requires_grad_(False)
        compiled(x)
    model.requires_grad_(True)
    with pytest.warns(UserWarning, match="outputs carry no gradient"):
        assert not compiled(x).requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x)  # once


def test_training_batch_norm_updates_its_running_statistics() -> None:
    """Training-mode batch norm decomposes (batch statistics, then the running ones
    as buffer updates): nothing in eager, and the buffers as eager leaves them."""
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 6), nn.BatchNorm1d(6, momentum=0.3)
    )
    reference = copy.deepcopy(model)
    with torch.no_grad():
        compiled = irc.compile(model.train(), (torch.randn(32, 24),))
        assert compiled.report.eager_ops == {}
        for _ in range(3):
            x = torch.randn(32, 24) * 3 + 1
            _close(compiled(x), reference.train()(x), 1e-4)
    for (name, mine), (_, eagers) in zip(
        model.named_buffers(), reference.named_buffers(), strict=True
    ):
        torch.testing.assert_close(mine, eagers, rtol=1e-5, atol=1e-5, msg=name)


def test_export_with_eager_ops_writes_one_function_per_island() -> None:
    from irc.pytorch.export import export_text

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.atan(x.exp()) * 2.0

    text = export_text(f, (torch.randn(3, 7),))
    assert "//   aten.atan.default x1: no graph op for it" in text
    module = irc.parse(text)
    assert [fn.sym_name.data for fn in module.ops] == ["f_0", "f_1"]  # type: ignore[attr-defined]


def test_irc_import_cli_errors(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from irc.pytorch.cli import main

    model = tmp_path / "model.py"
    model.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return x.sin()\n")  # fmt: skip
    for argv, message in (
        ([f"{model}:M", "--input", "3xq"], "cannot read the input type '3xq'"),
        ([f"{model}:M"], "no example inputs: give --input TYPE"),
        ([f"{model}:N", "--input", "3xf32"], f"{model} has no N"),
        ([str(model)], f"{model} defines no `model`"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 1
        assert f"irc-import: error: {message}" in capsys.readouterr().err
    out = tmp_path / "m.ir"
    assert main([f"{model}:M", "--input", "3xf32", "-o", str(out)]) == 0
    assert "%sin = graph.sin %x : tensor<3xf32>" in out.read_text()


def test_irc_import_says_in_a_line_what_the_users_code_raised(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """The user's code failing (at import, in its constructor, under torch.export),
    an input too large to make and an output that cannot be written: one line,
    exit 1, no traceback; where the user's code raised, its file and line."""
    from irc.pytorch.cli import main

    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x.sin()\n"
        "class Boom(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('no weights here')\n"
        "class Branch(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2 if x.sum() > 0 else x\n"
    )
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass M(torch.nn.Module:\n    pass\n")
    for argv, message in (
        ([f"{model}:Boom", "--input", "3xf32"],
         f"making {model}:Boom raised: RuntimeError: no weights here ({model}:7)"),
        ([f"{broken}:M", "--input", "3xf32"], f"making {broken}:M raised: SyntaxError"),
        ([f"{model}:Branch", "--input", "3xf32"],
         f"torch.export cannot capture {model}:Branch: GuardOnDataDependentSymNode"),
        ([f"{model}:M", "--input", "2000000x2000000xf32"],
         "the example input 2000000x2000000xf32 needs 1.49e+04 GiB, more than half"),
        ([f"{model}:M", "--input", "3xf32", "-o", str(tmp_path / "no" / "m.ir")],
         f"cannot write '{tmp_path / 'no' / 'm.ir'}': No such file or directory"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 1
        err = capsys.readouterr().err
        assert f"irc-import: error: {message}" in err, err
        assert "Traceback" not in err
    assert f"({model}:10)" in _import_error(main, [f"{model}:Branch", "--input", "3xf32"], capsys)


@pytest.mark.parametrize("name", ["x\n}\nfunc @evil", '"; import os', "../../etc/passwd", "@f %x"])
def test_irc_import_names_the_function_only_with_name_characters(name: str, tmp_path: Any) -> None:
    """--name reaches the .ir text: whatever it holds, the file has one function whose
    name is made of name characters, which irc-opt compiles."""
    from irc.pytorch.cli import main
    from irc.tools.opt import run

    model = tmp_path / "model.py"
    model.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return x.sin()\n")  # fmt: skip
    out = tmp_path / "m.ir"
    assert main([f"{model}:M", "--input", "3xf32", "--name", name, "-o", str(out)]) == 0
    text = out.read_text()
    functions = [line for line in text.splitlines() if line.startswith("func @")]
    assert len(functions) == 1 and "evil" not in text.replace(functions[0], "")
    assert re.fullmatch(r"func @[\w.$-]+\(.*", functions[0]), functions[0]
    assert run([str(out), "--fuse", "--emit", "triton"]) == 0


def _import_error(main: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().err
