"""Fake (meta) kernels: shape, dtype and strides of every op's output without
running it. torch.compile and FakeTensor tracing need them; they follow the
C++ rules of csrc/ops/ops.cpp (validation and output layout) exactly."""

import torch

try:  # decides False where symbolic sizes leave it open, instead of guarding
    from torch._prims_common import is_non_overlapping_and_dense_or_false as _dense
except ImportError:  # older torch
    from torch._prims_common import is_non_overlapping_and_dense as _dense

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_ACCEPTED = "accepted: float32, float16, bfloat16, float64"


def _wrap_dim(op: str, dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"{op}: dim {dim} is out of range for a tensor of {ndim} dimension(s) "
            f"(expected to be in range of [{-n}, {n - 1}])"
        )
    return dim % n


def _new_output(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The SPEC's output layout: like's strides when it is dense and
    non-overlapping, contiguous otherwise."""
    if _dense(like):
        return torch.empty_strided(like.shape, like.stride(), dtype=dtype, device=like.device)
    return torch.empty(like.shape, dtype=dtype, device=like.device)


def _forward_fake(op: str):
    def fake(x, dim=-1, dtype=None):
        if dtype is not None and dtype not in _SUPPORTED:
            raise NotImplementedError(f"{op}: dtype={dtype} is not supported; {_ACCEPTED}")
        if x.dtype not in _SUPPORTED and dtype is None:
            raise NotImplementedError(f"{op}: input dtype {x.dtype} is not supported; {_ACCEPTED}")
        _wrap_dim(op, dim, x.dim())
        return _new_output(x, dtype if dtype is not None else x.dtype)

    return fake


def _backward_fake(op: str):
    def fake(grad_output, output, dim):
        if grad_output.device != output.device:
            raise ValueError(f"{op}: grad_output is on {grad_output.device} but output is on {output.device}")
        if grad_output.shape != output.shape:
            raise ValueError(f"{op}: grad_output has shape {tuple(grad_output.shape)} but output has shape {tuple(output.shape)}")
        # grad_output may have another floating dtype than output (a traced
        # backward hands one over): the result has output's dtype.
        if output.dtype not in _SUPPORTED:
            raise NotImplementedError(f"{op}: output dtype {output.dtype} is not supported; {_ACCEPTED}")
        if grad_output.dtype not in _SUPPORTED:
            raise NotImplementedError(f"{op}: grad_output dtype {grad_output.dtype} is not supported; {_ACCEPTED}")
        _wrap_dim(op, dim, output.dim())
        return _new_output(output, output.dtype)

    return fake


for _name in ("softmax", "log_softmax"):
    torch.library.register_fake(f"softmax_ext::{_name}")(_forward_fake(f"softmax_ext.{_name}"))
for _name in ("softmax_backward", "log_softmax_backward"):
    torch.library.register_fake(f"softmax_ext::{_name}")(_backward_fake(f"softmax_ext.{_name}"))
