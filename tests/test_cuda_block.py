"""The block and cluster families (csrc/cuda/families/block): their thresholds (plan_limits' "block"
and "cluster") and one past them, packed 16-bit rows, rows off the 16-byte grid, persistent staged
clusters, partials of -inf."""

import pytest
import torch

from conftest import assert_close_verbose, make_input, ours, reference_backward, reference_forward, requires_cuda
from cuda_family_checks import KINDS, TAGS, check_family, limits, tolerances

pytestmark = requires_cuda

# 16-bit rows longer than this are kept packed (csrc/cuda/families/block/policy.h, kPackedMinRow;
# the README says so): not a threshold between families, so not in plan_limits.
PACKED_MIN_ROW = 4096


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", list(TAGS), ids=list(TAGS.values()))
def test_block_and_cluster_thresholds(kind, dtype, backward):
    """Contiguous rows up to plan_limits' "block" run on one block, one more
    on a cluster (sm_90+) or the resident split family; rows up to "cluster"
    on a cluster, one more on the resident split family."""
    lim = limits(dtype, backward)
    bw = "_backward" if backward else ""
    clusters = lim["max_cluster_size"] > 1
    big = "cuda.cluster" if clusters else "cuda.split_resident"
    cases = [(lim["warp"] + 1, "cuda.block"), (lim["block"], "cuda.block"), (lim["block"] + 1, big)]
    if clusters:
        cases += [(lim["cluster"], "cuda.cluster"), (lim["cluster"] + 1, "cuda.split_resident")]
    else:
        assert lim["cluster"] == 0
    if dtype in (torch.bfloat16, torch.float16) and PACKED_MIN_ROW < lim["block"]:
        # block rows of 16-bit values longer than this stay packed in registers
        cases += [(PACKED_MIN_ROW, "cuda.block"), (PACKED_MIN_ROW + 1, "cuda.block")]
    for n, family in cases:
        rows = 3 if n * 3 <= 1 << 22 and not family.startswith("cuda.split") else 1
        check_family(kind, dtype, (rows, n), -1, family + bw, backward)


def test_max_cluster_size():
    """Clusters where the GPU has them (sm_90+)."""
    major, _ = torch.cuda.get_device_capability()
    assert (limits(torch.float32)["max_cluster_size"] > 1) == (major >= 9)


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
    on the current one (csrc/cuda/core/staging.cuh), rows filling their cluster
    partly or exactly, at 16-byte boundaries or off them. 16-bit backward rows
    of 50257 and 151936 run in clusters of 512-thread blocks, 4 and 10 of them
    (csrc/cuda/families/block/policy.h, cluster_takes_half_blocks)."""
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
