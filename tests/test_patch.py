"""softmax_ext.patch() / unpatch() and softmax_ext.nn.swap_softmax: torch's
entry points routed to softmax_ext for the calls it serves, every other call
left to torch with torch's behaviour, and the routed calls traced to
torch.ops.softmax_ext.* under torch.compile."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES, make_input


@pytest.fixture(autouse=True)
def _unpatched():
    import softmax_ext

    softmax_ext.unpatch()
    yield
    softmax_ext.unpatch()


ENTRY_POINTS = {
    "torch.softmax": (lambda x, *a, **k: torch.softmax(x, *a, **k), torch.softmax),
    "torch.log_softmax": (lambda x, *a, **k: torch.log_softmax(x, *a, **k), torch.log_softmax),
    "Tensor.softmax": (lambda x, *a, **k: x.softmax(*a, **k), torch.softmax),
    "Tensor.log_softmax": (lambda x, *a, **k: x.log_softmax(*a, **k), torch.log_softmax),
    "F.softmax": (lambda x, *a, **k: F.softmax(x, *a, **k), torch.softmax),
    "F.log_softmax": (lambda x, *a, **k: F.log_softmax(x, *a, **k), torch.log_softmax),
}


class _Subclass(torch.Tensor):
    pass


def _ops_called(fn):
    """Names of the dispatcher ops `fn` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_patch_routes_and_unpatch_restores(entry, device):
    import softmax_ext

    call, reference = ENTRY_POINTS[entry]
    kernel = "log_softmax" if "log_softmax" in entry else "softmax"
    x = make_input((5, 37), torch.float32, device, seed=1)
    before = call(x, 1)
    with softmax_ext.patch():
        assert softmax_ext.is_patched()
        ops = _ops_called(lambda: call(x, 1))
        assert f"softmax_ext::{kernel}" in ops, sorted(ops)
        got = call(x, 1)
        got_kw = call(x, dim=0, dtype=torch.float64)
    assert not softmax_ext.is_patched()
    assert f"softmax_ext::{kernel}" not in _ops_called(lambda: call(x, 1))
    torch.testing.assert_close(got, before, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_kw, reference(x.double(), 0), rtol=1e-12, atol=1e-12)
    assert got_kw.dtype == torch.float64


def test_patch_function_form_and_idempotent():
    import softmax_ext

    original = torch.softmax
    softmax_ext.patch()
    routed = torch.softmax
    softmax_ext.patch()  # a second call changes nothing
    assert torch.softmax is routed and routed is not original
    softmax_ext.unpatch()
    assert torch.softmax is original
    assert "softmax" not in vars(torch.Tensor), "Tensor.softmax must be inherited again from TensorBase"
    softmax_ext.unpatch()  # unpatching twice is harmless


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_patch_leaves_unserved_calls_to_torch(entry):
    """Calls softmax_ext does not take give torch's result or torch's error."""
    import softmax_ext

    call, _ = ENTRY_POINTS[entry]
    ints = torch.arange(12).reshape(3, 4)
    cplx = torch.randn(3, 4, dtype=torch.complex64)
    sparse = torch.randn(3, 4).to_sparse()
    x = torch.randn(3, 4)
    sub = torch.randn(3, 4).as_subclass(_Subclass)
    deep = torch.randn(1, 1, 1, 1, 1, 1, 1, 3, 4)

    def outcomes():
        results = []
        for thunk in (
            lambda: call(ints, 1),  # integer input without dtype: torch's error
            lambda: call(ints, 1, dtype=torch.float32),
            lambda: call(cplx, 1),
            lambda: call(x, "b"),  # a dimension name
            lambda: call(sparse, 1),
            lambda: call(x, 2),  # dim out of range
            lambda: call(x, 1.0),  # wrong type
            lambda: call(x, True),  # a bool dim (torch reads it as 1)
            lambda: call(sub, 1),  # a tensor subclass
            lambda: call(deep, -1),  # more dims than softmax_ext takes
        ):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = thunk()
                results.append(("ok", r.to_dense() if r.is_sparse else r.rename(None)))
            except Exception as e:  # noqa: BLE001
                results.append((type(e), None))
        return results

    plain = outcomes()
    with softmax_ext.patch():
        patched = outcomes()
    for (kind_a, a), (kind_b, b) in zip(plain, patched):
        assert kind_a == kind_b, (plain, patched)
        if a is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_fast_route_serves_what_the_python_rules_serve(device):
    """An eager routed call first tries _C._route_softmax (the serve rules
    and the op in one C call); it must serve exactly the calls the Python
    rules, which torch.compile traces, serve, and give the same result."""
    import softmax_ext
    from softmax_ext import _C, patching

    x = make_input((3, 4), torch.float32, device, seed=2)
    calls = [
        (x, 1, None), (x, -1, torch.float64), (x, True, None), (x, 1.0, None), (x, "b", None),
        (x.to(torch.bfloat16), 0, None), (x.double().t(), 1, torch.float16), (x, 1, "float32"),
        (torch.arange(12, device=device).reshape(3, 4), 1, None),
        (torch.arange(12, device=device).reshape(3, 4), 1, torch.float32),
        (x.to(torch.complex64), 1, torch.float32), (x.to(torch.complex64), 1, None),
        (torch.nn.Parameter(x), 1, None), (x.as_subclass(_Subclass), 1, None), (x.reshape(1, 1, 1, 1, 1, 1, 1, 1, 3, 4), -1, None),
        (x.reshape(1, 1, 1, 1, 1, 1, 3, 4), -1, None), (x, 2, None), (x, 2**70, None),
    ]
    if device == "cpu":
        calls.append((x.to_sparse(), 1, None))
    for route, op in ((_C._route_softmax, softmax_ext.softmax), (_C._route_log_softmax, softmax_ext.log_softmax)):
        for t, dim, dtype in calls:
            serves = patching._serves(t, dim, dtype) and patching._autocast_serves(t)
            try:
                got = route(t, dim, dtype)
            except IndexError:  # a dim out of range, served: the op's own error
                assert serves
                continue
            assert (got is not None) == serves, (t.dtype, t.shape, dim, dtype)
            if got is not None:
                torch.testing.assert_close(got, op(t, dim, dtype), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU autocast: calls stay with torch
        assert _C._route_softmax(x.cpu(), 1, None) is None


@pytest.mark.parametrize("device", DEVICES)
def test_patch_under_autocast_matches_torch(device):
    """CUDA autocast computes softmax in float32 (softmax_ext does it through
    dtype=, without a cast pass); elsewhere torch keeps the call."""
    import softmax_ext

    x = make_input((4, 33), torch.bfloat16, device, seed=3)
    for name in ("softmax", "log_softmax"):
        with torch.autocast(device, dtype=torch.bfloat16):
            expected = getattr(F, name)(x, -1)
            with softmax_ext.patch():
                ops = _ops_called(lambda: getattr(F, name)(x, -1))
                got = getattr(F, name)(x, -1)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-3)
        assert (f"softmax_ext::{name}" in ops) == (device == "cuda"), sorted(ops)


