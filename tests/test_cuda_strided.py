"""The strided family (csrc/cuda/families/strided): its thresholds (plan_limits' "strided",
"strided_min_inner") and one past them, tiles and clusters of every shape."""

import pytest
import torch

from conftest import (assert_close_verbose, make_backward_inputs, make_input, ours, reference_backward, reference_forward,
    requires_cuda)
from cuda_family_checks import KINDS, check_family, limits, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_strided_thresholds(kind, dtype, backward):
    """A strided axis up to plan_limits' "strided" positions runs on the
    strided family (shorter axes in wider tiles: a quarter and a half of
    the reach), one more on the strided split family; an inner run from
    "strided_min_inner" columns up, one column less on the reference."""
    lim = limits(dtype, backward)
    bw = "_backward" if backward else ""
    reach = lim["strided"]
    for n, family in [(2, "cuda.strided"), (reach // 4, "cuda.strided"), (reach // 2 + 1, "cuda.strided"),
                      (reach, "cuda.strided"), (reach + 1, "cuda.strided_split")]:
        check_family(kind, dtype, (n, 64), 0, family + bw, backward)
    inner = lim["strided_min_inner"]
    check_family(kind, dtype, (100, inner), 0, "cuda.strided" + bw, backward)
    check_family(kind, dtype, (100, inner - 1), 0, "cuda.reference" + bw, backward)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "shape,dim",
    # one-warp tiles (axis 3, 16, 19; the first two widened past 128 bytes),
    # one 1024-thread block, clusters of two
    # 1024-thread blocks (axis 2000 forward, 1024 backward) and of 512-thread
    # blocks (axis 3000), tiles narrower than the inner run (96, 65, 9), an
    # inner run of 24 bytes (16-bit packs of 8 bytes, not 16), clusters
    # that exchange column totals over many tiles (a persistent grid of
    # 2 x 1024 threads, f32 forward on axis 3000, backward on 1500: both
    # barrier phases, both slot sets), an axis of 9000 (clusters of
    # 512-thread blocks on narrowed tiles)
    [((32, 1024, 64), 1), ((4, 2000, 64), 1), ((8, 3000, 33), 1), ((64, 3, 300), 1), ((64, 16, 520), 1), ((16, 19, 1000), 1),
     ((4096, 96), 0), ((64, 65), 0), ((2, 5, 7, 9), 2), ((8, 300, 12), 1), ((300, 3000, 16), 1), ((300, 1500, 16), 1), ((2, 9000, 40), 1)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_strided_shapes(kind, shape, dim, dtype):
    x = make_input(shape, dtype, "cuda")
    out = ours(kind)(x, dim)
    assert_close_verbose(out, reference_forward(kind, x, dim), msg=f"{kind} {shape} dim={dim}",
                         **tolerances(kind, dtype, shape[dim]))
    xt = make_input(tuple(reversed(shape)), dtype, "cuda").permute(*reversed(range(len(shape))))
    out = ours(kind)(xt, dim)
    assert_close_verbose(out, reference_forward(kind, xt, dim), msg=f"{kind} permuted {shape} dim={dim}",
                         **tolerances(kind, dtype, shape[dim]))
    name = kind + "_backward"
    dy, y = make_backward_inputs(name, shape, dim, dtype, "cuda")
    assert_close_verbose(ours(name)(dy, y, dim), reference_backward(name, dy, y, dim), msg=f"{name} {shape}",
                         **tolerances(name, dtype, shape[dim]))
