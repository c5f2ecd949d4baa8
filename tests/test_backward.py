"""softmax_backward / log_softmax_backward values against
aten._softmax_backward_data / aten._log_softmax_backward_data in float64, and
the gradients softmax_ext's autograd gives against torch's."""

import pytest
import torch

from conftest import (
    BACKWARD_OPS,
    BACKWARD_TOLERANCES,
    DEVICES,
    DTYPES,
    FORWARD_OPS,
    HALF_DTYPES,
    assert_close_verbose,
    assert_within_torch_bound,
    check_backward,
    custom_op,
    dims_for_rank,
    AXIS_LENGTHS,
    dtype_id,
    make_backward_inputs,
    make_input,
    ours,
    reference_backward,
    sizes_for_rank,
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", AXIS_LENGTHS)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_axis_lengths_last_dim(name, n, dtype, device):
    dy, y = make_backward_inputs(name, (3, n), -1, dtype, device, seed=n)
    check_backward(name, dy, y, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", AXIS_LENGTHS)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_axis_lengths_middle_dim(name, n, dtype, device):
    dy, y = make_backward_inputs(name, (2, n, 5), 1, dtype, device, seed=n + 1)
    check_backward(name, dy, y, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_many_rows(name, dtype, device):
    dy, y = make_backward_inputs(name, (517, 65), -1, dtype, device, seed=3)
    check_backward(name, dy, y, -1)
    dy, y = make_backward_inputs(name, (65, 517), 0, dtype, device, seed=4)
    check_backward(name, dy, y, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_arbitrary_output_values(name, device):
    """The backward formulas hold for any (dy, y), not only y = softmax(x)."""
    dy = make_input((7, 45), torch.float64, device, seed=1)
    y = make_input((7, 45), torch.float64, device, seed=2, scale=0.5)
    for dim in (0, 1):
        check_backward(name, dy, y, dim)
        check_backward(name, dy, y, dim, via_op=True)


RANK_DIM_CASES = [(r, d) for r in range(0, 9) for d in dims_for_rank(r)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rank,dim", RANK_DIM_CASES, ids=[f"r{r}d{d}" for r, d in RANK_DIM_CASES])
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_ranks_and_dims(name, rank, dim, device):
    dy, y = make_backward_inputs(name, sizes_for_rank(rank), dim, torch.float32, device, seed=rank * 7 + dim)
    out = check_backward(name, dy, y, dim)
    assert out.dim() == rank


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_rank10_contiguous_coalesces(name, device):
    shape = (2, 2, 3, 2, 2, 2, 3, 2, 2, 2)
    for dim in (0, 5, -1):
        dy, y = make_backward_inputs(name, shape, dim, torch.float32, device, seed=dim + 100)
        check_backward(name, dy, y, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim(name, dim, dtype, device):
    dy = torch.tensor(0.75, dtype=dtype, device=device)
    y = torch.tensor(1.0 if name == "softmax_backward" else 0.0, dtype=dtype, device=device)
    out = ours(name)(dy, y, dim)
    assert out.shape == () and out.dtype == dtype
    # softmax of one element is constant: its gradient is 0
    assert float(out) == 0.0, f"{name} 0-dim gave {float(out)}"
    # arbitrary y: dy*y - y*y*dy (softmax) / dy - exp(y)*dy (log_softmax)
    y2 = torch.tensor(0.5, dtype=dtype, device=device)
    assert_close_verbose(
        ours(name)(dy, y2, dim), reference_backward(name, dy, y2, 0), msg=f"{name} 0-dim", **BACKWARD_TOLERANCES[dtype]
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("shape,dim", [((0,), 0), ((0, 5), -1), ((5, 0), -1), ((5, 0), 0), ((2, 0, 3), 1)])
def test_empty(name, shape, dim, device):
    dy = torch.empty(shape, device=device)
    y = torch.empty(shape, device=device)
    out = ours(name)(dy, y, dim)
    assert out.shape == dy.shape and out.dtype == dy.dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_nan_in_grad_output_stays_in_its_slice(name, device):
    dy, y = make_backward_inputs(name, (4, 33), -1, torch.float32, device)
    dy[1, 5] = float("nan")
    out = ours(name)(dy, y, -1)
    assert torch.isnan(out[1]).all()
    assert not torch.isnan(out[[0, 2, 3]]).any()
    assert_close_verbose(out, reference_backward(name, dy, y, -1), msg=name, **BACKWARD_TOLERANCES[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_of_masked_softmax(name, device):
    """Rows with -inf inputs (masked): y is 0 / -inf there and the gradient
    there must be 0, not NaN."""
    x = make_input((3, 40), torch.float32, device, seed=6)
    x[:, ::4] = float("-inf")
    fwd = "softmax" if name == "softmax_backward" else "log_softmax"
    y = ours(fwd)(x, -1)
    dy = make_input((3, 40), torch.float32, device, seed=7, scale=1.0)
    out = ours(name)(dy, y, -1)
    assert not torch.isnan(out).any(), f"{name}: NaN gradient for masked entries"
    if name == "softmax_backward":
        assert (out[:, ::4] == 0).all()
    assert_close_verbose(out, reference_backward(name, dy, y, -1), msg=name, **BACKWARD_TOLERANCES[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_bit_identical_repeats(name, dtype, device):
    dy, y = make_backward_inputs(name, (64, 4097), -1, dtype, device, seed=77)
    first = ours(name)(dy, y, -1)
    first_t = ours(name)(dy.t().contiguous(), y.t().contiguous(), 0)
    for _ in range(3):
        assert torch.equal(ours(name)(dy, y, -1), first)
        assert torch.equal(ours(name)(dy.t().contiguous(), y.t().contiguous(), 0), first_t)


# --------------------------------------------------------------------------
# Autograd of the forward ops: gradients vs torch's
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("via_op", [False, True], ids=["wrapper", "torch_ops"])
def test_autograd_matches_torch(name, dtype, via_op, device):
    fn = custom_op(name) if via_op else ours(name)
    tfn = torch.softmax if name == "softmax" else torch.log_softmax
    for shape, dim in [((5, 33), -1), ((4, 7, 6), 1), ((6, 5), 0)]:
        x = make_input(shape, dtype, device, seed=len(shape) + dim)
        w = make_input(shape, dtype, device, seed=99, scale=1.0)
        xa = x.clone().requires_grad_(True)
        (fn(xa, dim) * w).sum().backward()
        # reference: torch in float64
        xr = x.double().requires_grad_(True)
        (tfn(xr, dim) * w.double()).sum().backward()
        assert xa.grad is not None and xa.grad.dtype == dtype and xa.grad.shape == x.shape
        what = f"grad of {name} {shape} dim={dim} {dtype_id(dtype)}"
        if dtype in HALF_DTYPES:
            # y is rounded to the half type before the backward uses it, so
            # compare accuracy with torch's own half-precision autograd.
            xt = x.clone().requires_grad_(True)
            (tfn(xt, dim) * w).sum().backward()
            assert_within_torch_bound(xa.grad, xt.grad, xr.grad, what)
            assert_close_verbose(xa.grad, xr.grad.to(dtype), msg=what, atol=5e-2, rtol=5e-2)
        else:
            assert_close_verbose(xa.grad, xr.grad.to(dtype), msg=what, **BACKWARD_TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_autograd_dtype_argument(name, device):
    """bf16 input, dtype=float32: the gradient comes back in bf16."""
    x = make_input((4, 33), torch.bfloat16, device, seed=3).requires_grad_(True)
    w = make_input((4, 33), torch.float32, device, seed=4, scale=1.0)
    out = ours(name)(x, -1, dtype=torch.float32)
    assert out.dtype == torch.float32
    (out * w).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    xr = x.detach().double().requires_grad_(True)
    tfn = torch.softmax if name == "softmax" else torch.log_softmax
    (tfn(xr, -1) * w.double()).sum().backward()
    assert_close_verbose(x.grad, xr.grad.to(torch.bfloat16), msg=f"{name} dtype= grad", atol=1e-3, rtol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_double_backward_matches_torch(name, device):
    tfn = torch.softmax if name == "softmax" else torch.log_softmax
    x = make_input((3, 11), torch.float64, device, seed=5)
    w = make_input((3, 11), torch.float64, device, seed=6, scale=1.0)
    v = make_input((3, 11), torch.float64, device, seed=7, scale=1.0)

    def hvp(f):
        xx = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad((f(xx, -1) * w).sum(), xx, create_graph=True)
        (h,) = torch.autograd.grad((g * v).sum(), xx)
        return h

    assert_close_verbose(hvp(ours(name)), hvp(tfn), msg=f"{name} Hessian-vector product", atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_uses_custom_backward_ops(device):
    """The autograd graph of softmax_ext.softmax goes through the extension's
    backward op (not a decomposition into aten ops)."""
    x = make_input((3, 8), torch.float32, device).requires_grad_(True)
    y = ours("softmax")(x, -1)
    assert y.grad_fn is not None
    seen = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y.backward(torch.ones_like(y))
    seen = [e.name for e in prof.events()]
    assert any("softmax_ext::softmax_backward" in n for n in seen), sorted(set(seen))[:30]
    assert not any("aten::_softmax_backward_data" in n for n in seen)


# --------------------------------------------------------------------------
# grad_output in another floating dtype than output (a traced backward, e.g.
# torch.compile's, hands one over): read as it is, the maths in float32
# (float64 if either is float64), the result in output's dtype.
# --------------------------------------------------------------------------

MIXED_PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.bfloat16),
    (torch.float64, torch.float32),
    (torch.float32, torch.float64),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", MIXED_PAIRS, ids=lambda p: f"dy_{dtype_id(p[0])}-y_{dtype_id(p[1])}")
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("via_op", [False, True], ids=["wrapper", "torch_ops"])
def test_backward_mixed_dtypes(name, pair, via_op, device):
    g_dtype, y_dtype = pair
    fn = custom_op(name) if via_op else ours(name)
    for shape, dim, transpose in [((6, 37), -1, False), ((5, 300), 0, True), ((3, 4, 1000), 1, False)]:
        y = make_input(shape, torch.float64, device, seed=11, scale=0.5)
        y = (torch.softmax(y, dim) if name == "softmax_backward" else torch.log_softmax(y, dim)).to(y_dtype)
        dy = make_input(shape, g_dtype, device, seed=12, scale=1.0)
        if transpose:
            y = y.t().contiguous().t()
        dx = fn(dy, y, dim)
        assert dx.dtype == y_dtype and dx.shape == y.shape
        # The reference reads both inputs exactly as given, computes in
        # float64 and rounds once to output's dtype.
        aten = {"softmax_backward": torch.ops.aten._softmax_backward_data,
                "log_softmax_backward": torch.ops.aten._log_softmax_backward_data}[name]
        expected = aten(dy.cpu().double(), y.cpu().double(), dim, torch.float64).to(y_dtype)
        tol = BACKWARD_TOLERANCES[y_dtype]
        assert_close_verbose(dx.cpu(), expected, msg=f"{name} dy {g_dtype} y {y_dtype} {shape}", **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_exp_within_one_ulp(device):
    """log_softmax_backward with grad_output = -one-hot gives exp(output)
    elementwise (dx_j = 0 - exp(y_j) * -1): the float32 exp of the kernels,
    checked over its whole range, subnormal results, overflow, ±inf and NaN,
    against float64's exp rounded to float32: within 1 ulp on CPU; within
    2 ulp on CUDA, the documented bound of CUDA's expf, which torch's CUDA
    kernels use too."""
    y = torch.cat([torch.linspace(-110.0, 90.0, 200_001),
                   torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 88.72283935546875,
                                 88.7228, -87.336544, -103.97, -103.2789, -1e-30, 1e-30])]).float()
    g = torch.zeros(y.numel() + 1)
    g[-1] = -1.0
    out = torch.cat([y, torch.zeros(1)]).to(device)
    dx = torch.ops.softmax_ext.log_softmax_backward(g.to(device), out, 0)[:-1].cpu()
    ref = torch.exp(y.double()).float()
    assert torch.equal(torch.isnan(dx), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    ulps = (dx[keep].view(torch.int32).long() - ref[keep].view(torch.int32).long()).abs()
    assert int(ulps.max()) <= (2 if device == "cuda" else 1), y[keep][ulps.argmax()]
    assert dx[-12] == float("inf") and dx[-11] == 0.0 and dx[-7] == float("inf")
