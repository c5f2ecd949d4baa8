"""CUDA-only behaviour: CUDA graphs, non-default streams, device guards and
the CUDA context after errors. Skipped without a GPU."""

import pytest
import torch

from conftest import (
    BACKWARD_OPS,
    BACKWARD_TOLERANCES,
    reference_backward,
    FORWARD_OPS,
    TOLERANCES,
    assert_close_verbose,
    check_backward,
    check_forward,
    make_backward_inputs,
    make_input,
    ours,
    reference_forward,
    requires_cuda,
)

pytestmark = requires_cuda


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_cuda_graph_capture_and_replay(name):
    static_x = make_input((64, 1000), torch.float32, "cuda", seed=1)
    fn = ours(name)
    # warm up on a side stream, as the CUDA-graph docs require
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(static_x, -1)
        fn(static_x, 0)
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = fn(static_x, -1)
        static_y0 = fn(static_x.t(), 1)
    for seed in (2, 3, 4):
        new_x = make_input((64, 1000), torch.float32, "cuda", seed=seed)
        static_x.copy_(new_x)
        g.replay()
        torch.cuda.synchronize()
        assert_close_verbose(static_y, reference_forward(name, new_x, -1), msg=f"{name} graph replay seed={seed}",
                             **TOLERANCES[torch.float32])
        assert_close_verbose(static_y0, reference_forward(name, new_x.t(), 1), msg=f"{name} graph replay (t)",
                             **TOLERANCES[torch.float32])


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_cuda_graph_backward_op(name):
    dy, y = make_backward_inputs(name, (32, 513), -1, torch.float32, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ours(name)(dy, y, -1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ours(name)(dy, y, -1)
    dy2, y2 = make_backward_inputs(name, (32, 513), -1, torch.float32, "cuda", seed=9)
    dy.copy_(dy2)
    y.copy_(y2)
    g.replay()
    torch.cuda.synchronize()
    assert_close_verbose(out, reference_backward(name, dy2, y2, -1), msg=f"{name} graph replay",
                         **BACKWARD_TOLERANCES[torch.float32])


@pytest.mark.parametrize("name", FORWARD_OPS + BACKWARD_OPS)
def test_runs_on_the_current_stream(name):
    """The input is written on a side stream after a long sleep; an op that
    launched on the default stream would read the stale input."""
    shape = (256, 4097)
    src = make_input(shape, torch.float32, "cuda", seed=5)
    src2 = make_input(shape, torch.float32, "cuda", seed=6, scale=1.0)
    a = torch.zeros(shape, device="cuda")
    b = torch.zeros(shape, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # ~50-100 ms of GPU time on s
        a.copy_(src)
        b.copy_(torch.softmax(src2, -1) if name == "softmax_backward" else torch.log_softmax(src2, -1))
        if name in FORWARD_OPS:
            out = ours(name)(a, -1)
        else:
            out = ours(name)(a, b, -1)
    s.synchronize()
    if name in FORWARD_OPS:
        assert_close_verbose(out, reference_forward(name, src, -1), msg=f"{name} on a side stream",
                             **TOLERANCES[torch.float32])
    else:
        assert_close_verbose(out, reference_backward(name, a, b, -1), msg=f"{name} on a side stream",
                             **BACKWARD_TOLERANCES[torch.float32])


def test_second_device_guard():
    if torch.cuda.device_count() < 2:
        pytest.skip("a device-guard test needs two GPUs")
    x = make_input((8, 33), torch.float32, "cuda:1", seed=7)
    with torch.cuda.device(0):
        out = ours("softmax")(x, -1)
    assert out.device == x.device
    torch.cuda.synchronize(1)
    assert_close_verbose(out, reference_forward("softmax", x, -1), msg="cuda:1 from device 0",
                         **TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_large_rows_cuda(dtype):
    """More rows than one grid wave, long and short axes."""
    for shape, dim in [((8192, 33), -1), ((33, 8192), 0), ((3, 65537), -1)]:
        x = make_input(shape, dtype, "cuda", seed=8)
        check_forward("softmax", x, dim)
        check_forward("log_softmax", x, dim)
    dy, y = make_backward_inputs("softmax_backward", (4099, 129), -1, dtype, "cuda")
    check_backward("softmax_backward", dy, y, -1)


def test_context_healthy_after_errors():
    x = make_input((4, 5), torch.float32, "cuda")
    for bad in (lambda: ours("softmax")(x, 3), lambda: ours("softmax")(x.long(), -1),
                lambda: ours("softmax_backward")(x, x[:, :4], -1)):
        with pytest.raises((IndexError, NotImplementedError, ValueError)):
            bad()
    out = ours("softmax")(x, -1)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.softmax(x, -1))
