"""softmax_ext.distributed: the per-rank ops of the sharded-axis softmax
(softmax_stats, softmax_normalize, softmax_backward_stats,
softmax_backward_normalize), their combination across shards, and DTensor
inputs on gloo worlds of 2 and 4 CPU processes (1-D and 2-D meshes) and, where
the GPUs are there, NCCL worlds of 2, 4 and 8 (one process a GPU).

The multi-process checks are batched: one spawned world per world size runs
every placement / dtype / op / shape case and raises on the first mismatch
(pytest shows the worker's traceback). References are torch in float64."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from conftest import (
    BACKWARD_TOLERANCES,
    DEVICES,
    TOLERANCES,
    assert_close_verbose,
    dtype_id,
    make_input,
    requires_cuda,
)

import softmax_ext
import softmax_ext.distributed as sd

HAS_DIST = torch.distributed.is_available()
requires_dist = pytest.mark.skipif(not HAS_DIST, reason="torch.distributed is not available")

DTYPES = [torch.float32, torch.bfloat16, torch.float64]
KINDS = ["softmax", "log_softmax"]


def _ref(kind, x, dim):
    x64 = x.detach().to("cpu", torch.float64)
    r = torch.softmax(x64, dim) if kind == "softmax" else torch.log_softmax(x64, dim)
    return r.to(x.dtype).to(x.device)


def _ref_backward(kind, dy, y, dim):
    dy64, y64 = dy.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)
    if kind == "softmax":
        r = torch.ops.aten._softmax_backward_data(dy64, y64, dim, torch.float64)
    else:
        r = torch.ops.aten._log_softmax_backward_data(dy64, y64, dim, torch.float64)
    return r.to(dy.dtype).to(dy.device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (NaN-safe bitwise comparison)."""
    t = t.detach().contiguous().cpu()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _split_rows(kind, x, dim, pieces):
    """The sharded-axis algorithm in one process: stats per piece, combined
    in piece order, each piece normalised with the whole rows' stats."""
    chunks = torch.tensor_split(x, pieces, dim) if isinstance(pieces, int) else torch.split(x, pieces, dim)
    stats = torch.stack([sd.softmax_stats(c, dim) for c in chunks])
    combined = sd.combine_stats(stats)
    return torch.cat([sd.softmax_normalize(c, combined, dim, kind) for c in chunks], dim), combined


