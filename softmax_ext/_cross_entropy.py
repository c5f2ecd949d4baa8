"""The fused cross-entropy: Python side of softmax_ext.cross_entropy.

- The public op torch.ops.softmax_ext.cross_entropy (SPEC schema) gets a
  CompositeImplicitAutograd body here: it validates the call like
  F.cross_entropy, flattens (N, C, d...) or (C) logits to rows of C classes
  (eager calls on plain tensors: (N, C, d...) to (N, C, D), which the op
  reads as it is or copies to rows, csrc/cross_entropy/ops.cpp) and calls the
  forward helper op, so autograd, fake tensors and torch.compile all go
  through the helper ops.
- _cross_entropy_forward carries the autograd formula, in C++
  (csrc/cross_entropy/autograd.cpp: its backward is _cross_entropy_backward,
  or the in-place _cross_entropy_backward_ that writes the gradient over the
  logits when the caller asked for it).
- A differentiable eager call with reduction "mean" or "sum" takes the fused
  forward instead (_FusedGrad): _cross_entropy_forward_grad writes the loss
  and, in the same pass over the logits, the gradient for grad_loss = 1;
  the backward only scales it in place by grad_loss
  (_cross_entropy_grad_scale_, no pass when grad_loss is 1). One read of the
  logits and one write of the gradient per step, against two reads and a
  write. Other differentiable eager calls take the forward op and its
  formula (one C++ node). torch.compile, tensor subclasses, dispatch modes
  and functorch transforms call the forward op, whose formula they trace.
  Float16 logits keep the two-op path (a loss scaler's grad_loss >> 1 must
  scale their gradient before its one rounding to 16 bits), and so do CUDA
  rows of more than 208 KB, whose second read no longer comes from the chip
  (docs/cross_entropy.md), and every call while the latest backward had
  a grad_loss other than 1 (the backward kernels record it on the device,
  read by the host without a synchronisation: a loss divided before
  backward() takes the two-op path from the next step on).
- Fake kernels of every helper op (shapes, dtypes and strides as the C++
  bodies in csrc/cross_entropy/ops.cpp give them).
"""

import math
from typing import Optional

import torch

from . import _C
from ._ops import _Tensor, _is_compiling, _torch_function_mode

_ops = torch.ops.softmax_ext
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_ACCEPTED = "accepted: float32, float16, bfloat16, float64"
_REDUCTIONS = ("mean", "sum", "none")
_OP = "softmax_ext.cross_entropy"


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def kept_targets(target, ignore_index):
    """(rows whose target is not ignore_index, targets with 0 in the ignored
    rows: safe to gather with)."""
    keep = target != ignore_index
    return keep, torch.where(keep, target, torch.zeros_like(target)).long()


def _check(logits, target, weight, reduction, label_smoothing):
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError(f"{_OP}: logits and target must be tensors")
    if logits.dtype not in _SUPPORTED:
        raise NotImplementedError(f"{_OP}: logits dtype {logits.dtype} is not supported; {_ACCEPTED}")
    if target.is_floating_point():
        raise NotImplementedError(
            f"{_OP}: probability (soft) targets are not supported; target must hold class indices (int64)"
        )
    if target.dtype not in (torch.int64, torch.int32):
        raise NotImplementedError(f"{_OP}: target dtype {target.dtype} is not supported; accepted: int64, int32")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{_OP}: reduction={reduction!r} is not known; accepted: 'mean', 'sum', 'none'")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{_OP}: label_smoothing={label_smoothing} is out of range; accepted: [0.0, 1.0]")
    if target.device != logits.device:
        raise ValueError(f"{_OP}: target is on {target.device} but logits are on {logits.device}")
    if logits.dim() == 0:
        raise ValueError(f"{_OP}: logits must have a class dimension, got a 0-dim tensor")
    if logits.dim() == 1:
        if target.dim() != 0:
            raise ValueError(
                f"{_OP}: logits of shape {tuple(logits.shape)} (one sample) need a 0-dim target, "
                f"got shape {tuple(target.shape)}"
            )
    else:
        expected = (logits.shape[0],) + tuple(logits.shape[2:])
        if tuple(target.shape) != expected:
            raise ValueError(
                f"{_OP}: target has shape {tuple(target.shape)} but logits have shape {tuple(logits.shape)}; "
                f"expected target shape {expected}"
            )
    classes = logits.shape[0] if logits.dim() == 1 else logits.shape[1]
    if weight is not None:
        if weight.dim() != 1 or weight.shape[0] != classes:
            raise ValueError(
                f"{_OP}: weight has shape {tuple(weight.shape)} but there are {classes} classes; "
                f"expected ({classes},)"
            )
        if weight.device != logits.device:
            raise ValueError(f"{_OP}: weight is on {weight.device} but logits are on {logits.device}")
    return classes


