"""softmax_matmul against softmax(x, -1) @ v and the Triton course kernel.

    python -m benchmarks.bench_softmax_matmul            # the reference sweep
    python -m benchmarks.bench_softmax_matmul --quick    # d2 in 1024, 8192 only
    python -m benchmarks.bench_softmax_matmul --out DIR  # CSV / PNG folder (default outputs/)
    python -m benchmarks.bench_softmax_matmul --few-rows # float32 (TF32 off), d1 of 1-8 rows

--few-rows: float32 with TF32 off, d1 in 1, 2, 4, 8 on seven (batch, d2,
d3): the naive version, softmax_ext's Hopper 3xTF32 kernel
(SOFTMAX_EXT_SMM_ROWS=0) and its rows kernel (the plan's choice there), each
timed two ways in one process: the GPU time of one call's kernels (torch
profiler, mean of 10 calls) and triton.testing.do_bench's median (host time
included where it passes the GPU's); relative errors against float64.
Writes softmax_matmul_few_rows.csv.

Reference parameters (issue 24): device cuda, batch_size 16, d1 2048, d3 512,
d2 in [64 .. 8192], 10 warm-up and 100 timed passes with CUDA events (mean
and std), Triton B in [16, 32, 64] (BLOCK_1 = BLOCK_2 = B). Precisions:
float32 with TF32 off (softmax_ext: 3xTF32, float32-accurate), float32 with
TF32 on, bfloat16. Backward (x and v gradients, through autograd with
retain_graph) for the naive version and softmax_ext. Peak memory is the
allocator's peak during one call minus what was allocated before it (so the
output is included). The tensor-core ceiling is torch.matmul of two 8192 x
8192 matrices in the same precision, measured in the same run: once at the
start (printed) and again right before each d2 of a precision, so that a
row's % of the ceiling compares the kernels at the same GPU clock and
temperature (a long sweep heats the GPU and lowers its clocks; column
ceiling_tflops); throughput counts 2 * batch * d1 * d2 * d3 flops.
Failures (OOM, Triton's OutOfResources) give a row of nulls. Writes
softmax_matmul_benchmark.csv and softmax_matmul_benchmark.png.
"""

import argparse
import math
import os
import statistics
import traceback

import torch
import torch.nn.functional as F

import softmax_ext

D2S = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
BLOCKS = [16, 32, 64]
PRECISIONS = [("float32", False), ("float32", True), ("bfloat16", False)]


def time_ms(fn, warmup=10, iters=100):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda.synchronize()
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.mean(t), statistics.stdev(t)


def peak_mib(fn):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del r
    return peak / 2**20


