"""softmax_ext.plan(): what would run, without running it."""

import pytest
import torch

from conftest import DEVICES, make_input, requires_cuda

DTYPE_TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
ACCUMULATORS = {torch.float32: torch.float32, torch.float16: torch.float32, torch.bfloat16: torch.float32,
                torch.float64: torch.float64}


def test_plan_cpu_basic(sx):
    p = sx.plan(torch.randn(4, 8), -1)
    assert isinstance(p.kernel, str) and p.kernel.startswith("cpu."), p.kernel
    assert p.accumulator == torch.float32
    assert isinstance(p.deterministic, bool)
    assert p.workspace_size == 0  # no CPU family takes a workspace
    assert p.problem.rows == 4
    assert p.problem.axis_size == 8


def test_plan_defaults(sx):
    x = torch.randn(3, 5)
    p_default = sx.plan(x)
    p_explicit = sx.plan(x, dim=-1, kind="softmax", backward=False)
    assert p_default == p_explicit
    assert p_default.problem.axis_size == 5 and p_default.problem.rows == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPE_TAGS), ids=lambda d: DTYPE_TAGS[d])
def test_plan_accumulator_and_kernel_dtype(sx, dtype, device):
    x = make_input((4, 8), dtype, device)
    p = sx.plan(x, -1)
    assert p.accumulator == ACCUMULATORS[dtype], f"{dtype}: accumulator {p.accumulator}"
    assert p.kernel.endswith("." + DTYPE_TAGS[dtype]), f"kernel name {p.kernel!r} does not carry the dtype tag"
    assert p.kernel.startswith("cpu." if device == "cpu" else "cuda."), p.kernel


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("backward", [False, True])
def test_plan_kinds_and_backward(sx, kind, backward, device):
    x = make_input((6, 10), torch.float32, device)
    p = sx.plan(x, 0, kind=kind, backward=backward)
    assert p.kernel.startswith("cpu." if device == "cpu" else "cuda.")
    assert p.problem.rows == 10 and p.problem.axis_size == 6
    assert p.workspace_size >= 0


def test_plan_backward_is_a_different_kernel(sx):
    x = torch.randn(4, 8)
    assert sx.plan(x, -1, backward=True).kernel != sx.plan(x, -1, backward=False).kernel


@pytest.mark.parametrize("kind", ["Softmax", "logsoftmax", "", "softmax_backward", "matmul"])
def test_plan_bad_kind(sx, kind):
    """The message names the kind given and the accepted ones."""
    with pytest.raises(ValueError, match=f"kind='{kind}' is not known; accepted: 'softmax', 'log_softmax'"):
        sx.plan(torch.randn(4, 8), -1, kind=kind)


def test_plan_bad_dim_and_dtype(sx):
    with pytest.raises(IndexError):
        sx.plan(torch.randn(4, 8), 2)
    with pytest.raises(NotImplementedError):
        sx.plan(torch.arange(8).reshape(2, 4), -1)


@pytest.mark.parametrize(
    "make,dim",
    [
        (lambda: torch.randn(4, 8), -1),
        (lambda: torch.randn(4, 8), 0),
        (lambda: torch.randn(2, 8, 5), 1),
        (lambda: torch.randn(6, 9).t(), 0),
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), 1),
        (lambda: torch.randn(6, 10)[:, ::2], -1),
        (lambda: torch.randn(2, 2, 3, 2, 2, 2, 3, 2, 2, 2), 4),
        (lambda: torch.randn(5), 0),
        (lambda: torch.tensor(2.0), 0),
    ],
)
def test_plan_problem_describes_x(sx, make, dim):
    x = make()
    p = sx.plan(x, dim)
    n = x.shape[dim] if x.dim() else 1
    assert p.problem.axis_size == n
    assert p.problem.rows == x.numel() // n
    assert p.problem.rank <= 8


