"""The warp family (csrc/cuda/families/warp): its threshold (plan_limits' "warp") and one past it,
every lane-group size, rows at every offset."""

import pytest
import torch

from conftest import assert_close_verbose, make_input, ours, reference_backward, reference_forward, requires_cuda
from cuda_family_checks import KINDS, TAGS, check_family, limits, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", list(TAGS), ids=list(TAGS.values()))
def test_warp_thresholds(kind, dtype, backward):
    """Contiguous rows up to plan_limits' "warp" run on the warp family (row
    lengths the row tile takes aside), one element more on the block family."""
    lim = limits(dtype, backward)
    bw = "_backward" if backward else ""
    for n, family in [(1, "cuda.warp"), (lim["warp"], "cuda.warp"), (lim["warp"] + 1, "cuda.block")]:
        check_family(kind, dtype, (3, n), -1, family + bw, backward)


WARP_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 100, 127, 128, 129, 200, 255, 256,
                257, 300, 500, 512, 513, 768, 1000, 1023, 1024]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=["f32", "f16", "f64"])
def test_warp_lengths_and_offsets(dtype):
    """Every lane-group size, and rows starting at every offset within a 16-byte vector,
    forward and backward (rows that fill their lane group partly or exactly)."""
    cap = limits(dtype)["warp"]
    cap_backward = limits(dtype, backward=True)["warp"]
    for n in [n for n in WARP_LENGTHS if n <= cap]:
        for start in (0, 1, 3):
            base = make_input((37, n + start + 2), dtype, "cuda", seed=n)
            x = base[:, start : start + n]
            for kind in KINDS:
                out = ours(kind)(x, -1)
                assert_close_verbose(out, reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                                     **tolerances(kind, dtype, n))
                if n > cap_backward:
                    continue
                dy = make_input((37, n + start + 2), dtype, "cuda", seed=n + 1)[:, start : start + n]
                name = kind + "_backward"
                dx = ours(name)(dy, out, -1)
                assert_close_verbose(dx, reference_backward(name, dy, out, -1), msg=f"{name} n={n} start={start}",
                                     **tolerances(name, dtype, n))


@pytest.mark.parametrize("n", [44, 52, 56, 91, 92, 100, 110, 114, 180, 196, 244, 380, 460])
def test_warp_rows_at_every_line_offset(sx, n):
    """f32 forward rows on either side of the fill that views a row from its group's access
    span rather than 16 bytes (up to a 128-byte line): contiguous rows starting at every
    16-byte offset within a line, and off 16-byte boundaries, against float64."""
    for start in (0, 2, 4, 8, 12, 16, 20, 28):
        rows = 67
        base = make_input((rows * n + start,), torch.float32, "cuda", seed=n + start)
        x = base[start:].view(rows, n)
        assert sx.plan(x, -1).kernel == "cuda.warp.f32"
        for kind in KINDS:
            assert_close_verbose(ours(kind)(x, -1), reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                                 **tolerances(kind, torch.float32, n))