def ceiling_tflops(dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    ms, _ = time_ms(lambda: torch.matmul(a, b), 5, 30)
    return 2 * 8192**3 / ms / 1e9


FEW_ROWS_SHAPES = [(2, 65536, 512), (1, 32768, 128), (4, 16384, 64), (1024, 256, 32), (8, 4096, 512),
                   (64, 1024, 256), (16, 2048, 512)]


def gpu_us(fn, calls=10):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sum(e.device_time for e in prof.events() if e.device_type == cuda) / calls


def few_rows(out_dir):
    from triton.testing import do_bench

    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}; float32, TF32 off; us: GPU time | do_bench median")
    print(f"{'(batch, d1, d2, d3)':22s} {'naive':>7s} {'3xtf32':>7s} {'rows':>7s} | {'naive':>7s} {'3xtf32':>7s} "
          f"{'rows':>7s} | rows x naive, x 3xtf32 (GPU) | rel. error rows / naive | plan")
    rows = []
    for batch, d2, d3 in FEW_ROWS_SHAPES:
        for d1 in (1, 2, 4, 8):
            g = torch.Generator(device="cuda").manual_seed(d1 * d2)
            x = torch.randn(batch, d1, d2, device="cuda", generator=g) * 3
            v = torch.randn(batch, d2, d3, device="cuda", generator=g)
            ref = F.softmax(x.double(), -1) @ v.double()
            scale = ref.abs().max().item()
            row = dict(batch_size=batch, d1=d1, d2=d2, d3=d3)
            for impl, env in [("naive", None), ("3xtf32", "0"), ("rows", None)]:
                fn = (lambda: F.softmax(x, -1) @ v) if impl == "naive" else (lambda: softmax_ext.softmax_matmul(x, v))
                if env is not None:
                    os.environ["SOFTMAX_EXT_SMM_ROWS"] = env
                try:
                    row[f"{impl}_gpu_us"] = gpu_us(fn)
                    row[f"{impl}_do_bench_us"] = do_bench(fn, warmup=25, rep=60, return_mode="median") * 1e3
                    row[f"{impl}_rel_error"] = (fn().double() - ref).abs().max().item() / scale
                    if impl != "naive":
                        row[f"{impl}_plan"] = softmax_ext.plan(x, kind="softmax_matmul", v=v).kernel
                finally:
                    os.environ.pop("SOFTMAX_EXT_SMM_ROWS", None)
            rows.append(row)
            r = row
            print(f"{str((batch, d1, d2, d3)):22s} {r['naive_gpu_us']:7.1f} {r['3xtf32_gpu_us']:7.1f} "
                  f"{r['rows_gpu_us']:7.1f} | {r['naive_do_bench_us']:7.1f} {r['3xtf32_do_bench_us']:7.1f} "
                  f"{r['rows_do_bench_us']:7.1f} | {r['naive_gpu_us'] / r['rows_gpu_us']:5.2f} "
                  f"{r['3xtf32_gpu_us'] / r['rows_gpu_us']:5.2f} | {r['rows_rel_error']:.1e} / "
                  f"{r['naive_rel_error']:.1e} | {r['rows_plan']}", flush=True)
            del x, v, ref
    import csv

    path = os.path.join(out_dir, "softmax_matmul_few_rows.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--few-rows", action="store_true")
    ap.add_argument("--out", default="outputs")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.few_rows:
        return few_rows(args.out)
    d2s = [1024, 8192] if args.quick else D2S
    batch, d1, d3 = 16, 2048, 512
    dev = torch.cuda.get_device_name()
    tri = None
    if not args.no_triton:
        try:
            from . import triton_softmax_matmul as tri
        except Exception as e:  # no triton
            print("triton peer unavailable:", e)
    ceilings = {("float32", True): ceiling_tflops(torch.float32, True),
                ("bfloat16", False): ceiling_tflops(torch.bfloat16, False),
                ("float32", False): ceiling_tflops(torch.float32, False)}
    print(f"device: {dev}; matmul 8192^3 ceilings (TFLOP/s): " +
          ", ".join(f"{k[0]}{' tf32' if k[1] else ''}={v:.1f}" for k, v in ceilings.items()), flush=True)
    rows = []
    for dname, tf32 in PRECISIONS:
        dtype = getattr(torch, dname)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for d2 in d2s:
            ceil = ceiling_tflops(dtype, tf32)  # at this row's clock and temperature
            g = torch.Generator(device="cuda").manual_seed(d2)
            x = torch.randn(batch, d1, d2, device="cuda", dtype=dtype, generator=g)
            v = torch.randn(batch, d2, d3, device="cuda", dtype=dtype, generator=g)
            flop = 2 * batch * d1 * d2 * d3
            naive_out = None
            impls = [("naive", None, lambda: F.softmax(x, -1) @ v),
                     ("softmax_ext", None, lambda: softmax_ext.softmax_matmul(x, v))]
            if tri is not None:
                impls += [("triton", b, (lambda b=b: tri.softmax_matmul(x, v, b))) for b in BLOCKS]
            for impl, blk, fn in impls:
                row = dict(batch_size=batch, d1=d1, d2=d2, d3=d3, impl=impl, dtype=dname, tf32=tf32,
                           triton=impl == "triton", BLOCK=blk, forward_ms_mean=None, forward_ms_std=None,
                           forward_peak_MiB=None, forward_tflops=None, ceiling_tflops=ceil, pct_of_ceiling=None,
                           max_abs_diff_vs_naive=None, backward_ms_mean=None, backward_ms_std=None,
                           backward_peak_MiB=None, kernel=None)
                if impl == "softmax_ext":
                    p = softmax_ext.plan(x, kind="softmax_matmul", v=v)
                    row["BLOCK"] = p.tile[0]
                    row["kernel"] = p.kernel
                try:
                    out = fn()
                    if impl == "naive":
                        naive_out = out.float()
                    else:
                        row["max_abs_diff_vs_naive"] = (out.float() - naive_out).abs().max().item()
                    del out
                    row["forward_peak_MiB"] = peak_mib(fn)
                    m, s = time_ms(fn)
                    row.update(forward_ms_mean=m, forward_ms_std=s, forward_tflops=flop / m / 1e9,
                               pct_of_ceiling=100 * flop / m / 1e9 / ceil)
                    if impl != "triton" and not args.no_backward:
                        xg = x.detach().requires_grad_()
                        vg = v.detach().requires_grad_()
                        go = torch.randn(batch, d1, d3, device="cuda", dtype=dtype, generator=g)
                        o = (F.softmax(xg, -1) @ vg) if impl == "naive" else softmax_ext.softmax_matmul(xg, vg)
                        bwd = lambda: torch.autograd.grad(o, (xg, vg), go, retain_graph=True)  # noqa: E731
                        row["backward_peak_MiB"] = peak_mib(bwd)
                        bm, bs = time_ms(bwd)
                        row.update(backward_ms_mean=bm, backward_ms_std=bs)
                        del o, xg, vg, go
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    print(f"OOM: {impl} B={blk} {dname} tf32={tf32} d2={d2}")
                except Exception as e:  # Triton OutOfResources, an unsupported tile
                    torch.cuda.empty_cache()
                    print(f"failed: {impl} B={blk} {dname} tf32={tf32} d2={d2}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160] if str(e) else ''}")
                rows.append(row)
            del x, v, naive_out
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    write(rows, args.out, dev, ceilings)


