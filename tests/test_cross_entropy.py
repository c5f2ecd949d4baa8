"""softmax_ext.cross_entropy against F.cross_entropy computed in float64:
every reduction, class weights, ignore_index (all rows ignored included),
label smoothing, (N, C, d...) and (C) shapes, each dtype; gradients
(gradcheck in float64, the true class of a confident prediction), the
in-place backward, opcheck of every op, torch.compile (fullgraph, dynamic),
determinism, errors, nn.CrossEntropyLoss and plan(). CUDA tests take
vocabulary-sized rows, CUDA-graph capture and inductor."""

import random

import pytest
import torch
import torch.nn.functional as F

import softmax_ext
from conftest import DEVICES, requires_cuda
from softmax_ext import _C

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Loss and gradient tolerances (relative to the largest reference value):
# one rounding to the dtype plus float32 accumulation.
TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-10}
CONFIGS = {
    "plain": dict(),
    "weight": dict(weight=True),
    "smooth": dict(label_smoothing=0.1),
    "all": dict(weight=True, label_smoothing=0.25, ignore=True),
}


def _gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _inputs(n, c, dtype, device, seed=0, ignore=False, weight=False, extra=(), scale=3.0):
    g = _gen(seed)
    x = (torch.randn((n, c) + tuple(extra), generator=g, dtype=torch.float64) * scale).to(dtype)
    t = torch.randint(0, c, (n,) + tuple(extra), generator=g)
    if ignore:
        t[torch.rand(t.shape, generator=g) < 0.3] = -100
    w = torch.rand(c, generator=g, dtype=torch.float64) + 0.5 if weight else None
    return x.to(device), t.to(device), (w.to(device).to(dtype) if w is not None else None)


def _reference(x, t, w, reduction, smoothing, ignore_index=-100):
    """F.cross_entropy in float64 on the CPU with its gradient (of sum(loss *
    g)). (On the CPU: torch's CUDA kernel gives 0, not NaN, for the "mean"
    of one (C,) sample whose target is ignored; its CPU kernel, and both
    for (N, C) logits, give the mean of no targets as NaN, as softmax_ext
    does on every device.)"""
    x64 = x.detach().to(torch.float64).cpu().requires_grad_(True)
    w64 = w.to(torch.float64).cpu() if w is not None else None
    loss = F.cross_entropy(x64, t.cpu(), weight=w64, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=smoothing)
    return x64, loss


def _assert_close(got, ref, dtype, what, floor=0.0):
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    got64, ref64 = got.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    assert got64.shape == ref64.shape, f"{what}: shape {tuple(got64.shape)} vs {tuple(ref64.shape)}"
    scale = ref64.nan_to_num().abs().max().item() if ref64.numel() else 1.0
    torch.testing.assert_close(got64, ref64, rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1e-30) + 1e-30 + floor,
                               equal_nan=True, msg=lambda m: f"{what}: {m}")


def _check(x, t, w, reduction, smoothing, dtype, what, ignore_index=-100, floor=0.0):
    """softmax_ext against F.cross_entropy in float64, loss and gradient
    (floor: an absolute tolerance for references that are exactly zero)."""
    x_ours = x.detach().clone().requires_grad_(True)
    loss = softmax_ext.cross_entropy(x_ours, t, w, ignore_index, reduction, smoothing)
    x64, ref = _reference(x, t, w, reduction, smoothing, ignore_index)
    _assert_close(loss, ref, dtype, f"{what} loss", floor)
    g = torch.randn(ref.shape, generator=_gen(7), dtype=torch.float64).to(ref.device)
    ref.backward(g)
    loss.backward(g.to(loss.device, loss.dtype))
    _assert_close(x_ours.grad, x64.grad, dtype, f"{what} grad", floor)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_torch(dtype, reduction, config):
    cfg = CONFIGS[config]
    x, t, w = _inputs(13, 37, dtype, "cpu", seed=1, ignore=cfg.get("ignore", False), weight=cfg.get("weight", False))
    _check(x, t, w, reduction, cfg.get("label_smoothing", 0.0), dtype, f"{dtype} {reduction} {config}")


