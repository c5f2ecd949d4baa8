"""What every CUDA family promises: thresholds in order, grids past 65535 passes, dtype= pairs, bit-
identical reruns, CUDA-graph replay, tensors of more than 2^31 elements."""

import pytest
import torch

from conftest import (BACKWARD_TOLERANCES, TOLERANCES, assert_close_verbose, custom_op, make_input, ours, reference_backward,
    reference_forward, requires_cuda)
from cuda_family_checks import KINDS, TAGS, free_gib, limits, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", list(TAGS), ids=list(TAGS.values()))
def test_limits_are_ordered(sx, dtype, backward):
    """plan_limits names every family's threshold, in the order the families
    take longer rows; CPU tensors have none."""
    lim = limits(dtype, backward)
    for key in ("warp", "block", "cluster", "strided", "max_cluster_size", "strided_min_inner", "split_tile",
                "split_resident", "row_tile"):
        assert key in lim, key
    assert lim["row_tile"] <= lim["block"]
    assert lim["warp"] < lim["block"] < lim["split_resident"]
    if lim["max_cluster_size"] > 1:
        assert lim["block"] < lim["cluster"] < lim["split_resident"]
    assert 0 < lim["strided"] <= 16384 and lim["split_tile"] > 0
    assert sx.plan_limits(torch.empty(1, dtype=dtype)) == {}


