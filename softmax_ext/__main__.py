"""python -m softmax_ext: what was built, whether every op agrees with torch
here, and how fast it is against torch (and torch.compile) on this machine.

  1. build facts: the torch version _C was built against and the one running,
     the CUDA version, the compiled GPU architectures, and whether this GPU's
     architecture is among them (with the rebuild command when it is not);
  2. a check of every op against torch's float64 result, per dtype and device;
  3. timings against torch and torch.compile on a few representative shapes,
     with a progress line per entry and a final table (ms, GB/s, % of the
     copy bandwidth on a GPU, speedup over torch).

Exits 1 when a check fails (or this GPU cannot run the build), 2 on bad
arguments, 0 otherwise.
"""

import argparse
import csv
import os
import platform
import statistics
import sys
import time

import torch

import softmax_ext

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Largest |ours - float64 reference| accepted per dtype, relative to the
# largest |reference| (at least 1).
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


# --------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m softmax_ext", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["all", "cpu", "cuda"], default="all",
                        help="where to check and time (default: the CPU and, when visible, the GPU)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer, smaller timing shapes and no torch.compile on the CPU "
                             "(under a minute on a CPU, 30 s on a GPU)")
    parser.add_argument("--no-timing", action="store_true", help="build facts and checks only")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the timings")
    parser.add_argument("--reps", type=_positive_int, default=None,
                        help="timed repetitions per entry on the CPU (default 20, 8 with --quick)")
    parser.add_argument("--csv", metavar="PATH", help="write the timing table to PATH as CSV")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of the speedups over torch to PATH "
                        "(needs matplotlib)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib, which is not installed here (pip install matplotlib); "
                         "the table and --csv work without it")
    if args.no_timing and (args.csv or args.plot):
        parser.error("--csv and --plot write the timings, which --no-timing skips")
    if args.reps is None:
        args.reps = 8 if args.quick else 20
    return args


def _devices(choice):
    if choice == "all":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [choice]


# --------------------------------------------------------------------------
# 1. build facts
# --------------------------------------------------------------------------


def _device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    name = platform.processor() or platform.machine()
    return f"{name}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"