def _cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    inplace_backward: bool = False,
) -> torch.Tensor:
    plain = _eager_plain(logits, target, weight)
    classes = _C._cross_entropy_valid(logits, target, weight, reduction, label_smoothing) if plain else None
    if classes is None:  # not plain, or not valid: the check with its errors
        classes = _check(logits, target, weight, reduction, label_smoothing)
    if logits.dim() == 1:
        rows, tgt = logits.unsqueeze(0), target.reshape(1)
    elif logits.dim() == 2:
        rows, tgt = logits, target
    elif plain:  # (N, C, d...) as (N, C, D): the op reads the layout or copies to rows (ops.cpp)
        n, d = logits.shape[0], math.prod(logits.shape[2:])
        rows, tgt = logits.reshape(n, classes, d), target.reshape(n, d)
    else:  # (N, C, d...): the class axis last, then rows of C
        rows, tgt = logits.movedim(1, -1).reshape(-1, classes), target.reshape(-1)
        inplace_backward = False  # the rows are a copy; nothing to save
    loss = rows_loss(rows, tgt, weight, ignore_index, reduction, float(label_smoothing), inplace_backward,
                     plain=plain)
    if reduction == "none" and logits.dim() != 2:
        loss = loss.reshape(target.shape)
    return loss


_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack


_FUSED_MAX_CUDA_ROW_BYTES = _C._CE_MAX_FUSED_ROW_BYTES  # 208 KB (cross_entropy/plan.h)


def _eager_plain(rows, target, weight):
    return (
        type(rows) is _Tensor
        and type(target) is _Tensor
        and (weight is None or type(weight) is _Tensor)
        and not _is_compiling()
        and not _torch_function_mode()
    )


def _fuses(rows, reduction, inplace_backward):
    """Whether a differentiable eager call takes the fused forward: mean or
    sum, not float16, rows of at most 208 KB on CUDA, and the latest such
    backward on the device type had an incoming gradient of 1 (a loss
    divided before backward(), as in gradient accumulation, would cost the
    fused path a scaling pass more than the two-op path costs)."""
    return (
        reduction != "none"
        and not inplace_backward
        and rows.dtype != torch.float16
        and (not rows.is_cuda or rows.shape[1] * rows.element_size() <= _FUSED_MAX_CUDA_ROW_BYTES)
        and _C._cross_entropy_grad_was_one(rows.is_cuda)
    )


def rows_loss(rows, tgt, weight, ignore_index, reduction, label_smoothing, inplace_backward=False, acc_loss=False,
              plain=None):
    """The loss of (N, C) rows. Plain tensors in eager mode go through _C's
    direct entry point (no torch.ops argument parsing): without a gradient
    to track, straight to the kernel; with one, the fused forward
    (_FusedGrad) or the forward op with its formula (a C++ node).
    Everything else (torch.compile, subclasses, dispatch modes, functorch)
    calls the forward op, whose autograd formula they trace."""
    args = (rows, tgt, weight, ignore_index, reduction, label_smoothing)
    if plain is None:
        plain = _eager_plain(rows, tgt, weight)
    if plain:
        if not (rows.requires_grad and torch.is_grad_enabled()):
            return _C._cross_entropy_rows(*args, inplace_backward, acc_loss, 0)
        if _dispatch_modes() == 0 and _functorch_level() is None:
            if _fuses(rows, reduction, inplace_backward):
                return _FusedGrad.apply(*args, inplace_backward, acc_loss)
            return _C._cross_entropy_rows(*args, inplace_backward, acc_loss, 0)
    return _ops._cross_entropy_forward.default(*args, inplace_backward, acc_loss)[0]


def _composite(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return _cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing, False)


torch.library.impl("softmax_ext::cross_entropy", "CompositeImplicitAutograd")(_composite)


# --- fake kernels -----------------------------------------------------------


