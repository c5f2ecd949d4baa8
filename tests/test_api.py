"""The package surface: nn modules, build_info(), __version__, exports."""

import re

import pytest
import torch

from conftest import DEVICES, HAS_CUDA, make_input


# --------------------------------------------------------------------------
# nn modules
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_nn_softmax_matches_torch(sx, dim, device):
    x = make_input((4, 7), torch.float32, device, seed=1)
    ours, ref = sx.nn.Softmax(dim), torch.nn.Softmax(dim)
    assert isinstance(ours, torch.nn.Module)
    assert ours.dim == dim
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_nn_log_softmax_matches_torch(sx, dim, device):
    x = make_input((4, 7), torch.float32, device, seed=2)
    ours, ref = sx.nn.LogSoftmax(dim), torch.nn.LogSoftmax(dim)
    assert ours.dim == dim
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def _pair_of_sequentials(sx, device):
    torch.manual_seed(0)
    lin_a = torch.nn.Linear(6, 5)
    lin_b = torch.nn.Linear(5, 5)
    ours = torch.nn.Sequential(lin_a, torch.nn.ReLU(), lin_b, sx.nn.Softmax(dim=-1)).to(device)
    import copy

    ref = copy.deepcopy(ours)
    ref[3] = torch.nn.Softmax(dim=-1)
    ours_log = torch.nn.Sequential(copy.deepcopy(lin_a), sx.nn.LogSoftmax(dim=1)).to(device)
    ref_log = torch.nn.Sequential(copy.deepcopy(lin_a), torch.nn.LogSoftmax(dim=1)).to(device)
    return ours, ref, ours_log, ref_log


@pytest.mark.parametrize("device", DEVICES)
def test_nn_modules_in_sequential_forward_and_backward(sx, device):
    ours, ref, ours_log, ref_log = _pair_of_sequentials(sx, device)
    x = make_input((8, 6), torch.float32, device, seed=3)
    w = make_input((8, 5), torch.float32, device, seed=4)
    out_o, out_r = ours(x), ref(x)
    torch.testing.assert_close(out_o, out_r, rtol=1e-5, atol=1e-6)
    (out_o * w).sum().backward()
    (out_r * w).sum().backward()
    for (n, po), pr in zip(ours.named_parameters(), ref.parameters()):
        assert po.grad is not None, n
        torch.testing.assert_close(po.grad, pr.grad, rtol=1e-4, atol=1e-6, msg=f"grad of {n}")

    target = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2], device=device)
    loss_o = torch.nn.functional.nll_loss(ours_log(x), target)
    loss_r = torch.nn.functional.nll_loss(ref_log(x), target)
    torch.testing.assert_close(loss_o, loss_r, rtol=1e-5, atol=1e-6)
    loss_o.backward()
    loss_r.backward()
    torch.testing.assert_close(ours_log[0].weight.grad, ref_log[0].weight.grad, rtol=1e-4, atol=1e-6)


def test_nn_modules_repr_and_state(sx):
    m = sx.nn.Softmax(dim=2)
    assert "dim=2" in repr(m)
    assert len(list(m.parameters())) == 0 and len(m.state_dict()) == 0
    assert "dim=0" in repr(sx.nn.LogSoftmax(0))


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)])
def test_nn_modules_dim_none_like_torch(sx, shape):
    """dim=None follows torch's legacy implicit-dim rule."""
    x = make_input(shape, torch.float32, "cpu", seed=5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = torch.nn.Softmax(dim=None)(x)
        ref_log = torch.nn.LogSoftmax(dim=None)(x)
        got = sx.nn.Softmax(dim=None)(x)
        got_log = sx.nn.LogSoftmax(dim=None)(x)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got_log, ref_log)


# --------------------------------------------------------------------------
# build_info / version / exports
# --------------------------------------------------------------------------


def _major_minor(v):
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def test_build_info(sx):
    info = sx.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["torch"], str)
    # built against the torch that is installed (same major.minor at least)
    assert _major_minor(info["torch"]) == _major_minor(torch.__version__), (info["torch"], torch.__version__)
    assert "cuda" in info
    archs = info["cuda_archs"]
    assert isinstance(archs, list) and all(isinstance(a, int) for a in archs)
    if info["cuda"] is None:
        assert archs == []
    else:
        assert isinstance(info["cuda"], str) and _major_minor(info["cuda"]) is not None
        assert torch.version.cuda is not None
        assert _major_minor(info["cuda"]) == _major_minor(torch.version.cuda), (info["cuda"], torch.version.cuda)
        assert len(archs) > 0 and all(a >= 50 for a in archs), archs
    if HAS_CUDA:
        assert info["cuda"] is not None, "a GPU is present but the build has no CUDA kernels"
        major, minor = torch.cuda.get_device_capability()
        cc = major * 10 + minor
        # some compiled arch (SASS of the same major, or PTX of an older one) runs here
        assert any(a <= cc for a in archs), (archs, cc)


def test_version(sx):
    assert isinstance(sx.__version__, str)
    assert re.match(r"^\d+\.\d+\.\d+", sx.__version__), sx.__version__


def test_exports(sx):
    for name in ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "plan", "build_info", "nn"):
        assert hasattr(sx, name), name
    assert hasattr(sx.nn, "Softmax") and hasattr(sx.nn, "LogSoftmax")


def test_extension_is_prebuilt(sx):
    """Importing loads a compiled library (no JIT build at import time)."""
    import softmax_ext._C as C

    assert C.__file__.endswith((".so", ".pyd")), C.__file__


def test_wrapper_keyword_defaults(sx):
    import inspect

    for name in ("softmax", "log_softmax"):
        params = inspect.signature(getattr(sx, name)).parameters
        assert list(params)[:3] == ["x", "dim", "dtype"], list(params)
        assert params["dim"].default == -1 and params["dtype"].default is None
    for name in ("softmax_backward", "log_softmax_backward"):
        params = inspect.signature(getattr(sx, name)).parameters
        assert list(params)[:3] == ["grad_output", "output", "dim"], list(params)
    params = inspect.signature(sx.plan).parameters
    assert params["dim"].default == -1 and params["kind"].default == "softmax" and params["backward"].default is False
