"""Every error of the SPEC: its exception type, and a message that names the
op (and what was given), through the Python wrappers and through torch.ops."""

import re

import pytest
import torch

from conftest import (
    ALL_OPS,
    BACKWARD_OPS,
    DEVICES,
    FORWARD_OPS,
    custom_op,
    make_input,
    mergeable,
    ours,
    requires_cuda,
)


def names_op(message: str, name: str) -> bool:
    """True when `name` appears as a whole word (so "softmax" is not found
    inside "log_softmax" or "softmax_backward"; "softmax_ext.softmax" and
    "softmax_ext::softmax" count)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def entry_points(name):
    return [("wrapper", ours(name)), ("torch.ops", custom_op(name))]


def call(name, fn, x, dim, **kw):
    if name in FORWARD_OPS:
        return fn(x, dim, **kw)
    return fn(x, x.clone(), dim)


# --------------------------------------------------------------------------
# dim out of range -> IndexError
# --------------------------------------------------------------------------

DIM_CASES = [((3, 4), 2), ((3, 4), -3), ((5,), 1), ((5,), -2), ((), 1), ((), -2), ((2, 3, 4), 100)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("shape,dim", DIM_CASES)
def test_dim_out_of_range(name, shape, dim, device):
    x = make_input(shape, torch.float32, device)
    for how, fn in entry_points(name):
        with pytest.raises(IndexError) as ei:
            call(name, fn, x, dim)
        assert names_op(str(ei.value), name), f"{how}: IndexError message does not name {name}: {ei.value}"
        assert str(dim) in str(ei.value), f"{how}: message does not say which dim was given: {ei.value}"


# --------------------------------------------------------------------------
# Unsupported dtypes -> NotImplementedError naming the dtype
# --------------------------------------------------------------------------

DTYPE_NAMES = {
    torch.int64: ("Long", "int64"),
    torch.int32: ("Int", "int32"),
    torch.int8: ("Char", "int8"),
    torch.uint8: ("Byte", "uint8"),
    torch.bool: ("Bool", "bool"),
    torch.complex64: ("ComplexFloat", "complex64"),
    torch.complex128: ("ComplexDouble", "complex128"),
}


def _tensor_of(dtype, device):
    if dtype == torch.bool:
        return (make_input((3, 5), torch.float32, device) > 0)
    if dtype.is_complex:
        return torch.complex(make_input((3, 5), torch.float32, device), make_input((3, 5), torch.float32, device, seed=1)).to(dtype)
    return torch.arange(1, 16, device=device).reshape(3, 5).to(dtype)


def _names_dtype(msg, dtype):
    return any(re.search(rf"\b{n}\b", msg) for n in DTYPE_NAMES[dtype])


def _names_a_supported_dtype(msg):
    return any(s in msg for s in ("float32", "Float", "float16", "Half", "bfloat16", "BFloat16"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=lambda d: str(d).replace("torch.", ""))
def test_unsupported_dtype(name, dtype, device):
    x = _tensor_of(dtype, device)
    for how, fn in entry_points(name):
        with pytest.raises(NotImplementedError) as ei:
            call(name, fn, x, -1)
        msg = str(ei.value)
        assert names_op(msg, name), f"{how}: message does not name {name}: {msg}"
        assert _names_dtype(msg, dtype), f"{how}: message does not name the dtype {dtype}: {msg}"
        assert _names_a_supported_dtype(msg), f"{how}: message does not say what is accepted: {msg}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_non_floating_dtype_argument(name, bad, device):
    x = make_input((3, 5), torch.float32, device)
    for how, fn in entry_points(name):
        with pytest.raises(NotImplementedError) as ei:
            fn(x, -1, dtype=bad)
        assert names_op(str(ei.value), name), f"{how}: {ei.value}"
        assert _names_dtype(str(ei.value), bad), f"{how}: message does not name {bad}: {ei.value}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_complex_input_with_float_dtype(name, device):
    """SPEC leaves this open: either NotImplementedError naming the dtype, or
    the input is treated as cast to dtype (real part) first."""
    x = _tensor_of(torch.complex64, device)
    try:
        out = ours(name)(x, -1, dtype=torch.float32)
    except NotImplementedError as e:
        assert names_op(str(e), name) and _names_dtype(str(e), torch.complex64), str(e)
        return
    ref = (torch.softmax if name == "softmax" else torch.log_softmax)(x.real.double().cpu(), -1).float()
    torch.testing.assert_close(out.cpu(), ref)


# --------------------------------------------------------------------------
# Backward tensors that disagree -> ValueError naming both
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_shape_mismatch(name, device):
    dy = make_input((4, 3), torch.float32, device)
    y = make_input((4, 5), torch.float32, device, seed=1)
    for how, fn in entry_points(name):
        for a, b in ((dy, y), (y, dy)):
            with pytest.raises(ValueError) as ei:
                fn(a, b, -1)
            msg = str(ei.value)
            assert names_op(msg, name), f"{how}: {msg}"
            assert re.search(r"4,\s*3", msg) and re.search(r"4,\s*5", msg), f"{how}: message does not name both shapes: {msg}"
    # same numel, different shape is still a mismatch
    with pytest.raises(ValueError):
        ours(name)(make_input((2, 6), torch.float32, device), make_input((3, 4), torch.float32, device), -1)
    # broadcastable is not accepted either
    with pytest.raises(ValueError):
        ours(name)(make_input((1, 5), torch.float32, device), make_input((4, 5), torch.float32, device), -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("bad", [torch.int64, torch.bool, torch.complex64], ids=lambda d: str(d).replace("torch.", ""))
def test_backward_non_floating_grad(name, bad, device):
    """grad_output may differ in dtype from output (test_backward.py), but it
    must be floating: anything else is NotImplementedError naming the dtype."""
    y = make_input((4, 5), torch.float32, device, seed=1)
    dy = torch.ones(4, 5, device=device).to(bad)
    for how, fn in entry_points(name):
        with pytest.raises(NotImplementedError) as ei:
            fn(dy, y, -1)
        msg = str(ei.value)
        assert names_op(msg, name), f"{how}: {msg}"
        assert _names_dtype(msg, bad), f"{how}: message does not name {bad}: {msg}"


@requires_cuda
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_device_mismatch(name):
    dy = make_input((4, 5), torch.float32, "cuda")
    y = make_input((4, 5), torch.float32, "cpu", seed=1)
    for how, fn in entry_points(name):
        for a, b in ((dy, y), (y, dy)):
            with pytest.raises(ValueError) as ei:
                fn(a, b, -1)
            msg = str(ei.value)
            assert names_op(msg, name), f"{how}: {msg}"
            assert "cuda" in msg.lower() and "cpu" in msg.lower(), f"{how}: message does not name both devices: {msg}"
    # the CUDA context still works after the errors
    z = ours("softmax")(make_input((4, 5), torch.float32, "cuda"), -1)
    torch.cuda.synchronize()
    assert torch.allclose(z.sum(-1), torch.ones(4, device="cuda"))


# --------------------------------------------------------------------------
# Effective rank > 8 after coalescing -> NotImplementedError
# --------------------------------------------------------------------------


def _nine_unmergeable(device, dtype=torch.float32):
    """9 dims of size 2 from a (4,)*9 tensor sliced with step 2 everywhere:
    strides 2 * 4**k, and stride[a] == size[b] * stride[b] has no solution,
    so no two dims merge in any order; the effective rank stays 9."""
    base = make_input((4,) * 9, dtype, device, seed=9)
    return base[(slice(None, None, 2),) * 9]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("dim", [0, 4, -1])
def test_effective_rank_above_8(name, dim, device):
    x = _nine_unmergeable(device)
    assert x.dim() == 9 and all(s > 1 for s in x.shape)
    assert not mergeable(x.shape, x.stride(), dim % 9), "construction error: some dims can merge"
    for how, fn in entry_points(name):
        with pytest.raises(NotImplementedError) as ei:
            if name in FORWARD_OPS:
                fn(x, dim)
            else:
                fn(x, x, dim)  # both operands non-mergeable
        msg = str(ei.value)
        assert names_op(msg, name), f"{how}: {msg}"
        assert re.search(r"rank|dimension", msg, re.I), f"{how}: message does not say the rank is the problem: {msg}"
        assert "8" in msg, f"{how}: message does not say what is accepted (8): {msg}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_effective_rank_above_8_from_one_backward_operand(name, device):
    """grad_output contiguous (mergeable) but output not: the common
    coalescing of both operands still has rank 9."""
    y = _nine_unmergeable(device)
    dy = make_input(y.shape, torch.float32, device, seed=3)
    with pytest.raises(NotImplementedError):
        ours(name)(dy, y, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_effective_rank_above_8_via_dtype_arg(name, device):
    x = _nine_unmergeable(device, torch.bfloat16)
    with pytest.raises(NotImplementedError):
        ours(name)(x, -1, dtype=torch.float32)


# --------------------------------------------------------------------------
# Meta tensors go through the fake kernels, and validate the same way
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_meta_forward(name):
    x = torch.empty(4, 6, device="meta").t()
    out = ours(name)(x, 0)
    assert out.device.type == "meta" and out.shape == (6, 4) and out.stride() == x.stride()
    out = ours(name)(torch.empty(4, 6, device="meta", dtype=torch.bfloat16), -1, dtype=torch.float32)
    assert out.dtype == torch.float32
    with pytest.raises(IndexError):
        ours(name)(torch.empty(4, 6, device="meta"), 2)
    with pytest.raises(NotImplementedError):
        ours(name)(torch.empty(4, 6, device="meta", dtype=torch.int64), -1)


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_meta_backward(name):
    dy = torch.empty(4, 6, device="meta")
    out = ours(name)(dy, torch.empty(4, 6, device="meta"), 1)
    assert out.device.type == "meta" and out.shape == (4, 6)
    with pytest.raises(ValueError):
        ours(name)(dy, torch.empty(4, 7, device="meta"), 1)
    with pytest.raises(ValueError):
        ours(name)(dy, torch.empty(4, 6, device="meta", dtype=torch.float64), 1)


# --------------------------------------------------------------------------
# Errors leave no trace
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_errors_leave_the_op_usable(device):
    x = make_input((3, 5), torch.float32, device)
    for bad in (lambda: ours("softmax")(x, 5), lambda: ours("softmax")(x.long(), -1),
                lambda: ours("softmax_backward")(x, x.double(), -1)):
        with pytest.raises((IndexError, NotImplementedError, ValueError)):
            bad()
    out = ours("softmax")(x, -1)
    if device == "cuda":
        torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), torch.softmax(x.cpu(), -1))