def _fake_check(op, logits, target, weight, reduction):
    if logits.dtype not in _SUPPORTED:
        raise NotImplementedError(f"{op}: logits dtype {logits.dtype} is not supported; {_ACCEPTED}")
    if logits.dim() not in (2, 3):
        raise ValueError(f"{op}: logits must be (N, C) or (N, C, D) here, got shape {tuple(logits.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise NotImplementedError(f"{op}: target dtype {target.dtype} is not supported; accepted: int64, int32")
    if tuple(target.shape) != (logits.shape[0],) + tuple(logits.shape[2:]):
        raise ValueError(f"{op}: target has shape {tuple(target.shape)} but logits have shape {tuple(logits.shape)}")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != logits.shape[1]):
        raise ValueError(f"{op}: weight has shape {tuple(weight.shape)}; expected ({logits.shape[1]},)")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction={reduction!r} is not known; accepted: 'mean', 'sum', 'none'")


@torch.library.register_fake("softmax_ext::_cross_entropy_forward")
def _forward_fake(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  inplace_backward=False, acc_loss=False):
    _fake_check("softmax_ext._cross_entropy_forward", logits, target, weight, reduction)
    n = target.numel()  # rows: N, or the N * D positions of (N, C, D) logits
    acc = _acc(logits.dtype)
    loss = logits.new_empty((n,) if reduction == "none" else (), dtype=acc if acc_loss else logits.dtype)
    # row_stats: each row's max and log of its sum of exp(x - max)
    return loss, logits.new_empty((n, 2), dtype=acc), logits.new_empty((), dtype=acc)


@torch.library.register_fake("softmax_ext::_cross_entropy_forward_grad")
def _forward_grad_fake(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                       acc_loss=False):
    op = "softmax_ext._cross_entropy_forward_grad"
    _fake_check(op, logits, target, weight, reduction)
    if reduction == "none":
        raise ValueError(f"{op}: reduction='none' is not accepted; accepted: 'mean', 'sum'")
    loss, stats, total = _forward_fake(logits, target, weight, ignore_index, reduction, label_smoothing, False,
                                       acc_loss)
    return loss, stats, total, torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


@torch.library.register_fake("softmax_ext::_cross_entropy_grad_scale_")
def _grad_scale_fake(grad, grad_loss):
    pass


@torch.library.register_fake("softmax_ext::_cross_entropy_backward")
def _backward_fake(grad_loss, logits, target, weight, row_stats, total_weight, ignore_index, reduction,
                   label_smoothing):
    _fake_check("softmax_ext._cross_entropy_backward", logits, target, weight, reduction)
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


@torch.library.register_fake("softmax_ext::_cross_entropy_backward_")
def _backward_inplace_fake(grad_loss, logits, target, weight, row_stats, total_weight, ignore_index, reduction,
                           label_smoothing):
    _fake_check("softmax_ext._cross_entropy_backward_", logits, target, weight, reduction)


# --- autograd ---------------------------------------------------------------
# The forward op's formula is C++ (csrc/cross_entropy/autograd.cpp).


class _FusedGrad(torch.autograd.Function):
    """The fused forward under autograd (mean / sum, never in place): the
    gradient written in the forward (grad_loss = 1), scaled in place by the
    backward. A second backward through the same graph (retain_graph=True)
    takes the backward op from the saved logits and row statistics, as the
    gradient buffer was handed out."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing, inplace_backward, acc_loss):
        inputs = (logits, target, weight, ignore_index, reduction, label_smoothing, inplace_backward, acc_loss)
        loss, stats, total, ctx.grad = _C._cross_entropy_rows(*inputs, 2)
        ctx.args = (ignore_index, reduction, label_smoothing)
        ctx.save_for_backward(logits, target, weight, stats, total)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if not ctx.needs_input_grad[0]:
            return (None,) * 8
        grad = ctx.grad
        if grad is None:
            logits, target, weight, stats, total = ctx.saved_tensors
            grad = _ops._cross_entropy_backward.default(grad_loss, logits, target, weight, stats, total, *ctx.args)
        else:
            ctx.grad = None
            _C._cross_entropy_grad_scale(grad, grad_loss)
        return (grad,) + (None,) * 7


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """F.cross_entropy with class-index targets, fused: log-softmax and the
    gather in one pass over the logits (float32 math inside; the loss in the
    logits' dtype), backward in one read and one write.

    inplace_backward=True writes the gradient over `logits` in the backward
    pass (no (N, C) gradient buffer), for callers that no longer need the
    logits after the loss; under torch.compile it is ignored (the traced
    graph keeps the out-of-place op)."""
    if inplace_backward and torch.compiler.is_compiling():
        inplace_backward = False
    return _cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing, inplace_backward)
