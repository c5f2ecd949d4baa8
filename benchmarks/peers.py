"""The implementations compared by bench_softmax, each behind one adapter.

An adapter is `make(op, direction, dim, x) -> fn or None`: op is "softmax" or
"log_softmax", direction "forward" or "backward", x a sample input. The
returned fn takes (x,) for forward and (dy, y) for backward and returns the
result; None means the peer does not offer this case (it is left out of the
table). An exception from make or fn is recorded as the peer refusing.
Optional peers (Triton, Liger-Kernel, QuACK) appear only when importable.
"""

import importlib

import torch

import softmax_ext


def _is_last(dim, x):
    return dim % x.dim() == x.dim() - 1


def ext_peer(op, direction, dim, x):
    if direction == "forward":
        ours = getattr(softmax_ext, op)
        return lambda x: ours(x, dim)
    ours = getattr(softmax_ext, f"{op}_backward")
    return lambda dy, y: ours(dy, y, dim)


def _torch_fn(op, direction, dim):
    if direction == "forward":
        fwd = getattr(torch, op)
        return lambda x: fwd(x, dim)
    aten = getattr(torch.ops.aten, f"_{op}_backward_data")
    return lambda dy, y: aten(dy, y, dim, y.dtype)


def torch_peer(op, direction, dim, x):
    return _torch_fn(op, direction, dim)


def compile_peer(op, direction, dim, x):
    return torch.compile(_torch_fn(op, direction, dim), dynamic=False)


PEERS = {"softmax_ext": ext_peer, "torch": torch_peer, "torch.compile": compile_peer}


def triton_peer(op, direction, dim, x):
    from .triton_softmax import fused_softmax, supported

    if direction != "forward" or not x.is_cuda or not supported(x, dim):
        return None
    log = op == "log_softmax"
    return lambda x: fused_softmax(x, dim, log=log)


def liger_peer(op, direction, dim, x):
    from liger_kernel.ops import softmax as liger

    if op != "softmax" or not x.is_cuda or not _is_last(dim, x):
        return None
    if direction == "forward":
        return lambda x: liger.LigerSoftmaxFunction.apply(x)
    # Liger's backward takes the launch settings its forward chose; take them
    # from a forward over one row (same N), outside the timed call.
    _, block, warps, multi = liger._softmax_forward(x.reshape(-1, x.shape[-1])[:1])
    return lambda dy, y: liger._softmax_backward(dy, y, block, warps, multi)


def quack_peer(op, direction, dim, x):
    # `quack.softmax` is shadowed by the function of that name; fetch the module.
    quack = importlib.import_module("quack.softmax")
    if op != "softmax" or not x.is_cuda or not _is_last(dim, x):
        return None
    n = x.shape[-1]
    if direction == "forward":
        return lambda x: quack.softmax_fwd(x.view(-1, n)).view(x.shape)
    return lambda dy, y: quack.softmax_bwd(dy.view(-1, n), y.view(-1, n)).view(dy.shape)


UNAVAILABLE = {}  # peer name -> why it is not in this run


def _optional(name, module, adapter):
    try:
        importlib.import_module(module)
    except ImportError as exc:
        UNAVAILABLE[name] = f"not importable ({exc})"
        return
    except Exception as exc:  # GPU runtimes may fail to initialise with other errors
        UNAVAILABLE[name] = f"import failed ({type(exc).__name__}: {exc})"
        return
    PEERS[name] = adapter


_optional("triton-tutorial", "triton", triton_peer)
_optional("liger", "liger_kernel.ops.softmax", liger_peer)
_optional("quack", "quack.softmax", quack_peer)
