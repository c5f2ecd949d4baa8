"""softmax_ext against torch on the CPU, side by side in one process.

    python -m benchmarks.cpu_parity                 # the shapes of the parity target
    python -m benchmarks.cpu_parity --rounds 60 --ops softmax
    python -m benchmarks.cpu_parity --csv benchmarks/results/cpu_parity.csv

For each case, forward (op) and forward+backward (op, then .backward(dy)
through autograd) of softmax_ext and torch run interleaved: every round
times each implementation once, alternating which goes first, so a
neighbour's load on a shared machine hits both alike. Printed per case: the
median time of each and the speedup (torch ms / softmax_ext ms) as the median
of the per-round ratios with its 10th-90th percentile spread.
"""

import argparse
import csv
import statistics
import time

import torch

import softmax_ext

# (label, shape, dim, dtype[, "causal": the last two dims' upper triangle -inf,
# as masked attention scores have])
CASES = [
    ("f32 4096x4096", (4096, 4096), -1, torch.float32),
    ("f32 64x50257", (64, 50257), -1, torch.float32),
    ("f32 32x12x128x128", (32, 12, 128, 128), -1, torch.float32),
    ("f32 32x12x128x128 causal", (32, 12, 128, 128), -1, torch.float32, "causal"),
    ("bf16 32x12x128x128 causal", (32, 12, 128, 128), -1, torch.bfloat16, "causal"),
    ("f32 131072x24", (131072, 24), -1, torch.float32),
    ("f32 65536x49", (65536, 49), -1, torch.float32),
    ("bf16 8192x1024", (8192, 1024), -1, torch.bfloat16),
    ("f32 262144x16", (262144, 16), -1, torch.float32),
    ("bf16 16384x100", (16384, 100), -1, torch.bfloat16),
    ("f32 32x1024x512 dim=1", (32, 1024, 512), 1, torch.float32),
    ("f32 64x64x2048 dim=1", (64, 64, 2048), 1, torch.float32),
    ("bf16 64x64x2048 dim=1", (64, 64, 2048), 1, torch.bfloat16),
]


def _fns(lib, op, dim, x, dy, direction):
    f = getattr(lib, op)
    if direction == "forward":
        return lambda: f(x, dim)
    xg = x.detach().requires_grad_()

    def fwd_bwd():
        f(xg, dim).backward(dy)
        xg.grad = None

    return fwd_bwd


def _time(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def compare(op, direction, shape, dim, dtype, rounds, gen, mask=None):
    x = torch.randn(shape, generator=gen).to(dtype)
    if mask == "causal":
        x = x.masked_fill(torch.ones(shape[-2:], dtype=torch.bool).triu(1), -float("inf"))
    dy = torch.randn(shape, generator=gen).to(dtype)
    ours = _fns(softmax_ext, op, dim, x, dy, direction)
    theirs = _fns(torch, op, dim, x, dy, direction)
    for _ in range(3):
        ours(), theirs()
    t_ours, t_theirs, ratios = [], [], []
    for r in range(rounds):
        if r % 2:
            a, b = _time(ours), _time(theirs)
        else:
            b, a = _time(theirs), _time(ours)
        t_ours.append(a)
        t_theirs.append(b)
        ratios.append(b / a)
    q = statistics.quantiles(ratios, n=10)
    return statistics.median(t_ours), statistics.median(t_theirs), statistics.median(ratios), q[0], q[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--ops", default="softmax,log_softmax")
    parser.add_argument("--cases", default="", help="comma list of substrings of the case labels")
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'case':26s} {'op':11s} {'direction':16s} {'ours ms':>8s} {'torch ms':>8s} {'speedup':>7s} {'p10-p90':>11s}")
    rows = []
    for label, shape, dim, dtype, *mask in CASES:
        if args.cases and not any(c in label for c in args.cases.split(",")):
            continue
        for op in args.ops.split(","):
            for direction in ("forward", "forward+backward"):
                ours, theirs, ratio, lo, hi = compare(op, direction, shape, dim, dtype, args.rounds, gen, *mask)
                print(f"{label:26s} {op:11s} {direction:16s} {ours:8.2f} {theirs:8.2f} {ratio:6.2f}x "
                      f"{lo:5.2f}-{hi:4.2f}", flush=True)
                rows.append(dict(case=label, op=op, direction=direction, softmax_ext_ms=round(ours, 4),
                                 torch_ms=round(theirs, 4), speedup_median=round(ratio, 4), speedup_p10=round(lo, 4),
                                 speedup_p90=round(hi, 4), rounds=args.rounds, threads=torch.get_num_threads(),
                                 torch=torch.__version__, capability=torch.backends.cpu.get_cpu_capability()))
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
