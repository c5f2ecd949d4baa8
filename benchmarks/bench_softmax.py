"""Side-by-side timing of softmax_ext against torch and other softmax kernels.

    python -m benchmarks.bench_softmax                      # the device's full sweep (long on a GPU)
    python -m benchmarks.bench_softmax --quick              # a few shapes
    python -m benchmarks.bench_softmax --dtype bf16 --op log_softmax --direction forward
    python -m benchmarks.bench_softmax --shapes last-axis,vocab
    python -m benchmarks.bench_softmax --device cpu         # CPU sweep

Peers (benchmarks/peers.py): softmax_ext, torch eager, torch.compile, the Triton
tutorial's fused softmax, Liger-Kernel and QuACK where importable. Each peer's
result is checked against torch once per case; a wrong result or a refusal is
marked in the table instead of timed. Every entry is a median over many runs
(triton.testing.do_bench on a GPU); GPU inputs are ~1 GiB, far larger than L2,
and the copy bandwidth (bytes read + written by a device-to-device clone) is
measured in the same run, so "% copy" compares against what this machine can
move. Bytes moved: forward reads x and writes y, backward reads dy and y and
writes dx. Results go to benchmarks/results/<device>.csv, with a GB/s plot per
dtype of the last-axis sweep when matplotlib is importable.
"""

import argparse
import csv
import os
import re
import statistics
import time
from dataclasses import dataclass

import torch

from . import peers

RESULTS = os.path.join(os.path.dirname(__file__), "results")
GIB = 1 << 30
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
OPS = ("softmax", "log_softmax")
DIRECTIONS = ("forward", "backward")
# (rtol, atol) for comparing a peer with torch; atol is scaled by the largest
# |reference| value, since backward results cancel and can be large.
TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 1e-2), torch.float16: (2e-3, 1e-3)}


@dataclass(frozen=True)
class Case:
    group: str  # what --shapes matches, with the shape label
    shape: tuple
    dim: int
    dtype: str
    ops: tuple = OPS
    transposed: bool = False  # randn(shape[::-1]).t(): the axis is not contiguous

    @property
    def label(self):
        return "x".join(map(str, self.shape)) + ("^T" if self.transposed else "")

    def make(self, device, gen):
        dtype = DTYPES[self.dtype]
        if self.transposed:
            return torch.randn(self.shape[::-1], device=device, dtype=dtype, generator=gen).t()
        return torch.randn(self.shape, device=device, dtype=dtype, generator=gen)


