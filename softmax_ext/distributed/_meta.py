"""Fake (meta) kernels of the per-rank ops of the sharded-axis softmax; they
follow csrc/distributed/row_ops.cpp (checks, shapes, dtypes, strides)."""

import torch

from .._meta import _new_output, _wrap_dim

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_ACCEPTED = "accepted: float32, float16, bfloat16, float64"
_KINDS = ("softmax", "log_softmax")


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _batch_shape(t: torch.Tensor, axis: int):
    return [s for d, s in enumerate(t.shape) if d != axis]


def _check_input(op: str, x: torch.Tensor) -> None:
    if x.dtype not in _SUPPORTED:
        raise NotImplementedError(f"{op}: input dtype {x.dtype} is not supported; {_ACCEPTED}")


def _check_kind(op: str, kind: str) -> None:
    if kind not in _KINDS:
        raise ValueError(f"{op}: kind='{kind}' is not known; accepted: 'softmax', 'log_softmax'")


def _check_stats(op: str, stats: torch.Tensor, like: torch.Tensor, shape) -> None:
    if stats.device != like.device:
        raise ValueError(f"{op}: stats is on {stats.device} but the input is on {like.device}; both must be on one device")
    if stats.dtype != _acc(like.dtype):
        raise ValueError(f"{op}: stats has dtype {stats.dtype} but a {like.dtype} input takes {_acc(like.dtype)} statistics")
    if list(stats.shape) != list(shape):
        raise ValueError(f"{op}: stats has shape {list(stats.shape)} but the input's rows take shape {list(shape)}")


def _check_pair(op: str, grad: torch.Tensor, out: torch.Tensor) -> None:
    if grad.device != out.device:
        raise ValueError(f"{op}: grad_output is on {grad.device} but output is on {out.device}; both must be on one device")
    if grad.shape != out.shape:
        raise ValueError(f"{op}: grad_output has shape {list(grad.shape)} but output has shape {list(out.shape)}; the shapes must be equal")
    if grad.dtype != out.dtype:
        raise ValueError(f"{op}: grad_output has dtype {grad.dtype} but output has dtype {out.dtype}; the dtypes must be equal")
    if out.dtype not in _SUPPORTED:
        raise NotImplementedError(f"{op}: dtype {out.dtype} is not supported; {_ACCEPTED}")


@torch.library.register_fake("softmax_ext::softmax_stats")
def _stats_fake(x, dim):
    op = "softmax_ext.softmax_stats"
    _check_input(op, x)
    axis = _wrap_dim(op, dim, x.dim())
    return x.new_empty(_batch_shape(x, axis) + [2], dtype=_acc(x.dtype))


@torch.library.register_fake("softmax_ext::softmax_normalize")
def _normalize_fake(x, stats, dim, kind):
    op = "softmax_ext.softmax_normalize"
    _check_kind(op, kind)
    _check_input(op, x)
    axis = _wrap_dim(op, dim, x.dim())
    _check_stats(op, stats, x, _batch_shape(x, axis) + [2])
    return _new_output(x, x.dtype)


@torch.library.register_fake("softmax_ext::softmax_backward_stats")
def _backward_stats_fake(grad_output, output, dim, kind):
    op = "softmax_ext.softmax_backward_stats"
    _check_kind(op, kind)
    _check_pair(op, grad_output, output)
    axis = _wrap_dim(op, dim, output.dim())
    return output.new_empty(_batch_shape(output, axis), dtype=_acc(output.dtype))


@torch.library.register_fake("softmax_ext::softmax_backward_normalize")
def _backward_normalize_fake(grad_output, output, stats, dim, kind):
    op = "softmax_ext.softmax_backward_normalize"
    _check_kind(op, kind)
    _check_pair(op, grad_output, output)
    axis = _wrap_dim(op, dim, output.dim())
    _check_stats(op, stats, output, _batch_shape(output, axis))
    return _new_output(output, output.dtype)
