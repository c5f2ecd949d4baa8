"""Where a training step's host time goes: the CPU self time of each op in
a few eager steps of one bench_models model, per variant (torch, patch,
integration), with the largest differences from torch first.

    python scripts/host_profile.py [--model bert] [--dtype bfloat16] [--steps 10]
"""

import argparse
import collections
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from benchmarks.bench_models import Case, variant_context  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bert")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--variants", default="torch,patch,integration")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    per_variant, walls = {}, {}
    for variant in args.variants.split(","):
        case = Case(args.model, dtype, "eager", variant, "cuda")
        case.run(3, timed=False)
        with variant_context(variant, case.model):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                case.step()
            torch.cuda.synchronize()
            walls[variant] = (time.perf_counter() - t0) / args.steps * 1e3
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    case.step()
                torch.cuda.synchronize()
        table = collections.defaultdict(lambda: [0.0, 0])
        for e in prof.key_averages():
            table[e.key][0] += e.self_cpu_time_total / args.steps
            table[e.key][1] += e.count // args.steps
        per_variant[variant] = table
        del case
        torch.cuda.empty_cache()
    names = list(per_variant)
    print("wall ms per step (unprofiled): " + ", ".join(f"{v} {walls[v]:.2f}" for v in names))
    print("self CPU ms per step: " + ", ".join(f"{v} {sum(t[0] for t in per_variant[v].values()) / 1e3:.2f}"
                                              for v in names))
    keys = set().union(*per_variant.values())
    base = per_variant[names[0]]

    def spread(k):
        return max(abs(per_variant[v][k][0] - base[k][0]) for v in names)

    print(f"{'op':60s} " + " ".join(f"{v + ' us (calls)':>22s}" for v in names))
    for k in sorted(keys, key=spread, reverse=True)[: args.top]:
        print(f"{k[:60]:60s} " + " ".join(f"{per_variant[v][k][0]:13.1f} ({per_variant[v][k][1]:5d})" for v in names))


if __name__ == "__main__":
    main()