def gpu_cases(quick):
    ns = (128, 4096, 65536) if quick else (32, 128, 512, 1024, 4096, 16384, 65536, 262144)
    cases = [Case("last-axis", (GIB // (n * DTYPES[d].itemsize), n), -1, d) for d in DTYPES for n in ns]
    if not quick:
        cases += [Case("long-row", (1, 1 << 28), -1, "f32"), Case("long-row", (4, 1 << 24), -1, "f32"),
                  Case("short-row", (1 << 24, 16), -1, "f32")]
        # rows past a cluster's reach that the GPU holds on chip (cuda.split_resident)
        cases += [Case("mid-long-row", (256, 1 << 20), -1, "f32"), Case("mid-long-row", (1024, 600000), -1, "f32"),
                  Case("mid-long-row", (512, 1 << 21), -1, "bf16"), Case("mid-long-row", (64, 1 << 22), -1, "f32"),
                  Case("mid-long-row", (16, 1 << 23), -1, "bf16")]
        # lengths off the powers of two: rows that fill their lane group partly
        # (f32 rows of 60 and 116 leave one lane of four a pack short; 126 and
        # 510, half a pack), 16-bit rows starting off 16-byte boundaries (bf16
        # 197: a ViT's 197 tokens)
        cases += [Case("odd-row", (GIB // (n * DTYPES[d].itemsize), n), -1, d)
                  for d, n in (("f32", 60), ("f32", 100), ("f32", 116), ("f32", 126), ("f32", 200), ("f32", 510),
                               ("bf16", 197), ("bf16", 777), ("bf16", 1500), ("f16", 1000))]
    cases += [Case("mid-axis", (32, 1024, 4096), 1, "f32"),
              Case("transposed", (8192, 8192), -1, "f32", transposed=True)]
    if not quick:  # a short axis over channels, as in channels-first segmentation heads
        cases.append(Case("channel-axis", (4096, 16, 4096), 1, "f32"))
        # the strided family in 16 bits
        cases += [Case("mid-axis", (32, 1024, 4096), 1, "bf16"),
                  Case("transposed", (8192, 8192), -1, "bf16", transposed=True)]
        # strided axes past the strided family's reach (the strided split family)
        cases += [Case("long-strided-axis", (131072, 2048), 0, "f32"),
                  Case("long-strided-axis", (131072, 2048), 0, "bf16")]
    if not quick:
        cases.append(Case("vocab", (8192, 131072), -1, "bf16", ops=("log_softmax",)))
    return cases


def cpu_cases(quick):
    # The CPU parity shapes (issue 26): square f32 rows, a GPT-2 vocabulary,
    # attention scores (rows of 128), bf16 rows, a strided axis (dim=1);
    # then a first-axis softmax.
    cases = [Case("last-axis", (4096, 4096), -1, "f32"), Case("vocab", (64, 50257), -1, "f32"),
             Case("attention", (32, 12, 128, 128), -1, "f32"), Case("last-axis", (8192, 1024), -1, "bf16"),
             Case("mid-axis", (32, 1024, 512), 1, "f32"), Case("last-axis", (4096, 4096), -1, "bf16"),
             Case("first-axis", (2048, 2048), 0, "f32")]
    return cases[:2] if quick else cases


def selected(cases, args):
    """(case, op, direction) triples left by the command-line filters."""
    patterns = args.shapes.split(",") if args.shapes else [""]
    for case in cases:
        if case.dtype not in args.dtype or not any(p in f"{case.group} {case.label}" for p in patterns):
            continue
        for op in case.ops:
            for direction in DIRECTIONS:
                if op in args.op and direction in args.direction:
                    yield case, op, direction


def median_ms(fn, device, reps=30):
    if device == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            return cuda_events_ms(fn, reps)
        return do_bench(fn, warmup=25, rep=200, return_mode="median")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cuda_events_ms(fn, reps, evict_by_read=False):
    """Median ms of `reps` calls of fn (CUDA events), each after evicting L2
    by writing a 256 MB buffer (zero_), or, with evict_by_read, by reading
    it: a read leaves no dirty lines whose write-back would fall on fn."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # evicts L2 between runs
    flush_words = flush.view(torch.float32)
    for _ in range(3):
        fn()
    events = []
    for _ in range(reps):  # queued back to back, as triton's do_bench does; one synchronisation at the end
        if evict_by_read:
            flush_words.sum()
        else:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def copy_gbs(device, nbytes):
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    ms = median_ms(lambda: x.clone(), device)
    return 2 * x.numel() * 4 / ms / 1e6


def memory_order(t):
    """t as a 1-D view in memory order when t is dense, else a flattened copy."""
    perm = sorted(range(t.dim()), key=lambda i: -t.stride(i))
    return t.permute(perm).reshape(-1), perm


def matches(out, ref):
    """allclose against torch's result, in chunks so no full-size float copy is made."""
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return False, f"got {type(out).__name__} {getattr(out, 'dtype', '')} {tuple(getattr(out, 'shape', ()))}"
    rtol, atol = TOLERANCE[ref.dtype]
    r, perm = memory_order(ref)
    o = out.permute(perm).reshape(-1)
    chunk = 1 << 24
    scale = max(max(c.abs().max().item() for c in r.split(chunk)), 1.0) if r.numel() else 1.0
    worst = 0.0
    for oc, rc in zip(o.split(chunk), r.split(chunk)):
        oc, rc = oc.float(), rc.float()
        if not torch.isclose(oc, rc, rtol=rtol, atol=atol * scale).all():
            worst = max(worst, (oc - rc).abs().nan_to_num(nan=float("inf")).max().item())
    if worst == float("inf"):
        return False, "non-finite values where torch has finite ones"
    return worst == 0.0, (f"max |diff| {worst:.3g}" if worst else "")


def measure(make, op, direction, dim, inputs, ref, device):
    """(status, ms, note) for one peer; None when the peer does not offer the case."""
    try:
        fn = make(op, direction, dim, inputs[0])
        if fn is None:
            return None
        ok, note = matches(fn(*inputs), ref)
        if not ok:
            return "wrong", None, note
        return "ok", median_ms(lambda: fn(*inputs), device), ""
    except Exception as exc:  # any failure of a peer is its refusal, not the harness's
        first_line = (str(exc).strip().splitlines() or [""])[0][:120]
        return "refuses", None, f"{type(exc).__name__}: {first_line}"


def fits(case, direction, device):
    """Whether the case's tensors fit in free GPU memory; a note when they do not."""
    if device != "cuda":
        return True, ""
    torch.cuda.empty_cache()
    nbytes = torch.Size(case.shape).numel() * DTYPES[case.dtype].itemsize
    # inputs, torch's result, the peer's result, one spare for copies, plus slack
    need = (5 if direction == "backward" else 4) * nbytes + GIB
    free, _ = torch.cuda.mem_get_info()
    return need <= free, f"needs ~{need / GIB:.1f} GiB, {free / GIB:.1f} GiB free"


def ext_kernel(op, direction, dim, inputs):
    """The softmax_ext kernel the case runs on: the plan of x, or of y for the
    backward, whose gradient takes y's layout. A dy in another layout is noted:
    the plan cannot show it, and the CUDA op may first copy dy into y's layout."""
    import softmax_ext

    t = inputs[-1]
    kernel = softmax_ext.plan(t, dim, kind=op, backward=direction == "backward").kernel
    if direction == "backward" and inputs[0].stride() != t.stride():
        kernel += " (dy in another layout)"
    return kernel


def run_case(case, op, direction, device, name, copy, impls):
    gen = torch.Generator(device=device).manual_seed(0)
    x = case.make(device, gen)
    if direction == "forward":
        inputs = (x,)
    else:
        inputs = (torch.empty_like(x).normal_(generator=gen), getattr(torch, op)(x, case.dim))
    del x
    ref = peers.torch_peer(op, direction, case.dim, inputs[0])(*inputs)
    nbytes = (2 if direction == "forward" else 3) * ref.numel() * ref.element_size()
    # A fresh compile per case: otherwise dynamo's per-function recompile limit
    # would quietly fall back to eager after a few shapes.
    torch._dynamo.reset()
    rows = []
    for impl, make in peers.PEERS.items():
        if impls and impl not in impls and impl != "torch":
            continue
        result = measure(make, op, direction, case.dim, inputs, ref, device)
        if result is None:
            continue
        status, ms, note = result
        rows.append(dict(device=name, case=case.group, op=op, direction=direction, dtype=str(ref.dtype)[6:], shape=case.label,
                         dim=case.dim, impl=impl, ms=round(ms, 4) if ms else None,
                         gbs=round(nbytes / ms / 1e6, 1) if ms else None,
                         pct_copy=round(100 * nbytes / ms / 1e6 / copy, 1) if ms else None,
                         speedup_vs_torch=None, status=status,
                         kernel=ext_kernel(op, direction, case.dim, inputs) if impl == "softmax_ext" else "",
                         note=note))
    base = next(r["ms"] for r in rows if r["impl"] == "torch")
    for r in rows:
        r["speedup_vs_torch"] = round(base / r["ms"], 2) if r["ms"] else None
    return rows


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_csv(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def print_table(rows):
    print(f"\n{'op':11s} {'dir':8s} {'dtype':8s} {'shape':17s} {'dim':>3s} {'impl':15s} "
          f"{'ms':>8s} {'GB/s':>7s} {'%copy':>6s} {'vs torch':>8s}")
    for r in rows:
        head = (f"{r['op']:11s} {r['direction']:8s} {r['dtype']:8s} {r['shape']:17s} {r['dim']:3d} "
                f"{r['impl']:15s}")
        if r["status"] == "ok":
            print(f"{head} {r['ms']:8.3f} {r['gbs']:7.1f} {r['pct_copy']:6.1f} {r['speedup_vs_torch']:7.2f}x"
                  f" {r['kernel']}")
        else:
            print(f"{head} {r['status'].upper():>8s}  {r['note']}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a few representative shapes")
    parser.add_argument("--dtype", default="f32,bf16,f16", help="comma list of f32, bf16, f16")
    parser.add_argument("--op", default=",".join(OPS), help="comma list of softmax, log_softmax")
    parser.add_argument("--direction", default=",".join(DIRECTIONS), help="comma list of forward, backward")
    parser.add_argument("--shapes", default="", help="comma list of substrings of a case's group or shape "
                        "(groups: last-axis, attention, odd-row, long-row, mid-long-row, short-row, mid-axis, channel-axis, long-strided-axis, first-axis, "
                        "transposed, vocab)")
    parser.add_argument("--impls", default="", help="comma list of implementations to time (torch always runs); "
                        "default: every available peer")
    parser.add_argument("--out", help="CSV path (default: benchmarks/results/<device-name>.csv)")
    args = parser.parse_args()
    for field, allowed in [("dtype", DTYPES), ("op", OPS), ("direction", DIRECTIONS)]:
        values = getattr(args, field).split(",")
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"--{field}: unknown {unknown}; choose from {list(allowed)}")
        setattr(args, field, values)
    return args


def main():
    args = parse_args()
    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    copy = copy_gbs(device, GIB if device == "cuda" else 1 << 27)
    print(f"device: {name}; copy bandwidth {copy:.0f} GB/s (read + write)")
    print(f"peers: {', '.join(peers.PEERS)}")
    for peer, why in peers.UNAVAILABLE.items():
        print(f"  {peer}: {why}")

    path = args.out or os.path.join(RESULTS, f"{slug(name)}.csv")
    rows, notes = [], []
    for case, op, direction in selected((gpu_cases if device == "cuda" else cpu_cases)(args.quick), args):
        what = f"{op} {direction} {case.dtype} {case.label} dim={case.dim}"
        ok, note = fits(case, direction, device)
        if not ok:
            notes.append(f"skipped {what}: {note}")
            print(notes[-1])
            continue
        print(what, flush=True)
        rows += run_case(case, op, direction, device, name, copy, args.impls.split(",") if args.impls else [])
        write_csv(rows, path)  # after every case, so an interrupted sweep keeps what it measured
    if not rows:
        print("nothing run: no case matches the filters")
        return

    print(f"\nwritten: {path}")
    try:
        from .plot import plot_csv
    except ImportError as exc:
        print(f"no plots: {exc}")
    else:
        for png in plot_csv(path):
            print(f"written: {png}")
    for note in notes:
        print(note)
    print_table(rows)


if __name__ == "__main__":
    main()
