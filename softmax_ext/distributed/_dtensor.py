"""DTensor support: sharding rules for the package's ops (registered with
torch.distributed.tensor.experimental.register_sharding), and the path that
serves a softmax axis sharded over a mesh dimension.

Rules. A rule lists, for one mesh dimension, the placements an op runs
under locally: each entry is (output placements, input placements), one
input placement per argument (None for non-tensors). DTensor expands the
list over every mesh dimension and redistributes inputs to the cheapest
entry. Before listing, every rule checks the placements it is given: a
Partial (or any placement other than Shard / Replicate) raises
NotImplementedError naming it, rather than being all-reduced silently, and
so does a Shard of the softmax axis, which only the Python wrappers serve
(softmax_ext.softmax / log_softmax: they exchange statistics instead of
gathering the axis; see sharded_axis_call below).

Adding an op later takes one line in _register_all (the hook is
register_rule): e.g. for a row-wise op whose tensors all share one axis,
    register_rule("my_op", rowwise_rule(tensor_args=(0,), dim_arg=1))
and for ops whose tensors relate otherwise (softmax_matmul: x (..., d1, d2)
and v (..., d2, d3); cross_entropy: logits (N, C, ...) and target
(N, ...)), a function of the op's arguments (DTensorSpec for tensors)
returning the list of (outputs, inputs) placements, e.g. for softmax_matmul:
Shard(b) of x, v and out for each leading dim b, Shard(d1) of x and out
with v Replicate, all Replicate.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from . import _exchange
from .._meta import _wrap_dim

_ops = torch.ops.softmax_ext

# op name -> rule(*args) -> [(out placements, in placements)], for one mesh dim.
RULES: Dict[str, Callable] = {}


def _placements_of(spec) -> Tuple:
    return tuple(getattr(spec, "placements", ()))


def check_placements(op: str, specs: Sequence, axes: Sequence[Optional[int]]) -> None:
    """NotImplementedError for placements a rule cannot serve: anything but
    Shard / Replicate, and (where axes[i] is not None) a Shard of tensor i's
    softmax axis."""
    for i, spec in enumerate(specs):
        for mesh_dim, p in enumerate(_placements_of(spec)):
            if isinstance(p, Replicate) or (type(p) is Shard and p.dim != axes[i]):
                continue
            if type(p) is Shard:
                raise NotImplementedError(
                    f"softmax_ext.{op}: placement {p!r} on mesh dim {mesh_dim} shards the softmax axis "
                    f"(dim {axes[i]}); torch.ops.softmax_ext.{op} serves Shard of other dims and Replicate. "
                    "Call softmax_ext.softmax / softmax_ext.log_softmax (the Python functions), which "
                    "exchange per-row statistics across the shards of the axis"
                )
            raise NotImplementedError(
                f"softmax_ext.{op}: placement {p!r} on mesh dim {mesh_dim} is not supported "
                f"(placements {list(_placements_of(spec))}); accepted: Shard of a dim other than the "
                "softmax axis, Replicate, and Shard of the axis through softmax_ext.softmax / log_softmax. "
                "Redistribute (e.g. x.redistribute(placements=[Replicate()])) first"
            )


def rowwise_rule(tensor_args: Sequence[int], dim_arg: int, outputs: int = 1,
                 reduced_args: Sequence[int] = (), reduced_output: bool = False) -> Callable:
    """The rule of an op reducing along one axis shared by its tensor
    arguments (at positions tensor_args; the axis is argument dim_arg), with
    outputs shaped like them: Replicate, or the same Shard(d) for every
    tensor, for every dim d but the axis. Tensors at reduced_args (and the
    output, with reduced_output) are per-row statistics: the shape without
    the axis (plus trailing dims), so Shard(d) of the rows is their
    Shard(d - 1) past the axis."""

    def rule(op: str, *args) -> List:
        full = [i for i in tensor_args if i not in reduced_args]
        ndim = len(args[full[0]].shape)
        axis = args[dim_arg] % max(ndim, 1)
        check_placements(op, [args[i] for i in tensor_args],
                         [None if i in reduced_args else axis for i in tensor_args])
        entries = []
        for d in [None] + [d for d in range(ndim) if d != axis]:
            placement = Replicate() if d is None else Shard(d)
            stats = Replicate() if d is None else Shard(d if d < axis else d - 1)
            ins = [stats if i in reduced_args else placement if i in tensor_args else None for i in range(len(args))]
            entries.append(([stats if reduced_output else placement] * outputs, ins))
        return entries

    return rule


def register_rule(name: str, rule: Callable) -> None:
    """Registers rule for torch.ops.softmax_ext.<name>.default with DTensor.
    rule(op_name, *args) gets the op's arguments (DTensorSpec for tensors)."""
    op = getattr(_ops, name).default
    RULES[name] = rule

    def sharding(*args, **kwargs):
        bound = _fill_defaults(op, args, kwargs)
        return rule(name, *bound)

    register_sharding(op)(sharding)