def _fmt(v, nd=3):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def write(rows, out_dir, dev, ceilings):
    path = os.path.join(out_dir, "softmax_matmul_benchmark.csv")
    try:
        import pandas as pd

        df = pd.DataFrame(rows)
        df["BLOCK"] = df["BLOCK"].astype("Int64")
        df["device"] = dev
        df.to_csv(path, index=False)
    except ImportError:
        import csv

        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["device"])
            w.writeheader()
            for r in rows:
                w.writerow({**{k: ("" if v is None else v) for k, v in r.items()}, "device": dev})
    print(f"\nwrote {path}")
    print(f"device: {dev}; ceilings TFLOP/s: " + ", ".join(f"{k[0]}{'+tf32' if k[1] else ''} {v:.0f}" for k, v in ceilings.items()))
    print(f"{'dtype':9} {'tf32':5} {'d2':>5} {'impl':12} {'B':>3} {'fwd ms':>8} {'TFLOP/s':>8} {'%ceil':>6} "
          f"{'peak MiB':>9} {'bwd ms':>8} {'bwd MiB':>8}")
    for r in rows:
        print(f"{r['dtype']:9} {str(r['tf32']):5} {r['d2']:>5} {r['impl']:12} {_fmt(r['BLOCK']):>3} "
              f"{_fmt(r['forward_ms_mean']):>8} {_fmt(r['forward_tflops'], 1):>8} {_fmt(r['pct_of_ceiling'], 1):>6} "
              f"{_fmt(r['forward_peak_MiB'], 1):>9} {_fmt(r['backward_ms_mean']):>8} {_fmt(r['backward_peak_MiB'], 1):>8}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for col, (dname, tf32) in enumerate(PRECISIONS):
        sel = [r for r in rows if r["dtype"] == dname and r["tf32"] == tf32]
        for key in sorted({(r["impl"], r["BLOCK"] if r["impl"] == "triton" else None) for r in sel}, key=str):
            pts = [r for r in sel if (r["impl"], r["BLOCK"] if r["impl"] == "triton" else None) == key
                   and r["forward_ms_mean"] is not None]
            if not pts:
                continue
            label = key[0] + (f" B={key[1]}" if key[1] else "")
            axes[0][col].plot([r["d2"] for r in pts], [r["forward_ms_mean"] for r in pts], "o-", label=label)
            axes[1][col].plot([r["d2"] for r in pts], [r["forward_peak_MiB"] for r in pts], "o-", label=label)
        title = dname + (" (TF32)" if tf32 else "")
        axes[0][col].set_title(f"forward time, {title}")
        axes[1][col].set_title(f"forward peak memory, {title}")
        for ax, yl in ((axes[0][col], "ms"), (axes[1][col], "MiB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("d2")
            ax.set_ylabel(yl)
            ax.legend(fontsize=7)
    fig.suptitle(f"softmax(x) @ v, batch 16, d1 2048, d3 512 - {dev}")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "softmax_matmul_benchmark.png"), dpi=90)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
