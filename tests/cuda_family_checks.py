"""Helpers of the CUDA family tests (tests/test_cuda_*.py): the thresholds
as softmax_ext.plan_limits reports them, tolerances scaled to the row
length, and a check that a shape runs on the expected kernel and gives the
float64 reference's values."""

import torch

from conftest import (
    BACKWARD_TOLERANCES,
    TOLERANCES,
    assert_close_verbose,
    make_backward_inputs,
    make_input,
    ours,
    reference_backward,
    reference_forward,
)

TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
KINDS = ["softmax", "log_softmax"]


def limits(dtype, backward=False):
    """select()'s thresholds for this device and dtype (softmax_ext.plan_limits)."""
    import softmax_ext

    return softmax_ext.plan_limits(torch.empty(1, dtype=dtype, device="cuda"), backward=backward)


def free_gib():
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


def tolerances(name, dtype, n):
    """Softmax values are ~1/n: scale the absolute tolerance with them so the
    check still bites on long rows."""
    table = BACKWARD_TOLERANCES if name.endswith("backward") else TOLERANCES
    tol = dict(table[dtype])
    if name.startswith("softmax"):
        # floor: twice the smallest subnormal step of the dtype
        tol["atol"] = max(tol["atol"] / max(n, 1), 2 * torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps)
    return tol


def check_family(kind, dtype, shape, dim, expected, backward=False):
    import softmax_ext

    n = shape[dim]
    if backward:
        name = kind + "_backward"
        dy, y = make_backward_inputs(name, shape, dim, dtype, "cuda")
        plan = softmax_ext.plan(dy, dim, kind=kind, backward=True)
        out = ours(name)(dy, y, dim)
        ref = reference_backward(name, dy, y, dim)
    else:
        name = kind
        x = make_input(shape, dtype, "cuda")
        plan = softmax_ext.plan(x, dim, kind=kind)
        out = ours(name)(x, dim)
        ref = reference_forward(name, x, dim)
    assert plan.kernel == f"{expected}.{TAGS[dtype]}", f"{shape} dim={dim}: {plan.kernel}"
    assert_close_verbose(out, ref, msg=f"{name} {shape} dim={dim} {plan.kernel}", **tolerances(name, dtype, n))
