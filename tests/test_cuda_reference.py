"""The reference family (csrc/cuda/families/reference): what no fast family takes, and the backward
with grad_output in another layout, which select() runs on a copy in grad_input's layout."""

import pytest
import torch

from conftest import assert_close_verbose, make_backward_inputs, make_input, ours, reference_backward, requires_cuda
from cuda_family_checks import KINDS, tolerances

pytestmark = requires_cuda


def test_reference_takes_the_rest(sx):
    """dtype= pairs without fast kernels and strided axes whose contiguous
    inner run is shorter than the strided families take run on the
    reference family; one column more goes to the strided family."""
    assert sx.plan(torch.empty(4, 8, device="cuda"), -1, dtype=torch.float16).kernel == "cuda.reference.f32_f16"
    inner = sx.plan_limits(torch.empty(100, 8, device="cuda"))["strided_min_inner"]
    assert sx.plan(torch.empty(100, inner - 1, device="cuda"), 0).kernel == "cuda.reference.f32"
    assert sx.plan(torch.empty(100, inner, device="cuda"), 0).kernel == "cuda.strided.f32"


def test_backward_relayout_in_plan(sx):
    """select() decides the copy of grad_output into grad_input's layout: a
    backward plan whose grad_output alone is strided names the family that
    runs on the copy, not the reference."""
    # grad_output every other column (no inner run), output contiguous
    dy = make_input((128, 128), torch.float32, "cuda")[:, ::2]
    assert sx.plan(dy, 0, backward=True).kernel == "cuda.strided_backward.f32"
    y = sx.softmax(make_input((128, 64), torch.float32, "cuda", seed=1), 0)
    assert_close_verbose(ours("softmax_backward")(dy, y, 0), reference_backward("softmax_backward", dy, y, 0),
                         msg="dy every other column", **tolerances("softmax_backward", torch.float32, 128))


@pytest.mark.parametrize(
    "shape,dim,order",
    # dy stored in `order` (a permutation, outermost first), y contiguous or
    # the reverse: the backward copies dy into y's layout through shared-memory
    # tiles. Edges off the tile size, more tiles than the grid has blocks,
    # batch dims between and around the two fastest dims.
    [((300, 70), -1, (1, 0)), ((2000, 3000), -1, (1, 0)), ((2000, 3000), 0, (1, 0)),
     ((3, 130, 67), 1, (2, 0, 1)), ((5, 67, 3, 129), -1, (1, 3, 0, 2)), ((2, 3, 2, 3, 2, 33, 65), 5, (6, 0, 1, 2, 3, 4, 5))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_backward_dy_in_another_layout(shape, dim, order, dtype):
    inverse = [order.index(d) for d in range(len(shape))]
    for kind in KINDS:
        name = kind + "_backward"
        dy, y = make_backward_inputs(name, shape, dim, dtype, "cuda", seed=len(shape))
        dy_p = dy.permute(*order).contiguous().permute(*inverse)
        y_p = y.permute(*order).contiguous().permute(*inverse)
        for dy_l, y_l, what in ((dy_p, y, "dy permuted"), (dy, y_p, "y permuted")):
            assert torch.equal(dy_l, dy) and torch.equal(y_l, y)
            out = ours(name)(dy_l, y_l, dim)
            assert out.stride() == y_l.stride(), f"{name} {what}: dx takes y's layout"
            assert_close_verbose(out, reference_backward(name, dy, y, dim), msg=f"{name} {shape} {what}",
                                 **tolerances(name, dtype, shape[dim]))


def test_graph_replay_dy_in_another_layout(sx):
    """The copy of dy into y's layout is captured with the backward kernel."""
    static_dy = make_input((700, 500), torch.float32, "cuda", seed=2).t()
    static_y = sx.softmax(make_input((500, 700), torch.float32, "cuda", seed=1), -1)
    sx.softmax_backward(static_dy, static_y, -1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_dx = sx.softmax_backward(static_dy, static_y, -1)
    for seed in (5, 6):
        static_dy.copy_(make_input((500, 700), torch.float32, "cuda", seed=seed))
        g.replay()
        torch.cuda.synchronize()
        assert_close_verbose(static_dx, reference_backward("softmax_backward", static_dy, static_y, -1),
                             msg="graph backward, dy transposed", **tolerances("softmax_backward", torch.float32, 700))
