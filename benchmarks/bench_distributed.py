"""Sharded-axis (log_)softmax: a tensor-parallel LM head's vocab over every rank.

For a tensor whose softmax axis is Shard(-1) over a world of ranks, compares
    ours:    softmax_ext.log_softmax(x_dtensor, -1): stats pass, an all-gather
             of (rows, 2) float32 per rank, normalise pass; output Shard(-1)
    dtensor: torch.log_softmax(x_dtensor, -1): DTensor redistributes the axis
             to Replicate (an all-gather of the whole tensor) and runs torch's
             kernel on the full rows; output Replicate
per rank, forward and forward + backward, with the bytes each rank receives
(global shapes (8192, 131072) and (16384, 262144) on CUDA). On the GPU it
also times the per-rank kernels alone on one shard, as % of the read
bandwidth (stats) and of the copy bandwidth (normalise) measured in the same
run. --kind softmax for the softmax.

    python benchmarks/bench_distributed.py                 # CPU, gloo, world 2
    python benchmarks/bench_distributed.py --device cuda   # every GPU, NCCL
    python benchmarks/bench_distributed.py --device cuda --kernels-only
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch

# Run from a source checkout: the package beside this folder (the spawned
# ranks inherit sys.path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_ms(fn, device, reps):
    import torch.distributed as dist

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _world(rank, world, port, device, shapes, dtype, kind, reps, out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    import softmax_ext
    import softmax_ext.distributed as sd

    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    mesh = init_device_mesh(device, (world,))
    rows_out = []
    torch.manual_seed(rank)
    for rows, n in shapes:
        # each rank makes its own shard (no full tensor on any rank)
        def shard():
            return DTensor.from_local(torch.randn(rows, n // world, dtype=dtype, device=device), mesh, [Shard(1)])

        xd = shard()
        xg, xt = shard().requires_grad_(), shard().requires_grad_()
        gd = shard()
        gd_full = gd.redistribute(mesh, [Replicate()])  # the gradient of DTensor's Replicate output
        op = getattr(torch, kind)
        ours = getattr(softmax_ext, kind)
        for name, fwd in [("ours", lambda t: ours(t, -1)), ("dtensor", lambda t: op(t, -1))]:
            ms_f = _time_ms(lambda: fwd(xd), device, reps)
            src = xg if name == "ours" else xt

            def fb():
                y = fwd(src)
                y.backward(gd if name == "ours" else gd_full)
                src.grad = None

            ms_fb = _time_ms(fb, device, reps)
            # bytes received per rank by the all-gathers: ours exchanges the
            # per-row statistics (forward: max and sum; backward: one sum per
            # row, float32 or float64); DTensor gathers the axis to Replicate
            local = xd.to_local()
            if name == "ours":
                stats = sd.softmax_stats(local, -1)
                fwd_bytes = stats.numel() * stats.element_size() * (world - 1)
                bwd_bytes = fwd_bytes // 2
            else:
                fwd_bytes = local.numel() * local.element_size() * (world - 1)
                bwd_bytes = 0  # the Replicate gradient is sliced back to Shard locally
            rows_out.append(dict(impl=name, rows=rows, n=n, ms_fwd=ms_f, ms_fwd_bwd=ms_fb,
                                 bytes_fwd=fwd_bytes, bytes_bwd=bwd_bytes))
        xd = xg = xt = gd = gd_full = None  # free this shape before the next
        if device == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        out.put(rows_out)
    dist.barrier()
    dist.destroy_process_group()


def run_world(device, world, shapes, dtype, kind, reps):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(_world, args=(world, _free_port(), device, shapes, dtype, kind, reps, q), nprocs=world, join=True)
    return q.get()


def _read_gbs(nbytes):
    x = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_()
    from triton.testing import do_bench

    ms = do_bench(lambda: x.amax(), warmup=25, rep=200, return_mode="median")
    return x.numel() * 4 / ms / 1e6


def _copy_gbs(nbytes):
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    from triton.testing import do_bench

    ms = do_bench(lambda: x.clone(), warmup=25, rep=200, return_mode="median")
    return 2 * x.numel() * 4 / ms / 1e6


def kernel_bench(shapes, dtypes):
    from triton.testing import do_bench

    import softmax_ext.distributed as sd

    read, copy = _read_gbs(1 << 30), _copy_gbs(1 << 30)
    print(f"device: {torch.cuda.get_device_name()}; read {read:.0f} GB/s (int32 amax of 1 GiB), "
          f"copy {copy:.0f} GB/s (read + write, clone of 1 GiB)")
    print(f"{'shape':>16s} {'dtype':>9s} {'step':>20s} {'kernel':>38s} {'us':>8s} {'GB/s':>7s} {'% bound':>8s}")
    results = []
    for rows, n in shapes:
        for dtype in dtypes:
            x = torch.randn(rows, n, dtype=dtype, device="cuda")
            y = torch.softmax(x.float(), -1).to(dtype)
            dy = torch.randn_like(x)
            s = sd.softmax_stats(x, -1)
            b = sd.softmax_backward_stats(dy, y, -1, "softmax")
            nb = x.numel() * x.element_size()
            steps = [
                ("stats", lambda: sd.softmax_stats(x, -1), nb, read, "read"),
                ("normalize softmax", lambda: sd.softmax_normalize(x, s, -1, "softmax"), 2 * nb, copy, "copy"),
                ("normalize log", lambda: sd.softmax_normalize(x, s, -1, "log_softmax"), 2 * nb, copy, "copy"),
                ("bwd stats softmax", lambda: sd.softmax_backward_stats(dy, y, -1, "softmax"), 2 * nb, read, "read"),
                ("bwd normalize", lambda: sd.softmax_backward_normalize(dy, y, b, -1, "softmax"), 3 * nb, copy, "copy"),
                ("torch.softmax", lambda: torch.softmax(x, -1), 2 * nb, copy, "copy"),
            ]
            for step, fn, nbytes, bound, what in steps:
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                gbs = nbytes / ms / 1e6
                kernel = sd.plan(x, -1, {"stats": "stats", "bwd stats softmax": "backward_stats",
                                         "bwd normalize": "backward_normalize"}.get(step, "normalize")) \
                    if not step.startswith("torch") else "aten"
                print(f"{str((rows, n)):>16s} {str(dtype)[6:]:>9s} {step:>20s} {kernel:>38s} {ms * 1e3:8.1f} "
                      f"{gbs:7.0f} {100 * gbs / bound:7.1f}% of {what}")
                results.append((rows, n, dtype, step, ms, gbs, 100 * gbs / bound))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--world", type=int, default=0, help="ranks (default: 2 on CPU, every GPU on CUDA)")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: f32 on CPU, bf16 on CUDA)")
    ap.add_argument("--kind", default="log_softmax", choices=["softmax", "log_softmax"])
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--kernels-only", action="store_true")
    ap.add_argument("--no-kernels", action="store_true")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    world = args.world or (torch.cuda.device_count() if cuda else 2)
    # a tensor-parallel LM head: the vocab sharded over every rank
    shapes = [(8192, 131072), (16384, 262144)] if cuda else [(1024, 8192), (256, 32768)]
    if cuda and not args.no_kernels:
        kernel_bench([(rows, n // world) for rows, n in shapes], [torch.bfloat16, torch.float32])
        torch.cuda.empty_cache()  # the ranks need GPU 0's memory
        if args.kernels_only:
            return
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    reps = args.reps or (20 if cuda else 10)
    rows = run_world(args.device, world, shapes, dtype, args.kind, reps)
    print(f"\nworld {world} ({'NCCL' if cuda else 'gloo'}, {torch.cuda.get_device_name() if cuda else 'CPU'}, "
          f"torch {torch.__version__}), {str(dtype)[6:]}, {args.kind} over Shard(-1); "
          f"per rank, median of {reps}; bytes = received by the all-gathers per rank")
    print(f"{'impl':>8s} {'global shape':>16s} {'fwd ms':>8s} {'fwd+bwd ms':>11s} {'fwd bytes':>12s} {'bwd bytes':>10s}")
    for r in rows:
        print(f"{r['impl']:>8s} {str((r['rows'], r['n'])):>16s} {r['ms_fwd']:8.2f} {r['ms_fwd_bwd']:11.2f} "
              f"{r['bytes_fwd']:12d} {r['bytes_bwd']:10d}")


if __name__ == "__main__":
    main()
