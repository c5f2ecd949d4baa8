"""softmax_ext.plan(): what the dispatcher would run for a tensor, without
running it (the C++ select() step, see csrc/plan/plan.h)."""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class Problem:
    """The coalesced problem: rows x axis, after merging the non-axis dims."""

    rows: int
    axis_size: int
    axis_stride: int  # of x, in elements
    inner_size: int  # contiguous inner run when the axis is strided, else 1
    batch_sizes: Tuple[int, ...]  # non-axis dims, outermost first
    batch_strides: Tuple[int, ...]  # of x

    @property
    def rank(self) -> int:
        return len(self.batch_sizes) + 1


@dataclass(frozen=True)
class MatmulProblem:
    """softmax_matmul's problem: x (batch, d1, d2) @ v (batch, d2, d3), the
    leading dims flattened into batch."""

    batch: int
    d1: int
    d2: int
    d3: int


@dataclass(frozen=True)
class Plan:
    kernel: str  # stable name, e.g. "cuda.reference.f32"
    workspace_size: int  # bytes
    deterministic: bool
    accumulator: torch.dtype
    problem: "Problem | MatmulProblem"
    # softmax_matmul only: (rows of d1, columns of d3, columns of d2) per step,
    # and the math mode: "exact-f32", "tf32", "16-bit-f32-acc", "f32", "f64".
    tile: Optional[Tuple[int, int, int]] = None
    math: Optional[str] = None


def plan(
    x: torch.Tensor,
    dim: int = -1,
    kind: str = "softmax",
    backward: bool = False,
    dtype: Optional[torch.dtype] = None,
    v: Optional[torch.Tensor] = None,
) -> Plan:
    """The plan for softmax/log_softmax of `x` along `dim`: which kernel would
    run, without running it.

    Args:
        x: the input (a CPU or CUDA tensor of any dtype, shape and strides
            the ops accept); only its metadata is read.
        dim: the softmax axis, negative counts from the end (like the ops).
        kind: ``"softmax"`` or ``"log_softmax"``; ``"cross_entropy"`` (the
            fused cross-entropy of logits `x`, class dim 1 or 0 for 1-D
            logits, `dim` unused: the problem is the rows of C classes the op
            forms); ``"softmax_matmul"`` (softmax_matmul(x, v), with `v`;
            the plan adds its ``.tile`` and ``.math`` mode).
        backward: the plan of the backward op (``softmax_backward`` /
            ``log_softmax_backward``) with grad_output and output laid out
            like `x`, instead of the forward op.
        v: the second operand, for ``kind="softmax_matmul"``.
        dtype: as the ops' ``dtype=``: `x` read as if cast to it, the output
            in that dtype (``None``: x's dtype). Changes the kernel's dtype
            tag, e.g. ``cpu.lastdim.bf16_f32``.

    Returns:
        A :class:`Plan`: ``.kernel`` (stable name such as
        ``"cuda.warp.f32"``, ``"cpu.lastdim_backward.bf16"``),
        ``.workspace_size`` (bytes taken from the caching allocator),
        ``.deterministic``, ``.accumulator`` (torch dtype of the sums) and
        ``.problem`` (the coalesced rows x axis geometry, see
        :class:`Problem`).

    Raises the same errors as the op would for these arguments
    (``IndexError`` for `dim`, ``NotImplementedError`` for a dtype or
    device, ``ValueError`` for an unknown `kind`).
    """
    if kind == "cross_entropy":
        kernel, workspace, deterministic, acc, p = torch.ops.softmax_ext._plan_cross_entropy.default(x, backward)
        rows, classes, stride = p[:3]
        problem = Problem(rows, classes, 1, 1, (rows,), (stride,))
        return Plan(kernel, workspace, deterministic, getattr(torch, acc.lower()), problem)
    if kind == "softmax_matmul":
        if v is None:
            raise ValueError("softmax_ext.plan: kind='softmax_matmul' needs v=")
        kernel, workspace, deterministic, acc, math, tile, p = torch.ops.softmax_ext._softmax_matmul_plan.default(
            x, v, backward
        )
        return Plan(kernel, workspace, deterministic, getattr(torch, acc.lower()), MatmulProblem(*p),
                    tuple(tile), math)
    kernel, workspace, deterministic, acc, p = torch.ops.softmax_ext._plan.default(
        x, dim, kind, backward, dtype
    )
    rows, axis_size, axis_stride, inner, rank = p[:5]
    problem = Problem(rows, axis_size, axis_stride, inner, tuple(p[5 : 5 + rank]), tuple(p[5 + rank :]))
    return Plan(kernel, workspace, deterministic, getattr(torch, acc.lower()), problem)


def plan_limits(x: torch.Tensor, backward: bool = False) -> dict:
    """The axis-length thresholds the CUDA dispatcher applies to tensors like
    `x` (its device and dtype): contiguous rows up to ``warp`` elements run on
    the warp family, up to ``block`` on the block family, up to ``cluster`` on
    a thread-block cluster (0 when the device has none), longer ones on the
    split family; a strided axis up to ``strided`` on the strided family,
    longer ones on the strided split family. Rows laid out one after another
    of up to ``row_tile`` elements that are not a power of two run on the
    row-tile family: backward f32, bf16 and f16 rows; forward f32 rows that
    fill their lane group (0: none for this dtype or direction).
    Empty for CPU tensors."""
    names, values = torch.ops.softmax_ext._limits.default(x, backward)
    return dict(zip(names, values))
