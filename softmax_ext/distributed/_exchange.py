"""The sharded-axis softmax on plain tensors: each rank holds a slice of the
softmax axis (its local shard); the ranks of one or more process groups
together hold whole rows.

    forward:  stats = softmax_stats(shard)            one read of the shard
              all-gather stats over each group        (rows, 2) per rank
              combine them in rank order              the same bits on every rank
              y = softmax_normalize(shard, stats)     one read, one write
    backward: s = softmax_backward_stats(dy, y)       sum(y * dy) or sum(dy)
              all-gather, sum in rank order
              dx = softmax_backward_normalize(dy, y, s)

Statistics are float32 (float64 for float64 shards). The combination runs
the same elementwise torch ops in the same (rank) order on every rank, on
the same gathered values, so every rank gets bit-identical statistics and
reruns are bit-identical; nothing is reduced with atomics. With several
groups (an axis sharded over two mesh dimensions) the groups are combined
one after another, which keeps that property."""

from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

_ops = torch.ops.softmax_ext

Groups = Union[None, "dist.ProcessGroup", Sequence["dist.ProcessGroup"]]


def _groups(group: Groups):
    if group is None:
        return [None]  # the default group
    if isinstance(group, (list, tuple)):
        return list(group)
    return [group]


# torch 2.14 renamed all_gather_into_tensor (kept, deprecated) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_gather_stats(stats: torch.Tensor, group=None) -> torch.Tensor:
    """(world, *stats.shape): every rank's statistics, in rank order."""
    world = dist.get_world_size(group)
    if world == 1:
        return stats.unsqueeze(0)
    flat = stats.contiguous().view(-1)
    out = flat.new_empty(world * flat.numel())
    _all_gather_single(out, flat, group=group)
    return out.view((world,) + tuple(stats.shape))


def combine_stats(gathered: torch.Tensor) -> torch.Tensor:
    """Combines per-rank (max, sum) statistics, gathered as (world, ..., 2),
    into the statistics of the whole rows, in rank order: the max over ranks
    first (NaN wins), then each rank's sum rescaled to it, added rank by
    rank. A rank whose slice is empty or all -inf has max -inf and adds 0."""
    maxes, sums = gathered[..., 0], gathered[..., 1]
    m = maxes[0]
    for r in range(1, gathered.shape[0]):
        m = torch.maximum(m, maxes[r])  # propagates NaN
    total = torch.zeros_like(m)
    for r in range(gathered.shape[0]):
        rescaled = sums[r] * torch.exp(maxes[r] - m)
        total = total + torch.where(maxes[r] == float("-inf"), torch.zeros_like(rescaled), rescaled)
    return torch.stack((m, total), dim=-1)


def exchange_stats(stats: torch.Tensor, group: Groups = None) -> torch.Tensor:
    """The whole rows' (max, sum) from this rank's softmax_stats."""
    for g in _groups(group):
        if dist.get_world_size(g) > 1:  # one rank's statistics are the rows' already
            stats = combine_stats(all_gather_stats(stats, g))
    return stats


def exchange_sums(sums: torch.Tensor, group: Groups = None) -> torch.Tensor:
    """The whole rows' sum from this rank's softmax_backward_stats (added in
    rank order)."""
    for g in _groups(group):
        if dist.get_world_size(g) == 1:
            continue
        gathered = all_gather_stats(sums, g)
        total = gathered[0]
        for r in range(1, gathered.shape[0]):
            total = total + gathered[r]
        sums = total
    return sums


def sharded_forward(x: torch.Tensor, dim: int, kind: str, group: Groups) -> torch.Tensor:
    """This rank's slice of (log_)softmax: local statistics, exchanged, then
    the normalising pass."""
    stats = exchange_stats(_ops.softmax_stats.default(x, dim), group)
    return _ops.softmax_normalize.default(x, stats, dim, kind)


def sharded_backward(dy: torch.Tensor, y: torch.Tensor, dim: int, kind: str, group: Groups) -> torch.Tensor:
    """This rank's slice of the input gradient from its slices of dy and y."""
    if dy.dtype != y.dtype:
        dy = dy.to(y.dtype)
    s = exchange_sums(_ops.softmax_backward_stats.default(dy, y, dim, kind), group)
    return _ops.softmax_backward_normalize.default(dy, y, s, dim, kind)


class _ShardedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, kind, group):
        y = sharded_forward(x, dim, kind, group)
        ctx.save_for_backward(y)
        ctx.dim, ctx.kind, ctx.group = dim, kind, group
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return sharded_backward(dy, y, ctx.dim, ctx.kind, ctx.group), None, None, None


def sharded(x: torch.Tensor, dim: int, kind: str, group: Groups = None,
            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    return _ShardedSoftmax.apply(x, dim, kind, group)


def softmax(local_shard: torch.Tensor, dim: int = -1, group: Groups = None,
            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax along `dim` of a tensor whose `dim` is split over the ranks of
    `group` (a process group, a sequence of them, or None for the default
    group): `local_shard` is this rank's slice of the axis (slices may have
    different lengths, or none), the other dimensions equal on every rank.
    Returns this rank's slice of the result. Differentiable; the forward and
    the backward each exchange (rows, 2) float32 (backward: (rows,)) values
    per rank, never the shard."""
    return sharded(local_shard, dim, "softmax", group, dtype)


def log_softmax(local_shard: torch.Tensor, dim: int = -1, group: Groups = None,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """log_softmax along a `dim` split over `group`; see softmax()."""
    return sharded(local_shard, dim, "log_softmax", group, dtype)
