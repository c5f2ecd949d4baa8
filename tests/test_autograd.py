"""gradcheck / gradgradcheck in float64 and torch.library.opcheck for every op.

gradcheck runs through the Python wrappers *and* the registered op
(torch.ops.softmax_ext.*), since autograd is registered on the op itself.
"""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from conftest import ALL_OPS, BACKWARD_OPS, DEVICES, FORWARD_OPS, custom_op, make_backward_inputs, make_input, ours

GRAD_CASES = [
    ((4, 5), -1, "contiguous"),
    ((4, 5), 0, "contiguous"),
    ((3, 4, 5), 1, "contiguous"),
    ((5, 4), 1, "transposed"),
    ((3, 8), -1, "sliced"),
    ((), 0, "0-dim"),
]


def _make(shape, layout, device, seed, scale=1.0):
    if layout == "transposed":
        x = make_input(shape[::-1], torch.float64, device, seed=seed, scale=scale).t()
    elif layout == "sliced":
        x = make_input((shape[0], shape[1] * 2), torch.float64, device, seed=seed, scale=scale)[:, ::2]
    else:
        x = make_input(shape, torch.float64, device, seed=seed, scale=scale)
    return x.detach().requires_grad_(True)


def _fwd_fn(name, via_op, dim):
    fn = custom_op(name) if via_op else ours(name)
    return lambda x: fn(x, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD_CASES, ids=[f"{c[2]}-{len(c[0])}d-dim{c[1]}" for c in GRAD_CASES])
@pytest.mark.parametrize("via_op", [False, True], ids=["wrapper", "torch_ops"])
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_gradcheck_forward(name, via_op, case, device):
    shape, dim, layout = case
    x = _make(shape, layout, device, seed=1)
    f = _fwd_fn(name, via_op, dim)
    assert gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD_CASES, ids=[f"{c[2]}-{len(c[0])}d-dim{c[1]}" for c in GRAD_CASES])
@pytest.mark.parametrize("via_op", [False, True], ids=["wrapper", "torch_ops"])
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_gradgradcheck_forward(name, via_op, case, device):
    shape, dim, layout = case
    x = _make(shape, layout, device, seed=2)
    f = _fwd_fn(name, via_op, dim)
    assert gradgradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_gradcheck_dtype_argument(name, device):
    """dtype= upcast: float32 input, float64 compute: gradient flows back."""
    x = make_input((3, 6), torch.float32, device, seed=3).requires_grad_(True)
    out = ours(name)(x, -1, dtype=torch.float64)
    assert out.dtype == torch.float64 and out.requires_grad
    # gradcheck through a float64 input cast to float32 first is not precise
    # enough; check the float64 -> float64 form with dtype= given explicitly.
    x64 = make_input((3, 6), torch.float64, device, seed=3).requires_grad_(True)
    assert gradcheck(lambda t: ours(name)(t, 0, dtype=torch.float64), (x64,), eps=1e-6, atol=1e-6)


