"""torch dtypes and FX values as irc types."""

from __future__ import annotations

from typing import Any

import torch
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute

from irc.ir.types import ELEMENT_TYPES, tensor

TORCH_TO_IRC: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "i1",
}
"""The dtypes irc's graph dialect has; any other keeps its op in eager."""

FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})


def element(dtype: torch.dtype) -> Attribute:
    return ELEMENT_TYPES[TORCH_TO_IRC[dtype]]


def fake_of(value: Any) -> torch.Tensor | None:
    """The example tensor FX recorded for a node (`meta['val']`), if it is one."""
    val = getattr(value, "meta", {}).get("val")
    return val if isinstance(val, torch.Tensor) else None


def is_static(t: torch.Tensor) -> bool:
    return all(isinstance(d, int) for d in t.shape)


def tensor_type(t: torch.Tensor) -> TensorType[Attribute]:
    return tensor([int(d) for d in t.shape], element(t.dtype))


def dtype_supported(t: torch.Tensor) -> bool:
    return t.dtype in TORCH_TO_IRC