@pytest.mark.parametrize("shape", [(4, 7, 3), (2, 5, 3, 2), (0, 4), (0, 4, 3), (2, 3, 0), (3, 4, 40)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_shapes(shape, reduction):
    n, c, extra = shape[0], shape[1], shape[2:]
    x, t, w = _inputs(n, c, torch.float32, "cpu", seed=2, ignore=True, weight=True, extra=extra)
    _check(x, t, w, reduction, 0.1, torch.float32, f"{shape} {reduction}")


@pytest.mark.parametrize("device", DEVICES)
def test_random_configs_match_torch(device):
    """Seeded draws over the whole argument space at once: (C,), (N, C) and
    (N, C, d...) logits, C from 1 (on CUDA up to vocabulary sizes, every
    kernel geometry: short rows, 16-bit rows in one block, in parts, in a
    cluster, wide float32 rows), rows with odd strides, every dtype, a
    weight or none, ignore_index -100 or a real class, label smoothing,
    each reduction; loss and gradient against torch in float64."""
    rng = random.Random(5)
    sizes = [1, 2, 7, 33, 130] + ([1000, 4099, 16000, 32000, 50257, 70000] if device == "cuda" else [])
    for i in range(120):
        dtype = rng.choice(DTYPES)
        c = rng.choice(sizes)
        rank = rng.choice([1, 2, 2, 3, 4]) if c <= 1000 else rng.choice([1, 2])
        if rank == 1:
            n, extra = None, ()
        else:
            n, extra = rng.choice([1, 3, 17]), tuple(rng.choice([1, 2, 5]) for _ in range(rank - 2))
        ignore = rng.choice([-100, 0, 1])
        x, t, w = _inputs(n or 1, c, dtype, device, seed=100 + i, ignore=True, weight=rng.random() < 0.4,
                          extra=extra)
        t[t == -100] = ignore
        if n is None:
            x, t = x[0], t[0]
        elif rng.random() < 0.3:  # rows whose classes are not contiguous
            x = x.transpose(0, -1).contiguous().transpose(0, -1)
        reduction = rng.choice(["mean", "sum", "none"])
        # (one class: loss and gradient are 0; the gradient's smoothing
        # terms, (1 - eps) w + eps W / C - eps w / C - (1 - eps) w, cancel to
        # a last-bit residue that has no scale to be held to)
        smoothing = rng.choice([0.0, 0.1, 0.7]) if c > 1 else 0.0
        _check(x, t, w, reduction, smoothing, dtype,
               f"draw {i}: {dtype} {tuple(x.shape)} {reduction} ls={smoothing} ignore={ignore} weight={w is not None}",
               ignore_index=ignore)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_one_sample_0dim_target(reduction):
    x = torch.randn(11, dtype=torch.float64)
    t = torch.tensor(4)
    _check(x, t, None, reduction, 0.2, torch.float64, f"(C,) {reduction}")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored(reduction):
    x, t, _ = _inputs(6, 9, torch.float32, "cpu", seed=3)
    t[:] = 3
    x_ours = x.clone().requires_grad_(True)
    loss = softmax_ext.cross_entropy(x_ours, t, ignore_index=3, reduction=reduction)
    ref = F.cross_entropy(x.double(), t, ignore_index=3, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss) and torch.isnan(ref)
    else:
        _assert_close(loss, ref, torch.float32, "all ignored")
    (loss.nansum() if reduction == "mean" else loss.sum()).backward()
    assert torch.count_nonzero(x_ours.grad) == 0


def test_vocab_rows_misaligned_and_strided():
    """Rows of vocabulary size, starting off 16-byte boundaries (a sliced
    class range) and with a row stride above C: head / body / tail paths."""
    for dtype in (torch.float32, torch.bfloat16):
        big, t, _ = _inputs(5, 32003, dtype, "cpu", seed=4, ignore=True)
        x = big[:, 1:32002]  # C = 32001, rows start 1 element past the boundary
        t = t.clamp(max=32000)
        t[0] = -100
        _check(x, t, None, "mean", 0.05, dtype, f"{dtype} sliced vocab")


def test_confident_prediction_keeps_gradient():
    """p_t close to 1 in bf16: the true-class gradient p_t - 1 is tiny but not
    zero (computed in float32 before the one rounding)."""
    # 1 - p_t = 999 e^-14 = 8.3e-4: below half a bf16 ulp under 1 (2^-9), so
    # a p_t rounded to bf16 first would give a zero gradient.
    x = torch.zeros(4, 1000, dtype=torch.bfloat16)
    t = torch.tensor([1, 2, 3, 4])
    x[torch.arange(4), t] = 14.0
    xg = x.clone().requires_grad_(True)
    softmax_ext.cross_entropy(xg, t, reduction="sum").backward()
    x64, ref = _reference(x, t, None, "sum", 0.0)
    ref.backward()
    got = xg.grad[torch.arange(4), t].double()
    want = x64.grad[torch.arange(4), t]
    assert (want < 0).all() and (got < 0).all(), (got, want)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("classes", [1000, 32000, 60000])
def test_large_logits_as_accurate_as_torch(device, classes):
    """float32 logits far from zero (x + 1e3, x + 1e4): the loss and the
    gradient are taken from x - max, exact, and the log of the row's
    exp-sum, never from a log-sum-exp rounded at the logits' magnitude (its
    rounding, an ulp of 1e4, is a relative 5e-4 of every probability). Errors
    against float64 within those of torch's own float32 cross_entropy on the
    same inputs: fused (mean under autograd), two-op (none) and weighted,
    smoothed rows; 32000 classes take the fused forward on CUDA, 60000 the
    two-op path, 1000 the short rows' block."""
    g = _gen(classes)
    n = 24
    base = torch.randn(n, classes, generator=g, dtype=torch.float64) * 3
    t = torch.randint(0, classes, (n,), generator=g)
    w = torch.rand(classes, generator=g, dtype=torch.float64) + 0.5
    for offset in (1e3, 1e4):
        x32 = (base + offset).float()
        for reduction, smoothing, weight in (("mean", 0.0, None), ("none", 0.0, None), ("mean", 0.1, w),
                                             ("none", 0.1, None), ("sum", 0.0, w)):
            x64 = x32.double().requires_grad_(True)
            ref = F.cross_entropy(x64, t, weight, reduction=reduction, label_smoothing=smoothing)
            ref.sum().backward()
            errs = {}
            for name, fn in (("torch", F.cross_entropy), ("ours", softmax_ext.cross_entropy)):
                x = x32.to(device, copy=True).requires_grad_(True)
                wd = weight.float().to(device) if weight is not None else None
                loss = fn(x, t.to(device), wd, reduction=reduction, label_smoothing=smoothing)
                loss.sum().backward()
                errs[name] = [((a.detach().double().cpu() - b).abs().max() / b.abs().max()).item()
                              for a, b in ((loss, ref.detach()), (x.grad, x64.grad))]
            what = f"{device} C={classes} offset {offset} {reduction} ls={smoothing} weight={weight is not None}"
            assert errs["ours"][0] <= 4 * errs["torch"][0] + 3e-7, f"{what}: loss {errs}"
            assert errs["ours"][1] <= 4 * errs["torch"][1] + 3e-6, f"{what}: grad {errs}"


def test_gradcheck_float64():
    x, t, w = _inputs(5, 6, torch.float64, "cpu", seed=5, ignore=True, weight=True)
    for reduction in ("mean", "sum", "none"):
        def f(x_):
            return softmax_ext.cross_entropy(x_, t, w, -100, reduction, 0.3)

        assert torch.autograd.gradcheck(f, (x.clone().requires_grad_(True),))


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_backward(device):
    x, t, w = _inputs(8, 300, torch.float32, device, seed=6, ignore=True, weight=True)
    a = x.clone().requires_grad_(True)
    softmax_ext.cross_entropy(a, t, w, label_smoothing=0.1).backward()
    leaf = x.clone().requires_grad_(True)
    logits = leaf * 1.0  # a non-leaf the caller gives up
    ptr = logits.data_ptr()
    softmax_ext.cross_entropy(logits, t, w, label_smoothing=0.1, inplace_backward=True).backward()
    torch.testing.assert_close(leaf.grad, a.grad, rtol=0, atol=0)
    assert logits.data_ptr() == ptr
    torch.testing.assert_close(logits.detach(), a.grad, rtol=0, atol=0)  # the gradient sits in the logits
    m = softmax_ext.nn.CrossEntropyLoss(inplace_backward=True)
    assert m.inplace_backward and "inplace_backward=True" in repr(m)


def test_module_matches_torch():
    x, t, w = _inputs(9, 17, torch.float32, "cpu", seed=8, ignore=True, weight=True)
    ours = softmax_ext.nn.CrossEntropyLoss(weight=w, ignore_index=-100, reduction="sum", label_smoothing=0.1)
    ref = torch.nn.CrossEntropyLoss(weight=w.double(), reduction="sum", label_smoothing=0.1)
    _assert_close(ours(x, t), ref(x.double(), t), torch.float32, "module")


def test_int32_target():
    x, t, _ = _inputs(7, 10, torch.float32, "cpu", seed=9)
    _assert_close(softmax_ext.cross_entropy(x, t.int()), F.cross_entropy(x.double(), t), torch.float32, "int32")


def test_deterministic():
    x, t, w = _inputs(64, 999, torch.float32, "cpu", seed=10, ignore=True, weight=True)
    outs = []
    for _ in range(2):
        xg = x.clone().requires_grad_(True)
        loss = softmax_ext.cross_entropy(xg, t, w, label_smoothing=0.1)
        loss.backward()
        outs.append((loss, xg.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_fast_checks_agree_with_python_rules():
    """_C._cross_entropy_valid (the eager check) accepts exactly the calls
    _check accepts, with the same class count, and _C._route_cross_entropy
    (patch()'s eager rules) answers as _cross_entropy_serves."""
    from softmax_ext import _cross_entropy as ce_mod
    from softmax_ext import patching

    x, t, _ = _inputs(4, 5, torch.float32, "cpu", seed=11)
    x3 = torch.randn(4, 5, 3)
    t3 = torch.randint(0, 5, (4, 3))
    cases = [
        (x, t, None, "mean", 0.0), (x, t.int(), torch.ones(5), "none", 0.5), (x3, t3, None, "sum", 1),
        (x[0], t[0], None, "mean", 0.0), (x, t[:3], None, "mean", 0.0), (x, t, torch.ones(4), "mean", 0.0),
        (x, t, None, "avg", 0.0), (x, t, None, "mean", 1.5), (x, t, None, "mean", float("nan")),
        (x, x, None, "mean", 0.0), (x.int(), t, None, "mean", 0.0), (x[0], t, None, "mean", 0.0),
        (x[0, 0], t[0], None, "mean", 0.0), (x3, t, None, "mean", 0.0), (x, t, None, "mean", -0.1),
        (x.half(), t, None, "sum", 0.0), (x.double(), t, torch.ones(5, 1), "mean", 0.0),
    ]
    for logits, target, weight, reduction, smoothing in cases:
        fast = _C._cross_entropy_valid(logits, target, weight, reduction, smoothing)
        try:
            slow = ce_mod._check(logits, target, weight, reduction, smoothing)
        except (ValueError, NotImplementedError, TypeError):
            slow = None
        assert fast == slow, (tuple(logits.shape), tuple(target.shape), reduction, smoothing, fast, slow)
        for size_average, reduce in ((None, None), (True, None), (None, False)):
            routed = _C._route_cross_entropy(logits, target, weight, size_average, reduce, reduction)
            assert routed == patching._cross_entropy_serves(logits, target, weight, size_average, reduce, reduction)


def test_errors():
    x, t, _ = _inputs(4, 5, torch.float32, "cpu", seed=11)
    ce = softmax_ext.cross_entropy
    with pytest.raises(IndexError, match="out of bounds"):
        ce(x, torch.tensor([0, 1, 5, 2]))
    with pytest.raises(IndexError, match="out of bounds"):
        ce(x, torch.tensor([0, -1, 2, 2]))
    with pytest.raises(ValueError, match="target has shape"):
        ce(x, t[:3])
    with pytest.raises(ValueError, match="weight has shape"):
        ce(x, t, weight=torch.ones(4))
    with pytest.raises(ValueError, match="reduction"):
        ce(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        ce(x, t, label_smoothing=1.5)
    with pytest.raises(NotImplementedError, match="soft"):
        ce(x, torch.softmax(x, 1))
    with pytest.raises(NotImplementedError, match="logits dtype"):
        ce(x.int(), t)
    with pytest.raises(ValueError, match="0-dim target"):
        ce(x[0], t)
    with pytest.raises(ValueError, match="0-dim"):
        ce(x[0, 0], t[0])
    with pytest.raises(ValueError, match="target has shape"):
        torch.ops.softmax_ext._cross_entropy_forward(x, t[:2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_acc_loss(device, dtype, reduction):
    """acc_loss=True: the loss in the accumulation dtype (float32 for 16-bit
    logits, float64 for float64), the same value the default output rounds
    to the logits' dtype, within float32 accuracy of float64's; the
    gradient is the default one."""
    ops = torch.ops.softmax_ext
    x, t, w = _inputs(37, 301, dtype, device, seed=21, ignore=True, weight=True)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    for smoothing in (0.0, 0.2):
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        plain, stats, total = ops._cross_entropy_forward(xs[0], t, w, -100, reduction, smoothing)
        ours, stats2, total2 = ops._cross_entropy_forward(xs[1], t, w, -100, reduction, smoothing, False, True)
        assert plain.dtype == dtype and ours.dtype == acc and ours.shape == plain.shape
        assert torch.equal(stats, stats2) and torch.equal(total, total2)
        assert torch.equal(ours.to(dtype), plain), "acc_loss rounded to the logits' dtype is the default loss"
        _, ref = _reference(x, t, w, reduction, smoothing)
        tol = 1e-10 if dtype == torch.float64 else 2e-5
        scale = ref.abs().max().item()
        torch.testing.assert_close(ours.detach().double().cpu(), ref.detach().cpu(), rtol=tol, atol=tol * scale)
        g = torch.rand(plain.shape, dtype=torch.float64, generator=_gen(3)).to(device)
        (gp,) = torch.autograd.grad(plain, xs[0], g.to(dtype))
        (go,) = torch.autograd.grad(ours, xs[1], g.to(acc))
        assert go.dtype == dtype
        if dtype in (torch.float32, torch.float64):
            assert torch.equal(gp, go)
        else:  # the upstream gradient read in float32 or after its rounding to 16 bits
            _assert_close(go, gp, dtype, f"acc_loss gradient {reduction} smoothing={smoothing}")


def _opcheck_samples(device):
    x, t, w = _inputs(6, 40, torch.float32, device, seed=12, ignore=True, weight=True)
    xb, tb, _ = _inputs(3, 24, torch.bfloat16, device, seed=13)
    out = []
    for red in ("mean", "sum", "none"):
        out.append(((x.clone().requires_grad_(True), t, w, -100, red, 0.1, False), red))
    out.append(((xb.clone().requires_grad_(True), tb, None, -100, "mean", 0.0, False), "bf16"))
    for red in ("mean", "none"):  # the loss in float32 (acc_loss)
        out.append(((xb.clone().requires_grad_(True), tb, None, -100, red, 0.1, False, True), "bf16 acc_loss"))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.softmax_ext
    for args, _ in _opcheck_samples(device):
        torch.library.opcheck(ops._cross_entropy_forward.default, args)
        torch.library.opcheck(ops.cross_entropy.default, args[:6])
        x, t, w, ii, red, ls = args[:6]
        loss, stats, total = ops._cross_entropy_forward.default(x.detach(), t, w, ii, red, ls)
        g = torch.rand_like(loss)
        bargs = (g, x.detach(), t, w, stats, total, ii, red, ls)
        torch.library.opcheck(ops._cross_entropy_backward.default, bargs)
        torch.library.opcheck(ops._cross_entropy_backward_.default, (g, x.detach().clone()) + bargs[2:])
        # A gradient of another dtype (a traced backward may hand one over).
        torch.library.opcheck(ops._cross_entropy_backward.default, (g.double(),) + bargs[1:])
        if red != "none":  # the fused forward and its backward
            fargs = (x.detach(), t, w, ii, red, ls, args[7] if len(args) > 7 else False)
            grad = ops._cross_entropy_forward_grad.default(*fargs)[3]
            torch.library.opcheck(ops._cross_entropy_forward_grad.default, fargs)
            torch.library.opcheck(ops._cross_entropy_grad_scale_.default, (grad, g))


def _two_op_grad(x, t, w, reduction, smoothing, g):
    """The gradient of the forward op with its own autograd formula (the
    path the fused forward replaces)."""
    xr = x.detach().clone().requires_grad_(True)
    loss = torch.ops.softmax_ext._cross_entropy_forward.default(xr, t, w, -100, reduction, smoothing)[0]
    loss.backward(g)
    return xr.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_forward_grad(device, dtype):
    """A differentiable eager mean / sum call writes the gradient in its
    forward (float16 excepted: a loss scaler must scale it before its
    rounding); the backward scales it by grad_loss; a second backward
    through the same graph is served from the saved logits."""
    # CUDA: 16-bit rows partly staged in shared memory (256 threads), f32
    # rows of 201 KB (200 KB staged, 512 threads), f64 rows of 160 KB
    classes = (20000 if dtype == torch.float64 else 50257) if device == "cuda" else 301
    for i, (reduction, config) in enumerate([("mean", "all"), ("sum", "plain"), ("mean", "weight"), ("sum", "smooth")]):
        cfg = CONFIGS[config]
        x, t, w = _inputs(7, classes, dtype, device, seed=40 + i, ignore=cfg.get("ignore", False),
                          weight=cfg.get("weight", False))
        smoothing = cfg.get("label_smoothing", 0.0)
        xf = x.clone().requires_grad_(True)
        _C._cross_entropy_set_grad_was_one(device == "cuda", True)  # (the 2.5 below clears it)
        loss = softmax_ext.cross_entropy(xf, t, w, -100, reduction, smoothing)
        fused = type(loss.grad_fn).__name__.startswith("_FusedGrad")
        assert fused == (dtype != torch.float16), type(loss.grad_fn).__name__
        if device == "cuda" and dtype == torch.float64:  # rows over 208 KB keep the two-op path
            xl = torch.zeros(2, 30000, dtype=dtype, device=device, requires_grad=True)
            big = softmax_ext.cross_entropy(xl, torch.zeros(2, dtype=torch.long, device=device))
            assert not type(big.grad_fn).__name__.startswith("_FusedGrad")
        x64, ref = _reference(x, t, w, reduction, smoothing)
        _assert_close(loss, ref, dtype, f"{reduction} {config} loss")
        ref.backward()
        for k, g in enumerate((1.0, 2.5)):  # the second through the saved logits
            (gx,) = torch.autograd.grad(loss * g, xf, retain_graph=True)
            _assert_close(gx, x64.grad * g, dtype, f"{reduction} {config} grad x {g}")
            two_op = _two_op_grad(x, t, w, reduction, smoothing, torch.tensor(g, dtype=dtype, device=device))
            # the same formula, the same roundings, the row's statistics summed
            # in the same order: the same bits
            assert torch.equal(gx, two_op), f"{reduction} {config}: fused and two-op gradients differ"
    with torch.no_grad():
        assert softmax_ext.cross_entropy(x.clone().requires_grad_(True), t).grad_fn is None
    xn = x.clone().requires_grad_(True)
    assert not type(softmax_ext.cross_entropy(xn, t, reduction="none").grad_fn).__name__.startswith("_FusedGrad")


@pytest.mark.parametrize("device", DEVICES)
def test_fused_forward_follows_the_incoming_gradient(device):
    """A backward whose incoming gradient is not 1 (a loss divided before
    backward()) turns the fused forward off for the calls after it, and one
    of 1 turns it back on; the values are right on either path."""
    cuda = device == "cuda"
    x, t, _ = _inputs(6, 301, torch.float32, device, seed=50)
    x64, ref = _reference(x, t, None, "mean", 0.0)
    ref.backward()

    def step(scale):
        xf = x.clone().requires_grad_(True)
        loss = softmax_ext.cross_entropy(xf, t)
        (loss * scale).backward()
        if cuda:
            torch.cuda.synchronize()  # the flag is written by the backward kernel
        _assert_close(xf.grad, x64.grad * scale, torch.float32, f"grad x {scale}")
        return "fused" if type(loss.grad_fn).__name__ == "_FusedGradBackward" else loss.grad_fn.name()

    two_op = "torch::autograd::CppNode<softmax_ext::ce::(anonymous namespace)::ForwardFunction>"
    _C._cross_entropy_set_grad_was_one(cuda, True)
    assert step(0.25) == "fused"
    assert step(0.25) == two_op
    assert step(1.0) == two_op
    assert step(1.0) == "fused"
    assert _C._cross_entropy_grad_was_one(cuda)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_grad_scale_skips_one(device):
    """_cross_entropy_grad_scale_ leaves the gradient's bits alone for a
    grad_loss of 1 and scales in the accumulation dtype otherwise, whatever
    floating dtype grad_loss has (read as it is on CUDA) and wherever its
    one value sits in its storage."""
    ops = torch.ops.softmax_ext
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        for loss_dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn):
            g = torch.randn(5, 1001, dtype=dtype, device=device)
            before = g.clone()
            ops._cross_entropy_grad_scale_.default(g, torch.ones((), device=device).to(loss_dtype))
            assert torch.equal(g, before), (dtype, loss_dtype)
            value = torch.tensor([0.5, -3.0], device=device).to(loss_dtype)[1]  # an offset view
            ops._cross_entropy_grad_scale_.default(g, value)
            acc = torch.float64 if dtype == torch.float64 else torch.float32
            torch.testing.assert_close(g, (before.to(acc) * -3.0).to(dtype), rtol=0, atol=0, msg=str(loss_dtype))
    with pytest.raises(ValueError, match="grad_loss has shape"):
        ops._cross_entropy_grad_scale_.default(g, torch.ones(2, device=device))


def _loss_fn(x, t, w):
    return softmax_ext.cross_entropy(x * 2.0, t, w, label_smoothing=0.1) + softmax_ext.cross_entropy(
        x, t, reduction="none"
    ).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(dynamic):
    torch._dynamo.reset()
    x, t, w = _inputs(8, 33, torch.float32, "cpu", seed=14, ignore=True, weight=True)
    xe = x.clone().requires_grad_(True)
    _loss_fn(xe, t, w).backward()
    fn = torch.compile(_loss_fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for n in (8, 5):
        xc = x[:n].clone().requires_grad_(True)
        loss = fn(xc, t[:n], w)
        loss.backward()
        xr = x[:n].clone().requires_grad_(True)
        ref = _loss_fn(xr, t[:n], w)
        ref.backward()
        torch.testing.assert_close(loss, ref)
        torch.testing.assert_close(xc.grad, xr.grad)
    torch._dynamo.reset()


def test_autograd_node_and_compiled_autograd():
    """The forward op's formula is one C++ node: row_stats and total_weight
    come out without grad, weight gets no gradient, the in-place backward
    writes over the logits, and compiled autograd traces the node."""
    from torch._dynamo.utils import counters

    x, t, w = _inputs(8, 33, torch.float64, "cpu", seed=15, ignore=True, weight=True)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, stats, total = torch.ops.softmax_ext._cross_entropy_forward(xg, t, wg, -100, "none", 0.1)
    assert "ce::" in loss.grad_fn.name() and not stats.requires_grad and not total.requires_grad
    g = torch.randn_like(loss)
    (dx,) = torch.autograd.grad(loss, xg, g, retain_graph=True)
    assert torch.autograd.grad(loss, wg, g, allow_unused=True)[0] is None
    xr = x.clone().requires_grad_(True)
    (rx,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t, w, reduction="none", label_smoothing=0.1),
                                xr, g)
    torch.testing.assert_close(dx, rx)
    copy = x.clone()
    softmax_ext.cross_entropy(copy.requires_grad_(True), t, w, reduction="sum", inplace_backward=True).backward()
    assert copy.grad is not None and copy.detach().equal(copy.grad)  # the gradient in the logits' memory

    def step(a):
        (softmax_ext.cross_entropy(a, t, w, reduction="none", label_smoothing=0.1) * g).sum().backward()
        return a.grad

    counters.clear()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        got = step(x.clone().requires_grad_(True))
    assert counters["compiled_autograd"]["captures"] == 1, dict(counters["compiled_autograd"])
    torch.testing.assert_close(got, rx)


def test_plan():
    x = torch.randn(6, 50, dtype=torch.bfloat16)
    p = softmax_ext.plan(x, kind="cross_entropy")
    assert p.kernel == "cpu.ce_rows.bf16" and p.deterministic and p.accumulator == torch.float32
    assert (p.problem.rows, p.problem.axis_size) == (6, 50)
    assert softmax_ext.plan(x, kind="cross_entropy", backward=True).kernel == "cpu.ce_rows_backward.bf16"
    assert softmax_ext.plan(torch.randn(2, 7, 3, 4), kind="cross_entropy").problem.rows == 24


# --- CUDA -------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("classes", [1000, 32000, 50257])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_vocab_rows(dtype, classes):
    x, t, w = _inputs(24, classes, dtype, "cuda", seed=20, ignore=True, weight=True)
    for reduction, weight, smoothing in (("mean", None, 0.0), ("none", w, 0.1), ("sum", None, 0.2)):
        _check(x, t, weight, reduction, smoothing, dtype, f"cuda {dtype} C={classes} {reduction}")


def _assert_paths_same_bits(x, t, w, reduction, smoothing, dtype, what):
    """The fused forward, the plain forward and the two-op gradient give the
    same loss, row statistics and gradient bits."""
    args = (x, t, w, -100, reduction, smoothing)
    loss, stats, total, grad = torch.ops.softmax_ext._cross_entropy_forward_grad.default(*args)
    ploss, pstats, _ = torch.ops.softmax_ext._cross_entropy_forward.default(*args)
    assert torch.equal(stats, pstats) and torch.equal(loss, ploss), what
    two_op = _two_op_grad(x, t, w, reduction, smoothing, torch.ones((), dtype=dtype, device=x.device))
    assert torch.equal(grad, two_op), f"{what}: gradient"


def _assert_inplace_matches(x, t):
    """inplace_backward=True writes the out-of-place gradient over the logits."""
    a = x.clone().requires_grad_(True)
    softmax_ext.cross_entropy(a, t).backward()
    logits = x.clone().requires_grad_(True) * 1.0
    softmax_ext.cross_entropy(logits, t, inplace_backward=True).backward()
    assert torch.equal(logits.detach(), a.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_short_rows(device, dtype):
    """Rows of a few classes: on CUDA the lanes kernels (a few lanes of a
    warp a row; every lane count, class counts around each lane boundary),
    on CPU a vector lane a row under 16 classes (blocks of rows and a
    partial last block); every reduction and configuration, rows off any
    alignment; the fused forward, the plain forward + backward op and a
    no_grad call give the same bits."""
    size = torch.empty((), dtype=dtype).element_size()
    for classes in (1, 2, 8, 9, 21, 33, 64, 65, 255, 1000):
        if classes * size > 4096:
            continue
        lanes = 1  # the classes of four 16-byte packs a lane
        while lanes < 32 and lanes * 4 * (16 // size) < classes:
            lanes *= 2
        plan = softmax_ext.plan(torch.empty(5, classes, device=device, dtype=dtype), kind="cross_entropy")
        if device == "cuda":
            assert plan.kernel == f"cuda.ce_lanes{lanes}.{TAGS[dtype]}", plan.kernel
        else:
            assert plan.kernel == f"cpu.ce_{'short_rows' if classes < 16 else 'rows'}.{TAGS[dtype]}", plan.kernel
        for i, (reduction, config) in enumerate((("mean", "all"), ("sum", "plain"), ("none", "weight"),
                                                 ("mean", "smooth"))):
            cfg = CONFIGS[config]
            x, t, w = _inputs(70, classes + 1, dtype, device, seed=30 + i, ignore=cfg.get("ignore", False),
                              weight=cfg.get("weight", False))
            x, t = x[:, 1:], t.clamp(max=classes - 1)  # rows off 16-byte boundaries, a row stride of C + 1
            w = w[1:] if w is not None else None
            smoothing = cfg.get("label_smoothing", 0.0)
            # one class: loss and gradient are 0, ours to the rounding of their terms
            floor = torch.finfo(dtype).eps if classes == 1 else 0.0
            _check(x, t, w, reduction, smoothing, dtype, f"C={classes} {reduction} {config}", floor=floor)
            if reduction != "none":
                _assert_paths_same_bits(x, t, w, reduction, smoothing, dtype, f"C={classes} {config}")
        if device == "cuda" and (classes * size) % 16 == 0:
            # aligned rows, read in 16-byte packs: right values, and the same
            # bits as the element reads of the same rows off alignment
            x, t, w = _inputs(70, classes, dtype, device, seed=60, ignore=True, weight=True)
            off = torch.empty(70 * classes + 1, dtype=dtype, device=device)[1:].view(70, classes)
            off.copy_(x)
            for reduction, smoothing in (("mean", 0.1), ("sum", 0.0)):
                what = f"C={classes} packed {reduction}"
                _check(x, t, w, reduction, smoothing, dtype, what, floor=torch.finfo(dtype).eps if classes == 1 else 0.0)
                _assert_paths_same_bits(x, t, w, reduction, smoothing, dtype, what)
                packed = torch.ops.softmax_ext._cross_entropy_forward.default(x, t, w, -100, reduction, smoothing)
                element = torch.ops.softmax_ext._cross_entropy_forward.default(off, t, w, -100, reduction, smoothing)
                assert torch.equal(packed[0], element[0]) and torch.equal(packed[1], element[1]), what


@requires_cuda
@pytest.mark.parametrize("lanes", [0, 1, 2, 4, 8, 16, 32])
def test_cuda_short_rows_any_lanes(lanes, monkeypatch):
    """SOFTMAX_EXT_CE_LANES forces the lanes a row (0: a block a row): every
    count gives the right loss and gradient on rows of 37 and 300 classes,
    many rows (the grid-stride loop, rows past the last whole warp)."""
    monkeypatch.setenv("SOFTMAX_EXT_CE_LANES", str(lanes))
    for i, (n, classes, dtype) in enumerate(((4099, 37, torch.float32), (333, 300, torch.bfloat16))):
        x, t, w = _inputs(n, classes, dtype, "cuda", seed=50 + i, ignore=True, weight=True)
        for reduction, smoothing in (("mean", 0.1), ("none", 0.0)):
            _check(x, t, w, reduction, smoothing, dtype, f"lanes {lanes} C={classes} {reduction}")


@pytest.mark.parametrize("device", DEVICES)
def test_ops_take_the_positions_layout(device):
    """The helper ops take (N, C, D) logits with (N, D) targets as they
    take rows of C classes (the positions in order): the same loss, row
    statistics and gradients, out of place, fused and in place."""
    ops = torch.ops.softmax_ext
    x, t, w = _inputs(4, 7, torch.float32, device, seed=41, ignore=True, weight=True, extra=(5,))
    rows, trows = x.movedim(1, -1).reshape(-1, 7), t.reshape(-1)
    for reduction, smoothing in (("mean", 0.1), ("sum", 0.0), ("none", 0.2)):
        args = (w, -100, reduction, smoothing)
        loss, stats, total = ops._cross_entropy_forward(x, t, *args)
        rloss, rstats, rtotal = ops._cross_entropy_forward(rows, trows, *args)
        torch.testing.assert_close(loss, rloss)
        torch.testing.assert_close(stats, rstats)
        g = torch.rand(rloss.shape, device=device) + 0.5
        grad = ops._cross_entropy_backward(g, x, t, w, stats, total, -100, reduction, smoothing)
        rgrad = ops._cross_entropy_backward(g, rows, trows, w, rstats, rtotal, -100, reduction, smoothing)
        assert grad.shape == x.shape and grad.is_contiguous()
        torch.testing.assert_close(grad, rgrad.view(4, 5, 7).permute(0, 2, 1))
        inplace = x.clone()
        ops._cross_entropy_backward_(g, inplace, t, w, stats, total, -100, reduction, smoothing)
        torch.testing.assert_close(inplace, grad)
        if reduction != "none":
            floss, _, _, fgrad = ops._cross_entropy_forward_grad(x, t, *args)
            torch.testing.assert_close(floss, loss)
            torch.testing.assert_close(fgrad, ops._cross_entropy_backward(torch.ones((), device=device), x, t, w,
                                                                          stats, total, -100, reduction, smoothing))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_positions_layout(device, dtype, monkeypatch):
    """(N, C, d...) logits (segmentation maps) read as they are, no copy to
    rows (CUDA: a thread a position; CPU: vector lanes over neighbouring
    positions, the last partial block position by position): every
    reduction and configuration, a class axis sliced out of a wider
    tensor, in place; the same bits from the fused forward and the two ops.
    SOFTMAX_EXT_CE_LAYOUT=1 forces the layout on small maps; CUDA takes it
    by itself from 65536 positions, CPU from 16 positions a sample."""
    tag = f"{device}.ce_positions.{TAGS[dtype]}"
    big = torch.empty(1, 21, 256, 256, device=device, dtype=dtype)
    assert softmax_ext.plan(big, kind="cross_entropy").kernel == tag
    assert softmax_ext.plan(big[..., :2, :3], kind="cross_entropy").kernel != tag
    monkeypatch.setenv("SOFTMAX_EXT_CE_LAYOUT", "1")
    for i, (reduction, config) in enumerate((("mean", "all"), ("sum", "plain"), ("none", "weight"),
                                             ("mean", "smooth"))):
        cfg = CONFIGS[config]
        smoothing = cfg.get("label_smoothing", 0.0)
        x, t, w = _inputs(3, 22, dtype, device, seed=80 + i, ignore=cfg.get("ignore", False),
                          weight=cfg.get("weight", False), extra=(7, 11))
        x, t = x[:, 1:], t.clamp(max=20)  # the class axis sliced: row stride 22 * 77, class stride 77
        w = w[1:] if w is not None else None
        _check(x, t, w, reduction, smoothing, dtype, f"layout {reduction} {config}")
        if reduction != "none":
            _assert_paths_same_bits(x.reshape(3, 21, -1), t.reshape(3, -1), w, reduction, smoothing, dtype, config)
    x, t, _ = _inputs(2, 5, dtype, device, seed=88, ignore=True, extra=(6, 7))
    _assert_inplace_matches(x, t)


@requires_cuda
def test_cuda_positions_layout_large():
    """A segmentation-sized map (65536 positions and more) on the layout
    kernels by default, forward and backward against float64."""
    x, t, w = _inputs(2, 19, torch.bfloat16, "cuda", seed=89, ignore=True, weight=True, extra=(200, 200))
    _check(x, t, w, "mean", 0.0, torch.bfloat16, "layout 2x19x200x200")
    _check(x, t, None, "none", 0.1, torch.bfloat16, "layout 2x19x200x200 none")


@requires_cuda
def test_cuda_misaligned_and_inplace():
    big, t, _ = _inputs(9, 50259, torch.bfloat16, "cuda", seed=21, ignore=True)
    x = big[:, 1:50258]
    t = t.clamp(max=50256)
    _check(x, t, None, "mean", 0.0, torch.bfloat16, "cuda sliced")
    _assert_inplace_matches(x, t)


@requires_cuda
def test_cuda_deterministic_and_graph_capture():
    x, t, w = _inputs(512, 32000, torch.bfloat16, "cuda", seed=22, ignore=True, weight=True)
    # every call below on the fused forward (the path a backward of gradient 1 leaves set; an
    # earlier test's other gradient would put the first call on the two-op path, whose row
    # sums run in another order: docs/cross_entropy.md)
    softmax_ext.cross_entropy(x.clone().requires_grad_(True), t, w, label_smoothing=0.1).backward()
    torch.cuda.synchronize()
    xg = x.clone().requires_grad_(True)
    loss = softmax_ext.cross_entropy(xg, t, w, label_smoothing=0.1)
    loss.backward()
    for _ in range(3):
        xh = x.clone().requires_grad_(True)
        l2 = softmax_ext.cross_entropy(xh, t, w, label_smoothing=0.1)
        l2.backward()
        assert torch.equal(loss, l2) and torch.equal(xg.grad, xh.grad)
    # Capture forward + backward in a CUDA graph (no host synchronisation).
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            xs = static_x.clone().requires_grad_(True)
            softmax_ext.cross_entropy(xs, t, w, label_smoothing=0.1).backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xs = static_x.requires_grad_(True)
        out = softmax_ext.cross_entropy(xs, t, w, label_smoothing=0.1)
        (gx,) = torch.autograd.grad(out, xs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, loss) and torch.equal(gx, xg.grad)


@requires_cuda
@pytest.mark.parametrize("n,c,dtype", [(65536, 128, torch.float32), (65536, 136, torch.bfloat16),
                                       (4096, 32000, torch.bfloat16)], ids=str)
def test_cuda_overlapped_launches(n, c, dtype, monkeypatch):
    """On sm_90 the forward's kernels after the first start before the one
    ahead of them ends and wait on the device for its results: the fused
    mean's rows for the divisor the first kernel sums, the kernel summing
    the row losses for those losses. Many short rows put the wait to work
    (the first rows' gradients are ready long before 65536 targets are
    summed); the results are bit-identical to launches one after another
    (SOFTMAX_EXT_OVERLAP=0) and right against float64."""
    x, t, w = _inputs(n, c, dtype, "cuda", seed=26, ignore=True, weight=True)
    ops = torch.ops.softmax_ext

    def run():
        fused = ops._cross_entropy_forward_grad(x, t, w)
        fused_sum = ops._cross_entropy_forward_grad(x, t, None, reduction="sum", label_smoothing=0.1)
        plain = ops._cross_entropy_forward(x, t, w)
        return fused + fused_sum + plain

    overlapped = run()
    monkeypatch.setenv("SOFTMAX_EXT_OVERLAP", "0")
    serial = run()
    for got, want in zip(overlapped, serial):
        assert torch.equal(got, want)
    x64, ref = _reference(x, t, w, "mean", 0.0)
    _assert_close(overlapped[0], ref, dtype, "fused mean")
    ref.backward()
    _assert_close(overlapped[3], x64.grad, dtype, "fused mean grad")


@requires_cuda
def test_cuda_compile_inductor():
    torch._dynamo.reset()
    x, t, w = _inputs(64, 4096, torch.bfloat16, "cuda", seed=23, ignore=True, weight=True)
    xe = x.clone().requires_grad_(True)
    _loss_fn(xe, t, w).backward()
    fn = torch.compile(_loss_fn, fullgraph=True)
    xc = x.clone().requires_grad_(True)
    loss = fn(xc, t, w)
    loss.backward()
    torch.testing.assert_close(loss, _loss_fn(x, t, w))
    torch.testing.assert_close(xc.grad, xe.grad)
    torch._dynamo.reset()


@requires_cuda
def test_cuda_plan():
    clusters = torch.cuda.get_device_capability() >= (9, 0)
    # (a mean's 16-bit rows of 32-128 KB: one block folds each half of the
    # row as the fused forward's cluster of two blocks does)
    x = torch.randn(4, 32000, device="cuda", dtype=torch.bfloat16)
    assert softmax_ext.plan(x, kind="cross_entropy").kernel == "cuda.ce_block_per_row.bf16"
    # few rows of 16-bit logits over 208 KB: a cluster of two blocks a row (sm_90)
    x = torch.randn(4, 128256, device="cuda", dtype=torch.bfloat16)
    expected = "cuda.ce_cluster2.bf16" if clusters else "cuda.ce_block_per_row.bf16"
    assert softmax_ext.plan(x, kind="cross_entropy").kernel == expected
    assert softmax_ext.plan(x, kind="cross_entropy", backward=True).kernel == "cuda.ce_block_per_row_backward.bf16"
    x = torch.randn(4, 128256, device="cuda", dtype=torch.float32)
    assert softmax_ext.plan(x, kind="cross_entropy").kernel == "cuda.ce_block_per_row.f32"


@requires_cuda
@pytest.mark.parametrize("dtype,classes", [(torch.bfloat16, 4099), (torch.bfloat16, 16000), (torch.bfloat16, 32000),
                                           (torch.bfloat16, 50257), (torch.bfloat16, 90000), (torch.float32, 20000),
                                           (torch.float32, 50257), (torch.float64, 10000), (torch.float64, 20000)],
                         ids=str)
def test_cuda_fused_and_two_op_same_bits(dtype, classes):
    """A differentiable call takes the fused forward or the plain forward and
    backward op by the last backward's incoming gradient, and a no_grad call
    the plain forward: every one gives the same loss, row statistics and gradient bits
    (the plain forward of a mean / sum sums each row as the fused one does),
    on every row geometry the fused forward has (16-bit rows in one block,
    in a cluster of two, in 512 threads; wider rows in 256 and 512)."""
    for i, config in enumerate(("plain", "weight", "smooth", "all")):
        cfg = CONFIGS[config]
        x, t, w = _inputs(37, classes, dtype, "cuda", seed=60 + i, ignore=cfg.get("ignore", False),
                          weight=cfg.get("weight", False))
        smoothing = cfg.get("label_smoothing", 0.0)
        for reduction in ("mean", "sum"):
            what = f"{reduction} {config}"
            args = (x, t, w, -100, reduction, smoothing)
            loss, stats, total, grad = torch.ops.softmax_ext._cross_entropy_forward_grad.default(*args)
            ploss, pstats, ptotal = torch.ops.softmax_ext._cross_entropy_forward.default(*args)
            assert torch.equal(stats, pstats), what + ": row statistics"
            assert torch.equal(loss, ploss) and torch.equal(total, ptotal), what + ": loss"
            two_op = _two_op_grad(x, t, w, reduction, smoothing, torch.ones((), dtype=dtype, device="cuda"))
            assert torch.equal(grad, two_op), what + ": gradient"
            with torch.no_grad():
                assert torch.equal(softmax_ext.cross_entropy(x, t, w, -100, reduction, smoothing), loss), what


@requires_cuda
@pytest.mark.parametrize("split", [2, 3, 8])
def test_cuda_rows_split(monkeypatch, split):
    """Rows over several blocks (SOFTMAX_EXT_CE_SPLIT forces it): the
    forward's clusters exchanging the row's statistics, the fused forward's
    gradient written by each block for its classes, the backward's parts;
    every reduction and configuration, class counts that split unevenly,
    rows off 16-byte boundaries."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    monkeypatch.setenv("SOFTMAX_EXT_CE_SPLIT", str(split))
    for i, (dtype, classes) in enumerate([(torch.bfloat16, 50257), (torch.float32, 5003), (torch.float16, 4099)]):
        plan = softmax_ext.plan(torch.empty(3, classes, device="cuda", dtype=dtype), kind="cross_entropy")
        # (a mean's bf16 rows in two: one block folds the halves as the
        # fused forward's cluster of two does; reduction "none" below takes
        # the cluster)
        parts = split == 2 and dtype == torch.bfloat16
        assert plan.kernel.startswith("cuda.ce_block_per_row." if parts else f"cuda.ce_cluster{split}."), plan.kernel
        for reduction in ("mean", "sum", "none"):
            for config, cfg in CONFIGS.items():
                x, t, w = _inputs(6, classes + 1, dtype, "cuda", seed=90 + i, ignore=cfg.get("ignore", False),
                                  weight=cfg.get("weight", False))
                x, t = x[:, 1:], t.clamp(max=classes - 1)  # rows start off 16-byte boundaries
                w = w[1:] if w is not None else None
                _check(x, t, w, reduction, cfg.get("label_smoothing", 0.0), dtype,
                       f"split {split} {dtype} {reduction} {config}")


@requires_cuda
def test_cuda_all_ignored_shapes_int32():
    x, t, w = _inputs(4, 5000, torch.float32, "cuda", seed=24, extra=(3,), weight=True)
    _check(x, t, w, "mean", 0.1, torch.float32, "cuda (N, C, d)")
    t_all = torch.full((6,), 7, device="cuda")
    xa = torch.randn(6, 5000, device="cuda").requires_grad_(True)
    loss = softmax_ext.cross_entropy(xa, t_all, ignore_index=7)
    assert torch.isnan(loss)
    softmax_ext.cross_entropy(xa, t_all, ignore_index=7, reduction="sum").backward()
    assert torch.count_nonzero(xa.grad) == 0
    x2, t2, _ = _inputs(8, 32000, torch.bfloat16, "cuda", seed=25)
    _assert_close(softmax_ext.cross_entropy(x2, t2.int()), F.cross_entropy(x2.double(), t2), torch.bfloat16, "int32")
