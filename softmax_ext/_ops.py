"""Python wrappers of torch.ops.softmax_ext (same names and defaults).

A call on a plain tensor in eager mode goes through _C's direct entry points
(csrc/python/fast_calls.cpp): the same op through the dispatcher, without the
generic torch.ops argument parsing. Tensor subclasses, torch function modes
and torch.compile's tracing take the torch.ops path, which handles them.
An argument of the wrong type raises TypeError on both paths, as torch's own
functions do."""

from typing import Optional

import torch

from . import _C

_ops = torch.ops.softmax_ext
_softmax = _ops.softmax.default
_log_softmax = _ops.log_softmax.default
_softmax_backward = _ops.softmax_backward.default
_log_softmax_backward = _ops.log_softmax_backward.default

# Dynamo's tracing takes the torch.ops path (is_dynamo_compiling is True
# there and a constant False, one cheap call, in eager mode); other tracers
# (export's non-strict mode, make_fx) see fake or subclass tensors or
# dispatch modes, which the direct entry points hand to the dispatcher too.
_is_compiling = torch.compiler.is_dynamo_compiling
_torch_function_mode = torch._C._is_torch_function_mode_enabled
_Tensor = torch.Tensor


def _raise_if_type_error(exc: RuntimeError) -> None:
    """Raises the TypeError torch would raise where the op's schema rejected
    an argument's type; returns for any other error."""
    if "Expected a value of type" in str(exc):
        raise TypeError(str(exc).split("\nDeclaration:")[0]) from None


def _sharded_axis(x, dim, kind, dtype):
    # A DTensor whose softmax axis is sharded takes the statistics exchange
    # (softmax_ext.distributed); other tensors return None at once.
    if type(x) is torch.Tensor:
        return None
    from .distributed import dtensor_call

    return dtensor_call(x, dim, kind, dtype)


# Each wrapper calls _C's direct entry point itself where it serves (plain
# tensors, eager: one Python frame less a call), and _forward / _backward
# (torch.ops, DTensor's sharded axis) otherwise.
def _forward(op, kind: str, x, dim, dtype):
    y = _sharded_axis(x, dim, kind, dtype)
    if y is not None:
        return y
    try:
        return op(x, dim, dtype)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise


def _backward(op, grad_output, output, dim):
    try:
        return op(grad_output, output, dim)
    except RuntimeError as exc:
        _raise_if_type_error(exc)
        raise


def softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim`; `dtype` casts the input first."""
    if type(x) is _Tensor and not _is_compiling() and not _torch_function_mode():
        return _C._softmax(x, dim, dtype)
    return _forward(_softmax, "softmax", x, dim, dtype)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x - max - log(sum(exp(x - max))) along `dim`; `dtype` casts the input first."""
    if type(x) is _Tensor and not _is_compiling() and not _torch_function_mode():
        return _C._log_softmax(x, dim, dtype)
    return _forward(_log_softmax, "log_softmax", x, dim, dtype)


def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax from its output y: y * (dy - sum(y * dy))."""
    if type(grad_output) is _Tensor and type(output) is _Tensor and not _is_compiling() and not _torch_function_mode():
        return _C._softmax_backward(grad_output, output, dim)
    return _backward(_softmax_backward, grad_output, output, dim)


def log_softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of log_softmax from its output y: dy - exp(y) * sum(dy)."""
    if type(grad_output) is _Tensor and type(output) is _Tensor and not _is_compiling() and not _torch_function_mode():
        return _C._log_softmax_backward(grad_output, output, dim)
    return _backward(_log_softmax_backward, grad_output, output, dim)
