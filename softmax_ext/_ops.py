"""Thin Python wrappers over torch.ops.softmax_ext (same names and defaults)."""

from typing import Optional

import torch

_ops = torch.ops.softmax_ext


def _sharded_axis(x, dim, kind, dtype):
    # A DTensor whose softmax axis is sharded takes the statistics exchange
    # (softmax_ext.distributed); plain tensors skip this at one type check.
    if type(x) is torch.Tensor:
        return None
    from .distributed import dtensor_call

    return dtensor_call(x, dim, kind, dtype)


def softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim`; `dtype` casts the input first."""
    y = _sharded_axis(x, dim, "softmax", dtype)
    if y is not None:
        return y
    return _ops.softmax.default(x, dim, dtype)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x - max - log(sum(exp(x - max))) along `dim`; `dtype` casts the input first."""
    y = _sharded_axis(x, dim, "log_softmax", dtype)
    if y is not None:
        return y
    return _ops.log_softmax.default(x, dim, dtype)


def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax from its output y: y * (dy - sum(y * dy))."""
    return _ops.softmax_backward.default(grad_output, output, dim)


def log_softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of log_softmax from its output y: dy - exp(y) * sum(dy)."""
    return _ops.log_softmax_backward.default(grad_output, output, dim)