@pytest.mark.parametrize("device", DEVICES)
def test_patch_under_compile_traces_to_softmax_ext(device):
    import softmax_ext

    def f(x):
        return F.softmax(x * 2.0, dim=-1) + torch.log_softmax(x, 0).exp() + x.softmax(1)

    x = make_input((6, 17), torch.float32, device, seed=4)
    expected = f(x)
    torch._dynamo.reset()
    with softmax_ext.patch():
        from torch._dynamo.testing import CompileCounterWithBackend

        cnt = CompileCounterWithBackend("aot_eager")
        got = torch.compile(f, backend=cnt, fullgraph=True)(x)
        graph_ops = {
            str(n.target) for g in cnt.graphs for n in g.graph.nodes if n.op == "call_function"
        }
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert any("softmax_ext.softmax" in t for t in graph_ops), graph_ops
    assert any("softmax_ext.log_softmax" in t for t in graph_ops), graph_ops


def test_nn_softmax_implicit_dim_warns_like_torch():
    import softmax_ext

    x = make_input((2, 3, 4), torch.float32, "cpu")
    for ours, theirs in ((softmax_ext.nn.Softmax(), torch.nn.Softmax()),
                         (softmax_ext.nn.LogSoftmax(), torch.nn.LogSoftmax())):
        with pytest.warns(UserWarning, match="Implicit dimension"):
            got = ours(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = theirs(x)
        torch.testing.assert_close(got, expected)


def test_swap_softmax():
    import softmax_ext

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.act = torch.nn.Softmax(dim=-1)
            self.inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LogSoftmax(dim=1))

        def forward(self, x):
            return self.inner(self.act(self.lin(x)))

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 8)
    expected = model(x)
    assert softmax_ext.nn.swap_softmax(model) == 2
    assert isinstance(model.act, softmax_ext.nn.Softmax) and model.act.dim == -1
    assert isinstance(model.inner[1], softmax_ext.nn.LogSoftmax) and model.inner[1].dim == 1
    ops = _ops_called(lambda: model(x))
    assert "softmax_ext::softmax" in ops and "softmax_ext::log_softmax" in ops
    torch.testing.assert_close(model(x), expected)
    assert softmax_ext.nn.swap_softmax(model) == 0


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_wrong_argument_types_raise_type_error_like_torch(name):
    import softmax_ext

    x = torch.randn(3, 4)
    for args in ((x, 1.0), ([1.0, 2.0], 0)):
        with pytest.raises(TypeError):
            getattr(torch, name)(*args)
    # (a str dim is a dimension name to torch versions with named tensors)
    for args in ((x, 1.0), ([1.0, 2.0], 0), (x, "a")):
        with pytest.raises(TypeError):
            getattr(softmax_ext, name)(*args)
    with pytest.raises(TypeError):
        getattr(softmax_ext, f"{name}_backward")(x, x, 1.5)



def test_repatching_does_not_recompile():
    """patch() makes new routed functions each time; a `with
    softmax_ext.patch():` around every compiled step still reuses the
    compiled code."""
    from torch._dynamo.testing import CompileCounter

    import softmax_ext

    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(lambda x: torch.nn.functional.softmax(x, -1) * 2, backend=counter)
    x = torch.randn(4, 8)
    for _ in range(3):
        with softmax_ext.patch():
            torch.testing.assert_close(step(x), torch.softmax(x, -1) * 2)
    assert counter.frame_count == 1
