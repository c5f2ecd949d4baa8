"""torch.compile(fullgraph=True) of code calling softmax_ext's ops: no graph
breaks, the same results as eager, with dynamic shapes and through backward.

Kept to a few compiles: each one takes seconds to tens of seconds on a small
CPU machine.
"""

import pytest
import torch

from conftest import DEVICES, make_input, requires_cuda


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(x, w):
    import softmax_ext

    a = softmax_ext.softmax(x, -1)
    b = softmax_ext.log_softmax(x * 0.5, 0)
    c = torch.ops.softmax_ext.softmax(x, 1, dtype=torch.float64)
    return (a * w).sum() + (b * w).sum() + c.float().pow(2).sum()


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_backward(device):
    """One graph, forward and backward, a transposed (non-contiguous) input."""
    x0 = make_input((7, 5), torch.float32, device, seed=1).t()  # (5, 7) strided
    w = make_input((5, 7), torch.float32, device, seed=2, scale=1.0)

    x_e = x0.detach().clone().requires_grad_(True)
    loss_e = _model(x_e, w)
    loss_e.backward()

    compiled = torch.compile(_model, fullgraph=True)
    x_c = x0.detach().clone().requires_grad_(True)
    loss_c = compiled(x_c, w)
    loss_c.backward()

    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x_c.grad, x_e.grad, rtol=1e-5, atol=1e-6)
    assert x_e.grad.abs().sum() > 0, "test is vacuous: zero gradient"


def _layers(x):
    import softmax_ext

    y = softmax_ext.softmax(x, -1)
    z = softmax_ext.log_softmax(y * 3.0, 0)
    # strided views inside the graph: the fake kernel's strides must match
    return z.t().contiguous(), softmax_ext.softmax(x.t(), 0)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_two_shapes(device):
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(_layers, fullgraph=True, dynamic=True)
    for shape in [(4, 9), (6, 13)]:
        x = make_input(shape, torch.float32, device, seed=shape[0])
        got = compiled(x)
        exp = _layers(x)
        for g, e in zip(got, exp):
            assert g.shape == e.shape
            assert g.stride() == e.stride(), f"compiled strides {g.stride()} != eager {e.stride()}"
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    # dynamic shapes: the fake kernels must not specialise on the sizes
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_compile_backward_ops_directly():
    """The backward ops themselves, compiled (the path AOTAutograd takes)."""
    import softmax_ext

    def f(dy, y):
        return softmax_ext.softmax_backward(dy, y, -1) + softmax_ext.log_softmax_backward(dy, y.log(), -1)

    dy = make_input((3, 11), torch.float32, "cpu", seed=3)
    y = torch.softmax(make_input((3, 11), torch.float32, "cpu", seed=4), -1)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(dy, y)
    torch.testing.assert_close(got, f(dy, y))


@requires_cuda
def test_compile_reduce_overhead_cuda():
    """mode="reduce-overhead" (CUDA graphs on a side stream): kernels must be
    launched on the current stream or results are silently wrong
    (pytorch/pytorch#157363)."""
    import softmax_ext

    def f(x):
        return softmax_ext.softmax(x * 2.0, -1) + softmax_ext.log_softmax(x, 0)

    compiled = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    for seed, n in [(1, 1000), (2, 1000), (3, 5000), (4, 10000)]:
        x = make_input((64, n), torch.float32, "cuda", seed=seed)
        for _ in range(3):
            got = compiled(x)
        torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-6)


def _nll_of_log_softmax(logits, target):
    import softmax_ext

    return torch.nn.functional.nll_loss(softmax_ext.log_softmax(logits, -1), target)


def _nll_of_upcast_log_softmax(logits, target):
    # transformers' loss: logits.float() before the loss
    import softmax_ext

    return torch.nn.functional.nll_loss(softmax_ext.log_softmax(logits.float(), -1), target)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("loss", [_nll_of_log_softmax, _nll_of_upcast_log_softmax], ids=["direct", "upcast"])
def test_compile_16bit_loss_backward(loss, dtype, device):
    """16-bit logits -> log_softmax -> nll_loss -> backward, compiled whole:
    the traced backward may hand log_softmax_backward a gradient of another
    dtype than the saved output (inductor on CUDA, aot_eager on CPU)."""
    backend = "inductor" if device == "cuda" else "aot_eager"
    logits0 = make_input((16, 50), dtype, device, seed=5)
    target = torch.randint(0, 50, (16,), device=device, generator=None)
    a = logits0.clone().requires_grad_(True)
    loss(a, target).backward()
    b = logits0.clone().requires_grad_(True)
    out = torch.compile(loss, fullgraph=True, backend=backend)(b, target)
    out.backward()
    torch.testing.assert_close(out, loss(logits0, target), rtol=2e-2, atol=1e-2)
    assert b.grad.dtype == dtype
    torch.testing.assert_close(b.grad, a.grad, rtol=2e-2, atol=1e-3)
    ref = logits0.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(ref, target).backward()
    torch.testing.assert_close(b.grad.double(), ref.grad, rtol=2e-2, atol=2e-3)


def test_compiled_autograd():
    """torch._dynamo.config.compiled_autograd traces the C++ autograd nodes."""
    import softmax_ext
    from torch._dynamo.utils import counters

    def step(x, w):
        loss = (softmax_ext.softmax(x, -1) * w).sum() + (softmax_ext.log_softmax(x, 0) * w).sum()
        loss.backward()
        return x.grad

    x0 = make_input((6, 9), torch.float32, "cpu", seed=7)
    w = make_input((6, 9), torch.float32, "cpu", seed=8, scale=1.0)
    xe = x0.clone().requires_grad_(True)
    expected = step(xe, w)
    xc = x0.clone().requires_grad_(True)
    counters.clear()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        got = step(xc, w)
    assert counters["compiled_autograd"]["captures"] == 1, dict(counters["compiled_autograd"])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert expected.abs().sum() > 0
