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

from typing import Optional

import torch

from . import _meta  # noqa: F401  (fake kernels of the per-rank ops)

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


if AVAILABLE:
    from ._exchange import all_gather_stats, combine_stats, exchange_stats, exchange_sums, log_softmax, softmax
    from . import _dtensor  # noqa: F401  (registers the DTensor sharding rules)
    from ._dtensor import register_rule, rowwise_rule

    def dtensor_call(x, dim: int, kind: str, dtype: Optional[torch.dtype]):
        """The sharded-axis path for softmax_ext.softmax / log_softmax: the
        result for a DTensor whose softmax axis is sharded, else None."""
        from torch.distributed.tensor import DTensor

        if not isinstance(x, DTensor):
            return None
        return _dtensor.sharded_axis_call(x, dim, kind, dtype)
else:

    def dtensor_call(x, dim, kind, dtype):
        return None