# --------------------------------------------------------------------------
# The per-rank ops, one process
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16], ids=dtype_id)
@pytest.mark.parametrize("device", DEVICES)
def test_stats_values(device, dtype):
    for shape, dim in [((7, 33), -1), ((3, 1000, 5), 1), ((4, 5000), 1), ((2, 3, 4), 0), ((), 0), ((5,), 0)]:
        x = make_input(shape, dtype, device, seed=len(shape))
        s = sd.softmax_stats(x, dim)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        x64 = x.to(torch.float64).cpu()
        d = dim if x.dim() else 0
        x64 = x64.reshape(1) if x.dim() == 0 else x64
        m = x64.amax(d)
        ref = torch.stack((m, torch.exp(x64 - m.unsqueeze(d)).sum(d)), -1).to(acc)
        assert s.dtype == acc and s.is_contiguous()
        tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
        assert_close_verbose(s.cpu(), ref.reshape(s.shape), msg=f"stats {shape} dim={dim} {dtype}", **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("device", DEVICES)
def test_split_rows_match_softmax(device, kind, dtype):
    """Statistics of the pieces of a row, combined, normalise each piece to
    the whole row's result: uneven pieces, empty pieces, several layouts."""
    cases = [((6, 37), -1, 2), ((6, 37), -1, [10, 0, 27, 0]), ((3, 50, 4), 1, 4), ((5, 3), -1, 4),
             ((8, 4099), -1, [1, 2048, 2050]), ((9, 256), 0, 3)]
    for shape, dim, pieces in cases:
        x = make_input(shape, dtype, device, seed=7)
        y, _ = _split_rows(kind, x, dim, pieces)
        assert_close_verbose(y, _ref(kind, x, dim), msg=f"{kind} {shape} dim={dim} pieces={pieces}",
                             **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("device", DEVICES)
def test_backward_steps(device, kind, dtype):
    for shape, dim, pieces in [((6, 37), -1, [20, 17]), ((3, 40, 5), 1, [0, 13, 27]), ((4, 3000), -1, 3)]:
        x = make_input(shape, torch.float64, "cpu", seed=3)
        y = (torch.softmax(x, dim) if kind == "softmax" else torch.log_softmax(x, dim)).to(dtype).to(device)
        dy = make_input(shape, dtype, device, seed=4, scale=1.0)
        split = (lambda t: torch.tensor_split(t, pieces, dim)) if isinstance(pieces, int) else \
            (lambda t: torch.split(t, pieces, dim))
        parts = list(zip(split(dy), split(y)))
        sums = [sd.softmax_backward_stats(g, o, dim, kind) for g, o in parts]
        total = sums[0]
        for s in sums[1:]:
            total = total + s
        dx = torch.cat([sd.softmax_backward_normalize(g, o, total, dim, kind) for g, o in parts], dim)
        assert_close_verbose(dx, _ref_backward(kind, dy, y, dim), msg=f"{kind} backward {shape} dim={dim}",
                             **BACKWARD_TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_layouts_and_output_strides(device):
    x = make_input((16, 40), torch.float32, device).t()  # (40, 16), axis 0 with unit stride
    for dim in (0, 1):
        s = sd.softmax_stats(x, dim)
        y = sd.softmax_normalize(x, s, dim, "softmax")
        assert y.stride() == x.stride()
        assert_close_verbose(y, _ref("softmax", x, dim), msg=f"transposed dim={dim}", **TOLERANCES[torch.float32])
    base = make_input((4, 6, 10), torch.float32, device)
    sliced = base[:, ::2, 1:]  # not dense: contiguous output
    y = sd.softmax_normalize(sliced, sd.softmax_stats(sliced, 2), 2, "log_softmax")
    assert y.is_contiguous()
    assert_close_verbose(y, _ref("log_softmax", sliced, 2), msg="sliced", **TOLERANCES[torch.float32])
    perm = base.permute(2, 0, 1)  # batch dims out of logical order
    s = sd.softmax_stats(perm, 1)
    assert s.shape == (10, 6, 2)
    assert torch.equal(s, sd.softmax_stats(perm.contiguous(), 1))


@pytest.mark.parametrize("device", DEVICES)
def test_edge_values(device):
    x = torch.tensor([[1.0, float("nan"), 2.0, 3.0], [float("-inf")] * 4, [0.0, float("inf"), 1.0, 2.0],
                      [1e38, -1e38, 1e38, 0.0]], device=device)
    for kind in KINDS:
        y, _ = _split_rows(kind, x, 1, [1, 3])
        ref = _ref(kind, x, 1)
        assert torch.equal(y.isnan(), ref.isnan()), (kind, y, ref)
        assert_close_verbose(y[3:], ref[3:], msg=f"{kind} near float max", **TOLERANCES[torch.float32])
    # empty rows and an empty axis
    e = torch.empty(0, 5, device=device)
    assert sd.softmax_stats(e, 1).shape == (0, 2)
    z = torch.empty(3, 0, device=device)
    s = sd.softmax_stats(z, 1)
    assert torch.equal(s.cpu(), torch.tensor([[float("-inf"), 0.0]] * 3))
    assert sd.softmax_normalize(z, s, 1, "softmax").shape == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x = make_input((4, 6), torch.float32, device)
    s = sd.softmax_stats(x, 1)
    with pytest.raises(NotImplementedError, match="softmax_stats: input dtype Long is not supported"):
        sd.softmax_stats(torch.ones(3, 3, dtype=torch.int64, device=device), 1)
    with pytest.raises(IndexError, match="softmax_stats: dim 2 is out of range"):
        sd.softmax_stats(x, 2)
    with pytest.raises(ValueError, match="softmax_normalize: kind='softmin'"):
        sd.softmax_normalize(x, s, 1, "softmin")
    with pytest.raises(ValueError, match="softmax_normalize: stats has shape"):
        sd.softmax_normalize(x, s[:2], 1, "softmax")
    with pytest.raises(ValueError, match="softmax_normalize: stats has dtype Double but a Float input"):
        sd.softmax_normalize(x, s.double(), 1, "softmax")
    with pytest.raises(ValueError, match="softmax_backward_stats: grad_output has shape"):
        sd.softmax_backward_stats(x[:2], x, 1, "softmax")
    with pytest.raises(ValueError, match="softmax_backward_normalize: stats has shape"):
        sd.softmax_backward_normalize(x, x, s, 1, "softmax")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = make_input((5, 33), torch.float32, device)
    t = make_input((3, 7, 10), torch.bfloat16, device).transpose(1, 2)
    for a, dim in [(x, 1), (t, 1), (t, 2)]:
        s = sd.softmax_stats(a, dim)
        dy = torch.randn_like(a)
        for kind in KINDS:
            y = sd.softmax_normalize(a, s, dim, kind)
            b = sd.softmax_backward_stats(dy, y, dim, kind)
            torch.library.opcheck(torch.ops.softmax_ext.softmax_stats.default, (a, dim))
            torch.library.opcheck(torch.ops.softmax_ext.softmax_normalize.default, (a, s, dim, kind))
            torch.library.opcheck(torch.ops.softmax_ext.softmax_backward_stats.default, (dy, y, dim, kind))
            torch.library.opcheck(torch.ops.softmax_ext.softmax_backward_normalize.default, (dy, y, b, dim, kind))


def test_plan_names():
    x = torch.empty(8, 100, dtype=torch.bfloat16)
    assert sd.plan(x, -1, "stats") == "cpu.rows.stats.bf16"
    assert sd.plan(x, -1, "backward_normalize") == "cpu.rows.backward_normalize.bf16"


@requires_cuda
def test_cuda_families_and_determinism():
    """Warp-per-row and block-per-row rows, aligned (vector) and unaligned
    (element) walks, bit-identical reruns."""
    for n in [1, 7, 8, 2048, 2049, 4096, 16385, 131072 // 8]:
        for dtype in DTYPES + [torch.float16]:
            x = make_input((33, n), dtype, "cuda", seed=n)
            for kind in KINDS:
                y, stats = _split_rows(kind, x, 1, 3)
                assert_close_verbose(y, _ref(kind, x, 1), msg=f"{kind} n={n} {dtype}", **TOLERANCES[dtype])
                y2, stats2 = _split_rows(kind, x, 1, 3)
                assert torch.equal(_bits(y), _bits(y2)) and torch.equal(_bits(stats), _bits(stats2))
            xo = make_input((5 * n + 1,), dtype, "cuda", seed=1)[1:].view(5, n)  # rows off 16-byte alignment
            s = sd.softmax_stats(xo, 1)
            assert_close_verbose(sd.softmax_normalize(xo, s, 1, "softmax"), _ref("softmax", xo, 1),
                                 msg=f"offset n={n} {dtype}", **TOLERANCES[dtype])


@requires_dist
def test_import_does_not_load_dtensor():
    """Importing softmax_ext leaves DTensor unimported (it costs about half a
    second); importing DTensor later registers the rules."""
    import subprocess
    import sys

    code = (
        "import sys, softmax_ext\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'DTensor imported'\n"
        "import torch\n"
        "from torch.distributed.tensor import DTensor\n"
        "props = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "assert torch.ops.softmax_ext.softmax.default in props, 'no rule'\n"
        "assert torch.ops.softmax_ext.softmax_backward_normalize.default in props, 'no rule'\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


# --------------------------------------------------------------------------
# Spawned gloo worlds
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world_checks(rank: int, world: int, port: int, device: str) -> None:
    """Every multi-rank check, in one process of a world."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        meshes = [("1d", init_device_mesh(device, (world,)))]
        if world == 4:
            meshes.append(("2d", init_device_mesh(device, (2, 2), mesh_dim_names=("dp", "tp"))))

        def gather_bits_equal(t: torch.Tensor, what: str) -> None:
            """t is bitwise the same on every rank."""
            b = _bits(t).to(torch.int64).to(device)  # gloo gathers no int16
            out = [torch.empty_like(b) for _ in range(world)]
            dist.all_gather(out, b)
            for r in range(world):
                assert torch.equal(out[r], b), f"{what}: rank {r} differs from rank {rank}"

        # shapes: axis not divisible by the world size; an axis shorter than
        # the world (ranks with empty shards); an axis in the middle.
        shapes = [((6, 37), -1), ((4, max(world - 1, 1)), 1), ((5, 10, 4), 1)]
        for mesh_name, mesh in meshes:
            if mesh.ndim == 1:
                layouts = lambda ax: [[Shard(0)], [Shard(ax)], [Replicate()]]  # noqa: E731
            else:
                layouts = lambda ax: [[Shard(0), Shard(ax)], [Replicate(), Shard(ax)],  # noqa: E731
                                      [Shard(ax), Shard(ax)], [Shard(0), Replicate()], [Shard(ax), Shard(0)]]
            for (shape, dim), dtype in [(s, d) for s in shapes for d in DTYPES]:
                axis = dim % len(shape)
                x = make_input(shape, dtype, "cpu", seed=11).to(device)
                dy = make_input(shape, dtype, "cpu", seed=12, scale=1.0).to(device)
                for placements in layouts(axis):
                    for kind in KINDS:
                        what = f"{mesh_name} {kind} {shape} dim={dim} {placements} {dtype_id(dtype)}"
                        xd = distribute_tensor(x, mesh, placements).requires_grad_()
                        fn = softmax_ext.softmax if kind == "softmax" else softmax_ext.log_softmax
                        yd = fn(xd, dim)
                        assert isinstance(yd, DTensor) and tuple(yd.placements) == tuple(placements), what
                        y = yd.full_tensor()
                        assert_close_verbose(y, _ref(kind, x, dim), msg=what, **TOLERANCES[dtype])
                        # rerun: bit-identical
                        assert torch.equal(_bits(fn(xd, dim).to_local()), _bits(yd.to_local())), what + " rerun"
                        if all(isinstance(p, Replicate) for p in placements):
                            gather_bits_equal(yd.to_local(), what + " (replicated)")
                        yd.backward(distribute_tensor(dy, mesh, placements))
                        assert tuple(xd.grad.placements) == tuple(placements), what
                        grad = xd.grad.full_tensor()
                        assert_close_verbose(grad, _ref_backward(kind, dy, y, dim), msg=what + " backward",
                                             **BACKWARD_TOLERANCES[dtype])
                        # the backward ops through DTensor directly, where their rule serves the placements
                        if not any(type(p) is Shard and p.dim == axis for p in placements):
                            bw = getattr(torch.ops.softmax_ext, f"{kind}_backward").default
                            dd = distribute_tensor(dy, mesh, placements)
                            dx = bw(dd, yd.detach(), dim)
                            assert tuple(dx.placements) == tuple(placements), what
                            assert_close_verbose(dx.full_tensor(), _ref_backward(kind, dy, y, dim),
                                                 msg=what + " backward op", **BACKWARD_TOLERANCES[dtype])

        # vocab-sized rows sharded over the axis (on the GPU the per-rank
        # kernels are the long-row ones): against float64 and against the
        # same op on the whole tensor in one process, forward and backward
        mesh = meshes[0][1]
        n = 40000 * world + 7 if device == "cuda" else 3000 * world + 7
        for dtype in (torch.float32, torch.bfloat16):
            x = make_input((8, n), dtype, "cpu", seed=15).to(device)
            dy = make_input((8, n), dtype, "cpu", seed=16, scale=1.0).to(device)
            for kind in KINDS:
                what = f"vocab rows {kind} (8, {n}) {dtype_id(dtype)}"
                fn = softmax_ext.softmax if kind == "softmax" else softmax_ext.log_softmax
                xd = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
                yd = fn(xd, -1)
                yd.backward(distribute_tensor(dy, mesh, [Shard(1)]))
                x1 = x.clone().requires_grad_()
                y1 = fn(x1, -1)
                y1.backward(dy)
                y = yd.full_tensor()
                assert_close_verbose(y, y1.detach(), msg=what + " vs one process", **TOLERANCES[dtype])
                assert_close_verbose(y, _ref(kind, x, -1), msg=what, **TOLERANCES[dtype])
                grad = xd.grad.full_tensor()
                assert_close_verbose(grad, x1.grad, msg=what + " backward vs one process", **BACKWARD_TOLERANCES[dtype])
                assert_close_verbose(grad, _ref_backward(kind, dy, y, -1), msg=what + " backward",
                                     **BACKWARD_TOLERANCES[dtype])
                assert torch.equal(_bits(fn(xd, -1).to_local()), _bits(yd.to_local())), what + " rerun"

        # the per-rank ops on DTensors sharded over the rows
        for shape, dim in [((6, 37), -1), ((5, 10, 4), 1)]:
            x = make_input(shape, torch.float32, "cpu", seed=13).to(device)
            dy = make_input(shape, torch.float32, "cpu", seed=14, scale=1.0).to(device)
            for kind in KINDS:
                xd, dyd = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(dy, mesh, [Shard(0)])
                sdt = torch.ops.softmax_ext.softmax_stats(xd, dim)
                assert tuple(sdt.placements) == (Shard(0),)
                yd = torch.ops.softmax_ext.softmax_normalize(xd, sdt, dim, kind)
                assert_close_verbose(yd.full_tensor(), _ref(kind, x, dim), msg=f"DTensor normalize {kind} {shape}",
                                     **TOLERANCES[torch.float32])
                bd = torch.ops.softmax_ext.softmax_backward_stats(dyd, yd, dim, kind)
                dxd = torch.ops.softmax_ext.softmax_backward_normalize(dyd, yd, bd, dim, kind)
                assert tuple(dxd.placements) == (Shard(0),)
                assert_close_verbose(dxd.full_tensor(), _ref_backward(kind, dy, yd.full_tensor(), dim),
                                     msg=f"DTensor backward normalize {kind} {shape}", **BACKWARD_TOLERANCES[torch.float32])

        # the exchanged statistics are bitwise the same on every rank
        mesh = meshes[0][1]
        x = make_input((5, 4 * world + 3), torch.float32, "cpu", seed=5).to(device)
        local = distribute_tensor(x, mesh, [Shard(1)]).to_local()
        gather_bits_equal(sd.exchange_stats(sd.softmax_stats(local, 1)), "combined stats")

        # the plain-tensor API: uneven slices of the axis (the last rank's
        # empty), forward and backward
        length = 9 * world + 1
        sizes = [9] * world
        sizes[-1] = 0
        sizes[0] = length - sum(sizes[1:])
        start = sum(sizes[:rank])
        x = make_input((3, length), torch.float64, "cpu", seed=6).to(device)
        g = make_input((3, length), torch.float64, "cpu", seed=8, scale=1.0).to(device)
        for kind in KINDS:
            local = x[:, start:start + sizes[rank]].clone().requires_grad_()
            fn = sd.softmax if kind == "softmax" else sd.log_softmax
            y = fn(local, 1)
            assert_close_verbose(y, _ref(kind, x, 1)[:, start:start + sizes[rank]], msg=f"plain {kind}",
                                 **TOLERANCES[torch.float64])
            y.backward(g[:, start:start + sizes[rank]])
            x64 = x.clone().requires_grad_()
            (torch.softmax(x64, 1) if kind == "softmax" else torch.log_softmax(x64, 1)).backward(g)
            assert_close_verbose(local.grad, x64.grad[:, start:start + sizes[rank]], msg=f"plain {kind} backward",
                                 **BACKWARD_TOLERANCES[torch.float64])

        # softmax_matmul and cross_entropy on sharded batches, rows and
        # columns, forward and backward, against the single-process result
        x = make_input((2, 4 * world + 1, 13), torch.float64, "cpu", seed=21).to(device)
        v = make_input((2, 13, 2 * world + 1), torch.float64, "cpu", seed=22, scale=1.0).to(device)
        for px, pv in [([Shard(0)], [Shard(0)]), ([Shard(1)], [Replicate()]), ([Replicate()], [Shard(2)])]:
            what = f"softmax_matmul {px} {pv}"
            xd = distribute_tensor(x, mesh, px).requires_grad_()
            vd = distribute_tensor(v, mesh, pv).requires_grad_()
            out = softmax_ext.softmax_matmul(xd, vd)
            out.sum().backward()
            x64, v64 = x.clone().requires_grad_(), v.clone().requires_grad_()
            ref = torch.softmax(x64, -1) @ v64
            ref.sum().backward()
            assert_close_verbose(out.full_tensor(), ref.detach(), msg=what, **TOLERANCES[torch.float64])
            assert_close_verbose(xd.grad.full_tensor(), x64.grad, msg=what + " dx", **BACKWARD_TOLERANCES[torch.float64])
            assert_close_verbose(vd.grad.full_tensor(), v64.grad, msg=what + " dv", **BACKWARD_TOLERANCES[torch.float64])
        logits = make_input((4 * world + 2, 11), torch.float64, "cpu", seed=23).to(device)
        target = torch.arange(4 * world + 2, device=device) % 11
        for reduction in ("none", "sum", "mean"):
            what = f"cross_entropy {reduction}"
            ld = distribute_tensor(logits, mesh, [Shard(0)]).requires_grad_()
            loss = softmax_ext.cross_entropy(ld, distribute_tensor(target, mesh, [Shard(0)]), reduction=reduction)
            loss.sum().backward()
            l64 = logits.clone().requires_grad_()
            ref = torch.nn.functional.cross_entropy(l64, target, reduction=reduction)
            ref.sum().backward()
            assert_close_verbose(loss.full_tensor(), ref.detach(), msg=what, **TOLERANCES[torch.float64])
            assert_close_verbose(ld.grad.full_tensor(), l64.grad, msg=what + " grad", **BACKWARD_TOLERANCES[torch.float64])

        # placements that cannot be served
        p = DTensor.from_local(torch.ones(4, 6, device=device), mesh, [Partial()], run_check=False)
        with pytest.raises(NotImplementedError, match="Partial"):
            softmax_ext.softmax(p, -1)
        with pytest.raises(NotImplementedError, match="Partial"):
            torch.ops.softmax_ext.log_softmax(p, -1)
        s = distribute_tensor(torch.ones(4, 8, device=device), mesh, [Shard(1)])
        with pytest.raises(IndexError, match="softmax_ext.softmax: dim 3 is out of range"):
            softmax_ext.softmax(s, 3)
        with pytest.raises(NotImplementedError, match=r"Shard\(dim=1\).*softmax axis"):
            torch.ops.softmax_ext.softmax(s, 1)
        # every rank done before any tears its connections down: a gloo
        # rank whose peer closed first can abort in gloo's own threads
        # ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, device: str = "cpu") -> None:
    import torch.multiprocessing as mp

    mp.spawn(_world_checks, args=(world, _free_port(), device), nprocs=world, join=True)


@requires_dist
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_world(world):
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo is not available")
    _spawn(world)


@requires_cuda
@requires_dist
@pytest.mark.parametrize("world", [2, 4, 8])
def test_nccl_world(world):
    """Every check of the gloo worlds over NCCL, one process a GPU."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("NCCL is not available")
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} GPUs needed, {torch.cuda.device_count()} seen")
    _spawn(world, "cuda")


@requires_cuda
@requires_dist
def test_nccl_world_of_one():
    """The DTensor path on CUDA: a one-process NCCL world (every check of
    the gloo worlds, on the GPU)."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("NCCL is not available")
    _spawn(1, "cuda")