def _fill_defaults(op, args, kwargs) -> list:
    values = list(args)
    for a in op._schema.arguments[len(values):]:
        values.append(kwargs[a.name] if a.name in kwargs else a.default_value)
    return values


def _register_all() -> None:
    register_rule("softmax", rowwise_rule(tensor_args=(0,), dim_arg=1))
    register_rule("log_softmax", rowwise_rule(tensor_args=(0,), dim_arg=1))
    register_rule("softmax_backward", rowwise_rule(tensor_args=(0, 1), dim_arg=2))
    register_rule("log_softmax_backward", rowwise_rule(tensor_args=(0, 1), dim_arg=2))
    # The per-rank steps run locally under the same placements (their
    # statistics are per shard: a Shard of the axis is refused here too).
    register_rule("softmax_stats", rowwise_rule(tensor_args=(0,), dim_arg=1, reduced_output=True))
    register_rule("softmax_normalize", rowwise_rule(tensor_args=(0, 1), dim_arg=2, reduced_args=(1,)))
    register_rule("softmax_backward_stats", rowwise_rule(tensor_args=(0, 1), dim_arg=2, reduced_output=True))
    register_rule("softmax_backward_normalize", rowwise_rule(tensor_args=(0, 1, 2), dim_arg=3, reduced_args=(2,)))
    # Autograd runs above DTensor's dispatch, so the ops that the public
    # softmax_matmul and cross_entropy decompose into (and their autograd
    # formulas call) carry the rules.
    register_rule("_softmax_matmul_forward", _softmax_matmul_forward_rule)
    register_rule("_softmax_matmul_backward", _softmax_matmul_backward_rule)
    register_rule("_cross_entropy_forward", _cross_entropy_forward_rule)
    register_rule("_cross_entropy_backward", _cross_entropy_backward_rule)


def _batch_dims(spec) -> int:
    return len(spec.shape) - 2


def _softmax_matmul_forward_rule(op: str, x, v) -> List:
    """x (..., d1, d2), v (..., d2, d3) -> out (..., d1, d3), lse (..., d1):
    Replicate; the same Shard of a leading dim everywhere; x, out and lse
    sharded along d1 with v replicated; v and out sharded along d3 with x
    and lse replicated (lse depends on x alone). d2, the softmax axis, is
    never sharded here."""
    nb = _batch_dims(x)
    check_placements(op, [x, v], [nb + 1, nb])
    R = Replicate()
    entries = [([R, R], [R, R])]
    entries += [([Shard(b), Shard(b)], [Shard(b), Shard(b)]) for b in range(nb)]
    entries.append(([Shard(nb), Shard(nb)], [Shard(nb), R]))
    entries.append(([Shard(nb + 1), R], [R, Shard(nb + 1)]))
    return entries


def _softmax_matmul_backward_rule(op: str, grad_output, x, v, output, lse) -> List:
    """(dO, x, v, out, lse) -> (dx, dv): Replicate; a Shard of a leading dim
    everywhere; d1 sharded (dO, x, out, lse) with v replicated, where dv sums
    over d1 and is Partial."""
    nb = _batch_dims(x)
    check_placements(op, [grad_output, x, v, output, lse], [None, nb + 1, nb, None, None])
    R = Replicate()
    entries = [([R, R], [R] * 5)]
    entries += [([Shard(b), Shard(b)], [Shard(b)] * 5) for b in range(nb)]
    entries.append(([Shard(nb), Partial()], [Shard(nb), Shard(nb), R, Shard(nb), Shard(nb)]))
    return entries