@pytest.mark.parametrize(
    "dtype,shape,backward,family",
    # more passes than 65535 blocks: f32 rows on a block per pass (past
    # 65535 blocks), 16-bit forward rows and 16-bit backward rows off the
    # powers of two on 65535 blocks walking several passes each
    # (csrc/cuda/core/grid.h, grid_walks_rows)
    [(torch.float32, (2**23 + 5, 16), False, "cuda.warp"), (torch.float32, (140003, 1000), True, "cuda.block_backward"),
     (torch.bfloat16, (2**23 + 5, 32), False, "cuda.warp"), (torch.float16, (140003, 1500), False, "cuda.block"),
     (torch.bfloat16, (140003, 1500), True, "cuda.block_backward")],
    ids=["f32-warp", "f32-block-backward", "bf16-warp", "f16-block", "bf16-block-backward"],
)
def test_grids_past_65535_passes(sx, dtype, shape, backward, family):
    """Every row is done whichever grid the family takes: compared in
    float64 on the first, middle and last rows."""
    rows, n = shape
    parts = (slice(0, 3), slice(rows // 2, rows // 2 + 3), slice(rows - 5, rows))
    for kind in KINDS:
        x = torch.empty(shape, device="cuda", dtype=dtype).normal_()
        assert sx.plan(x, -1, kind=kind, backward=backward).kernel.startswith(family)
        if backward:
            name = kind + "_backward"
            y = getattr(torch, kind)(x, -1)
            out = ours(name)(x, y, -1)
            for part in parts:
                assert_close_verbose(out[part], reference_backward(name, x[part], y[part], -1), msg=f"{name} rows {part}",
                                     **tolerances(name, dtype, n))
        else:
            out = ours(kind)(x, -1)
            for part in parts:
                assert_close_verbose(out[part], reference_forward(kind, x[part], -1), msg=f"{kind} rows {part}",
                                     **tolerances(kind, dtype, n))
        del x, out
    torch.cuda.empty_cache()


@pytest.mark.parametrize("n", [64, 4096, 50000, 300000, 2000000])
def test_dtype_argument_fast_and_reference(sx, n):
    """bf16 -> f32 runs on the fast families; f32 -> bf16 on the reference one."""
    x = make_input((2, n), torch.bfloat16, "cuda")
    assert not sx.plan(x, -1, dtype=torch.float32).kernel.startswith("cuda.reference")
    for kind in KINDS:
        out = ours(kind)(x, -1, dtype=torch.float32)
        assert out.dtype == torch.float32
        assert_close_verbose(out, reference_forward(kind, x, -1, torch.float32), msg=f"{kind} bf16->f32 n={n}",
                             **tolerances(kind, torch.float32, n))
    xf = make_input((2, n), torch.float32, "cuda")
    assert sx.plan(xf, -1, dtype=torch.bfloat16).kernel.startswith("cuda.reference")


@pytest.mark.parametrize(
    "shape,dim",
    [((4096, 100), -1), ((64, 20000), -1), ((8, 200000), -1), ((1, 3_000_000), -1), ((6, 1_000_000), -1),
     ((64, 512, 32), 1),
     ((16, 3000, 16), 1)],
)
def test_bit_identical_reruns(shape, dim):
    x = make_input(shape, torch.float32, "cuda")
    dy = make_input(shape, torch.float32, "cuda", seed=3)
    for kind in KINDS:
        first = ours(kind)(x, dim)
        g1 = ours(kind + "_backward")(dy, first, dim)
        for _ in range(3):
            assert torch.equal(ours(kind)(x, dim), first)
            assert torch.equal(ours(kind + "_backward")(dy, first, dim), g1)


@pytest.mark.parametrize(
    "shape,dim",
    [((300, 100), -1), ((256, 700), -1), ((16, 9000), -1), ((4, 100000), -1), ((2, 1_500_000), -1), ((1, 1_500_000), -1),
     ((8, 2048, 64), 1)],
)
def test_graph_replay_every_family(sx, shape, dim):
    static_x = make_input(shape, torch.float32, "cuda", seed=1)
    static_dy = make_input(shape, torch.float32, "cuda", seed=2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = sx.log_softmax(static_x, dim)
            sx.log_softmax_backward(static_dy, y, dim)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = sx.log_softmax(static_x, dim)
        static_dx = sx.log_softmax_backward(static_dy, static_y, dim)
    for seed in (5, 6):
        static_x.copy_(make_input(shape, torch.float32, "cuda", seed=seed))
        g.replay()
        torch.cuda.synchronize()
        ref_y = reference_forward("log_softmax", static_x, dim)
        assert_close_verbose(static_y, ref_y, msg=f"graph {shape}", **TOLERANCES[torch.float32])
        assert_close_verbose(static_dx, reference_backward("log_softmax_backward", static_dy, static_y, dim),
                             msg=f"graph backward {shape}", **BACKWARD_TOLERANCES[torch.float32])


@pytest.mark.parametrize("shape", [(2**21 + 3, 1024), (1, 2**31 + 40)], ids=["many_rows", "one_row"])
def test_more_than_2_31_elements(shape):
    """64-bit offsets: bf16 tensors of more than 2^31 elements (warp and split
    families); the rows past the 2^31st element are checked against torch."""
    numel = shape[0] * shape[1]
    if free_gib() < numel * 2 * 3 / 2**30 + 2:
        pytest.skip("not enough GPU memory")
    torch.cuda.empty_cache()
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    x.view(-1)[: 2**30].normal_(0, 2)
    x.view(-1)[2**30 :].normal_(0, 3)
    y = custom_op("log_softmax")(x, -1)
    if shape[0] > 1:
        tail = x[-5:]
        ref = torch.log_softmax(tail.double(), -1).to(torch.bfloat16)
        assert torch.allclose(y[-5:].float(), ref.float(), atol=1e-4, rtol=1.6e-2)
        head = torch.log_softmax(x[:3].double(), -1).to(torch.bfloat16)
        assert torch.allclose(y[:3].float(), head.float(), atol=1e-4, rtol=1.6e-2)
    else:
        ref_lse = torch.logsumexp(torch.stack([c.double().logsumexp(0) for c in x.view(-1).split(2**28)]), 0)
        idx = torch.tensor([0, 2**31 - 1, 2**31, 2**31 + 39], device="cuda")
        ref = (x.view(-1)[idx].double() - ref_lse).to(torch.bfloat16)
        assert torch.allclose(y.view(-1)[idx].float(), ref.float(), atol=1e-4, rtol=1.6e-2), (y.view(-1)[idx], ref)
    del x, y
    torch.cuda.empty_cache()
