"""PyTorch's own OpInfo samples (``op_db`` of torch.testing._internal) for
the torch functions softmax_ext serves: every sample on every device and
dtype torch's OpInfo lists, (1) through softmax_ext's op against torch in
float64 rounded to the output dtype, gradients included, and (2) through
the torch entry point itself under ``softmax_ext.patch()`` against the same
call unpatched (same values, or the same exception type)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import softmax_ext
from conftest import BACKWARD_TOLERANCES, DEVICES, HALF_DTYPES, TOLERANCES, assert_within_torch_bound

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

# (OpInfo name, variant) -> softmax_ext's function
SERVED = {
    ("softmax", ""): "softmax",
    ("softmax", "with_dtype"): "softmax",
    ("log_softmax", ""): "log_softmax",
    ("log_softmax", "with_dtype"): "log_softmax",
    ("_softmax_backward_data", ""): "softmax_backward",
    ("nn.functional.cross_entropy", ""): "cross_entropy",
}
OPINFOS = {(o.name, o.variant_test_name): o for o in op_db if (o.name, o.variant_test_name) in SERVED}
CASES = [(key, dtype) for key, o in sorted(OPINFOS.items()) for dtype in sorted(o.dtypes, key=str)]


def _id(case):
    (name, variant), dtype = case
    return f"{name}{'.' + variant if variant else ''}-{str(dtype).removeprefix('torch.')}"


def _samples(opinfo, device, dtype, requires_grad=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex inputs cast to a real dtype=
        yield from opinfo.sample_inputs(device, dtype, requires_grad=requires_grad)


def _floating(dtype):
    return dtype.is_floating_point


def _compare(got, want, dtype, what, backward=False):
    tol = (BACKWARD_TOLERANCES if backward else TOLERANCES)[dtype]
    assert got.dtype == dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    torch.testing.assert_close(got.double().cpu(), want.to(dtype).double().cpu(), equal_nan=True, msg=what, **tol)


def _forward_case(fn, sample):
    """softmax / log_softmax sample: (x, dim, out dtype, the float64 reference)."""
    x, (dim,), kwargs = sample.input, sample.args, sample.kwargs
    out_dtype = kwargs.get("dtype") or x.dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = getattr(torch, fn)(x.detach().to(torch.float64), dim)
    return x, dim, kwargs.get("dtype"), out_dtype, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_opinfo_samples_through_softmax_ext(case, device):
    key, dtype = case
    opinfo, fn = OPINFOS[key], SERVED[key]
    checked = 0
    for sample in _samples(opinfo, device, dtype):
        what = f"{fn} {sample.summary() if hasattr(sample, 'summary') else sample}"
        if fn in ("softmax", "log_softmax"):
            x, dim, dt, out_dtype, ref = _forward_case(fn, sample)
            if not _floating(out_dtype):
                with pytest.raises(NotImplementedError, match=fn):
                    getattr(softmax_ext, fn)(x, dim, dtype=dt)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = getattr(softmax_ext, fn)(x, dim, dtype=dt)
            _compare(got, ref, out_dtype, what)
            assert got.device == x.device
        elif fn == "softmax_backward":
            g, (y, dim, input_dtype) = sample.input, sample.args
            got = softmax_ext.softmax_backward(g, y, dim)
            ref = torch.ops.aten._softmax_backward_data(g.double(), y.double(), dim, torch.float64)
            _compare(got, ref, y.dtype, what, backward=True)
        else:
            x, (target,), kwargs = sample.input, sample.args, dict(sample.kwargs)
            if target.is_floating_point():  # probability targets: the SPEC lets them raise
                with pytest.raises(NotImplementedError, match="cross_entropy"):
                    softmax_ext.cross_entropy(x, target, **kwargs)
                continue
            got = softmax_ext.cross_entropy(x, target, **kwargs)
            kw64 = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kwargs.items()}
            ref = F.cross_entropy(x.double(), target, **kw64)
            _compare(got, ref, dtype, what)
        checked += 1
    assert checked or not _floating(dtype), "no sample ran"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in CASES if _floating(c[1])], ids=_id)
def test_opinfo_sample_gradients(case, device):
    # gradients of softmax_ext's op for a random upstream gradient against
    # torch's float64 autograd; in 16 bits, where the backward starts from
    # the rounded output, held to twice torch's own error in that dtype
    key, dtype = case
    opinfo, fn = OPINFOS[key], SERVED[key]
    if fn == "softmax_backward":
        pytest.skip("the backward op's own gradient: tests/test_autograd.py (gradgradcheck)")
    gen = torch.Generator().manual_seed(0)
    for sample in _samples(opinfo, device, dtype, requires_grad=True):
        what = f"{fn} grad {sample}"
        x = sample.input
        if fn == "cross_entropy":
            target, kwargs = sample.args[0], dict(sample.kwargs)
            if target.is_floating_point():
                continue
            kwargs = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in kwargs.items()}

            def run(f, t, target=target, kwargs=kwargs):  # the weights in t's dtype
                return f(t, target, **{k: (v.to(t.dtype) if torch.is_tensor(v) else v) for k, v in kwargs.items()})

            ours, theirs = softmax_ext.cross_entropy, F.cross_entropy
        else:
            dim = sample.args[0]
            if not x.requires_grad:
                continue

            def run(f, t, dim=dim):
                return f(t, dim)

            ours, theirs = getattr(softmax_ext, fn), getattr(torch, fn)
        out = run(ours, x)
        if out.numel() == 0:
            continue
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
        x_t, x64 = x.detach().clone().requires_grad_(), x.detach().double().requires_grad_()
        (dx,) = torch.autograd.grad(out, x, g)
        (dx_t,) = torch.autograd.grad(run(theirs, x_t), x_t, g)
        (dx64,) = torch.autograd.grad(run(theirs, x64), x64, g.double())
        if dtype in HALF_DTYPES:
            assert dx.dtype == dtype, what
            assert_within_torch_bound(dx, dx_t, dx64, what)
        else:
            _compare(dx, dx64, dtype, what, backward=True)


def _call(fn, sample):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn(sample.input, *sample.args, **sample.kwargs)
        except Exception as e:  # noqa: BLE001 - the exception is what is compared
            return e


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in CASES if SERVED[c[0]] != "softmax_backward"], ids=_id)
def test_opinfo_samples_under_patch(case, device):
    # the torch entry point (torch.softmax, torch.log_softmax,
    # F.cross_entropy; patch() leaves aten's backward ops alone) patched
    # against itself unpatched: the same values in the same dtype, or the
    # same exception type
    key, dtype = case
    opinfo = OPINFOS[key]
    for sample in _samples(opinfo, device, dtype):
        want = _call(opinfo.op, sample)
        with softmax_ext.patch():
            got = _call(opinfo.op, sample)
        what = f"{key} under patch() {sample}"
        if isinstance(want, Exception):
            assert type(got) is type(want), (what, got, want)
            continue
        assert not isinstance(got, Exception), (what, got)
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
        if got.dtype.is_floating_point:
            tol = TOLERANCES[got.dtype]
            # torch's own result is one rounding off float64, like softmax_ext's
            torch.testing.assert_close(got, want, equal_nan=True, msg=what,
                                       atol=2 * tol["atol"], rtol=2 * tol["rtol"])
        else:
            assert torch.equal(got, want), what
