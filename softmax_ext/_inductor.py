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

The loss's upcast: transformers' losses call cross_entropy on
`logits.float()`. An opaque cross-entropy on that float32 tensor would make
Inductor write the float32 copy, and its float32 gradient be cast back to
16 bits in another pass. Where the logits of _cross_entropy_forward /
_cross_entropy_backward are an exact upcast of 16-bit logits in the traced
graph (a convert_element_type node, possibly under views; label_smoothing
0), the forward calls the op on the upcast cast back to 16 bits: Inductor folds
the pair of casts away, so the kernel reads the 16-bit logits. The op
returns the loss in float32 (acc_loss), the value the float32 call would
have given before any rounding to 16 bits. The
backward, pointwise once the log-sum-exp is known, becomes aten ops on the
16-bit logits that Inductor fuses with the gradient's cast back to 16 bits
(and with whatever else AOTAutograd adds to it) into one pass. Logits that
are no upcast (float32 models, the transformers integration's 16-bit
logits) get the same pointwise backward: a model that returns its logits
has AOTAutograd add their tangent to the gradient, and Inductor fuses that
add in (label_smoothing 0; the forward keeps softmax_ext's kernel).

SOFTMAX_EXT_INDUCTOR_HANDOFF=0 in the environment keeps every call on
softmax_ext's kernels as traced. The numerics are those of the ops:
float32 math for 16-bit inputs (float64 when a float64 tensor is
involved), results in the op's output dtype.

The decompositions go into Inductor's table when torch._inductor's lowering
module is imported (a post-import hook: importing Inductor costs seconds,
and softmax_ext does not import it itself)."""

import os

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from . import _import_hooks
from ._cross_entropy import kept_targets

HANDOFF = os.environ.get("SOFTMAX_EXT_INDUCTOR_HANDOFF", "1") != "0"
HANDOFF_MAX_ROW = 1024
HANDOFF_MAX_ROW_BACKWARD = 16384
HANDOFF_DEVICES = ("cuda",)  # where the lengths above were measured
_MODULE = "torch._inductor.lowering"
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
    def decomposition(x, dim=-1, dtype=None):
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


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default,
          torch.ops.aten.detach.default, torch.ops.aten.alias.default)
_CONVERTS = (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)
_downcasts = WeakTensorKeyDictionary()  # traced upcast -> its cast back to 16 bits


def _view_chain(node):
    """`node`, then each node it is a view of, nearest first."""
    while True:
        yield node
        if not (node.op == "call_function" and node.target in _VIEWS and isinstance(node.args[0], torch.fx.Node)):
            return
        node = node.args[0]


def _shaped_as(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t if tuple(t.shape) == tuple(x.shape) else t.reshape(x.shape)


def _upcast_source(x: torch.Tensor):
    """When float32 `x` is, in the graph being traced, an upcast of a 16-bit
    tensor (possibly under views, as transformers' logits.float().view(-1,
    vocab)): that 16-bit tensor viewed as x, or, when the tracer no longer
    holds it, the upcast cast back to 16 bits. None otherwise.

    The cast back is one node per upcast, shared by the forward and the
    backward, so the upcast feeds nothing else and Inductor folds the pair
    of casts away (its pointless-convert pass). Either way the 16-bit logits
    are read as they are and the float32 copy is never written."""
    if x.dtype != torch.float32 or x.device.type not in HANDOFF_DEVICES:
        return None
    try:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

        mode = get_proxy_mode()
        if mode is None:
            return None
        *_, node = _view_chain(get_proxy_slot(x, mode.tracer).proxy.node)
        if node.op != "call_function" or node.target not in _CONVERTS or not isinstance(node.args[0], torch.fx.Node):
            return None
        val = node.args[0].meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in (torch.bfloat16, torch.float16) \
                or val.device != x.device:
            return None
        held = {slot.proxy.node: t for t, slot in mode.tracer.tensor_tracker.items()}
        # the 16-bit tensor itself, or a tensor it is a view of, when the
        # tracer still holds one (a model's returned logits): used directly
        for source in _view_chain(node.args[0]):
            t = held.get(source)
            if t is not None and t.dtype == val.dtype and t.numel() == x.numel():
                return _shaped_as(t, x)
        # otherwise the upcast's traced tensor (x's views keep it alive), cast back
        upcast = held.get(node)
    except Exception:  # not traced, or a torch whose tracer differs
        return None
    if upcast is None or upcast.numel() != x.numel():
        return None
    x16 = _downcasts.get(upcast)
    if x16 is None:
        x16 = _downcasts[upcast] = upcast.to(val.dtype)
    return _shaped_as(x16, x)


def _cross_entropy_forward(logits, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0, inplace_backward=False, acc_loss=False):
    x16 = _upcast_source(logits) if label_smoothing == 0.0 else None
    if x16 is None:
        return NotImplemented
    # the loss in float32, the dtype of the upcast logits
    return _ops._cross_entropy_forward.default(x16, target, weight, ignore_index, reduction, label_smoothing,
                                               False, True)


def _cross_entropy_backward(grad_loss, logits, target, weight, row_stats, total_weight, ignore_index, reduction,
                            label_smoothing):
    """Given each row's max m and ls = log sum exp(x - m) (row_stats), the
    gradient is pointwise: s_i * w[t_i] * (exp((x_ic - m_i) - ls_i) -
    [c = t_i]), zero rows for ignored targets. Written
    in aten ops, it becomes one Inductor kernel with its neighbours (the
    cast of the gradient back to 16 bits where the logits were an upcast,
    and the tangent of a model output that returns the logits, which
    AOTAutograd adds to the gradient): one read of the logits and one write
    of the gradient, where an opaque kernel would leave those to a second
    pass. Upcast 16-bit logits are read as the 16-bit tensor; the math is
    float32 (float64 for float64 logits), the true class's p - 1 included;
    the gradient has the logits' dtype, as the op's."""
    if label_smoothing != 0.0 or not logits.is_floating_point() or logits.dim() != 2:
        return NotImplemented
    x = _upcast_source(logits)
    if x is None:
        x = logits
    math = _math_dtype(logits.dtype)
    keep, safe = kept_targets(target, ignore_index)
    s = grad_loss.to(math)
    if reduction == "mean":
        s = s / total_weight.to(math)
    if weight is not None:
        s = s * weight.to(math)[safe]
    s = torch.where(keep, s, torch.zeros_like(s))
    stats = row_stats.to(math)
    p = torch.exp((x.to(math) - stats[:, 0:1]) - stats[:, 1:2])
    true_class = torch.arange(x.shape[1], device=x.device).unsqueeze(0) == safe.unsqueeze(1)
    return ((p - true_class.to(math)) * s.unsqueeze(1)).to(logits.dtype)


def table():
    """op overload -> decomposition, for Inductor's decomposition table."""
    return {
        _ops.softmax.default: _forward("softmax"),
        _ops.log_softmax.default: _forward("log_softmax"),
        _ops.softmax_backward.default: _backward("softmax"),
        _ops.log_softmax_backward.default: _backward("log_softmax"),
        _ops._cross_entropy_forward.default: _cross_entropy_forward,
        _ops._cross_entropy_backward.default: _cross_entropy_backward,
    }


def _register(lowering) -> None:
    """The decompositions into Inductor's table, and a fallback lowering for
    each op (the op's own kernel where its decomposition declines; Inductor
    creates those implicitly for other custom ops, but not for ops with a
    decomposition)."""
    from torch._inductor import decomposition
    from torch._library.utils import get_layout_constraint_tag

    for op, fn in table().items():
        decomposition.decompositions.setdefault(op, fn)
        if op not in lowering.lowerings:
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint, warn=False, override_decomp=True)
    cached = getattr(decomposition, "fast_random_decomps", None)
    if hasattr(cached, "cache_clear"):  # a copy of the table, made at the first compile
        cached.cache_clear()


def install() -> None:
    if HANDOFF:
        _import_hooks.after_import(_MODULE, _register, "the Inductor decompositions")