def gpu_arch_status(archs, capability):
    """(ok, message) for a GPU of `capability` (major, minor) and a build
    with SASS for `archs` (compute capability x 10): a binary for sm_XY runs
    on sm_XZ for Z >= Y."""
    major, minor = capability
    cc = 10 * major + minor
    fits = [a for a in archs if a // 10 == major and a % 10 <= minor]
    if fits:
        return True, f"sm_{cc} runs the build's sm_{max(fits)} code"
    newer_ptx = archs and cc > max(archs)
    fix = (f"rebuild for it: TORCH_CUDA_ARCH_LIST=\"{major}.{minor}\" pip install --no-build-isolation "
           f"--force-reinstall --no-deps -e .  (or add {major}.{minor} to the list)")
    if newer_ptx:
        return True, (f"sm_{cc} is not in the build (archs {archs}); it runs only if the build carries PTX "
                      f"(the default list ends in +PTX), JIT-compiled at first use. For native code, {fix}")
    return False, f"sm_{cc} is not in the build (archs {archs or 'none'}): {fix}"


def build_facts(devices):
    """Prints the build facts; returns False when a GPU cannot run the build."""
    info = softmax_ext.build_info()
    print(f"softmax_ext {softmax_ext.__version__} ({os.path.dirname(softmax_ext.__file__)})")
    print(f"  torch: built against {info['torch']}, running {info['torch_runtime']}")
    if info["cuda"] is None:
        why = "torch is a CPU build" if torch.version.cuda is None else \
            "a CPU-only build (no CUDA toolkit found at build time, or SOFTMAX_EXT_CPU_ONLY=1)"
        print(f"  CUDA: none, {why}")
    else:
        print(f"  CUDA: built with {info['cuda']} (torch's CUDA {torch.version.cuda}), "
              f"GPU archs {', '.join(f'sm_{a}' for a in info['cuda_archs'])}")
    ok = True
    for device in devices:
        print(f"  device {device}: {_device_name(device)}")
        if device == "cuda":
            if info["cuda"] is None:
                print("    this build has no CUDA kernels: CUDA tensors raise NotImplementedError. Rebuild with "
                      "a CUDA toolkit (CUDA_HOME=/usr/local/cuda pip install --no-build-isolation -e .)")
                ok = False
                continue
            arch_ok, message = gpu_arch_status(info["cuda_archs"], torch.cuda.get_device_capability())
            print(f"    {'' if arch_ok else 'PROBLEM: '}{message}")
            ok = ok and arch_ok
    return ok


# --------------------------------------------------------------------------
# 2. checks
# --------------------------------------------------------------------------


def _check_cases(device, gen):
    """(op, dtype, shape, ours, float64 reference) for every op on a few layouts."""
    shapes = [((37, 1025), -1), ((6, 33, 17), 1), ((64, 48), 0), ((), 0)]
    for dtype in DTYPES:
        for shape, dim in shapes:
            x = torch.randn(shape, generator=gen, dtype=torch.float64).mul_(3).to(device, dtype)
            dy = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
            for kind, ref_fn, bw_ref in (
                ("softmax", torch.softmax, torch.ops.aten._softmax_backward_data),
                ("log_softmax", torch.log_softmax, torch.ops.aten._log_softmax_backward_data),
            ):
                ref = ref_fn(x.double(), dim)
                yield kind, dtype, shape, getattr(softmax_ext, kind)(x, dim), ref
                y = ref.to(dtype)
                dx = getattr(softmax_ext, f"{kind}_backward")(dy, y, dim)
                yield f"{kind}_backward", dtype, shape, dx, bw_ref(dy.double(), y.double(), dim, torch.float64)
        if dtype != torch.float64:
            # dtype=: read in its own dtype, computed and written in float32.
            x = torch.randn(19, 300, generator=gen).to(device, dtype)
            yield "softmax(dtype=f32)", dtype, (19, 300), softmax_ext.softmax(x, -1, dtype=torch.float32), \
                torch.softmax(x.double(), -1)
        # through autograd, a transposed input
        x = torch.randn(40, 24, generator=gen, dtype=torch.float64).to(device, dtype).t().requires_grad_()
        dy = torch.randn(24, 40, generator=gen, dtype=torch.float64).to(device, dtype)
        (grad,) = torch.autograd.grad(softmax_ext.softmax(x, 0), x, dy)
        x64 = x.detach().double().requires_grad_()
        (ref,) = torch.autograd.grad(torch.softmax(x64, 0), x64, dy.double())
        yield "autograd softmax", dtype, (24, 40), grad, ref
        yield from _extra_op_cases(device, dtype, gen)


def _extra_op_cases(device, dtype, gen):
    """The ops beyond the softmax family, where this build has them."""
    if hasattr(softmax_ext, "cross_entropy"):
        logits = torch.randn(33, 517, generator=gen, dtype=torch.float64).to(device, dtype)
        target = torch.randint(0, 517, (33,), generator=gen).to(device)
        ref = torch.nn.functional.cross_entropy(logits.double(), target)
        yield "cross_entropy", dtype, (33, 517), softmax_ext.cross_entropy(logits, target), ref
    if hasattr(softmax_ext, "softmax_matmul"):
        x = torch.randn(3, 17, 129, generator=gen, dtype=torch.float64).to(device, dtype)
        v = torch.randn(3, 129, 40, generator=gen, dtype=torch.float64).to(device, dtype)
        try:
            got = softmax_ext.softmax_matmul(x, v)
        except NotImplementedError:
            return  # e.g. f64 on CUDA, allowed by the SPEC
        yield "softmax_matmul", dtype, (3, 17, 129), got, torch.softmax(x.double(), -1) @ v.double()


def check(device, gen):
    """Prints the largest error per (op, dtype); returns the number of failures."""
    worst = {}
    for name, dtype, shape, got, ref in _check_cases(device, gen):
        got = got.detach()
        err = (got.double() - ref).abs().max().item() if got.numel() else 0.0
        tol = ATOL[dtype] * (4 if name in ("cross_entropy", "softmax_matmul") else 1)
        ok = got.shape == ref.shape and err <= tol * max(1.0, ref.abs().max().item())
        if not ok:
            print(f"  FAIL {name} {dtype} {tuple(shape)} on {device}: max error {err:.3g}")
        key = (name, SHORT[dtype])
        prev_err, prev_ok = worst.get(key, (0.0, True))
        worst[key] = (max(prev_err, err), prev_ok and ok)
    names = list(dict.fromkeys(name for name, _ in worst))
    dts = [SHORT[d] for d in DTYPES]
    print(f"  {'op':20s} " + " ".join(f"{d:>10s}" for d in dts) + "   (max |error| vs float64)")
    for name in names:
        cells = []
        for d in dts:
            if (name, d) not in worst:
                cells.append(f"{'-':>10s}")
                continue
            err, ok = worst[(name, d)]
            cells.append(f"{err:10.1e}" if ok else f"{'FAIL':>10s}")
        print(f"  {name:20s} " + " ".join(cells))
    return sum(not ok for _, ok in worst.values())


# --------------------------------------------------------------------------
# 3. timings
# --------------------------------------------------------------------------


def timing_cases(device, quick):
    """(shape, dim, dtype) to time."""
    if device == "cuda":
        if quick:
            return [((16384, 4096), -1, torch.float32), ((16384, 4096), -1, torch.bfloat16),
                    ((8, 1024, 4096), 1, torch.float32)]
        return [((262144, 512), -1, torch.float32), ((65536, 4096), -1, torch.float32),
                ((65536, 4096), -1, torch.bfloat16), ((4096, 65536), -1, torch.bfloat16),
                ((16, 4194304), -1, torch.float32), ((32, 1024, 4096), 1, torch.float32)]
    if quick:
        return [((1024, 4096), -1, torch.float32), ((1024, 4096), -1, torch.bfloat16)]
    return [((4096, 4096), -1, torch.float32), ((64, 50257), -1, torch.float32),
            ((8192, 1024), -1, torch.bfloat16), ((32, 1024, 512), 1, torch.float32)]


def _median_ms(fn, device, reps):
    if device == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            pass
        else:
            return do_bench(fn, warmup=10, rep=40, return_mode="median")
    for _ in range(2):
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


def copy_gbs(device, reps):
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    return 2 * x.numel() / _median_ms(lambda: x.clone(), device, reps) / 1e6


def _impls(op, direction, dim, use_compile):
    """{name: fn(*inputs)}; forward inputs (x,), backward (dy, y)."""
    if direction == "forward":
        ours = getattr(softmax_ext, op)
        fns = {"softmax_ext": lambda x: ours(x, dim), "torch": lambda x: getattr(torch, op)(x, dim)}
        if use_compile:
            torch_op = getattr(torch, op)
            fns["torch.compile"] = torch.compile(lambda x: torch_op(x, dim), dynamic=False)
        return fns
    ours = getattr(softmax_ext, f"{op}_backward")
    aten = getattr(torch.ops.aten, f"_{op}_backward_data")
    fns = {"softmax_ext": lambda dy, y: ours(dy, y, dim), "torch": lambda dy, y: aten(dy, y, dim, y.dtype)}
    if use_compile:
        fns["torch.compile"] = torch.compile(lambda dy, y: aten(dy, y, dim, y.dtype), dynamic=False)
    return fns


def timing_table(device, quick, reps, use_compile):
    """Times every entry, printing progress; returns the rows."""
    cases = [(shape, dim, dtype, op, direction)
             for shape, dim, dtype in timing_cases(device, quick)
             for op in ("softmax", "log_softmax")
             for direction in ("forward", "backward")]
    copy = copy_gbs(device, reps) if device == "cuda" else None
    print(f"\ntiming on {device} ({_device_name(device)}): {len(cases)} entries"
          + (f", copy bandwidth {copy:.0f} GB/s" if copy else "")
          + ("" if use_compile else "; torch.compile left out"
             + (" (--quick on a CPU: it compiles C++ at first call)" if quick and device == "cpu" else "")))
    rows = []
    compile_broken = None
    for i, (shape, dim, dtype, op, direction) in enumerate(cases, 1):
        torch._dynamo.reset()
        x = torch.randn(shape, device=device, dtype=dtype)
        if direction == "forward":
            inputs = (x,)
        else:
            inputs = (torch.randn_like(x), getattr(torch, op)(x, dim))
        nbytes = (len(inputs) + 1) * x.numel() * x.element_size()
        label = f"{op} {direction} {SHORT[dtype]} {'x'.join(map(str, shape))} dim={dim}"
        print(f"  [{i:2d}/{len(cases)}] {label:45s}", end="", flush=True)
        times = {}
        for impl, fn in _impls(op, direction, dim, use_compile and compile_broken is None).items():
            try:
                times[impl] = _median_ms(lambda: fn(*inputs), device, reps)
            except Exception as exc:  # torch.compile without a working compiler, for one
                if impl != "torch.compile":
                    raise
                compile_broken = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:100]}"
        base = times["torch"]
        for impl, ms in times.items():
            gbs = nbytes / ms / 1e6
            rows.append(dict(device=device, op=op, direction=direction, dtype=SHORT[dtype],
                             shape="x".join(map(str, shape)), dim=dim, impl=impl, ms=round(ms, 4),
                             gbs=round(gbs, 1), pct_copy=round(100 * gbs / copy, 1) if copy else None,
                             speedup_vs_torch=round(base / ms, 2)))
        print("  " + "  ".join(f"{k} {v:.3f} ms" for k, v in times.items()), flush=True)
    if compile_broken:
        print(f"  torch.compile left out after it failed: {compile_broken}")
    return rows


