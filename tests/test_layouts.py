"""Strided inputs (transposed, permuted, step-sliced, expanded with stride 0,
channels_last, storage offsets, overlapping views) are read in place and give
the same values as the contiguous input; the output keeps x's strides when x
is dense and non-overlapping and is contiguous otherwise (SPEC "Semantics")."""

import pytest
import torch

from conftest import (
    BACKWARD_OPS,
    DEVICES,
    FORWARD_OPS,
    HALF_DTYPES,
    check_backward,
    check_forward,
    dtype_id,
    is_non_overlapping_and_dense,
    make_backward_inputs,
    make_input,
    mergeable,
    ours,
)


def _layouts(dtype, device):
    """name -> (tensor, dims to test). Every tensor is a view (no copy)."""
    mk = lambda shape, seed: make_input(shape, dtype, device, seed=seed)  # noqa: E731
    base4 = mk((3, 5, 4, 6), 1)
    cases = {
        "transposed_2d": (mk((33, 7), 2).t(), [0, 1, -1]),
        "permuted_4d": (base4.permute(2, 0, 3, 1), [0, 1, 2, 3]),
        "step_sliced_nonaxis": (mk((10, 37), 3)[::3], [-1, 0]),
        "step_sliced_axis": (mk((4, 70), 4)[:, ::2], [-1, 0]),
        "step_sliced_both_3d": (mk((6, 9, 40), 5)[::2, 1::3, 3::4], [0, 1, 2]),
        "narrowed_offset": (mk((9, 40), 6)[2:7, 5:38], [0, 1]),
        "storage_offset_dense": (mk((8, 33), 7)[3:], [0, 1]),
        "expanded_axis": (mk((5, 1), 8).expand(5, 33), [-1, 0]),
        "expanded_nonaxis": (mk((1, 33), 9).expand(6, 33), [-1, 0]),
        "expanded_3d_middle": (mk((4, 1, 7), 10).expand(4, 9, 7), [0, 1, 2]),
        "channels_last": (mk((2, 6, 5, 7), 11).to(memory_format=torch.channels_last), [0, 1, 2, 3, -3]),
        "channels_last_3d": (mk((2, 3, 4, 3, 5), 12).to(memory_format=torch.channels_last_3d), [1, -1, 2]),
        "overlapping_as_strided": (
            torch.as_strided(mk((80,), 13), (6, 9), (7, 1)),  # rows overlap by 2 elements
            [0, 1],
        ),
        "size1_dims_odd_strides": (mk((1, 5, 1, 33), 14).permute(3, 2, 1, 0), [0, 2, 3, -2]),
        "transposed_long_axis": (mk((1025, 3), 15).t(), [1, 0]),
    }
    return cases


LAYOUT_NAMES = list(_layouts(torch.float32, "cpu").keys())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_forward_layouts(name, layout, dtype, device):
    x, dims = _layouts(dtype, device)[layout]
    assert not x.is_contiguous() or layout in ("storage_offset_dense",), "layout case must be a strided view"
    xc = x.contiguous()
    for dim in dims:
        out = check_forward(name, x, dim, msg=layout)
        # same values as the contiguous input: the layout must not matter
        out_c = ours(name)(xc, dim)
        assert torch.equal(out.contiguous(), out_c) or torch.allclose(
            out.contiguous().double(), out_c.double(), rtol=1e-2 if dtype in HALF_DTYPES else 1e-5, atol=1e-6
        ), f"{name} {layout} dim={dim}: differs from the contiguous input's result"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_forward_layouts_dtype_arg(name, layout, device):
    x, dims = _layouts(torch.float16, device)[layout]
    for dim in dims[:2]:
        check_forward(name, x, dim, dtype=torch.float32, msg=layout)


@pytest.mark.parametrize("device", DEVICES)
def test_output_stride_rules(device):
    """The rule itself, on cases where it is unambiguous."""
    sm = ours("softmax")
    # transposed: dense -> same strides as x
    x = make_input((6, 9), torch.float32, device).t()
    assert sm(x, 0).stride() == x.stride() == (1, 9)
    # permuted 4-D
    x = make_input((2, 3, 4, 5), torch.float32, device).permute(3, 1, 0, 2)
    assert sm(x, 2).stride() == x.stride()
    # channels_last
    x = make_input((2, 3, 4, 5), torch.float32, device).to(memory_format=torch.channels_last)
    for d in range(4):
        out = sm(x, d)
        assert out.stride() == x.stride(), f"channels_last dim={d}: {out.stride()} != {x.stride()}"
        assert out.is_contiguous(memory_format=torch.channels_last)
    # step-sliced: not dense -> contiguous
    x = make_input((6, 10), torch.float32, device)[:, ::2]
    out = sm(x, -1)
    assert out.is_contiguous() and out.stride() == (5, 1)
    # expanded: overlapping -> contiguous
    x = make_input((4, 1), torch.float32, device).expand(4, 7)
    out = sm(x, -1)
    assert out.is_contiguous() and out.stride() == (7, 1)
    # contiguous with a storage offset: dense, contiguous output, offset 0
    x = make_input((5, 7), torch.float32, device)[1:]
    out = sm(x, -1)
    assert out.is_contiguous() and out.storage_offset() == 0
    # dtype= keeps the layout too
    x = make_input((6, 9), torch.bfloat16, device).t()
    out = sm(x, 1, dtype=torch.float32)
    assert out.stride() == x.stride() and out.dtype == torch.float32
    # the output is a new tensor
    x = make_input((3, 4), torch.float32, device)
    out = sm(x, -1)
    assert out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_input_not_modified(device):
    for name in FORWARD_OPS:
        x = make_input((5, 33), torch.float32, device, seed=40).t()
        before = x.clone()
        ours(name)(x, 0)
        assert torch.equal(x, before), f"{name} modified its input"
    for name in BACKWARD_OPS:
        dy, y = make_backward_inputs(name, (4, 33), -1, torch.float32, device)
        dyc, yc = dy.clone(), y.clone()
        ours(name)(dy, y, -1)
        assert torch.equal(dy, dyc) and torch.equal(y, yc), f"{name} modified its inputs"