def test_plan_axis_stride_and_inner(sx):
    x = torch.randn(4, 8)
    assert sx.plan(x, -1).problem.axis_stride == 1
    assert sx.plan(x, 0).problem.axis_stride == 8
    assert sx.plan(x.t(), 0).problem.axis_stride == 1
    assert sx.plan(torch.randn(4, 16)[:, ::2], -1).problem.axis_stride == 2
    assert sx.plan(torch.randn(2, 8, 5), 1).problem.inner_size == 5
    assert sx.plan(torch.randn(2, 8, 5), -1).problem.inner_size == 1


def test_plan_coalesces(sx):
    """Contiguous dims around the axis merge: a 10-D contiguous tensor is at
    most (outer, axis, inner)."""
    x = torch.randn(2, 2, 3, 2, 2, 2, 3, 2, 2, 2)
    p = sx.plan(x, 4)
    assert p.problem.rank <= 3, p.problem
    # reordered (permuted) dims merge too: the result does not depend on order
    xp = x.permute(9, 3, 1, 0, 4, 6, 2, 8, 5, 7)
    assert sx.plan(xp, 4).problem.rank <= 3, sx.plan(xp, 4).problem
    # size-1 dims are dropped
    assert sx.plan(torch.randn(1, 4, 1, 8, 1), 3).problem.rank <= 2


def test_plan_does_not_run(sx):
    """plan() works on a tensor whose values were never written (and must not
    change it)."""
    x = torch.empty(3, 7)
    before = x.clone()
    p = sx.plan(x, -1)
    assert p.problem.axis_size == 7
    assert torch.equal(x.nan_to_num(), before.nan_to_num())


@requires_cuda
def test_plan_cuda(sx):
    p = sx.plan(torch.randn(4, 8, device="cuda"), -1)
    assert p.kernel == "cuda.warp.f32", p.kernel  # short contiguous rows: the warp family
    assert sx.plan(torch.randn(4, 8, device="cuda"), -1, dtype=torch.float16).kernel == "cuda.reference.f32_f16"
    assert p.accumulator == torch.float32
    assert p.problem.rows == 4 and p.problem.axis_size == 8
    p64 = sx.plan(torch.randn(4, 8, device="cuda", dtype=torch.float64), -1)
    assert p64.accumulator == torch.float64


def test_plan_limits_cpu_and_bad_dtype(sx):
    assert sx.plan_limits(torch.randn(3)) == {}
    assert sx.plan_limits(torch.randn(3), backward=True) == {}
    with pytest.raises(NotImplementedError, match="plan_limits"):
        sx.plan_limits(torch.arange(3))


# One shape per family on each device: the contiguous axis, an inner run, a
# strided axis without one (CPU); short, mid and long rows, strided axes
# (CUDA: warp, row tile, block, cluster or resident split, split, strided,
# strided split, reference).
DETERMINISM_SHAPES = {
    "cpu": [((64, 1000), -1), ((8, 300, 16), 1), ((300, 7), 0)],
    "cuda": [((64, 100), -1), ((301, 126), -1), ((8, 3000), -1), ((2, 100000), -1), ((1, 20_000_000), -1),
             ((8, 2048, 64), 1), ((140000, 8), 0), ((300, 3), 0)],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_plan_deterministic_means_bit_identical(sx, device, backward):
    """A plan that says deterministic gives bit-identical results on reruns
    (on CPU also with other thread counts)."""
    threads = torch.get_num_threads()
    for shape, dim in DETERMINISM_SHAPES[device]:
        x = make_input(shape, torch.float32, device)
        y = sx.softmax(x, dim)
        plan = sx.plan(y if backward else x, dim, backward=backward)
        run = (lambda: sx.softmax_backward(x, y, dim)) if backward else (lambda: sx.softmax(x, dim))
        first = run()
        for n in (1, 3, threads):
            if device == "cpu":
                torch.set_num_threads(n)
            same = torch.equal(run(), first)
            assert same or not plan.deterministic, f"{plan.kernel} {shape} dim={dim}: reruns differ"
        torch.set_num_threads(threads)
        assert plan.deterministic, f"{plan.kernel}: every family of softmax_ext is deterministic"
