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
    """Importing Inductor's lowering (as torch.compile does) registers each
    decomposition and a fallback lowering (the op's kernel where the
    decomposition declines)."""
    import torch._inductor.decomposition as decomposition
    import torch._inductor.lowering as lowering

    for op in _inductor.table():
        assert op in decomposition.decompositions, op
        assert op in lowering.lowerings, op


def _attention(x, mask):
    # what a transformers eager attention does around its softmax
    s = x * 0.125 + mask
    return softmax_ext.softmax(s, -1, torch.float32).to(x.dtype)


def _compiled_code(fn, *args, fullgraph=True):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        out, code = run_and_get_code(torch.compile(fn, fullgraph=fullgraph), *args)
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
    assert "torch.ops.softmax_ext" not in code
    code = _check_attention("cpu", torch.float32, 2048)  # past the handoff: softmax_ext's kernel
    assert "torch.ops.softmax_ext.softmax.default" in code


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_attention_fuses_on_cuda(dtype):
    code = _check_attention("cuda", dtype, 512)
    assert "torch.ops.softmax_ext" not in code  # (the generated kernel's comments name the op)
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


def _float32_buffers(code: str, numel: int) -> bool:
    """Whether the generated code allocates a float32 buffer of numel elements."""
    import math
    import re

    for shape in re.findall(r"empty_strided_\w+\(\(([\d, ]+)\), \([\d, ]*\), torch\.float32\)", code):
        if math.prod(int(d) for d in shape.replace(" ", "").strip(",").split(",")) == numel:
            return True
    return False


def _lm_loss_step(h, w, target, kwargs):
    """A language-model head and its loss as transformers writes it (with
    patch(), its F.cross_entropy is this call): the 16-bit logits upcast
    before the loss."""
    n, c = h.shape[0], w.shape[1]
    logits = (h @ w).view(2, n // 2, c)  # (batch, tokens, vocab)
    loss = softmax_ext.cross_entropy(logits.float().view(-1, c), target, **kwargs)
    loss.sum().backward()
    return loss


def _lm_step_returning_logits(h, w, target, kwargs):
    """The same, returning the 16-bit logits too (a model's output)."""
    n, c = h.shape[0], w.shape[1]
    logits = (h @ w).view(2, n // 2, c)
    loss = softmax_ext.cross_entropy(logits.float().view(-1, c), target, **kwargs)
    loss.sum().backward()
    return loss, logits


@pytest.mark.parametrize("kwargs", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"weight": "w"},
                                    {"label_smoothing": 0.1}], ids=["mean", "sum", "none", "weight", "smoothing"])
def test_loss_upcast_folds_on_cpu(handoff_on_cpu, kwargs):
    n, c, k = 48, 300, 16
    h = make_input((n, k), torch.bfloat16, "cpu", seed=6).requires_grad_()
    w = make_input((k, c), torch.bfloat16, "cpu", seed=7, scale=0.3).requires_grad_()
    target = torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(8))
    target[::7] = -100
    if kwargs.get("weight") == "w":
        kwargs = {"weight": torch.rand(c, generator=torch.Generator().manual_seed(9)) + 0.5}
    # (backward() in the step: the forward and backward graphs both compiled)
    loss, code = _compiled_code(_lm_loss_step, h, w, target, kwargs, fullgraph=False)
    if "label_smoothing" not in kwargs:  # the logits kept alive as an output: read in place
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        (loss2, _), code2 = _compiled_code(_lm_step_returning_logits, h2, w2, target, kwargs, fullgraph=False)
        assert not _float32_buffers(code2, n * c), code2
        torch.testing.assert_close(loss2, loss)
    grads = h.grad.clone(), w.grad.clone()
    # against float64 torch on the same 16-bit logits
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    logits = (h64 @ w64).to(torch.bfloat16).double()  # the 16-bit logits the model makes
    kw64 = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    ref = torch.nn.functional.cross_entropy(logits, target, **kw64)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=2e-5, atol=1e-5)
    ref.sum().backward()
    for got, want in zip(grads, (h64.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want, **BACKWARD_TOLERANCES[torch.bfloat16])
    # the (n, c) float32 upcast is never written, unless label smoothing
    # keeps the float32 call
    assert _float32_buffers(code, n * c) == ("label_smoothing" in kwargs), code
    assert "softmax_ext._cross_entropy_forward" in code
    # the backward, pointwise given the log-sum-exp, is generated code fused
    # with the gradient's cast (label smoothing keeps the op)
    calls_op = "torch.ops.softmax_ext._cross_entropy_backward.default(" in code
    assert calls_op == ("label_smoothing" in kwargs), code


def _lm_step_logits_used(h, w, target, kwargs):
    """A head whose logits (no upcast) feed the loss and a second term, as a
    model that returns its logits: AOTAutograd adds that term's gradient to
    the loss's."""
    logits = h @ w
    loss = softmax_ext.cross_entropy(logits, target, **kwargs)
    (loss.sum() + (logits.float() * 0.5).sum()).backward()
    return loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("kwargs", [{}, {"reduction": "none"}, {"weight": "w"}, {"label_smoothing": 0.1}],
                         ids=["mean", "none", "weight", "smoothing"])
def test_loss_backward_fuses_without_upcast(kwargs, dtype):
    """Logits that are no upcast (a float32 model, the integration's 16-bit
    logits): the backward is generated code, fused with the added gradient;
    label smoothing keeps the op. Values against float64 torch."""
    n, c, k = 40, 300, 16
    h = make_input((n, k), dtype, "cpu", seed=16).requires_grad_()
    w = make_input((k, c), dtype, "cpu", seed=17, scale=0.3).requires_grad_()
    target = torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(18))
    target[::5] = -100
    if kwargs.get("weight") == "w":
        kwargs = {"weight": (torch.rand(c, generator=torch.Generator().manual_seed(19)) + 0.5).to(dtype)}
    loss, code = _compiled_code(_lm_step_logits_used, h, w, target, kwargs, fullgraph=False)
    calls_op = "torch.ops.softmax_ext._cross_entropy_backward.default(" in code
    assert calls_op == ("label_smoothing" in kwargs), code
    assert "softmax_ext._cross_entropy_forward" in code
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    logits = (h64 @ w64).to(dtype).double()
    kw64 = {key: (v.double() if torch.is_tensor(v) else v) for key, v in kwargs.items()}
    ref = torch.nn.functional.cross_entropy(logits, target, **kw64)
    torch.testing.assert_close(loss.double(), ref.detach(), **TOLERANCES[dtype])
    (ref.sum() + (logits * 0.5).sum()).backward()
    for got, want in zip((h.grad, w.grad), (h64.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want, **BACKWARD_TOLERANCES[dtype])
