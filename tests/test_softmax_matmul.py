"""softmax_matmul: softmax(x, -1) @ v against float64 torch, on CPU and CUDA.

Values (each dtype; d2 not a multiple of any tile, d1 = 1, d3 = 1, d3 not a
multiple of 8, batch rank 0/1/2, randn * 30, -inf entries, strided inputs),
errors, gradients (gradcheck in float64, the 16-bit and f32 gradients against
float64), opcheck, torch.compile (dynamic shapes, backward), determinism, the
plan and CUDA-graph capture. TF32 tolerances apply only while TF32 is on.
"""

import contextlib
import math
import random

import pytest
import torch

from conftest import DEVICES, HAS_CUDA, dtype_id, make_generator, requires_cuda

import softmax_ext

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (atol, rtol) against float64 on inputs already rounded to the dtype. On CUDA
# P is rounded to the operand type before the tensor-core product (like any
# 16-bit attention kernel); a bf16 P costs ~2^-8 relative.
TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=3e-2),
}
TF32_TOL = dict(atol=4e-3, rtol=8e-3)

# (batch dims, d1, d2, d3): no d2 is a multiple of a tile (32 / 64), d1 = 1,
# d3 = 1, d3 not a multiple of 8, batch rank 0 / 1 / 2, d1 past one 64-row block.
SHAPES = [
    ((), 1, 37, 5),
    ((3,), 33, 130, 1),
    ((2, 3), 70, 77, 13),
    ((2,), 17, 300, 129),
    ((), 65, 1000, 64),
]