def _cross_entropy_forward_rule(op: str, logits, target, weight, ignore_index, reduction, label_smoothing,
                                inplace_backward, acc_loss) -> List:
    """(logits (N, C), target (N), weight (C)?) -> (loss, row_stats (N, 2),
    total weight ()): Replicate; or the rows sharded, where a "none" loss is
    sharded like them and a "sum" loss and the total weight are Partial (a
    "mean" loss, a ratio of two sums, takes Replicate). C, the softmax axis,
    is never sharded here."""
    check_placements(op, [logits, target], [1, None])
    R = Replicate()
    w = None if weight is None else R
    entries = [([R, R, R], [R, R, w] + [None] * 5)]
    if reduction in ("none", "sum"):
        loss = Shard(0) if reduction == "none" else Partial()
        entries.append(([loss, Shard(0), Partial()], [Shard(0), Shard(0), w] + [None] * 5))
    return entries


def _cross_entropy_backward_rule(op: str, grad_loss, logits, target, weight, row_stats, total_weight,
                                 ignore_index, reduction, label_smoothing) -> List:
    """Replicate; or the rows sharded (logits, target, row_stats; grad_loss too for
    "none"), with the total weight replicated: the gradient is sharded like
    the rows."""
    check_placements(op, [logits, target], [1, None])
    R = Replicate()
    w = None if weight is None else R
    rows = Shard(0)
    entries = [([R], [R, R, R, w, R, R] + [None] * 3)]
    entries.append(([rows], [rows if reduction == "none" else R, rows, rows, w, rows, R] + [None] * 3))
    return entries


# --------------------------------------------------------------------------
# The sharded axis
# --------------------------------------------------------------------------


def axis_mesh_dims(x: DTensor, axis: int) -> List[int]:
    """The mesh dims whose placement is Shard(axis)."""
    return [i for i, p in enumerate(x.placements) if type(p) is Shard and p.dim == axis]


class _ShardedAxis(torch.autograd.Function):
    """(log_)softmax of a DTensor over its sharded axis, DTensor in and out.
    The local shards go through _exchange's steps; the gradient comes back
    with x's placements, global shape and strides (to_local / from_local
    around the local Function would give, for uneven shards, a gradient
    whose strides differ from x's, which AccumulateGrad then redistributes
    to Replicate on some torch versions)."""

    @staticmethod
    def forward(ctx, x, dim, kind, groups, dtype):
        local = x.to_local()
        if dtype is not None and local.dtype != dtype:
            local = local.to(dtype)
        y = _exchange.sharded_forward(local, dim, kind, groups)
        ctx.save_for_backward(y)
        ctx.args = (dim, kind, groups)
        ctx.layout = (x.device_mesh, x.placements, x.shape, x.stride(), x.dtype)
        return DTensor.from_local(y, x.device_mesh, x.placements, run_check=False, shape=x.shape,
                                  stride=x.stride())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        mesh, placements, shape, stride, dtype = ctx.layout
        if isinstance(dy, DTensor):
            if tuple(dy.placements) != tuple(placements):
                dy = dy.redistribute(mesh, placements)
            dy = dy.to_local()
        dx = _exchange.sharded_backward(dy, y, *ctx.args)
        dx = DTensor.from_local(dx.to(dtype), mesh, placements, run_check=False, shape=shape, stride=stride)
        return dx, None, None, None, None


def sharded_axis_call(x: DTensor, dim: int, kind: str, dtype: Optional[torch.dtype]) -> Optional[DTensor]:
    """softmax / log_softmax of a DTensor whose axis is Shard(axis) on some
    mesh dims: None when it is not (the op's rule serves it). Runs on the
    local shards, exchanging the statistics over the process groups of those
    mesh dims; the output keeps x's placements (and its global shape, for
    uneven shards)."""
    axis = _wrap_dim(f"softmax_ext.{kind}", dim, x.ndim)
    mesh_dims = axis_mesh_dims(x, axis)
    if not mesh_dims:
        return None
    # Anything else must be a Shard of another dim or Replicate.
    check_placements(kind, [x], [None])
    groups = [x.device_mesh.get_group(d) for d in mesh_dims]
    return _ShardedAxis.apply(x, dim, kind, groups, dtype)


_register_all()
