"""Autograd for every op, registered on the ops themselves, so calling
torch.ops.softmax_ext.* directly is differentiable too.

softmax / log_softmax differentiate through the backward ops, which only need
the saved output. The backward ops have formulas of their own, which is what
makes double backward (and gradgradcheck) work.
"""

import torch

_ops = torch.ops.softmax_ext


def _setup_forward(ctx, inputs, output):
    x, dim, _dtype = inputs
    ctx.dim = dim
    ctx.x_dtype = x.dtype
    ctx.save_for_backward(output)


def _to_input_dtype(ctx, grad):
    # With dtype=, the output (and its gradient) has another dtype than x.
    return grad if grad.dtype == ctx.x_dtype else grad.to(ctx.x_dtype)


def _softmax_grad(ctx, grad):
    (y,) = ctx.saved_tensors
    return _to_input_dtype(ctx, _ops.softmax_backward.default(grad, y, ctx.dim)), None, None


def _log_softmax_grad(ctx, grad):
    (y,) = ctx.saved_tensors
    return _to_input_dtype(ctx, _ops.log_softmax_backward.default(grad, y, ctx.dim)), None, None


def _setup_backward(ctx, inputs, output):
    grad_output, output_, dim = inputs
    ctx.dim = dim
    ctx.save_for_backward(grad_output, output_)


def _softmax_backward_grad(ctx, g):
    # dx = y * (dy - s) with s = sum(y * dy):
    #   d/d dy = y * (g - sum(g * y))           = softmax_backward(g, y)
    #   d/d y  = g * (dy - s) - dy * sum(g * y)
    dy, y = ctx.saved_tensors
    grad_dy = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_dy = _ops.softmax_backward.default(g, y, ctx.dim)
    if ctx.needs_input_grad[1]:
        s = (y * dy).sum(ctx.dim, keepdim=True)
        gy = (g * y).sum(ctx.dim, keepdim=True)
        grad_y = g * (dy - s) - dy * gy
    return grad_dy, grad_y, None


def _log_softmax_backward_grad(ctx, g):
    # dx = dy - exp(y) * sum(dy):
    #   d/d dy = g - sum(g * exp(y))
    #   d/d y  = -g * exp(y) * sum(dy)
    dy, y = ctx.saved_tensors
    grad_dy = grad_y = None
    p = y.exp()
    if ctx.needs_input_grad[0]:
        grad_dy = g - (g * p).sum(ctx.dim, keepdim=True)
    if ctx.needs_input_grad[1]:
        grad_y = -g * p * dy.sum(ctx.dim, keepdim=True)
    return grad_dy, grad_y, None


torch.library.register_autograd("softmax_ext::softmax", _softmax_grad, setup_context=_setup_forward)
torch.library.register_autograd("softmax_ext::log_softmax", _log_softmax_grad, setup_context=_setup_forward)
torch.library.register_autograd(
    "softmax_ext::softmax_backward", _softmax_backward_grad, setup_context=_setup_backward
)
torch.library.register_autograd(
    "softmax_ext::log_softmax_backward", _log_softmax_backward_grad, setup_context=_setup_backward
)
