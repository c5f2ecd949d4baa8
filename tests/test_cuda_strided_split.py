"""The strided split family (csrc/cuda/families/strided_split): axes past the strided family's reach,
special values across chunks, dtype= pairs."""

import pytest
import torch

from conftest import (assert_close_verbose, make_backward_inputs, make_input, ours, reference_backward, reference_forward,
    requires_cuda)
from cuda_family_checks import KINDS, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize(
    "shape,dim,slice_first",
    # axes past the strided family's reach: unaligned runs (scalar columns)
    # with a last chunk of one position (139265 = 136 * 1024 + 1), an inner
    # run off the tile width, several outer rows, a sliced view
    [((3, 139265, 5), 1, False), ((2, 140000, 40), 1, False), ((140001, 70), 0, True), ((140000, 8), 0, False)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_strided_split_shapes(sx, shape, dim, slice_first, dtype):
    x = make_input(shape, dtype, "cuda")
    if slice_first:
        x = x[:, 1:]
    for kind in KINDS:
        plan = sx.plan(x, dim, kind=kind)
        assert plan.kernel.startswith("cuda.strided_split."), plan.kernel
        assert plan.workspace_size > 0
        assert_close_verbose(ours(kind)(x, dim), reference_forward(kind, x, dim), msg=f"{kind} {tuple(x.shape)}",
                             **tolerances(kind, dtype, x.shape[dim]))
        name = kind + "_backward"
        dy, y = make_backward_inputs(name, tuple(x.shape), dim, dtype, "cuda")
        assert sx.plan(dy, dim, kind=kind, backward=True).kernel.startswith("cuda.strided_split_backward.")
        assert_close_verbose(ours(name)(dy, y, dim), reference_backward(name, dy, y, dim), msg=f"{name} {tuple(x.shape)}",
                             **tolerances(name, dtype, x.shape[dim]))


def test_strided_split_special_values(sx):
    """Columns of -inf, NaN and +inf across chunks, as torch: an all -inf
    column is NaN, a NaN or +inf anywhere makes its column NaN; -inf heads
    (whole chunks) add nothing."""
    x = make_input((140000, 8), torch.float32, "cuda")
    x[:, 0] = float("-inf")
    x[:100000, 1] = float("-inf")
    x[70000, 2] = float("nan")
    x[139999, 3] = float("inf")
    assert sx.plan(x, 0).kernel == "cuda.strided_split.f32"
    for kind in KINDS:
        out = ours(kind)(x, 0)
        ref = getattr(torch, kind)(x.double(), 0)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), kind
        ok = ~torch.isnan(ref)
        assert_close_verbose(out[ok], ref[ok].float(), msg=f"{kind} special values", **tolerances(kind, torch.float32, 140000))


def test_strided_split_dtype_argument(sx):
    """bf16 in, f32 out: the cast happens in the store."""
    x = make_input((140000, 16), torch.bfloat16, "cuda")
    assert sx.plan(x, 0, dtype=torch.float32).kernel == "cuda.strided_split.bf16_f32"
    out = sx.log_softmax(x, 0, dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close_verbose(out, torch.log_softmax(x.double(), 0).float(), msg="bf16 -> f32",
                         **tolerances("log_softmax", torch.float32, 140000))
