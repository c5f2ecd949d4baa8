"""Thin Python wrappers over torch.ops.softmax_ext (same names and defaults)."""

from typing import Optional

import torch

_ops = torch.ops.softmax_ext


def softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim`; `dtype` casts the input first."""
    return _ops.softmax.default(x, dim, dtype)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x - max - log(sum(exp(x - max))) along `dim`; `dtype` casts the input first."""
    return _ops.log_softmax.default(x, dim, dtype)


def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax from its output y: y * (dy - sum(y * dy))."""
    return _ops.softmax_backward.default(grad_output, output, dim)


def log_softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of log_softmax from its output y: dy - exp(y) * sum(dy)."""
    return _ops.log_softmax_backward.default(grad_output, output, dim)