BWD_CASES = [
    ((4, 5), -1, "contiguous"),
    ((4, 5), 0, "contiguous"),
    ((3, 4, 5), 1, "contiguous"),
    ((5, 4), 1, "transposed"),
    ((3, 8), 1, "sliced"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BWD_CASES, ids=[f"{c[2]}-{len(c[0])}d-dim{c[1]}" for c in BWD_CASES])
@pytest.mark.parametrize("via_op", [False, True], ids=["wrapper", "torch_ops"])
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_gradcheck_backward_ops(name, via_op, case, device):
    """The backward ops are differentiable wrt both grad_output and output."""
    shape, dim, layout = case
    dy = _make(shape, layout, device, seed=4)
    y = _make(shape, "contiguous", device, seed=5, scale=0.5)
    fn = custom_op(name) if via_op else ours(name)
    f = lambda a, b: fn(a, b, dim)  # noqa: E731
    assert gradcheck(f, (dy, y), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert gradgradcheck(f, (dy, y), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("wrt", ["grad_output", "output"])
def test_gradcheck_backward_ops_single_input(name, wrt, device):
    """Only one of the two inputs requires grad: the other's gradient slot is
    None and the one asked for is still right."""
    dy = make_input((3, 7), torch.float64, device, seed=6)
    y = make_input((3, 7), torch.float64, device, seed=7, scale=0.5)
    if wrt == "grad_output":
        dy.requires_grad_(True)
        f = lambda a: ours(name)(a, y, -1)  # noqa: E731
        assert gradcheck(f, (dy,), eps=1e-6, atol=1e-6)
    else:
        y.requires_grad_(True)
        f = lambda b: ours(name)(dy, b, -1)  # noqa: E731
        assert gradcheck(f, (y,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_triple_backward(name, device):
    """Backward ops carry their own autograd, so higher orders keep working."""
    x = make_input((2, 5), torch.float64, device, seed=8).requires_grad_(True)
    w = make_input((2, 5), torch.float64, device, seed=9)
    tfn = torch.softmax if name == "softmax" else torch.log_softmax

    def third(f, xx):
        (g1,) = torch.autograd.grad((f(xx, -1) * w).sum(), xx, create_graph=True)
        (g2,) = torch.autograd.grad((g1 * w).sum(), xx, create_graph=True)
        (g3,) = torch.autograd.grad((g2 * w).sum(), xx)
        return g3

    xr = x.detach().clone().requires_grad_(True)
    torch.testing.assert_close(third(ours(name), x), third(tfn, xr), atol=1e-10, rtol=1e-8)


# --------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------


def _leaf(t, requires_grad):
    return t.detach().requires_grad_(requires_grad) if t.is_floating_point() else t


def _forward_samples(device, requires_grad):
    rg = requires_grad
    mk = lambda shape, dtype=torch.float32, seed=0: make_input(shape, dtype, device, seed=seed)  # noqa: E731
    return [
        ("contiguous", (_leaf(mk((3, 5)), rg), -1), {}),
        ("transposed", (_leaf(mk((6, 4)).t(), rg), 0), {}),
        ("channels_last", (_leaf(mk((2, 3, 4, 5)).to(memory_format=torch.channels_last), rg), 1), {}),
        ("sliced", (_leaf(mk((4, 12))[:, ::3], rg), -1), {}),
        ("expanded", (_leaf(mk((3, 1)).expand(3, 4), rg), 0), {}),
        ("bf16_dtype_f32", (_leaf(mk((3, 9), torch.bfloat16), rg), -1), {"dtype": torch.float32}),
        ("f32_dtype_f16", (_leaf(mk((5, 3)), rg), 0), {"dtype": torch.float16}),
        ("f64_3d", (_leaf(mk((2, 3, 4), torch.float64), rg), -2), {}),
        ("0-dim", (_leaf(mk(()), rg), 0), {}),
        ("int_dtype_f32", (torch.arange(12, device=device).reshape(3, 4), -1), {"dtype": torch.float32}),
    ]


def _backward_samples(name, device, requires_grad):
    rg = requires_grad
    out = []
    dy, y = make_backward_inputs(name, (3, 5), -1, torch.float32, device)
    out.append(("contiguous", (_leaf(dy, rg), _leaf(y, rg), -1), {}))
    dy, y = make_backward_inputs(name, (4, 6), 0, torch.float32, device, seed=1)
    out.append(("mixed_layouts", (_leaf(dy.t().contiguous().t(), rg), _leaf(y, rg), 0), {}))
    dy, y = make_backward_inputs(name, (2, 3, 4, 5), 1, torch.float16, device, seed=2)
    out.append(
        ("channels_last_f16", (_leaf(dy.contiguous(memory_format=torch.channels_last), rg), _leaf(y, rg), 1), {})
    )
    dy, y = make_backward_inputs(name, (3, 5), 1, torch.float64, device, seed=3)
    y_sliced = make_input((3, 10), torch.float64, device, seed=5)[:, ::2]
    y_sliced.copy_(y)
    out.append(("f64_sliced", (_leaf(dy, rg), _leaf(y_sliced, rg), 1), {}))
    dy, y = make_backward_inputs(name, (), 0, torch.float32, device, seed=4)
    out.append(("0-dim", (_leaf(dy, rg), _leaf(y, rg), 0), {}))
    return out


def _opcheck_cases():
    cases = []
    for device in DEVICES:
        for rg in (False, True):
            for name in FORWARD_OPS:
                for sid, _, _ in _forward_samples("cpu", False):
                    if rg and sid == "int_dtype_f32":
                        continue
                    cases.append(pytest.param(name, device, rg, sid, id=f"{name}-{device}-{'grad' if rg else 'nograd'}-{sid}"))
            for name in BACKWARD_OPS:
                for sid, _, _ in _backward_samples(name, "cpu", False):
                    cases.append(pytest.param(name, device, rg, sid, id=f"{name}-{device}-{'grad' if rg else 'nograd'}-{sid}"))
    return cases


@pytest.mark.parametrize("name,device,requires_grad,sample", _opcheck_cases())
def test_opcheck(name, device, requires_grad, sample):
    samples = (
        _forward_samples(device, requires_grad)
        if name in FORWARD_OPS
        else _backward_samples(name, device, requires_grad)
    )
    args, kwargs = next((a, k) for s, a, k in samples if s == sample)
    op = custom_op(name).default
    torch.library.opcheck(op, args, kwargs)


SCHEMAS = {
    "softmax": "softmax_ext::softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor",
    "log_softmax": "softmax_ext::log_softmax(Tensor x, int dim=-1, ScalarType? dtype=None) -> Tensor",
    "softmax_backward": "softmax_ext::softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor",
    "log_softmax_backward": "softmax_ext::log_softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor",
}


@pytest.mark.parametrize("name", ALL_OPS)
def test_schema_matches_spec(name):
    import softmax_ext  # noqa: F401

    op = getattr(torch.ops.softmax_ext, name).default
    assert str(op._schema) == SCHEMAS[name]
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU"), f"{name} has no CPU kernel"
    if torch.cuda.is_available():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CUDA"), f"{name} has no CUDA kernel"
