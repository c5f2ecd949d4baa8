"""softmax_ext.distributed: softmax across devices.

* DTensor inputs: every op has a sharding rule (Shard of a non-axis dim and
  Replicate run locally; _dtensor.py), and softmax_ext.softmax /
  log_softmax serve a softmax axis that is itself sharded (Shard(axis)) by
  exchanging per-row statistics instead of gathering the axis.
* Plain tensors, for process groups managed by hand: softmax(local_shard,
  dim, group) and log_softmax(...) (_exchange.py).
* The per-rank steps as ops (csrc/distributed/): softmax_stats,
  softmax_normalize, softmax_backward_stats, softmax_backward_normalize.

See docs/distributed.md.
"""

import sys
from typing import Optional

import torch

from . import _meta  # noqa: F401  (fake kernels of the per-rank ops)
from .._import_hooks import after_import

_ops = torch.ops.softmax_ext

AVAILABLE = torch.distributed.is_available()


def softmax_stats(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """(..., 2) float32 (float64 for float64 x), "..." being x's shape without
    dim: each row's max and sum(exp(x - max))."""
    return _ops.softmax_stats.default(x, dim)


def softmax_normalize(x: torch.Tensor, stats: torch.Tensor, dim: int = -1, kind: str = "softmax") -> torch.Tensor:
    """softmax (kind="softmax": exp(x - M) / S) or log_softmax ("log_softmax":
    x - M - log(S)) of x given whole-row statistics stats[..., 0] = M,
    stats[..., 1] = S, as combine_stats returns them."""
    return _ops.softmax_normalize.default(x, stats, dim, kind)


def softmax_backward_stats(grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1,
                           kind: str = "softmax") -> torch.Tensor:
    """(...) float32 (float64): per row sum(output * grad_output) for
    kind="softmax", sum(grad_output) for "log_softmax"."""
    return _ops.softmax_backward_stats.default(grad_output, output, dim, kind)


def softmax_backward_normalize(grad_output: torch.Tensor, output: torch.Tensor, stats: torch.Tensor,
                               dim: int = -1, kind: str = "softmax") -> torch.Tensor:
    """The input gradient given the whole rows' backward statistic s:
    y * (dy - s) (softmax) or dy - exp(y) * s (log_softmax)."""
    return _ops.softmax_backward_normalize.default(grad_output, output, stats, dim, kind)


def plan(x: torch.Tensor, dim: int = -1, step: str = "stats") -> str:
    """The kernel a step ("stats", "normalize", "backward_stats",
    "backward_normalize") would run for tensors like x."""
    return _ops._rows_plan.default(x, dim, step)[0]


_DTENSOR = "torch.distributed.tensor"


def _register_dtensor_rules(_module=None) -> None:
    from . import _dtensor  # noqa: F401  (registers the DTensor sharding rules)


if AVAILABLE:
    from ._exchange import all_gather_stats, combine_stats, exchange_stats, exchange_sums, log_softmax, softmax

    # Importing DTensor costs about half a second, which users who never
    # touch it should not pay, and no DTensor can exist before it is imported.
    after_import(_DTENSOR, _register_dtensor_rules,
                 "the DTensor sharding rules (DTensor inputs to softmax_ext ops will fail)")

    def register_rule(name, rule):
        """Registers a DTensor sharding rule for torch.ops.softmax_ext.<name>
        (see _dtensor.py); imports DTensor."""
        from . import _dtensor

        _dtensor.register_rule(name, rule)

    def dtensor_call(x, dim: int, kind: str, dtype: Optional[torch.dtype]):
        """The sharded-axis path for softmax_ext.softmax / log_softmax: the
        result for a DTensor whose softmax axis is sharded, else None."""
        if _DTENSOR not in sys.modules:
            return None  # no DTensor can exist yet
        from torch.distributed.tensor import DTensor

        if not isinstance(x, DTensor):
            return None
        from . import _dtensor

        return _dtensor.sharded_axis_call(x, dim, kind, dtype)
else:

    def dtensor_call(x, dim, kind, dtype):
        return None
