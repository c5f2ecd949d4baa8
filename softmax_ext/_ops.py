"""Thin Python wrappers over torch.ops.softmax_ext (same names and defaults).

An argument of the wrong type raises TypeError, as torch's own functions do
(the op call path reports it as a RuntimeError)."""

from typing import Optional

import torch

_ops = torch.ops.softmax_ext
_softmax = _ops.softmax.default
_log_softmax = _ops.log_softmax.default
_softmax_backward = _ops.softmax_backward.default
_log_softmax_backward = _ops.log_softmax_backward.default


def _raise_if_type_error(exc: RuntimeError) -> None:
    """Raises the TypeError torch would raise where the op's schema rejected
    an argument's type; returns for any other error."""
    if "Expected a value of type" in str(exc):
        raise TypeError(str(exc).split("\nDeclaration:")[0]) from None


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
    try:
        return _softmax(x, dim, dtype)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x - max - log(sum(exp(x - max))) along `dim`; `dtype` casts the input first."""
    y = _sharded_axis(x, dim, "log_softmax", dtype)
    if y is not None:
        return y
    try:
        return _log_softmax(x, dim, dtype)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise


def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax from its output y: y * (dy - sum(y * dy))."""
    try:
        return _softmax_backward(grad_output, output, dim)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise


def log_softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of log_softmax from its output y: dy - exp(y) * sum(dy)."""
    try:
        return _log_softmax_backward(grad_output, output, dim)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise
