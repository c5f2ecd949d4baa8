"""The CUDA kernel families and their plan thresholds.

For every family: the threshold values select() applies (softmax_ext.plan_limits)
are the documented ones, and an axis length at each threshold and one past it
both picks the expected kernel and gives the float64 reference's values, in
softmax and log_softmax, forward and backward. Plus the cases the families are
built for: rows that start off a 16-byte boundary, rows with a block's worth of
-inf, tiny rows sharing a warp, non-last axes, bit-identical reruns, CUDA-graph
replay of every family, and a tensor of more than 2^31 elements."""

import pytest
import torch

from conftest import (
    BACKWARD_TOLERANCES,
    TOLERANCES,
    assert_close_verbose,
    custom_op,
    make_backward_inputs,
    make_input,
    ours,
    reference_backward,
    reference_forward,
    requires_cuda,
)

pytestmark = requires_cuda

TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
KINDS = ["softmax", "log_softmax"]


# 16-bit rows longer than this are kept packed (csrc/cuda/config.h, kPackedMinRow)
PACKED_MIN_ROW = 4096


def register_floats(dtype, backward):
    """Row elements a thread keeps in registers (csrc/cuda/config.h)."""
    per = 16 if dtype == torch.float64 else 32
    return per // 2 if backward else per


def expected_limits(dtype, backward, max_cluster):
    e = register_floats(dtype, backward)
    element_size = torch.empty((), dtype=dtype).element_size()
    # backward: two blocks per SM where clusters take longer rows
    block_threads = 512 if max_cluster > 1 and backward else 1024
    packed = e * (2 if dtype in (torch.bfloat16, torch.float16) else 1)  # clusters keep 16-bit rows packed
    return {
        "warp": 32 * e,
        "block": block_threads * e,
        "cluster": 1024 * packed * max_cluster if max_cluster > 1 else 0,
        # narrowest tiles: one 16-byte vector of columns; longer axes than
        # 16384 go to the strided split family
        "strided": min(1024 * e // max(16 // element_size, 1) * max(max_cluster, 1), 16384),
        "split_tile": 512 * e,
        "strided_min_inner": 4,
        "split_resident": resident_capacity(e, element_size, backward),
        # f32, bf16 and f16 rows laid out one after another, not a power of two
        # (backward; forward f32 rows that fill their lane group)
        "row_tile": 512 if dtype in ((torch.float32, torch.bfloat16, torch.float16) if backward else (torch.float32,))
        else 0,
    }


def resident_capacity(e, element_size, backward):
    """Split rows that the GPU's blocks hold on chip run resident: two
    512-thread blocks per SM, each keeping a tile of 512 * e positions in
    registers and as many as its half of the SM's shared memory takes (less
    the 1 KB the hardware reserves per block and 1 KB for the kernel's own);
    the tiles cover the row and pack - 1 positions."""
    props = torch.cuda.get_device_properties(0)
    tile_thread_bytes = (2 if backward else 1) * e * element_size
    held = min((props.shared_memory_per_multiprocessor // 2 - 2048) // (tile_thread_bytes * 512), 32)
    return props.multi_processor_count * 2 * (held + 1) * 512 * e - (16 // element_size - 1)


def tolerances(name, dtype, n):
    """Softmax values are ~1/n: scale the absolute tolerance with them so the
    check still bites on long rows."""
    table = BACKWARD_TOLERANCES if name.endswith("backward") else TOLERANCES
    tol = dict(table[dtype])
    if name.startswith("softmax"):
        # floor: twice the smallest subnormal step of the dtype
        tol["atol"] = max(tol["atol"] / max(n, 1), 2 * torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps)
    return tol


def check_family(kind, dtype, shape, dim, expected, backward=False):
    import softmax_ext

    n = shape[dim]
    if backward:
        name = kind + "_backward"
        dy, y = make_backward_inputs(name, shape, dim, dtype, "cuda")
        plan = softmax_ext.plan(dy, dim, kind=kind, backward=True)
        out = ours(name)(dy, y, dim)
        ref = reference_backward(name, dy, y, dim)
    else:
        name = kind
        x = make_input(shape, dtype, "cuda")
        plan = softmax_ext.plan(x, dim, kind=kind)
        out = ours(name)(x, dim)
        ref = reference_forward(name, x, dim)
    assert plan.kernel == f"{expected}.{TAGS[dtype]}", f"{shape} dim={dim}: {plan.kernel}"
    assert_close_verbose(out, ref, msg=f"{name} {shape} dim={dim} {plan.kernel}", **tolerances(name, dtype, n))


@pytest.fixture(scope="module")
def max_cluster():
    import softmax_ext

    return softmax_ext.plan_limits(torch.empty(1, device="cuda"))["max_cluster_size"]


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", list(TAGS), ids=list(TAGS.values()))
def test_limit_values(sx, dtype, backward, max_cluster):
    limits = sx.plan_limits(torch.empty(1, dtype=dtype, device="cuda"), backward=backward)
    expected = expected_limits(dtype, backward, max_cluster)
    for key, value in expected.items():
        assert limits[key] == value, f"{key}: {limits[key]} != {value}"
    major, _ = torch.cuda.get_device_capability()
    assert (max_cluster > 1) == (major >= 9), max_cluster
    assert sx.plan_limits(torch.empty(1, dtype=dtype)) == {}


def contiguous_cases(dtype, backward, max_cluster):
    lim = expected_limits(dtype, backward, max_cluster)
    bw = "_backward" if backward else ""
    big = "cuda.cluster" if max_cluster > 1 else "cuda.split_resident"
    cases = [
        (1, "cuda.warp"), (lim["warp"], "cuda.warp"),
        (lim["warp"] + 1, "cuda.block"), (lim["block"], "cuda.block"),
        (lim["block"] + 1, big),
    ]
    if max_cluster > 1:
        cases += [(lim["cluster"], "cuda.cluster"), (lim["cluster"] + 1, "cuda.split_resident")]
    if dtype in (torch.bfloat16, torch.float16) and PACKED_MIN_ROW < lim["block"]:
        # block rows of 16-bit values longer than this stay packed in registers
        cases += [(PACKED_MIN_ROW, "cuda.block"), (PACKED_MIN_ROW + 1, "cuda.block")]
    return [(n, family + bw) for n, family in cases]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_contiguous_thresholds(kind, dtype, backward, max_cluster):
    for n, family in contiguous_cases(dtype, backward, max_cluster):
        # one row past the cluster's reach (the resident split family's rows are long)
        rows = 3 if n * 3 <= 1 << 22 and not family.startswith("cuda.split") else 1
        check_family(kind, dtype, (rows, n), -1, family, backward)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_split_resident_thresholds(sx, kind, dtype, backward, max_cluster):
    """Split rows of at most split_resident elements run on one resident
    kernel, one row or many; one element more takes the three kernels."""
    lim = sx.plan_limits(torch.empty(1, dtype=dtype, device="cuda"), backward=backward)
    bw = "_backward" if backward else ""
    first_split = (lim["cluster"] if max_cluster > 1 else lim["block"]) + 1
    cap = lim["split_resident"]
    assert cap > first_split
    for shape, family in [((2, first_split), "cuda.split_resident"), ((1, cap), "cuda.split_resident"),
                          ((2, cap), "cuda.split_resident"), ((1, cap + 1), "cuda.split")]:
        check_family(kind, dtype, shape, -1, family + bw, backward)


@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_split_resident_many_groups(sx, dtype, start, max_cluster):
    """40 rows, several groups per block (each block takes its slice of one
    row per group), rows off the 16-byte grid, forward and backward."""
    lim = sx.plan_limits(torch.empty(1, dtype=dtype, device="cuda"))  # forward: the longer reach
    n = (lim["cluster"] if max_cluster > 1 else lim["block"]) + 1001
    rows = 40
    base = make_input((rows, n + start), dtype, "cuda", seed=n + start)
    x = base[:, start:]
    dy = make_input((rows, n + start), dtype, "cuda", seed=n + start + 1)[:, start:]
    for kind in KINDS:
        assert sx.plan(x, -1, kind=kind).kernel == f"cuda.split_resident.{TAGS[dtype]}"
        out = ours(kind)(x, -1)
        assert_close_verbose(out, reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                             **tolerances(kind, dtype, n))
        name = kind + "_backward"
        y = reference_forward(kind, x, -1).to("cuda", dtype)
        assert sx.plan(dy, -1, kind=kind, backward=True).kernel == f"cuda.split_resident_backward.{TAGS[dtype]}"
        dx = ours(name)(dy, y, -1)
        assert_close_verbose(dx, reference_backward(name, dy, y, -1), msg=f"{name} n={n} start={start}",
                             **tolerances(name, dtype, n))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_strided_thresholds(kind, dtype, backward, max_cluster):
    lim = expected_limits(dtype, backward, max_cluster)
    bw = "_backward" if backward else ""
    # 128-byte tiles hold the axis up to `wide`; longer axes run in narrower tiles
    wide = 1024 * register_floats(dtype, backward) * torch.empty((), dtype=dtype).element_size() // 128
    wide *= max(max_cluster, 1)
    cases = [(2, "cuda.strided")]
    if wide + 1 <= lim["strided"]:
        cases += [(wide, "cuda.strided"), (wide + 1, "cuda.strided")]
    cases += [(lim["strided"], "cuda.strided"), (lim["strided"] + 1, "cuda.strided_split")]
    for n, family in cases:
        check_family(kind, dtype, (n, 64), 0, family + bw, backward)
    # the inner run: from strided_min_inner columns up
    inner = lim["strided_min_inner"]
    check_family(kind, dtype, (100, inner), 0, "cuda.strided" + bw, backward)
    check_family(kind, dtype, (100, inner - 1), 0, "cuda.reference" + bw, backward)


WARP_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 100, 127, 128, 129, 200, 255, 256,
                257, 300, 500, 512, 513, 768, 1000, 1023, 1024]


@pytest.mark.parametrize("kind", KINDS)
def test_row_tile_thresholds(kind):
    """Backward f32, bf16 and f16 rows laid out one after another run on the
    row-tile family up to 512 elements, except powers of two (the warp family's)."""
    for shape, family in [((5, 3), "cuda.row_tile"), ((300, 100), "cuda.row_tile"), ((2, 3, 100), "cuda.row_tile"),
                          ((7, 511), "cuda.row_tile"), ((4, 1), "cuda.warp"), ((9, 64), "cuda.warp"),
                          ((3, 512), "cuda.warp"), ((3, 513), "cuda.block")]:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            check_family(kind, dtype, shape, -1, family + "_backward", backward=True)
    # f64 rows stay with the warp family
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
        check_family(kind, dtype, (301, 126), -1, "cuda.warp")
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
    if _free_gib() < rows * n * 4 * 3 / 2**30 + 2:
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


@pytest.mark.parametrize(
    "dtype,shape,backward,family",
    # more passes than 65535 blocks: f32 rows on a block per pass (past
    # 65535 blocks), 16-bit forward rows and 16-bit backward rows off the
    # powers of two on 65535 blocks walking several passes each
    # (csrc/cuda/config.h, grid_walks_rows)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=["f32", "f16", "f64"])
def test_warp_lengths_and_offsets(dtype):
    """Every lane-group size, and rows starting at every offset within a 16-byte vector,
    forward and backward (rows that fill their lane group partly or exactly)."""
    cap = expected_limits(dtype, False, 1)["warp"]
    cap_backward = expected_limits(dtype, True, 1)["warp"]
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


@pytest.mark.parametrize("n", [1500, 4097, 20000, 40000, 100003])
@pytest.mark.parametrize("start", [0, 1, 5])
def test_unaligned_rows_long(n, start):
    """Block, cluster and split rows whose starts are not 16-byte aligned, in every operand."""
    base = make_input((3, n + 8), torch.bfloat16, "cuda", seed=n)
    x = base[:, start : start + n]
    for kind in KINDS:
        out = ours(kind)(x, -1)
        assert_close_verbose(out, reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                             **tolerances(kind, torch.bfloat16, n))
        y = ours(kind)(x.float(), -1)
        g_base = make_input((3, n + 8), torch.float32, "cuda", seed=n + 1)
        dy = g_base[:, start : start + n]
        name = kind + "_backward"
        dx = ours(name)(dy, y, -1)
        assert_close_verbose(dx, reference_backward(name, dy, y, -1), msg=f"{name} n={n} start={start}",
                             **tolerances(name, torch.float32, n))
        # bf16 backward: packed fragments, dy and y both off the 16-byte grid
        yb_base = make_input((3, n + 8), torch.bfloat16, "cuda", seed=n + 2)
        yb = ours(kind)(yb_base[:, start : start + n].float(), -1).to(torch.bfloat16)
        dyb = base[:, start : start + n]
        dxb = ours(name)(dyb, yb, -1)
        assert_close_verbose(dxb, reference_backward(name, dyb, yb, -1), msg=f"bf16 {name} n={n} start={start}",
                             **tolerances(name, torch.bfloat16, n))


@pytest.mark.parametrize("n", [40000, 50257, 100003, 151936, 262144])
@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["f32", "bf16", "f16", "f64"])
def test_cluster_rows_many(dtype, n, start):
    """More rows than clusters run at once: each cluster of the persistent grid
    takes several rows, staging the next one in shared memory while it works
    on the current one (csrc/cuda/staging.cuh), rows filling their cluster
    partly or exactly, at 16-byte boundaries or off them. 16-bit backward rows
    of 50257 and 151936 run in clusters of 512-thread blocks, 4 and 10 of them
    (config.h, cluster_takes_half_blocks)."""
    rows = 100
    base = make_input((rows, n + start), dtype, "cuda", seed=n + start)
    x = base[:, start:]
    g_base = make_input((rows, n + start), dtype, "cuda", seed=n + start + 1)
    dy = g_base[:, start:]
    for kind in KINDS:
        out = ours(kind)(x, -1)
        assert_close_verbose(out, reference_forward(kind, x, -1), msg=f"{kind} n={n} start={start}",
                             **tolerances(kind, dtype, n))
        name = kind + "_backward"
        y = reference_forward(kind, x, -1).to("cuda", dtype)
        dx = ours(name)(dy, y, -1)
        assert_close_verbose(dx, reference_backward(name, dy, y, -1), msg=f"{name} n={n} start={start}",
                             **tolerances(name, dtype, n))


def test_cluster_block_sizes_alternate():
    """One kernel staged in blocks of 1024 threads (N=262144), then of 512
    (N=40000), then of 1024 again: each launch gets the shared memory its
    block size needs, in whatever order the shapes come."""
    for n in (262144, 40000, 262144, 40000):
        x = make_input((20, n), torch.float32, "cuda", seed=n)
        for kind in KINDS:
            assert_close_verbose(ours(kind)(x, -1), reference_forward(kind, x, -1), msg=f"{kind} n={n}",
                                 **tolerances(kind, torch.float32, n))


@pytest.mark.parametrize("n", [100, 126, 510, 5000, 70000, 600000])  # 126, 510: the f32 row tile
@pytest.mark.parametrize("kind", KINDS)
def test_inf_nan_spread_over_blocks(n, kind):
    """Partials of a block or tile holding only -inf must not poison the row
    (they add 0); a NaN or +inf anywhere makes the row NaN, as in torch."""
    x = make_input((4, n), torch.float32, "cuda")
    x[0, : n * 3 // 4] = float("-inf")  # whole blocks / tiles of -inf, finite tail
    x[1, :] = float("-inf")  # all -inf: NaN row
    x[2, n // 2] = float("nan")
    x[3, n - 1] = float("inf")
    out = ours(kind)(x, -1)
    ref = getattr(torch, kind)(x.double(), -1)
    assert torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    assert torch.equal(torch.isnan(out[3]), torch.isnan(ref[3]))
    tail = x[0, n * 3 // 4 :]
    assert_close_verbose(out[0, n * 3 // 4 :], getattr(torch, kind)(tail.double(), -1).float(), msg=f"{kind} -inf head",
                         **tolerances(kind, torch.float32, n // 4))
    if kind == "softmax":
        assert (out[0, : n * 3 // 4] == 0).all()


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


def _free_gib():
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


@pytest.mark.parametrize("shape", [(2**21 + 3, 1024), (1, 2**31 + 40)], ids=["many_rows", "one_row"])
def test_more_than_2_31_elements(shape):
    """64-bit offsets: bf16 tensors of more than 2^31 elements (warp and split
    families); the rows past the 2^31st element are checked against torch."""
    numel = shape[0] * shape[1]
    if _free_gib() < numel * 2 * 3 / 2**30 + 2:
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
