"""The PyTorch frontend: core-ATen FX graphs as irc's graph dialect.

- `irc.compile(module, example_inputs)`: torch.export capture (irc/pytorch/export.py);
- `torch.compile(model, backend="irc")`: a dynamo backend (irc/pytorch/backend.py);
- `irc.export_ir(module, example_inputs, "block.ir")` and `irc-import`: the
  captured graph as an editable `.ir` file (irc/pytorch/cli.py).

One importer serves them all (irc/pytorch/importer.py, irc/pytorch/aten.py);
see docs/pytorch.md.
"""
