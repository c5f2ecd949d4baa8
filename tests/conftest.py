"""Shared helpers for the softmax_ext test suite.

Everything here is about *checking* softmax_ext against PyTorch:

* ``DEVICES`` / the ``device`` fixture: CPU always, CUDA when a GPU is present.
* ``TOLERANCES[dtype]``: one central (atol, rtol) table. The reference is
  torch computed in float64 and rounded to the output dtype, so the table only
  has to absorb one or two roundings in the output type plus the accumulation
  error of the accumulator (float32 for f16/bf16/f32, float64 for f64).
* ``reference_*``: the float64 references (torch.softmax / torch.log_softmax /
  aten._softmax_backward_data / aten._log_softmax_backward_data).
* ``assert_close_verbose``: a Liger-style mismatch reporter (counts, first
  indices, max abs / rel error, NaN and inf mismatches).
* ``assert_within_torch_bound``: the flash-attention style relative bound
  err(ours vs f64 ref) <= 2 * err(torch same dtype vs f64 ref) + eps.
* ``make_input``: seeded random inputs that are never zero.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist, share the CPUs among the workers: each worker's
    torch would otherwise run a thread per core for the CPU references, and
    eight workers on a 16-core GPU machine ran the row-tile tests about 20
    times slower than at two threads each. OMP_NUM_THREADS, if set, wins."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


# --------------------------------------------------------------------------
# Devices and dtypes
# --------------------------------------------------------------------------

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
HALF_DTYPES = [torch.float16, torch.bfloat16]

# (atol, rtol) against the float64 reference rounded to the output dtype.
#  * f64: the reference *is* torch's float64 result; only summation order may
#    differ (a few ulp of the row sum).
#  * f32: ~1e-7 relative from exp/log and the float32 row sum, so 1e-5 is
#    generous but still catches a wrong formula or a lost row element.
#  * f16 / bf16: the reference and ours are each rounded once to the output
#    type: at most ~1 ulp apart (f16 ulp 2^-10 ~ 9.8e-4, bf16 ulp 2^-7 ~
#    7.8e-3); rtol is ~2 ulp. atol covers the f16 subnormal range.
TOLERANCES = {
    torch.float64: dict(atol=1e-12, rtol=1e-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-5, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-4, rtol=1.6e-2),
}

# Backward ops involve a cancellation (dy - sum(y * dy)), so the absolute part
# scales with |dy| * |y|; the inputs below have |dy| = O(1).
BACKWARD_TOLERANCES = {
    torch.float64: dict(atol=1e-11, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=5e-5, rtol=2e-3),
    torch.bfloat16: dict(atol=5e-4, rtol=1.6e-2),
}

FORWARD_OPS = ["softmax", "log_softmax"]
BACKWARD_OPS = ["softmax_backward", "log_softmax_backward"]
ALL_OPS = FORWARD_OPS + BACKWARD_OPS


# The axis lengths, plus 1024 / 2049 (PyTorch's warp-per-row limits, +-1).
AXIS_LENGTHS = [1, 2, 31, 32, 33, 1000, 1024, 1025, 2049, 4097]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# --------------------------------------------------------------------------
# The package under test
# --------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _registered_ops():
    """Import softmax_ext once so torch.ops.softmax_ext.* exist in every test."""
    import softmax_ext  # noqa: F401


@pytest.fixture(scope="session")
def sx():
    """The imported ``softmax_ext`` package (importing registers the ops)."""
    import softmax_ext

    return softmax_ext


def ours(name: str) -> Callable:
    """softmax_ext.<name> (the Python wrapper)."""
    import softmax_ext

    return getattr(softmax_ext, name)


def custom_op(name: str):
    """torch.ops.softmax_ext.<name> (the registered op, not the wrapper)."""
    import softmax_ext  # noqa: F401  (registers the ops)

    return getattr(torch.ops.softmax_ext, name)


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


def make_generator(seed: int = 0) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def make_input(
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    scale: float = 2.0,
) -> torch.Tensor:
    """Random non-zero values ~ scale * N(0, 1), bounded away from 0.

    Drawn on the CPU from a seeded generator (identical on every device) and
    then moved; |x| >= 0.05 so no element is zero after rounding to any dtype.
    """
    g = make_generator(seed)
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale
    sign = torch.where(x < 0, -1.0, 1.0).to(torch.float64)
    x = torch.where(x.abs() < 0.05, sign * (0.05 + x.abs()), x)
    return x.to(dtype=dtype, device=device)


def contiguous_strides(shape: Sequence[int]) -> tuple:
    strides, acc = [], 1
    for s in reversed(list(shape)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Same definition as c10's: a permutation of a contiguous layout
    (size-1 dimensions may carry any stride)."""
    if t.numel() == 0:
        return True
    dims = [(st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1]
    dims.sort()
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def expected_output_strides(x: torch.Tensor) -> tuple:
    """SPEC: same strides as x when x is dense and non-overlapping,
    contiguous otherwise."""
    if is_non_overlapping_and_dense(x):
        return tuple(x.stride())
    return contiguous_strides(x.shape)


def assert_output_strides(out: torch.Tensor, x: torch.Tensor, what: str = "") -> None:
    """Compares strides on the dimensions where they mean something (size > 1)."""
    if out.numel() == 0:
        return
    exp = expected_output_strides(x)
    got = tuple(out.stride())
    mism = [
        d for d, sz in enumerate(out.shape) if sz > 1 and got[d] != exp[d]
    ]
    assert not mism, (
        f"{what}: output strides {got} differ from expected {exp} in dims {mism} "
        f"(input shape {tuple(x.shape)}, strides {tuple(x.stride())}, "
        f"dense={is_non_overlapping_and_dense(x)})"
    )


# --------------------------------------------------------------------------
# float64 references
# --------------------------------------------------------------------------


def _wrap(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    return dim % n


def reference_forward(
    name: str, x: torch.Tensor, dim: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """torch in float64 on the CPU, rounded to the output dtype.

    With ``dtype=``, x is first cast to ``dtype`` (SPEC: "the input is treated
    as if cast to dtype first").
    """
    out_dtype = dtype if dtype is not None else x.dtype
    x64 = x.detach().to("cpu").to(out_dtype).to(torch.float64)
    if name == "softmax":
        r = torch.softmax(x64, dim)
    elif name == "log_softmax":
        r = torch.log_softmax(x64, dim)
    else:
        raise ValueError(name)
    return r.to(out_dtype).to(x.device)


def reference_forward64(name: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    x64 = x.detach().to("cpu", torch.float64)
    return torch.softmax(x64, dim) if name == "softmax" else torch.log_softmax(x64, dim)


def reference_backward(
    name: str, grad_output: torch.Tensor, output: torch.Tensor, dim: int
) -> torch.Tensor:
    dy = grad_output.detach().to("cpu", torch.float64)
    y = output.detach().to("cpu", torch.float64)
    if dy.dim() == 0:
        dy, y, dim = dy.reshape(1), y.reshape(1), 0
        squeeze = True
    else:
        squeeze = False
    if name == "softmax_backward":
        r = torch.ops.aten._softmax_backward_data(dy, y, dim, torch.float64)
    elif name == "log_softmax_backward":
        r = torch.ops.aten._log_softmax_backward_data(dy, y, dim, torch.float64)
    else:
        raise ValueError(name)
    if squeeze:
        r = r.reshape(())
    return r.to(grad_output.dtype).to(grad_output.device)


def torch_same_dtype_forward(name: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch's own kernel in x's dtype on x's device (for the relative bound)."""
    return torch.softmax(x, dim) if name == "softmax" else torch.log_softmax(x, dim)


# --------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------


def _fmt_index(flat_index: int, shape: Sequence[int]) -> tuple:
    idx = []
    for s in reversed(list(shape)):
        s = max(int(s), 1)
        idx.append(flat_index % s)
        flat_index //= s
    return tuple(reversed(idx))


def assert_close_verbose(
    actual: torch.Tensor,
    expected: torch.Tensor,
    atol: float,
    rtol: float,
    msg: str = "",
    max_report: int = 5,
) -> None:
    """assert_close with a report that says *where* and *how much* it is off.

    NaN must match NaN and +-inf must match the same inf exactly.
    """
    assert isinstance(actual, torch.Tensor), f"{msg}: result is {type(actual)}"
    assert actual.shape == expected.shape, (
        f"{msg}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, (
        f"{msg}: dtype {actual.dtype} != expected {expected.dtype}"
    )
    assert actual.device == expected.device, (
        f"{msg}: device {actual.device} != expected {expected.device}"
    )
    if actual.numel() == 0:
        return
    a = actual.detach().to("cpu", torch.float64).reshape(-1)
    e = expected.detach().to("cpu", torch.float64).reshape(-1)
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    a_inf, e_inf = torch.isinf(a), torch.isinf(e)
    finite = ~(a_nan | e_nan | a_inf | e_inf)
    diff = torch.zeros_like(a)
    diff[finite] = (a[finite] - e[finite]).abs()
    tol = atol + rtol * e.abs()
    bad_val = finite & (diff > tol)
    bad_nan = a_nan != e_nan
    bad_inf = (a_inf | e_inf) & ~(a_nan | e_nan) & (a != e)
    bad = bad_val | bad_nan | bad_inf
    n_bad = int(bad.sum())
    if n_bad == 0:
        return
    lines = [
        f"{msg}: {n_bad} / {a.numel()} elements mismatch "
        f"(atol={atol:g}, rtol={rtol:g}; value {int(bad_val.sum())}, "
        f"nan {int(bad_nan.sum())}, inf {int(bad_inf.sum())})",
    ]
    if finite.any():
        rel = diff[finite] / e[finite].abs().clamp_min(1e-300)
        lines.append(
            f"  max abs err {float(diff[finite].max()):.3e}, "
            f"max rel err {float(rel.max()):.3e}"
        )
    for flat in torch.nonzero(bad).reshape(-1)[:max_report].tolist():
        lines.append(
            f"  at {_fmt_index(flat, actual.shape)}: got {float(a[flat])!r}, "
            f"expected {float(e[flat])!r}"
        )
    raise AssertionError("\n".join(lines))


def max_abs_err(a: torch.Tensor, ref64: torch.Tensor) -> float:
    a = a.detach().to("cpu", torch.float64)
    r = ref64.detach().to("cpu", torch.float64)
    m = torch.isfinite(a) & torch.isfinite(r)
    if not m.any():
        return 0.0
    return float((a[m] - r[m]).abs().max())


def assert_within_torch_bound(
    ours_out: torch.Tensor,
    torch_out: torch.Tensor,
    ref64: torch.Tensor,
    msg: str = "",
) -> None:
    """err(ours vs f64) <= 2 * err(torch same dtype vs f64) + eps.

    eps is one unit of the output dtype at the largest reference magnitude, so
    a result that is merely rounded differently from torch's still passes,
    while a systematically less accurate one fails.
    """
    dtype = ours_out.dtype
    ref_max = float(ref64.abs()[torch.isfinite(ref64)].max()) if ref64.numel() else 0.0
    eps = torch.finfo(dtype).eps * ref_max
    e_ours = max_abs_err(ours_out, ref64)
    e_torch = max_abs_err(torch_out, ref64)
    assert e_ours <= 2 * e_torch + eps, (
        f"{msg}: err(ours vs f64) = {e_ours:.3e} > 2 * err(torch {dtype_id(dtype)} "
        f"vs f64) = 2 * {e_torch:.3e} + eps {eps:.3e}"
    )


# --------------------------------------------------------------------------
# One-call checkers used by several test files
# --------------------------------------------------------------------------


def check_forward(
    name: str,
    x: torch.Tensor,
    dim: int,
    dtype: torch.dtype | None = None,
    *,
    via_op: bool = False,
    check_strides: bool = True,
    torch_bound: bool = False,
    msg: str = "",
) -> torch.Tensor:
    """Runs softmax_ext.<name>(x, dim, dtype) and checks dtype, shape, device,
    strides and values against the float64 reference."""
    fn = custom_op(name) if via_op else ours(name)
    out = fn(x, dim) if dtype is None else fn(x, dim, dtype=dtype)
    out_dtype = dtype if dtype is not None else x.dtype
    what = (
        f"{name}{' (torch.ops)' if via_op else ''} shape={tuple(x.shape)} "
        f"strides={tuple(x.stride())} dim={dim} {dtype_id(x.dtype)}"
        f"{'->' + dtype_id(dtype) if dtype is not None else ''} on {x.device} {msg}"
    )
    ref = reference_forward(name, x, dim, dtype)
    assert_close_verbose(out, ref, msg=what, **TOLERANCES[out_dtype])
    if check_strides:
        assert_output_strides(out, x, what)
    if torch_bound and dtype is None and x.dtype != torch.float64 and x.numel() > 0:
        assert_within_torch_bound(
            out, torch_same_dtype_forward(name, x, dim), reference_forward64(name, x, dim), what
        )
    return out


def make_backward_inputs(
    name: str,
    shape: Sequence[int],
    dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
):
    """(grad_output, output): output is a real softmax / log_softmax result
    (computed in float64, rounded to dtype), grad_output is random N(0, 1)."""
    x = make_input(shape, torch.float64, "cpu", seed=seed)
    d = dim if len(shape) else 0
    if len(shape) == 0:
        y = torch.softmax(x.reshape(1), 0).reshape(()) if name == "softmax_backward" \
            else torch.log_softmax(x.reshape(1), 0).reshape(())
    else:
        y = torch.softmax(x, d) if name == "softmax_backward" else torch.log_softmax(x, d)
    dy = make_input(shape, torch.float64, "cpu", seed=seed + 1000, scale=1.0)
    return dy.to(dtype=dtype, device=device), y.to(dtype=dtype, device=device)


def check_backward(
    name: str,
    dy: torch.Tensor,
    y: torch.Tensor,
    dim: int,
    *,
    via_op: bool = False,
    msg: str = "",
) -> torch.Tensor:
    fn = custom_op(name) if via_op else ours(name)
    out = fn(dy, y, dim)
    what = (
        f"{name}{' (torch.ops)' if via_op else ''} shape={tuple(dy.shape)} "
        f"dy.strides={tuple(dy.stride())} y.strides={tuple(y.stride())} dim={dim} "
        f"{dtype_id(dy.dtype)} on {dy.device} {msg}"
    )
    ref = reference_backward(name, dy, y, dim)
    assert_close_verbose(out, ref, msg=what, **BACKWARD_TOLERANCES[dy.dtype])
    return out


def sizes_for_rank(rank: int) -> tuple:
    """Small, distinct sizes (so a mixed-up axis shows) for a rank-r tensor."""
    base = [3, 2, 4, 2, 3, 2, 2, 3, 2, 2]
    return tuple(base[:rank])


def dims_for_rank(rank: int) -> list:
    if rank == 0:
        return [0, -1]
    return list(range(-rank, rank))


def mergeable(sizes: Sequence[int], strides: Sequence[int], axis: int) -> list:
    """Pairs (a, b) of non-axis dims (size > 1) that could be merged into one
    dimension in some order: stride[a] == size[b] * stride[b]."""
    dims = [d for d in range(len(sizes)) if d != axis and sizes[d] > 1]
    pairs = []
    for a in dims:
        for b in dims:
            if a != b and strides[a] == sizes[b] * strides[b]:
                pairs.append((a, b))
    return pairs


def isclose_scalar(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