def print_table(rows):
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    gpu = any(r["pct_copy"] is not None for r in rows)
    keyed = {}
    for r in rows:
        keyed.setdefault((r["device"], r["op"], r["direction"], r["dtype"], r["shape"], r["dim"]), {})[r["impl"]] = r
    head = f"{'device':6s} {'op':11s} {'dir':8s} {'dtype':5s} {'shape':16s} {'dim':>3s}"
    cols = "".join(f" {impl + ' ms':>18s}" for impl in impls)
    print(f"\n{head}{cols} {'ours GB/s':>9s}{' %copy' if gpu else ''} "
          + " ".join(f"{'vs ' + impl:>17s}" for impl in impls if impl != "softmax_ext"))
    for key, by_impl in keyed.items():
        device, op, direction, dtype, shape, dim = key
        ours = by_impl["softmax_ext"]
        line = f"{device:6s} {op:11s} {direction:8s} {dtype:5s} {shape:16s} {dim:3d}"
        line += "".join(f" {by_impl[i]['ms']:18.3f}" if i in by_impl else f" {'-':>18s}" for i in impls)
        line += f" {ours['gbs']:9.1f}"
        if gpu:
            line += f" {ours['pct_copy']:5.0f}%" if ours["pct_copy"] is not None else "      "
        for impl in impls:
            if impl == "softmax_ext":
                continue
            line += f" {by_impl[impl]['ms'] / ours['ms']:16.2f}x" if impl in by_impl else f" {'-':>17s}"
        print(line)
    print("(vs X: X's time / softmax_ext's time; above 1 means softmax_ext is faster)")