def randn(shape, dtype, device, seed, scale=1.0):
    g = make_generator(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


def reference(x, v):
    return torch.softmax(x.double(), -1) @ v.double()


@contextlib.contextmanager
def tf32(enabled):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def tol_for(dtype, device):
    if dtype == torch.float32 and device == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return TF32_TOL
    return TOL[dtype]


def check(x, v, scale_note=""):
    out = softmax_ext.softmax_matmul(x, v)
    assert out.shape == (*x.shape[:-1], v.shape[-1]) and out.dtype == x.dtype and out.device == x.device
    assert out.is_contiguous()
    ref = reference(x, v)
    torch.testing.assert_close(out.double(), ref, equal_nan=True, **tol_for(x.dtype, x.device.type),
                               msg=lambda m: f"{scale_note} {x.dtype} {tuple(x.shape)} @ {tuple(v.shape)}: {m}")
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-{s[1]}x{s[2]}x{s[3]}")
@pytest.mark.parametrize("device", DEVICES)
def test_values(device, dtype, shape):
    batch, d1, d2, d3 = shape
    x = randn((*batch, d1, d2), dtype, device, 1, scale=3.0)
    v = randn((*batch, d2, d3), dtype, device, 2)
    check(x, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("device", DEVICES)
def test_large_magnitude_and_neg_inf(device, dtype):
    x = randn((2, 40, 200), torch.float64, "cpu", 3, scale=30.0)
    x[0, 3, ::3] = -float("inf")  # some -inf entries
    x[1, 5, :150] = -float("inf")  # -inf over whole leading tiles, finite later
    x[1, 7, :] = -float("inf")  # a row all -inf -> NaN like softmax(x) @ v
    x = x.to(dtype=dtype, device=device)
    v = randn((2, 200, 24), dtype, device, 4)
    out = check(x, v, "randn*30")
    assert torch.isnan(out[1, 7]).all() and not torch.isnan(out[1, 6]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_d2_zero(device):
    x = torch.empty(3, 5, 0, device=device)
    v = torch.empty(3, 0, 7, device=device)
    out = softmax_ext.softmax_matmul(x, v)
    assert out.shape == (3, 5, 7) and (out == 0).all()
    assert softmax_ext.softmax_matmul(torch.empty(0, 4, device=device), torch.ones(4, 3, device=device)).shape == (0, 3)
    assert softmax_ext.softmax_matmul(torch.ones(2, 4, device=device), torch.ones(4, 0, device=device)).shape == (2, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device):
    x = randn((3, 300, 40), torch.float32, device, 5).transpose(-1, -2)  # (3, 40, 300), d2 strided
    v = randn((3, 24, 300), torch.float32, device, 6).transpose(-1, -2)[..., ::2]  # (3, 300, 12), strided
    x2 = randn((40, 4, 300), torch.float32, device, 7).transpose(0, 1)  # batch and rows swapped
    v2 = randn((300, 4, 9), torch.float32, device, 8).transpose(0, 1)
    with tf32(False):
        check(x, v)
        check(x2, v2)


def test_cpu_many_blocks():
    x = randn((2, 4096, 700), torch.float32, "cpu", 9, scale=5.0)
    v = randn((2, 700, 8), torch.float32, "cpu", 10)
    p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
    assert p.tile[2] < 700, p  # the loop really takes several blocks of d2
    check(x, v)


def test_errors():
    x, v = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    with pytest.raises(ValueError, match=r"softmax_matmul.*float32.*float64"):
        softmax_ext.softmax_matmul(x, v.double())
    with pytest.raises(ValueError, match=r"softmax_matmul.*\[2, 3, 4\].*\[2, 5, 5\]"):
        softmax_ext.softmax_matmul(x, torch.randn(2, 5, 5))
    with pytest.raises(ValueError, match="leading dimensions"):
        softmax_ext.softmax_matmul(x, torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="leading dimensions"):
        softmax_ext.softmax_matmul(x, torch.randn(4, 5))  # no broadcasting
    with pytest.raises(ValueError, match="at least 2"):
        softmax_ext.softmax_matmul(torch.randn(4), torch.randn(4, 5))
    with pytest.raises(NotImplementedError, match=r"softmax_matmul.*int32.*float32, float16, bfloat16, float64"):
        softmax_ext.softmax_matmul(torch.ones(2, 3, dtype=torch.int32), torch.ones(3, 2, dtype=torch.int32))
    if HAS_CUDA:
        with pytest.raises(ValueError, match=r"softmax_matmul.*cpu.*cuda"):
            softmax_ext.softmax_matmul(x, v.cuda())


def _grads(x, v, go):
    x = x.detach().requires_grad_()
    v = v.detach().requires_grad_()
    out = softmax_ext.softmax_matmul(x, v)
    dx, dv = torch.autograd.grad(out, (x, v), go)
    return dx, dv


def _naive_grads(x, v, go):
    # autograd through softmax(x) @ v
    x = x.detach().requires_grad_()
    v = v.detach().requires_grad_()
    return torch.autograd.grad(torch.softmax(x, -1) @ v, (x, v), go)


def _check_grads(x, v, go):
    # x's and v's gradients against float64 autograd (go rounded to x's dtype, as the op reads it)
    dtype, device = x.dtype, x.device.type
    dx, dv = _grads(x, v, go)
    x64 = x.double().requires_grad_()
    v64 = v.double().requires_grad_()
    rx, rv = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.to(dtype).double())
    assert dx.dtype == dtype and dv.dtype == dtype and dx.shape == x.shape and dv.shape == v.shape
    tol = {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=1e-4, rtol=1e-4),
           torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=3e-2, rtol=5e-2)}[dtype]
    if dtype == torch.float32 and device == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        tol = dict(atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(dx.double(), rx, **tol)
    torch.testing.assert_close(dv.double(), rv, **tol)


@pytest.mark.parametrize("allow_tf32", [False, True], ids=["exact", "tf32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("device", DEVICES)
def test_batch_expanded_inputs(device, dtype, allow_tf32):
    # x and v repeated along the batch (stride 0, as expand() gives them): on
    # sm_90 no tensor map describes such a batch, so the 16-bit kernels load
    # by cp.async and the float32 ones hand over to the blocked path; the
    # values and gradients are those of the materialised inputs either way.
    if allow_tf32 and dtype != torch.float32:
        pytest.skip("TF32 is a float32 setting")
    x = randn((1, 40, 136), dtype, device, 14, scale=3.0).expand(3, 40, 136)
    v = randn((1, 136, 24), dtype, device, 15).expand(3, 136, 24)
    go = randn((3, 40, 24), dtype, device, 16)
    with tf32(allow_tf32):
        out = softmax_ext.softmax_matmul(x, v)
        ref = reference(x, v)
        tol = TF32_TOL if allow_tf32 and device == "cuda" else tol_for(dtype, device)
        torch.testing.assert_close(out.double(), ref, **tol)
        if allow_tf32 and device == "cuda":
            dx, dv = _grads(x, v, go)
            cx, cv = _grads(x.contiguous(), v.contiguous(), go)
            torch.testing.assert_close(dx, cx, atol=1e-2, rtol=2e-2)
            torch.testing.assert_close(dv, cv, atol=1e-2, rtol=2e-2)
        else:
            _check_grads(x, v, go)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("device", DEVICES)
def test_backward_values(device, dtype):
    x = randn((2, 37, 150), dtype, device, 11, scale=3.0)
    v = randn((2, 150, 19), dtype, device, 12)
    go = randn((2, 37, 19), dtype, device, 13)
    _check_grads(x, v, go)


@pytest.mark.parametrize("blocked", [False, True], ids=["default", "blocked"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("device", DEVICES)
def test_backward_many_blocks(device, dtype, blocked, monkeypatch):
    # d2 over several blocks of the blocked backward (a block's dX written
    # into a column range of dX; on sm_90 with SOFTMAX_EXT_SMM_BLOCKED_BACKWARD=1,
    # else the fused backward on padded copies: odd d2 and d3), a row of
    # -inf, a grad_output of another dtype
    if blocked:
        if device == "cpu":
            pytest.skip("the CPU backward is the blocked one")
        monkeypatch.setenv("SOFTMAX_EXT_SMM_BLOCKED_BACKWARD", "1")
    x = randn((2, 3, 9001), dtype, device, 64, scale=3.0)
    x[1, 2, 4000:] = -float("inf")
    v = randn((2, 9001, 5), dtype, device, 65)
    go = randn((2, 3, 5), torch.float32, device, 66)
    _check_grads(x, v, go)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = randn((2, 5, 9), torch.float64, device, 14, scale=2.0).requires_grad_()
    v = randn((2, 9, 3), torch.float64, device, 15).requires_grad_()
    assert torch.autograd.gradcheck(softmax_ext.softmax_matmul, (x, v))
    x1 = randn((5, 9), torch.float64, device, 16).requires_grad_()  # batch rank 0, x only
    v1 = randn((9, 3), torch.float64, device, 17)
    assert torch.autograd.gradcheck(softmax_ext.softmax_matmul, (x1, v1))


def test_double_backward_raises():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(softmax_ext.softmax_matmul(x, v).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dx.sum().backward()


def test_autograd_node_and_compiled_autograd():
    """A differentiable call makes one C++ node (csrc/softmax_matmul/autograd.cpp,
    no Python): lse is not differentiable, only the gradients asked for are
    made, a retained graph runs twice, and compiled autograd traces the node."""
    from torch._dynamo.utils import counters

    x0 = randn((2, 5, 40), torch.float64, "cpu", 60)
    v0 = randn((2, 40, 3), torch.float64, "cpu", 61)
    x, v = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    assert type(out.grad_fn).__name__ == "CppFunction" and "smm::" in out.grad_fn.name(), out.grad_fn.name()
    assert not lse.requires_grad and lse.grad_fn is None
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, (x, v), g, retain_graph=True)
    assert all(a.equal(b) for a, b in zip(first, torch.autograd.grad(out, (x, v), g)))
    (dv_only,) = torch.autograd.grad(softmax_ext.softmax_matmul(x0, v), v, g)
    ref = torch.autograd.grad(torch.softmax(x, -1) @ v, (x, v), g)
    torch.testing.assert_close(first, ref)
    torch.testing.assert_close(dv_only, ref[1])

    def step(a, b):
        (softmax_ext.softmax_matmul(a, b) * g).sum().backward()
        return a.grad, b.grad

    xc, vc = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    counters.clear()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        got = step(xc, vc)
    assert counters["compiled_autograd"]["captures"] == 1, dict(counters["compiled_autograd"])
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_grad_modes(device):
    # The eager wrapper's direct entry point: no autograd node without a
    # gradient to track (grad mode off, inference mode, inputs that need no
    # grad), the op's formula otherwise; the values are the op's either way.
    x = randn((2, 5, 40), torch.float64, device, 56).requires_grad_()
    v = randn((2, 40, 3), torch.float64, device, 57).requires_grad_()
    want = torch.ops.softmax_ext.softmax_matmul(x, v)
    with torch.no_grad():
        out = softmax_ext.softmax_matmul(x, v)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, want.detach(), rtol=0, atol=0)
    with torch.inference_mode():
        assert torch.equal(softmax_ext.softmax_matmul(x, v), want.detach())
    assert softmax_ext.softmax_matmul(x.detach(), v.detach()).grad_fn is None
    out = softmax_ext.softmax_matmul(x, v.detach())
    assert out.grad_fn is not None
    (dx,) = torch.autograd.grad(out.sum(), x)
    (rx,) = torch.autograd.grad((torch.softmax(x, -1) @ v.detach()).sum(), x)
    torch.testing.assert_close(dx, rx)
    with pytest.raises(TypeError, match="softmax_matmul.*'v' must be Tensor"):  # worded like torch's bindings
        softmax_ext._C._softmax_matmul(x, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for dtype in (torch.float32, torch.bfloat16):
        x = randn((2, 7, 45), dtype, device, 18).requires_grad_()
        v = randn((2, 45, 6), dtype, device, 19).requires_grad_()
        torch.library.opcheck(torch.ops.softmax_ext._softmax_matmul_forward.default, (x, v))
        torch.library.opcheck(torch.ops.softmax_ext.softmax_matmul.default, (x, v))
    x = randn((7, 45), torch.float32, device, 20)
    v = randn((45, 6), torch.float32, device, 21)
    out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    torch.library.opcheck(torch.ops.softmax_ext._softmax_matmul_backward.default,
                          (torch.ones_like(out), x, v, out, lse))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_with_backward(device):
    torch._dynamo.reset()

    def f(x, v):
        return softmax_ext.softmax_matmul(x * 2, v).sum(-1)

    cf = torch.compile(f, fullgraph=True, dynamic=True)
    for d1, d2 in ((5, 33), (9, 70)):
        x = randn((2, d1, d2), torch.float32, device, 22).requires_grad_()
        v = randn((2, d2, 4), torch.float32, device, 23).requires_grad_()
        with tf32(False):
            y = cf(x, v)
            y.sum().backward()
            torch.testing.assert_close(y, f(x, v), atol=1e-5, rtol=1e-5)
            gx, gv = torch.autograd.grad(f(x, v).sum(), (x, v))
        torch.testing.assert_close(x.grad, gx, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v.grad, gv, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    x = randn((3, 70, 333), torch.bfloat16, device, 24, scale=4.0).requires_grad_()
    v = randn((3, 333, 40), torch.bfloat16, device, 25).requires_grad_()
    go = randn((3, 70, 40), torch.bfloat16, device, 26)
    a = softmax_ext.softmax_matmul(x, v)
    b = softmax_ext.softmax_matmul(x, v)
    assert torch.equal(a, b)
    g1, g2 = _grads(x, v, go), _grads(x, v, go)
    assert torch.equal(g1[0], g2[0]) and torch.equal(g1[1], g2[1])


@pytest.mark.parametrize("device", DEVICES)
def test_plan(device):
    x = torch.randn(2, 3, 100, 200, device=device)
    v = torch.randn(2, 3, 200, 48, device=device)
    p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
    assert p.problem == softmax_ext.plan.__globals__["MatmulProblem"](6, 100, 200, 48)
    assert p.deterministic and p.workspace_size == 0 and p.accumulator == torch.float32
    if device == "cpu":
        assert p.kernel == "cpu.blocked_aten.f32" and p.math == "f32"
    else:
        with tf32(True):
            assert softmax_ext.plan(x, kind="softmax_matmul", v=v).math == "tf32"
        with tf32(False):
            p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
            assert p.math == "exact-f32", p
            hopper = torch.cuda.get_device_capability() == (9, 0)
            assert p.kernel == ("cuda.wgmma.3xtf32.128x128x32" if hopper else "cuda.mma_sync.3xtf32.128x64x32"), p
        pb = softmax_ext.plan(x.bfloat16(), kind="softmax_matmul", v=v.bfloat16())
        assert pb.math == "16-bit-f32-acc" and pb.tile == (128, 64, 64), pb
        if torch.cuda.get_device_capability() == (9, 0):  # sm_90a build (setup.py turns 9.0 into 9.0a)
            assert pb.kernel == "cuda.wgmma.bf16.128x64x64", pb
            # rows that are not 16-byte aligned (d2 = 201): x copied to rows of 208 for the Hopper
            # kernel (its workspace), or the mma.sync kernel where the Hopper kernels are off
            xu = torch.zeros(2, 3, 100, 201, device=device, dtype=torch.bfloat16)
            vu = torch.zeros(2, 3, 201, 48, device=device, dtype=torch.bfloat16)
            pu = softmax_ext.plan(xu, kind="softmax_matmul", v=vu)
            assert pu.kernel == "cuda.wgmma.bf16.128x64x64.rows_copied" and pu.workspace_size == 6 * 100 * 208 * 2, pu
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("SOFTMAX_EXT_SMM_SM80", "1")
                pu = softmax_ext.plan(xu, kind="softmax_matmul", v=vu)
                assert pu.kernel.startswith("cuda.mma_sync.bf16"), pu
        else:
            assert pb.kernel.startswith("cuda.mma_sync.bf16"), pb
    pd = softmax_ext.plan(x.double(), kind="softmax_matmul", v=v.double(), backward=True)
    assert pd.accumulator == torch.float64 and pd.math == "f64" and "backward" in pd.kernel
    with pytest.raises(ValueError, match="v="):
        softmax_ext.plan(x, kind="softmax_matmul")


@requires_cuda
@pytest.mark.parametrize("shape", [(4, 300, 1000, 200), (2, 130, 2049, 520), (1, 1, 65, 1), (2, 130, 2052, 520),
                                   (2, 5, 5000, 300)])
def test_cuda_exact_f32_within_naive_bound(shape):
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), torch.float32, "cuda", 27, scale=30.0)
    v = randn((b, d2, d3), torch.float32, "cuda", 28)
    ref = reference(x, v)
    with tf32(False):
        ours = softmax_ext.softmax_matmul(x, v).double()
        naive = (torch.softmax(x, -1) @ v).double()
    err, err_naive = (ours - ref).abs().max().item(), (naive - ref).abs().max().item()
    assert err <= 2 * err_naive + 1e-6, (err, err_naive)


@requires_cuda
def test_cuda_tf32_gradients_near_naive_tf32():
    """With TF32 on, the gradients' error against float64 stays near that of
    autograd through the naive version in TF32: the fused Hopper backward
    rounds every TF32 operand to nearest (a truncated one biases dP, and
    D = rowsum(dO * O) does not take that bias out of dP - D as the naive
    backward's sum over dP does)."""
    b, d1, d2, d3 = 8, 1024, 1024, 64
    x = randn((b, d1, d2), torch.float32, "cuda", 61, scale=2.0)
    v = randn((b, d2, d3), torch.float32, "cuda", 62)
    go = randn((b, d1, d3), torch.float32, "cuda", 63)
    x64, v64 = x.double().requires_grad_(), v.double().requires_grad_()
    ref = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.double())
    with tf32(True):
        ours, naive = _grads(x, v, go), _naive_grads(x, v, go)
    # (measured on an H200: dx 1.7x the naive error, dv 1.0x; with V and
    # dO^T truncated by wgmma they were 5.8x and 1.7x)
    for name, a, n, r, bound in zip(("dx", "dv"), ours, naive, ref, (2.5, 1.5)):
        scale = r.abs().max().item()
        err, err_naive = (a.double() - r).abs().max().item() / scale, (n.double() - r).abs().max().item() / scale
        assert err <= bound * err_naive, (name, err, err_naive)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_cuda_tf32_and_big(dtype):
    x = randn((3, 200, 3000), dtype, "cuda", 29, scale=3.0)
    v = randn((3, 3000, 300), dtype, "cuda", 30)
    with tf32(True):
        check(x, v, "tf32 on")
    with tf32(False):
        check(x, v, "tf32 off")


@requires_cuda
@pytest.mark.parametrize("kernels", ["default", "sm80"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cuda_unaligned_and_offset_views(dtype, kernels, monkeypatch):
    # rows that start at odd offsets, d2 and d3 no multiple of 16 bytes: on
    # sm_90 copied to aligned rows for the Hopper kernels, else (and with
    # SOFTMAX_EXT_SMM_SM80=1) the mma.sync kernel's element loads
    if kernels == "sm80":
        monkeypatch.setenv("SOFTMAX_EXT_SMM_SM80", "1")
    base = randn((2, 50, 301), dtype, "cuda", 31)
    x = base[:, :, 1:]
    v = randn((2, 300, 75), dtype, "cuda", 32)[:, :, 3:]
    x[0, 3, :] = -float("inf")
    x[1, 4, ::5] = -float("inf")
    with tf32(False):
        check(x, v)
        check(x[:, :, :299], v[:, :299, :71])
        if kernels == "default" and torch.cuda.get_device_capability() == (9, 0):
            assert softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel.endswith(".rows_copied")


@requires_cuda
def test_cuda_graph_capture():
    x = randn((2, 64, 256), torch.bfloat16, "cuda", 33)
    v = randn((2, 256, 64), torch.bfloat16, "cuda", 34)
    softmax_ext.softmax_matmul(x, v)  # warm up outside the graph
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = softmax_ext.softmax_matmul(x, v)
    torch.cuda.current_stream().wait_stream(s)
    x.copy_(randn((2, 64, 256), torch.bfloat16, "cuda", 35))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), reference(x, v), **TOL[torch.bfloat16])


def hard_inputs(mode, shape, seed, nan_col):
    """x (b, d1, d2), v (b, d2, d3) in mode's dtype ("bf16", "f16", else
    float32): a max growing along d2 in the last batch entry, every third
    entry of row 0 -inf, and where d1 > 2 row 1 all -inf and a NaN in row 2."""
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(mode, torch.float32)
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), dtype, "cuda", seed, scale=3.0)
    v = randn((b, d2, d3), dtype, "cuda", seed + 1)
    x[-1] += torch.linspace(0, 40, d2, device="cuda").to(dtype)
    x[0, 0, ::3] = -float("inf")
    if d1 > 2:
        x[0, 1, :] = -float("inf")
        x[0, 2, nan_col] = float("nan")
    return dtype, x, v


# Few rows of d1 over many batch entries: mma.sync tiles of one warp (16
# rows; where they make six CTAs an SM) or two (32 rows; 64 for float32,
# in two row blocks), 64 columns of d3 a CTA. Shapes sized for the SM count:
# a multiple of it in batch entries. Tails of d2's tiles, of the row block
# and of d3's column blocks; unaligned rows (no 16-byte vectors); strided v.
SMALL_TILE_CASES = [(6, 16, 300, 40, 1), (6, 9, 128, 130, 1), (4, 24, 200, 64, 2), (3, 5, 77, 33, 2),
                    (2, 50, 136, 64, 2)]


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("mode", ["bf16", "f16", "tf32", "f32"])
@pytest.mark.parametrize("case", SMALL_TILE_CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"-sms{c[0]}")
def test_cuda_small_tiles_for_many_batch_entries(case, mode):
    per_sm, d1, d2, d3, warps = case
    if d1 > 32 and mode in ("bf16", "f16"):
        pytest.skip("16-bit rows of d1 over 32 keep the 128-row tiles")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    col_blocks = -(-d3 // 64)
    b = -(-per_sm * sms // col_blocks)  # per_sm CTAs an SM with one row block
    dtype, x, v = hard_inputs(mode, (b, d1, d2, d3), 85, nan_col=d2 // 3)
    if warps == 2 and mode in ("tf32", "f32"):  # v strided: the rows of a wider tensor
        v = randn((b, d2, d3 + 3), dtype, "cuda", 87)[..., :d3]
    with tf32(mode == "tf32"):
        p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
        variant = {"tf32": "tf32", "f32": "3xtf32"}.get(mode, mode)
        bk = 32 if dtype == torch.float32 else 64
        assert p.kernel == f"cuda.mma_sync.{variant}.{16 * warps}x64x{bk}", p
        out = check(x, v, mode)
        torch.testing.assert_close(softmax_ext.softmax_matmul(x, v), out, rtol=0, atol=0, equal_nan=True)
    if d1 > 2:
        assert torch.isnan(out[0, 1]).all() and torch.isnan(out[0, 2]).all() and not torch.isnan(out[0, 3:]).any()


@pytest.fixture
def tensor_core_kernels(monkeypatch):
    # shapes of few rows of d1 would take the rows kernel (CUDA cores):
    # tests of the tensor-core kernels keep them on every shape
    monkeypatch.setenv("SOFTMAX_EXT_SMM_ROWS", "0")


# The Hopper (wgmma) kernel takes 16-byte aligned rows: d2 and d3 multiples of
# 8 here, with tails of its 64-column d2 tiles, its 128-row blocks and its
# 64 / 128 / 256-column d3 blocks.
WGMMA_SHAPES = [(1, 1, 8, 8), (2, 130, 200, 136), (3, 257, 1000, 520), (2, 64, 64, 256), (1, 200, 4096, 64),
                (2, 129, 520, 328)]


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", WGMMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_tiles(dtype, shape):
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), dtype, "cuda", 40, scale=3.0)
    v = randn((b, d2, d3), dtype, "cuda", 41)
    check(x, v)


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("mode", ["bf16", "f16"])
@pytest.mark.parametrize("shape", [(2, 130, 200, 136), (1, 257, 1000, 520), (3, 1, 8, 8), (2, 64, 64, 64),
                                   (2, 130, 72, 131), (1, 129, 40, 260)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_output_stores_agree(mode, shape, monkeypatch):
    # On sm_90 the 16-bit forward stores its output tile by TMA from shared
    # memory where the output's tensor map can be made (d3 a multiple of 8),
    # by each thread's 4-byte stores with SOFTMAX_EXT_SMM_OUT_STAGED=0 (and
    # for d3 = 131, v's rows padded to 136): the same values bit for bit,
    # tails of d1 and d3 clipped.
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[mode]
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), dtype, "cuda", 54, scale=3.0)
    v = randn((b, d2, -(-d3 // 8) * 8), dtype, "cuda", 55)[..., :d3]
    monkeypatch.delenv("SOFTMAX_EXT_SMM_OUT_STAGED", raising=False)
    staged = check(x, v)
    monkeypatch.setenv("SOFTMAX_EXT_SMM_OUT_STAGED", "0")
    assert torch.equal(softmax_ext.softmax_matmul(x, v), staged)


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "3xtf32"])
@pytest.mark.parametrize("shape", WGMMA_SHAPES + [(2, 130, 1003, 131), (1, 129, 37, 257), (2, 3, 5, 2)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_f32(allow_tf32, shape):
    # float32 rows with 16-byte aligned strides: the Hopper TF32 / 3xTF32
    # kernels on sm_90, with tails of their 32-column d2 tiles, 128-row
    # blocks and 128 / 256-column d3 blocks, down to d2 and d3 that are no
    # multiple of 4 (rows padded to a multiple of 4 elements); a growing max
    # in the second batch entry, -inf entries, a row all -inf
    b, d1, d2, d3 = shape
    pad2, pad3 = -d2 % 4, -d3 % 4
    x = randn((b, d1, d2 + pad2), torch.float32, "cuda", 60, scale=3.0)[..., :d2]
    v = randn((b, d2, d3 + pad3), torch.float32, "cuda", 61)[..., :d3]
    if b > 1:
        x[1] += torch.linspace(0, 80, d2, device="cuda")
    x[0, 0, ::3] = -float("inf")
    if d1 > 2:
        x[0, 2, :] = -float("inf")
    with tf32(allow_tf32):
        if torch.cuda.get_device_capability() == (9, 0):
            p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
            assert p.kernel.startswith("cuda.wgmma." + ("tf32" if allow_tf32 else "3xtf32")), p
        out = check(x, v, "tf32" if allow_tf32 else "3xtf32")
        if d1 > 2:
            assert torch.isnan(out[0, 2]).all() and not torch.isnan(out[0, :2]).any()
        torch.testing.assert_close(softmax_ext.softmax_matmul(x, v), out, rtol=0, atol=0, equal_nan=True)
        if not allow_tf32:
            naive = (torch.softmax(x, -1) @ v).double()
            ref = reference(x, v)
            err, err_naive = (out.double() - ref).nan_to_num().abs().max().item(), \
                (naive - ref).nan_to_num().abs().max().item()
            assert err <= 2 * err_naive + 1e-6, (err, err_naive)


@requires_cuda
@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "3xtf32"])
@pytest.mark.parametrize("shape", [(40, 300, 40, 264), (24, 200, 100, 136), (20, 520, 200, 600), (9, 129, 1000, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_f32_many_tiles(allow_tf32, shape):
    # The Hopper float32 kernel runs a persistent grid: each CTA takes tile
    # after tile (here more tiles than CTAs), loading the next tile's first
    # d2 steps while the last one ends (d2 of two steps, fewer than its three
    # stages, and of many); every tile starts its running max, sum and
    # accumulator afresh: batch entries of very different scales, rows of
    # -inf in later tiles, a growing max
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), torch.float32, "cuda", 62, scale=3.0)
    x *= torch.linspace(0.1, 20, b, device="cuda").view(b, 1, 1)
    x[b // 2] += torch.linspace(0, 80, d2, device="cuda")
    x[-1, -1, :] = -float("inf")
    x[b // 3, 5, :] = -float("inf")
    v = randn((b, d2, d3), torch.float32, "cuda", 63)
    with tf32(allow_tf32):
        out = check(x, v, "tf32" if allow_tf32 else "3xtf32")
        assert torch.isnan(out[-1, -1]).all() and torch.isnan(out[b // 3, 5]).all()
        assert not torch.isnan(out[0]).any() and not torch.isnan(out[-1, :-1]).any()
        torch.testing.assert_close(softmax_ext.softmax_matmul(x, v), out, rtol=0, atol=0, equal_nan=True)
        _, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
        torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), -1), rtol=1e-6, atol=1e-5)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_cuda_aligned_growing_max_and_neg_inf(dtype):
    # the row max grows tile after tile (every tile moves it by more than 2^8),
    # rows of -inf before finite tiles, a whole -inf row, randn * 30
    b, d1, d2, d3 = 2, 150, 1096, 264
    ramp = torch.linspace(0, 60, d2, dtype=torch.float64)
    x = (randn((b, d1, d2), torch.float64, "cpu", 42) + ramp).to(dtype=dtype, device="cuda")
    x[1] = randn((d1, d2), dtype, "cuda", 43, scale=30.0)
    x[0, 3, :700] = -float("inf")
    x[0, 7, 64:] = -float("inf")
    x[1, 9, :] = -float("inf")
    v = randn((b, d2, d3), dtype, "cuda", 44)
    out = check(x, v)
    assert torch.isnan(out[1, 9]).all() and not torch.isnan(out[0]).any()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", [(2, 130, 200, 136), (1, 257, 1096, 520), (3, 1, 8, 8), (2, 64, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_backward(dtype, shape):
    # d2, d3 multiples of 8: the fused backward kernels on sm_90 (tails of
    # their 128-row, 128-column and 64-row tiles)
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), dtype, "cuda", 45, scale=3.0)
    v = randn((b, d2, d3), dtype, "cuda", 46)
    go = randn((b, d1, d3), dtype, "cuda", 47)
    if torch.cuda.get_device_capability() == (9, 0):
        p = softmax_ext.plan(x, kind="softmax_matmul", v=v, backward=True)
        assert p.kernel.startswith("cuda.wgmma.backward.") and p.workspace_size == 4 * b * d1, p
    dx, dv = _grads(x, v, go)
    x64 = x.double().requires_grad_()
    v64 = v.double().requires_grad_()
    rx, rv = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.double())
    tol = {torch.float16: dict(atol=4e-3, rtol=1e-2), torch.bfloat16: dict(atol=3e-2, rtol=5e-2)}[dtype]
    torch.testing.assert_close(dx.double(), rx, **tol)
    torch.testing.assert_close(dv.double(), rv, **tol)
    d2x, d2v = _grads(x, v, go)
    assert torch.equal(dx, d2x) and torch.equal(dv, d2v)


@requires_cuda
@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "3xtf32"])
@pytest.mark.parametrize("shape", [(2, 130, 200, 136), (1, 257, 1096, 520), (3, 2, 8, 8), (2, 64, 64, 64),
                                   (3, 66, 96, 264), (2, 129, 136, 72)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_backward_f32(shape, allow_tf32):
    # float32, d2 and d3 multiples of 8: the fused backward on sm_90 (dX
    # over K tiles of 32, dV from dO transposed; d1 not a multiple of 4 pads
    # the transposed rows; tails of every tile). TF32: within a few times the
    # error of autograd through softmax(x) @ v with TF32 matmuls (cuBLAS
    # keeps tiny products in float32: at least 2^-8, TF32's 2^-10 grown by
    # the cancellation in dP - D). 3xTF32: max
    # error over elements within twice that of autograd in float32 for dV
    # (the forward's bound), four times for dX: D = rowsum(dO * O) reads the
    # forward's output, whose own error (within twice the naive one's)
    # reaches a whole row of dX. Deterministic either way.
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), torch.float32, "cuda", 54, scale=3.0)
    x[0, min(3, d1 - 1), : d2 // 2] = -float("inf")
    v = randn((b, d2, d3), torch.float32, "cuda", 55)
    go = randn((b, d1, d3), torch.float32, "cuda", 56)
    x64 = x.double().requires_grad_()
    v64 = v.double().requires_grad_()
    rx, rv = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.double())
    with tf32(allow_tf32):
        if torch.cuda.get_device_capability() == (9, 0):
            p = softmax_ext.plan(x, kind="softmax_matmul", v=v, backward=True)
            # dV's columns: 256 only for TF32 with d3 > 128 and enough CTAs to fill the SMs
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            wide = allow_tf32 and d3 > 128 and b * -(-d2 // 128) * -(-d3 // 256) >= sms
            d1p = (d1 + 3) // 4 * 4
            variant = "tf32" if allow_tf32 else "3xtf32"
            assert p.kernel == f"cuda.wgmma.backward.{variant}.128x{256 if wide else 128}x32", p
            # D, then lse, dO^T and V rounded to TF32 (3xTF32: V's and dO^T's small parts too),
            # each at a 16-byte boundary
            words = (b * d1 + 3) // 4 * 4 + b * d1p * (1 + d3) + (b * d2 * d3 if allow_tf32 else b * d3 * (2 * d2 + d1p))
            assert p.workspace_size == 4 * words, p
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the fused kernels, not a fallback
                _grads(x, v, go)
                torch.cuda.synchronize()
            names = " ".join(e.key for e in prof.key_averages())
            assert "smm_bwd_dx_kernel<float" in names and "smm_bwd_dv_tf32_kernel" in names, names
        dx, dv = _grads(x, v, go)
        d2x, d2v = _grads(x, v, go)
        nx, nv = _naive_grads(x, v, go)
    assert torch.equal(dx, d2x) and torch.equal(dv, d2v)
    torch.testing.assert_close(dx.double(), rx, atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(dv.double(), rv, atol=1e-2, rtol=2e-2)
    for name, ours, naive, ref in (("dx", dx, nx, rx), ("dv", dv, nv, rv)):
        if allow_tf32:
            err = (ours.double() - ref).norm() / ref.norm()
            bound = (naive.double() - ref).norm() / ref.norm()
            assert err <= max(4 * bound, 2.0**-8), (name, err.item(), bound.item())
        else:
            err, bound = (ours.double() - ref).abs().max().item(), (naive.double() - ref).abs().max().item()
            assert err <= (4 if name == "dx" else 2) * bound + 1e-6, (name, err, bound)


@requires_cuda
@pytest.mark.parametrize("mode", ["bf16", "f16", "tf32", "3xtf32"])
@pytest.mark.parametrize("shape", [(2, 130, 201, 136), (3, 70, 96, 77), (2, 129, 1003, 515), (1, 33, 5, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_padded_backward(mode, shape, monkeypatch):
    # d2 or d3 no multiple of 8, and rows at odd offsets: on sm_90 the fused
    # backward on padded copies (x with -inf columns, v, grad_output and
    # output with zero rows and columns), named ".padded" (taken for large
    # problems only; here asked for); contiguous gradients, deterministic,
    # the same bits as the fused backward on the problem padded by hand;
    # values against float64 autograd (within the dtype's tolerance or twice
    # the naive version's error)
    monkeypatch.setenv("SOFTMAX_EXT_SMM_PADDED_BACKWARD", "1")
    b, d1, d2, d3 = shape
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(mode, torch.float32)
    x = randn((b, d1, d2 + 1), dtype, "cuda", 57, scale=3.0)[:, :, 1:]  # odd offsets
    x[0, min(2, d1 - 1), : d2 // 2] = -float("inf")
    v = randn((b, d2, d3), dtype, "cuda", 58)
    go = randn((b, d1, d3), dtype, "cuda", 59)
    with tf32(mode == "tf32"):
        hopper = torch.cuda.get_device_capability() == (9, 0)
        if hopper:
            p = softmax_ext.plan(x, kind="softmax_matmul", v=v, backward=True)
            variant = {"bf16": "bf16", "f16": "f16"}.get(mode, mode)
            assert p.kernel.startswith(f"cuda.wgmma.backward.{variant}.") and p.kernel.endswith(".padded"), p
            d2p, d3p = -(-d2 // 8) * 8, -(-d3 // 8) * 8
            copies = 2 * b * (d1 * d2p + d2p * d3p) + (2 * b * d1 * d3p if d3p != d3 else 0)
            assert p.workspace_size > copies * dtype.itemsize, p
        dx, dv = _grads(x, v, go)
        assert dx.is_contiguous() and dv.is_contiguous()
        d2x, d2v = _grads(x, v, go)
        assert torch.equal(dx, d2x) and torch.equal(dv, d2v)
        if hopper:  # the same kernels on the problem padded by hand
            pad = torch.nn.functional.pad
            out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
            bx, bv = torch.ops.softmax_ext._softmax_matmul_backward(go, x, v, out, lse)
            hx, hv = torch.ops.softmax_ext._softmax_matmul_backward(
                pad(go, (0, d3p - d3)), pad(x, (0, d2p - d2), value=-float("inf")), pad(v, (0, d3p - d3, 0, d2p - d2)),
                pad(out, (0, d3p - d3)), lse)
            assert torch.equal(bx, hx[..., :d2]) and torch.equal(bv, hv[:, :d2, :d3])
        _check_grads_against_naive(x, v, go, f"{mode} {shape}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", [(2, 132, 200, 264), (1, 1, 8, 8), (2, 64, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_backward_loads_agree(dtype, shape, monkeypatch):
    # on sm_90 the fused backward kernels load their tiles by TMA where the
    # tensor maps can be made and by cp.async with SOFTMAX_EXT_SMM_CPASYNC=1:
    # the same shared-memory tiles (zero fill past the edges either way), so
    # the same gradients bit for bit (dX with 128 and with 256 columns; with
    # 128, TMA's is the SS kernel and cp.async's the register-A one)
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), dtype, "cuda", 48, scale=3.0)
    v = randn((b, d2, d3), dtype, "cuda", 49)
    go = randn((b, d1, d3), dtype, "cuda", 50)
    for dx_bn in ("128", "256"):
        monkeypatch.setenv("SOFTMAX_EXT_SMM_DX_BN", dx_bn)
        monkeypatch.delenv("SOFTMAX_EXT_SMM_CPASYNC", raising=False)
        dx, dv = _grads(x, v, go)
        monkeypatch.setenv("SOFTMAX_EXT_SMM_CPASYNC", "1")
        cx, cv = _grads(x, v, go)
        assert torch.equal(dx, cx) and torch.equal(dv, cv), dx_bn


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", [(3, 200, 264, 136), (2, 130, 1000, 520), (1, 1, 8, 8), (2, 64, 64, 64),
                                   (1, 257, 384, 72)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_pad", [0, 16], ids=["contiguous", "row-strided"])
def test_cuda_aligned_backward_ss_dx_agrees(dtype, shape, x_pad, monkeypatch):
    # The default on sm_90: dX with both operands in shared memory and its
    # epilogue through shared memory (x tile by TMA into a finished stage, dX
    # stored by TMA, clipped at d1 and d2), the same products in the same
    # order and the same f32 math as the register-A kernel with its epilogue
    # through global memory (SOFTMAX_EXT_SMM_DX_SS=0): the same gradients bit
    # for bit.
    # Tails in d1 (not a multiple of 128) and d2 (not a multiple of 128), a
    # batch dim, more K tiles than stages, and x rows with a stride past d2.
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2 + x_pad), dtype, "cuda", 51, scale=3.0)[..., :d2]
    v = randn((b, d2, d3), dtype, "cuda", 52)
    go = randn((b, d1, d3), dtype, "cuda", 53)
    monkeypatch.delenv("SOFTMAX_EXT_SMM_DX_BN", raising=False)
    monkeypatch.delenv("SOFTMAX_EXT_SMM_CPASYNC", raising=False)
    monkeypatch.setenv("SOFTMAX_EXT_SMM_DX_SS", "0")
    dx, dv = _grads(x, v, go)
    monkeypatch.delenv("SOFTMAX_EXT_SMM_DX_SS")
    if torch.cuda.get_device_capability() == (9, 0):  # the SS kernel is the one that ran
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sx, sv = _grads(x, v, go)
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
        assert any("smm_bwd_dx_ss_kernel" in n for n in names), names
    else:
        sx, sv = _grads(x, v, go)
    assert torch.equal(dx, sx) and torch.equal(dv, sv)


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("allow_tf32", [False, True], ids=["exact", "tf32"])
@pytest.mark.parametrize("shape", WGMMA_SHAPES + [(2, 70, 36, 20)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_aligned_tiles_f32(shape, allow_tf32):
    # d2, d3 multiples of 4: the float32 Hopper kernels (TF32 / 3xTF32)
    b, d1, d2, d3 = shape
    x = randn((b, d1, d2), torch.float32, "cuda", 48, scale=3.0)
    v = randn((b, d2, d3), torch.float32, "cuda", 49)
    with tf32(allow_tf32):
        check(x, v, "tf32" if allow_tf32 else "exact")


def _hopper():
    return HAS_CUDA and torch.cuda.get_device_capability() == (9, 0) and softmax_ext.plan(
        torch.empty(1, 8, 8, device="cuda", dtype=torch.bfloat16), kind="softmax_matmul",
        v=torch.empty(1, 8, 8, device="cuda", dtype=torch.bfloat16)).kernel.startswith("cuda.wgmma.")


@requires_cuda
@pytest.mark.parametrize("mode", ["bf16", "f16"])
@pytest.mark.parametrize("shape", [(16, 2100, 130, 264), (16, 2100, 130, 128), (12, 1500, 300, 260)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_persistent_forward(shape, mode, monkeypatch):
    # More tiles of 128 rows x 128 / 256 columns than CTAs run at once: the
    # 16-bit Hopper forward's persistent kernel (tails of d1, d2 and d3; the
    # output by TMA through its buffer, or by stores where d3 % 8 != 0),
    # bit-identical to the kernel of a CTA per tile, values against float64
    if not _hopper():
        pytest.skip("the persistent kernel is a Hopper (sm_90a) forward path")
    _, x, v = hard_inputs(mode, shape, 90, nan_col=5)
    out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    monkeypatch.setenv("SOFTMAX_EXT_SMM_PERSISTENT", "0")
    out1, lse1 = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    assert torch.equal(out.nan_to_num(), out1.nan_to_num()) and torch.equal(out.isnan(), out1.isnan())
    assert torch.equal(lse.nan_to_num(), lse1.nan_to_num())
    torch.testing.assert_close(out.double(), reference(x, v), equal_nan=True, **TOL[x.dtype])
    assert torch.isnan(out[0, 1]).all() and lse[0, 1] == -float("inf") and torch.isnan(out[0, 2]).all()


@requires_cuda
@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "exact"])
@pytest.mark.parametrize("d3", [64, 72])
def test_cuda_float32_unaligned_rows_plan(allow_tf32, d3):
    # float32 x with rows that are no whole 16-byte chunks: the mma.sync
    # kernel reads them as they are (TF32; 3xTF32 up to 64 columns of d3),
    # the Hopper kernel on a copy only for 3xTF32 with more columns
    if not _hopper():
        pytest.skip("the row copies are a Hopper (sm_90a) path")
    x = randn((3, 70, 201), torch.float32, "cuda", 95, scale=3.0)
    v = randn((3, 201, d3), torch.float32, "cuda", 96)
    with tf32(allow_tf32):
        kernel = softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
        check(x, v, kernel)
    copied = not allow_tf32 and d3 > 64
    assert kernel.endswith(".rows_copied") == copied and kernel.startswith("cuda.wgmma." if copied else "cuda.mma_sync."), kernel


@requires_cuda
@pytest.mark.usefixtures("tensor_core_kernels")
@pytest.mark.parametrize("mode", ["bf16", "f16", "tf32", "3xtf32"])
@pytest.mark.parametrize("parts", [2, 5])
@pytest.mark.parametrize("shape", [(2, 3, 1000, 40), (1, 130, 1300, 264), (3, 1, 2049, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_d2_parts(mode, parts, shape, monkeypatch):
    # On sm_90 a forward whose CTAs would leave most SMs idle cuts d2 into
    # parts (a CTA each) and merges their outputs and log-sum-exps; forced
    # here with SOFTMAX_EXT_SMM_D2_PARTS on small shapes. Rows: a growing max
    # (the parts' maxima differ), -inf entries, a part's columns all -inf
    # (that part weighs 0), a row all -inf (NaN, lse -inf, as uncut), a NaN.
    if not _hopper():
        pytest.skip("the d2 parts are a Hopper (sm_90a) forward path")
    b, d1, d2, d3 = shape
    dtype, x, v = hard_inputs(mode, shape, 70, nan_col=7)
    x[0, 0, :300] = -float("inf")
    with tf32(mode == "tf32"):
        monkeypatch.setenv("SOFTMAX_EXT_SMM_D2_PARTS", "1")
        whole, lse_whole = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
        monkeypatch.setenv("SOFTMAX_EXT_SMM_D2_PARTS", str(parts))
        p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
        cols = (-(-d2 // parts) + 127) // 128 * 128  # parts of whole 128-column steps, none empty
        assert f".d2parts{-(-d2 // cols)}" in p.kernel and p.workspace_size > 0, p  # (+ ".rows_copied": d2 % 8)
        out = check(x, v, f"{parts} parts")
        out2, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    torch.testing.assert_close(out2, out, rtol=0, atol=0, equal_nan=True)  # deterministic
    torch.testing.assert_close(lse, lse_whole, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(out.isnan(), whole.isnan())
    if d1 > 2:
        assert torch.isnan(out[0, 1]).all() and lse[0, 1] == -float("inf") and torch.isnan(out[0, 2]).all()
    ref = reference(x, v)
    err = (out.double() - ref).nan_to_num().abs().max().item()
    err_whole = (whole.double() - ref).nan_to_num().abs().max().item()
    # each part's output is rounded to the dtype before the merge: one more rounding
    eps = {torch.bfloat16: 2**-8, torch.float16: 2**-11}.get(dtype, 2**-11 if mode == "tf32" else 1e-6)
    assert err <= 2 * err_whole + eps * ref.nan_to_num().abs().max().item(), (err, err_whole)
    # the backward takes the merged output and log-sum-exp: its gradients as
    # close to float64's as those after the uncut forward (up to the
    # rounding of the parts' outputs, which D = rowsum(dO * O) sums over d3)
    xg, vg = x.nan_to_num(neginf=-1e4), v
    go = randn((b, d1, d3), dtype, "cuda", 72)
    x64, v64 = xg.double().requires_grad_(), vg.double().requires_grad_()
    rx, rv = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.double())

    def grad_err():
        with tf32(mode == "tf32"):
            dx, dv = _grads(xg, vg, go)
        return max((dx.double() - rx).abs().max().item(), (dv.double() - rv).abs().max().item())

    err_parts = grad_err()
    monkeypatch.setenv("SOFTMAX_EXT_SMM_D2_PARTS", "1")
    err_whole = grad_err()
    scale = max(rx.abs().max().item(), rv.abs().max().item())
    assert err_parts <= 2 * err_whole + 4 * eps * scale, (err_parts, err_whole, scale)


@requires_cuda
@pytest.mark.parametrize("rows_kernel", [False, True], ids=["wgmma", "rows"])
def test_cuda_d2_parts_merge_overlapped(rows_kernel, monkeypatch):
    # On sm_90 the merge of the parts starts before the forward that writes
    # them ends and waits on the device for them: bit-identical to the
    # merge launched after it (SOFTMAX_EXT_OVERLAP=0)
    if not _hopper():
        pytest.skip("the d2 parts are a Hopper (sm_90a) forward path")
    monkeypatch.setenv("SOFTMAX_EXT_SMM_ROWS", "16" if rows_kernel else "0")
    x = randn((3, 4, 40000), torch.bfloat16, "cuda", 75, scale=3.0)
    v = randn((3, 40000, 96), torch.bfloat16, "cuda", 76)
    assert ".d2parts" in softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
    out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    monkeypatch.setenv("SOFTMAX_EXT_OVERLAP", "0")
    out0, lse0 = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
    check(x, v)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cuda_d2_parts_chosen_for_few_rows(dtype, monkeypatch):
    # one query row against a long d2 (attention-style pooling): the plan
    # cuts d2 by itself
    if not _hopper():
        pytest.skip("the d2 parts are a Hopper (sm_90a) forward path")
    monkeypatch.delenv("SOFTMAX_EXT_SMM_D2_PARTS", raising=False)
    x = randn((2, 1, 32768), dtype, "cuda", 73, scale=3.0)
    v = randn((2, 32768, 64), dtype, "cuda", 74)
    assert ".d2parts" in softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
    check(x, v)


# Few rows of d1 (the plan's "cuda.rows" kernel, CUDA cores): every row
# block size (1-16 rows), d2 tails of its 256-column steps and d2 cut into
# parts, d3 tails of its column groups and several column blocks.
ROWS_SHAPES = [(1, 1, 37, 5), (3, 2, 300, 129), (2, 3, 1000, 40), (1, 5, 257, 1100), (2, 8, 5000, 64),
               (1, 13, 2049, 520), (4, 16, 256, 32), (1, 16, 70, 1), (2, 4, 65536, 8)]


@requires_cuda
@pytest.mark.parametrize("cut", ["auto", "3"])
@pytest.mark.parametrize("mode", ["bf16", "f16", "f32", "tf32"])
@pytest.mark.parametrize("shape", ROWS_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_rows_kernel(shape, mode, cut, monkeypatch):
    # rows: a growing max (later chunks and parts move it), -inf entries, a
    # row all -inf (NaN, lse -inf), a NaN; values and lse against float64,
    # bit-identical reruns; "3": d2 cut into parts of whole 256-column steps
    monkeypatch.setenv("SOFTMAX_EXT_SMM_ROWS", "16")
    if cut != "auto":
        monkeypatch.setenv("SOFTMAX_EXT_SMM_D2_PARTS", cut)
    b, d1, d2, d3 = shape
    dtype, x, v = hard_inputs(mode, shape, 80, nan_col=d2 // 2)
    with tf32(mode == "tf32"):
        p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
        out, lse = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
        out2, lse2 = torch.ops.softmax_ext._softmax_matmul_forward(x, v)
    assert p.kernel.startswith("cuda.rows." + {"tf32": "f32"}.get(mode, mode)), p
    assert p.math == ("f32" if dtype == torch.float32 else "16-bit-f32-acc"), p
    parts = -(-d2 // ((-(-d2 // 3) + 255) // 256 * 256))
    if cut == "3" and d2 > 256:
        assert p.kernel.endswith(f".d2parts{parts}") and p.workspace_size > 0, p
    assert torch.equal(out.nan_to_num(), out2.nan_to_num()) and torch.equal(out.isnan(), out2.isnan())
    assert torch.equal(lse.nan_to_num(), lse2.nan_to_num())
    # float32 FMAs: the float32 tolerance with TF32 on as well
    torch.testing.assert_close(out.double(), reference(x, v), equal_nan=True, **TOL[dtype])
    torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), -1), rtol=2e-6, atol=2e-6, equal_nan=True)
    if d1 > 2:
        assert torch.isnan(out[0, 1]).all() and lse[0, 1] == -float("inf") and torch.isnan(out[0, 2]).all()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cuda_rows_kernel_layouts(dtype, monkeypatch):
    # element loads: v at an odd offset, rows no whole 16 bytes apart; x
    # strided along its rows; a batch repeated by expand (stride 0); two
    # blocks of 16 rows; a grid of more than 2^20 tiles (the grid-stride loop)
    monkeypatch.setenv("SOFTMAX_EXT_SMM_ROWS", "32")
    x = randn((3, 20, 1301), dtype, "cuda", 82, scale=3.0)[:, :, 1:]
    v = randn((3, 1300, 77), dtype, "cuda", 83)[:, :, 2:]
    assert softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel.startswith("cuda.rows"), "two row blocks"
    check(x, v)
    check(x[:, ::2], v)
    xe = randn((1, 3, 600), dtype, "cuda", 84).expand(4, 3, 600)
    ve = randn((1, 600, 24), dtype, "cuda", 85).expand(4, 600, 24)
    check(xe, ve)
    xb = randn(((1 << 20) + 5, 1, 4), dtype, "cuda", 86)
    vb = randn(((1 << 20) + 5, 4, 3), dtype, "cuda", 87)
    check(xb, vb)


@requires_cuda
def test_cuda_rows_kernel_chosen_for_few_rows(monkeypatch):
    # the plan's default: float32 with TF32 off up to 8 rows (16 where d3 <= 32); with TF32 where
    # d2 fills the kernel's 256-column steps, up to 2 rows (8 where no small tiles fill the GPU);
    # 16-bit keeps the tensor cores
    monkeypatch.delenv("SOFTMAX_EXT_SMM_ROWS", raising=False)

    def kernel(d1, dtype, allow):
        x = torch.zeros(2, d1, 512, device="cuda", dtype=dtype)
        v = torch.zeros(2, 512, 64, device="cuda", dtype=dtype)
        with tf32(allow):
            return softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel

    assert kernel(1, torch.float32, False).startswith("cuda.rows.f32.1x")
    assert kernel(8, torch.float32, False).startswith("cuda.rows.f32.8x")
    assert not kernel(9, torch.float32, False).startswith("cuda.rows")
    x16, v32 = torch.zeros(4, 16, 256, device="cuda"), torch.zeros(4, 256, 32, device="cuda")
    with tf32(False):
        assert softmax_ext.plan(x16, kind="softmax_matmul", v=v32).kernel.startswith("cuda.rows.f32.16x")
    assert kernel(1, torch.float32, True).startswith("cuda.rows.f32.1x")
    assert kernel(8, torch.float32, True).startswith("cuda.rows.f32.8x")
    assert not kernel(9, torch.float32, True).startswith("cuda.rows")
    assert not kernel(1, torch.bfloat16, False).startswith("cuda.rows")
    # many batch entries of a few rows: the small mma.sync tiles fill the GPU instead where d2 is
    # short of a step (or, with TF32, over two rows or 1024 entries)
    many = 6 * torch.cuda.get_device_properties(0).multi_processor_count
    for allow, d1, d2, rows in ((False, 2, 256, True), (False, 8, 256, True), (False, 2, 128, False),
                                (False, 3, 128, False), (False, 16, 256, False), (True, 2, 256, many <= 1024),
                                (True, 3, 256, False), (True, 1, 128, False)):
        xm, vm = torch.zeros(many, d1, d2, device="cuda"), torch.zeros(many, d2, 64, device="cuda")
        with tf32(allow):
            k = softmax_ext.plan(xm, kind="softmax_matmul", v=vm).kernel
            small = "cuda.mma_sync." + ("tf32" if allow else "3xtf32") + ".16x64x32"
            assert k.startswith("cuda.rows.f32" if rows else small), (allow, d1, d2, k)
            # and their backward is the blocked one (the fused one's 128-row tiles)
            kb = softmax_ext.plan(xm, kind="softmax_matmul", v=vm, backward=True).kernel
            assert kb.startswith("cuda.blocked_aten.backward"), (d1, kb)
    # the backward of one float32 row is the blocked one (the fused kernel's 128-row tiles), its
    # gradients as close to float64's as autograd's through the naive version
    x1, v1 = randn((2, 1, 512), torch.float32, "cuda", 88, scale=3.0), randn((2, 512, 64), torch.float32, "cuda", 89)
    assert softmax_ext.plan(x1, kind="softmax_matmul", v=v1, backward=True).kernel.startswith("cuda.blocked_aten")
    go = randn((2, 1, 64), torch.float32, "cuda", 90)
    with tf32(False):
        dx, dv = _grads(x1, v1, go)
        x64, v64 = x1.double().requires_grad_(), v1.double().requires_grad_()
        rx, rv = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.double())
    torch.testing.assert_close(dx.double(), rx, **TOL[torch.float32])
    torch.testing.assert_close(dv.double(), rv, **TOL[torch.float32])
    x2 = torch.zeros(2, 2, 512, device="cuda")
    if torch.cuda.get_device_capability() == (9, 0):
        assert "wgmma.backward" in softmax_ext.plan(x2, kind="softmax_matmul", v=v1, backward=True).kernel
    monkeypatch.setenv("SOFTMAX_EXT_SMM_ROWS", "16")
    assert kernel(16, torch.float16, False).startswith("cuda.rows.f16.16x")


@pytest.mark.parametrize("device", DEVICES)
def test_random_draws(device):
    """Seeded draws over shapes no list names, all at once: batch rank 0-2,
    d1 / d2 / d3 from 1 to past several tiles (long d2 on CUDA, where the
    plan cuts it into parts), every dtype, TF32 on and off, scales up to
    x·10, x or v read through a transposed layout; forward values, and on
    a third of the draws the x and v gradients, against float64."""
    rng = random.Random(21)
    d2s = [1, 3, 64, 100, 257, 1000, 4097] + ([20000] if device == "cuda" else [])
    for i in range(60 if device == "cuda" else 30):
        dtype = rng.choice(DTYPES)
        batch = tuple(rng.choice([1, 2, 5]) for _ in range(rng.choice([0, 1, 1, 2])))
        d1, d2 = rng.choice([1, 2, 7, 16, 33, 128, 200, 513]), rng.choice(d2s)
        d3 = rng.choice([1, 5, 8, 32, 64, 100, 256, 520])
        while max(1, math.prod(batch)) * max(d1 * d2, d2 * d3) > 3_000_000:
            d1, d3 = max(1, d1 // 2), max(1, d3 // 2)
        scale = rng.choice([1.0, 3.0, 10.0])
        x = randn(batch + (d1, d2), dtype, device, seed=700 + i, scale=scale)
        v = randn(batch + (d2, d3), dtype, device, seed=900 + i)
        if rng.random() < 0.25:  # x read with a unit stride along d1 instead of d2
            x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        if rng.random() < 0.25:
            v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
        with tf32(rng.random() < 0.5):
            check(x, v, f"draw {i} (x·{scale})")
            if i % 3 == 0:
                go = randn(batch + (d1, d3), dtype, device, seed=1100 + i)
                _check_grads_against_naive(x, v, go, f"draw {i} {dtype} {tuple(x.shape)} @ {tuple(v.shape)} x·{scale}")


def _check_grads_against_naive(x, v, go, what):
    """x's and v's gradients within _check_grads' tolerance, or (large x,
    where a 16-bit P's rounding dominates) within twice the error of
    autograd through the naive version in the same dtype, against float64."""
    try:
        _check_grads(x, v, go)
        return
    except AssertionError:
        pass
    ours = _grads(x, v, go)
    naive = _naive_grads(x, v, go.to(x.dtype))
    x64 = x.double().requires_grad_()
    v64 = v.double().requires_grad_()
    ref = torch.autograd.grad(torch.softmax(x64, -1) @ v64, (x64, v64), go.to(x.dtype).double())
    for name, a, n, r in zip(("dx", "dv"), ours, naive, ref):
        err = (a.double() - r).abs().max().item()
        err_naive = (n.double() - r).abs().max().item()
        assert err <= 2 * err_naive, f"{what}: {name} error {err:.3g}, naive {err_naive:.3g}"
