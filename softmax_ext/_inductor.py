"""Under torch.compile (Inductor), short CUDA rows are handed back to Inductor.

Inductor fuses what sits around a softmax into the softmax's own kernel: an
attention's scale, its additive or causal mask, the cast of the result to
16 bits, the upcast of a loss's logits. An opaque op cannot join such a
fusion, so every neighbour would cost a memory pass of its own. Where
Inductor's softmax is itself at the memory floor (rows along the contiguous
axis of up to HANDOFF_MAX_ROW elements forward, HANDOFF_MAX_ROW_BACKWARD
backward; measured in benchmarks/bench_softmax.py, where torch.compile is
within a few percent of the copy bandwidth up to those lengths and falls
behind past them), softmax_ext's ops decompose into the same aten ops torch
would have traced, and Inductor fuses them as it does for torch's softmax.
Longer rows, strided axes, CPU tensors, symbolic row lengths and every
eager call keep softmax_ext's kernels. The graph that Dynamo captures still
holds torch.ops.softmax_ext.*; only Inductor's lowering changes.

SOFTMAX_EXT_INDUCTOR_HANDOFF=0 in the environment keeps every call on
softmax_ext's kernels. The numerics are those of the ops: float32 math for
16-bit inputs (float64 when a float64 tensor is involved), results in the
op's output dtype.

The decompositions go into Inductor's table when torch._inductor's
decomposition module is imported (a post-import hook: importing Inductor
costs seconds, and softmax_ext does not import it itself)."""

import importlib.abc
import importlib.util
import os
import sys

import torch

HANDOFF = os.environ.get("SOFTMAX_EXT_INDUCTOR_HANDOFF", "1") != "0"
HANDOFF_MAX_ROW = 1024
HANDOFF_MAX_ROW_BACKWARD = 16384
HANDOFF_DEVICES = ("cuda",)  # where the lengths above were measured
_MODULE = "torch._inductor.decomposition"
_ops = torch.ops.softmax_ext


def _row(t: torch.Tensor, dim: int):
    """The row length along `dim` when it is a concrete int and `dim` is the
    contiguous axis of a tensor on HANDOFF_DEVICES; None otherwise."""
    if t.device.type not in HANDOFF_DEVICES or t.dim() == 0:
        return None
    dim = dim % t.dim()
    n, stride = t.shape[dim], t.stride(dim)
    if not isinstance(n, int) or not isinstance(stride, int):
        return None
    return n if stride == 1 or n == 1 else None


def _math_dtype(*dtypes) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _forward(kind: str):
    def decomposition(x, dim, dtype=None):
        n = _row(x, dim)
        if n is None or n > HANDOFF_MAX_ROW or not x.is_floating_point():
            return NotImplemented
        out_dtype = dtype if dtype is not None else x.dtype
        t = x.to(_math_dtype(x.dtype, out_dtype))
        t = t - t.amax(dim, keepdim=True)
        if kind == "softmax":
            e = t.exp()
            return (e / e.sum(dim, keepdim=True)).to(out_dtype)
        return (t - t.exp().sum(dim, keepdim=True).log()).to(out_dtype)

    return decomposition


def _backward(kind: str):
    def decomposition(grad_output, output, dim):
        n = _row(output, dim)
        if n is None or n > HANDOFF_MAX_ROW_BACKWARD or _row(grad_output, dim) is None:
            return NotImplemented
        if not grad_output.is_floating_point() or not output.is_floating_point():
            return NotImplemented  # the op raises its own error
        math = _math_dtype(grad_output.dtype, output.dtype)
        g, y = grad_output.to(math), output.to(math)
        if kind == "softmax":
            gy = g * y
            dx = gy - y * gy.sum(dim, keepdim=True)
        else:
            dx = g - y.exp() * g.sum(dim, keepdim=True)
        return dx.to(output.dtype)

    return decomposition


def table():
    """op overload -> decomposition, for Inductor's decomposition table."""
    return {
        _ops.softmax.default: _forward("softmax"),
        _ops.log_softmax.default: _forward("log_softmax"),
        _ops.softmax_backward.default: _backward("softmax"),
        _ops.log_softmax_backward.default: _backward("log_softmax"),
    }


def _register(module) -> None:
    for op, fn in table().items():
        module.decompositions.setdefault(op, fn)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Registers the decompositions right after Inductor's decomposition
    module has run."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register(module)

        spec.loader.exec_module = exec_and_register
        return spec


def install() -> None:
    if not HANDOFF:
        return
    if _MODULE in sys.modules:
        _register(sys.modules[_MODULE])
    elif not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())
