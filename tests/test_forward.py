"""Forward values of softmax_ext.softmax / log_softmax against torch in float64.

Covers every dtype, axis lengths around the dispatch boundaries, ranks 0-8
with every dim (negative too), the SPEC's edge values (empty, 0-dim, NaN,
+-inf, values near the float limits), the dtype= argument and determinism.
"""

import pytest
import torch

from conftest import (
    DEVICES,
    DTYPES,
    FORWARD_OPS,
    HALF_DTYPES,
    TOLERANCES,
    assert_close_verbose,
    check_forward,
    custom_op,
    dims_for_rank,
    AXIS_LENGTHS,
    dtype_id,
    make_input,
    ours,
    reference_forward,
    sizes_for_rank,
)


# --------------------------------------------------------------------------
# Values: every dtype x axis length, last axis and a middle axis
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", AXIS_LENGTHS)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_axis_lengths_last_dim(name, n, dtype, device):
    x = make_input((3, n), dtype, device, seed=n)
    check_forward(name, x, -1, torch_bound=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", AXIS_LENGTHS)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_axis_lengths_middle_dim(name, n, dtype, device):
    # inner size 5: the axis is strided (the "spatial" / inner kernels).
    x = make_input((2, n, 5), dtype, device, seed=n + 1)
    check_forward(name, x, 1, torch_bound=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [33, 1025])
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_axis_lengths_first_dim_inner_long(name, n, dtype, device):
    # axis first, long contiguous inner run (inner > warp size, not a
    # multiple of any vector width).
    x = make_input((n, 67), dtype, device, seed=3)
    check_forward(name, x, 0, torch_bound=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_many_rows(name, dtype, device):
    # more rows than one thread / block handles, odd row count.
    x = make_input((517, 65), dtype, device, seed=11)
    check_forward(name, x, -1, torch_bound=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_large_scale_inputs(name, dtype, device):
    # wide dynamic range within a row: most probabilities underflow to ~0.
    x = make_input((4, 257), dtype, device, seed=5, scale=30.0)
    check_forward(name, x, -1)
    check_forward(name, x, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_via_torch_ops(name, device):
    """The registered op (not only the Python wrapper) computes the same."""
    x = make_input((4, 37), torch.float32, device, seed=2)
    a = check_forward(name, x, -1, via_op=True)
    b = ours(name)(x, -1)
    assert torch.equal(a, b)
    # keyword arguments and default dim
    c = custom_op(name)(x)
    assert torch.equal(c, b), "default dim must be -1"
    d = ours(name)(x)
    assert torch.equal(d, b), "wrapper default dim must be -1"
    e = custom_op(name)(x, dim=0)
    assert_close_verbose(e, reference_forward(name, x, 0), msg=f"{name} dim=0 kw", **TOLERANCES[torch.float32])


# --------------------------------------------------------------------------
# Ranks 0-8, every dim
# --------------------------------------------------------------------------

RANK_DIM_CASES = [(r, d) for r in range(0, 9) for d in dims_for_rank(r)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rank,dim", RANK_DIM_CASES, ids=[f"r{r}d{d}" for r, d in RANK_DIM_CASES])
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_ranks_and_dims(name, rank, dim, device):
    x = make_input(sizes_for_rank(rank), torch.float32, device, seed=rank * 31 + dim)
    out = check_forward(name, x, dim)
    assert out.dim() == rank


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rank8_half_and_double(name, dtype, device):
    x = make_input((2, 3, 2, 2, 3, 2, 2, 5), dtype, device, seed=8)
    for dim in (0, 3, -1):
        check_forward(name, x, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rank10_contiguous_coalesces(name, device):
    """A contiguous 10-D tensor coalesces to <= 3 dims, so it must work."""
    x = make_input((2, 2, 3, 2, 2, 2, 3, 2, 2, 2), torch.float32, device, seed=10)
    for dim in (0, 4, -1):
        check_forward(name, x, dim)


# --------------------------------------------------------------------------
# Edge values (SPEC "Semantics")
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim_tensor(name, dim, dtype, device):
    x = torch.tensor(1.7, dtype=dtype, device=device)
    out = ours(name)(x, dim)
    assert out.shape == () and out.dtype == dtype and out.device == x.device
    expected = 1.0 if name == "softmax" else 0.0
    assert float(out) == expected, f"{name} of a 0-dim tensor gave {float(out)}"
    out2 = custom_op(name)(x, dim)
    assert out2.shape == () and float(out2) == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize(
    "shape,dim",
    [((0,), 0), ((0, 5), -1), ((0, 5), 0), ((5, 0), -1), ((5, 0), 0), ((2, 0, 3), 1), ((2, 0, 3), -1), ((3, 4, 0), 1)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_empty(name, shape, dim, dtype, device):
    x = torch.empty(shape, dtype=dtype, device=device)
    out = ours(name)(x, dim)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    out = ours(name)(x, dim, dtype=torch.float64)
    assert out.shape == x.shape and out.dtype == torch.float64


def _row_with(dtype, device, n, seed, pos, value):
    x = make_input((5, n), dtype, device, seed=seed)
    x[2, pos] = value
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("n", [7, 1025])
@pytest.mark.parametrize("axis", ["last", "first"])
def test_nan_poisons_only_its_slice(name, n, dtype, device, axis):
    x = _row_with(dtype, device, n, seed=n, pos=n // 2, value=float("nan"))
    if axis == "first":
        x = x.t().contiguous()  # row 2 is now column 2; softmax over dim 0
        dim = 0
    else:
        dim = -1
    out = ours(name)(x, dim)
    o = out if axis == "last" else out.t()
    assert torch.isnan(o[2]).all(), f"{name}: slice with a NaN must be all NaN, got {o[2][:8]}"
    others = torch.cat([o[:2], o[3:]])
    assert not torch.isnan(others).any(), f"{name}: NaN leaked into other slices"
    ref = reference_forward(name, x, dim)
    assert_close_verbose(out, ref, msg=f"{name} NaN slice", **TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("n", [7, 1025])
def test_all_neg_inf_slice_is_nan(name, n, dtype, device):
    x = make_input((5, n), dtype, device, seed=n)
    x[1] = float("-inf")
    out = ours(name)(x, -1)
    assert torch.isnan(out[1]).all(), f"{name}: all -inf slice must give NaN (like torch), got {out[1][:8]}"
    assert not torch.isnan(out[[0, 2, 3, 4]]).any()
    assert_close_verbose(out, reference_forward(name, x, -1), msg=f"{name} all -inf", **TOLERANCES[dtype])
    # also along a strided axis
    out0 = ours(name)(x.t(), 0)
    assert torch.isnan(out0[:, 1]).all()
    assert_close_verbose(out0, reference_forward(name, x.t(), 0), msg=f"{name} all -inf dim0", **TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("n", [7, 1025])
def test_pos_inf_slice_is_all_nan(name, n, dtype, device):
    x = _row_with(dtype, device, n, seed=n, pos=n - 1, value=float("inf"))
    out = ours(name)(x, -1)
    assert torch.isnan(out[2]).all(), f"{name}: slice containing +inf must be all NaN, got {out[2][-8:]}"
    assert not torch.isnan(out[[0, 1, 3, 4]]).any()
    assert_close_verbose(out, reference_forward(name, x, -1), msg=f"{name} +inf", **TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_partial_neg_inf_is_masking(name, dtype, device):
    """-inf entries in a slice that has finite ones are "masked": softmax 0,
    log_softmax -inf; the rest of the slice is the softmax of the finite part."""
    x = make_input((4, 40), dtype, device, seed=4)
    x[:, ::3] = float("-inf")
    out = ours(name)(x, -1)
    masked = out[:, ::3]
    if name == "softmax":
        assert (masked == 0).all()
        s = out.double().sum(-1)
        assert torch.allclose(s, torch.ones_like(s), atol=2e-2 if dtype in HALF_DTYPES else 1e-5)
    else:
        assert torch.isneginf(masked).all()
    assert not torch.isnan(out).any()
    assert_close_verbose(out, reference_forward(name, x, -1), msg=f"{name} masked", **TOLERANCES[dtype])


LIMITS = {
    torch.float32: 1e38,
    torch.float64: 1e300,
    torch.float16: 6e4,
    torch.bfloat16: 3e38,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("n", [5, 1025])
def test_near_float_limits_no_overflow(name, n, dtype, device):
    big = LIMITS[dtype]
    g = torch.Generator().manual_seed(n)
    # values in {-big, -big/2, +big/2, +big} plus small ones
    choices = torch.tensor([-big, -big / 2, big / 2, big, 1.0, -1.0], dtype=torch.float64)
    idx = torch.randint(0, len(choices), (4, n), generator=g)
    x = choices[idx].to(dtype=dtype, device=device)
    x[0] = big  # a row of equal maximal values: uniform
    x[1] = -big  # a row of equal minimal values: uniform
    out = ours(name)(x, -1)
    assert not torch.isnan(out).any(), f"{name}: NaN from finite inputs near the float limit"
    if name == "softmax":
        assert torch.isfinite(out).all(), f"{name}: overflow near the float limit"
    ref = reference_forward(name, x, -1)
    assert_close_verbose(out, ref, msg=f"{name} near limits {dtype_id(dtype)}", **TOLERANCES[dtype])
    uniform = reference_forward(name, torch.zeros(1, n, dtype=dtype, device=device), -1)[0]
    assert_close_verbose(out[0], uniform, msg="row of +big must be uniform", **TOLERANCES[dtype])
    assert_close_verbose(out[1], uniform, msg="row of -big must be uniform", **TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_f16_limits_middle_axis(name, device):
    x = torch.tensor([[6e4, -6e4, 6e4], [-6e4, -6e4, -6e4], [6e4, 6e4, 1.0]], dtype=torch.float16, device=device)
    x = x.t()  # strided axis
    out = ours(name)(x, 0)
    assert not torch.isnan(out).any()
    assert_close_verbose(out, reference_forward(name, x, 0), msg=f"{name} f16 limits dim0", **TOLERANCES[torch.float16])


# --------------------------------------------------------------------------
# Properties (independent of any reference implementation)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_rows_sum_to_one_and_shift_invariance(dim, device):
    x = make_input((6, 33, 7), torch.float64, device, seed=9)
    y = ours("softmax")(x, dim)
    s = y.sum(dim)
    assert torch.allclose(s, torch.ones_like(s), atol=1e-12, rtol=0), f"row sums {s.flatten()[:5]}"
    assert (y > 0).all()
    y_shift = ours("softmax")(x + 123.25, dim)
    assert torch.allclose(y, y_shift, atol=1e-12, rtol=1e-10)
    ly = ours("log_softmax")(x, dim)
    assert torch.allclose(ly.exp(), y, atol=1e-12, rtol=1e-10)
    assert (ly < 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_argmax_preserved_and_monotone(device):
    x = make_input((8, 100), torch.float32, device, seed=12)
    y = ours("softmax")(x, -1)
    assert torch.equal(y.argmax(-1), x.argmax(-1))
    order_x = x.argsort(-1)
    assert (y.gather(-1, order_x).diff(dim=-1) >= 0).all()


# --------------------------------------------------------------------------
# dtype=
# --------------------------------------------------------------------------

DTYPE_ARG_CASES = [
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.float32),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "in_dtype,out_dtype", DTYPE_ARG_CASES, ids=[f"{dtype_id(a)}-{dtype_id(b)}" for a, b in DTYPE_ARG_CASES]
)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("dim", [0, -1])
def test_dtype_argument(name, in_dtype, out_dtype, dim, device):
    x = make_input((6, 1025), in_dtype, device, seed=21)
    out = check_forward(name, x, dim, dtype=out_dtype)
    assert out.dtype == out_dtype
    out_op = custom_op(name)(x, dim, dtype=out_dtype)
    assert out_op.dtype == out_dtype
    assert torch.equal(out_op, out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_dtype_argument_upcast_is_more_accurate(name, device):
    """bf16 input with dtype=float32 is computed from the bf16 values in f32,
    not rounded through bf16: it must be f32-accurate, which a bf16 result
    upcast afterwards is not."""
    x = make_input((4, 300), torch.bfloat16, device, seed=22)
    out = ours(name)(x, -1, dtype=torch.float32)
    ref = reference_forward(name, x, -1, dtype=torch.float32)
    err = (out.double() - ref.double()).abs().max().item()
    assert err < 1e-5, f"{name} bf16->f32 error {err:.3e} looks like bf16 rounding"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_integer_input_with_float_dtype(name, int_dtype, device):
    g = torch.Generator().manual_seed(7)
    lo = 0 if int_dtype == torch.uint8 else -5
    x = torch.randint(lo, 6, (3, 17), generator=g).to(int_dtype).to(device)
    out = ours(name)(x, -1, dtype=torch.float32)
    assert out.dtype == torch.float32
    ref = (torch.softmax if name == "softmax" else torch.log_softmax)(x.cpu().double(), -1).float().to(device)
    assert_close_verbose(out, ref, msg=f"{name} {int_dtype} dtype=f32", **TOLERANCES[torch.float32])
    out64 = custom_op(name)(x, 0, dtype=torch.float64)
    ref64 = (torch.softmax if name == "softmax" else torch.log_softmax)(x.cpu().double(), 0).to(device)
    assert_close_verbose(out64, ref64, msg=f"{name} {int_dtype} dtype=f64", **TOLERANCES[torch.float64])


# --------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_bit_identical_repeats(name, dtype, device):
    x = make_input((96, 4097), dtype, device, seed=31)
    xt = make_input((4097, 96), dtype, device, seed=32)
    first = ours(name)(x, -1)
    first_t = ours(name)(xt, 0)
    for _ in range(3):
        # something else running in between must not change the result
        _ = ours(name)(make_input((7, 129), dtype, device, seed=33), 0)
        assert torch.equal(ours(name)(x, -1), first), f"{name}: repeated run differs (dim -1)"
        assert torch.equal(ours(name)(xt, 0), first_t), f"{name}: repeated run differs (dim 0)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rows_of_one_vector_or_less(name, device):
    """Rows of 1 to 17 float32 elements (at most one vector of AVX2 or
    AVX-512, and just past it; the CPU's short-row path), forward and
    backward, with -inf entries, a row of -inf and a NaN, against float64
    torch."""
    for n in range(1, 18):
        x = make_input((64, n), torch.float32, device, seed=n, scale=4.0)
        x[3, 0] = float("-inf")
        x[5] = float("-inf")
        x[7, n // 2] = float("nan")
        y = getattr(torch.ops.softmax_ext, name)(x, -1)
        ref = getattr(torch, name)(x.double(), -1)
        torch.testing.assert_close(y.double(), ref, **TOLERANCES[torch.float32], equal_nan=True)
        dy = make_input((64, n), torch.float32, device, seed=100 + n)
        dx = getattr(torch.ops.softmax_ext, name + "_backward")(dy, y, -1)
        aten = getattr(torch.ops.aten, f"_{name}_backward_data")
        want = aten(dy.double(), y.double(), -1, torch.float64)
        torch.testing.assert_close(dx.double(), want, rtol=2e-5, atol=2e-5, equal_nan=True)


# Every row length up to two AVX-512 blocks of float (a block: 32 lanes) and
# a few past them: rows made of partial blocks only, one whole block and a
# partial one, and so on; forward (also read as float32 through dtype=) and
# backward, every dtype, on the last axis and as a middle axis.
SHORT_ROW_LENGTHS = list(range(1, 36)) + [47, 63, 64, 65, 100]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_short_rows_every_length(name, dtype, device):
    from conftest import check_backward, make_backward_inputs

    for n in SHORT_ROW_LENGTHS:
        x = make_input((37, n), dtype, device, seed=n)
        check_forward(name, x, -1, msg=f"n={n}")
        if dtype in HALF_DTYPES:
            check_forward(name, x, -1, dtype=torch.float32, msg=f"n={n}")
        check_forward(name, make_input((5, n, 3), dtype, device, seed=n), 1, msg=f"n={n}")
        dy, y = make_backward_inputs(name + "_backward", (37, n), -1, dtype, device, seed=n)
        check_backward(name + "_backward", dy, y, -1, msg=f"n={n}")
