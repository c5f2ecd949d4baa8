"""softmax_matmul: softmax(x, -1) @ v without the (d1, d2) probability matrix.

The C++ side (csrc/softmax_matmul/) registers three ops: the public
``softmax_matmul(x, v) -> out`` (CompositeImplicitAutograd, it calls the next
one), ``_softmax_matmul_forward(x, v) -> (out, lse)`` (the kernels; lse is the
row log-sum-exp the backward recomputes P from) and
``_softmax_matmul_backward(dO, x, v, out, lse) -> (dx, dv)``, and their
autograd (csrc/softmax_matmul/autograd.cpp: the forward op's formula calls
the backward op; double backward raises NotImplementedError). This module
adds their fake kernels (same validation and output layout as ops.cpp) and
the wrapper ``softmax_ext.softmax_matmul``.
"""

import torch

from . import _C
from ._ops import _Tensor, _is_compiling, _torch_function_mode

_ops = torch.ops.softmax_ext
_OP = "softmax_ext.softmax_matmul"
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check(op: str, x: torch.Tensor, v: torch.Tensor) -> None:
    if x.device != v.device:
        raise ValueError(f"{op}: x is on {x.device} but v is on {v.device}; both must be on the same device")
    if x.dtype != v.dtype:
        raise ValueError(f"{op}: x has dtype {x.dtype} but v has dtype {v.dtype}; both must have the same dtype")
    if x.dtype not in _SUPPORTED:
        raise NotImplementedError(
            f"{op}: dtype {x.dtype} is not supported; accepted: float32, float16, bfloat16, float64"
        )
    if x.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"{op}: x {list(x.shape)} and v {list(v.shape)} must have at least 2 dimensions: "
            "x (..., d1, d2), v (..., d2, d3)"
        )
    if x.dim() != v.dim() or x.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"{op}: x has shape {list(x.shape)} and v has shape {list(v.shape)}; "
            "their leading dimensions must be equal (no broadcasting)"
        )
    if x.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"{op}: x has shape {list(x.shape)} and v has shape {list(v.shape)}; "
            "x.size(-1) (d2) must equal v.size(-2)"
        )


@torch.library.register_fake("softmax_ext::_softmax_matmul_forward")
def _forward_fake(x, v):
    _check(_OP, x, v)
    out = x.new_empty((*x.shape[:-1], v.shape[-1]))
    lse_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    lse = x.new_empty(x.shape[:-1], dtype=lse_dtype)
    return out, lse


@torch.library.register_fake("softmax_ext::_softmax_matmul_backward")
def _backward_fake(grad_output, x, v, output, lse):
    _check(f"{_OP} (backward)", x, v)
    return x.new_empty(x.shape), v.new_empty(v.shape)


def softmax_matmul(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(x, -1) @ v for x (..., d1, d2) and v (..., d2, d3) with equal
    leading dims, never materialising softmax(x). float32 on CUDA follows
    torch.backends.cuda.matmul.allow_tf32 like torch.matmul."""
    # plain tensors in eager mode: _C's direct entry point (no torch.ops
    # argument parsing; no autograd kernel when no gradient is tracked)
    if type(x) is _Tensor and type(v) is _Tensor and not _is_compiling() and not _torch_function_mode():
        return _C._softmax_matmul(x, v)
    return _ops.softmax_matmul.default(x, v)
