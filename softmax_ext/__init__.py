"""softmax_ext: the softmax family as compiled PyTorch custom ops.

Importing the package loads softmax_ext._C, whose static initialisers register
every op under torch.ops.softmax_ext; the modules below add the fake (meta)
kernels, autograd formulas and the Python wrappers.
"""

import torch  # noqa: F401  (the extension links against libtorch)

from . import _C  # noqa: F401  (registers torch.ops.softmax_ext.*)
from . import _meta, _autograd  # noqa: F401  (fake kernels, autograd)
from . import nn
from ._build_info import build_info
from ._ops import log_softmax, log_softmax_backward, softmax, softmax_backward
from ._version import __version__
from .plan import Plan, Problem, plan

__all__ = [
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "plan",
    "Plan",
    "Problem",
    "nn",
    "build_info",
    "__version__",
]
