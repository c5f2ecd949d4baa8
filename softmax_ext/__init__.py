"""softmax_ext: the softmax family as compiled PyTorch custom ops.

Importing the package loads softmax_ext._C, whose static initialisers register
every op under torch.ops.softmax_ext with its autograd; the modules below add the
fake (meta) kernels and the Python wrappers.
"""

import torch  # noqa: F401  (the extension links against libtorch)

from . import _compat

try:
    from . import _C  # noqa: F401  (registers torch.ops.softmax_ext.*)
except ImportError as exc:  # never fall back silently: there is no Python path
    _built = _compat.built_version_from_binary(__path__[0])
    if _built is not None:  # a _C for another torch names both versions
        _compat.check_torch_version(_built)
    raise ImportError(
        f"softmax_ext: the compiled extension softmax_ext._C could not be loaded from {__path__[0]} "
        f"({exc}). Importing from a source checkout needs an in-place build: "
        "pip install --no-build-isolation -e . (or run from another directory after "
        "pip install --no-build-isolation .)"
    ) from exc
_compat.check_torch_version(torch.ops.softmax_ext._build_info.default()[0])
from . import _meta  # noqa: F401  (fake kernels; autograd is registered in C++)
from . import _inductor

_inductor.install()  # short CUDA rows fuse with their neighbours under Inductor
from ._cross_entropy import cross_entropy  # fused cross-entropy (its op bodies, fakes, autograd)
from ._softmax_matmul import softmax_matmul  # fused softmax(x) @ v (its op bodies, fakes, autograd)
from . import nn
from . import distributed  # noqa: F401  (per-rank ops, DTensor rules: docs/distributed.md)
from ._build_info import build_info
from ._ops import log_softmax, log_softmax_backward, softmax, softmax_backward
from ._version import __version__
from .patching import is_patched, patch, unpatch
from .plan import Plan, Problem, plan, plan_limits

__all__ = [
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "cross_entropy",
    "patch",
    "unpatch",
    "is_patched",
    "softmax_matmul",
    "plan",
    "plan_limits",
    "Plan",
    "Problem",
    "nn",
    "build_info",
    "__version__",
]
