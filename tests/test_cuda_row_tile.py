"""The row-tile family (csrc/cuda/families/row_tile): its thresholds (plan_limits' "row_tile") and the
rows it takes below them, every offset from the 32-byte grid, 64-bit offsets."""

import pytest
import torch

from conftest import (assert_close_verbose, custom_op, make_backward_inputs, make_input, ours, reference_backward,
    reference_forward, requires_cuda)
from cuda_family_checks import KINDS, TAGS, check_family, free_gib, limits, tolerances

pytestmark = requires_cuda


@pytest.mark.parametrize("kind", KINDS)
def test_row_tile_thresholds(kind):
    """Backward f32, bf16 and f16 rows laid out one after another run on the
    row-tile family up to plan_limits' "row_tile" elements, except powers of
    two (the warp family's); one element more runs on the block family."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        lim = limits(dtype, backward=True)["row_tile"]
        for shape, family in [((5, 3), "cuda.row_tile"), ((300, 100), "cuda.row_tile"), ((2, 3, 100), "cuda.row_tile"),
                              ((7, lim - 1), "cuda.row_tile"), ((4, 1), "cuda.warp"), ((9, 64), "cuda.warp"),
                              ((3, lim), "cuda.warp"), ((3, lim + 1), "cuda.block")]:
            check_family(kind, dtype, shape, -1, family + "_backward", backward=True)
    # f64 rows stay with the warp family
    assert limits(torch.float64, backward=True)["row_tile"] == 0
    check_family(kind, torch.float64, (300, 100), -1, "cuda.warp_backward", backward=True)


# f32 forward rows the row tile takes: 90% of a lane group's values (8 a lane
# up to rows of 256, then 16) from rows of 33 to 128, 97% beyond.
ROW_TILE_FORWARD = [58, 63, 116, 127, 249, 255, 497, 511]


ROW_TILE_FORWARD_NOT = [32, 57, 64, 100, 115, 128, 248, 256, 496, 512]


@pytest.mark.parametrize("kind", KINDS)
def test_row_tile_forward_thresholds(sx, kind):
    """Forward: f32 rows laid out one after another that fill their lane
    group run on the row tile; other f32 lengths, 16-bit rows, dtype= pairs
    and rows not laid out one after another stay with the warp family."""
    for n in ROW_TILE_FORWARD:
        check_family(kind, torch.float32, (301, n), -1, "cuda.row_tile")
        check_family(kind, torch.float32, (2, 3, n), -1, "cuda.row_tile")
    for n in ROW_TILE_FORWARD_NOT:
        check_family(kind, torch.float32, (301, n), -1, "cuda.warp")
    for dtype in (torch.bfloat16, torch.float16):
        assert limits(dtype)["row_tile"] == 0
        check_family(kind, dtype, (301, 126), -1, "cuda.warp")
    assert max(ROW_TILE_FORWARD) < limits(torch.float32)["row_tile"] <= min(n for n in ROW_TILE_FORWARD_NOT if n > 500)
    x = make_input((301, 126), torch.float32, "cuda")
    assert sx.plan(x, -1, kind=kind).kernel == "cuda.row_tile.f32"
    assert not sx.plan(x.bfloat16(), -1, kind=kind, dtype=torch.float32).kernel.startswith("cuda.row_tile")
    assert sx.plan(x[:, :125], -1, kind=kind).kernel == "cuda.warp.f32"  # rows not one after another


@pytest.mark.parametrize("n", ROW_TILE_FORWARD)
def test_row_tile_forward_offsets(sx, n):
    """Forward row tile with x at every offset from the 32-byte grid (y, new,
    sits on it: at offset 0 y goes over x in shared memory, elsewhere in its
    own region) and row counts that leave the last tile partly filled."""
    rows = 1000 + n % 7
    for start in range(8):
        x = make_input((rows * n + 8,), torch.float32, "cuda", seed=n + start)[start : start + rows * n].view(rows, n)
        for kind in KINDS:
            assert sx.plan(x, -1, kind=kind).kernel == "cuda.row_tile.f32"
            assert_close_verbose(ours(kind)(x, -1), reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                                 **tolerances(kind, torch.float32, n))


ROW_TILE_LENGTHS = [3, 7, 24, 33, 100, 255, 257, 300, 500, 511]


# (dy, y) starts in elements: on the 32-byte grid, off the 16-byte one, and 16
# bytes off the 32-byte one with dx sharing dy's 16-byte phase only.
ROW_TILE_STARTS = {torch.float32: [(0, 0), (1, 0), (0, 3), (2, 1), (4, 0), (5, 7), (7, 4)],
                   torch.bfloat16: [(0, 0), (1, 0), (0, 3), (2, 1), (8, 0), (9, 15), (15, 8)],
                   torch.float16: [(0, 0), (3, 5), (8, 0), (9, 15)]}


@pytest.mark.parametrize("dtype", list(ROW_TILE_STARTS), ids=[TAGS[d] for d in ROW_TILE_STARTS])
@pytest.mark.parametrize("n", ROW_TILE_LENGTHS)
def test_row_tile_offsets_and_layouts(sx, n, dtype):
    """Row-tile backward with dy, y and dx at different offsets from the
    32-byte grid (dx then has its own shared-memory region, also where dy and
    dx share the 16-byte phase but not the 32-byte one), row counts that
    leave the last tile partly filled, and rows that are not laid out one
    after another (a column slice: the warp family)."""
    rows = 1000 + n % 7
    for kind in KINDS:
        name = kind + "_backward"
        for dy_start, y_start in ROW_TILE_STARTS[dtype]:
            dy = make_input((rows * n + 16,), dtype, "cuda", seed=n, scale=1.0)[dy_start : dy_start + rows * n]
            y = torch.empty(rows * n + 16, device="cuda", dtype=dtype)[y_start : y_start + rows * n]
            _, y_rows = make_backward_inputs(name, (rows, n), -1, torch.float64, "cpu", seed=n)
            dy, y = dy.view(rows, n), y.view(rows, n).copy_(y_rows)
            assert sx.plan(dy, -1, kind=kind, backward=True).kernel == f"cuda.row_tile_backward.{TAGS[dtype]}"
            dx = ours(name)(dy, y, -1)
            assert_close_verbose(dx, reference_backward(name, dy, y, -1), msg=f"{name} n={n} at {dy_start}/{y_start}",
                                 **tolerances(name, dtype, n))
        dy_wide, y_wide = make_backward_inputs(name, (rows, n + 5), -1, dtype, "cuda", seed=n + 1)
        dy, y = dy_wide[:, 1 : n + 1], y_wide[:, 1 : n + 1]
        assert sx.plan(dy, -1, kind=kind, backward=True).kernel.startswith("cuda.warp_backward")
        assert_close_verbose(ours(name)(dy, y, -1), reference_backward(name, dy, y, -1), msg=f"{name} n={n} sliced",
                             **tolerances(name, dtype, n))


def test_row_tile_more_than_2_31_elements():
    """64-bit offsets: f32 backward rows of 100, more than 2^31 elements per
    tensor, in more tiles (a block each) than 65535."""
    rows, n = 2**31 // 100 + 7, 100
    if free_gib() < rows * n * 4 * 3 / 2**30 + 2:
        pytest.skip("not enough GPU memory")
    torch.cuda.empty_cache()
    dy = torch.empty(rows, n, device="cuda").normal_()
    y = torch.empty(rows, n, device="cuda").normal_().log_softmax(-1)
    dx = custom_op("log_softmax_backward")(dy, y, -1)
    for part in (slice(0, 3), slice(rows - 5, rows)):
        ref = torch.ops.aten._log_softmax_backward_data(dy[part].double(), y[part].double(), -1, torch.float64)
        assert torch.allclose(dx[part].double(), ref, atol=1e-5, rtol=1e-5)
    del dy, y, dx
    torch.cuda.empty_cache()
