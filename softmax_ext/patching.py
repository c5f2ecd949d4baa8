"""softmax_ext.patch(): route torch's softmax, log_softmax and cross_entropy
entry points to softmax_ext, for existing models, in one line.

    softmax_ext.patch()            # from now on (softmax_ext.unpatch() undoes it)
    with softmax_ext.patch():      # only inside the block
        loss = model(x).loss

Each routed entry point serves the calls softmax_ext supports (a floating
tensor of up to 8 dims on CPU or CUDA, an int dim; for cross_entropy class
indices and the default size_average/reduce) and hands every other call to
torch unchanged, so a patched program raises only the errors torch raises.
Under torch.compile the routed calls trace to torch.ops.softmax_ext.*.
"""

import functools
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from . import _C, _ops
from ._cross_entropy import cross_entropy
from ._ops import _is_compiling, _torch_function_mode

_FLOATING = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Plain tensors: nn.Parameter is one for every op (as torch's own C bindings
# see it); other subclasses keep torch's entry points.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DEVICES = ("cpu", "cuda")

# (owner, attribute name) -> (torch's original, whether owner defined it
# itself rather than inheriting it), while patched.
_originals: Dict[Tuple[object, str], Tuple[Callable, bool]] = {}
_MISSING = object()  # dim not given: torch raises its own error


def _serves(x, dim, dtype) -> bool:
    """True for the calls softmax_ext's softmax/log_softmax take as torch would."""
    return (
        type(x) in _PLAIN
        and type(dim) is int
        and -(1 << 63) <= dim < (1 << 63)  # (past int64: torch's own error)
        and x.device.type in _DEVICES
        and x.layout == torch.strided
        and x.dim() <= 8
        and (x.dtype in _FLOATING if dtype is None else dtype in _FLOATING and not x.is_complex())
    )


def _autocast_serves(x) -> bool:
    """Under autocast softmax_ext follows CUDA's policy for softmax and
    log_softmax (computed in float32, see _autocast_dtype); other devices'
    autocast calls stay with torch."""
    return x.device.type == "cuda" or not torch.is_autocast_enabled(x.device.type)


def _autocast_dtype(x, dtype):
    # CUDA autocast runs torch's softmax and log_softmax of CUDA tensors in
    # float32; softmax_ext reads 16-bit inputs as they are and writes float32
    # without a cast pass.
    if (dtype is None and x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cuda"
            and torch.is_autocast_enabled("cuda")):
        return torch.float32
    return dtype


def _forward_routes(name: str, original: Callable, ours: Callable, fast: Callable):
    """torch.softmax / F.softmax style entry points (input, dim, ..., dtype).
    An eager call outside torch function modes takes `fast`, the same rules
    and the op in one C call (csrc/python/fast_calls.cpp), which returns None
    for a call it leaves to torch; torch.compile and torch function modes go
    through the Python rules (_serves, _autocast_serves, _autocast_dtype)."""

    if name.startswith("F."):
        # F.softmax(input, dim=None, _stacklevel=3, dtype=None)
        @functools.wraps(original)
        def routed(input, dim=None, _stacklevel=3, dtype=None):
            if not _is_compiling() and not _torch_function_mode():
                y = fast(input, dim, dtype)
                if y is not None:
                    return y
            elif _serves(input, dim, dtype) and _autocast_serves(input):
                return ours(input, dim, _autocast_dtype(input, dtype))
            return original(input, dim, _stacklevel, dtype)

        return routed

    # torch.softmax(input, dim, dtype=None), Tensor.softmax(self, dim, dtype=None)
    @functools.wraps(original)
    def routed(input, dim=_MISSING, dtype=None, *args, **kwargs):
        if not args and not kwargs:
            if not _is_compiling() and not _torch_function_mode():
                y = fast(input, dim, dtype)
                if y is not None:
                    return y
            elif _serves(input, dim, dtype) and _autocast_serves(input):
                return ours(input, dim, _autocast_dtype(input, dtype))
        if dim is _MISSING:
            return original(input, *args, **kwargs)
        if args or dtype is None:
            # (dtype is keyword-only in torch's overload for dimension names)
            return original(input, dim, *((dtype,) + args if args else ()), **kwargs)
        return original(input, dim, dtype=dtype, **kwargs)

    return routed


def _cross_entropy_serves(input, target, weight, size_average, reduce, reduction) -> bool:
    """True for the F.cross_entropy calls softmax_ext's cross_entropy takes:
    plain tensors of a floating dtype on CPU or CUDA, int64 class targets,
    no legacy size_average / reduce, a known reduction, and not under
    autocast (which computes torch's cross_entropy in float32 and returns a
    float32 loss). _C._route_cross_entropy is the same rules in one C call."""
    return (
        size_average is None
        and reduce is None
        and type(input) in _PLAIN
        and type(target) in _PLAIN
        and input.dtype in _FLOATING
        and input.device.type in _DEVICES
        and input.layout == torch.strided
        and target.dtype == torch.int64
        and target.dim() == max(input.dim() - 1, 0)
        and (weight is None or type(weight) in _PLAIN)
        and reduction in ("mean", "sum", "none")
        and not torch.is_autocast_enabled(input.device.type)
    )


def _cross_entropy_route(original: Callable):
    """F.cross_entropy: an eager call outside torch function modes asks
    _C._route_cross_entropy, torch.compile and function modes the Python
    rules (_cross_entropy_serves)."""

    @functools.wraps(original)
    def routed(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
               reduction="mean", label_smoothing=0.0):
        if not _is_compiling() and not _torch_function_mode():
            serves = _C._route_cross_entropy(input, target, weight, size_average, reduce, reduction)
        else:
            serves = _cross_entropy_serves(input, target, weight, size_average, reduce, reduction)
        if serves:
            return cross_entropy(input, target, weight, ignore_index, reduction, float(label_smoothing))
        return original(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)

    return routed


# Every routed entry point: (owner, attribute, label), and torch's own
# function for it, taken when softmax_ext is imported.
_TARGETS = [
    (torch, "softmax", "torch.softmax"),
    (torch, "log_softmax", "torch.log_softmax"),
    (torch.Tensor, "softmax", "Tensor.softmax"),
    (torch.Tensor, "log_softmax", "Tensor.log_softmax"),
    (F, "softmax", "F.softmax"),
    (F, "log_softmax", "F.log_softmax"),
    (F, "cross_entropy", "F.cross_entropy"),
]
_TORCH_FUNCTIONS = {label: getattr(owner, name) for owner, name, label in _TARGETS}


def routed(label: str) -> Callable:
    """The routed version of torch's entry point `label` (e.g. "F.softmax")."""
    original = _TORCH_FUNCTIONS[label]
    if label == "F.cross_entropy":
        return _cross_entropy_route(original)
    if label.endswith("log_softmax"):
        return _forward_routes(label, original, _ops.log_softmax, _C._route_log_softmax)
    return _forward_routes(label, original, _ops.softmax, _C._route_softmax)


class _Patched:
    """What patch() returns: the routing is on already; as a context manager
    it is undone when the block is left."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        unpatch()
        return False


def patch() -> _Patched:
    """Route torch.softmax, torch.log_softmax, Tensor.softmax,
    Tensor.log_softmax, F.softmax, F.log_softmax and F.cross_entropy to
    softmax_ext for the calls it serves (torch keeps the others). Calling it
    again while patched changes nothing. Use as a function (undo with
    unpatch()) or as a context manager."""
    if not _originals:
        for owner, name, label in _TARGETS:
            _originals[(owner, name)] = (getattr(owner, name), name in vars(owner))
            setattr(owner, name, routed(label))
    return _Patched()


def unpatch() -> None:
    """Give torch its own entry points back (nothing happens when not patched)."""
    while _originals:
        (owner, name), (original, own) = _originals.popitem()
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def is_patched() -> bool:
    return bool(_originals)
