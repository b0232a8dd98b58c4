"""A small pre-norm block for the importer's lit test (tests/lit/pytorch/small_block.ir)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SmallBlock(nn.Module):
    """LayerNorm, a GELU MLP and a residual: what a transformer's MLP half does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 16)
        self.proj = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(F.gelu(self.fc(self.ln(x))))
