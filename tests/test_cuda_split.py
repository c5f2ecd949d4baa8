"""The split families (csrc/cuda/families/split): the resident one up to plan_limits' "split_resident"
and the three kernels past it, several row groups per block, rows off the 16-byte grid."""

import pytest
import torch

from conftest import assert_close_verbose, make_input, ours, reference_backward, reference_forward, requires_cuda
from cuda_family_checks import KINDS, TAGS, check_family, limits, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_split_resident_thresholds(sx, kind, dtype, backward):
    """Split rows of at most split_resident elements run on one resident
    kernel, one row or many; one element more takes the three kernels."""
    lim = sx.plan_limits(torch.empty(1, dtype=dtype, device="cuda"), backward=backward)
    bw = "_backward" if backward else ""
    first_split = (lim["cluster"] if lim["max_cluster_size"] > 1 else lim["block"]) + 1
    cap = lim["split_resident"]
    assert cap > first_split
    for shape, family in [((2, first_split), "cuda.split_resident"), ((1, cap), "cuda.split_resident"),
                          ((2, cap), "cuda.split_resident"), ((1, cap + 1), "cuda.split")]:
        check_family(kind, dtype, shape, -1, family + bw, backward)


@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_split_resident_many_groups(sx, dtype, start):
    """40 rows, several groups per block (each block takes its slice of one
    row per group), rows off the 16-byte grid, forward and backward."""
    lim = sx.plan_limits(torch.empty(1, dtype=dtype, device="cuda"))  # forward: the longer reach
    n = (lim["cluster"] if lim["max_cluster_size"] > 1 else lim["block"]) + 1001
    rows = 40
    base = make_input((rows, n + start), dtype, "cuda", seed=n + start)
    x = base[:, start:]
    dy = make_input((rows, n + start), dtype, "cuda", seed=n + start + 1)[:, start:]
    for kind in KINDS:
        assert sx.plan(x, -1, kind=kind).kernel == f"cuda.split_resident.{TAGS[dtype]}"
        out = ours(kind)(x, -1)
        assert_close_verbose(out, reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                             **tolerances(kind, dtype, n))
        name = kind + "_backward"
        y = reference_forward(kind, x, -1).to("cuda", dtype)
        assert sx.plan(dy, -1, kind=kind, backward=True).kernel == f"cuda.split_resident_backward.{TAGS[dtype]}"
        dx = ours(name)(dy, y, -1)
        assert_close_verbose(dx, reference_backward(name, dy, y, -1), msg=f"{name} n={n} start={start}",
                             **tolerances(name, dtype, n))


def test_split_plans_workspace_and_atomics(sx):
    """The split families report their workspace; rows the GPU holds run
    resident, rows past it on the three kernels, both deterministic."""
    lim = limits(torch.float32)
    for n, family in [(lim["split_resident"], "cuda.split_resident"), (lim["split_resident"] + 1, "cuda.split")]:
        p = sx.plan(torch.empty(2, n, device="cuda"), -1)
        assert p.kernel == family + ".f32" and p.workspace_size > 0 and p.deterministic