def write_csv(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_plot(rows, path):
    """Speedup over torch per entry (softmax_ext and torch.compile), one bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = list(dict.fromkeys((r["device"], r["op"], r["direction"], r["dtype"], r["shape"], r["dim"])
                                 for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "torch"]
    value = {(r["device"], r["op"], r["direction"], r["dtype"], r["shape"], r["dim"], r["impl"]):
             r["speedup_vs_torch"] for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(entries) * max(1, len(impls))), 5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        xs = [i + k * width for i in range(len(entries))]
        ax.bar(xs, [value.get(e + (impl,), 0) or 0 for e in entries], width, label=impl)
    ax.axhline(1.0, color="grey", linewidth=1, label="torch")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(entries))])
    ax.set_xticklabels([f"{d} {op} {dr[:3]} {dt} {s} d{dim}" for d, op, dr, dt, s, dim in entries],
                       rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speedup over torch (higher is faster)")
    devices = sorted({r["device"] for r in rows})
    ax.set_title(f"softmax_ext {softmax_ext.__version__} vs torch {torch.__version__} on "
                 + ", ".join(_device_name(d) for d in devices), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    devices = _devices(args.device)
    start = time.perf_counter()
    runnable = build_facts(devices)

    gen = torch.Generator().manual_seed(0)
    failures = 0
    for device in devices:
        if device == "cuda" and not runnable:
            print("\nskipping the CUDA checks: this build cannot run on this GPU (see above)")
            failures += 1
            continue
        print(f"\nchecking every op against torch's float64 result on {device}")
        failures += check(device, gen)

    rows = []
    if not args.no_timing and failures == 0:
        for device in devices:
            use_compile = not args.no_compile and not (args.quick and device == "cpu")
            rows += timing_table(device, args.quick, args.reps, use_compile)
        print_table(rows)
        if args.csv:
            write_csv(rows, args.csv)
            print(f"written: {args.csv}")
        if args.plot:
            write_plot(rows, args.plot)
            print(f"written: {args.plot}")
    elif failures and not args.no_timing:
        print("\ntimings skipped: a check failed")
    print(f"\n{'all checks passed' if failures == 0 else f'{failures} checks FAILED'} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
