"""Side-by-side timing of softmax_ext against torch (eager and compiled).

    python -m benchmarks.bench_softmax                # the device's default sweep
    python -m benchmarks.bench_softmax --device cpu   # CPU sweep
    python -m benchmarks.bench_softmax --quick        # a few shapes

Every entry is the median of many runs; GPU inputs are larger than L2 and the
copy bandwidth (bytes read + written by a device-to-device clone) is measured
in the same run, so "% copy" compares against what this machine can move.
Results go to benchmarks/results/<device>.csv.
"""

import argparse
import csv
import os
import statistics
import time

import torch
import torch.nn.functional as F

import softmax_ext

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def median_ms(fn, device, reps=30):
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=200, return_mode="median")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_gbs(device, nbytes=1 << 30):
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    ms = median_ms(lambda: x.clone(), device)
    return 2 * x.numel() * 4 / ms / 1e6


def forward_impls(op, dim):
    torch_fn = getattr(torch, op)
    impls = {
        "softmax_ext": lambda x: getattr(softmax_ext, op)(x, dim),
        "torch": lambda x: torch_fn(x, dim),
        "torch.compile": torch.compile(lambda x: torch_fn(x, dim), dynamic=False),
    }
    return impls


def backward_impls(op, dim):
    ours = getattr(softmax_ext, f"{op}_backward")
    aten = getattr(torch.ops.aten, f"_{op}_backward_data")
    return {
        "softmax_ext": lambda dy, y: ours(dy, y, dim),
        "torch": lambda dy, y: aten(dy, y, dim, y.dtype),
    }


def sweep(device, quick):
    """(op, dtype, shape, dim, direction) tuples."""
    if device == "cpu":
        shapes = [((4096, 4096), -1), ((256, 65536), -1), ((32, 1024, 512), 1), ((2048, 2048), 0)]
        dtypes = [torch.float32, torch.bfloat16]
    else:
        gib = 1 << 30
        shapes = [((gib // (4 * n), n), -1) for n in (128, 1024, 4096, 16384, 65536)]
        shapes += [((32, 1024, 4096), 1)]
        dtypes = [torch.float32, torch.bfloat16]
    if quick:
        shapes = shapes[:2]
    for shape, dim in shapes:
        for dtype in dtypes:
            for op in ("softmax", "log_softmax"):
                for direction in ("forward", "backward"):
                    yield op, dtype, shape, dim, direction


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    copy = copy_gbs(device, (1 << 30) if device == "cuda" else (1 << 27))
    print(f"device: {name}; copy bandwidth {copy:.0f} GB/s (read + write)")

    rows = []
    for op, dtype, shape, dim, direction in sweep(device, args.quick):
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(shape, device=device, dtype=dtype, generator=gen)
        if direction == "forward":
            impls, inputs, tensors = forward_impls(op, dim), (x,), 2
        else:
            y = getattr(torch, op)(x, dim)
            impls, inputs, tensors = backward_impls(op, dim), (torch.randn_like(x), y), 3
        nbytes = tensors * x.numel() * x.element_size()
        base = None
        for impl, fn in impls.items():
            ms = median_ms(lambda: fn(*inputs), device)
            base = ms if impl == "torch" else base
            gbs = nbytes / ms / 1e6
            rows.append(dict(device=name, op=op, direction=direction, dtype=str(dtype)[6:],
                             shape="x".join(map(str, shape)), dim=dim, impl=impl, ms=round(ms, 4),
                             gbs=round(gbs, 1), pct_copy=round(100 * gbs / copy, 1)))
        for r in rows[-len(impls):]:
            r["speedup_vs_torch"] = round(base / r["ms"], 2)
        del x, inputs

    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{device}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'op':12s} {'dir':8s} {'dtype':8s} {'shape':14s} {'dim':>3s} {'impl':14s} "
          f"{'ms':>8s} {'GB/s':>7s} {'%copy':>6s} {'vs torch':>8s}")
    for r in rows:
        print(f"{r['op']:12s} {r['direction']:8s} {r['dtype']:8s} {r['shape']:14s} {r['dim']:3d} "
              f"{r['impl']:14s} {r['ms']:8.3f} {r['gbs']:7.1f} {r['pct_copy']:6.1f} {r['speedup_vs_torch']:7.2f}x")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
