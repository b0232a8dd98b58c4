"""Text in and out: the `.ir` parser (lark), the printer, MLIR generic input, and
the located diagnostics every layer reports through."""
