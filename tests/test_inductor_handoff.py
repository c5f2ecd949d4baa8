"""Under Inductor, short contiguous rows decompose into aten ops that Inductor
fuses with their neighbours (softmax_ext/_inductor.py); long rows, strided
axes and other devices keep softmax_ext's kernels. Checked: the
decompositions' values against float64 torch, when they decline, and in
compiled code that the attention pattern (scale, additive mask, softmax,
cast) becomes one generated kernel without a softmax_ext call, while a
vocab-sized row still calls softmax_ext."""

import pytest
import torch

import softmax_ext
from softmax_ext import _inductor
from conftest import BACKWARD_TOLERANCES, DTYPES, TOLERANCES, dtype_id, make_input

OPS = torch.ops.softmax_ext


@pytest.fixture
def handoff_on_cpu(monkeypatch):
    monkeypatch.setattr(_inductor, "HANDOFF_DEVICES", ("cpu", "cuda"))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_decompositions_match_torch(handoff_on_cpu, kind, dtype):
    table = _inductor.table()
    x = make_input((7, 33), dtype, "cpu", seed=1)
    dy = make_input((7, 33), dtype, "cpu", seed=2, scale=1.0)
    ref = getattr(torch, kind)(x.double(), -1)
    y = table[getattr(OPS, kind).default](x, -1)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), ref, **TOLERANCES[dtype])
    # dtype= (a wider output)
    y32 = table[getattr(OPS, kind).default](x, 1, torch.float64)
    assert y32.dtype == torch.float64
    torch.testing.assert_close(y32, ref, **TOLERANCES[dtype])
    # backward, also with a gradient of another floating dtype
    aten = getattr(torch.ops.aten, f"_{kind}_backward_data")
    for g in (dy, dy.float()):
        want = aten(g.double(), y.double(), -1, torch.float64)
        dx = table[getattr(OPS, f"{kind}_backward").default](g, y, -1)
        assert dx.dtype == dtype
        torch.testing.assert_close(dx.double(), want, **BACKWARD_TOLERANCES[dtype])


def test_decompositions_decline(handoff_on_cpu):
    table = _inductor.table()
    fwd, bwd = table[OPS.softmax.default], table[OPS.softmax_backward.default]
    long_row = torch.randn(2, _inductor.HANDOFF_MAX_ROW + 1)
    assert fwd(long_row, -1) is NotImplemented
    assert fwd(torch.randn(2, 64), 0) is NotImplemented  # a strided axis
    assert fwd(torch.randn(64, 2).t(), -1) is NotImplemented
    assert fwd(torch.randn(3, 8), 1) is not NotImplemented
    assert bwd(torch.randn(2, 20000), torch.randn(2, 20000), -1) is NotImplemented
    assert bwd(torch.randn(2, 5000), torch.randn(2, 5000), -1) is not NotImplemented


def test_decompositions_decline_off_their_devices():
    table = _inductor.table()  # HANDOFF_DEVICES as shipped: CUDA only
    assert _inductor.HANDOFF_DEVICES == ("cuda",)
    assert table[OPS.softmax.default](torch.randn(3, 8), 1) is NotImplemented


def test_registered_with_inductor():
    import torch._inductor.decomposition as decomposition

    for op in _inductor.table():
        assert op in decomposition.decompositions, op


def _attention(x, mask):
    # what a transformers eager attention does around its softmax
    s = x * 0.125 + mask
    return softmax_ext.softmax(s, -1, torch.float32).to(x.dtype)


def _compiled_code(fn, *args):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        out, code = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return out, "\n".join(code)


def _check_attention(device, dtype, n):
    x = make_input((2, 4, 16, n), dtype, "cpu", seed=3).to(device).requires_grad_()
    mask = torch.zeros(16, n, dtype=dtype)
    mask[:, n // 2:] = float("-inf")
    mask = mask.to(device)
    out, code = _compiled_code(_attention, x, mask)
    ref = torch.softmax(x.detach().double() * 0.125 + mask.double(), -1)
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[dtype])
    return code


def test_attention_fuses_on_cpu(handoff_on_cpu):
    code = _check_attention("cpu", torch.float32, 64)
    assert "softmax_ext" not in code


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_attention_fuses_on_cuda(dtype):
    code = _check_attention("cuda", dtype, 512)
    assert "softmax_ext" not in code
    code = _check_attention("cuda", dtype, 8192)  # past the handoff: softmax_ext's kernel
    assert "torch.ops.softmax_ext.softmax.default" in code


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_compiled_training_step_matches_eager():
    """Forward and backward through the decompositions, against eager."""
    x = make_input((4, 8, 128, 128), torch.bfloat16, "cuda", seed=4).requires_grad_()
    mask = torch.triu(torch.full((128, 128), float("-inf"), device="cuda"), 1).to(torch.bfloat16)
    g = make_input((4, 8, 128, 128), torch.bfloat16, "cuda", seed=5, scale=1.0)

    def step(fn):
        x.grad = None
        fn(x, mask).backward(g)
        return x.grad.clone()

    torch._dynamo.reset()
    want = step(_attention)
    got = step(torch.compile(_attention, fullgraph=True))
    torch.testing.assert_close(got.double(), want.double(), **BACKWARD_TOLERANCES[torch.bfloat16])
