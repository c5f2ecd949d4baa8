"""python -m softmax_ext: build info, a check of every op against torch on
random inputs, and a small timing table against torch.softmax.

Exits non-zero when any check fails.
"""

import argparse
import platform
import statistics
import sys
import time

import torch

import softmax_ext

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Largest |ours - float64 reference| accepted per dtype (outputs are O(1)).
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine()


def _check_cases(device, gen):
    """(name, ours, reference in float64) for every op on a few layouts."""
    shapes = [((37, 1025), -1), ((6, 33, 17), 1), ((64, 48), 0), ((), 0)]
    for dtype in DTYPES:
        for shape, dim in shapes:
            x = torch.randn(shape, generator=gen, dtype=torch.float64).mul_(3).to(device, dtype)
            x64 = x.double()
            dy = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
            for kind, ref_fn, bw_ref in (
                ("softmax", torch.softmax, torch.ops.aten._softmax_backward_data),
                ("log_softmax", torch.log_softmax, torch.ops.aten._log_softmax_backward_data),
            ):
                y = getattr(softmax_ext, kind)(x, dim)
                ref = ref_fn(x64, dim)
                yield f"{kind}", dtype, shape, y, ref
                y_ref_rounded = ref.to(dtype)
                dx = getattr(softmax_ext, f"{kind}_backward")(dy, y_ref_rounded, dim)
                dx_ref = bw_ref(dy.double(), y_ref_rounded.double(), dim, torch.float64)
                yield f"{kind}_backward", dtype, shape, dx, dx_ref
        if dtype != torch.float64:
            # dtype=: read in its own dtype, computed and written in float32.
            x = torch.randn(19, 300, generator=gen).to(device, dtype)
            y = softmax_ext.softmax(x, -1, dtype=torch.float32)
            yield "softmax(dtype=float32)", dtype, (19, 300), y, torch.softmax(x.double(), -1)


def check(device, gen):
    """Prints the largest error per (op, dtype); returns the number of failures."""
    worst = {}
    for name, dtype, shape, got, ref in _check_cases(device, gen):
        err = (got.double() - ref).abs().max().item() if got.numel() else 0.0
        ok = got.shape == ref.shape and err <= ATOL[got.dtype] * max(1.0, ref.abs().max().item())
        if not ok:
            print(f"  FAIL {name} {dtype} {shape} on {device}: max error {err:.3g}")
        key = (name, str(dtype).replace("torch.", ""))
        prev_err, prev_ok = worst.get(key, (0.0, True))
        worst[key] = (max(prev_err, err), prev_ok and ok)
    for (name, dtype), (err, ok) in sorted(worst.items()):
        print(f"  {'ok  ' if ok else 'FAIL'} {device:4s} {name:24s} {dtype:9s} max error {err:.2e}")
    return sum(not ok for _, ok in worst.values())


def _median_ms(fn, device, reps):
    if device == "cuda":
        try:
            from triton.testing import do_bench

            return do_bench(fn, warmup=25, rep=100, return_mode="median")
        except ImportError:
            pass
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timing_table(device, reps):
    rows = []
    shapes = [((4096, 4096), -1), ((32, 1024, 512), 1)]
    if device == "cuda":
        shapes = [((65536, 1024), -1), ((8192, 16384), -1), ((32, 1024, 4096), 1)]
    for shape, dim in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device=device, dtype=dtype)
            nbytes = 2 * x.numel() * x.element_size()
            for op in ("softmax", "log_softmax"):
                ours = _median_ms(lambda: getattr(softmax_ext, op)(x, dim), device, reps)
                theirs = _median_ms(lambda: getattr(torch, op)(x, dim), device, reps)
                rows.append((op, device, str(dtype).replace("torch.", ""), "x".join(map(str, shape)),
                             dim, ours, theirs, nbytes / ours / 1e6, theirs / ours))
    print(f"\n  {'op':12s} {'dev':4s} {'dtype':9s} {'shape':14s} {'dim':>3s} "
          f"{'ours ms':>9s} {'torch ms':>9s} {'ours GB/s':>9s} {'speed vs torch':>14s}")
    for op, dev, dt, shape, dim, ours, theirs, gbs, ratio in rows:
        print(f"  {op:12s} {dev:4s} {dt:9s} {shape:14s} {dim:3d} {ours:9.3f} {theirs:9.3f} {gbs:9.1f} {ratio:13.2f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m softmax_ext", description=__doc__)
    parser.add_argument("--no-timing", action="store_true", help="skip the timing table")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per entry (CPU)")
    args = parser.parse_args(argv)

    info = softmax_ext.build_info()
    print(f"softmax_ext {softmax_ext.__version__}")
    print(f"  built against torch {info['torch']} (running {info['torch_runtime']}), "
          f"CUDA {info['cuda'] or 'none (CPU-only build)'}, archs {info['cuda_archs'] or '-'}")
    for device in _devices():
        print(f"  device {device}: {_device_name(device)}")

    gen = torch.Generator().manual_seed(0)
    failures = 0
    for device in _devices():
        print(f"\nchecking every op against torch (float64 reference) on {device}")
        failures += check(device, gen)
    if not args.no_timing:
        for device in _devices():
            timing_table(device, args.reps)
    print(f"\n{'all checks passed' if failures == 0 else f'{failures} checks FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