# --------------------------------------------------------------------------
# Effective rank after coalescing
# --------------------------------------------------------------------------


def _unmergeable(ndim, device, dtype=torch.float32):
    """An ndim-D view, size 2 per dim, of a (4,)*ndim tensor sliced with step 2
    in every dim: strides are 2 * 4**k. Merging a (outer) with b (inner) needs
    stride[a] == size[b] * stride[b] = 4 * 4**kb, i.e. 4**ka == 2 * 4**kb,
    which no integers satisfy: no pair merges, in any order. Callers also
    check this with conftest.mergeable()."""
    base = make_input((4,) * ndim, dtype, device, seed=ndim)
    x = base[(slice(None, None, 2),) * ndim]
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_effective_rank_8_non_mergeable_works(name, device):
    x = _unmergeable(8, device)
    for axis in (0, 3, 7):
        assert not mergeable(x.shape, x.stride(), axis), "construction error: dims could merge"
    for dim in (0, 3, -1):
        check_forward(name, x, dim, msg="8-D non-mergeable")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rank9_with_a_size1_dim_works(name, device):
    """Size-1 dimensions are dropped before the rank limit applies."""
    x = _unmergeable(8, device).unsqueeze(4)
    assert x.dim() == 9 and x.shape[4] == 1
    for dim in (0, 5, -1):  # an axis of size 2; the size-1 dim is a batch dim
        check_forward(name, x, dim, msg="9-D with a size-1 dim")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rank9_permuted_dense_coalesces(name, device):
    """A permuted contiguous 9-D tensor is dense: the output takes its strides,
    so the non-axis dims can be reordered and merged (rank <= 3)."""
    base = make_input((2, 2, 3, 2, 2, 3, 2, 2, 2), torch.float32, device, seed=90)
    x = base.permute(8, 6, 4, 2, 0, 1, 3, 5, 7)
    assert is_non_overlapping_and_dense(x)
    for dim in (0, 4, -1):
        check_forward(name, x, dim, msg="9-D permuted dense")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_rank9_sliced_coalesces(name, device):
    """Sliced (not dense) in dim 0 only: the contiguous output and x agree
    that dims 1..8 merge, so the effective rank is small."""
    base = make_input((4, 2, 3, 2, 2, 3, 2, 2, 2), torch.float32, device, seed=91)
    x = base[::2]
    assert not is_non_overlapping_and_dense(x)
    assert mergeable(x.shape, x.stride(), 0)
    for dim in (0, 4, -1):
        check_forward(name, x, dim, msg="9-D sliced in dim 0")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_effective_rank_8_mixed_layouts(name, device):
    dy, y = make_backward_inputs(name, (2,) * 8, 2, torch.float32, device)
    dy_s = _unmergeable(8, device)
    dy_s.copy_(dy)
    check_backward(name, dy_s, y, 2, msg="dy 8-D non-mergeable, y contiguous")


# --------------------------------------------------------------------------
# Backward inputs with layouts different from each other
# --------------------------------------------------------------------------


def _relayout(t, how):
    if how == "contiguous":
        return t.contiguous()
    if how == "transposed":  # same logical tensor, column-major storage
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if how == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if how == "sliced":  # a step-sliced view holding the same values
        big = torch.empty((t.shape[0] * 2,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        big.normal_()
        v = big[::2]
        v.copy_(t)
        return v
    if how == "expanded":  # stride-0 view: take the values of the first index along dim 2
        return t[:, :, :1].expand(t.shape)
    raise ValueError(how)


BACKWARD_LAYOUT_PAIRS = [
    ("contiguous", "transposed"),
    ("transposed", "contiguous"),
    ("channels_last", "contiguous"),
    ("contiguous", "channels_last"),
    ("sliced", "transposed"),
    ("transposed", "sliced"),
    ("expanded", "channels_last"),
    ("channels_last", "sliced"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", BACKWARD_LAYOUT_PAIRS, ids=[f"{a}-{b}" for a, b in BACKWARD_LAYOUT_PAIRS])
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_backward_mixed_layouts(name, pair, dtype, device):
    shape = (2, 5, 4, 33)
    for dim in (1, -1, 2):
        dy, y = make_backward_inputs(name, shape, dim, dtype, device, seed=dim + 5)
        dy_l, y_l = _relayout(dy, pair[0]), _relayout(y, pair[1])
        out = check_backward(name, dy_l, y_l, dim, msg=f"layouts {pair}")
        assert out.shape == dy.shape
        # the values must not depend on the layouts
        out_c = ours(name)(dy_l.contiguous(), y_l.contiguous(), dim)
        torch.testing.assert_close(out, out_c, rtol=2e-3 if dtype in HALF_DTYPES else 1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_output_layout(name, device):
    """The backward output is a valid, new tensor with the SPEC's stride rule
    (dense-like-an-input or contiguous)."""
    dy, y = make_backward_inputs(name, (6, 9), 0, torch.float32, device)
    dy_t, y_t = dy.t().contiguous().t(), y.t().contiguous().t()
    out = ours(name)(dy_t, y_t, 0)
    assert out.stride() == dy_t.stride(), "both inputs transposed: the output should keep that layout"
    out2 = ours(name)(dy[:, :], y[::1, :].contiguous(), 0)
    assert out2.is_contiguous()
    assert is_non_overlapping_and_dense(out)
